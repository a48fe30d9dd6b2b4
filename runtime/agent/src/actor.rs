//! The actor: the control loop driving one robot with a base policy, and everything around it
//! that never holds the loop up: the recorder, the bus (status out, teleop and e-stop in, the
//! trace for `reflex viz`), the residual (or full) learner's weights in and the steps out.
//!
//! ```no_run
//! # fn demo(robot: reflex_sim::SimEnv, policy: Box<dyn reflex_contracts::policy::Policy>)
//! #     -> Result<(), reflex_agent::AgentError> {
//! use reflex_agent::actor::{ActorBuilder, ClockChoice};
//! let mut actor = ActorBuilder::new(robot)
//!     .policy(policy)
//!     .clock(ClockChoice::Sim)
//!     .seed(7)
//!     .record("runs".into())
//!     .build()?;
//! actor.run_episodes(10, &reflex_agent::progress::Silent)?;
//! let report = actor.finish()?;
//! println!("{} episodes", report.episodes.len());
//! # Ok(()) }
//! ```

use crate::config::{ClockKind, LearnerSection, PolicyKind, RobotSource, RunConfig};
use crate::learner::{LearnerConfig, LearnerReport, ServeOptions, action_norm};
use crate::progress::Progress;
use crate::stop::StopHandle;
use crate::tap::{RecordingTap, make_recorder};
use crate::{AgentError, error::Result};
use reflex_bus::learnlink::{ActorLink, LinkProgress, LinkStats, SwapPoint};
use reflex_bus::robot::RemoteRobot;
use reflex_bus::{BusConfig, Keys};
use reflex_contracts::msg::{Image, Observation, RobotSpec};
use reflex_contracts::policy::{ChunkSpec, Policy, PolicyError};
use reflex_contracts::robot::Robot;
use reflex_contracts::stop::{StopState, StopSwitch};
use reflex_learn::sac::hook::ResidualMlp;
use reflex_learn::sac::{Mode, Sac};
use reflex_policies::features::FeatureEncoder;
use reflex_record::Live;
use reflex_runtime::clock::{Clock, SimClock, WallClock};
use reflex_runtime::control::{ControlLoop, EpisodeSummary, LoopConfig, LoopStats, PolicyDriver};
use reflex_runtime::features::{FeatureDriver, LoopFeatures};
use reflex_runtime::kinematics::Chain;
use reflex_runtime::policy::PolicyThread;
use reflex_runtime::safety::{SafetyConfig, SafetyCounters};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
    robot: R,
    policy: Option<Box<dyn Policy>>,
    clock: ClockChoice,
    loop_cfg: Option<LoopConfig>,
    safety: SafetyConfig,
    chain: Option<Chain>,
    seed: u64,
    session: Option<zenoh::Session>,
    trace_hz: f64,
    ros2: Option<reflex_ros2::Ros2Config>,
    record: Option<PathBuf>,
    record_limits: reflex_data::rotate::Limits,
    live: Live,
    learner: Option<LearnerSetup>,
    frozen: Option<ResidualMlp>,
    run_id: Option<String>,
    rejects: Vec<Arc<reflex_bus::Rejects>>,
    stop: Arc<StopSwitch>,
    camera_figures: Option<CameraFiguresFn>,
    encoder: Option<(FeatureEncoder, u32)>,
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
const FRAME_PACE_LIMIT: Duration = Duration::from_secs(1);

/// Frames a kept residual's maps may lag in real time when nothing says otherwise.
const DEFAULT_MAP_AGE: u32 = 2;

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

/// Everything around the loop, started before it: the recorder, trace and learner link behind
/// the outbox, the in-process learner, and the bus's status, teleop and e-stop.
struct Wires {
    outbox: Option<reflex_runtime::outbox::OutboxSender>,
    frames: Option<(
        reflex_runtime::outbox::OutboxSender<reflex_runtime::outbox::Frames>,
        u32,
    )>,
    held: Option<(
        reflex_runtime::outbox::OutboxSender<reflex_runtime::outbox::Held>,
        u32,
    )>,
    residual: Option<(ResidualMlp, bool)>,
    teleop: Option<reflex_runtime::teleop::TeleopReader>,
    status: Option<reflex_runtime::triple::Writer<reflex_runtime::control::LoopStatus>>,
    stop: Arc<StopSwitch>,
    parts: Parts,
}

/// What the actor keeps alive beside the loop.
struct Parts {
    tap: Option<RecordingTap>,
    learner: Option<JoinHandle<Result<LearnerReport>>>,
    learner_stop: Arc<AtomicBool>,
    learner_restart: Option<(zenoh::Session, LearnerConfig)>,
    link_progress: Option<Arc<LinkProgress>>,
    rejects: Vec<Arc<reflex_bus::Rejects>>,
    _subs: Vec<zenoh::pubsub::Subscriber<()>>,
    _stop: Option<reflex_bus::stop::StopInputs>,
    _status: Option<reflex_bus::status::StatusPublisher>,
    _spec: Option<zenoh::query::Queryable<()>>,
    _ros2: Option<reflex_ros2::Ros2Node>,
    _janitor: Option<reflex_data::rotate::Janitor>,
}

