//! reflex-video: camera frames as video files, the way LeRobot datasets keep them.
//!
//! - [`VideoWriter`] encodes RGB frames as H.264 (Cisco's OpenH264, built from its bundled
//!   source) in an MP4 file: 4:2:0 chroma, BT.601 limited range (`yuv420p`, what LeRobot asks its
//!   encoders for) at a fixed quantiser, a key frame every `gop` frames (LeRobot's `g = 2` by default, so any frame
//!   decodes after at most one other), frame `k` presented at `k / fps` seconds.
//! - [`VideoReader`] reads an H.264 or AV1 MP4 (LeRobot's default codec, module `av1`) back
//!   frame by frame into RGB with each frame's presentation time; other codecs are refused with
//!   what to do.
//!
//! Neither runs on the control loop: the export writes videos, a file camera decodes on its own
//! capture thread. Every error names the file.

use openh264::OpenH264API;
use openh264::decoder::{DecodedYUV, Decoder, DecoderConfig, Flush};
use openh264::encoder::{
    Encoder, EncoderConfig, FrameRate, IntraFramePeriod, RateControlMode, VuiConfig,
};
use openh264::formats::YUVSource;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};

/// The codec name LeRobot's `info.json` gives H.264 video (`video.codec`).
pub const CODEC: &str = "h264";
/// The pixel format written (`video.pix_fmt`).
pub const PIX_FMT: &str = "yuv420p";
/// Ticks of the track's clock per frame: the clock runs at `fps * TICKS` Hz, so every integer
/// frame rate gives exact presentation times.
const TICKS: u32 = 1000;
/// The largest frame side read (a file's header decides how much memory a frame takes; the
/// camera config's own limit).
const MAX_SIDE: u32 = 8192;

/// A video file that could not be written or read, and why.
#[derive(Debug, thiserror::Error)]
#[error("video `{path}`: {message}")]
pub struct VideoError {
    /// The file.
    pub path: String,
    /// What is wrong and, where it helps, what to do.
    pub message: String,
}

fn err(path: &Path, message: impl std::fmt::Display) -> VideoError {
    VideoError {
        path: path.display().to_string(),
        message: message.to_string(),
    }
}

/// Results of this crate.
pub type Result<T, E = VideoError> = std::result::Result<T, E>;

/// A 4:2:0 frame in three planes (no padding).
struct Yuv420 {
    width: usize,
    height: usize,
    y: Vec<u8>,
    u: Vec<u8>,
    v: Vec<u8>,
}

impl Yuv420 {
    fn new(width: usize, height: usize) -> Self {
        let c = (width / 2) * (height / 2);
        Yuv420 {
            width,
            height,
            y: vec![0; width * height],
            u: vec![0; c],
            v: vec![0; c],
        }
    }

    /// Fills the planes from packed RGB8: luma per pixel, chroma from each 2x2 block's mean,
    /// BT.601 in limited range (luma 16-235, chroma 16-240), rounded.
    fn set_rgb(&mut self, rgb: &[u8]) {
        let w = self.width;
        for (i, px) in rgb.chunks_exact(3).enumerate() {
            let (r, g, b) = (px[0] as f32, px[1] as f32, px[2] as f32);
            self.y[i] = (16.0 + (65.481 * r + 128.553 * g + 24.966 * b) / 255.0).round() as u8;
        }
        for cy in 0..self.height / 2 {
            for cx in 0..w / 2 {
                let (mut r, mut g, mut b) = (0.0f32, 0.0f32, 0.0f32);
                for (dy, dx) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                    let i = ((2 * cy + dy) * w + 2 * cx + dx) * 3;
                    r += rgb[i] as f32;
                    g += rgb[i + 1] as f32;
                    b += rgb[i + 2] as f32;
                }
                let (r, g, b) = (r / 4.0, g / 4.0, b / 4.0);
                let c = cy * (w / 2) + cx;
                self.u[c] = (128.0 + (-37.797 * r - 74.203 * g + 112.0 * b) / 255.0).round() as u8;
                self.v[c] = (128.0 + (112.0 * r - 93.786 * g - 18.214 * b) / 255.0).round() as u8;
            }
        }
    }
}

