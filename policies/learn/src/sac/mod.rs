//! Soft actor-critic in candle, in three modes over the same machinery:
//!
//! - `residual` (default, ResFiT-style): the actor sees observation + base action and outputs
//!   `action_scale * tanh(.)`, its mean head starting at exactly zero; the combined action
//!   `clamp(base + residual, -1, 1)` is what the critic scores and what is stored.
//! - `full`: ordinary SAC on the whole action (the from-scratch baseline).
//! - `noise` (DSRL): the actor chooses the base sampler's initial noise, bounded by `noise_bound`;
//!   the critic scores the noise.
//!
//! Defaults follow RLPD / HIL-SERL (../shared/design/recipes.md; docs/learner.md says which value
//! comes from where). All randomness (batches, ensemble subsets, actor noise, initialisation) comes
//! from one seeded generator, so the same seed gives the same parameters.

/// Adam / AdamW by hand (reflex-mlp's).
pub use reflex_mlp::adam;
mod augment;
mod byhand;
pub mod checkpoint;
pub mod export;
pub use reflex_mlp::gemm;
pub mod hil;
pub mod hook;
pub mod nets;
pub mod replay;
pub mod steer;

use adam::{Adam, AdamConfig};
use candle_core::{Device, Tensor, Var};
use nets::{Actor, Ensemble, randn};
use rand::Rng;
use rand::seq::index::sample as sample_indices;
use rand_chacha::ChaCha8Rng;
use reflex_runtime::config::{Invalid, Validate, in_range, key};
pub use reflex_vision::head::FeatureShape;
use reflex_vision::head::{HeadDims, SpatialHead};
use replay::{Batch, NStep, Replay, sample_mixed};
use serde::{Deserialize, Serialize};

/// What the actor controls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// A bounded correction added to the base action.
    Residual,
    /// The whole action.
    Full,
    /// The initial noise of the base policy's sampler.
    Noise,
}

/// Learner settings (`[learner]` in a config). Defaults: RLPD's SAC core with HIL-SERL's buffer
/// ratio; see docs/learner.md.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SacConfig {
    /// residual | full | noise.
    pub mode: Mode,
    /// Hidden widths of actor and critics.
    pub hidden: Vec<usize>,
    /// Critics in the ensemble.
    pub critics: usize,
    /// Critics the target takes the minimum over (a random subset, redrawn every update).
    pub critic_subset: usize,
    /// LayerNorm after every hidden layer of the critics.
    pub critic_layer_norm: bool,
    /// LayerNorm in the actor.
    pub actor_layer_norm: bool,
    /// Actor learning rate.
    pub actor_lr: f64,
    /// Critic learning rate.
    pub critic_lr: f64,
    /// Temperature learning rate.
    pub temperature_lr: f64,
    /// Decoupled weight decay (0 = Adam).
    pub weight_decay: f64,
    /// Gradient-norm clip (None = off).
    pub max_grad_norm: Option<f64>,
    /// Discount.
    pub discount: f32,
    /// Polyak rate of the target critics.
    pub tau: f64,
    /// n-step returns.
    pub n_step: usize,
    /// Bootstrap through time-limit truncations.
    pub bootstrap_truncation: bool,
    /// Initial temperature.
    pub init_temperature: f64,
    /// Target entropy (default -|A|/2).
    pub target_entropy: Option<f64>,
    /// Subtract `alpha log pi` in the critic target.
    pub entropy_in_target: bool,
    /// Critic updates per environment step (update-to-data ratio).
    pub utd: usize,
    /// Actor and temperature update every this many environment steps.
    pub actor_every: usize,
    /// Batch size.
    pub batch: usize,
    /// Fraction of each batch from the demonstration/intervention buffer.
    pub demo_ratio: f64,
    /// Residual bound (residual mode), in normalised action units.
    pub action_scale: f32,
    /// Residual bounds per action component (residual mode), replacing `action_scale` for each;
    /// empty: `action_scale` everywhere. For a gripper that needs more reach than the motion,
    /// or the reverse (tried on `reflex demo --vision`, where a uniform bound did better:
    /// docs/training.md).
    pub action_scales: Vec<f32>,
    /// Noise bound (noise mode).
    pub noise_bound: f32,
    /// Log-std clip of the actor.
    pub log_std: (f32, f32),
    /// Initial log-std of the residual actor (its last layer starts at zero with this bias): small
    /// exploration around the base at first.
    pub residual_init_log_std: f32,
    /// Capacity of each buffer.
    pub capacity: usize,
    /// Environment steps before the first update.
    pub warmup_steps: usize,
    /// Weight of a behaviour-cloning term on the batch's demonstration/intervention rows in the
    /// actor loss: `bc_weight * mean ||mean_action(s) - a_person||^2` (0 = off, plain SAC as in
    /// RLPD and HIL-SERL). The Q-plus-BC actor objective of TD3+BC (Fujimoto & Gu 2021) and of
    /// ConRFT's human-in-the-loop stage (Chen et al. 2025): a person's corrections pull the
    /// policy directly instead of only through the critic.
    pub bc_weight: f64,
    /// Affine scaling of the state before every network: `(s - center) / half` per component.
    /// Positions in metres differ by centimetres where a grasp is decided; unscaled, such
    /// differences are lost next to velocities of several rad/s. `reflex demo` and `reflex learn`
    /// set it from the base policy's own input normalisation; absent, the state is used as is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub obs_norm: Option<ObsNorm>,
    /// Learning from pixels (`[learner.vision]`, resolved from the frozen encoder's spec): each
    /// observation row carries, after the state, one feature map per camera; a trainable head per
    /// camera (SERL's, [`reflex_vision::head`]) turns it into 256 features beside the scaled
    /// state. Absent: the learner reads the state only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vision: Option<VisionHeads>,
    /// Seed.
    pub seed: u64,
}

