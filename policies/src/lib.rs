//! reflex-policies: base policies on ONNX Runtime and the learners that refine them.
//!
//! Today: [`ort_env`], which finds and loads ONNX Runtime at start-up.
#![warn(missing_docs)]

pub mod ort_env;
