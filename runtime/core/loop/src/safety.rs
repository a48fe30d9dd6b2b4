//! The safety layer: every action, whoever produced it (policy, residual, person), passes through
//! here on its way to the robot.
//!
//! Checks, in order: a latched emergency stop; the watchdog (stale observations, a stale policy
//! while it is in charge, a stale teleop stream while a person is in charge); NaN/Inf; the action
//! space bounds and joint position limits; the per-step change limit; the end-effector workspace
//! box. A failed watchdog or a non-finite value replaces the action with the robot's hold action;
//! limits clip the action. Every intervention is counted by kind.

use crate::config::{Invalid, Validate, in_range, key};
use crate::kinematics::Chain;
use crate::msg::{ActionKind, ActionSpec};
use serde::Deserialize;
use std::time::Duration;

/// Safety limits (`[safety]` in a config).
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SafetyConfig {
    /// Largest change of a joint target per control step, rad (joint action spaces).
    pub max_joint_step_rad: f32,
    /// Largest end-effector step per control step, m (ee action spaces).
    pub max_ee_step_m: f32,
    /// Largest change of the gripper command per control step, m.
    pub max_gripper_step_m: f32,
    /// Lower corner of the end-effector workspace box, m, base frame.
    pub workspace_min_m: [f64; 3],
    /// Upper corner of the workspace box.
    pub workspace_max_m: [f64; 3],
    /// Hold when no new observation arrived for this long, ms.
    pub obs_timeout_ms: f64,
    /// Hold when the policy produced no usable action for this long while in charge, ms.
    pub policy_timeout_ms: f64,
    /// Hold when a person is intervening and their stream stopped for this long, ms.
    pub teleop_timeout_ms: f64,
}

impl Default for SafetyConfig {
    fn default() -> Self {
        SafetyConfig {
            max_joint_step_rad: 0.1,
            max_ee_step_m: 0.02,
            max_gripper_step_m: 0.02,
            workspace_min_m: [0.05, -0.30, 0.0],
            workspace_max_m: [0.40, 0.30, 0.35],
            obs_timeout_ms: 100.0,
            policy_timeout_ms: 500.0,
            teleop_timeout_ms: 200.0,
        }
    }
}

impl Validate for SafetyConfig {
    fn validate(&self, p: &str) -> Result<(), Invalid> {
        in_range(p, "max_joint_step_rad", self.max_joint_step_rad, 1e-4, 3.2)?;
        in_range(p, "max_ee_step_m", self.max_ee_step_m, 1e-4, 0.5)?;
        in_range(p, "max_gripper_step_m", self.max_gripper_step_m, 1e-4, 1.0)?;
        in_range(p, "obs_timeout_ms", self.obs_timeout_ms, 1.0, 60_000.0)?;
        in_range(
            p,
            "policy_timeout_ms",
            self.policy_timeout_ms,
            1.0,
            60_000.0,
        )?;
        in_range(
            p,
            "teleop_timeout_ms",
            self.teleop_timeout_ms,
            1.0,
            60_000.0,
        )?;
        for i in 0..3 {
            if self.workspace_min_m[i] >= self.workspace_max_m[i] {
                return Err(Invalid {
                    key: key(p, "workspace_min_m"),
                    value: format!("{:?}", self.workspace_min_m),
                    allowed: format!(
                        "each component below workspace_max_m = {:?}",
                        self.workspace_max_m
                    ),
                });
            }
        }
        Ok(())
    }
}

/// Why the safety layer acted (one bit each in [`Verdict::flags`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum SafetyEvent {
    /// Emergency stop latched.
    Estop = 1,
    /// Observation stream stale.
    ObsStale = 2,
    /// Policy output stale while in charge.
    PolicyStale = 4,
    /// Teleop stream stale while a person is in charge.
    TeleopStale = 8,
    /// A NaN or infinite component.
    NonFinite = 16,
    /// Outside the action bounds or joint position limits (clipped).
    PositionLimit = 32,
    /// Per-step change too large (clipped).
    StepLimit = 64,
    /// End-effector outside the workspace box (clipped or held).
    Workspace = 128,
}