impl YUVSource for Yuv420 {
    fn dimensions(&self) -> (usize, usize) {
        (self.width, self.height)
    }

    fn strides(&self) -> (usize, usize, usize) {
        (self.width, self.width / 2, self.width / 2)
    }

    fn y(&self) -> &[u8] {
        &self.y
    }

    fn u(&self) -> &[u8] {
        &self.u
    }

    fn v(&self) -> &[u8] {
        &self.v
    }
}

/// Packed RGB8 from a decoded 4:2:0 frame (BT.601 limited range, the inverse of the writer's
/// conversion; chroma taken from the pixel's 2x2 block).
fn yuv_to_rgb(frame: &DecodedYUV<'_>, rgb: &mut [u8]) {
    let (w, h) = frame.dimensions();
    let (sy, su, sv) = frame.strides();
    yuv420_to_rgb(
        w,
        h,
        (frame.y(), sy),
        (frame.u(), su),
        (frame.v(), sv),
        false,
        rgb,
    );
}

/// Packed RGB8 from three 4:2:0 planes, each with its row stride, BT.601 in limited range
/// (luma 16-235, chroma 16-240: `yuv420p` as FFmpeg and LeRobot write it) or full range.
fn yuv420_to_rgb(
    w: usize,
    h: usize,
    (yp, sy): (&[u8], usize),
    (up, su): (&[u8], usize),
    (vp, sv): (&[u8], usize),
    full_range: bool,
    rgb: &mut [u8],
) {
    let (gain, offset, chroma) = if full_range {
        (1.0, 0.0, 255.0 / 224.0)
    } else {
        (1.164_383, 16.0, 1.0)
    };
    let clamp = |x: f32| x.round().clamp(0.0, 255.0) as u8;
    for row in 0..h {
        for col in 0..w {
            let l = gain * (yp[row * sy + col] as f32 - offset);
            let cb = chroma * (up[(row / 2) * su + col / 2] as f32 - 128.0);
            let cr = chroma * (vp[(row / 2) * sv + col / 2] as f32 - 128.0);
            let o = (row * w + col) * 3;
            rgb[o] = clamp(l + 1.596_027 * cr);
            rgb[o + 1] = clamp(l - 0.391_762 * cb - 0.812_968 * cr);
            rgb[o + 2] = clamp(l + 2.017_232 * cb);
        }
    }
}

/// NAL units of an Annex B stream without their start codes.
fn nal_units(stream: &[u8]) -> impl Iterator<Item = &[u8]> {
    openh264::nal_units(stream).map(|n| {
        let skip = n.iter().take_while(|b| **b == 0).count() + 1;
        &n[skip.min(n.len())..]
    })
}

/// What a finished video holds.
#[derive(Clone, Debug, PartialEq)]
pub struct VideoSummary {
    /// Frames written.
    pub frames: u64,
    /// Size of the file, bytes.
    pub bytes: u64,
}

/// Writes RGB frames as an H.264 MP4 file; the file appears under its name only when
/// [`VideoWriter::finish`] succeeds (it is written beside it and renamed).
pub struct VideoWriter {
    path: PathBuf,
    partial: PathBuf,
    width: u32,
    height: u32,
    fps: u32,
    encoder: Encoder,
    yuv: Yuv420,
    mp4: Option<mp4::Mp4Writer<BufWriter<File>>>,
    sample: Vec<u8>,
    frames: u64,
    /// Bytes of encoded frames so far.
    bytes: u64,
}

