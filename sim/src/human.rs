//! A simulated person for training in simulation: watches the robot, takes over with the
//! scripted expert when it stalls or strays, holds for a few steps, gives control back, and labels
//! success.
//!
//! Criteria (all configurable, checked from the observation only, like a person watching):
//! - **stall**: the tool centre moved less than `stall_m` over the last `stall_steps` steps;
//! - **stray**: the tool centre is more than `stray_m` (in the table plane) from the object while
//!   the object has not been lifted yet;
//! - **late**: more than `late_fraction` of the time limit has passed without success;
//! - **misaligned** (off when `misalign_m` is 0): the tool has come down to within `grasp_zone_m`
//!   of the object's centre height while more than `misalign_m` beside it in the table plane, the
//!   object not lifted yet: the person sees a grasp about to miss and steps in before it does
//!   (HIL-SERL's advice: correct early; RLIF's simulated intervener also acts on a deviation
//!   from the reference, not on a failure); `pick` only, like the next one;
//! - **missed** (off when `missed_m` is 0): the gripper has closed to less than `missed_m` with the
//!   object still on the table: the grasp closed on nothing.
//! - **closing high** (off when `close_high_m` is 0, the default): the gripper is closing (its
//!   opening below `close_high_m`) while the tool is still more than `grasp_zone_m` above the
//!   object's centre, the object on the table: the person sees the fingers about to shut above
//!   the object and steps in before they do, which "missed" only does after.
//! - **slipping** (off when `slip_m` is 0): an object that started the episode in the grasp (the
//!   `insert` peg) has been pushed up through the fingers by more than `slip_m` since the start:
//!   the peg met the fixture beside the hole and the arm kept pressing down, a few steps before
//!   the peg falls out. A dropped peg cannot be picked up again by the person's expert, so the
//!   person steps in while the peg is still held, any step. (Only the height counts: a peg that
//!   shifts sideways in the fingers as the arm sets off is still held.)
//!
//! When a criterion fires (stall, stray and late not before `min_step`; the grasp criteria at
//! any step, since grasps happen early), the person takes over with probability `rate`,
//! at most `max_interventions` times per episode, and drives with the expert (its action noise is
//! the person's `skill` knob) for `hold_steps` steps.

use crate::expert::{Expert, ExpertError};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use reflex_runtime::config::{Invalid, Validate, in_range};
use reflex_runtime::msg::{Observation, PROTOCOL_VERSION, RobotSpec, TeleopMsg};
use serde::Deserialize;
use std::ops::Range;

/// The simulated person (`[human]` in a config).
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HumanConfig {
    /// Probability of taking over when a criterion fires.
    pub rate: f64,
    /// Steps per takeover.
    pub hold_steps: u32,
    /// Window of the stall criterion, steps.
    pub stall_steps: u32,
    /// Movement below which the robot counts as stalled, m.
    pub stall_m: f64,
    /// Distance from the object beyond which the robot counts as straying, m.
    pub stray_m: f64,
    /// Fraction of the time limit after which a person steps in.
    pub late_fraction: f64,
    /// Takeovers per episode at most.
    pub max_interventions: u32,
    /// No takeover before this step (stall, stray, late).
    pub min_step: u32,
    /// Distance beside the object (table plane) at which a descending tool counts as misaligned,
    /// m; 0 turns the criterion off.
    pub misalign_m: f64,
    /// Height above the object's centre below which the tool counts as going in for a grasp, m.
    pub grasp_zone_m: f64,
    /// Gripper opening below which, with the object not lifted, the grasp counts as missed, m; 0
    /// turns the criterion off.
    pub missed_m: f64,
    /// Gripper opening below which the gripper counts as closing for a grasp; closing with the
    /// tool more than `grasp_zone_m` above the object's centre is a grasp about to close on
    /// nothing, m; 0 (the default) turns the criterion off.
    pub close_high_m: f64,
    /// Rise of an object that started in the grasp against the tool beyond which it counts as
    /// slipping out, m; 0 turns the criterion off.
    pub slip_m: f64,
    /// Action noise of the person's commands (the expert's noise knob).
    pub skill_noise: f64,
    /// Whether the person presses success when the scene shows it (HIL-SERL's success key).
    /// Off where a reward classifier says success and the person only vetoes its mistakes (the
    /// pixel demo): pressing it on what the scene shows would bring the simulator's truth in as
    /// a reward, and end an episode a frame before the classifier does.
    pub labels_success: bool,
    /// Seed.
    pub seed: u64,
}

