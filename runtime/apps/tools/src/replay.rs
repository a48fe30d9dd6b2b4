//! `reflex replay PATH`: open recordings in the Rerun viewer, or read their summaries.

use reflex_agent::{AgentError, error::Result};
use reflex_record::{Live, RERUN_VERSION};
use std::path::{Path, PathBuf};

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

/// The episode recordings at `path`: the file itself, or every `.rrd` in a directory, sorted.
pub fn episodes_in(path: &Path) -> Result<Vec<PathBuf>> {
    if path.is_dir() {
        let mut v: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| AgentError::io(path, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "rrd"))
            .collect();
        v.sort();
        if v.is_empty() {
            return Err(AgentError::setup(
                path.display().to_string(),
                "no .rrd recordings in it",
            ));
        }
        Ok(v)
    } else if path.exists() {
        Ok(vec![path.to_path_buf()])
    } else {
        Err(AgentError::setup(
            format!("recording `{}`", path.display()),
            "it does not exist",
        ))
    }
}

/// Every recording's JSON summary, with its file.
pub fn summaries(path: &Path) -> Result<Vec<(PathBuf, reflex_record::EpisodeFileSummary)>> {
    episodes_in(path)?
        .into_iter()
        .map(|f| {
            let s = reflex_record::read_summary(&f)?;
            Ok((f, s))
        })
        .collect()
}

/// Opens the recordings at `path` in the Rerun viewer and waits for it to close.
pub fn open(path: &Path) -> Result<()> {
    let files = episodes_in(path)?;
    let Some(viewer) = find_viewer() else {
        return Err(AgentError::setup(
            "the Rerun viewer",
            format!(
                "it is not installed. Install the version that reads these files ({RERUN_VERSION}) with \
                 `python3 -m pip install rerun-sdk=={RERUN_VERSION}` (or `cargo install rerun-cli@{RERUN_VERSION}`), \
                 or read the summary with `reflex replay --summary {}`",
                path.display()
            ),
        ));
    };
    let status = std::process::Command::new(&viewer)
        .args(&files)
        .status()
        .map_err(|e| AgentError::io(&viewer, e))?;
    if !status.success() {
        // Most often: no display to open a window on (a robot's computer over ssh).
        let display =
            std::env::var_os("DISPLAY").is_some() || std::env::var_os("WAYLAND_DISPLAY").is_some();
        return Err(AgentError::setup(
            viewer.display().to_string(),
            format!(
                "it exited with {status}{}; read the summary with `reflex replay --summary {}`, or copy the .rrd files to a computer with a screen",
                if display {
                    ""
                } else {
                    " (no DISPLAY or WAYLAND_DISPLAY: there is no screen to open a window on)"
                },
                path.display()
            ),
        ));
    }
    Ok(())
}

/// A live-view choice with the viewer program filled in when reflex can find one (PATH or the
/// project environment), so `--rerun spawn` works without activating the environment.
pub fn with_viewer(live: Live) -> Live {
    match live {
        Live::Spawn(None) => Live::Spawn(find_viewer()),
        other => other,
    }
}
