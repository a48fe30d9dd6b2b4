//! `reflex teleop --device keyboard --robot NAME`: drive a robot from a terminal.
//!
//! Publishes `TeleopMsg` on `reflex/<robot>/teleop` at a fixed rate; the actor (`reflex run`)
//! executes the command while the person intervenes and stores those steps as interventions.
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
//! | `q`, Ctrl-C | quit (hands back first) |

use crate::cli::BusArgs;
use anyhow::bail;
use clap::Args;
use reflex_runtime::bus::Keys;
use reflex_runtime::msg::{self, PROTOCOL_VERSION, RobotSpec, TeleopMsg};
use std::io::Read;
use std::time::{Duration, Instant};
use zenoh::Wait;

#[derive(Args)]
pub struct TeleopArgs {
    /// Input device: keyboard (this terminal). Gamepads, SpaceMouse and leader arms come with the
    /// hardware drivers.
    #[arg(long, default_value = "keyboard")]
    device: String,
    /// The robot's name on the bus.
    #[arg(long)]
    robot: String,
    /// Messages per second.
    #[arg(long, default_value_t = 50.0)]
    rate_hz: f64,
    /// A key counts as held for this long after its last press, ms.
    #[arg(long, default_value_t = 250.0)]
    hold_ms: f64,
    /// Fraction of the action bounds a held key commands.
    #[arg(long, default_value_t = 0.5)]
    speed: f32,
    /// How long to wait for the robot's spec, s.
    #[arg(long, default_value_t = 15.0)]
    wait_s: f64,
    #[command(flatten)]
    bus: BusArgs,
}

/// The terminal in raw mode (no echo, no line buffering) until dropped.
struct RawTerminal {
    saved: libc::termios,
}

impl RawTerminal {
    fn new() -> anyhow::Result<Self> {
        // SAFETY: isatty/tcgetattr/tcsetattr on fd 0 with a termios we own.
        unsafe {
            if libc::isatty(0) != 1 {
                bail!(
                    "reflex teleop --device keyboard reads keys from a terminal; stdin is not one"
                );
            }
            let mut t: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(0, &mut t) != 0 {
                bail!("cannot read the terminal's settings");
            }
            let saved = t;
            t.c_lflag &= !(libc::ICANON | libc::ECHO | libc::ISIG);
            t.c_cc[libc::VMIN] = 0;
            t.c_cc[libc::VTIME] = 0;
            if libc::tcsetattr(0, libc::TCSANOW, &t) != 0 {
                bail!("cannot put the terminal in raw mode");
            }
            Ok(RawTerminal { saved })
        }
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        // SAFETY: restores the settings read in `new`.
        unsafe {
            libc::tcsetattr(0, libc::TCSANOW, &self.saved);
        }
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

pub fn run(a: TeleopArgs) -> anyhow::Result<()> {
    if a.device != "keyboard" {
        bail!(
            "--device `{}`: this build drives `keyboard`; gamepad, spacemouse and leader-arm drivers come with the hardware crate",
            a.device
        );
    }
    let keys = Keys::new(&a.robot).map_err(anyhow::Error::msg)?;
    let session = a.bus.config().open()?;
    let spec = reflex_runtime::viz::fetch_spec(&session, &keys, Duration::from_secs_f64(a.wait_s))?;
    let publisher = session
        .declare_publisher(keys.teleop.clone())
        .express(true)
        .wait()
        .map_err(anyhow::Error::msg)?;
    let term = RawTerminal::new()?;
    eprint!(
        "teleop `{}` ({}): w/s a/d r/f move, o/c gripper, space take over / hand back, y success, n failure, x reset, q quit\r\n",
        spec.name, spec.kind
    );
    let mut map = KeyMap::new(&spec, a.speed, Duration::from_secs_f64(a.hold_ms / 1e3));
    let mut m = TeleopMsg {
        v: PROTOCOL_VERSION,
        ..Default::default()
    };
    let period = Duration::from_secs_f64(1.0 / a.rate_hz.clamp(1.0, 1000.0));
    let mut stdin = std::io::stdin();
    let mut buf = [0u8; 64];
    let mut next = Instant::now();
    let mut was = false;
    'outer: loop {
        let n = match stdin.read(&mut buf) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock
                ) =>
            {
                0
            }
            Err(_) => break, // the terminal is gone: hand back and leave
        };
        let now = Instant::now();
        for &k in &buf[..n] {
            if !map.press(k, now, &mut m) {
                break 'outer;
            }
        }
        if now >= next {
            map.command(now, &mut m);
            m.seq += 1;
            let _ = publisher.put(msg::encode(&m)).wait();
            if m.intervene != was {
                eprint!(
                    "{}\r\n",
                    if m.intervene {
                        "-- you drive"
                    } else {
                        "-- the policy drives"
                    }
                );
                was = m.intervene;
            }
            // Labels and reset are one-shot.
            m.success = false;
            m.failure = false;
            m.reset = false;
            next += period;
            if next < now {
                next = now + period;
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // Hand back before leaving, so the robot is not left holding a stale command.
    m.intervene = false;
    m.action.fill(0.0);
    m.seq += 1;
    let _ = publisher.put(msg::encode(&m)).wait();
    drop(term);
    eprintln!("teleop: handed back, bye");
    Ok(())
}
