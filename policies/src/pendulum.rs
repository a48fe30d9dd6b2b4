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

    /// Starts an episode hanging down: angle within 0.3 rad of the bottom, speed within 0.5 rad/s
    /// (the sparse swing-up task, where the reward can only be found by a full swing-up).
    pub fn reset_hanging(&mut self) -> [f32; 3] {
        self.th = std::f64::consts::PI + self.rng.random_range(-0.3..0.3);
        self.thdot = self.rng.random_range(-0.5..0.5);
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

/// A competent swing-up controller: energy pumping at full torque until the pendulum has the
/// energy of the upright state, then a PD catch near the top. `catch_gain` scales the catch's
/// gains: at 1 it swings up and balances from a hanging start; a gain error lets the pendulum
/// arrive at the top and fall through. The weakened base of the residual-learning test.
pub fn swing_up(obs: &[f32; 3], catch_gain: f64) -> f64 {
    let (c, s, w) = (obs[0] as f64, obs[1] as f64, obs[2] as f64);
    let th = s.atan2(c);
    if c > 0.9 {
        // Near the top: PD on the angle (gravity pulls with 15 sin th; the torque enters as 3 u).
        (-(12.0 * catch_gain) * th - 2.5 * catch_gain * w).clamp(-MAX_TORQUE, MAX_TORQUE)
    } else {
        // Energy (per unit inertia, zero when upright at rest): pump while below it, brake above.
        let e = w * w / 6.0 + G / 2.0 * (c - 1.0);
        let dir = if w.abs() < 1e-3 { 1.0 } else { w.signum() };
        if e < 0.0 {
            MAX_TORQUE * dir
        } else {
            -0.5 * MAX_TORQUE * dir
        }
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
