//! `reflex teleop --device D --robot NAME`: drive a robot from a device.
//!
//! Publishes `TeleopMsg` on `reflex/<robot>/teleop` at a fixed rate; the actor (`reflex run`)
//! executes the command while the person intervenes and stores those steps as interventions.
//!
//! The devices themselves (keyboard, gamepad, SpaceMouse, leader arm) are in reflex-hardware;
//! this module puts what one produces on the bus and shows what the robot answers.

use reflex_agent::error::Result;
use reflex_contracts::keys::Keys;
use reflex_contracts::msg::{self, Observation, PROTOCOL_VERSION, RobotSpec, TeleopMsg};
use reflex_contracts::stop::{StopAct, StopState};
use reflex_contracts::teleop::Teleop;
use std::time::{Duration, Instant};
use zenoh::Wait;

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
    stop: std::sync::Mutex<Option<(StopState, u64, String)>>,
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
    pub fn stop(&self) -> Option<(StopState, u64, String)> {
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
            *g = Some((m.figures.episode, m.figures.intervening));
        }
        if let Ok(mut g) = self.stop.lock() {
            *g = Some((m.stop, m.figures.estops, m.stop_by.clone()));
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
        reflex_agent::AgentError::setup("teleop", format!("cannot follow the robot's trace: {e}"))
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
        .map_err(reflex_agent::error::ctx(keys.teleop.clone()))?;
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
                    on_event(TeleopEvent::Stop(state.as_str(), n, &by));
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
                    // Each holder (the robot's server too) its own count; `n` when none answers.
                    crate::operator::publish_for_holders(
                        session,
                        &keys,
                        act,
                        n,
                        &source,
                        Duration::from_millis(300),
                    )?;
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
