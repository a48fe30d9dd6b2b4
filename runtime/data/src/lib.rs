//! reflex-data: what reflex writes to disk and reads back, none of it on the control loop's
//! thread.
//!
//! - [`demos`]: reflex's episode format (`manifest.json` and one MessagePack file per episode),
//!   written by `reflex sim demos`, by the demo and by `reflex run --record`;
//! - [`steplog`]: every step of a run in that format, with who acted;
//! - `dataset` (feature `lerobot`): LeRobotDataset v3.0 out (`reflex dataset export`) and in
//!   (`reflex bc train --dataset`);
//! - `videos` (feature `lerobot`): the dataset's camera frames as H.264 MP4 video features, out
//!   and in;
//! - [`plot`]: learning curves and camera snapshots as PNG;
//! - [`rotate`]: a records directory kept within a size and an age.

#[cfg(feature = "lerobot")]
pub mod dataset;
pub mod demos;
pub mod plot;
pub mod rotate;
pub mod steplog;
#[cfg(feature = "lerobot")]
pub mod videos;

/// Errors of the data formats: each names the file or directory at fault.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A file or directory that is not what it should be, and what to do.
    #[error("{context}: {message}")]
    Invalid {
        /// The file, directory or key at fault.
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
    /// Recorded episodes.
    #[error(transparent)]
    Demos(#[from] demos::DemoError),
}

impl DataError {
    /// A [`DataError::Invalid`].
    pub fn invalid(context: impl Into<String>, message: impl Into<String>) -> Self {
        DataError::Invalid {
            context: context.into(),
            message: message.into(),
        }
    }

    /// An I/O error at `path`.
    pub fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        DataError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

/// Results of the data formats.
pub type Result<T, E = DataError> = std::result::Result<T, E>;
