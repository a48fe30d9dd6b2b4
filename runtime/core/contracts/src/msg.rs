//! Wire messages of the reflex robot protocol.
//!
//! Every message is a serde struct encoded as MessagePack with named fields
//! (`rmp_serde::to_vec_named`), so Python's `msgpack.unpackb` yields a plain dict. Every message
//! carries `v`, the protocol version; a peer that receives another version gets a
//! [`DecodeError::Version`] naming the key expression, never a silent misread. docs/protocol.md is
//! the human-readable contract and must change together with this file.

use serde::{Deserialize, Serialize, de::DeserializeOwned};

/// Version of the wire protocol described in docs/protocol.md.
pub const PROTOCOL_VERSION: u16 = 1;

/// One named segment of the flat observation state vector (e.g. `joint_pos`, 6 values, `rad`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StateField {
    /// Name, e.g. `joint_pos`, `ee_pos`, `object_quat`.
    pub name: String,
    /// Number of f32 values.
    pub size: u32,
    /// Units and frame in words, e.g. `rad`, `m, base frame`, `quaternion xyzw, base frame`.
    pub unit: String,
    /// Lower bound of each value where the robot knows one (a Gymnasium `Box`, joint limits);
    /// infinite where unbounded. The learner scales the state by these when no base policy
    /// gives it a normalisation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub low: Option<Vec<f32>>,
    /// Upper bound of each value, as `low`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high: Option<Vec<f32>>,
}

impl StateField {
    /// A field of `size` values without bounds.
    pub fn new(name: &str, size: u32, unit: &str) -> Self {
        StateField {
            name: name.to_string(),
            size,
            unit: unit.to_string(),
            low: None,
            high: None,
        }
    }
}

/// What a recorder or viewer can draw of a robot, described by the robot itself (never guessed
/// from its `kind`): an arm from a URDF, boxes and markers placed by state fields.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Scene {
    /// The arm, posed by forward kinematics from a state field of joint positions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arm: Option<ArmScene>,
    /// Boxes posed by state fields (objects the robot handles).
    #[serde(default)]
    pub objects: Vec<SceneObject>,
    /// Points placed by state fields (targets, goals).
    #[serde(default)]
    pub markers: Vec<SceneMarker>,
    /// State field with the tool position (m, base frame) to draw as a path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_path_field: Option<String>,
    /// Boxes that never move (a table).
    #[serde(default)]
    pub static_boxes: Vec<StaticBox>,
}

/// A fixed box.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StaticBox {
    /// Entity name.
    pub name: String,
    /// Centre, m, base frame.
    pub center_m: [f32; 3],
    /// Half extents, m.
    pub half_extents_m: [f32; 3],
    /// Colour.
    pub rgb: [u8; 3],
}

/// An arm to draw.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ArmScene {
    /// The URDF, as XML text.
    pub urdf: String,
    /// Name of the base link.
    pub base_link: String,
    /// Name of the tool link (the end of the chain).
    pub tool_link: String,
    /// State field holding the chain's joint positions (rad, URDF order).
    pub joint_field: String,
    /// Two fingers drawn at the tool, opened by a state value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gripper: Option<GripperScene>,
}

/// Parallel fingers at the tool link.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GripperScene {
    /// Index into the state vector of the opening, m (the distance between the fingers).
    pub opening_index: u32,
    /// Offset of the finger centres along the tool's z axis, m.
    pub offset_m: f32,
}

/// A box whose pose comes from the state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SceneObject {
    /// Entity name.
    pub name: String,
    /// State field with its position (m, base frame, 3 values).
    pub position_field: String,
    /// State field with its orientation (quaternion xyzw, 4 values), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quaternion_field: Option<String>,
    /// Half extents, m.
    pub half_extents_m: [f32; 3],
    /// Colour.
    pub rgb: [u8; 3],
}

/// A point whose position comes from the state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SceneMarker {
    /// Entity name.
    pub name: String,
    /// State field with its position (m, base frame, 3 values).
    pub position_field: String,
    /// Radius, m.
    pub radius_m: f32,
    /// Colour.
    pub rgb: [u8; 3],
}

/// How a robot interprets the action vector of a [`Command`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionKind {
    /// Absolute joint-position targets (rad for revolute joints, m for the gripper opening).
    JointAbs,
    /// Joint-position targets relative to the current targets.
    JointDelta,
    /// End-effector translation step (m, base frame) and gripper opening target (m), through IK.
    EeDelta,
    /// As [`ActionKind::EeDelta`] plus a yaw step (rad) about the base z axis.
    EeDeltaYaw,
    /// A generic bounded vector (a Gymnasium `Box`); meaning defined by the environment.
    Box,
}

