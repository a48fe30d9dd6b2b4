//! The networks of the learner, in candle: a critic ensemble evaluated as batched matrix
//! products (one GEMM per layer for all members, not N separate networks) and a tanh-squashed
//! Gaussian actor.

use super::gemm::Gemm;
use candle_core::{
    CpuStorage, CustomOp1, CustomOp2, CustomOp3, D, Device, Layout, Result, Shape, Tensor, Var,
};

fn f32s<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<&'a [f32]> {
    match (s, l.contiguous_offsets()) {
        (CpuStorage::F32(v), Some((a, b))) => Ok(&v[a..b]),
        _ => candle_core::bail!("{what}: expected contiguous f32 storage"),
    }
}
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn uniform(rng: &mut ChaCha8Rng, n: usize, k: f32) -> Vec<f32> {
    (0..n)
        .map(|_| (rng.random::<f32>() * 2.0 - 1.0) * k)
        .collect()
}

/// `a @ b` (2-D, or 3-D batched) whose backward computes only the gradients somebody needs.
///
/// candle's own matmul computes both operands' gradients whatever they are. A learner update
/// wastes two of them: the gradient of a data input (the first layer's input in the critic and
/// actor updates) and the critic's weight gradients in the actor update, where the critic only
/// passes gradients through to the action. Here an operand that is not tracked (plain data, or
/// a weight detached for the actor update) gets none: the same numbers, fewer matrix products.
struct NeededGradsMatmul;

impl CustomOp2 for NeededGradsMatmul {
    fn name(&self) -> &'static str {
        "matmul (needed gradients only)"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        Gemm.cpu_fwd(s1, l1, s2, l2)
    }

    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let r = a.rank();
        // Read transposed in place (strided), computed on the learner's threads.
        let ga = if a.track_op() {
            Some(grad.apply_op2_no_bwd(&b.transpose(r - 2, r - 1)?, &Gemm)?)
        } else {
            None
        };
        let gb = if b.track_op() {
            Some(a.transpose(r - 2, r - 1)?.apply_op2_no_bwd(grad, &Gemm)?)
        } else {
            None
        };
        Ok((ga, gb))
    }
}

/// `a @ b`, computing in backward only the gradients of operands that are tracked.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    a.apply_op2(b, NeededGradsMatmul)
}

/// `relu(h + b)` for `h` `[N, B, O]` and a bias `b` `[N, 1, O]`, in one pass each way.
///
/// The separate operations it replaces (a broadcast add, a ReLU, and in backward a comparison
/// against a zeroed tensor, a conversion, a product and a reduction) each allocated a tensor of
/// the layer's size. The arithmetic is theirs: ReLU passes the gradient where `h + b >= 0`
/// (multiplying by 1 or 0), and the bias gradient is the sum over the batch.
struct BiasRelu;

fn bias_dims(h: &Layout, b: &Layout) -> Result<(usize, usize, usize)> {
    let (n, rows, o) = h.shape().dims3()?;
    if b.shape().dims3()? != (n, 1, o) {
        candle_core::bail!("bias {:?} for activations {:?}", b.dims(), h.dims());
    }
    Ok((n, rows, o))
}

impl CustomOp2 for BiasRelu {
    fn name(&self) -> &'static str {
        "bias + relu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (n, rows, o) = bias_dims(l1, l2)?;
        let (h, b) = (f32s(s1, l1, self.name())?, f32s(s2, l2, self.name())?);
        // Extended row by row rather than zero-filled and then written.
        let mut out = Vec::with_capacity(h.len());
        for (k, src) in h.chunks_exact(o).enumerate() {
            let bias = &b[(k / rows) * o..(k / rows + 1) * o];
            out.extend(src.iter().zip(bias).map(|(x, c)| (x + c).max(0f32)));
        }
        Ok((CpuStorage::F32(out), Shape::from((n, rows, o))))
    }

    fn bwd(
        &self,
        h: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dpre = h.apply_op3_no_bwd(b, &grad.contiguous()?, &BiasReluGrad)?;
        let db = if b.track_op() {
            Some(dpre.apply_op1_no_bwd(&SumRows)?)
        } else {
            None
        };
        Ok((h.track_op().then_some(dpre), db))
    }
}

