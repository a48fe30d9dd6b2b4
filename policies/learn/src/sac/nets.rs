//! The networks of the learner, in candle: a critic ensemble evaluated as batched matrix
//! products (one GEMM per layer for all members, not N separate networks) and a tanh-squashed
//! Gaussian actor.

use candle_core::{Device, Result, Tensor, Var};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use reflex_mlp::norm::{Act, layer_norm_act};
pub use reflex_mlp::ops::{bias_relu, matmul};

fn uniform(rng: &mut ChaCha8Rng, n: usize, k: f32) -> Vec<f32> {
    (0..n)
        .map(|_| (rng.random::<f32>() * 2.0 - 1.0) * k)
        .collect()
}

/// N MLPs with the same shape evaluated together.
pub struct Ensemble {
    /// Members.
    pub n: usize,
    /// Weights per layer: `[N, in, out]` (the first layer is `[in, N * out]`, shared input).
    pub ws: Vec<Var>,
    /// Biases per layer: `[N, 1, out]`.
    pub bs: Vec<Var>,
    /// Layer-norm gains and offsets per hidden layer, `[N, 1, out]`.
    pub ln: Option<Vec<(Var, Var)>>,
    /// Members, widths and LayerNorm, as the hand-written update reads the parameters.
    shape: reflex_mlp::ensemble::Shape,
}

impl Ensemble {
    /// `n` MLPs `dims[0] -> dims[1] -> ... -> dims.last()`, ReLU between layers (after
    /// LayerNorm when `layer_norm`).
    pub fn new(
        n: usize,
        dims: &[usize],
        layer_norm: bool,
        rng: &mut ChaCha8Rng,
        dev: &Device,
    ) -> Result<Self> {
        let mut ws = vec![];
        let mut bs = vec![];
        let mut ln = vec![];
        for (l, w) in dims.windows(2).enumerate() {
            let (i, o) = (w[0], w[1]);
            let k = 1.0 / (i as f32).sqrt();
            let wt = if l == 0 {
                // Member-major blocks side by side: column j*o..(j+1)*o belongs to member j.
                Tensor::from_vec(uniform(rng, n * i * o, k), (n, i, o), dev)?
                    .permute((1, 0, 2))?
                    .reshape((i, n * o))?
                    .contiguous()?
            } else {
                Tensor::from_vec(uniform(rng, n * i * o, k), (n, i, o), dev)?
            };
            ws.push(Var::from_tensor(&wt)?);
            bs.push(Var::from_tensor(&Tensor::from_vec(
                uniform(rng, n * o, k),
                (n, 1, o),
                dev,
            )?)?);
            if l + 2 < dims.len() && layer_norm {
                ln.push((
                    Var::from_tensor(&Tensor::ones((n, 1, o), candle_core::DType::F32, dev)?)?,
                    Var::from_tensor(&Tensor::zeros((n, 1, o), candle_core::DType::F32, dev)?)?,
                ));
            }
        }
        Ok(Ensemble {
            n,
            ws,
            bs,
            ln: layer_norm.then_some(ln),
            shape: reflex_mlp::ensemble::Shape {
                members: n,
                dims: dims.to_vec(),
                layer_norm,
            },
        })
    }

    /// The shape the hand-written update ([`reflex_mlp::ensemble`]) reads these parameters as.
    pub fn shape(&self) -> &reflex_mlp::ensemble::Shape {
        &self.shape
    }

    /// Every parameter.
    pub fn vars(&self) -> Vec<Var> {
        self.params().cloned().collect()
    }