impl ActionKind {
    /// The config/CLI spelling of this kind.
    pub fn as_str(self) -> &'static str {
        match self {
            ActionKind::JointAbs => "joint_abs",
            ActionKind::JointDelta => "joint_delta",
            ActionKind::EeDelta => "ee_delta",
            ActionKind::EeDeltaYaw => "ee_delta_yaw",
            ActionKind::Box => "box",
        }
    }
}

/// The action space: its kind, the name of every component and its bounds in physical units.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ActionSpec {
    /// How the vector is interpreted.
    pub kind: ActionKind,
    /// One name per component, e.g. `dx_m`, `gripper_m`.
    pub names: Vec<String>,
    /// Lower bound per component.
    pub low: Vec<f32>,
    /// Upper bound per component.
    pub high: Vec<f32>,
}

impl ActionSpec {
    /// Number of components.
    pub fn dim(&self) -> usize {
        self.names.len()
    }
}

/// A camera the robot publishes images from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CameraSpec {
    /// Name, e.g. `front`, `wrist`.
    pub name: String,
    /// Image width in pixels.
    pub width: u32,
    /// Image height in pixels.
    pub height: u32,
    /// The pinhole of the images as published (after any undistortion, crop and resize):
    /// `[fx, fy, cx, cy]`, px, pixel centres at integers (OpenCV's convention). Absent: unknown
    /// (an uncalibrated camera).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intrinsics: Option<[f64; 4]>,
    /// Where the camera sits (OpenCV camera axes: x right, y down, z forward). Absent: unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount: Option<CameraMount>,
}

/// A camera's pose on the robot: `T_parent_camera`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CameraMount {
    /// The frame it is fixed to: `base`, or a link of the robot's URDF (`gripper`).
    pub parent: String,
    /// Translation, m.
    pub translation_m: [f64; 3],
    /// Rotation as a unit quaternion `[x, y, z, w]`.
    pub rotation_xyzw: [f64; 4],
}

/// Everything a controller must know about a robot before it drives it. Served on
/// `reflex/<robot>/spec`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RobotSpec {
    /// Protocol version.
    pub v: u16,
    /// Robot name (the `<robot>` of the key expressions).
    pub name: String,
    /// What stands behind the name: `sim/pick`, `gym/Pendulum-v1`, `so101`, ...
    pub kind: String,
    /// Control rate the robot expects, Hz.
    pub control_hz: f64,
    /// `true` when the robot advances one step per command (simulation); `false` when it runs on
    /// its own clock (hardware, real-time simulation) and publishes observations at `control_hz`.
    pub lockstep: bool,
    /// Layout of [`Observation::state`], in order.
    pub state: Vec<StateField>,
    /// Action space.
    pub action: ActionSpec,
    /// Cameras, in the order their images appear in [`Observation::images`].
    pub cameras: Vec<CameraSpec>,
    /// Joint names of an arm (empty for non-arm environments).
    pub joints: Vec<String>,
    /// Episode time limit in control steps (0 = none).
    pub max_episode_steps: u32,
    /// What a viewer can draw (absent: plots only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scene: Option<Scene>,
}

impl RobotSpec {
    /// A lockstep robot called `name` of `kind` at `control_hz`, with no state, action, cameras
    /// or time limit yet (add them with the `with_*` methods).
    pub fn new(name: &str, kind: &str, control_hz: f64) -> Self {
        RobotSpec {
            v: PROTOCOL_VERSION,
            name: name.into(),
            kind: kind.into(),
            control_hz,
            lockstep: true,
            state: vec![],
            action: ActionSpec {
                kind: ActionKind::Box,
                names: vec![],
                low: vec![],
                high: vec![],
            },
            cameras: vec![],
            joints: vec![],
            max_episode_steps: 0,
            scene: None,
        }
    }

    /// Adds a state field of `size` values.
    pub fn with_state(mut self, name: &str, size: u32, unit: &str) -> Self {
        self.state.push(StateField::new(name, size, unit));
        self
    }

    /// Sets the action space: one component per name, each within `[low, high]`.
    pub fn with_action(mut self, kind: ActionKind, names: &[&str], low: f32, high: f32) -> Self {
        self.action = ActionSpec {
            kind,
            names: names.iter().map(|n| n.to_string()).collect(),
            low: vec![low; names.len()],
            high: vec![high; names.len()],
        };
        self
    }

    /// Sets the episode time limit, in control steps.
    pub fn with_max_episode_steps(mut self, steps: u32) -> Self {
        self.max_episode_steps = steps;
        self
    }

    /// Total length of the state vector.
    pub fn state_dim(&self) -> usize {
        self.state.iter().map(|f| f.size as usize).sum()
    }

