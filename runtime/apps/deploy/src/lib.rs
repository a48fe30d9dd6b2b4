//! reflex-deploy: getting reflex onto a robot's computer and checking that computer.
//!
//! - [`bundle`]: one tarball with the binary, ONNX Runtime, models, configs, the systemd unit and
//!   an installer (`reflex bundle`);
//! - [`doctor`]: what this machine and this build can drive (`reflex doctor`), as a typed report.

pub mod bundle;
pub mod doctor;

/// Errors of packaging: each names the file or option at fault and what to do.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    /// Settings or files that do not fit together.
    #[error("{context}: {message}")]
    Setup {
        /// The file, command or option at fault.
        context: String,
        /// What is wrong and what to do.
        message: String,
    },
    /// A file or directory could not be read or written.
    #[error("`{path}`: {source}")]
    Io {
        /// The path at fault.
        path: String,
        /// The system's error.
        source: std::io::Error,
    },
}

impl DeployError {
    /// A [`DeployError::Setup`].
    pub fn setup(context: impl Into<String>, message: impl Into<String>) -> Self {
        DeployError::Setup {
            context: context.into(),
            message: message.into(),
        }
    }

    /// An I/O error at `path`.
    pub fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        DeployError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

/// Results of packaging.
pub type Result<T, E = DeployError> = std::result::Result<T, E>;
