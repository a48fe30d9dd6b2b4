//! The LeRobot tools environment: a Python virtual environment (`.venv-lerobot`) with the
//! pinned LeRobot, torch and ONNX Runtime of policies/import/requirements.txt, made on first use.
//! torch stays there: nothing of it reaches reflex's binary or the robot.
//!
//! The requirements and the exporter are compiled into reflex, so the command works from any
//! folder; the environment is current when its copy of the requirements (written last, after
//! pip succeeded) equals reflex's. `make lerobot-tools` makes the same environment the same way.

use crate::ImportError;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// policies/import/requirements.txt, as this reflex was built with it.
pub const REQUIREMENTS: &str = include_str!("../../../../policies/import/requirements.txt");
/// policies/import/lerobot_export.py.
pub const EXPORTER: &str = include_str!("../../../../policies/import/lerobot_export.py");
/// The environment's folder name.
pub const DIR_NAME: &str = ".venv-lerobot";

/// LeRobot 0.6 refuses older interpreters.
const MIN_PYTHON: (u32, u32) = (3, 12);

/// A tools environment folder, made or not.
#[derive(Clone, Debug)]
pub struct ToolsEnv {
    dir: PathBuf,
}

impl ToolsEnv {
    /// The environment at `dir`, or where reflex looks by default: an existing `.venv-lerobot` in
    /// the current folder or one above it, else the reflex checkout the current folder is in
    /// (where `make lerobot-tools` puts it), else the current folder.
    pub fn locate(dir: Option<&Path>) -> Self {
        if let Some(d) = dir {
            return ToolsEnv { dir: d.into() };
        }
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
        let found = cwd
            .ancestors()
            .find(|a| a.join(DIR_NAME).join("bin/python").exists())
            .or_else(|| {
                cwd.ancestors()
                    .find(|a| a.join("policies/import/requirements.txt").is_file())
            })
            .unwrap_or(&cwd);
        ToolsEnv {
            dir: found.join(DIR_NAME),
        }
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its Python.
    pub fn python(&self) -> PathBuf {
        self.dir.join("bin/python")
    }

    fn marker(&self) -> PathBuf {
        self.dir.join("requirements.txt")
    }

    /// Whether it is made with this reflex's requirements.
    pub fn is_current(&self) -> bool {
        self.python().exists()
            && std::fs::read_to_string(self.marker()).is_ok_and(|m| m == REQUIREMENTS)
    }

    /// ONNX Runtime's shared library in the environment (the same release reflex loads), for a
    /// machine that has no other.
    pub fn onnxruntime(&self) -> Option<PathBuf> {
        let lib = self.dir.join("lib");
        let mut found = None;
        for py in std::fs::read_dir(&lib).ok()?.flatten() {
            let capi = py.path().join("site-packages/onnxruntime/capi");
            for f in std::fs::read_dir(&capi).into_iter().flatten().flatten() {
                if f.file_name()
                    .to_string_lossy()
                    .starts_with("libonnxruntime.so")
                {
                    found = Some(f.path());
                }
            }
        }
        found
    }

    /// Makes (or brings up to date) the environment with `python` (default: the first Python of
    /// version 3.12 or later found). pip's output goes to this process's stderr, so a person sees the
    /// download; stdout stays reflex's.
    ///
    /// # Errors
    /// [`ImportError::ToolsEnv`] saying what failed and how to make the environment by hand.
    pub fn create(&self, python: Option<&Path>) -> Result<(), ImportError> {
        let fail = |m: String| ImportError::ToolsEnv {
            dir: self.dir.display().to_string(),
            message: m,
        };
        if !self.python().exists() {
            let py = match python {
                Some(p) => {
                    if !python_ok(p) {
                        return Err(fail(format!(
                            "{} is not a Python >= {}.{} (LeRobot 0.6 needs it)",
                            p.display(),
                            MIN_PYTHON.0,
                            MIN_PYTHON.1
                        )));
                    }
                    p.to_path_buf()
                }
                None => find_python().ok_or_else(|| {
                    fail(format!(
                        "no Python >= {}.{} found (python3.12, python3.13, ~/.pyenv/versions/3.1x): \
                         LeRobot 0.6 needs one; install it and pass --python PATH",
                        MIN_PYTHON.0, MIN_PYTHON.1
                    ))
                })?,
            };
            run(
                Command::new(&py).arg("-m").arg("venv").arg(&self.dir),
                "python -m venv",
            )
            .map_err(fail)?;
        }
        let req = self.dir.join("requirements.pending.txt");
        std::fs::write(&req, REQUIREMENTS).map_err(|e| fail(format!("{}: {e}", req.display())))?;
        run(
            Command::new(self.python())
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--disable-pip-version-check",
                    "--progress-bar",
                    "off",
                    "-r",
                ])
                .arg(&req),
            "pip install",
        )
        .map_err(fail)?;
        // Written last: an interrupted install is made again next time.
        std::fs::rename(&req, self.marker())
            .map_err(|e| fail(format!("{}: {e}", self.marker().display())))?;
        Ok(())
    }
}

/// Runs `cmd` with its output on this process's stderr; the error names `what` and its status.
pub(super) fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let status = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::from(std::io::stderr()))
        .stderr(Stdio::inherit())
        .status()
        .map_err(|e| format!("{what} could not start: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what} failed ({status}); its output is above"))
    }
}

fn python_ok(p: &Path) -> bool {
    Command::new(p)
        .args([
            "-c",
            &format!(
                "import sys; sys.exit(sys.version_info < ({}, {}))",
                MIN_PYTHON.0, MIN_PYTHON.1
            ),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The first Python >= 3.12: on PATH by versioned name, then pyenv's installs (whose shims
/// refuse a version that is not selected), then `python3`.
fn find_python() -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = ["python3.12", "python3.13", "python3.14"]
        .iter()
        .map(PathBuf::from)
        .collect();
    if let Some(home) = std::env::var_os("HOME") {
        let versions = Path::new(&home).join(".pyenv/versions");
        let mut v: Vec<PathBuf> = std::fs::read_dir(&versions)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path().join("bin/python3"))
            .collect();
        v.sort();
        candidates.extend(v);
    }
    candidates.push("python3".into());
    candidates.into_iter().find(|p| python_ok(p))
}
