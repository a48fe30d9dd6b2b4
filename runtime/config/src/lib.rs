//! The run config: one TOML file describes the actor (`reflex run`) and its learner
//! (`reflex learn`): `[robot]`, `[sim]`, `[policy]`, `[loop]`, `[safety]`, `[bus]`, `[run]`,
//! `[learner]`. docs/runtime.md and docs/learner.md list every key.
//!
//! reflex-config: the file parsed and checked key by key (an error names the file, the key and
//! what is allowed); reflex-agent builds the actor and the learner from it.

use reflex_bus::BusConfig;
use reflex_contracts::config::{ConfigError, Invalid, Validate, in_range};
use reflex_learn::sac::{Mode, SacConfig};
use reflex_runtime::control::LoopConfig;
use reflex_runtime::safety::SafetyConfig;
use reflex_tabletop::sim_config::SimConfig;
use serde::Deserialize;
use std::path::PathBuf;

pub use reflex_hardware::robot::{ArmSection, ArmTask, OnExit};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
/// Where the robot is.
pub enum RobotSource {
    /// The simulator in this process (`[sim]`).
    Sim,
    /// A robot on the bus, served by another process.
    Remote,
    /// An SO-100/SO-101 follower on a Feetech bus in this process (`[arm]`).
    So101,
    /// A Koch follower on a Dynamixel bus in this process (`[arm]`).
    Koch,
}

