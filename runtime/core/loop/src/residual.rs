//! The residual hook: a small function of (observation, base action) that the loop evaluates
//! itself, every step, and adds to the base action. The learner fills it with the SAC actor; its
//! weights arrive through a triple buffer, so swapping them never blocks the loop.

use crate::triple::{Reader, Writer, triple};

/// Evaluated on the loop thread: must be fast and must not allocate.
pub trait ResidualHook: Send {
    /// Writes the residual for `obs` and `base` into `out` (same length as `base`).
    fn residual(&mut self, obs: &[f32], base: &[f32], out: &mut [f32]);
    /// Takes new weights if some were published; returns the version in use.
    fn refresh(&mut self) -> u64;
    /// Samples around the learner's action (training) or takes its mean (evaluation). Hooks
    /// without exploration ignore it.
    fn set_explore(&mut self, _on: bool) {}
}

/// Versioned weights as published by a learner.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Weights {
    /// Version (increasing).
    pub version: u64,
    /// Flat parameter vector.
    pub values: Vec<f32>,
}

/// Publishes weights to a [`ResidualHook`] without ever blocking its reader.
pub struct WeightsWriter(Writer<Weights>);

impl WeightsWriter {
    /// Wraps the writing half of a weights triple buffer.
    pub fn from_writer(w: Writer<Weights>) -> Self {
        WeightsWriter(w)
    }

    /// Publishes a version (copied into a preallocated slot of the same size).
    pub fn publish(&mut self, version: u64, values: &[f32]) {
        let slot = self.0.slot();
        slot.version = version;
        slot.values.clear();
        slot.values.extend_from_slice(values);
        self.0.publish();
    }
}

/// A linear residual `out = scale * tanh(W [obs; base] + b)`, the smallest useful hook (and the
/// one the runtime tests swap weights into). `W` is `dim x (obs_dim + dim)`, row-major, then `b`.
pub struct LinearResidual {
    obs_dim: usize,
    dim: usize,
    scale: f32,
    weights: Reader<Weights>,
}

impl LinearResidual {
    /// A residual starting at exactly zero (all weights zero), and the writer for new weights.
    pub fn new(obs_dim: usize, dim: usize, scale: f32) -> (Self, WeightsWriter) {
        let n = dim * (obs_dim + dim) + dim;
        let (w, r) = triple(Weights {
            version: 0,
            values: vec![0.0; n],
        });
        (
            LinearResidual {
                obs_dim,
                dim,
                scale,
                weights: r,
            },
            WeightsWriter(w),
        )
    }

    /// Number of parameters.
    pub fn len(&self) -> usize {
        self.dim * (self.obs_dim + self.dim) + self.dim
    }

    /// `true` when there are no parameters.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl ResidualHook for LinearResidual {
    fn residual(&mut self, obs: &[f32], base: &[f32], out: &mut [f32]) {
        let w = &self.weights.get().values;
        let cols = self.obs_dim + self.dim;
        for (r, o) in out.iter_mut().enumerate().take(self.dim) {
            let row = &w[r * cols..(r + 1) * cols];
            let mut acc = w[self.dim * cols + r];
            for (x, k) in obs.iter().chain(base).zip(row) {
                acc += x * k;
            }
            *o = self.scale * acc.tanh();
        }
    }

    fn refresh(&mut self) -> u64 {
        self.weights.update();
        self.weights.get().version
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_at_zero_and_picks_up_new_weights() {
        let (mut r, mut w) = LinearResidual::new(2, 1, 0.5);
        let mut out = [1.0];
        r.refresh();
        r.residual(&[1.0, 2.0], &[3.0], &mut out);
        assert_eq!(out, [0.0]);
        w.publish(7, &[0.1, 0.0, 0.0, 0.2]);
        assert_eq!(r.refresh(), 7);
        r.residual(&[1.0, 2.0], &[3.0], &mut out);
        assert!((out[0] - 0.5 * (0.1f32 + 0.2).tanh()).abs() < 1e-7);
    }
}
