//! The device a person drives with, as `reflex teleop --device D` opens it: the keyboard alone,
//! or a leader arm, gamepad or SpaceMouse for the motion with the keyboard (when there is a
//! terminal) for the buttons: take over, label, reset, e-stop, quit.

use crate::arm::{ArmKind, RESOLUTION};
use crate::devices::{Gamepad, SpaceMouse};
use crate::keyboard::Keyboard;
use crate::leader::LeaderArm;
use reflex_contracts::msg::{Observation, RobotSpec, TeleopMsg};
use reflex_contracts::stop::StopAct;
use reflex_contracts::teleop::{Teleop, TeleopError};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

/// Which device moves the robot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// This terminal's keyboard (motion and buttons).
    Keyboard,
    /// A leader arm on a serial port, its torque off.
    Leader,
    /// A gamepad's evdev node.
    Gamepad,
    /// A SpaceMouse's hidraw node.
    SpaceMouse,
}

/// Everything [`open`] needs besides the device's kind and the robot's description.
#[derive(Clone, Debug)]
pub struct DeviceOptions {
    /// The leader arm's serial port ([`DeviceKind::Leader`]).
    pub port: Option<String>,
    /// The device file of a gamepad (`/dev/input/eventN`) or a SpaceMouse (`/dev/hidrawN`).
    pub path: Option<PathBuf>,
    /// Which leader arm: `so101-leader` or `koch-leader`.
    pub leader: String,
    /// The leader's LeRobot calibration file (absent: zero at step 2048, for emulated servos).
    pub calibration: Option<PathBuf>,
    /// Fraction of the action bounds a full deflection or a held key commands.
    pub speed: f32,
    /// A key counts as held for this long after its last press.
    pub hold: Duration,
    /// Largest change of a joint command per control period while the follower is brought to
    /// the leader, rad.
    pub max_joint_step_rad: f64,
    /// Take over from the start and keep driving (no keyboard needed; labels need one).
    pub intervene: bool,
}

fn setup(device: &str, message: impl Into<String>) -> TeleopError {
    TeleopError {
        device: device.into(),
        message: message.into(),
    }
}

/// Opens the device `kind` for the robot described by `spec`. Whether stdin is a terminal
/// decides if the keyboard also serves the buttons; a leader arm without a terminal needs
/// `intervene` (nothing else could take over).
pub fn open(
    kind: DeviceKind,
    spec: &RobotSpec,
    o: &DeviceOptions,
) -> Result<Box<dyn Teleop>, TeleopError> {
    open_with_terminal(kind, spec, o, std::io::stdin().is_terminal())
}

fn open_with_terminal(
    kind: DeviceKind,
    spec: &RobotSpec,
    o: &DeviceOptions,
    is_tty: bool,
) -> Result<Box<dyn Teleop>, TeleopError> {
    let buttons = || -> Result<Option<Keyboard>, TeleopError> {
        // The keyboard's keys do not move the robot here (speed 0): they are the buttons.
        Ok(if is_tty {
            Some(Keyboard::open(spec, 0.0, o.hold)?)
        } else {
            None
        })
    };
    let dev: Box<dyn Teleop> = match kind {
        DeviceKind::Keyboard => return Ok(Box::new(Keyboard::open(spec, o.speed, o.hold)?)),
        DeviceKind::Leader => {
            let port = o.port.as_deref().ok_or_else(|| {
                setup(
                    "leader",
                    "--device leader needs --port (the leader arm's serial port)",
                )
            })?;
            let arm = ArmKind::parse(&o.leader)
                .filter(|k| k.is_leader())
                .ok_or_else(|| {
                    setup(
                        &o.leader,
                        "not a leader arm: so101-leader or koch-leader".to_string(),
                    )
                })?;
            let cal = match &o.calibration {
                Some(p) => reflex_calibration::Calibration::read(p, RESOLUTION)
                    .map_err(|e| setup(port, e.to_string()))?,
                None => arm.default_calibration(),
            };
            if !is_tty && !o.intervene {
                return Err(setup(
                    port,
                    "a leader arm takes over with the keyboard's space bar, and stdin is not a terminal: run it in a terminal, or pass --intervene to drive from the start",
                ));
            }
            Box::new(LeaderArm::open(
                arm,
                port,
                &cal,
                spec,
                o.max_joint_step_rad,
            )?)
        }
        DeviceKind::Gamepad | DeviceKind::SpaceMouse => {
            let path = o.path.as_deref().ok_or_else(|| {
                setup(
                    if kind == DeviceKind::Gamepad { "gamepad" } else { "spacemouse" },
                    "--device gamepad and spacemouse need --path (the device file: /dev/input/eventN, /dev/hidrawN)",
                )
            })?;
            if kind == DeviceKind::Gamepad {
                Box::new(Gamepad::open(path, spec, o.speed)?)
            } else {
                Box::new(SpaceMouse::open(path, spec, o.speed)?)
            }
        }
    };
    Ok(Box::new(WithButtons {
        dev,
        keys: buttons()?,
        always: o.intervene,
    }))
}

