//! Real-time chunking: the next chunk sampled as an inpainting of the one the robot is executing.
//!
//! Black, Galliker and Levine 2025, "Real-Time Execution of Action Chunking Flow Policies"
//! (arXiv 2506.07339). While a slow policy samples its next chunk, the robot keeps executing the
//! current one. The new chunk starts at the time of the observation it was computed from, so its
//! first `d` actions (`d` the inference delay in control ticks) will already have been executed
//! from the old chunk by the time it arrives, and the rest of the overlap is what the old chunk
//! planned. Sampling the new chunk with that prefix as an inpainting constraint keeps the arm from
//! jumping at the chunk boundary:
//!
//! - rows `i < d` are frozen to the old chunk (weight 1);
//! - rows `d <= i < end` (`end` = how far the old chunk reaches into the new one) are pulled
//!   toward it with a weight that decays (the paper's exponential schedule, eq. 5:
//!   `c_i = (end - i) / (end - d + 1)`, `w_i = c_i (e^{c_i} - 1) / (e - 1)`);
//! - rows `i >= end` are free.
//!
//! With a vector-Jacobian product of the velocity network, each Euler step is guided toward the
//! weighted target (ΠGDM-style, Algorithm 1 of the paper): the clean-chunk estimate
//! `x1 = x + (1 - t) v`, its weighted error `e = W (Y - x1)`, the correction
//! `g = e + (1 - t) J_v(x)^T e` and the step `x += dt (v + min(beta, r(t)) g)` with
//! `r(t) = (t^2 + (1 - t)^2) / (t (1 - t))` (the paper's `(1 - t)/t * 1/r_t^2`) clipped at
//! `beta` (`max_guidance_weight`, 5 in the paper). Without a VJP the sampler falls back to hard
//! inpainting: before every step the frozen rows are set to the point the flow would have
//! reached from the same noise toward the old chunk (`(1 - t) noise + t Y`), and nothing else is
//! guided. Either way the returned chunk's frozen rows are the old chunk's values, bit for bit:
//! they are what the robot executes.
//!
//! Time runs from 0 (noise) to 1 (actions), as in reflex's flow sampler and the paper's code.

use serde::{Deserialize, Serialize};

/// How the guidance weight falls over the soft part of the overlap (the paper's
/// `prefix_attention_schedule`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrefixSchedule {
    /// Only the frozen rows are guided (hard inpainting of the delay, nothing softer).
    Zeros,
    /// The whole overlap at full weight.
    Ones,
    /// A linear ramp from 1 to 0 over the soft rows.
    Linear,
    /// The paper's exponential ramp (eq. 5).
    #[default]
    Exp,
}

/// `[policy.rtc]`: real-time chunking for a diffusion or flow policy. Off unless `enabled`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RtcConfig {
    /// Sample each chunk as an inpainting of the executing one.
    pub enabled: bool,
    /// Weights over the soft part of the overlap.
    pub prefix_attention_schedule: PrefixSchedule,
    /// The clip `beta` on the guidance weight (the paper uses 5).
    pub max_guidance_weight: f32,
    /// Guide a flow policy's sampling with its VJP graph when the model has one (the paper's
    /// method); `false` inpaints hard even then (for comparing the two).
    pub guidance: bool,
}

impl Default for RtcConfig {
    fn default() -> Self {
        RtcConfig {
            enabled: false,
            prefix_attention_schedule: PrefixSchedule::Exp,
            max_guidance_weight: 5.0,
            guidance: true,
        }
    }
}

/// The weights of a chunk of `out.len()` rows with `delay` frozen rows and the old chunk
/// reaching `end` rows into the new one (`end` takes precedence: a delay past it is cut to it).
pub fn prefix_weights(delay: usize, end: usize, schedule: PrefixSchedule, out: &mut [f32]) {
    let total = out.len();
    let end = end.min(total);
    let delay = delay.min(end);
    for (i, w) in out.iter_mut().enumerate() {
        *w = if i >= end {
            0.0
        } else if i < delay {
            1.0
        } else {
            match schedule {
                PrefixSchedule::Zeros => 0.0,
                PrefixSchedule::Ones => 1.0,
                PrefixSchedule::Linear | PrefixSchedule::Exp => {
                    let c = (end - i) as f32 / (end - delay + 1) as f32;
                    if schedule == PrefixSchedule::Exp {
                        c * c.exp_m1() / (std::f32::consts::E - 1.0)
                    } else {
                        c
                    }
                }
            }
        };
    }
}

