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

/// What the robot is executing while a chunk is computed: the executing chunk's actions at the
/// new chunk's times, for a policy that samples its chunk as an inpainting of it (real-time
/// chunking, arXiv 2506.07339). Robot action units, row-major.
#[derive(Clone, Copy, Debug)]
pub struct ChunkPrefix<'a> {
    /// `len * dim` values; rows at and after `covered` are unspecified.
    pub actions: &'a [f32],
    /// Rows the executing chunk covers, from the new chunk's first.
    pub covered: usize,
    /// Rows the robot will have executed from the executing chunk by the time the new one
    /// arrives (the inference delay in control ticks, estimated from the policy's own timings).
    pub delay: usize,
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
    /// As [`Policy::infer`], knowing what the robot executes meanwhile. A policy that cannot use
    /// it (the default) ignores it.
    fn infer_with_prefix(
        &mut self,
        obs: &Observation,
        prefix: &ChunkPrefix<'_>,
        out: &mut [f32],
    ) -> Result<(), PolicyError> {
        let _ = prefix;
        self.infer(obs, out)
    }
    /// Whether [`Policy::infer_with_prefix`] uses the prefix (the loop gathers it only then).
    fn wants_prefix(&self) -> bool {
        false
    }
}
