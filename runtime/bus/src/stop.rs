//! A holder's e-stop on the bus: emergency stops on `reflex/<robot>/events` and an operator's
//! release and resume on `reflex/<robot>/operator` into the switch the holder obeys, and the
//! switch's state out on `reflex/<robot>/stop/<holder>` ([`StopStatus`]).
//!
//! Two processes hold an e-stop of a served robot: the robot's server, which holds the robot
//! itself, and the actor, which holds its loop. Before the server reported its own, only the
//! actor's status said where the stop stood, so a served arm whose actor died while latched
//! could not be released remotely (`reflex estop release` waited for a status nobody sent) and
//! a new actor's reset was refused: only a restart of the server helped. Now every holder
//! answers a query on `reflex/<robot>/stop/*` with its own state and count, and the server also
//! publishes it when it changes and once a second, so an operator releases and resumes each
//! holder there is, from any computer, with or without an actor.

use crate::{BusError, Rejects};
use reflex_contracts::keys::Keys;
use reflex_contracts::msg::{
    self, EpisodeEvent, EventKind, OperatorKind, OperatorMsg, PROTOCOL_VERSION, StopStatus,
};
use reflex_contracts::stop::{StopHolder, StopState, StopSwitch, clean_name};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use zenoh::Wait;

/// How often the publishing thread looks at the switch: a change goes out within this.
const LOOK_EVERY: Duration = Duration::from_millis(20);
/// The longest a watcher waits for a server's stop state while nothing changes.
const HEARTBEAT: Duration = Duration::from_secs(1);

/// A holder's e-stop inputs and report, alive as long as this is.
pub struct StopInputs {
    _subs: Vec<zenoh::pubsub::Subscriber<()>>,
    _query: zenoh::query::Queryable<()>,
    publisher: Option<(Arc<AtomicBool>, JoinHandle<()>)>,
}

/// The state of `stop` as `holder` reports it.
pub fn stop_status(
    keys: &Keys,
    holder: StopHolder,
    stop: &StopSwitch,
    rejects: &[Arc<Rejects>],
) -> StopStatus {
    let state = stop.state();
    StopStatus {
        v: PROTOCOL_VERSION,
        robot: keys.robot.clone(),
        holder: holder.as_str().to_string(),
        stop: state,
        estops: stop.raises(),
        stop_by: match state {
            StopState::Latched => stop.raised_by(),
            StopState::Paused => stop.released_resumed_by().0,
            StopState::Running => stop.released_resumed_by().1,
        },
        estop_raised_unix_ns: stop.last_raised_unix_ns(),
        rejected: rejects
            .iter()
            .filter(|r| r.count() > 0)
            .map(|r| (r.key().to_string(), r.count()))
            .collect(),
    }
}