fn d_true() -> bool {
    true
}
fn d_embeddings() -> usize {
    reflex_vision::head::EMBEDDINGS
}
fn d_head_width() -> usize {
    reflex_vision::head::WIDTH
}

/// The learner's image heads (see [`SacConfig::vision`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VisionHeads {
    /// Identity of the frozen encoder whose feature maps the heads read (its file name and a
    /// digest of its bytes): steps encoded by another encoder are refused.
    pub encoder_id: String,
    /// The feature maps, one per camera, in the order they follow the state in a row.
    pub features: Vec<FeatureShape>,
    /// Learned spatial embeddings per channel (SERL: 8).
    #[serde(default = "d_embeddings")]
    pub embeddings: usize,
    /// Width of each head's output (SERL: 256).
    #[serde(default = "d_head_width")]
    pub width: usize,
    /// The actor's behaviour-cloning term (`bc_weight`, on a person's corrections) also trains
    /// the heads. SERL trains them by the critic's loss alone and stops the actor's gradient at
    /// them; reflex lets the person's corrections, the one dense signal a run has, shape what the
    /// heads see too (the actor's Q term still stops at them). Measured in docs/training.md
    /// ("Learning from pixels"); `false` is SERL's recipe.
    #[serde(default = "d_true")]
    pub bc_trains_heads: bool,
    /// DrQ's random shift on the feature maps of every sampled row and its bootstrap row: up to
    /// this many places along each axis, the edge replicated (0: none, the default). SERL shifts
    /// its images by up to 4 pixels; one place of the shipped encoder's 16x16 map is 4 pixels of
    /// its 64x64 image. Measured in docs/training.md.
    #[serde(default)]
    pub shift: usize,
}

impl VisionHeads {
    /// Feature values in a row (every camera's map).
    pub fn features_len(&self) -> usize {
        self.features.iter().map(FeatureShape::len).sum()
    }

    /// The sizes of camera `k`'s head.
    pub fn dims(&self, k: usize) -> HeadDims {
        HeadDims::new(&self.features[k], self.embeddings, self.width)
    }

    /// Every camera's head sizes, in row order.
    pub fn all_dims(&self) -> Vec<HeadDims> {
        (0..self.features.len()).map(|k| self.dims(k)).collect()
    }

    /// Values the heads put beside the state (every head's output).
    pub fn seen_len(&self) -> usize {
        self.width * self.features.len()
    }

    /// What a learner with `v` reads, in words (for a refusal to resume).
    pub fn describe(v: &Option<VisionHeads>) -> String {
        let Some(v) = v else {
            return "no camera (state only)".into();
        };
        let maps: Vec<String> = v
            .features
            .iter()
            .map(|f| format!("{} {}x{}x{}", f.camera, f.channels, f.height, f.width))
            .collect();
        let trained = if v.bc_trains_heads {
            "critic and corrections"
        } else {
            "critic only"
        };
        format!(
            "encoder `{}`, maps {maps:?}, heads {}x{} trained by the {trained}",
            v.encoder_id, v.embeddings, v.width
        )
    }

    /// Whether a learner saved with heads `saved` goes on under `now`: the same encoder, maps,
    /// head sizes and the same training of the heads (`bc_trains_heads` decides which optimiser
    /// moments exist). The maps' `shift` is each batch's augmentation and shapes no parameter, so
    /// `now`'s is taken: returned as `Some((saved, now))` when it changed.
    pub fn resume(
        saved: &mut Option<VisionHeads>,
        now: &Option<VisionHeads>,
    ) -> std::result::Result<Option<(usize, usize)>, String> {
        let same = match (saved.as_ref(), now) {
            (None, None) => return Ok(None),
            (Some(a), Some(b)) => {
                *a == VisionHeads {
                    shift: a.shift,
                    ..b.clone()
                }
            }
            _ => false,
        };
        match (saved.as_mut(), now) {
            (Some(a), Some(b)) if same => {
                let was = std::mem::replace(&mut a.shift, b.shift);
                Ok((was != b.shift).then_some((was, b.shift)))
            }
            _ => Err(format!(
                "it learned from {}; [learner.vision] now says {}",
                Self::describe(saved),
                Self::describe(now)
            )),
        }
    }
}

/// Per-component centre and half width of the state (see [`SacConfig::obs_norm`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObsNorm {
    /// Centre per component.
    pub center: Vec<f32>,
    /// Half width per component (> 0).
    pub half: Vec<f32>,
}

impl ObsNorm {
    /// From per-component bounds (a policy's min-max input normalisation); half widths are kept
    /// at `min_half` or more, so a component that hardly varied in the demonstrations is not
    /// blown up.
    pub fn from_bounds(low: &[f32], high: &[f32], min_half: f32) -> Self {
        ObsNorm {
            center: low.iter().zip(high).map(|(l, h)| 0.5 * (l + h)).collect(),
            half: low
                .iter()
                .zip(high)
                .map(|(l, h)| (0.5 * (h - l)).max(min_half))
                .collect(),
        }
    }
}

impl SacConfig {
    /// The residual's bound per action component: `action_scales` when given, `action_scale`
    /// for each of the `act_dim` components otherwise.
    pub fn residual_bounds(&self, act_dim: usize) -> Vec<f32> {
        if self.action_scales.is_empty() {
            vec![self.action_scale; act_dim]
        } else {
            self.action_scales.clone()
        }
    }

