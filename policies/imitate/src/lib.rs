//! Imitation training of a diffusion policy in candle, exported to ONNX by reflex itself.
//!
//! The network is a conditional MLP denoiser: the noisy action chunk (flattened), a sinusoidal
//! embedding of the diffusion timestep and the normalised observation go in, the predicted noise
//! comes out. Training is DDPM (Ho et al. 2020): draw a timestep and noise, noise the
//! demonstration's chunk, regress the noise (MSE). Inference is DDIM in <= 10 steps (the sampler
//! module). Defaults follow Chi et al. 2023 (Diffusion Policy): 100 training steps, squared-cosine
//! schedule, horizon 16 with 8 executed, min-max normalisation to [-1, 1], EMA of the weights.
//! The same forward pass is written as ONNX operators, and a test checks that ONNX Runtime running
//! the exported file matches candle within 1e-5.
//!
//! With `objective = flow` the same network learns a flow-matching velocity instead (Lipman et
//! al. 2023; the conditional flow of pi0, Black et al. 2024): `x_t = t A + (1 - t) noise` for
//! `t ~ U(0, 1)`, regressing `A - noise`; inference integrates it from noise at `t = 0` to the
//! chunk at `t = 1` in `flow_steps` Euler steps. A flow policy's export also writes a second
//! graph that returns the network's vector-Jacobian product with respect to the noisy chunk
//! ([`Denoiser::to_onnx_vjp`]), which guided real-time chunking needs (`reflex_policies::rtc`).

use candle_core::{Device, Tensor, Var};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use reflex_policies::onnx_write::{Dim, Elem, Graph, batch};
use reflex_policies::sampler::{BetaSchedule, Ddim, Prediction, betas};
use reflex_policies::spec::{DiffusionSpec, GraphIo, InputSpec, Normalize, PolicyKind, PolicySpec};
use reflex_vision::encoder::{Frames, ImageEncoder, MEAN, STD, Shifts, shifted};
pub use reflex_vision::image_input_name;
use serde::Deserialize;

/// Errors of training or export.
#[derive(Debug, thiserror::Error)]
pub enum BcError {
    /// A tensor operation failed.
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    /// The dataset cannot train anything.
    #[error("dataset: {0}")]
    Data(String),
    /// A training setting out of range (named as the `reflex bc train` flag).
    #[error("{0}")]
    Setting(String),
    /// The image encoder failed.
    #[error(transparent)]
    Vision(#[from] reflex_vision::VisionError),
}

/// What the network learns to predict.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Objective {
    /// The noise of a DDPM-noised chunk (Diffusion Policy); DDIM samples it.
    #[default]
    Diffusion,
    /// The velocity of a straight flow from noise to the chunk; Euler integration samples it.
    Flow,
}

/// Flow time `t` in [0, 1] is scaled by this before the sinusoidal embedding, so the embedding
/// spans about the same range of phases as a diffusion step in 0..100 does.
pub const FLOW_TIME_SCALE: f32 = 100.0;

/// Shape of the denoiser.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DenoiserShape {
    /// Observation input size (state size x history).
    pub obs_dim: usize,
    /// Action dimension.
    pub action_dim: usize,
    /// Chunk length.
    pub horizon: usize,
    /// Hidden width.
    pub hidden: usize,
    /// Hidden layers.
    pub layers: usize,
    /// Size of the timestep embedding (even).
    pub temb: usize,
}

struct Linear {
    w: Var, // [out, in]
    b: Var, // [out]
}