impl SafetyEvent {
    /// All kinds, in counter order.
    pub const ALL: [SafetyEvent; 8] = [
        SafetyEvent::Estop,
        SafetyEvent::ObsStale,
        SafetyEvent::PolicyStale,
        SafetyEvent::TeleopStale,
        SafetyEvent::NonFinite,
        SafetyEvent::PositionLimit,
        SafetyEvent::StepLimit,
        SafetyEvent::Workspace,
    ];

    /// `true` for the routine clipping kinds (a step, a joint or the tool kept inside its
    /// limit, the robot still moving); `false` for holds and the e-stop, which stop the robot.
    pub fn is_clip(self) -> bool {
        matches!(
            self,
            SafetyEvent::PositionLimit | SafetyEvent::StepLimit | SafetyEvent::Workspace
        )
    }

    /// Name used in status messages and logs.
    pub fn name(self) -> &'static str {
        match self {
            SafetyEvent::Estop => "estop",
            SafetyEvent::ObsStale => "obs_stale",
            SafetyEvent::PolicyStale => "policy_stale",
            SafetyEvent::TeleopStale => "teleop_stale",
            SafetyEvent::NonFinite => "non_finite",
            SafetyEvent::PositionLimit => "position_limit",
            SafetyEvent::StepLimit => "step_limit",
            SafetyEvent::Workspace => "workspace",
        }
    }
}

/// Counters per safety event kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SafetyCounters(pub [u64; 8]);

impl SafetyCounters {
    /// Count of one kind.
    pub fn get(&self, e: SafetyEvent) -> u64 {
        self.0[SafetyEvent::ALL
            .iter()
            .position(|x| *x == e)
            .expect("listed")]
    }

    fn bump(&mut self, flags: u32) {
        for (i, e) in SafetyEvent::ALL.iter().enumerate() {
            if flags & *e as u32 != 0 {
                self.0[i] += 1;
            }
        }
    }

    /// Total interventions.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

/// What the layer did to one action.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Bit set of [`SafetyEvent`]s.
    pub flags: u32,
    /// The action was replaced by the hold action.
    pub held: bool,
}

impl Verdict {
    /// `true` when the event is in the flags.
    pub fn has(&self, e: SafetyEvent) -> bool {
        self.flags & e as u32 != 0
    }
}

/// What the layer needs to know about this step besides the action.
#[derive(Clone, Copy, Debug)]
pub struct SafetyInput<'a> {
    /// Measured joint positions (arm joints, then gripper), if the robot reports them.
    pub joint_pos: Option<&'a [f32]>,
    /// Measured end-effector position, if the robot reports it.
    pub ee_pos: Option<[f64; 3]>,
    /// Time since the observation last changed.
    pub obs_age: Duration,
    /// Time since the policy last delivered a usable action (`None`: the policy is not in charge).
    pub policy_age: Option<Duration>,
    /// Time since the last teleop message while a person is in charge (`None` otherwise).
    pub teleop_age: Option<Duration>,
}

/// The safety layer of one robot.
pub struct Safety {
    cfg: SafetyConfig,
    kind: ActionKind,
    low: Vec<f32>,
    high: Vec<f32>,
    chain: Option<Chain>,
    q_buf: Vec<f64>,
    last: Vec<f32>,
    have_last: bool,
    estop: bool,
    counters: SafetyCounters,
}

impl Safety {
    /// A safety layer for an action space; `chain` (the arm's kinematics) enables the workspace
    /// check for joint action spaces.
    pub fn new(cfg: SafetyConfig, action: &ActionSpec, chain: Option<Chain>) -> Self {
        let n = chain.as_ref().map_or(0, |c| c.dof());
        Safety {
            cfg,
            kind: action.kind,
            low: action.low.clone(),
            high: action.high.clone(),
            chain,
            q_buf: vec![0.0; n],
            last: vec![0.0; action.dim()],
            have_last: false,
            estop: false,
            counters: SafetyCounters::default(),
        }
    }

