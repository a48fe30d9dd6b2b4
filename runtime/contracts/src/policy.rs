//! The base-policy contract: an observation in, a chunk of actions out. ONNX Runtime policies,
//! the simulator's scripted experts and anything an integrator writes implement it; the control
//! loop runs it on its own thread or inline (reflex-runtime's `PolicyThread`).

use crate::msg::Observation;

/// The shape of what a policy produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkSpec {
    /// Actions per chunk.
    pub len: usize,
    /// Actions executed before the loop asks for a new chunk (<= `len`).
    pub execute: usize,
    /// Action dimension.
    pub dim: usize,
}

/// Why a policy failed.
#[derive(Debug, thiserror::Error)]
#[error("policy `{policy}`: {message}")]
pub struct PolicyError {
    /// Policy name.
    pub policy: String,
    /// What went wrong.
    pub message: String,
}

/// A base policy: observation in, action chunk out.
pub trait Policy: Send {
    /// Name for logs and errors.
    fn name(&self) -> &str;
    /// The chunk shape.
    fn chunk_spec(&self) -> ChunkSpec;
    /// Called at each episode start.
    fn reset(&mut self) {}
    /// Writes `len * dim` action values for `obs` into `out`.
    fn infer(&mut self, obs: &Observation, out: &mut [f32]) -> Result<(), PolicyError>;
}
