//! The recorder: every episode to a Rerun file (`.rrd`), and optionally live to a Rerun viewer.
//!
//! Fed with the loop's transitions by whoever drains the outbox, through a bounded queue of its
//! own: [`Recorder::record`] never waits; when the recorder falls behind, the step is dropped and
//! counted (in [`RecorderStats`], in the recording itself as `telemetry/dropped`, and per episode
//! as `dropped_steps` in its summary, from gaps in the step index and the lost tail). It runs on its own thread. One file per episode under `dir`, named
//! `episode_NNNNNN.rrd`, with a JSON summary beside it (`episode_NNNNNN.json`).
//!
//! What is in a recording (docs/replay.md): timelines `step` and `time`; the 3-D scene the robot
//! describes in its spec ([`scene`]: an arm from its URDF posed by forward kinematics, the fingers
//! from the gripper opening, objects and markers from state fields, the tool path); per joint the
//! measured position; per action component the base action, the residual and the executed action;
//! the intervention flag; reward and success; episode and safety events; loop lateness and chunk
//! age; and a blueprint that lays it out.

mod blueprint;
mod episode;
mod learning;
pub mod scene;

pub use blueprint::blueprint;
pub use learning::{EpisodeFileSummary, LearningPoint, read_summary, write_learning_curves};
pub use scene::{LinkShape, SceneError, SceneModel, link_shapes};

use crossbeam::channel::{self, Receiver, Sender, TrySendError};
use episode::Episode;
use reflex_contracts::msg::{EpisodeEvent, RobotSpec, StatusMsg};
use reflex_runtime::outbox::{Frames, Transition};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

/// The Rerun version of the SDK reflex records with; the viewer of this version opens the files.
pub const RERUN_VERSION: &str = "0.36.3";

/// Where the live stream goes, besides the files.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Live {
    /// Files only.
    #[default]
    Off,
    /// Stream to a running viewer (`rerun+http://127.0.0.1:9876/proxy` when `None`).
    Connect(Option<String>),
    /// Start a viewer and stream to it: the given `rerun` program, else the one on PATH.
    Spawn(Option<PathBuf>),
}

impl Live {
    /// Parses `off`, `connect`, `connect=ADDR`, `spawn`.
    pub fn parse(s: &str) -> Result<Self, RecorderError> {
        match s {
            "off" => Ok(Live::Off),
            "spawn" => Ok(Live::Spawn(None)),
            "connect" => Ok(Live::Connect(None)),
            _ => match s.strip_prefix("connect=") {
                Some(a) => Ok(Live::Connect(Some(a.to_string()))),
                None => Err(RecorderError::Live(s.to_string())),
            },
        }
    }
}

/// Counters of a recorder.
#[derive(Debug, Default)]
pub struct RecorderStats {
    /// Steps recorded.
    pub recorded: AtomicU64,
    /// Steps dropped because the recorder was behind.
    pub dropped: AtomicU64,
    /// Episode files finished.
    pub episodes: AtomicU64,
    /// Errors writing (the robot never stops for them).
    pub errors: AtomicU64,
    /// Episodes not completely recorded: the file whose write failed (e.g. a full disk, kept as
    /// `.rrd.partial`) and every later one (no file: recording stops after a failed write).
    pub incomplete: AtomicU64,
    /// A write failed: no more episode files this run.
    pub suspended: std::sync::atomic::AtomicBool,
    /// Camera frames dropped because the recorder was behind.
    pub frames_dropped: AtomicU64,
    /// Status messages and bus events dropped because the recorder was behind.
    pub other_dropped: AtomicU64,
    /// Items the live view dropped (the viewer was slow or gone).
    pub live_dropped: AtomicU64,
}