    /// The residual's bound on action component `i` (see [`Self::residual_bounds`]).
    pub fn residual_bound(&self, i: usize) -> f32 {
        self.action_scales
            .get(i)
            .copied()
            .unwrap_or(self.action_scale)
    }
}

impl Default for SacConfig {
    /// A key a config leaves out takes its value from here.
    fn default() -> Self {
        SacConfig {
            mode: Mode::Residual,
            hidden: vec![256, 256],
            critics: 2,
            critic_subset: 2,
            critic_layer_norm: true,
            actor_layer_norm: false,
            actor_lr: 3e-4,
            critic_lr: 3e-4,
            temperature_lr: 3e-4,
            weight_decay: 0.0,
            max_grad_norm: None,
            discount: 0.99,
            tau: 0.005,
            n_step: 1,
            bootstrap_truncation: true,
            init_temperature: 1.0,
            target_entropy: None,
            entropy_in_target: true,
            utd: 1,
            actor_every: 1,
            batch: 256,
            demo_ratio: 0.5,
            action_scale: 0.1,
            action_scales: vec![],
            noise_bound: 1.5,
            log_std: (-20.0, 2.0),
            residual_init_log_std: -2.0,
            capacity: 1_000_000,
            warmup_steps: 0,
            bc_weight: 0.0,
            obs_norm: None,
            vision: None,
            seed: 0,
        }
    }
}

impl Validate for SacConfig {
    /// The ranges every setting keeps, named under `p` (`learner.sac` in a run config, `learner`
    /// in a demo config). Without them a zero-width layer or a zero batch reached the learner's
    /// thread and panicked it there, far from the file that said so. The number of per-component
    /// bounds is checked by [`Sac::new`], which knows the action's size.
    fn validate(&self, p: &str) -> std::result::Result<(), Invalid> {
        let bad = |field: &str, value: String, allowed: &str| Invalid {
            key: key(p, field),
            value,
            allowed: allowed.into(),
        };
        if self.hidden.is_empty() || self.hidden.iter().any(|h| !(1..=8192).contains(h)) {
            let allowed = "one or more layer widths, each 1 ..= 8192";
            return Err(bad("hidden", format!("{:?}", self.hidden), allowed));
        }
        in_range(p, "critics", self.critics, 1, 256)?;
        in_range(p, "critic_subset", self.critic_subset, 1, self.critics)?;
        in_range(p, "actor_lr", self.actor_lr, 1e-9, 1.0)?;
        in_range(p, "critic_lr", self.critic_lr, 1e-9, 1.0)?;
        in_range(p, "temperature_lr", self.temperature_lr, 0.0, 1.0)?;
        in_range(p, "weight_decay", self.weight_decay, 0.0, 1.0)?;
        if let Some(g) = self.max_grad_norm {
            in_range(p, "max_grad_norm", g, 1e-9, 1e9)?;
        }
        in_range(p, "discount", self.discount, 0.0, 1.0)?;
        in_range(p, "tau", self.tau, 1e-9, 1.0)?;
        in_range(p, "n_step", self.n_step, 1, 1000)?;
        in_range(p, "init_temperature", self.init_temperature, 1e-9, 1e6)?;
        if let Some(t) = self.target_entropy {
            in_range(p, "target_entropy", t, -1e6, 1e6)?;
        }
        in_range(p, "utd", self.utd, 1, 1000)?;
        in_range(p, "actor_every", self.actor_every, 1, 1000)?;
        in_range(p, "batch", self.batch, 1, 65_536)?;
        in_range(p, "demo_ratio", self.demo_ratio, 0.0, 1.0)?;
        in_range(p, "action_scale", self.action_scale, 0.0, 10.0)?;
        if self.action_scales.iter().any(|s| !(0.0..=10.0).contains(s)) {
            let allowed = "each bound 0 ..= 10, or none";
            return Err(bad(
                "action_scales",
                format!("{:?}", self.action_scales),
                allowed,
            ));
        }
        in_range(p, "noise_bound", self.noise_bound, 1e-6, 10.0)?;
        let (lo, hi) = self.log_std;
        if !(lo.is_finite() && hi.is_finite() && lo < hi) {
            let allowed = "[low, high], finite, low below high";
            return Err(bad("log_std", format!("[{lo}, {hi}]"), allowed));
        }
        in_range(
            p,
            "residual_init_log_std",
            self.residual_init_log_std,
            lo,
            hi,
        )?;
        in_range(p, "capacity", self.capacity, 1, 1 << 32)?;
        in_range(p, "warmup_steps", self.warmup_steps, 0, 1 << 32)?;
        in_range(p, "bc_weight", self.bc_weight, 0.0, 1000.0)
    }
}

/// The learner's settings for the demo (docs/training.md explains each choice).
pub fn learner_preset(mode: Mode, seed: u64) -> SacConfig {
    if mode == Mode::Noise {
        // One decision per chunk: a few hundred transitions in 100 episodes, so many updates per
        // transition (DSRL uses ~20) are cheap.
        return SacConfig {
            mode,
            hidden: vec![256, 256],
            critics: 2,
            critic_subset: 2,
            critic_layer_norm: true,
            batch: 256,
            utd: 10,
            discount: 0.97,
            n_step: 1,
            init_temperature: 0.01,
            entropy_in_target: false,
            bootstrap_truncation: false,
            noise_bound: 1.5,
            demo_ratio: 0.0,
            warmup_steps: 32,
            capacity: 200_000,
            seed,
            ..Default::default()
        };
    }
    SacConfig {
        mode,
        hidden: vec![128, 128],
        critics: 2,
        critic_subset: 2,
        critic_layer_norm: true,
        batch: 256,
        utd: 5,
        discount: 0.97,
        n_step: 3,
        init_temperature: 0.01,
        entropy_in_target: false,
        bootstrap_truncation: false,
        action_scale: 0.5,
        bc_weight: 1.0,
        demo_ratio: 0.5,
        warmup_steps: 256,
        capacity: 200_000,
        seed,
        ..Default::default()
    }
}