    /// Offset and size of the named state field, if present.
    pub fn field(&self, name: &str) -> Option<std::ops::Range<usize>> {
        let mut offset = 0;
        for f in &self.state {
            let end = offset + f.size as usize;
            if f.name == name {
                return Some(offset..end);
            }
            offset = end;
        }
        None
    }
}

/// An image as raw bytes with a small header.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Image {
    /// Camera name (matches a [`CameraSpec`]).
    pub camera: String,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Pixel encoding; `rgb8` (row-major, 3 bytes per pixel, no padding) is the only one today.
    pub encoding: String,
    /// Pixel data.
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
    /// The camera's frame counter, when it has one (0: unknown). Two images of one camera with
    /// the same non-zero counter hold the same pixels, so copies can skip them.
    #[serde(default)]
    pub seq: u64,
    /// How long before the observation the frame was captured, ns, on the robot's one
    /// monotonic clock (the frame's capture time is the observation's `time_ns` less this).
    /// 0: rendered with the observation (the simulator) or not known.
    #[serde(default)]
    pub age_ns: u64,
}

impl Image {
    /// Copies `src` into `self` reusing `self`'s buffers (a derived `clone_from` would allocate);
    /// the pixels are not copied again when `self` already holds that frame of that camera.
    pub fn copy_from(&mut self, src: &Image) {
        let same_frame = src.seq != 0
            && self.seq == src.seq
            && self.camera == src.camera
            && self.data.len() == src.data.len();
        self.camera.clone_from(&src.camera);
        self.width = src.width;
        self.height = src.height;
        self.encoding.clone_from(&src.encoding);
        if !same_frame {
            self.data.clone_from(&src.data);
        }
        self.seq = src.seq;
        self.age_ns = src.age_ns;
    }
}

/// One observation of the robot. Published on `reflex/<robot>/obs`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// Protocol version.
    pub v: u16,
    /// Sequence number of the command this observation answers (lockstep), or a running counter.
    pub seq: u64,
    /// Episode counter (increments on every reset).
    pub episode: u64,
    /// Control step within the episode (0 right after reset).
    pub step: u32,
    /// Robot time since the episode started, ns (simulated time in simulation).
    pub time_ns: u64,
    /// Flat state vector, laid out as [`RobotSpec::state`] says.
    pub state: Vec<f32>,
    /// Reward of the last step (the task's own signal in simulation; 0 on hardware).
    pub reward: f32,
    /// The episode ended in a terminal state (success or failure).
    pub terminated: bool,
    /// The episode was cut by its time limit.
    pub truncated: bool,
    /// The task reports success in this state.
    pub success: bool,
    /// Camera images, in [`RobotSpec::cameras`] order (may be empty when cameras are off).
    pub images: Vec<Image>,
    /// A success classifier's probability that this observation shows the task done, when one
    /// gives the run's reward (`[reward] classifier`); then `reward`, `success` and `terminated`
    /// are its verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success_score: Option<f32>,
}

impl Observation {
    /// `true` when the episode is over (terminated or truncated).
    pub fn done(&self) -> bool {
        self.terminated || self.truncated
    }

    /// Copies `src` into `self` reusing `self`'s buffers (no allocation once capacities suffice).
    pub fn copy_from(&mut self, src: &Observation) {
        self.v = src.v;
        self.seq = src.seq;
        self.episode = src.episode;
        self.step = src.step;
        self.time_ns = src.time_ns;
        self.state.clone_from(&src.state);
        self.reward = src.reward;
        self.terminated = src.terminated;
        self.truncated = src.truncated;
        self.success = src.success;
        self.success_score = src.success_score;
        self.images.truncate(src.images.len());
        for (i, img) in src.images.iter().enumerate() {
            if let Some(dst) = self.images.get_mut(i) {
                dst.copy_from(img);
            } else {
                self.images.push(img.clone());
            }
        }
    }
}

/// A command to the robot. Published on `reflex/<robot>/cmd`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Command {
    /// Protocol version.
    pub v: u16,
    /// Sequence number; a lockstep robot answers with an [`Observation`] of the same `seq`.
    pub seq: u64,
    /// Action vector in the units of [`RobotSpec::action`].
    pub action: Vec<f32>,
}

/// Request body of the `reflex/<robot>/reset` query; the reply is an [`Observation`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ResetRequest {
    /// Protocol version.
    pub v: u16,
    /// Seed for the episode's randomisation; `None` lets the robot choose.
    pub seed: Option<u64>,
}

