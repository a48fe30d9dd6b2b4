//! A Rust port of Gymnasium's `Pendulum-v1` (gymnasium/envs/classic_control/pendulum.py, v1.x):
//! the learning benchmark of the SAC learner.
//!
//! Dynamics with g = 10, m = l = 1, dt = 0.05, torque limit 2, speed limit 8; reward
//! `-(angle_normalize(th)^2 + 0.1 thdot^2 + 0.001 u^2)`; observation `[cos th, sin th, thdot]`;
//! reset uniform in `th in [-pi, pi]`, `thdot in [-1, 1]`; 200-step time limit (truncation).
//! A test checks trajectories against the gymnasium package itself.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Largest torque.
pub const MAX_TORQUE: f64 = 2.0;
/// Largest angular speed.
pub const MAX_SPEED: f64 = 8.0;
/// Time step, s.
pub const DT: f64 = 0.05;
/// Gravity (gymnasium's default).
pub const G: f64 = 10.0;
/// Time limit.
pub const MAX_STEPS: u32 = 200;

/// `angle_normalize` of gymnasium: into [-pi, pi).
pub fn angle_normalize(x: f64) -> f64 {
    (x + std::f64::consts::PI).rem_euclid(2.0 * std::f64::consts::PI) - std::f64::consts::PI
}

/// The pendulum.
#[derive(Clone, Debug)]
pub struct Pendulum {
    /// Angle, rad (0 = upright).
    pub th: f64,
    /// Angular speed, rad/s.
    pub thdot: f64,
    /// Steps in the episode.
    pub steps: u32,
    rng: ChaCha8Rng,
}

/// The result of a step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Step {
    /// Observation.
    pub obs: [f32; 3],
    /// Reward.
    pub reward: f64,
    /// Time limit reached.
    pub truncated: bool,
}

impl Pendulum {
    /// A pendulum whose resets draw from `seed`.
    pub fn new(seed: u64) -> Self {
        Pendulum {
            th: 0.0,
            thdot: 0.0,
            steps: 0,
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// The observation.
    pub fn obs(&self) -> [f32; 3] {
        [
            self.th.cos() as f32,
            self.th.sin() as f32,
            self.thdot as f32,
        ]
    }

    /// Starts an episode at a random state.
    pub fn reset(&mut self) -> [f32; 3] {
        self.th = self
            .rng
            .random_range(-std::f64::consts::PI..std::f64::consts::PI);
        self.thdot = self.rng.random_range(-1.0..1.0);
        self.steps = 0;
        self.obs()
    }

    /// Starts an episode at a given state (to compare with gymnasium).
    pub fn reset_to(&mut self, th: f64, thdot: f64) -> [f32; 3] {
        self.th = th;
        self.thdot = thdot;
        self.steps = 0;
        self.obs()
    }

    /// Applies torque `u` for one step.
    pub fn step(&mut self, u: f64) -> Step {
        let u = u.clamp(-MAX_TORQUE, MAX_TORQUE);
        let cost = angle_normalize(self.th).powi(2) + 0.1 * self.thdot.powi(2) + 0.001 * u * u;
        let mut thdot = self.thdot + (3.0 * G / 2.0 * self.th.sin() + 3.0 * u) * DT;
        thdot = thdot.clamp(-MAX_SPEED, MAX_SPEED);
        self.th += thdot * DT;
        self.thdot = thdot;
        self.steps += 1;
        Step {
            obs: self.obs(),
            reward: -cost,
            truncated: self.steps >= MAX_STEPS,
        }
    }

    /// Upright and nearly still: |angle| < 0.1 rad and |speed| < 0.5 rad/s (the sparse success of
    /// the residual-learning test).
    pub fn upright(&self) -> bool {
        angle_normalize(self.th).abs() < 0.1 && self.thdot.abs() < 0.5
    }
}

/// A competent swing-up controller (energy pumping, then a PD catch near the top), with its
/// gains multiplied by `gain`: at `gain = 1` it balances from almost every start; a gain error
/// makes it overshoot or fall short. The weakened base of the residual-learning test.
pub fn swing_up(obs: &[f32; 3], gain: f64) -> f64 {
    let (c, s, w) = (obs[0] as f64, obs[1] as f64, obs[2] as f64);
    let th = s.atan2(c);
    if c > 0.85 {
        // Near the top: PD on the angle (with the torque's 3/(m l^2) factor, these gains
        // overcome gravity's 15 sin th).
        (-(10.0 * gain) * th - 2.0 * gain * w).clamp(-MAX_TORQUE, MAX_TORQUE)
    } else {
        // Energy pumping: E = 0.5 w^2 / 3 + g/2 (cos th - 1) ... push along w while below the
        // energy of the upright state.
        let e = w * w / 6.0 + G / 2.0 * (c - 1.0);
        let push = if e < 0.0 { 1.0 } else { -0.3 };
        (push * MAX_TORQUE * gain * w.signum()).clamp(-MAX_TORQUE, MAX_TORQUE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_hand_computed_step() {
        let mut p = Pendulum::new(0);
        p.reset_to(1.0, 0.5);
        let s = p.step(1.0);
        // cost = 1 + 0.1 * 0.25 + 0.001 = 1.026
        assert!((s.reward + 1.026).abs() < 1e-12);
        let w = 0.5 + (15.0 * 1f64.sin() + 3.0) * 0.05;
        assert!((p.thdot - w).abs() < 1e-12);
        assert!((p.th - (1.0 + w * 0.05)).abs() < 1e-12);
        assert_eq!(s.obs, [p.th.cos() as f32, p.th.sin() as f32, w as f32]);
    }
}
