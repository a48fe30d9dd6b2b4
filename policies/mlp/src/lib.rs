//! reflex mlp: the arithmetic under the SAC learner's state-only update.
//!
//! - [`kernel`]: the matrix kernel, one order of arithmetic (the same bits) on every processor;
//! - [`gemm`]: matrix products split over the learner's threads (also candle's products in the
//!   learner, through its `Gemm` op), with the same bits for any thread count;
//! - [`ensemble`]: N MLPs of one shape (ReLU, optional LayerNorm) forward and backward by hand,
//!   reading the parameters in the layout of the learner's candle networks;
//! - [`denormal`]: denormal floats flushed to zero while the learner computes;
//! - [`squash`]: the tanh-squashed Gaussian of the actor, sample and backward;
//! - [`norm`]: LayerNorm and its activation (tanh, ReLU) as one candle operation with its own
//!   backward pass, per ensemble member (the pixel learner's critics, heads and encoder);
//! - [`ops`]: the same layers as candle operations (a product computing only needed gradients,
//!   fused bias + ReLU) for the learner that trains image heads through candle's autograd;
//! - [`adam`]: Adam / AdamW on the parameters in place, gradient-norm clipping, a state saved and
//!   restored exactly.
//!
//! Nothing here knows about SAC: `reflex_learn::sac` puts the pieces together and keeps the
//! parameters (candle `Var`s, so checkpoints and the ONNX export read them as before).

pub mod adam;
#[allow(unsafe_code)] // the MXCSR / FPCR registers (flush-to-zero), by intrinsic or asm
pub mod denormal;
pub mod ensemble;
#[allow(unsafe_code)] // the threaded product writes disjoint parts of one buffer
pub mod gemm;
#[allow(unsafe_code)] // AVX-512 and AVX2+FMA intrinsics behind run-time feature checks
pub mod kernel;
pub mod norm;
pub mod ops;
pub mod squash;
