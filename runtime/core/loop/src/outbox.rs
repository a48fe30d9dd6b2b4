//! The loop's outbox: a bounded, non-blocking hand-off of transitions to the recorder, the bus
//! and the learner.
//!
//! Transitions live in buffers allocated once, up front. The loop takes a free buffer, fills it in
//! place and sends it; the consumer reads it and gives it back. When the consumer falls behind,
//! no free buffer is available and the loop drops the transition and counts it: the loop never
//! waits and never allocates.

use crate::msg::{PROTOCOL_VERSION, StepTrace, WireStep};
use crossbeam::channel::{self, Receiver, RecvTimeoutError, Sender, TrySendError};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Who produced the executed action.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Source {
    /// The base policy (plus residual).
    #[default]
    Policy,
    /// A person through a teleop device.
    Teleop,
    /// Nobody: the robot held (no chunk yet, or the safety layer replaced the action).
    Hold,
}

impl Source {
    /// Name in logs and recordings.
    pub fn name(self) -> &'static str {
        match self {
            Source::Policy => "policy",
            Source::Teleop => "teleop",
            Source::Hold => "hold",
        }
    }
}

/// One control step as the loop saw it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Transition {
    /// Episode counter of the robot.
    pub episode: u64,
    /// Step in the episode.
    pub step: u32,
    /// Loop time of the step.
    pub t: Duration,
    /// Observation state the action was chosen from.
    pub obs: Vec<f32>,
    /// Observation state after the action.
    pub next_obs: Vec<f32>,
    /// Feature maps of the observation the action was chosen from (a residual that sees;
    /// empty otherwise).
    pub features: Vec<f32>,
    /// Feature maps of the observation after the action.
    pub next_features: Vec<f32>,
    /// The base policy's action (zeros when there was none).
    pub base: Vec<f32>,
    /// The residual added to it (zeros when none).
    pub residual: Vec<f32>,
    /// The action sent to the robot, after safety.
    pub action: Vec<f32>,
    /// Who produced `action`.
    pub source: Source,
    /// Reward of the step (reported with the next observation).
    pub reward: f32,
    /// The step ended the episode in a terminal state.
    pub terminated: bool,
    /// The step hit the time limit.
    pub truncated: bool,
    /// The task reported success after the step.
    pub success: bool,
    /// A success classifier's probability for the observation after the step (when it gives
    /// the run's reward).
    pub success_score: Option<f32>,
    /// A person's label in this step: `Some(true)` success, `Some(false)` failure.
    pub label: Option<bool>,
    /// A person asked for a reset in this step.
    pub reset_requested: bool,
    /// An emergency stop ended the episode after this step.
    pub estop: bool,
    /// Safety events of this step ([`crate::safety::SafetyEvent`] bits).
    pub safety_flags: u32,
    /// Wake-up lateness of this step.
    pub lateness: Duration,
    /// Age of the newest chunk used (zero when none).
    pub chunk_age: Duration,
    /// Inference time of the policy thread's newest chunk (zero for inline policies, whose time
    /// is part of the step).
    pub policy_latency: Duration,
}

/// Camera frames of one step, handed off beside the transition through their own small pool
/// (images are large: a few buffers, every `n`-th step, instead of one per transition slot).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Frames {
    /// Episode counter of the robot.
    pub episode: u64,
    /// Step in the episode.
    pub step: u32,
    /// Loop time of the step.
    pub t: Duration,
    /// The observation's images, in the robot's camera order.
    pub images: Vec<crate::msg::Image>,
}

/// The robot as the loop saw it on a tick that belongs to no episode: the e-stop latched, or
/// released and waiting for a resume. Held ticks are no steps, so the recorder, the step log and
/// the learner never see them; watchers of the live robot do (ROS 2's joint states, TF and
/// images), which would otherwise lose the robot exactly while it is stopped.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Held {
    /// Loop time of the tick.
    pub t: Duration,
    /// The observation's state.
    pub state: Vec<f32>,
    /// The observation's images; this tick's only when `fresh_images` (they are copied with the
    /// camera frames' cadence, not every tick).
    pub images: Vec<crate::msg::Image>,
    /// `images` were copied on this tick.
    pub fresh_images: bool,
}