/// What happened to an episode. Published on `reflex/<robot>/events`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A new episode started.
    Reset,
    /// The task (or a person) marked success.
    Success,
    /// The task (or a person) marked failure.
    Failure,
    /// The episode ended (after success, failure or the time limit).
    Done,
    /// Emergency stop: every actor and robot server holds the robot still, ends the episode in
    /// progress and starts nothing until an operator releases it and resumes (an
    /// [`OperatorMsg`] on `reflex/<robot>/operator`). Anyone on the bus may raise it.
    Estop,
}

/// A deliberate act of an operator on the e-stop (docs/runtime.md, "Stopping"). Published on
/// `reflex/<robot>/operator`, which only peers allowed to teleoperate may write when the bus has
/// access rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OperatorKind {
    /// Release a latched e-stop: the robot stays still (paused) until a resume.
    Release,
    /// Resume a paused run: the next episode starts.
    Resume,
}

/// An operator's release or resume. Published on `reflex/<robot>/operator`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OperatorMsg {
    /// Protocol version.
    pub v: u16,
    /// Release or resume.
    pub kind: OperatorKind,
    /// The e-stop count the operator saw in the robot's status (`StatusMsg::estops`): the act
    /// answers that e-stop only, never one raised after it.
    pub estops: u64,
    /// Who acts (a person's or a device's name; shown in the status and logs).
    pub source: String,
    /// Which holder of the robot's e-stop the act is for: `robot` (its server), `actor`, or
    /// empty for every holder. Each holder counts the e-stops it heard, so when an actor started
    /// after the server its count differs and `reflex estop` sends each its own.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub to: String,
}

/// One holder's e-stop, as `reflex estop` reads it: the reply to a query on
/// `reflex/<robot>/stop/*` (every holder answers on its own key, `stop/robot` or `stop/actor`),
/// and published by a robot server on `reflex/<robot>/stop/robot` when it changes and at least
/// once a second, so an operator can release a served robot whose actor is gone.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StopStatus {
    /// Protocol version.
    pub v: u16,
    /// Robot name.
    pub robot: String,
    /// `robot` (the process serving it) or `actor`.
    pub holder: String,
    /// `running`, `latched` or `paused`.
    pub stop: crate::stop::StopState,
    /// E-stops this holder heard (an operator's release names this count).
    pub estops: u64,
    /// Who raised it (latched), released it (paused) or resumed (running after a stop).
    pub stop_by: String,
    /// Wall time of the last e-stop, ns since the Unix epoch (0: none yet).
    pub estop_raised_unix_ns: u64,
    /// Messages this holder refused on the e-stop's keys (`events`, `operator`), per key; keys
    /// with none are left out.
    #[serde(default)]
    pub rejected: Vec<(String, u64)>,
}

/// An episode event. Published on `reflex/<robot>/events`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EpisodeEvent {
    /// Protocol version.
    pub v: u16,
    /// What happened.
    pub kind: EventKind,
    /// Episode counter of the robot.
    pub episode: u64,
    /// Step within the episode.
    pub step: u32,
    /// Seed of the episode, when known.
    pub seed: Option<u64>,
    /// Who raised it: `robot`, `teleop`, `actor`, `safety`, ...
    pub source: String,
    /// For an e-stop: the operator's act it belongs to. `reflex estop` repeats its raise until
    /// every holder confirms it, and a holder counts one act once while it stays latched
    /// (`StopSwitch::raise_act`). 0 (and absent, from older senders): every message counts.
    #[serde(default)]
    pub act: u64,
}

/// A teleoperation message. Published on `reflex/<robot>/teleop` by a teleop device.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TeleopMsg {
    /// Protocol version.
    pub v: u16,
    /// Running counter of the device.
    pub seq: u64,
    /// Command in the robot's action space (same units as [`Command::action`]).
    pub action: Vec<f32>,
    /// The person holds the intervention control: `action` replaces the policy's.
    pub intervene: bool,
    /// The person marks the episode a success.
    pub success: bool,
    /// The person marks the episode a failure.
    pub failure: bool,
    /// The person asks for a reset.
    pub reset: bool,
}

