//! reflex-cameras: cameras on the robot. A capture thread per camera hands the newest frame to
//! whoever drives the robot without ever making it wait.
//!
//! - [`CameraConfig`]: a `[[arm.cameras]]` table (name, device, size, rate, format, crop, resize,
//!   timeout), validated with errors that name the key;
//! - [`FrameSource`]: where frames come from. [`FileCamera`] plays a folder of images; V4L2
//!   capture of a USB camera is not built yet ([`CameraConfig::open`] says so);
//! - [`Capture`]: the thread that decodes ([`pixels`]: MJPEG, YUYV, RGB), crops and resizes each
//!   frame into one of three preallocated frames (a triple buffer) and stamps it with its arrival
//!   time on the loop's clock; [`Capture::latest`] takes the newest without blocking, and
//!   [`Capture::is_stale`] says when the camera has stopped delivering (the robot then holds).

pub mod file;
pub mod pixels;
pub mod recorded;
pub mod v4l2;

pub use file::FileCamera;
pub use pixels::{PixelFormat, Roi};
pub use recorded::EpisodeCamera;
#[cfg(feature = "video")]
pub use recorded::VideoCamera;

use reflex_calibration::camera::{CameraModel, UndistortMap};
use reflex_calibration::hand_eye::HandEyeFile;
use reflex_contracts::config::{Invalid, Validate, in_range};
use reflex_contracts::msg::{CameraMount, CameraSpec, Image};
use reflex_runtime::triple::{Reader, Writer, triple};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Why a camera cannot be used, or a frame not read.
#[derive(Debug, thiserror::Error)]
pub enum CameraError {
    /// The device could not be opened or configured.
    #[error("camera `{device}`: {message}")]
    Open {
        /// The device as configured.
        device: String,
        /// What went wrong and what to do.
        message: String,
    },
    /// One frame could not be read or decoded (the camera goes on).
    #[error("{0}")]
    Frame(String),
}

/// Where frames come from.
pub trait FrameSource: Send {
    /// What the source is, for messages (`file camera /data/frames`, `/dev/video0`).
    fn describe(&self) -> String;
    /// The encoding and size of the frames [`FrameSource::next_frame`] returns.
    fn format(&self) -> (PixelFormat, u32, u32);
    /// Waits for the next frame and puts its bytes in `buf` (cleared first; its capacity is
    /// kept from frame to frame). Returns at least every second or so, with a frame or an
    /// error, so that the capture thread can be stopped.
    fn next_frame(&mut self, buf: &mut Vec<u8>) -> Result<(), CameraError>;
}

/// Prefix of a [`CameraConfig::device`] that names something recorded: a folder of images, an
/// H.264 or AV1 MP4 video, or a recorded episode (`files:EPISODE.msgpack`, or `#CAMERA` after it for
/// another camera's frames than the one of the config's name).
pub const FILES_PREFIX: &str = "files:";

/// A camera of the robot: `[[cameras]]` in the robot's config.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CameraConfig {
    /// Name, as policies and recordings know it (`front`, `wrist`).
    pub name: String,
    /// `/dev/video0` or `/dev/v4l/by-id/...` (V4L2); or `files:DIR` for a folder of images,
    /// `files:VIDEO.mp4` for an H.264 or AV1 video, `files:EPISODE.msgpack[#CAMERA]` for a camera's
    /// frames of a recorded episode.
    pub device: String,
    /// Width the camera captures at, pixels.
    pub width: u32,
    /// Height the camera captures at, pixels.
    pub height: u32,
    /// Frames per second.
    pub fps: f64,
    /// What the camera sends (V4L2); a file camera's frames say it themselves.
    #[serde(default)]
    pub format: PixelFormat,
    /// The region of each frame the policy sees, in captured pixels (`{ x, y, w, h }`).
    #[serde(default)]
    pub crop: Option<Roi>,
    /// The size the (cropped) frame is scaled to, `[width, height]`.
    #[serde(default)]
    pub resize: Option<[u32; 2]>,
    /// A camera whose newest frame is older than this is stale: the robot holds, ms.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: f64,
    /// A file camera's frames round and round (true), or once and then newer files as another
    /// program writes them into the folder (false).
    #[serde(default = "default_repeat")]
    pub repeat: bool,
    /// The camera's lens from `reflex calibrate camera` (OpenCV's YAML, or JSON), at the capture
    /// size or one of the same shape: its pinhole goes into the robot spec (and recordings).
    #[serde(default)]
    pub intrinsics: Option<std::path::PathBuf>,
    /// Take the lens's distortion out of every frame before crop and resize (needs
    /// `intrinsics`); the spec's pinhole is then exact.
    #[serde(default)]
    pub undistort: bool,
    /// Where the camera sits, from `reflex calibrate hand-eye` (its JSON result): the mount goes
    /// into the robot spec, so recordings draw the camera where it is.
    #[serde(default)]
    pub hand_eye: Option<std::path::PathBuf>,
}