impl Transition {
    /// A transition with buffers sized for `state_dim` and `action_dim`.
    pub fn with_dims(state_dim: usize, action_dim: usize) -> Self {
        Transition {
            obs: vec![0.0; state_dim],
            next_obs: vec![0.0; state_dim],
            base: vec![0.0; action_dim],
            residual: vec![0.0; action_dim],
            action: vec![0.0; action_dim],
            ..Default::default()
        }
    }

    /// Room for `n` feature values per observation.
    pub fn with_features(mut self, n: usize) -> Self {
        self.features = vec![0.0; n];
        self.next_features = vec![0.0; n];
        self
    }
}

impl Transition {
    /// The learner's view of this step, written into `w` reusing its buffers.
    pub fn to_wire(&self, w: &mut WireStep) {
        w.episode = self.episode;
        w.step = self.step;
        w.obs.clone_from(&self.obs);
        w.next_obs.clone_from(&self.next_obs);
        w.base.clone_from(&self.base);
        w.action.clone_from(&self.action);
        w.teleop = self.source == Source::Teleop;
        w.reward = self.reward;
        w.terminated = self.terminated;
        w.truncated = self.truncated;
        w.success = self.success;
        w.label = self.label;
        w.reset = self.reset_requested;
        w.estop = self.estop;
    }

    /// The step is the last of its episode (the task ended it, its time ran out, a person
    /// labelled or reset it, or an e-stop ended it).
    pub fn ends_episode(&self) -> bool {
        self.terminated
            || self.truncated
            || self.label.is_some()
            || self.reset_requested
            || self.estop
    }

    /// The trace of this step for `reflex viz`, written into `m` reusing its buffers.
    pub fn to_trace(&self, m: &mut StepTrace) {
        let (t, s) = (self, m);
        s.v = PROTOCOL_VERSION;
        s.episode = t.episode;
        s.step = t.step;
        s.t_ns = t.t.as_nanos() as u64;
        s.state.clone_from(&t.obs);
        s.base.clone_from(&t.base);
        s.residual.clone_from(&t.residual);
        s.action.clone_from(&t.action);
        s.source.clear();
        s.source.push_str(t.source.name());
        s.reward = t.reward;
        s.terminated = t.terminated;
        s.truncated = t.truncated;
        s.success = t.success;
        s.label = t.label;
        s.reset = t.reset_requested;
        s.estop = t.estop;
        s.safety_flags = t.safety_flags;
        s.lateness_us = (t.lateness.as_secs_f64() * 1e6) as f32;
        s.chunk_age_ms = (t.chunk_age.as_secs_f64() * 1e3) as f32;
        s.policy_latency_ms = (t.policy_latency.as_secs_f64() * 1e3) as f32;
    }

    /// The transition a trace describes (the next state is not carried: it is the state).
    pub fn from_trace(m: &StepTrace) -> Transition {
        let s = m;
        let secs = |x: f32| Duration::from_secs_f64(x.max(0.0) as f64);
        Transition {
            episode: s.episode,
            step: s.step,
            t: Duration::from_nanos(s.t_ns),
            obs: s.state.clone(),
            next_obs: s.state.clone(),
            features: Vec::new(),
            next_features: Vec::new(),
            base: s.base.clone(),
            residual: s.residual.clone(),
            action: s.action.clone(),
            source: match s.source.as_str() {
                "teleop" => Source::Teleop,
                "hold" => Source::Hold,
                _ => Source::Policy,
            },
            reward: s.reward,
            terminated: s.terminated,
            truncated: s.truncated,
            success: s.success,
            success_score: None,
            label: s.label,
            reset_requested: s.reset,
            estop: s.estop,
            safety_flags: s.safety_flags,
            lateness: secs(s.lateness_us / 1e6),
            chunk_age: secs(s.chunk_age_ms / 1e3),
            policy_latency: secs(s.policy_latency_ms / 1e3),
        }
    }
}

/// The loop's end.
pub struct OutboxSender<T = Transition> {
    free: Receiver<Box<T>>,
    tx: Sender<Box<T>>,
    dropped: Arc<AtomicU64>,
    sent: u64,
}

