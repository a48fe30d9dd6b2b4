//! A camera made of image files: a folder of PNG or JPEG frames played in name order at the
//! configured rate, round and round; or, with `repeat = false`, played once while the folder is
//! watched for newer files (a folder another program writes frames into: each frame written
//! under another name and renamed, so that no half-written file is read). For tests and for
//! people without a camera; JPEG frames go through the same MJPEG decoder a USB camera's frames
//! do.

use super::pixels::{PixelFormat, jpeg_size};
use super::recorded::Pace;
use super::{CameraError, FrameSource};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Frames from a folder of `*.png` (decoded to RGB once, at open) or `*.jpg`/`*.jpeg` files
/// (kept as JPEG and decoded per frame like a camera's MJPEG).
pub struct FileCamera {
    dir: PathBuf,
    format: PixelFormat,
    size: (u32, u32),
    frames: Vec<Vec<u8>>,
    pace: Pace,
    next: usize,
    /// Round and round (true), or once, then newer files as they appear.
    repeat: bool,
    /// The last file loaded (the watch reads only files whose names sort after it).
    last: PathBuf,
}

/// Image files of a folder in name order.
fn image_paths(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension()
                .and_then(|x| x.to_str())
                .is_some_and(|x| matches!(x.to_ascii_lowercase().as_str(), "png" | "jpg" | "jpeg"))
        })
        .collect();
    paths.sort();
    Ok(paths)
}

fn png_rgb(path: &Path) -> Result<(u32, u32, Vec<u8>), CameraError> {
    let bad = |m: String| CameraError::Open {
        device: path.display().to_string(),
        message: m,
    };
    let file = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
    let mut dec = png::Decoder::new(std::io::BufReader::new(file));
    dec.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut r = dec.read_info().map_err(|e| bad(e.to_string()))?;
    let mut buf = vec![
        0;
        r.output_buffer_size()
            .ok_or_else(|| bad("too large".into()))?
    ];
    let info = r.next_frame(&mut buf).map_err(|e| bad(e.to_string()))?;
    let px = (info.width * info.height) as usize;
    let rgb = match info.color_type {
        png::ColorType::Rgb => buf[..px * 3].to_vec(),
        png::ColorType::Rgba => buf[..px * 4]
            .chunks_exact(4)
            .flat_map(|p| [p[0], p[1], p[2]])
            .collect(),
        png::ColorType::Grayscale => buf[..px].iter().flat_map(|g| [*g; 3]).collect(),
        png::ColorType::GrayscaleAlpha => buf[..px * 2]
            .chunks_exact(2)
            .flat_map(|p| [p[0]; 3])
            .collect(),
        other => return Err(bad(format!("PNG colour type {other:?} is not supported"))),
    };
    Ok((info.width, info.height, rgb))
}

/// Reads one PNG or JPEG file as RGB8: `(width, height, pixels)` (calibration images, snapshots).
pub fn read_image(path: &Path) -> Result<(u32, u32, Vec<u8>), CameraError> {
    let is_png = path
        .extension()
        .is_some_and(|x| x.eq_ignore_ascii_case("png"));
    if is_png {
        return png_rgb(path);
    }
    let bad = |m: String| CameraError::Open {
        device: path.display().to_string(),
        message: m,
    };
    let bytes = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let (w, h) = jpeg_size(&bytes).map_err(|e| bad(e.to_string()))?;
    let mut rgb = vec![0; (w * h * 3) as usize];
    super::pixels::mjpeg_to_rgb(&bytes, w, h, &mut rgb, &mut Vec::new())
        .map_err(|e| bad(e.to_string()))?;
    Ok((w, h, rgb))
}