impl Validate for HumanConfig {
    /// Every setting in its physical range: a NaN distance or a negative one never fires, a late
    /// fraction above 1 never comes, and each ran without a word.
    fn validate(&self, p: &str) -> Result<(), Invalid> {
        in_range(p, "rate", self.rate, 0.0, 1.0)?;
        in_range(p, "hold_steps", self.hold_steps, 1, 10_000)?;
        in_range(p, "stall_steps", self.stall_steps, 1, 10_000)?;
        in_range(p, "late_fraction", self.late_fraction, 0.0, 1.0)?;
        in_range(p, "max_interventions", self.max_interventions, 0, 10_000)?;
        in_range(p, "min_step", self.min_step, 0, 1_000_000)?;
        for (field, m) in [
            ("stall_m", self.stall_m),
            ("stray_m", self.stray_m),
            ("misalign_m", self.misalign_m),
            ("grasp_zone_m", self.grasp_zone_m),
            ("missed_m", self.missed_m),
            ("close_high_m", self.close_high_m),
            ("slip_m", self.slip_m),
        ] {
            in_range(p, field, m, 0.0, 10.0)?;
        }
        in_range(p, "skill_noise", self.skill_noise, 0.0, 10.0)
    }
}

impl Default for HumanConfig {
    fn default() -> Self {
        HumanConfig {
            rate: 1.0,
            hold_steps: 12,
            stall_steps: 15,
            stall_m: 0.005,
            stray_m: 0.12,
            late_fraction: 0.7,
            max_interventions: 2,
            min_step: 25,
            misalign_m: 0.02,
            grasp_zone_m: 0.015,
            missed_m: 0.015,
            close_high_m: Default::default(),
            slip_m: 0.003,
            skill_noise: Default::default(),
            labels_success: true,
            seed: Default::default(),
        }
    }
}

/// An object whose centre starts within this of the tool's starts in the grasp, m (the `insert`
/// peg sits 5-6 mm from the tool centre point; a `pick` cube starts 10 cm or more away).
const HELD_M: f64 = 0.02;

/// The simulated person.
pub struct SimHuman {
    cfg: HumanConfig,
    expert: Expert,
    rng: ChaCha8Rng,
    ee: Range<usize>,
    object: Option<Range<usize>>,
    opening: Option<usize>,
    grasping: bool,
    history: Vec<[f64; 3]>,
    holding: u32,
    interventions: u32,
    object_z0: f64,
    /// The object's height above the tool at the start, when it started in the grasp.
    held_dz0: Option<f64>,
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
    /// Going in for a grasp beside the object.
    pub misaligned: u64,
    /// The gripper closed on nothing.
    pub missed: u64,
    /// The gripper was closing above the object.
    pub closing_high: u64,
    /// An object that started in the grasp was sliding out of it.
    pub slipping: u64,
}