    /// `x` `[B, in]` -> `[N, B, out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_with(x, |v| v.as_tensor().clone())
    }

    /// `x` `[B, in]` -> `[N, B, out]` with the parameters detached: gradients flow to `x` only
    /// (the actor update scores its actions with the critic without differentiating the
    /// critic's weights).
    pub fn forward_frozen(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_with(x, |v| v.as_tensor().detach())
    }

    fn forward_with(&self, x: &Tensor, p: impl Fn(&Var) -> Tensor) -> Result<Tensor> {
        let b = x.dim(0)?;
        let o0 = self.shape.dims[1];
        // First layer: one GEMM for every member.
        let mut h = matmul(x, &p(&self.ws[0]))?
            .reshape((b, self.n, o0))?
            .transpose(0, 1)?
            .contiguous()?;
        let last = self.ws.len() - 1;
        for l in 0..=last {
            if l > 0 {
                h = matmul(&h, &p(&self.ws[l]))?;
            }
            let bias = p(&self.bs[l]);
            h = match &self.ln {
                _ if l == last => h.broadcast_add(&bias)?,
                Some(ln) => layer_norm_act(
                    &h.broadcast_add(&bias)?,
                    &p(&ln[l].0),
                    &p(&ln[l].1),
                    1e-5,
                    Act::Relu,
                )?,
                None => bias_relu(&h, &bias)?,
            };
        }
        Ok(h)
    }

    /// Copies `other`'s parameters into this one, or moves towards them: `self = tau other +
    /// (1 - tau) self` (Polyak averaging of target networks).
    pub fn polyak_from(&self, other: &Ensemble, tau: f64) -> Result<()> {
        if self.shape != other.shape {
            candle_core::bail!(
                "Polyak update of a {:?} ensemble from a {:?} one",
                self.shape,
                other.shape
            );
        }
        for (t, s) in self.params().zip(other.params()) {
            polyak_one(t, s, tau)?;
        }
        Ok(())
    }

    /// Every parameter in [`Self::vars`] order, borrowed.
    fn params(&self) -> impl Iterator<Item = &Var> {
        self.ws
            .iter()
            .chain(&self.bs)
            .chain(self.ln.iter().flatten().flat_map(|(g, b)| [g, b]))
    }
}

/// `target = tau source + (1 - tau) target` for each pair of tensors, in place (`tau >= 1`
/// copies).
pub fn polyak_vars(target: &[Var], source: &[Var], tau: f64) -> Result<()> {
    if target.len() != source.len() {
        candle_core::bail!(
            "Polyak update of {} tensors from {}",
            target.len(),
            source.len()
        );
    }
    for (t, s) in target.iter().zip(source) {
        polyak_one(t, s, tau)?;
    }
    Ok(())
}

/// `target = tau source + (1 - tau) target` for one tensor, in place (`tau >= 1` copies).
fn polyak_one(target: &Var, source: &Var, tau: f64) -> Result<()> {
    if tau >= 1.0 {
        return target.set(&source.as_tensor().detach().copy()?);
    }
    let (a, b) = (tau as f32, (1.0 - tau) as f32);
    // In place, the arithmetic of `s * tau + t * (1 - tau)` to the bit.
    target.as_tensor().inplace_op2(
        source.as_tensor(),
        &super::adam::Inplace2("polyak", |t: &mut f32, s: f32| {
            *t = (s * a + 0.0) + (*t * b + 0.0)
        }),
    )
}

/// A tanh-squashed diagonal Gaussian actor.
pub struct Actor {
    /// Trunk and head as a one-member ensemble: `in -> hidden... -> 2 A` (means, then log stds).
    pub net: Ensemble,
    /// Action dimension.
    pub action_dim: usize,
    /// Log-std bounds.
    pub log_std: (f32, f32),
}

/// A sampled action with its log-probability.
pub struct ActorSample {
    /// `tanh(u)` in [-1, 1], `[B, A]`.
    pub action: Tensor,
    /// `log pi(action | s)` of the squashed distribution, `[B]`.
    pub log_prob: Tensor,
}

impl Actor {
    /// An actor `obs_dim -> hidden -> 2 A`. `zero_head = Some(s)` starts the last layer at exactly
    /// zero with the log-std biases at `s`: the initial deterministic action is `tanh(0) = 0`, and
    /// the initial exploration noise is small (a residual must not drown its base in noise).
    #[allow(clippy::too_many_arguments)] // one call site, every argument named there
    pub fn new(
        obs_dim: usize,
        hidden: &[usize],
        action_dim: usize,
        layer_norm: bool,
        zero_head: Option<f32>,
        log_std: (f32, f32),
        rng: &mut ChaCha8Rng,
        dev: &Device,
    ) -> Result<Self> {
        let mut dims = vec![obs_dim];
        dims.extend_from_slice(hidden);
        dims.push(2 * action_dim);
        let net = Ensemble::new(1, &dims, layer_norm, rng, dev)?;
        if let Some(init_log_std) = zero_head {
            let l = net.ws.len() - 1;
            let w = net.ws[l].as_tensor().to_vec3::<f32>()?;
            let (i, o) = (w[0].len(), w[0][0].len());
            let mut flat: Vec<f32> = w[0].iter().flatten().copied().collect();
            let mut b = net.bs[l].as_tensor().flatten_all()?.to_vec1::<f32>()?;
            flat.iter_mut().for_each(|v| *v = 0.0);
            for (c, v) in b.iter_mut().enumerate() {
                *v = if c < action_dim { 0.0 } else { init_log_std };
            }
            net.ws[l].set(&Tensor::from_vec(flat, (1, i, o), dev)?)?;
            net.bs[l].set(&Tensor::from_vec(b, (1, 1, o), dev)?)?;
        }
        Ok(Actor {
            net,
            action_dim,
            log_std,
        })
    }

