//! Inputs of vision-language-action policies: camera frames resized and normalised for the
//! network, and instructions tokenised with a Hugging Face `tokenizer.json` (the `tokenizers`
//! crate), plus the tiny VLA-shaped model reflex builds to test that path end to end.

use crate::onnx_policy::LoadError;
use crate::onnx_write::{Attr, Dim, Elem, Graph, batch};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
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
    let err = |m: String| LoadError::Tokenizer {
        path: path.display().to_string(),
        message: m,
    };
    let tok = tokenizers::Tokenizer::from_file(path).map_err(|e| err(e.to_string()))?;
    let enc = tok.encode(text, true).map_err(|e| err(e.to_string()))?;
    let mut ids: Vec<i64> = enc
        .get_ids()
        .iter()
        .map(|&i| i as i64)
        .take(max_len)
        .collect();
    let mut mask = vec![1i64; ids.len()];
    ids.resize(max_len, pad_id);
    mask.resize(max_len, 0);
    Ok((ids, mask))
}

/// Resizes an rgb8 image to `w x h` (bilinear, half-pixel centres, as OpenCV's INTER_LINEAR and
/// PyTorch's `align_corners=False`), scales to [0, 1], normalises each channel with `mean`/`std`
/// and writes it channel-first (NCHW without the batch) into `out` (length 3 w h).
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

/// Shape of the tiny VLA.
#[derive(Clone, Copy, Debug)]
pub struct TinyVla {
    /// Image side the network takes.
    pub image: u32,
    /// Vocabulary size of its token embedding.
    pub vocab: usize,
    /// Token sequence length.
    pub max_len: usize,
    /// State input size.
    pub state_dim: usize,
    /// Actions per chunk.
    pub chunk_len: usize,
    /// Action dimension.
    pub action_dim: usize,
}

/// Builds a VLA-shaped flow policy with random weights from `seed`: a patchifying convolution and
/// global pooling for the image, a token embedding averaged over the sequence, the state, the noisy
/// chunk and a sinusoidal time embedding, concatenated into an MLP that outputs a velocity
/// `[batch, chunk_len, action_dim]`. Inputs: `image` `[B,3,S,S]`, `tokens` `[B,L]` (int64),
/// `state` `[B,state_dim]`, `x_t` `[B,T,A]`, `t` `[B,1]`. It is not trained: it exists to prove
/// that images and instructions reach a network through reflex exactly as specified.
pub fn build_tiny_vla(v: &TinyVla, seed: u64) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut rnd = |n: usize, scale: f32| -> Vec<f32> {
        (0..n)
            .map(|_| (rng.random::<f32>() * 2.0 - 1.0) * scale)
            .collect()
    };
    let mut g = Graph::new();
    let s = v.image as i64;
    let (t, a) = (v.chunk_len as i64, v.action_dim as i64);
    let image = g.input(
        "image",
        Elem::F32,
        vec![batch(), Dim::Fixed(3), Dim::Fixed(s), Dim::Fixed(s)],
    );
    let tokens = g.input(
        "tokens",
        Elem::I64,
        vec![batch(), Dim::Fixed(v.max_len as i64)],
    );
    let state = g.input(
        "state",
        Elem::F32,
        vec![batch(), Dim::Fixed(v.state_dim as i64)],
    );
    let x_t = g.input(
        "x_t",
        Elem::F32,
        vec![batch(), Dim::Fixed(t), Dim::Fixed(a)],
    );
    let time = g.input("t", Elem::F32, vec![batch(), Dim::Fixed(1)]);
    // Vision: 4x4 patches -> 8 channels -> ReLU -> global average.
    let wconv = g.constant("conv_w", &[8, 3, 4, 4], &rnd(8 * 3 * 16, 0.3));
    let bconv = g.constant("conv_b", &[8], &rnd(8, 0.1));
    let conv = g.op(
        "Conv",
        &[&image, &wconv, &bconv],
        vec![
            ("kernel_shape", Attr::Ints(vec![4, 4])),
            ("strides", Attr::Ints(vec![4, 4])),
        ],
    );
    let relu = g.op("Relu", &[&conv], vec![]);
    let pooled = g.op("GlobalAveragePool", &[&relu], vec![]);
    let vis = g.op("Flatten", &[&pooled], vec![("axis", Attr::Int(1))]);
    // Language: embedding lookup, mean over the sequence.
    let table = g.constant("embed", &[v.vocab as i64, 8], &rnd(v.vocab * 8, 1.0));
    let emb = g.op("Gather", &[&table, &tokens], vec![("axis", Attr::Int(0))]);
    let lang = g.op(
        "ReduceMean",
        &[&emb],
        vec![("axes", Attr::Ints(vec![1])), ("keepdims", Attr::Int(0))],
    );
    // Time embedding and the noisy chunk.
    let freqs: Vec<f32> = (0..8)
        .map(|i| (-(10000f32).ln() * i as f32 / 8.0).exp())
        .collect();
    let fr = g.constant("freqs", &[1, 8], &freqs);
    let tf = g.op("MatMul", &[&time, &fr], vec![]);
    let (sin, cos) = (g.op("Sin", &[&tf], vec![]), g.op("Cos", &[&tf], vec![]));
    let xf = g.reshape(&x_t, &[-1, t * a]);
    let h0 = g.concat(&[&vis, &lang, &state, &xf, &sin, &cos], 1);
    let n_in = 8 + 8 + v.state_dim + (t * a) as usize + 16;
    let hid = 64;
    let w1 = rnd(n_in * hid, 1.0 / (n_in as f32).sqrt());
    let b1 = rnd(hid, 0.1);
    let h1 = g.linear(&h0, &w1, &b1, n_in, hid);
    let h1 = g.silu(&h1);
    let w2 = rnd(hid * (t * a) as usize, 1.0 / (hid as f32).sqrt());
    let b2 = rnd((t * a) as usize, 0.1);
    let out = g.linear(&h1, &w2, &b2, hid, (t * a) as usize);
    let out = g.reshape(&out, &[-1, t, a]);
    g.output(
        &out,
        "velocity",
        Elem::F32,
        vec![batch(), Dim::Fixed(t), Dim::Fixed(a)],
    );
    g.to_bytes("tiny_vla", "reflex")
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