/// The guidance weight at flow time `t` in [0, 1): `min(beta, (t^2 + (1-t)^2) / (t (1-t)))`,
/// `beta` at the ends where the ratio is unbounded.
pub fn guidance_weight(t: f32, beta: f32) -> f32 {
    let (a, b) = (t, 1.0 - t);
    if a <= 0.0 || b <= 0.0 {
        return beta;
    }
    ((a * a + b * b) / (a * b)).min(beta)
}

/// What the new chunk is inpainted toward: the old chunk's actions at the new chunk's times
/// (normalised units, `rows * dim` values, row-major; only the first `end` rows are read).
#[derive(Clone, Copy, Debug)]
pub struct Prefix<'a> {
    /// The old chunk's actions, aligned with the new chunk's rows.
    pub target: &'a [f32],
    /// Rows the robot executes from the old chunk while the new one is sampled.
    pub delay: usize,
    /// Rows the old chunk covers.
    pub end: usize,
}

/// A velocity network's vector-Jacobian product: `vjp(x, t, e, out)` writes `J_v(x)^T e`.
pub type Vjp<'a, E> = &'a mut dyn FnMut(&[f32], f32, &[f32], &mut [f32]) -> Result<(), E>;

/// Which sampler ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RtcVariant {
    /// Guided sampling with the velocity network's VJP (the paper's method).
    Guided,
    /// Hard replacement of the frozen rows at every step (no VJP available).
    Hard,
}

/// Buffers a guided sampler works in, sized once (the policy thread reuses them).
#[derive(Clone, Debug, Default)]
pub struct RtcScratch {
    weights: Vec<f32>,
    noise: Vec<f32>,
    err: Vec<f32>,
    jt_err: Vec<f32>,
}

impl RtcScratch {
    /// Scratch for chunks of `rows` actions of `dim` values.
    pub fn new(rows: usize, dim: usize) -> Self {
        RtcScratch {
            weights: vec![0.0; rows],
            noise: vec![0.0; rows * dim],
            err: vec![0.0; rows * dim],
            jt_err: vec![0.0; rows * dim],
        }
    }

    /// The weights of the last call.
    pub fn weights(&self) -> &[f32] {
        &self.weights
    }
}

/// Flow sampling of `x` (the initial noise on entry, the chunk on return; `rows * dim` values)
/// in `steps` Euler steps, inpainted toward `prefix`. `velocity(x, t, v)` writes the velocity;
/// `vjp`, when given, writes `J_v(x)^T e` for `vjp(x, t, e, out)` and selects guided sampling,
/// otherwise hard inpainting runs. `v` is the caller's velocity buffer.
#[allow(clippy::too_many_arguments)]
pub fn rtc_flow_sample<E>(
    cfg: &RtcConfig,
    steps: usize,
    dim: usize,
    prefix: Prefix<'_>,
    x: &mut [f32],
    v: &mut [f32],
    scratch: &mut RtcScratch,
    mut velocity: impl FnMut(&[f32], f32, &mut [f32]) -> Result<(), E>,
    mut vjp: Option<Vjp<'_, E>>,
) -> Result<RtcVariant, E> {
    let rows = x.len() / dim;
    assert_eq!(rows * dim, x.len(), "the chunk is rows x dim");
    assert!(prefix.target.len() >= prefix.end.min(rows) * dim);
    scratch.weights.resize(rows, 0.0);
    scratch.noise.resize(x.len(), 0.0);
    scratch.err.resize(x.len(), 0.0);
    scratch.jt_err.resize(x.len(), 0.0);
    prefix_weights(
        prefix.delay,
        prefix.end,
        cfg.prefix_attention_schedule,
        &mut scratch.weights,
    );
    let frozen = prefix.delay.min(prefix.end).min(rows);
    let variant = if vjp.is_some() {
        RtcVariant::Guided
    } else {
        RtcVariant::Hard
    };
    scratch.noise.copy_from_slice(x);
    let dt = 1.0 / steps as f32;
    for k in 0..steps {
        // `k / steps`, not `k * dt`: the same times, to the bit, as every other flow sampler
        // here (they differ at k = 9 of 10 in f32).
        let t = k as f32 / steps as f32;
        if variant == RtcVariant::Hard {
            let (noise, target) = (
                &scratch.noise[..frozen * dim],
                &prefix.target[..frozen * dim],
            );
            for ((xj, n), y) in x[..frozen * dim].iter_mut().zip(noise).zip(target) {
                *xj = (1.0 - t) * n + t * y;
            }
        }
        velocity(x, t, v)?;
        let w = guidance_weight(t, cfg.max_guidance_weight);
        match vjp.as_deref_mut() {
            Some(vjp) if w != 0.0 => {
                // e = W (Y - x1), x1 = x + (1 - t) v, over the rows the old chunk covers.
                for r in 0..rows {
                    let wr = scratch.weights[r];
                    for c in 0..dim {
                        let j = r * dim + c;
                        scratch.err[j] = if wr == 0.0 {
                            0.0
                        } else {
                            wr * (prefix.target[j] - (x[j] + (1.0 - t) * v[j]))
                        };
                    }
                }
                vjp(x, t, &scratch.err, &mut scratch.jt_err)?;
                for j in 0..x.len() {
                    let g = scratch.err[j] + (1.0 - t) * scratch.jt_err[j];
                    x[j] += dt * (v[j] + w * g);
                }
            }
            _ => {
                for (xi, vi) in x.iter_mut().zip(v.iter()) {
                    *xi += dt * vi;
                }
            }
        }
    }
    x[..frozen * dim].copy_from_slice(&prefix.target[..frozen * dim]);
    Ok(variant)
}

