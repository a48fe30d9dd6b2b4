//! This terminal's keyboard as a teleop device (`reflex teleop --device keyboard`).
//!
//! Keys (a terminal reports presses, not releases, so "held" means "pressed again within
//! `--hold-ms`", which the keyboard's auto-repeat does while a key is held down):
//!
//! | key | action |
//! |---|---|
//! | `w` / `s` | +x / -x (first action component) |
//! | `a` / `d` | +y / -y (second) |
//! | `r` / `f` | +z / -z (third) |
//! | `o` / `c` | open / close the gripper (last component, when the action space has one) |
//! | space | take over / hand back (toggles the intervention) |
//! | `y` | mark success (ends the episode) |
//! | `n` | mark failure (ends the episode) |
//! | `x` | ask for a reset |
//! | `e` | raise the e-stop (anyone may) |
//! | `u` | release the e-stop the robot's status shows (the robot stays still: paused) |
//! | `g` | resume a paused run (the next episode starts) |
//! | `q`, Ctrl-C | quit (hands back first) |

use reflex_contracts::msg::{Observation, RobotSpec, TeleopMsg};
use reflex_contracts::stop::StopAct;
use reflex_contracts::teleop::{Teleop, TeleopError};
use std::io::Read;
use std::time::{Duration, Instant};

/// The terminal in raw mode (no echo, no line buffering, no signals from Ctrl-C, reads that
/// return at once) until dropped. Not crossterm's raw mode: that one blocks on reads (VMIN 1)
/// and reads keys from /dev/tty through its own event parser, where the keyboard device reads
/// stdin byte by byte without waiting (what a pseudo-terminal drives in the tests).
struct RawTerminal {
    saved: rustix::termios::Termios,
}

impl RawTerminal {
    fn new() -> std::result::Result<Self, TeleopError> {
        use rustix::termios::{
            LocalModes, OptionalActions, SpecialCodeIndex, tcgetattr, tcsetattr,
        };
        let fail = |message: String| TeleopError {
            device: "keyboard".into(),
            message,
        };
        let stdin = std::io::stdin();
        if !rustix::termios::isatty(&stdin) {
            return Err(fail(
                "reflex teleop --device keyboard reads keys from a terminal; stdin is not one"
                    .into(),
            ));
        }
        let saved = tcgetattr(&stdin)
            .map_err(|e| fail(format!("cannot read the terminal's settings: {e}")))?;
        let mut t = saved.clone();
        t.local_modes
            .remove(LocalModes::ICANON | LocalModes::ECHO | LocalModes::ISIG);
        t.special_codes[SpecialCodeIndex::VMIN] = 0;
        t.special_codes[SpecialCodeIndex::VTIME] = 0;
        tcsetattr(&stdin, OptionalActions::Now, &t)
            .map_err(|e| fail(format!("cannot put the terminal in raw mode: {e}")))?;
        Ok(RawTerminal { saved })
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(
            std::io::stdin(),
            rustix::termios::OptionalActions::Now,
            &self.saved,
        );
    }
}

/// What the keys mean for a robot.
pub struct KeyMap {
    dim: usize,
    scale: Vec<f32>,
    gripper: Option<(usize, f32, f32)>,
    hold: Duration,
    last: [Option<Instant>; 6],
    gripper_target: Option<f32>,
    /// The intervention toggle.
    pub intervene: bool,
    /// An e-stop key pressed and not yet sent.
    pub stop_act: Option<StopAct>,
}

impl KeyMap {
    /// Key map for a robot's action space.
    pub fn new(spec: &RobotSpec, speed: f32, hold: Duration) -> Self {
        let a = &spec.action;
        let dim = a.dim();
        let scale = (0..dim)
            .map(|i| speed * (a.high[i] - a.low[i]) / 2.0)
            .collect();
        let gripper = a
            .names
            .iter()
            .position(|n| n.starts_with("gripper"))
            .map(|i| (i, a.low[i], a.high[i]));
        KeyMap {
            dim,
            scale,
            gripper,
            hold,
            last: [None; 6],
            gripper_target: None,
            intervene: false,
            stop_act: None,
        }
    }

