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
        figures: s.figures,
        safety: SafetyEvent::ALL
            .iter()
            .map(|e| (e.name().to_string(), s.safety.get(*e)))
            .collect(),
        recorder_dropped: 0,
        rejected: Vec::new(),
        stop: s.stop,
        stop_by: String::new(),
        estop_raised_unix_ns: 0,
        cameras: Vec::new(),
        learner: None,
    }
}

/// A status channel: give the writer to the loop, the reader to [`spawn_publisher`].
pub fn status_channel() -> (Writer<LoopStatus>, Reader<LoopStatus>) {
    triple(LoopStatus::default())
}
