//! reflex-runtime: the contracts every other reflex crate implements, and the machinery that runs
//! on the robot.
//!
//! - [`msg`]: versioned wire messages (MessagePack) and the robot description ([`msg::RobotSpec`]).
//! - [`robot`]: the [`robot::Robot`] trait that simulators and hardware implement.
//! - [`kinematics`]: forward kinematics and damped-least-squares inverse kinematics of a serial
//!   chain read from a URDF, shared by the simulator, the safety layer and the hardware drivers.
//! - [`config`]: TOML loading with errors that name the file, the key and the allowed values.
//! - [`bus`]: the Zenoh robot protocol: key expressions, [`bus::RemoteRobot`] and
//!   [`bus::RobotServer`].
//! - [`control`]: the fixed-rate control loop, with [`clock`], [`schedule`], [`chunk`],
//!   [`safety`], [`teleop`], [`residual`], [`policy`], [`outbox`], [`status`], [`rt`] and the
//!   lock-free [`triple`] buffer it is built from.
#![warn(missing_docs)]

pub mod bus;
pub mod chunk;
pub mod clock;
pub mod config;
pub mod control;
pub mod fsio;
pub mod hist;
pub mod kinematics;
pub mod learnlink;
pub mod msg;
pub mod outbox;
pub mod policy;
pub mod recorder;
pub mod residual;
pub mod robot;
pub mod rt;
pub mod safety;
pub mod schedule;
pub mod status;
pub mod teleop;
pub mod testkit;
pub mod triple;
pub mod viz;

/// The types most users need, in one import.
pub mod prelude {
    pub use crate::msg::{
        ActionKind, ActionSpec, CameraSpec, Image, Observation, RobotSpec, StateField,
    };
    pub use crate::robot::{Robot, RobotError};
}
