//! Recorded episodes on disk (`reflex sim demos`), read back by imitation training.
//!
//! A demo directory holds `manifest.json` and one MessagePack file per episode,
//! `episode_NNNNNN.msgpack`. Every file is written atomically, and the manifest is rewritten
//! after each episode, so a crash loses at most the episode in progress. The format is documented
//! in docs/sim.md; Python reads it with `msgpack` and `json`.

use reflex_contracts::msg::RobotSpec;
use reflex_runtime::fsio::atomic_write;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Version of the demo format.
pub const DEMO_FORMAT_VERSION: u16 = 1;

/// One episode.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Episode {
    /// Format version.
    pub v: u16,
    /// Index within the directory.
    pub index: u64,
    /// Seed the episode was reset with.
    pub seed: u64,
    /// The task reported success.
    pub success: bool,
    /// Sum of rewards.
    #[serde(rename = "return")]
    pub ret: f32,
    /// State vectors, `steps + 1` of them (the one after reset first).
    pub observations: Vec<Vec<f32>>,
    /// Actions, one per step, in the robot's action units.
    pub actions: Vec<Vec<f32>>,
    /// Reward after each step.
    pub rewards: Vec<f32>,
    /// The episode ended in a terminal state.
    pub terminated: bool,
    /// The episode hit its time limit.
    pub truncated: bool,
    /// Who acted at each step: 0 the policy, 1 a person (empty: not recorded, e.g. an expert's
    /// demonstrations).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub actors: Vec<u8>,
    /// The base policy's action at each step (with `actors`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub base_actions: Vec<Vec<f32>>,
    /// The residual added to it at each step (with `actors`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub residuals: Vec<Vec<f32>>,
    /// Camera frames, one stream per camera, each frame beside the observation of the same index
    /// (empty: recorded without cameras).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cameras: Vec<CameraStream>,
    /// A success classifier's probability after each step, when it gave the run's reward.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub success_scores: Vec<f32>,
    /// The observation each camera frame belongs to, strictly increasing, when the cameras were
    /// kept at some observations only (a run's step log keeps about 15 a second and the last);
    /// empty: one frame per observation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub frame_observations: Vec<u32>,
    /// The person's success (true) or failure (false) key that ended the episode, when one did;
    /// it overrides the robot's or a classifier's verdict on the last observation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub person_label: Option<bool>,
}

impl Episode {
    /// Frames each camera stream should hold.
    pub fn frame_count(&self) -> usize {
        if self.frame_observations.is_empty() {
            self.observations.len()
        } else {
            self.frame_observations.len()
        }
    }

    /// The observation frame `j` belongs to.
    pub fn frame_observation(&self, j: usize) -> usize {
        if self.frame_observations.is_empty() {
            j
        } else {
            self.frame_observations[j] as usize
        }
    }

    /// The frame to show at observation `i`: its own, else the newest before it, else the first
    /// (a sample-and-hold of sparsely kept frames, as a display would show them).
    pub fn frame_at(&self, i: usize) -> usize {
        if self.frame_observations.is_empty() {
            return i;
        }
        self.frame_observations
            .partition_point(|&o| o as usize <= i)
            .saturating_sub(1)
    }

    /// Checks every camera stream against the observations (and `frame_observations`); the
    /// error says which camera or index is wrong.
    pub fn check_cameras(&self) -> Result<(), String> {
        let n = self.observations.len();
        if let Some(w) = self
            .frame_observations
            .windows(2)
            .position(|w| w[0] >= w[1])
        {
            return Err(format!(
                "frame_observations are not increasing at index {}",
                w + 1
            ));
        }
        if let Some(&o) = self.frame_observations.last()
            && o as usize >= n
        {
            return Err(format!("frame_observations name observation {o} of {n}"));
        }
        for c in &self.cameras {
            c.check(self.frame_count())?;
        }
        Ok(())
    }
}

/// One camera's frames through an episode.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CameraStream {
    /// Camera name in the robot spec.
    pub camera: String,
    /// Width, pixels.
    pub width: u32,
    /// Height, pixels.
    pub height: u32,
    /// Pixel encoding of every frame (`rgb8`: row-major, 3 bytes a pixel).
    pub encoding: String,
    /// One frame per observation, `steps + 1` of them.
    pub frames: Vec<serde_bytes::ByteBuf>,
}

impl CameraStream {
    /// An empty stream for `camera`'s images of `width` x `height` rgb8.
    pub fn new(camera: &str, width: u32, height: u32) -> Self {
        CameraStream {
            camera: camera.into(),
            width,
            height,
            encoding: "rgb8".into(),
            frames: vec![],
        }
    }

    /// Appends a frame.
    pub fn push(&mut self, rgb: &[u8]) {
        self.frames.push(serde_bytes::ByteBuf::from(rgb.to_vec()));
    }

    /// Frame `i` as an image message (what a policy reads at run time).
    pub fn image(&self, i: usize) -> reflex_contracts::msg::Image {
        reflex_contracts::msg::Image {
            camera: self.camera.clone(),
            width: self.width,
            height: self.height,
            encoding: self.encoding.clone(),
            data: self.frames[i].to_vec(),
            seq: 0,
            age_ns: 0,
        }
    }

