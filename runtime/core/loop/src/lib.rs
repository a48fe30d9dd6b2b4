//! reflex-runtime: the machinery that runs on the robot, free of any transport or recorder.
//!
//! - [`control`]: the fixed-rate control loop ([`control::ControlLoop`], built with
//!   [`control::ControlLoop::builder`]), with [`clock`], [`schedule`], [`chunk`], [`safety`],
//!   [`teleop`] and [`status`] channels, the [`residual`] hook, the [`policy`] thread, the
//!   [`outbox`], real-time settings ([`rt`], re-exported from reflex-rt) and the lock-free [`triple`] buffer it is built from;
//! - [`features`]: a frozen image encoder on the newest frames, inline or on its own thread beside
//!   the loop (for a learner that sees; reflex-adapters' `reward` runs a success classifier on
//!   it);
//! - [`kinematics`] (re-exported from reflex-kinematics): forward and damped-least-squares inverse
//!   kinematics of a serial chain read from a URDF, shared by the simulator, the safety layer, the
//!   recorder and hardware drivers;
//! - [`fsio`]: atomic file writes.
//!
//! It depends on [`reflex_contracts`] (re-exported as [`msg`], [`robot`], [`config`], [`keys`])
//! and on no transport, recorder or learning framework: the Zenoh bus, the Rerun recorder and the
//! learner live in reflex-bus, reflex-record and reflex-agent (docs/architecture.md).

pub use reflex_contracts as contracts;
pub use reflex_contracts::{config, keys, msg, robot};
/// Kinematics of a serial chain (the reflex-kinematics crate).
pub use reflex_kinematics as kinematics;
/// Real-time settings of the loop's thread (the reflex-rt crate).
pub use reflex_rt as rt;

pub mod chunk;
#[allow(unsafe_code)] // clock_nanosleep on an absolute deadline
pub mod clock;
pub mod control;
pub mod features;
pub mod fsio;
pub mod hist;
pub mod outbox;
pub mod policy;
pub mod residual;
pub mod safety;
pub mod schedule;
pub mod status;
pub mod teleop;
#[allow(unsafe_code)] // the lock-free triple buffer shares slots between two threads
pub mod triple;

/// The types most users need, in one import.
pub mod prelude {
    pub use reflex_contracts::prelude::*;
}
