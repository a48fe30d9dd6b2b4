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

mod learner;
pub use learner::*;

use reflex_contracts::keys::Keys;
use reflex_contracts::msg::{
    self, LearnerState, PROTOCOL_VERSION, StepFeatures, TransitionBatch, WeightsChunk, WireStep,
};
use reflex_runtime::outbox::Transition;
use reflex_runtime::residual::WeightsWriter;
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
    /// Steps sent ahead of what the learner has taken, at most: the rest wait in the actor
    /// (back-pressure), so the learner's bounded queue does not overflow under normal load.
    pub max_in_flight: usize,
    /// When new weights reach the loop.
    pub swap: SwapPoint,
    /// At the end of a run, wait this long for the learner to persist the last steps, s.
    pub drain_s: f64,
}

/// Most feature-map bytes an actor keeps for a learner that has not persisted them (a learner
/// gone for a long time costs the robot at most this much memory; older steps are dropped and
/// counted as `lost`).
pub const MAX_UNACKED_FEATURE_BYTES: u64 = 2_000_000_000;

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            batch_steps: 64,
            flush_ms: 50.0,
            resend_ms: 5000.0,
            max_unacked: 2_000_000,
            max_in_flight: 16_384,
            swap: SwapPoint::Episode,
            drain_s: 10.0,
        }
    }
}