/// A camera's calibration as its config names it, loaded and checked.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CameraCalibration {
    /// The lens at the capture size.
    pub lens: Option<CameraModel>,
    /// Where the camera sits.
    pub mount: Option<CameraMount>,
}

fn default_repeat() -> bool {
    true
}

fn default_timeout_ms() -> f64 {
    500.0
}

impl CameraConfig {
    /// A camera with the config's defaults: no crop, resize or calibration, a 500 ms timeout,
    /// a file camera's frames round and round.
    pub fn new(
        name: &str,
        device: &str,
        (width, height): (u32, u32),
        fps: f64,
        format: PixelFormat,
    ) -> Self {
        CameraConfig {
            name: name.into(),
            device: device.into(),
            width,
            height,
            fps,
            format,
            crop: None,
            resize: None,
            timeout_ms: default_timeout_ms(),
            repeat: default_repeat(),
            intrinsics: None,
            undistort: false,
            hand_eye: None,
        }
    }

    /// The size of the frames handed on: the resize, else the crop, else the capture size.
    pub fn output_size(&self) -> (u32, u32) {
        match (self.resize, self.crop) {
            (Some([w, h]), _) => (w, h),
            (None, Some(r)) => (r.w, r.h),
            (None, None) => (self.width, self.height),
        }
    }

    /// A black frame of this camera's output size, as observations and the capture's buffers
    /// start.
    pub fn blank_image(&self) -> Image {
        let (width, height) = self.output_size();
        Image {
            camera: self.name.clone(),
            width,
            height,
            encoding: "rgb8".into(),
            seq: 0,
            age_ns: 0,
            data: vec![0; (width * height * 3) as usize],
        }
    }

    /// The camera as a robot spec lists it (its output size), without its calibration.
    pub fn spec(&self) -> CameraSpec {
        self.spec_calibrated(&CameraCalibration::default())
    }

    /// The camera as a robot spec lists it, with the pinhole of its output frames (the lens's,
    /// moved by the crop and scaled by the resize) and its mount.
    pub fn spec_calibrated(&self, cal: &CameraCalibration) -> CameraSpec {
        let (width, height) = self.output_size();
        let intrinsics = cal.lens.map(|lens| {
            let roi = self.crop.unwrap_or(Roi::full(self.width, self.height));
            let (sx, sy) = (width as f64 / roi.w as f64, height as f64 / roi.h as f64);
            // Pixel centres at integers: a region's edge is at -0.5.
            [
                lens.fx * sx,
                lens.fy * sy,
                (lens.cx - roi.x as f64 + 0.5) * sx - 0.5,
                (lens.cy - roi.y as f64 + 0.5) * sy - 0.5,
            ]
        });
        CameraSpec {
            name: self.name.clone(),
            width,
            height,
            intrinsics,
            mount: cal.mount.clone(),
        }
    }

    /// Loads the files `intrinsics` and `hand_eye` name; the lens is scaled to the capture size
    /// when it was calibrated at another size of the same shape.
    pub fn load_calibration(&self) -> Result<CameraCalibration, CameraError> {
        let bad = |m: String| CameraError::Open {
            device: self.device.clone(),
            message: m,
        };
        let lens = match &self.intrinsics {
            None => None,
            Some(p) => {
                let lens = CameraModel::load(p).map_err(|e| bad(e.to_string()))?;
                let same_shape = (lens.width as f64 * self.height as f64
                    - lens.height as f64 * self.width as f64)
                    .abs()
                    <= 0.005 * (lens.width as f64 * self.height as f64);
                if (lens.width, lens.height) == (self.width, self.height) {
                    Some(lens)
                } else if same_shape {
                    Some(lens.scaled(self.width, self.height))
                } else {
                    return Err(bad(format!(
                        "`{}` was calibrated at {}x{}, the camera captures {}x{} (another shape); calibrate it at the capture size",
                        p.display(),
                        lens.width,
                        lens.height,
                        self.width,
                        self.height
                    )));
                }
            }
        };
        let mount = match &self.hand_eye {
            None => None,
            Some(p) => {
                let f = HandEyeFile::load(p).map_err(|e| bad(e.to_string()))?;
                Some(CameraMount {
                    parent: f.parent,
                    translation_m: f.camera.translation_m,
                    rotation_xyzw: f.camera.rotation_xyzw,
                })
            }
        };
        Ok(CameraCalibration { lens, mount })
    }

