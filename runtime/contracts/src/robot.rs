//! The robot contract: what the control loop needs from a simulator or real hardware.

use crate::msg::{Observation, RobotSpec};
use std::time::Duration;

/// Errors a robot can report. Each names the device or key expression at fault.
#[derive(Debug, thiserror::Error)]
pub enum RobotError {
    /// No peer answered within the deadline.
    #[error(
        "no answer on `{key}` within {timeout:?}: is a robot serving it (e.g. `reflex sim serve \
         --robot {robot}`), and do both sides use the same Zenoh endpoints?"
    )]
    Timeout {
        /// Robot name.
        robot: String,
        /// Key expression that stayed silent.
        key: String,
        /// The deadline that passed.
        timeout: Duration,
    },
    /// The action does not fit the robot's action space.
    #[error("action for robot `{robot}` has {got} components, its action space has {want}")]
    ActionDim {
        /// Robot name.
        robot: String,
        /// Components given.
        got: usize,
        /// Components expected.
        want: usize,
    },
    /// The action contains NaN or infinity.
    #[error("action for robot `{robot}` contains a non-finite value at index {index}")]
    NonFinite {
        /// Robot name.
        robot: String,
        /// First bad component.
        index: usize,
    },
    /// A message could not be decoded.
    #[error(transparent)]
    Decode(#[from] crate::msg::DecodeError),
    /// The robot describes itself in a way that cannot be driven.
    #[error(transparent)]
    Spec(#[from] crate::validate::SpecError),
    /// An observation that does not fit the robot's spec.
    #[error(transparent)]
    Observation(#[from] crate::validate::ObservationError),
    /// The transport failed.
    #[error("bus error on `{key}`: {message}")]
    Bus {
        /// Key expression involved.
        key: String,
        /// What the transport said.
        message: String,
    },
    /// The emergency stop interrupted or refused a move the robot makes on its own (a reset's
    /// move to the start pose): the robot holds where it is.
    #[error(
        "robot `{robot}`: the emergency stop is {state}: {what} stopped, the robot holds where it is (release and resume it to go on)"
    )]
    Stopped {
        /// Robot name.
        robot: String,
        /// What was stopped: `the move to the start pose`, `the reset`.
        what: &'static str,
        /// `latched` or `paused`.
        state: &'static str,
    },
    /// The robot (or simulator) itself failed.
    #[error("robot `{robot}`: {message}")]
    Device {
        /// Robot name.
        robot: String,
        /// What went wrong.
        message: String,
    },
}

/// A robot the control loop can drive: an in-process simulator, a servo bus, or a peer on Zenoh.
///
/// The calling pattern is `reset`, then repeatedly `command` and `observe`. A lockstep robot
/// (simulation) advances one control period inside `command`; a free-running robot applies the
/// command and keeps its own clock. `observe` returns the newest observation; for a lockstep robot
/// that is the state after the last command.
pub trait Robot: Send {
    /// The robot's description.
    fn spec(&self) -> &RobotSpec;

    /// Starts a new episode. `seed` fixes the episode's randomisation where the robot has any.
    fn reset(&mut self, seed: Option<u64>) -> Result<&Observation, RobotError>;

    /// Sends one action in the units of [`RobotSpec::action`].
    fn command(&mut self, action: &[f32]) -> Result<(), RobotError>;

    /// The newest observation.
    fn observe(&mut self) -> Result<&Observation, RobotError>;

    /// Writes into `out` (length = action dimension) an action that keeps the robot where it is:
    /// zero steps for delta action spaces (an absolute gripper component at its current target),
    /// the current targets for absolute ones, never a fixed pose such as the middle of the range.
    /// The control loop and the real-time server use it when no fresh command is available and
    /// whenever the robot must be held (e-stop, stale inputs).
    fn hold_action(&self, out: &mut [f32]);

    /// Hands the robot its e-stop. A robot that moves on its own between commands (a real arm
    /// driving to its start pose inside [`Robot::reset`]) checks it every period and stops with
    /// [`RobotError::Stopped`] when it is no longer running; robots that only move when commanded
    /// may ignore it (the default).
    fn attach_stop(&mut self, _stop: std::sync::Arc<crate::stop::StopSwitch>) {}

    /// `command` then `observe`.
    fn step(&mut self, action: &[f32]) -> Result<&Observation, RobotError> {
        self.command(action)?;
        self.observe()
    }
}

/// Checks dimension and finiteness of an action before it reaches a device.
pub fn check_action(robot: &str, want: usize, action: &[f32]) -> Result<(), RobotError> {
    if action.len() != want {
        return Err(RobotError::ActionDim {
            robot: robot.to_string(),
            got: action.len(),
            want,
        });
    }
    if let Some(index) = action.iter().position(|x| !x.is_finite()) {
        return Err(RobotError::NonFinite {
            robot: robot.to_string(),
            index,
        });
    }
    Ok(())
}