    /// Latches the emergency stop: every action is replaced by hold until [`Safety::clear_estop`].
    /// The control loop mirrors its [`crate::control::ControlLoop::stop_switch`] here every
    /// tick; the switch, not this flag, decides when a stop ends.
    pub fn estop(&mut self) {
        self.estop = true;
    }

    /// Lets actions through again (the loop calls it once the switch is no longer latched).
    pub fn clear_estop(&mut self) {
        self.estop = false;
    }

    /// Whether the emergency stop is latched.
    pub fn estopped(&self) -> bool {
        self.estop
    }

    /// Counters so far.
    pub fn counters(&self) -> SafetyCounters {
        self.counters
    }

    /// The configuration.
    pub fn config(&self) -> &SafetyConfig {
        &self.cfg
    }

    /// Forgets the last command (at an episode start the step limit restarts from the robot's
    /// state).
    pub fn reset(&mut self) {
        self.have_last = false;
    }

    fn ms(d: Duration) -> f64 {
        d.as_secs_f64() * 1e3
    }

    /// Filters `action` in place. `hold` is the robot's hold action for this step.
    pub fn filter(&mut self, action: &mut [f32], hold: &[f32], input: &SafetyInput) -> Verdict {
        let mut flags = 0u32;
        if self.estop {
            flags |= SafetyEvent::Estop as u32;
        }
        if Self::ms(input.obs_age) > self.cfg.obs_timeout_ms {
            flags |= SafetyEvent::ObsStale as u32;
        }
        if input
            .policy_age
            .is_some_and(|a| Self::ms(a) > self.cfg.policy_timeout_ms)
        {
            flags |= SafetyEvent::PolicyStale as u32;
        }
        if input
            .teleop_age
            .is_some_and(|a| Self::ms(a) > self.cfg.teleop_timeout_ms)
        {
            flags |= SafetyEvent::TeleopStale as u32;
        }
        if action.iter().any(|x| !x.is_finite()) {
            flags |= SafetyEvent::NonFinite as u32;
        }
        if flags != 0 {
            return self.hold(action, hold, input, flags);
        }
        flags |= self.bounds(action);
        flags |= self.step_limit(action, hold, input);
        flags |= self.workspace(action, hold, input);
        self.counters.bump(flags);
        self.remember(action);
        Verdict { flags, held: false }
    }

    /// Replaces `action` with the robot's `hold`, counted under `why` (bits of
    /// [`SafetyEvent`], 0 for a hold nobody needs to hear about, such as a paused run). A hold
    /// is a command like any other: it stays inside the action bounds and the per-step limit
    /// (a robot whose hold is not where it was last commanded moves there no faster than the
    /// limit allows), so no hold can command a jump. The workspace check is left out: it would
    /// turn a hold into a step back towards the box.
    pub fn hold(
        &mut self,
        action: &mut [f32],
        hold: &[f32],
        input: &SafetyInput,
        why: u32,
    ) -> Verdict {
        action.copy_from_slice(hold);
        if self.have_last {
            // A hold that is not finite keeps the last command instead.
            for (a, l) in action.iter_mut().zip(&self.last) {
                if !a.is_finite() {
                    *a = *l;
                }
            }
        }
        let flags = why | self.bounds(action) | self.step_limit(action, hold, input);
        self.counters.bump(flags);
        self.remember(action);
        Verdict { flags, held: true }
    }

    /// Bounds of the action space, which for absolute joints are the joint limits.
    fn bounds(&self, action: &mut [f32]) -> u32 {
        let mut flags = 0;
        for ((a, lo), hi) in action.iter_mut().zip(&self.low).zip(&self.high) {
            if *a < *lo || *a > *hi {
                *a = a.clamp(*lo, *hi);
                flags |= SafetyEvent::PositionLimit as u32;
            }
        }
        flags
    }

