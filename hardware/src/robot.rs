//! A real arm as a [`Robot`]: `[robot] source = "so101"` (or `"koch"`) with an `[arm]` table.
//!
//! The SO-101 shares the simulator's arm model (sim/assets/so101.urdf, the SO-101's published
//! geometry with its "L" pose zero, which is where LeRobot's calibration puts the middle of every
//! joint's range), so its `reach` layout is the simulator's: the same state fields (joint
//! positions and velocities, tool pose by forward kinematics, a target drawn per episode from the
//! same distribution) and the same action spaces (end-effector steps through the shared IK, or
//! joint targets). A policy trained on the simulated arm runs on the real one unchanged.
//!
//! The Koch has no kinematic model here: its `joints` layout is joint positions and velocities,
//! its actions joint targets or joint steps, and its episodes end at their time limit or on a
//! person's label.
//!
//! The arm runs on its own clock: every tick the control loop calls [`Robot::observe`] (one SYNC
//! READ) and [`Robot::command`] (one SYNC WRITE). A read that fails after the bus's retries keeps
//! the last observation (the loop sees it stale and holds); more than `max_missed_reads` in a row
//! end the run with the error naming the servo, the servos holding their last goal.

use crate::arm::{ArmKind, ArmTiming, ServoArm};
use nalgebra::{Isometry3, Translation3, Vector3};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use reflex_cameras::{CameraConfig, CameraStats, Capture};
use reflex_contracts::config::{Invalid, Validate, in_range};
use reflex_contracts::msg::{ActionKind, Observation, PROTOCOL_VERSION, RobotSpec, StateField};
use reflex_contracts::robot::{Robot, RobotError, check_action};
use reflex_contracts::stop::StopSwitch;
use reflex_runtime::kinematics::{IkOptions, top_down};
use reflex_tabletop::ArmModel;
use reflex_tabletop::spec::{HOME_YAW, WORKSPACE_MAX, WORKSPACE_MIN};
use reflex_tabletop::task::{TaskKind, TaskLayout};
use serde::Deserialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Arm joints before the gripper.
const BODY: usize = 5;

/// What a real arm's episodes are (`[arm] task`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArmTask {
    /// The simulator's reach layout (SO-101 only): a target per episode, success within 2 cm.
    Reach,
    /// Joint positions and velocities; episodes end at their limit or on a person's label.
    Joints,
}

