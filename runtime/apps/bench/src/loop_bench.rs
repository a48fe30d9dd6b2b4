//! `reflex bench loop`: the control loop's timing with a trivial robot and policy, optionally
//! with busy threads beside it standing in for inference and learning.

use crate::workloads::{NullRobot, SweepPolicy};
use reflex_agent::error::Result;
use reflex_runtime::clock::WallClock;
use reflex_runtime::control::{ControlLoop, LoopConfig, PolicyDriver};
use reflex_runtime::policy::PolicyThread;
use reflex_runtime::rt::RtConfig;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// What `reflex bench loop` measures.
#[derive(Clone, Debug)]
pub struct LoopBenchOptions {
    /// Loop rate, Hz.
    pub hz: f64,
    /// Seconds to run.
    pub seconds: f64,
    /// Run one busy thread per CPU beside the loop (inference and learning stand-ins).
    pub load: bool,
    /// Real-time settings of the loop thread.
    pub rt: RtConfig,
    /// Spin for the last part of each wait, us.
    pub spin_us: f64,
    /// Record every step under this directory (the recording's cost on the loop).
    pub record: Option<std::path::PathBuf>,
    /// A file camera beside the loop: its capture thread decodes and scales every frame, and
    /// the robot hands the newest one to each observation.
    pub camera: Option<CameraBeside>,
}

/// A camera beside the benchmarked loop.
#[derive(Clone, Debug)]
pub struct CameraBeside {
    /// A folder of PNG or JPEG frames (`files:` camera).
    pub dir: std::path::PathBuf,
    /// Frames per second.
    pub fps: f64,
    /// The size frames are scaled to, `[width, height]` (HIL-SERL's and LeRobot's 128x128).
    pub resize: [u32; 2],
}

/// A thread that keeps a core busy with floating-point work until stopped.
fn busy(stop: Arc<AtomicBool>) -> std::thread::JoinHandle<f64> {
    std::thread::Builder::new()
        .name("load".into())
        .spawn(move || {
            let mut x = 1.0f64;
            let mut v = vec![1.0f64; 4096];
            while !stop.load(Ordering::Relaxed) {
                for e in v.iter_mut() {
                    *e = (*e * 1.000001 + x).sin();
                    x += *e * 1e-9;
                }
            }
            x
        })
        .expect("spawn load thread")
}

/// What recording cost while the loop ran (`--record`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct LoopRecording {
    /// Steps written.
    pub steps_recorded: u64,
    /// Steps the recorder dropped (queue full).
    pub steps_dropped: u64,
    /// Episode files written.
    pub episode_files: u64,
}

/// One real-time setting and what became of it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RtOutcome {
    /// What was asked.
    pub setting: String,
    /// It took effect.
    pub ok: bool,
    /// What happened.
    pub detail: String,
}

/// What `reflex bench loop` measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LoopBenchReport {
    /// The rate asked for, Hz.
    pub hz: f64,
    /// Wall time measured, s.
    pub seconds: f64,
    /// Busy threads beside the loop.
    pub load_threads: usize,
    /// Ticks run.
    pub ticks: u64,
    /// Ticks per second achieved.
    pub rate_hz: f64,
    /// Median wake-up lateness, µs.
    pub lateness_p50_us: f64,
    /// 99th percentile, µs.
    pub lateness_p99_us: f64,
    /// Latest wake-up, µs.
    pub lateness_max_us: f64,
    /// Ticks missed (a whole period late).
    pub missed: u64,
    /// Steps whose work took longer than a period.
    pub overruns: u64,
    /// Median per-step work, µs.
    pub step_p50_us: f64,
    /// 99th percentile, µs.
    pub step_p99_us: f64,
    /// Mean per-step work, µs.
    pub step_mean_us: f64,
    /// Holds for want of a chunk.
    pub holds_no_chunk: u64,
    /// Chunks received from the policy thread.
    pub chunks: u64,
    /// Recording, when on.
    pub recording: Option<LoopRecording>,
    /// The camera beside the loop, when on: frames captured, used, its rate.
    pub camera: Option<reflex_cameras::CameraStats>,
    /// Real-time settings tried.
    pub rt: Vec<RtOutcome>,
}

