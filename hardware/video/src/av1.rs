//! AV1 video in MP4, LeRobot's default codec (`libsvtav1`, `yuv420p`): the track found by
//! `re_mp4` (which knows the `av01` sample entry), the frames decoded by rav1d, the Rust port of
//! dav1d (crate `re_rav1d`, built without its assembly: no nasm, no C compiler, the same on
//! x86_64 and aarch64; slower than dav1d with its assembly, which matters little here since a
//! dataset's videos are decoded once, off the control loop).
//!
//! An MP4 sample is one AV1 temporal unit, which shows at most one frame, so frames come out in
//! presentation order; the sequence header from the sample entry (`av1C`'s config OBUs) is fed
//! before the first sample, as the AV1-in-ISOBMFF binding reads a stream from a sync sample
//! (encoders also repeat it in every key frame).

use crate::{MAX_SIDE, Result, err, yuv420_to_rgb};
use re_rav1d::dav1d::{Decoder, Error as Dav1dError, PixelLayout, PlanarImageComponent, Settings};
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// One frame's bytes in the file and its presentation time.
#[derive(Clone, Copy, Debug)]
struct SampleRef {
    offset: u64,
    size: u64,
    pts: i64,
}

/// An AV1 track being read.
pub(crate) struct Av1Track {
    path: PathBuf,
    file: File,
    samples: Vec<SampleRef>,
    config_obus: Vec<u8>,
    decoder: Decoder,
    /// The next sample to send.
    next: usize,
    /// A sample the decoder did not take yet (it had pictures to hand out first).
    pending: bool,
    pub(crate) width: u32,
    pub(crate) height: u32,
    pub(crate) timescale: u64,
    pub(crate) duration: u64,
}

/// The first video track of an MP4 file when it is AV1; `Ok(None)` when the file's video is
/// another codec (or `re_mp4` cannot read the file: the H.264 reader then says why).
pub(crate) fn open(path: &Path) -> Result<Option<Av1Track>> {
    let file = File::open(path).map_err(|e| err(path, e))?;
    let size = file.metadata().map_err(|e| err(path, e))?.len();
    let Ok(mp4) = re_mp4::Mp4::read(BufReader::new(file), size) else {
        return Ok(None);
    };
    let Some(track) = mp4
        .tracks()
        .values()
        .find(|t| t.kind == Some(re_mp4::TrackKind::Video))
    else {
        return Ok(None);
    };
    let re_mp4::StsdBoxContent::Av01(av01) = &track.trak(&mp4).mdia.minf.stbl.stsd.contents else {
        return Ok(None);
    };
    let config = &av01.av1c.contents;
    if config.bit_depth != 8
        || config.monochrome
        || config.chroma_subsampling_x != 1
        || config.chroma_subsampling_y != 1
    {
        return Err(err(
            path,
            format!(
                "its AV1 video is {}-bit{} with chroma subsampling {}x{}; reflex reads 8-bit 4:2:0 \
                 (`yuv420p`, what LeRobot writes): re-encode with `ffmpeg -i IN -c:v libsvtav1 \
                 -pix_fmt yuv420p -g 2 OUT.mp4`",
                config.bit_depth,
                if config.monochrome { " monochrome" } else { "" },
                config.chroma_subsampling_x,
                config.chroma_subsampling_y
            ),
        ));
    }
    let (width, height) = (av01.width as u32, av01.height as u32);
    if width == 0 || height == 0 || width > MAX_SIDE || height > MAX_SIDE {
        return Err(err(
            path,
            format!("its frames are {width}x{height}; reflex reads 1 to {MAX_SIDE} pixels a side"),
        ));
    }
    let samples: Vec<SampleRef> = track
        .samples
        .iter()
        .map(|s| SampleRef {
            offset: s.offset,
            size: s.size,
            pts: s.composition_timestamp,
        })
        .collect();
    if samples.is_empty() || track.timescale == 0 {
        return Err(err(path, "the video track holds no frames"));
    }
    if let Some(s) = samples.iter().find(|s| s.offset + s.size > size) {
        return Err(err(
            path,
            format!(
                "a frame of {} bytes at {} runs past the end of the {size}-byte file (cut off?)",
                s.size, s.offset
            ),
        ));
    }
    Ok(Some(Av1Track {
        path: path.to_path_buf(),
        file: File::open(path).map_err(|e| err(path, e))?,
        samples,
        config_obus: config.config_obus.clone(),
        decoder: new_decoder(path)?,
        next: 0,
        pending: false,
        width,
        height,
        timescale: track.timescale,
        duration: track.duration,
    }))
}

