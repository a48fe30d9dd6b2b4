//! What a camera delivers turned into the RGB a policy reads: YUYV and MJPEG decoding, and the
//! crop (the region of interest HIL-SERL and LeRobot cut out of each frame) and resize to the
//! policy's input size. Every function writes into a buffer the caller owns, so a capture thread
//! reuses its buffers frame after frame.

use super::CameraError;
use serde::{Deserialize, Serialize};

/// How a camera encodes its frames.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PixelFormat {
    /// Motion JPEG: each frame a JPEG (what most USB cameras give at full size and rate).
    #[default]
    Mjpeg,
    /// YUV 4:2:2 packed as Y0 U Y1 V (what USB cameras give uncompressed).
    Yuyv,
    /// 8-bit RGB, row-major, no padding.
    Rgb8,
}

impl PixelFormat {
    /// The V4L2 four-character code.
    pub fn fourcc(self) -> [u8; 4] {
        match self {
            PixelFormat::Mjpeg => *b"MJPG",
            PixelFormat::Yuyv => *b"YUYV",
            PixelFormat::Rgb8 => *b"RGB3",
        }
    }
}

/// A rectangle of a frame, in pixels: left, top, width, height.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Roi {
    /// Left edge.
    pub x: u32,
    /// Top edge.
    pub y: u32,
    /// Width.
    pub w: u32,
    /// Height.
    pub h: u32,
}

impl Roi {
    /// The whole of a `w` x `h` frame.
    pub fn full(w: u32, h: u32) -> Roi {
        Roi { x: 0, y: 0, w, h }
    }

    /// Whether the rectangle is non-empty and lies inside a `w` x `h` frame.
    pub fn fits(&self, w: u32, h: u32) -> bool {
        self.w > 0
            && self.h > 0
            && self.x.checked_add(self.w).is_some_and(|r| r <= w)
            && self.y.checked_add(self.h).is_some_and(|b| b <= h)
    }
}

fn clamp_u8(v: i32) -> u8 {
    v.clamp(0, 255) as u8
}

/// Converts a YUYV frame to RGB with the BT.601 limited-range matrix (what UVC cameras send):
/// Y in 16..235 and U, V in 16..240 map to 0..255.
pub fn yuyv_to_rgb(src: &[u8], w: u32, h: u32, dst: &mut [u8]) -> Result<(), CameraError> {
    let (w, h) = (w as usize, h as usize);
    if !w.is_multiple_of(2) {
        return Err(CameraError::Frame(format!(
            "YUYV needs an even width, got {w}"
        )));
    }
    if src.len() < w * h * 2 {
        return Err(CameraError::Frame(format!(
            "a YUYV frame of {w}x{h} needs {} bytes, got {}",
            w * h * 2,
            src.len()
        )));
    }
    assert_eq!(dst.len(), w * h * 3, "destination sized for {w}x{h} RGB");
    // Fixed point, 8 fractional bits: 1.164 = 298/256, 1.596 = 409/256, 0.391 = 100/256,
    // 0.813 = 208/256, 2.018 = 516/256.
    for (pair, out) in src[..w * h * 2]
        .chunks_exact(4)
        .zip(dst.chunks_exact_mut(6))
    {
        let (u, v) = (pair[1] as i32 - 128, pair[3] as i32 - 128);
        for (k, y) in [pair[0], pair[2]].into_iter().enumerate() {
            let c = 298 * (y as i32 - 16) + 128;
            out[3 * k] = clamp_u8((c + 409 * v) >> 8);
            out[3 * k + 1] = clamp_u8((c - 100 * u - 208 * v) >> 8);
            out[3 * k + 2] = clamp_u8((c + 516 * u) >> 8);
        }
    }
    Ok(())
}

/// The width and height of a JPEG, from its headers.
pub fn jpeg_size(src: &[u8]) -> Result<(u32, u32), CameraError> {
    let mut d = zune_jpeg::JpegDecoder::new(zune_core::bytestream::ZCursor::new(src));
    d.decode_headers()
        .map_err(|e| CameraError::Frame(format!("not a JPEG frame: {e:?}")))?;
    let info = d
        .info()
        .ok_or_else(|| CameraError::Frame("a JPEG frame without a size".into()))?;
    Ok((info.width as u32, info.height as u32))
}

