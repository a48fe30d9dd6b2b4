//! Publishing the loop's status on the bus without touching the loop: the loop writes a snapshot
//! into a triple buffer at a low rate; a thread here reads it and publishes
//! `reflex/<robot>/status`.

use crate::bus::Keys;
use crate::control::LoopStatus;
use crate::msg::{self, PROTOCOL_VERSION, StatusMsg};
use crate::safety::SafetyEvent;
use crate::triple::{Reader, Writer, triple};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;
use zenoh::Wait;

/// Converts a snapshot to the wire message.
pub fn to_msg(robot: &str, s: &LoopStatus) -> StatusMsg {
    StatusMsg {
        v: PROTOCOL_VERSION,
        robot: robot.to_string(),
        t_s: s.t_s,
        ticks: s.ticks,
        rate_hz: s.rate_hz,
        lateness_p50_us: s.lateness_p50_us,
        lateness_p99_us: s.lateness_p99_us,
        lateness_max_us: s.lateness_max_us,
        step_p99_us: s.step_p99_us,
        overruns: s.overruns,
        missed: s.missed,
        holds_no_chunk: s.holds_no_chunk,
        safety: SafetyEvent::ALL
            .iter()
            .map(|e| (e.name().to_string(), s.safety.get(*e)))
            .collect(),
        chunk_age_ms: s.chunk_age_ms,
        intervening: s.intervening,
        episode: s.episode,
        outbox_dropped: s.outbox_dropped,
        recorder_dropped: 0,
        residual_version: s.residual_version,
    }
}

/// A status channel: give the writer to the loop, the reader to [`spawn_publisher`].
pub fn status_channel() -> (Writer<LoopStatus>, Reader<LoopStatus>) {
    triple(LoopStatus::default())
}

/// A running status publisher.
pub struct StatusPublisher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Publishes each new snapshot on `reflex/<robot>/status`, checking every `poll`.
pub fn spawn_publisher(
    session: zenoh::Session,
    keys: Keys,
    mut reader: Reader<LoopStatus>,
    poll: Duration,
    recorder: Option<Arc<crate::recorder::RecorderStats>>,
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
            let mut last_safety = crate::safety::SafetyCounters::default();
            while !s.load(Ordering::Relaxed) {
                if reader.update() {
                    // The loop cannot log (formatting allocates); this thread logs for it.
                    let now = reader.get().safety;
                    for (i, e) in SafetyEvent::ALL.iter().enumerate() {
                        let d = now.0[i].saturating_sub(last_safety.0[i]);
                        if d > 0 {
                            tracing::warn!(
                                "safety on `{}`: {} x {} (total {})",
                                keys.robot,
                                d,
                                e.name(),
                                now.0[i]
                            );
                        }
                    }
                    last_safety = now;
                    let mut m = to_msg(&keys.robot, reader.get());
                    if let Some(r) = &recorder {
                        m.recorder_dropped = r.dropped.load(Ordering::Relaxed);
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

impl Drop for StatusPublisher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