fn d_arm_task() -> ArmTask {
    ArmTask::Reach
}
fn d_arm_action() -> reflex_contracts::msg::ActionKind {
    reflex_contracts::msg::ActionKind::EeDelta
}
fn d_arm_hz() -> f64 {
    50.0
}
fn d_arm_timeout() -> f64 {
    20.0
}
fn d_arm_retries() -> u32 {
    2
}
fn d_arm_missed() -> u32 {
    3
}
fn d_arm_start_speed() -> f64 {
    0.5
}
fn d_arm_ee_step() -> f64 {
    0.008
}
fn d_arm_joint_step() -> f64 {
    0.05
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
/// `[arm]`: a real arm on a serial port (`robot.source = "so101"` or `"koch"`).
pub struct ArmSection {
    /// Serial port of the arm's bus adapter (`/dev/ttyACM0`, or what `reflex hw emulate` prints).
    pub port: String,
    /// LeRobot calibration file (absent: every joint's zero at step 2048, for emulated servos).
    #[serde(default)]
    pub calibration: Option<PathBuf>,
    /// `reach` (SO-101) or `joints`.
    #[serde(default = "d_arm_task")]
    pub task: ArmTask,
    /// Action space: ee_delta, joint_abs or joint_delta.
    #[serde(default = "d_arm_action")]
    pub action: reflex_contracts::msg::ActionKind,
    /// Control rate, Hz.
    #[serde(default = "d_arm_hz")]
    pub control_hz: f64,
    /// Episode time limit in steps (default: 3 s for reach, 20 s for joints).
    #[serde(default)]
    pub max_episode_steps: Option<u32>,
    /// Deadline of one bus attempt, ms.
    #[serde(default = "d_arm_timeout")]
    pub timeout_ms: f64,
    /// Attempts after the first.
    #[serde(default = "d_arm_retries")]
    pub retries: u32,
    /// Failed reads in a row (each after its retries) before the run stops, the arm holding.
    #[serde(default = "d_arm_missed")]
    pub max_missed_reads: u32,
    /// Speed of the move to an episode's start pose, rad/s.
    #[serde(default = "d_arm_start_speed")]
    pub start_speed_rad_s: f64,
    /// Largest end-effector step per action, m.
    #[serde(default = "d_arm_ee_step")]
    pub ee_step_m: f64,
    /// Largest joint step per action, rad.
    #[serde(default = "d_arm_joint_step")]
    pub joint_step_rad: f64,
    /// Seed of the targets when the run gives none.
    #[serde(default)]
    pub seed: u64,
    /// The arm's cameras (`[[arm.cameras]]`): their frames are the observation's images, in this
    /// order, as the simulator's cameras are.
    #[serde(default)]
    pub cameras: Vec<CameraConfig>,
}

impl Validate for ArmSection {
    fn validate(&self, p: &str) -> Result<(), Invalid> {
        in_range(p, "control_hz", self.control_hz, 1.0, 1000.0)?;
        in_range(p, "timeout_ms", self.timeout_ms, 1.0, 1000.0)?;
        in_range(p, "start_speed_rad_s", self.start_speed_rad_s, 0.01, 3.0)?;
        in_range(p, "ee_step_m", self.ee_step_m, 1e-4, 0.05)?;
        in_range(p, "joint_step_rad", self.joint_step_rad, 1e-4, 0.5)?;
        reflex_cameras::validate_cameras(&self.cameras, &format!("{p}.cameras"))?;
        if self.retries > 10 {
            return Err(Invalid {
                key: format!("{p}.retries"),
                value: self.retries.to_string(),
                allowed: "0 to 10".into(),
            });
        }
        if !matches!(
            self.action,
            reflex_contracts::msg::ActionKind::EeDelta
                | reflex_contracts::msg::ActionKind::JointAbs
                | reflex_contracts::msg::ActionKind::JointDelta
        ) {
            return Err(Invalid {
                key: format!("{p}.action"),
                value: format!("{:?}", self.action),
                allowed: "ee_delta, joint_abs or joint_delta".into(),
            });
        }
        Ok(())
    }
}

/// `[robot] on_exit`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnExit {
    /// Keep the last goal with the torque on (the default: nothing falls).
    #[default]
    Hold,
    /// Turn the torque off (the arm can be moved by hand; unsupported joints fall).
    Release,
}

impl OnExit {
    /// `hold` or `release`.
    pub fn as_str(self) -> &'static str {
        match self {
            OnExit::Hold => "hold",
            OnExit::Release => "release",
        }
    }
}

/// Bus timing and counters of a run on a real arm, for the run's report.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ArmReport {
    /// `so101-follower`, ...
    pub arm: String,
    /// Serial port.
    pub port: String,
    /// SYNC READ of the present positions: p50, p99, max, µs, and how many.
    pub read_p50_us: f64,
    /// 99th percentile of the reads, µs.
    pub read_p99_us: f64,
    /// Slowest read, µs.
    pub read_max_us: f64,
    /// Reads that succeeded.
    pub reads: u64,
    /// SYNC WRITE of the goals, p50, µs.
    pub write_p50_us: f64,
    /// 99th percentile of the writes, µs.
    pub write_p99_us: f64,
    /// Writes made.
    pub writes: u64,
    /// Ticks whose read failed after every retry.
    pub missed_reads: u64,
    /// Writes that failed.
    pub failed_writes: u64,
    /// Attempts repeated after a timeout or a corrupt answer.
    pub retries: u64,
    /// Answers that failed their checksum or framing.
    pub corrupt: u64,
    /// Attempts that timed out.
    pub timeouts: u64,
    /// What the arm was left doing when reflex let go of it: `hold` (last goal, torque on) or
    /// `release` (torque off); empty while the run goes on.
    pub on_exit: String,
    /// Whether that last act reached every servo (false: the bus failed; the servos keep what
    /// they last received).
    pub on_exit_ok: bool,
    /// Each camera's frames, drops and age at use.
    pub cameras: Vec<CameraStats>,
    /// Observations held back because a camera's newest frame was older than its timeout (the
    /// loop then holds the arm, as for any stale observation).
    pub camera_stale_reads: u64,
}

/// Shared with the caller, so the report survives the robot being moved into the loop.
pub type SharedTiming = std::sync::Arc<std::sync::Mutex<Option<ArmReport>>>;