/// The loop's wake-up lateness, misses and per-step work with a trivial robot and a policy
/// thread delivering 16-action chunks, optionally with busy threads beside it.
pub fn run(a: &LoopBenchOptions) -> Result<LoopBenchReport> {
    let mut cfg = LoopConfig::at(a.hz);
    cfg.spin_us = a.spin_us;
    cfg.rt = a.rt.clone();
    cfg.chunks = reflex_runtime::chunk::ChunkMode::Ensemble { m: 0.01 };
    let mut robot = NullRobot::new("bench", 32, 0);
    if let Some(c) = &a.camera {
        let probe = reflex_cameras::FileCamera::open(&c.dir, c.fps, true)
            .map_err(reflex_agent::error::ctx("--camera"))?;
        let (format, width, height) = reflex_cameras::FrameSource::format(&probe);
        let cfg = reflex_cameras::CameraConfig {
            resize: Some(c.resize),
            ..reflex_cameras::CameraConfig::new(
                "bench",
                &format!("{}{}", reflex_cameras::FILES_PREFIX, c.dir.display()),
                (width, height),
                c.fps,
                format,
            )
        };
        let epoch = Instant::now();
        let cap = reflex_cameras::Capture::spawn(&cfg, Box::new(probe), epoch)
            .map_err(reflex_agent::error::ctx("--camera"))?;
        robot = robot.with_cameras(vec![(cfg, cap)], epoch);
    }
    let template = reflex_contracts::robot::Robot::observe(&mut robot)?.clone();
    // A 16-action chunk, 8 executed per request, like the shipped diffusion policies.
    let policy = PolicyThread::spawn(Box::new(SweepPolicy::new(16, 8)), &template);
    let clock = WallClock::new(Duration::from_secs_f64(a.spin_us / 1e6));
    let spec = reflex_contracts::robot::Robot::spec(&robot).clone();
    let mut b = ControlLoop::builder(robot, clock)
        .config(cfg.clone())
        .policy(PolicyDriver::Thread(policy));
    let mut tap = None;
    if let Some(runs) = &a.record {
        let (otx, orx) = reflex_runtime::outbox::outbox(1024, spec.state_dim(), spec.action.dim());
        b = b.outbox(otx);
        tap = Some(reflex_agent::tap::RecordingTap::start(
            runs,
            &reflex_agent::run_id("bench-loop"),
            reflex_record::Live::Off,
            &spec,
            orx,
        )?);
    }
    let mut lp = b.build()?;
    let stop = Arc::new(AtomicBool::new(false));
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let load: Vec<_> = if a.load {
        (0..cpus).map(|_| busy(stop.clone())).collect()
    } else {
        vec![]
    };
    let rt = reflex_runtime::rt::apply(&cfg.rt);
    let ticks = (a.seconds * a.hz).round() as u64;
    // Warm-up: the first chunk arrives, buffers settle. Not counted.
    lp.run_ticks((a.hz * 0.2) as u64)?;
    let warm = lp.stats().clone();
    let t0 = Instant::now();
    lp.run_ticks(ticks)?;
    let wall = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for t in load {
        let _ = t.join();
    }
    let recording = tap.map(|t| t.finish());
    let camera = lp.robot().camera_stats().into_iter().next();
    let s = lp.stats();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let (lat, step) = (&s.lateness, &s.step);
    Ok(LoopBenchReport {
        hz: a.hz,
        seconds: wall,
        load_threads: if a.load { cpus } else { 0 },
        ticks: s.ticks - warm.ticks,
        rate_hz: (s.ticks - warm.ticks) as f64 / wall,
        lateness_p50_us: us(lat.percentile(50.0)),
        lateness_p99_us: us(lat.percentile(99.0)),
        lateness_max_us: us(lat.max()),
        missed: s.missed - warm.missed,
        overruns: s.overruns - warm.overruns,
        step_p50_us: us(step.percentile(50.0)),
        step_p99_us: us(step.percentile(99.0)),
        step_mean_us: us(step.mean()),
        holds_no_chunk: s.holds_no_chunk - warm.holds_no_chunk,
        chunks: s.chunks,
        camera,
        recording: recording.map(|r| LoopRecording {
            steps_recorded: r.recorded,
            steps_dropped: r.dropped,
            episode_files: r.episodes,
        }),
        rt: rt
            .into_iter()
            .map(|r| RtOutcome {
                setting: r.setting,
                ok: r.ok,
                detail: r.detail,
            })
            .collect(),
    })
}
