//! `reflex dataset export`: recorded episodes as a LeRobotDataset v3.0.

use crate::cli::print_json;
use clap::{Args, Subcommand, ValueEnum};
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum DatasetCommand {
    /// Write recorded episodes as a dataset other tools read (LeRobotDataset v3.0).
    Export(ExportArgs),
}

#[derive(Clone, Copy, ValueEnum)]
pub enum DatasetFormat {
    /// LeRobotDataset v3.0 (parquet data and metadata, info.json, stats.json).
    Lerobot,
}

#[derive(Args)]
pub struct ExportArgs {
    /// Recorded episodes: a directory written by `reflex sim demos`.
    #[arg(long, required_unless_present = "run", conflicts_with = "run")]
    demos: Option<PathBuf>,
    /// A run directory with recorded steps (`<run>/steps`, written by `reflex demo`).
    #[arg(long)]
    run: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value = "lerobot")]
    format: DatasetFormat,
    /// The dataset directory to create (new or empty).
    #[arg(long)]
    out: PathBuf,
    /// The task in words (default: the robot's kind).
    #[arg(long)]
    task: Option<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn dataset(cmd: DatasetCommand) -> anyhow::Result<()> {
    let DatasetCommand::Export(a) = cmd;
    let DatasetFormat::Lerobot = a.format;
    let demos = match (a.demos, a.run) {
        (Some(d), _) => d,
        (None, Some(r)) => r.join("steps"),
        (None, None) => anyhow::bail!("give --demos DIR or --run DIR"),
    };
    let r = reflex_data::dataset::export_lerobot(&reflex_data::dataset::ExportOptions {
        demos,
        out: a.out.clone(),
        task: a.task,
    })?;
    if a.json {
        print_json(&r);
    } else {
        println!(
            "wrote {} episodes, {} frames ({} data files; features {}) to {} (LeRobotDataset {})",
            r.episodes,
            r.frames,
            r.data_files,
            r.features.join(", "),
            a.out.display(),
            reflex_data::dataset::CODEBASE_VERSION
        );
    }
    Ok(())
}