impl Linear {
    fn new(n_in: usize, n_out: usize, rng: &mut ChaCha8Rng, dev: &Device) -> Result<Self, BcError> {
        // PyTorch's default: uniform(-1/sqrt(in), 1/sqrt(in)) for weights and biases.
        let k = 1.0 / (n_in as f32).sqrt();
        let w: Vec<f32> = (0..n_in * n_out)
            .map(|_| (rng.random::<f32>() * 2.0 - 1.0) * k)
            .collect();
        let b: Vec<f32> = (0..n_out)
            .map(|_| (rng.random::<f32>() * 2.0 - 1.0) * k)
            .collect();
        Ok(Linear {
            w: Var::from_tensor(&Tensor::from_vec(w, (n_out, n_in), dev)?)?,
            b: Var::from_tensor(&Tensor::from_vec(b, n_out, dev)?)?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor, BcError> {
        Ok(x.matmul(&self.w.as_tensor().t()?)?
            .broadcast_add(self.b.as_tensor())?)
    }
}

/// The conditional MLP denoiser, with an image encoder per camera when it reads cameras.
pub struct Denoiser {
    shape: DenoiserShape,
    layers: Vec<Linear>,
    freqs: Tensor,
    encoders: Vec<ImageEncoder>,
    output: &'static str,
    dev: Device,
}

impl Denoiser {
    /// A denoiser of the state alone with weights drawn from `seed`.
    pub fn new(shape: DenoiserShape, seed: u64) -> Result<Self, BcError> {
        Self::with_cameras(shape, &[], (0, 0), seed)
    }

    /// A denoiser that also reads `cameras`' images, resized to `size` (width, height), each
    /// through its own encoder.
    pub fn with_cameras(
        shape: DenoiserShape,
        cameras: &[String],
        size: (usize, usize),
        seed: u64,
    ) -> Result<Self, BcError> {
        let dev = Device::Cpu;
        // The encoders draw from their own stream, so a state-only network's weights do not
        // depend on whether this build knows about cameras.
        let mut enc_rng = ChaCha8Rng::seed_from_u64(seed ^ 0x1a6e);
        let encoders = cameras
            .iter()
            .map(|c| ImageEncoder::new(c, size.0, size.1, &mut enc_rng, &dev))
            .collect::<Result<Vec<_>, _>>()?;
        let features: usize = encoders.iter().map(|e| e.features()).sum();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let n_in = shape.horizon * shape.action_dim + shape.temb + shape.obs_dim + features;
        let mut layers = vec![Linear::new(n_in, shape.hidden, &mut rng, &dev)?];
        for _ in 1..shape.layers {
            layers.push(Linear::new(shape.hidden, shape.hidden, &mut rng, &dev)?);
        }
        layers.push(Linear::new(
            shape.hidden,
            shape.horizon * shape.action_dim,
            &mut rng,
            &dev,
        )?);
        let half = shape.temb / 2;
        let freqs: Vec<f32> = (0..half)
            .map(|i| (-(10000f32).ln() * i as f32 / half as f32).exp())
            .collect();
        Ok(Denoiser {
            shape,
            layers,
            freqs: Tensor::from_vec(freqs, (1, half), &dev)?,
            encoders,
            output: "eps",
            dev,
        })
    }

    /// Its image encoders, one per camera in input order.
    pub fn encoders(&self) -> &[ImageEncoder] {
        &self.encoders
    }

    /// The cameras it reads, in input order.
    pub fn cameras(&self) -> Vec<String> {
        self.encoders
            .iter()
            .map(|e| e.camera().to_string())
            .collect()
    }

    /// The shape.
    pub fn shape(&self) -> DenoiserShape {
        self.shape
    }

    /// The same network as a flow policy's velocity: its time input (`t` in [0, 1]) is scaled by
    /// [`FLOW_TIME_SCALE`] before the embedding (baked into the embedding's frequencies, so the
    /// export takes `t` itself), and the export's output is named `velocity`.
    pub fn into_flow(mut self) -> Result<Self, BcError> {
        self.freqs = (&self.freqs * FLOW_TIME_SCALE as f64)?;
        self.output = "velocity";
        Ok(self)
    }

    /// The name of the exported graph's output: `eps` (diffusion) or `velocity` (flow).
    pub fn output_name(&self) -> &'static str {
        self.output
    }

    fn vars(&self) -> Vec<Var> {
        self.layers
            .iter()
            .flat_map(|l| [l.w.clone(), l.b.clone()])
            .chain(self.encoders.iter().flat_map(|e| e.vars()))
            .collect()
    }

    /// `x_t` `[B, T, A]`, `t` `[B, 1]` (the training step as a float), `obs` `[B, obs_dim]`,
    /// one `[B, 3, H, W]` image per camera -> predicted noise `[B, T, A]`.
    pub fn forward(
        &self,
        x_t: &Tensor,
        t: &Tensor,
        obs: &Tensor,
        images: &[Tensor],
    ) -> Result<Tensor, BcError> {
        let b = x_t.dim(0)?;
        let s = self.shape;
        if images.len() != self.encoders.len() {
            return Err(BcError::Data(format!(
                "{} images for {} cameras",
                images.len(),
                self.encoders.len()
            )));
        }
        let xf = x_t.reshape((b, s.horizon * s.action_dim))?;
        let tf = t.matmul(&self.freqs)?;
        let mut parts = vec![xf, tf.sin()?, tf.cos()?, obs.clone()];
        for (e, img) in self.encoders.iter().zip(images) {
            parts.push(e.forward(img)?);
        }
        let mut h = Tensor::cat(&parts, 1)?;
        let n = self.layers.len();
        for (i, l) in self.layers.iter().enumerate() {
            h = l.forward(&h)?;
            if i + 1 < n {
                h = h.silu()?;
            }
        }
        Ok(h.reshape((b, s.horizon, s.action_dim))?)
    }

    /// The same network as an ONNX graph: inputs `noisy_actions` `[B,T,A]`, `timestep` `[B,1]`,
    /// `obs` `[B,obs_dim]` and `image_<camera>` `[B,3,H,W]` per camera; output `eps` `[B,T,A]`
    /// (the noise), or a flow policy's `velocity`.
    pub fn to_onnx(&self) -> Result<Vec<u8>, BcError> {
        self.write_graph(false)
    }

    /// The network's vector-Jacobian product as a second ONNX graph: the inputs of
    /// [`Self::to_onnx`] and `cotangent` `[B,T,A]` (`e`), output `vjp` `[B,T,A]`: `J^T e`, with
    /// `J` the Jacobian of the output with respect to `noisy_actions` at the given inputs. It is
    /// the forward pass followed by its backward pass through the linear layers and SiLUs
    /// (`silu'(z) = s (1 + z (1 - s))`, `s = sigmoid(z)`), written out by hand.
    pub fn to_onnx_vjp(&self) -> Result<Vec<u8>, BcError> {
        self.write_graph(true)
    }

    fn write_graph(&self, vjp: bool) -> Result<Vec<u8>, BcError> {
        let s = self.shape;
        let (t, a) = (s.horizon as i64, s.action_dim as i64);
        let chunk_dims = || vec![batch(), Dim::Fixed(t), Dim::Fixed(a)];
        let mut g = Graph::new();
        let x = g.input("noisy_actions", Elem::F32, chunk_dims());
        let ts = g.input("timestep", Elem::F32, vec![batch(), Dim::Fixed(1)]);
        let obs = g.input(
            "obs",
            Elem::F32,
            vec![batch(), Dim::Fixed(s.obs_dim as i64)],
        );
        let xf = g.reshape(&x, &[-1, t * a]);
        let freqs = self.freqs.flatten_all()?.to_vec1::<f32>()?;
        let fr = g.constant("freqs", &[1, freqs.len() as i64], &freqs);
        let tf = g.op("MatMul", &[&ts, &fr], vec![]);
        let (sin, cos) = (g.op("Sin", &[&tf], vec![]), g.op("Cos", &[&tf], vec![]));
        let mut parts = vec![xf, sin, cos, obs];
        for e in &self.encoders {
            parts.push(e.write_onnx(&mut g, &image_input_name(e.camera()))?);
        }
        let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
        let mut h = g.concat(&refs, 1);
        let n = self.layers.len();
        // Each layer's weight constant and pre-activation, for the backward pass.
        let mut saved = Vec::with_capacity(n);
        for (i, l) in self.layers.iter().enumerate() {
            let (n_out, n_in) = l.w.as_tensor().dims2()?;
            let w_in_out =
                l.w.as_tensor()
                    .t()?
                    .contiguous()?
                    .flatten_all()?
                    .to_vec1::<f32>()?;
            let b = l.b.as_tensor().to_vec1::<f32>()?;
            let w = g.constant("w", &[n_in as i64, n_out as i64], &w_in_out);
            let bias = g.constant("b", &[n_out as i64], &b);
            let y = g.op("MatMul", &[&h, &w], vec![]);
            let z = g.op("Add", &[&y, &bias], vec![]);
            h = if i + 1 < n { g.silu(&z) } else { z.clone() };
            saved.push((w, z));
        }
        if !vjp {
            let out = g.reshape(&h, &[-1, t, a]);
            g.output(&out, self.output, Elem::F32, chunk_dims());
            return Ok(g.to_bytes("reflex_diffusion_denoiser", "reflex"));
        }
        let e = g.input("cotangent", Elem::F32, chunk_dims());
        let mut grad = g.reshape(&e, &[-1, t * a]);
        let one = g.constant("one", &[1], &[1.0]);
        for (i, (w, z)) in saved.iter().enumerate().rev() {
            if i + 1 < n {
                let sg = g.op("Sigmoid", &[z], vec![]);
                let rest = g.op("Sub", &[&one, &sg], vec![]);
                let zr = g.op("Mul", &[z, &rest], vec![]);
                let inner = g.op("Add", &[&one, &zr], vec![]);
                let slope = g.op("Mul", &[&sg, &inner], vec![]);
                grad = g.op("Mul", &[&grad, &slope], vec![]);
            }
            let wt = g.op(
                "Transpose",
                &[w],
                vec![("perm", reflex_policies::onnx_write::Attr::Ints(vec![1, 0]))],
            );
            grad = g.op("MatMul", &[&grad, &wt], vec![]);
        }
        // The gradient with respect to the first layer's input; the noisy chunk is its first
        // T*A columns.
        let starts = g.constant_i64("starts", &[0]);
        let ends = g.constant_i64("ends", &[t * a]);
        let axes = g.constant_i64("axes", &[1]);
        let dx = g.op("Slice", &[&grad, &starts, &ends, &axes], vec![]);
        let out = g.reshape(&dx, &[-1, t, a]);
        g.output(&out, "vjp", Elem::F32, chunk_dims());
        Ok(g.to_bytes("reflex_denoiser_vjp", "reflex"))
    }

    /// Runs DDIM with this network on one normalised observation (and one normalised
    /// `[3, H, W]` image per camera) from `noise`, returning the normalised chunk (the candle side
    /// of the export parity test).
    pub fn sample(
        &self,
        ddim: &Ddim,
        obs: &[f32],
        images: &[&[f32]],
        noise: &[f32],
    ) -> Result<Vec<f32>, BcError> {
        let s = self.shape;
        let obs_t = Tensor::from_vec(obs.to_vec(), (1, s.obs_dim), &self.dev)?;
        let images = self
            .encoders
            .iter()
            .zip(images)
            .map(|(e, i)| {
                let (w, h) = e.size();
                Tensor::from_slice(i, (1, 3, h, w), &self.dev)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut x = noise.to_vec();
        let mut out = vec![0.0f32; x.len()];
        for &t in &ddim.timesteps {
            let xt = Tensor::from_vec(x.clone(), (1, s.horizon, s.action_dim), &self.dev)?;
            let tt = Tensor::from_vec(vec![t as f32], (1, 1), &self.dev)?;
            out.copy_from_slice(
                &self
                    .forward(&xt, &tt, &obs_t, &images)?
                    .flatten_all()?
                    .to_vec1::<f32>()?,
            );
            ddim.step(t, &out, &mut x);
        }
        Ok(x)
    }

    /// A copy of the current weights (for the EMA).
    fn snapshot(&self) -> Result<Vec<Tensor>, BcError> {
        Ok(self
            .vars()
            .iter()
            .map(|v| v.as_tensor().copy())
            .collect::<Result<_, _>>()?)
    }

    fn load(&self, ws: &[Tensor]) -> Result<(), BcError> {
        for (v, w) in self.vars().iter().zip(ws) {
            v.set(w)?;
        }
        Ok(())
    }
}

/// One training example: an observation and the action chunk that followed it.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Observation (raw units).
    pub obs: Vec<f32>,
    /// `horizon * action_dim` actions (raw units), padded with the episode's last action.
    pub chunk: Vec<f32>,
}

/// An episode as (observations, actions).
pub type EpisodeData = (Vec<Vec<f32>>, Vec<Vec<f32>>);

/// Cuts episodes into (observation, chunk) examples.
pub fn make_samples(episodes: &[EpisodeData], horizon: usize) -> Vec<Sample> {
    let mut out = vec![];
    for (obs, acts) in episodes {
        if acts.is_empty() {
            continue;
        }
        for t in 0..acts.len() {
            let mut chunk = Vec::with_capacity(horizon * acts[0].len());
            for k in 0..horizon {
                chunk.extend_from_slice(&acts[(t + k).min(acts.len() - 1)]);
            }
            out.push(Sample {
                obs: obs[t].clone(),
                chunk,
            });
        }
    }
    out
}

/// Min-max statistics of each component, widened where a component is (nearly) constant.
pub fn min_max(rows: impl Iterator<Item = Vec<f32>>, dim: usize) -> Normalize {
    let (mut lo, mut hi) = (vec![f32::INFINITY; dim], vec![f32::NEG_INFINITY; dim]);
    for r in rows {
        for i in 0..dim {
            lo[i] = lo[i].min(r[i]);
            hi[i] = hi[i].max(r[i]);
        }
    }
    for i in 0..dim {
        if hi[i] - lo[i] <= 1e-4 || hi[i].is_nan() || lo[i].is_nan() {
            let m = 0.5 * (hi[i] + lo[i]);
            lo[i] = m - 1.0;
            hi[i] = m + 1.0;
        }
    }
    Normalize::MinMax {
        low: lo,
        high: hi,
        eps: None,
    }
}

/// Training settings (`reflex bc train` flags).
#[derive(Clone, Debug, Deserialize)]
#[serde(default)]
pub struct TrainConfig {
    /// Gradient steps.
    pub steps: usize,
    /// Batch size.
    pub batch: usize,
    /// AdamW learning rate (weight decay 1e-6, as Diffusion Policy).
    pub lr: f64,
    /// Hidden width.
    pub hidden: usize,
    /// Hidden layers.
    pub layers: usize,
    /// Chunk length.
    pub horizon: usize,
    /// Actions executed per chunk.
    pub execute: usize,
    /// EMA decay of the exported weights (0 = export the raw weights).
    pub ema: f64,
    /// Largest random shift of a training image, pixels on each axis (0: none).
    pub shift: usize,
    /// What the network learns: diffusion (the default) or flow.
    pub objective: Objective,
    /// Euler steps of a flow policy's sampler (its spec's `flow_steps`).
    pub flow_steps: usize,
    /// Seed of initialisation, batches, timesteps and noise.
    pub seed: u64,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            steps: 4000,
            batch: 256,
            lr: 1e-3,
            hidden: 256,
            layers: 3,
            horizon: 16,
            execute: 8,
            ema: 0.995,
            shift: 4,
            objective: Objective::Diffusion,
            flow_steps: 10,
            seed: 0,
        }
    }
}

/// The result of training: the network (EMA weights loaded), its spec, and the loss curve.
pub struct Trained {
    /// The denoiser.
    pub net: Denoiser,
    /// A spec to write beside the exported model.
    pub spec: PolicySpec,
    /// Mean loss per reporting interval.
    pub losses: Vec<f32>,
}

/// The training set, normalised once, with the normalisations that the spec records.
struct Dataset<'a> {
    obs: Vec<f32>,
    act: Vec<f32>,
    n: usize,
    obs_dim: usize,
    obs_norm: Normalize,
    act_norm: Normalize,
    frames: Option<&'a Frames>,
}

