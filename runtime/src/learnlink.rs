//! The actor's end of the link to a learner on the bus (possibly on another machine).
//!
//! Transitions: every step the loop hands to its outbox gets a sequence number and is kept until
//! the learner reports it persisted in a checkpoint (`LearnerState::persisted`). Steps go out in
//! batches on `reflex/<robot>/learn/transitions`; the learner accepts only the sequence number it
//! expects next, so a duplicate (a resend after a reconnect) is dropped and a gap is refused. When
//! the learner reports less than was sent (it restarted from a checkpoint, or a batch was lost),
//! the actor resends from what the learner has. Nothing the actor sent is lost as long as the actor
//! lives and its unacknowledged backlog stays under `max_unacked` (beyond that the oldest steps
//! are dropped and counted in `lost`).
//!
//! Weights: the learner publishes versioned residual weights in chunks on
//! `reflex/<robot>/learn/weights`; the link assembles them and hands a complete version to the
//! loop's residual hook through its triple buffer ([`WeightsWriter`]). The loop takes it at its
//! next step or at the next episode start ([`SwapPoint`]); it never waits, and reads whichever
//! version is newest.
//! When the learner goes away the loop keeps its last weights.
//!
//! This all runs on the outbox's consumer thread and Zenoh's callback threads, never the loop's.

use crate::bus::Keys;
use crate::msg::{self, LearnerState, PROTOCOL_VERSION, TransitionBatch, WeightsChunk, WireStep};
use crate::outbox::{Source, Transition};
use crate::residual::WeightsWriter;
use serde::Deserialize;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zenoh::Wait;

/// When new weights reach the loop.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SwapPoint {
    /// As soon as a version is complete.
    Immediate,
    /// At the next episode boundary (the policy does not change within an episode).
    #[default]
    Episode,
}

/// Settings of the actor's link.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LinkConfig {
    /// Steps per batch at most.
    pub batch_steps: usize,
    /// A partial batch goes out after this long, ms.
    pub flush_ms: f64,
    /// Resend what the learner lacks when it has not caught up after this long, ms.
    pub resend_ms: f64,
    /// Unacknowledged steps kept at most (the oldest are dropped and counted beyond this).
    pub max_unacked: usize,
    /// When new weights reach the loop.
    pub swap: SwapPoint,
    /// At the end of a run, wait this long for the learner to persist the last steps, s.
    pub drain_s: f64,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            batch_steps: 64,
            flush_ms: 50.0,
            resend_ms: 5000.0,
            max_unacked: 2_000_000,
            swap: SwapPoint::Episode,
            drain_s: 10.0,
        }
    }
}

impl crate::config::Validate for LinkConfig {
    fn validate(&self, p: &str) -> Result<(), crate::config::Invalid> {
        use crate::config::in_range;
        in_range(p, "batch_steps", self.batch_steps, 1, 65_536)?;
        in_range(p, "flush_ms", self.flush_ms, 1.0, 60_000.0)?;
        in_range(p, "resend_ms", self.resend_ms, 10.0, 600_000.0)?;
        in_range(p, "max_unacked", self.max_unacked, 1_000, 1_000_000_000)?;
        in_range(p, "drain_s", self.drain_s, 0.0, 3600.0)?;
        Ok(())
    }
}

/// Counters of the link.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct LinkStats {
    /// Steps numbered and queued for the learner.
    pub steps: u64,
    /// Batches published (first sends and resends).
    pub batches: u64,
    /// Steps sent again after the learner lacked them.
    pub resent: u64,
    /// Steps dropped from a backlog over `max_unacked` (the learner never got them).
    pub lost: u64,
    /// Steps the learner has persisted.
    pub persisted: u64,
    /// Weight versions handed to the loop's residual hook.
    pub swaps: u64,
    /// Newest weight version handed over.
    pub weights_version: u64,
    /// Learner processes seen (a restart counts anew).
    pub learner_instances: u64,
}

/// How far the learner is behind the actor, readable from any thread.
#[derive(Debug, Default)]
pub struct LinkProgress {
    /// Steps handed to the link.
    pub offered: std::sync::atomic::AtomicU64,
    /// Steps the learner has taken (trained on).
    pub received: std::sync::atomic::AtomicU64,
}

