//! A person's input from the bus: teleop messages on `reflex/<robot>/teleop` into the loop's
//! lock-free teleop channel; emergency stops on `reflex/<robot>/events`, and an operator's
//! release and resume on `reflex/<robot>/operator`, into the e-stop switch the loop reads every
//! tick.

use crate::Rejects;
use reflex_contracts::keys::Keys;
use reflex_contracts::msg::{EpisodeEvent, EventKind, OperatorKind, OperatorMsg, TeleopMsg};
use reflex_contracts::stop::{StopSwitch, clean_name};
use reflex_runtime::teleop::TeleopWriter;
use std::sync::{Arc, Mutex};

/// Feeds `reflex/<robot>/teleop` from the bus into a teleop channel. A message that does not
/// decode, or that intervenes with an action that is not `action_dim` finite values, is counted in `rejects` and never
/// reaches the loop. Keep the returned subscriber alive as long as the loop should listen.
pub fn subscribe(
    session: &zenoh::Session,
    keys: &Keys,
    writer: TeleopWriter,
    action_dim: usize,
    rejects: Arc<Rejects>,
) -> Result<zenoh::pubsub::Subscriber<()>, zenoh::Error> {
    let writer = Mutex::new(writer);
    let r = rejects.clone();
    crate::subscribe_decoded(session, &keys.teleop, rejects, move |m: TeleopMsg| {
        // The loop reads the action only while a person intervenes: then it must fit the robot.
        let fits = !m.intervene
            || (m.action.len() == action_dim && m.action.iter().all(|v| v.is_finite()));
        if !fits {
            r.reject(&format_args!(
                "teleop action of {} values (finite: {}) for a robot with {action_dim}",
                m.action.len(),
                m.action.iter().all(|v| v.is_finite())
            ));
        } else if let Ok(mut w) = writer.lock() {
            w.send(&m);
        }
    })
}

/// Feeds the e-stop from the bus into `stop`: an `estop` event on `reflex/<robot>/events` raises
/// it (anyone on the bus may: with access rules, every authenticated peer), an operator's
/// release or resume on `reflex/<robot>/operator` moves it on (with access rules, only teleop
/// peers may write there). A message that does not decode is counted in its key's rejects, and
/// so is a release or resume that does not fit (nothing latched, or an e-stop raised after the
/// operator looked). Keep the returned subscribers alive as long as the robot should listen.
pub fn subscribe_stop(
    session: &zenoh::Session,
    keys: &Keys,
    stop: Arc<StopSwitch>,
    event_rejects: Arc<Rejects>,
    operator_rejects: Arc<Rejects>,
) -> Result<Vec<zenoh::pubsub::Subscriber<()>>, zenoh::Error> {
    let (s, robot) = (stop.clone(), keys.robot.clone());
    let events = crate::subscribe_decoded(
        session,
        &keys.events,
        event_rejects,
        move |ev: EpisodeEvent| {
            if ev.kind == EventKind::Estop {
                let by = clean_name(&ev.source);
                s.raise(&by);
                tracing::warn!(
                    "EMERGENCY STOP on `{robot}` raised by {by} (e-stop {}): the robot holds; release it with `reflex estop release --robot {robot}`, then resume",
                    s.raises()
                );
            }
        },
    )?;
    let (r, robot) = (operator_rejects.clone(), keys.robot.clone());
    let operator = crate::subscribe_decoded(
        session,
        &keys.operator,
        operator_rejects,
        move |m: OperatorMsg| {
            let by = clean_name(&m.source);
            let result = match m.kind {
                OperatorKind::Release => stop.release(m.estops, &by),
                OperatorKind::Resume => stop.resume(m.estops, &by),
            };
            match (result, m.kind) {
                (Ok(()), OperatorKind::Release) => tracing::warn!(
                    "e-stop on `{robot}` released by {by}: paused, nothing moves until someone resumes (`reflex estop resume --robot {robot}`)"
                ),
                (Ok(()), OperatorKind::Resume) => {
                    tracing::warn!("`{robot}` resumed by {by}: the next episode starts")
                }
                (Err(e), kind) => r.reject(&format_args!("{kind:?} from {by} refused: {e}")),
            }
        },
    )?;
    Ok(vec![events, operator])
}
