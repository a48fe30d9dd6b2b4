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

/// A training loop's loss as `reflex bc train` and `reflex reward train` report it: the mean of
/// each hundred steps and of the steps after the last hundred (a run under 100 steps reported
/// none), and a loss that is not a number as divergence.
#[derive(Debug, Default)]
pub struct LossLog {
    sum: f32,
    n: usize,
}

impl LossLog {
    /// Adds the loss of step `step` (from 1) of `steps`; the window's mean when this step closes
    /// one.
    pub fn add(
        &mut self,
        step: usize,
        steps: usize,
        loss: f32,
    ) -> Result<Option<f32>, VisionError> {
        if !loss.is_finite() {
            return Err(VisionError::Diverged { step, loss });
        }
        self.sum += loss;
        self.n += 1;
        if self.n < 100 && step < steps {
            return Ok(None);
        }
        let mean = self.sum / self.n as f32;
        *self = LossLog::default();
        Ok(Some(mean))
    }
}

#[cfg(test)]
mod tests {
    use super::{LossLog, VisionError};

    #[test]
    fn the_loss_log_reports_each_hundred_the_rest_and_divergence() {
        let mut log = LossLog::default();
        let means: Vec<(usize, f32)> = (1..=250)
            .filter_map(|s| {
                log.add(s, 250, if s <= 100 { 1.0 } else { 3.0 })
                    .unwrap()
                    .map(|m| (s, m))
            })
            .collect();
        assert_eq!(means, vec![(100, 1.0), (200, 3.0), (250, 3.0)]);
        let mut log = LossLog::default();
        assert_eq!(log.add(1, 5, 2.0).unwrap(), None);
        assert!(matches!(
            log.add(2, 5, f32::NAN),
            Err(VisionError::Diverged { step: 2, .. })
        ));
    }
}