/// The control loop's own figures: what the loop writes into its status snapshot
/// (`reflex_runtime::control::LoopStatus`) and what [`StatusMsg`] carries of them, one list.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LoopFigures {
    /// Loop time, s.
    pub t_s: f64,
    /// Control steps run.
    pub ticks: u64,
    /// Loop rate achieved over the last status period, Hz.
    pub rate_hz: f64,
    /// Wake-up lateness percentiles since start, us.
    pub lateness_p50_us: f64,
    /// 99th percentile.
    pub lateness_p99_us: f64,
    /// Maximum.
    pub lateness_max_us: f64,
    /// 99th percentile of the step duration, us.
    pub step_p99_us: f64,
    /// Steps that ended after the next deadline.
    pub overruns: u64,
    /// Ticks skipped after overruns.
    pub missed: u64,
    /// Steps held for want of a policy action.
    pub holds_no_chunk: u64,
    /// Age of the action chunk used in the last step, ms.
    pub chunk_age_ms: f64,
    /// A person is driving.
    pub intervening: bool,
    /// Episode counter.
    pub episode: u64,
    /// Transitions the outbox dropped (consumers behind).
    pub outbox_dropped: u64,
    /// Residual weight version in use.
    pub residual_version: u64,
    /// E-stops raised so far (an operator's release names this count).
    #[serde(default)]
    pub estops: u64,
    /// Age of the feature maps a residual that sees read in the last step, ms (0 without one).
    #[serde(default)]
    pub feature_age_ms: f64,
    /// Steps whose feature maps were missing or too old, so the residual gave nothing.
    #[serde(default)]
    pub feature_stale: u64,
}

/// The actor's status. Published on `reflex/<robot>/status` at a low rate (default 5 Hz). On the
/// wire the loop's figures are fields of the message itself (one MessagePack map), not a nested
/// map.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusMsg {
    /// Protocol version.
    pub v: u16,
    /// Robot name.
    pub robot: String,
    /// The control loop's figures.
    #[serde(flatten)]
    pub figures: LoopFigures,
    /// Safety interventions by kind: estop, obs_stale, policy_stale, teleop_stale, non_finite,
    /// position_limit, step_limit, workspace.
    pub safety: Vec<(String, u64)>,
    /// Steps the episode recorder dropped (it fell behind); 0 when not recording.
    #[serde(default)]
    pub recorder_dropped: u64,
    /// Messages rejected so far, per key expression the actor reads (malformed, another protocol
    /// version, or not fitting the robot's spec); keys with none are left out.
    #[serde(default)]
    pub rejected: Vec<(String, u64)>,
    /// The e-stop: `running`, `latched` or `paused` (docs/runtime.md, "Stopping").
    #[serde(default)]
    pub stop: crate::stop::StopState,
    /// Who raised the e-stop (latched), released it (paused) or resumed (running after a stop).
    #[serde(default)]
    pub stop_by: String,
    /// Wall time of the last e-stop, ns since the Unix epoch (0: none yet).
    #[serde(default)]
    pub estop_raised_unix_ns: u64,
    /// The robot's cameras, when it reports them (a real arm's): rate, frames handed on and
    /// replaced unseen, errors, and the age of the frame last used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cameras: Vec<CameraFigures>,
    /// The link to the learner, when the actor learns: steps handed to it and steps it has
    /// taken (their difference is how far the learner is behind).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learner: Option<LearnerLag>,
}

/// How far the learner is behind the actor, in steps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LearnerLag {
    /// Steps the actor handed to the link.
    pub offered: u64,
    /// Steps the learner has taken.
    pub taken: u64,
}

/// One camera's figures in the status.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CameraFigures {
    /// Camera name.
    pub name: String,
    /// Frames captured.
    pub frames: u64,
    /// Frames captured per second since the capture started.
    pub fps: f64,
    /// Frames the robot took into an observation.
    pub used: u64,
    /// Frames replaced by a newer one before the robot took them.
    pub skipped: u64,
    /// Frames that could not be read or decoded.
    pub errors: u64,
    /// Age of the newest frame when last taken, ms.
    pub age_at_use_ms: f64,
}

/// One control step as the actor saw it, for visualisation on other machines. Published on
/// `reflex/<robot>/trace` by the actor at a configured rate (every n-th step, and every step that
/// ends an episode), from the outbox's consumer thread, never from the loop.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepTrace {
    /// Protocol version.
    pub v: u16,
    /// Episode counter.
    pub episode: u64,
    /// Step within the episode.
    pub step: u32,
    /// Loop time of the step, ns.
    pub t_ns: u64,
    /// Observation state the action was chosen from.
    pub state: Vec<f32>,
    /// The base policy's action.
    pub base: Vec<f32>,
    /// The residual added to it.
    pub residual: Vec<f32>,
    /// The action sent to the robot, after safety.
    pub action: Vec<f32>,
    /// `policy`, `teleop` or `hold`.
    pub source: String,
    /// Reward of the step.
    pub reward: f32,
    /// The step ended the episode in a terminal state.
    pub terminated: bool,
    /// The step hit the time limit.
    pub truncated: bool,
    /// The task reported success after the step.
    pub success: bool,
    /// A person's label in this step.
    pub label: Option<bool>,
    /// A person asked for a reset.
    pub reset: bool,
    /// An emergency stop ended the episode after this step.
    #[serde(default)]
    pub estop: bool,
    /// Safety event bits of the step.
    pub safety_flags: u32,
    /// Wake-up lateness, us.
    pub lateness_us: f32,
    /// Age of the chunk used, ms.
    pub chunk_age_ms: f32,
    /// Inference time of the newest chunk, ms.
    pub policy_latency_ms: f32,
}