/// Counters of the learner.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Environment steps seen.
    pub env_steps: u64,
    /// Critic updates.
    pub critic_updates: u64,
    /// Actor updates.
    pub actor_updates: u64,
    /// Temperature updates.
    pub temperature_updates: u64,
    /// Target-network updates.
    pub target_updates: u64,
}

/// Losses and diagnostics of the last update.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct UpdateInfo {
    /// Critic loss.
    pub critic_loss: f32,
    /// Actor loss.
    pub actor_loss: f32,
    /// Temperature.
    pub temperature: f32,
    /// Policy entropy estimate (-mean log pi).
    pub entropy: f32,
    /// Mean Q of the batch.
    pub q_mean: f32,
}

/// Draws `m` distinct critics of `n` uniformly (RLPD's random subset for the target minimum).
pub fn draw_subset(rng: &mut ChaCha8Rng, n: usize, m: usize) -> Vec<u32> {
    sample_indices(rng, n, m)
        .into_iter()
        .map(|i| i as u32)
        .collect()
}

/// Minimum over the critics `idx` of `q` `[N, B]` -> `[B]`.
pub fn subset_min(q: &Tensor, idx: &[u32]) -> Result<Tensor> {
    q.index_select(&Tensor::from_slice(idx, idx.len(), q.device())?, 0)?
        .min(0)
}

/// The agent: networks, optimisers, temperature, buffers, generator, counters.
pub struct Sac {
    /// Settings.
    pub cfg: SacConfig,
    /// Values in an observation row as stored and acted on: the state, then (learning from
    /// pixels) every camera's feature map.
    pub obs_dim: usize,
    /// The state's part of a row.
    pub state_dim: usize,
    /// Dimension of the learner's action (action dim; chunk x action for noise mode).
    pub act_dim: usize,
    /// Base action dimension stored with transitions (residual mode).
    pub base_dim: usize,
    /// The actor.
    pub actor: Actor,
    /// The critic ensemble.
    pub critic: Ensemble,
    /// Its target copy.
    pub target: Ensemble,
    /// One image head per camera (learning from pixels), shared by actor and critics as in SERL:
    /// trained by the critic loss only, the actor reads its output detached.
    pub heads: Vec<SpatialHead>,
    /// The heads the target critics read, Polyak-averaged with the critics.
    pub target_heads: Vec<SpatialHead>,
    /// log of the temperature.
    pub log_alpha: Var,
    /// Actor optimiser.
    pub actor_opt: Adam,
    /// Critic optimiser.
    pub critic_opt: Adam,
    /// Temperature optimiser.
    pub alpha_opt: Adam,
    /// Online buffer.
    pub online: Replay,
    /// Demonstration / intervention buffer.
    pub demo: Replay,
    /// The one generator.
    pub rng: ChaCha8Rng,
    /// Counters.
    pub counters: Counters,
    /// The caller's own bookkeeping, saved in the same checkpoint file so that it stays
    /// consistent with the buffers (the learner link keeps its sequence numbers here).
    pub tags: std::collections::BTreeMap<String, u64>,
    batch: Batch,
    /// One feature map while [`augment::shift_maps`] moves it.
    shift_scratch: Vec<f32>,
    /// Updates and actions by hand ([`byhand`]) when the learner reads the state only (true
    /// unless a test compares the two paths); learning from pixels always goes through candle.
    pub by_hand: bool,
    scratch: byhand::Scratch,
    dev: Device,
    /// `(center, 1 / half)` as `[1, obs_dim]` tensors when the state is scaled.
    obs_scale: Option<(Tensor, Tensor)>,
}

/// Errors of the learner.
pub type Result<T> = candle_core::Result<T>;

/// The most the learner's networks may take with their gradients and optimiser state (a robot's
/// computer has a few GB; HIL-SERL's 256-wide critics take a few MB).
const MAX_NETWORK_BYTES: u64 = 8_000_000_000;

/// Most memory the two replay buffers may be sized for (32 GB: more than this machine's 24 GiB
/// and a Jetson Orin's 32 GB; a 64 GB Orin may ask for half of it).
pub const MAX_REPLAY_BYTES: u64 = 32_000_000_000;

/// Which image heads an observation goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Heads {
    /// The live heads, tracked: the critic loss trains them.
    Live,
    /// The live heads' output detached: the actor reads it without training them.
    Detached,
    /// The target critics' heads.
    Target,
}

