//! The policy interface and the two ways the loop runs a policy.
//!
//! - [`PolicyThread`]: the policy runs on its own thread from the newest observation, as fast as
//!   it can, and hands back action chunks through a triple buffer. The loop never waits for it.
//!   This is how a robot runs (inference takes 1-300 ms, the loop ticks every 1-50 ms).
//! - inline: the loop calls the policy itself when a new chunk is due. Only for simulated time,
//!   where waiting costs nothing and keeps a run reproducible.

use crate::chunk::ActionChunk;
use crate::msg::Observation;
use crate::triple::{Reader, Writer, triple};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use reflex_contracts::policy::{ChunkPrefix, ChunkSpec, PastObs, Policy, PolicyError};

/// An observation handed to the policy thread, with the loop time it belongs to.
#[derive(Clone, Debug, Default)]
pub struct TimedObs {
    /// Loop time of the observation.
    pub t: Duration,
    /// The observation.
    pub obs: Observation,
    /// Episode generation: chunks from an older generation are discarded by the loop.
    pub generation: u64,
    /// The loop period: the spacing of the chunk's actions.
    pub dt: Duration,
    /// What the robot executes while this chunk is computed (`len * dim` values, robot units;
    /// the first `covered` rows are valid), for a policy that wants it.
    pub prefix: Vec<f32>,
    /// Rows of `prefix` the executing chunk covers (0: none, or the policy does not want it).
    pub covered: usize,
    /// Rows the robot will execute from it before this chunk arrives (estimated delay).
    pub delay: usize,
    /// The newest chunk the loop had taken when it asked (its `seq`): a request made before the
    /// loop saw the policy's latest chunk is stale and not answered.
    pub seen: u64,
    /// The observations of the control steps before `obs`, oldest first ([`Policy::past_steps`]).
    pub past: Vec<Observation>,
}

/// A chunk with the generation of the observation it came from.
#[derive(Clone, Debug, Default)]
pub struct TimedChunk {
    /// The chunk (its `t_start` is the observation time).
    pub chunk: ActionChunk,
    /// Generation of the observation.
    pub generation: u64,
    /// Inference time, for the status and the recorder.
    pub latency: Duration,
}

/// A policy's recent delays, from the loop's request to the tick it takes the chunk (on the
/// loop's clock, so the hand-over is included and simulated time works), for a conservative
/// estimate of the next one: the largest of the last 16 (a policy whose time varies is assumed
/// to take its worst recent time; the estimate follows a slower or faster policy within 16
/// chunks).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LatencyWindow {
    recent: [Duration; 16],
    filled: usize,
    next: usize,
}

impl LatencyWindow {
    /// Adds one delay.
    pub fn push(&mut self, d: Duration) {
        self.recent[self.next] = d;
        self.next = (self.next + 1) % self.recent.len();
        self.filled = (self.filled + 1).min(self.recent.len());
    }

    /// The estimate: the largest recent delay (zero before the first).
    pub fn estimate(&self) -> Duration {
        self.recent[..self.filled]
            .iter()
            .copied()
            .max()
            .unwrap_or_default()
    }

    /// The estimate in control ticks of `dt`, rounded up: the rows of a chunk requested now that
    /// are in the past when it arrives.
    pub fn ticks(&self, dt: Duration) -> usize {
        let (e, dt) = (self.estimate().as_nanos(), dt.as_nanos().max(1));
        e.div_ceil(dt) as usize
    }
}

/// Counters of the policy thread.
#[derive(Default)]
pub struct PolicyStats {
    /// Chunks produced.
    pub chunks: AtomicU64,
    /// Inference failures.
    pub errors: AtomicU64,
    /// Last inference time, ns.
    pub last_latency_ns: AtomicU64,
}

/// A policy running on its own thread.
pub struct PolicyThread {
    obs_tx: Writer<TimedObs>,
    chunk_rx: Reader<TimedChunk>,
    stop: Arc<AtomicBool>,
    stats: Arc<PolicyStats>,
    thread: Option<JoinHandle<()>>,
    spec: ChunkSpec,
    wants_prefix: bool,
    past_steps: usize,
    seen: u64,
}

