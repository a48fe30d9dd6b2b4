//! reflex-policies: base policies on ONNX Runtime and what makes them.
//!
//! - [`ort_env`]: find and load ONNX Runtime at start-up.
//! - [`spec`]: the policy spec file beside each model.
//! - [`onnx_policy`]: running a model (chunk, diffusion or flow) as a loop [`reflex_runtime::policy::Policy`].
//! - [`sampler`]: DDIM and flow-matching samplers with injectable noise.
//! - [`rtc`]: real-time chunking, the next chunk sampled as an inpainting of the executing one.
//! - [`vla`]: image and language inputs.
//! - [`features`]: a frozen image encoder file (images in, feature maps out) for a learner that
//!   sees.
//! - [`onnx_write`], [`onnx_read`], [`onnx_proto`]: reflex's own ONNX files, from reflex-onnx
//!   (re-exported under these names).
//!
//! The learners that make and refine these models (SAC, imitation) are in reflex-learn.

pub mod features;
pub mod onnx_policy;
pub mod ort_env;
pub mod reward;
pub mod rtc;
pub mod sampler;
pub mod spec;
pub mod vla;

pub use reflex_onnx::{proto as onnx_proto, read as onnx_read, write as onnx_write};
