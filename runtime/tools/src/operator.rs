//! `reflex estop [raise|release|resume] --robot NAME`: a robot's e-stop from any computer on its
//! bus, each act confirmed by the robot's own status (`reflex/<robot>/status`, published by the
//! actor at once when the stop changes).
//!
//! - raise: an `estop` event on `reflex/<robot>/events`, repeated until the status says
//!   `latched`; unconfirmed after `wait` it is an error (the person must know the robot may not
//!   have heard it, and use the power switch);
//! - release: the e-stop count the status shows, named in an [`OperatorMsg`] on
//!   `reflex/<robot>/operator` (an e-stop raised after that is not released by it), repeated
//!   until the status says `paused`;
//! - resume: the same, until the status says `running`.

use reflex_agent::AgentError;
use reflex_agent::error::Result;
use reflex_contracts::keys::Keys;
use reflex_contracts::msg::{
    self, EpisodeEvent, EventKind, OperatorKind, OperatorMsg, PROTOCOL_VERSION, StatusMsg,
};
use reflex_contracts::stop::{StopAct, StopState};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zenoh::Wait;

/// How an act ended: the robot's status that confirmed it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StopOutcome {
    /// The robot.
    pub robot: String,
    /// `raise`, `release` or `resume`.
    pub act: &'static str,
    /// The stop's state in the confirming status.
    pub state: String,
    /// E-stops raised so far.
    pub estops: u64,
    /// Who raised, released or resumed last (the status's `stop_by`).
    pub by: String,
    /// Times the message was sent before the status confirmed it.
    pub sends: u32,
}

/// Publishes one act: a raise on `events`, a release or resume (answering e-stop `estops`) on
/// `operator`.
pub fn publish(
    session: &zenoh::Session,
    keys: &Keys,
    act: StopAct,
    estops: u64,
    source: &str,
) -> Result<()> {
    let (key, bytes) = match act {
        StopAct::Raise => (
            &keys.events,
            msg::encode(&EpisodeEvent {
                v: PROTOCOL_VERSION,
                kind: EventKind::Estop,
                episode: 0,
                step: 0,
                seed: None,
                source: source.to_string(),
            }),
        ),
        StopAct::Release | StopAct::Resume => (
            &keys.operator,
            msg::encode(&OperatorMsg {
                v: PROTOCOL_VERSION,
                kind: if act == StopAct::Release {
                    OperatorKind::Release
                } else {
                    OperatorKind::Resume
                },
                estops,
                source: source.to_string(),
            }),
        ),
    };
    session
        .put(key.clone(), bytes)
        .wait()
        .map_err(reflex_agent::error::ctx(key.clone()))
}

/// Raises, releases or resumes `robot`'s e-stop and waits up to `wait` for its status to
/// confirm it.
///
/// # Errors
/// No status within `wait` (nobody confirmed: the robot may not have heard), a release with
/// nothing latched, a resume with nothing paused, or an e-stop raised after the one this act
/// answers.
pub fn act(
    session: &zenoh::Session,
    robot: &str,
    act: StopAct,
    source: &str,
    wait: Duration,
) -> Result<StopOutcome> {
    let keys = Keys::new(robot).map_err(reflex_bus::BusError::from)?;
    let latest: Arc<Mutex<Option<(StatusMsg, Instant)>>> = Arc::default();
    let l = latest.clone();
    let _sub = session
        .declare_subscriber(keys.status.clone())
        .callback(move |s| {
            if let Ok(m) = msg::decode::<StatusMsg>("status", &s.payload().to_bytes())
                && let Ok(mut g) = l.lock()
            {
                *g = Some((m, Instant::now()));
            }
        })
        .wait()
        .map_err(reflex_agent::error::ctx(keys.status.clone()))?;
    let t0 = Instant::now();
    let status_since = |t: Instant| -> Option<StatusMsg> {
        latest
            .lock()
            .ok()?
            .as_ref()
            .filter(|(_, at)| *at >= t)
            .map(|(m, _)| m.clone())
    };
    let fail =
        |m: String| AgentError::setup(format!("reflex estop {} --robot {robot}", act.as_str()), m);
    // What a release or resume answers: the e-stop count in a status.
    let estops = match act {
        StopAct::Raise => 0,
        StopAct::Release | StopAct::Resume => loop {
            if let Some(m) = status_since(t0) {
                let need = if act == StopAct::Release {
                    StopState::Latched
                } else {
                    StopState::Paused
                };
                if m.stop != need.as_str() {
                    return Err(fail(format!(
                        "the stop of `{robot}` is {} (by {}); {} needs it {}",
                        m.stop,
                        m.stop_by,
                        act.as_str(),
                        need.as_str()
                    )));
                }
                break m.figures.estops;
            }
            if t0.elapsed() > wait {
                return Err(fail(format!(
                    "no status on `{}` within {:.1} s: is `reflex run` on this bus (same endpoints, and TLS keys with a teleop role)?",
                    keys.status,
                    wait.as_secs_f64()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        },
    };
    let want = act.leads_to();
    let mut sends = 0u32;
    let mut last_send: Option<Instant> = None;
    loop {
        if last_send.is_none_or(|t| t.elapsed() > Duration::from_millis(200)) {
            publish(session, &keys, act, estops, source)?;
            sends += 1;
            last_send = Some(Instant::now());
        }
        if let Some(m) = status_since(t0) {
            let done = match act {
                StopAct::Raise => m.stop == want.as_str(),
                _ => m.stop == want.as_str() && m.figures.estops == estops,
            };
            if done {
                return Ok(StopOutcome {
                    robot: robot.to_string(),
                    act: act.as_str(),
                    state: m.stop,
                    estops: m.figures.estops,
                    by: m.stop_by,
                    sends,
                });
            }
            if act != StopAct::Raise && m.figures.estops != estops {
                return Err(fail(format!(
                    "e-stop {} was raised (by {}) after the one this {} answered ({estops}): look at the robot, then release that one",
                    m.figures.estops,
                    m.stop_by,
                    act.as_str()
                )));
            }
        }
        if t0.elapsed() > wait {
            return Err(fail(match act {
                StopAct::Raise => format!(
                    "sent {sends} times, but no status on `{}` confirmed the stop within {:.1} s: the robot may NOT have stopped; use its power switch",
                    keys.status,
                    wait.as_secs_f64()
                ),
                _ => format!(
                    "sent {sends} times, but the status on `{}` did not become {} within {:.1} s (is this peer allowed to teleoperate? docs/deploy.md)",
                    keys.status,
                    want.as_str(),
                    wait.as_secs_f64()
                ),
            }));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
