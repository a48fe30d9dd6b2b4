//! Samplers that turn a denoiser (diffusion) or a velocity field (flow matching) into an action
//! chunk, in Rust around the network.
//!
//! - DDPM training schedule with `train_steps` steps (linear or squared-cosine betas), sampled with
//!   DDIM (Song et al. 2021) in `inference_steps` steps. With `eta = 0` DDIM is deterministic given
//!   the initial noise, which is an input here: tests inject it, and diffusion steering (DSRL)
//!   chooses it. Step conventions follow Hugging Face diffusers' `DDIMScheduler` ("leading" timestep
//!   spacing, `clip_sample`, `set_alpha_to_one`), which is what Chi et al.'s Diffusion Policy uses.
//! - The same schedule sampled with DDPM (Ho et al. 2020), as LeRobot's Diffusion Policy does by
//!   default: each step but the last adds fresh noise, scaled by diffusers' `DDPMScheduler`
//!   `fixed_small` variance `(1 - abar_prev) / (1 - abar_t) * beta_t`. The noise of every step is
//!   an input too ([`Ddim::noise_draws`] chunks of it after the initial sample), so a parity check
//!   can hand reflex the very noise LeRobot drew.
//! - Flow matching (pi0, SmolVLA): the network predicts a velocity `v(x, t)`; `x` goes from noise at
//!   `t = 0` to an action chunk at `t = 1` in `steps` Euler steps.

use serde::{Deserialize, Serialize};

/// How betas grow over the training steps.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BetaSchedule {
    /// Linear from `beta_start` to `beta_end`.
    Linear,
    /// Squared cosine ("squaredcos_cap_v2", Nichol & Dhariwal 2021), the Diffusion Policy default.
    SquaredcosCapV2,
}

/// What the network predicts.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Prediction {
    /// The noise.
    Epsilon,
    /// The clean sample.
    Sample,
}

/// How a diffusion policy samples its chunk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sampler {
    /// DDIM with eta 0: deterministic given the initial noise.
    #[default]
    Ddim,
    /// DDPM: fresh noise at every step but the last.
    Ddpm,
}

impl Sampler {
    /// Whether it is DDIM (the default, left out of a written spec).
    pub fn is_ddim(&self) -> bool {
        *self == Sampler::Ddim
    }
}

/// A diffusion schedule and how it is sampled (DDIM, or DDPM when `sampler` says so).
#[derive(Clone, Debug, PartialEq)]
pub struct Ddim {
    /// Cumulative products of alphas, one per training step.
    pub alphas_cumprod: Vec<f64>,
    /// Training timesteps visited by the sampler, from noisy to clean.
    pub timesteps: Vec<usize>,
    /// Step between visited timesteps.
    pub step_ratio: usize,
    /// Clip the predicted clean sample to `[-clip, clip]` (0 = off).
    pub clip: f64,
    /// What the network predicts.
    pub prediction: Prediction,
    /// DDIM or DDPM.
    pub sampler: Sampler,
}

/// Betas of a schedule.
pub fn betas(schedule: BetaSchedule, steps: usize, beta_start: f64, beta_end: f64) -> Vec<f64> {
    match schedule {
        BetaSchedule::Linear => (0..steps)
            .map(|i| {
                if steps == 1 {
                    beta_start
                } else {
                    beta_start + (beta_end - beta_start) * i as f64 / (steps - 1) as f64
                }
            })
            .collect(),
        BetaSchedule::SquaredcosCapV2 => {
            let abar = |t: f64| {
                ((t + 0.008) / 1.008 * std::f64::consts::FRAC_PI_2)
                    .cos()
                    .powi(2)
            };
            (0..steps)
                .map(|i| {
                    (1.0 - abar((i + 1) as f64 / steps as f64) / abar(i as f64 / steps as f64))
                        .min(0.999)
                })
                .collect()
        }
    }
}

impl Ddim {
    /// A schedule of `train_steps` steps sampled in `inference_steps`.
    pub fn new(
        schedule: BetaSchedule,
        train_steps: usize,
        inference_steps: usize,
        beta_start: f64,
        beta_end: f64,
        clip: f64,
        prediction: Prediction,
    ) -> Self {
        assert!(inference_steps >= 1 && inference_steps <= train_steps);
        let mut acc = 1.0;
        let alphas_cumprod = betas(schedule, train_steps, beta_start, beta_end)
            .into_iter()
            .map(|b| {
                acc *= 1.0 - b;
                acc
            })
            .collect();
        let step_ratio = train_steps / inference_steps;
        let timesteps = (0..inference_steps).rev().map(|i| i * step_ratio).collect();
        Ddim {
            alphas_cumprod,
            timesteps,
            step_ratio,
            clip,
            prediction,
            sampler: Sampler::Ddim,
        }
    }

    /// The same schedule sampled with `sampler`.
    pub fn with_sampler(mut self, sampler: Sampler) -> Self {
        self.sampler = sampler;
        self
    }

    /// Chunks of fresh noise one sample draws after its initial one: DDPM's steps at `t > 0`;
    /// none for DDIM.
    pub fn noise_draws(&self) -> usize {
        match self.sampler {
            Sampler::Ddim => 0,
            Sampler::Ddpm => self.timesteps.iter().filter(|&&t| t > 0).count(),
        }
    }