/// Errors of the recorder and its files.
#[derive(Debug, thiserror::Error)]
pub enum RecorderError {
    /// The output directory cannot be created.
    #[error("recording directory `{path}`: {source}")]
    Dir {
        /// Directory.
        path: String,
        /// Error.
        source: std::io::Error,
    },
    /// A live-view setting that means nothing.
    #[error("--rerun `{0}`: allowed values are off, spawn, connect, connect=ADDR")]
    Live(String),
    /// The robot's scene cannot be drawn.
    #[error(transparent)]
    Scene(#[from] SceneError),
    /// A recording or summary file cannot be written or read.
    #[error("`{path}`: {message}")]
    File {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
}

/// Where and how a recorder writes.
#[derive(Clone, Debug)]
pub struct RecorderConfig {
    /// Directory of the episode files.
    pub dir: PathBuf,
    /// Live viewer.
    pub live: Live,
    /// Steps queued at most before dropping.
    pub queue: usize,
    /// The robot; its `scene` says what the 3-D view draws.
    pub spec: RobotSpec,
    /// Artificial delay per step (tests and benchmarks of a recorder that cannot keep up).
    pub throttle: Option<std::time::Duration>,
    /// Write episode files under `dir` (off: live view only).
    pub files: bool,
    /// Count gaps in the step index as dropped steps. Off for a decimated stream (`reflex viz`),
    /// whose gaps are by design.
    pub count_gaps: bool,
}

/// What the recorder threads are fed.
#[derive(Clone)]
enum Item {
    Step(Box<Transition>),
    Frames(Box<Frames>),
    Status(Box<StatusMsg>),
    Event(EpisodeEvent),
}

/// A running recorder: a thread that writes the episode files and, when a live view is asked for,
/// a second thread that streams to the viewer. The two never wait for each other: a viewer that
/// stalls or vanishes costs live-view drops (`live_dropped`), never a file or the robot.
pub struct Recorder {
    tx: Option<Sender<Item>>,
    live_tx: Option<Sender<Item>>,
    stats: Arc<RecorderStats>,
    seen: Arc<Seen>,
    thread: Option<JoinHandle<()>>,
    live_thread: Option<JoinHandle<()>>,
}

/// The last step offered to the recorder, kept so that an episode's lost tail (steps dropped
/// after the last one recorded) is counted too. Written by the one thread that calls
/// [`Recorder::record`]; read by the recorder thread.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    /// `episode << 32 | step` of the newest step offered.
    last: AtomicU64,
    /// The same for the previous episode's last step.
    prev: AtomicU64,
}

impl Seen {
    fn note(&self, episode: u64, step: u32) {
        // Stored plus one so that zero means "nothing yet".
        let v = ((episode << 32) | u64::from(step)) + 1;
        let old = self.last.swap(v, Ordering::AcqRel);
        if old != 0 && (old - 1) >> 32 != episode {
            self.prev.store(old, Ordering::Release);
        }
    }