/// A real arm (SO-101 or Koch follower) driven through its servo bus.
pub struct ArmRobot {
    arm: ServoArm,
    spec: RobotSpec,
    cfg: ArmSection,
    model: Option<ArmModel>,
    ik: IkOptions,
    obs: Observation,
    /// Measured joints (body in rad, gripper as a fraction of its range).
    q: Vec<f64>,
    q_prev: Vec<f64>,
    /// The goal being sent (same units).
    q_cmd: Vec<f64>,
    /// The goal before the command being applied.
    q_before: Vec<f64>,
    ranges: Vec<(f64, f64)>,
    ee_goal: Vector3<f64>,
    layout: Option<TaskLayout>,
    seeds: ChaCha8Rng,
    t_read: Option<Instant>,
    t_episode: Instant,
    missed_in_a_row: u32,
    shared: SharedTiming,
    stop: Option<Arc<StopSwitch>>,
    on_exit: OnExit,
    exit: Option<(OnExit, bool)>,
    cameras: Vec<Capture>,
    /// Time origin of the cameras' frame stamps.
    epoch: Instant,
    camera_stale_reads: u64,
    /// The camera that was stale at the last read (warned once per spell).
    stale_camera: Option<usize>,
    /// Commands written this episode: the step number of the next fresh observation (a held,
    /// stale observation keeps its step, so the loop sees it unchanged and holds).
    commands: u32,
}

/// How long a reset waits for a fresh frame from every camera.
const CAMERA_START: Duration = Duration::from_secs(5);

/// Changes smaller than this (joint units) are no change: a hold that goes through the action's
/// f32 units comes back within rounding and must not move a servo by a step.
const SAME: f64 = 1e-6;

fn device(robot: &str, e: impl std::fmt::Display) -> RobotError {
    RobotError::Device {
        robot: robot.into(),
        message: e.to_string(),
    }
}

impl ArmRobot {
    /// Opens the arm of `kind` as the config says; checks every servo answers.
    pub fn open(kind: ArmKind, name: &str, cfg: &ArmSection) -> Result<Self, RobotError> {
        let calibration = match &cfg.calibration {
            Some(p) => reflex_calibration::Calibration::read(p, crate::arm::RESOLUTION)
                .map_err(|e| device(name, e))?,
            None => {
                tracing::warn!(
                    "{}: no [arm] calibration file; every joint's zero is taken at step 2048 (right for `reflex hw emulate`, not for a real arm: run `reflex calibrate joints`)",
                    kind.name()
                );
                kind.default_calibration()
            }
        };
        let arm = ServoArm::open(
            kind,
            &cfg.port,
            &calibration,
            Duration::from_secs_f64(cfg.timeout_ms / 1e3),
            cfg.retries,
        )
        .map_err(|e| device(name, e))?;
        let mut arm = arm;
        let mut here = vec![0.0; arm.dof()];
        if !kind.is_leader() {
            // Safe start: hold where the arm is before anything moves it.
            arm.hold_here(&mut here).map_err(|e| device(name, e))?;
        }
        let model = match kind {
            ArmKind::So101Follower | ArmKind::So101Leader => Some(ArmModel::so101()),
            _ => None,
        };
        if cfg.task == ArmTask::Reach && model.is_none() {
            return Err(device(
                name,
                format!(
                    "[arm] task = \"reach\" needs the arm's kinematics, which reflex has for the SO-101 only; use task = \"joints\" for the {}",
                    kind.name()
                ),
            ));
        }
        let ranges = arm.ranges();
        let mut spec = Self::make_spec(kind, name, cfg, model.as_ref(), &ranges)?;
        let epoch = Instant::now();
        let mut cameras = Vec::with_capacity(cfg.cameras.len());
        for c in &cfg.cameras {
            let calibration = c.load_calibration().map_err(|e| device(name, e))?;
            let source = c.open().map_err(|e| device(name, e))?;
            cameras.push(Capture::spawn(c, source, epoch).map_err(|e| device(name, e))?);
            spec.cameras.push(c.spec_calibrated(&calibration));
        }
        let images = cfg.cameras.iter().map(CameraConfig::blank_image).collect();
        Ok(ArmRobot {
            arm,
            cfg: cfg.clone(),
            ik: IkOptions {
                max_iterations: 30,
                position_tolerance_m: 2e-4,
                rotation_tolerance_rad: 2e-3,
                ..Default::default()
            },
            obs: Observation {
                v: PROTOCOL_VERSION,
                seq: 0,
                episode: 0,
                step: 0,
                time_ns: 0,
                state: Vec::with_capacity(spec.state_dim()),
                reward: 0.0,
                terminated: false,
                truncated: false,
                success: false,
                images,
                success_score: None,
            },
            spec,
            model,
            q: here.clone(),
            q_prev: here.clone(),
            q_before: here.clone(),
            q_cmd: here,
            ranges,
            ee_goal: Vector3::zeros(),
            layout: None,
            seeds: ChaCha8Rng::seed_from_u64(cfg.seed),
            t_read: None,
            t_episode: Instant::now(),
            missed_in_a_row: 0,
            shared: SharedTiming::default(),
            stop: None,
            on_exit: OnExit::Hold,
            exit: None,
            cameras,
            epoch,
            camera_stale_reads: 0,
            stale_camera: None,
            commands: 0,
        })
    }

