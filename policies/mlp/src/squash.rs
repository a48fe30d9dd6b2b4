//! The tanh-squashed diagonal Gaussian of a SAC actor, forward and backward on buffers.
//!
//! The actor's network outputs `[rows, 2 A]`: means, then log standard deviations (clamped to
//! `log_std`). With standard-normal noise `eps` the sample is `u = mean + exp(log_std) eps`
//! (reparameterised: `eps` is data, the gradient flows through `mean` and `log_std`), the action
//! `tanh(u)`, and its log-probability under the squashed distribution
//! `sum_i [ -eps_i^2 / 2 - log_std_i - log(2 pi) / 2 - log(1 - tanh(u_i)^2) ]`, with
//! `log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2 u))` (the numerically stable form of Haarnoja
//! et al. 2018, appendix C). Its derivative in `u` is `2 tanh(u)`.

/// The squashing for `action_dim` actions with log-stds clamped to `log_std`.
#[derive(Clone, Copy, Debug)]
pub struct Squash {
    /// Actions per row.
    pub action_dim: usize,
    /// Log-std bounds.
    pub log_std: (f32, f32),
}

/// A batch of samples and what their backward pass needs; allocated once, reused.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    /// `tanh(u)`, `[rows, A]`.
    pub action: Vec<f32>,
    /// Log-probabilities, `[rows]`.
    pub log_prob: Vec<f32>,
    /// `exp(log_std)`, `[rows, A]`.
    std: Vec<f32>,
    /// Derivative of the clamp at each log-std (1 inside the bounds, 0 outside).
    clamp: Vec<f32>,
}

/// d clamp(x, lo, hi) / dx as candle's `clamp` (a maximum, then a minimum) differentiates it:
/// 1 inside the bounds, 0 outside, 1/2 where `x` equals a bound (both sides of the tie share
/// the gradient).
pub fn clamp_grad(x: f32, lo: f32, hi: f32) -> f32 {
    if x > lo && x < hi {
        1.0
    } else if x == lo || x == hi {
        0.5
    } else {
        0.0
    }
}

const HALF_LN_2PI: f64 = 0.918_938_533_204_672_8; // ln(2 pi) / 2

fn softplus(x: f32) -> f32 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

impl Squash {
    fn rows(&self, out: &[f32]) -> usize {
        assert_eq!(out.len() % (2 * self.action_dim), 0, "actor output width");
        out.len() / (2 * self.action_dim)
    }

    /// Samples from the actor's output `out` (`[rows, 2 A]`) with noise `eps` (`[rows, A]`).
    pub fn sample(&self, out: &[f32], eps: &[f32], s: &mut Sample) {
        let a = self.action_dim;
        let rows = self.rows(out);
        assert_eq!(eps.len(), rows * a, "noise for {rows} rows of {a}");
        s.action.resize(rows * a, 0.0);
        s.std.resize(rows * a, 0.0);
        s.clamp.resize(rows * a, 0.0);
        s.log_prob.resize(rows, 0.0);
        let (lo, hi) = self.log_std;
        let ln2 = std::f32::consts::LN_2;
        for r in 0..rows {
            let head = &out[r * 2 * a..(r + 1) * 2 * a];
            let mut lp = 0f32;
            for i in 0..a {
                let k = r * a + i;
                let raw = head[a + i];
                let ls = raw.clamp(lo, hi);
                s.clamp[k] = clamp_grad(raw, lo, hi);
                let std = ls.exp();
                let e = eps[k];
                let u = head[i] + std * e;
                s.std[k] = std;
                s.action[k] = u.tanh();
                let gauss = (e * e * -0.5 - ls) - HALF_LN_2PI as f32;
                let log_det = 2.0 * (ln2 - u - softplus(-2.0 * u));
                lp += gauss - log_det;
            }
            s.log_prob[r] = lp;
        }
    }

    /// The deterministic actions `tanh(mean)` of `out` into `action` (`[rows, A]`).
    pub fn mean_action(&self, out: &[f32], action: &mut [f32]) {
        let a = self.action_dim;
        let rows = self.rows(out);
        assert_eq!(action.len(), rows * a, "actions for {rows} rows of {a}");
        for r in 0..rows {
            for i in 0..a {
                action[r * a + i] = out[r * 2 * a + i].tanh();
            }
        }
    }

    /// From the gradients of a loss with respect to the sampled actions (`[rows, A]`) and to
    /// their log-probabilities (`[rows]`), the gradient with respect to the actor's output
    /// (`[rows, 2 A]`, overwritten). `eps` is the noise of [`Self::sample`]'s call on `s`.
    pub fn backward(
        &self,
        eps: &[f32],
        s: &Sample,
        d_action: &[f32],
        d_log_prob: &[f32],
        d_out: &mut [f32],
    ) {
        let a = self.action_dim;
        let rows = s.log_prob.len();
        assert!(
            d_action.len() == rows * a && d_log_prob.len() == rows && d_out.len() == rows * 2 * a,
            "gradient shapes for {rows} rows of {a} actions"
        );
        for r in 0..rows {
            let dlp = d_log_prob[r];
            for i in 0..a {
                let k = r * a + i;
                let t = s.action[k];
                let du = d_action[k] * (1.0 - t * t) + dlp * 2.0 * t;
                d_out[r * 2 * a + i] = du;
                d_out[r * 2 * a + a + i] = (du * s.std[k] * eps[k] - dlp) * s.clamp[k];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Loss = sum_k w_k action_k + sum_r c_r log_prob_r, by central differences in f64-ish f32.
    #[test]
    fn the_backward_pass_matches_finite_differences() {
        let sq = Squash {
            action_dim: 2,
            log_std: (-5.0, 2.0),
        };
        // Two rows; one log-std beyond the upper clamp (no gradient there).
        let out = vec![0.3f32, -0.7, -0.5, 0.2, -1.1, 0.4, 2.5, -1.0];
        let eps = vec![0.9f32, -0.4, 0.1, 1.3];
        let w = [0.7f32, -0.2, 0.5, 1.1];
        let c = [0.3f32, -0.6];
        let loss = |o: &[f32]| {
            let mut s = Sample::default();
            sq.sample(o, &eps, &mut s);
            let mut l = 0f64;
            for (wk, ak) in w.iter().zip(&s.action) {
                l += (wk * ak) as f64;
            }
            for (cr, lp) in c.iter().zip(&s.log_prob) {
                l += (cr * lp) as f64;
            }
            l
        };
        let mut s = Sample::default();
        sq.sample(&out, &eps, &mut s);
        let mut d = vec![0f32; 8];
        sq.backward(&eps, &s, &w, &c, &mut d);
        for k in 0..8 {
            let h = 1e-2f32;
            let (mut p, mut m) = (out.clone(), out.clone());
            p[k] += h;
            m[k] -= h;
            let fd = (loss(&p) - loss(&m)) / (2.0 * h as f64);
            assert!(
                (fd - d[k] as f64).abs() < 2e-3 * (1.0 + fd.abs()),
                "output {k}: finite difference {fd}, backward {}",
                d[k]
            );
        }
        assert_eq!(d[6], 0.0, "a clamped log-std passes no gradient");
    }
}