/// DDIM sampling with hard inpainting of the frozen rows: before every step they are set to the
/// old chunk's actions noised to that step (`sqrt(abar) Y + sqrt(1 - abar) noise`, the same noise
/// the sample started from), and the returned chunk holds the old chunk's values there. (The
/// paper's guidance is derived for flow policies; a diffusion policy gets this variant.)
pub fn rtc_ddim_sample<E>(
    ddim: &crate::sampler::Ddim,
    dim: usize,
    prefix: Prefix<'_>,
    x: &mut [f32],
    out: &mut [f32],
    noise: &mut Vec<f32>,
    mut denoise: impl FnMut(&[f32], usize, &mut [f32]) -> Result<(), E>,
) -> Result<RtcVariant, E> {
    let rows = x.len() / dim;
    let frozen = prefix.delay.min(prefix.end).min(rows);
    noise.clear();
    noise.extend_from_slice(x);
    for &t in &ddim.timesteps {
        let ab = ddim.alphas_cumprod[t];
        let (sa, s1a) = (ab.sqrt(), (1.0 - ab).sqrt());
        for j in 0..frozen * dim {
            x[j] = (sa * prefix.target[j] as f64 + s1a * noise[j] as f64) as f32;
        }
        denoise(x, t, out)?;
        ddim.step(t, out, x);
    }
    x[..frozen * dim].copy_from_slice(&prefix.target[..frozen * dim]);
    Ok(RtcVariant::Hard)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::flow_sample;

    #[test]
    fn the_weights_follow_the_papers_exponential_schedule() {
        // Eq. 5 of arXiv 2506.07339 with H = 10, d = 2 and the old chunk reaching 6 rows.
        let mut w = [0.0f32; 10];
        prefix_weights(2, 6, PrefixSchedule::Exp, &mut w);
        let e1 = std::f32::consts::E - 1.0;
        for (i, &wi) in w.iter().enumerate() {
            let want = if i < 2 {
                1.0
            } else if i < 6 {
                let c = (6 - i) as f32 / 5.0;
                c * (c.exp() - 1.0) / e1
            } else {
                0.0
            };
            assert!((wi - want).abs() < 1e-6, "row {i}: {wi} vs {want}");
        }
        // The linear schedule is the reference code's docstring example: 1 1 4/5 3/5 2/5 1/5 0...
        prefix_weights(2, 6, PrefixSchedule::Linear, &mut w);
        let lin = [1.0, 1.0, 0.8, 0.6, 0.4, 0.2, 0.0, 0.0, 0.0, 0.0];
        for (a, b) in w.iter().zip(lin) {
            assert!((a - b).abs() < 1e-6, "{w:?}");
        }
        prefix_weights(2, 6, PrefixSchedule::Zeros, &mut w);
        assert_eq!(w, [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        prefix_weights(2, 6, PrefixSchedule::Ones, &mut w);
        assert_eq!(w, [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
        // A delay past the old chunk's end is cut to it.
        prefix_weights(8, 3, PrefixSchedule::Exp, &mut w);
        assert_eq!(w, [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn the_guidance_weight_is_clipped_at_beta_and_smallest_mid_flow() {
        assert_eq!(guidance_weight(0.0, 5.0), 5.0);
        assert_eq!(guidance_weight(0.5, 5.0), 2.0);
        assert_eq!(guidance_weight(0.9, 5.0), 5.0);
        let t = 0.3f32;
        let want = (1.0 - t) / t * (t * t + (1.0 - t) * (1.0 - t)) / ((1.0 - t) * (1.0 - t));
        assert!((guidance_weight(t, 100.0) - want).abs() < 1e-5);
    }

    /// A velocity field with a known Jacobian: `v(x) = A x + b(t)` per row, `A` mixing the
    /// components of a row.
    fn linear_field(dim: usize) -> impl Fn(&[f32], f32, &mut [f32]) {
        move |x: &[f32], t: f32, v: &mut [f32]| {
            for r in 0..x.len() / dim {
                for c in 0..dim {
                    let mut s = 0.3 * t + 0.1 * c as f32 - 0.05 * r as f32;
                    for k in 0..dim {
                        s += (0.2 * (c as f32 - k as f32) - 0.4 * (c == k) as i32 as f32)
                            * x[r * dim + k];
                    }
                    v[r * dim + c] = s;
                }
            }
        }
    }

    fn linear_field_vjp(dim: usize) -> impl Fn(&[f32], f32, &[f32], &mut [f32]) {
        move |x: &[f32], _t: f32, e: &[f32], out: &mut [f32]| {
            for r in 0..x.len() / dim {
                for k in 0..dim {
                    let mut s = 0.0;
                    for c in 0..dim {
                        s += (0.2 * (c as f32 - k as f32) - 0.4 * (c == k) as i32 as f32)
                            * e[r * dim + c];
                    }
                    out[r * dim + k] = s;
                }
            }
        }
    }

    fn noise(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 % 97) as f32 / 48.5) - 1.0)
            .collect()
    }

    #[test]
    fn guided_sampling_with_zero_guidance_weight_is_plain_sampling() {
        let (rows, dim) = (8, 3);
        let field = linear_field(dim);
        let jac = linear_field_vjp(dim);
        let mut plain = noise(rows * dim);
        let mut v = vec![0.0; rows * dim];
        flow_sample::<()>(10, &mut plain, &mut v, |x, t, v| {
            field(x, t, v);
            Ok(())
        })
        .unwrap();
        let cfg = RtcConfig {
            enabled: true,
            max_guidance_weight: 0.0,
            ..RtcConfig::default()
        };
        let target = vec![0.7; rows * dim];
        let mut x = noise(rows * dim);
        let mut scratch = RtcScratch::new(rows, dim);
        let mut vjp = |x: &[f32], t: f32, e: &[f32], o: &mut [f32]| -> Result<(), ()> {
            jac(x, t, e, o);
            Ok(())
        };
        let prefix = Prefix {
            target: &target,
            delay: 0,
            end: 5,
        };
        let variant = rtc_flow_sample::<()>(
            &cfg,
            10,
            dim,
            prefix,
            &mut x,
            &mut v,
            &mut scratch,
            |x, t, v| {
                field(x, t, v);
                Ok(())
            },
            Some(&mut vjp),
        )
        .unwrap();
        assert_eq!(variant, RtcVariant::Guided);
        assert_eq!(x, plain, "bit for bit");
    }

    #[test]
    fn the_frozen_rows_are_the_old_chunks_bit_for_bit_and_guidance_pulls_the_overlap() {
        let (rows, dim, delay, end) = (10, 2, 3, 7);
        let field = linear_field(dim);
        let jac = linear_field_vjp(dim);
        let target: Vec<f32> = (0..rows * dim).map(|j| 0.9 - 0.13 * j as f32).collect();
        let mut v = vec![0.0; rows * dim];
        let run = |guided: bool, beta: f32, v: &mut Vec<f32>| {
            let cfg = RtcConfig {
                enabled: true,
                max_guidance_weight: beta,
                ..RtcConfig::default()
            };
            let mut x = noise(rows * dim);
            let mut scratch = RtcScratch::new(rows, dim);
            let mut vjp = |x: &[f32], t: f32, e: &[f32], o: &mut [f32]| -> Result<(), ()> {
                jac(x, t, e, o);
                Ok(())
            };
            let variant = rtc_flow_sample::<()>(
                &cfg,
                10,
                dim,
                Prefix {
                    target: &target,
                    delay,
                    end,
                },
                &mut x,
                v,
                &mut scratch,
                |x, t, v| {
                    field(x, t, v);
                    Ok(())
                },
                if guided { Some(&mut vjp) } else { None },
            )
            .unwrap();
            (x, variant)
        };
        let (free, _) = run(true, 0.0, &mut v);
        let (guided, variant) = run(true, 5.0, &mut v);
        let (hard, hard_variant) = run(false, 5.0, &mut v);
        assert_eq!(variant, RtcVariant::Guided);
        assert_eq!(hard_variant, RtcVariant::Hard);
        for out in [&guided, &hard] {
            assert_eq!(
                out[..delay * dim],
                target[..delay * dim],
                "frozen rows bit for bit"
            );
        }
        // Guidance brings the soft rows toward the old chunk, the more the higher their weight;
        // unweighted rows feel it only through the field's coupling, which is per row here, so
        // they do not move at all.
        let mut w = vec![0.0; rows];
        prefix_weights(delay, end, PrefixSchedule::Exp, &mut w);
        let dist = |x: &[f32], r: usize| -> f32 {
            (0..dim)
                .map(|c| (x[r * dim + c] - target[r * dim + c]).abs())
                .sum()
        };
        let weighted = |x: &[f32]| -> f32 { (delay..end).map(|r| w[r] * dist(x, r)).sum() };
        assert!(
            weighted(&guided) < 0.5 * weighted(&free),
            "weighted distance to the old chunk: guided {} free {}",
            weighted(&guided),
            weighted(&free)
        );
        for r in (delay..end).filter(|&r| w[r] > 0.25) {
            assert!(dist(&guided, r) < dist(&free, r), "row {r}");
        }
        assert_eq!(guided[end * dim..], free[end * dim..]);
    }

    #[test]
    fn the_guided_correction_uses_the_true_vjp_of_the_clean_estimate() {
        // For one step from t = 0.2, the guided update differs from the plain one by
        // dt * w * (e + (1 - t) J^T e); compare J^T e with central finite differences of the
        // field, so the VJP convention (transpose, not Jacobian) is the one the paper needs.
        let (rows, dim) = (2, 3);
        let field = linear_field(dim);
        let jac = linear_field_vjp(dim);
        let x = noise(rows * dim);
        let e: Vec<f32> = (0..rows * dim).map(|j| 0.3 - 0.1 * j as f32).collect();
        let mut jt = vec![0.0; rows * dim];
        jac(&x, 0.2, &e, &mut jt);
        let h = 1e-2f32;
        for k in 0..rows * dim {
            let (mut xp, mut xm) = (x.clone(), x.clone());
            xp[k] += h;
            xm[k] -= h;
            let (mut vp, mut vm) = (vec![0.0; rows * dim], vec![0.0; rows * dim]);
            field(&xp, 0.2, &mut vp);
            field(&xm, 0.2, &mut vm);
            let fd: f32 = (0..rows * dim)
                .map(|j| e[j] * (vp[j] - vm[j]) / (2.0 * h))
                .sum();
            assert!(
                (fd - jt[k]).abs() < 1e-3,
                "component {k}: {fd} vs {}",
                jt[k]
            );
        }
    }

    #[test]
    fn ddim_inpainting_freezes_the_prefix_and_leaves_an_empty_prefix_alone() {
        use crate::sampler::{BetaSchedule, Ddim, Prediction};
        let d = Ddim::new(
            BetaSchedule::SquaredcosCapV2,
            100,
            10,
            0.0,
            0.0,
            1.0,
            Prediction::Epsilon,
        );
        let (rows, dim) = (6, 2);
        let target: Vec<f32> = (0..rows * dim).map(|j| 0.5 - 0.07 * j as f32).collect();
        let eps = |x: &[f32], _t: usize, o: &mut [f32]| -> Result<(), ()> {
            for (o, x) in o.iter_mut().zip(x) {
                *o = 0.3 * x;
            }
            Ok(())
        };
        let mut noise_buf = vec![];
        let mut out = vec![0.0; rows * dim];
        let mut x = noise(rows * dim);
        rtc_ddim_sample(
            &d,
            dim,
            Prefix {
                target: &target,
                delay: 2,
                end: 4,
            },
            &mut x,
            &mut out,
            &mut noise_buf,
            eps,
        )
        .unwrap();
        assert_eq!(x[..2 * dim], target[..2 * dim]);
        let mut plain = noise(rows * dim);
        d.sample(&mut plain, &mut out, eps).unwrap();
        let mut x = noise(rows * dim);
        rtc_ddim_sample(
            &d,
            dim,
            Prefix {
                target: &target,
                delay: 0,
                end: 4,
            },
            &mut x,
            &mut out,
            &mut noise_buf,
            eps,
        )
        .unwrap();
        assert_eq!(x, plain, "no frozen rows: plain DDIM");
    }
}
