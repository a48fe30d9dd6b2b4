//! A simulated person for training in simulation: watches the robot, takes over with the
//! scripted expert when it stalls or strays, holds for a few steps, gives control back, and labels
//! success.
//!
//! Criteria (all configurable, checked from the observation only, like a person watching):
//! - **stall**: the tool centre moved less than `stall_m` over the last `stall_steps` steps;
//! - **stray**: the tool centre is more than `stray_m` (in the table plane) from the object while
//!   the object has not been lifted yet;
//! - **late**: more than `late_fraction` of the time limit has passed without success.
//!
//! When a criterion fires (not before `min_step`), the person takes over with probability `rate`,
//! at most `max_interventions` times per episode, and drives with the expert (its action noise is
//! the person's `skill` knob) for `hold_steps` steps.

use crate::expert::{Expert, ExpertError};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use reflex_runtime::msg::{Observation, PROTOCOL_VERSION, RobotSpec, TeleopMsg};
use serde::Deserialize;
use std::ops::Range;

fn d_rate() -> f64 {
    1.0
}
fn d_hold() -> u32 {
    12
}
fn d_stall_steps() -> u32 {
    15
}
fn d_stall_m() -> f64 {
    0.005
}
fn d_stray_m() -> f64 {
    0.12
}
fn d_late() -> f64 {
    0.7
}
fn d_max() -> u32 {
    2
}
fn d_min_step() -> u32 {
    25
}

/// The simulated person (`[human]` in a config).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HumanConfig {
    /// Probability of taking over when a criterion fires.
    #[serde(default = "d_rate")]
    pub rate: f64,
    /// Steps per takeover.
    #[serde(default = "d_hold")]
    pub hold_steps: u32,
    /// Window of the stall criterion, steps.
    #[serde(default = "d_stall_steps")]
    pub stall_steps: u32,
    /// Movement below which the robot counts as stalled, m.
    #[serde(default = "d_stall_m")]
    pub stall_m: f64,
    /// Distance from the object beyond which the robot counts as straying, m.
    #[serde(default = "d_stray_m")]
    pub stray_m: f64,
    /// Fraction of the time limit after which a person steps in.
    #[serde(default = "d_late")]
    pub late_fraction: f64,
    /// Takeovers per episode at most.
    #[serde(default = "d_max")]
    pub max_interventions: u32,
    /// No takeover before this step.
    #[serde(default = "d_min_step")]
    pub min_step: u32,
    /// Action noise of the person's commands (the expert's noise knob).
    #[serde(default)]
    pub skill_noise: f64,
    /// Seed.
    #[serde(default)]
    pub seed: u64,
}

impl Default for HumanConfig {
    fn default() -> Self {
        toml::from_str("").expect("defaults")
    }
}

/// The simulated person.
pub struct SimHuman {
    cfg: HumanConfig,
    expert: Expert,
    rng: ChaCha8Rng,
    ee: Range<usize>,
    object: Option<Range<usize>>,
    history: Vec<[f64; 3]>,
    holding: u32,
    interventions: u32,
    object_z0: f64,
    seq: u64,
    max_steps: u32,
    /// Takeovers so far.
    pub total_interventions: u64,
    /// Takeovers by the criterion that fired: stall, stray, late (several may fire at once).
    pub reasons: TakeoverReasons,
}

/// How often each takeover criterion fired when the person took over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TakeoverReasons {
    /// The tool barely moved over the stall window.
    pub stall: u64,
    /// The tool was far from the object before it was lifted.
    pub stray: u64,
    /// Late in the episode.
    pub late: u64,
}

impl SimHuman {
    /// A person for the robot described by `spec` (a simulator task).
    pub fn new(spec: &RobotSpec, cfg: HumanConfig) -> Result<Self, ExpertError> {
        let expert = Expert::new(spec, cfg.skill_noise, cfg.seed ^ 0x4a11)?;
        let ee = spec
            .field("ee_pos")
            .ok_or_else(|| ExpertError::MissingField("ee_pos".into()))?;
        Ok(SimHuman {
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            object: spec.field("object_pos"),
            ee,
            history: Vec::with_capacity(64),
            holding: 0,
            interventions: 0,
            object_z0: 0.0,
            seq: 0,
            max_steps: spec.max_episode_steps,
            expert,
            total_interventions: 0,
            reasons: TakeoverReasons::default(),
            cfg,
        })
    }

    /// Whether the person is driving now.
    pub fn intervening(&self) -> bool {
        self.holding > 0
    }

    /// Looks at `obs` and fills the teleop message for this step (`msg.action` must have the
    /// action dimension).
    pub fn act(&mut self, obs: &Observation, msg: &mut TeleopMsg) {
        let ee = {
            let s = &obs.state[self.ee.clone()];
            [s[0] as f64, s[1] as f64, s[2] as f64]
        };
        if obs.step == 0 {
            self.history.clear();
            self.holding = 0;
            self.interventions = 0;
            self.object_z0 = self
                .object
                .as_ref()
                .map_or(0.0, |r| obs.state[r.start + 2] as f64);
        }
        self.history.push(ee);
        let w = self.cfg.stall_steps as usize;
        if self.history.len() > w + 1 {
            self.history.remove(0);
        }
        if self.holding == 0
            && obs.step >= self.cfg.min_step
            && self.interventions < self.cfg.max_interventions
            && !obs.success
        {
            let stalled = self.history.len() > w && {
                let a = self.history[0];
                ((ee[0] - a[0]).powi(2) + (ee[1] - a[1]).powi(2) + (ee[2] - a[2]).powi(2)).sqrt()
                    < self.cfg.stall_m
            };
            let strayed = self.object.as_ref().is_some_and(|r| {
                let o = &obs.state[r.clone()];
                let lifted = o[2] as f64 > self.object_z0 + 0.01;
                let d = ((ee[0] - o[0] as f64).powi(2) + (ee[1] - o[1] as f64).powi(2)).sqrt();
                !lifted && d > self.cfg.stray_m
            });
            let late = self.max_steps > 0
                && obs.step as f64 > self.cfg.late_fraction * self.max_steps as f64;
            if (stalled || strayed || late) && self.rng.random::<f64>() < self.cfg.rate {
                self.holding = self.cfg.hold_steps;
                self.interventions += 1;
                self.total_interventions += 1;
                self.reasons.stall += stalled as u64;
                self.reasons.stray += strayed as u64;
                self.reasons.late += late as u64;
                // The expert plans from what it sees now.
                self.expert.take_over();
            }
        }
        self.seq += 1;
        msg.v = PROTOCOL_VERSION;
        msg.seq = self.seq;
        msg.success = obs.success;
        msg.failure = false;
        msg.reset = false;
        if self.holding > 0 {
            self.expert.act(obs, &mut msg.action);
            msg.intervene = true;
            self.holding -= 1;
        } else {
            msg.intervene = false;
        }
    }
}
