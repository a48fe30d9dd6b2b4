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
use crate::outbox::{Source, Transition};
use crate::safety::SafetyEvent;
use crossbeam::channel::{self, Receiver, Sender, TrySendError};
use nalgebra::{Isometry3, Translation3, UnitQuaternion};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

/// Where the live stream goes, besides the files.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Live {
    /// Files only.
    #[default]
    Off,
    /// Stream to a running viewer (`rerun+http://127.0.0.1:9876/proxy` when `None`).
    Connect(Option<String>),
    /// Start a viewer (the `rerun` program must be on PATH) and stream to it.
    Spawn,
}

impl Live {
    /// Parses `off`, `connect`, `connect=ADDR`, `spawn`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(Live::Off),
            "spawn" => Ok(Live::Spawn),
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
}

/// A running recorder.
pub struct Recorder {
    tx: Option<Sender<Box<Transition>>>,
    stats: Arc<RecorderStats>,
    seen: Arc<Seen>,
    thread: Option<JoinHandle<()>>,
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

impl Recorder {
    /// Starts the recorder thread.
    pub fn spawn(cfg: RecorderConfig) -> Result<Self, RecorderError> {
        std::fs::create_dir_all(&cfg.dir).map_err(|source| RecorderError::Dir {
            path: cfg.dir.display().to_string(),
            source,
        })?;
        let (tx, rx) = channel::bounded::<Box<Transition>>(cfg.queue.max(1));
        let stats = Arc::new(RecorderStats::default());
        let st = stats.clone();
        let seen = Arc::new(Seen::default());
        let sn = seen.clone();
        let thread = std::thread::Builder::new()
            .name("recorder".into())
            .spawn(move || run(cfg, rx, st, sn))
            .expect("spawn the recorder thread");
        Ok(Recorder {
            tx: Some(tx),
            stats,
            seen,
            thread: Some(thread),
        })
    }

    /// Queues a step; never waits. Returns `false` (and counts a drop) when the queue is full.
    pub fn record(&self, t: &Transition) -> bool {
        let Some(tx) = &self.tx else { return false };
        self.seen.note(t.episode, t.step);
        match tx.try_send(Box::new(t.clone())) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Counters.
    pub fn stats(&self) -> &RecorderStats {
        &self.stats
    }

    /// A shared handle on the counters (for the status publisher).
    pub fn stats_handle(&self) -> Arc<RecorderStats> {
        self.stats.clone()
    }

    /// Finishes the current episode file and stops.
    pub fn finish(mut self) -> Arc<RecorderStats> {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.stats.clone()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The layout sent with every recording: the 3-D scene beside the action and joint plots, with
/// timing and events below.
pub fn blueprint() -> rerun::blueprint::Blueprint {
    use rerun::blueprint::{
        Blueprint, ContainerLike, Horizontal, Spatial3DView, TextLogView, TimeSeriesView, Vertical,
    };
    let left: ContainerLike = Spatial3DView::new("arm").with_origin("world").into();
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
        TextLogView::new("events").with_origin("events").into(),
    ])
    .into();
    Blueprint::new(
        Vertical::new([Horizontal::new([left, right]).into(), bottom]).with_row_shares([3.0, 1.0]),
    )
}

struct Episode {
    rec: rerun::RecordingStream,
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
    let rec = match rerun::RecordingStreamBuilder::new("reflex")
        .recording_id(format!("episode-{id}"))
        .save(&file)
    {
        Ok(r) => r,
        Err(e) => {
            stats.errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("cannot record episode {id} to {}: {e}", file.display());
            return None;
        }
    };
    let _ = blueprint().send(
        &rec,
        rerun::blueprint::BlueprintActivation {
            make_active: true,
            make_default: true,
        },
    );
    log_static(&rec, cfg);
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
    if let Some(last) = seen.last_step(ep.id) {
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
    if let Err(e) = ep.rec.flush_blocking() {
        tracing::warn!("flushing episode {}: {e}", ep.id);
    }
    drop(ep.rec);
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
    stats.episodes.fetch_add(1, Ordering::Relaxed);
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
    rx: Receiver<Box<Transition>>,
    stats: Arc<RecorderStats>,
    seen: Arc<Seen>,
) {
    let live = match &cfg.live {
        Live::Off => None,
        Live::Spawn => rerun::RecordingStreamBuilder::new("reflex")
            .spawn()
            .map_err(|e| {
                tracing::warn!("no live viewer (rerun spawn failed: {e}); recording to files only")
            })
            .ok(),
        Live::Connect(addr) => {
            let b = rerun::RecordingStreamBuilder::new("reflex");
            let r = match addr {
                Some(a) => b.connect_grpc_opts(a.clone()),
                None => b.connect_grpc(),
            };
            r.map_err(|e| tracing::warn!("no live viewer ({e}); recording to files only"))
                .ok()
        }
    };
    if let Some(l) = &live {
        let _ = blueprint().send(
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
    while let Ok(t) = rx.recv() {
        if let Some(d) = cfg.throttle {
            std::thread::sleep(d);
        }
        if ep.as_ref().is_some_and(|e| e.id != t.episode) {
            finish_episode(&cfg, ep.take().expect("checked"), &stats, &seen);
        }
        if ep.is_none() {
            ep = open_episode(&cfg, &live, t.episode, &stats);
        }
        if let Some(e) = &mut ep {
            // Whatever was lost upstream (here or in the outbox) shows as a gap in the step index.
            e.dropped += u64::from(t.step.saturating_sub(e.next_step));
            e.next_step = t.step + 1;
            let dropped = e.dropped;
            log_step(&cfg, &e.rec, e, &t, dropped, &mut q_buf, &mut poses);
            if let Some(l) = &live {
                log_step(&cfg, l, e, &t, dropped, &mut q_buf, &mut poses);
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