impl Wires {
    fn start<R: Robot + 'static>(
        b: &mut ActorBuilder<R>,
        spec: &RobotSpec,
        run_id: &str,
        mode: Option<Mode>,
        features: Option<&(LoopFeatures, StepFeatureHeader)>,
    ) -> Result<Self> {
        let header = features.map(|(_, h)| h);
        let keys = Keys::new(&spec.name).map_err(reflex_bus::BusError::from)?;
        let recorder = recorder_of(b, spec, run_id)?;
        let trace = match &b.session {
            Some(s) if b.trace_hz > 0.0 => Some(reflex_bus::trace::TracePublisher::new(
                s, &keys, spec, b.trace_hz,
            )?),
            _ => None,
        };
        let ros2 = ros2_of(b, spec, &keys)?;
        let learning = match (&b.learner, &b.session, mode) {
            (Some(setup), Some(session), Some(mode)) => Some(Learning::start(
                setup, session, spec, &keys, mode, b.seed, header,
            )?),
            _ => None,
        };
        let mut w = Wires::empty(b, run_id);
        if let Some(s) = &b.session {
            w.parts._spec = Some(reflex_bus::trace::serve_spec(s, &keys, spec)?);
        }
        let mut link = None;
        if let Some(l) = learning {
            w.residual = Some(l.residual);
            w.parts.link_progress = Some(l.link.progress());
            w.parts.learner = l.thread;
            w.parts.learner_stop = l.stop;
            w.parts.learner_restart = l.restart;
            b.rejects.extend(l.link.rejects());
            link = Some(l.link);
        }
        // With a records directory, every step also goes to `<run>/steps/` in reflex's episode
        // format (who acted, base, residual), for `reflex dataset export --run`.
        let steps = match &b.record {
            Some(r) => Some(reflex_data::steplog::StepLog::create(
                &r.join(run_id).join("steps"),
                spec,
                &format!("reflex run (run {run_id})"),
            )?),
            None => None,
        };
        let (node, topics) = ros2.unzip();
        w.parts._ros2 = node;
        let bus = crate::tap::BusOut {
            trace,
            ros2: topics,
            held: None,
        };
        if recorder.is_some() || bus.trace.is_some() || bus.ros2.is_some() || link.is_some() {
            w.tap(
                spec,
                recorder,
                bus,
                link,
                steps,
                header.map_or(0, |h| h.len),
            );
        }
        if let Some(s) = &b.session {
            w.bus_inputs(
                s,
                &keys,
                spec,
                std::mem::take(&mut b.rejects),
                b.camera_figures.take(),
            )?;
        }
        Ok(w)
    }

    /// Nothing wired yet: the parts that live as long as the actor (the records' janitor).
    fn empty<R: Robot + 'static>(b: &ActorBuilder<R>, run_id: &str) -> Self {
        Wires {
            outbox: None,
            frames: None,
            held: None,
            residual: None,
            teleop: None,
            status: None,
            stop: b.stop.clone(),
            parts: Parts {
                tap: None,
                learner: None,
                learner_stop: Arc::new(AtomicBool::new(false)),
                learner_restart: None,
                link_progress: None,
                rejects: Vec::new(),
                _subs: Vec::new(),
                _stop: None,
                _status: None,
                _spec: None,
                _ros2: None,
                _janitor: match &b.record {
                    Some(root) if !b.record_limits.is_none() => {
                        Some(reflex_data::rotate::Janitor::start(
                            root.clone(),
                            root.join(run_id),
                            b.record_limits,
                            Duration::from_secs(60),
                        ))
                    }
                    _ => None,
                },
            },
        }
    }

    /// The outbox and its consumer (recorder, trace, learner link); camera frames when someone
    /// shows them.
    fn tap(
        &mut self,
        spec: &RobotSpec,
        recorder: Option<(Arc<reflex_record::Recorder>, PathBuf)>,
        mut bus: crate::tap::BusOut,
        link: Option<ActorLink>,
        steps: Option<reflex_data::steplog::StepLog>,
        features: usize,
    ) {
        if let Some(r) = &bus.ros2 {
            // While the e-stop holds the robot the loop sends no steps; ROS 2 keeps showing it
            // from the held ticks (docs/ros2.md).
            let (htx, hrx) = reflex_runtime::outbox::held(8, spec.state_dim());
            self.held = Some((htx, r.held_every()));
            bus.held = Some(hrx);
        }
        let (otx, orx) = reflex_runtime::outbox::outbox_with_features(
            1024,
            spec.state_dim(),
            spec.action.dim(),
            features,
        );
        self.outbox = Some(otx);
        let shown = recorder.is_some() || bus.trace.is_some() || bus.ros2.is_some();
        let frx = if shown && !spec.cameras.is_empty() {
            // A few frame buffers, at up to ~15 frames per second of camera video.
            let (ftx, frx) = reflex_runtime::outbox::frames(8);
            self.frames = Some((ftx, (spec.control_hz / 15.0).round().max(1.0) as u32));
            Some(frx)
        } else {
            None
        };
        let (rec, dir) = match recorder {
            Some((r, d)) => (Some(r), d),
            None => (None, PathBuf::new()),
        };
        self.parts.tap = Some(RecordingTap::with(rec, dir, bus, link, orx, frx, steps));
    }

    /// Status out, teleop and e-stop in; `rejects` are reported in the status beside the teleop
    /// and event keys' own.
    fn bus_inputs(
        &mut self,
        s: &zenoh::Session,
        keys: &Keys,
        spec: &RobotSpec,
        mut rejects: Vec<Arc<reflex_bus::Rejects>>,
        cameras: Option<CameraFiguresFn>,
    ) -> Result<()> {
        let teleop_rejects = reflex_bus::Rejects::new(&keys.teleop);
        let event_rejects = reflex_bus::Rejects::new(&keys.events);
        let operator_rejects = reflex_bus::Rejects::new(&keys.operator);
        rejects.extend([
            teleop_rejects.clone(),
            event_rejects.clone(),
            operator_rejects.clone(),
        ]);
        self.parts.rejects = rejects.clone();
        let (w, r) = reflex_runtime::status::status_channel();
        self.status = Some(w);
        let recorder = self.parts.tap.as_ref().and_then(|t| t.recorder.as_ref());
        self.parts._status = Some(reflex_bus::status::spawn_publisher(
            s.clone(),
            keys.clone(),
            r,
            Duration::from_millis(50),
            reflex_bus::status::StatusExtras {
                recorder_dropped: recorder.map(|r| {
                    let st = r.stats_handle();
                    Box::new(move || st.dropped.load(Ordering::Relaxed))
                        as Box<dyn Fn() -> u64 + Send>
                }),
                rejects,
                stop: Some(self.stop.clone()),
                cameras,
                learner: self.parts.link_progress.clone(),
            },
        ));
        let (tw, tr) = reflex_runtime::teleop::teleop_channel(spec.action.dim());
        self.teleop = Some(tr);
        let bus_err = |key: &str, e: zenoh::Error| reflex_bus::BusError::Declare {
            key: key.into(),
            message: e.to_string(),
        };
        self.parts._subs.push(
            reflex_bus::teleop::subscribe(s, keys, tw, spec.action.dim(), teleop_rejects)
                .map_err(|e| bus_err(&keys.teleop, e))?,
        );
        self.parts._stop = Some(reflex_bus::stop::StopInputs::open(
            s,
            keys,
            reflex_contracts::stop::StopHolder::Actor,
            self.stop.clone(),
            event_rejects,
            operator_rejects,
        )?);
        Ok(())
    }

    fn attach<R: Robot, C: Clock>(
        self,
        mut b: reflex_runtime::control::ControlLoopBuilder<R, C>,
    ) -> (reflex_runtime::control::ControlLoopBuilder<R, C>, Parts) {
        if let Some((hook, at_episode)) = self.residual {
            b = b.residual(Box::new(hook), at_episode);
        }
        if let Some(o) = self.outbox {
            b = b.outbox(o);
        }
        if let Some((f, every)) = self.frames {
            b = b.frames(f, every);
        }
        if let Some((h, every)) = self.held {
            b = b.held(h, every);
        }
        if let Some(t) = self.teleop {
            b = b.teleop(t);
        }
        if let Some(s) = self.status {
            b = b.status(s);
        }
        b = b.stop_switch(self.stop);
        (b, self.parts)
    }
}

/// The learner's side of the actor: the hook that runs the learner's actor on the loop, the
/// link that carries steps out and weights in, the in-process learner thread.
struct Learning {
    residual: (ResidualMlp, bool),
    link: ActorLink,
    thread: Option<JoinHandle<Result<LearnerReport>>>,
    stop: Arc<AtomicBool>,
    restart: Option<(zenoh::Session, LearnerConfig)>,
}