/// Camera images of one step, for visualisation on other machines. Published on
/// `reflex/<robot>/trace/frames` by the actor at a low rate (a few per second), beside the trace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TraceFrames {
    /// Protocol version.
    pub v: u16,
    /// Episode counter.
    pub episode: u64,
    /// Step within the episode (the images are of the state the step's action was chosen in).
    pub step: u32,
    /// Loop time of the step, ns.
    pub t_ns: u64,
    /// The images, in the robot's camera order.
    pub images: Vec<Image>,
}

/// One control step as the learner receives it (what it needs of an outbox transition).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WireStep {
    /// Episode counter of the robot.
    pub episode: u64,
    /// Step within the episode.
    pub step: u32,
    /// Observation state the action was chosen from.
    pub obs: Vec<f32>,
    /// Observation state after the action.
    pub next_obs: Vec<f32>,
    /// The base policy's action (robot units; zeros while a person drives).
    pub base: Vec<f32>,
    /// The action executed (robot units).
    pub action: Vec<f32>,
    /// A person drove this step (an intervention).
    pub teleop: bool,
    /// Reward of the step.
    pub reward: f32,
    /// The step ended the episode in a terminal state.
    pub terminated: bool,
    /// The step hit the time limit.
    pub truncated: bool,
    /// The task reported success.
    pub success: bool,
    /// A person's label: `Some(true)` success (ends the episode), `Some(false)` failure.
    pub label: Option<bool>,
    /// A person asked for a reset (ends the episode).
    pub reset: bool,
    /// An emergency stop ended the episode after this step (not terminal: the task did not end).
    #[serde(default)]
    pub estop: bool,
    /// Learning from pixels: the frozen encoder's feature maps of `obs` and `next_obs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<StepFeatures>,
}

/// The feature maps of one step, as a frozen image encoder on the actor made them: one map per
/// camera, `[channels, height, width]` each, concatenated in the learner's camera order.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepFeatures {
    /// Identity of the encoder (its file name and a digest of its bytes).
    pub encoder: String,
    /// Shape of each camera's map.
    pub shapes: Vec<[u32; 3]>,
    /// The maps of the observation the action was chosen from.
    pub obs: Vec<f32>,
    /// The maps of the observation after the action.
    pub next_obs: Vec<f32>,
}

impl WireStep {
    /// The step ends its episode.
    pub fn ends_episode(&self) -> bool {
        self.terminated || self.truncated || self.label.is_some() || self.reset || self.estop
    }
}

/// Transitions from an actor to the learner, numbered. Published on
/// `reflex/<robot>/learn/transitions`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TransitionBatch {
    /// Protocol version.
    pub v: u16,
    /// The actor's identity (random per actor process).
    pub actor: u64,
    /// Sequence number of `steps[0]`; the actor numbers every step from 0.
    pub first_seq: u64,
    /// The oldest step the actor still holds (everything before it was persisted by a learner):
    /// where a learner that does not know this actor starts.
    #[serde(default)]
    pub held_from: u64,
    /// Consecutive steps.
    pub steps: Vec<WireStep>,
    /// The actor is stopping: persist what you hold now (it waits for that before it exits).
    #[serde(default)]
    pub flush: bool,
    /// Steps the actor has numbered so far (sent or not): how far a learner is behind it.
    #[serde(default)]
    pub offered: u64,
}

/// What the learner holds. Published on `reflex/<robot>/learn/state` after every batch and twice
/// a second.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LearnerState {
    /// Protocol version.
    pub v: u16,
    /// The learner process (random per start): a new value means "resend what I lack".
    pub instance: u64,
    /// The actor these numbers are about (0: the learner knows no actor yet; an actor then
    /// resends all it holds).
    pub actor: u64,
    /// Next sequence number the learner accepts (everything before it was received).
    pub received: u64,
    /// Everything before this sequence number is in the learner's last checkpoint: the actor may
    /// forget it.
    pub persisted: u64,
    /// Newest residual weights published.
    pub weights_version: u64,
    /// Batches refused because one before them was missing (the actor resends when it rises).
    #[serde(default)]
    pub gaps: u64,
    /// Batches waiting in the learner's queue: while it is busy, silence is not loss.
    #[serde(default)]
    pub queued: u64,
    /// Why the learner refuses this actor's steps (a robot of another spec than the fleet's);
    /// empty when it takes them.
    #[serde(default)]
    pub refused: String,
}

