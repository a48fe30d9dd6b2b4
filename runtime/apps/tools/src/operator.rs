//! `reflex estop [raise|release|resume] --robot NAME`: a robot's e-stop from any computer on its
//! bus, each act confirmed by every holder of the robot's e-stop: the process serving the robot
//! (`reflex sim serve`, `reflex hw serve`) and the actor (`reflex run`), whichever are running.
//! Each answers a query on `reflex/<robot>/stop/*` with its own state and count
//! ([`StopStatus`]), so a served robot whose actor is gone is released and resumed all the same.
//!
//! - raise: an `estop` event on `reflex/<robot>/events`, repeated until every holder says
//!   `latched`; unconfirmed after `wait` it is an error (the person must know the robot may not
//!   have heard it, and use the power switch);
//! - release: to each holder the e-stop count it shows, in an [`OperatorMsg`] on
//!   `reflex/<robot>/operator` addressed to it (an e-stop raised after that is not released by
//!   it), repeated until each says `paused`;
//! - resume: the same, until each says `running`.

use reflex_agent::AgentError;
use reflex_agent::error::Result;
use reflex_contracts::keys::Keys;
use reflex_contracts::msg::{
    self, EpisodeEvent, EventKind, OperatorKind, OperatorMsg, PROTOCOL_VERSION, StopStatus,
};
use reflex_contracts::stop::{StopAct, StopHolder, StopState};
use std::time::{Duration, Instant};
use zenoh::Wait;

/// How an act ended: the holders' reports that confirmed it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StopOutcome {
    /// The robot.
    pub robot: String,
    /// `raise`, `release` or `resume`.
    pub act: &'static str,
    /// The stop's state the holders confirmed.
    pub state: String,
    /// E-stops raised so far, as the actor counts them (else the robot's server).
    pub estops: u64,
    /// Who raised, released or resumed last (the actor's `stop_by`, else the server's).
    pub by: String,
    /// Times the message was sent before the holders confirmed it.
    pub sends: u32,
    /// Every holder's confirming report: `robot` (its server) and `actor`, those running.
    pub holders: Vec<StopStatus>,
}

/// Publishes one act: a raise on `events`, a release or resume (answering e-stop `estops`) on
/// `operator`, for every holder of the robot's e-stop.
pub fn publish(
    session: &zenoh::Session,
    keys: &Keys,
    act: StopAct,
    estops: u64,
    source: &str,
) -> Result<()> {
    publish_to(session, keys, act, estops, source, None)
}

/// Publishes one act for `to` (`None`: every holder); a raise is always for everyone, and
/// counts as an e-stop of its own at every holder.
pub fn publish_to(
    session: &zenoh::Session,
    keys: &Keys,
    act: StopAct,
    estops: u64,
    source: &str,
    to: Option<StopHolder>,
) -> Result<()> {
    send(session, keys, act, estops, source, to, 0)
}

/// A number for one operator's act that another act is unlikely to share (time and process).
fn act_id() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (t ^ (u64::from(std::process::id()) << 40)) | 1
}

/// [`publish_to`], with a raise naming the act `raise_act` it repeats (0: none).
fn send(
    session: &zenoh::Session,
    keys: &Keys,
    act: StopAct,
    estops: u64,
    source: &str,
    to: Option<StopHolder>,
    raise_act: u64,
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
                act: raise_act,
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
                to: to.map_or(String::new(), |h| h.as_str().to_string()),
            }),
        ),
    };
    // An e-stop act must not be dropped or queued behind a robot's observations on a busy link
    // (a loaded actor behind the server missed every raise with put's default, drop): it blocks
    // rather than drops and travels at the highest priority, on every hop.
    session
        .put(key.clone(), bytes)
        .congestion_control(zenoh::qos::CongestionControl::Block)
        .priority(zenoh::qos::Priority::RealTime)
        .express(true)
        .wait()
        .map_err(reflex_agent::error::ctx(key.clone()))
}

/// What the holders of `keys.robot`'s e-stop report now, one each (robot's server first), and
/// the replies refused (not a [`StopStatus`] of this robot from the holder its key names).
/// Waits at most `within` for them; returns as soon as every holder on the bus has answered.
pub fn holders(
    session: &zenoh::Session,
    keys: &Keys,
    within: Duration,
) -> Result<(Vec<StopStatus>, u32)> {
    let replies = session
        .get(keys.stop_any.clone())
        .target(zenoh::query::QueryTarget::All)
        .consolidation(zenoh::query::ConsolidationMode::None)
        .timeout(within.max(Duration::from_millis(10)))
        .wait()
        .map_err(reflex_agent::error::ctx(keys.stop_any.clone()))?;
    let (mut out, mut refused) = (Vec::<StopStatus>::new(), 0u32);
    while let Ok(r) = replies.recv() {
        let Ok(sample) = r.result() else { continue };
        let key = sample.key_expr().as_str().to_string();
        let fits = msg::decode::<StopStatus>(&key, &sample.payload().to_bytes())
            .ok()
            .filter(|m| {
                m.robot == keys.robot
                    && StopHolder::parse(&m.holder).is_some_and(|h| keys.stop_of(h) == key)
            });
        match fits {
            // One report per holder: a second answer on the same key replaces the first.
            Some(m) => match out.iter_mut().find(|o| o.holder == m.holder) {
                Some(o) => *o = m,
                None => out.push(m),
            },
            None => refused += 1,
        }
    }
    out.sort_by_key(|m| m.holder != StopHolder::Robot.as_str());
    for m in &mut out {
        m.stop_by = reflex_contracts::stop::clean_name(&m.stop_by);
    }
    Ok((out, refused))
}