fn d_timeout() -> f64 {
    2000.0
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
/// `[robot]`: which robot the actor drives.
pub struct RobotSection {
    /// `sim` (the simulator in this process) or `remote` (a robot on the bus).
    pub source: RobotSource,
    /// Robot name on the bus (default: `[sim] robot`, or required for remote).
    #[serde(default)]
    pub name: Option<String>,
    /// Deadline of every exchange with a remote robot, ms.
    #[serde(default = "d_timeout")]
    pub timeout_ms: f64,
    /// URDF of the arm for the safety layer's workspace check on joint actions (default: the
    /// simulator's arm for `source = "sim"`).
    #[serde(default)]
    pub urdf: Option<PathBuf>,
    /// What a real arm does when the run ends, fails or is stopped by a signal: `hold` (the
    /// servos keep their last goal with the torque on) or `release` (torque off: the joints go
    /// limp and fall under gravity). Ignored by simulators and remote robots (their server
    /// decides).
    #[serde(default)]
    pub on_exit: OnExit,
    /// Lockstep remote robots: how long to wait for the observation that answers a command
    /// before sending the command again, ms (default: a quarter of `timeout_ms`, at most 1000).
    #[serde(default)]
    pub resend_ms: Option<f64>,
    /// `[robot.cameras]`: the robot's cameras under the names the policy, the image encoder and
    /// the success classifier read (robot camera name = "name they read"), e.g.
    /// `"pixels.front" = "front"`. Checked against the robot at start.
    #[serde(default)]
    pub cameras: std::collections::BTreeMap<String, String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
/// The base policy's kind.
pub enum PolicyKind {
    /// The simulator's scripted expert (sim tasks only).
    Expert,
    /// An ONNX model with its spec (`model`).
    Onnx,
    /// No base policy: the robot holds unless a person drives.
    None,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
/// `[policy]`: the base policy.
pub struct PolicySection {
    /// `expert`, `onnx` or `none`.
    pub kind: PolicyKind,
    /// Expert action noise.
    pub noise: f64,
    /// Seed of the expert's noise.
    pub seed: u64,
    /// Chunk length the expert returns (its action repeated).
    pub chunk_len: usize,
    /// The .onnx file (kind = "onnx"); its spec is NAME.policy.toml beside it. Relative paths are
    /// relative to the config file.
    pub model: Option<PathBuf>,
    /// Execution provider (kind = "onnx").
    pub provider: reflex_policies::onnx_policy::Provider,
    /// ONNX Runtime intra-op threads.
    pub intra_threads: usize,
    /// Actions executed per chunk, in place of the model spec's `execute` (docs/policy-spec.md).
    pub execute: Option<usize>,
    /// `[policy.residual]`: a refined policy kept from training, run on the base with no
    /// learner (docs/training.md).
    pub residual: Option<ResidualSection>,
    /// `[policy.rtc]`: real-time chunking for a diffusion or flow model on its own thread
    /// (docs/runtime.md, "Chunk execution"). Off by default.
    pub rtc: reflex_policies::rtc::RtcConfig,
}

/// `[policy.residual]`: a residual file written by a learner (`residual.onnx` and its spec).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResidualSection {
    /// The .onnx file; its spec (`kind = "residual"`) is NAME.policy.toml beside it. Relative
    /// paths are relative to the config file.
    pub model: PathBuf,
    /// The frozen image encoder of a residual that sees (one trained with `[learner.vision]`);
    /// default: the file its spec names, beside the residual or the base model.
    #[serde(default)]
    pub encoder: Option<PathBuf>,
}

impl Default for PolicySection {
    fn default() -> Self {
        PolicySection {
            kind: PolicyKind::Expert,
            noise: 0.0,
            seed: 0,
            chunk_len: 2,
            model: None,
            provider: Default::default(),
            intra_threads: 1,
            execute: None,
            residual: None,
            rtc: Default::default(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
/// Which time the loop runs on.
pub enum ClockKind {
    /// Simulated time: the loop runs as fast as the robot steps; reproducible.
    Sim,
    /// Wall time: the loop runs at its rate in real time.
    Wall,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
/// `[run]`: how many episodes, seeds, which clock.
pub struct RunSection {
    /// Episodes to run.
    pub episodes: u64,
    /// Seed of the episode seeds.
    pub seed: u64,
    /// `sim` (lockstep, reproducible) or `wall`.
    pub clock: ClockKind,
    /// After the episodes above, this many more with the learner's deterministic action (no
    /// exploration noise), reported apart as the evaluation (`eval` in `--json`).
    pub eval_episodes: u64,
    /// With `--record DIR`: keep DIR within this many GB, deleting the oldest recordings of
    /// earlier runs first (the run being recorded is never touched).
    pub keep_recordings_gb: Option<f64>,
    /// With `--record DIR`: delete recordings of earlier runs older than this many days.
    pub keep_recordings_days: Option<f64>,
}

impl RunSection {
    /// The limits on the records directory, if any.
    pub fn record_limits(&self) -> reflex_data::rotate::Limits {
        reflex_data::rotate::Limits {
            max_bytes: self.keep_recordings_gb.map(|g| (g * 1e9) as u64),
            max_age: self
                .keep_recordings_days
                .map(|d| std::time::Duration::from_secs_f64(d * 86400.0)),
        }
    }
}

impl Default for RunSection {
    fn default() -> Self {
        RunSection {
            episodes: 10,
            seed: 0,
            clock: ClockKind::Sim,
            eval_episodes: 0,
            keep_recordings_gb: None,
            keep_recordings_days: None,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
/// `[bus]`: how the actor joins the Zenoh network.
pub struct BusSection {
    /// Use the bus at all (status, teleop, estop; required for remote robots).
    pub enabled: bool,
    /// Endpoints to listen on.
    pub listen: Vec<String>,
    /// Endpoints to connect to.
    pub connect: Vec<String>,
    /// Turn multicast scouting off.
    pub no_multicast: bool,
    /// Rate of the step trace published for `reflex viz`, Hz (0 turns it off).
    pub trace_hz: f64,
    /// TLS with mutual authentication: the directory `reflex keys init` wrote (relative to
    /// this file) and this peer's name in it.
    pub tls: Option<TlsSection>,
    /// Who may do what on this robot's key space (certificate common names); needs `tls`.
    pub access: Option<AccessSection>,
    /// Allow a real arm on a bus without TLS (anyone on the network could take over, reset or
    /// release it): `reflex run` refuses such a config unless this is set, and then warns every
    /// minute.
    pub insecure: bool,
}

/// `[bus.tls]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    /// The keys directory (`ca.pem`, `<name>.pem`, `<name>.key`).
    pub dir: PathBuf,
    /// This peer's name (its certificate's common name).
    pub name: String,
}

/// `[bus.access]`: certificate common names by role.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessSection {
    /// May publish weights and learner state.
    #[serde(default)]
    pub learners: Vec<String>,
    /// May command and take over.
    #[serde(default)]
    pub teleops: Vec<String>,
    /// May watch and raise an e-stop.
    #[serde(default)]
    pub viewers: Vec<String>,
}

impl Default for BusSection {
    fn default() -> Self {
        BusSection {
            enabled: false,
            listen: Vec::new(),
            connect: Vec::new(),
            no_multicast: false,
            trace_hz: 10.0,
            tls: None,
            access: None,
            insecure: false,
        }
    }
}

/// `[serve]`: how `reflex hw serve` offers the config's arm on the bus.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeSection {
    /// Check every command against the spec's ranges and `[safety]`'s per-step limits
    /// (`max_joint_step_rad`, `max_ee_step_m`, `max_gripper_step_m`) before the arm executes it;
    /// refused commands are counted and the arm holds (default: on).
    #[serde(default)]
    pub filter: Option<bool>,
    /// Hold the arm once no command came for this long, ms (default: five periods).
    #[serde(default)]
    pub watchdog_ms: Option<f64>,
}

/// The whole actor config file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// `[robot]`.
    pub robot: RobotSection,
    #[serde(default)]
    /// `[sim]` (with `robot.source = "sim"`).
    pub sim: Option<SimConfig>,
    #[serde(default)]
    /// `[arm]` (with `robot.source = "so101"` or `"koch"`).
    pub arm: Option<ArmSection>,
    #[serde(default)]
    /// `[policy]`.
    pub policy: PolicySection,
    #[serde(rename = "loop", default)]
    /// `[loop]` (default: the robot's rate).
    pub loop_: Option<LoopConfig>,
    #[serde(default)]
    /// `[safety]`.
    pub safety: SafetyConfig,
    #[serde(default)]
    /// `[bus]`.
    pub bus: BusSection,
    #[serde(default)]
    /// `[run]`.
    pub run: RunSection,
    /// The residual learner on the bus (`reflex learn` with the same file); absent: no learning.
    #[serde(default)]
    pub learner: Option<LearnerSection>,
    /// `[serve]`: the arm served on the bus by `reflex hw serve`.
    #[serde(default)]
    pub serve: ServeSection,
    /// `[reward]`: a success classifier on the cameras gives the run's reward.
    #[serde(default)]
    pub reward: Option<RewardSection>,
    /// `[ros2]`: the robot as a ROS 2 node over rmw_zenoh, on the run's bus.
    #[serde(default)]
    pub ros2: Option<Ros2Section>,
}

/// `[ros2]` (docs/ros2.md); keys left out take [`reflex_ros2::Ros2Config::for_robot`]'s
/// values, the domain `ROS_DOMAIN_ID` when it is set.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ros2Section {
    /// Appear in ROS 2 at all.
    #[serde(default)]
    pub enabled: bool,
    /// `ROS_DOMAIN_ID`.
    #[serde(default)]
    pub domain: Option<u32>,
    /// The node's namespace (default `/<robot>`).
    #[serde(default)]
    pub namespace: Option<String>,
    /// The node's name (default `reflex`).
    #[serde(default)]
    pub node: Option<String>,
    /// Joint states and TF at most this often, Hz.
    #[serde(default)]
    pub state_hz: Option<f64>,
    /// Camera images at most this often, Hz.
    #[serde(default)]
    pub image_hz: Option<f64>,
    /// A silent twist stream hands the robot back after this long, s.
    #[serde(default)]
    pub twist_timeout_s: Option<f64>,
    /// Put before every TF frame name.
    #[serde(default)]
    pub frame_prefix: Option<String>,
}

impl Ros2Section {
    /// The file's settings over the defaults for robot `robot`, domain 0 unless given.
    fn settings(&self, robot: &str) -> reflex_ros2::Ros2Config {
        let mut c = reflex_ros2::Ros2Config::for_robot(robot);
        c.domain = self.domain.unwrap_or(0);
        macro_rules! take {
            ($($k:ident),*) => { $(if let Some(v) = &self.$k { c.$k = v.clone(); })* };
        }
        take!(
            namespace,
            node,
            state_hz,
            image_hz,
            twist_timeout_s,
            frame_prefix
        );
        c
    }

    /// The node's settings for robot `robot` (the section is validated with the file), the
    /// domain `ROS_DOMAIN_ID` when the file gives none; the error is a bad `ROS_DOMAIN_ID`.
    pub fn config(&self, robot: &str) -> Result<reflex_ros2::Ros2Config, String> {
        let mut c = self.settings(robot);
        if self.domain.is_none()
            && let Ok(v) = std::env::var("ROS_DOMAIN_ID")
        {
            c.domain = v.trim().parse().map_err(|_| {
                format!(
                    "[ros2] domain: the environment's ROS_DOMAIN_ID `{v}` is not a number; set it right or give `domain` in the file"
                )
            })?;
        }
        Ok(c)
    }
}

/// `[reward]`: a reward the robot can see (docs/training.md, "Learning from pixels").
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardSection {
    /// The classifier `reflex reward train` wrote (its spec `<name>.reward.toml` beside it).
    pub classifier: PathBuf,
    /// Probability at or above which a frame shows success (default: the spec's).
    #[serde(default)]
    pub threshold: Option<f32>,
    /// Frames in a row at or above the threshold before the episode ends as a success.
    #[serde(default = "d_one_frame")]
    pub consecutive_frames: u32,
    /// In real time the classifier runs on its own thread; verdicts more than this many frames
    /// behind the newest frame are not used.
    #[serde(default = "d_map_age")]
    pub max_age_frames: u32,
}

fn d_one_frame() -> u32 {
    1
}

impl RunConfig {
    /// The robot's name on the bus.
    pub fn robot_name(&self) -> String {
        match (&self.robot.name, &self.sim) {
            (Some(n), _) => n.clone(),
            (None, Some(s)) if self.robot.source == RobotSource::Sim => s.robot.clone(),
            (None, _) => match self.robot.source {
                RobotSource::So101 => "so101".into(),
                RobotSource::Koch => "koch".into(),
                _ => "sim".into(),
            },
        }
    }

    /// The bus settings of the file with `extra` (from a command line) added: its endpoints
    /// join the file's, its Zenoh config file is used, and scouting is off if either says so.
    pub fn bus_config(&self, extra: &BusConfig) -> BusConfig {
        let mut bus = BusConfig {
            listen: self.bus.listen.clone(),
            connect: self.bus.connect.clone(),
            multicast_scouting: !self.bus.no_multicast && extra.multicast_scouting,
            config_file: extra.config_file.clone(),
            tls: extra.tls.clone().or_else(|| {
                self.bus
                    .tls
                    .as_ref()
                    .map(|t| reflex_bus::secure::TlsFiles::in_dir(&t.dir, &t.name))
            }),
            access: self.bus.access.as_ref().map(|a| {
                (
                    self.robot_name(),
                    reflex_bus::secure::Access {
                        learners: a.learners.clone(),
                        teleops: a.teleops.clone(),
                        viewers: a.viewers.clone(),
                        ros2: self
                            .ros2
                            .as_ref()
                            .filter(|r| r.enabled)
                            .and_then(|r| r.config(&self.robot_name()).ok())
                            .map(|c| (c.domain, c.key_prefix())),
                    },
                )
            }),
            mode: Default::default(),
        };
        bus.listen.extend(extra.listen.iter().cloned());
        bus.connect.extend(extra.connect.iter().cloned());
        bus.mode = extra.mode;
        bus
    }

    /// The run's seed.
    pub fn seed(&self) -> u64 {
        self.run.seed
    }

    /// Reads and validates a run config; paths in it (the model, a URDF) are relative to the
    /// file.
    pub fn load(path: &std::path::Path) -> Result<Self, ConfigError> {
        let mut c: RunConfig = reflex_contracts::config::load(path)?;
        let dir = path.parent().unwrap_or(std::path::Path::new(""));
        let resolve = |p: &mut PathBuf| {
            if p.is_relative() && !p.exists() {
                *p = dir.join(&*p);
            }
        };
        if let Some(m) = &mut c.policy.model {
            resolve(m);
        }
        if let Some(u) = &mut c.robot.urdf {
            resolve(u);
        }
        if let Some(r) = &mut c.policy.residual {
            resolve(&mut r.model);
            if let Some(e) = &mut r.encoder {
                resolve(e);
            }
        }
        if let Some(a) = &mut c.arm {
            if let Some(cal) = &mut a.calibration {
                resolve(cal);
            }
            for cam in &mut a.cameras {
                if let Some(p) = &mut cam.intrinsics {
                    resolve(p);
                }
                if let Some(p) = &mut cam.hand_eye {
                    resolve(p);
                }
            }
        }
        if let Some(t) = &mut c.bus.tls {
            resolve(&mut t.dir);
        }
        if let Some(v) = c.learner.as_mut().and_then(|l| l.vision.as_mut()) {
            resolve(&mut v.encoder);
        }
        if let Some(r) = &mut c.reward {
            resolve(&mut r.classifier);
        }
        Ok(c)
    }

    /// A real arm in this process (`source = "so101"` or `"koch"`).
    pub fn is_arm(&self) -> bool {
        matches!(self.robot.source, RobotSource::So101 | RobotSource::Koch)
    }

    /// Why this config may not drive its arm over this bus, if it may not: a real arm on a bus
    /// without TLS lets anyone on the network take over, reset, release or resume it, so that
    /// needs `[bus] insecure = true`. `extra` is the command line's bus settings.
    pub fn insecure_arm_bus(&self, extra: &BusConfig) -> Option<String> {
        let bus = self.bus_config(extra);
        (self.is_arm() && self.uses_bus(extra) && bus.tls.is_none()).then(|| {
            format!(
                "robot `{}` is a real arm and its bus has no TLS: anyone on the network could take it over, reset it, or release its e-stop. Give [bus] a [bus.tls] table (`reflex keys init`, docs/deploy.md), or set [bus] insecure = true on a network you trust",
                self.robot_name()
            )
        })
    }

    /// Whether the actor needs the bus: a remote robot, endpoints, a Zenoh file or TLS on the
    /// command line (given and then ignored, they were silent), or the file says so.
    pub fn uses_bus(&self, extra: &BusConfig) -> bool {
        self.bus.enabled
            || self.ros2.as_ref().is_some_and(|r| r.enabled)
            || self.robot.source == RobotSource::Remote
            || !extra.listen.is_empty()
            || !extra.connect.is_empty()
            || extra.config_file.is_some()
            || extra.tls.is_some()
    }

    /// The learner's mode: residual on a base policy, or SAC from scratch without one.
    pub fn learner_mode(&self) -> reflex_learn::sac::Mode {
        match self.policy.kind {
            PolicyKind::None => reflex_learn::sac::Mode::Full,
            _ => reflex_learn::sac::Mode::Residual,
        }
    }
}

impl Validate for RunConfig {
    fn validate(&self, _: &str) -> Result<(), Invalid> {
        self.check_robot_source()?;
        self.check_tables()?;
        self.check_policy()
    }
}

impl RunConfig {
    /// The table the robot's source needs is there.
    fn check_robot_source(&self) -> Result<(), Invalid> {
        if let Some(r) = self.ros2.as_ref().filter(|r| r.enabled) {
            // With the robot's own name: the default namespace must be a ROS 2 name too.
            r.settings(&self.robot_name()).validate("ros2")?;
        }
        if self.robot.source == RobotSource::Sim && self.sim.is_none() {
            return Err(Invalid {
                key: "sim".into(),
                value: "(missing)".into(),
                allowed: "a [sim] table when robot.source = \"sim\"".into(),
            });
        }
        if self.robot.source == RobotSource::Remote && self.robot.name.is_none() {
            return Err(Invalid {
                key: "robot.name".into(),
                value: "(missing)".into(),
                allowed: "the robot's name on the bus".into(),
            });
        }
        if matches!(self.robot.source, RobotSource::So101 | RobotSource::Koch) && self.arm.is_none()
        {
            return Err(Invalid {
                key: "arm".into(),
                value: "(missing)".into(),
                allowed: "an [arm] table with the port (and calibration) when robot.source is so101 or koch".into(),
            });
        }
        Ok(())
    }

    /// Every table's own ranges, and the robot link's.
    fn check_tables(&self) -> Result<(), Invalid> {
        if let Some(s) = &self.sim {
            s.validate("sim")?;
        }
        if let Some(a) = &self.arm {
            a.validate("arm")?;
        }
        if let Some(l) = &self.loop_ {
            l.validate("loop")?;
        }
        if let Some(r) = &self.reward {
            if let Some(t) = r.threshold {
                in_range("reward", "threshold", t, 0.0, 1.0)?;
            }
            in_range(
                "reward",
                "consecutive_frames",
                r.consecutive_frames,
                1,
                10_000,
            )?;
            in_range("reward", "max_age_frames", r.max_age_frames, 0, 1000)?;
        }
        if let Some(w) = self.serve.watchdog_ms {
            in_range("serve", "watchdog_ms", w, 1.0, 60_000.0)?;
        }
        self.safety.validate("safety")?;
        in_range("robot", "timeout_ms", self.robot.timeout_ms, 1.0, 600_000.0)?;
        if let Some(r) = self.robot.resend_ms {
            in_range("robot", "resend_ms", r, 1.0, self.robot.timeout_ms)?;
        }
        for (from, to) in &self.robot.cameras {
            if from.is_empty() || to.trim().is_empty() {
                return Err(Invalid {
                    key: format!("robot.cameras.{from:?}"),
                    value: format!("{to:?}"),
                    allowed:
                        "a robot camera's name = the non-empty name the policy or encoder reads"
                            .into(),
                });
            }
        }
        in_range("bus", "trace_hz", self.bus.trace_hz, 0.0, 1000.0)?;
        if let Some(g) = self.run.keep_recordings_gb {
            in_range("run", "keep_recordings_gb", g, 1e-6, 1e6)?;
        }
        if let Some(d) = self.run.keep_recordings_days {
            in_range("run", "keep_recordings_days", d, 1e-6, 1e5)?;
        }
        Ok(())
    }

    /// The policy, its kept residual and the learner fit together.
    fn check_policy(&self) -> Result<(), Invalid> {
        if self.policy.residual.is_some() && self.learner.is_some() {
            return Err(Invalid {
                key: "policy.residual".into(),
                value: "(present with a [learner] table)".into(),
                allowed: "a kept residual runs without a learner: remove [learner] to run it, or remove [policy.residual] to train (a learner resumes from its checkpoint, not from the residual file)".into(),
            });
        }
        if self.policy.residual.is_some()
            && !matches!(self.policy.kind, PolicyKind::Onnx | PolicyKind::None)
        {
            return Err(Invalid {
                key: "policy.residual".into(),
                value: format!("(present with policy.kind = {:?})", self.policy.kind),
                allowed: "policy.kind = \"onnx\" (the base the residual was trained on) or \"none\" (a policy learned from scratch)".into(),
            });
        }
        if let Some(l) = &self.learner {
            l.validate(self.learner_mode())?;
            if self.policy.kind == PolicyKind::Expert {
                return Err(Invalid {
                    key: "learner".into(),
                    value: "(present)".into(),
                    allowed: "a [learner] table with [policy] kind = \"onnx\" (a residual on the base policy) or kind = \"none\" (SAC from scratch)".into(),
                });
            }
        }
        in_range("policy", "noise", self.policy.noise, 0.0, 10.0)?;
        in_range("policy", "chunk_len", self.policy.chunk_len, 1, 64)?;
        in_range("run", "episodes", self.run.episodes, 1, 10_000_000)?;
        in_range(
            "run",
            "eval_episodes",
            self.run.eval_episodes,
            0,
            10_000_000,
        )?;
        in_range("policy", "intra_threads", self.policy.intra_threads, 1, 256)?;
        if self.policy.kind == PolicyKind::Onnx && self.policy.model.is_none() {
            return Err(Invalid {
                key: "policy.model".into(),
                value: "(missing)".into(),
                allowed: "the .onnx file when policy.kind = \"onnx\"".into(),
            });
        }
        Ok(())
    }
}

/// `[learner]` of a run config: shared by the actor (`reflex run`) and the learner.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LearnerSection {
    /// Checkpoint file of the learner (resumed from when it exists).
    pub checkpoint: PathBuf,
    /// Seconds between checkpoints (the actor keeps what is not in one yet).
    pub checkpoint_every_s: f64,
    /// Publish new weights every this many episodes.
    pub publish_every_episodes: u64,
    /// RLIF: reward -1 on the step before each takeover.
    pub rlif: bool,
    /// SAC hyperparameters (docs/learner.md); keys not given keep the demo's values.
    pub sac: Option<toml::Table>,
    /// The actor's side of the link.
    pub link: reflex_bus::learnlink::LinkConfig,
    /// Run the learner inside `reflex run` (a thread on the same bus session) rather than as a
    /// separate `reflex learn` process.
    pub in_process: bool,
    /// With `[run] clock = "sim"`: before each episode, let the learner take every step so far
    /// (the actor runs ahead of it otherwise). Never inside an episode.
    pub pace_lockstep: bool,
    /// Where the learner's state scaling comes from (docs/learner.md).
    pub obs_norm: ObsNormSource,
    /// What to do when the checkpoint cannot be read (corrupt, truncated, another format).
    pub on_bad_checkpoint: BadCheckpoint,
    /// The settings `[learner.sac]` is laid over: `demo` (measured with a person correcting
    /// the robot, docs/training.md) or `sac` (SAC's own defaults, RLPD-like).
    pub preset: Preset,
    /// When more than about this many received steps wait to be taken, the learner stores
    /// them without training on them (counted as `updates_shed`): a learner slower than the
    /// robot keeps every step and a bounded queue, and trains at the rate it can.
    pub shed_updates_above: usize,
    /// Threads for the learner's matrix products; 0 (the default) takes one fewer than the
    /// machine's cores, at least one, so that a control loop on the same computer keeps a core.
    /// On a workstation running only `reflex learn`, give it every core.
    pub threads: usize,
    /// A learner that sees: the frozen image encoder whose feature maps go with every step,
    /// and the image heads the learner trains on them (docs/learner.md, "Learning from pixels").
    pub vision: Option<VisionSection>,
    /// The robots a `reflex learn` serves at once (fleet learning: every robot's steps feed one
    /// replay, every robot gets the same weights); `["*"]` takes every robot on the bus. Empty
    /// (the default): the config's own robot. `reflex learn --robot` overrides it.
    pub fleet: Vec<String>,
}

/// `[learner.vision]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VisionSection {
    /// The frozen encoder (`reflex bc train --camera ...` writes `<model>.encoder.onnx`), its
    /// spec `M.encoder.toml` beside `M.encoder.onnx`. The actor runs it once per frame; the learner checks
    /// every step's maps were made by this very file.
    pub encoder: PathBuf,
    /// Learned spatial embeddings per map channel (SERL: 8).
    #[serde(default = "d_embeddings")]
    pub embeddings: usize,
    /// Width of each camera's head (SERL: 256).
    #[serde(default = "d_head_width")]
    pub width: usize,
    /// In real time the encoder runs on its own thread and the residual reads the newest maps;
    /// maps more than this many frames behind the newest frame are stale and the residual gives
    /// nothing until fresh ones arrive (counted as `feature_stale` in the status).
    #[serde(default = "d_map_age")]
    pub max_map_age_frames: u32,
    /// The actor's behaviour-cloning term on the person's corrections also trains the heads
    /// (default; `false`: SERL's heads, trained by the critic alone). docs/learner.md.
    #[serde(default = "d_bc_trains_heads")]
    pub bc_trains_heads: bool,
    /// DrQ's random shift of the maps in each sampled batch, places (0: none). docs/learner.md.
    #[serde(default)]
    pub shift: usize,
}

fn d_bc_trains_heads() -> bool {
    true
}

fn d_embeddings() -> usize {
    8
}
fn d_head_width() -> usize {
    256
}
fn d_map_age() -> u32 {
    2
}

impl Validate for VisionSection {
    fn validate(&self, prefix: &str) -> Result<(), Invalid> {
        in_range(prefix, "embeddings", self.embeddings, 1, 64)?;
        in_range(prefix, "width", self.width, 1, 4096)?;
        in_range(prefix, "shift", self.shift, 0, 8)?;
        let age = self.max_map_age_frames;
        in_range(prefix, "max_map_age_frames", age, 0, 1000)
    }
}

impl VisionSection {
    /// `encoder` with every other key at its default (SERL's heads).
    pub fn with_encoder(encoder: PathBuf) -> Self {
        VisionSection {
            encoder,
            embeddings: d_embeddings(),
            width: d_head_width(),
            max_map_age_frames: d_map_age(),
            bc_trains_heads: d_bc_trains_heads(),
            shift: 0,
        }
    }

    /// The image heads this section describes: the encoder's spec gives each camera's map shape,
    /// its bytes the encoder's identity. An error names the file and what to do.
    pub fn heads(&self) -> Result<reflex_learn::sac::VisionHeads, SetupError> {
        use reflex_policies::features::{EncoderSpec, encoder_id, encoder_spec_path};
        let spec_path = encoder_spec_path(&self.encoder);
        let spec: EncoderSpec = reflex_contracts::config::load(&spec_path).map_err(|e| {
            SetupError::new(
                "[learner.vision] encoder",
                format!(
                    "{e}; the encoder `{}` needs its spec beside it (`reflex bc train --camera ...` writes both)",
                    self.encoder.display()
                ),
            )
        })?;
        let bytes = std::fs::read(&self.encoder).map_err(|e| {
            SetupError::new(
                "[learner.vision] encoder",
                format!(
                    "cannot read `{}`: {e} (a path relative to the config file, or absolute)",
                    self.encoder.display()
                ),
            )
        })?;
        Ok(reflex_learn::sac::VisionHeads {
            encoder_id: encoder_id(&self.encoder, &bytes),
            features: spec
                .cameras
                .iter()
                .map(|c| reflex_learn::sac::FeatureShape {
                    camera: c.camera.clone(),
                    channels: c.channels as usize,
                    height: c.map_height as usize,
                    width: c.map_width as usize,
                })
                .collect(),
            embeddings: self.embeddings,
            width: self.width,
            bc_trains_heads: self.bc_trains_heads,
            shift: self.shift,
        })
    }
}

/// What a learner does with a checkpoint it cannot read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BadCheckpoint {
    /// Stop at once with an error naming the file (nothing is trained over it).
    #[default]
    Stop,
    /// Move it aside and resume from the one before it (`<file>.prev`).
    Previous,
    /// Move it aside and start afresh.
    Fresh,
}

/// The SAC settings a `[learner.sac]` table starts from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Preset {
    /// The demo's (docs/training.md).
    #[default]
    Demo,
    /// SAC's defaults (docs/learner.md).
    Sac,
}

impl Default for LearnerSection {
    /// Every key at its default (as an empty `[learner]` table).
    fn default() -> Self {
        LearnerSection {
            checkpoint: PathBuf::from("runs/learner/sac.ckpt"),
            checkpoint_every_s: 10.0,
            publish_every_episodes: 1,
            rlif: Default::default(),
            sac: Default::default(),
            link: Default::default(),
            in_process: true,
            pace_lockstep: true,
            obs_norm: Default::default(),
            on_bad_checkpoint: Default::default(),
            preset: Default::default(),
            shed_updates_above: 5_000,
            threads: Default::default(),
            vision: Default::default(),
            fleet: Default::default(),
        }
    }
}

/// Where the learner's state scaling comes from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ObsNormSource {
    /// The base policy's own input normalisation; without a base policy, the state bounds in the
    /// robot's spec (an error names the fields without finite bounds).
    #[default]
    Auto,
    /// The state bounds in the robot's spec, even with a base policy.
    Spec,
    /// No scaling: the learner sees the raw state.
    Off,
}