    /// Opens the device: something recorded (`files:...`) or a V4L2 camera.
    pub fn open(&self) -> Result<Box<dyn FrameSource>, CameraError> {
        let source: Box<dyn FrameSource> = match self.device.strip_prefix(FILES_PREFIX) {
            Some(what) => self.open_recorded(what)?,
            None => Box::new(v4l2::V4l2Camera::open(self)?),
        };
        let (_, w, h) = source.format();
        if (w, h) != (self.width, self.height) {
            return Err(CameraError::Open {
                device: self.device.clone(),
                message: format!(
                    "it delivers {w}x{h} frames, the config says width = {}, height = {}",
                    self.width, self.height
                ),
            });
        }
        Ok(source)
    }
}

impl CameraConfig {
    /// A folder of images, an MP4 video or a recorded episode's frames, by what `what` names.
    fn open_recorded(&self, what: &str) -> Result<Box<dyn FrameSource>, CameraError> {
        let (path, camera) = match what.rsplit_once('#') {
            Some((p, c)) if p.ends_with(".msgpack") => (std::path::Path::new(p), c),
            _ => (std::path::Path::new(what), self.name.as_str()),
        };
        let ext = path
            .extension()
            .and_then(|x| x.to_str())
            .map(str::to_ascii_lowercase);
        Ok(match ext.as_deref() {
            _ if path.is_dir() => Box::new(FileCamera::open(path, self.fps, self.repeat)?),
            #[cfg(feature = "video")]
            Some("mp4") => Box::new(VideoCamera::open(path, self.fps, self.repeat)?),
            #[cfg(not(feature = "video"))]
            Some("mp4") => {
                return Err(CameraError::Open {
                    device: self.device.clone(),
                    message: format!(
                        "`{}`: this build plays no video (the robot's build leaves out the video \
                         decoders, feature `video`): play a folder of images or a recorded episode",
                        path.display()
                    ),
                });
            }
            Some("msgpack") => Box::new(EpisodeCamera::open(path, camera, self.fps, self.repeat)?),
            _ => {
                return Err(CameraError::Open {
                    device: self.device.clone(),
                    message: format!(
                        "`{}` is not a folder of PNG or JPEG images, an H.264 or AV1 `.mp4` video or a \
                         recorded episode (`.msgpack`)",
                        path.display()
                    ),
                });
            }
        })
    }
}

impl Validate for CameraConfig {
    fn validate(&self, p: &str) -> Result<(), Invalid> {
        let bad = |field: &str, value: String, allowed: &str| Invalid {
            key: format!("{p}.{field}"),
            value,
            allowed: allowed.into(),
        };
        if self.name.is_empty()
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(bad(
                "name",
                format!("{:?}", self.name),
                "letters, digits, `_` and `-`, not empty",
            ));
        }
        in_range(p, "width", self.width, 1, 8192)?;
        in_range(p, "height", self.height, 1, 8192)?;
        in_range(p, "fps", self.fps, 0.1, 1000.0)?;
        in_range(p, "timeout_ms", self.timeout_ms, 1.0, 60_000.0)?;
        if let Some(r) = self.crop
            && !r.fits(self.width, self.height)
        {
            return Err(bad(
                "crop",
                format!("{{ x = {}, y = {}, w = {}, h = {} }}", r.x, r.y, r.w, r.h),
                &format!(
                    "a non-empty region inside the {}x{} frame",
                    self.width, self.height
                ),
            ));
        }
        if let Some([w, h]) = self.resize
            && (!(1..=4096).contains(&w) || !(1..=4096).contains(&h))
        {
            return Err(bad(
                "resize",
                format!("[{w}, {h}]"),
                "[width, height], each 1 to 4096",
            ));
        }
        if self.undistort && self.intrinsics.is_none() {
            return Err(bad(
                "undistort",
                "true".into(),
                "false, or name the lens in `intrinsics` (reflex calibrate camera's file)",
            ));
        }
        if self.format == PixelFormat::Yuyv && !self.width.is_multiple_of(2) {
            return Err(bad(
                "width",
                self.width.to_string(),
                "an even width for YUYV",
            ));
        }
        Ok(())
    }
}

