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
            let mut last_safety = reflex_runtime::safety::SafetyCounters::default();
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
                    // Holds and e-stops are warned at once; routine clipping (a step or the
                    // tool kept inside its limit) is summarised per episode by the actor and
                    // warned here only when it goes on and on.
                    let now = reader.get().safety;
                    let ticks = reader.get().figures.ticks;
                    for (i, e) in SafetyEvent::ALL.iter().enumerate() {
                        let d = now.0[i].saturating_sub(last_safety.0[i]);
                        if d > 0 && !e.is_clip() {
                            tracing::warn!(
                                "safety on `{}`: {} x {} (total {})",
                                keys.robot,
                                d,
                                e.name(),
                                now.0[i]
                            );
                        }
                    }
                    if let Some((n, of)) = clips.update(&now, ticks) {
                        tracing::warn!(
                            "safety on `{}`: the limits clipped {n} of the last {of} steps; if the policy keeps pushing past them, check [safety] (max_joint_step_rad, max_ee_step_m, workspace)",
                            keys.robot
                        );
                    }
                    last_safety = now;
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
    m.stop = state.as_str().to_string();
    m.figures.estops = sw.raises();
    m.estop_raised_unix_ns = sw.last_raised_unix_ns();
    m.stop_by = match state {
        StopState::Latched => sw.raised_by(),
        StopState::Paused => sw.released_resumed_by().0,
        StopState::Running => sw.released_resumed_by().1,
    };
}

impl Drop for StatusPublisher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