    /// What the arm does when this robot is dropped (the run ended, failed or was stopped):
    /// keep its last goal with the torque on, or turn the torque off.
    pub fn set_on_exit(&mut self, on_exit: OnExit) {
        self.on_exit = on_exit;
    }

    /// The e-stop stops moves the arm makes on its own: `Err` when it is not running.
    fn check_stop(&self, what: &'static str) -> Result<(), RobotError> {
        match &self.stop {
            Some(s) if !s.may_move() => Err(RobotError::Stopped {
                robot: self.spec.name.clone(),
                what,
                state: s.state().as_str(),
            }),
            _ => Ok(()),
        }
    }

    /// Lets go of the arm as `[robot] on_exit` says: the last goal once more with the torque on,
    /// or the torque off.
    fn settle(&mut self) {
        let ok = match self.on_exit {
            OnExit::Hold => self.arm.write(&self.q_cmd).is_ok(),
            OnExit::Release => self.arm.set_torque(false).is_ok(),
        };
        match (self.on_exit, ok) {
            (OnExit::Hold, true) => tracing::info!(
                "{}: on exit the servos hold their last goal with the torque on",
                self.spec.name
            ),
            (OnExit::Release, true) => tracing::warn!(
                "{}: on exit the torque is off: the joints are free and fall under gravity",
                self.spec.name
            ),
            (what, false) => tracing::warn!(
                "{}: on exit could not {} (the bus failed): the servos keep what they last received",
                self.spec.name,
                what.as_str()
            ),
        }
        self.exit = Some((self.on_exit, ok));
    }

    fn make_spec(
        kind: ArmKind,
        name: &str,
        cfg: &ArmSection,
        model: Option<&ArmModel>,
        ranges: &[(f64, f64)],
    ) -> Result<RobotSpec, RobotError> {
        let source = match kind {
            ArmKind::So101Follower | ArmKind::So101Leader => "so101",
            _ => "koch",
        };
        let joints: Vec<String> = kind.motors().iter().map(|m| m.name.to_string()).collect();
        let (state, action) = match (cfg.task, model) {
            (ArmTask::Reach, Some(model)) => (
                reflex_tabletop::spec::state_fields(TaskKind::Reach),
                reflex_tabletop::spec::action_space(
                    cfg.action,
                    cfg.ee_step_m,
                    0.2,
                    cfg.joint_step_rad,
                    model,
                ),
            ),
            _ => {
                if matches!(cfg.action, ActionKind::EeDelta | ActionKind::EeDeltaYaw) {
                    return Err(device(
                        name,
                        "[arm] action: end-effector actions need task = \"reach\" (the SO-101's kinematics); use joint_abs or joint_delta",
                    ));
                }
                let f = StateField::new;
                let state = vec![
                    f(
                        "joint_pos",
                        6,
                        "rad for the 5 arm joints, then the gripper as a fraction of its calibrated range",
                    ),
                    f(
                        "joint_vel",
                        6,
                        "rad/s, then the gripper's fraction per second",
                    ),
                ];
                let s = cfg.joint_step_rad as f32;
                let names = |p: &str, u: &str| -> Vec<String> {
                    joints.iter().map(|j| format!("{p}{j}_{u}")).collect()
                };
                let action = match cfg.action {
                    ActionKind::JointDelta => reflex_contracts::msg::ActionSpec {
                        kind: ActionKind::JointDelta,
                        names: names("d_", "rad"),
                        low: vec![-s, -s, -s, -s, -s, -0.1],
                        high: vec![s, s, s, s, s, 0.1],
                    },
                    // Joint targets within what the calibration allows.
                    _ => reflex_contracts::msg::ActionSpec {
                        kind: ActionKind::JointAbs,
                        names: names("", "rad"),
                        low: ranges.iter().map(|r| r.0 as f32).collect(),
                        high: ranges.iter().map(|r| r.1 as f32).collect(),
                    },
                };
                (state, action)
            }
        };
        let task = match cfg.task {
            ArmTask::Reach => "reach",
            ArmTask::Joints => "joints",
        };
        let mut spec = RobotSpec::new(name, &format!("{source}/{task}"), cfg.control_hz);
        spec.lockstep = false;
        spec.state = state;
        spec.action = action;
        spec.joints = joints;
        spec.max_episode_steps = cfg.max_episode_steps.unwrap_or(match cfg.task {
            // The simulator's reach limit (60 steps at 20 Hz), in time.
            ArmTask::Reach => (3.0 * cfg.control_hz).round() as u32,
            ArmTask::Joints => (20.0 * cfg.control_hz).round() as u32,
        });
        if cfg.task == ArmTask::Reach {
            spec.scene = Some(reflex_tabletop::spec::scene(TaskKind::Reach));
        }
        spec.validate().map_err(RobotError::from)?;
        Ok(spec)
    }

