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
//! | `e` | raise the e-stop (anyone may) |
//! | `u` | release the e-stop the robot's status shows (the robot stays still: paused) |
//! | `g` | resume a paused run (the next episode starts) |
//! | `q`, Ctrl-C | quit (hands back first) |

use crate::error::Result;
use reflex_contracts::keys::Keys;
use reflex_contracts::msg::{self, Observation, PROTOCOL_VERSION, RobotSpec, TeleopMsg};
use reflex_contracts::stop::StopAct;
use reflex_contracts::teleop::{Teleop, TeleopError};
use std::io::Read;
use std::time::{Duration, Instant};
use zenoh::Wait;

/// The terminal in raw mode (no echo, no line buffering) until dropped.
struct RawTerminal {
    saved: libc::termios,
}

impl RawTerminal {
    fn new() -> std::result::Result<Self, TeleopError> {
        let fail = |message: &str| TeleopError {
            device: "keyboard".into(),
            message: message.into(),
        };
        // SAFETY: isatty/tcgetattr/tcsetattr on fd 0 with a termios we own.
        unsafe {
            if libc::isatty(0) != 1 {
                return Err(fail(
                    "reflex teleop --device keyboard reads keys from a terminal; stdin is not one",
                ));
            }
            let mut t: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(0, &mut t) != 0 {
                return Err(fail("cannot read the terminal's settings"));
            }
            let saved = t;
            t.c_lflag &= !(libc::ICANON | libc::ECHO | libc::ISIG);
            t.c_cc[libc::VMIN] = 0;
            t.c_cc[libc::VTIME] = 0;
            if libc::tcsetattr(0, libc::TCSANOW, &t) != 0 {
                return Err(fail("cannot put the terminal in raw mode"));
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

/// What happens while a device drives, for whoever shows it.
pub enum TeleopEvent<'a> {
    /// The robot was found.
    Connected(&'a RobotSpec),
    /// The person took over (`true`) or handed back.
    Driving(bool),
    /// A label or reset was sent.
    Sent(&'static str),
    /// The actor reported an episode event (a label it recorded, an episode's end or start).
    Robot(&'a msg::EpisodeEvent),
    /// The actor's episode or who drives changed: (episode, a person drives).
    Status(u64, bool),
    /// The robot's e-stop changed: (state, e-stops raised, who acted).
    Stop(&'a str, u64, &'a str),
}

/// What a teleop device hears back from the actor: the robot's newest traced state (for devices
/// that need the follower's pose), who drives, and the episode events that confirm a person's
/// labels.
#[derive(Default)]
pub struct Follow {
    latest: std::sync::Mutex<Option<Observation>>,
    events: std::sync::Mutex<Vec<msg::EpisodeEvent>>,
    status: std::sync::Mutex<Option<(u64, bool)>>,
    stop: std::sync::Mutex<Option<(String, u64, String)>>,
}

impl Follow {
    /// The robot's newest traced observation.
    pub fn latest(&self) -> Option<Observation> {
        self.latest.lock().ok().and_then(|g| g.clone())
    }

    /// Episode events received since the last call.
    pub fn take_events(&self) -> Vec<msg::EpisodeEvent> {
        self.events
            .lock()
            .map(|mut g| std::mem::take(&mut *g))
            .unwrap_or_default()
    }

    /// The actor's newest status: (episode, a person drives).
    pub fn status(&self) -> Option<(u64, bool)> {
        self.status.lock().ok().and_then(|g| *g)
    }

    /// The robot's e-stop in the actor's newest status: (state, e-stops raised, who acted).
    pub fn stop(&self) -> Option<(String, u64, String)> {
        self.stop.lock().ok().and_then(|g| g.clone())
    }
}

impl reflex_bus::trace::TraceSink for Follow {
    fn step(&self, t: &reflex_runtime::outbox::Transition) {
        if let Ok(mut g) = self.latest.lock() {
            let o = g.get_or_insert_with(Observation::default);
            o.episode = t.episode;
            o.step = t.step;
            o.state.clear();
            o.state.extend_from_slice(&t.obs);
        }
    }
    fn status(&self, m: &msg::StatusMsg) {
        if let Ok(mut g) = self.status.lock() {
            *g = Some((m.episode, m.intervening));
        }
        if let Ok(mut g) = self.stop.lock() {
            *g = Some((m.stop.clone(), m.estops, m.stop_by.clone()));
        }
    }
    fn event(&self, e: &msg::EpisodeEvent) {
        if let Ok(mut g) = self.events.lock() {
            g.push(e.clone());
        }
    }
    fn frames(&self, _: &reflex_runtime::outbox::Frames) {}
}

/// Subscribes `follow` to the actor's trace, status and events of `robot`.
pub fn follow(
    session: &zenoh::Session,
    robot: &str,
    follow: std::sync::Arc<Follow>,
) -> Result<reflex_bus::trace::Watch> {
    let keys = Keys::new(robot).map_err(reflex_bus::BusError::from)?;
    reflex_bus::trace::watch(session, &keys, follow).map_err(|e| {
        crate::AgentError::setup("teleop", format!("cannot follow the robot's trace: {e}"))
    })
}

/// Publishes what `device` produces on `reflex/<robot>/teleop` at `rate_hz` until the device is
/// finished, then hands back (so the robot is not left holding a stale command). `follow` gives
/// the device the robot's newest traced observation.
pub fn drive(
    device: &mut dyn Teleop,
    session: &zenoh::Session,
    robot: &str,
    rate_hz: f64,
    follow: Option<&Follow>,
    on_event: &mut dyn FnMut(TeleopEvent),
) -> Result<()> {
    let keys = Keys::new(robot).map_err(reflex_bus::BusError::from)?;
    let publisher = session
        .declare_publisher(keys.teleop.clone())
        .express(true)
        .wait()
        .map_err(crate::error::ctx(keys.teleop.clone()))?;
    let mut m = TeleopMsg {
        v: PROTOCOL_VERSION,
        ..Default::default()
    };
    let period = Duration::from_secs_f64(1.0 / rate_hz.clamp(1.0, 1000.0));
    let mut next = Instant::now();
    let mut was = false;
    let mut last_status = None;
    let mut last_stop = None;
    let source = format!("teleop {} ({})", device.name(), std::process::id());
    while !device.finished() {
        if let Some(f) = follow {
            for e in f.take_events() {
                on_event(TeleopEvent::Robot(&e));
            }
            let st = f.status();
            if st.is_some() && st != last_status {
                last_status = st;
                if let Some((ep, person)) = st {
                    on_event(TeleopEvent::Status(ep, person));
                }
            }
            let sp = f.stop().map(|(state, n, _)| (state, n));
            if sp.is_some() && sp != last_stop {
                last_stop = sp;
                if let Some((state, n, by)) = f.stop() {
                    on_event(TeleopEvent::Stop(&state, n, &by));
                }
            }
        }
        let obs = follow.and_then(Follow::latest);
        device.poll(obs.as_ref(), &mut m)?;
        if let Some(act) = device.take_stop_act() {
            // A release or resume names the e-stop the status shows; without a status there
            // is nothing to answer.
            let seen = follow.and_then(Follow::stop).map(|(_, n, _)| n);
            match (act, seen) {
                (StopAct::Raise, _) => {
                    crate::operator::publish(session, &keys, act, 0, &source)?;
                    on_event(TeleopEvent::Sent("EMERGENCY STOP"));
                }
                (_, Some(n)) => {
                    crate::operator::publish(session, &keys, act, n, &source)?;
                    on_event(TeleopEvent::Sent(act.as_str()));
                }
                (_, None) => on_event(TeleopEvent::Sent(
                    "nothing: no status from the robot yet to say which e-stop to answer",
                )),
            }
        }
        let now = Instant::now();
        if now >= next {
            m.seq += 1;
            let _ = publisher.put(msg::encode(&m)).wait();
            if m.intervene != was {
                on_event(TeleopEvent::Driving(m.intervene));
                was = m.intervene;
            }
            for (on, what) in [
                (m.success, "success"),
                (m.failure, "failure"),
                (m.reset, "reset"),
            ] {
                if on {
                    on_event(TeleopEvent::Sent(what));
                }
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
    m.intervene = false;
    m.action.fill(0.0);
    m.seq += 1;
    let _ = publisher.put(msg::encode(&m)).wait();
    Ok(())
}

/// Finds the robot's spec on the bus (the actor's, else the robot's own).
pub fn fetch_spec(session: &zenoh::Session, robot: &str, wait: Duration) -> Result<RobotSpec> {
    let keys = Keys::new(robot).map_err(reflex_bus::BusError::from)?;
    let spec = reflex_bus::trace::fetch_spec(session, &keys, wait)?;
    spec.validate()?;
    Ok(spec)
}