impl Sac {
    /// A fresh agent for states of `state_dim` and actions of `act_dim` (in residual mode the
    /// actor also sees a base action of `act_dim`; learning from pixels, each row also carries
    /// the feature maps [`SacConfig::vision`] names).
    pub fn new(cfg: SacConfig, state_dim: usize, act_dim: usize) -> Result<Self> {
        let dev = Device::Cpu;
        check_settings(&cfg, act_dim)?;
        let mut rng = nets::init_rng(cfg.seed);
        let base_dim = if cfg.mode == Mode::Residual {
            act_dim
        } else {
            0
        };
        let (heads, target_heads) = vision_heads(&cfg, &mut rng, &dev)?;
        let (obs_dim, seen) = match &cfg.vision {
            Some(v) => (state_dim + v.features_len(), state_dim + v.seen_len()),
            None => (state_dim, state_dim),
        };
        let actor_in = seen + base_dim;
        check_network_size(&cfg, actor_in, act_dim)?;
        let actor = Actor::new(
            actor_in,
            &cfg.hidden,
            act_dim,
            cfg.actor_layer_norm,
            (cfg.mode == Mode::Residual).then_some(cfg.residual_init_log_std),
            cfg.log_std,
            &mut rng,
            &dev,
        )?;
        let mut dims = vec![actor_in + act_dim];
        dims.extend_from_slice(&cfg.hidden);
        dims.push(1);
        let critic = Ensemble::new(cfg.critics, &dims, cfg.critic_layer_norm, &mut rng, &dev)?;
        let target = Ensemble::new(cfg.critics, &dims, cfg.critic_layer_norm, &mut rng, &dev)?;
        target.polyak_from(&critic, 1.0)?;
        let log_alpha = Var::from_tensor(&Tensor::new(&[cfg.init_temperature.ln() as f32], &dev)?)?;
        let mk = |lr: f64| AdamConfig {
            lr,
            weight_decay: cfg.weight_decay,
            max_grad_norm: cfg.max_grad_norm,
            ..AdamConfig::adam(lr)
        };
        let mut actor_vars = actor.net.vars();
        if cfg.bc_weight > 0.0 && cfg.vision.as_ref().is_some_and(|v| v.bc_trains_heads) {
            // The heads' second optimiser: their moments for the behaviour-cloning gradient.
            actor_vars.extend(heads.iter().flat_map(SpatialHead::vars));
        }
        let actor_opt = Adam::new(actor_vars, mk(cfg.actor_lr))?;
        let mut critic_vars = critic.vars();
        critic_vars.extend(heads.iter().flat_map(SpatialHead::vars));
        let critic_opt = Adam::new(critic_vars, mk(cfg.critic_lr))?;
        let alpha_opt = Adam::new(
            vec![log_alpha.clone()],
            AdamConfig::adam(cfg.temperature_lr),
        )?;
        let obs_scale = obs_scale_of(&cfg, state_dim)?;
        let scratch = byhand::Scratch::new(obs_scale.clone());
        let obs_scale = match obs_scale {
            Some((c, inv)) => Some((
                Tensor::from_slice(&c, (1, state_dim), &dev)?,
                Tensor::from_slice(&inv, (1, state_dim), &dev)?,
            )),
            None => None,
        };
        check_replay_size(&cfg, obs_dim, base_dim, act_dim)?;
        let online = Replay::new(cfg.capacity, obs_dim, base_dim, act_dim);
        let demo = Replay::new(cfg.capacity, obs_dim, base_dim, act_dim);
        Ok(Sac {
            obs_dim,
            state_dim,
            act_dim,
            base_dim,
            actor,
            critic,
            target,
            heads,
            target_heads,
            log_alpha,
            actor_opt,
            critic_opt,
            alpha_opt,
            online,
            demo,
            rng,
            counters: Counters::default(),
            tags: Default::default(),
            batch: Batch::default(),
            shift_scratch: Vec::new(),
            by_hand: true,
            scratch,
            dev,
            obs_scale,
            cfg,
        })
    }

    /// The temperature.
    pub fn temperature(&self) -> Result<f32> {
        // Read under the variable's lock: no tensor (and no allocation) per update.
        byhand::scalar(&self.log_alpha).map(f32::exp)
    }

    /// Target entropy in use.
    pub fn target_entropy(&self) -> f64 {
        self.cfg
            .target_entropy
            .unwrap_or(-(self.act_dim as f64) / 2.0)
    }

    fn nstep(&self) -> NStep {
        NStep {
            n: self.cfg.n_step,
            gamma: self.cfg.discount,
            bootstrap_truncation: self.cfg.bootstrap_truncation,
        }
    }

    /// The actor's input: observation, plus the base action in residual mode.
    fn actor_input(&self, obs: &Tensor, base: &Tensor) -> Result<Tensor> {
        if self.base_dim > 0 {
            Tensor::cat(&[obs, base], 1)
        } else {
            Ok(obs.clone())
        }
    }

    /// Maps the actor's squashed output to the learner's action: `clamp(base + scale * a)`
    /// (residual), `a` (full), `bound * a` (noise).
    fn to_action(&self, a: &Tensor, base: &Tensor) -> Result<Tensor> {
        match self.cfg.mode {
            Mode::Residual => {
                let bounds = self.cfg.residual_bounds(self.act_dim);
                let s = Tensor::from_slice(&bounds, (1, self.act_dim), a.device())?;
                (base + a.broadcast_mul(&s)?)?.clamp(-1f32, 1f32)
            }
            Mode::Full => Ok(a.clone()),
            Mode::Noise => a * self.cfg.noise_bound as f64,
        }
    }

    /// The action for one observation (and base action in residual mode), `[act_dim]`:
    /// deterministic (the mean) or sampled for exploration.
    pub fn act(&mut self, obs: &[f32], base: &[f32], deterministic: bool) -> Result<Vec<f32>> {
        if self.hand_written() {
            return self.act_by_hand(obs, base, deterministic);
        }
        let o = self.encode(
            &Tensor::from_slice(obs, (1, self.obs_dim), &self.dev)?,
            Heads::Detached,
        )?;
        let b = if self.base_dim > 0 {
            Tensor::from_slice(base, (1, self.base_dim), &self.dev)?
        } else {
            Tensor::zeros((1, self.act_dim), candle_core::DType::F32, &self.dev)?
        };
        let x = self.actor_input(&o, &b)?;
        let a = if deterministic {
            self.actor.mean_action(&x)?
        } else {
            let eps = randn(&mut self.rng, (1, self.act_dim), &self.dev)?;
            self.actor.sample(&x, &eps)?.action
        };
        self.to_action(&a, &b)?.flatten_all()?.to_vec1::<f32>()
    }