impl Learning {
    fn start(
        setup: &LearnerSetup,
        session: &zenoh::Session,
        spec: &RobotSpec,
        keys: &Keys,
        mode: Mode,
        seed: u64,
        features: Option<&StepFeatureHeader>,
    ) -> Result<Self> {
        let sac_cfg = setup.section.learner_sac(mode, seed)?;
        if let (Some(v), Some(h)) = (&sac_cfg.vision, features)
            && v.encoder_id != h.encoder
        {
            return Err(AgentError::setup(
                format!("encoder `{}`", h.encoder),
                format!(
                    "the actor's encoder is not the one [learner.vision] names (`{}`): the learner would refuse every step",
                    v.encoder_id
                ),
            ));
        }
        let sac = Sac::new(sac_cfg, spec.state_dim(), spec.action.dim())?;
        let (hook, writer) = ResidualMlp::new(&sac, action_norm(spec, &sac), true, seed ^ 7)?;
        let (len, arch) = reflex_learn::sac::hook::actor_shape(&sac);
        let shape = reflex_bus::learnlink::WeightsShape { len, arch };
        let mut link = ActorLink::new(session, keys, setup.section.link.clone(), writer, shape)?;
        if let Some(h) = features {
            link = link.with_features(h.encoder.clone(), h.shapes.clone());
        }
        let stop = Arc::new(AtomicBool::new(false));
        let cfg = LearnerConfig {
            robot: spec.name.clone(),
            // The actor's own robot: an in-process learner serves no fleet.
            fleet: reflex_bus::learnlink::Fleet::one(&keys.robot)
                .map_err(reflex_bus::BusError::from)?,
            section: setup.section.clone(),
            mode,
            base_model: setup.base_model.clone(),
            seed,
        };
        let thread = setup
            .section
            .in_process
            .then(|| spawn_learner(session.clone(), cfg.clone(), stop.clone()));
        Ok(Learning {
            residual: (hook, setup.section.link.swap == SwapPoint::Episode),
            link,
            thread,
            stop,
            restart: setup.section.in_process.then(|| (session.clone(), cfg)),
        })
    }
}

fn spawn_learner(
    session: zenoh::Session,
    cfg: LearnerConfig,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Result<LearnerReport>> {
    std::thread::Builder::new()
        .name("learner".into())
        .spawn(move || {
            let opts = ServeOptions {
                exit_when_actor_leaves: false,
                seconds: None,
                wait_s: 60.0,
                stop: Some(stop),
            };
            crate::learner::serve(&session, &cfg, &opts, &crate::progress::Silent)
        })
        .expect("spawn the learner thread")
}

/// An observation of `spec`'s shape (zero state, black frames of every camera): what sizes the
/// loop's buffers, and a placeholder input for a policy check.
pub fn obs_template(spec: &RobotSpec) -> Observation {
    Observation {
        state: vec![0.0; spec.state_dim()],
        images: spec
            .cameras
            .iter()
            .map(|c| Image {
                camera: c.name.clone(),
                width: c.width,
                height: c.height,
                encoding: "rgb8".into(),
                seq: 0,
                age_ns: 0,
                data: vec![0; (c.width * c.height * 3) as usize],
            })
            .collect(),
        ..Default::default()
    }
}

/// What a run produced.
#[derive(Debug)]
pub struct RunReport {
    /// The run's id.
    pub run_id: String,
    /// Every training (or plain) episode.
    pub episodes: Vec<EpisodeSummary>,
    /// The evaluation episodes (the learner's deterministic action), after the others.
    pub eval: Vec<EpisodeSummary>,
    /// Wall time of the episodes, s.
    pub wall_s: f64,
    /// The loop's timing and counters.
    pub stats: LoopStats,
    /// Safety events by kind.
    pub safety: SafetyCounters,
    /// Recording: directory, steps recorded, steps dropped, episode files, frames dropped.
    pub recording: Option<Recording>,
    /// Steps published on the bus trace (for `reflex viz`).
    pub traced: u64,
    /// The learner link's counters, when learning.
    pub link: Option<LinkStats>,
    /// The in-process learner's report.
    pub learner: Option<LearnerReport>,
    /// A real arm's bus timing and counters.
    pub arm: Option<reflex_hardware::robot::ArmReport>,
    /// The e-stop over the run.
    pub stop: StopReport,
    /// The frozen image encoder's maps, for a residual that sees.
    pub features: Option<FeatureReport>,
    /// The success classifier's verdicts, when it gave the run's reward (`[reward]`).
    pub reward: Option<reflex_adapters::reward::RewardCounts>,
    /// Messages refused, dropped or asked for again on the bus, per key (as in the status),
    /// keys with none left out: a remote robot's observations that did not fit its spec, the
    /// commands sent again because no observation answered them, a person's bad teleop.
    pub rejected: Vec<(String, u64)>,
}

/// How a residual that sees got its feature maps over a run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct FeatureReport {
    /// The encoder's identity (file name and digest).
    pub encoder: String,
    /// The loop's counters: steps with missing or stale maps, frames the inline encoder failed on,
    /// and how many frames behind the maps in use were at the end.
    pub r#loop: reflex_runtime::features::FeatureCounts,
    /// The encoder thread's counters (real time only): frames offered, encoded, skipped, failed.
    pub thread: Option<reflex_runtime::features::FeedCounts>,
}

/// What the e-stop did over a run.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct StopReport {
    /// `running`, `latched` or `paused` when the run ended.
    pub state: &'static str,
    /// E-stops raised.
    pub estops: u64,
    /// Who raised the last one.
    pub raised_by: String,
    /// Wall time of the last one, ns since the Unix epoch (0: none).
    pub last_raised_unix_ns: u64,
    /// Episodes an e-stop ended.
    pub episodes_stopped: u64,
    /// Ticks held latched.
    pub stopped_ticks: u64,
    /// Ticks held after a release, before a resume.
    pub paused_ticks: u64,
    /// A person's labels and resets refused while stopped.
    pub refused_while_stopped: u64,
    /// Moves to a start pose the e-stop cut short.
    pub resets_stopped: u64,
}

/// What the recorder wrote.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Recording {
    /// Directory of the episode files.
    pub dir: PathBuf,
    /// Steps recorded.
    pub steps_recorded: u64,
    /// Steps dropped (the recorder fell behind).
    pub steps_dropped: u64,
    /// Episode files written.
    pub episode_files: u64,
    /// Camera-frame sets dropped.
    pub frames_dropped: u64,
    /// Errors writing recordings (the loop never waits for them).
    pub write_errors: u64,
    /// Episode files cut short by a failed write (a full disk): kept as `episode_N.rrd.partial`,
    /// their summaries say `"complete": false`.
    pub episodes_incomplete: u64,
}

/// How long an actor in simulated time waits between episodes for a learner in another process
/// to catch up before it goes on without it.
const REMOTE_PACE_LIMIT: Duration = Duration::from_secs(120);

/// A running actor.
pub struct Actor<R: Robot> {
    lp: ControlLoop<R, Box<dyn Clock>>,
    parts: Parts,
    pace: bool,
    /// In simulated time, wait for room in the camera frames' pool before each step.
    pace_frames: bool,
    run_id: String,
    recording: bool,
    done: Vec<EpisodeSummary>,
    eval: Vec<EpisodeSummary>,
    t0: Instant,
    /// Print a line per episode through the progress sink (`reflex run`).
    pub episode_lines: bool,
    /// Asked from outside to end the run ([`Actor::stop_handle`]).
    stop: StopHandle,
    last_stop: (StopState, u64),
    /// The frozen encoder's identity (empty for a residual that does not see).
    encoder_id: String,
}