impl<'a> Dataset<'a> {
    fn new(
        samples: &[Sample],
        action_dim: usize,
        frames: Option<&'a Frames>,
    ) -> Result<Self, BcError> {
        if samples.is_empty() {
            return Err(BcError::Data(
                "no (observation, action) pairs: the demo directory has no steps".into(),
            ));
        }
        if let Some(f) = frames
            && f.len() != samples.len()
        {
            return Err(BcError::Data(format!(
                "{} camera frames for {} samples: every sample needs its frame from each camera",
                f.len(),
                samples.len()
            )));
        }
        let obs_dim = samples[0].obs.len();
        let obs_norm = min_max(samples.iter().map(|s| s.obs.clone()), obs_dim);
        let act_norm = min_max(
            samples.iter().flat_map(|s| {
                s.chunk
                    .chunks(action_dim)
                    .map(|c| c.to_vec())
                    .collect::<Vec<_>>()
            }),
            action_dim,
        );
        let mut obs = Vec::with_capacity(samples.len() * obs_dim);
        let mut act = Vec::with_capacity(samples.len() * samples[0].chunk.len());
        for s in samples {
            let mut o = s.obs.clone();
            obs_norm.apply(&mut o);
            obs.extend(o);
            let mut c = s.chunk.clone();
            act_norm.apply(&mut c);
            act.extend(c);
        }
        Ok(Dataset {
            obs,
            act,
            n: samples.len(),
            obs_dim,
            obs_norm,
            act_norm,
            frames,
        })
    }
}

