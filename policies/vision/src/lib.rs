//! reflex-vision: what sees, in candle on the CPU.
//!
//! - [`encoder`]: the image encoder a policy trained on camera frames reads each camera through
//!   (trained with the policy by reflex-learn's imitation training), the frames it trains on and
//!   their augmentation;
//! - [`reward`]: the success classifier on camera frames that gives a reward a robot can see
//!   (`reflex reward train`);
//! - [`head`]: the trainable head a learner that sees puts on a frozen encoder's feature map
//!   (SERL's spatial learned embeddings, 256 wide, LayerNorm, tanh).
//!
//! Both are written as ONNX graphs with `image_<camera>` inputs, so ONNX Runtime runs them where
//! the base policy runs.
#![warn(missing_docs)]

pub mod encoder;
pub mod head;
pub mod reward;

/// Errors of training or export.
#[derive(Debug, thiserror::Error)]
pub enum VisionError {
    /// A tensor operation failed.
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    /// The frames or labels cannot train anything.
    #[error("frames: {0}")]
    Data(String),
    /// The loss stopped being a number: nothing worth writing was learned.
    #[error(
        "training diverged: the loss is {loss} at step {step}; lower the learning rate (--lr) and train again"
    )]
    Diverged {
        /// The first step whose loss was not finite.
        step: usize,
        /// That loss.
        loss: f32,
    },
}

/// The graph input that takes `camera`'s image.
pub fn image_input_name(camera: &str) -> String {
    format!("image_{camera}")
}
