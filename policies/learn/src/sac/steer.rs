//! Diffusion steering (DSRL: Wagenmaker et al. 2025, "Steering Your Diffusion Policy with Latent
//! Space Reinforcement Learning", github.com/ajwagen/dsrl): the learner does not add to the base's
//! actions, it chooses the initial noise the frozen diffusion sampler starts from (DDIM with
//! eta = 0 is deterministic given that noise). The robot only ever executes chunks the base
//! policy can produce, so exploring never leaves the base's action manifold, and the learner
//! decides once per chunk rather than once per step: a short horizon for a sparse reward.
//!
//! [`SteeredPolicy`] is the base policy plus the learner's actor, evaluated in plain Rust from the
//! weights the learner publishes (the same flat layout and triple buffer as the residual hook).
//! Each chunk it reports the noise it chose through a [`NoiseTap`], so the learner can pair the
//! chunk with what followed.

use super::hook::MlpEval;
use super::{Mode, Sac};
use crossbeam::channel::{Receiver, Sender, bounded};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use reflex_policies::onnx_policy::OnnxPolicy;
use reflex_runtime::msg::Observation;
use reflex_runtime::policy::{ChunkSpec, Policy, PolicyError};
use reflex_runtime::residual::{Weights, WeightsWriter};
use reflex_runtime::triple::{Reader, triple};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The consumer's end of the chosen-noise stream: one record per inferred chunk, in order.
pub struct NoiseTap {
    rx: Receiver<Vec<f32>>,
    free: Sender<Vec<f32>>,
    dropped: Arc<AtomicU64>,
}

impl NoiseTap {
    /// The next chosen noise (learner units: `noise_bound * tanh(u)`), if one is waiting.
    pub fn try_recv(&self) -> Option<Vec<f32>> {
        self.rx.try_recv().ok()
    }

    /// Returns a record's buffer for reuse.
    pub fn recycle(&self, v: Vec<f32>) {
        let _ = self.free.try_send(v);
    }

    /// Records the policy could not hand over (no free buffer: the consumer fell behind).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// The base diffusion policy steered by the learner's noise actor.
pub struct SteeredPolicy {
    base: OnnxPolicy,
    mlp: MlpEval,
    weights: Reader<Weights>,
    version: u64,
    bound: f32,
    log_std: (f32, f32),
    explore: bool,
    rng: ChaCha8Rng,
    noise: Vec<f32>,
    out: Sender<Vec<f32>>,
    free: Receiver<Vec<f32>>,
    dropped: Arc<AtomicU64>,
    refresh_due: bool,
}

/// Why a base policy cannot be steered by a learner.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("diffusion steering: {0}")]
pub struct SteerError(pub String);

impl SteeredPolicy {
    /// Wraps `base` (a diffusion or flow policy) with the noise actor of `sac` (mode `noise`, its
    /// action dimension the chunk's `chunk_len x action_dim`). Returns the policy, the writer the
    /// learner publishes new weights through (taken when an episode starts), and the tap of the
    /// chosen noise. `explore` samples from the actor's Gaussian; otherwise the mean is used.
    pub fn new(
        base: OnnxPolicy,
        sac: &Sac,
        explore: bool,
        seed: u64,
    ) -> Result<(Self, WeightsWriter, NoiseTap), SteerError> {
        if sac.cfg.mode != Mode::Noise {
            return Err(SteerError(format!(
                "diffusion steering needs a learner in mode `noise`, not `{:?}`",
                sac.cfg.mode
            )));
        }
        let n = base.noise_len();
        if n == 0 {
            return Err(SteerError(format!(
                "policy `{}` is not a diffusion or flow policy: it has no initial noise to steer",
                base.spec().name
            )));
        }
        if sac.act_dim != n {
            return Err(SteerError(format!(
                "the learner's actor chooses {} values but policy `{}` starts each chunk from {} \
                 (chunk_len x action_dim)",
                sac.act_dim,
                base.spec().name,
                n
            )));
        }
        let mut dims = vec![sac.obs_dim];
        dims.extend_from_slice(&sac.cfg.hidden);
        dims.push(2 * n);
        let w = super::hook::export_actor(sac).map_err(|e| SteerError(e.to_string()))?;
        let (mut writer, reader) = triple(Weights {
            version: 0,
            values: w.clone(),
        });
        writer.write(|s| s.values.clone_from(&w));
        let (out, rx) = bounded(64);
        let (free_tx, free) = bounded(64);
        for _ in 0..64 {
            let _ = free_tx.try_send(vec![0.0; n]);
        }
        let dropped = Arc::new(AtomicU64::new(0));
        let p = SteeredPolicy {
            base,
            mlp: MlpEval::new(dims, sac.cfg.actor_layer_norm),
            weights: reader,
            version: 0,
            bound: sac.cfg.noise_bound,
            log_std: sac.cfg.log_std,
            explore,
            rng: ChaCha8Rng::seed_from_u64(seed),
            noise: vec![0.0; n],
            out,
            free,
            dropped: dropped.clone(),
            refresh_due: true,
        };
        let tap = NoiseTap {
            rx,
            free: free_tx,
            dropped,
        };
        Ok((p, WeightsWriter::from_writer(writer), tap))
    }

    /// Version of the weights in use.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The noise chosen for the last chunk (learner units).
    pub fn last_noise(&self) -> &[f32] {
        &self.noise
    }
}

impl Policy for SteeredPolicy {
    fn name(&self) -> &str {
        self.base.spec().name.as_str()
    }

    fn chunk_spec(&self) -> ChunkSpec {
        self.base.chunk_spec()
    }

    fn past_steps(&self) -> usize {
        self.base.past_steps()
    }

    fn observe_past(&mut self, past: &[Observation]) {
        self.base.observe_past(past);
    }

    /// New weights are taken at the first chunk of an episode, never inside one.
    fn reset(&mut self) {
        self.refresh_due = true;
        self.base.reset();
    }

    fn infer(&mut self, obs: &Observation, out: &mut [f32]) -> Result<(), PolicyError> {
        let n = self.noise.len();
        if std::mem::take(&mut self.refresh_due) {
            self.weights.update();
            self.version = self.weights.get().version;
        }
        let w = &self.weights.get().values;
        let input = self.mlp.input();
        if input.len() != obs.state.len() {
            return Err(PolicyError {
                policy: self.base.spec().name.clone(),
                message: format!(
                    "the steering actor takes a state of {} values, the robot sent {}",
                    input.len(),
                    obs.state.len()
                ),
            });
        }
        input.copy_from_slice(&obs.state);
        let head = self.mlp.run(w);
        for k in 0..n {
            let mut u = head[k];
            if self.explore {
                let ls = head[n + k].clamp(self.log_std.0, self.log_std.1);
                let e: f32 = StandardNormal.sample(&mut self.rng);
                u += ls.exp() * e;
            }
            self.noise[k] = self.bound * u.tanh();
        }
        self.base.set_next_noise_from(&self.noise);
        self.base.infer_chunk(obs, out)?;
        match self.free.try_recv() {
            Ok(mut v) => {
                v.copy_from_slice(&self.noise);
                if self.out.try_send(v).is_err() {
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(_) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }
}