    /// Checks that every frame holds `width * height * 3` bytes of rgb8 and that there are
    /// `frames` of them (one per observation, or per entry of the episode's
    /// `frame_observations`); the error says which frame is wrong.
    pub fn check(&self, frames: usize) -> Result<(), String> {
        if self.encoding != "rgb8" {
            return Err(format!(
                "camera `{}`: encoding `{}`, only rgb8 is read",
                self.camera, self.encoding
            ));
        }
        if self.frames.len() != frames {
            return Err(format!(
                "camera `{}`: {} frames where the episode has {frames} (one per observation, or \
                 per entry of frame_observations)",
                self.camera,
                self.frames.len()
            ));
        }
        let n = self.width as usize * self.height as usize * 3;
        if let Some(i) = self.frames.iter().position(|f| f.len() != n) {
            return Err(format!(
                "camera `{}`: frame {i} holds {} bytes, a {}x{} rgb8 frame holds {n}",
                self.camera,
                self.frames[i].len(),
                self.width,
                self.height
            ));
        }
        Ok(())
    }
}

/// One line of the manifest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EpisodeEntry {
    /// Index.
    pub index: u64,
    /// File name within the directory.
    pub file: String,
    /// Reset seed.
    pub seed: u64,
    /// Steps taken.
    pub steps: u32,
    /// Success.
    pub success: bool,
    /// Sum of rewards.
    #[serde(rename = "return")]
    pub ret: f32,
}

/// `manifest.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always `reflex-demos`.
    pub format: String,
    /// Format version.
    pub version: u16,
    /// The robot the episodes were recorded on.
    pub spec: RobotSpec,
    /// The command line that made them.
    pub command: String,
    /// Episodes written so far.
    pub episodes: Vec<EpisodeEntry>,
}

/// Errors reading or writing demos; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// I/O on a file failed.
    #[error("demo file `{path}`: {source}")]
    Io {
        /// File at fault.
        path: String,
        /// Error.
        source: std::io::Error,
    },
    /// The directory holds no demonstrations.
    #[error(
        "`{dir}` holds no demonstrations (no manifest.json): `reflex sim demos --out DIR` writes them, and a run keeps its steps in `<run>/steps` when `reflex demo` or `reflex run --record RUNS` records it (not with --no-record)"
    )]
    Missing {
        /// The directory asked for.
        dir: String,
    },
    /// A file is not in the expected format.
    #[error("demo file `{path}` is not a reflex demo file: {message}")]
    Format {
        /// File at fault.
        path: String,
        /// What is wrong.
        message: String,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DemoError + '_ {
    move |source| DemoError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Writes episodes into a directory.
pub struct DemoWriter {
    dir: PathBuf,
    manifest: Manifest,
}

impl DemoWriter {
    /// Creates (or empties of manifest) `dir` for episodes of `spec`.
    pub fn create(dir: &Path, spec: &RobotSpec, command: &str) -> Result<Self, DemoError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let w = DemoWriter {
            dir: dir.to_path_buf(),
            manifest: Manifest {
                format: "reflex-demos".into(),
                version: DEMO_FORMAT_VERSION,
                spec: spec.clone(),
                command: command.into(),
                episodes: vec![],
            },
        };
        w.write_manifest()?;
        Ok(w)
    }

    fn write_manifest(&self) -> Result<(), DemoError> {
        let p = self.dir.join("manifest.json");
        let text = serde_json::to_vec_pretty(&self.manifest).expect("manifest serialises");
        atomic_write(&p, &text).map_err(io(&p))
    }

    /// Appends an episode (its `index` is assigned here).
    pub fn write(&mut self, ep: &mut Episode) -> Result<(), DemoError> {
        ep.v = DEMO_FORMAT_VERSION;
        ep.index = self.manifest.episodes.len() as u64;
        let file = format!("episode_{:06}.msgpack", ep.index);
        let p = self.dir.join(&file);
        let bytes = rmp_serde::to_vec_named(ep).expect("episode serialises");
        atomic_write(&p, &bytes).map_err(io(&p))?;
        self.manifest.episodes.push(EpisodeEntry {
            index: ep.index,
            file,
            seed: ep.seed,
            steps: ep.actions.len() as u32,
            success: ep.success,
            ret: ep.ret,
        });
        self.write_manifest()
    }

    /// The manifest so far.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }
}

/// Reads `manifest.json` of a demo directory.
pub fn read_manifest(dir: &Path) -> Result<Manifest, DemoError> {
    let p = dir.join("manifest.json");
    if !p.exists() {
        return Err(DemoError::Missing {
            dir: dir.display().to_string(),
        });
    }
    let text = std::fs::read(&p).map_err(io(&p))?;
    let m: Manifest = serde_json::from_slice(&text).map_err(|e| DemoError::Format {
        path: p.display().to_string(),
        message: e.to_string(),
    })?;
    if m.format != "reflex-demos" || m.version != DEMO_FORMAT_VERSION {
        return Err(DemoError::Format {
            path: p.display().to_string(),
            message: format!(
                "format `{}` version {}, expected `reflex-demos` version {DEMO_FORMAT_VERSION}",
                m.format, m.version
            ),
        });
    }
    Ok(m)
}

/// Reads one episode file.
pub fn read_episode(dir: &Path, entry: &EpisodeEntry) -> Result<Episode, DemoError> {
    let p = dir.join(&entry.file);
    let bytes = std::fs::read(&p).map_err(io(&p))?;
    let format = |message| DemoError::Format {
        path: p.display().to_string(),
        message,
    };
    let ep: Episode = rmp_serde::from_slice(&bytes).map_err(|e| format(e.to_string()))?;
    ep.check_cameras().map_err(format)?;
    Ok(ep)
}
