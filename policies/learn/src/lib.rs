//! reflex-learn: what learns online. The SAC learner that refines a base policy on the robot, in
//! candle on the CPU (candle's CUDA backend is not enabled in this build): its replay, checkpoints,
//! the residual exported to ONNX and the hook the control loop runs it through. Imitation training
//! of base policies is reflex-imitate's job.

pub mod sac;