impl TakeoverReasons {
    /// Adds another person's counts (a fleet's people together).
    pub fn add(&mut self, o: &TakeoverReasons) {
        self.stall += o.stall;
        self.stray += o.stray;
        self.late += o.late;
        self.misaligned += o.misaligned;
        self.missed += o.missed;
        self.closing_high += o.closing_high;
        self.slipping += o.slipping;
    }
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
            // The gripper's opening is the last joint position (docs/sim.md).
            opening: spec.field("joint_pos").map(|r| r.end - 1),
            // The grasp criteria: only where the object is picked up from the table.
            grasping: spec.kind == "sim/pick",
            ee,
            history: Vec::with_capacity(64),
            holding: 0,
            interventions: 0,
            object_z0: 0.0,
            held_dz0: None,
            seq: 0,
            max_steps: spec.max_episode_steps,
            expert,
            total_interventions: 0,
            reasons: TakeoverReasons::default(),
            cfg,
        })
    }

    /// Drives the whole episode with the expert (the person's skill noise included): a
    /// demonstration given before training starts, as HIL-SERL's operators give about 20 per task.
    pub fn demonstrate(&mut self, obs: &Observation, msg: &mut TeleopMsg) {
        self.seq += 1;
        msg.v = PROTOCOL_VERSION;
        msg.seq = self.seq;
        msg.success = self.cfg.labels_success && obs.success;
        msg.failure = false;
        msg.reset = false;
        msg.intervene = true;
        self.expert.act(obs, &mut msg.action);
    }

    /// Whether an object that started in the grasp has risen more than `slip_m` against the tool.
    fn slipping(&self, obs: &Observation, ee: [f64; 3]) -> bool {
        self.cfg.slip_m > 0.0
            && self
                .held_dz0
                .zip(self.offset(obs, ee))
                .is_some_and(|(dz0, d)| d[2] - dz0 > self.cfg.slip_m)
    }

    /// The object's centre less the tool's, m (none without an object).
    fn offset(&self, obs: &Observation, ee: [f64; 3]) -> Option<[f64; 3]> {
        self.object.as_ref().map(|r| {
            let o = &obs.state[r.clone()];
            [
                o[0] as f64 - ee[0],
                o[1] as f64 - ee[1],
                o[2] as f64 - ee[2],
            ]
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
            self.held_dz0 = self
                .offset(obs, ee)
                .filter(|d| d.iter().map(|v| v * v).sum::<f64>().sqrt() < HELD_M)
                .map(|d| d[2]);
        }
        self.history.push(ee);
        let w = self.cfg.stall_steps as usize;
        if self.history.len() > w + 1 {
            self.history.remove(0);
        }
        if self.holding == 0 && self.interventions < self.cfg.max_interventions && !obs.success {
            let early = obs.step < self.cfg.min_step;
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
            let misaligned = self.grasping
                && self.cfg.misalign_m > 0.0
                && self.object.as_ref().is_some_and(|r| {
                    let o = &obs.state[r.clone()];
                    let lifted = o[2] as f64 > self.object_z0 + 0.01;
                    let d = ((ee[0] - o[0] as f64).powi(2) + (ee[1] - o[1] as f64).powi(2)).sqrt();
                    !lifted
                        && ee[2] - (o[2] as f64) < self.cfg.grasp_zone_m
                        && d > self.cfg.misalign_m
                });
            let missed = self.grasping
                && self.cfg.missed_m > 0.0
                && self
                    .object
                    .as_ref()
                    .is_some_and(|r| obs.state[r.start + 2] as f64 <= self.object_z0 + 0.01)
                && self
                    .opening
                    .is_some_and(|i| (obs.state[i] as f64) < self.cfg.missed_m);
            let closing_high = self.grasping
                && self.cfg.close_high_m > 0.0
                && self.object.as_ref().is_some_and(|r| {
                    let o = &obs.state[r.clone()];
                    o[2] as f64 <= self.object_z0 + 0.01
                        && ee[2] - (o[2] as f64) > self.cfg.grasp_zone_m
                })
                && self
                    .opening
                    .is_some_and(|i| (obs.state[i] as f64) < self.cfg.close_high_m);
            let slipping = self.slipping(obs, ee);
            let (stalled, strayed, late) = (stalled && !early, strayed && !early, late && !early);
            if (stalled || strayed || late || misaligned || missed || closing_high || slipping)
                && self.rng.random::<f64>() < self.cfg.rate
            {
                self.holding = self.cfg.hold_steps;
                self.interventions += 1;
                self.total_interventions += 1;
                self.reasons.stall += stalled as u64;
                self.reasons.stray += strayed as u64;
                self.reasons.late += late as u64;
                self.reasons.misaligned += misaligned as u64;
                self.reasons.missed += missed as u64;
                self.reasons.closing_high += closing_high as u64;
                self.reasons.slipping += slipping as u64;
                // The expert plans from what it sees now.
                self.expert.take_over();
            }
        }
        self.seq += 1;
        msg.v = PROTOCOL_VERSION;
        msg.seq = self.seq;
        msg.success = self.cfg.labels_success && obs.success;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SimConfig, SimEnv, TaskKind};
    use reflex_runtime::robot::Robot;

    /// A pick observation at `step` with the tool at `ee`, the cube at `cube` and the gripper
    /// opened `opening` m (everything else zero).
    fn scene(
        spec: &RobotSpec,
        step: u32,
        ee: [f32; 3],
        cube: [f32; 3],
        opening: f32,
    ) -> Observation {
        let mut state = vec![0.0f32; spec.state_dim()];
        let (e, o, j) = (
            spec.field("ee_pos").unwrap(),
            spec.field("object_pos").unwrap(),
            spec.field("joint_pos").unwrap(),
        );
        state[e].copy_from_slice(&ee);
        state[o].copy_from_slice(&cube);
        state[j.end - 1] = opening;
        state[spec.field("ee_quat").unwrap().end - 1] = 1.0;
        Observation {
            state,
            step,
            ..Default::default()
        }
    }

    /// Whether a person with `cfg` takes over at step 10, after watching the scene from step 0.
    fn takes_over(cfg: HumanConfig, ee: [f32; 3], opening: f32) -> (bool, TakeoverReasons) {
        let env = SimEnv::new(SimConfig::for_task(TaskKind::Pick)).unwrap();
        let spec = env.spec().clone();
        let mut h = SimHuman::new(&spec, cfg).unwrap();
        let mut msg = TeleopMsg {
            action: vec![0.0; spec.action.dim()],
            ..Default::default()
        };
        let cube = [0.2, 0.0, 0.015];
        h.act(&scene(&spec, 0, [0.2, 0.0, 0.14], cube, 0.06), &mut msg);
        assert!(!msg.intervene, "nobody takes over at the start");
        h.act(&scene(&spec, 10, ee, cube, opening), &mut msg);
        (msg.intervene, h.reasons)
    }

    #[test]
    fn the_person_steps_in_before_a_grasp_beside_the_cube_and_after_one_on_nothing() {
        let d = HumanConfig::default;
        // Low and 3 cm beside the cube, before `min_step`: a grasp about to miss.
        let (on, r) = takes_over(d(), [0.23, 0.0, 0.02], 0.06);
        assert!(on && r.misaligned == 1 && r.missed == 0, "{r:?}");
        // Low and 5 mm beside it: on track, nobody steps in.
        assert!(!takes_over(d(), [0.205, 0.0, 0.02], 0.06).0);
        // Still high and 3 cm beside it: not going in yet.
        assert!(!takes_over(d(), [0.23, 0.0, 0.08], 0.06).0);
        // Fingers closed to 5 mm high above a cube still on the table: the grasp missed.
        let (on, r) = takes_over(d(), [0.2, 0.0, 0.08], 0.005);
        assert!(on && r.missed == 1 && r.misaligned == 0, "{r:?}");
        // Both criteria off: the same scenes pass.
        let off = || HumanConfig {
            misalign_m: 0.0,
            missed_m: 0.0,
            ..HumanConfig::default()
        };
        assert!(!takes_over(off(), [0.23, 0.0, 0.02], 0.06).0);
        assert!(!takes_over(off(), [0.2, 0.0, 0.08], 0.005).0);
    }

    #[test]
    fn a_person_who_watches_the_height_steps_in_when_the_fingers_close_above_the_cube() {
        let watching = || HumanConfig {
            close_high_m: 0.04,
            ..HumanConfig::default()
        };
        // Closing to 3 cm with the tool 3.5 cm above the cube's centre: about to shut on air.
        let (on, r) = takes_over(watching(), [0.2, 0.0, 0.05], 0.03);
        assert!(on && r.closing_high == 1 && r.missed == 0, "{r:?}");
        // Closing to 3 cm at the cube's centre height: a grasp, nobody steps in.
        assert!(!takes_over(watching(), [0.2, 0.0, 0.02], 0.03).0);
        // High with the gripper open: still on the way down.
        assert!(!takes_over(watching(), [0.2, 0.0, 0.05], 0.06).0);
        // The default person does not watch for it.
        let (on, r) = takes_over(HumanConfig::default(), [0.2, 0.0, 0.05], 0.03);
        assert!(!on && r.closing_high == 0, "{r:?}");
    }

    #[test]
    fn the_grasp_criteria_stay_quiet_on_tasks_without_a_grasp() {
        // Push: the fingers stay closed and the tool comes down beside the cube on purpose.
        let env = SimEnv::new(SimConfig::for_task(TaskKind::Push)).unwrap();
        let spec = env.spec().clone();
        let cfg = HumanConfig {
            close_high_m: 0.04,
            ..HumanConfig::default()
        };
        let mut h = SimHuman::new(&spec, cfg).unwrap();
        let mut msg = TeleopMsg {
            action: vec![0.0; spec.action.dim()],
            ..Default::default()
        };
        let cube = [0.2, 0.0, 0.015];
        h.act(&scene(&spec, 0, [0.2, 0.0, 0.14], cube, 0.0), &mut msg);
        h.act(&scene(&spec, 10, [0.24, 0.0, 0.02], cube, 0.0), &mut msg);
        assert!(!msg.intervene, "{:?}", h.reasons);
        h.act(&scene(&spec, 11, [0.2, 0.0, 0.06], cube, 0.0), &mut msg);
        assert!(
            !msg.intervene,
            "closed and high over the cube: {:?}",
            h.reasons
        );
    }
    #[test]
    fn a_person_presses_success_on_what_the_scene_shows_unless_told_to_leave_it_to_a_classifier() {
        let env = SimEnv::new(SimConfig::for_task(TaskKind::Pick)).unwrap();
        let spec = env.spec().clone();
        let mut done = scene(&spec, 10, [0.2, 0.0, 0.1], [0.2, 0.0, 0.08], 0.03);
        done.success = true;
        for (labels_success, pressed) in [(true, true), (false, false)] {
            let mut h = SimHuman::new(
                &spec,
                HumanConfig {
                    labels_success,
                    ..HumanConfig::default()
                },
            )
            .unwrap();
            let mut msg = TeleopMsg {
                action: vec![0.0; spec.action.dim()],
                ..Default::default()
            };
            h.act(&done, &mut msg);
            assert_eq!(msg.success, pressed, "labels_success = {labels_success}");
            h.demonstrate(&done, &mut msg);
            assert_eq!(
                msg.success, pressed,
                "demonstrating, labels_success = {labels_success}"
            );
        }
    }
    #[test]
    fn the_person_steps_in_when_a_held_peg_slides_through_the_fingers() {
        let env = SimEnv::new(SimConfig::for_task(TaskKind::Insert)).unwrap();
        let spec = env.spec().clone();
        let held = |step, tool_z: f32, peg_z: f32| {
            let mut o = scene(&spec, step, [0.2, 0.0, tool_z], [0.2, 0.0, peg_z], 0.012);
            o.state[spec.field("object_quat").unwrap().end - 1] = 1.0;
            o
        };
        // The peg held 6 mm below the tool centre point; 10 steps later the tool is 8 cm lower
        // and the peg with it, or `slid` higher in the fingers (held up by the fixture's top), or
        // shifted sideways by `aside`.
        let run = |cfg: HumanConfig, slid: f32, aside: f32| {
            let mut h = SimHuman::new(&spec, cfg).unwrap();
            let mut msg = TeleopMsg {
                action: vec![0.0; spec.action.dim()],
                ..Default::default()
            };
            h.act(&held(0, 0.14, 0.134), &mut msg);
            assert!(!msg.intervene, "nobody takes over at the start");
            let mut o = held(10, 0.06, 0.054 + slid);
            o.state[spec.field("object_pos").unwrap().start] += aside;
            h.act(&o, &mut msg);
            (msg.intervene, h.reasons)
        };
        let (on, r) = run(HumanConfig::default(), 0.005, 0.0);
        assert!(on && r.slipping == 1, "{r:?}");
        let (on, r) = run(HumanConfig::default(), 0.0, 0.005);
        assert!(
            !on && r.slipping == 0,
            "shifted sideways, still held: {r:?}"
        );
        let (on, r) = run(HumanConfig::default(), 0.001, 0.0);
        assert!(
            !on && r.slipping == 0,
            "a millimetre of play is still a grip: {r:?}"
        );
        let off = HumanConfig {
            slip_m: 0.0,
            ..HumanConfig::default()
        };
        assert!(!run(off, 0.005, 0.0).0, "the criterion off");
    }
}
