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
//! - [`stop`]: a run ended from another thread ([`stop::StopHandle`]); [`signals`]: SIGINT and
//!   SIGTERM as such requests; [`summary`]: a run's figures as one type.
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
pub mod stop;
pub mod summary;
pub mod tap;

pub use error::AgentError;
/// The run config (reflex-config), where the actor and the learner read it.
pub use reflex_config as config;
/// reflex's ONNX writer: a graph built in Rust (a controller as a base policy, a test model).
pub use reflex_policies::onnx_write;
pub use stop::StopHandle;
/// The Zenoh reflex is built with: [`actor::ActorBuilder::bus`] takes its `Session`.
pub use zenoh;

/// The front door: what a program that drives its own robot with reflex's loop, a base policy
/// on ONNX Runtime, the residual learner and the recorder needs, from this crate alone
/// (`use reflex_agent::prelude::*;`, runtime/agent/examples/toy_arm.rs).
pub mod prelude {
    pub use crate::AgentError;
    pub use crate::actor::{Actor, ActorBuilder, ClockChoice, LearnerSetup, RunReport};
    pub use crate::config::LearnerSection;
    pub use crate::progress::{Progress, Silent};
    pub use crate::stop::StopHandle;
    pub use reflex_contracts::prelude::*;
    pub use reflex_contracts::robot::check_action;
    pub use reflex_learn::sac::SacConfig;
    pub use reflex_policies::onnx_policy::OnnxPolicy;
    /// How ONNX Runtime runs a policy (threads, provider); not the actor's run options.
    pub use reflex_policies::onnx_policy::RunOptions as PolicyOptions;
    pub use reflex_policies::spec::PolicySpec;
    pub use reflex_runtime::control::EpisodeSummary;
}

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