    fn remember(&mut self, action: &[f32]) {
        self.last.copy_from_slice(action);
        self.have_last = true;
    }

    fn step_limit(&mut self, action: &mut [f32], hold: &[f32], input: &SafetyInput) -> u32 {
        let n = action.len();
        let mut hit = false;
        let mut clip = |v: &mut f32, max: f32| {
            if v.abs() > max {
                *v = v.clamp(-max, max);
                hit = true;
            }
        };
        match self.kind {
            ActionKind::EeDelta | ActionKind::EeDeltaYaw => {
                for v in action.iter_mut().take(3) {
                    clip(v, self.cfg.max_ee_step_m);
                }
                // The gripper is absolute: limit its change from the last command, or at an
                // episode's start from where the robot holds it now.
                let from = if self.have_last {
                    self.last[n - 1]
                } else {
                    hold[n - 1]
                };
                if from.is_finite() {
                    let mut d = action[n - 1] - from;
                    clip(&mut d, self.cfg.max_gripper_step_m);
                    action[n - 1] = from + d;
                }
            }
            ActionKind::JointDelta => {
                for v in action.iter_mut().take(n - 1) {
                    clip(v, self.cfg.max_joint_step_rad);
                }
                clip(&mut action[n - 1], self.cfg.max_gripper_step_m);
            }
            ActionKind::JointAbs => {
                // Relative to the last command, or to the measured position at an episode start.
                let reference: Option<&[f32]> = if self.have_last {
                    Some(&self.last)
                } else {
                    input.joint_pos
                };
                if let Some(r) = reference {
                    for (i, v) in action.iter_mut().enumerate().take(r.len().min(n)) {
                        let max = if i + 1 == n {
                            self.cfg.max_gripper_step_m
                        } else {
                            self.cfg.max_joint_step_rad
                        };
                        let mut d = *v - r[i];
                        clip(&mut d, max);
                        *v = r[i] + d;
                    }
                }
            }
            ActionKind::Box => {}
        }
        if hit {
            SafetyEvent::StepLimit as u32
        } else {
            0
        }
    }

    fn in_box(&self, p: [f64; 3]) -> bool {
        (0..3).all(|i| p[i] >= self.cfg.workspace_min_m[i] && p[i] <= self.cfg.workspace_max_m[i])
    }

    fn workspace(&mut self, action: &mut [f32], hold: &[f32], input: &SafetyInput) -> u32 {
        match self.kind {
            ActionKind::EeDelta | ActionKind::EeDeltaYaw => {
                let Some(p) = input.ee_pos else { return 0 };
                // Clip the step so the commanded point stays in the box.
                let mut hit = false;
                for i in 0..3 {
                    let target = p[i] + action[i] as f64;
                    let clamped =
                        target.clamp(self.cfg.workspace_min_m[i], self.cfg.workspace_max_m[i]);
                    if clamped != target {
                        // Outside already: allow only steps back towards the box.
                        action[i] = (clamped - p[i]) as f32;
                        hit = true;
                    }
                }
                if hit {
                    SafetyEvent::Workspace as u32
                } else {
                    0
                }
            }
            ActionKind::JointAbs | ActionKind::JointDelta => {
                let Some(chain) = &self.chain else { return 0 };
                let n = chain.dof();
                for i in 0..n {
                    let base = if self.kind == ActionKind::JointDelta {
                        input.joint_pos.map_or(0.0, |q| q[i])
                    } else {
                        0.0
                    };
                    self.q_buf[i] = (base + action[i]) as f64;
                }
                let p = chain.fk(&self.q_buf).translation.vector;
                if self.in_box([p.x, p.y, p.z]) {
                    0
                } else {
                    action.copy_from_slice(hold);
                    SafetyEvent::Workspace as u32
                }
            }
            ActionKind::Box => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ee_spec() -> ActionSpec {
        ActionSpec {
            kind: ActionKind::EeDelta,
            names: vec!["dx".into(), "dy".into(), "dz".into(), "g".into()],
            low: vec![-0.05, -0.05, -0.05, 0.0],
            high: vec![0.05, 0.05, 0.05, 0.07],
        }
    }

    fn input(ee: [f64; 3]) -> SafetyInput<'static> {
        SafetyInput {
            joint_pos: None,
            ee_pos: Some(ee),
            obs_age: Duration::ZERO,
            policy_age: Some(Duration::ZERO),
            teleop_age: None,
        }
    }

    const HOLD: [f32; 4] = [0.0, 0.0, 0.0, 0.03];

    #[test]
    fn nan_and_inf_are_replaced_by_hold() {
        let mut s = Safety::new(SafetyConfig::default(), &ee_spec(), None);
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut a = [0.01, bad, 0.0, 0.03];
            let v = s.filter(&mut a, &HOLD, &input([0.2, 0.0, 0.1]));
            assert!(v.held && v.has(SafetyEvent::NonFinite));
            assert_eq!(a, HOLD);
        }
        assert_eq!(s.counters().get(SafetyEvent::NonFinite), 3);
    }

