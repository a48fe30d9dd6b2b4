//! Visualisation over the bus: the actor publishes a decimated trace of its steps; `reflex viz`
//! on any machine subscribes to it (with the status and the episode events) and feeds a
//! [`TraceSink`] (reflex-record's recorder in `reflex viz`), so a laptop watches a robot in Rerun
//! without touching the robot's process.
//!
//! The publisher runs on the outbox's consumer thread, never on the loop: the loop hands its
//! transitions to the outbox as always, and the consumer decides what goes on the wire.

use reflex_contracts::keys::Keys;
use reflex_contracts::msg::{
    self, EpisodeEvent, PROTOCOL_VERSION, RobotSpec, StatusMsg, StepTrace, TraceFrames,
};
use reflex_runtime::outbox::{Frames, Transition};
use std::sync::Arc;
use std::time::Duration;
use zenoh::Wait;

/// Errors of the visualisation links.
#[derive(Debug, thiserror::Error)]
pub enum VizError {
    /// A declaration on the bus failed.
    #[error("bus key `{key}`: {message}")]
    Bus {
        /// Key expression.
        key: String,
        /// Zenoh's message.
        message: String,
    },
    /// Nobody answered for the robot.
    #[error(
        "no actor or robot answered on `{trace_spec}` or `{spec}` within {waited_s} s: start the actor with the bus on (`reflex run --config F --listen ...` or `[bus] enabled = true`), check the robot name and that both sides reach each other (--connect/--listen)"
    )]
    NoSpec {
        /// The actor's key.
        trace_spec: String,
        /// The robot's key.
        spec: String,
        /// Seconds waited.
        waited_s: f64,
    },
}

fn bus(key: &str, e: impl std::fmt::Display) -> VizError {
    VizError::Bus {
        key: key.to_string(),
        message: e.to_string(),
    }
}

/// The actor's side: publishes every `every`-th step (and every step that ends an episode) on
/// `reflex/<robot>/trace`, and answers `reflex/<robot>/trace/spec` with the robot's spec.
pub struct TracePublisher {
    publisher: zenoh::pubsub::Publisher<'static>,
    frames_pub: zenoh::pubsub::Publisher<'static>,
    frames_every: std::time::Duration,
    last_frames: Option<std::time::Duration>,
    frames_msg: TraceFrames,
    every: u32,
    msg: StepTrace,
    buf: Vec<u8>,
    key: String,
    /// Steps published.
    pub published: u64,
    /// Camera-frame sets published.
    pub frames_published: u64,
}

/// Camera frames go on the bus at most this often (images are large; a viewer needs a few per
/// second).
pub const TRACE_FRAMES_HZ: f64 = 5.0;

impl TracePublisher {
    /// Declares the trace and frame publishers; `hz` is the trace rate wanted (the robot's
    /// control rate divided down to it).
    pub fn new(
        session: &zenoh::Session,
        keys: &Keys,
        spec: &RobotSpec,
        hz: f64,
    ) -> Result<Self, VizError> {
        let every = (spec.control_hz / hz.max(1e-3)).round().max(1.0) as u32;
        let publisher = session
            .declare_publisher(keys.trace.clone())
            .congestion_control(zenoh::qos::CongestionControl::Drop)
            .wait()
            .map_err(|e| bus(&keys.trace, e))?;
        let frames_pub = session
            .declare_publisher(keys.trace_frames.clone())
            .congestion_control(zenoh::qos::CongestionControl::Drop)
            .wait()
            .map_err(|e| bus(&keys.trace_frames, e))?;
        Ok(TracePublisher {
            publisher,
            frames_pub,
            frames_every: std::time::Duration::from_secs_f64(
                1.0 / TRACE_FRAMES_HZ.min(hz.max(1e-3)),
            ),
            last_frames: None,
            frames_msg: TraceFrames::default(),
            frames_published: 0,
            every,
            msg: StepTrace::default(),
            buf: Vec::with_capacity(1024),
            key: keys.trace.clone(),
            published: 0,
        })
    }