impl VideoWriter {
    /// A video of `width` x `height` frames (both even: 4:2:0 halves them) at `fps` frames a
    /// second, a key frame every `gop` frames.
    pub fn create(path: &Path, width: u32, height: u32, fps: u32, gop: u32) -> Result<Self> {
        if width == 0 || height == 0 || !width.is_multiple_of(2) || !height.is_multiple_of(2) {
            return Err(err(
                path,
                format!(
                    "frames of {width}x{height}: H.264 4:2:0 video needs an even, non-zero width \
                     and height (crop or resize the camera by one pixel)"
                ),
            ));
        }
        if fps == 0 || fps > 1000 || gop == 0 {
            return Err(err(
                path,
                format!(
                    "{fps} frames a second with a key frame every {gop}: both must be 1 or more (fps at most 1000)"
                ),
            ));
        }
        // A fixed quantiser (OpenH264's base QP, 26, without rate control): every frame the
        // same quality, none skipped (a skipped frame would break the constant frame rate
        // LeRobot's loader relies on). About 2.5 levels of mean error on smooth pictures.
        let config = EncoderConfig::new()
            .debug(false)
            .rate_control_mode(RateControlMode::Off)
            .max_frame_rate(FrameRate::from_hz(fps as f32))
            .skip_frames(false)
            .intra_frame_period(IntraFramePeriod::from_num_frames(gop))
            .vui(VuiConfig::bt601());
        let encoder = Encoder::with_api_config(OpenH264API::from_source(), config)
            .map_err(|e| err(path, format!("the H.264 encoder did not start: {e}")))?;
        let mut partial = path.as_os_str().to_owned();
        partial.push(".partial");
        Ok(VideoWriter {
            path: path.to_path_buf(),
            partial: PathBuf::from(partial),
            width,
            height,
            fps,
            encoder,
            yuv: Yuv420::new(width as usize, height as usize),
            mp4: None,
            sample: Vec::new(),
            frames: 0,
            bytes: 0,
        })
    }

    /// Frames written so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Bytes of encoded frames so far (the file's size less its headers and index).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Appends one packed RGB8 frame of the video's size.
    pub fn push(&mut self, rgb: &[u8]) -> Result<()> {
        let n = self.width as usize * self.height as usize * 3;
        if rgb.len() != n {
            return Err(err(
                &self.path,
                format!(
                    "frame {} holds {} bytes, a {}x{} RGB frame holds {n}",
                    self.frames,
                    rgb.len(),
                    self.width,
                    self.height
                ),
            ));
        }
        self.yuv.set_rgb(rgb);
        let encoded = self
            .encoder
            .encode(&self.yuv)
            .map_err(|e| err(&self.path, format!("frame {}: {e}", self.frames)))?
            .to_vec();
        // The MP4 sample: the frame's NAL units, each after its length (parameter sets go into
        // the track's header instead).
        let (mut sps, mut pps, mut key, mut pictures) = (None, None, false, 0);
        self.sample.clear();
        for nal in nal_units(&encoded) {
            let Some(&head) = nal.first() else { continue };
            match head & 0x1f {
                7 => sps = Some(nal.to_vec()),
                8 => pps = Some(nal.to_vec()),
                t => {
                    key |= t == 5;
                    pictures += usize::from(t == 1 || t == 5);
                    self.sample
                        .extend_from_slice(&(nal.len() as u32).to_be_bytes());
                    self.sample.extend_from_slice(nal);
                }
            }
        }
        if pictures == 0 {
            return Err(err(
                &self.path,
                format!("frame {}: the encoder gave no picture", self.frames),
            ));
        }
        if self.mp4.is_none() {
            let (Some(sps), Some(pps)) = (sps, pps) else {
                return Err(err(
                    &self.path,
                    "the encoder's first frame carried no parameter sets",
                ));
            };
            self.mp4 = Some(self.start(sps, pps)?);
        }
        self.bytes += self.sample.len() as u64;
        let mp4 = self.mp4.as_mut().expect("started above");
        mp4.write_sample(
            1,
            &mp4::Mp4Sample {
                start_time: self.frames * TICKS as u64,
                duration: TICKS,
                rendering_offset: 0,
                is_sync: key,
                bytes: std::mem::take(&mut self.sample).into(),
            },
        )
        .map_err(|e| err(&self.partial, e))?;
        self.frames += 1;
        Ok(())
    }

