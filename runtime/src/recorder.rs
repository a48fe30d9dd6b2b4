//! The recorder: every episode to a Rerun file (`.rrd`), and optionally live to a Rerun viewer.
//!
//! Fed with the loop's transitions by whoever drains the outbox, through a bounded queue of its
//! own: [`Recorder::record`] never waits; when the recorder falls behind, the step is dropped and
//! counted (in [`RecorderStats`], in the recording itself as `telemetry/dropped`, and per episode
//! as `dropped_steps` in its summary, from gaps in the step index and the lost tail). It runs on its own thread. One file per episode under `dir`, named
//! `episode_NNNNNN.rrd`, with a JSON summary beside it (`episode_NNNNNN.json`).
//!
//! What is in a recording (docs/replay.md): timelines `step` and `time`; the arm in 3-D (link poses
//! from forward kinematics with the URDF's box shapes, the fingers from the gripper opening), the
//! object and the target, the tool path; per joint the measured position; per action component the
//! base action, the residual and the executed action; the intervention flag; reward and success;
//! episode and safety events; loop lateness and chunk age; and a blueprint that lays it out.

use crate::kinematics::Chain;
use crate::msg::RobotSpec;
use crate::msg::{EpisodeEvent, StatusMsg};
use crate::outbox::{Frames, Source, Transition};
use crate::safety::SafetyEvent;
use crossbeam::channel::{self, Receiver, Sender, TrySendError};
use nalgebra::{Isometry3, Translation3, UnitQuaternion};
use std::path::{Path, PathBuf};
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
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(Live::Off),
            "spawn" => Ok(Live::Spawn(None)),
            "connect" => Ok(Live::Connect(None)),
            _ => match s.strip_prefix("connect=") {
                Some(a) => Ok(Live::Connect(Some(a.to_string()))),
                None => Err(format!(
                    "--rerun `{s}`: allowed values are off, spawn, connect, connect=ADDR"
                )),
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
    /// Camera frames dropped because the recorder was behind.
    pub frames_dropped: AtomicU64,
    /// Status messages and bus events dropped because the recorder was behind.
    pub other_dropped: AtomicU64,
    /// Items the live view dropped (the viewer was slow or gone).
    pub live_dropped: AtomicU64,
}

/// Errors starting a recorder.
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
}

/// A box of the arm's collision geometry, in its link's frame.
#[derive(Clone, Debug)]
pub struct LinkShape {
    /// URDF link name.
    pub link: String,
    /// Pose of the box in the link frame.
    pub origin: Isometry3<f64>,
    /// Half extents, m.
    pub half: [f32; 3],
}

/// Box shapes of every link of a URDF.
pub fn link_shapes(robot: &urdf_rs::Robot) -> Vec<LinkShape> {
    let mut out = vec![];
    for l in &robot.links {
        for c in &l.collision {
            if let urdf_rs::Geometry::Box { size } = &c.geometry {
                let o = &c.origin;
                out.push(LinkShape {
                    link: l.name.clone(),
                    origin: Isometry3::from_parts(
                        Translation3::new(o.xyz[0], o.xyz[1], o.xyz[2]),
                        UnitQuaternion::from_euler_angles(o.rpy[0], o.rpy[1], o.rpy[2]),
                    ),
                    half: [
                        size[0] as f32 / 2.0,
                        size[1] as f32 / 2.0,
                        size[2] as f32 / 2.0,
                    ],
                });
            }
        }
    }
    out
}