impl LinkProgress {
    /// Steps the learner still has to take.
    pub fn lag(&self) -> u64 {
        use std::sync::atomic::Ordering::Relaxed;
        self.offered
            .load(Relaxed)
            .saturating_sub(self.received.load(Relaxed))
    }
}

/// What the Zenoh callbacks share with the link.
struct Shared {
    state: Option<(LearnerState, Instant)>,
    instances: u64,
    // Weight assembly.
    asm_version: u64,
    asm: Vec<f32>,
    asm_have: usize,
    ready: Option<(u64, Vec<f32>)>,
    writer: WeightsWriter,
    in_use: u64,
    swaps: u64,
}

impl Shared {
    fn take_chunk(&mut self, c: &WeightsChunk) {
        if c.version <= self.in_use || self.ready.as_ref().is_some_and(|r| r.0 >= c.version) {
            return; // old news
        }
        if c.version != self.asm_version || self.asm.len() != c.total as usize {
            self.asm_version = c.version;
            self.asm = vec![f32::NAN; c.total as usize];
            self.asm_have = 0;
        }
        let (o, n) = (c.offset as usize, c.values.len());
        if o + n > self.asm.len() {
            return;
        }
        for (d, s) in self.asm[o..o + n].iter_mut().zip(&c.values) {
            if d.is_nan() {
                self.asm_have += 1;
            }
            *d = *s;
        }
        if self.asm_have == self.asm.len() {
            self.ready = Some((self.asm_version, std::mem::take(&mut self.asm)));
            self.asm_have = 0;
            // Into the triple buffer at once; the loop takes it at its next step, or at the next
            // episode start with `SwapPoint::Episode` (ControlLoop::set_residual_swap_at_episode).
            self.swap_in();
        }
    }

    fn swap_in(&mut self) {
        if let Some((v, w)) = self.ready.take() {
            self.writer.publish(v, &w);
            self.in_use = v;
            self.swaps += 1;
        }
    }
}

/// The actor's link to the learner.
pub struct ActorLink {
    cfg: LinkConfig,
    id: u64,
    publisher: zenoh::pubsub::Publisher<'static>,
    key: String,
    shared: Arc<Mutex<Shared>>,
    /// Steps not yet persisted by the learner; `unacked[0]` has sequence number `base`.
    unacked: VecDeque<WireStep>,
    base: u64,
    next: u64,
    /// Next sequence number to send.
    sent: u64,
    last_send: Instant,
    last_progress: (u64, Instant),
    instance: u64,
    gaps_seen: u64,
    last_rewind: (u64, Instant),
    progress: Arc<LinkProgress>,
    batch: TransitionBatch,
    buf: Vec<u8>,
    stats: LinkStats,
    _subs: Vec<zenoh::pubsub::Subscriber<()>>,
    _token: zenoh::liveliness::LivelinessToken,
}

/// Errors of the link.
#[derive(Debug, thiserror::Error)]
#[error("learner link on `{key}`: {message}")]
pub struct LinkError {
    /// Key expression.
    pub key: String,
    /// What failed.
    pub message: String,
}

fn err(key: &str, e: impl std::fmt::Display) -> LinkError {
    LinkError {
        key: key.to_string(),
        message: e.to_string(),
    }
}

impl WireStep {
    /// The learner's view of an outbox transition.
    pub fn fill(&mut self, t: &Transition) {
        self.episode = t.episode;
        self.step = t.step;
        self.obs.clone_from(&t.obs);
        self.next_obs.clone_from(&t.next_obs);
        self.base.clone_from(&t.base);
        self.action.clone_from(&t.action);
        self.teleop = t.source == Source::Teleop;
        self.reward = t.reward;
        self.terminated = t.terminated;
        self.truncated = t.truncated;
        self.success = t.success;
        self.label = t.label;
        self.reset = t.reset_requested;
    }
}

