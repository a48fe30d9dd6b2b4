//! The learner's actor on the control loop: a plain-Rust MLP evaluated on preallocated buffers
//! (no candle, no allocation), fed by weights the learner publishes through a triple buffer. It
//! implements the loop's [`ResidualHook`] for the residual mode.
//!
//! Layout of the flat weight vector (what [`export_actor`] writes): learning from pixels, first
//! each camera's image head in [`reflex_vision::head::SpatialHead::flat`]'s layout; then for each
//! layer of the MLP, `W` as `[in, out]` row-major, then `b` `[out]`, then (hidden layers with
//! LayerNorm) `gamma`, `beta`. The MLP's input is the state, each head's output, and (residual
//! mode) the normalised base action.

use super::{Sac, VisionHeads};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use reflex_runtime::control::{DIGEST_START, digest_bytes};
use reflex_runtime::residual::{ResidualHook, Weights, WeightsWriter};
use reflex_runtime::triple::{Reader, triple};
use reflex_vision::head::{HeadDims, HeadEval};

/// Flattens the actor's parameters in the hook's layout.
/// With [`super::SacConfig::obs_norm`] set, the state scaling is folded into the first layer, so
/// the exported network takes the raw state: `W' = W / half` on the state rows and
/// `b' = b - sum_r (center_r / half_r) W_r`.
pub fn export_actor(sac: &Sac) -> candle_core::Result<Vec<f32>> {
    let net = &sac.actor.net;
    let mut out = vec![];
    for h in &sac.heads {
        out.extend(
            h.flat()
                .map_err(|e| candle_core::Error::Msg(e.to_string()))?,
        );
    }
    for l in 0..net.ws.len() {
        let mut w = net.ws[l].as_tensor().flatten_all()?.to_vec1::<f32>()?;
        let mut b = net.bs[l].as_tensor().flatten_all()?.to_vec1::<f32>()?;
        if l == 0
            && let Some(n) = &sac.cfg.obs_norm
        {
            let o = b.len();
            for (r, (c, h)) in n.center.iter().zip(&n.half).enumerate() {
                let row = &mut w[r * o..(r + 1) * o];
                for (k, v) in row.iter_mut().enumerate() {
                    *v /= h.max(1e-6);
                    b[k] -= c * *v;
                }
            }
        }
        out.extend(w);
        out.extend(b);
        if let Some(ln) = &net.ln
            && l < ln.len()
        {
            out.extend(ln[l].0.as_tensor().flatten_all()?.to_vec1::<f32>()?);
            out.extend(ln[l].1.as_tensor().flatten_all()?.to_vec1::<f32>()?);
        }
    }
    Ok(out)
}

/// The length and architecture tag of the weights [`export_actor`] writes for `sac`: what an
/// actor's hook can evaluate, and what it checks every published version against.
pub fn actor_shape(sac: &Sac) -> (usize, u64) {
    let dims = mlp_dims(sac);
    let ln = sac.cfg.actor_layer_norm;
    let heads = head_dims(sac);
    let len =
        MlpEval::weights_len(&dims, ln) + heads.iter().map(HeadDims::weights_len).sum::<usize>();
    let head_words = heads
        .iter()
        .flat_map(|d| [d.channels, d.places, d.embeddings, d.width]);
    let words = dims
        .iter()
        .copied()
        .chain(head_words)
        .map(|d| d as u64)
        .chain([ln as u64, sac.cfg.mode as u64 + 1]);
    let h = words.fold(DIGEST_START, |h, w| digest_bytes(h, &w.to_le_bytes()));
    (len, h)
}

/// Layer widths of `sac`'s actor MLP (input first, head last).
fn mlp_dims(sac: &Sac) -> Vec<usize> {
    let seen = sac.cfg.vision.as_ref().map_or(0, VisionHeads::seen_len);
    let mut dims = vec![sac.state_dim + seen + sac.base_dim];
    dims.extend_from_slice(&sac.cfg.hidden);
    dims.push(2 * sac.act_dim);
    dims
}

