//! reflex-sim: a tabletop arm modelled on the SO-101, simulated with rapier3d.
//!
//! - [`world`]: the physical scene (arm multibody from the shipped URDF, servo model, table,
//!   objects).
//! - [`task`]: reach, push, pick and insert: seeded layouts and sparse success.
//! - [`env`]: [`SimEnv`], the simulator as a [`reflex_runtime::robot::Robot`].
//! - [`expert`]: scripted experts with a noise knob.
//! - [`camera`]: CPU-rendered front and wrist cameras.
//! - [`calib`]: calibration boards seen by those cameras, with their truth.
//!
//! docs/sim.md describes the model, the tasks and their numbers.

/// The arm integrated by reflex's own dynamics (`[sim.solver] arm = "reflex"`).
pub use reflex_arm_dynamics as arm;
pub mod calib;
pub mod camera;
pub mod config;
pub mod env;
pub mod expert;
pub mod human;
pub mod task;
pub mod world;

pub use config::{SimConfig, StateView};
pub use env::SimEnv;
pub use expert::Expert;
pub use task::TaskKind;
