//! `reflex viz --robot NAME`: watch a robot in Rerun from anywhere on the network.
//!
//! Subscribes to the actor's step trace (`reflex/<robot>/trace`), its status and the episode
//! events, and streams them into a Rerun viewer (spawned or connected) and/or episode files,
//! through the same recorder `reflex run --record` uses. The robot's process is not touched.

use reflex_agent::progress::Progress;
use reflex_agent::{AgentError, error::Result};
use reflex_bus::trace::TraceSink;
use reflex_contracts::keys::Keys;
use reflex_contracts::msg::{EpisodeEvent, StatusMsg};
use reflex_record::{Live, Recorder};
use reflex_runtime::outbox::Transition;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// Where a watched stream goes.
#[derive(Clone, Debug, PartialEq)]
pub enum VizTarget {
    /// A viewer (spawned or connected).
    Live(Live),
    /// Episode files under this directory, no viewer.
    Save(PathBuf),
}

impl VizTarget {
    /// Parses `spawn`, `connect`, `connect=ADDR` or `save=DIR`.
    pub fn parse(s: &str) -> Result<Self> {
        if let Some(d) = s.strip_prefix("save=") {
            if d.is_empty() {
                return Err(AgentError::setup(
                    "--rerun save=DIR",
                    "the directory is missing",
                ));
            }
            return Ok(VizTarget::Save(PathBuf::from(d)));
        }
        match Live::parse(s) {
            Ok(Live::Off) => Err(AgentError::setup(
                "--rerun off",
                "viz needs somewhere to send the stream (spawn, connect[=ADDR], save=DIR)",
            )),
            Ok(l) => Ok(VizTarget::Live(l)),
            Err(_) => Err(AgentError::setup(
                format!("--rerun `{s}`"),
                "allowed values are spawn, connect, connect=ADDR, save=DIR",
            )),
        }
    }
}

/// How long to watch.
#[derive(Clone, Debug, Default)]
pub struct VizOptions {
    /// Stop after this many episodes have ended.
    pub episodes: Option<u64>,
    /// Stop after this many seconds.
    pub seconds: Option<f64>,
    /// How long to wait for the actor (or the robot) to answer, s.
    pub wait_s: f64,
}

struct RecorderSink(Arc<Recorder>);

impl TraceSink for RecorderSink {
    fn step(&self, t: &Transition) {
        self.0.record(t);
    }
    fn status(&self, m: &StatusMsg) {
        self.0.record_status(m);
    }
    fn event(&self, e: &EpisodeEvent) {
        self.0.record_event(e);
    }
    fn frames(&self, f: &reflex_runtime::outbox::Frames) {
        self.0.record_frames(f);
    }
}

/// What `reflex viz` saw.
#[derive(Clone, Debug, serde::Serialize)]
pub struct VizReport {
    /// The robot watched.
    pub robot: String,
    /// Steps traced.
    pub steps: u64,
    /// Episodes that ended while watching.
    pub episodes_ended: u64,
    /// Status messages received.
    pub statuses: u64,
    /// Episode events received.
    pub events: u64,
    /// Messages that did not decode (rejected).
    pub undecodable: u64,
    /// Camera frames received.
    pub frames: u64,
    /// Steps the recorder dropped (its queue was full).
    pub recorder_dropped: u64,
    /// Episode files written (with `save=DIR`).
    pub episode_files: u64,
    /// Where they are.
    pub dir: Option<String>,
    /// Wall time watched, s.
    pub wall_s: f64,
}

/// Watches `robot` until the options say stop; returns what was seen.
pub fn watch(
    session: &zenoh::Session,
    robot: &str,
    target: VizTarget,
    o: &VizOptions,
    progress: &dyn Progress,
) -> Result<VizReport> {
    let (live, save) = match target {
        VizTarget::Live(l) => (crate::replay::with_viewer(l), None),
        VizTarget::Save(d) => (Live::Off, Some(d)),
    };
    let keys = Keys::new(robot).map_err(reflex_bus::BusError::from)?;
    let spec =
        reflex_bus::trace::fetch_spec(session, &keys, Duration::from_secs_f64(o.wait_s.max(0.1)))?;
    spec.validate()?;
    tracing::info!(
        "watching `{}` ({}, {} Hz)",
        spec.name,
        spec.kind,
        spec.control_hz
    );
    let dir = save.map(|d| {
        d.join(reflex_agent::run_id(&format!("viz-{}", spec.name)))
            .join("episodes")
    });
    let recorder = Arc::new(reflex_agent::tap::make_recorder(
        dir.clone(),
        live,
        &spec,
        false,
    )?);
    let watch = reflex_bus::trace::watch(session, &keys, Arc::new(RecorderSink(recorder.clone())))?;
    let t0 = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let st = &watch.stats;
        let ended = st.episodes_ended.load(Relaxed);
        progress.message(&format!(
            "{}: {} steps, {} episodes ended, {} status, {} events",
            spec.name,
            st.traces.load(Relaxed),
            ended,
            st.statuses.load(Relaxed),
            st.events.load(Relaxed)
        ));
        if o.episodes.is_some_and(|n| ended >= n)
            || o.seconds.is_some_and(|s| t0.elapsed().as_secs_f64() >= s)
        {
            break;
        }
    }
    progress.finish();
    let st = watch.stats.clone();
    drop(watch);
    let rs = match Arc::try_unwrap(recorder) {
        Ok(r) => r.finish(),
        Err(_) => unreachable!("the watcher's subscriptions are dropped"),
    };
    Ok(VizReport {
        robot: spec.name,
        steps: st.traces.load(Relaxed),
        episodes_ended: st.episodes_ended.load(Relaxed),
        statuses: st.statuses.load(Relaxed),
        events: st.events.load(Relaxed),
        undecodable: st.bad.load(Relaxed),
        frames: st.frames.load(Relaxed),
        recorder_dropped: rs.dropped.load(Relaxed),
        episode_files: if dir.is_some() {
            rs.episodes.load(Relaxed)
        } else {
            0
        },
        dir: dir.map(|d| d.display().to_string()),
        wall_s: t0.elapsed().as_secs_f64(),
    })
}