    /// A handle on the bus report, filled at every episode's end and when the robot is dropped.
    pub fn report_handle(&self) -> SharedTiming {
        self.shared.clone()
    }

    /// The cameras' counters, readable from another thread (the status message's).
    pub fn camera_monitors(&self) -> Vec<reflex_cameras::CameraMonitor> {
        self.cameras.iter().map(Capture::monitor).collect()
    }

    /// The bus timing so far.
    pub fn timing(&self) -> &ArmTiming {
        self.arm.timing()
    }

    fn publish_report(&self) {
        let t = self.arm.timing();
        let s = self.arm.bus_stats();
        let us = |h: &reflex_runtime::hist::Histogram, p: f64| {
            if h.count() == 0 {
                0.0
            } else {
                h.percentile(p).as_secs_f64() * 1e6
            }
        };
        let r = ArmReport {
            arm: self.arm.kind().name().into(),
            port: self.arm.port().into(),
            read_p50_us: us(&t.read, 50.0),
            read_p99_us: us(&t.read, 99.0),
            read_max_us: t.read.max().as_secs_f64() * 1e6,
            reads: t.read.count(),
            write_p50_us: us(&t.write, 50.0),
            write_p99_us: us(&t.write, 99.0),
            writes: t.write.count(),
            missed_reads: t.missed_reads,
            failed_writes: t.failed_writes,
            retries: s.retries,
            corrupt: s.corrupt,
            timeouts: s.timeouts,
            on_exit: self
                .exit
                .map_or(String::new(), |(e, _)| e.as_str().to_string()),
            on_exit_ok: self.exit.is_some_and(|(_, ok)| ok),
            cameras: self.cameras.iter().map(Capture::stats).collect(),
            camera_stale_reads: self.camera_stale_reads,
        };
        if let Ok(mut g) = self.shared.lock() {
            *g = Some(r);
        }
    }

    /// Copies each camera's frame into the observation when a new one has come (no allocation:
    /// the buffers are sized at open). False when a camera's newest frame is older than its timeout: the
    /// observation is then not renewed, so the loop's stale-observation hold applies.
    fn take_frames(&mut self) -> bool {
        let now = self.epoch.elapsed();
        let mut stale = None;
        for (i, (cap, img)) in self
            .cameras
            .iter_mut()
            .zip(&mut self.obs.images)
            .enumerate()
        {
            if let Some(f) = cap.newer(now) {
                img.data.copy_from_slice(&f.image.data);
                img.seq = f.seq;
            }
            // The frame's capture time on the loop's clock, as its age at this observation.
            img.age_ns = cap
                .captured()
                .map_or(0, |t| now.saturating_sub(t).as_nanos() as u64);
            if stale.is_none() && cap.is_stale(now) {
                stale = Some(i);
            }
        }
        if stale.is_some() {
            self.camera_stale_reads += 1;
        }
        if stale != self.stale_camera {
            match stale {
                Some(i) => tracing::warn!(
                    "{}: camera `{}` has delivered no frame for over its timeout; holding the last observation",
                    self.spec.name,
                    self.cameras[i].name()
                ),
                None => tracing::info!("{}: cameras delivering again", self.spec.name),
            }
            self.stale_camera = stale;
        }
        stale.is_none()
    }