impl FileCamera {
    /// Opens the folder `dir` as a camera delivering `fps` frames a second, round and round
    /// (`repeat`) or once and then newer files as they appear.
    pub fn open(dir: &Path, fps: f64, repeat: bool) -> Result<Self, CameraError> {
        let device = dir.display().to_string();
        let open_err = |m: String| CameraError::Open {
            device: device.clone(),
            message: m,
        };
        let paths = image_paths(dir).map_err(|e| {
            open_err(format!(
                "{e} (a file camera is a folder of PNG or JPEG images)"
            ))
        })?;
        if paths.is_empty() {
            return Err(open_err("no .png, .jpg or .jpeg files in it".into()));
        }
        let is_png = |p: &Path| p.extension().is_some_and(|x| x.eq_ignore_ascii_case("png"));
        let format = if is_png(&paths[0]) {
            PixelFormat::Rgb8
        } else {
            PixelFormat::Mjpeg
        };
        let mut frames = Vec::with_capacity(paths.len());
        let mut size = None;
        for p in &paths {
            if is_png(p) != (format == PixelFormat::Rgb8) {
                return Err(open_err(format!(
                    "`{}` mixes PNG and JPEG frames; keep one kind per folder",
                    p.display()
                )));
            }
            let (w, h, bytes) = if format == PixelFormat::Rgb8 {
                png_rgb(p)?
            } else {
                let bytes =
                    std::fs::read(p).map_err(|e| open_err(format!("{}: {e}", p.display())))?;
                let (w, h) =
                    jpeg_size(&bytes).map_err(|e| open_err(format!("{}: {e}", p.display())))?;
                (w, h, bytes)
            };
            if *size.get_or_insert((w, h)) != (w, h) {
                return Err(open_err(format!(
                    "`{}` is {w}x{h}, the frames before it {}x{}; a camera's frames share one size",
                    p.display(),
                    size.unwrap().0,
                    size.unwrap().1
                )));
            }
            frames.push(bytes);
        }
        Ok(FileCamera {
            dir: dir.to_path_buf(),
            format,
            size: size.expect("at least one frame"),
            frames,
            pace: Pace::new(fps, &device)?,
            next: 0,
            repeat,
            last: paths.last().cloned().expect("at least one frame"),
        })
    }

    /// Loads the files newer than the last one loaded (watch mode); their size and kind must
    /// match the camera's.
    fn load_newer(&mut self) -> Result<(), CameraError> {
        let bad = |m: String| CameraError::Frame(format!("{}: {m}", self.dir.display()));
        let mut paths = image_paths(&self.dir).map_err(|e| bad(e.to_string()))?;
        paths.retain(|p| *p > self.last);
        for p in paths {
            let (w, h, bytes) = match self.format {
                PixelFormat::Rgb8 => png_rgb(&p).map_err(|e| bad(e.to_string()))?,
                _ => {
                    let bytes = std::fs::read(&p).map_err(|e| bad(e.to_string()))?;
                    let (w, h) = jpeg_size(&bytes).map_err(|e| bad(e.to_string()))?;
                    (w, h, bytes)
                }
            };
            self.last = p.clone();
            if (w, h) != self.size {
                return Err(bad(format!(
                    "`{}` is {w}x{h}, the camera's frames {}x{}",
                    p.display(),
                    self.size.0,
                    self.size.1
                )));
            }
            self.frames.push(bytes);
        }
        Ok(())
    }

    /// Frames in the folder.
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    /// Whether the folder has no frames (never true of an opened camera).
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }
}

impl FrameSource for FileCamera {
    fn describe(&self) -> String {
        format!("file camera {}", self.dir.display())
    }

    fn format(&self) -> (PixelFormat, u32, u32) {
        (self.format, self.size.0, self.size.1)
    }

    fn next_frame(&mut self, buf: &mut Vec<u8>) -> Result<(), CameraError> {
        // Paces the frames as a camera would: one every period, on a fixed schedule.
        self.pace.wait();
        if !self.repeat && self.next == self.frames.len() {
            // Played out: wait for newer files, looking once a period, for up to a second.
            self.frames.clear();
            self.next = 0;
            let t0 = Instant::now();
            loop {
                self.load_newer()?;
                if !self.frames.is_empty() {
                    break;
                }
                if t0.elapsed() > Duration::from_secs(1) {
                    self.pace.restart();
                    return Err(CameraError::Frame(format!(
                        "no new image in {} for a second",
                        self.dir.display()
                    )));
                }
                // Paces the folder watch.
                std::thread::sleep(self.pace.period());
            }
        }
        buf.clear();
        buf.extend_from_slice(&self.frames[self.next]);
        self.next += 1;
        if self.repeat {
            self.next %= self.frames.len();
        }
        Ok(())
    }
}