/// The consumer's end.
pub struct OutboxReceiver<T = Transition> {
    rx: Receiver<Box<T>>,
    free: Sender<Box<T>>,
    dropped: Arc<AtomicU64>,
}

/// An outbox of `capacity` transition buffers sized for the given dimensions.
pub fn outbox(
    capacity: usize,
    state_dim: usize,
    action_dim: usize,
) -> (OutboxSender, OutboxReceiver) {
    pool(capacity, || Transition::with_dims(state_dim, action_dim))
}

/// An outbox whose transitions also carry `features` feature-map values per observation.
pub fn outbox_with_features(
    capacity: usize,
    state_dim: usize,
    action_dim: usize,
    features: usize,
) -> (OutboxSender, OutboxReceiver) {
    pool(capacity, || {
        Transition::with_dims(state_dim, action_dim).with_features(features)
    })
}

/// A pool of `capacity` frame buffers (their image buffers grow on first use, then are reused).
pub fn frames(capacity: usize) -> (OutboxSender<Frames>, OutboxReceiver<Frames>) {
    pool(capacity, Frames::default)
}

/// A pool of `capacity` held-tick buffers with room for a `state_dim` state (their image
/// buffers grow on first use, then are reused).
pub fn held(capacity: usize, state_dim: usize) -> (OutboxSender<Held>, OutboxReceiver<Held>) {
    pool(capacity, || Held {
        state: Vec::with_capacity(state_dim),
        ..Default::default()
    })
}

fn pool<T>(capacity: usize, make: impl Fn() -> T) -> (OutboxSender<T>, OutboxReceiver<T>) {
    let (tx, rx) = channel::bounded(capacity);
    let (free_tx, free_rx) = channel::bounded(capacity);
    for _ in 0..capacity {
        free_tx
            .send(Box::new(make()))
            .expect("room for every buffer");
    }
    let dropped = Arc::new(AtomicU64::new(0));
    (
        OutboxSender {
            free: free_rx,
            tx,
            dropped: dropped.clone(),
            sent: 0,
        },
        OutboxReceiver {
            rx,
            free: free_tx,
            dropped,
        },
    )
}

impl<T> OutboxSender<T> {
    /// A free buffer to fill, or `None` (counted as a drop) when the consumer holds them all.
    pub fn slot(&mut self) -> Option<Box<T>> {
        match self.free.try_recv() {
            Ok(b) => Some(b),
            Err(_) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Sends a filled buffer. Never blocks: the queue holds as many entries as there are buffers.
    pub fn send(&mut self, t: Box<T>) {
        match self.tx.try_send(t) {
            Ok(()) => self.sent += 1,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                // Only possible when the consumer is gone; the buffer is simply dropped.
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Transitions sent.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// Transitions dropped because the consumer was behind (or gone).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Free buffers now (the consumer returns them as it finishes with them).
    pub fn free(&self) -> usize {
        self.free.len()
    }
}

impl<T> OutboxReceiver<T> {
    /// The next transition, waiting up to `timeout`. Give it back with [`OutboxReceiver::recycle`].
    pub fn recv_timeout(&self, timeout: Duration) -> Option<Box<T>> {
        match self.rx.recv_timeout(timeout) {
            Ok(t) => Some(t),
            Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => None,
        }
    }

    /// The next transition if one is waiting.
    pub fn try_recv(&self) -> Option<Box<T>> {
        self.rx.try_recv().ok()
    }

    /// Returns a buffer to the loop.
    pub fn recycle(&self, t: Box<T>) {
        let _ = self.free.try_send(t);
    }

    /// Drops counted by the loop so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_consumer_makes_the_loop_drop_and_count_never_wait() {
        let (mut tx, rx) = outbox(4, 3, 2);
        for i in 0..10u32 {
            if let Some(mut t) = tx.slot() {
                t.step = i;
                tx.send(t);
            }
        }
        assert_eq!((tx.sent(), tx.dropped()), (4, 6));
        // The consumer catches up and recycles: the loop can send again.
        let mut got = vec![];
        while let Some(t) = rx.try_recv() {
            got.push(t.step);
            rx.recycle(t);
        }
        assert_eq!(got, vec![0, 1, 2, 3]);
        let t = tx.slot().expect("a recycled buffer");
        assert_eq!(t.obs.len(), 3);
    }
}
