//! Adam / AdamW with explicit weight decay, global gradient-norm clipping, and a state that can
//! be saved and restored exactly (checkpoints must resume training as if never interrupted).

use candle_core::backprop::GradStore;
use candle_core::{CpuStorage, InplaceOp1, InplaceOp2, Layout, Result, Tensor, Var};
use std::cell::RefCell;

fn contiguous<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<&'a [f32]> {
    match (s, l.contiguous_offsets()) {
        (CpuStorage::F32(v), Some((a, b))) => Ok(&v[a..b]),
        _ => candle_core::bail!("{what}: expected contiguous f32 storage"),
    }
}

fn contiguous_mut<'a>(s: &'a mut CpuStorage, l: &Layout, what: &str) -> Result<&'a mut [f32]> {
    match (s, l.contiguous_offsets()) {
        (CpuStorage::F32(v), Some((a, b))) => Ok(&mut v[a..b]),
        _ => candle_core::bail!("{what}: expected contiguous f32 storage"),
    }
}

/// `f(dst, a)` element by element, in place on `dst`: one pass over memory instead of a chain of
/// tensor operations that each allocate their result.
pub struct Inplace2<F: Fn(&mut f32, f32)>(pub &'static str, pub F);

impl<F: Fn(&mut f32, f32)> InplaceOp2 for Inplace2<F> {
    fn name(&self) -> &'static str {
        self.0
    }
    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<()> {
        let a = contiguous(s2, l2, self.0)?;
        let d = contiguous_mut(s1, l1, self.0)?;
        if d.len() != a.len() {
            candle_core::bail!("{}: {} values against {}", self.0, d.len(), a.len());
        }
        for (x, y) in d.iter_mut().zip(a) {
            (self.1)(x, *y);
        }
        Ok(())
    }
}

/// One Adam(W) step of one variable, in a single pass over its memory: both moments from the
/// gradient, then the parameter from the moments. The moments live in the optimiser's own
/// buffers (candle's in-place operations write only their destination tensor, and each one
/// allocates to check its layout: three passes and three allocations per variable before).
struct Step<'a> {
    k: &'a StepConsts,
    grad: &'a [f32],
    /// The gradient's clipping factor (1: none).
    scale: f32,
    m: RefCell<&'a mut [f32]>,
    v: RefCell<&'a mut [f32]>,
}

impl InplaceOp1 for Step<'_> {
    fn name(&self) -> &'static str {
        "adam step"
    }
    fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout) -> Result<()> {
        let p = contiguous_mut(s, l, "adam step")?;
        let (mut m, mut v) = (self.m.borrow_mut(), self.v.borrow_mut());
        if p.len() != self.grad.len() || p.len() != m.len() || p.len() != v.len() {
            candle_core::bail!(
                "adam step: {} values, {} gradients, moments of {} and {}",
                p.len(),
                self.grad.len(),
                m.len(),
                v.len()
            );
        }
        let StepConsts {
            b1,
            ob1,
            b2,
            ob2,
            ibc1,
            ibc2,
            eps,
            lr,
            decay,
        } = *self.k;
        let scale = self.scale;
        // The arithmetic of the tensor form it replaces, operation for operation in f32 (`x * c`
        // is `x * c + 0` there, the clipped gradient `g * scale + 0`), so the numbers are the same
        // to the bit (a unit test compares).
        for (((p, m), v), &g) in p
            .iter_mut()
            .zip(m.iter_mut())
            .zip(v.iter_mut())
            .zip(self.grad)
        {
            let g = if scale != 1.0 { g * scale + 0.0 } else { g };
            *m = (*m * b1 + 0.0) + (g * ob1 + 0.0);
            *v = (*v * b2 + 0.0) + ((g * g) * ob2 + 0.0);
            let upd = (*m * ibc1 + 0.0) / ((*v * ibc2 + 0.0).sqrt() + eps);
            let step = upd * lr + 0.0;
            *p = match decay {
                Some(d) => (*p * d + 0.0) - step,
                None => *p - step,
            };
        }
        Ok(())
    }
}

/// One step's constants, in f32 as the tensor form computed them.
#[derive(Clone, Copy)]
struct StepConsts {
    b1: f32,
    ob1: f32,
    b2: f32,
    ob2: f32,
    ibc1: f32,
    ibc2: f32,
    eps: f32,
    lr: f32,
    decay: Option<f32>,
}

/// Optimiser settings.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AdamConfig {
    /// Learning rate.
    pub lr: f64,
    /// Decoupled weight decay (AdamW); 0 gives Adam.
    pub weight_decay: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Numerical floor.
    pub eps: f64,
    /// Clip the global gradient norm to this (None: no clipping).
    pub max_grad_norm: Option<f64>,
}

impl AdamConfig {
    /// Adam with the usual betas at learning rate `lr`.
    pub fn adam(lr: f64) -> Self {
        AdamConfig {
            lr,
            weight_decay: 0.0,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            max_grad_norm: None,
        }
    }
}