/// A piece of a residual weight vector. Published on `reflex/<robot>/learn/weights`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WeightsChunk {
    /// Protocol version.
    pub v: u16,
    /// Weight version (increasing).
    pub version: u64,
    /// Offset of `values` in the whole vector.
    pub offset: u32,
    /// Length of the whole vector.
    pub total: u32,
    /// The network's architecture (a hash of its layer sizes and options): an actor takes only
    /// weights of the architecture its hook evaluates. 0 from older learners: not checked.
    #[serde(default)]
    pub arch: u64,
    /// The values.
    pub values: Vec<f32>,
}

/// Why a message could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The bytes are not the expected MessagePack structure.
    #[error("message on `{key}` is not a valid {what}: {source}")]
    Format {
        /// Key expression the message came from.
        key: String,
        /// Expected message type.
        what: &'static str,
        /// Decoder error.
        source: rmp_serde::decode::Error,
    },
    /// The peer speaks another protocol version.
    #[error(
        "message on `{key}` has protocol version {got}, this reflex speaks version {want}; \
         upgrade the older side"
    )]
    Version {
        /// Key expression the message came from.
        key: String,
        /// Version found.
        got: u16,
        /// Version expected.
        want: u16,
    },
}

/// Messages that carry a protocol version.
pub trait Versioned {
    /// The `v` field.
    fn version(&self) -> u16;
    /// Name used in errors.
    const WHAT: &'static str;
}

macro_rules! versioned {
    ($($t:ty => $what:literal),* $(,)?) => {$(
        impl Versioned for $t {
            fn version(&self) -> u16 { self.v }
            const WHAT: &'static str = $what;
        }
    )*};
}
versioned!(
    RobotSpec => "RobotSpec",
    Observation => "Observation",
    Command => "Command",
    ResetRequest => "ResetRequest",
    EpisodeEvent => "EpisodeEvent",
    OperatorMsg => "OperatorMsg",
    StopStatus => "StopStatus",
    TeleopMsg => "TeleopMsg",
    StatusMsg => "StatusMsg",
    StepTrace => "StepTrace",
    TraceFrames => "TraceFrames",
    TransitionBatch => "TransitionBatch",
    LearnerState => "LearnerState",
    WeightsChunk => "WeightsChunk",
);

/// Encodes a message as MessagePack with named fields.
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    // Encoding a plain struct into a Vec cannot fail (no I/O, every field type is supported).
    rmp_serde::to_vec_named(msg).expect("MessagePack encoding of a reflex message")
}

/// Encodes into a reused buffer (cleared first), so a steady-state publisher does not allocate.
pub fn encode_into<T: Serialize>(msg: &T, buf: &mut Vec<u8>) {
    buf.clear();
    let mut ser = rmp_serde::Serializer::new(&mut *buf).with_struct_map();
    msg.serialize(&mut ser)
        .expect("MessagePack encoding of a reflex message");
}