fn new_decoder(path: &Path) -> Result<Decoder> {
    let mut s = Settings::new();
    // One thread (the caller's: a file camera's capture thread, or the dataset reader), and no
    // frames held back, so every temporal unit sent gives its picture at once.
    s.set_n_threads(1);
    s.set_max_frame_delay(1);
    Decoder::with_settings(&s).map_err(|e| err(path, format!("the AV1 decoder did not start: {e}")))
}

impl Av1Track {
    /// The file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Frames in the track.
    pub(crate) fn frames(&self) -> u32 {
        self.samples.len() as u32
    }

    /// Starts again from the first frame.
    pub(crate) fn rewind(&mut self) -> Result<()> {
        self.decoder = new_decoder(&self.path)?;
        self.next = 0;
        self.pending = false;
        Ok(())
    }

    /// Decodes the next frame into `rgb`; its presentation time in seconds, `None` after the
    /// last.
    pub(crate) fn next_frame(&mut self, rgb: &mut [u8]) -> Result<Option<f64>> {
        loop {
            match self.decoder.get_picture() {
                Ok(picture) => return self.deliver(&picture, rgb).map(Some),
                Err(Dav1dError::Again) => {}
                Err(e) => {
                    return Err(err(
                        &self.path,
                        format!("frame {} did not decode: {e}", self.next),
                    ));
                }
            }
            if self.pending {
                match self.decoder.send_pending_data() {
                    Ok(()) => self.pending = false,
                    Err(Dav1dError::Again) => {}
                    Err(e) => return Err(self.frame_error(e)),
                }
                continue;
            }
            if self.next >= self.samples.len() {
                return Ok(None);
            }
            let s = self.samples[self.next];
            let mut data = Vec::with_capacity(s.size as usize + self.config_obus.len());
            if self.next == 0 {
                data.extend_from_slice(&self.config_obus);
            }
            let at = data.len();
            data.resize(at + s.size as usize, 0);
            self.file
                .seek(SeekFrom::Start(s.offset))
                .and_then(|_| self.file.read_exact(&mut data[at..]))
                .map_err(|e| err(&self.path, format!("frame {}: {e}", self.next + 1)))?;
            self.next += 1;
            match self.decoder.send_data(data, None, Some(s.pts), None) {
                Ok(()) => {}
                Err(Dav1dError::Again) => self.pending = true,
                Err(e) => return Err(self.frame_error(e)),
            }
        }
    }

    fn frame_error(&self, e: Dav1dError) -> crate::VideoError {
        err(
            &self.path,
            format!("frame {} is not valid AV1: {e}", self.next),
        )
    }

    fn deliver(&self, p: &re_rav1d::dav1d::Picture, rgb: &mut [u8]) -> Result<f64> {
        if (p.width(), p.height()) != (self.width, self.height) {
            return Err(err(
                &self.path,
                format!(
                    "a {}x{} frame in a track that says {}x{}",
                    p.width(),
                    p.height(),
                    self.width,
                    self.height
                ),
            ));
        }
        if p.bit_depth() != 8 || p.pixel_layout() != PixelLayout::I420 {
            return Err(err(
                &self.path,
                "a frame that is not 8-bit 4:2:0 (re-encode with `-pix_fmt yuv420p`)",
            ));
        }
        let full_range = matches!(p.color_range(), re_rav1d::dav1d::pixel::YUVRange::Full);
        let (y, u, v) = (
            p.plane(PlanarImageComponent::Y),
            p.plane(PlanarImageComponent::U),
            p.plane(PlanarImageComponent::V),
        );
        let (sy, sc) = (
            p.stride(PlanarImageComponent::Y) as usize,
            p.stride(PlanarImageComponent::U) as usize,
        );
        yuv420_to_rgb(
            self.width as usize,
            self.height as usize,
            (&y, sy),
            (&u, sc),
            (&v, sc),
            full_range,
            rgb,
        );
        let ticks = p.timestamp().unwrap_or(0).max(0);
        Ok(ticks as f64 / self.timescale as f64)
    }
}
