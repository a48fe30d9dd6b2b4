//! [`StopHandle`]: ending a run from another thread (a signal, an embedder's UI, a supervisor)
//! without ending the process. This is not the e-stop: the e-stop
//! ([`reflex_contracts::stop::StopSwitch`], [`crate::actor::Actor::stop_switch`]) holds the robot
//! and latches; a stop handle ends the run, and the robot is then left as `[robot] on_exit` says.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Two requests shared by every clone: finish (end the run after the episode in progress, at
/// once while the e-stop holds the robot) and stop now (end it at the next control tick, the
/// episode in progress unfinished). Requests are never withdrawn.
#[derive(Clone, Debug, Default)]
pub struct StopHandle {
    finish: Arc<AtomicBool>,
    now: Arc<AtomicBool>,
}

impl StopHandle {
    /// A handle nobody has asked yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks the run to end after the episode in progress.
    pub fn finish(&self) {
        self.finish.store(true, Ordering::SeqCst);
    }

    /// Asks the run to end at the next control tick.
    pub fn stop_now(&self) {
        self.now.store(true, Ordering::SeqCst);
    }

    /// Whether [`StopHandle::finish`] (or [`StopHandle::stop_now`]) was asked.
    pub fn finish_asked(&self) -> bool {
        self.finish.load(Ordering::Relaxed) || self.now_asked()
    }

    /// Whether [`StopHandle::stop_now`] was asked.
    pub fn now_asked(&self) -> bool {
        self.now.load(Ordering::Relaxed)
    }

    /// The finish request as a flag, for the services that poll one (`reflex hw serve`).
    pub fn finish_flag(&self) -> &AtomicBool {
        &self.finish
    }
}

#[cfg(test)]
mod tests {
    use super::StopHandle;

    #[test]
    fn clones_share_the_requests_and_stop_now_implies_finish() {
        let h = StopHandle::new();
        let seen_by_the_run = h.clone();
        assert!(!seen_by_the_run.finish_asked() && !seen_by_the_run.now_asked());
        h.stop_now();
        assert!(seen_by_the_run.now_asked() && seen_by_the_run.finish_asked());
        let other = StopHandle::new();
        other.finish();
        assert!(other.finish_asked() && !other.now_asked());
    }
}
