//! Directories of a bench's own, removed when it ends, however it ends.
//!
//! A bench or the soak has nothing to finish cleanly: the first SIGINT or SIGTERM after a
//! [`Scratch`] directory is made removes every one still open and ends the process with status
//! 130. Before, a bench stopped with Ctrl-C left its TLS keys, checkpoints or encoder behind in
//! the temporary directory. Commands that must finish their work on a signal (`reflex run`,
//! `reflex hw serve`) do not use this.

use reflex_agent::error::AgentError;
use signal_hook::consts::{SIGINT, SIGTERM};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, Once, PoisonError};

static OPEN: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
static WATCH: Once = Once::new();

/// A directory under the system's temporary directory, removed on drop and on a signal.
#[derive(Debug)]
pub struct Scratch {
    path: PathBuf,
}

impl Scratch {
    /// Makes `<temporary directory>/<prefix>-<run id>`.
    pub fn new(prefix: &str) -> Result<Self, AgentError> {
        let path = std::env::temp_dir().join(reflex_agent::run_id(prefix));
        std::fs::create_dir_all(&path).map_err(|e| AgentError::io(&path, e))?;
        open().push(path.clone());
        WATCH.call_once(watch_signals);
        Ok(Scratch { path })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        open().retain(|p| p != &self.path);
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

fn open() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    OPEN.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A thread of signal-hook's takes SIGINT and SIGTERM (nothing runs inside a signal handler).
fn watch_signals() {
    let mut signals = match signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(
                "cannot take SIGINT/SIGTERM ({e}): a signal leaves this run's temporary directories behind"
            );
            return;
        }
    };
    let spawned = std::thread::Builder::new()
        .name("scratch".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                // Held to the end: nothing makes a new directory while these go.
                let dirs = open();
                for d in dirs.iter() {
                    let _ = std::fs::remove_dir_all(d);
                }
                let name = if sig == SIGINT { "SIGINT" } else { "SIGTERM" };
                eprintln!(
                    "{name}: stopped; removed this run's temporary directories ({})",
                    dirs.len()
                );
                std::process::exit(130);
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(
            "cannot watch for SIGINT/SIGTERM ({e}): a signal leaves this run's temporary directories behind"
        );
    }
}
