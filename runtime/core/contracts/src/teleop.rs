//! The teleoperation contract: a device a person holds (keyboard, gamepad, SpaceMouse, leader
//! arm) or a simulated person, turned into [`TeleopMsg`]s in the robot's action space.
//!
//! A device is polled on its own thread (never the control loop's); what it produces reaches the
//! loop through reflex-runtime's lock-free teleop channel, or another process through
//! `reflex/<robot>/teleop` on the bus.

use crate::msg::{Observation, TeleopMsg};

/// Why a device could not be read.
#[derive(Debug, thiserror::Error)]
#[error("teleop device `{device}`: {message}")]
pub struct TeleopError {
    /// The device (a path, a port, a name).
    pub device: String,
    /// What went wrong and what to do about it.
    pub message: String,
}

/// A teleoperation device.
pub trait Teleop: Send {
    /// Name for logs and errors, e.g. `keyboard`, `/dev/ttyACM1`.
    fn name(&self) -> &str;

    /// Reads the device and updates `msg`: the person's command (in the units of the robot's
    /// action space), whether they hold the intervention control, and the success / failure /
    /// reset buttons. `obs` is the robot's newest observation where the device needs it (a
    /// leader arm that follows the follower, a simulated person). Returns `true` when `msg`
    /// changed and should be sent (bump `msg.seq` for a new button press).
    fn poll(&mut self, obs: Option<&Observation>, msg: &mut TeleopMsg)
    -> Result<bool, TeleopError>;

    /// The person asked to stop, or the device is gone.
    fn finished(&self) -> bool {
        false
    }

    /// An e-stop button the person pressed since the last call (raise, release, resume), if the
    /// device has such buttons. The caller sends it on the bus (`reflex/<robot>/events` for a
    /// raise, `reflex/<robot>/operator` for a release or resume).
    fn take_stop_act(&mut self) -> Option<crate::stop::StopAct> {
        None
    }
}
