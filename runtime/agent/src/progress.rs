//! Progress of long jobs, reported to whoever shows it (the command line draws bars; an
//! integrator may log, or ignore it). Calls are cheap and never block the job.

/// Receives progress; every method has a no-op default.
pub trait Progress: Send + Sync {
    /// A phase of `total` units named `what` starts (e.g. 100 "episodes").
    fn start(&self, _total: u64, _what: &str) {}
    /// `n` more units are done.
    fn inc(&self, _n: u64) {}
    /// A short status line for the current phase.
    fn message(&self, _msg: &str) {}
    /// The phase ended.
    fn finish(&self) {}
    /// A line to keep (a finished episode's summary), shown above whatever is in progress.
    fn line(&self, _msg: &str) {}
}

/// Shows nothing.
pub struct Silent;

impl Progress for Silent {}
