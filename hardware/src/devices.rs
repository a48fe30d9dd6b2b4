//! A gamepad and a SpaceMouse as teleop devices, read from their Linux device files: the
//! gamepad from its evdev node (`/dev/input/eventN`, `struct input_event` records), the
//! SpaceMouse from its hidraw node (`/dev/hidrawN`, 3Dconnexion's HID reports). Neither needs a
//! system library at build time (the crates that wrap them, gilrs and hidapi, need libudev's
//! headers to build on Linux), and both are tested on recorded byte streams.
//!
//! Both command end-effector steps (the follower's `ee_delta` action space, through its IK):
//! - gamepad (an Xbox-style layout, as HIL-SERL's intervention uses): hold the right bumper to
//!   take over; left stick x/y moves the tool in the table plane, right stick up/down moves it
//!   up and down; right trigger opens the gripper, left trigger closes it; A marks success, B
//!   failure, Y asks for a reset.
//! - SpaceMouse: push the cap beyond a small dead band to take over (the person's hand on it is
//!   the intervention); its translation moves the tool; the left button closes the gripper, the
//!   right one opens it.
//!
//! Deflections scale the action bounds: full deflection commands `speed` of the largest step.

use reflex_contracts::msg::{ActionKind, Observation, RobotSpec, TeleopMsg};
use reflex_contracts::teleop::{Teleop, TeleopError};
use std::io::Read;

/// Size of `struct input_event` on 64-bit Linux: a 16-byte timeval, type, code, value.
pub const INPUT_EVENT_SIZE: usize = 24;
const EV_KEY: u16 = 1;
const EV_ABS: u16 = 3;
const ABS_X: u16 = 0;
const ABS_Y: u16 = 1;
const ABS_Z: u16 = 2;
const ABS_RY: u16 = 4;
const ABS_RZ: u16 = 5;
const BTN_SOUTH: u16 = 0x130;
const BTN_EAST: u16 = 0x131;
const BTN_NORTH: u16 = 0x133;
const BTN_WEST: u16 = 0x134;
const BTN_TR: u16 = 0x137;

fn err(device: &str, m: impl std::fmt::Display) -> TeleopError {
    TeleopError {
        device: device.into(),
        message: m.to_string(),
    }
}

/// Where the gripper and the three translation steps sit in an `ee_delta` action.
struct EeMap {
    step: [f32; 3],
    gripper: Option<(usize, f32, f32)>,
    dim: usize,
}

impl EeMap {
    fn new(spec: &RobotSpec, device: &str, speed: f32) -> Result<Self, TeleopError> {
        let a = &spec.action;
        if !matches!(a.kind, ActionKind::EeDelta | ActionKind::EeDeltaYaw) || a.dim() < 3 {
            return Err(err(
                device,
                format!(
                    "it commands end-effector steps and `{}` takes {:?} actions: give the robot an ee_delta action space, or use the keyboard or a leader arm",
                    spec.name, a.kind
                ),
            ));
        }
        let gripper = a
            .names
            .iter()
            .position(|n| n.starts_with("gripper"))
            .map(|i| (i, a.low[i], a.high[i]));
        Ok(EeMap {
            step: [0, 1, 2].map(|i| speed * a.high[i].min(-a.low[i])),
            gripper,
            dim: a.dim(),
        })
    }

    /// Writes a command: `v` in -1..1 per axis (x forward, y left, z up), the gripper target.
    fn fill(&self, v: [f32; 3], grip: Option<f32>, m: &mut TeleopMsg) {
        m.action.resize(self.dim, 0.0);
        m.action.fill(0.0);
        for ((a, x), s) in m.action.iter_mut().zip(v).zip(self.step) {
            *a = x.clamp(-1.0, 1.0) * s;
        }
        if let Some((i, lo, hi)) = self.gripper {
            m.action[i] = grip.unwrap_or(hi).clamp(lo, hi);
        }
    }
}

/// One evdev record: (type, code, value).
pub fn parse_input_event(b: &[u8; INPUT_EVENT_SIZE]) -> (u16, u16, i32) {
    (
        u16::from_le_bytes([b[16], b[17]]),
        u16::from_le_bytes([b[18], b[19]]),
        i32::from_le_bytes([b[20], b[21], b[22], b[23]]),
    )
}

