//! `reflex viz`: watch a robot over the bus in Rerun.

use crate::cli::{Bars, BusArgs, print_json};
use clap::Args;
use reflex_tools::viz::{VizOptions, VizTarget};
use std::path::PathBuf;

#[derive(Args)]
pub struct VizArgs {
    /// The robot's name on the bus (default: the robot of --config).
    #[arg(long, required_unless_present = "config")]
    robot: Option<String>,
    /// A config whose [robot] name and [bus] (endpoints, TLS) are used, e.g.
    /// configs/deploy/viewer.toml; flags given beside it win.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Where the stream goes: spawn (start a viewer), connect or connect=ADDR (a running viewer),
    /// save=DIR (episode files, no viewer).
    #[arg(long, default_value = "spawn")]
    rerun: String,
    /// Stop after this many episodes have ended (default: run until interrupted).
    #[arg(long, value_parser = crate::cli::count64)]
    episodes: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long, value_parser = crate::cli::seconds)]
    seconds: Option<f64>,
    /// How long to wait for the actor (or the robot) to answer, s.
    #[arg(long, default_value_t = 15.0, value_parser = crate::cli::seconds)]
    wait_s: f64,
    /// Print a JSON summary at the end.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    bus: BusArgs,
}

pub fn viz(a: VizArgs) -> anyhow::Result<()> {
    let target = VizTarget::parse(&a.rerun)?;
    let (robot, bus) = match &a.config {
        Some(path) => {
            let cfg = reflex_agent::config::RunConfig::load(path)?;
            let mut bus = cfg.bus_config(&a.bus.config());
            // Access rules guard a robot's own key space; a viewer enforces none.
            bus.access = None;
            (a.robot.clone().unwrap_or_else(|| cfg.robot_name()), bus)
        }
        None => (a.robot.clone().unwrap_or_default(), a.bus.config()),
    };
    let session = bus.open()?;
    let o = VizOptions {
        episodes: a.episodes,
        seconds: a.seconds,
        wait_s: a.wait_s,
    };
    let out = reflex_tools::viz::watch(&session, &robot, target, &o, &Bars::spinner(a.json))?;
    if a.json {
        print_json(&out);
    } else {
        println!(
            "watched `{}`: {} steps, {} episodes ended{}",
            out.robot,
            out.steps,
            out.episodes_ended,
            out.dir
                .as_deref()
                .map(|d| format!(", files in {d}"))
                .unwrap_or_default()
        );
    }
    Ok(())
}
