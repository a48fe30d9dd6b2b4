//! reflex-onnx: the ONNX files reflex writes and reads without Python or ONNX Runtime.
//!
//! - [`proto`]: the nine `onnx.proto` messages reflex uses, declared for `prost`.
//! - [`write`]: a graph builder that encodes a model (imitation-trained policies, residual
//!   exports, encoders, the test VLA).
//! - [`read`]: the float initializers (the weights) of a model, external data files included.
//!
//! ONNX Runtime loads every file written here in the tests of the crates that run them
//! (reflex-policies and up), which is the check that the declarations are right.

pub mod proto;
pub mod read;
pub mod write;