    fn start(&self, sps: Vec<u8>, pps: Vec<u8>) -> Result<mp4::Mp4Writer<BufWriter<File>>> {
        let file = File::create(&self.partial).map_err(|e| err(&self.partial, e))?;
        let brand = |s: &str| s.parse::<mp4::FourCC>().expect("four characters");
        let mut mp4 = mp4::Mp4Writer::write_start(
            BufWriter::new(file),
            &mp4::Mp4Config {
                major_brand: brand("isom"),
                minor_version: 512,
                compatible_brands: vec![brand("isom"), brand("iso2"), brand("avc1"), brand("mp41")],
                timescale: 1000,
            },
        )
        .map_err(|e| err(&self.partial, e))?;
        mp4.add_track(&mp4::TrackConfig {
            track_type: mp4::TrackType::Video,
            timescale: self.fps * TICKS,
            language: "und".into(),
            media_conf: mp4::MediaConfig::AvcConfig(mp4::AvcConfig {
                width: self.width as u16,
                height: self.height as u16,
                seq_param_set: sps,
                pic_param_set: pps,
            }),
        })
        .map_err(|e| err(&self.partial, e))?;
        Ok(mp4)
    }

    /// Closes the file (index at its end), syncs it and moves it to its name.
    pub fn finish(mut self) -> Result<VideoSummary> {
        let Some(mut mp4) = self.mp4.take() else {
            return Err(err(&self.path, "no frames were written"));
        };
        mp4.write_end().map_err(|e| err(&self.partial, e))?;
        let file = mp4
            .into_writer()
            .into_inner()
            .map_err(|e| err(&self.partial, e.error()))?;
        file.sync_all().map_err(|e| err(&self.partial, e))?;
        let bytes = file.metadata().map_err(|e| err(&self.partial, e))?.len();
        drop(file);
        std::fs::rename(&self.partial, &self.path).map_err(|e| err(&self.path, e))?;
        Ok(VideoSummary {
            frames: self.frames,
            bytes,
        })
    }
}

impl Drop for VideoWriter {
    fn drop(&mut self) {
        // A writer dropped before `finish` (or a `finish` that failed) leaves nothing behind
        // under either name; after a finish the partial file has been renamed away.
        let _ = std::fs::remove_file(&self.partial);
    }
}

/// Reads an H.264 or AV1 MP4 file frame by frame.
pub struct VideoReader {
    inner: Reader,
}

enum Reader {
    H264(Box<H264Reader>),
    Av1(Box<av1::Av1Track>),
}

/// The H.264 track of an MP4 file, decoded by OpenH264.
struct H264Reader {
    path: PathBuf,
    mp4: mp4::Mp4Reader<BufReader<File>>,
    track: u32,
    samples: u32,
    timescale: u32,
    width: u32,
    height: u32,
    /// Bytes of each NAL unit's length field in a sample.
    length_size: usize,
    /// The media time shown at time 0 (the edit list's: FFmpeg's files with B-frames start
    /// their composition times one frame or more late and say so there).
    start_ticks: i64,
    /// The track's parameter sets in Annex B form, fed before the first sample.
    header: Vec<u8>,
    decoder: Decoder,
    /// The next sample to read (1-based, as MP4 counts).
    next: u32,
    /// Presentation times of samples read but not yet delivered (frames leave a decoder in
    /// presentation order).
    pending: BinaryHeap<Reverse<u64>>,
    /// Frames the decoder gave back when flushed at the end, with their times.
    flushed: std::collections::VecDeque<(f64, Vec<u8>)>,
    annexb: Vec<u8>,
}

