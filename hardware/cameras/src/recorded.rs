//! Cameras that play something recorded: an H.264 or AV1 MP4 video (one of a LeRobot dataset's, or any
//! `ffmpeg -c:v libx264` file), or one camera's frames of an episode reflex recorded
//! (`reflex sim demos --cameras`, `episode_NNNNNN.msgpack`). Paced at the configured rate like a
//! camera, round and round, or once and then silent (the robot then sees a stale camera and
//! holds). For tests, for replaying what a camera saw, and for people without a camera.

use super::pixels::PixelFormat;
use super::{CameraError, FrameSource};
#[cfg(feature = "video")]
use reflex_video::VideoReader;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Frames one every period on a fixed schedule; a late frame moves the schedule on instead of
/// bursting to catch up, as a camera drops frames rather than queueing them.
#[derive(Debug)]
pub(crate) struct Pace {
    period: Duration,
    due: Option<Instant>,
}

impl Pace {
    /// One frame every `1 / fps` s; an error names `device` when the rate is not a positive
    /// number.
    pub(crate) fn new(fps: f64, device: &str) -> Result<Self, CameraError> {
        if !(fps > 0.0 && fps.is_finite()) {
            return Err(CameraError::Open {
                device: device.into(),
                message: format!("frame rate {fps} is not a positive number"),
            });
        }
        Ok(Pace {
            period: Duration::from_secs_f64(1.0 / fps),
            due: None,
        })
    }

    /// The time between frames.
    pub(crate) fn period(&self) -> Duration {
        self.period
    }

    /// Sleeps until the next frame is due.
    pub(crate) fn wait(&mut self) {
        let due = *self.due.get_or_insert_with(Instant::now);
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        self.due = Some((due + self.period).max(now));
    }

    /// Starts the schedule again at the next frame.
    pub(crate) fn restart(&mut self) {
        self.due = None;
    }
}

/// How a played-out recording answers: once a period, that it has ended.
fn played_out(pace: &mut Pace, what: &str) -> CameraError {
    pace.wait();
    CameraError::Frame(format!(
        "{what} has played out (set `repeat = true` to play it round and round)"
    ))
}

/// An H.264 or AV1 MP4 file played as a camera (feature `video`).
#[cfg(feature = "video")]
pub struct VideoCamera {
    path: PathBuf,
    reader: VideoReader,
    pace: Pace,
    repeat: bool,
    size: (u32, u32),
}

#[cfg(feature = "video")]
impl VideoCamera {
    /// Opens `path` to deliver `fps` frames a second (whatever rate it was recorded at), round
    /// and round (`repeat`) or once.
    pub fn open(path: &Path, fps: f64, repeat: bool) -> Result<Self, CameraError> {
        let device = path.display().to_string();
        let reader = VideoReader::open(path).map_err(|e| CameraError::Open {
            device: device.clone(),
            message: format!(
                "{} (a video file camera plays H.264 and AV1 MP4 files)",
                e.message
            ),
        })?;
        Ok(VideoCamera {
            path: path.to_path_buf(),
            size: reader.size(),
            reader,
            pace: Pace::new(fps, &device)?,
            repeat,
        })
    }

    /// Frames in the file.
    pub fn frames(&self) -> u32 {
        self.reader.frames()
    }
}

#[cfg(feature = "video")]
impl FrameSource for VideoCamera {
    fn describe(&self) -> String {
        format!("video file camera {}", self.path.display())
    }

    fn format(&self) -> (PixelFormat, u32, u32) {
        (PixelFormat::Rgb8, self.size.0, self.size.1)
    }

    fn next_frame(&mut self, buf: &mut Vec<u8>) -> Result<(), CameraError> {
        buf.resize(self.size.0 as usize * self.size.1 as usize * 3, 0);
        let bad = |e: reflex_video::VideoError| CameraError::Frame(e.to_string());
        let mut got = self.reader.next_frame(buf).map_err(bad)?;
        if got.is_none() && self.repeat {
            self.reader.rewind().map_err(bad)?;
            got = self.reader.next_frame(buf).map_err(bad)?;
        }
        if got.is_none() {
            let what = self.describe();
            return Err(played_out(&mut self.pace, &what));
        }
        // Decoding took part of the period; the wait covers the rest.
        self.pace.wait();
        Ok(())
    }
}

/// The part of reflex's episode file (runtime/data `demos::Episode`, MessagePack with named
/// fields) a camera needs: its frames.
#[derive(Deserialize)]
struct RecordedEpisode {
    #[serde(default)]
    cameras: Vec<RecordedStream>,
}

#[derive(Deserialize)]
struct RecordedStream {
    camera: String,
    width: u32,
    height: u32,
    encoding: String,
    frames: Vec<serde_bytes::ByteBuf>,
}

/// One camera's frames of a recorded episode played as a camera.
pub struct EpisodeCamera {
    path: PathBuf,
    camera: String,
    size: (u32, u32),
    frames: Vec<serde_bytes::ByteBuf>,
    next: usize,
    pace: Pace,
    repeat: bool,
}

impl EpisodeCamera {
    /// Opens camera `camera`'s frames of the episode file `path`.
    pub fn open(path: &Path, camera: &str, fps: f64, repeat: bool) -> Result<Self, CameraError> {
        let device = path.display().to_string();
        let open = |m: String| CameraError::Open {
            device: device.clone(),
            message: m,
        };
        let bytes = std::fs::read(path).map_err(|e| open(e.to_string()))?;
        let ep: RecordedEpisode = rmp_serde::from_slice(&bytes)
            .map_err(|e| open(format!("not an episode reflex recorded: {e}")))?;
        let names: Vec<String> = ep.cameras.iter().map(|s| s.camera.clone()).collect();
        let Some(s) = ep.cameras.into_iter().find(|s| s.camera == camera) else {
            return Err(open(format!(
                "it has no frames of camera `{camera}` (it has {names:?}; record with \
                 `reflex sim demos --cameras`, or pick one with `files:{device}#NAME`)"
            )));
        };
        let n = s.width as usize * s.height as usize * 3;
        if s.encoding != "rgb8" || s.frames.is_empty() || s.frames.iter().any(|f| f.len() != n) {
            return Err(open(format!(
                "camera `{camera}`: {} frames of encoding `{}`, not {}x{} rgb8 ones",
                s.frames.len(),
                s.encoding,
                s.width,
                s.height
            )));
        }
        Ok(EpisodeCamera {
            path: path.to_path_buf(),
            camera: camera.into(),
            size: (s.width, s.height),
            frames: s.frames,
            next: 0,
            pace: Pace::new(fps, &device)?,
            repeat,
        })
    }

    /// Frames in the episode.
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    /// Whether it has none (never true of an opened camera).
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }
}

impl FrameSource for EpisodeCamera {
    fn describe(&self) -> String {
        format!("episode camera {}#{}", self.path.display(), self.camera)
    }

    fn format(&self) -> (PixelFormat, u32, u32) {
        (PixelFormat::Rgb8, self.size.0, self.size.1)
    }

    fn next_frame(&mut self, buf: &mut Vec<u8>) -> Result<(), CameraError> {
        if self.next == self.frames.len() {
            if !self.repeat {
                let what = self.describe();
                return Err(played_out(&mut self.pace, &what));
            }
            self.next = 0;
        }
        self.pace.wait();
        buf.clear();
        buf.extend_from_slice(&self.frames[self.next]);
        self.next += 1;
        Ok(())
    }
}
