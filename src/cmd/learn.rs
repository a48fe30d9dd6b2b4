//! `reflex learn --config F`: the learner as its own process, for an actor started with the
//! same config file, or for a fleet of robots (`--robot`, `[learner] fleet`).

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
    /// Serve these robots at once (repeatable; `*` for every robot on the bus): one replay,
    /// one weights stream. Overrides `[learner] fleet`; by default the config's robot.
    #[arg(long = "robot", value_name = "NAME")]
    robots: Vec<String>,
    /// Run Zenoh in router mode: robots on other networks connect to this learner's --listen
    /// endpoints and reach it (and each other's learner traffic) through it (docs/deploy.md).
    #[arg(long)]
    router: bool,
    /// Stop when every actor has gone (their liveliness tokens) and everything they sent is
    /// checkpointed.
    #[arg(long)]
    exit_when_actor_leaves: bool,
    /// Stop after this many seconds.
    #[arg(long, value_parser = crate::cli::seconds)]
    seconds: Option<f64>,
    /// How long to wait for the actor's spec, s.
    #[arg(long, default_value_t = 600.0, value_parser = crate::cli::seconds)]
    wait_s: f64,
    /// Print a JSON summary at the end.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    bus: BusArgs,
}

pub fn run(a: LearnArgs) -> anyhow::Result<()> {
    let mut cfg = RunConfig::load(&a.config)?;
    let mut extra = a.bus.config();
    if a.router {
        extra.mode = reflex_bus::Mode::Router;
    }
    let mut bus = cfg.bus_config(&extra);
    // [bus.access] guards the robot's key space in the actor; the learner receives the actor's
    // steps and must not filter them by the robot's rules.
    bus.access = None;
    let session = bus.open()?;
    if !a.robots.is_empty()
        && let Some(l) = cfg.learner.as_mut()
    {
        l.fleet = a.robots.clone();
    }
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
            "learner for {}: {} steps received ({} duplicates dropped, {} gaps refused, {} refused as another spec), {} episodes, weights v{}, checkpoint {}",
            r.fleet,
            r.received,
            r.duplicates_dropped,
            r.gaps_refused,
            r.refused_spec,
            r.episodes,
            r.weights_version,
            r.checkpoint
        );
        for x in &r.actors {
            println!(
                "  {} {}: received {}, persisted {}, behind {}",
                x.robot, x.actor, x.received, x.persisted, x.behind
            );
        }
    }
    Ok(())
}
