//! `reflex estop`: a robot's emergency stop from any computer on its bus.

use crate::cli::{BusArgs, print_json};
use clap::Args;
use std::time::Duration;

/// What `reflex estop` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EstopAction {
    /// Latch the e-stop: the robot holds, the episode ends, nothing starts.
    Raise,
    /// Release the latched e-stop of every holder (the robot's server, its actor): the robot
    /// stays still (paused).
    Release,
    /// Resume a paused run: the next episode starts.
    Resume,
}

#[derive(Args)]
pub struct EstopArgs {
    /// raise (the default), release or resume.
    #[arg(value_enum, default_value = "raise")]
    action: EstopAction,
    /// The robot's name on the bus.
    #[arg(long)]
    robot: String,
    /// Who acts, shown in the robot's status and log (default: user@host).
    #[arg(long = "as", value_name = "NAME")]
    who: Option<String>,
    /// How long to wait for every holder of the robot's e-stop (its server, its actor) to
    /// confirm, s.
    #[arg(long, default_value_t = 5.0, value_parser = crate::cli::seconds)]
    wait_s: f64,
    /// Print the confirming reports as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    bus: BusArgs,
}

pub fn estop(a: EstopArgs) -> anyhow::Result<()> {
    use reflex_contracts::stop::StopAct;
    let act = match a.action {
        EstopAction::Raise => StopAct::Raise,
        EstopAction::Release => StopAct::Release,
        EstopAction::Resume => StopAct::Resume,
    };
    let who = a.who.clone().unwrap_or_else(|| {
        let user = std::env::var("USER").unwrap_or_else(|_| "someone".into());
        let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
        format!("{user}@{}", host.trim())
    });
    // A client of the robot's bus: its one link carries the act (see `reflex_bus::Mode`).
    let mut bus = a.bus.config();
    bus.mode = reflex_bus::Mode::Client;
    let session = bus.open()?;
    let out = reflex_tools::operator::act(
        &session,
        &a.robot,
        act,
        &who,
        Duration::from_secs_f64(a.wait_s),
    )?;
    if a.json {
        print_json(&out);
    } else {
        let next = match act {
            StopAct::Raise => format!(
                "the robot holds; release with `reflex estop release --robot {}`",
                a.robot
            ),
            StopAct::Release => format!(
                "nothing moves until `reflex estop resume --robot {}`",
                a.robot
            ),
            StopAct::Resume => "the next episode starts".to_string(),
        };
        // Each holder's count and who acted: a served robot's server and its actor count the
        // e-stops each heard, so they differ when the actor started later.
        let who: Vec<String> = out
            .holders
            .iter()
            .map(|h| format!("{}: e-stop {}, by {}", h.holder, h.estops, h.stop_by))
            .collect();
        println!(
            "`{}`: e-stop {} ({}): {next}",
            out.robot,
            out.state,
            who.join("; ")
        );
    }
    Ok(())
}