/// Adam state over a fixed list of variables.
pub struct Adam {
    /// Settings.
    pub cfg: AdamConfig,
    vars: Vec<Var>,
    /// First moments, one buffer per variable (its values in row-major order).
    m: Vec<Vec<f32>>,
    /// Second moments.
    v: Vec<Vec<f32>>,
    /// Steps taken.
    pub t: u64,
}

impl Adam {
    /// An optimiser for `vars`.
    pub fn new(vars: Vec<Var>, cfg: AdamConfig) -> Result<Self> {
        let zeros = || -> Vec<Vec<f32>> {
            vars.iter()
                .map(|v| vec![0f32; v.as_tensor().elem_count()])
                .collect()
        };
        Ok(Adam {
            cfg,
            m: zeros(),
            v: zeros(),
            vars,
            t: 0,
        })
    }

    /// Counts a step and returns its constants (bias corrections for the new step count).
    fn next_step(&mut self) -> StepConsts {
        self.t += 1;
        let c = self.cfg;
        let bc1 = 1.0 - c.beta1.powi(self.t as i32);
        let bc2 = 1.0 - c.beta2.powi(self.t as i32);
        let f = |x: f64| x as f32;
        StepConsts {
            b1: f(c.beta1),
            ob1: f(1.0 - c.beta1),
            b2: f(c.beta2),
            ob2: f(1.0 - c.beta2),
            ibc1: f(1.0 / bc1),
            ibc2: f(1.0 / bc2),
            eps: f(c.eps),
            lr: f(c.lr),
            decay: (c.weight_decay > 0.0).then(|| f(1.0 - c.lr * c.weight_decay)),
        }
    }

    /// Global norm of the gradients of this optimiser's variables.
    pub fn grad_norm(&self, grads: &GradStore) -> Result<f64> {
        let mut sq = 0.0f64;
        for v in &self.vars {
            if let Some(g) = grads.get(v.as_tensor()) {
                sq += g.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
            }
        }
        Ok(sq.sqrt())
    }

    /// The clipping factor for a gradient of global norm `norm` (1: no clipping).
    fn clip_scale(&self, norm: f64) -> f32 {
        match self.cfg.max_grad_norm {
            Some(max) if norm > max => (max / (norm + 1e-6)) as f32,
            _ => 1.0,
        }
    }

    /// Variable `i`'s step from its gradient `grad`, in place.
    fn step_one(&mut self, i: usize, k: &StepConsts, grad: &[f32], scale: f32) -> Result<()> {
        self.vars[i].as_tensor().inplace_op1(&Step {
            k,
            grad,
            scale,
            m: RefCell::new(&mut self.m[i]),
            v: RefCell::new(&mut self.v[i]),
        })
    }

    /// One step from `grads`; returns the gradient norm before clipping. Variables without a
    /// gradient keep their values and moments.
    pub fn step(&mut self, grads: &GradStore) -> Result<f64> {
        let norm = if self.cfg.max_grad_norm.is_some() {
            self.grad_norm(grads)?
        } else {
            0.0
        };
        let scale = self.clip_scale(norm);
        let k = self.next_step();
        for i in 0..self.vars.len() {
            let Some(g) = grads.get(self.vars[i].as_tensor()) else {
                continue;
            };
            let g = g.contiguous()?; // a copy only when candle's gradient is strided
            let (storage, layout) = g.storage_and_layout();
            let candle_core::Storage::Cpu(c) = &*storage else {
                candle_core::bail!("adam: gradients on the CPU expected");
            };
            let values = contiguous(c, layout, "adam gradient")?;
            self.step_one(i, &k, values, scale)?;
        }
        Ok(norm)
    }