/// An evdev record with a zero timestamp (for tests and recordings).
pub fn input_event(ty: u16, code: u16, value: i32) -> [u8; INPUT_EVENT_SIZE] {
    let mut b = [0u8; INPUT_EVENT_SIZE];
    b[16..18].copy_from_slice(&ty.to_le_bytes());
    b[18..20].copy_from_slice(&code.to_le_bytes());
    b[20..24].copy_from_slice(&value.to_le_bytes());
    b
}

/// What a gamepad's state means, separate from where its bytes come from.
#[derive(Default)]
pub struct GamepadState {
    /// Sticks, -1..1: left x, left y, right y (y positive down, as evdev reports them).
    sticks: [f32; 3],
    /// Triggers, 0..1: left, right.
    triggers: [f32; 2],
    intervene: bool,
    grip: Option<f32>,
    success: bool,
    failure: bool,
    reset: bool,
}

impl GamepadState {
    /// Applies one evdev record. Sticks are taken as signed 16-bit (-32768..32767) and triggers
    /// as 0..1023 (Xbox controllers on Linux' xpad driver); values beyond are clamped.
    pub fn apply(&mut self, ty: u16, code: u16, value: i32) {
        let stick = |v: i32| {
            let x = v as f32 / 32767.0;
            // A dead band: a stick at rest reads a few hundred off centre.
            if x.abs() < 0.1 {
                0.0
            } else {
                x.clamp(-1.0, 1.0)
            }
        };
        match (ty, code) {
            (EV_ABS, ABS_X) => self.sticks[0] = stick(value),
            (EV_ABS, ABS_Y) => self.sticks[1] = stick(value),
            (EV_ABS, ABS_RY) => self.sticks[2] = stick(value),
            (EV_ABS, ABS_Z) => self.triggers[0] = (value as f32 / 1023.0).clamp(0.0, 1.0),
            (EV_ABS, ABS_RZ) => self.triggers[1] = (value as f32 / 1023.0).clamp(0.0, 1.0),
            (EV_KEY, BTN_TR) => self.intervene = value != 0,
            (EV_KEY, BTN_SOUTH) if value == 1 => self.success = true,
            (EV_KEY, BTN_EAST) if value == 1 => self.failure = true,
            // Xbox Y is BTN_NORTH on newer kernels, BTN_WEST on older xpad mappings.
            (EV_KEY, BTN_NORTH | BTN_WEST) if value == 1 => self.reset = true,
            _ => {}
        }
    }

    fn command(&mut self, map: &EeMap, m: &mut TeleopMsg, dt: f32) {
        // Triggers move the gripper's target: a full pull opens or closes it in a second.
        if let Some((_, lo, hi)) = map.gripper {
            let g = self.grip.get_or_insert(hi);
            *g = (*g + (self.triggers[1] - self.triggers[0]) * (hi - lo) * dt).clamp(lo, hi);
        }
        // Stick up (negative y) is forward (+x); stick left (negative x) is +y; right stick up
        // is up (+z).
        let v = [-self.sticks[1], -self.sticks[0], -self.sticks[2]];
        map.fill(v, self.grip, m);
        m.intervene |= self.intervene;
        m.success |= std::mem::take(&mut self.success);
        m.failure |= std::mem::take(&mut self.failure);
        m.reset |= std::mem::take(&mut self.reset);
    }
}

/// A gamepad on an evdev node.
pub struct Gamepad {
    name: String,
    file: std::fs::File,
    map: EeMap,
    state: GamepadState,
    buf: Vec<u8>,
    last: Option<std::time::Instant>,
}

/// Opens `path` for reading without blocking.
fn open_nonblocking(path: &std::path::Path, name: &str) -> Result<std::fs::File, TeleopError> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)
        .map_err(|e| {
            err(
                name,
                format!(
                    "cannot open it: {e} (input devices belong to the `input` group: sudo usermod -aG input $USER, then log in again)"
                ),
            )
        })
}