/// Cumulative products of (1 - beta) of the training noise schedule.
fn alpha_bars(d: &DiffusionSpec) -> Vec<f32> {
    let mut acc = 1.0;
    betas(
        BetaSchedule::SquaredcosCapV2,
        d.train_steps,
        d.beta_start,
        d.beta_end,
    )
    .into_iter()
    .map(|b| {
        acc *= 1.0 - b;
        acc as f32
    })
    .collect()
}

/// One batch's buffers: observations, clean chunks, regression targets (the noise, or the flow's
/// velocity), noised chunks, times, and one shifted image per camera.
struct BatchBufs {
    ob: Vec<f32>,
    x0: Vec<f32>,
    target: Vec<f32>,
    xt: Vec<f32>,
    tt: Vec<f32>,
    img: Vec<Vec<f32>>,
    shifts: Shifts,
}

impl BatchBufs {
    /// Draws a batch: random samples, random times, noise added per the schedule (diffusion) or
    /// along the straight flow (flow), images randomly shifted.
    fn draw(
        &mut self,
        data: &Dataset,
        chunk: usize,
        objective: Objective,
        abar: &[f32],
        rng: &mut ChaCha8Rng,
    ) {
        let od = data.obs_dim;
        for b in 0..self.tt.len() {
            let i = rng.random_range(0..data.n);
            self.ob[b * od..(b + 1) * od].copy_from_slice(&data.obs[i * od..(i + 1) * od]);
            if let Some(f) = data.frames {
                let n = f.frame_len();
                for (dst, src) in self.img.iter_mut().zip(&f.data) {
                    let (dx, dy) = self.shifts.draw();
                    let frame = &src[i * n..(i + 1) * n];
                    shifted(
                        frame,
                        f.width,
                        f.height,
                        dx,
                        dy,
                        &mut dst[b * n..(b + 1) * n],
                    );
                }
            }
            self.x0[b * chunk..(b + 1) * chunk]
                .copy_from_slice(&data.act[i * chunk..(i + 1) * chunk]);
            match objective {
                Objective::Diffusion => {
                    let t = rng.random_range(0..abar.len());
                    self.tt[b] = t as f32;
                    let (sa, s1a) = (abar[t].sqrt(), (1.0 - abar[t]).sqrt());
                    for k in b * chunk..(b + 1) * chunk {
                        let e: f32 = StandardNormal.sample(rng);
                        self.target[k] = e;
                        self.xt[k] = sa * self.x0[k] + s1a * e;
                    }
                }
                Objective::Flow => {
                    let t: f32 = rng.random();
                    self.tt[b] = t;
                    for k in b * chunk..(b + 1) * chunk {
                        let e: f32 = StandardNormal.sample(rng);
                        self.target[k] = self.x0[k] - e;
                        self.xt[k] = t * self.x0[k] + (1.0 - t) * e;
                    }
                }
            }
        }
    }
}