impl ActorLink {
    /// Declares the link: publisher, subscriptions to the learner's state and weights, and the
    /// actor's liveliness token. `writer` feeds the loop's residual hook.
    pub fn new(
        session: &zenoh::Session,
        keys: &Keys,
        cfg: LinkConfig,
        writer: WeightsWriter,
    ) -> Result<Self, LinkError> {
        let id = rand::random::<u64>() | 1;
        let publisher = session
            .declare_publisher(keys.learn_transitions.clone())
            // Reliable is Zenoh's default; Block: a full queue slows this (consumer) thread
            // rather than dropping steps.
            .congestion_control(zenoh::qos::CongestionControl::Block)
            .wait()
            .map_err(|e| err(&keys.learn_transitions, e))?;
        let shared = Arc::new(Mutex::new(Shared {
            state: None,
            instances: 0,
            asm_version: 0,
            asm: Vec::new(),
            asm_have: 0,
            ready: None,
            writer,
            in_use: 0,
            swaps: 0,
        }));
        let mut subs = Vec::new();
        let (sh, k) = (shared.clone(), keys.learn_state.clone());
        subs.push(
            session
                .declare_subscriber(keys.learn_state.clone())
                .callback(move |s| {
                    if let Ok(m) = msg::decode::<LearnerState>(&k, &s.payload().to_bytes())
                        && (m.actor == id || m.actor == 0)
                    {
                        let mut g = sh.lock().expect("link state");
                        if g.state
                            .as_ref()
                            .is_none_or(|(o, _)| o.instance != m.instance)
                        {
                            g.instances += 1;
                        }
                        g.state = Some((m, Instant::now()));
                    }
                })
                .wait()
                .map_err(|e| err(&keys.learn_state, e))?,
        );
        let (sh, k) = (shared.clone(), keys.learn_weights.clone());
        subs.push(
            session
                .declare_subscriber(keys.learn_weights.clone())
                .callback(
                    move |s| match msg::decode::<WeightsChunk>(&k, &s.payload().to_bytes()) {
                        Ok(c) => sh.lock().expect("link state").take_chunk(&c),
                        Err(e) => tracing::warn!("{e}"),
                    },
                )
                .wait()
                .map_err(|e| err(&keys.learn_weights, e))?,
        );
        let token = session
            .liveliness()
            .declare_token(keys.alive_actor.clone())
            .wait()
            .map_err(|e| err(&keys.alive_actor, e))?;
        let now = Instant::now();
        Ok(ActorLink {
            batch: TransitionBatch {
                v: PROTOCOL_VERSION,
                actor: id,
                ..Default::default()
            },
            cfg,
            id,
            publisher,
            key: keys.learn_transitions.clone(),
            shared,
            unacked: VecDeque::new(),
            base: 0,
            next: 0,
            sent: 0,
            last_send: now,
            last_progress: (0, now),
            instance: 0,
            gaps_seen: 0,
            last_rewind: (u64::MAX, now),
            progress: Arc::new(LinkProgress::default()),
            buf: Vec::with_capacity(64 * 1024),
            stats: LinkStats::default(),
            _subs: subs,
            _token: token,
        })
    }

    /// Shared counters to follow the learner from another thread (see [`LinkProgress`]).
    pub fn progress(&self) -> Arc<LinkProgress> {
        self.progress.clone()
    }

    /// This actor's identity on the link.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Numbers a step and queues it; at an episode boundary, swaps in waiting weights
    /// ([`SwapPoint::Episode`]) and sends at once.
    pub fn offer(&mut self, t: &Transition) {
        let mut w = WireStep::default();
        w.fill(t);
        let ends = w.ends_episode();
        self.unacked.push_back(w);
        self.next += 1;
        self.progress
            .offered
            .store(self.next, std::sync::atomic::Ordering::Relaxed);
        self.stats.steps += 1;
        if self.unacked.len() > self.cfg.max_unacked {
            self.unacked.pop_front();
            self.base += 1;
            self.sent = self.sent.max(self.base);
            self.stats.lost += 1;
        }
        if ends || self.next - self.sent >= self.cfg.batch_steps as u64 {
            self.flush();
        }
    }

