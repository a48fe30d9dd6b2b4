//! reflex-learn: what learns. The SAC learner that refines a base policy online and the
//! imitation training that makes one, both in candle on the CPU (candle's CUDA backend is not
//! enabled in this build).
//!
//! - [`sac`]: the residual / full / noise-steering SAC learner, its replay, checkpoints, the
//!   residual exported to ONNX and the hook the control loop runs it through;
//! - [`bc`]: imitation training of diffusion and chunk policies, exported to ONNX with their spec
//!   (policies that see read their cameras through reflex-vision's encoder).
#![warn(missing_docs)]

pub mod bc;
pub mod sac;