/// Validates `[[cameras]]`: each table, and names that differ.
pub fn validate_cameras(cameras: &[CameraConfig], prefix: &str) -> Result<(), Invalid> {
    for (i, c) in cameras.iter().enumerate() {
        let p = format!("{prefix}[{i}]");
        c.validate(&p)?;
        if cameras[..i].iter().any(|o| o.name == c.name) {
            return Err(Invalid {
                key: format!("{p}.name"),
                value: format!("{:?}", c.name),
                allowed: "a name no other camera has".into(),
            });
        }
    }
    Ok(())
}

/// One frame as handed on: RGB at the camera's output size.
#[derive(Clone, Debug)]
pub struct Frame {
    /// Frames captured before and including this one (1 for the first; 0: none yet).
    pub seq: u64,
    /// When it arrived, on the clock that started at the capture's `epoch` (the loop's clock).
    pub captured: Duration,
    /// The pixels (`rgb8`).
    pub image: Image,
}

#[derive(Default)]
struct Counters {
    frames: AtomicU64,
    errors: AtomicU64,
    last_error: Mutex<String>,
    /// Reader side (written by the robot's thread, read by anyone): frames taken, frames
    /// replaced unseen, the age of the frame last taken in microseconds.
    used: AtomicU64,
    skipped: AtomicU64,
    age_at_use_us: AtomicU64,
}

/// A camera's counters, readable from any thread while the robot's thread captures (for the
/// status message).
#[derive(Clone)]
pub struct CameraMonitor {
    name: String,
    counters: Arc<Counters>,
    started: Instant,
}

impl CameraMonitor {
    /// Counters so far.
    pub fn stats(&self) -> CameraStats {
        let c = &self.counters;
        let frames = c.frames.load(Ordering::Relaxed);
        CameraStats {
            name: self.name.clone(),
            frames,
            used: c.used.load(Ordering::Relaxed),
            skipped: c.skipped.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            fps: frames as f64 / self.started.elapsed().as_secs_f64().max(1e-9),
            age_at_use_ms: c.age_at_use_us.load(Ordering::Relaxed) as f64 / 1e3,
            last_error: c.last_error.lock().expect("camera error").clone(),
        }
    }
}

/// How a camera has done, for the status message and the run's report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CameraStats {
    /// Camera name.
    pub name: String,
    /// Frames captured.
    pub frames: u64,
    /// Frames taken by the reader.
    pub used: u64,
    /// Frames captured that no reader took (a newer one replaced them first).
    pub skipped: u64,
    /// Frames that could not be read or decoded.
    pub errors: u64,
    /// Frames captured per second since the capture started.
    pub fps: f64,
    /// Age of the newest frame when it was last taken, ms.
    pub age_at_use_ms: f64,
    /// The last error, if any.
    pub last_error: String,
}

/// A camera's capture thread and the reader's end of its newest frame.
pub struct Capture {
    name: String,
    timeout: Duration,
    reader: Reader<Frame>,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    started: Instant,
    seen: u64,
}

struct Worker {
    source: Box<dyn FrameSource>,
    format: PixelFormat,
    size: (u32, u32),
    roi: Roi,
    out: (u32, u32),
    epoch: Instant,
    writer: Writer<Frame>,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
    /// The lens's map to a pinhole, when the config asks to undistort.
    undistort: Option<UndistortMap>,
}