    /// The last step offered for `episode`, when known.
    pub(crate) fn last_step(&self, episode: u64) -> Option<u32> {
        [
            self.last.load(Ordering::Acquire),
            self.prev.load(Ordering::Acquire),
        ]
        .into_iter()
        .find(|v| *v != 0 && (v - 1) >> 32 == episode)
        .map(|v| (v - 1) as u32)
    }
}

/// `host:port` of a `rerun+http://host:port/proxy` address.
fn socket_of(url: &str) -> Option<std::net::SocketAddr> {
    use std::net::ToSocketAddrs;
    let rest = url.split("://").nth(1)?;
    let hostport = rest.split('/').next()?;
    hostport.to_socket_addrs().ok()?.next()
}

/// Opens the live stream, or explains (a warning) why there is none. Checks that something
/// listens before connecting: Rerun's gRPC client would otherwise block its caller until a
/// viewer appears.
fn open_live(live: &Live) -> Option<rerun::RecordingStream> {
    const DEFAULT: &str = "rerun+http://127.0.0.1:9876/proxy";
    let url = match live {
        Live::Off => return None,
        Live::Connect(addr) => addr.clone().unwrap_or_else(|| DEFAULT.to_string()),
        Live::Spawn(exe) => {
            let opts = rerun::SpawnOptions {
                executable_path: exe.as_ref().map(|p| p.display().to_string()),
                ..Default::default()
            };
            match rerun::spawn(&opts) {
                Ok(_) => format!("rerun+http://127.0.0.1:{}/proxy", opts.port),
                Err(e) => {
                    tracing::warn!(
                        "no live view: cannot start the Rerun viewer ({e}); install it with `pip install rerun-sdk=={}`; recording continues",
                        RERUN_VERSION
                    );
                    return None;
                }
            }
        }
    };
    let reachable = socket_of(&url).is_some_and(|a| {
        std::net::TcpStream::connect_timeout(&a, std::time::Duration::from_secs(1)).is_ok()
    });
    if !reachable {
        tracing::warn!(
            "no live view: no Rerun viewer listens at {url} (start one with `rerun`, or use --rerun spawn); recording continues"
        );
        return None;
    }
    rerun::RecordingStreamBuilder::new("reflex")
        .connect_grpc_opts(url.clone())
        .map_err(|e| tracing::warn!("no live view at {url}: {e}; recording continues"))
        .ok()
}

impl Recorder {
    /// Starts the recorder threads.
    pub fn spawn(cfg: RecorderConfig) -> Result<Self, RecorderError> {
        // The scene is resolved once here so a robot that describes it wrongly is an error at
        // start, not a silent blank view.
        SceneModel::new(&cfg.spec)?;
        if cfg.files {
            std::fs::create_dir_all(&cfg.dir).map_err(|source| RecorderError::Dir {
                path: cfg.dir.display().to_string(),
                source,
            })?;
        }
        let stats = Arc::new(RecorderStats::default());
        let seen = Arc::new(Seen::default());
        let (mut tx, mut thread) = (None, None);
        if cfg.files {
            let (t, rx) = channel::bounded::<Item>(cfg.queue.max(1));
            let mut c = cfg.clone();
            c.live = Live::Off;
            let (st, sn) = (stats.clone(), seen.clone());
            tx = Some(t);
            thread = Some(
                std::thread::Builder::new()
                    .name("recorder".into())
                    .spawn(move || run(c, None, rx, st, sn))
                    .expect("spawn the recorder thread"),
            );
        }
        let (mut live_tx, mut live_thread) = (None, None);
        if cfg.live != Live::Off {
            let (t, rx) = channel::bounded::<Item>(cfg.queue.max(1));
            let mut c = cfg.clone();
            c.files = false;
            // The live view's own counters stay out of the files' (its drops are `live_dropped`).
            let (st, sn) = (
                Arc::new(RecorderStats::default()),
                Arc::new(Seen::default()),
            );
            live_tx = Some(t);
            live_thread = Some(
                std::thread::Builder::new()
                    .name("recorder-live".into())
                    .spawn(move || {
                        let live = open_live(&c.live);
                        if live.is_some() {
                            run(c, live, rx, st, sn);
                        }
                    })
                    .expect("spawn the live recorder thread"),
            );
        }
        Ok(Recorder {
            tx,
            live_tx,
            stats,
            seen,
            thread,
            live_thread,
        })
    }