impl VideoReader {
    /// Opens the first video track of an MP4 file; it must be H.264 or AV1 (8-bit 4:2:0).
    pub fn open(path: &Path) -> Result<Self> {
        let inner = match av1::open(path)? {
            Some(track) => Reader::Av1(Box::new(track)),
            None => Reader::H264(Box::new(H264Reader::open(path)?)),
        };
        Ok(VideoReader { inner })
    }

    /// Width and height of the frames, pixels.
    pub fn size(&self) -> (u32, u32) {
        match &self.inner {
            Reader::H264(r) => (r.width, r.height),
            Reader::Av1(r) => (r.width, r.height),
        }
    }

    /// Frames in the file.
    pub fn frames(&self) -> u32 {
        match &self.inner {
            Reader::H264(r) => r.samples,
            Reader::Av1(r) => r.frames(),
        }
    }

    /// The codec: [`CODEC`] (`h264`) or `av1`, as LeRobot's `info.json` names them.
    pub fn codec(&self) -> &'static str {
        match &self.inner {
            Reader::H264(_) => CODEC,
            Reader::Av1(_) => "av1",
        }
    }

    /// Frames a second, from the track's length.
    pub fn fps(&self) -> f64 {
        let (ticks, timescale) = match &self.inner {
            Reader::H264(r) => (
                r.mp4.tracks()[&r.track].trak.mdia.mdhd.duration,
                r.timescale as u64,
            ),
            Reader::Av1(r) => (r.duration, r.timescale),
        };
        if ticks == 0 {
            return 0.0;
        }
        self.frames() as f64 * timescale as f64 / ticks as f64
    }

    /// Starts again from the first frame.
    pub fn rewind(&mut self) -> Result<()> {
        match &mut self.inner {
            Reader::H264(r) => r.rewind(),
            Reader::Av1(r) => r.rewind(),
        }
    }

    /// Decodes the next frame into `rgb` (width x height x 3 bytes) and returns its
    /// presentation time in seconds; `None` after the last frame.
    pub fn next_frame(&mut self, rgb: &mut [u8]) -> Result<Option<f64>> {
        let (w, h) = self.size();
        let n = w as usize * h as usize * 3;
        if rgb.len() != n {
            let path = match &self.inner {
                Reader::H264(r) => r.path.clone(),
                Reader::Av1(r) => r.path().to_path_buf(),
            };
            return Err(err(
                &path,
                format!("an RGB buffer of {} bytes for {n}-byte frames", rgb.len()),
            ));
        }
        match &mut self.inner {
            Reader::H264(r) => r.next_frame(rgb),
            Reader::Av1(r) => r.next_frame(rgb),
        }
    }
}