impl<R: Robot> Actor<R> {
    /// The run's id.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The control loop (its robot, counters, episodes).
    pub fn control_loop(&self) -> &ControlLoop<R, Box<dyn Clock>> {
        &self.lp
    }

    /// The e-stop the actor obeys.
    pub fn stop_switch(&self) -> Arc<StopSwitch> {
        self.lp.stop_switch().clone()
    }

    /// Ends [`Actor::run_episodes`] from another thread: `finish()` after the episode in
    /// progress (at once while the e-stop holds the robot), `stop_now()` at the next tick.
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// Obeys `handle` from now on (one shared with other work, or the signals' handle).
    pub fn set_stop_handle(&mut self, handle: StopHandle) {
        self.stop = handle;
    }

    /// Runs `n` more episodes. In simulated time with a learner, the actor lets the learner
    /// take every step so far before each episode (between episodes nothing waits on the robot),
    /// so training follows the data as it would at the robot's own pace. A learner that stopped
    /// ends the run at once with its error. While the e-stop holds the robot the loop keeps
    /// ticking (holding) and no episode counts; a finish request then ends the run at once.
    pub fn run_episodes(&mut self, n: u64, progress: &dyn Progress) -> Result<&[EpisodeSummary]> {
        progress.start(n, "episodes");
        let start = self.done.len();
        let mut seen = self.lp.episodes().len();
        self.pace_learner()?;
        let mut safety_before = self.lp.safety_counters();
        let mut version_before = self.lp.stats().residual_version;
        while ((self.done.len() - start) as u64) < n {
            if self.stop.now_asked() {
                tracing::warn!(
                    "asked to stop now: ending the run after {} episodes, the one in progress unfinished",
                    self.done.len() - start
                );
                break;
            }
            if self.stop.finish_asked() && !self.lp.in_episode() {
                tracing::info!("asked to stop while the robot is held: ending the run");
                break;
            }
            if self.pace && self.pace_frames {
                self.pace_frames();
            }
            self.lp.step()?;
            self.note_stop_change(progress);
            if self.lp.episodes().len() == seen {
                continue;
            }
            let new = self.lp.episodes()[seen..].to_vec();
            seen += new.len();
            for e in new {
                self.done.push(e);
                let ok = self.done[start..].iter().filter(|e| e.success).count();
                progress.message(&format!("{ok} ok"));
                if self.episode_lines {
                    progress.line(&self.episode_line(&safety_before, version_before));
                }
                progress.inc(1);
                safety_before = self.lp.safety_counters();
                version_before = self.lp.stats().residual_version;
            }
            if self.stop.finish_asked() {
                tracing::info!(
                    "asked to stop: ending the run after {} episodes",
                    self.done.len() - start
                );
                break;
            }
            if ((self.done.len() - start) as u64) < n {
                self.pace_learner()?;
            }
        }
        progress.finish();
        Ok(&self.done[start..])
    }

    /// A line for the person watching when the e-stop changes state.
    fn note_stop_change(&mut self, progress: &dyn Progress) {
        let sw = self.lp.stop_switch().clone();
        let now = (sw.state(), sw.raises());
        if now == self.last_stop {
            return;
        }
        self.last_stop = now;
        if !self.episode_lines {
            return;
        }
        let robot = &self.lp.robot().spec().name;
        let line = match now.0 {
            StopState::Latched => format!(
                "EMERGENCY STOP {} latched (raised by {}): the robot holds, no episode starts; release with `reflex estop release --robot {robot}`",
                now.1,
                sw.raised_by()
            ),
            StopState::Paused => format!(
                "e-stop released by {}: paused, nothing moves; resume with `reflex estop resume --robot {robot}`",
                sw.released_resumed_by().0
            ),
            StopState::Running => format!(
                "resumed by {}: the next episode starts",
                sw.released_resumed_by().1
            ),
        };
        progress.line(&line);
    }

    /// What a person watching wants after each episode: how it ended and who drove, the robot's
    /// own success over the last 20 episodes, takeovers, the weights in use and the learner's
    /// lag, loop timing, and the safety layer's clipping summarised (holds and e-stops are
    /// warned on their own).
    fn episode_line(
        &self,
        safety_before: &reflex_runtime::safety::SafetyCounters,
        version_before: u64,
    ) -> String {
        use reflex_runtime::safety::SafetyEvent;
        let Some(e) = self.done.last() else {
            return String::new();
        };
        let how = match (e.success, e.labelled, e.truncated) {
            _ if e.estop => "EMERGENCY STOP",
            (true, true, _) => "success (labelled)",
            (true, false, _) => "success",
            (false, true, _) => "failure (labelled)",
            (false, false, true) => "time limit",
            (false, false, false) => "failure",
        };
        let recent = &self.done[self.done.len().saturating_sub(20)..];
        let alone = recent
            .iter()
            .filter(|e| e.success && e.interventions == 0)
            .count();
        let st = self.lp.stats();
        let mut line = format!(
            "episode {:>4}: {how:<18} {:>4} steps | robot alone {alone}/{} of the last {} | takeovers {}",
            e.episode,
            e.steps,
            recent.len(),
            recent.len(),
            e.interventions
        );
        if e.interventions > 0 {
            line.push_str(&format!(" ({} steps)", e.intervention_steps));
        }
        if self.parts.link_progress.is_some() || st.residual_version > 0 {
            line.push_str(&format!(
                " | weights v{} (+{})",
                st.residual_version,
                st.residual_version.saturating_sub(version_before)
            ));
            if let Some((offered, received)) = self.link_progress() {
                line.push_str(&format!(
                    ", learner {} steps behind",
                    offered.saturating_sub(received)
                ));
            }
        }
        line.push_str(&format!(
            " | lateness p99 {:.0} us",
            st.lateness.percentile(99.0).as_secs_f64() * 1e6
        ));
        let now = self.lp.safety_counters();
        let acted: Vec<String> = SafetyEvent::ALL
            .iter()
            .enumerate()
            .filter_map(|(i, k)| {
                let d = now.0[i].saturating_sub(safety_before.0[i]);
                (d > 0).then(|| format!("{} {d}", k.name()))
            })
            .collect();
        if !acted.is_empty() {
            line.push_str(&format!(" | safety: {}", acted.join(", ")));
        }
        line
    }

    /// Runs `n` more episodes with the learner's deterministic action (its mean, no exploration
    /// noise), kept apart from the training episodes in the report's `eval`.
    pub fn evaluate(&mut self, n: u64, progress: &dyn Progress) -> Result<&[EpisodeSummary]> {
        self.lp.set_residual_explore(false);
        let start = self.done.len();
        let r = self.run_episodes(n, progress).map(|_| ());
        self.lp.set_residual_explore(true);
        r?;
        self.eval.extend_from_slice(&self.done[start..]);
        self.done.truncate(start);
        Ok(&self.eval)
    }

