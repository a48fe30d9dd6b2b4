//! `reflex learn --config F`: the learner as its own process, for an actor started with the
//! same config file.

use crate::cli::{Bars, BusArgs, print_json};
use anyhow::Context;
use clap::Args;
use reflex_agent::config::RunConfig;
use reflex_agent::learner::{LearnerConfig, ServeOptions, serve};
use std::path::PathBuf;

#[derive(Args)]
pub struct LearnArgs {
    /// The run config (the actor's); its `[learner]` table configures the learner.
    #[arg(long)]
    config: PathBuf,
    /// Stop when the actor has gone (its liveliness token) and everything it sent is checkpointed.
    #[arg(long)]
    exit_when_actor_leaves: bool,
    /// Stop after this many seconds.
    #[arg(long)]
    seconds: Option<f64>,
    /// How long to wait for the actor's spec, s.
    #[arg(long, default_value_t = 600.0)]
    wait_s: f64,
    /// Print a JSON summary at the end.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    bus: BusArgs,
}

pub fn run(a: LearnArgs) -> anyhow::Result<()> {
    let cfg = RunConfig::load(&a.config)?;
    let mut bus = cfg.bus_config(&a.bus.config());
    // [bus.access] guards the robot's key space in the actor; the learner receives the actor's
    // steps and must not filter them by the robot's rules.
    bus.access = None;
    let session = bus.open()?;
    let lc = LearnerConfig::from_run_config(&cfg)?;
    let o = ServeOptions {
        exit_when_actor_leaves: a.exit_when_actor_leaves,
        seconds: a.seconds,
        wait_s: a.wait_s,
        stop: None,
    };
    let r = serve(&session, &lc, &o, &Bars::spinner(a.json))
        .with_context(|| format!("learner for config `{}`", a.config.display()))?;
    if a.json {
        print_json(&r);
    } else {
        println!(
            "learner: {} steps received ({} duplicates dropped, {} gaps refused), {} episodes, weights v{}, checkpoint {}",
            r.received,
            r.duplicates_dropped,
            r.gaps_refused,
            r.episodes,
            r.weights_version,
            r.checkpoint
        );
    }
    Ok(())
}
