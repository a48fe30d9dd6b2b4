//! `reflex run --config FILE`: the actor. Runs the control loop against the robot named in the
//! config (the in-process simulator, or any robot on the bus) with the chosen policy.

use crate::cli::{BusArgs, progress};
use anyhow::{Context, bail};
use clap::Args;
use reflex_runtime::bus::{BusConfig, Keys, RemoteRobot};
use reflex_runtime::clock::{Clock, SimClock, WallClock};
use reflex_runtime::config::{Invalid, Validate, in_range, key};
use reflex_runtime::control::{ControlLoop, EpisodeSummary, LoopConfig, PolicyDriver};
use reflex_runtime::msg::{EpisodeEvent, EventKind, Image, Observation};
use reflex_runtime::policy::{Policy, PolicyThread};
use reflex_runtime::robot::Robot;
use reflex_runtime::safety::{SafetyConfig, SafetyEvent};
use reflex_sim::expert::ExpertPolicy;
use reflex_sim::{SimConfig, SimEnv};
use serde::Deserialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use zenoh::Wait;

#[derive(Args)]
pub struct RunArgs {
    /// The actor's TOML config (see configs/run/).
    #[arg(long)]
    config: PathBuf,
    /// Episodes to run (overrides `[run] episodes`).
    #[arg(long)]
    episodes: Option<u64>,
    /// Print a JSON summary.
    #[arg(long)]
    json: bool,
    /// Record every episode to RUNS/<run-id>/episodes/episode_NNNNNN.rrd.
    #[arg(long, value_name = "RUNS")]
    record: Option<PathBuf>,
    /// Live view: off, spawn (start a viewer), connect or connect=ADDR (a running viewer).
    #[arg(long, default_value = "off")]
    rerun: String,
    /// Rate of the step trace on the bus for `reflex viz`, Hz (0: off; default `[bus] trace_hz`).
    #[arg(long, value_name = "HZ")]
    trace_hz: Option<f64>,
    #[command(flatten)]
    bus: BusArgs,
}

/// A recorder for `spec` writing episodes to `dir` (and to a live viewer), with the arm drawn
/// from the simulator's URDF for simulated robots.
pub fn make_recorder(
    dir: Option<PathBuf>,
    live: reflex_runtime::recorder::Live,
    spec: &reflex_runtime::msg::RobotSpec,
    count_gaps: bool,
) -> anyhow::Result<reflex_runtime::recorder::Recorder> {
    let urdf =
        urdf_rs::read_from_string(reflex_sim::world::ARM_URDF).map_err(anyhow::Error::msg)?;
    let arm = spec.kind.starts_with("sim/").then(|| {
        (
            reflex_sim::world::ArmModel::so101().chain,
            reflex_runtime::recorder::link_shapes(&urdf),
        )
    });
    let object_half_m = if spec.kind == "sim/insert" {
        0.01
    } else {
        0.015
    };
    Ok(reflex_runtime::recorder::Recorder::spawn(
        reflex_runtime::recorder::RecorderConfig {
            files: dir.is_some(),
            dir: dir.unwrap_or_default(),
            live,
            queue: 4096,
            spec: spec.clone(),
            arm,
            object_half_m,
            throttle: None,
            count_gaps,
        },
    )?)
}

/// What the loop's outbox feeds, off the loop's thread: the episode recorder and the bus trace
/// for `reflex viz`. One thread drains the outbox (and the camera frames) and hands each step to
/// both; neither can hold the loop up.
pub struct RecordingTap {
    /// The recorder, when recording.
    pub recorder: Option<Arc<reflex_runtime::recorder::Recorder>>,
    stop: Arc<AtomicBool>,
    thread:
        Option<std::thread::JoinHandle<(u64, u64, Option<reflex_runtime::learnlink::LinkStats>)>>,
    /// Directory of the episode files.
    pub dir: PathBuf,
}

/// What a [`RecordingTap`] did.
#[derive(Clone, Debug, Default)]
pub struct TapReport {
    /// Steps recorded.
    pub recorded: u64,
    /// Steps the recorder dropped.
    pub dropped: u64,
    /// Episode files written.
    pub episodes: u64,
    /// Steps published on the bus trace.
    pub traced: u64,
    /// Camera-frame sets dropped (the frame pool was empty, or the recorder behind).
    pub frames_dropped: u64,
    /// The learner link's counters, when learning.
    pub link: Option<reflex_runtime::learnlink::LinkStats>,
}

