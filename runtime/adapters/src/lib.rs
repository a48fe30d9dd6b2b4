//! reflex-adapters: a [`Robot`](reflex_contracts::robot::Robot) wrapped so that what it reports
//! changes, between the robot and everything downstream of it (policy, encoder, recorder,
//! learner). Each adapter is itself a robot, so they nest and the loop sees no difference.
//!
//! - [`reward`]: a success classifier's verdict on each frame becomes the robot's reward and
//!   success (HIL-SERL's reward classifier);
//! - [`cameras`]: the robot's cameras under the names a policy, an encoder or a classifier
//!   reads (`[robot.cameras]`).

pub mod cameras;
pub mod reward;