    /// Records an environment step (drives the update cadence).
    pub fn observe_step(&mut self) {
        self.counters.env_steps += 1;
    }

    /// The state as the networks see it (scaled by `obs_norm` when set).
    fn scale_obs(&self, o: Tensor) -> Result<Tensor> {
        match &self.obs_scale {
            Some((c, inv)) => o.broadcast_sub(c)?.broadcast_mul(inv),
            None => Ok(o),
        }
    }

    /// Rows `[B, obs_dim]` as the networks read them: the scaled state, then each camera's head
    /// output (learning from pixels) through the heads `which` says.
    fn encode(&self, rows: &Tensor, which: Heads) -> Result<Tensor> {
        let Some(v) = &self.cfg.vision else {
            return self.scale_obs(rows.clone());
        };
        let heads = match which {
            Heads::Target => &self.target_heads,
            Heads::Live | Heads::Detached => &self.heads,
        };
        let mut parts = vec![self.scale_obs(rows.narrow(1, 0, self.state_dim)?)?];
        let mut off = self.state_dim;
        for (head, shape) in heads.iter().zip(&v.features) {
            let x = rows.narrow(1, off, shape.len())?;
            off += shape.len();
            let y = head
                .forward(&x)
                .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
            parts.push(match which {
                Heads::Detached => y.detach(),
                Heads::Live | Heads::Target => y,
            });
        }
        Tensor::cat(&parts, 1)
    }

    /// The batch as tensors: observation rows raw (`[B, obs_dim]`; [`Self::encode`] makes them
    /// network input), base, action, reward, next rows, next base, discount.
    fn tensors(&self, b: &Batch) -> Result<[Tensor; 7]> {
        let n = b.size;
        let d = &self.dev;
        let base = |v: &Vec<f32>| {
            if self.base_dim > 0 {
                Tensor::from_slice(v, (n, self.base_dim), d)
            } else {
                Tensor::zeros((n, self.act_dim), candle_core::DType::F32, d)
            }
        };
        Ok([
            Tensor::from_slice(&b.obs, (n, self.obs_dim), d)?,
            base(&b.base)?,
            Tensor::from_slice(&b.action, (n, self.act_dim), d)?,
            Tensor::from_slice(&b.reward, n, d)?,
            Tensor::from_slice(&b.next_obs, (n, self.obs_dim), d)?,
            base(&b.next_base)?,
            Tensor::from_slice(&b.discount, n, d)?,
        ])
    }

    /// One critic update on `batch`; returns (loss, mean Q).
    pub fn critic_update(&mut self, batch: &Batch) -> Result<(f32, f32)> {
        if self.hand_written() {
            return self.critic_update_by_hand(batch);
        }
        let [rows, base, act, rew, nrows, nbase, disc] = self.tensors(batch)?;
        let n = batch.size;
        let alpha = self.log_alpha.as_tensor().exp()?.detach();
        // Target: r + discount * (min over a random subset of target critics - alpha log pi).
        // The actor reads the next observation through the live heads, the target critics
        // through their own (one and the same when there are no heads).
        let nx = self.actor_input(&self.encode(&nrows, Heads::Detached)?, &nbase)?;
        let eps = randn(&mut self.rng, (n, self.act_dim), &self.dev)?;
        let s = self.actor.sample(&nx, &eps)?;
        let na = self.to_action(&s.action, &nbase)?;
        let nx_target = if self.heads.is_empty() {
            nx
        } else {
            self.actor_input(&self.encode(&nrows, Heads::Target)?, &nbase)?
        };
        let qn = self
            .target
            .forward(&Tensor::cat(&[&nx_target, &na], 1)?)?
            .squeeze(2)?; // [N, B]
        let m = self.cfg.critic_subset.min(self.cfg.critics);
        let mut v = if m < self.cfg.critics {
            let idx = draw_subset(&mut self.rng, self.cfg.critics, m);
            subset_min(&qn, &idx)?
        } else {
            qn.min(0)?
        };
        if self.cfg.entropy_in_target {
            v = (v - s.log_prob.broadcast_mul(&alpha)?)?;
        }
        let y = (rew + (disc * v)?)?.detach();
        // The critic loss trains the heads: their gradients flow through this input.
        let x = self.actor_input(&self.encode(&rows, Heads::Live)?, &base)?;
        let q = self
            .critic
            .forward(&Tensor::cat(&[&x, &act], 1)?)?
            .squeeze(2)?; // [N, B]
        let loss = q.broadcast_sub(&y)?.sqr()?.mean_all()?;
        let grads = loss.backward()?;
        self.critic_opt.step(&grads)?;
        self.target.polyak_from(&self.critic, self.cfg.tau)?;
        for (t, h) in self.target_heads.iter().zip(&self.heads) {
            nets::polyak_vars(&t.vars(), &h.vars(), self.cfg.tau)?;
        }
        self.counters.critic_updates += 1;
        self.counters.target_updates += 1;
        Ok((loss.to_scalar::<f32>()?, q.mean_all()?.to_scalar::<f32>()?))
    }

