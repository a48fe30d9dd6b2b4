//! `reflex replay`: a recorded episode in the Rerun viewer, or its summary.

use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub struct ReplayArgs {
    /// An episode recording (`episode_NNNNNN.rrd`) or a directory of them.
    path: PathBuf,
    /// Print the episode's steps, return, success, takeovers and timing instead of opening a viewer.
    #[arg(long)]
    summary: bool,
}

pub fn replay(a: ReplayArgs) -> anyhow::Result<()> {
    if !a.summary {
        return Ok(reflex_tools::replay::open(&a.path)?);
    }
    let head = [
        "episode",
        "steps",
        "return",
        "success",
        "takeovers",
        "takeover",
        "lateness p99",
        "dropped",
    ];
    let unit = ["", "", "", "", "", "steps", "us", "steps"];
    for row in [head, unit] {
        println!(
            "{:<22} {:>6} {:>7} {:>8} {:>9} {:>10} {:>12} {:>8}",
            row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7]
        );
    }
    for (f, s) in reflex_tools::replay::summaries(&a.path)? {
        println!(
            "{:<22} {:>6} {:>7.2} {:>8} {:>9} {:>10} {:>12.0} {:>8}",
            f.file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_default(),
            s.steps,
            s.ret,
            s.success,
            s.interventions,
            s.intervention_steps,
            s.lateness_p99_us,
            s.dropped_steps
        );
    }
    Ok(())
}
