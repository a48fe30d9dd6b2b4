//! Building an actor: the robot, its policy, clock, loop and safety settings, and what runs
//! beside the loop (bus, recorder, learner), chosen one call at a time.

use super::*;

/// Which time the loop runs on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ClockChoice {
    /// Simulated time: the loop runs as fast as the robot steps, the policy inline; a seed
    /// reproduces the run (lockstep robots only).
    Sim,
    /// Wall time at the loop's rate, the policy on its own thread; `spin` is the busy-wait before
    /// each deadline.
    Wall {
        /// Spin before each deadline.
        spin: Duration,
    },
}

/// The learner an actor trains with.
#[derive(Clone, Debug)]
pub struct LearnerSetup {
    /// `[learner]`.
    pub section: LearnerSection,
    /// The base policy's model (residual mode; the learner relabels a person's steps with it).
    pub base_model: Option<PathBuf>,
}

/// A base that holds the centre of the action box: with the learner in full mode, the learner's
/// action replaces it entirely.
struct CentrePolicy {
    centre: Vec<f32>,
}

impl Policy for CentrePolicy {
    fn name(&self) -> &str {
        "centre of the action box"
    }
    fn chunk_spec(&self) -> ChunkSpec {
        ChunkSpec {
            len: 1,
            execute: 1,
            dim: self.centre.len(),
        }
    }
    fn infer(&mut self, _: &Observation, out: &mut [f32]) -> std::result::Result<(), PolicyError> {
        out.copy_from_slice(&self.centre);
        Ok(())
    }
}

/// Builds an [`Actor`].
pub struct ActorBuilder<R: Robot> {
    pub(super) robot: R,
    pub(super) policy: Option<Box<dyn Policy>>,
    pub(super) clock: ClockChoice,
    loop_cfg: Option<LoopConfig>,
    pub(super) safety: SafetyConfig,
    pub(super) chain: Option<Chain>,
    pub(super) seed: u64,
    pub(super) session: Option<zenoh::Session>,
    pub(super) trace_hz: f64,
    pub(super) ros2: Option<reflex_ros2::Ros2Config>,
    pub(super) record: Option<PathBuf>,
    pub(super) record_limits: reflex_data::rotate::Limits,
    pub(super) live: Live,
    pub(super) learner: Option<LearnerSetup>,
    frozen: Option<ResidualMlp>,
    pub(super) run_id: Option<String>,
    pub(super) rejects: Vec<Arc<reflex_bus::Rejects>>,
    pub(super) stop: Arc<StopSwitch>,
    pub(super) camera_figures: Option<CameraFiguresFn>,
    pub(super) encoder: Option<(FeatureEncoder, u32)>,
}

/// Reads the robot's cameras' figures from the status thread.
pub type CameraFiguresFn = Box<dyn Fn() -> Vec<reflex_contracts::msg::CameraFigures> + Send>;