    /// One actor and temperature update on `batch`; returns (actor loss, entropy, temperature).
    pub fn actor_update(&mut self, batch: &Batch) -> Result<(f32, f32, f32)> {
        if self.hand_written() {
            return self.actor_update_by_hand(batch);
        }
        let [rows, base, act, ..] = self.tensors(batch)?;
        let n = batch.size;
        // SERL: the actor's loss does not train the shared heads (its behaviour-cloning term
        // below may, `VisionHeads::bc_trains_heads`).
        let x = self.actor_input(&self.encode(&rows, Heads::Detached)?, &base)?;
        let eps = randn(&mut self.rng, (n, self.act_dim), &self.dev)?;
        let s = self.actor.sample(&x, &eps)?;
        let a = self.to_action(&s.action, &base)?;
        // The critic scores the actions with its weights held still: gradients reach the actor
        // through the actions only (the critic's own gradients would be thrown away).
        let q = self
            .critic
            .forward_frozen(&Tensor::cat(&[&x, &a], 1)?)?
            .squeeze(2)?
            .mean(0)?; // mean over the ensemble
        let alpha = self.log_alpha.as_tensor().exp()?.detach();
        let mut loss = (s.log_prob.broadcast_mul(&alpha)? - q)?.mean_all()?;
        let d = batch.demo_rows;
        if self.cfg.bc_weight > 0.0 && d > 0 {
            // The demonstration rows come first in a mixed batch; with `bc_trains_heads` they
            // go through the live heads so that the person's corrections train them.
            let x_d = match &self.cfg.vision {
                Some(v) if v.bc_trains_heads => self.actor_input(
                    &self.encode(&rows.narrow(0, 0, d)?, Heads::Live)?,
                    &base.narrow(0, 0, d)?,
                )?,
                _ => x.narrow(0, 0, d)?,
            };
            let mean = self.actor.mean_action(&x_d)?;
            let a_mean = self.to_action(&mean, &base.narrow(0, 0, d)?)?;
            let bc = (a_mean - act.narrow(0, 0, d)?)?.sqr()?.sum(1)?.mean_all()?;
            loss = (loss + (bc * self.cfg.bc_weight)?)?;
        }
        let grads = loss.backward()?;
        self.actor_opt.step(&grads)?;
        self.counters.actor_updates += 1;
        // Temperature: loss = alpha * (entropy - target).
        let entropy = s.log_prob.detach().mean_all()?.neg()?;
        let t_loss = self
            .log_alpha
            .as_tensor()
            .exp()?
            .broadcast_mul(&(entropy.clone() - self.target_entropy())?)?
            .sum_all()?;
        let g = t_loss.backward()?;
        self.alpha_opt.step(&g)?;
        self.counters.temperature_updates += 1;
        Ok((
            loss.to_scalar::<f32>()?,
            entropy.to_scalar::<f32>()?,
            self.temperature()?,
        ))
    }

    /// The updates due after one environment step: `utd` critic updates, then (every
    /// `actor_every` steps) one actor and temperature update on the last batch.
    pub fn train_step(&mut self) -> Result<Option<UpdateInfo>> {
        self.observe_step();
        if (self.counters.env_steps as usize) < self.cfg.warmup_steps {
            return Ok(None);
        }
        let actor = self
            .counters
            .env_steps
            .is_multiple_of(self.cfg.actor_every as u64);
        self.updates(actor)
    }

    /// The updates of one step with no environment step taken: `utd` critic updates and one
    /// actor and temperature update, on what the buffers hold (an offline phase on a person's
    /// demonstrations before the robot acts, as ResFiT trains on its offline data first).
    pub fn train_offline(&mut self) -> Result<Option<UpdateInfo>> {
        self.updates(true)
    }

    fn updates(&mut self, actor: bool) -> Result<Option<UpdateInfo>> {
        let _flush = reflex_mlp::denormal::FlushDenormals::new();
        if self.online.is_empty() && self.demo.is_empty() {
            return Ok(None);
        }
        let mut info = UpdateInfo::default();
        let ns = self.nstep();
        let mut batch = std::mem::take(&mut self.batch);
        for _ in 0..self.cfg.utd {
            sample_mixed(
                &self.online,
                &self.demo,
                self.cfg.batch,
                self.cfg.demo_ratio,
                &ns,
                &mut self.rng,
                &mut batch,
            );
            self.augment(&mut batch);
            let (l, q) = self.critic_update(&batch)?;
            info.critic_loss = l;
            info.q_mean = q;
        }
        if actor {
            let (l, e, t) = self.actor_update(&batch)?;
            info.actor_loss = l;
            info.entropy = e;
            info.temperature = t;
        }
        self.batch = batch;
        Ok(Some(info))
    }

    /// Shifts the feature maps of a sampled batch (`VisionHeads::shift`), its bootstrap rows
    /// independently of its rows.
    fn augment(&mut self, batch: &mut Batch) {
        let Some(v) = self.cfg.vision.as_ref().filter(|v| v.shift > 0) else {
            return;
        };
        for rows in [&mut batch.obs, &mut batch.next_obs] {
            augment::shift_maps(
                rows,
                self.obs_dim,
                self.state_dim,
                &v.features,
                v.shift,
                &mut self.rng,
                &mut self.shift_scratch,
            );
        }
    }