impl H264Reader {
    fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| err(path, e))?;
        let size = file.metadata().map_err(|e| err(path, e))?.len();
        let mp4 = mp4::Mp4Reader::read_header(BufReader::new(file), size)
            .map_err(|e| err(path, format!("not a readable MP4 file: {e}")))?;
        let mut ids: Vec<u32> = mp4.tracks().keys().copied().collect();
        ids.sort();
        let video = ids.iter().copied().find(|id| {
            mp4.tracks()[id]
                .track_type()
                .is_ok_and(|t| t == mp4::TrackType::Video)
        });
        let Some(track) = video else {
            let other = ids
                .iter()
                .find(|id| {
                    mp4.tracks()[*id].trak.mdia.hdlr.handler_type == mp4::FourCC::from(*b"vide")
                })
                .map(|id| sample_entry(&mp4.tracks()[id]));
            return Err(err(
                path,
                match other {
                    Some(codec) => format!(
                        "its video is `{codec}`; reflex reads H.264 (`avc1`) and AV1 (`av01`) \
                         video: re-encode it, e.g. `ffmpeg -i IN -c:v libx264 -pix_fmt yuv420p \
                         -g 2 OUT.mp4`"
                    ),
                    None => "no video track".into(),
                },
            ));
        };
        let t = &mp4.tracks()[&track];
        let Some(avc1) = t.trak.mdia.minf.stbl.stsd.avc1.as_ref() else {
            return Err(err(
                path,
                format!(
                    "its video is `{}`; reflex reads H.264 (`avc1`) and AV1 (`av01`) video \
                     (re-encode with `ffmpeg -i IN -c:v libx264 -pix_fmt yuv420p -g 2 OUT.mp4`)",
                    sample_entry(t)
                ),
            ));
        };
        let mut header = Vec::new();
        for nal in avc1
            .avcc
            .sequence_parameter_sets
            .iter()
            .chain(&avc1.avcc.picture_parameter_sets)
        {
            header.extend_from_slice(&[0, 0, 0, 1]);
            header.extend_from_slice(&nal.bytes);
        }
        let length_size = (avc1.avcc.length_size_minus_one & 3) as usize + 1;
        let (width, height) = (avc1.width as u32, avc1.height as u32);
        if width == 0 || height == 0 || width > MAX_SIDE || height > MAX_SIDE {
            return Err(err(
                path,
                format!(
                    "its frames are {width}x{height}; reflex reads 1 to {MAX_SIDE} pixels a side"
                ),
            ));
        }
        let (samples, timescale) = (t.sample_count(), t.timescale());
        // The first edit that shows media (an empty edit, a delay, has media time -1).
        let start_ticks = t
            .trak
            .edts
            .as_ref()
            .and_then(|e| e.elst.as_ref())
            .and_then(|l| {
                l.entries
                    .iter()
                    .map(|e| e.media_time)
                    .find(|&m| m != u32::MAX as u64 && m != u64::MAX)
            })
            .unwrap_or(0) as i64;
        if samples == 0 || timescale == 0 {
            return Err(err(path, "the video track holds no frames"));
        }
        Ok(H264Reader {
            path: path.to_path_buf(),
            mp4,
            track,
            samples,
            timescale,
            width,
            height,
            length_size,
            start_ticks,
            header,
            decoder: new_decoder(path)?,
            next: 1,
            pending: BinaryHeap::new(),
            flushed: Default::default(),
            annexb: Vec::new(),
        })
    }

    fn rewind(&mut self) -> Result<()> {
        self.decoder = new_decoder(&self.path)?;
        self.next = 1;
        self.pending.clear();
        self.flushed.clear();
        Ok(())
    }

    fn next_frame(&mut self, rgb: &mut [u8]) -> Result<Option<f64>> {
        let n = rgb.len();
        loop {
            if let Some((t, frame)) = self.flushed.pop_front() {
                rgb.copy_from_slice(&frame);
                return Ok(Some(t));
            }
            if self.next > self.samples {
                if self.pending.is_empty() {
                    return Ok(None);
                }
                self.flush(n)?;
                if self.flushed.is_empty() {
                    return Err(err(
                        &self.path,
                        format!("{} frames did not decode", self.pending.len()),
                    ));
                }
                self.pending.clear();
                continue;
            }
            let id = self.next;
            self.next += 1;
            let sample = self
                .mp4
                .read_sample(self.track, id)
                .map_err(|e| err(&self.path, format!("frame {id}: {e}")))?
                .ok_or_else(|| err(&self.path, format!("frame {id} is missing")))?;
            let pts = (sample.start_time as i64 + sample.rendering_offset as i64 - self.start_ticks)
                .max(0) as u64;
            self.pending.push(Reverse(pts));
            self.annexb.clear();
            if id == 1 {
                self.annexb.extend_from_slice(&self.header);
            }
            to_annex_b(&sample.bytes, self.length_size, &mut self.annexb)
                .map_err(|m| err(&self.path, format!("frame {id}: {m}")))?;
            let decoded = self
                .decoder
                .decode(&self.annexb)
                .map_err(|e| err(&self.path, format!("frame {id} did not decode: {e}")))?;
            if let Some(frame) = decoded {
                check_size(&self.path, &frame, self.width, self.height)?;
                yuv_to_rgb(&frame, rgb);
                let Reverse(t) = self.pending.pop().expect("pushed above");
                return Ok(Some(t as f64 / self.timescale as f64));
            }
        }
    }

    /// Takes the frames the decoder still holds at the end of the stream.
    fn flush(&mut self, n: usize) -> Result<()> {
        let frames = self
            .decoder
            .flush_remaining()
            .map_err(|e| err(&self.path, format!("the last frames did not decode: {e}")))?;
        for frame in frames {
            check_size(&self.path, &frame, self.width, self.height)?;
            let mut rgb = vec![0; n];
            yuv_to_rgb(&frame, &mut rgb);
            let Some(Reverse(t)) = self.pending.pop() else {
                break;
            };
            self.flushed
                .push_back((t as f64 / self.timescale as f64, rgb));
        }
        Ok(())
    }
}