impl LearnerSection {
    /// `[learner.sac]` from a typed config instead of a TOML table: the learner runs `sac` as
    /// given (the `sac` preset under every key of it), but for its mode and seed, which are the
    /// actor's. For a program that embeds reflex:
    /// `LearnerSection::default().with_sac(&SacConfig { batch: 64, ..SacConfig::default() })`.
    pub fn with_sac(mut self, sac: &SacConfig) -> Self {
        let mut t = toml::Table::try_from(sac).expect("SacConfig serialises to a table");
        t.remove("mode");
        t.remove("seed");
        self.preset = Preset::Sac;
        self.sac = Some(t);
        self
    }

    /// The threads `threads` asks for, 0 resolved against this machine's cores.
    pub fn learner_threads(&self) -> usize {
        reflex_learn::sac::gemm::threads_for(self.threads)
    }

    /// The SAC settings for `mode`: the demo's, with the keys of `[learner.sac]` replacing them.
    /// A key SAC does not have, or a value of the wrong type, is an error naming it.
    pub fn sac_config(&self, mode: Mode, seed: u64) -> Result<SacConfig, Invalid> {
        let base = match self.preset {
            Preset::Demo => reflex_learn::sac::learner_preset(mode, seed),
            Preset::Sac => SacConfig {
                seed,
                ..SacConfig::default()
            },
        };
        let c = match &self.sac {
            Some(t) => overlay_sac(base, t).map_err(|e| Invalid {
                key: "learner.sac".into(),
                value: e.to_string(),
                allowed: "the SAC keys of docs/learner.md".into(),
            })?,
            None => base,
        };
        let c = SacConfig { mode, ..c };
        c.validate("learner.sac").map(|()| c)
    }