/// A device for the motion, the keyboard (if any) for the buttons.
pub struct WithButtons {
    dev: Box<dyn Teleop>,
    keys: Option<Keyboard>,
    always: bool,
}

impl Teleop for WithButtons {
    fn name(&self) -> &str {
        self.dev.name()
    }
    fn poll(&mut self, obs: Option<&Observation>, m: &mut TeleopMsg) -> Result<bool, TeleopError> {
        if let Some(k) = &mut self.keys {
            k.poll(obs, m)?;
        }
        if self.always {
            m.intervene = true;
        }
        self.dev.poll(obs, m)
    }
    fn finished(&self) -> bool {
        self.keys.as_ref().is_some_and(|k| k.finished()) || self.dev.finished()
    }
    fn take_stop_act(&mut self) -> Option<StopAct> {
        self.keys
            .as_mut()
            .and_then(|k| k.take_stop_act())
            .or_else(|| self.dev.take_stop_act())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::input_event;
    use reflex_contracts::msg::ActionKind;

    fn spec() -> RobotSpec {
        RobotSpec::new("arm", "sim/pick", 20.0).with_action(
            ActionKind::EeDelta,
            &["dx_m", "dy_m", "dz_m", "gripper_m"],
            -0.02,
            0.02,
        )
    }

    fn options() -> DeviceOptions {
        DeviceOptions {
            port: None,
            path: None,
            leader: "so101-leader".into(),
            calibration: None,
            speed: 0.5,
            hold: Duration::from_millis(250),
            max_joint_step_rad: 0.04,
            intervene: false,
        }
    }

    #[test]
    fn each_device_refuses_what_it_lacks_by_name() {
        let s = spec();
        let e = open_with_terminal(DeviceKind::Leader, &s, &options(), false)
            .err()
            .unwrap();
        assert!(e.to_string().contains("--port"), "{e}");
        let e = open_with_terminal(DeviceKind::Gamepad, &s, &options(), false)
            .err()
            .unwrap();
        assert!(e.to_string().contains("--path"), "{e}");
        let mut o = options();
        o.port = Some("/dev/ttyACM9".into());
        o.leader = "so101-follower".into();
        let e = open_with_terminal(DeviceKind::Leader, &s, &o, false)
            .err()
            .unwrap();
        assert!(e.to_string().contains("not a leader arm"), "{e}");
        o.leader = "so101-leader".into();
        let e = open_with_terminal(DeviceKind::Leader, &s, &o, false)
            .err()
            .unwrap();
        assert!(e.to_string().contains("--intervene"), "{e}");
    }

    #[test]
    fn intervene_takes_over_without_a_keyboard() {
        // A recorded gamepad at rest: nobody holds the bumper, so only `intervene` takes over.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("event0");
        std::fs::write(&path, input_event(3, 0, 0)).unwrap();
        let mut o = options();
        o.path = Some(path);
        let mut m = TeleopMsg::default();
        let mut dev = open_with_terminal(DeviceKind::Gamepad, &spec(), &o, false).unwrap();
        dev.poll(None, &mut m).unwrap();
        assert!(!m.intervene);
        o.intervene = true;
        let mut dev = open_with_terminal(DeviceKind::Gamepad, &spec(), &o, false).unwrap();
        dev.poll(None, &mut m).unwrap();
        assert!(m.intervene);
        assert!(dev.name().starts_with("gamepad "), "{}", dev.name());
    }
}