/// The Huffman tables of ITU-T T.81 Annex K.3 (Tables K.3 to K.6): (class << 4 | id, codes of
/// each length 1..16, symbols). Motion-JPEG frames from USB cameras leave their tables out and
/// are decoded with these (the AVI1 convention).
const STANDARD_HUFFMAN: [(u8, [u8; 16], &[u8]); 4] = [
    (
        0x00,
        [0, 1, 5, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0],
        &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
    ),
    (
        0x10,
        [0, 2, 1, 3, 3, 2, 4, 3, 5, 5, 4, 4, 0, 0, 1, 0x7d],
        &[
            0x01, 0x02, 0x03, 0x00, 0x04, 0x11, 0x05, 0x12, 0x21, 0x31, 0x41, 0x06, 0x13, 0x51,
            0x61, 0x07, 0x22, 0x71, 0x14, 0x32, 0x81, 0x91, 0xa1, 0x08, 0x23, 0x42, 0xb1, 0xc1,
            0x15, 0x52, 0xd1, 0xf0, 0x24, 0x33, 0x62, 0x72, 0x82, 0x09, 0x0a, 0x16, 0x17, 0x18,
            0x19, 0x1a, 0x25, 0x26, 0x27, 0x28, 0x29, 0x2a, 0x34, 0x35, 0x36, 0x37, 0x38, 0x39,
            0x3a, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48, 0x49, 0x4a, 0x53, 0x54, 0x55, 0x56, 0x57,
            0x58, 0x59, 0x5a, 0x63, 0x64, 0x65, 0x66, 0x67, 0x68, 0x69, 0x6a, 0x73, 0x74, 0x75,
            0x76, 0x77, 0x78, 0x79, 0x7a, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8a, 0x92,
            0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9a, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7,
            0xa8, 0xa9, 0xaa, 0xb2, 0xb3, 0xb4, 0xb5, 0xb6, 0xb7, 0xb8, 0xb9, 0xba, 0xc2, 0xc3,
            0xc4, 0xc5, 0xc6, 0xc7, 0xc8, 0xc9, 0xca, 0xd2, 0xd3, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8,
            0xd9, 0xda, 0xe1, 0xe2, 0xe3, 0xe4, 0xe5, 0xe6, 0xe7, 0xe8, 0xe9, 0xea, 0xf1, 0xf2,
            0xf3, 0xf4, 0xf5, 0xf6, 0xf7, 0xf8, 0xf9, 0xfa,
        ],
    ),
    (
        0x01,
        [0, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0],
        &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
    ),
    (
        0x11,
        [0, 2, 1, 2, 4, 4, 3, 4, 7, 5, 4, 4, 0, 1, 2, 0x77],
        &[
            0x00, 0x01, 0x02, 0x03, 0x11, 0x04, 0x05, 0x21, 0x31, 0x06, 0x12, 0x41, 0x51, 0x07,
            0x61, 0x71, 0x13, 0x22, 0x32, 0x81, 0x08, 0x14, 0x42, 0x91, 0xa1, 0xb1, 0xc1, 0x09,
            0x23, 0x33, 0x52, 0xf0, 0x15, 0x62, 0x72, 0xd1, 0x0a, 0x16, 0x24, 0x34, 0xe1, 0x25,
            0xf1, 0x17, 0x18, 0x19, 0x1a, 0x26, 0x27, 0x28, 0x29, 0x2a, 0x35, 0x36, 0x37, 0x38,
            0x39, 0x3a, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48, 0x49, 0x4a, 0x53, 0x54, 0x55, 0x56,
            0x57, 0x58, 0x59, 0x5a, 0x63, 0x64, 0x65, 0x66, 0x67, 0x68, 0x69, 0x6a, 0x73, 0x74,
            0x75, 0x76, 0x77, 0x78, 0x79, 0x7a, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89,
            0x8a, 0x92, 0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9a, 0xa2, 0xa3, 0xa4, 0xa5,
            0xa6, 0xa7, 0xa8, 0xa9, 0xaa, 0xb2, 0xb3, 0xb4, 0xb5, 0xb6, 0xb7, 0xb8, 0xb9, 0xba,
            0xc2, 0xc3, 0xc4, 0xc5, 0xc6, 0xc7, 0xc8, 0xc9, 0xca, 0xd2, 0xd3, 0xd4, 0xd5, 0xd6,
            0xd7, 0xd8, 0xd9, 0xda, 0xe2, 0xe3, 0xe4, 0xe5, 0xe6, 0xe7, 0xe8, 0xe9, 0xea, 0xf2,
            0xf3, 0xf4, 0xf5, 0xf6, 0xf7, 0xf8, 0xf9, 0xfa,
        ],
    ),
];

