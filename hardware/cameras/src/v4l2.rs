//! USB and other Linux cameras through V4L2 (the `linuxvideo` crate: ioctls through libc, no
//! system headers or bindgen at build time), and their discovery.
//!
//! Capture streams from the driver's memory-mapped buffers: each frame's bytes are copied into
//! the capture thread's buffer (its capacity kept) and the buffer handed straight back to the
//! driver, MJPEG or YUYV as the config asks. A camera that stops is noticed within a second (the
//! stream is polled, never waited on without bound), so the capture thread can always be stopped.
//!
//! Not run on this project's CI machine: it has no camera and no v4l2loopback module. What is
//! tested here is discovery on a machine without cameras and the errors for a device that is not
//! a camera; the frame path after the copy is the file camera's, tested with recorded frames.

use crate::pixels::PixelFormat;
use crate::{CameraConfig, CameraError, FrameSource};
use linuxvideo::format::{FrameIntervals, FrameSizes, PixFormat};
use linuxvideo::stream::ReadStream;
use linuxvideo::{BufType, CapabilityFlags, Device, Fract};
use serde::Serialize;
use std::time::{Duration, Instant};

/// A V4L2 capture stream.
pub struct V4l2Camera {
    device: String,
    stream: ReadStream,
    format: PixelFormat,
    size: (u32, u32),
}

fn fourcc(f: PixelFormat) -> Option<linuxvideo::format::PixelFormat> {
    match f {
        PixelFormat::Mjpeg => Some(linuxvideo::format::PixelFormat::MJPG),
        PixelFormat::Yuyv => Some(linuxvideo::format::PixelFormat::YUYV),
        PixelFormat::Rgb8 => None,
    }
}

/// What to do about an error opening a device.
fn open_hint(e: &std::io::Error) -> &'static str {
    // ENOTTY: the file answers no V4L2 ioctl.
    if e.raw_os_error() == Some(25) {
        return " (not a V4L2 device: `reflex hw cameras` lists the cameras)";
    }
    match e.kind() {
        std::io::ErrorKind::PermissionDenied => {
            " (this user may not open it: add it to the `video` group, `sudo usermod -aG video $USER`, then log in again)"
        }
        std::io::ErrorKind::NotFound => " (no such device: `reflex hw cameras` lists the cameras)",
        _ => "",
    }
}

impl V4l2Camera {
    /// Opens the camera `cfg.device` at the config's size, format and rate.
    pub fn open(cfg: &CameraConfig) -> Result<Self, CameraError> {
        let bad = |m: String| CameraError::Open {
            device: cfg.device.clone(),
            message: m,
        };
        let want = fourcc(cfg.format).ok_or_else(|| {
            bad("V4L2 cameras send `mjpeg` or `yuyv`; set `format` to one of them".into())
        })?;
        let dev = Device::open(&cfg.device).map_err(|e| bad(format!("{e}{}", open_hint(&e))))?;
        let caps = dev
            .capabilities()
            .map_err(|e| bad(format!("not a V4L2 device: {e}")))?;
        let flags = caps.device_capabilities();
        if !flags.contains(CapabilityFlags::VIDEO_CAPTURE)
            || !flags.contains(CapabilityFlags::STREAMING)
        {
            return Err(bad(format!(
                "`{}` ({}) does not stream video captures; `reflex hw cameras` lists the devices that do",
                caps.card(),
                caps.driver()
            )));
        }
        let capture = dev
            .video_capture(PixFormat::new(cfg.width, cfg.height, want))
            .map_err(|e| {
                bad(format!(
                    "cannot set {}x{} {:?}: {e}",
                    cfg.width, cfg.height, cfg.format
                ))
            })?;
        let got = capture.format();
        if (got.width(), got.height(), got.pixel_format()) != (cfg.width, cfg.height, want) {
            return Err(bad(format!(
                "asked for {}x{} {want}, the driver offers {}x{} {}; `reflex hw cameras` lists the sizes and formats it supports",
                cfg.width,
                cfg.height,
                got.width(),
                got.height(),
                got.pixel_format()
            )));
        }
        let fps = cfg.fps.round().max(1.0) as u32;
        if let Ok(set) = capture.set_frame_interval(Fract::new(1, fps))
            && set.numerator() > 0
            && (set.denominator() as f64 / set.numerator() as f64 - cfg.fps).abs() > 0.5
        {
            tracing::warn!(
                "camera {}: asked for {} fps, the driver chose {}/{} s per frame",
                cfg.device,
                cfg.fps,
                set.numerator(),
                set.denominator()
            );
        }
        let stream = capture
            .into_stream()
            .map_err(|e| bad(format!("cannot start streaming: {e}")))?;
        Ok(V4l2Camera {
            device: cfg.device.clone(),
            stream,
            format: cfg.format,
            size: (cfg.width, cfg.height),
        })
    }
}

