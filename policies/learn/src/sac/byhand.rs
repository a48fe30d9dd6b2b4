//! The state-only SAC update without candle's autograd: the same losses as
//! [`Sac::critic_update`] and [`Sac::actor_update`], differentiated by hand
//! ([`reflex_mlp::ensemble`], [`reflex_mlp::squash`]) on buffers kept between updates.
//!
//! The parameters stay candle `Var`s (checkpoints, the ONNX export and the pixel learner read
//! them as before); an update reads them under their storage's read lock, computes every
//! gradient into its own buffers, drops the locks and lets the optimisers write in place. A unit
//! test holds this path to candle's autograd on the same batches (every mode, LayerNorm or not,
//! subsets, behaviour cloning, clipping). Why: at a robot's sizes most of a candle update was
//! per-operation overhead (docs/benchmarks.md has the figures before and after).

use super::nets::Ensemble;
use super::replay::Batch;
use super::{Mode, Result, Sac, SacConfig, draw_subset};
use candle_core::{CpuStorage, Layout, Storage, StorageRef, Var};
use rand_distr::{Distribution, StandardNormal};
use reflex_mlp::ensemble::{self, Grads, Input, InputGrad, Params, PerLayer, SmallVec, Tape};
use reflex_mlp::squash::{Sample, Squash, clamp_grad};

/// Buffers of the hand-written update, sized on first use and reused.
#[derive(Default)]
pub struct Scratch {
    /// `[B, critic input]`: the scaled state, the base action (residual), the action.
    now: Vec<f32>,
    /// The same for the bootstrap observation and the actor's next action.
    next: Vec<f32>,
    eps: Vec<f32>,
    actor_tape: Tape,
    critic_tape: Tape,
    target_tape: Tape,
    sample: Sample,
    q_min: Vec<f32>,
    d_q: Vec<f32>,
    /// The loss's gradient at the learner's actions, then at the squashed samples.
    d_act: Vec<f32>,
    /// The derivative of the action mapping (`to_action`) at each sample.
    act_grad: Vec<f32>,
    d_log_prob: Vec<f32>,
    d_head: Vec<f32>,
    critic_grads: Option<Grads>,
    actor_grads: Option<Grads>,
    /// `obs_norm` as `(center, 1 / half)`.
    scale: Option<(Vec<f32>, Vec<f32>)>,
}

type Guard<'a> = (StorageRef<'a>, &'a Layout);

fn lock(v: &Var) -> Guard<'_> {
    v.as_tensor().storage_and_layout()
}

fn values<'a>(g: &'a Guard<'_>) -> Result<&'a [f32]> {
    match (&*g.0, g.1.contiguous_offsets()) {
        (Storage::Cpu(CpuStorage::F32(v)), Some((a, b))) => Ok(&v[a..b]),
        _ => {
            candle_core::bail!("the hand-written update needs contiguous f32 parameters on the CPU")
        }
    }
}

