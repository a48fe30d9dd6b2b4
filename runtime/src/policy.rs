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

pub use reflex_contracts::policy::{ChunkSpec, Policy, PolicyError};

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
}

impl PolicyThread {
    /// Starts `policy` on a thread named `policy`; `obs_template` sizes the buffers (so the loop
    /// does not allocate when it hands observations over).
    pub fn spawn(mut policy: Box<dyn Policy>, obs_template: &Observation) -> Self {
        let spec = policy.chunk_spec();
        let (obs_tx, mut obs_rx) = triple(TimedObs {
            t: Duration::ZERO,
            obs: obs_template.clone(),
            generation: 0,
            dt: Duration::ZERO,
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
                    let t0 = Instant::now();
                    let slot = chunk_tx.slot();
                    slot.chunk.data.resize(spec.len * spec.dim, 0.0);
                    match policy.infer(&o.obs, &mut slot.chunk.data) {
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
        }
    }

    /// The chunk shape.
    pub fn spec(&self) -> ChunkSpec {
        self.spec
    }

    /// Hands the newest observation (taken at loop time `t`; the loop ticks every `dt`) to the
    /// policy. Never blocks; copies into a preallocated slot.
    pub fn request(&mut self, t: Duration, dt: Duration, obs: &Observation, generation: u64) {
        let slot = self.obs_tx.slot();
        slot.t = t;
        slot.dt = dt;
        slot.generation = generation;
        slot.obs.copy_from(obs);
        self.obs_tx.publish();
        if let Some(th) = &self.thread {
            th.thread().unpark();
        }
    }

    /// A new chunk, if one arrived since the last call.
    pub fn poll(&mut self) -> Option<&TimedChunk> {
        if self.chunk_rx.update() {
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