impl StopInputs {
    /// Feeds the e-stop from the bus into `stop`, which `holder` obeys: an `estop` event on
    /// `reflex/<robot>/events` raises it (anyone on the bus may: with access rules, every
    /// authenticated peer), an operator's release or resume on `reflex/<robot>/operator`
    /// addressed to this holder or to all moves it on (with access rules, only teleop peers may
    /// write there). A message that does not decode is counted in its key's rejects, and so is
    /// a release or resume that does not fit (nothing latched, or an e-stop raised after the
    /// operator looked). Answers queries on `reflex/<robot>/stop/<holder>` with the switch's
    /// [`StopStatus`].
    pub fn open(
        session: &zenoh::Session,
        keys: &Keys,
        holder: StopHolder,
        stop: Arc<StopSwitch>,
        event_rejects: Arc<Rejects>,
        operator_rejects: Arc<Rejects>,
    ) -> Result<Self, BusError> {
        let declare = |key: &str, e: zenoh::Error| BusError::Declare {
            key: key.into(),
            message: e.to_string(),
        };
        let (s, robot) = (stop.clone(), keys.robot.clone());
        let events = crate::subscribe_decoded(
            session,
            &keys.events,
            event_rejects.clone(),
            move |ev: EpisodeEvent| {
                if ev.kind == EventKind::Estop {
                    let by = clean_name(&ev.source);
                    if !s.raise_act(&by, ev.act) {
                        return; // a repeat of the act that latched it
                    }
                    tracing::warn!(
                        "EMERGENCY STOP on `{robot}` raised by {by} (e-stop {}, the {}'s count): it holds; release it with `reflex estop release --robot {robot}`, then resume",
                        s.raises(),
                        holder.as_str()
                    );
                }
            },
        )
        .map_err(|e| declare(&keys.events, e))?;
        let (r, s, robot) = (operator_rejects.clone(), stop.clone(), keys.robot.clone());
        let operator = crate::subscribe_decoded(
            session,
            &keys.operator,
            operator_rejects.clone(),
            move |m: OperatorMsg| {
                if !holder.addressed_by(&m.to) {
                    return; // for the robot's other holder
                }
                let by = clean_name(&m.source);
                let result = match m.kind {
                    OperatorKind::Release => s.release(m.estops, &by),
                    OperatorKind::Resume => s.resume(m.estops, &by),
                };
                let h = holder.as_str();
                match (result, m.kind) {
                    (Ok(()), OperatorKind::Release) => tracing::warn!(
                        "e-stop on `{robot}` ({h}) released by {by}: paused, nothing moves until someone resumes (`reflex estop resume --robot {robot}`)"
                    ),
                    (Ok(()), OperatorKind::Resume) => {
                        tracing::warn!("`{robot}` ({h}) resumed by {by}")
                    }
                    (Err(e), kind) => {
                        r.reject(&format_args!("{kind:?} for the {h} from {by} refused: {e}"))
                    }
                }
            },
        )
        .map_err(|e| declare(&keys.operator, e))?;
        let key = keys.stop_of(holder).to_string();
        let (k, ks, s) = (key.clone(), keys.clone(), stop);
        let rejects = [event_rejects, operator_rejects];
        let query = session
            .declare_queryable(key.clone())
            .callback(move |q| {
                let m = stop_status(&ks, holder, &s, &rejects);
                let _ = q.reply(k.clone(), msg::encode(&m)).wait();
            })
            .wait()
            .map_err(|e| declare(&key, e))?;
        Ok(StopInputs {
            _subs: vec![events, operator],
            _query: query,
            publisher: None,
        })
    }

    /// Also publishes the switch's [`StopStatus`] on `reflex/<robot>/stop/<holder>` when it
    /// changes (within 20 ms) and at least once a second, from a thread of its own: watchers
    /// see a served robot's stop with no actor, and while the server is busy (a reset's move).
    pub fn publishing(
        mut self,
        session: &zenoh::Session,
        keys: &Keys,
        holder: StopHolder,
        stop: Arc<StopSwitch>,
        rejects: Vec<Arc<Rejects>>,
    ) -> Result<Self, BusError> {
        let key = keys.stop_of(holder).to_string();
        let publisher =
            session
                .declare_publisher(key.clone())
                .wait()
                .map_err(|e| BusError::Declare {
                    key: key.clone(),
                    message: e.to_string(),
                })?;
        let done = Arc::new(AtomicBool::new(false));
        let (d, keys, k) = (done.clone(), keys.clone(), key.clone());
        let thread = std::thread::Builder::new()
            .name(format!("stop-{}", holder.as_str()))
            .spawn(move || {
                let mut last: Option<(StopState, u64)> = None;
                let mut at = Instant::now();
                while !d.load(Ordering::Relaxed) {
                    let now = (stop.state(), stop.raises());
                    if last != Some(now) || at.elapsed() >= HEARTBEAT {
                        let m = stop_status(&keys, holder, &stop, &rejects);
                        if let Err(e) = publisher.put(msg::encode(&m)).wait() {
                            tracing::warn!("cannot publish the e-stop on {k}: {e}");
                        }
                        (last, at) = (Some(now), Instant::now());
                    }
                    std::thread::sleep(LOOK_EVERY);
                }
            })
            .map_err(|e| BusError::Declare {
                key,
                message: format!("cannot start the thread that publishes it: {e}"),
            })?;
        self.publisher = Some((done, thread));
        Ok(self)
    }
}

impl Drop for StopInputs {
    fn drop(&mut self) {
        if let Some((done, thread)) = self.publisher.take() {
            done.store(true, Ordering::Relaxed);
            let _ = thread.join();
        }
    }
}