    fn tcp(&self) -> Option<Isometry3<f64>> {
        self.model.as_ref().map(|m| m.chain.fk(&self.q[..BODY]))
    }

    fn opening_m(&self, fraction: f64) -> f64 {
        fraction
            * self
                .model
                .as_ref()
                .map_or(1.0, |m| m.max_opening_m() as f64)
    }

    fn fraction(&self, opening_m: f64) -> f64 {
        opening_m
            / self
                .model
                .as_ref()
                .map_or(1.0, |m| m.max_opening_m() as f64)
    }

    fn ik_top_down(&self, pos: &Vector3<f64>, seed: &[f64]) -> Option<[f64; BODY]> {
        let m = self.model.as_ref()?;
        let target = Isometry3::from_parts(Translation3::from(*pos), top_down(HOME_YAW));
        let sol = m.ik_chain.ik(&target, &seed[..BODY], &self.ik);
        let mut q = [0.0; BODY];
        q.copy_from_slice(&sol.q[..BODY]);
        Some(q)
    }

    /// One SYNC READ into `q`, velocities from the previous read.
    fn read(&mut self) -> Result<bool, RobotError> {
        self.q_prev.copy_from_slice(&self.q);
        match self.arm.read(&mut self.q) {
            Ok(()) => {
                self.missed_in_a_row = 0;
                Ok(true)
            }
            Err(e) => {
                self.q.copy_from_slice(&self.q_prev);
                self.missed_in_a_row += 1;
                if self.missed_in_a_row > self.cfg.max_missed_reads {
                    self.publish_report();
                    return Err(device(
                        &self.spec.name,
                        format!(
                            "{} reads in a row failed, the arm holds its last goal: {e}",
                            self.missed_in_a_row
                        ),
                    ));
                }
                tracing::warn!(
                    "{}: read failed, holding the last observation: {e}",
                    self.spec.name
                );
                Ok(false)
            }
        }
    }

    fn update_obs(&mut self, dt: f64) {
        let o = &mut self.obs;
        o.seq += 1;
        o.step = self.commands;
        o.time_ns = self.t_episode.elapsed().as_nanos() as u64;
        let s = &mut o.state;
        s.clear();
        let max_open = self
            .model
            .as_ref()
            .map_or(1.0, |m| m.max_opening_m() as f64);
        let grip = |v: f64| {
            if self.model.is_some() {
                v * max_open
            } else {
                v
            }
        };
        for k in 0..self.q.len() {
            let v = if k == BODY {
                grip(self.q[k])
            } else {
                self.q[k]
            };
            s.push(v as f32);
        }
        for k in 0..self.q.len() {
            let d = if dt > 0.0 {
                (self.q[k] - self.q_prev[k]) / dt
            } else {
                0.0
            };
            let v = if k == BODY { grip(d) } else { d };
            s.push(v as f32);
        }
        let (mut success, mut terminated) = (false, false);
        if let (Some(m), Some(layout)) = (&self.model, &self.layout) {
            let tcp = m.chain.fk(&self.q[..BODY]);
            let t = tcp.translation.vector;
            let r = tcp.rotation.quaternion();
            s.extend_from_slice(&[t.x as f32, t.y as f32, t.z as f32]);
            s.extend_from_slice(&[r.i as f32, r.j as f32, r.k as f32, r.w as f32]);
            let g = layout.target;
            s.extend_from_slice(&[g.x as f32, g.y as f32, g.z as f32]);
            let d = g - t;
            s.extend_from_slice(&[d.x as f32, d.y as f32, d.z as f32]);
            success = layout.success(&t, None);
            terminated = success;
        }
        o.success = success;
        o.terminated = terminated;
        o.reward = if success && o.step > 0 { 1.0 } else { 0.0 };
        o.truncated = !terminated && o.step >= self.spec.max_episode_steps;
    }