impl<R: Robot + 'static> ActorBuilder<R> {
    /// An actor for `robot`: no policy (it holds), simulated time, no bus, no recording.
    pub fn new(robot: R) -> Self {
        ActorBuilder {
            robot,
            policy: None,
            clock: ClockChoice::Sim,
            loop_cfg: None,
            safety: SafetyConfig::default(),
            chain: None,
            seed: 0,
            session: None,
            trace_hz: 0.0,
            ros2: None,
            record: None,
            record_limits: reflex_data::rotate::Limits::default(),
            live: Live::Off,
            learner: None,
            frozen: None,
            run_id: None,
            rejects: Vec::new(),
            camera_figures: None,
            stop: StopSwitch::new(),
            encoder: None,
        }
    }

    /// The e-stop the actor obeys (default: its own, raised and released from the bus when the
    /// actor has one). Share it to stop the robot from this process.
    pub fn stop_switch(mut self, stop: Arc<StopSwitch>) -> Self {
        self.stop = stop;
        self
    }

    /// Reports this counter of rejected messages in the status (e.g. a remote robot's
    /// observations, [`RemoteRobot::rejects`]).
    pub fn count_rejects(mut self, r: Arc<reflex_bus::Rejects>) -> Self {
        self.rejects.push(r);
        self
    }

    /// The robot's cameras' figures, read by the status thread (a real arm's capture counters)
    /// and published in every status on the bus.
    pub fn camera_figures(mut self, f: CameraFiguresFn) -> Self {
        self.camera_figures = Some(f);
        self
    }

    /// The base policy.
    pub fn policy(mut self, p: Box<dyn Policy>) -> Self {
        self.policy = Some(p);
        self
    }

    /// Simulated or wall time.
    pub fn clock(mut self, c: ClockChoice) -> Self {
        self.clock = c;
        self
    }

    /// `[loop]` settings (default: the robot's rate).
    pub fn loop_config(mut self, c: LoopConfig) -> Self {
        self.loop_cfg = Some(c);
        self
    }

    /// `[safety]` settings.
    pub fn safety(mut self, s: SafetyConfig) -> Self {
        self.safety = s;
        self
    }

    /// The arm's kinematics for the workspace check of joint actions.
    pub fn chain(mut self, c: Option<Chain>) -> Self {
        self.chain = c;
        self
    }

    /// Seed of the episode seeds (and of the learner).
    pub fn seed(mut self, s: u64) -> Self {
        self.seed = s;
        self
    }

    /// Joins the bus: status out, teleop and e-stop in (and the learner link, the trace).
    pub fn bus(mut self, session: zenoh::Session) -> Self {
        self.session = Some(session);
        self
    }

    /// The robot appears as a ROS 2 node over rmw_zenoh on the bus session (needs the bus).
    pub fn ros2(mut self, cfg: reflex_ros2::Ros2Config) -> Self {
        self.ros2 = Some(cfg);
        self
    }

    /// Publishes a decimated trace for `reflex viz` at this rate (needs the bus; 0: off).
    pub fn trace_hz(mut self, hz: f64) -> Self {
        self.trace_hz = hz;
        self
    }

    /// Records every episode under `runs/<run-id>/episodes/`.
    pub fn record(mut self, runs: PathBuf) -> Self {
        self.record = Some(runs);
        self
    }

    /// Keeps the records directory within `limits`, deleting earlier runs' oldest files first
    /// (a thread of its own, at start and every minute).
    pub fn record_limits(mut self, limits: reflex_data::rotate::Limits) -> Self {
        self.record_limits = limits;
        self
    }

    /// Streams to a live Rerun viewer.
    pub fn live(mut self, live: Live) -> Self {
        self.live = live;
        self
    }

    /// Trains a learner from this actor's steps (on a thread of this process when
    /// `section.in_process`, else a `reflex learn` elsewhere on the bus). Without a bus a local
    /// one is opened for the in-process learner.
    pub fn learner(mut self, setup: LearnerSetup) -> Self {
        self.learner = Some(setup);
        self
    }

    /// Runs a kept residual on the base policy (no learner): the refined policy a learner
    /// exported ([`reflex_learn::sac::export::ResidualModel::hook`]). A full-mode file
    /// (trained without a base) runs with no base policy given.
    pub fn residual_model(mut self, hook: ResidualMlp) -> Self {
        self.frozen = Some(hook);
        self
    }

    /// The frozen image encoder of a residual that sees (a learner with `[learner.vision]`, or a
    /// kept residual with image heads), and how many frames behind its maps may be in real
    /// time. Default for a learner: the file `[learner.vision] encoder` names, on the CPU.
    pub fn encoder(mut self, encoder: FeatureEncoder, max_age_frames: u32) -> Self {
        self.encoder = Some((encoder, max_age_frames));
        self
    }

    /// The run's id (default: [`crate::run_id`]).
    pub fn run_id(mut self, id: String) -> Self {
        self.run_id = Some(id);
        self
    }

    /// Checks everything fits and starts the threads around the loop.
    pub fn build(mut self) -> Result<Actor<R>> {
        let spec = self.robot.spec().clone();
        spec.validate()?;
        let run_id = self.run_id.take().unwrap_or_else(|| crate::run_id("run"));
        if self.learner.is_some() && self.session.is_none() {
            // The in-process learner speaks the same protocol as a remote one, on a session that
            // reaches nothing but this process.
            self.session = Some(BusConfig::hermetic(vec![], vec![]).open()?);
        }
        if self.learner.is_some() && self.frozen.is_some() {
            return Err(AgentError::setup(
                "a kept residual",
                "runs without a learner; a learner trains its own from its checkpoint",
            ));
        }
        let mode = match (&self.learner, &self.policy) {
            (Some(_), Some(_)) => Some(Mode::Residual),
            (Some(_), None) => Some(Mode::Full),
            (None, _) => None,
        };
        let frozen_full = self.frozen.is_some() && self.policy.is_none();
        if mode == Some(Mode::Full) || frozen_full {
            let centre = spec
                .action
                .low
                .iter()
                .zip(&spec.action.high)
                .map(|(l, h)| 0.5 * (l + h))
                .collect();
            self.policy = Some(Box::new(CentrePolicy { centre }));
        }
        let inline =
            matches!(self.clock, ClockChoice::Sim) || mode == Some(Mode::Full) || frozen_full;
        let driver = match self.policy.take() {
            None => PolicyDriver::None,
            Some(p) if inline => PolicyDriver::inline(p),
            Some(p) => PolicyDriver::Thread(PolicyThread::spawn(p, &obs_template(&spec))),
        };
        let clock: Box<dyn Clock> = match self.clock {
            ClockChoice::Sim => Box::new(SimClock::new()),
            ClockChoice::Wall { spin } => Box::new(WallClock::new(spin)),
        };
        let vision = match (&self.learner, &self.frozen) {
            (Some(l), _) => l.section.vision.as_ref().map(|v| v.max_map_age_frames),
            (None, Some(h)) => h.sees().then_some(DEFAULT_MAP_AGE),
            (None, None) => None,
        };
        let features = match vision {
            Some(age) => Some(self.feature_driver(&spec, age)?),
            None => None,
        };
        let mut wires = Wires::start(&mut self, &spec, &run_id, mode, features.as_ref())?;
        if let Some(h) = self.frozen.take() {
            wires.residual = Some((h, true));
        }
        let mut b = ControlLoop::builder(self.robot, clock)
            .safety(self.safety)
            .policy(driver)
            .chain(self.chain)
            .seed(self.seed);
        let mut encoder_id = String::new();
        if let Some((f, h)) = features {
            encoder_id = h.encoder;
            b = b.features(f);
        }
        if let Some(c) = self.loop_cfg.clone() {
            b = b.config(c);
        }
        let (b, parts) = wires.attach(b);
        let lp = b.build()?;
        // Real-time settings last, on this (the loop's) thread only: the helper threads started
        // above keep the ordinary scheduler.
        let rt_cfg = self.loop_cfg.map(|c| c.rt).unwrap_or_default();
        reflex_runtime::rt::apply(&rt_cfg);
        Ok(Actor {
            lp,
            parts,
            pace: matches!(self.clock, ClockChoice::Sim),
            pace_frames: true,
            run_id,
            recording: self.record.is_some(),
            done: Vec::new(),
            eval: Vec::new(),
            episode_lines: false,
            stop: StopHandle::new(),
            last_stop: (StopState::Running, 0),
            t0: Instant::now(),
            encoder_id,
        })
    }
}

