//! `reflex teleop`: drive a robot by hand over the bus.

use crate::cli::BusArgs;
use clap::{Args, ValueEnum};
use reflex_hardware::teleop::{DeviceKind, DeviceOptions};
use reflex_tools::teleop::TeleopEvent;
use std::path::PathBuf;
use std::time::Duration;

/// A teleop device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DeviceArg {
    /// This terminal's keyboard.
    Keyboard,
    /// A leader arm on a serial port (--port), its torque off; the keyboard (when there is a
    /// terminal) keeps the buttons: space takes over, y/n label, x reset, q quits.
    Leader,
    /// A gamepad's evdev node (--path /dev/input/eventN): hold the right bumper to take over.
    Gamepad,
    /// A SpaceMouse's hidraw node (--path /dev/hidrawN): push the cap to take over.
    Spacemouse,
}

#[derive(Args)]
pub struct TeleopArgs {
    /// Input device.
    #[arg(long, value_enum, default_value = "keyboard")]
    device: DeviceArg,
    /// The robot's name on the bus.
    #[arg(long)]
    robot: String,
    /// Messages per second.
    #[arg(long, default_value_t = 50.0, value_parser = crate::cli::hertz)]
    rate_hz: f64,
    /// A key counts as held for this long after its last press, ms.
    #[arg(long, default_value_t = 250.0)]
    hold_ms: f64,
    /// Fraction of the action bounds a held key commands.
    #[arg(long, default_value_t = 0.5)]
    speed: f32,
    /// How long to wait for the robot's spec, s.
    #[arg(long, default_value_t = 15.0, value_parser = crate::cli::seconds)]
    wait_s: f64,
    /// The leader arm's serial port (--device leader).
    #[arg(long)]
    port: Option<String>,
    /// The device file of a gamepad (/dev/input/eventN) or a SpaceMouse (/dev/hidrawN).
    #[arg(long)]
    path: Option<PathBuf>,
    /// Which leader arm: so101-leader or koch-leader.
    #[arg(long, default_value = "so101-leader")]
    leader: String,
    /// The leader's LeRobot calibration file (default: zero at step 2048, for emulated servos).
    #[arg(long)]
    calibration: Option<PathBuf>,
    /// Largest change of a joint command per control period of the robot while the follower is
    /// brought to the leader, rad. Keep it under half the actor's `[safety] max_joint_step_rad`
    /// (0.1 by default): a tick can see two messages' worth of change when delivery jitters.
    #[arg(long, default_value_t = 0.04)]
    max_joint_step_rad: f64,
    /// Take over from the start and keep driving (no keyboard needed; labels need one).
    #[arg(long)]
    intervene: bool,
    #[command(flatten)]
    bus: BusArgs,
}

pub fn teleop(a: TeleopArgs) -> anyhow::Result<()> {
    use reflex_contracts::msg::EventKind;
    let session = a.bus.config().open()?;
    let spec =
        reflex_tools::teleop::fetch_spec(&session, &a.robot, Duration::from_secs_f64(a.wait_s))?;
    let follow = std::sync::Arc::new(reflex_tools::teleop::Follow::default());
    let _watch = reflex_tools::teleop::follow(&session, &a.robot, follow.clone())?;
    let kind = match a.device {
        DeviceArg::Keyboard => DeviceKind::Keyboard,
        DeviceArg::Leader => DeviceKind::Leader,
        DeviceArg::Gamepad => DeviceKind::Gamepad,
        DeviceArg::Spacemouse => DeviceKind::SpaceMouse,
    };
    let options = DeviceOptions {
        port: a.port.clone(),
        path: a.path.clone(),
        leader: a.leader.clone(),
        calibration: a.calibration.clone(),
        speed: a.speed,
        hold: Duration::from_secs_f64(a.hold_ms / 1e3),
        max_joint_step_rad: a.max_joint_step_rad,
        intervene: a.intervene,
    };
    let mut dev = reflex_hardware::teleop::open(kind, &spec, &options)?;
    match a.device {
        DeviceArg::Keyboard => eprint!(
            "teleop `{}` ({}): w/s a/d r/f move, o/c gripper, space take over / hand back, y success, n failure, x reset, e E-STOP, u release, g resume, q quit\r\n",
            spec.name, spec.kind
        ),
        DeviceArg::Leader => eprint!(
            "teleop `{}` ({}) from the leader arm {}: {}\r\n",
            spec.name,
            spec.kind,
            dev.name(),
            if a.intervene {
                "driving from the start (Ctrl-C stops)"
            } else {
                "space take over / hand back, y success, n failure, x reset, e E-STOP, u release, g resume, q quit"
            }
        ),
        DeviceArg::Gamepad => eprint!(
            "teleop `{}` ({}) from the {}: hold the right bumper to drive; left stick: forward/back and left/right, right stick: up/down; triggers: gripper; A success, B failure, Y reset\r\n",
            spec.name,
            spec.kind,
            dev.name()
        ),
        DeviceArg::Spacemouse => eprint!(
            "teleop `{}` ({}) from the {}: push the cap to drive; left button closes the gripper, right opens it; labels from the keyboard (y, n, x)\r\n",
            spec.name,
            spec.kind,
            dev.name()
        ),
    }
    reflex_tools::teleop::drive(
        dev.as_mut(),
        &session,
        &a.robot,
        a.rate_hz,
        Some(&follow),
        &mut |e| match e {
            TeleopEvent::Driving(true) => eprint!("-- you drive\r\n"),
            TeleopEvent::Driving(false) => eprint!("-- the policy drives\r\n"),
            TeleopEvent::Sent(what) => eprint!("-- sent: {what}\r\n"),
            TeleopEvent::Robot(ev) => {
                let what = match ev.kind {
                    EventKind::Success => "success",
                    EventKind::Failure => "failure",
                    EventKind::Done => "episode over",
                    EventKind::Reset => "new episode",
                    EventKind::Estop => "EMERGENCY STOP",
                };
                if matches!(ev.kind, EventKind::Success | EventKind::Failure) {
                    eprint!(
                        "-- the robot recorded: {what} (episode {}, step {}, from {})\r\n",
                        ev.episode, ev.step, ev.source
                    );
                } else {
                    eprint!("-- {what}: episode {} at step {}\r\n", ev.episode, ev.step);
                }
            }
            TeleopEvent::Status(ep, person) => eprint!(
                "-- episode {ep}: {} drives\r\n",
                if person { "you" } else { "the policy" }
            ),
            TeleopEvent::Stop(state, n, by) => match state {
                "latched" => eprint!(
                    "-- EMERGENCY STOP {n} latched (by {by}): the robot holds; u releases\r\n"
                ),
                "paused" => {
                    eprint!("-- e-stop released (by {by}): nothing moves until g resumes\r\n")
                }
                _ if n > 0 => eprint!("-- running again (resumed by {by})\r\n"),
                _ => {}
            },
            TeleopEvent::Connected(_) => {}
        },
    )?;
    drop(dev);
    eprintln!("teleop: handed back, bye");
    Ok(())
}
