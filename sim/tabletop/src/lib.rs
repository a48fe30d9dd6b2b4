//! reflex-tabletop: the tabletop cell as both the simulator and the real SO-101 present it,
//! without a physics engine, so a robot build carries it without rapier.
//!
//! - [`model`]: the arm from its shipped URDF (joints, limits, the chain to the tool).
//! - [`task`]: reach, push, pick and insert: seeded layouts and sparse success.
//! - [`spec`]: the observation fields per task, the action spaces, the scene a viewer draws;
//! - [`sim_config`]: the simulator's settings (`[sim]`), read and checked where no simulator is
//!   linked (a run config on the robot names a simulator on another computer).
//!
//! reflex-sim puts these into rapier's world; reflex-hardware gives the real arm the same spec,
//! so a policy moves between the two unchanged.

pub mod model;
pub mod sim_config;
pub mod spec;
pub mod task;

pub use model::ArmModel;
pub use task::{TaskKind, TaskLayout};