/// The gradient before the ReLU: `grad * (h + b >= 0)`.
struct BiasReluGrad;

impl CustomOp3 for BiasReluGrad {
    fn name(&self) -> &'static str {
        "bias + relu gradient"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (n, rows, o) = bias_dims(l1, l2)?;
        let (h, b) = (f32s(s1, l1, self.name())?, f32s(s2, l2, self.name())?);
        let g = f32s(s3, l3, self.name())?;
        if g.len() != h.len() {
            candle_core::bail!(
                "{}: gradient of {} values for {}",
                self.name(),
                g.len(),
                h.len()
            );
        }
        let mut out = Vec::with_capacity(h.len());
        for (k, (src, gr)) in h.chunks_exact(o).zip(g.chunks_exact(o)).enumerate() {
            let bias = &b[(k / rows) * o..(k / rows + 1) * o];
            out.extend(
                src.iter()
                    .zip(bias)
                    .zip(gr)
                    .map(|((x, c), gv)| gv * if x + c >= 0f32 { 1f32 } else { 0f32 }),
            );
        }
        Ok((CpuStorage::F32(out), Shape::from((n, rows, o))))
    }
}

/// `x` `[N, B, O]` summed over `B` to `[N, 1, O]`, adding the rows in order from zero as
/// candle's reduction does (the same bits), in one contiguous pass instead of an index
/// computation per element.
struct SumRows;

impl CustomOp1 for SumRows {
    fn name(&self) -> &'static str {
        "sum over rows"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (n, rows, o) = l.shape().dims3()?;
        let x = f32s(s, l, self.name())?;
        let mut out = vec![0f32; n * o];
        for (dst, block) in out.chunks_exact_mut(o).zip(x.chunks_exact(rows * o)) {
            for row in block.chunks_exact(o) {
                for (d, v) in dst.iter_mut().zip(row) {
                    *d += v;
                }
            }
        }
        Ok((CpuStorage::F32(out), Shape::from((n, 1, o))))
    }
}

/// `relu(h + b)`, fused (see [`BiasRelu`]).
pub fn bias_relu(h: &Tensor, b: &Tensor) -> Result<Tensor> {
    h.contiguous()?.apply_op2(&b.contiguous()?, BiasRelu)
}