    /// Queues a step; never waits. Returns `false` (and counts a drop) when the queue is full.
    pub fn record(&self, t: &Transition) -> bool {
        let item = Item::Step(Box::new(t.clone()));
        self.to_live(&item);
        let Some(tx) = &self.tx else { return false };
        self.seen.note(t.episode, t.step);
        match tx.try_send(item) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    fn to_live(&self, item: &Item) {
        if let Some(l) = &self.live_tx
            && l.try_send(item.clone()).is_err()
        {
            self.stats.live_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Queues camera frames; never waits (a drop is counted in `frames_dropped`).
    pub fn record_frames(&self, f: &Frames) -> bool {
        self.offer(
            Item::Frames(Box::new(f.clone())),
            &self.stats.frames_dropped,
        )
    }

    /// Queues a status snapshot (shown as `status/...` series); never waits.
    pub fn record_status(&self, m: &StatusMsg) -> bool {
        self.offer(Item::Status(Box::new(m.clone())), &self.stats.other_dropped)
    }

    /// Queues an episode event from the bus (shown in `events`); never waits.
    pub fn record_event(&self, e: &EpisodeEvent) -> bool {
        self.offer(Item::Event(e.clone()), &self.stats.other_dropped)
    }

    fn offer(&self, item: Item, counter: &AtomicU64) -> bool {
        self.to_live(&item);
        let Some(tx) = &self.tx else { return false };
        let ok = tx.try_send(item).is_ok();
        if !ok {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    /// Counters.
    pub fn stats(&self) -> &RecorderStats {
        &self.stats
    }

    /// A shared handle on the counters (for the status publisher).
    pub fn stats_handle(&self) -> Arc<RecorderStats> {
        self.stats.clone()
    }

    /// Finishes the current episode file and stops. The live view gets a few seconds to drain;
    /// a viewer that does not take it is left behind, never waited for.
    pub fn finish(mut self) -> Arc<RecorderStats> {
        self.stop();
        self.stats.clone()
    }

    fn stop(&mut self) {
        self.tx.take();
        self.live_tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(t) = self.live_thread.take() {
            let t0 = std::time::Instant::now();
            while !t.is_finished() && t0.elapsed() < std::time::Duration::from_secs(3) {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            if t.is_finished() {
                let _ = t.join();
            } else {
                tracing::warn!("the live viewer is not taking data; leaving it behind");
            }
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The recorder thread: takes items until the sender is gone, one episode file at a time.
fn run(
    cfg: RecorderConfig,
    live: Option<rerun::RecordingStream>,
    rx: Receiver<Item>,
    stats: Arc<RecorderStats>,
    seen: Arc<Seen>,
) {
    if let Some(l) = &live {
        let _ = blueprint(&cfg.spec).send(
            l,
            rerun::blueprint::BlueprintActivation {
                make_active: true,
                make_default: true,
            },
        );
    }
    let mut w = Worker {
        scene: SceneModel::new(&cfg.spec).expect("checked in Recorder::spawn"),
        cfg,
        live,
        stats,
        seen,
        ep: None,
    };
    while let Ok(item) = rx.recv() {
        if let Some(d) = w.cfg.throttle {
            std::thread::sleep(d);
        }
        match item {
            Item::Step(t) => w.step(&t),
            Item::Frames(f) => w.frames(&f),
            Item::Status(m) => {
                for r in w.streams() {
                    episode::log_status(r, &m);
                }
            }
            Item::Event(ev) => {
                let text = format!(
                    "episode {} step {}: {:?} (from {})",
                    ev.episode, ev.step, ev.kind, ev.source
                );
                for r in w.streams() {
                    let _ = r.log("events", &rerun::TextLog::new(text.clone()));
                }
            }
        }
    }
    if let Some(e) = w.ep.take() {
        episode::finish_episode(&w.cfg, e, &w.stats, &w.seen);
    }
}

/// The recorder thread's state.
struct Worker {
    cfg: RecorderConfig,
    scene: SceneModel,
    live: Option<rerun::RecordingStream>,
    stats: Arc<RecorderStats>,
    seen: Arc<Seen>,
    ep: Option<Episode>,
}

impl Worker {
    /// The episode file and the live view, whichever are open.
    fn streams(&self) -> impl Iterator<Item = &rerun::RecordingStream> {
        self.ep
            .iter()
            .filter_map(|e| e.rec.as_ref())
            .chain(self.live.iter())
    }

    /// Makes `episode` the open one (finishing another first).
    fn enter(&mut self, episode: u64) {
        if self.ep.as_ref().is_some_and(|e| e.id != episode) {
            let e = self.ep.take().expect("checked");
            episode::finish_episode(&self.cfg, e, &self.stats, &self.seen);
        }
        if self.ep.is_none() {
            self.ep =
                episode::open_episode(&self.cfg, &self.scene, &self.live, episode, &self.stats);
        }
    }

    /// Frames come just before their step's transition (the images are of the state the action
    /// was chosen in), so they may be the first word of a new episode.
    fn frames(&mut self, f: &Frames) {
        self.enter(f.episode);
        for r in self.streams() {
            episode::log_frames(r, f, self.scene.image_paths());
        }
    }

    fn step(&mut self, t: &Transition) {
        self.enter(t.episode);
        let Some(e) = &mut self.ep else { return };
        // Whatever was lost upstream (here or in the outbox) shows as a gap in the step index.
        if self.cfg.count_gaps {
            e.dropped += u64::from(t.step.saturating_sub(e.next_step));
        }
        e.next_step = t.step + 1;
        let dropped = e.dropped;
        for r in e.rec.iter().chain(self.live.iter()) {
            episode::log_step(&self.cfg, &mut self.scene, r, e, t, dropped);
        }
        episode::account(&self.scene, e, t);
        self.stats.recorded.fetch_add(1, Ordering::Relaxed);
        if t.ends_episode() {
            let e = self.ep.take().expect("open");
            episode::finish_episode(&self.cfg, e, &self.stats, &self.seen);
        }
    }
}
