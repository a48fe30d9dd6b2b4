//! `reflex replay PATH`: open a recording in the Rerun viewer, or print its summary.

use anyhow::{Context, bail};
use clap::Args;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct ReplayArgs {
    /// An episode recording (`episode_NNNNNN.rrd`) or a directory of them.
    path: PathBuf,
    /// Print the episode's steps, return, success, takeovers and timing instead of opening a viewer.
    #[arg(long)]
    summary: bool,
}

/// The Rerun version whose viewer opens reflex's recordings (the rerun crate reflex is built with).
pub const RERUN_VERSION: &str = "0.36.3";

/// Finds the `rerun` viewer: on PATH, or in the project environment.
pub fn find_viewer() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("rerun"))
            .find(|c| c.is_file())
    });
    on_path.or_else(|| {
        reflex_policies::ort_env::default_roots()
            .into_iter()
            .map(|r| r.join(".venv/bin/rerun"))
            .find(|c| c.is_file())
    })
}

fn episodes_in(path: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if path.is_dir() {
        let mut v: Vec<PathBuf> = std::fs::read_dir(path)
            .with_context(|| format!("reading {}", path.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "rrd"))
            .collect();
        v.sort();
        if v.is_empty() {
            bail!("no .rrd recordings in {}", path.display());
        }
        Ok(v)
    } else if path.exists() {
        Ok(vec![path.to_path_buf()])
    } else {
        bail!("recording `{}` does not exist", path.display())
    }
}

pub fn run(a: ReplayArgs) -> anyhow::Result<()> {
    let files = episodes_in(&a.path)?;
    if a.summary {
        println!(
            "{:<22} {:>6} {:>7} {:>8} {:>9} {:>10} {:>12} {:>8}",
            "episode",
            "steps",
            "return",
            "success",
            "takeovers",
            "takeover",
            "lateness p99",
            "dropped"
        );
        println!(
            "{:<22} {:>6} {:>7} {:>8} {:>9} {:>10} {:>12} {:>8}",
            "", "", "", "", "", "steps", "us", "steps"
        );
        for f in &files {
            let s = reflex_runtime::recorder::read_summary(f).map_err(anyhow::Error::msg)?;
            println!(
                "{:<22} {:>6} {:>7.2} {:>8} {:>9} {:>10} {:>12.0} {:>8}",
                f.file_name()
                    .map(|n| n.to_string_lossy().to_string())
                    .unwrap_or_default(),
                s["steps"],
                s["return"].as_f64().unwrap_or(0.0),
                s["success"],
                s["interventions"],
                s["intervention_steps"],
                s["lateness_p99_us"].as_f64().unwrap_or(0.0),
                s["dropped_steps"]
            );
        }
        return Ok(());
    }
    let Some(viewer) = find_viewer() else {
        bail!(
            "the Rerun viewer is not installed. Install the version that reads these files ({RERUN_VERSION}) with \
             `python3 -m pip install rerun-sdk=={RERUN_VERSION}` (or `cargo install rerun-cli@{RERUN_VERSION}`), \
             or read the summary with `reflex replay --summary {}`",
            a.path.display()
        );
    };
    let status = std::process::Command::new(&viewer)
        .args(&files)
        .status()
        .with_context(|| format!("starting {}", viewer.display()))?;
    if !status.success() {
        bail!("{} exited with {status}", viewer.display());
    }
    Ok(())
}

/// A live-view choice with the viewer program filled in when reflex can find one (PATH or the
/// project environment), so `--rerun spawn` works without activating the environment.
pub fn with_viewer(live: reflex_runtime::recorder::Live) -> reflex_runtime::recorder::Live {
    match live {
        reflex_runtime::recorder::Live::Spawn(None) => {
            reflex_runtime::recorder::Live::Spawn(find_viewer())
        }
        other => other,
    }
}