    /// Follows the learner's state (forget what it persisted, resend what it lacks) and sends a
    /// partial batch that has waited long enough. Call it every few tens of milliseconds.
    pub fn tick(&mut self) {
        let state = self.shared.lock().expect("link state").state.clone();
        if let Some((s, _)) = state.as_ref().filter(|(s, _)| s.actor == 0) {
            // A learner that knows no actor yet: send it everything still held.
            if s.instance != self.instance {
                self.instance = s.instance;
                self.gaps_seen = s.gaps;
                self.rewind(self.base);
            }
        } else if let Some((s, _)) = state {
            // Forget what the learner has in a checkpoint.
            while self.base < s.persisted.min(self.next) && !self.unacked.is_empty() {
                self.unacked.pop_front();
                self.base += 1;
            }
            self.stats.persisted = s.persisted;
            self.progress
                .received
                .store(s.received, std::sync::atomic::Ordering::Relaxed);
            if s.instance != self.instance {
                // A learner (re)started: it has `received`; resend from there.
                self.instance = s.instance;
                self.gaps_seen = s.gaps;
                self.rewind(s.received);
            } else if s.received < self.sent {
                if s.received > self.last_progress.0 {
                    self.last_progress = (s.received, Instant::now());
                }
                let quiet_ms = self.last_progress.1.elapsed().as_secs_f64() * 1e3;
                if s.gaps > self.gaps_seen {
                    // The learner refused a batch after a missing one: resend from what it has
                    // (once per position, unless that resend went missing too).
                    self.gaps_seen = s.gaps;
                    if s.received != self.last_rewind.0
                        || self.last_rewind.1.elapsed().as_secs_f64() * 1e3 > self.cfg.resend_ms
                    {
                        self.rewind(s.received);
                    }
                } else if s.queued == 0
                    && quiet_ms > self.cfg.resend_ms
                    && self.last_send.elapsed().as_secs_f64() * 1e3 > self.cfg.resend_ms
                {
                    // An idle learner, no progress for a while and nothing new sent: the tail
                    // went missing. (A busy learner is slow, not lossy: no resend.)
                    self.rewind(s.received);
                    self.last_progress = (s.received, Instant::now());
                }
            }
        }
        if self.sent < self.next
            && self.last_send.elapsed().as_secs_f64() * 1e3 >= self.cfg.flush_ms
        {
            self.flush();
        }
    }

    fn rewind(&mut self, to: u64) {
        let to = to.max(self.base);
        self.last_rewind = (to, Instant::now());
        if to < self.sent {
            self.stats.resent += self.sent - to;
            self.sent = to;
        }
    }

    /// Sends every queued step not sent yet, in batches.
    pub fn flush(&mut self) {
        while self.sent < self.next {
            let from = (self.sent - self.base) as usize;
            let n = ((self.next - self.sent) as usize).min(self.cfg.batch_steps);
            self.batch.first_seq = self.sent;
            self.batch.held_from = self.base;
            self.batch.steps.clear();
            self.batch
                .steps
                .extend(self.unacked.range(from..from + n).cloned());
            msg::encode_into(&self.batch, &mut self.buf);
            if let Err(e) = self.publisher.put(self.buf.as_slice()).wait() {
                tracing::warn!("sending transitions on {}: {e}", self.key);
                return;
            }
            self.sent += n as u64;
            self.stats.batches += 1;
            self.last_send = Instant::now();
        }
    }

    /// Waits up to `drain_s` for the learner to persist everything sent; returns the counters.
    pub fn finish(mut self) -> LinkStats {
        let t0 = Instant::now();
        self.flush();
        while self.base < self.next && t0.elapsed().as_secs_f64() < self.cfg.drain_s {
            std::thread::sleep(Duration::from_millis(20));
            self.tick();
        }
        if self.base < self.next {
            tracing::warn!(
                "{} steps were not persisted by a learner before the actor stopped",
                self.next - self.base
            );
        }
        self.stats()
    }

    /// Counters so far.
    pub fn stats(&self) -> LinkStats {
        let g = self.shared.lock().expect("link state");
        LinkStats {
            swaps: g.swaps,
            weights_version: g.in_use,
            learner_instances: g.instances,
            ..self.stats.clone()
        }
    }
}