    #[test]
    fn ee_step_is_clipped_and_gripper_rate_limited() {
        let mut s = Safety::new(SafetyConfig::default(), &ee_spec(), None);
        let mut a = [0.04, -0.01, 0.0, 0.03];
        let v = s.filter(&mut a, &HOLD, &input([0.2, 0.0, 0.1]));
        assert!(v.has(SafetyEvent::StepLimit) && !v.held);
        assert_eq!(a[0], 0.02);
        // Gripper jumps from 0.03 to 0.07: limited to +0.02 per step.
        let mut a = [0.0, 0.0, 0.0, 0.07];
        s.filter(&mut a, &HOLD, &input([0.2, 0.0, 0.1]));
        assert!((a[3] - 0.05).abs() < 1e-6, "{}", a[3]);
        // At an episode's start the first gripper command moves from where the robot holds it
        // (0.03), not anywhere in its range at once.
        s.reset();
        let mut a = [0.0, 0.0, 0.0, 0.0];
        let v = s.filter(&mut a, &HOLD, &input([0.2, 0.0, 0.1]));
        assert!(v.has(SafetyEvent::StepLimit));
        assert!((a[3] - 0.01).abs() < 1e-6, "{}", a[3]);
    }

    #[test]
    fn workspace_box_clips_steps_that_leave_it() {
        let cfg = SafetyConfig {
            workspace_max_m: [0.3, 0.3, 0.3],
            ..Default::default()
        };
        let mut s = Safety::new(cfg, &ee_spec(), None);
        let mut a = [0.02, 0.0, -0.01, 0.03];
        let v = s.filter(&mut a, &HOLD, &input([0.29, 0.0, 0.1]));
        assert!(v.has(SafetyEvent::Workspace));
        assert!((a[0] - 0.01).abs() < 1e-6, "{}", a[0]);
        assert_eq!(a[2], -0.01);
    }

    #[test]
    fn position_limits_clamp_absolute_joint_targets_and_step_limits_apply() {
        let spec = ActionSpec {
            kind: ActionKind::JointAbs,
            names: vec!["j".into(), "g".into()],
            low: vec![-1.0, 0.0],
            high: vec![1.0, 0.07],
        };
        let cfg = SafetyConfig {
            max_joint_step_rad: 0.1,
            ..Default::default()
        };
        let mut s = Safety::new(cfg, &spec, None);
        let q = [0.95f32, 0.03];
        let inp = SafetyInput {
            joint_pos: Some(&q),
            ee_pos: None,
            obs_age: Duration::ZERO,
            policy_age: None,
            teleop_age: None,
        };
        let mut a = [1.5, 0.03];
        let v = s.filter(&mut a, &[0.95, 0.03], &inp);
        assert!(v.has(SafetyEvent::PositionLimit));
        assert_eq!(a[0], 1.0);
        let mut a = [0.0, 0.03];
        let v = s.filter(&mut a, &[0.95, 0.03], &inp);
        assert!(v.has(SafetyEvent::StepLimit));
        assert!((a[0] - 0.9).abs() < 1e-6, "{}", a[0]);
    }