    /// The SAC settings with the image heads of `[learner.vision]`, if any (reads the encoder's
    /// spec and bytes).
    pub fn learner_sac(&self, mode: Mode, seed: u64) -> Result<SacConfig, SetupError> {
        let mut c = self.sac_config(mode, seed).map_err(|e| {
            SetupError::new(
                format!("[{}]", e.key),
                format!("{} ({})", e.value, e.allowed),
            )
        })?;
        c.vision = self.vision.as_ref().map(VisionSection::heads).transpose()?;
        Ok(c)
    }

    /// Checks ranges, naming the key.
    pub fn validate(&self, mode: Mode) -> Result<(), Invalid> {
        in_range(
            "learner",
            "checkpoint_every_s",
            self.checkpoint_every_s,
            0.05,
            86_400.0,
        )?;
        in_range(
            "learner",
            "publish_every_episodes",
            self.publish_every_episodes,
            1,
            1_000_000,
        )?;
        in_range(
            "learner",
            "shed_updates_above",
            self.shed_updates_above,
            64,
            100_000_000,
        )?;
        in_range("learner", "threads", self.threads, 0, 1024)?;
        if let Some(v) = &self.vision {
            v.validate("learner.vision")?;
        }
        self.sac_config(mode, 0)?;
        self.link.validate("learner.link")
    }
}