/// Trains a diffusion policy on `samples` (and on `frames`, one per sample and camera, when
/// given). `report(step, loss)` is called every 100 steps.
#[allow(clippy::too_many_arguments)]
pub fn train(
    samples: &[Sample],
    frames: Option<&Frames>,
    action_dim: usize,
    cfg: &TrainConfig,
    name: &str,
    state_fields: Vec<String>,
    robot_kind: Option<String>,
    mut report: impl FnMut(usize, f32),
) -> Result<Trained, BcError> {
    if cfg.execute == 0 || cfg.execute > cfg.horizon {
        return Err(BcError::Setting(format!(
            "--execute {}: between 1 and the chunk's length (--horizon {}): the policy runs that many of each chunk's actions",
            cfg.execute, cfg.horizon
        )));
    }
    let data = Dataset::new(samples, action_dim, frames)?;
    let (t_len, a) = (cfg.horizon, action_dim);
    let dev = Device::Cpu;
    let shape = DenoiserShape {
        obs_dim: data.obs_dim,
        action_dim,
        horizon: t_len,
        hidden: cfg.hidden,
        layers: cfg.layers,
        temb: 32,
    };
    let net = match frames {
        Some(f) => Denoiser::with_cameras(shape, &f.cameras, (f.width, f.height), cfg.seed)?,
        None => Denoiser::new(shape, cfg.seed)?,
    };
    let net = match cfg.objective {
        Objective::Diffusion => net,
        Objective::Flow => net.into_flow()?,
    };
    let diffusion = DiffusionSpec::default();
    let abar = alpha_bars(&diffusion);
    let mut opt = AdamW::new(
        net.vars(),
        ParamsAdamW {
            lr: cfg.lr,
            weight_decay: 1e-6,
            ..Default::default()
        },
    )?;
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ 0xbc);
    let mut ema = (cfg.ema > 0.0).then(|| net.snapshot()).transpose()?;
    let (mut losses, mut log) = (vec![], reflex_vision::LossLog::default());
    let bsz = cfg.batch.min(data.n);
    let chunk = t_len * a;
    let mut buf = BatchBufs {
        ob: vec![0.0; bsz * data.obs_dim],
        x0: vec![0.0; bsz * chunk],
        target: vec![0.0; bsz * chunk],
        xt: vec![0.0; bsz * chunk],
        tt: vec![0.0; bsz],
        img: frames.map_or(vec![], |f| {
            vec![vec![0.0; bsz * f.frame_len()]; f.cameras.len()]
        }),
        shifts: Shifts::new(cfg.shift, cfg.seed ^ 0x5417),
    };
    for step in 1..=cfg.steps {
        buf.draw(&data, chunk, cfg.objective, &abar, &mut rng);
        let images = match frames {
            Some(f) => buf
                .img
                .iter()
                .map(|i| Tensor::from_slice(i, (bsz, 3, f.height, f.width), &dev))
                .collect::<Result<Vec<_>, _>>()?,
            None => vec![],
        };
        let pred = net.forward(
            &Tensor::from_slice(&buf.xt, (bsz, t_len, a), &dev)?,
            &Tensor::from_slice(&buf.tt, (bsz, 1), &dev)?,
            &Tensor::from_slice(&buf.ob, (bsz, data.obs_dim), &dev)?,
            &images,
        )?;
        let target = Tensor::from_slice(&buf.target, (bsz, t_len, a), &dev)?;
        let loss = (pred - target)?.sqr()?.mean_all()?;
        opt.backward_step(&loss)?;
        if let Some(e) = &mut ema {
            let d = cfg.ema.min((1.0 + step as f64) / (10.0 + step as f64));
            for (ev, v) in e.iter_mut().zip(net.vars()) {
                *ev = ((&*ev * d)? + (v.as_tensor().detach() * (1.0 - d))?)?.detach();
            }
        }
        if let Some(mean) = log.add(step, cfg.steps, loss.to_scalar::<f32>()?)? {
            losses.push(mean);
            report(step, mean);
        }
    }
    if let Some(e) = &ema {
        net.load(e)?;
    }
    let spec = trained_spec(
        name,
        action_dim,
        cfg,
        robot_kind,
        state_fields,
        data,
        diffusion,
    );
    Ok(Trained { net, spec, losses })
}