impl FrameSource for V4l2Camera {
    fn describe(&self) -> String {
        format!("V4L2 camera {}", self.device)
    }

    fn format(&self) -> (PixelFormat, u32, u32) {
        (self.format, self.size.0, self.size.1)
    }

    fn next_frame(&mut self, buf: &mut Vec<u8>) -> Result<(), CameraError> {
        let t0 = Instant::now();
        loop {
            match self.stream.will_block() {
                Ok(false) => break,
                Ok(true) if t0.elapsed() > Duration::from_secs(1) => {
                    return Err(CameraError::Frame(format!(
                        "no frame from {} for a second",
                        self.device
                    )));
                }
                // Paces the poll of the driver's buffers (a frame every 33 ms at 30 fps).
                Ok(true) => std::thread::sleep(Duration::from_millis(2)),
                Err(e) => return Err(CameraError::Frame(format!("{}: {e}", self.device))),
            }
        }
        self.stream
            .dequeue(|view| {
                if view.is_error() {
                    return Err(std::io::Error::other("the driver marked the frame corrupt"));
                }
                buf.clear();
                buf.extend_from_slice(&view);
                Ok(())
            })
            .map_err(|e| CameraError::Frame(format!("{}: {e}", self.device)))
    }
}

/// A size a camera offers for a format, with its frame rates.
#[derive(Clone, Debug, Serialize)]
pub struct SizeInfo {
    /// px.
    pub width: u32,
    /// px.
    pub height: u32,
    /// Frames per second offered at this size (the fastest first).
    pub fps: Vec<f64>,
}

/// A format a camera offers.
#[derive(Clone, Debug, Serialize)]
pub struct FormatInfo {
    /// The FourCC (`MJPG`, `YUYV`, ...).
    pub fourcc: String,
    /// The driver's description.
    pub description: String,
    /// What reflex calls it in a camera table (`mjpeg`, `yuyv`), when reflex decodes it.
    pub reflex_format: Option<String>,
    /// Sizes (discrete ones; for stepwise or continuous ranges, the largest).
    pub sizes: Vec<SizeInfo>,
}

/// One V4L2 device as discovery found it.
#[derive(Clone, Debug, Serialize)]
pub struct CameraInfo {
    /// `/dev/videoN`.
    pub path: String,
    /// The card's name.
    pub card: String,
    /// The driver.
    pub driver: String,
    /// Where it is plugged in.
    pub bus_info: String,
    /// Whether it captures video by streaming (what reflex needs).
    pub captures: bool,
    /// Formats, sizes and rates offered.
    pub formats: Vec<FormatInfo>,
    /// Why it could not be opened or queried, if so (with what to do).
    pub error: Option<String>,
}

/// Every `/dev/video*` device, with what it offers; a machine without cameras gives an empty
/// list, a device this user may not open an entry that says so.
pub fn list_cameras() -> Vec<CameraInfo> {
    let mut paths: Vec<std::path::PathBuf> = std::fs::read_dir("/dev")
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("video"))
                })
                .collect()
        })
        .unwrap_or_default();
    paths.sort();
    paths
        .iter()
        .map(|p| {
            // linuxvideo asserts on driver answers it does not know (an unknown frame-size
            // type): one odd device must not take the whole listing down.
            std::panic::catch_unwind(|| describe(p)).unwrap_or_else(|_| CameraInfo {
                path: p.display().to_string(),
                card: String::new(),
                driver: String::new(),
                bus_info: String::new(),
                captures: false,
                formats: Vec::new(),
                error: Some(
                    "its driver answered a format query in a way the V4L2 library does not know"
                        .into(),
                ),
            })
        })
        .collect()
}