impl RecordingTap {
    /// Starts a recorder for `spec` under `runs/<run_id>/episodes` and a thread that feeds it from `rx`.
    pub fn start(
        runs: &std::path::Path,
        run_id: &str,
        live: reflex_runtime::recorder::Live,
        spec: &reflex_runtime::msg::RobotSpec,
        rx: reflex_runtime::outbox::OutboxReceiver,
    ) -> anyhow::Result<Self> {
        let dir = runs.join(run_id).join("episodes");
        let rec = make_recorder(Some(dir.clone()), live, spec, true)?;
        Ok(Self::with(Some(Arc::new(rec)), dir, None, None, rx, None))
    }

    /// The general form: any of a recorder, a trace publisher and a frame source.
    pub fn with(
        recorder: Option<Arc<reflex_runtime::recorder::Recorder>>,
        dir: PathBuf,
        mut trace: Option<reflex_runtime::viz::TracePublisher>,
        mut link: Option<reflex_runtime::learnlink::ActorLink>,
        rx: reflex_runtime::outbox::OutboxReceiver,
        frames: Option<reflex_runtime::outbox::OutboxReceiver<reflex_runtime::outbox::Frames>>,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (r, s) = (recorder.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("outbox".into())
            .spawn(move || {
                // Frames of step k are sent just before transition k; they are passed on in that
                // order, never ahead of an earlier step's transition (a frame of the next episode
                // must not close the current one early).
                let mut held: Option<Box<reflex_runtime::outbox::Frames>> = None;
                let mut frames_up_to = |upto: Option<(u64, u32)>| {
                    let (Some(fr), Some(r)) = (&frames, &r) else {
                        return;
                    };
                    loop {
                        let Some(f) = held.take().or_else(|| fr.try_recv()) else {
                            return;
                        };
                        if upto.is_some_and(|k| (f.episode, f.step) > k) {
                            held = Some(f);
                            return;
                        }
                        r.record_frames(&f);
                        fr.recycle(f);
                    }
                };
                let mut handle = |t: Option<Box<reflex_runtime::outbox::Transition>>| {
                    let Some(t) = t else {
                        if let Some(l) = &mut link {
                            l.tick();
                        }
                        return;
                    };
                    frames_up_to(Some((t.episode, t.step)));
                    if let Some(r) = &r {
                        r.record(&t);
                    }
                    if let Some(p) = &mut trace {
                        p.offer(&t);
                    }
                    if let Some(l) = &mut link {
                        l.offer(&t);
                    }
                    rx.recycle(t);
                };
                loop {
                    match rx.recv_timeout(Duration::from_millis(20)) {
                        Some(t) => handle(Some(t)),
                        None if s.load(Ordering::Relaxed) => {
                            while let Some(t) = rx.try_recv() {
                                handle(Some(t));
                            }
                            break;
                        }
                        None => {}
                    }
                    handle(None);
                }
                let pool_drops = frames.as_ref().map_or(0, |f| f.dropped());
                let link = link.map(|l| l.finish());
                (trace.map_or(0, |p| p.published), pool_drops, link)
            })
            .expect("spawn the outbox thread");
        RecordingTap {
            recorder,
            stop,
            thread: Some(thread),
            dir,
        }
    }

    /// Drains what is left, finishes the files, returns the counters.
    pub fn finish(mut self) -> TapReport {
        self.stop.store(true, Ordering::Relaxed);
        let (traced, pool_drops, link) = self
            .thread
            .take()
            .map_or((0, 0, None), |t| t.join().unwrap_or((0, 0, None)));
        let mut rep = TapReport {
            traced,
            frames_dropped: pool_drops,
            link,
            ..Default::default()
        };
        if let Some(rec) = self.recorder.take() {
            let st = match Arc::try_unwrap(rec) {
                Ok(r) => r.finish(),
                Err(_) => unreachable!("the outbox thread has ended"),
            };
            rep.recorded = st.recorded.load(Ordering::Relaxed);
            rep.dropped = st.dropped.load(Ordering::Relaxed);
            rep.episodes = st.episodes.load(Ordering::Relaxed);
            rep.frames_dropped += st.frames_dropped.load(Ordering::Relaxed);
        }
        rep
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum RobotSource {
    Sim,
    Remote,
}

fn d_timeout() -> f64 {
    2000.0
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RobotSection {
    /// `sim` (the simulator in this process) or `remote` (a robot on the bus).
    source: RobotSource,
    /// Robot name on the bus (default: `[sim] robot`, or required for remote).
    #[serde(default)]
    name: Option<String>,
    /// Deadline of every exchange with a remote robot, ms.
    #[serde(default = "d_timeout")]
    timeout_ms: f64,
    /// URDF of the arm for the safety layer's workspace check on joint actions (default: the
    /// simulator's arm for `source = "sim"`).
    #[serde(default)]
    urdf: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum PolicyKind {
    /// The simulator's scripted expert (sim tasks only).
    Expert,
    /// An ONNX model with its spec (`model`).
    Onnx,
    /// No base policy: the robot holds unless a person drives.
    None,
}

fn d_policy_kind() -> PolicyKind {
    PolicyKind::Expert
}
fn d_chunk_len() -> usize {
    2
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicySection {
    #[serde(default = "d_policy_kind")]
    kind: PolicyKind,
    /// Expert action noise.
    #[serde(default)]
    noise: f64,
    /// Seed of the expert's noise.
    #[serde(default)]
    seed: u64,
    /// Chunk length the expert returns (its action repeated).
    #[serde(default = "d_chunk_len")]
    chunk_len: usize,
    /// The .onnx file (kind = "onnx"); its spec is NAME.policy.toml beside it. Relative paths are
    /// relative to the config file.
    #[serde(default)]
    model: Option<PathBuf>,
    /// Execution provider (kind = "onnx").
    #[serde(default)]
    provider: reflex_policies::onnx_policy::Provider,
    /// ONNX Runtime intra-op threads.
    #[serde(default = "d_threads")]
    intra_threads: usize,
}

fn d_threads() -> usize {
    1
}

impl Default for PolicySection {
    fn default() -> Self {
        PolicySection {
            kind: d_policy_kind(),
            noise: 0.0,
            seed: 0,
            chunk_len: d_chunk_len(),
            model: None,
            provider: Default::default(),
            intra_threads: d_threads(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum ClockKind {
    /// Simulated time: the loop runs as fast as the robot steps; reproducible.
    Sim,
    /// Wall time: the loop runs at its rate in real time.
    Wall,
}

fn d_episodes() -> u64 {
    10
}
fn d_clock() -> ClockKind {
    ClockKind::Sim
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunSection {
    #[serde(default = "d_episodes")]
    episodes: u64,
    /// Seed of the episode seeds.
    #[serde(default)]
    seed: u64,
    #[serde(default = "d_clock")]
    clock: ClockKind,
}

impl Default for RunSection {
    fn default() -> Self {
        RunSection {
            episodes: d_episodes(),
            seed: 0,
            clock: d_clock(),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BusSection {
    /// Use the bus at all (status, teleop, estop; required for remote robots).
    #[serde(default)]
    enabled: bool,
    #[serde(default)]
    listen: Vec<String>,
    #[serde(default)]
    connect: Vec<String>,
    #[serde(default)]
    no_multicast: bool,
    /// Rate of the step trace published for `reflex viz`, Hz (0 turns it off).
    #[serde(default = "d_trace_hz")]
    trace_hz: f64,
}

fn d_trace_hz() -> f64 {
    10.0
}

impl Default for BusSection {
    fn default() -> Self {
        BusSection {
            enabled: false,
            listen: Vec::new(),
            connect: Vec::new(),
            no_multicast: false,
            trace_hz: d_trace_hz(),
        }
    }
}

/// The whole actor config file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunFile {
    robot: RobotSection,
    #[serde(default)]
    sim: Option<SimConfig>,
    #[serde(default)]
    policy: PolicySection,
    #[serde(rename = "loop", default)]
    loop_: Option<LoopConfig>,
    #[serde(default)]
    safety: SafetyConfig,
    #[serde(default)]
    bus: BusSection,
    #[serde(default)]
    run: RunSection,
    /// The residual learner on the bus (`reflex learn` with the same file); absent: no learning.
    #[serde(default)]
    pub(crate) learner: Option<crate::learn_cmd::LearnerSection>,
}

impl RunFile {
    /// The robot's name on the bus.
    pub(crate) fn robot_name(&self) -> String {
        match (&self.robot.name, &self.sim) {
            (Some(n), _) => n.clone(),
            (None, Some(s)) => s.robot.clone(),
            (None, None) => "sim".into(),
        }
    }

    /// The bus settings of the file with the command line's added.
    pub(crate) fn bus_config(&self, a: &BusArgs) -> BusConfig {
        let mut bus = BusConfig {
            listen: self.bus.listen.clone(),
            connect: self.bus.connect.clone(),
            multicast_scouting: !self.bus.no_multicast,
            config_file: a.zenoh_config.clone(),
        };
        bus.listen.extend(a.listen.clone());
        bus.connect.extend(a.connect.clone());
        bus
    }

    /// The run's seed.
    pub(crate) fn seed(&self) -> u64 {
        self.run.seed
    }

    /// The base policy's model, relative paths resolved against the config's directory.
    pub(crate) fn model_path(&self, dir: &std::path::Path) -> Option<PathBuf> {
        let m = self.policy.model.clone()?;
        Some(if m.is_relative() && !m.exists() {
            dir.join(m)
        } else {
            m
        })
    }
}

/// Reads a run config for the learner: the file and its directory.
pub(crate) fn load_for_learner(path: &std::path::Path) -> anyhow::Result<(RunFile, PathBuf)> {
    let f = load(path)?;
    let dir = path.parent().map(PathBuf::from).unwrap_or_default();
    Ok((f, dir))
}

impl Validate for RunFile {
    fn validate(&self, _: &str) -> Result<(), Invalid> {
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
        if let Some(s) = &self.sim {
            s.validate("sim")?;
        }
        if let Some(l) = &self.loop_ {
            l.validate("loop")?;
        }
        self.safety.validate("safety")?;
        in_range("robot", "timeout_ms", self.robot.timeout_ms, 1.0, 600_000.0)?;
        in_range("bus", "trace_hz", self.bus.trace_hz, 0.0, 1000.0)?;
        if let Some(l) = &self.learner {
            l.validate()?;
            if self.policy.kind != PolicyKind::Onnx {
                return Err(Invalid {
                    key: "learner".into(),
                    value: "(present)".into(),
                    allowed: "a [learner] table only with [policy] kind = \"onnx\" (the residual refines a base policy)".into(),
                });
            }
        }
        in_range("policy", "noise", self.policy.noise, 0.0, 10.0)?;
        in_range("policy", "chunk_len", self.policy.chunk_len, 1, 64)?;
        in_range("run", "episodes", self.run.episodes, 1, 10_000_000)?;
        in_range("policy", "intra_threads", self.policy.intra_threads, 1, 256)?;
        if self.policy.kind == PolicyKind::Onnx && self.policy.model.is_none() {
            return Err(Invalid {
                key: "policy.model".into(),
                value: "(missing)".into(),
                allowed: "the .onnx file when policy.kind = \"onnx\"".into(),
            });
        }
        let _ = key("", "");
        Ok(())
    }
}

/// How a run is driven, besides the config file.
pub struct DriveOpts<'a> {
    /// The bus, when in use.
    pub session: Option<&'a zenoh::Session>,
    /// Episodes to run.
    pub episodes: u64,
    /// JSON output (no progress bar).
    pub json: bool,
    /// Record episodes under this directory.
    pub record: Option<&'a std::path::Path>,
    /// Live viewer.
    pub live: reflex_runtime::recorder::Live,
    /// Rate of the bus trace for `reflex viz`, Hz (0: none; needs the bus).
    pub trace_hz: f64,
}

/// What a run produced.
#[derive(Debug)]
pub struct RunReport {
    pub episodes: Vec<EpisodeSummary>,
    pub wall_s: f64,
    pub stats: reflex_runtime::control::LoopStats,
    pub safety: reflex_runtime::safety::SafetyCounters,
    /// Recording directory, steps recorded, steps dropped, episode files, frames dropped.
    pub recording: Option<(PathBuf, u64, u64, u64, u64)>,
    /// Steps published on the bus trace (for `reflex viz`).
    pub traced: u64,
    /// The learner link's counters, when learning.
    pub link: Option<reflex_runtime::learnlink::LinkStats>,
    /// The in-process learner's summary.
    pub learner: Option<serde_json::Value>,
}

fn obs_template(robot: &dyn Robot) -> Observation {
    let spec = robot.spec();
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
                data: vec![0; (c.width * c.height * 3) as usize],
            })
            .collect(),
        ..Default::default()
    }
}

fn drive<R: Robot, C: Clock>(
    robot: R,
    clock: C,
    file: &RunFile,
    policy: Option<Box<dyn Policy>>,
    inline: bool,
    o: &DriveOpts,
) -> anyhow::Result<RunReport> {
    let (session, episodes, json, record, live) =
        (o.session, o.episodes, o.json, o.record, &o.live);
    let hz = robot.spec().control_hz;
    let cfg = file
        .loop_
        .clone()
        .unwrap_or_else(|| LoopConfig::at(hz.clamp(10.0, 1000.0)));
    let driver = match policy {
        None => PolicyDriver::None,
        Some(p) if inline => PolicyDriver::inline(p),
        Some(p) => PolicyDriver::Thread(PolicyThread::spawn(p, &obs_template(&robot))),
    };
    let chain = match (&file.robot.urdf, file.robot.source) {
        (Some(p), _) => Some(reflex_runtime::kinematics::Chain::from_urdf_file(
            p, "base", "tcp",
        )?),
        (None, RobotSource::Sim) => Some(reflex_sim::world::ArmModel::so101().chain),
        _ => None,
    };
    let name = robot.spec().name.clone();
    let mut lp = ControlLoop::new(
        robot,
        clock,
        cfg.clone(),
        file.safety.clone(),
        driver,
        chain,
        file.run.seed,
    )?;
    let rt = reflex_runtime::rt::apply(&cfg.rt);
    let _ = rt;
    // Recording and the bus trace: the loop's outbox feeds one consumer thread that hands each
    // step to the recorder and to the trace publisher; nothing on the loop waits for either.
    let run_id = format!("run-{}", crate::demo::chrono_like_stamp());
    let spec = lp.robot().spec().clone();
    let recorder = if record.is_some() || *live != reflex_runtime::recorder::Live::Off {
        // Files only with --record; a live view alone writes nothing.
        let dir = record.map(|r| r.join(&run_id).join("episodes"));
        Some((
            Arc::new(make_recorder(dir.clone(), live.clone(), &spec, true)?),
            dir.unwrap_or_default(),
        ))
    } else {
        None
    };
    let trace = match session {
        Some(s) if o.trace_hz > 0.0 => Some(reflex_runtime::viz::TracePublisher::new(
            s,
            &Keys::new(&name)?,
            &spec,
            o.trace_hz,
        )?),
        _ => None,
    };
    // The learner on the bus: the residual hook takes its weights; the outbox consumer sends it
    // every step.
    let link = match (session, &file.learner) {
        (Some(s), Some(ls)) => {
            let sac = reflex_policies::sac::Sac::new(
                ls.sac_config(file.run.seed),
                spec.state_dim(),
                spec.action.dim(),
            )?;
            let norm = reflex_policies::sac::hook::ActionNorm::new(
                &spec.action.low,
                &spec.action.high,
                sac.cfg.action_scale,
            );
            let (hook, writer) =
                reflex_policies::sac::hook::ResidualMlp::new(&sac, norm, true, file.run.seed ^ 7)?;
            lp.set_residual(Box::new(hook));
            lp.set_residual_swap_at_episode(
                ls.link.swap == reflex_runtime::learnlink::SwapPoint::Episode,
            );
            Some(reflex_runtime::learnlink::ActorLink::new(
                s,
                &Keys::new(&name)?,
                ls.link.clone(),
                writer,
            )?)
        }
        (None, Some(_)) => bail!(
            "a [learner] table needs the bus: set [bus] enabled = true or pass --listen/--connect"
        ),
        _ => None,
    };
    // The learner in this process (the default): a thread on the same session, the same
    // protocol as a learner on another machine.
    let learner_stop = Arc::new(AtomicBool::new(false));
    let learner = match (session, &file.learner) {
        (Some(s), Some(ls)) if ls.in_process => {
            let (s, f, stop) = (s.clone(), file.clone(), learner_stop.clone());
            Some(
                std::thread::Builder::new()
                    .name("learner".into())
                    .spawn(move || {
                        crate::learn_cmd::serve(
                            &s,
                            &f,
                            std::path::Path::new(""),
                            &crate::learn_cmd::LearnOpts {
                                exit_when_actor_leaves: false,
                                seconds: None,
                                wait_s: 60.0,
                                progress: false,
                                stop: Some(stop),
                            },
                        )
                    })
                    .expect("spawn the learner thread"),
            )
        }
        _ => None,
    };
    let link_progress = link.as_ref().map(|l| l.progress());
    let tap = if recorder.is_some() || trace.is_some() || link.is_some() {
        let (otx, orx) = reflex_runtime::outbox::outbox(1024, spec.state_dim(), spec.action.dim());
        lp.set_outbox(otx);
        let frames = if recorder.is_some() && !spec.cameras.is_empty() {
            // A few frame buffers, at up to ~15 frames per second of camera video.
            let (ftx, frx) = reflex_runtime::outbox::frames(8);
            lp.set_frames(ftx, (spec.control_hz / 15.0).round().max(1.0) as u32);
            Some(frx)
        } else {
            None
        };
        let (rec, dir) = match recorder {
            Some((r, d)) => (Some(r), d),
            None => (None, PathBuf::new()),
        };
        Some(RecordingTap::with(rec, dir, trace, link, orx, frames))
    } else {
        None
    };
    // Bus side: status out, teleop in, estop in. None of it is on the loop's path.
    let mut _keep = Vec::new();
    let mut _status = None;
    if let Some(s) = session {
        let keys = Keys::new(&name)?;
        let (w, r) = reflex_runtime::status::status_channel();
        lp.set_status(w);
        _status = Some(reflex_runtime::status::spawn_publisher(
            s.clone(),
            keys.clone(),
            r,
            Duration::from_millis(50),
            tap.as_ref()
                .and_then(|t| t.recorder.as_ref())
                .map(|r| r.stats_handle()),
        ));
        let (tw, tr) = reflex_runtime::teleop::teleop_channel(lp.robot().spec().action.dim());
        lp.set_teleop(tr);
        _keep.push(reflex_runtime::teleop::subscribe(s, &keys, tw).map_err(anyhow::Error::msg)?);
        let flag = Arc::new(AtomicBool::new(false));
        lp.set_estop_flag(flag.clone());
        let ev_key = keys.events.clone();
        _keep.push(
            s.declare_subscriber(keys.events.clone())
                .callback(move |sample| {
                    if let Ok(ev) = reflex_runtime::msg::decode::<EpisodeEvent>(
                        &ev_key,
                        &sample.payload().to_bytes(),
                    ) && ev.kind == EventKind::Estop
                    {
                        flag.store(true, Ordering::Relaxed);
                    }
                })
                .wait()
                .map_err(anyhow::Error::msg)?,
        );
    }
    let pb = if json {
        indicatif::ProgressBar::hidden()
    } else {
        progress(episodes, "episodes")
    };
    let t0 = Instant::now();
    let mut done = Vec::new();
    // In lockstep simulation the actor would outrun its learner; between episodes (the robot is
    // resetting, no control step is waiting) it lets the learner take every step so far, so that
    // training in simulation follows the data as it would at the robot's own pace.
    let pace = file.learner.as_ref().is_some_and(|l| l.pace_lockstep) && inline;
    while (done.len() as u64) < episodes {
        if pace && let (Some(p), Some(ob)) = (&link_progress, lp.outbox()) {
            let t = Instant::now();
            while p.received.load(Ordering::Relaxed) < ob.sent()
                && t.elapsed() < Duration::from_secs(120)
            {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        let ep = lp.run_episodes(1)?;
        done.extend(ep);
        let ok = done.iter().filter(|e| e.success).count();
        pb.set_message(format!("{ok} ok"));
        pb.inc(1);
    }
    pb.finish_and_clear();
    let wall_s = t0.elapsed().as_secs_f64();
    let (mut recording, mut traced, mut link) = (None, 0, None);
    // The tap drains the link first (the learner persists the last steps), then the learner stops.
    let tap_report = tap.map(|t| (t.dir.clone(), t.finish()));
    learner_stop.store(true, Ordering::Relaxed);
    let learner = match learner.map(|h| h.join()) {
        Some(Ok(Ok(v))) => Some(v),
        Some(Ok(Err(e))) => {
            tracing::error!("the in-process learner failed: {e:#}");
            None
        }
        Some(Err(_)) => bail!("the in-process learner panicked"),
        None => None,
    };
    if let Some((dir, r)) = tap_report {
        let recording_on = record.is_some();
        traced = r.traced;
        link = r.link.clone();
        if recording_on {
            recording = Some((dir, r.recorded, r.dropped, r.episodes, r.frames_dropped));
        }
    }
    Ok(RunReport {
        episodes: done,
        wall_s,
        stats: lp.stats().clone(),
        safety: lp.safety_counters(),
        recording,
        traced,
        link,
        learner,
    })
}

fn load(path: &std::path::Path) -> anyhow::Result<RunFile> {
    Ok(reflex_runtime::config::load::<RunFile>(path)?)
}

pub fn run(a: RunArgs) -> anyhow::Result<()> {
    let mut file = load(&a.config)?;
    // Paths in the config are relative to the config file.
    if let Some(m) = &file.policy.model
        && m.is_relative()
        && !m.exists()
        && let Some(dir) = a.config.parent()
    {
        file.policy.model = Some(dir.join(m));
    }
    let episodes = a.episodes.unwrap_or(file.run.episodes);
    // Bus: from the file, with command-line endpoints added.
    let mut bus = BusConfig {
        listen: file.bus.listen.clone(),
        connect: file.bus.connect.clone(),
        multicast_scouting: !file.bus.no_multicast,
        config_file: a.bus.zenoh_config.clone(),
    };
    bus.listen.extend(a.bus.listen.clone());
    bus.connect.extend(a.bus.connect.clone());
    if a.bus.no_multicast {
        bus.multicast_scouting = false;
    }
    let use_bus = file.bus.enabled
        || file.robot.source == RobotSource::Remote
        || !a.bus.listen.is_empty()
        || !a.bus.connect.is_empty();
    // A learner needs the bus; one in this process alone needs no network (local session).
    let local_learner = file.learner.as_ref().is_some_and(|l| l.in_process) && !use_bus;
    if local_learner {
        bus.multicast_scouting = false;
    }
    let session = if use_bus || file.learner.is_some() {
        Some(bus.open()?)
    } else {
        None
    };
    let inline = file.run.clock == ClockKind::Sim;
    let opts = DriveOpts {
        session: session.as_ref(),
        episodes,
        json: a.json,
        record: a.record.as_deref(),
        live: crate::replay::with_viewer(
            reflex_runtime::recorder::Live::parse(&a.rerun).map_err(anyhow::Error::msg)?,
        ),
        trace_hz: a.trace_hz.unwrap_or(file.bus.trace_hz),
    };
    let report = match file.robot.source {
        RobotSource::Sim => {
            let mut sim = file.sim.clone().expect("validated");
            if let Some(n) = &file.robot.name {
                sim.robot = n.clone();
            }
            let env = SimEnv::new(sim)?;
            let policy = make_policy(&file, env.spec())?;
            run_with_clock(env, &file, policy, inline, &opts)?
        }
        RobotSource::Remote => {
            let name = file.robot.name.clone().expect("validated");
            let s = session.as_ref().expect("remote robots need the bus");
            let robot = RemoteRobot::connect(
                s,
                &name,
                Duration::from_secs_f64(file.robot.timeout_ms / 1e3),
            )
            .with_context(|| format!("connecting to robot `{name}`"))?;
            if inline && !robot.spec().lockstep {
                bail!(
                    "config `{}`: run.clock = \"sim\" needs a lockstep robot; `{name}` runs on its own clock, use run.clock = \"wall\"",
                    a.config.display()
                );
            }
            let policy = make_policy(&file, robot.spec())?;
            run_with_clock(robot, &file, policy, inline, &opts)?
        }
    };
    print_report(&report, a.json);
    Ok(())
}

fn make_policy(
    file: &RunFile,
    spec: &reflex_runtime::msg::RobotSpec,
) -> anyhow::Result<Option<Box<dyn Policy>>> {
    Ok(match file.policy.kind {
        PolicyKind::None => None,
        PolicyKind::Onnx => {
            let model = file.policy.model.clone().expect("validated");
            let opts = reflex_policies::onnx_policy::RunOptions {
                provider: file.policy.provider.clone(),
                intra_threads: file.policy.intra_threads,
                seed: file.policy.seed,
            };
            Some(Box::new(reflex_policies::onnx_policy::OnnxPolicy::load(
                &model, spec, &opts,
            )?))
        }
        PolicyKind::Expert => Some(Box::new(
            ExpertPolicy::new(
                spec,
                file.policy.noise,
                file.policy.seed,
                file.policy.chunk_len,
            )
            .context("policy.kind = \"expert\" drives the simulator's tasks only")?,
        )),
    })
}

fn run_with_clock<R: Robot>(
    robot: R,
    file: &RunFile,
    policy: Option<Box<dyn Policy>>,
    inline: bool,
    o: &DriveOpts,
) -> anyhow::Result<RunReport> {
    if inline {
        drive(robot, SimClock::new(), file, policy, true, o)
    } else {
        let spin = file.loop_.as_ref().map_or(50.0, |l| l.spin_us);
        drive(
            robot,
            WallClock::new(Duration::from_secs_f64(spin / 1e6)),
            file,
            policy,
            false,
            o,
        )
    }
}

fn print_report(r: &RunReport, json: bool) {
    let n = r.episodes.len().max(1) as f64;
    let ok = r.episodes.iter().filter(|e| e.success).count();
    let steps: u32 = r.episodes.iter().map(|e| e.steps).sum();
    let ret: f32 = r.episodes.iter().map(|e| e.ret).sum();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let safety: serde_json::Map<String, serde_json::Value> = SafetyEvent::ALL
        .iter()
        .map(|e| (e.name().to_string(), r.safety.get(*e).into()))
        .collect();
    if json {
        println!(
            "{}",
            serde_json::json!({
                "episodes": r.episodes.len(),
                "success_rate": ok as f64 / n,
                "mean_return": ret as f64 / n,
                "mean_steps": steps as f64 / n,
                "wall_s": r.wall_s,
                "ticks": r.stats.ticks,
                "lateness_p50_us": us(r.stats.lateness.percentile(50.0)),
                "lateness_p99_us": us(r.stats.lateness.percentile(99.0)),
                "lateness_max_us": us(r.stats.lateness.max()),
                "step_p50_us": us(r.stats.step.percentile(50.0)),
                "step_p99_us": us(r.stats.step.percentile(99.0)),
                "overruns": r.stats.overruns,
                "missed": r.stats.missed,
                "holds_no_chunk": r.stats.holds_no_chunk,
                "chunks": r.stats.chunks,
                "stale_chunks": r.stats.stale_chunks,
                "safety": safety,
                "traced_steps": r.traced,
                "learner_link": r.link,
                "learner": r.learner,
                "residual_version": r.stats.residual_version,
                "recording": r.recording.as_ref().map(|(d, rec, drop, files, fdrop)| serde_json::json!({"dir": d.display().to_string(), "steps_recorded": rec, "steps_dropped": drop, "episode_files": files, "frames_dropped": fdrop})),
                "seeds": r.episodes.iter().map(|e| e.seed).collect::<Vec<_>>(),
            })
        );
    } else {
        println!(
            "{} episodes: {ok} successful ({:.1}%), mean return {:.2}, {:.1} steps per episode, {:.1} s",
            r.episodes.len(),
            100.0 * ok as f64 / n,
            ret as f64 / n,
            steps as f64 / n,
            r.wall_s
        );
        println!(
            "loop: {} ticks, lateness p50 {:.0} us / p99 {:.0} us / max {:.0} us, step p99 {:.0} us, {} overruns, {} missed, {} holds (no chunk)",
            r.stats.ticks,
            us(r.stats.lateness.percentile(50.0)),
            us(r.stats.lateness.percentile(99.0)),
            us(r.stats.lateness.max()),
            us(r.stats.step.percentile(99.0)),
            r.stats.overruns,
            r.stats.missed,
            r.stats.holds_no_chunk
        );
        println!(
            "policy: {} chunks used, {} discarded as stale (from before a reset or hand-back)",
            r.stats.chunks, r.stats.stale_chunks
        );
        let acted: Vec<String> = SafetyEvent::ALL
            .iter()
            .filter(|e| r.safety.get(**e) > 0)
            .map(|e| format!("{} {}", e.name(), r.safety.get(*e)))
            .collect();
        println!(
            "safety: {}",
            if acted.is_empty() {
                "no interventions".into()
            } else {
                acted.join(", ")
            }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shipped_run_config_loads_and_validates() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/run");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "toml") {
                load(&p).unwrap_or_else(|e| panic!("{}: {e:#}", p.display()));
                n += 1;
            }
        }
        assert!(n >= 4, "configs found: {n}");
    }

    #[test]
    fn a_learner_table_without_an_onnx_base_is_refused_naming_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.toml");
        std::fs::write(
            &p,
            "[robot]\nsource = \"sim\"\n[sim]\ntask = \"pick\"\n[policy]\nkind = \"expert\"\n[learner]\n",
        )
        .unwrap();
        let e = format!("{:#}", load(&p).unwrap_err());
        assert!(e.contains("learner") && e.contains("onnx"), "{e}");
    }
}