    /// Publishes camera frames if they are due (at most [`TRACE_FRAMES_HZ`]); congestion drops
    /// rather than waits.
    pub fn offer_frames(&mut self, f: &Frames) {
        if self
            .last_frames
            .is_some_and(|last| f.t.saturating_sub(last) < self.frames_every && f.t >= last)
        {
            return;
        }
        self.last_frames = Some(f.t);
        let m = &mut self.frames_msg;
        m.v = PROTOCOL_VERSION;
        m.episode = f.episode;
        m.step = f.step;
        m.t_ns = f.t.as_nanos() as u64;
        m.images.clone_from(&f.images);
        msg::encode_into(&*m, &mut self.buf);
        match self.frames_pub.put(self.buf.as_slice()).wait() {
            Ok(()) => self.frames_published += 1,
            Err(e) => tracing::debug!("frames on {}: {e}", self.key),
        }
    }

    /// Publishes `t` if it is due. Congestion drops rather than waits.
    pub fn offer(&mut self, t: &Transition) {
        let ends = t.ends_episode();
        if !ends && !t.step.is_multiple_of(self.every) {
            return;
        }
        t.to_trace(&mut self.msg);
        msg::encode_into(&self.msg, &mut self.buf);
        match self.publisher.put(self.buf.as_slice()).wait() {
            Ok(()) => self.published += 1,
            Err(e) => tracing::debug!("trace on {}: {e}", self.key),
        }
    }
}

/// The actor's answer on `reflex/<robot>/trace/spec`: the spec of the robot it drives, for its
/// learner, `reflex viz` and `reflex teleop` (which find it even when the robot itself is not on
/// the bus). Keep the returned queryable alive as long as the actor runs.
pub fn serve_spec(
    session: &zenoh::Session,
    keys: &Keys,
    spec: &RobotSpec,
) -> Result<zenoh::query::Queryable<()>, VizError> {
    let bytes = msg::encode(spec);
    let k = keys.trace_spec.clone();
    session
        .declare_queryable(keys.trace_spec.clone())
        .callback(move |q| {
            let _ = q.reply(k.clone(), bytes.clone()).wait();
        })
        .wait()
        .map_err(|e| bus(&keys.trace_spec, e))
}

