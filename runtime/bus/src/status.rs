//! The actor's status on `reflex/<robot>/status`: a thread reads the loop's snapshots from its
//! triple buffer and publishes them; the loop never waits for it. It also logs the loop's safety
//! events, which the loop cannot format itself without allocating.

use crate::Rejects;
use reflex_contracts::keys::Keys;
use reflex_contracts::msg;
use reflex_contracts::stop::{StopState, StopSwitch};
use reflex_runtime::control::LoopStatus;
use reflex_runtime::safety::SafetyEvent;
use reflex_runtime::triple::Reader;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;
use zenoh::Wait;

/// What the status carries beside the loop's own snapshot.
#[derive(Default)]
pub struct StatusExtras {
    /// The episode recorder's count of dropped steps, when recording.
    pub recorder_dropped: Option<Box<dyn Fn() -> u64 + Send>>,
    /// Rejection counters of the keys the actor reads.
    pub rejects: Vec<Arc<Rejects>>,
    /// The e-stop: its state and who acted last go in every status, and a change is published
    /// at once, even while the loop is busy (a reset's move to its start pose).
    pub stop: Option<Arc<StopSwitch>>,
    /// The robot's cameras' figures, when it has cameras that report them.
    pub cameras: Option<Box<dyn Fn() -> Vec<msg::CameraFigures> + Send>>,
    /// The learner link's progress, when the actor learns.
    pub learner: Option<Arc<crate::learnlink::LinkProgress>>,
}

impl StatusExtras {
    /// Keys with at least one rejected message, with their counts.
    pub fn rejected(&self) -> Vec<(String, u64)> {
        self.rejects
            .iter()
            .filter(|r| r.count() > 0)
            .map(|r| (r.key().to_string(), r.count()))
            .collect()
    }
}

/// A running status publisher.
pub struct StatusPublisher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Counts clipped steps over windows of 10 s; reports a window where more than half the steps
/// were clipped.
#[derive(Default)]
struct ClipWindow {
    start: Option<(std::time::Instant, u64, u64)>,
}

impl ClipWindow {
    fn update(
        &mut self,
        now: &reflex_runtime::safety::SafetyCounters,
        ticks: u64,
    ) -> Option<(u64, u64)> {
        let clipped: u64 = SafetyEvent::ALL
            .iter()
            .enumerate()
            .filter(|(_, e)| e.is_clip())
            .map(|(i, _)| now.0[i])
            .sum();
        let t = std::time::Instant::now();
        let (t0, c0, k0) = *self.start.get_or_insert((t, clipped, ticks));
        if t.duration_since(t0) < Duration::from_secs(10) {
            return None;
        }
        self.start = Some((t, clipped, ticks));
        let (n, of) = (clipped.saturating_sub(c0), ticks.saturating_sub(k0));
        (of > 0 && 2 * n > of).then_some((n, of))
    }
}

/// Publishes each new snapshot on `reflex/<robot>/status`, checking every `poll`;
/// `extras` adds what the loop does not know: the recorder's dropped steps and the rejected
/// messages of each key the actor reads.
pub fn spawn_publisher(
    session: zenoh::Session,
    keys: Keys,
    mut reader: Reader<LoopStatus>,
    poll: Duration,
    extras: StatusExtras,
) -> StatusPublisher {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let thread = std::thread::Builder::new()
        .name("status".into())
        .spawn(move || {
            let publisher = match session.declare_publisher(keys.status.clone()).wait() {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!("cannot publish status on {}: {e}", keys.status);
                    return;
                }
            };
            let mut holds = HoldLog::default();
            let mut clips = ClipWindow::default();
            let stop_now = |x: &Option<Arc<StopSwitch>>| x.as_ref().map(|s| (s.state(), s.raises()));
            let mut last_stop = stop_now(&extras.stop);
            let mut last_put = std::time::Instant::now();
            while !s.load(Ordering::Relaxed) {
                let fresh = reader.update();
                let stop = stop_now(&extras.stop);
                // A new snapshot, a change of the e-stop, or a heartbeat every second (the loop
                // may be busy in a reset: watchers must still see the stop and the actor alive).
                if fresh || stop != last_stop || last_put.elapsed() >= Duration::from_secs(1) {
                    last_stop = stop;
                    last_put = std::time::Instant::now();
                    // The loop cannot log (formatting allocates); this thread logs for it.
                    // Holds are warned once as they start (`HoldLog`); routine clipping (a
                    // step or the tool kept inside its limit) is summarised per episode by the
                    // actor and warned here only when it goes on and on.
                    let now = reader.get().safety;
                    let ticks = reader.get().figures.ticks;
                    if fresh {
                        // Only a new snapshot says whether a hold goes on: a heartbeat or an
                        // e-stop change republishes the old one, which would end it falsely.
                        holds.update(&keys.robot, &now);
                    }
                    if let Some((n, of)) = clips.update(&now, ticks) {
                        tracing::warn!(
                            "safety on `{}`: the limits clipped {n} of the last {of} steps; if the policy keeps pushing past them, check [safety] (max_joint_step_rad, max_ee_step_m, workspace)",
                            keys.robot
                        );
                    }
                    let mut m = reflex_runtime::status::to_msg(&keys.robot, reader.get());
                    if let Some(r) = &extras.recorder_dropped {
                        m.recorder_dropped = r();
                    }
                    m.rejected = extras.rejected();
                    if let Some(c) = &extras.cameras {
                        m.cameras = c();
                    }
                    if let Some(sw) = &extras.stop {
                        fill_stop(&mut m, sw);
                    }
                    if let Some(p) = &extras.learner {
                        let lag = p.lag();
                        let offered = p.offered.load(Ordering::Relaxed);
                        m.learner = Some(msg::LearnerLag {
                            offered,
                            taken: offered - lag,
                        });
                    }
                    if let Err(e) = publisher.put(msg::encode(&m)).wait() {
                        tracing::warn!("status on {}: {e}", keys.status);
                    }
                }
                std::thread::sleep(poll);
            }
        })
        .expect("spawn the status thread");
    StatusPublisher {
        stop,
        thread: Some(thread),
    }
}

