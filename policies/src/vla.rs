//! Inputs of vision-language-action policies: camera frames resized and normalised for the
//! network, and instructions tokenised with a Hugging Face `tokenizer.json` (the `tokenizers`
//! crate). The tiny VLA-shaped model reflex builds to test that path end to end is in
//! tests/system/tiny_vla.rs.

use crate::onnx_policy::LoadError;
use reflex_runtime::msg::Image;
use std::path::Path;

/// Tokenises `text` to `max_len` int64 ids (truncated or padded with `pad_id`) and the matching
/// attention mask.
pub fn tokenize(
    path: &Path,
    text: &str,
    max_len: usize,
    pad_id: i64,
) -> Result<(Vec<i64>, Vec<i64>), LoadError> {
    let tok = load_tokenizer(path)?;
    let (mut ids, mut mask) = (vec![], vec![]);
    encode(&tok, text, max_len, pad_id, &mut ids, &mut mask).map_err(|m| LoadError::Tokenizer {
        path: path.display().to_string(),
        message: m,
    })?;
    Ok((ids, mask))
}

/// Reads a Hugging Face `tokenizer.json`.
pub fn load_tokenizer(path: &Path) -> Result<tokenizers::Tokenizer, LoadError> {
    tokenizers::Tokenizer::from_file(path).map_err(|e| LoadError::Tokenizer {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

/// Tokenises `text` with its special tokens into `ids` (truncated or padded with `pad_id` to
/// `max_len`) and `mask` (1 for tokens, 0 for padding), reusing both buffers.
pub fn encode(
    tok: &tokenizers::Tokenizer,
    text: &str,
    max_len: usize,
    pad_id: i64,
    ids: &mut Vec<i64>,
    mask: &mut Vec<i64>,
) -> Result<(), String> {
    let enc = tok.encode(text, true).map_err(|e| e.to_string())?;
    ids.clear();
    ids.extend(enc.get_ids().iter().map(|&i| i64::from(i)).take(max_len));
    mask.clear();
    mask.resize(ids.len(), 1);
    ids.resize(max_len, pad_id);
    mask.resize(max_len, 0);
    Ok(())
}

/// Resizes an rgb8 image to `w x h` (bilinear, half-pixel centres, as OpenCV's INTER_LINEAR and
/// PyTorch's `align_corners=False`), scales to [0, 1], normalises each channel with `mean`/`std`
/// and writes it channel-first (NCHW without the batch) into `out` (length 3 w h).
///
/// # Panics
/// When `img` is empty or its data is not `width x height x 3` bytes: callers check (the ONNX
/// policy refuses such an image with an error naming the camera; [`camera_to_nchw`] checks).
pub fn image_to_nchw(
    img: &Image,
    w: u32,
    h: u32,
    mean: &[f32; 3],
    std: &[f32; 3],
    out: &mut [f32],
) {
    let (sw, sh) = (img.width as usize, img.height as usize);
    let (w, h) = (w as usize, h as usize);
    let sx = sw as f32 / w as f32;
    let sy = sh as f32 / h as f32;
    let px = |x: usize, y: usize, c: usize| img.data[(y * sw + x) * 3 + c] as f32 / 255.0;
    for y in 0..h {
        let fy = ((y as f32 + 0.5) * sy - 0.5).clamp(0.0, (sh - 1) as f32);
        let (y0, ty) = (fy.floor() as usize, fy - fy.floor());
        let y1 = (y0 + 1).min(sh - 1);
        for x in 0..w {
            let fx = ((x as f32 + 0.5) * sx - 0.5).clamp(0.0, (sw - 1) as f32);
            let (x0, tx) = (fx.floor() as usize, fx - fx.floor());
            let x1 = (x0 + 1).min(sw - 1);
            for c in 0..3 {
                let top = px(x0, y0, c) * (1.0 - tx) + px(x1, y0, c) * tx;
                let bottom = px(x0, y1, c) * (1.0 - tx) + px(x1, y1, c) * tx;
                let v = top * (1.0 - ty) + bottom * ty;
                out[c * w * h + y * w + x] = (v - mean[c]) / std[c];
            }
        }
    }
}

/// Finds camera `camera`'s image among `images` (by name), checks it is a non-empty rgb8 image,
/// and writes it into `out` as [`image_to_nchw`] does. The error says what is wrong; `reader`
/// names who reads the camera ("the encoder", "the classifier").
#[allow(clippy::too_many_arguments)]
pub fn camera_to_nchw(
    images: &[Image],
    camera: &str,
    reader: &str,
    w: u32,
    h: u32,
    mean: &[f32; 3],
    std: &[f32; 3],
    out: &mut [f32],
) -> Result<(), String> {
    let img = images.iter().find(|i| i.camera == camera).ok_or_else(|| {
        format!(
            "no image from camera `{camera}` (got {:?}); {reader} reads it",
            images.iter().map(|i| &i.camera).collect::<Vec<_>>()
        )
    })?;
    if img.encoding != "rgb8"
        || img.width == 0
        || img.height == 0
        || img.data.len() != (img.width * img.height * 3) as usize
    {
        return Err(format!(
            "camera `{camera}`: a {}x{} `{}` image of {} bytes is not rgb8",
            img.width,
            img.height,
            img.encoding,
            img.data.len()
        ));
    }
    image_to_nchw(img, w, h, mean, std, out);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bilinear_resize_and_normalisation_match_hand_values() {
        // 4x2 image (w=4, h=2), red channel 0, 40, 80, 120 on row 0 and +100 on row 1; green and
        // blue constant. Resized to 2x1: half-pixel centres sample x = 0.5 and 2.5, y = 0.5.
        let mut data = vec![];
        for y in 0..2u8 {
            for x in 0..4u8 {
                data.extend_from_slice(&[x * 40 + y * 100, 51, 255]);
            }
        }
        let img = Image {
            camera: "c".into(),
            width: 4,
            height: 2,
            encoding: "rgb8".into(),
            seq: 0,
            age_ns: 0,
            data,
        };
        let mut out = vec![0.0; 3 * 2];
        image_to_nchw(&img, 2, 1, &[0.5, 0.0, 0.0], &[0.5, 1.0, 2.0], &mut out);
        // Red at (0.5, 0.5): mean of 0, 40, 100, 140 = 70 -> 70/255 = 0.27451 -> (0.27451-0.5)/0.5
        let hand_r0 = (70.0 / 255.0 - 0.5) / 0.5;
        let hand_r1 = (150.0 / 255.0 - 0.5) / 0.5; // mean of 80, 120, 180, 220
        assert!((out[0] - hand_r0).abs() < 1e-6, "{}", out[0]);
        assert!((out[1] - hand_r1).abs() < 1e-6, "{}", out[1]);
        assert!(
            (out[2] - 0.2).abs() < 1e-6 && (out[3] - 0.2).abs() < 1e-6,
            "green {:?}",
            &out[2..4]
        );
        assert!((out[4] - 0.5).abs() < 1e-6, "blue {}", out[4]);
    }
}