    /// Moves from where the arm is to `goal` no faster than `[arm] start_speed_rad_s`, one goal
    /// per control period, then waits (up to 2 s) until the arm is there. The e-stop is checked
    /// before every goal: once it is raised no further goal is written, the arm holds the last
    /// one (at most one period's step from where it was), and the move returns
    /// [`RobotError::Stopped`].
    fn move_to(&mut self, goal: &[f64]) -> Result<(), RobotError> {
        let period = Duration::from_secs_f64(1.0 / self.cfg.control_hz);
        let max_step = self.cfg.start_speed_rad_s / self.cfg.control_hz;
        self.check_stop("the move to the start pose")?;
        while !self.read()? {}
        self.q_cmd.copy_from_slice(&self.q);
        loop {
            self.check_stop("the move to the start pose")?;
            let mut done = true;
            for (k, (q, g)) in self.q_cmd.iter_mut().zip(goal).enumerate() {
                // The gripper's unit is a fraction of its range: its whole range in the time the
                // other joints turn half a turn.
                let lim = if k == BODY {
                    max_step / std::f64::consts::PI
                } else {
                    max_step
                };
                *q += (g - *q).clamp(-lim, lim);
                done &= (g - *q).abs() < 1e-9;
            }
            self.arm
                .write(&self.q_cmd)
                .map_err(|e| device(&self.spec.name, e))?;
            std::thread::sleep(period);
            if done {
                break;
            }
        }
        let t0 = Instant::now();
        loop {
            self.check_stop("the move to the start pose")?;
            self.read()?;
            let far = self
                .q
                .iter()
                .zip(goal)
                .take(BODY)
                .any(|(q, g)| (q - g).abs() > 0.02);
            if !far || t0.elapsed() > Duration::from_secs(2) {
                if far {
                    tracing::warn!(
                        "{}: the arm did not reach its start pose within 2 s (measured {:?}, goal {:?})",
                        self.spec.name,
                        self.q,
                        goal
                    );
                }
                return Ok(());
            }
            std::thread::sleep(period);
        }
    }
}

impl Drop for ArmRobot {
    fn drop(&mut self) {
        self.settle();
        self.publish_report();
    }
}

impl Robot for ArmRobot {
    fn spec(&self) -> &RobotSpec {
        &self.spec
    }

    fn reset(&mut self, seed: Option<u64>) -> Result<&Observation, RobotError> {
        if self.obs.episode > 0 {
            self.publish_report();
        }
        self.check_stop("the reset")?;
        let seed = seed.unwrap_or_else(|| self.seeds.random());
        // Where the arm starts: the simulator's start pose for reach, else where it is.
        while !self.read()? {}
        let mut start = self.q.clone();
        if self.cfg.task == ArmTask::Reach {
            let layout = TaskLayout::sample(TaskKind::Reach, &mut ChaCha8Rng::seed_from_u64(seed));
            let t = layout.tcp_start;
            let seed_q = [t.y.atan2(t.x), 0.0, 0.0, 0.0, 0.0, 0.0];
            let q = self
                .ik_top_down(&t, &seed_q)
                .expect("reach has a kinematic model");
            start[..BODY].copy_from_slice(&q);
            start[BODY] = self.fraction(layout.opening_start);
            self.layout = Some(layout);
        }
        for (k, (lo, hi)) in self.ranges.iter().enumerate() {
            start[k] = start[k].clamp(*lo, *hi);
        }
        self.move_to(&start)?;
        if let Some(tcp) = self.tcp() {
            self.ee_goal = tcp.translation.vector;
        }
        self.q_cmd.copy_from_slice(&start);
        // An episode starts with a fresh frame from every camera (waited for here, in the reset,
        // never in a control step).
        let t0 = Instant::now();
        while !self.take_frames() {
            if t0.elapsed() > CAMERA_START {
                let name = self.stale_camera.map_or("?", |i| self.cameras[i].name());
                return Err(device(
                    &self.spec.name,
                    format!(
                        "camera `{name}` delivered no fresh frame within {} s of the episode's start; check its device, cable and rate",
                        CAMERA_START.as_secs()
                    ),
                ));
            }
            // Paces the wait for the cameras' first frames of the episode.
            std::thread::sleep(Duration::from_millis(5));
        }
        self.obs.episode += 1;
        self.obs.step = 0;
        self.commands = 0;
        tracing::info!(
            "{}: episode {} under way (start pose reached{})",
            self.spec.name,
            self.obs.episode,
            if self.cameras.is_empty() {
                ""
            } else {
                ", every camera delivering"
            }
        );
        self.t_episode = Instant::now();
        self.t_read = Some(Instant::now());
        self.update_obs(0.0);
        Ok(&self.obs)
    }

