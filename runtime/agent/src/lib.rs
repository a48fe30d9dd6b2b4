//! reflex-agent: reflex as a library. An integrator embeds the actor (their robot, their policy,
//! reflex's loop, safety, bus, recorder and learner) and the learner service in their own
//! program; the `reflex` binary is a thin command line over this crate.
//!
//! - [`actor`]: [`actor::Actor`], built with [`actor::ActorBuilder`] from any
//!   [`reflex_contracts::robot::Robot`] and [`reflex_contracts::policy::Policy`], or from a run
//!   config ([`config::RunConfig`], what `reflex run` reads, parsed and checked by reflex-config)
//!   with [`actor::run_config`];
//! - [`learner`]: the residual (or full) SAC learner as a service on the bus, in its own process
//!   (`reflex learn`) or on a thread of the actor's;
//! - [`assemble`], [`presets`]: from the actor's steps to the learner's transitions (relabelling,
//!   RLIF, HIL-SERL routing) and the SAC settings the demo measured;
//! - `[robot.cameras]` and a success classifier's reward are reflex-adapters' robot wrappers;
//! - [`heldout`]: a policy judged alone on held-out seeds (`reflex eval`);
//! - [`signals`]: SIGINT and SIGTERM as stops; [`summary`]: a run's figures as one type.
//!
//! The commands around a run (serving, watching, replaying, teleop, the e-stop, policy tools) are
//! in reflex-tools.
//!
//! Long jobs report through [`progress::Progress`]; nothing here prints.

pub mod actor;
pub mod assemble;
pub mod error;
pub mod heldout;
pub mod learner;
pub mod presets;
pub mod progress;
pub mod signals;
pub mod summary;
pub mod tap;

pub use error::AgentError;
/// The run config (reflex-config), where the actor and the learner read it.
pub use reflex_config as config;

/// A run id that no other run on this machine has: the time in seconds and microseconds, the
/// process id and a per-process counter (two runs started in the same second get different ids).
pub fn run_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!(
        "{prefix}-{}-{:06}-{}-{}",
        now.as_secs(),
        now.subsec_micros(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn run_ids_started_together_never_collide() {
        let ids: std::collections::BTreeSet<String> =
            (0..1000).map(|_| super::run_id("run")).collect();
        assert_eq!(ids.len(), 1000);
    }
}
