//! reflex-contracts: what every part of reflex agrees on, and all a driver author needs.
//!
//! - [`msg`]: the versioned wire messages (MessagePack with named fields) and the robot
//!   description [`msg::RobotSpec`], with [`validate`] checking specs and observations that
//!   arrive from other processes;
//! - [`keys`]: the key expressions of one robot on the bus;
//! - [`robot::Robot`], [`policy::Policy`], [`teleop::Teleop`]: the traits simulators, hardware,
//!   policies and teleop devices implement;
//! - [`stop`]: the emergency stop's latch, release and resume, shared by the loop, the robot and
//!   the bus;
//! - [`config`]: TOML loading whose errors name the file, the key and what is allowed.
//!
//! It depends on serde and its formats only: no Zenoh, Rerun, candle or ONNX Runtime
//! (docs/architecture.md).

pub mod config;
pub mod keys;
pub mod msg;
pub mod policy;
pub mod robot;
pub mod stop;
pub mod teleop;
pub mod validate;

#[cfg(test)]
mod fuzz;

/// The types most users need, in one import.
pub mod prelude {
    pub use crate::keys::Keys;
    pub use crate::msg::{
        ActionKind, ActionSpec, CameraSpec, Image, Observation, RobotSpec, StateField,
    };
    pub use crate::policy::{ChunkSpec, Policy, PolicyError};
    pub use crate::robot::{Robot, RobotError};
    pub use crate::stop::{StopState, StopSwitch};
    pub use crate::teleop::{Teleop, TeleopError};
}