/// The watcher's side: asks for the spec (the actor's, else the robot's), waiting up to `wait`.
pub fn fetch_spec(
    session: &zenoh::Session,
    keys: &Keys,
    wait: Duration,
) -> Result<RobotSpec, VizError> {
    let t0 = std::time::Instant::now();
    while t0.elapsed() < wait {
        for key in [&keys.trace_spec, &keys.spec] {
            let replies = session
                .get(key.clone())
                .timeout(Duration::from_millis(500))
                .wait()
                .map_err(|e| bus(key, e))?;
            while let Ok(r) = replies.recv() {
                if let Ok(s) = r.result()
                    && let Ok(spec) = msg::decode::<RobotSpec>(key, &s.payload().to_bytes())
                {
                    return Ok(spec);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Err(VizError::NoSpec {
        trace_spec: keys.trace_spec.clone(),
        spec: keys.spec.clone(),
        waited_s: wait.as_secs_f64(),
    })
}

/// What a watcher has seen so far.
#[derive(Debug, Default)]
pub struct WatchStats {
    /// Traces received.
    pub traces: std::sync::atomic::AtomicU64,
    /// Status messages received.
    pub statuses: std::sync::atomic::AtomicU64,
    /// Events received.
    pub events: std::sync::atomic::AtomicU64,
    /// Episodes that ended (a trace that ends an episode).
    pub episodes_ended: std::sync::atomic::AtomicU64,
    /// Messages that did not decode.
    pub bad: std::sync::atomic::AtomicU64,
    /// Camera-frame sets received.
    pub frames: std::sync::atomic::AtomicU64,
}

/// What a watcher feeds: called on Zenoh's threads, so it must not block for long.
pub trait TraceSink: Send + Sync + 'static {
    /// One traced step (its next state is not carried: `next_obs` repeats the state).
    fn step(&self, t: &Transition);
    /// A status message of the actor.
    fn status(&self, m: &StatusMsg);
    /// An episode event.
    fn event(&self, e: &EpisodeEvent);
    /// Camera frames of a step.
    fn frames(&self, f: &Frames);
}

/// A running watcher: subscriptions that feed a [`TraceSink`]. Dropping it unsubscribes.
pub struct Watch {
    _subs: Vec<zenoh::pubsub::Subscriber<()>>,
    /// Counters.
    pub stats: Arc<WatchStats>,
}

/// Subscribes to the robot's trace, camera frames, status and events and feeds them to `sink`.
pub fn watch(
    session: &zenoh::Session,
    keys: &Keys,
    sink: Arc<dyn TraceSink>,
) -> Result<Watch, VizError> {
    use std::sync::atomic::Ordering::Relaxed;
    let stats = Arc::new(WatchStats::default());
    let (r, st) = (sink.clone(), stats.clone());
    let trace =
        crate::subscribe_decoded(session, &keys.trace, stats.clone(), move |m: StepTrace| {
            st.traces.fetch_add(1, Relaxed);
            let t = Transition::from_trace(&m);
            r.step(&t);
            if t.ends_episode() {
                st.episodes_ended.fetch_add(1, Relaxed);
            }
        })
        .map_err(|e| bus(&keys.trace, e))?;
    let (r, st) = (sink.clone(), stats.clone());
    let status =
        crate::subscribe_decoded(session, &keys.status, stats.clone(), move |m: StatusMsg| {
            st.statuses.fetch_add(1, Relaxed);
            r.status(&m);
        })
        .map_err(|e| bus(&keys.status, e))?;
    let (r, st) = (sink.clone(), stats.clone());
    let frames = crate::subscribe_decoded(
        session,
        &keys.trace_frames,
        stats.clone(),
        move |m: TraceFrames| {
            st.frames.fetch_add(1, Relaxed);
            r.frames(&Frames {
                episode: m.episode,
                step: m.step,
                t: Duration::from_nanos(m.t_ns),
                images: m.images,
            });
        },
    )
    .map_err(|e| bus(&keys.trace_frames, e))?;
    let (r, st) = (sink, stats.clone());
    let events = crate::subscribe_decoded(
        session,
        &keys.events,
        stats.clone(),
        move |m: EpisodeEvent| {
            st.events.fetch_add(1, Relaxed);
            r.event(&m);
        },
    )
    .map_err(|e| bus(&keys.events, e))?;
    Ok(Watch {
        _subs: vec![trace, status, frames, events],
        stats,
    })
}

impl crate::CountsBad for WatchStats {
    fn bad(&self, _why: &dyn std::fmt::Display) {
        self.bad.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reflex_runtime::outbox::Source;

    #[test]
    fn a_trace_round_trips_a_transition() {
        let mut t = Transition::with_dims(3, 2);
        t.episode = 4;
        t.step = 9;
        t.t = Duration::from_millis(450);
        t.obs = vec![1.0, 2.0, 3.0];
        t.base = vec![0.5, -0.5];
        t.residual = vec![0.1, 0.0];
        t.action = vec![0.6, -0.5];
        t.source = Source::Teleop;
        t.reward = 1.0;
        t.terminated = true;
        t.success = true;
        t.lateness = Duration::from_micros(120);
        let mut m = StepTrace::default();
        t.to_trace(&mut m);
        let back: StepTrace = msg::decode("k", &msg::encode(&m)).unwrap();
        let u = Transition::from_trace(&back);
        assert_eq!(
            (u.episode, u.step, u.t, &u.obs, &u.action, u.source),
            (4, 9, t.t, &t.obs, &t.action, Source::Teleop)
        );
        assert!(u.terminated && u.success && u.reward == 1.0);
        assert!((u.lateness.as_secs_f64() - 120e-6).abs() < 1e-9);
    }
}