/// Settings that parse but do not fit together or cannot be used (an encoder file that is not
/// there): the file, table or option at fault and what to do.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{context}: {message}")]
pub struct SetupError {
    /// The file, table or option at fault.
    pub context: String,
    /// What is wrong and what to do.
    pub message: String,
}

impl SetupError {
    /// An error about `context`.
    pub fn new(context: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            context: context.into(),
            message: message.into(),
        }
    }
}

/// A `[learner]` table that does not fit SAC's settings (an unknown key, a wrong type).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct OverlayError(pub String);

/// `base` with the keys of `table` replacing its own (a partial table keeps the other values).
pub fn overlay_sac(base: SacConfig, table: &toml::Table) -> Result<SacConfig, OverlayError> {
    let mut t = match toml::Value::try_from(&base).map_err(|e| OverlayError(e.to_string()))? {
        toml::Value::Table(t) => t,
        _ => unreachable!("a struct serialises to a table"),
    };
    for (k, v) in table {
        t.insert(k.clone(), v.clone());
    }
    toml::Value::Table(t)
        .try_into::<SacConfig>()
        .map_err(|e| OverlayError(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learner_threads_default_to_all_cores_but_one_and_are_range_checked() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let auto: LearnerSection = toml::from_str("").unwrap();
        assert_eq!(auto.learner_threads(), cores.saturating_sub(1).max(1));
        let two: LearnerSection = toml::from_str("threads = 2").unwrap();
        assert_eq!(two.learner_threads(), 2);
        two.validate(Mode::Full).unwrap();
        let many: LearnerSection = toml::from_str("threads = 5000").unwrap();
        let e = many.validate(Mode::Full).unwrap_err();
        assert!(e.key.ends_with("threads"), "{e:?}");
    }
}