/// Sends a release or resume to every holder of the robot's e-stop with the count it shows,
/// addressed to it (one message for all when they agree); with no holder answering within
/// `within`, to everyone with `fallback` (the count an actor's status showed). For a teleop
/// device's keys, which act once and watch the status.
pub fn publish_for_holders(
    session: &zenoh::Session,
    keys: &Keys,
    act: StopAct,
    fallback: u64,
    source: &str,
    within: Duration,
) -> Result<()> {
    let (now, _) = holders(session, keys, within)?;
    if now.is_empty() {
        return publish(session, keys, act, fallback, source);
    }
    send_each(session, keys, act, source, &now)
}

/// How long a raise keeps asking before it takes "no actor answered" to mean there is none: a
/// command's fresh session learns of peers behind the server over its first moments, so an
/// actor's report (and token) can miss the first rounds.
const SETTLE: Duration = Duration::from_millis(700);

/// Whether an actor of the robot holds its liveliness token now (it holds an e-stop too, so a
/// raise waits for its confirmation).
fn actor_alive(session: &zenoh::Session, keys: &Keys) -> bool {
    session
        .liveliness()
        .get(keys.alive_actor.clone())
        .timeout(Duration::from_millis(500))
        .wait()
        .is_ok_and(|r| r.recv().is_ok())
}

/// One message for every holder when their counts agree, else one addressed to each.
fn send_each(
    session: &zenoh::Session,
    keys: &Keys,
    act: StopAct,
    source: &str,
    targets: &[StopStatus],
) -> Result<()> {
    if targets.windows(2).all(|w| w[0].estops == w[1].estops) {
        return publish(session, keys, act, targets[0].estops, source);
    }
    for t in targets {
        publish_to(
            session,
            keys,
            act,
            t.estops,
            source,
            StopHolder::parse(&t.holder),
        )?;
    }
    Ok(())
}