impl Worker {
    fn run(mut self) {
        let (w, h) = self.size;
        let mut raw = Vec::with_capacity((w * h * 3) as usize);
        let mut rgb = vec![0u8; (w * h * 3) as usize];
        let mut jpeg = Vec::new();
        let mut straight = match self.undistort {
            Some(_) => vec![0u8; (w * h * 3) as usize],
            None => Vec::new(),
        };
        let mut seq = 0;
        while !self.stop.load(Ordering::Relaxed) {
            let got = self.source.next_frame(&mut raw);
            let captured = self.epoch.elapsed();
            let decoded = got.and_then(|()| match self.format {
                PixelFormat::Rgb8 if raw.len() == rgb.len() => {
                    rgb.copy_from_slice(&raw);
                    Ok(())
                }
                PixelFormat::Rgb8 => Err(CameraError::Frame(format!(
                    "an RGB frame of {} bytes where {w}x{h} needs {}",
                    raw.len(),
                    rgb.len()
                ))),
                PixelFormat::Yuyv => pixels::yuyv_to_rgb(&raw, w, h, &mut rgb),
                PixelFormat::Mjpeg => pixels::mjpeg_to_rgb(&raw, w, h, &mut rgb, &mut jpeg),
            });
            if let Err(e) = decoded {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                *self.counters.last_error.lock().expect("camera error") = e.to_string();
                continue;
            }
            seq += 1;
            let frame = match &self.undistort {
                Some(map) => {
                    map.apply_rgb(&rgb, &mut straight);
                    &straight
                }
                None => &rgb,
            };
            let slot = self.writer.slot();
            pixels::crop_resize(
                frame,
                w,
                h,
                self.roi,
                &mut slot.image.data,
                self.out.0,
                self.out.1,
            );
            slot.seq = seq;
            slot.captured = captured;
            self.writer.publish();
            self.counters.frames.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Capture {
    /// Starts capturing from `source` as `cfg` says; frame times count from `epoch`.
    pub fn spawn(
        cfg: &CameraConfig,
        source: Box<dyn FrameSource>,
        epoch: Instant,
    ) -> Result<Capture, CameraError> {
        let (format, w, h) = source.format();
        let roi = cfg.crop.unwrap_or(Roi::full(w, h));
        if !roi.fits(w, h) {
            return Err(CameraError::Open {
                device: cfg.device.clone(),
                message: format!("crop {roi:?} does not fit its {w}x{h} frames"),
            });
        }
        let out = cfg.output_size();
        let (writer, reader) = triple(Frame {
            seq: 0,
            captured: Duration::ZERO,
            image: cfg.blank_image(),
        });
        let undistort = if cfg.undistort {
            let lens = cfg
                .load_calibration()?
                .lens
                .ok_or_else(|| CameraError::Open {
                    device: cfg.device.clone(),
                    message: "undistort = true needs `intrinsics`".into(),
                })?;
            let lens = lens.scaled(w, h);
            Some(UndistortMap::new(
                &lens,
                &CameraModel {
                    dist: [0.0; 5],
                    ..lens
                },
            ))
        } else {
            None
        };
        let counters = Arc::new(Counters::default());
        let stop = Arc::new(AtomicBool::new(false));
        let worker = Worker {
            undistort,
            source,
            format,
            size: (w, h),
            roi,
            out,
            epoch,
            writer,
            counters: counters.clone(),
            stop: stop.clone(),
        };
        let thread = std::thread::Builder::new()
            .name(format!("camera-{}", cfg.name))
            .spawn(move || worker.run())
            .map_err(|e| CameraError::Open {
                device: cfg.device.clone(),
                message: format!("cannot start its capture thread: {e}"),
            })?;
        Ok(Capture {
            name: cfg.name.clone(),
            timeout: Duration::from_secs_f64(cfg.timeout_ms / 1e3),
            reader,
            counters,
            stop,
            thread: Some(thread),
            started: Instant::now(),
            seen: 0,
        })
    }

    /// The camera's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The newest frame if it arrived since the last call (else `None`), without waiting; what
    /// a caller that keeps its own copy needs, so that an unchanged frame is not copied again.
    pub fn newer(&mut self, now: Duration) -> Option<&Frame> {
        let before = self.seen;
        match self.latest(now) {
            Some(f) if f.seq != before => Some(f),
            _ => None,
        }
    }

    /// Takes the newest frame without waiting; `None` until the first frame. `now` is the
    /// loop's time, for the frame's age at use. Allocates nothing.
    pub fn latest(&mut self, now: Duration) -> Option<&Frame> {
        let c = &self.counters;
        if self.reader.update() {
            let seq = self.reader.get().seq;
            c.skipped
                .fetch_add(seq.saturating_sub(self.seen + 1), Ordering::Relaxed);
            self.seen = seq;
            c.used.fetch_add(1, Ordering::Relaxed);
        }
        if self.seen == 0 {
            return None;
        }
        let f = self.reader.get();
        let age = now.saturating_sub(f.captured).as_micros() as u64;
        c.age_at_use_us.store(age, Ordering::Relaxed);
        Some(f)
    }

    /// When the newest frame taken was captured, on the clock the capture was started with
    /// (`None` before the first).
    pub fn captured(&self) -> Option<Duration> {
        (self.seen != 0).then(|| self.reader.get().captured)
    }

    /// Whether the newest frame taken is older than the camera's timeout at `now` (or none has
    /// come): the robot should hold. Call after [`Capture::latest`].
    pub fn is_stale(&self, now: Duration) -> bool {
        self.seen == 0 || now.saturating_sub(self.reader.get().captured) > self.timeout
    }

    /// Counters so far.
    pub fn stats(&self) -> CameraStats {
        self.monitor().stats()
    }

    /// A handle on the counters for another thread.
    pub fn monitor(&self) -> CameraMonitor {
        CameraMonitor {
            name: self.name.clone(),
            counters: self.counters.clone(),
            started: self.started,
        }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests;