    /// `alpha_bar` before timestep `t` in the sampler (1 past the first step, `set_alpha_to_one`).
    fn alpha_prev(&self, t: usize) -> f64 {
        if t >= self.step_ratio {
            self.alphas_cumprod[t - self.step_ratio]
        } else {
            1.0
        }
    }

    /// One deterministic DDIM step (eta = 0): from `x` at timestep `t` and the network output `out`
    /// to the sample at the previous visited timestep, in place.
    pub fn step(&self, t: usize, out: &[f32], x: &mut [f32]) {
        let a_t = self.alphas_cumprod[t];
        let a_prev = self.alpha_prev(t);
        let (sa, s1a) = (a_t.sqrt(), (1.0 - a_t).sqrt());
        for (xi, oi) in x.iter_mut().zip(out) {
            let (xv, ov) = (*xi as f64, *oi as f64);
            let (mut x0, eps) = match self.prediction {
                Prediction::Epsilon => ((xv - s1a * ov) / sa, ov),
                Prediction::Sample => (ov, (xv - sa * ov) / s1a),
            };
            if self.clip > 0.0 {
                x0 = x0.clamp(-self.clip, self.clip);
            }
            *xi = (a_prev.sqrt() * x0 + (1.0 - a_prev).sqrt() * eps) as f32;
        }
    }

    /// One DDPM step, as diffusers' `DDPMScheduler.step` with `fixed_small` variance: the
    /// posterior mean from `x` at timestep `t` and the network output `out`, plus `noise` (one
    /// chunk of standard normal values, unused at `t = 0`) times the posterior deviation, in place.
    pub fn step_ddpm(&self, t: usize, out: &[f32], x: &mut [f32], noise: &[f32]) {
        let a_t = self.alphas_cumprod[t];
        let a_prev = self.alpha_prev(t);
        let (b_t, b_prev) = (1.0 - a_t, 1.0 - a_prev);
        let alpha = a_t / a_prev;
        let beta = 1.0 - alpha;
        let c_x0 = a_prev.sqrt() * beta / b_t;
        let c_x = alpha.sqrt() * b_prev / b_t;
        let sd = if t > 0 {
            (b_prev / b_t * beta).max(1e-20).sqrt()
        } else {
            0.0
        };
        for (i, (xi, oi)) in x.iter_mut().zip(out).enumerate() {
            let (xv, ov) = (*xi as f64, *oi as f64);
            let mut x0 = match self.prediction {
                Prediction::Epsilon => (xv - b_t.sqrt() * ov) / a_t.sqrt(),
                Prediction::Sample => ov,
            };
            if self.clip > 0.0 {
                x0 = x0.clamp(-self.clip, self.clip);
            }
            let z = if t > 0 { noise[i] as f64 } else { 0.0 };
            *xi = (c_x0 * x0 + c_x * xv + sd * z) as f32;
        }
    }

    /// Runs the sampler from `x` (the initial noise, overwritten with the result), calling
    /// `denoise(x, t, out)` for the network output at each visited timestep.
    pub fn sample<E>(
        &self,
        x: &mut [f32],
        out: &mut [f32],
        mut denoise: impl FnMut(&[f32], usize, &mut [f32]) -> Result<(), E>,
    ) -> Result<(), E> {
        for &t in &self.timesteps {
            denoise(x, t, out)?;
            self.step(t, out, x);
        }
        Ok(())
    }
}