    /// Applies a key press; returns `false` for quit.
    pub fn press(&mut self, key: u8, now: Instant, m: &mut TeleopMsg) -> bool {
        let axis = |k: u8| match k {
            b'w' => Some(0),
            b's' => Some(1),
            b'a' => Some(2),
            b'd' => Some(3),
            b'r' => Some(4),
            b'f' => Some(5),
            _ => None,
        };
        if let Some(i) = axis(key) {
            self.last[i] = Some(now);
            // The opposite direction is released at once.
            self.last[i ^ 1] = None;
            return true;
        }
        match key {
            b'o' => self.gripper_target = self.gripper.map(|g| g.2),
            b'c' => self.gripper_target = self.gripper.map(|g| g.1),
            b' ' => self.intervene = !self.intervene,
            b'y' => m.success = true,
            b'n' => m.failure = true,
            b'x' => m.reset = true,
            b'e' => self.stop_act = Some(StopAct::Raise),
            b'u' => self.stop_act = Some(StopAct::Release),
            b'g' => self.stop_act = Some(StopAct::Resume),
            b'q' | 3 => return false,
            _ => {}
        }
        true
    }

    /// Fills the command for `now` from the keys held.
    pub fn command(&self, now: Instant, m: &mut TeleopMsg) {
        m.action.resize(self.dim, 0.0);
        m.action.fill(0.0);
        for (axis, pair) in [(0usize, 0usize), (1, 2), (2, 4)] {
            if axis >= self.dim || self.gripper.is_some_and(|g| g.0 == axis) {
                continue;
            }
            let held = |i: usize| self.last[i].is_some_and(|t| now - t <= self.hold);
            let v = held(pair) as i32 - held(pair + 1) as i32;
            m.action[axis] = v as f32 * self.scale[axis];
        }
        if let (Some((i, lo, hi)), t) = (self.gripper, self.gripper_target) {
            // Holds the last chosen opening; open until told otherwise.
            m.action[i] = t.unwrap_or(hi).clamp(lo, hi);
        }
        m.intervene = self.intervene;
    }
}

/// This terminal's keyboard as a teleop device (the key table above).
pub struct Keyboard {
    map: KeyMap,
    quit: bool,
    buf: [u8; 64],
    _term: RawTerminal,
}

impl Keyboard {
    /// Puts the terminal in raw mode (restored when dropped) and maps the keys onto `spec`'s
    /// action space: a held key commands `speed` of the bounds; a key counts as held for `hold`
    /// after its last press.
    pub fn open(
        spec: &RobotSpec,
        speed: f32,
        hold: Duration,
    ) -> std::result::Result<Self, TeleopError> {
        Ok(Keyboard {
            _term: RawTerminal::new()?,
            map: KeyMap::new(spec, speed, hold),
            quit: false,
            buf: [0; 64],
        })
    }
}

impl Teleop for Keyboard {
    fn name(&self) -> &str {
        "keyboard"
    }

    fn poll(
        &mut self,
        _: Option<&Observation>,
        m: &mut TeleopMsg,
    ) -> std::result::Result<bool, TeleopError> {
        let n = match std::io::stdin().read(&mut self.buf) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock
                ) =>
            {
                0
            }
            Err(_) => {
                self.quit = true; // the terminal is gone: hand back and leave
                0
            }
        };
        let now = Instant::now();
        for i in 0..n {
            if !self.map.press(self.buf[i], now, m) {
                self.quit = true;
                break;
            }
        }
        self.map.command(now, m);
        Ok(n > 0)
    }

    fn finished(&self) -> bool {
        self.quit
    }

    fn take_stop_act(&mut self) -> Option<StopAct> {
        self.map.stop_act.take()
    }
}