/// The sizes of `sac`'s image heads, one per camera (none without `[learner.vision]`).
pub fn head_dims(sac: &Sac) -> Vec<HeadDims> {
    sac.cfg
        .vision
        .as_ref()
        .map_or(vec![], VisionHeads::all_dims)
}

/// The image heads on the loop: the state passes through, each camera's feature map becomes its
/// head's output, written straight into the MLP's input.
pub struct HeadsEval {
    state_dim: usize,
    evals: Vec<HeadEval>,
    weights_len: usize,
}

impl HeadsEval {
    /// Heads of `dims` after a state of `state_dim` (no heads: the state alone).
    pub fn new(state_dim: usize, dims: Vec<HeadDims>) -> Self {
        HeadsEval {
            state_dim,
            weights_len: dims.iter().map(HeadDims::weights_len).sum(),
            evals: dims.into_iter().map(HeadEval::new).collect(),
        }
    }

    /// Values of the heads' weights at the front of the flat vector.
    pub fn weights_len(&self) -> usize {
        self.weights_len
    }

    /// Values in an observation row: the state and every feature map.
    pub fn row_len(&self) -> usize {
        self.state_dim
            + self
                .evals
                .iter()
                .map(|e| e.dims().input_len())
                .sum::<usize>()
    }

    /// Values the heads add to the MLP's input (beside the state).
    fn seen_len(&self) -> usize {
        self.evals.iter().map(|e| e.dims().width).sum()
    }

    /// Fills `input` (the MLP's state-and-features part) from the row `obs` with the heads'
    /// weights `w`. A row of another length fills zeros.
    fn fill(&mut self, w: &[f32], obs: &[f32], input: &mut [f32]) {
        let s = self.state_dim;
        if obs.len() != self.row_len() || w.len() < self.weights_len {
            input.fill(0.0);
            return;
        }
        input[..s].copy_from_slice(&obs[..s]);
        let (mut woff, mut xoff, mut ioff) = (0, s, s);
        for e in &mut self.evals {
            let d = e.dims();
            let (wl, xl, width) = (d.weights_len(), d.input_len(), d.width);
            e.run(
                &w[woff..woff + wl],
                &obs[xoff..xoff + xl],
                &mut input[ioff..ioff + width],
            );
            woff += wl;
            xoff += xl;
            ioff += width;
        }
    }
}

/// How the hook maps between robot action units and the learner's normalised units: each
/// component `x` becomes `(x - center) / half_width`, with the half width of the action range
/// widened by `1 + s` with `s` that component's residual bound (ResFiT), so the base sits inside
/// [-1/(1+s), 1/(1+s)] and the residual can reach beyond it.
#[derive(Clone, Debug, PartialEq)]
pub struct ActionNorm {
    /// Centre per component.
    pub center: Vec<f32>,
    /// Half width per component (already widened).
    pub half: Vec<f32>,
}

impl ActionNorm {
    /// Normalisation for bounds `low`/`high`, component `i` widened by `1 + scales[i]` (empty
    /// `scales`: no widening).
    pub fn new(low: &[f32], high: &[f32], scales: &[f32]) -> Self {
        let scale = |i: usize| scales.get(i).copied().unwrap_or(0.0);
        ActionNorm {
            center: low.iter().zip(high).map(|(l, h)| 0.5 * (l + h)).collect(),
            half: low
                .iter()
                .zip(high)
                .enumerate()
                .map(|(i, (l, h))| (0.5 * (h - l) * (1.0 + scale(i))).max(1e-6))
                .collect(),
        }
    }

    /// Robot units -> normalised, in place.
    pub fn to_norm(&self, x: &mut [f32]) {
        for ((v, c), h) in x.iter_mut().zip(&self.center).zip(&self.half) {
            *v = (*v - c) / h;
        }
    }

    /// Normalised -> robot units, in place.
    pub fn to_robot(&self, x: &mut [f32]) {
        for ((v, c), h) in x.iter_mut().zip(&self.center).zip(&self.half) {
            *v = *v * h + c;
        }
    }
}