/// The e-stop's state, count and who acted last, from the switch itself.
pub fn fill_stop(m: &mut msg::StatusMsg, sw: &StopSwitch) {
    let state = sw.state();
    m.stop = state;
    m.figures.estops = sw.raises();
    m.estop_raised_unix_ns = sw.last_raised_unix_ns();
    m.stop_by = match state {
        StopState::Latched => sw.raised_by(),
        StopState::Paused => sw.released_resumed_by().0,
        StopState::Running => sw.released_resumed_by().1,
    };
}

/// Logs the loop's holds for it, once each: a hold (stale observations, a stale policy, a
/// non-finite action...) is warned when it starts, its further ticks are counted, and one line
/// says how long it lasted when it ends (the first snapshot with no new tick of it). The
/// e-stop's held ticks are not warned at all: the raise is, where it happens (the bus's event,
/// ROS 2's `estop`), naming who raised it and how to release it; here it is counted and
/// summarised on release.
///
/// Why: every status snapshot with new held ticks used to warn again, so a latched e-stop
/// logged a warning five times a second for as long as it was latched.
#[derive(Default)]
struct HoldLog {
    last: reflex_runtime::safety::SafetyCounters,
    /// Per kind: the counter when the hold in progress started, and the snapshots since that
    /// were not warned; `None` when it is not holding.
    open: [Option<(u64, u64)>; SafetyEvent::ALL.len()],
    /// Warnings logged.
    warned: u64,
    /// Snapshots with new held ticks that were counted, not warned.
    repeats: u64,
}

impl HoldLog {
    fn update(&mut self, robot: &str, now: &reflex_runtime::safety::SafetyCounters) {
        for (i, e) in SafetyEvent::ALL.iter().enumerate() {
            if e.is_clip() {
                continue;
            }
            let d = now.0[i].saturating_sub(self.last.0[i]);
            match (&mut self.open[i], d > 0) {
                (None, true) => {
                    self.open[i] = Some((self.last.0[i], 0));
                    if *e != SafetyEvent::Estop {
                        self.warned += 1;
                        tracing::warn!(
                            "safety on `{robot}`: {} x {} (total {}): the robot holds; further ticks are counted, not warned, until it ends",
                            d,
                            e.name(),
                            now.0[i]
                        );
                    }
                }
                (Some((_, quiet)), true) => {
                    *quiet += 1;
                    self.repeats += 1;
                }
                (Some((start, quiet)), false) => {
                    let (held, quiet) = (now.0[i] - *start, *quiet);
                    self.open[i] = None;
                    tracing::info!(
                        "safety on `{robot}`: {} held the robot for {held} ticks ({quiet} status snapshots not warned; total {})",
                        e.name(),
                        now.0[i]
                    );
                }
                (None, false) => {}
            }
        }
        self.last = *now;
    }
}

impl Drop for StatusPublisher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reflex_runtime::safety::SafetyCounters;

    fn with(e: SafetyEvent, n: u64) -> SafetyCounters {
        let mut c = SafetyCounters::default();
        c.0[SafetyEvent::ALL.iter().position(|x| *x == e).unwrap()] = n;
        c
    }

    #[test]
    fn a_latched_estop_is_not_warned_five_times_a_second() {
        // The issue: 10 s latched at 20 Hz, a status snapshot every 200 ms, each with 4 new
        // e-stop ticks, each warned. The raise was warned where it happened; here it is counted.
        let mut log = HoldLog::default();
        for k in 1..=50 {
            log.update("arm", &with(SafetyEvent::Estop, 4 * k));
        }
        assert_eq!(
            log.warned, 0,
            "the raise is warned where it happens, not per snapshot"
        );
        assert_eq!(log.repeats, 49, "every later snapshot counted");
        // Released: the hold ends, and the next latch is a new one.
        log.update("arm", &with(SafetyEvent::Estop, 200));
        assert!(log.open.iter().all(Option::is_none));
        log.update("arm", &with(SafetyEvent::Estop, 204));
        assert!(log.open[0].is_some());
    }

    #[test]
    fn a_hold_is_warned_once_when_it_starts_and_again_only_after_it_ended() {
        let mut log = HoldLog::default();
        for k in 1..=30 {
            log.update("arm", &with(SafetyEvent::ObsStale, 10 * k));
        }
        assert_eq!((log.warned, log.repeats), (1, 29));
        log.update("arm", &with(SafetyEvent::ObsStale, 300));
        log.update("arm", &with(SafetyEvent::ObsStale, 301));
        assert_eq!(log.warned, 2, "a new hold after the first ended");
    }
}