/// Reads whatever is waiting. A device unplugged reads an error (ENODEV), which ends the
/// teleop with it; nothing waiting (or a recorded stream's writer not there yet) reads nothing.
fn drain(file: &mut std::fs::File, buf: &mut Vec<u8>) -> std::io::Result<()> {
    let mut chunk = [0u8; 512];
    loop {
        match file.read(&mut chunk) {
            Ok(0) => return Ok(()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

impl Gamepad {
    /// Opens the evdev node `path` (e.g. `/dev/input/by-id/usb-...-event-joystick`) for `spec`'s
    /// `ee_delta` action space; full stick deflection commands `speed` of the largest step.
    pub fn open(path: &std::path::Path, spec: &RobotSpec, speed: f32) -> Result<Self, TeleopError> {
        let name = format!("gamepad {}", path.display());
        let map = EeMap::new(spec, &name, speed)?;
        Ok(Gamepad {
            file: open_nonblocking(path, &name)?,
            name,
            map,
            state: GamepadState::default(),
            buf: Vec::with_capacity(4096),
            last: None,
        })
    }
}

impl Teleop for Gamepad {
    fn name(&self) -> &str {
        &self.name
    }

    fn poll(&mut self, _: Option<&Observation>, m: &mut TeleopMsg) -> Result<bool, TeleopError> {
        drain(&mut self.file, &mut self.buf).map_err(|e| err(&self.name, e))?;
        let whole = self.buf.len() / INPUT_EVENT_SIZE * INPUT_EVENT_SIZE;
        for rec in self.buf[..whole].chunks_exact(INPUT_EVENT_SIZE) {
            let (ty, code, value) = parse_input_event(rec.try_into().expect("exact chunk"));
            self.state.apply(ty, code, value);
        }
        self.buf.drain(..whole);
        let now = std::time::Instant::now();
        let dt = self
            .last
            .replace(now)
            .map_or(0.0, |t| (now - t).as_secs_f32());
        self.state.command(&self.map, m, dt.min(0.1));
        Ok(true)
    }
}

/// What a SpaceMouse's reports mean.
#[derive(Default)]
pub struct SpaceMouseState {
    /// Translation x, y, z in the device's counts (about +-350 at full push).
    t: [i16; 3],
    buttons: u8,
    grip: Option<f32>,
}

/// Full deflection of a SpaceMouse's cap, counts.
const SPACEMOUSE_FULL: f32 = 350.0;

impl SpaceMouseState {
    /// Applies one HID report: id 1 is translation (x, y, z as signed 16-bit little-endian; the
    /// newer devices append the rotation in the same report), id 2 rotation (ignored: the arm's
    /// 5 joints keep the tool pointing down), id 3 the buttons bitmask.
    pub fn apply(&mut self, report: &[u8]) {
        let i16_at = |k: usize| i16::from_le_bytes([report[k], report[k + 1]]);
        match report.first() {
            Some(1) if report.len() >= 7 => self.t = [i16_at(1), i16_at(3), i16_at(5)],
            Some(3) if report.len() >= 2 => self.buttons = report[1],
            _ => {}
        }
    }

    fn command(&mut self, map: &EeMap, m: &mut TeleopMsg) {
        if let Some((_, lo, hi)) = map.gripper {
            if self.buttons & 1 != 0 {
                self.grip = Some(lo);
            } else if self.buttons & 2 != 0 {
                self.grip = Some(hi);
            }
        }
        // The device's y points toward the user and z down: forward and up are their negatives.
        let n = |c: i16| {
            let x = c as f32 / SPACEMOUSE_FULL;
            if x.abs() < 0.05 { 0.0 } else { x }
        };
        let v = [-n(self.t[1]), -n(self.t[0]), -n(self.t[2])];
        map.fill(v, self.grip, m);
        m.intervene |= v.iter().any(|x| *x != 0.0) || self.buttons != 0;
    }
}

/// A 3Dconnexion SpaceMouse on a hidraw node.
pub struct SpaceMouse {
    name: String,
    file: std::fs::File,
    map: EeMap,
    state: SpaceMouseState,
    buf: Vec<u8>,
}

impl SpaceMouse {
    /// Opens the hidraw node `path` (`/dev/hidrawN` of vendor 0x256f or 0x046d) for `spec`'s
    /// `ee_delta` action space.
    pub fn open(path: &std::path::Path, spec: &RobotSpec, speed: f32) -> Result<Self, TeleopError> {
        let name = format!("SpaceMouse {}", path.display());
        let map = EeMap::new(spec, &name, speed)?;
        Ok(SpaceMouse {
            file: open_nonblocking(path, &name)?,
            name,
            map,
            state: SpaceMouseState::default(),
            buf: Vec::with_capacity(1024),
        })
    }
}

impl Teleop for SpaceMouse {
    fn name(&self) -> &str {
        &self.name
    }

    /// hidraw hands over one report per read; a recorded stream is split by report length (7
    /// bytes for ids 1 and 2, 2 or more for id 3, here taken as 7 for every report, the length
    /// the wired SpaceMouse sends).
    fn poll(&mut self, _: Option<&Observation>, m: &mut TeleopMsg) -> Result<bool, TeleopError> {
        drain(&mut self.file, &mut self.buf).map_err(|e| err(&self.name, e))?;
        let whole = self.buf.len() / 7 * 7;
        for r in self.buf[..whole].chunks_exact(7) {
            self.state.apply(r);
        }
        self.buf.drain(..whole);
        self.state.command(&self.map, m);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> RobotSpec {
        RobotSpec::new("arm", "sim/pick", 20.0).with_action(
            ActionKind::EeDelta,
            &["dx_m", "dy_m", "dz_m", "gripper_m"],
            -0.02,
            0.02,
        )
    }

    #[test]
    fn evdev_records_round_trip() {
        let b = input_event(EV_ABS, ABS_Y, -32767);
        assert_eq!(parse_input_event(&b), (EV_ABS, ABS_Y, -32767));
    }

    #[test]
    fn a_gamepad_pushed_forward_with_the_bumper_held_drives_forward_and_labels_once() {
        let mut spec = spec();
        spec.action.low[3] = 0.0;
        spec.action.high[3] = 0.07;
        let map = EeMap::new(&spec, "pad", 0.5).unwrap();
        let mut g = GamepadState::default();
        let mut m = TeleopMsg::default();
        g.command(&map, &mut m, 0.02);
        assert!(!m.intervene && m.action[..3] == [0.0; 3]);
        for (ty, code, v) in [
            (EV_KEY, BTN_TR, 1),
            (EV_ABS, ABS_Y, -32767),
            (EV_ABS, ABS_X, 200), // inside the dead band
            (EV_ABS, ABS_RZ, 1023),
            (EV_KEY, BTN_SOUTH, 1),
        ] {
            g.apply(ty, code, v);
        }
        g.command(&map, &mut m, 0.5);
        assert!(m.intervene && m.success);
        assert!((m.action[0] - 0.01).abs() < 1e-6, "{:?}", m.action);
        assert_eq!(m.action[1], 0.0);
        // Open already (the default), so the trigger keeps it at the top.
        assert_eq!(m.action[3], 0.07);
        g.apply(EV_ABS, ABS_RZ, 0);
        g.apply(EV_ABS, ABS_Z, 1023);
        let mut m2 = TeleopMsg::default();
        g.command(&map, &mut m2, 0.5);
        assert!(!m2.success, "a label is sent once");
        assert!(
            (m2.action[3] - 0.035).abs() < 1e-6,
            "half closed: {:?}",
            m2.action
        );
        g.apply(EV_KEY, BTN_TR, 0);
        let mut m3 = TeleopMsg::default();
        g.command(&map, &mut m3, 0.0);
        assert!(!m3.intervene);
    }

    #[test]
    fn a_spacemouse_push_takes_over_and_its_buttons_set_the_gripper() {
        let mut spec = spec();
        spec.action.low[3] = 0.0;
        spec.action.high[3] = 0.07;
        let map = EeMap::new(&spec, "sm", 1.0).unwrap();
        let mut s = SpaceMouseState::default();
        let mut m = TeleopMsg::default();
        s.command(&map, &mut m);
        assert!(!m.intervene);
        // Pushed away from the user (negative y) at half deflection, and down.
        let mut r = vec![1u8];
        for v in [0i16, -175, 350] {
            r.extend_from_slice(&v.to_le_bytes());
        }
        s.apply(&r);
        s.apply(&[3, 1, 0, 0, 0, 0, 0]);
        s.command(&map, &mut m);
        assert!(m.intervene);
        assert!((m.action[0] - 0.01).abs() < 1e-6 && (m.action[2] + 0.02).abs() < 1e-6);
        assert_eq!(m.action[3], 0.0, "left button closes");
    }

    #[test]
    fn joint_action_spaces_are_refused_with_a_clear_error() {
        let spec = RobotSpec::new("arm", "koch/joints", 50.0).with_action(
            ActionKind::JointAbs,
            &["a", "b", "c"],
            -1.0,
            1.0,
        );
        let e = EeMap::new(&spec, "gamepad /dev/input/event3", 0.5)
            .err()
            .unwrap();
        assert!(e.to_string().contains("ee_delta"), "{e}");
    }
}