    #[test]
    fn watchdogs_hold_on_stale_streams_and_estop_latches() {
        let mut s = Safety::new(SafetyConfig::default(), &ee_spec(), None);
        let base = input([0.2, 0.0, 0.1]);
        let mut a = [0.01, 0.0, 0.0, 0.03];
        let v = s.filter(
            &mut a,
            &HOLD,
            &SafetyInput {
                obs_age: Duration::from_millis(101),
                ..base
            },
        );
        assert!(v.held && v.has(SafetyEvent::ObsStale));
        let mut a = [0.01, 0.0, 0.0, 0.03];
        let v = s.filter(
            &mut a,
            &HOLD,
            &SafetyInput {
                policy_age: Some(Duration::from_millis(600)),
                ..base
            },
        );
        assert!(v.held && v.has(SafetyEvent::PolicyStale));
        let mut a = [0.01, 0.0, 0.0, 0.03];
        let v = s.filter(
            &mut a,
            &HOLD,
            &SafetyInput {
                policy_age: None,
                teleop_age: Some(Duration::from_millis(250)),
                ..base
            },
        );
        assert!(v.held && v.has(SafetyEvent::TeleopStale));
        s.estop();
        let mut a = [0.01, 0.0, 0.0, 0.03];
        assert!(s.filter(&mut a, &HOLD, &base).has(SafetyEvent::Estop));
        s.clear_estop();
        let mut a = [0.01, 0.0, 0.0, 0.03];
        assert_eq!(s.filter(&mut a, &HOLD, &base).flags, 0);
        assert_eq!(s.counters().total(), 4);
    }

    fn joint_abs(n: usize) -> ActionSpec {
        ActionSpec {
            kind: ActionKind::JointAbs,
            names: (0..n).map(|i| format!("j{i}")).collect(),
            low: vec![-2.0; n],
            high: vec![2.0; n],
        }
    }