/// Where a JPEG's tables would go if it has none: the offset of its start-of-scan marker, or
/// `None` when it defines its own Huffman tables (or cannot be walked: the decoder will say).
fn missing_huffman_at(src: &[u8]) -> Option<usize> {
    let mut i = 2; // after SOI
    while i + 4 <= src.len() {
        if src[i] != 0xFF {
            return None;
        }
        match src[i + 1] {
            0xFF => i += 1, // fill byte
            0xC4 => return None,
            0xDA => return Some(i),
            0xD0..=0xD7 | 0x01 => i += 2,
            _ => i += 2 + (((src[i + 2] as usize) << 8) | src[i + 3] as usize),
        }
    }
    None
}

/// `src` as a complete JPEG: with [`STANDARD_HUFFMAN`] inserted before its scan when it has no
/// tables of its own (built in `scratch`, whose capacity is reused), else `src` itself.
pub fn with_standard_huffman_tables<'a>(src: &'a [u8], scratch: &'a mut Vec<u8>) -> &'a [u8] {
    let Some(at) = missing_huffman_at(src) else {
        return src;
    };
    scratch.clear();
    scratch.extend_from_slice(&src[..at]);
    let len: usize = 2 + STANDARD_HUFFMAN
        .iter()
        .map(|(_, _, v)| 17 + v.len())
        .sum::<usize>();
    scratch.extend_from_slice(&[0xFF, 0xC4, (len >> 8) as u8, len as u8]);
    for (class_id, counts, values) in STANDARD_HUFFMAN {
        scratch.push(class_id);
        scratch.extend_from_slice(&counts);
        scratch.extend_from_slice(values);
    }
    scratch.extend_from_slice(&src[at..]);
    scratch
}

/// Decodes one MJPEG frame into `dst` as RGB; the frame must be `w` x `h`. `scratch` holds the
/// frame with the standard Huffman tables added when it came without them, as motion-JPEG
/// cameras send frames.
///
/// zune-jpeg (pure Rust) decodes it. The decoder's own working memory is allocated per frame on
/// the capture thread; the frame buffers themselves are reused.
pub fn mjpeg_to_rgb(
    src: &[u8],
    w: u32,
    h: u32,
    dst: &mut [u8],
    scratch: &mut Vec<u8>,
) -> Result<(), CameraError> {
    let src = with_standard_huffman_tables(src, scratch);
    let options = zune_core::options::DecoderOptions::default()
        .jpeg_set_out_colorspace(zune_core::colorspace::ColorSpace::RGB);
    let mut d =
        zune_jpeg::JpegDecoder::new_with_options(zune_core::bytestream::ZCursor::new(src), options);
    d.decode_headers()
        .map_err(|e| CameraError::Frame(format!("not a JPEG frame: {e:?}")))?;
    let info = d
        .info()
        .ok_or_else(|| CameraError::Frame("a JPEG frame without a size".into()))?;
    if (info.width as u32, info.height as u32) != (w, h) {
        return Err(CameraError::Frame(format!(
            "a {}x{} JPEG frame from a camera configured for {w}x{h}",
            info.width, info.height
        )));
    }
    assert_eq!(
        dst.len(),
        (w * h * 3) as usize,
        "destination sized for {w}x{h} RGB"
    );
    d.decode_into(dst)
        .map_err(|e| CameraError::Frame(format!("a JPEG frame that does not decode: {e:?}")))
}

