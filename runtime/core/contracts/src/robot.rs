//! The robot contract: what the control loop needs from a simulator or real hardware.

use crate::msg::{Observation, RobotSpec};
use std::time::Duration;

/// Errors a robot can report. Each names the device or key expression at fault.
#[derive(Debug, thiserror::Error)]
pub enum RobotError {
    /// No peer answered within the deadline; `silence` says what the controller knew of the
    /// robot then, so the message sends the user to the right place (a robot that never
    /// answered is not served, or not reachable; one that answered before and is still on the
    /// bus is stuck or failing; one whose liveliness token went is gone).
    #[error("no answer on `{key}` within {timeout:?}: {}", silence.explain(robot))]
    Timeout {
        /// Robot name.
        robot: String,
        /// Key expression that stayed silent.
        key: String,
        /// The deadline that passed.
        timeout: Duration,
        /// What was known of the robot when the deadline passed.
        silence: Silence,
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

/// What a controller knew of a silent robot when its deadline passed (see
/// [`RobotError::Timeout`]). The default knows nothing: the robot never answered and nobody
/// looked for it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Silence {
    /// How long before the deadline passed the robot last answered on any key (its spec, a
    /// reset, an observation); `None`: it never answered this controller.
    pub last_answer: Option<Duration>,
    /// Whether the robot's liveliness token (`reflex/<robot>/alive/robot`) was on the bus when
    /// the deadline passed; `None`: not looked at.
    pub present: Option<bool>,
    /// Times the request was sent again for want of an answer.
    pub resent: u32,
}

impl Silence {
    /// The sentence after "no answer on KEY within T: ", naming what to do.
    pub fn explain(&self, robot: &str) -> String {
        let again = match self.resent {
            0 => String::new(),
            1 => " (the request was sent again once)".to_string(),
            n => format!(" (the request was sent again {n} times)"),
        };
        let gone = format!(
            "its liveliness token `reflex/{robot}/alive/robot` is gone: the robot's process stopped or the link to it broke; look at its log, restart it"
        );
        match (self.last_answer, self.present) {
            (None, None) => format!(
                "is a robot serving it (e.g. `reflex sim serve --robot {robot}`), and do both sides use the same Zenoh endpoints?{again}"
            ),
            (None, Some(true)) => format!(
                "robot `{robot}` is on the bus (its liveliness token is there) but has never answered this controller{again}: it is stuck or failing before it answers; look at its log"
            ),
            (None, Some(false)) => {
                format!("robot `{robot}` never answered this controller{again}, and {gone}")
            }
            (Some(ago), present) => {
                let then = format!(
                    "robot `{robot}` answered before (last {:.1} s ago){again}",
                    ago.as_secs_f64()
                );
                match present {
                    Some(true) => format!(
                        "{then} and is still on the bus (its liveliness token is there): it is alive but stuck or failing (an environment that raises or hangs in step or reset?); look at its log"
                    ),
                    Some(false) => format!("{then}, but {gone}"),
                    None => format!("{then}; look at its log"),
                }
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_robots_message_says_what_the_controller_knew() {
        // The issue: a Gymnasium bridge failing in `reset` was reported as "is a robot serving
        // it", which sent the user to check endpoints instead of the bridge's log.
        let err = |silence: Silence| {
            RobotError::Timeout {
                robot: "gymhil".into(),
                key: "reflex/gymhil/reset".into(),
                timeout: Duration::from_secs(15),
                silence,
            }
            .to_string()
        };
        let never = err(Silence::default());
        assert!(never.contains("reflex sim serve --robot gymhil"), "{never}");
        let stuck = err(Silence {
            last_answer: Some(Duration::from_millis(15_200)),
            present: Some(true),
            resent: 3,
        });
        assert!(
            stuck.contains("answered before (last 15.2 s ago)")
                && stuck.contains("sent again 3 times")
                && stuck.contains("still on the bus")
                && !stuck.contains("reflex sim serve"),
            "{stuck}"
        );
        let gone = err(Silence {
            last_answer: Some(Duration::from_secs(2)),
            present: Some(false),
            resent: 0,
        });
        assert!(
            gone.contains("reflex/gymhil/alive/robot` is gone"),
            "{gone}"
        );
        let mute = err(Silence {
            last_answer: None,
            present: Some(true),
            resent: 0,
        });
        assert!(mute.contains("never answered"), "{mute}");
    }
}