fn new_decoder(path: &Path) -> Result<Decoder> {
    // No flush after each access unit (the crate's default): flushing hands out a frame before
    // the B-frames that come before it in presentation order have arrived, and OpenH264 then
    // fails on streams with B-frames (libx264's default, and so LeRobot's `vcodec="h264"`).
    let config = DecoderConfig::new().flush_after_decode(Flush::NoFlush);
    Decoder::with_api_config(OpenH264API::from_source(), config)
        .map_err(|e| err(path, format!("the H.264 decoder did not start: {e}")))
}

fn check_size(path: &Path, frame: &DecodedYUV<'_>, width: u32, height: u32) -> Result<()> {
    let (w, h) = frame.dimensions();
    if (w as u32, h as u32) != (width, height) {
        return Err(err(
            path,
            format!("a {w}x{h} frame in a track that says {width}x{height}"),
        ));
    }
    Ok(())
}

/// The four-character name of a track's sample entry (its codec), as far as the header says.
fn sample_entry(track: &mp4::Mp4Track) -> String {
    let stsd = &track.trak.mdia.minf.stbl.stsd;
    if stsd.hev1.is_some() {
        "hev1 (H.265)".into()
    } else if stsd.vp09.is_some() {
        "vp09 (VP9)".into()
    } else {
        "neither H.264 nor AV1".into()
    }
}

/// Rewrites a sample's length-prefixed NAL units as an Annex B stream (start codes).
fn to_annex_b(sample: &[u8], length_size: usize, out: &mut Vec<u8>) -> Result<(), String> {
    let mut rest = sample;
    while !rest.is_empty() {
        if rest.len() < length_size {
            return Err("a NAL unit's length is cut off".into());
        }
        let len = rest[..length_size]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | *b as usize);
        rest = &rest[length_size..];
        if len > rest.len() {
            return Err(format!(
                "a NAL unit of {len} bytes where {} are left",
                rest.len()
            ));
        }
        out.extend_from_slice(&[0, 0, 0, 1]);
        out.extend_from_slice(&rest[..len]);
        rest = &rest[len..];
    }
    Ok(())
}

impl std::fmt::Debug for VideoReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let path = match &self.inner {
            Reader::H264(r) => r.path.as_path(),
            Reader::Av1(r) => r.path(),
        };
        f.debug_struct("VideoReader")
            .field("path", &path)
            .field("codec", &self.codec())
            .field("size", &self.size())
            .field("frames", &self.frames())
            .finish()
    }
}

/// Writes all of `frames` (packed RGB8) as one video; a helper for tests and small exports.
pub fn write_video(
    path: &Path,
    width: u32,
    height: u32,
    fps: u32,
    frames: &[&[u8]],
) -> Result<VideoSummary> {
    let mut w = VideoWriter::create(path, width, height, fps, 2)?;
    for f in frames {
        w.push(f)?;
    }
    w.finish()
}

mod av1;
#[cfg(test)]
mod tests;