    /// Means and clamped log-stds of the pre-squash Gaussian, each `[B, A]`.
    pub fn heads(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        let out = self.net.forward(x)?.squeeze(0)?;
        let mean = out.narrow(1, 0, self.action_dim)?;
        let log_std = out
            .narrow(1, self.action_dim, self.action_dim)?
            .clamp(self.log_std.0, self.log_std.1)?;
        Ok((mean, log_std))
    }

    /// The deterministic action `tanh(mean)`, `[B, A]`.
    pub fn mean_action(&self, x: &Tensor) -> Result<Tensor> {
        self.heads(x)?.0.tanh()
    }

    /// A reparameterised sample with standard-normal noise `eps` `[B, A]` and its log-probability.
    pub fn sample(&self, x: &Tensor, eps: &Tensor) -> Result<ActorSample> {
        let (mean, log_std) = self.heads(x)?;
        let u = (&mean + (log_std.exp()? * eps)?)?;
        let action = u.tanh()?;
        // log N(u; mean, std) = -eps^2/2 - log std - log(2 pi)/2, per component.
        let ln2pi = (2.0 * std::f64::consts::PI).ln();
        let gauss = ((eps.sqr()? * -0.5)? - &log_std)?.affine(1.0, -0.5 * ln2pi)?;
        // log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), the numerically stable form.
        let m2u = (&u * -2.0)?;
        let softplus = (m2u.relu()? + (m2u.abs()?.neg()?.exp()? + 1.0)?.log()?)?;
        let log_det = ((u.neg()? - softplus)?.affine(2.0, 2.0 * std::f64::consts::LN_2))?;
        let log_prob = (gauss - log_det)?.sum(1)?;
        Ok(ActorSample { action, log_prob })
    }
}

/// A seeded standard-normal tensor (candle's own RNG is not seedable on the CPU).
pub fn randn(rng: &mut ChaCha8Rng, shape: (usize, usize), dev: &Device) -> Result<Tensor> {
    use rand_distr::{Distribution, StandardNormal};
    let v: Vec<f32> = (0..shape.0 * shape.1)
        .map(|_| StandardNormal.sample(rng))
        .collect();
    Tensor::from_vec(v, shape, dev)
}

/// A seeded generator for network initialisation.
pub fn init_rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frozen_ensemble_passes_the_same_input_gradient_and_none_to_its_weights() {
        let mut rng = init_rng(5);
        let e = Ensemble::new(2, &[3, 8, 8, 1], true, &mut rng, &Device::Cpu).unwrap();
        let x = Var::from_tensor(
            &Tensor::from_vec(uniform(&mut rng, 4 * 3, 1.0), (4, 3), &Device::Cpu).unwrap(),
        )
        .unwrap();
        let live = e.forward(x.as_tensor()).unwrap().sum_all().unwrap();
        let frozen = e.forward_frozen(x.as_tensor()).unwrap().sum_all().unwrap();
        assert_eq!(
            live.to_scalar::<f32>().unwrap(),
            frozen.to_scalar::<f32>().unwrap()
        );
        let (gl, gf) = (live.backward().unwrap(), frozen.backward().unwrap());
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(flat(gl.get(&x).unwrap()), flat(gf.get(&x).unwrap()));
        for w in e.vars() {
            assert!(gl.get(&w).is_some(), "the live forward trains every weight");
            assert!(
                gf.get(&w).is_none(),
                "the frozen forward computed a weight gradient"
            );
        }
    }
}