/// Cuts `roi` out of the RGB frame `src` (`sw` x `sh`) and scales it to `dw` x `dh` into `dst`,
/// bilinearly (pixel centres aligned, as OpenCV's `INTER_LINEAR`). Same size: a plain copy.
pub fn crop_resize(src: &[u8], sw: u32, sh: u32, roi: Roi, dst: &mut [u8], dw: u32, dh: u32) {
    assert!(roi.fits(sw, sh), "{roi:?} inside {sw}x{sh}");
    assert_eq!(src.len(), (sw * sh * 3) as usize);
    assert_eq!(dst.len(), (dw * dh * 3) as usize);
    let (sw, dw) = (sw as usize, dw as usize);
    if (roi.w, roi.h) == (dw as u32, dh) {
        for row in 0..dh as usize {
            let s = ((roi.y as usize + row) * sw + roi.x as usize) * 3;
            dst[row * dw * 3..(row + 1) * dw * 3].copy_from_slice(&src[s..s + dw * 3]);
        }
        return;
    }
    let (fx, fy) = (roi.w as f32 / dw as f32, roi.h as f32 / dh as f32);
    let (max_x, max_y) = ((roi.w - 1) as f32, (roi.h - 1) as f32);
    for oy in 0..dh as usize {
        let sy = ((oy as f32 + 0.5) * fy - 0.5).clamp(0.0, max_y);
        let (y0, ty) = (sy as usize, sy.fract());
        let y1 = (y0 + 1).min(roi.h as usize - 1);
        let (r0, r1) = (roi.y as usize + y0, roi.y as usize + y1);
        for ox in 0..dw {
            let sx = ((ox as f32 + 0.5) * fx - 0.5).clamp(0.0, max_x);
            let (x0, tx) = (sx as usize, sx.fract());
            let x1 = (x0 + 1).min(roi.w as usize - 1);
            let (c0, c1) = (roi.x as usize + x0, roi.x as usize + x1);
            for ch in 0..3 {
                let p = |r: usize, c: usize| src[(r * sw + c) * 3 + ch] as f32;
                let top = p(r0, c0) * (1.0 - tx) + p(r0, c1) * tx;
                let bottom = p(r1, c0) * (1.0 - tx) + p(r1, c1) * tx;
                dst[(oy * dw + ox) * 3 + ch] = (top * (1.0 - ty) + bottom * ty).round() as u8;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yuyv_black_white_and_the_primaries_decode_to_their_rgb() {
        // BT.601 limited-range YUV of black, white, red, green and blue (ITU-R BT.601 table):
        // each as a pixel pair with the same chroma.
        let cases: [([u8; 3], [u8; 3]); 5] = [
            ([16, 128, 128], [0, 0, 0]),
            ([235, 128, 128], [255, 255, 255]),
            ([81, 90, 240], [255, 0, 0]),
            ([145, 54, 34], [0, 255, 0]),
            ([41, 240, 110], [0, 0, 255]),
        ];
        for (yuv, rgb) in cases {
            let src = [yuv[0], yuv[1], yuv[0], yuv[2]];
            let mut dst = [0u8; 6];
            yuyv_to_rgb(&src, 2, 1, &mut dst).unwrap();
            for px in dst.chunks(3) {
                for c in 0..3 {
                    assert!(
                        (px[c] as i32 - rgb[c] as i32).abs() <= 3,
                        "{yuv:?} gave {px:?}, expected {rgb:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_short_or_odd_yuyv_frame_is_an_error() {
        let mut dst = [0u8; 12];
        assert!(yuyv_to_rgb(&[0; 7], 2, 2, &mut dst).is_err());
        let mut dst = [0u8; 9];
        assert!(yuyv_to_rgb(&[0; 6], 3, 1, &mut dst).is_err());
    }

    #[test]
    fn cropping_without_scaling_copies_the_region() {
        // A 4x3 frame whose pixel (x, y) is (x, y, 7).
        let src: Vec<u8> = (0..3u8)
            .flat_map(|y| (0..4u8).flat_map(move |x| [x, y, 7]))
            .collect();
        let mut dst = vec![0; 2 * 2 * 3];
        crop_resize(
            &src,
            4,
            3,
            Roi {
                x: 1,
                y: 1,
                w: 2,
                h: 2,
            },
            &mut dst,
            2,
            2,
        );
        assert_eq!(dst, [1, 1, 7, 2, 1, 7, 1, 2, 7, 2, 2, 7]);
    }

    #[test]
    fn halving_averages_and_doubling_keeps_a_ramp_monotonic() {
        // A horizontal ramp 0, 100, 200, 250 in every channel, two rows.
        let row = [0u8, 100, 200, 250];
        let src: Vec<u8> = (0..2)
            .flat_map(|_| row.iter().flat_map(|v| [*v; 3]))
            .collect();
        let mut half = vec![0; 2 * 3];
        crop_resize(&src, 4, 2, Roi::full(4, 2), &mut half, 2, 1);
        assert_eq!(half, [50, 50, 50, 225, 225, 225]);
        let mut double = vec![0; 8 * 2 * 3];
        crop_resize(&src, 4, 2, Roi::full(4, 2), &mut double, 8, 2);
        let first_row: Vec<u8> = double[..8 * 3].chunks(3).map(|p| p[0]).collect();
        assert!(first_row.windows(2).all(|w| w[0] <= w[1]), "{first_row:?}");
        assert_eq!((first_row[0], first_row[7]), (0, 250));
    }

    #[test]
    fn regions_outside_the_frame_do_not_fit() {
        assert!(Roi::full(640, 480).fits(640, 480));
        assert!(
            !Roi {
                x: 600,
                y: 0,
                w: 100,
                h: 10
            }
            .fits(640, 480)
        );
        assert!(
            !Roi {
                x: 0,
                y: 0,
                w: 0,
                h: 10
            }
            .fits(640, 480)
        );
    }
}