/// How long, in simulated time, the actor waits for the camera frames' consumer before a step.
pub(super) const FRAME_PACE_LIMIT: Duration = Duration::from_secs(1);

/// Frames a kept residual's maps may lag in real time when nothing says otherwise.
pub(super) const DEFAULT_MAP_AGE: u32 = 2;

impl<R: Robot + 'static> ActorBuilder<R> {
    /// The encoder of a residual that sees, on the loop's thread in simulated time (the maps of
    /// the frame in hand) or its own in real time; with its identity and map shapes for the link.
    fn feature_driver(
        &mut self,
        spec: &RobotSpec,
        max_age: u32,
    ) -> Result<(LoopFeatures, StepFeatureHeader)> {
        let (enc, max_age) = match self.encoder.take() {
            Some(e) => e,
            None => {
                let path = self
                    .learner
                    .as_ref()
                    .and_then(|l| l.section.vision.as_ref())
                    .map(|v| v.encoder.clone())
                    .ok_or_else(|| {
                        AgentError::setup(
                            "the kept residual",
                            "it sees through image heads: give the actor its frozen encoder ([policy.residual] encoder)",
                        )
                    })?;
                let enc = FeatureEncoder::load(&path, &Default::default())?;
                (enc, max_age)
            }
        };
        loop_features(enc, spec, matches!(self.clock, ClockChoice::Sim), max_age)
    }
}

/// The loop's features from the frozen encoder `enc` on `spec`'s cameras: run inline on the frame
/// in hand (simulated time) or on its own thread, maps older than `max_age` frames unused (real
/// time); with what every step's maps say of themselves. An encoder reading a camera the robot
/// lacks is refused, naming both.
pub fn loop_features(
    enc: FeatureEncoder,
    spec: &RobotSpec,
    inline: bool,
    max_age: u32,
) -> Result<(LoopFeatures, StepFeatureHeader)> {
    {
        for c in &enc.spec().cameras {
            if !spec.cameras.iter().any(|k| k.name == c.camera) {
                return Err(AgentError::setup(
                    format!("encoder `{}`", enc.id()),
                    format!(
                        "it reads camera `{}`, which robot `{}` does not have (cameras: {:?}); if one of them is that camera under another name, map it in [robot.cameras]",
                        c.camera,
                        spec.name,
                        spec.cameras.iter().map(|k| &k.name).collect::<Vec<_>>()
                    ),
                ));
            }
        }
        let header = StepFeatureHeader {
            encoder: enc.id().to_string(),
            shapes: enc.spec().cameras.iter().map(|c| c.shape()).collect(),
            len: enc.features_len(),
        };
        let driver =
            FeatureDriver::start(Box::new(enc), inline, &obs_template(spec).images, max_age)
                .map_err(|e| AgentError::setup("the encoder thread", e.to_string()))?;
        Ok((LoopFeatures::new(driver, spec.state_dim()), header))
    }
}

/// What the link says of every step's maps, and how many values they are.
#[derive(Clone, Debug)]
pub struct StepFeatureHeader {
    /// The encoder's identity (file name and digest).
    pub encoder: String,
    /// Each camera's map shape, [C, H, W].
    pub shapes: Vec<[u32; 3]>,
    /// Values of all maps of one frame.
    pub len: usize,
}

impl StepFeatureHeader {
    /// A step's features with this header and no maps yet.
    pub fn empty_features(&self) -> reflex_contracts::msg::StepFeatures {
        reflex_contracts::msg::StepFeatures {
            encoder: self.encoder.clone(),
            shapes: self.shapes.clone(),
            obs: vec![],
            next_obs: vec![],
        }
    }
}