/// The learner's actor network evaluated in plain Rust on preallocated buffers, from the flat
/// weight layout of [`export_actor`].
pub struct MlpEval {
    dims: Vec<usize>,
    layer_norm: bool,
    len: usize,
    a: Vec<f32>,
    b: Vec<f32>,
}

impl MlpEval {
    /// A network with layer widths `dims` (input first, head last).
    pub fn new(dims: Vec<usize>, layer_norm: bool) -> Self {
        let widest = *dims.iter().max().expect("layers");
        MlpEval {
            a: vec![0.0; widest],
            b: vec![0.0; widest],
            len: Self::weights_len(&dims, layer_norm),
            dims,
            layer_norm,
        }
    }

    /// Values in the flat weight vector of a network with layer widths `dims`.
    pub fn weights_len(dims: &[usize], layer_norm: bool) -> usize {
        let last = dims.len() - 2;
        (0..=last)
            .map(|l| {
                let (i, o) = (dims[l], dims[l + 1]);
                i * o + o + if layer_norm && l < last { 2 * o } else { 0 }
            })
            .sum()
    }

    /// The input buffer (fill it before [`Self::run`]).
    pub fn input(&mut self) -> &mut [f32] {
        &mut self.a[..self.dims[0]]
    }

    /// Runs the network with weights `w` on the input; returns the head's outputs. Weights of
    /// another length (never published by a link that checks them) give a zero output rather
    /// than a slice out of bounds.
    pub fn run(&mut self, w: &[f32]) -> &[f32] {
        let out = self.dims[self.dims.len() - 1];
        if w.len() != self.len {
            self.b[..out].fill(0.0);
            return &self.b[..out];
        }
        let mut off = 0;
        let last = self.dims.len() - 2;
        for l in 0..=last {
            let (i, o) = (self.dims[l], self.dims[l + 1]);
            let (wm, bias) = (&w[off..off + i * o], &w[off + i * o..off + i * o + o]);
            off += i * o + o;
            self.b[..o].copy_from_slice(&bias[..o]);
            for r in 0..i {
                let x = self.a[r];
                if x != 0.0 {
                    let row = &wm[r * o..(r + 1) * o];
                    for (acc, wv) in self.b[..o].iter_mut().zip(row) {
                        *acc += x * wv;
                    }
                }
            }
            if l < last {
                if self.layer_norm {
                    let mean = self.b[..o].iter().sum::<f32>() / o as f32;
                    let var = self.b[..o]
                        .iter()
                        .map(|v| (v - mean) * (v - mean))
                        .sum::<f32>()
                        / o as f32;
                    let inv = 1.0 / (var + 1e-5).sqrt();
                    let (g, be) = (&w[off..off + o], &w[off + o..off + 2 * o]);
                    off += 2 * o;
                    for c in 0..o {
                        self.b[c] = (self.b[c] - mean) * inv * g[c] + be[c];
                    }
                }
                for c in 0..o {
                    self.a[c] = self.b[c].max(0.0);
                }
            }
        }
        &self.b[..self.dims[self.dims.len() - 1]]
    }
}

/// The learner's actor on the loop thread: a residual on the base action (residual mode), or the
/// whole action (full mode, on a base that holds the centre of the action box).
pub struct ResidualMlp {
    heads: HeadsEval,
    mlp: MlpEval,
    full: bool,
    act_dim: usize,
    /// The residual's bound per action component.
    scale: Vec<f32>,
    log_std: (f32, f32),
    norm: ActionNorm,
    weights: Reader<Weights>,
    explore: bool,
    rng: ChaCha8Rng,
    base_n: Vec<f32>,
}

impl ResidualMlp {
    /// Whether it reads feature maps beside the state (image heads).
    pub fn sees(&self) -> bool {
        self.heads.seen_len() > 0
    }