/// Layer normalisation over the last dimension (differentiable basic ops).
fn layer_norm(x: &Tensor, gamma: &Tensor, beta: &Tensor) -> Result<Tensor> {
    let mean = x.mean_keepdim(D::Minus1)?;
    let xc = x.broadcast_sub(&mean)?;
    let var = xc.sqr()?.mean_keepdim(D::Minus1)?;
    let xn = xc.broadcast_div(&(var + 1e-5)?.sqrt()?)?;
    xn.broadcast_mul(gamma)?.broadcast_add(beta)
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
    dims: Vec<usize>,
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
            dims: dims.to_vec(),
        })
    }

    /// Every parameter.
    pub fn vars(&self) -> Vec<Var> {
        let mut v: Vec<Var> = self.ws.iter().chain(&self.bs).cloned().collect();
        if let Some(ln) = &self.ln {
            for (g, b) in ln {
                v.push(g.clone());
                v.push(b.clone());
            }
        }
        v
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
        let o0 = self.dims[1];
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
                Some(ln) => {
                    layer_norm(&h.broadcast_add(&bias)?, &p(&ln[l].0), &p(&ln[l].1))?.relu()?
                }
                None => bias_relu(&h, &bias)?,
            };
        }
        Ok(h)
    }

    /// Copies `other`'s parameters into this one, or moves towards them: `self = tau other +
    /// (1 - tau) self` (Polyak averaging of target networks).
    pub fn polyak_from(&self, other: &Ensemble, tau: f64) -> Result<()> {
        polyak_vars(&self.vars(), &other.vars(), tau)
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
    let (a, b) = (tau as f32, (1.0 - tau) as f32);
    for (t, s) in target.iter().zip(source) {
        if tau >= 1.0 {
            t.set(&s.as_tensor().detach().copy()?)?;
        } else {
            // In place, the arithmetic of `s * tau + t * (1 - tau)` to the bit.
            t.as_tensor().inplace_op2(
                s.as_tensor(),
                &super::adam::Inplace2("polyak", |t: &mut f32, s: f32| {
                    *t = (s * a + 0.0) + (*t * b + 0.0)
                }),
            )?;
        }
    }
    Ok(())
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

    fn rand_var(rng: &mut ChaCha8Rng, shape: (usize, usize, usize)) -> Var {
        let v = uniform(rng, shape.0 * shape.1 * shape.2, 1.0);
        Var::from_tensor(&Tensor::from_vec(v, shape, &Device::Cpu).unwrap()).unwrap()
    }

    #[test]
    fn the_needed_gradients_matmul_gives_candles_numbers_and_skips_untracked_operands() {
        let mut rng = init_rng(3);
        let (a, b) = (rand_var(&mut rng, (2, 5, 4)), rand_var(&mut rng, (2, 4, 3)));
        let weights =
            Tensor::from_vec(uniform(&mut rng, 2 * 5 * 3, 1.0), (2, 5, 3), &Device::Cpu).unwrap();
        let loss = |y: Tensor| y.mul(&weights).unwrap().sum_all().unwrap();
        let ours = loss(matmul(a.as_tensor(), b.as_tensor()).unwrap());
        let theirs = loss(a.as_tensor().matmul(b.as_tensor()).unwrap());
        assert_eq!(
            ours.to_scalar::<f32>().unwrap(),
            theirs.to_scalar::<f32>().unwrap()
        );
        let (g1, g2) = (ours.backward().unwrap(), theirs.backward().unwrap());
        for v in [&a, &b] {
            let (x, y) = (g1.get(v).unwrap(), g2.get(v).unwrap());
            assert_eq!(
                x.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                y.flatten_all().unwrap().to_vec1::<f32>().unwrap()
            );
        }
        // A detached right operand gets no gradient; the left one still the same.
        let frozen = b.as_tensor().detach();
        let g = loss(matmul(a.as_tensor(), &frozen).unwrap())
            .backward()
            .unwrap();
        assert!(g.get(&frozen).is_none() && g.get(b.as_tensor()).is_none());
        assert_eq!(
            g.get(&a)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap(),
            g2.get(&a)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        );
    }

    #[test]
    fn the_fused_bias_relu_gives_candles_numbers_forward_and_backward() {
        let mut rng = init_rng(4);
        let h = rand_var(&mut rng, (2, 6, 5));
        let b = rand_var(&mut rng, (2, 1, 5));
        // An exact zero before the ReLU, where the gradient's convention matters.
        let mut hv = h
            .as_tensor()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let bv = b
            .as_tensor()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        hv[7] = -bv[2];
        h.set(&Tensor::from_vec(hv, (2, 6, 5), &Device::Cpu).unwrap())
            .unwrap();
        let w = Tensor::from_vec(uniform(&mut rng, 60, 1.0), (2, 6, 5), &Device::Cpu).unwrap();
        let ours = bias_relu(h.as_tensor(), b.as_tensor())
            .unwrap()
            .mul(&w)
            .unwrap()
            .sum_all()
            .unwrap();
        let theirs = h
            .as_tensor()
            .broadcast_add(b.as_tensor())
            .unwrap()
            .relu()
            .unwrap()
            .mul(&w)
            .unwrap()
            .sum_all()
            .unwrap();
        assert_eq!(
            ours.to_scalar::<f32>().unwrap().to_bits(),
            theirs.to_scalar::<f32>().unwrap().to_bits()
        );
        let (g1, g2) = (ours.backward().unwrap(), theirs.backward().unwrap());
        let bits = |t: &Tensor| -> Vec<u32> {
            t.flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        };
        for v in [&h, &b] {
            assert_eq!(bits(g1.get(v).unwrap()), bits(g2.get(v).unwrap()));
        }
    }

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