    fn command(&mut self, a: &[f32]) -> Result<(), RobotError> {
        check_action(&self.spec.name, self.spec.action.dim(), a)?;
        let lim = &self.spec.action;
        let c = |i: usize| a[i].clamp(lim.low[i], lim.high[i]) as f64;
        self.q_before.copy_from_slice(&self.q_cmd);
        match self.spec.action.kind {
            // No step: the body keeps its goals exactly (a hold never re-solves the IK).
            ActionKind::EeDelta | ActionKind::EeDeltaYaw
                if a[..a.len() - 1].iter().all(|v| *v == 0.0) =>
            {
                self.q_cmd[BODY] = self.fraction(c(a.len() - 1));
            }
            ActionKind::EeDelta | ActionKind::EeDeltaYaw => {
                let measured = self.tcp().map(|t| t.translation.vector).unwrap_or_default();
                // As in the simulator: track the goal so small steps add up, re-anchor on the
                // measured pose when the arm could not follow.
                if (self.ee_goal - measured).norm() > 0.03 {
                    self.ee_goal = measured;
                }
                let g = self.ee_goal + Vector3::new(c(0), c(1), c(2));
                self.ee_goal = Vector3::new(
                    g.x.clamp(WORKSPACE_MIN[0], WORKSPACE_MAX[0]),
                    g.y.clamp(WORKSPACE_MIN[1], WORKSPACE_MAX[1]),
                    g.z.clamp(WORKSPACE_MIN[2], WORKSPACE_MAX[2]),
                );
                let grip = c(a.len() - 1);
                if let Some(q) = self.ik_top_down(&self.ee_goal, &self.q_cmd) {
                    self.q_cmd[..BODY].copy_from_slice(&q);
                }
                self.q_cmd[BODY] = self.fraction(grip);
            }
            ActionKind::JointAbs => {
                for k in 0..self.q_cmd.len() {
                    self.q_cmd[k] = c(k);
                }
                if self.model.is_some() {
                    self.q_cmd[BODY] = self.fraction(c(BODY));
                }
            }
            ActionKind::JointDelta => {
                for k in 0..self.q_cmd.len() {
                    let d = if k == BODY && self.model.is_some() {
                        self.fraction(c(k))
                    } else {
                        c(k)
                    };
                    self.q_cmd[k] += d;
                }
            }
            ActionKind::Box => {}
        }
        for ((q, (lo, hi)), b) in self.q_cmd.iter_mut().zip(&self.ranges).zip(&self.q_before) {
            *q = q.clamp(*lo, *hi);
            if (*q - b).abs() < SAME {
                *q = *b;
            }
        }
        self.arm
            .write(&self.q_cmd)
            .map_err(|e| device(&self.spec.name, e))?;
        self.commands += 1;
        Ok(())
    }

    fn observe(&mut self) -> Result<&Observation, RobotError> {
        if self.read()? && self.take_frames() {
            let now = Instant::now();
            let dt = self
                .t_read
                .replace(now)
                .map_or(0.0, |t| (now - t).as_secs_f64());
            self.update_obs(dt);
        }
        Ok(&self.obs)
    }

    fn hold_action(&self, out: &mut [f32]) {
        out.fill(0.0);
        match self.spec.action.kind {
            ActionKind::EeDelta => out[3] = self.opening_m(self.q_cmd[BODY]) as f32,
            ActionKind::EeDeltaYaw => out[4] = self.opening_m(self.q_cmd[BODY]) as f32,
            ActionKind::JointAbs => {
                for (o, q) in out.iter_mut().zip(&self.q_cmd) {
                    *o = *q as f32;
                }
                if self.model.is_some() {
                    out[BODY] = self.opening_m(self.q_cmd[BODY]) as f32;
                }
            }
            ActionKind::JointDelta | ActionKind::Box => {}
        }
    }

    fn attach_stop(&mut self, stop: Arc<StopSwitch>) {
        self.stop = Some(stop);
    }
}