    fn still() -> SafetyInput<'static> {
        SafetyInput {
            joint_pos: None,
            ee_pos: None,
            obs_age: Duration::ZERO,
            policy_age: None,
            teleop_age: None,
        }
    }

    #[test]
    fn a_hold_of_an_absolute_joint_robot_never_jumps_from_the_last_command() {
        let mut s = Safety::new(SafetyConfig::default(), &joint_abs(3), None);
        let mut a = [0.8, -0.8, 0.03];
        assert_eq!(s.filter(&mut a, &[0.0; 3], &still()).flags, 0);
        // The right hold (the last command) passes untouched.
        let mut a = [9.0; 3];
        let v = s.hold(
            &mut a,
            &[0.8, -0.8, 0.03],
            &still(),
            SafetyEvent::Estop as u32,
        );
        assert_eq!(a, [0.8, -0.8, 0.03]);
        assert!(v.held && v.has(SafetyEvent::Estop) && !v.has(SafetyEvent::StepLimit));
        // A hold at the middle of the range (what a remote robot used to send) moves one limited
        // step at a time, whichever way it comes in.
        let mut a = [9.0; 3];
        let v = s.filter(
            &mut a,
            &[0.0; 3],
            &SafetyInput {
                obs_age: Duration::from_secs(1),
                ..still()
            },
        );
        assert!(v.held && v.has(SafetyEvent::ObsStale) && v.has(SafetyEvent::StepLimit));
        assert!(
            (a[0] - 0.7).abs() < 1e-6 && (a[1] + 0.7).abs() < 1e-6,
            "{a:?}"
        );
        assert!((a[2] - 0.01).abs() < 1e-6, "gripper limited too: {a:?}");
    }

    #[test]
    fn a_hold_of_a_delta_robot_is_step_limited_and_a_nan_hold_keeps_the_last_command() {
        let spec = ActionSpec {
            kind: ActionKind::JointDelta,
            names: vec!["a".into(), "b".into(), "g".into()],
            low: vec![-1.0; 3],
            high: vec![1.0; 3],
        };
        let mut s = Safety::new(SafetyConfig::default(), &spec, None);
        let mut a = [0.0; 3];
        let v = s.hold(&mut a, &[0.5, -0.05, 0.5], &still(), 0);
        assert!(v.has(SafetyEvent::StepLimit), "{v:?}");
        assert_eq!(a, [0.1, -0.05, 0.02]);
        // End-effector steps: the translation and the (absolute) gripper both limited.
        let mut s = Safety::new(SafetyConfig::default(), &ee_spec(), None);
        let mut a = [0.0, 0.0, 0.0, 0.03];
        s.filter(&mut a, &HOLD, &input([0.2, 0.0, 0.1]));
        let mut a = [0.0; 4];
        s.hold(&mut a, &[0.05, 0.0, 0.0, 0.07], &input([0.2, 0.0, 0.1]), 0);
        assert!(
            (a[0] - 0.02).abs() < 1e-6 && (a[3] - 0.05).abs() < 1e-6,
            "{a:?}"
        );
        // A hold that is not finite keeps the last command.
        let mut a = [0.0; 4];
        s.hold(
            &mut a,
            &[0.0, 0.0, 0.0, f32::NAN],
            &input([0.2, 0.0, 0.1]),
            0,
        );
        assert!((a[3] - 0.05).abs() < 1e-6, "{a:?}");
        // A generic box: inside its bounds.
        let spec = ActionSpec {
            kind: ActionKind::Box,
            names: vec!["u".into()],
            low: vec![-2.0],
            high: vec![2.0],
        };
        let mut s = Safety::new(SafetyConfig::default(), &spec, None);
        let mut a = [0.0];
        let v = s.hold(&mut a, &[5.0], &still(), 0);
        assert_eq!(a, [2.0]);
        assert!(v.has(SafetyEvent::PositionLimit));
    }

    #[test]
    fn joint_workspace_uses_forward_kinematics() {
        const ARM: &str = r#"<robot name="t"><link name="base"/><link name="l1"/><link name="tip"/>
          <joint name="j" type="revolute"><parent link="base"/><child link="l1"/><origin xyz="0 0 0.1"/>
            <axis xyz="0 1 0"/><limit lower="-3" upper="3" effort="1" velocity="1"/></joint>
          <joint name="t" type="fixed"><parent link="l1"/><child link="tip"/><origin xyz="0 0 0.2"/></joint></robot>"#;
        let chain = Chain::from_urdf_str(ARM, "t", "base", "tip").unwrap();
        let spec = ActionSpec {
            kind: ActionKind::JointAbs,
            names: vec!["j".into(), "g".into()],
            low: vec![-3.0, 0.0],
            high: vec![3.0, 0.1],
        };
        let cfg = SafetyConfig {
            max_joint_step_rad: 3.0,
            workspace_min_m: [0.05, -1.0, 0.0],
            workspace_max_m: [1.0, 1.0, 1.0],
            ..Default::default()
        };
        let mut s = Safety::new(cfg, &spec, Some(chain));
        let inp = SafetyInput {
            joint_pos: None,
            ee_pos: None,
            obs_age: Duration::ZERO,
            policy_age: None,
            teleop_age: None,
        };
        // Tip at (0.2 sin q, 0, 0.1 + 0.2 cos q): q = 1 is in front (x = 0.168), q = -1 behind.
        let mut a = [1.0, 0.0];
        assert_eq!(s.filter(&mut a, &[0.5, 0.0], &inp).flags, 0);
        let mut a = [-1.0, 0.0];
        let v = s.filter(&mut a, &[0.5, 0.0], &inp);
        assert!(v.has(SafetyEvent::Workspace));
        assert_eq!(a, [0.5, 0.0]);
    }
}