/// The spec written beside a trained model.
fn trained_spec(
    name: &str,
    action_dim: usize,
    cfg: &TrainConfig,
    robot_kind: Option<String>,
    state_fields: Vec<String>,
    data: Dataset,
    diffusion: DiffusionSpec,
) -> PolicySpec {
    PolicySpec {
        format: "reflex-policy".into(),
        version: 1,
        name: name.into(),
        kind: match cfg.objective {
            Objective::Diffusion => PolicyKind::Diffusion,
            Objective::Flow => PolicyKind::Flow,
        },
        action_dim,
        chunk_len: cfg.horizon,
        execute: cfg.execute,
        first_action: 0,
        model_action_dim: None,
        robot_kind,
        action_normalize: data.act_norm,
        graph: GraphIo {
            sample_input: Some("noisy_actions".into()),
            time_input: Some("timestep".into()),
            output: match cfg.objective {
                Objective::Diffusion => "eps".into(),
                Objective::Flow => "velocity".into(),
            },
            ..Default::default()
        },
        inputs: std::iter::once(InputSpec::State {
            name: "obs".into(),
            fields: state_fields,
            history: 1,
            normalize: data.obs_norm,
        })
        .chain(data.frames.iter().flat_map(|f| {
            f.cameras.iter().map(|c| InputSpec::Image {
                name: image_input_name(c),
                camera: c.clone(),
                width: f.width as u32,
                height: f.height as u32,
                mean: MEAN,
                std: STD,
                eps: None,
                history: 1,
            })
        }))
        .collect(),
        diffusion: (cfg.objective == Objective::Diffusion).then_some(DiffusionSpec {
            prediction: Prediction::Epsilon,
            ..diffusion
        }),
        flow_steps: cfg.flow_steps,
        provenance: None,
    }
}