    /// Simulated time only: waits, before the loop's next tick, until the camera frames' pool
    /// has room for this step's frames and an episode's last, so the recording and the step log
    /// keep every frame handed out (in real time the loop never waits: a full pool is a counted
    /// drop). Bounded: a consumer that stops returning buffers for [`FRAME_PACE_LIMIT`] is not
    /// waited for again in this run; it costs drops, not a hung run.
    fn pace_frames(&mut self) {
        let Some(pool) = self.lp.frame_pool() else {
            return;
        };
        let t0 = Instant::now();
        while pool.free() < 2 {
            if t0.elapsed() > FRAME_PACE_LIMIT {
                tracing::warn!(
                    "the camera frames' consumer has held every buffer for {FRAME_PACE_LIMIT:?}; \
                     going on without waiting for it (frames it misses are counted as dropped)"
                );
                self.pace_frames = false;
                return;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    fn pace_learner(&mut self) -> Result<()> {
        // Paced or not (a person's wall-clock run is not), a stopped in-process learner ends the
        // run at this episode boundary instead of letting the robot go on for nothing.
        if self.parts.learner.as_ref().is_some_and(|h| h.is_finished()) {
            return Err(self.learner_stopped());
        }
        let (Some(p), Some(ob)) = (&self.parts.link_progress, self.lp.outbox()) else {
            return Ok(());
        };
        if !self.pace {
            return Ok(());
        }
        let (sent, t0) = (ob.sent(), Instant::now());
        let p = p.clone();
        while p.received.load(Ordering::Relaxed) < sent {
            if self.parts.learner.as_ref().is_some_and(|h| h.is_finished()) {
                return Err(self.learner_stopped());
            }
            if self.parts.learner.is_none() && t0.elapsed() > REMOTE_PACE_LIMIT {
                tracing::warn!(
                    "the learner on the bus has not taken the last {} steps within {:?}; going on without it (they stay queued for it)",
                    sent - p.received.load(Ordering::Relaxed),
                    REMOTE_PACE_LIMIT
                );
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }

    /// Messages rejected so far per key the actor reads (as in its status); empty without a bus.
    pub fn rejected(&self) -> Vec<(String, u64)> {
        self.parts
            .rejects
            .iter()
            .map(|r| (r.key().to_string(), r.count()))
            .collect()
    }

    /// Stops the in-process learner (it checkpoints what it holds) and starts a new one, which
    /// resumes from that checkpoint; the link resends what the new one lacks. Returns the old
    /// one's report. For fault drills (`reflex soak`) and restarts after a configuration change.
    pub fn restart_learner(&mut self) -> Result<LearnerReport> {
        let Some((session, cfg)) = self.parts.learner_restart.clone() else {
            return Err(AgentError::setup(
                "restart_learner",
                "this actor has no in-process learner",
            ));
        };
        self.parts.learner_stop.store(true, Ordering::Relaxed);
        let report = match self.parts.learner.take().map(|h| h.join()) {
            Some(Ok(r)) => r?,
            Some(Err(_)) => return Err(AgentError::setup("the in-process learner", "it panicked")),
            None => {
                return Err(AgentError::setup(
                    "the in-process learner",
                    "it is not running",
                ));
            }
        };
        let stop = Arc::new(AtomicBool::new(false));
        self.parts.learner = Some(spawn_learner(session, cfg, stop.clone()));
        self.parts.learner_stop = stop;
        Ok(report)
    }

    /// Runs `n` ticks of the loop (no episode accounting; for drills and benchmarks).
    pub fn run_ticks(&mut self, n: u64) -> Result<()> {
        Ok(self.lp.run_ticks(n)?)
    }

    /// The link to the learner's counters so far (steps sent, persisted, weights), if learning.
    pub fn link_progress(&self) -> Option<(u64, u64)> {
        let p = self.parts.link_progress.as_ref()?;
        Some((
            p.offered.load(Ordering::Relaxed),
            p.received.load(Ordering::Relaxed),
        ))
    }

    /// The in-process learner ended while the actor needs it: its error, or a plain statement.
    fn learner_stopped(&mut self) -> AgentError {
        match self.parts.learner.take().map(|h| h.join()) {
            Some(Ok(Err(e))) => e,
            Some(Err(_)) => AgentError::setup("the in-process learner", "it panicked"),
            _ => AgentError::setup("the in-process learner", "it stopped before the run ended"),
        }
    }

    /// Stops the threads, drains the recorder and the learner link, returns the report.
    pub fn finish(mut self) -> Result<RunReport> {
        let wall_s = self.t0.elapsed().as_secs_f64();
        // The tap drains the link first (the learner persists the last steps), then the learner
        // stops.
        let tap = self.parts.tap.take().map(|t| (t.dir.clone(), t.finish()));
        self.parts.learner_stop.store(true, Ordering::Relaxed);
        let learner = match self.parts.learner.take().map(|h| h.join()) {
            Some(Ok(r)) => Some(r?),
            Some(Err(_)) => return Err(AgentError::setup("the in-process learner", "it panicked")),
            None => None,
        };
        let (mut recording, mut traced, mut link) = (None, 0, None);
        if let Some((dir, r)) = tap {
            traced = r.traced;
            link = r.link.clone();
            if self.recording {
                recording = Some(Recording {
                    dir,
                    steps_recorded: r.recorded,
                    steps_dropped: r.dropped,
                    episode_files: r.episodes,
                    frames_dropped: r.frames_dropped,
                    write_errors: r.write_errors,
                    episodes_incomplete: r.incomplete,
                });
            }
        }
        let sw = self.lp.stop_switch().clone();
        let st = self.lp.stats();
        let stop = StopReport {
            state: sw.state().as_str(),
            estops: sw.raises(),
            raised_by: sw.raised_by(),
            last_raised_unix_ns: sw.last_raised_unix_ns(),
            episodes_stopped: self
                .done
                .iter()
                .chain(&self.eval)
                .filter(|e| e.estop)
                .count() as u64,
            stopped_ticks: st.stopped_ticks,
            paused_ticks: st.paused_ticks,
            refused_while_stopped: st.refused_while_stopped,
            resets_stopped: st.resets_stopped,
        };
        Ok(RunReport {
            stop,
            rejected: self
                .rejected()
                .into_iter()
                .filter(|(_, n)| *n > 0)
                .collect(),
            run_id: self.run_id.clone(),
            episodes: std::mem::take(&mut self.done),
            eval: std::mem::take(&mut self.eval),
            wall_s,
            stats: self.lp.stats().clone(),
            safety: self.lp.safety_counters(),
            recording,
            traced,
            link,
            learner,
            arm: None,
            reward: None,
            features: self.lp.features().map(|f| {
                let (r#loop, thread) = f.counts();
                FeatureReport {
                    encoder: self.encoder_id.clone(),
                    r#loop,
                    thread,
                }
            }),
        })
    }
}

/// How `reflex run` runs a config, besides the file.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Endpoints and Zenoh settings added to the file's `[bus]`.
    pub bus: BusConfig,
    /// Episodes (default `[run] episodes`).
    pub episodes: Option<u64>,
    /// Record episodes under this directory.
    pub record: Option<PathBuf>,
    /// Live viewer.
    pub live: Live,
    /// Trace rate for `reflex viz`, Hz (default `[bus] trace_hz`).
    pub trace_hz: Option<f64>,
    /// Print a line per episode through the progress sink (what `reflex run` shows).
    pub episode_lines: bool,
    /// Ends the run from outside (SIGTERM from systemd, Ctrl-C: [`crate::signals`]): finish
    /// after the episode in progress (it is recorded and its steps reach the learner), or stop
    /// at the next tick.
    pub stop: Option<StopHandle>,
}

/// How ONNX Runtime runs the config's models (the base policy, and a frozen image encoder
/// beside it).
fn onnx_options(cfg: &RunConfig) -> reflex_policies::onnx_policy::RunOptions {
    reflex_policies::onnx_policy::RunOptions {
        provider: cfg.policy.provider.clone(),
        intra_threads: cfg.policy.intra_threads,
        seed: cfg.policy.seed,
        execute: cfg.policy.execute,
    }
}

/// Builds the policy a config names, for a robot with `spec`.
pub fn make_policy(cfg: &RunConfig, spec: &RobotSpec) -> Result<Option<Box<dyn Policy>>> {
    Ok(match cfg.policy.kind {
        PolicyKind::None => None,
        PolicyKind::Onnx => {
            let model =
                cfg.policy.model.clone().ok_or_else(|| {
                    AgentError::setup("[policy]", "kind = \"onnx\" needs `model`")
                })?;
            let mut p =
                reflex_policies::onnx_policy::OnnxPolicy::load(&model, spec, &onnx_options(cfg))?;
            if cfg.policy.rtc.enabled {
                if p.spec().kind == reflex_policies::spec::PolicyKind::Chunk {
                    return Err(AgentError::setup(
                        "[policy.rtc]",
                        format!(
                            "`{}` is a chunk policy (one call, no sampler), so there is nothing to inpaint: set `enabled = false`, or use a diffusion or flow model",
                            model.display()
                        ),
                    ));
                }
                let guided = p.spec().kind == reflex_policies::spec::PolicyKind::Flow
                    && p.has_vjp()
                    && cfg.policy.rtc.guidance;
                tracing::info!(
                    "real-time chunking on `{}`: {}",
                    model.display(),
                    if guided {
                        "guided by the velocity's VJP graph (the paper's method)"
                    } else if p.spec().kind == reflex_policies::spec::PolicyKind::Flow {
                        "hard inpainting (no VJP graph beside the model, or guidance = false)"
                    } else {
                        "hard inpainting (a diffusion policy's DDIM)"
                    }
                );
                p.set_rtc(cfg.policy.rtc.clone());
            }
            Some(Box::new(p))
        }
        #[cfg(not(feature = "sim"))]
        PolicyKind::Expert => return Err(without_sim("[policy] kind = \"expert\"")),
        #[cfg(feature = "sim")]
        PolicyKind::Expert => Some(Box::new(
            reflex_sim::expert::ExpertPolicy::new(
                spec,
                cfg.policy.noise,
                cfg.policy.seed,
                cfg.policy.chunk_len,
            )
            .map_err(|e| {
                AgentError::setup(
                    "[policy] kind = \"expert\"",
                    format!("{e} (the expert drives the simulator's tasks only)"),
                )
            })?,
        )),
    })
}

/// The kept residual of `[policy.residual]`, checked against the robot, the base policy and
/// (with ONNX Runtime) its own graph; `None` without one.
pub fn load_residual(cfg: &RunConfig, spec: &RobotSpec) -> Result<Option<KeptResidual>> {
    use reflex_learn::sac::export::{ResidualMode, ResidualModel};
    let Some(r) = &cfg.policy.residual else {
        return Ok(None);
    };
    let m = ResidualModel::load(&r.model)?;
    let file = r.model.display().to_string();
    let unfit =
        |message: String| AgentError::setup(format!("[policy.residual] model `{file}`"), message);
    match (m.spec.mode, cfg.policy.kind) {
        (ResidualMode::Residual, PolicyKind::Onnx) => {
            let base = cfg
                .policy
                .model
                .as_ref()
                .and_then(|p| p.file_name())
                .map(|f| f.to_string_lossy().into_owned());
            if let Some(want) = &m.spec.base_model
                && base.as_deref() != Some(want.as_str())
            {
                return Err(unfit(format!(
                    "was trained on the base `{want}`, but [policy] model is `{}`: a residual corrects one base policy; run it on that one",
                    base.unwrap_or_default()
                )));
            }
        }
        (ResidualMode::Full, PolicyKind::None) => {}
        (mode, kind) => {
            return Err(unfit(format!(
                "is a {mode:?} file and [policy] kind is {kind:?}: a residual runs on kind = \"onnx\" (its base), a full-mode file on kind = \"none\""
            )));
        }
    }
    if m.spec.state_dim != spec.state_dim() || m.spec.action_dim != spec.action.dim() {
        return Err(unfit(format!(
            "takes {} state values and {} actions; robot `{}` has {} and {}",
            m.spec.state_dim,
            m.spec.action_dim,
            spec.name,
            spec.state_dim(),
            spec.action.dim()
        )));
    }
    let same = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= 1e-6 * x.abs().max(1.0))
    };
    if !same(&m.spec.action_low, &spec.action.low) || !same(&m.spec.action_high, &spec.action.high)
    {
        return Err(unfit(format!(
            "was made for action bounds {:?}..{:?}; robot `{}` has {:?}..{:?}",
            m.spec.action_low, m.spec.action_high, spec.name, spec.action.low, spec.action.high
        )));
    }
    let gap = m.check_with_ort(32, 0)?;
    if gap > 1e-4 {
        return Err(unfit(format!(
            "its graph and its weights disagree by {gap:.2e} (ONNX Runtime against reflex's evaluation): the file was changed after export; export it again"
        )));
    }
    tracing::info!(
        "kept residual `{file}` ({:?} mode, hidden {:?}); ONNX Runtime agrees within {gap:.1e}",
        m.spec.mode,
        m.spec.hidden
    );
    let encoder = match &m.spec.vision {
        None => None,
        Some(v) => Some(residual_encoder(r, v, &cfg.policy.model, &file)?),
    };
    Ok(Some(KeptResidual {
        hook: m.hook(),
        encoder,
    }))
}

/// A kept residual ready for the loop, with the encoder file its image heads read.
pub struct KeptResidual {
    /// The hook.
    pub hook: ResidualMlp,
    /// The frozen encoder (a residual that sees), checked to be the one it was trained with.
    pub encoder: Option<PathBuf>,
}

/// The encoder a residual with image heads was trained with: `[policy.residual] encoder`, else
/// the file of that name beside the residual or the base model; its bytes must be the same.
fn residual_encoder(
    r: &crate::config::ResidualSection,
    v: &reflex_learn::sac::VisionHeads,
    base: &Option<PathBuf>,
    file: &str,
) -> Result<PathBuf> {
    let name = v.encoder_id.split('#').next().unwrap_or_default();
    let candidates: Vec<PathBuf> = match &r.encoder {
        Some(p) => vec![p.clone()],
        None => [Some(r.model.as_path()), base.as_deref()]
            .into_iter()
            .flatten()
            .filter_map(|p| p.parent())
            .map(|d| d.join(name))
            .collect(),
    };
    for c in &candidates {
        if let Ok(bytes) = std::fs::read(c) {
            let id = reflex_policies::features::encoder_id(c, &bytes);
            if id == v.encoder_id {
                return Ok(c.clone());
            }
            if r.encoder.is_some() {
                return Err(AgentError::setup(
                    "[policy.residual] encoder",
                    format!(
                        "`{}` is `{id}`, but residual `{file}` was trained on maps of `{}`: name that file",
                        c.display(),
                        v.encoder_id
                    ),
                ));
            }
        }
    }
    Err(AgentError::setup(
        format!("[policy.residual] model `{file}`"),
        format!(
            "it sees through the frozen encoder `{}`, found in none of {:?}: set [policy.residual] encoder to that file",
            v.encoder_id, candidates
        ),
    ))
}

/// Repeats a warning every `every` (the first at once) until dropped.
pub struct Nag {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Nag {
    /// Starts warning `message`.
    pub fn start(message: String, every: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("warn".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    tracing::warn!("{message}");
                    let t0 = Instant::now();
                    while t0.elapsed() < every && !s.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            })
            .expect("spawn the warning thread");
        Nag {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Nag {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Refuses a real arm on a bus without TLS unless `[bus] insecure = true`; with it, a warning
/// now and every minute while the returned guard lives.
pub fn check_arm_bus(cfg: &RunConfig, bus: &BusConfig) -> Result<Option<Nag>> {
    match cfg.insecure_arm_bus(bus) {
        None => Ok(None),
        Some(why) if !cfg.bus.insecure => Err(AgentError::setup("[bus]", why)),
        Some(_) => Ok(Some(Nag::start(
            format!(
                "INSECURE: robot `{}` is a real arm on a bus without TLS ([bus] insecure = true): anyone on the network can take it over, reset it or release its e-stop",
                cfg.robot_name()
            ),
            Duration::from_secs(60),
        ))),
    }
}

/// `robot` with its cameras renamed by `[robot.cameras]` (checked against it here), judged by
/// the success classifier of `[reward]`, if the config has one: inline in simulated time, on its
/// own thread in real time; unchanged otherwise.
pub fn with_reward<R: Robot>(
    robot: R,
    cfg: &RunConfig,
) -> Result<reflex_adapters::reward::ClassifiedReward<reflex_adapters::cameras::CamerasRenamed<R>>>
{
    // The cameras under the names the classifier, the policy and the encoder read.
    let robot = reflex_adapters::cameras::CamerasRenamed::new(robot, &cfg.robot.cameras)
        .map_err(|e| crate::AgentError::setup("[robot.cameras]", e.0))?;
    let Some(r) = &cfg.reward else {
        return Ok(reflex_adapters::reward::ClassifiedReward::passthrough(
            robot,
        ));
    };
    judged_by(
        robot,
        &r.classifier,
        r.threshold,
        r.consecutive_frames,
        cfg.run.clock == ClockKind::Sim,
        r.max_age_frames,
        &onnx_options(cfg),
    )
}

/// `robot` judged by the success classifier in file `classifier`: success at `threshold` (default
/// the classifier's own, from its spec) for `consecutive_frames` frames in a row, judged inline
/// or on the classifier's own thread (verdicts more than `max_age` frames old unused). A
/// classifier reading a camera the robot lacks is refused.
pub fn judged_by<R: Robot>(
    robot: R,
    classifier: &std::path::Path,
    threshold: Option<f32>,
    consecutive_frames: u32,
    inline: bool,
    max_age: u32,
    opts: &reflex_policies::onnx_policy::RunOptions,
) -> Result<reflex_adapters::reward::ClassifiedReward<R>> {
    use reflex_adapters::reward::{ClassifiedReward, RewardRule};
    let c = reflex_policies::reward::SuccessClassifier::load(classifier, opts)?;
    let spec = robot.spec();
    for cam in c.cameras() {
        if !spec.cameras.iter().any(|k| k.name == cam) {
            return Err(AgentError::setup(
                format!("[reward] classifier `{}`", classifier.display()),
                format!(
                    "it reads camera `{cam}`, which robot `{}` does not have (cameras: {:?}; a simulator's need [sim.cameras] enabled = true; one under another name is mapped in [robot.cameras])",
                    spec.name,
                    spec.cameras.iter().map(|k| &k.name).collect::<Vec<_>>()
                ),
            ));
        }
    }
    let rule = RewardRule {
        threshold: threshold.unwrap_or(c.spec().threshold),
        consecutive_frames,
    };
    tracing::info!(
        "reward: classifier `{}`, success at p >= {} for {} frame(s) in a row",
        classifier.display(),
        rule.threshold,
        rule.consecutive_frames
    );
    let driver = FeatureDriver::start(Box::new(c), inline, &obs_template(spec).images, max_age)
        .map_err(|e| AgentError::setup("the reward classifier's thread", e.to_string()))?;
    Ok(ClassifiedReward::new(robot, driver, rule))
}

/// The simulator of `[sim]`, named by `[robot] name`.
#[cfg(feature = "sim")]
fn sim_robot(cfg: &RunConfig) -> Result<reflex_sim::SimEnv> {
    let mut sim = cfg
        .sim
        .clone()
        .ok_or_else(|| AgentError::setup("[robot] source = \"sim\"", "needs a [sim] table"))?;
    if let Some(n) = &cfg.robot.name {
        sim.robot = n.clone();
    }
    Ok(reflex_sim::SimEnv::new(sim)?)
}

/// Runs a run config to the end: what `reflex run --config F` does.
pub fn run_config(cfg: &RunConfig, o: &RunOptions, progress: &dyn Progress) -> Result<RunReport> {
    let _insecure = check_arm_bus(cfg, &o.bus)?;
    let use_bus = cfg.uses_bus(&o.bus);
    let session = if use_bus {
        Some(cfg.bus_config(&o.bus).open()?)
    } else {
        None
    };
    let episodes = o.episodes.unwrap_or(cfg.run.episodes);
    match cfg.robot.source {
        #[cfg(not(feature = "sim"))]
        RobotSource::Sim => Err(without_sim("[robot] source = \"sim\"")),
        #[cfg(feature = "sim")]
        RobotSource::Sim => drive(
            ActorBuilder::new(with_reward(sim_robot(cfg)?, cfg)?),
            Some(reflex_tabletop::ArmModel::so101().chain),
            cfg,
            session,
            o,
            episodes,
            progress,
        ),
        RobotSource::Remote => {
            let name = cfg.robot_name();
            let s = session.as_ref().expect("remote robots use the bus");
            let mut robot = RemoteRobot::connect(
                s,
                &name,
                Duration::from_secs_f64(cfg.robot.timeout_ms / 1e3),
            )?;
            if let Some(ms) = cfg.robot.resend_ms {
                robot.set_resend_after(Duration::from_secs_f64(ms / 1e3));
            }
            if cfg.run.clock == ClockKind::Sim && !robot.spec().lockstep {
                return Err(AgentError::setup(
                    "[run] clock = \"sim\"",
                    format!(
                        "simulated time needs a lockstep robot; `{name}` runs on its own clock: use clock = \"wall\""
                    ),
                ));
            }
            let (rejects, dropped, resent) = (robot.rejects(), robot.dropped(), robot.resent());
            let b = ActorBuilder::new(with_reward(robot, cfg)?)
                .count_rejects(rejects)
                .count_rejects(dropped)
                .count_rejects(resent);
            drive(b, None, cfg, session, o, episodes, progress)
        }
        RobotSource::So101 | RobotSource::Koch => {
            let arm_cfg = cfg.arm.as_ref().ok_or_else(|| {
                AgentError::setup("[robot] source", "a real arm needs an [arm] table")
            })?;
            if cfg.run.clock == ClockKind::Sim {
                return Err(AgentError::setup(
                    "[run] clock = \"sim\"",
                    "a real arm runs on its own clock: use clock = \"wall\"",
                ));
            }
            let kind = match cfg.robot.source {
                RobotSource::So101 => reflex_hardware::arm::ArmKind::So101Follower,
                _ => reflex_hardware::arm::ArmKind::KochFollower,
            };
            let mut robot =
                reflex_hardware::robot::ArmRobot::open(kind, &cfg.robot_name(), arm_cfg)?;
            robot.set_on_exit(cfg.robot.on_exit);
            let handle = robot.report_handle();
            let monitors = robot.camera_monitors();
            let chain = (kind == reflex_hardware::arm::ArmKind::So101Follower)
                .then(|| reflex_tabletop::ArmModel::so101().chain);
            let mut builder = ActorBuilder::new(with_reward(robot, cfg)?);
            if !monitors.is_empty() {
                builder = builder.camera_figures(Box::new(move || {
                    monitors
                        .iter()
                        .map(|m| {
                            let s = m.stats();
                            reflex_contracts::msg::CameraFigures {
                                name: s.name,
                                frames: s.frames,
                                fps: s.fps,
                                used: s.used,
                                skipped: s.skipped,
                                errors: s.errors,
                                age_at_use_ms: s.age_at_use_ms,
                            }
                        })
                        .collect()
                }));
            }
            let mut report = drive(builder, chain, cfg, session, o, episodes, progress)?;
            report.arm = handle.lock().ok().and_then(|g| g.clone());
            Ok(report)
        }
    }
}

fn drive<R: Robot + 'static>(
    b: ActorBuilder<reflex_adapters::reward::ClassifiedReward<R>>,
    default_chain: Option<Chain>,
    cfg: &RunConfig,
    session: Option<zenoh::Session>,
    o: &RunOptions,
    episodes: u64,
    progress: &dyn Progress,
) -> Result<RunReport> {
    let policy = make_policy(cfg, b.robot.spec())?;
    let chain = match &cfg.robot.urdf {
        Some(p) => Some(Chain::from_urdf_file(p, "base", "tcp")?),
        None => default_chain,
    };
    let clock = match cfg.run.clock {
        ClockKind::Sim => ClockChoice::Sim,
        ClockKind::Wall => ClockChoice::Wall {
            spin: Duration::from_secs_f64(cfg.loop_.as_ref().map_or(50.0, |l| l.spin_us) / 1e6),
        },
    };
    let mut b = b
        .clock(clock)
        .safety(cfg.safety.clone())
        .chain(chain)
        .seed(cfg.run.seed)
        .live(o.live.clone())
        .trace_hz(o.trace_hz.unwrap_or(cfg.bus.trace_hz));
    if let Some(r) = cfg.ros2.as_ref().filter(|r| r.enabled) {
        let c = r
            .config(b.robot.spec().name.as_str())
            .map_err(|e| AgentError::setup("[ros2]", e))?;
        b = b.ros2(c);
    }
    if let Some(p) = policy {
        b = b.policy(p);
    }
    let opts = onnx_options(cfg);
    if let Some(k) = load_residual(cfg, b.robot.spec())? {
        b = b.residual_model(k.hook);
        if let Some(e) = k.encoder {
            b = b.encoder(FeatureEncoder::load(&e, &opts)?, DEFAULT_MAP_AGE);
        }
    }
    if let Some(v) = cfg.learner.as_ref().and_then(|l| l.vision.as_ref()) {
        // The encoder runs where the base policy runs, with its execution provider.
        b = b.encoder(
            FeatureEncoder::load(&v.encoder, &opts)?,
            v.max_map_age_frames,
        );
    }
    if let Some(l) = cfg.loop_.clone() {
        b = b.loop_config(l);
    }
    if let Some(s) = session {
        b = b.bus(s);
    }
    if let Some(r) = &o.record {
        b = b.record(r.clone()).record_limits(cfg.run.record_limits());
    }
    if let Some(l) = &cfg.learner {
        b = b.learner(LearnerSetup {
            section: l.clone(),
            base_model: cfg.policy.model.clone(),
        });
        if cfg.run.clock == ClockKind::Sim && !l.pace_lockstep {
            tracing::info!("the learner is not paced: the actor may run ahead of it");
        }
    }
    let mut actor = b.build()?;
    if cfg.learner.as_ref().is_some_and(|l| !l.pace_lockstep) {
        actor.pace = false;
    }
    actor.episode_lines = o.episode_lines;
    if let Some(h) = &o.stop {
        actor.set_stop_handle(h.clone());
    }
    actor.run_episodes(episodes, progress)?;
    if cfg.run.eval_episodes > 0 {
        actor.evaluate(cfg.run.eval_episodes, progress)?;
    }
    let reward = actor.control_loop().robot().counts();
    let mut report = actor.finish()?;
    report.reward = reward;
    Ok(report)
}

/// The recorder of a run that records or shows itself live, and where its files go.
fn recorder_of<R: Robot + 'static>(
    b: &ActorBuilder<R>,
    spec: &RobotSpec,
    run_id: &str,
) -> Result<Option<(Arc<reflex_record::Recorder>, PathBuf)>> {
    Ok(if b.record.is_some() || b.live != Live::Off {
        // Files only with a records directory; a live view alone writes nothing.
        let dir = b.record.as_ref().map(|r| r.join(run_id).join("episodes"));
        Some((
            Arc::new(make_recorder(dir.clone(), b.live.clone(), spec, true)?),
            dir.unwrap_or_default(),
        ))
    } else {
        None
    })
}

/// The ROS 2 node and the robot's topics, when `[ros2]` asks for them (on the actor's bus).
fn ros2_of<R: Robot + 'static>(
    b: &mut ActorBuilder<R>,
    spec: &RobotSpec,
    keys: &Keys,
) -> Result<Option<(reflex_ros2::Ros2Node, reflex_ros2::RobotTopics)>> {
    Ok(match (&b.ros2, &b.session) {
        (Some(cfg), Some(s)) => {
            let (node, topics) = reflex_ros2::start(s, cfg, spec, keys, b.stop.clone())?;
            b.rejects.extend(node.rejects.iter().cloned());
            Some((node, topics))
        }
        (Some(_), None) => {
            return Err(AgentError::setup(
                "[ros2]",
                "ROS 2 runs on the bus: give the actor a session (`[bus] enabled = true`)",
            ));
        }
        (None, _) => None,
    })
}

/// What a robot build (`--no-default-features`: no simulator) says when a config asks for it.
#[cfg(not(feature = "sim"))]
fn without_sim(key: &str) -> AgentError {
    AgentError::setup(
        key,
        "this reflex is the robot build, without the simulator (feature `sim`): run the \
         simulator from a workstation build (`reflex sim serve`) and connect to it with \
         [robot] source = \"remote\", or use a real arm",
    )
}