    /// A hook for an actor `obs_dim (+ act_dim in residual mode) -> hidden -> 2 act_dim` with the
    /// learner's current weights, and the writer through which the learner publishes new ones.
    /// `explore` samples from the Gaussian (training); otherwise the mean is used. In full mode
    /// the hook's output replaces the base action entirely (`norm` then has no widening).
    pub fn new(
        sac: &Sac,
        norm: ActionNorm,
        explore: bool,
        seed: u64,
    ) -> candle_core::Result<(Self, WeightsWriter)> {
        if sac.cfg.mode == super::Mode::Noise {
            candle_core::bail!(
                "diffusion steering runs through SteeredPolicy, not the residual hook"
            );
        }
        let w = export_actor(sac)?;
        let (mut hook, writer) = Self::with_weights(
            HeadsEval::new(sac.state_dim, head_dims(sac)),
            MlpEval::new(mlp_dims(sac), sac.cfg.actor_layer_norm),
            sac.cfg.mode == super::Mode::Full,
            norm,
            sac.cfg.residual_bounds(sac.act_dim),
            w,
        );
        hook.log_std = sac.cfg.log_std;
        hook.explore = explore;
        hook.rng = ChaCha8Rng::seed_from_u64(seed);
        Ok((hook, writer))
    }

    /// A hook with fixed weights `w` (a residual file, [`super::export::ResidualModel::hook`]):
    /// the Gaussian's mean, no exploration, nothing publishes to it.
    pub fn frozen(
        heads: HeadsEval,
        mlp: MlpEval,
        full: bool,
        norm: ActionNorm,
        scale: Vec<f32>,
        w: Vec<f32>,
    ) -> Self {
        Self::with_weights(heads, mlp, full, norm, scale, w).0
    }

    fn with_weights(
        heads: HeadsEval,
        mlp: MlpEval,
        full: bool,
        norm: ActionNorm,
        scale: Vec<f32>,
        w: Vec<f32>,
    ) -> (Self, WeightsWriter) {
        let act_dim = norm.center.len();
        let (writer, reader) = triple(Weights {
            version: 0,
            values: w,
        });
        let hook = ResidualMlp {
            heads,
            mlp,
            full,
            act_dim,
            scale,
            log_std: (-5.0, 2.0),
            norm,
            weights: reader,
            explore: false,
            rng: ChaCha8Rng::seed_from_u64(0),
            base_n: vec![0.0; act_dim],
        };
        (hook, crate::sac::hook::writer(writer))
    }
}

/// Wraps a raw triple-buffer writer as the runtime's weights writer.
fn writer(w: reflex_runtime::triple::Writer<Weights>) -> WeightsWriter {
    WeightsWriter::from_writer(w)
}

impl ResidualHook for ResidualMlp {
    fn residual(&mut self, obs: &[f32], base: &[f32], out: &mut [f32]) {
        let w = &self.weights.get().values;
        let (head_w, mlp_w) = w.split_at(self.heads.weights_len().min(w.len()));
        // Input: state, each camera's head output, normalised base action.
        self.base_n.copy_from_slice(base);
        self.norm.to_norm(&mut self.base_n);
        let seen = self.heads.state_dim + self.heads.seen_len();
        let input = self.mlp.input();
        self.heads.fill(head_w, obs, &mut input[..seen]);
        if !self.full {
            input[seen..].copy_from_slice(&self.base_n);
        }
        let head = self.mlp.run(mlp_w);
        // Head: means then log-stds; squash, scale, combine in normalised units.
        let a_dim = self.act_dim;
        for (k, o) in out.iter_mut().enumerate().take(a_dim) {
            let mut u = head[k];
            if self.explore {
                let ls = head[a_dim + k].clamp(self.log_std.0, self.log_std.1);
                let e: f32 = StandardNormal.sample(&mut self.rng);
                u += ls.exp() * e;
            }
            *o = if self.full {
                u.tanh()
            } else {
                (self.base_n[k] + self.scale[k] * u.tanh()).clamp(-1.0, 1.0)
            };
        }
        self.norm.to_robot(&mut out[..a_dim]);
        for (o, b) in out[..a_dim].iter_mut().zip(base) {
            *o -= b;
        }
    }

    fn refresh(&mut self) -> u64 {
        self.weights.update();
        self.weights.get().version
    }

    fn set_explore(&mut self, on: bool) {
        self.explore = on;
    }
}
