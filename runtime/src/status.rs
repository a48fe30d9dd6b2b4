//! The loop's status without touching the loop: the loop writes a snapshot into a triple buffer
//! at a low rate; another thread reads it (reflex-bus publishes it as `reflex/<robot>/status`).

use crate::control::LoopStatus;
use crate::msg::{PROTOCOL_VERSION, StatusMsg};
use crate::safety::SafetyEvent;
use crate::triple::{Reader, Writer, triple};

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
        rejected: Vec::new(),
        stop: s.stop.as_str().to_string(),
        estops: s.estops,
        stop_by: String::new(),
        estop_raised_unix_ns: 0,
    }
}

/// A status channel: give the writer to the loop, the reader to [`spawn_publisher`].
pub fn status_channel() -> (Writer<LoopStatus>, Reader<LoopStatus>) {
    triple(LoopStatus::default())
}