fn describe(path: &std::path::Path) -> CameraInfo {
    let mut info = CameraInfo {
        path: path.display().to_string(),
        card: String::new(),
        driver: String::new(),
        bus_info: String::new(),
        captures: false,
        formats: Vec::new(),
        error: None,
    };
    let dev = match Device::open(path) {
        Ok(d) => d,
        Err(e) => {
            info.error = Some(format!("{e}{}", open_hint(&e)));
            return info;
        }
    };
    match dev.capabilities() {
        Ok(caps) => {
            info.card = caps.card().to_string();
            info.driver = caps.driver().to_string();
            info.bus_info = caps.bus_info().to_string();
            let f = caps.device_capabilities();
            info.captures = f.contains(CapabilityFlags::VIDEO_CAPTURE)
                && f.contains(CapabilityFlags::STREAMING);
        }
        Err(e) => {
            info.error = Some(format!("not a V4L2 device: {e}"));
            return info;
        }
    }
    if !info.captures {
        return info;
    }
    for desc in dev.formats(BufType::VIDEO_CAPTURE).flatten() {
        let pf = desc.pixel_format();
        let reflex_format = if pf == linuxvideo::format::PixelFormat::MJPG {
            Some("mjpeg".to_string())
        } else if pf == linuxvideo::format::PixelFormat::YUYV {
            Some("yuyv".to_string())
        } else {
            None
        };
        let sizes: Vec<(u32, u32)> = match dev.frame_sizes(pf) {
            Ok(FrameSizes::Discrete(list)) => {
                list.iter().map(|s| (s.width(), s.height())).collect()
            }
            Ok(other) => vec![(other.max_width(), other.max_height())],
            Err(_) => Vec::new(),
        };
        let sizes = sizes
            .into_iter()
            .map(|(width, height)| {
                let mut fps: Vec<f64> = match dev.frame_intervals(pf, width, height) {
                    Ok(FrameIntervals::Discrete(list)) => list
                        .iter()
                        .map(|i| i.fract())
                        .filter(|f| f.numerator() > 0)
                        .map(|f| f.denominator() as f64 / f.numerator() as f64)
                        .collect(),
                    Ok(other) => {
                        let f = other.min();
                        if f.numerator() > 0 {
                            vec![f.denominator() as f64 / f.numerator() as f64]
                        } else {
                            Vec::new()
                        }
                    }
                    Err(_) => Vec::new(),
                };
                fps.sort_by(|a, b| b.total_cmp(a));
                SizeInfo { width, height, fps }
            })
            .collect();
        info.formats.push(FormatInfo {
            fourcc: pf.to_string(),
            description: desc.description().to_string(),
            reflex_format,
            sizes,
        });
    }
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_lists_only_video_devices_and_says_why_one_cannot_be_used() {
        // This machine has no camera: discovery is an empty list, not an error. Where cameras
        // exist, each entry has a path under /dev and either a card or an error.
        for c in list_cameras() {
            assert!(c.path.starts_with("/dev/video"), "{c:?}");
            assert!(!c.card.is_empty() || c.error.is_some(), "{c:?}");
        }
        // A file that is not a device is refused with what is wrong.
        let not_a_camera =
            CameraConfig::new("front", "/dev/null", (640, 480), 30.0, PixelFormat::Mjpeg);
        let e = V4l2Camera::open(&not_a_camera)
            .err()
            .expect("/dev/null is no camera")
            .to_string();
        assert!(
            e.contains("/dev/null") && e.contains("not a V4L2 device"),
            "{e}"
        );
        let e = V4l2Camera::open(&CameraConfig {
            device: "/dev/video-missing".into(),
            ..not_a_camera.clone()
        })
        .err()
        .expect("missing")
        .to_string();
        assert!(e.contains("reflex hw cameras"), "{e}");
        let e = V4l2Camera::open(&CameraConfig {
            format: PixelFormat::Rgb8,
            ..not_a_camera
        })
        .err()
        .expect("rgb8")
        .to_string();
        assert!(e.contains("`mjpeg` or `yuyv`"), "{e}");
    }
}