/// Decodes a message and checks its protocol version; `key` names the source in errors.
pub fn decode<T: DeserializeOwned + Versioned>(key: &str, bytes: &[u8]) -> Result<T, DecodeError> {
    let msg: T = rmp_serde::from_slice(bytes).map_err(|source| DecodeError::Format {
        key: key.to_string(),
        what: T::WHAT,
        source,
    })?;
    if msg.version() != PROTOCOL_VERSION {
        return Err(DecodeError::Version {
            key: key.to_string(),
            got: msg.version(),
            want: PROTOCOL_VERSION,
        });
    }
    Ok(msg)
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_stop_state_travels_as_its_name_and_an_unknown_one_does_not_decode() {
        use super::{PROTOCOL_VERSION, StopStatus, decode, encode};
        use crate::stop::StopState;
        let m = StopStatus {
            v: PROTOCOL_VERSION,
            robot: "arm".into(),
            holder: "robot".into(),
            stop: StopState::Latched,
            ..Default::default()
        };
        let bytes = encode(&m);
        // The same bytes as when the field was a string: a peer reading a string still does.
        #[derive(serde::Deserialize)]
        struct AsString {
            stop: String,
        }
        let read: AsString = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(read.stop, "latched");
        assert_eq!(
            decode::<StopStatus>("k", &bytes).unwrap().stop,
            StopState::Latched
        );
        // Another process's status with a state reflex does not know is refused, not read as one.
        #[derive(serde::Serialize)]
        struct Forged<'a> {
            v: u16,
            robot: &'a str,
            holder: &'a str,
            stop: &'a str,
            estops: u64,
            stop_by: &'a str,
            estop_raised_unix_ns: u64,
        }
        let forged = rmp_serde::to_vec_named(&Forged {
            v: PROTOCOL_VERSION,
            robot: "arm",
            holder: "robot",
            stop: "stopped-ish",
            estops: 0,
            stop_by: "",
            estop_raised_unix_ns: 0,
        })
        .unwrap();
        assert!(decode::<StopStatus>("k", &forged).is_err());
        let honest = rmp_serde::to_vec_named(&Forged {
            stop: "paused",
            ..Forged {
                v: PROTOCOL_VERSION,
                robot: "arm",
                holder: "robot",
                stop: "",
                estops: 0,
                stop_by: "",
                estop_raised_unix_ns: 0,
            }
        })
        .unwrap();
        assert_eq!(
            decode::<StopStatus>("k", &honest).unwrap().stop,
            StopState::Paused
        );
    }
    #[test]
    fn an_image_copy_skips_the_pixels_of_a_frame_it_already_holds() {
        let frame = |seq, v| Image {
            camera: "front".into(),
            width: 2,
            height: 1,
            encoding: "rgb8".into(),
            data: vec![v; 6],
            seq,
            age_ns: 0,
        };
        let mut dst = frame(0, 0);
        dst.copy_from(&frame(5, 9));
        assert_eq!((dst.seq, dst.data[0]), (5, 9));
        // The same frame again (a counter says so): nothing to copy; a liar is not believed
        // across cameras or sizes, and a counter of 0 always copies.
        let mut liar = frame(5, 1);
        dst.copy_from(&liar);
        assert_eq!(
            dst.data[0], 9,
            "same camera, same counter: same pixels, not copied"
        );
        liar.camera = "wrist".into();
        dst.copy_from(&liar);
        assert_eq!(dst.data[0], 1);
        dst.copy_from(&frame(0, 4));
        dst.copy_from(&frame(0, 3));
        assert_eq!(dst.data[0], 3);
    }

    use super::*;

    #[test]
    fn observation_round_trips_with_images() {
        let obs = Observation {
            v: PROTOCOL_VERSION,
            seq: 7,
            episode: 2,
            step: 3,
            time_ns: 150_000_000,
            state: vec![0.5, -1.25, 3.0],
            reward: 1.0,
            terminated: true,
            truncated: false,
            success: true,
            images: vec![Image {
                camera: "front".into(),
                width: 2,
                height: 1,
                encoding: "rgb8".into(),
                seq: 0,
                age_ns: 0,
                data: vec![1, 2, 3, 4, 5, 6],
            }],
            success_score: Some(0.75),
        };
        let bytes = encode(&obs);
        let back: Observation = decode("reflex/r/obs", &bytes).unwrap();
        assert_eq!(back, obs);
        let mut buf = Vec::new();
        encode_into(&obs, &mut buf);
        assert_eq!(buf, bytes);
    }

    #[test]
    fn wrong_version_names_the_key() {
        let cmd = Command {
            v: 99,
            seq: 1,
            action: vec![0.0],
        };
        let err = decode::<Command>("reflex/arm/cmd", &encode(&cmd)).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("reflex/arm/cmd") && text.contains("99"),
            "{text}"
        );
    }

    #[test]
    fn garbage_names_the_key_and_type() {
        let err = decode::<Observation>("reflex/arm/obs", b"\x01\x02").unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("reflex/arm/obs") && text.contains("Observation"),
            "{text}"
        );
    }

    #[test]
    fn copy_from_reuses_buffers() {
        let mut a = Observation {
            state: vec![0.0; 4],
            ..Default::default()
        };
        let b = Observation {
            state: vec![1.0, 2.0, 3.0, 4.0],
            step: 9,
            ..Default::default()
        };
        let ptr = a.state.as_ptr();
        a.copy_from(&b);
        assert_eq!(a, b);
        assert_eq!(ptr, a.state.as_ptr());
    }

    #[test]
    fn spec_field_offsets() {
        let spec = RobotSpec {
            v: PROTOCOL_VERSION,
            name: "r".into(),
            kind: "sim/reach".into(),
            control_hz: 20.0,
            lockstep: true,
            state: vec![StateField::new("a", 2, ""), StateField::new("b", 3, "")],
            action: ActionSpec {
                kind: ActionKind::Box,
                names: vec![],
                low: vec![],
                high: vec![],
            },
            cameras: vec![],
            joints: vec![],
            max_episode_steps: 0,
            scene: None,
        };
        assert_eq!(spec.state_dim(), 5);
        assert_eq!(spec.field("b"), Some(2..5));
        assert_eq!(spec.field("c"), None);
    }
}