fn list(reports: &[StopStatus]) -> String {
    reports
        .iter()
        .map(|m| {
            format!(
                "{} {} (e-stop {}, by {})",
                m.holder,
                m.stop,
                m.estops,
                if m.stop_by.is_empty() {
                    "nobody"
                } else {
                    &m.stop_by
                }
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Raises, releases or resumes `robot`'s e-stop and waits up to `wait` for every holder of it
/// to confirm.
///
/// # Errors
/// No holder answers within `wait` (nobody confirmed: the robot may not have heard), a release
/// with nothing latched, a resume with nothing paused, or an e-stop raised after the one this
/// act answers.
pub fn act(
    session: &zenoh::Session,
    robot: &str,
    act: StopAct,
    source: &str,
    wait: Duration,
) -> Result<StopOutcome> {
    let keys = Keys::new(robot).map_err(reflex_bus::BusError::from)?;
    let t0 = Instant::now();
    let want = act.leads_to();
    let fail = |m: String| failure(robot, act, m);
    // A release or resume answers the count each holder shows now.
    let targets: Vec<StopStatus> = match act {
        StopAct::Raise => Vec::new(),
        StopAct::Release | StopAct::Resume => targets(session, &keys, act, wait, t0)?,
    };
    let mut sends = 0u32;
    let raise_act = act_id();
    let mut last_send: Option<Instant> = None;
    let mut seen = Vec::new();
    let mut latest: Vec<StopStatus> = Vec::new();
    loop {
        if last_send.is_none_or(|t| t.elapsed() > Duration::from_millis(200)) {
            match act {
                // Each repeat names this act: a holder counts it once.
                StopAct::Raise => send(session, &keys, act, 0, source, None, raise_act)?,
                _ => send_each(session, &keys, act, source, &targets)?,
            }
            sends += 1;
            last_send = Some(Instant::now());
        }
        let (now, refused) = holders(session, &keys, left(wait, t0))?;
        if act != StopAct::Raise
            && let Some((t, m)) = targets.iter().find_map(|t| {
                now.iter()
                    .find(|m| m.holder == t.holder && m.estops != t.estops)
                    .map(|m| (t, m))
            })
        {
            return Err(fail(format!(
                "e-stop {} was raised on the {} (by {}) after the one this {} answered ({}): look at the robot, then release that one",
                m.estops,
                m.holder,
                m.stop_by,
                act.as_str(),
                t.estops
            )));
        }
        // A holder that answered an earlier round keeps its last report until it answers again,
        // so a raise is confirmed by every holder seen, not only by those that answered this
        // round in time (a loaded actor can miss a round).
        for m in &now {
            match latest
                .iter_mut()
                .find(|o: &&mut StopStatus| o.holder == m.holder)
            {
                Some(o) => *o = m.clone(),
                None => latest.push(m.clone()),
            }
        }
        let now = if act == StopAct::Raise {
            latest.clone()
        } else {
            now
        };
        let done = !now.is_empty()
            && match act {
                StopAct::Raise => {
                    now.iter().all(|m| m.stop == want)
                        && (now.iter().any(|m| m.holder == StopHolder::Actor.as_str())
                            || (t0.elapsed() >= SETTLE && !actor_alive(session, &keys)))
                }
                _ => targets
                    .iter()
                    .all(|t| now.iter().any(|m| m.holder == t.holder && m.stop == want)),
            };
        if done {
            let main = now
                .iter()
                .find(|m| m.holder == StopHolder::Actor.as_str())
                .unwrap_or(&now[0]);
            return Ok(StopOutcome {
                robot: robot.to_string(),
                act: act.as_str(),
                state: want.as_str().to_string(),
                estops: main.estops,
                by: main.stop_by.clone(),
                sends,
                holders: now,
            });
        }
        if !now.is_empty() {
            seen = now;
        }
        if t0.elapsed() > wait {
            return Err(fail(unconfirmed(&keys, act, wait, sends, &seen, refused)));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How long the next query for the holders' reports may wait: what is left of `wait`, at most 1 s.
fn left(wait: Duration, t0: Instant) -> Duration {
    wait.saturating_sub(t0.elapsed())
        .min(Duration::from_secs(1))
}

/// An act's failure, worded as the command the person typed.
fn failure(robot: &str, act: StopAct, m: String) -> AgentError {
    AgentError::setup(format!("reflex estop {} --robot {robot}", act.as_str()), m)
}

/// Nobody answered for the robot's e-stop within `wait`.
fn nobody(keys: &Keys, wait: Duration, refused: u32) -> String {
    format!(
        "no holder of its e-stop answered on `{}` within {:.1} s: is `reflex run`, `reflex sim serve` or `reflex hw serve` on this bus (same endpoints, and TLS keys of this robot)?{}",
        keys.stop_any,
        wait.as_secs_f64(),
        if refused > 0 {
            format!(
                " ({refused} replies there were not a holder's report of this robot and were ignored)"
            )
        } else {
            String::new()
        }
    )
}

/// The holders a release or resume is for, each with the count it shows now: those in the
/// state the act needs. Refused when one is in another state, or none needs it.
fn targets(
    session: &zenoh::Session,
    keys: &Keys,
    act: StopAct,
    wait: Duration,
    t0: Instant,
) -> Result<Vec<StopStatus>> {
    let robot = keys.robot.as_str();
    let want = act.leads_to();
    let fail = |m: String| failure(robot, act, m);
    let need = if act == StopAct::Release {
        StopState::Latched
    } else {
        StopState::Paused
    };
    let now = loop {
        let (now, refused) = holders(session, keys, left(wait, t0))?;
        if !now.is_empty() {
            break now;
        }
        if t0.elapsed() >= wait {
            return Err(fail(nobody(keys, wait, refused)));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if let Some(m) = now.iter().find(|m| m.stop != need && m.stop != want) {
        return Err(fail(format!(
            "the {}'s stop of `{robot}` is {} (by {}); {} needs it {} (all: {})",
            m.holder,
            m.stop,
            m.stop_by,
            act.as_str(),
            need.as_str(),
            list(&now)
        )));
    }
    let targets: Vec<StopStatus> = now.iter().filter(|m| m.stop == need).cloned().collect();
    if targets.is_empty() {
        return Err(fail(format!(
            "nothing to {}: the stop of `{robot}` is {} already ({}); {} needs it {}",
            act.as_str(),
            want.as_str(),
            list(&now),
            act.as_str(),
            need.as_str()
        )));
    }
    Ok(targets)
}

/// Why an act was not confirmed within `wait`, and what the person must do.
fn unconfirmed(
    keys: &Keys,
    act: StopAct,
    wait: Duration,
    sends: u32,
    seen: &[StopStatus],
    refused: u32,
) -> String {
    let want = act.leads_to();
    match (act, seen.is_empty()) {
        (StopAct::Raise, true) => format!(
            "sent {sends} times, but {}: the robot may NOT have stopped; use its power switch",
            nobody(keys, wait, refused)
        ),
        (StopAct::Raise, false) => format!(
            "sent {sends} times, but not every holder confirmed the stop within {:.1} s ({}): the robot may NOT have stopped; use its power switch",
            wait.as_secs_f64(),
            list(seen)
        ),
        _ => format!(
            "sent {sends} times, but the stop did not become {} within {:.1} s ({}; is this peer allowed to teleoperate? docs/deploy.md)",
            want.as_str(),
            wait.as_secs_f64(),
            if seen.is_empty() {
                "no holder answered since".to_string()
            } else {
                list(seen)
            }
        ),
    }
}