/// Flow-matching sampler: `steps` Euler steps of `x += dt * v(x, t)` from `t = 0` (noise) to 1.
pub fn flow_sample<E>(
    steps: usize,
    x: &mut [f32],
    v: &mut [f32],
    mut velocity: impl FnMut(&[f32], f32, &mut [f32]) -> Result<(), E>,
) -> Result<(), E> {
    let dt = 1.0 / steps as f32;
    for k in 0..steps {
        // `k / steps`, not `k * dt`: the same times, to the bit, as every other flow sampler
        // here (they differ at k = 9 of 10 in f32).
        let t = k as f32 / steps as f32;
        velocity(x, t, v)?;
        for (xi, vi) in x.iter_mut().zip(v.iter()) {
            *xi += dt * vi;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn squared_cosine_betas_match_reference_values() {
        // diffusers' betas_for_alpha_bar("cosine") for 100 steps: first and last values.
        let b = betas(BetaSchedule::SquaredcosCapV2, 100, 0.0, 0.0);
        // alpha_bar(0) = cos(0.008/1.008 * pi/2)^2; alpha_bar(0.01) = cos(0.018/1.008 * pi/2)^2.
        let ab = |t: f64| {
            ((t + 0.008) / 1.008 * std::f64::consts::FRAC_PI_2)
                .cos()
                .powi(2)
        };
        assert!((b[0] - (1.0 - ab(0.01) / ab(0.0))).abs() < 1e-15);
        assert!((b[0] - 6.3128e-4).abs() < 1e-7, "{}", b[0]);
        assert_eq!(b[99], 0.999);
    }

    #[test]
    fn ddim_matches_a_hand_computed_two_step_example() {
        // Linear betas 0.1, 0.2, 0.3, 0.4 (4 training steps), sampled in 2: timesteps 2, 0.
        // alpha_bar = 0.9, 0.72, 0.504, 0.3024. Denoiser eps(x) = 0.5 x, no clipping.
        let d = Ddim::new(
            BetaSchedule::Linear,
            4,
            2,
            0.1,
            0.4,
            0.0,
            Prediction::Epsilon,
        );
        assert_eq!(d.timesteps, vec![2, 0]);
        let ab = [0.9, 0.72, 0.504, 0.3024];
        for (a, b) in d.alphas_cumprod.iter().zip(ab) {
            assert!((a - b).abs() < 1e-12);
        }
        let mut x = [1.0f32, -2.0];
        let mut out = [0.0f32; 2];
        d.sample::<()>(&mut x, &mut out, |x, _, o| {
            o[0] = 0.5 * x[0];
            o[1] = 0.5 * x[1];
            Ok(())
        })
        .unwrap();
        // Step t = 2 -> prev 0: x0 = (1 - sqrt(0.496) 0.5) / sqrt(0.504) = 0.91257
        //   x' = sqrt(0.9) x0 + sqrt(0.1) 0.5 = 0.86575 + 0.15811 = 1.02386
        // Step t = 0 -> prev 1 (alpha 1): x0 = (x' - sqrt(0.1) 0.5 x') / sqrt(0.9)
        //   = 1.02386 * (1 - 0.15811) / 0.94868 = 0.90860
        let hand = 0.90860f32;
        assert!((x[0] - hand).abs() < 1e-4, "{} vs {hand}", x[0]);
        assert!((x[1] + 2.0 * hand).abs() < 2e-4, "linear in x: {}", x[1]);
    }

    #[test]
    fn ddim_is_deterministic_given_the_noise_and_clip_bounds_the_result() {
        let d = Ddim::new(
            BetaSchedule::SquaredcosCapV2,
            100,
            10,
            0.0,
            0.0,
            1.0,
            Prediction::Epsilon,
        );
        assert_eq!(d.timesteps, vec![90, 80, 70, 60, 50, 40, 30, 20, 10, 0]);
        let run = || {
            let mut x = [3.0f32, -0.5, 0.25];
            let mut o = [0.0f32; 3];
            d.sample::<()>(&mut x, &mut o, |x, t, o| {
                for (oi, xi) in o.iter_mut().zip(x) {
                    *oi = xi * 0.1 + t as f32 * 1e-3;
                }
                Ok(())
            })
            .unwrap();
            x
        };
        let a = run();
        assert_eq!(a, run());
        assert!(a.iter().all(|v| v.abs() <= 1.0 + 1e-6), "{a:?}");
    }

    #[test]
    fn ddpm_matches_a_hand_computed_two_step_example_and_adds_noise_only_before_the_last_step() {
        // The schedule of the DDIM example (abar 0.9, 0.72, 0.504, 0.3024; timesteps 2, 0).
        let d = Ddim::new(
            BetaSchedule::Linear,
            4,
            2,
            0.1,
            0.4,
            0.0,
            Prediction::Epsilon,
        )
        .with_sampler(Sampler::Ddpm);
        assert_eq!(d.noise_draws(), 1);
        // t = 2, prev 0: alpha = 0.504 / 0.9 = 0.56, beta = 0.44; eps(x) = 0.5 x at x = 1:
        // x0 = (1 - sqrt(0.496) 0.5) / sqrt(0.504) = 0.91257
        // mean = sqrt(0.9) 0.44 / 0.496 x0 + sqrt(0.56) 0.1 / 0.496 x = 0.76800 + 0.15088
        // sd = sqrt(0.1 / 0.496 * 0.44) = 0.29785; with z = 2: x' = 0.91888 + 0.59570 = 1.51458
        let mut x = [1.0f32];
        d.step_ddpm(2, &[0.5], &mut x, &[2.0]);
        assert!((x[0] - 1.51458).abs() < 1e-4, "{}", x[0]);
        // t = 0, prev alpha 1: alpha = 0.9, beta = 0.1; x' = x0 exactly, no noise.
        let mut y = [1.0f32];
        d.step_ddpm(0, &[0.5], &mut y, &[100.0]);
        let x0 = (1.0 - 0.1f64.sqrt() * 0.5) / 0.9f64.sqrt();
        assert!((y[0] as f64 - x0).abs() < 1e-6, "{} vs {x0}", y[0]);
        assert_eq!(d.clone().with_sampler(Sampler::Ddim).noise_draws(), 0);
    }

    #[test]
    fn flow_euler_integrates_a_constant_velocity_exactly() {
        let mut x = [0.0f32, 1.0];
        let mut v = [0.0f32; 2];
        flow_sample::<()>(10, &mut x, &mut v, |_, _, v| {
            v[0] = 2.0;
            v[1] = -1.0;
            Ok(())
        })
        .unwrap();
        assert!((x[0] - 2.0).abs() < 1e-6 && x[1].abs() < 1e-6);
    }
}