    /// Every parameter of actor, critics, targets and temperature, flattened in a fixed order
    /// (for determinism tests and checksums).
    pub fn parameters(&self) -> Result<Vec<f32>> {
        let mut vars = self.actor.net.vars();
        vars.extend(self.critic.vars());
        vars.extend(self.target.vars());
        for h in self.heads.iter().chain(&self.target_heads) {
            vars.extend(h.vars());
        }
        vars.push(self.log_alpha.clone());
        let mut out = vec![];
        for v in &vars {
            out.extend(v.as_tensor().flatten_all()?.to_vec1::<f32>()?);
        }
        Ok(out)
    }

    /// A uniformly random action in the learner's action space (warm-up exploration).
    pub fn random_action(&mut self) -> Vec<f32> {
        (0..self.act_dim)
            .map(|_| self.rng.random::<f32>() * 2.0 - 1.0)
            .collect()
    }
}

/// Settings that cannot run together with an action of `act_dim` components.
fn check_settings(cfg: &SacConfig, act_dim: usize) -> Result<()> {
    if let Err(i) = cfg.validate("learner") {
        let (k, v, a) = (i.key, i.value, i.allowed);
        candle_core::bail!("learner setting `{k}` = {v} is out of range; allowed: {a}");
    }
    if !cfg.action_scales.is_empty() && cfg.action_scales.len() != act_dim {
        candle_core::bail!(
            "[learner] action_scales = {:?}: one bound in 0..=10 per action component ({act_dim}), or none",
            cfg.action_scales
        );
    }
    Ok(())
}

/// The image heads and their targets (none without `[learner.vision]`), drawn from `rng`.
fn vision_heads(
    cfg: &SacConfig,
    rng: &mut ChaCha8Rng,
    dev: &Device,
) -> Result<(Vec<SpatialHead>, Vec<SpatialHead>)> {
    let (mut heads, mut target_heads) = (vec![], vec![]);
    if let Some(v) = &cfg.vision {
        if cfg.mode == Mode::Noise {
            candle_core::bail!(
                "[learner.vision] works with the residual and full modes; noise mode steers the base policy's sampler from the state"
            );
        }
        if v.features.is_empty() || v.features.iter().any(FeatureShape::is_empty) {
            candle_core::bail!(
                "[learner.vision] names no camera, or a camera with an empty feature map: {:?}",
                v.features
            );
        }
        for k in 0..v.features.len() {
            let mk = |rng: &mut ChaCha8Rng| {
                SpatialHead::new(v.dims(k), rng, candle_core::DType::F32, dev)
                    .map_err(|e| candle_core::Error::Msg(e.to_string()))
            };
            let h = mk(rng)?;
            let t = mk(rng)?;
            nets::polyak_vars(&t.vars(), &h.vars(), 1.0)?;
            heads.push(h);
            target_heads.push(t);
        }
    }
    Ok((heads, target_heads))
}

/// Weights, gradients and Adam's two moments of the actor and of the live and target critics,
/// checked before any is allocated: each width is in range on its own, but 256 critics of
/// 8192-wide layers need 69 GB and aborted the process when it asked for them.
fn check_network_size(cfg: &SacConfig, actor_in: usize, act_dim: usize) -> Result<()> {
    let weights = |inputs: usize, outputs: usize| {
        let mut d = vec![inputs];
        d.extend_from_slice(&cfg.hidden);
        d.push(outputs);
        d.windows(2)
            .map(|w| (w[0] as u64 + 1) * w[1] as u64)
            .sum::<u64>()
    };
    let net_bytes = 16
        * (weights(actor_in, 2 * act_dim)
            + 2 * cfg.critics as u64 * weights(actor_in + act_dim, 1));
    if net_bytes > MAX_NETWORK_BYTES {
        candle_core::bail!(
            "[learner.sac] hidden = {:?} with critics = {}: the networks would take {:.1} GB \
             (weights, gradients and optimiser state), more than the {} GB allowed: narrow \
             the layers or use fewer critics",
            cfg.hidden,
            cfg.critics,
            net_bytes as f64 / 1e9,
            MAX_NETWORK_BYTES / 1_000_000_000
        );
    }
    Ok(())
}

/// The state's centre and inverse half width from `obs_norm`, checked against the state's size.
fn obs_scale_of(cfg: &SacConfig, state_dim: usize) -> Result<Option<(Vec<f32>, Vec<f32>)>> {
    Ok(match &cfg.obs_norm {
        Some(n) => {
            if n.center.len() != state_dim || n.half.len() != state_dim {
                candle_core::bail!(
                    "obs_norm has {} centres and {} half widths for a state of {state_dim}",
                    n.center.len(),
                    n.half.len()
                );
            }
            let inv: Vec<f32> = n.half.iter().map(|h| 1.0 / h.max(1e-6)).collect();
            Some((n.center.clone(), inv))
        }
        None => None,
    })
}

/// Both buffers are sized for their capacity up front (the memory is taken as rows are
/// written): with feature maps in every row a million rows is more than a robot has.
fn check_replay_size(
    cfg: &SacConfig,
    obs_dim: usize,
    base_dim: usize,
    act_dim: usize,
) -> Result<()> {
    let row_bytes = 4 * (2 * obs_dim + 2 * base_dim + act_dim + 2);
    let need = 2 * cfg.capacity as u64 * row_bytes as u64;
    if need > MAX_REPLAY_BYTES {
        candle_core::bail!(
            "[learner.sac] capacity = {} rows of {obs_dim} observation values (state and \
             feature maps) would take {:.1} GB in the two replay buffers, more than the \
             {} GB allowed: set capacity to {} or fewer",
            cfg.capacity,
            need as f64 / 1e9,
            MAX_REPLAY_BYTES / 1_000_000_000,
            MAX_REPLAY_BYTES / (2 * row_bytes as u64)
        );
    }
    Ok(())
}