    /// One step from gradients held outside candle, one slice per variable in this
    /// optimiser's order (each of its variable's size); the arithmetic of [`Self::step`] to the
    /// bit. Returns the gradient norm before clipping (0 when clipping is off).
    pub fn step_slices<'g>(
        &mut self,
        grads: impl Iterator<Item = &'g [f32]> + Clone,
    ) -> Result<f64> {
        let norm = if self.cfg.max_grad_norm.is_some() {
            grads
                .clone()
                .map(|g| g.iter().map(|x| x * x).sum::<f32>() as f64)
                .sum::<f64>()
                .sqrt()
        } else {
            0.0
        };
        let scale = self.clip_scale(norm);
        let k = self.next_step();
        let mut used = 0;
        for (i, g) in grads.enumerate().take(self.vars.len()) {
            used += 1;
            self.step_one(i, &k, g, scale)?;
        }
        if used != self.vars.len() {
            candle_core::bail!("{used} gradients for {} variables", self.vars.len());
        }
        Ok(norm)
    }

    /// The moments as tensors of their variables' shapes, for a checkpoint.
    pub fn state(&self) -> Result<(Vec<Tensor>, Vec<Tensor>, u64)> {
        let tensors = |ms: &[Vec<f32>]| -> Result<Vec<Tensor>> {
            ms.iter()
                .zip(&self.vars)
                .map(|(m, var)| {
                    let t = var.as_tensor();
                    Tensor::from_slice(m, t.shape(), t.device())
                })
                .collect()
        };
        Ok((tensors(&self.m)?, tensors(&self.v)?, self.t))
    }

    /// Restores the moments from a checkpoint: one first and one second moment per variable, each
    /// of its variable's shape.
    pub fn restore(&mut self, m: Vec<Tensor>, v: Vec<Tensor>, t: u64) -> Result<()> {
        if m.len() != self.vars.len() || v.len() != self.vars.len() {
            candle_core::bail!(
                "optimiser moments for {} and {} tensors where the network has {}",
                m.len(),
                v.len(),
                self.vars.len()
            );
        }
        for (k, var) in self.vars.iter().enumerate() {
            let want = var.as_tensor().dims();
            if m[k].dims() != want || v[k].dims() != want {
                candle_core::bail!(
                    "optimiser moments of shapes {:?} and {:?} for a tensor of {want:?}",
                    m[k].dims(),
                    v[k].dims()
                );
            }
        }
        let values = |ts: Vec<Tensor>| -> Result<Vec<Vec<f32>>> {
            ts.iter()
                .map(|t| t.flatten_all()?.to_vec1::<f32>())
                .collect()
        };
        self.m = values(m)?;
        self.v = values(v)?;
        self.t = t;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// The tensor-operation form of one Adam(W) step that the fused one replaced.
    fn reference_step(
        p: &Tensor,
        g: &Tensor,
        m: &mut Tensor,
        v: &mut Tensor,
        c: AdamConfig,
        t: i32,
    ) -> Tensor {
        let (bc1, bc2) = (1.0 - c.beta1.powi(t), 1.0 - c.beta2.powi(t));
        *m = ((&*m * c.beta1).unwrap() + (g * (1.0 - c.beta1)).unwrap()).unwrap();
        *v = ((&*v * c.beta2).unwrap() + (g.sqr().unwrap() * (1.0 - c.beta2)).unwrap()).unwrap();
        let mhat = (&*m / bc1).unwrap();
        let vhat = (&*v / bc2).unwrap();
        let upd = (mhat / (vhat.sqrt().unwrap() + c.eps).unwrap()).unwrap();
        if c.weight_decay > 0.0 {
            ((p * (1.0 - c.lr * c.weight_decay)).unwrap() - (upd * c.lr).unwrap()).unwrap()
        } else {
            (p - (upd * c.lr).unwrap()).unwrap()
        }
    }

    #[test]
    fn the_fused_step_gives_the_tensor_forms_numbers_to_the_bit() {
        for wd in [0.0, 0.01] {
            let cfg = AdamConfig {
                weight_decay: wd,
                ..AdamConfig::adam(3e-4)
            };
            let dev = Device::Cpu;
            let init: Vec<f32> = (0..64)
                .map(|i| ((i * 37 % 17) as f32 - 8.0) * 0.1)
                .collect();
            let var = Var::from_vec(init.clone(), 64, &dev).unwrap();
            let mut opt = Adam::new(vec![var.clone()], cfg).unwrap();
            let mut p = Tensor::from_vec(init, 64, &dev).unwrap();
            let (mut m, mut v) = (p.zeros_like().unwrap(), p.zeros_like().unwrap());
            for t in 1..=20 {
                let loss = (var.as_tensor().sqr().unwrap() * (t as f64))
                    .unwrap()
                    .sum_all()
                    .unwrap();
                let grads = loss.backward().unwrap();
                let g = grads.get(var.as_tensor()).unwrap().clone();
                opt.step(&grads).unwrap();
                p = reference_step(&p, &g, &mut m, &mut v, cfg, t);
                let bits = |x: &Tensor| -> Vec<u32> {
                    x.to_vec1::<f32>()
                        .unwrap()
                        .iter()
                        .map(|f| f.to_bits())
                        .collect()
                };
                assert_eq!(
                    bits(var.as_tensor()),
                    bits(&p),
                    "step {t}, weight decay {wd}"
                );
            }
        }
    }

    #[test]
    fn moments_of_another_count_or_shape_are_refused() {
        let dev = Device::Cpu;
        let var = Var::from_tensor(&Tensor::zeros((2, 3), candle_core::DType::F32, &dev).unwrap())
            .unwrap();
        let mut opt = Adam::new(vec![var], AdamConfig::adam(1e-3)).unwrap();
        let t =
            |shape: (usize, usize)| Tensor::zeros(shape, candle_core::DType::F32, &dev).unwrap();
        let e = opt.restore(vec![], vec![], 5).unwrap_err().to_string();
        assert!(
            e.contains("for 0 and 0 tensors where the network has 1"),
            "{e}"
        );
        let e = opt
            .restore(vec![t((3, 2))], vec![t((2, 3))], 5)
            .unwrap_err()
            .to_string();
        assert!(e.contains("[3, 2]"), "{e}");
        opt.restore(vec![t((2, 3))], vec![t((2, 3))], 5).unwrap();
        assert_eq!(opt.t, 5);
    }
}
