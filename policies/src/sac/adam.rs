//! Adam / AdamW with explicit weight decay, global gradient-norm clipping, and a state that can
//! be saved and restored exactly (checkpoints must resume training as if never interrupted).

use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor, Var};

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
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    /// Steps taken.
    pub t: u64,
}

impl Adam {
    /// An optimiser for `vars`.
    pub fn new(vars: Vec<Var>, cfg: AdamConfig) -> Result<Self> {
        let m = vars
            .iter()
            .map(|v| v.as_tensor().zeros_like())
            .collect::<Result<Vec<_>>>()?;
        let v2 = vars
            .iter()
            .map(|v| v.as_tensor().zeros_like())
            .collect::<Result<Vec<_>>>()?;
        Ok(Adam {
            cfg,
            vars,
            m,
            v: v2,
            t: 0,
        })
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

    /// One step from `grads`; returns the gradient norm before clipping.
    pub fn step(&mut self, grads: &GradStore) -> Result<f64> {
        let norm = if self.cfg.max_grad_norm.is_some() {
            self.grad_norm(grads)?
        } else {
            0.0
        };
        let scale = match self.cfg.max_grad_norm {
            Some(max) if norm > max => max / (norm + 1e-6),
            _ => 1.0,
        };
        self.t += 1;
        let c = self.cfg;
        let bc1 = 1.0 - c.beta1.powi(self.t as i32);
        let bc2 = 1.0 - c.beta2.powi(self.t as i32);
        for ((var, m), v) in self
            .vars
            .iter()
            .zip(self.m.iter_mut())
            .zip(self.v.iter_mut())
        {
            let Some(g) = grads.get(var.as_tensor()) else {
                continue;
            };
            let g = if scale != 1.0 {
                (g * scale)?
            } else {
                g.clone()
            };
            // Detached: otherwise every step's moment would keep the previous one's graph alive,
            // a chain that grows (and slows everything down) for the whole run.
            let g = g.detach();
            *m = ((&*m * c.beta1)? + (&g * (1.0 - c.beta1))?)?.detach();
            *v = ((&*v * c.beta2)? + (g.sqr()? * (1.0 - c.beta2))?)?.detach();
            let mhat = (&*m / bc1)?;
            let vhat = (&*v / bc2)?;
            let upd = (mhat / (vhat.sqrt()? + c.eps)?)?;
            let p = var.as_tensor().detach();
            let p = &p;
            let next = if c.weight_decay > 0.0 {
                ((p * (1.0 - c.lr * c.weight_decay))? - (upd * c.lr)?)?
            } else {
                (p - (upd * c.lr)?)?
            };
            var.set(&next)?;
        }
        Ok(norm)
    }

    /// The moments, for a checkpoint.
    pub fn state(&self) -> (&[Tensor], &[Tensor], u64) {
        (&self.m, &self.v, self.t)
    }

    /// Restores the moments from a checkpoint.
    pub fn restore(&mut self, m: Vec<Tensor>, v: Vec<Tensor>, t: u64) {
        self.m = m;
        self.v = v;
        self.t = t;
    }
}