/// What the recorder needs to draw the robot.
#[derive(Clone, Debug)]
pub struct RecorderConfig {
    /// Directory of the episode files.
    pub dir: PathBuf,
    /// Live viewer.
    pub live: Live,
    /// Steps queued at most before dropping.
    pub queue: usize,
    /// The robot.
    pub spec: RobotSpec,
    /// Its kinematic chain (base -> tool) and link shapes, for the 3-D view.
    pub arm: Option<(Chain, Vec<LinkShape>)>,
    /// Half size of the task's object, m (drawn as a box at `object_pos`).
    pub object_half_m: f32,
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
struct Seen {
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
    fn last_step(&self, episode: u64) -> Option<u32> {
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

/// The layout sent with every recording: the 3-D scene beside the action and joint plots, with
/// timing and events below.
pub fn blueprint(spec: &RobotSpec) -> rerun::blueprint::Blueprint {
    use rerun::blueprint::{
        Blueprint, ContainerLike, Horizontal, Spatial2DView, Spatial3DView, TextLogView,
        TimeSeriesView, Vertical,
    };
    let scene: ContainerLike = Spatial3DView::new("arm").with_origin("world").into();
    // Cameras under the 3-D view, side by side.
    let left: ContainerLike = if spec.cameras.is_empty() {
        scene
    } else {
        let cams: Vec<ContainerLike> = spec
            .cameras
            .iter()
            .map(|c| {
                Spatial2DView::new(c.name.clone())
                    .with_origin(format!("camera/{}", c.name))
                    .into()
            })
            .collect();
        Vertical::new([scene, Horizontal::new(cams).into()])
            .with_row_shares([2.0, 1.0])
            .into()
    };
    let right: ContainerLike = Vertical::new([
        TimeSeriesView::new("actions").with_origin("action").into(),
        TimeSeriesView::new("joints").with_origin("joints").into(),
        TimeSeriesView::new("reward, success, takeover")
            .with_origin("episode")
            .into(),
    ])
    .into();
    let bottom: ContainerLike = Horizontal::new([
        TimeSeriesView::new("loop timing")
            .with_origin("timing")
            .into(),
        TimeSeriesView::new("status").with_origin("status").into(),
        TextLogView::new("events").with_origin("events").into(),
    ])
    .into();
    Blueprint::new(
        Vertical::new([Horizontal::new([left, right]).into(), bottom]).with_row_shares([3.0, 1.0]),
    )
}

struct Episode {
    /// The episode's file (none when the recorder writes no files).
    rec: Option<rerun::RecordingStream>,
    id: u64,
    steps: u32,
    ret: f32,
    success: bool,
    interventions: u32,
    intervention_steps: u32,
    was_teleop: bool,
    lateness: crate::hist::Histogram,
    path: Vec<[f32; 3]>,
    /// Steps of this episode that never reached the recorder (gaps in the step index).
    dropped: u64,
    /// Step index expected next.
    next_step: u32,
}

fn open_episode(
    cfg: &RecorderConfig,
    live: &Option<rerun::RecordingStream>,
    id: u64,
    stats: &RecorderStats,
) -> Option<Episode> {
    let file = cfg.dir.join(format!("episode_{id:06}.rrd"));
    let rec = if !cfg.files {
        Ok(None)
    } else {
        rerun::RecordingStreamBuilder::new("reflex")
            .recording_id(format!("episode-{id}"))
            .save(&file)
            .map(Some)
    };
    let rec = match rec {
        Ok(r) => r,
        Err(e) => {
            stats.errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("cannot record episode {id} to {}: {e}", file.display());
            return None;
        }
    };
    if let Some(r) = &rec {
        let _ = blueprint(&cfg.spec).send(
            r,
            rerun::blueprint::BlueprintActivation {
                make_active: true,
                make_default: true,
            },
        );
        log_static(r, cfg);
    }
    if let Some(l) = live {
        log_static(l, cfg);
    }
    Some(Episode {
        rec,
        id,
        steps: 0,
        ret: 0.0,
        success: false,
        interventions: 0,
        intervention_steps: 0,
        was_teleop: false,
        lateness: crate::hist::Histogram::new(),
        path: Vec::new(),
        dropped: 0,
        next_step: 0,
    })
}

fn log_static(rec: &rerun::RecordingStream, cfg: &RecorderConfig) {
    let _ = rec.log_static("world", &rerun::ViewCoordinates::RIGHT_HAND_Z_UP());
    let _ = rec.log_static(
        "world/table",
        &rerun::Boxes3D::from_centers_and_half_sizes([[0.2, 0.0, -0.01]], [[0.3, 0.3, 0.01]])
            .with_colors([rerun::Color::from_rgb(150, 120, 90)]),
    );
    if let Some((_, shapes)) = &cfg.arm {
        for s in shapes {
            let t = s.origin.translation.vector;
            let q = s.origin.rotation.quaternion();
            let _ = rec.log_static(
                format!("world/arm/{}/shape", s.link),
                &rerun::Boxes3D::from_centers_and_half_sizes(
                    [[t.x as f32, t.y as f32, t.z as f32]],
                    [s.half],
                )
                .with_quaternions([rerun::Quaternion::from_xyzw([
                    q.i as f32, q.j as f32, q.k as f32, q.w as f32,
                ])])
                .with_colors([if s.link.starts_with("finger") {
                    rerun::Color::from_rgb(40, 40, 40)
                } else {
                    rerun::Color::from_rgb(240, 200, 40)
                }]),
            );
        }
    }
}

fn pose_transform(p: &Isometry3<f64>) -> rerun::Transform3D {
    let t = p.translation.vector;
    let q = p.rotation.quaternion();
    rerun::Transform3D::from_translation([t.x as f32, t.y as f32, t.z as f32]).with_quaternion(
        rerun::Quaternion::from_xyzw([q.i as f32, q.j as f32, q.k as f32, q.w as f32]),
    )
}

fn finish_episode(cfg: &RecorderConfig, mut ep: Episode, stats: &RecorderStats, seen: &Seen) {
    // Steps offered after the last one recorded and dropped on the way: the lost tail.
    if let Some(last) = seen.last_step(ep.id).filter(|_| cfg.count_gaps) {
        ep.dropped += u64::from((last + 1).saturating_sub(ep.next_step));
    }
    let summary = serde_json::json!({
        "episode": ep.id,
        "steps": ep.steps,
        "return": ep.ret,
        "success": ep.success,
        "interventions": ep.interventions,
        "intervention_steps": ep.intervention_steps,
        "lateness_p50_us": ep.lateness.percentile(50.0).as_secs_f64() * 1e6,
        "lateness_p99_us": ep.lateness.percentile(99.0).as_secs_f64() * 1e6,
        "lateness_max_us": ep.lateness.max().as_secs_f64() * 1e6,
        "dropped_steps": ep.dropped,
        "recording": format!("episode_{:06}.rrd", ep.id),
    });
    if let Some(rec) = ep.rec.take() {
        if let Err(e) = rec.flush_blocking() {
            tracing::warn!("flushing episode {}: {e}", ep.id);
        }
        drop(rec);
    }
    stats.episodes.fetch_add(1, Ordering::Relaxed);
    if !cfg.files {
        return;
    }
    let p = cfg.dir.join(format!("episode_{:06}.json", ep.id));
    if let Err(e) = crate::fsio::atomic_write(
        &p,
        serde_json::to_string_pretty(&summary)
            .expect("json")
            .as_bytes(),
    ) {
        stats.errors.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("writing {}: {e}", p.display());
    }
}

/// Logs one step to `rec` (the episode file or the live viewer).
fn log_step(
    cfg: &RecorderConfig,
    rec: &rerun::RecordingStream,
    ep: &Episode,
    t: &Transition,
    dropped: u64,
    q_buf: &mut Vec<f64>,
    poses: &mut Vec<Isometry3<f64>>,
) {
    let spec = &cfg.spec;
    rec.set_time_sequence("step", t.step as i64);
    rec.set_duration_secs("time", t.t.as_secs_f64());
    // The arm from the measured joints.
    if let (Some((chain, _)), Some(jr)) = (&cfg.arm, spec.field("joint_pos")) {
        let n = chain.dof();
        q_buf.clear();
        q_buf.extend(t.obs[jr.clone()].iter().take(n).map(|v| *v as f64));
        poses.resize(n, Isometry3::identity());
        if q_buf.len() == n {
            chain.link_poses(q_buf, poses);
            for (j, p) in chain.joints().iter().zip(poses.iter()) {
                let _ = rec.log(format!("world/arm/{}", j.child_link), &pose_transform(p));
            }
            // Fingers: the gripper frame shifted by half the opening each way.
            if let Some(g) = poses.last() {
                let half = t.obs.get(jr.start + n).copied().unwrap_or(0.0) as f64 / 2.0;
                for (name, s) in [("finger_left", 1.0), ("finger_right", -1.0)] {
                    let f = g * Isometry3::translation(0.0, s * half, 0.03);
                    let _ = rec.log(format!("world/arm/{name}"), &pose_transform(&f));
                }
            }
        }
        for (k, name) in spec.joints.iter().enumerate() {
            if let Some(v) = t.obs.get(jr.start + k) {
                let _ = rec.log(
                    format!("joints/{name}/measured"),
                    &rerun::Scalars::single(*v as f64),
                );
            }
        }
    }
    if let Some(r) = spec.field("object_pos") {
        let o = &t.obs[r];
        let mut b = rerun::Boxes3D::from_centers_and_half_sizes(
            [[o[0], o[1], o[2]]],
            [[cfg.object_half_m; 3]],
        )
        .with_colors([rerun::Color::from_rgb(220, 40, 30)]);
        if let Some(qr) = spec.field("object_quat") {
            let q = &t.obs[qr];
            b = b.with_quaternions([rerun::Quaternion::from_xyzw([q[0], q[1], q[2], q[3]])]);
        }
        let _ = rec.log("world/object", &b);
    }
    if let Some(r) = spec.field("target_pos") {
        let g = &t.obs[r];
        let _ = rec.log(
            "world/target",
            &rerun::Points3D::new([[g[0], g[1], g[2]]])
                .with_radii([0.008])
                .with_colors([rerun::Color::from_rgb(40, 200, 80)]),
        );
    }
    if !ep.path.is_empty() && ep.path.len() % 5 == 1 {
        let _ = rec.log(
            "world/ee_path",
            &rerun::LineStrips3D::new([ep.path.clone()])
                .with_colors([rerun::Color::from_rgb(60, 120, 230)]),
        );
    }
    for (k, name) in spec.action.names.iter().enumerate() {
        let _ = rec.log(
            format!("action/{name}/base"),
            &rerun::Scalars::single(t.base[k] as f64),
        );
        let _ = rec.log(
            format!("action/{name}/residual"),
            &rerun::Scalars::single(t.residual[k] as f64),
        );
        let _ = rec.log(
            format!("action/{name}/executed"),
            &rerun::Scalars::single(t.action[k] as f64),
        );
    }
    let teleop = t.source == Source::Teleop;
    let _ = rec.log(
        "episode/intervention",
        &rerun::Scalars::single(teleop as u8 as f64),
    );
    let _ = rec.log("episode/reward", &rerun::Scalars::single(t.reward as f64));
    let _ = rec.log(
        "episode/success",
        &rerun::Scalars::single(t.success as u8 as f64),
    );
    let _ = rec.log(
        "timing/lateness_us",
        &rerun::Scalars::single(t.lateness.as_secs_f64() * 1e6),
    );
    let _ = rec.log(
        "timing/chunk_age_ms",
        &rerun::Scalars::single(t.chunk_age.as_secs_f64() * 1e3),
    );
    let _ = rec.log(
        "timing/policy_latency_ms",
        &rerun::Scalars::single(t.policy_latency.as_secs_f64() * 1e3),
    );
    let _ = rec.log("telemetry/dropped", &rerun::Scalars::single(dropped as f64));
    if teleop && !ep.was_teleop {
        let _ = rec.log(
            "events",
            &rerun::TextLog::new(format!("step {}: a person took over", t.step))
                .with_level(rerun::TextLogLevel::INFO),
        );
    }
    if !teleop && ep.was_teleop {
        let _ = rec.log(
            "events",
            &rerun::TextLog::new(format!("step {}: control handed back", t.step))
                .with_level(rerun::TextLogLevel::INFO),
        );
    }
    if t.safety_flags != 0 {
        let names: Vec<&str> = SafetyEvent::ALL
            .iter()
            .filter(|e| t.safety_flags & **e as u32 != 0)
            .map(|e| e.name())
            .collect();
        let _ = rec.log(
            "events",
            &rerun::TextLog::new(format!("step {}: safety {}", t.step, names.join(", ")))
                .with_level(rerun::TextLogLevel::WARN),
        );
    }
    if t.terminated || t.truncated || t.label.is_some() {
        let what = if t.success || t.label == Some(true) {
            "success"
        } else if t.truncated {
            "time limit"
        } else {
            "failure"
        };
        let _ = rec.log(
            "events",
            &rerun::TextLog::new(format!("step {}: episode ends ({what})", t.step))
                .with_level(rerun::TextLogLevel::INFO),
        );
    }
}

/// The episode's own bookkeeping for one step, after it was logged.
fn account(cfg: &RecorderConfig, ep: &mut Episode, t: &Transition) {
    let teleop = t.source == Source::Teleop;
    ep.interventions += (teleop && !ep.was_teleop) as u32;
    ep.intervention_steps += teleop as u32;
    ep.was_teleop = teleop;
    ep.steps += 1;
    ep.ret += t.reward;
    ep.success |= t.success || t.label == Some(true);
    ep.lateness.record(t.lateness);
    if let Some(r) = cfg.spec.field("ee_pos") {
        let e = &t.obs[r];
        ep.path.push([e[0], e[1], e[2]]);
    }
}

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
    let mut ep: Option<Episode> = None;
    let mut q_buf = Vec::new();
    let mut poses = Vec::new();
    while let Ok(item) = rx.recv() {
        if let Some(d) = cfg.throttle {
            std::thread::sleep(d);
        }
        let t = match item {
            Item::Step(t) => t,
            Item::Frames(f) => {
                // Frames come just before their step's transition (the images are of the state
                // the action was chosen in), so they may be the first word of a new episode.
                if ep.as_ref().is_some_and(|e| e.id != f.episode) {
                    finish_episode(&cfg, ep.take().expect("checked"), &stats, &seen);
                }
                if ep.is_none() {
                    ep = open_episode(&cfg, &live, f.episode, &stats);
                }
                if let Some(e) = ep.as_ref() {
                    for r in e.rec.iter().chain(live.iter()) {
                        log_frames(r, &f);
                    }
                }
                continue;
            }
            Item::Status(m) => {
                for r in ep.iter().filter_map(|e| e.rec.as_ref()).chain(live.iter()) {
                    log_status(r, &m);
                }
                continue;
            }
            Item::Event(ev) => {
                let text = format!(
                    "episode {} step {}: {:?} (from {})",
                    ev.episode, ev.step, ev.kind, ev.source
                );
                for r in ep.iter().filter_map(|e| e.rec.as_ref()).chain(live.iter()) {
                    let _ = r.log("events", &rerun::TextLog::new(text.clone()));
                }
                continue;
            }
        };
        if ep.as_ref().is_some_and(|e| e.id != t.episode) {
            finish_episode(&cfg, ep.take().expect("checked"), &stats, &seen);
        }
        if ep.is_none() {
            ep = open_episode(&cfg, &live, t.episode, &stats);
        }
        if let Some(e) = &mut ep {
            // Whatever was lost upstream (here or in the outbox) shows as a gap in the step index.
            if cfg.count_gaps {
                e.dropped += u64::from(t.step.saturating_sub(e.next_step));
            }
            e.next_step = t.step + 1;
            let dropped = e.dropped;
            for r in e.rec.iter().chain(live.iter()) {
                log_step(&cfg, r, e, &t, dropped, &mut q_buf, &mut poses);
            }
            account(&cfg, e, &t);
            stats.recorded.fetch_add(1, Ordering::Relaxed);
            let ended = t.terminated || t.truncated || t.label.is_some() || t.reset_requested;
            if ended {
                finish_episode(&cfg, ep.take().expect("open"), &stats, &seen);
            }
        }
    }
    if let Some(e) = ep.take() {
        finish_episode(&cfg, e, &stats, &seen);
    }
}

/// Camera images at their step, under `camera/<name>`.
fn log_frames(rec: &rerun::RecordingStream, f: &Frames) {
    rec.set_time_sequence("step", f.step as i64);
    rec.set_duration_secs("time", f.t.as_secs_f64());
    for img in &f.images {
        if img.encoding == "rgb8" && img.data.len() == (img.width * img.height * 3) as usize {
            let _ = rec.log(
                format!("camera/{}", img.camera),
                &rerun::Image::from_rgb24(img.data.clone(), [img.width, img.height]),
            );
        }
    }
}

/// The actor's status as `status/...` series, at the time of the last step logged.
fn log_status(rec: &rerun::RecordingStream, m: &StatusMsg) {
    for (name, v) in [
        ("rate_hz", m.rate_hz),
        ("lateness_p99_us", m.lateness_p99_us),
        ("step_p99_us", m.step_p99_us),
        ("missed", m.missed as f64),
        ("outbox_dropped", m.outbox_dropped as f64),
        ("recorder_dropped", m.recorder_dropped as f64),
        ("residual_version", m.residual_version as f64),
    ] {
        let _ = rec.log(format!("status/{name}"), &rerun::Scalars::single(v));
    }
}

/// Reads an episode's JSON summary (what `reflex replay --summary` prints).
pub fn read_summary(recording: &Path) -> Result<serde_json::Value, String> {
    let p = recording.with_extension("json");
    let text = std::fs::read_to_string(&p).map_err(|e| {
        format!(
            "summary `{}`: {e} (episodes recorded by reflex have one beside the .rrd)",
            p.display()
        )
    })?;
    serde_json::from_str(&text).map_err(|e| format!("summary `{}`: {e}", p.display()))
}

/// One episode of a run, for the run-level learning-curve recording.
#[derive(Clone, Debug, Default)]
pub struct LearningPoint {
    /// The robot succeeded without a takeover.
    pub success: bool,
    /// A person took over at least once.
    pub intervened: bool,
    /// Return of the episode.
    pub ret: f32,
    /// Length in steps.
    pub steps: u32,
}

/// Writes `path` (an `.rrd`): per episode on the `episode` timeline, success and takeover (0/1),
/// their rolling means over `window` episodes, return and length; with a blueprint of two plots.
pub fn write_learning_curves(
    path: &Path,
    points: &[LearningPoint],
    window: usize,
) -> Result<(), String> {
    use rerun::blueprint::{Blueprint, TimeSeriesView, Vertical};
    let rec = rerun::RecordingStreamBuilder::new("reflex")
        .recording_id("learning")
        .save(path)
        .map_err(|e| format!("recording `{}`: {e}", path.display()))?;
    let bp = Blueprint::new(Vertical::new([
        TimeSeriesView::new("success and takeovers")
            .with_origin("rate")
            .into(),
        TimeSeriesView::new("return and length")
            .with_origin("episode")
            .into(),
    ]));
    let _ = bp.send(
        &rec,
        rerun::blueprint::BlueprintActivation {
            make_active: true,
            make_default: true,
        },
    );
    let w = window.max(1);
    for (i, p) in points.iter().enumerate() {
        rec.set_time_sequence("episode", i as i64);
        let from = (i + 1).saturating_sub(w);
        let recent = &points[from..=i];
        let mean = |f: fn(&LearningPoint) -> bool| {
            recent.iter().filter(|p| f(p)).count() as f64 / recent.len() as f64
        };
        let log = |k: &str, v: f64| {
            let _ = rec.log(k, &rerun::Scalars::single(v));
        };
        log("rate/success_rolling", mean(|p| p.success));
        log("rate/takeover_rolling", mean(|p| p.intervened));
        log("rate/success", p.success as u8 as f64);
        log("rate/takeover", p.intervened as u8 as f64);
        log("episode/return", p.ret as f64);
        log("episode/steps", p.steps as f64);
    }
    rec.flush_blocking()
        .map_err(|e| format!("recording `{}`: {e}", path.display()))
}