/// Read locks on every parameter of `e`, in `Ensemble::vars` order (inline up to four layers
/// with LayerNorm: no allocation per update).
fn lock_all(e: &Ensemble) -> SmallVec<[Guard<'_>; 14]> {
    let mut g: SmallVec<[Guard<'_>; 14]> = e.ws.iter().chain(&e.bs).map(lock).collect();
    for (a, b) in e.ln.iter().flatten() {
        g.push(lock(a));
        g.push(lock(b));
    }
    g
}

fn params<'a>(e: &Ensemble, g: &'a [Guard<'_>]) -> Result<Params<'a>> {
    let l = e.ws.len();
    let mut p = Params {
        w: PerLayer::new(),
        b: PerLayer::new(),
        ln: PerLayer::new(),
    };
    for (i, guard) in g.iter().enumerate() {
        let v = values(guard)?;
        match i {
            _ if i < l => p.w.push(v),
            _ if i < 2 * l => p.b.push(v),
            _ if (i - 2 * l).is_multiple_of(2) => p.ln.push((v, &[])),
            _ => p.ln.last_mut().expect("a gain before its offset").1 = v,
        }
    }
    Ok(p)
}

/// `rows` rows of `width` values, read from their first columns.
fn rows_of(data: &[f32], width: usize, rows: usize) -> Input<'_> {
    Input {
        data,
        start: 0,
        stride: width,
        rows,
    }
}

pub(super) fn scalar(v: &Var) -> Result<f32> {
    let g = lock(v);
    Ok(values(&g)?[0])
}

impl Scratch {
    /// Buffers for a learner whose state is scaled by `(center, 1 / half)` when given.
    pub fn new(scale: Option<(Vec<f32>, Vec<f32>)>) -> Self {
        Scratch {
            scale,
            ..Default::default()
        }
    }
}

/// `to_action` on component `i` of one row: the learner's action from the squashed `a` and the base `b`
/// (`clamp(b + scale a)`, `a`, `bound a` by mode), with its derivative in `a`.
fn to_action_1(cfg: &SacConfig, i: usize, a: f32, b: f32) -> (f32, f32) {
    match cfg.mode {
        Mode::Residual => {
            let s = cfg.residual_bound(i);
            let x = b + (a * s + 0.0);
            (x.clamp(-1.0, 1.0), s * clamp_grad(x, -1.0, 1.0))
        }
        Mode::Full => (a, 1.0),
        Mode::Noise => (a * cfg.noise_bound + 0.0, cfg.noise_bound),
    }
}

/// Writes rows `[scaled state, base]` of `obs` / `base` into the first columns of `dst`
/// (`rows x width`), as [`Sac::encode`] and [`Sac::actor_input`] build them.
fn fill_input(
    dst: &mut Vec<f32>,
    width: usize,
    obs: &[f32],
    base: &[f32],
    dims: (usize, usize, usize),
    scale: &Option<(Vec<f32>, Vec<f32>)>,
) {
    let (rows, obs_dim, base_dim) = dims;
    dst.resize(rows * width, 0.0);
    for r in 0..rows {
        let row = &mut dst[r * width..(r + 1) * width];
        let o = &obs[r * obs_dim..(r + 1) * obs_dim];
        match scale {
            Some((c, inv)) => {
                for k in 0..obs_dim {
                    row[k] = (o[k] - c[k]) * inv[k];
                }
            }
            None => row[..obs_dim].copy_from_slice(o),
        }
        row[obs_dim..obs_dim + base_dim].copy_from_slice(&base[r * base_dim..(r + 1) * base_dim]);
    }
}

impl Sac {
    /// Whether updates and actions take the hand-written path (state only; the pixel learner's
    /// heads train through candle).
    pub(super) fn hand_written(&self) -> bool {
        self.by_hand && self.heads.is_empty()
    }

    fn squash(&self) -> Squash {
        Squash {
            action_dim: self.act_dim,
            log_std: self.actor.log_std,
        }
    }

    fn draw_eps(&mut self, rows: usize) {
        let n = rows * self.act_dim;
        let s = &mut self.scratch.eps;
        s.clear();
        s.extend((0..n).map(|_| -> f32 { StandardNormal.sample(&mut self.rng) }));
    }

    /// [`Sac::critic_update`] by hand.
    #[allow(
        clippy::too_many_lines,
        reason = "hand-derived gradient: the forward and backward passes read as one derivation"
    )]
    pub(super) fn critic_update_by_hand(&mut self, batch: &Batch) -> Result<(f32, f32)> {
        let n = batch.size;
        let (obs_dim, base_dim, act_dim) = (self.obs_dim, self.base_dim, self.act_dim);
        let actor_in = obs_dim + base_dim;
        let width = actor_in + act_dim;
        let alpha = scalar(&self.log_alpha)?.exp();
        let dims = (n, obs_dim, base_dim);
        fill_input(
            &mut self.scratch.next,
            width,
            &batch.next_obs,
            &batch.next_base,
            dims,
            &self.scratch.scale,
        );
        fill_input(
            &mut self.scratch.now,
            width,
            &batch.obs,
            &batch.base,
            dims,
            &self.scratch.scale,
        );
        for r in 0..n {
            let row = &mut self.scratch.now[r * width + actor_in..(r + 1) * width];
            row.copy_from_slice(&batch.action[r * act_dim..(r + 1) * act_dim]);
        }
        self.draw_eps(n);
        let squash = self.squash();
        // The next action from the live actor.
        {
            let g = lock_all(&self.actor.net);
            let p = params(&self.actor.net, &g)?;
            let sc = &mut self.scratch;
            let x = rows_of(&sc.next, width, n);
            ensemble::forward(self.actor.net.shape(), &p, x, &mut sc.actor_tape);
            squash.sample(&sc.actor_tape.out, &sc.eps, &mut sc.sample);
        }
        for r in 0..n {
            for i in 0..act_dim {
                let b = if base_dim > 0 {
                    batch.next_base[r * base_dim + i]
                } else {
                    0.0
                };
                let a = to_action_1(&self.cfg, i, self.scratch.sample.action[r * act_dim + i], b).0;
                self.scratch.next[r * width + actor_in + i] = a;
            }
        }
        // Target: r + discount * (min over a subset of target critics - alpha log pi).
        let members = self.cfg.critics;
        {
            let g = lock_all(&self.target);
            let p = params(&self.target, &g)?;
            let sc = &mut self.scratch;
            ensemble::forward(
                self.target.shape(),
                &p,
                rows_of(&sc.next, width, n),
                &mut sc.target_tape,
            );
        }
        let m = self.cfg.critic_subset.min(members);
        let subset = (m < members).then(|| draw_subset(&mut self.rng, members, m));
        let sc = &mut self.scratch;
        sc.q_min.resize(n, 0.0);
        let qn = &sc.target_tape.out;
        for r in 0..n {
            let v = match &subset {
                Some(idx) => idx
                    .iter()
                    .map(|&j| qn[j as usize * n + r])
                    .fold(f32::INFINITY, f32::min),
                None => (0..members)
                    .map(|j| qn[j * n + r])
                    .fold(f32::INFINITY, f32::min),
            };
            let v = if self.cfg.entropy_in_target {
                v - sc.sample.log_prob[r] * alpha
            } else {
                v
            };
            sc.q_min[r] = batch.reward[r] + batch.discount[r] * v;
        }
        // Mean squared error of every critic against the target.
        let shape = self.critic.shape();
        let grads = sc.critic_grads.get_or_insert_with(|| Grads::new(shape));
        let (loss, q_mean);
        {
            let g = lock_all(&self.critic);
            let p = params(&self.critic, &g)?;
            let x = rows_of(&sc.now, width, n);
            ensemble::forward(shape, &p, x, &mut sc.critic_tape);
            let q = &sc.critic_tape.out;
            let count = (members * n) as f32;
            sc.d_q.resize(members * n, 0.0);
            let (mut sq, mut sum) = (0f64, 0f64);
            for (k, (d, qv)) in sc.d_q.iter_mut().zip(q).enumerate() {
                let e = qv - sc.q_min[k % n];
                sq += (e * e) as f64;
                sum += *qv as f64;
                *d = 2.0 * e / count;
            }
            loss = (sq / count as f64) as f32;
            q_mean = (sum / count as f64) as f32;
            let dq = std::mem::take(&mut sc.d_q);
            ensemble::backward(
                shape,
                &p,
                x,
                &mut sc.critic_tape,
                &dq,
                Some(&mut *grads),
                None,
            );
            sc.d_q = dq;
        }
        self.critic_opt.step_slices(grads.in_var_order())?;
        self.target.polyak_from(&self.critic, self.cfg.tau)?;
        self.counters.critic_updates += 1;
        self.counters.target_updates += 1;
        Ok((loss, q_mean))
    }

    /// [`Sac::actor_update`] by hand.
    #[allow(
        clippy::too_many_lines,
        reason = "hand-derived gradient: the forward and backward passes read as one derivation"
    )]
    pub(super) fn actor_update_by_hand(&mut self, batch: &Batch) -> Result<(f32, f32, f32)> {
        let n = batch.size;
        let (obs_dim, base_dim, act_dim) = (self.obs_dim, self.base_dim, self.act_dim);
        let actor_in = obs_dim + base_dim;
        let width = actor_in + act_dim;
        let alpha = scalar(&self.log_alpha)?.exp();
        fill_input(
            &mut self.scratch.now,
            width,
            &batch.obs,
            &batch.base,
            (n, obs_dim, base_dim),
            &self.scratch.scale,
        );
        self.draw_eps(n);
        let squash = self.squash();
        let actor_shape = self.actor.net.shape();
        let actor_guards = lock_all(&self.actor.net);
        let ap = params(&self.actor.net, &actor_guards)?;
        {
            let sc = &mut self.scratch;
            ensemble::forward(
                actor_shape,
                &ap,
                rows_of(&sc.now, width, n),
                &mut sc.actor_tape,
            );
            squash.sample(&sc.actor_tape.out, &sc.eps, &mut sc.sample);
        }
        let base_at = |r: usize, i: usize| {
            if base_dim > 0 {
                batch.base[r * base_dim + i]
            } else {
                0.0
            }
        };
        let mut to_act_grad = std::mem::take(&mut self.scratch.act_grad);
        to_act_grad.resize(n * act_dim, 0.0);
        for r in 0..n {
            for i in 0..act_dim {
                let (a, da) = to_action_1(
                    &self.cfg,
                    i,
                    self.scratch.sample.action[r * act_dim + i],
                    base_at(r, i),
                );
                self.scratch.now[r * width + actor_in + i] = a;
                to_act_grad[r * act_dim + i] = da;
            }
        }
        // The critics score the actions with their weights held still: only the gradient with
        // respect to the action columns of their input is computed.
        let members = self.cfg.critics;
        let critic_shape = self.critic.shape();
        let sc = &mut self.scratch;
        let mut loss = {
            let g = lock_all(&self.critic);
            let p = params(&self.critic, &g)?;
            ensemble::forward(
                critic_shape,
                &p,
                rows_of(&sc.now, width, n),
                &mut sc.critic_tape,
            );
            let q = &sc.critic_tape.out;
            let mut total = 0f64;
            for r in 0..n {
                let q_mean = (0..members).map(|j| q[j * n + r]).sum::<f32>() / members as f32;
                total += (sc.sample.log_prob[r] * alpha - q_mean) as f64;
            }
            sc.d_q.clear();
            sc.d_q.resize(members * n, -1.0 / (members * n) as f32);
            let mut d_act = std::mem::take(&mut sc.d_act);
            d_act.resize(n * act_dim, 0.0);
            let dq = std::mem::take(&mut sc.d_q);
            ensemble::backward(
                critic_shape,
                &p,
                rows_of(&sc.now, width, n),
                &mut sc.critic_tape,
                &dq,
                None,
                Some(InputGrad {
                    data: &mut d_act,
                    cols: (actor_in, act_dim),
                }),
            );
            sc.d_q = dq;
            // Through the action mapping to the squashed sample.
            for (d, t) in d_act.iter_mut().zip(&to_act_grad) {
                *d *= t;
            }
            sc.d_act = d_act;
            (total / n as f64) as f32
        };
        sc.d_log_prob.clear();
        sc.d_log_prob.resize(n, alpha / n as f32);
        sc.d_head.resize(n * 2 * act_dim, 0.0);
        squash.backward(
            &sc.eps,
            &sc.sample,
            &sc.d_act,
            &sc.d_log_prob,
            &mut sc.d_head,
        );
        // Behaviour cloning on the batch's demonstration rows (they come first).
        let d = batch.demo_rows.min(n);
        if self.cfg.bc_weight > 0.0 && d > 0 {
            let w = self.cfg.bc_weight as f32;
            let out = &sc.actor_tape.out;
            let mut bc = 0f64;
            for r in 0..d {
                let mut row = 0f32;
                for i in 0..act_dim {
                    let t = out[r * 2 * act_dim + i].tanh();
                    let (a, da) = to_action_1(&self.cfg, i, t, base_at(r, i));
                    let e = a - batch.action[r * act_dim + i];
                    row += e * e;
                    sc.d_head[r * 2 * act_dim + i] += w * 2.0 * e / d as f32 * da * (1.0 - t * t);
                }
                bc += row as f64;
            }
            loss += (bc / d as f64) as f32 * w;
        }
        let grads = sc
            .actor_grads
            .get_or_insert_with(|| Grads::new(actor_shape));
        let dh = std::mem::take(&mut sc.d_head);
        ensemble::backward(
            actor_shape,
            &ap,
            rows_of(&sc.now, width, n),
            &mut sc.actor_tape,
            &dh,
            Some(&mut *grads),
            None,
        );
        sc.d_head = dh;
        sc.act_grad = to_act_grad;
        drop(ap);
        drop(actor_guards);
        self.actor_opt.step_slices(grads.in_var_order())?;
        self.counters.actor_updates += 1;
        // Temperature: loss = alpha * (entropy - target), differentiated in log alpha.
        let entropy = -(sc.sample.log_prob.iter().sum::<f32>() / n as f32);
        let g_alpha = (entropy - self.target_entropy() as f32) * scalar(&self.log_alpha)?.exp();
        self.alpha_opt
            .step_slices(std::iter::once(std::slice::from_ref(&g_alpha)))?;
        self.counters.temperature_updates += 1;
        Ok((loss, entropy, self.temperature()?))
    }

    /// [`Sac::act`] by hand, for one state row.
    pub(super) fn act_by_hand(
        &mut self,
        obs: &[f32],
        base: &[f32],
        deterministic: bool,
    ) -> Result<Vec<f32>> {
        let (obs_dim, base_dim, act_dim) = (self.obs_dim, self.base_dim, self.act_dim);
        let width = obs_dim + base_dim;
        let zeros = [0f32; 0];
        let b: &[f32] = if base_dim > 0 { base } else { &zeros };
        if obs.len() != obs_dim || b.len() != base_dim {
            candle_core::bail!(
                "act: {} state and {} base values for {obs_dim} and {base_dim}",
                obs.len(),
                b.len()
            );
        }
        fill_input(
            &mut self.scratch.next,
            width,
            obs,
            b,
            (1, obs_dim, base_dim),
            &self.scratch.scale,
        );
        if !deterministic {
            self.draw_eps(1);
        }
        let squash = self.squash();
        let mut out = vec![0f32; act_dim];
        {
            let g = lock_all(&self.actor.net);
            let p = params(&self.actor.net, &g)?;
            let sc = &mut self.scratch;
            let x = rows_of(&sc.next, width, 1);
            ensemble::forward(self.actor.net.shape(), &p, x, &mut sc.actor_tape);
            if deterministic {
                squash.mean_action(&sc.actor_tape.out, &mut out);
            } else {
                squash.sample(&sc.actor_tape.out, &sc.eps, &mut sc.sample);
                out.copy_from_slice(&sc.sample.action);
            }
        }
        for (i, a) in out.iter_mut().enumerate() {
            let bi = if base_dim > 0 { b[i] } else { 0.0 };
            *a = to_action_1(&self.cfg, i, *a, bi).0;
        }
        Ok(out)
    }
}