impl PolicyThread {
    /// Starts `policy` on a thread named `policy`; `obs_template` sizes the buffers (so the loop
    /// does not allocate when it hands observations over).
    pub fn spawn(mut policy: Box<dyn Policy>, obs_template: &Observation) -> Self {
        let spec = policy.chunk_spec();
        let wants_prefix = policy.wants_prefix();
        let past_steps = policy.past_steps();
        let (obs_tx, mut obs_rx) = triple(TimedObs {
            t: Duration::ZERO,
            obs: obs_template.clone(),
            generation: 0,
            dt: Duration::ZERO,
            prefix: vec![0.0; if wants_prefix { spec.len * spec.dim } else { 0 }],
            covered: 0,
            delay: 0,
            seen: 0,
            past: vec![obs_template.clone(); past_steps],
        });
        let mut chunk_template = TimedChunk {
            chunk: ActionChunk::with_capacity(spec.len, spec.dim),
            generation: 0,
            latency: Duration::ZERO,
        };
        chunk_template.chunk.data.resize(spec.len * spec.dim, 0.0);
        let (mut chunk_tx, chunk_rx) = triple(chunk_template);
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(PolicyStats::default());
        let (s, st) = (stop.clone(), stats.clone());
        let thread = std::thread::Builder::new()
            .name("policy".into())
            .spawn(move || {
                let mut seq = 0;
                while !s.load(Ordering::Relaxed) {
                    if !obs_rx.update() {
                        // Woken by the loop's unpark when an observation is ready.
                        std::thread::park_timeout(Duration::from_millis(5));
                        continue;
                    }
                    let o = obs_rx.get();
                    if o.seen < seq {
                        // Asked before the loop took the chunk just produced: the loop asks
                        // again, with what it now executes, when it needs the next one.
                        continue;
                    }
                    let t0 = Instant::now();
                    if !o.past.is_empty() {
                        policy.observe_past(&o.past);
                    }
                    let slot = chunk_tx.slot();
                    slot.chunk.data.resize(spec.len * spec.dim, 0.0);
                    let result = if o.covered > 0 {
                        let prefix = ChunkPrefix {
                            actions: &o.prefix,
                            covered: o.covered,
                            delay: o.delay,
                        };
                        policy.infer_with_prefix(&o.obs, &prefix, &mut slot.chunk.data)
                    } else {
                        policy.infer(&o.obs, &mut slot.chunk.data)
                    };
                    match result {
                        Ok(()) => {
                            seq += 1;
                            slot.chunk.t_start = o.t;
                            slot.chunk.dt = o.dt;
                            slot.chunk.len = spec.len;
                            slot.chunk.dim = spec.dim;
                            slot.chunk.seq = seq;
                            slot.generation = o.generation;
                            slot.latency = t0.elapsed();
                            st.last_latency_ns
                                .store(slot.latency.as_nanos() as u64, Ordering::Relaxed);
                            st.chunks.fetch_add(1, Ordering::Relaxed);
                            chunk_tx.publish();
                        }
                        Err(e) => {
                            st.errors.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!("{e}");
                        }
                    }
                }
            })
            .expect("spawn the policy thread");
        PolicyThread {
            obs_tx,
            chunk_rx,
            stop,
            stats,
            thread: Some(thread),
            spec,
            wants_prefix,
            past_steps,
            seen: 0,
        }
    }

    /// The chunk shape.
    pub fn spec(&self) -> ChunkSpec {
        self.spec
    }

    /// Hands the newest observation (taken at loop time `t`; the loop ticks every `dt`) to the
    /// policy. Never blocks; copies into a preallocated slot.
    pub fn request(&mut self, t: Duration, dt: Duration, obs: &Observation, generation: u64) {
        self.request_with_prefix(t, dt, obs, &[], generation, |_| (0, 0));
    }

    /// Observations of earlier steps the policy reads ([`Policy::past_steps`]).
    pub fn past_steps(&self) -> usize {
        self.past_steps
    }

    /// Whether the policy uses what the robot executes meanwhile ([`Self::request_with_prefix`]).
    pub fn wants_prefix(&self) -> bool {
        self.wants_prefix
    }

    /// As [`Self::request`], with the observations of the steps before (`past`, oldest first,
    /// for a policy that reads them); when the policy wants it, `prefix` writes the executing chunk's
    /// actions at the new chunk's times into the slot's buffer (`len * dim` values) and returns
    /// the rows it covered and the estimated delay in rows. Never blocks, never allocates.
    pub fn request_with_prefix(
        &mut self,
        t: Duration,
        dt: Duration,
        obs: &Observation,
        past: &[Observation],
        generation: u64,
        prefix: impl FnOnce(&mut [f32]) -> (usize, usize),
    ) {
        let wants = self.wants_prefix;
        let slot = self.obs_tx.slot();
        slot.t = t;
        slot.dt = dt;
        slot.generation = generation;
        slot.obs.copy_from(obs);
        for (dst, src) in slot.past.iter_mut().zip(past) {
            dst.copy_from(src);
        }
        slot.seen = self.seen;
        (slot.covered, slot.delay) = if wants {
            prefix(&mut slot.prefix)
        } else {
            (0, 0)
        };
        self.obs_tx.publish();
        if let Some(th) = &self.thread {
            th.thread().unpark();
        }
    }

    /// A new chunk, if one arrived since the last call.
    pub fn poll(&mut self) -> Option<&TimedChunk> {
        if self.chunk_rx.update() {
            self.seen = self.chunk_rx.get().chunk.seq;
            Some(self.chunk_rx.get())
        } else {
            None
        }
    }

    /// Counters.
    pub fn stats(&self) -> &PolicyStats {
        &self.stats
    }
}

impl Drop for PolicyThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}