impl reflex_contracts::config::Validate for LinkConfig {
    fn validate(&self, p: &str) -> Result<(), reflex_contracts::config::Invalid> {
        use reflex_contracts::config::in_range;
        in_range(p, "batch_steps", self.batch_steps, 1, 65_536)?;
        in_range(p, "flush_ms", self.flush_ms, 1.0, 60_000.0)?;
        in_range(p, "resend_ms", self.resend_ms, 10.0, 600_000.0)?;
        in_range(p, "max_unacked", self.max_unacked, 1_000, 1_000_000_000)?;
        in_range(p, "max_in_flight", self.max_in_flight, 64, 100_000_000)?;
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
    /// Steps no learner had persisted when the actor stopped (after waiting `drain_s`): they
    /// are gone with the actor unless a learner still holds them in memory and checkpoints later.
    pub unpersisted_at_exit: u64,
    /// Steps the learner has persisted.
    pub persisted: u64,
    /// Weight versions handed to the loop's residual hook.
    pub swaps: u64,
    /// Newest weight version handed over.
    pub weights_version: u64,
    /// Learner processes seen (a restart counts anew).
    pub learner_instances: u64,
    /// Weight messages rejected (another architecture, out of range, not finite, undecodable).
    pub rejected_weights: u64,
    /// Why a fleet's learner refused this actor's steps, if one did (its robot's spec differs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused_by_learner: Option<String>,
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

/// The weights an actor's hook can evaluate: their length and architecture tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightsShape {
    /// Values in one version.
    pub len: usize,
    /// Architecture tag (see [`WeightsChunk::arch`]).
    pub arch: u64,
}

/// What the Zenoh callbacks share with the link.
struct Shared {
    state: Option<(LearnerState, Instant)>,
    refused: Option<String>,
    instances: u64,
    shape: WeightsShape,
    // Weight assembly: the version being assembled and which values have arrived.
    asm_version: u64,
    asm: Vec<f32>,
    asm_got: Vec<bool>,
    asm_have: usize,
    ready: Option<(u64, Vec<f32>)>,
    writer: WeightsWriter,
    in_use: u64,
    swaps: u64,
    rejects: Arc<crate::Rejects>,
}

impl Shared {
    /// Takes one chunk. A chunk for another architecture, of another length, out of range, or a
    /// version with a value that is not finite (a diverged learner) is rejected and counted; the
    /// loop stays on its last good weights.
    fn take_chunk(&mut self, c: &WeightsChunk) {
        if c.version <= self.in_use || self.ready.as_ref().is_some_and(|r| r.0 >= c.version) {
            return; // old news
        }
        if (c.arch != 0 && c.arch != self.shape.arch) || c.total as usize != self.shape.len {
            return self.rejects.reject(&format!(
                "weights v{} are for a network of {} values (architecture {:x}); this actor's has {} ({:x}): a learner with other layer sizes or mode?",
                c.version, c.total, c.arch, self.shape.len, self.shape.arch
            ));
        }
        let (o, n) = (c.offset as usize, c.values.len());
        if o.checked_add(n).is_none_or(|end| end > self.shape.len) {
            return self.rejects.reject(&format!(
                "weights v{} chunk at {o} of {n} values runs past {}",
                c.version, self.shape.len
            ));
        }
        if c.version != self.asm_version {
            self.asm_version = c.version;
            self.asm.resize(self.shape.len, 0.0);
            self.asm_got.clear();
            self.asm_got.resize(self.shape.len, false);
            self.asm_have = 0;
        }
        for i in o..o + n {
            self.asm_have += !self.asm_got[i] as usize;
            self.asm_got[i] = true;
            self.asm[i] = c.values[i - o];
        }
        if self.asm_have == self.shape.len {
            self.asm_have = 0;
            self.asm_got.fill(false);
            if let Some(i) = self.asm.iter().position(|v| !v.is_finite()) {
                return self.rejects.reject(&format!(
                    "weights v{} hold {} at index {i}: the learner diverged; keeping v{}",
                    c.version, self.asm[i], self.in_use
                ));
            }
            self.ready = Some((self.asm_version, self.asm.clone()));
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

/// Follows the learner's reports about this actor (or about no actor yet) on `learn/state`.
fn state_subscriber(
    session: &zenoh::Session,
    keys: &Keys,
    id: u64,
    shared: Arc<Mutex<Shared>>,
    rejects: Arc<crate::Rejects>,
) -> Result<zenoh::pubsub::Subscriber<()>, zenoh::Error> {
    crate::subscribe_decoded(
        session,
        &keys.learn_state,
        rejects,
        move |m: LearnerState| {
            if m.actor == id && !m.refused.is_empty() {
                // A fleet's learner that will not take this robot's steps: said once per
                // reason; the steps stay held as if no learner were there.
                let mut g = shared.lock().expect("link state");
                if g.refused.as_deref() != Some(m.refused.as_str()) {
                    tracing::error!("the learner refuses this actor's steps: {}", m.refused);
                    g.refused = Some(m.refused);
                }
            } else if m.actor == id || m.actor == 0 {
                let mut g = shared.lock().expect("link state");
                if g.state
                    .as_ref()
                    .is_none_or(|(o, _)| o.instance != m.instance)
                {
                    g.instances += 1;
                }
                g.state = Some((m, Instant::now()));
            }
        },
    )
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
    /// What the learner reported it has taken (sends stay within `max_in_flight` of it).
    learner_received: u64,
    last_send: Instant,
    last_progress: (u64, Instant),
    instance: u64,
    gaps_seen: u64,
    last_rewind: (u64, Instant),
    progress: Arc<LinkProgress>,
    batch: TransitionBatch,
    buf: Vec<u8>,
    stats: LinkStats,
    rejects: Vec<Arc<crate::Rejects>>,
    /// A learner that sees: the encoder id and map shapes every step's maps go out with.
    features: Option<StepFeatures>,
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

pub(crate) fn err(key: &str, e: impl std::fmt::Display) -> LinkError {
    LinkError {
        key: key.to_string(),
        message: e.to_string(),
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
        shape: WeightsShape,
    ) -> Result<Self, LinkError> {
        let id = rand::random::<u64>() | 1;
        let publisher = session
            .declare_publisher(keys.learn_transitions.clone())
            // Reliable is Zenoh's default; Block: a full queue slows this (consumer) thread
            // rather than dropping steps.
            .congestion_control(zenoh::qos::CongestionControl::Block)
            .wait()
            .map_err(|e| err(&keys.learn_transitions, e))?;
        let rejects = crate::Rejects::new(&keys.learn_weights);
        let shared = Arc::new(Mutex::new(Shared {
            state: None,
            refused: None,
            instances: 0,
            shape,
            asm_version: 0,
            asm: Vec::with_capacity(shape.len),
            asm_got: Vec::with_capacity(shape.len),
            asm_have: 0,
            ready: None,
            writer,
            in_use: 0,
            swaps: 0,
            rejects: rejects.clone(),
        }));
        let state_rejects = crate::Rejects::new(&keys.learn_state);
        let subs = vec![
            state_subscriber(session, keys, id, shared.clone(), state_rejects.clone())
                .map_err(|e| err(&keys.learn_state, e))?,
            crate::subscribe_decoded(session, &keys.learn_weights, rejects.clone(), {
                let sh = shared.clone();
                move |c: WeightsChunk| sh.lock().expect("link state").take_chunk(&c)
            })
            .map_err(|e| err(&keys.learn_weights, e))?,
        ];
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
            learner_received: 0,
            last_send: now,
            last_progress: (0, now),
            instance: 0,
            gaps_seen: 0,
            last_rewind: (u64::MAX, now),
            progress: Arc::new(LinkProgress::default()),
            buf: Vec::with_capacity(64 * 1024),
            stats: LinkStats::default(),
            rejects: vec![rejects, state_rejects],
            features: None,
            _subs: subs,
            _token: token,
        })
    }

    /// Shared counters to follow the learner from another thread (see [`LinkProgress`]).
    pub fn progress(&self) -> Arc<LinkProgress> {
        self.progress.clone()
    }

    /// Rejection counters of the keys the link reads (weights, learner state), for the status.
    pub fn rejects(&self) -> Vec<Arc<crate::Rejects>> {
        self.rejects.clone()
    }

    /// This actor's identity on the link.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Sends each step's feature maps (a learner that sees), named by the frozen encoder that
    /// made them and shaped `[channels, height, width]` per camera. Steps with maps are large,
    /// so the unacknowledged backlog is also held under [`MAX_UNACKED_FEATURE_BYTES`] of maps.
    pub fn with_features(mut self, encoder: String, shapes: Vec<[u32; 3]>) -> Self {
        let values: u64 = shapes
            .iter()
            .map(|s| s.iter().map(|d| *d as u64).product::<u64>())
            .sum();
        let per_step = (8 * values).max(1);
        let fit = (MAX_UNACKED_FEATURE_BYTES / per_step).max(1_000) as usize;
        if fit < self.cfg.max_unacked {
            tracing::info!(
                "learner link: steps carry {} KB of feature maps; at most {fit} unacknowledged steps are kept (not {})",
                per_step / 1000,
                self.cfg.max_unacked
            );
            self.cfg.max_unacked = fit;
        }
        self.features = Some(StepFeatures {
            encoder,
            shapes,
            ..Default::default()
        });
        self
    }

    /// Numbers a step and queues it; at an episode boundary, swaps in waiting weights
    /// ([`SwapPoint::Episode`]) and sends at once.
    pub fn offer(&mut self, t: &Transition) {
        let mut w = WireStep::default();
        t.to_wire(&mut w);
        if let Some(h) = &self.features {
            w.features = Some(StepFeatures {
                encoder: h.encoder.clone(),
                shapes: h.shapes.clone(),
                obs: t.features.clone(),
                next_obs: t.next_features.clone(),
            });
        }
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
            self.learner_received = self.base;
        } else if let Some((s, _)) = state {
            self.learner_received = s.received;
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

    /// Sends queued steps not sent yet, in batches, as far as `max_in_flight` allows.
    pub fn flush(&mut self) {
        let limit = self
            .learner_received
            .max(self.base)
            .saturating_add(self.cfg.max_in_flight as u64);
        while self.sent < self.next.min(limit) {
            let from = (self.sent - self.base) as usize;
            let n = ((self.next.min(limit) - self.sent) as usize).min(self.cfg.batch_steps);
            self.batch.first_seq = self.sent;
            self.batch.held_from = self.base;
            self.batch.offered = self.next;
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

    /// Asks the learner to persist what it holds now (an empty batch marked `flush`).
    fn request_flush(&mut self) {
        self.batch.first_seq = self.sent;
        self.batch.held_from = self.base;
        self.batch.offered = self.next;
        self.batch.steps.clear();
        self.batch.flush = true;
        msg::encode_into(&self.batch, &mut self.buf);
        self.batch.flush = false;
        if let Err(e) = self.publisher.put(self.buf.as_slice()).wait() {
            tracing::warn!("asking the learner to persist on {}: {e}", self.key);
        }
    }

    /// Sends what is left, asks the learner to persist it at once, and waits up to `drain_s`
    /// for that; returns the counters. Whatever the learner has not persisted by then is lost
    /// with the actor, and reported.
    pub fn finish(mut self) -> LinkStats {
        let t0 = Instant::now();
        self.flush();
        let mut asked = None::<Instant>;
        while self.base < self.next && t0.elapsed().as_secs_f64() < self.cfg.drain_s {
            // Asked again every half second, whether or not every step is out yet: a request or
            // an answer lost to congestion must not leave the actor waiting out `drain_s`.
            if asked.is_none_or(|t| t.elapsed() > Duration::from_millis(500)) {
                self.request_flush();
                asked = Some(Instant::now());
            }
            std::thread::sleep(Duration::from_millis(20));
            self.tick();
        }
        if self.base < self.next {
            tracing::warn!(
                "{} steps were not persisted by a learner before the actor stopped (waited {:.0} s, `drain_s`)",
                self.next - self.base,
                self.cfg.drain_s
            );
        }
        let mut stats = self.stats();
        stats.unpersisted_at_exit = self.next - self.base;
        stats
    }

    /// Counters so far.
    pub fn stats(&self) -> LinkStats {
        let g = self.shared.lock().expect("link state");
        LinkStats {
            swaps: g.swaps,
            weights_version: g.in_use,
            learner_instances: g.instances,
            rejected_weights: g.rejects.count(),
            refused_by_learner: g.refused.clone(),
            ..self.stats.clone()
        }
    }
}
