//! Visualisation over the bus: the actor publishes a decimated trace of its steps; `reflex viz`
//! on any machine subscribes to it (with the status and the episode events) and feeds a
//! [`Recorder`], so a laptop watches a robot in Rerun without touching the robot's process.
//!
//! The publisher runs on the outbox's consumer thread, never on the loop: the loop hands its
//! transitions to the outbox as always, and the consumer decides what goes on the wire.

use crate::bus::Keys;
use crate::msg::{self, EpisodeEvent, PROTOCOL_VERSION, RobotSpec, StatusMsg, StepTrace};
use crate::outbox::{Source, Transition};
use crate::recorder::Recorder;
use std::sync::Arc;
use std::time::Duration;
use zenoh::Wait;

impl StepTrace {
    /// Fills `self` from a transition, reusing its buffers.
    pub fn fill(&mut self, t: &Transition) {
        self.v = PROTOCOL_VERSION;
        self.episode = t.episode;
        self.step = t.step;
        self.t_ns = t.t.as_nanos() as u64;
        self.state.clone_from(&t.obs);
        self.base.clone_from(&t.base);
        self.residual.clone_from(&t.residual);
        self.action.clone_from(&t.action);
        self.source.clear();
        self.source.push_str(t.source.name());
        self.reward = t.reward;
        self.terminated = t.terminated;
        self.truncated = t.truncated;
        self.success = t.success;
        self.label = t.label;
        self.reset = t.reset_requested;
        self.safety_flags = t.safety_flags;
        self.lateness_us = (t.lateness.as_secs_f64() * 1e6) as f32;
        self.chunk_age_ms = (t.chunk_age.as_secs_f64() * 1e3) as f32;
        self.policy_latency_ms = (t.policy_latency.as_secs_f64() * 1e3) as f32;
    }

    /// The transition this trace describes (the next state is not carried: it is the state).
    pub fn to_transition(&self) -> Transition {
        let secs = |x: f32| Duration::from_secs_f64(x.max(0.0) as f64);
        Transition {
            episode: self.episode,
            step: self.step,
            t: Duration::from_nanos(self.t_ns),
            obs: self.state.clone(),
            next_obs: self.state.clone(),
            base: self.base.clone(),
            residual: self.residual.clone(),
            action: self.action.clone(),
            source: match self.source.as_str() {
                "teleop" => Source::Teleop,
                "hold" => Source::Hold,
                _ => Source::Policy,
            },
            reward: self.reward,
            terminated: self.terminated,
            truncated: self.truncated,
            success: self.success,
            label: self.label,
            reset_requested: self.reset,
            safety_flags: self.safety_flags,
            lateness: secs(self.lateness_us / 1e6),
            chunk_age: secs(self.chunk_age_ms / 1e3),
            policy_latency: secs(self.policy_latency_ms / 1e3),
        }
    }
}

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
    _spec_q: zenoh::query::Queryable<()>,
    every: u32,
    msg: StepTrace,
    buf: Vec<u8>,
    key: String,
    /// Steps published.
    pub published: u64,
}

impl TracePublisher {
    /// Declares the publisher and the spec queryable; `hz` is the trace rate wanted (the robot's
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
        let bytes = msg::encode(spec);
        let k = keys.trace_spec.clone();
        let spec_q = session
            .declare_queryable(keys.trace_spec.clone())
            .callback(move |q| {
                let _ = q.reply(k.clone(), bytes.clone()).wait();
            })
            .wait()
            .map_err(|e| bus(&keys.trace_spec, e))?;
        Ok(TracePublisher {
            publisher,
            _spec_q: spec_q,
            every,
            msg: StepTrace::default(),
            buf: Vec::with_capacity(1024),
            key: keys.trace.clone(),
            published: 0,
        })
    }

    /// Publishes `t` if it is due. Congestion drops rather than waits.
    pub fn offer(&mut self, t: &Transition) {
        let ends = t.terminated || t.truncated || t.label.is_some() || t.reset_requested;
        if !ends && !t.step.is_multiple_of(self.every) {
            return;
        }
        self.msg.fill(t);
        msg::encode_into(&self.msg, &mut self.buf);
        match self.publisher.put(self.buf.as_slice()).wait() {
            Ok(()) => self.published += 1,
            Err(e) => tracing::debug!("trace on {}: {e}", self.key),
        }
    }
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
}

/// A running watcher: subscriptions that feed `recorder`. Dropping it unsubscribes.
pub struct Watch {
    _subs: Vec<zenoh::pubsub::Subscriber<()>>,
    /// Counters.
    pub stats: Arc<WatchStats>,
}

/// Subscribes to the robot's trace, status and events and feeds them to `recorder`.
pub fn watch(
    session: &zenoh::Session,
    keys: &Keys,
    recorder: Arc<Recorder>,
) -> Result<Watch, VizError> {
    use std::sync::atomic::Ordering::Relaxed;
    let stats = Arc::new(WatchStats::default());
    let mut subs = Vec::new();
    let (r, st, k) = (recorder.clone(), stats.clone(), keys.trace.clone());
    subs.push(
        session
            .declare_subscriber(keys.trace.clone())
            .callback(
                move |s| match msg::decode::<StepTrace>(&k, &s.payload().to_bytes()) {
                    Ok(m) => {
                        st.traces.fetch_add(1, Relaxed);
                        let t = m.to_transition();
                        r.record(&t);
                        if t.terminated || t.truncated || t.label.is_some() || t.reset_requested {
                            st.episodes_ended.fetch_add(1, Relaxed);
                        }
                    }
                    Err(e) => {
                        st.bad.fetch_add(1, Relaxed);
                        tracing::warn!("{e}");
                    }
                },
            )
            .wait()
            .map_err(|e| bus(&keys.trace, e))?,
    );
    let (r, st, k) = (recorder.clone(), stats.clone(), keys.status.clone());
    subs.push(
        session
            .declare_subscriber(keys.status.clone())
            .callback(
                move |s| match msg::decode::<StatusMsg>(&k, &s.payload().to_bytes()) {
                    Ok(m) => {
                        st.statuses.fetch_add(1, Relaxed);
                        r.record_status(&m);
                    }
                    Err(_) => {
                        st.bad.fetch_add(1, Relaxed);
                    }
                },
            )
            .wait()
            .map_err(|e| bus(&keys.status, e))?,
    );
    let (r, st, k) = (recorder, stats.clone(), keys.events.clone());
    subs.push(
        session
            .declare_subscriber(keys.events.clone())
            .callback(
                move |s| match msg::decode::<EpisodeEvent>(&k, &s.payload().to_bytes()) {
                    Ok(m) => {
                        st.events.fetch_add(1, Relaxed);
                        r.record_event(&m);
                    }
                    Err(_) => {
                        st.bad.fetch_add(1, Relaxed);
                    }
                },
            )
            .wait()
            .map_err(|e| bus(&keys.events, e))?,
    );
    Ok(Watch { _subs: subs, stats })
}

#[cfg(test)]
mod tests {
    use super::*;

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
        m.fill(&t);
        let back: StepTrace = msg::decode("k", &msg::encode(&m)).unwrap();
        let u = back.to_transition();
        assert_eq!(
            (u.episode, u.step, u.t, &u.obs, &u.action, u.source),
            (4, 9, t.t, &t.obs, &t.action, Source::Teleop)
        );
        assert!(u.terminated && u.success && u.reward == 1.0);
        assert!((u.lateness.as_secs_f64() - 120e-6).abs() < 1e-9);
    }
}
