//! A small convolutional image encoder trained with a policy, and the frames it trains on.
//!
//! Per camera: a patchify stem (a 4x4 convolution of stride 4, 32 channels, ReLU: the stem of
//! ViT and ConvNeXt), a 1x1 convolution to 8 channels (ReLU), then SERL's head in a compact
//! form: a linear readout with its own weights at every place of the feature map (SERL's
//! spatial learned embeddings do the same per channel), 64 wide, LayerNorm, tanh. A weight per
//! place keeps where things are in the picture, which is what a manipulation policy needs from
//! it. Both convolutions are matrix products over non-overlapping patches, which keeps training
//! on a CPU quick (an overlapping 3x3 stack through candle's CPU convolutions ran 0.24 s a step
//! at batch 64 on 64x64 images here; a spatial-softmax head on this stem learnt slower than the
//! readout on the simulator's tasks). Training augments with random shifts (Kostrikov et al. 2020, DrQ: pad by replicating the
//! border, crop back to size), the augmentation HIL-SERL and SERL use on their cameras.
//!
//! The same network is written as ONNX operators (Conv, Relu, Transpose, MatMul,
//! LayerNormalization, Tanh) so that the exported policy takes the camera's image as a graph
//! input and ONNX Runtime computes the features itself.

use crate::VisionError;
use candle_core::{Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use reflex_policies::onnx_write::{Attr, Dim, Elem, Graph, batch};

/// Side of the stem's patches, pixels; image sizes must be multiples of it.
pub const PATCH: usize = 4;
/// Channels of the stem.
pub const CHANNELS: usize = 32;
/// Channels of the 1x1 convolution, what the readout sees at each cell.
pub const CELL_CHANNELS: usize = 8;
/// Features out of one camera's encoder.
pub const FEATURES: usize = 64;

/// Per-channel mean and std the encoder's input is normalised with (pixels scaled to [0, 1]
/// first), so that the input lies in [-1, 1].
pub const MEAN: [f32; 3] = [0.5, 0.5, 0.5];
/// See [`MEAN`].
pub const STD: [f32; 3] = [0.5, 0.5, 0.5];

/// A weight matrix `[in, out]` and bias `[out]`.
struct Dense {
    w: Var,
    b: Var,
}

impl Dense {
    fn new(
        n_in: usize,
        n_out: usize,
        rng: &mut ChaCha8Rng,
        dev: &Device,
    ) -> Result<Self, VisionError> {
        // PyTorch's default for convolutions and linear layers: uniform within 1/sqrt(fan in).
        let k = 1.0 / (n_in as f32).sqrt();
        let mut draw = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| (rng.random::<f32>() * 2.0 - 1.0) * k)
                .collect()
        };
        Ok(Dense {
            w: Var::from_tensor(&Tensor::from_vec(draw(n_in * n_out), (n_in, n_out), dev)?)?,
            b: Var::from_tensor(&Tensor::from_vec(draw(n_out), n_out, dev)?)?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor, VisionError> {
        Ok(x.matmul(self.w.as_tensor())?
            .broadcast_add(self.b.as_tensor())?)
    }

    /// The weights transposed, `[out, in]` row-major (an ONNX Conv kernel `[out, in, k, k]` when
    /// the rows of `w` are ordered (channel, ky, kx)), and the bias.
    fn transposed(&self) -> Result<(Vec<f32>, Vec<f32>), VisionError> {
        Ok((
            self.w
                .as_tensor()
                .t()?
                .contiguous()?
                .flatten_all()?
                .to_vec1()?,
            self.b.as_tensor().to_vec1()?,
        ))
    }

    fn plain(&self) -> Result<(Vec<f32>, Vec<f32>), VisionError> {
        Ok((
            self.w.as_tensor().flatten_all()?.to_vec1()?,
            self.b.as_tensor().to_vec1()?,
        ))
    }
}

/// One camera's encoder: image `[B, 3, H, W]` (normalised) -> features `[B, 64]` in (-1, 1).
pub struct ImageEncoder {
    camera: String,
    width: usize,
    height: usize,
    stem: Dense,
    mix: Dense,
    readout: Dense,
    gamma: Var,
    beta: Var,
}

impl ImageEncoder {
    /// An encoder for `camera`'s images resized to `width` x `height`, weights drawn from `rng`.
    pub fn new(
        camera: &str,
        width: usize,
        height: usize,
        rng: &mut ChaCha8Rng,
        dev: &Device,
    ) -> Result<Self, VisionError> {
        if width < 2 * PATCH
            || height < 2 * PATCH
            || !width.is_multiple_of(PATCH)
            || !height.is_multiple_of(PATCH)
        {
            return Err(VisionError::Data(format!(
                "camera `{camera}`: the encoder reads images whose sides are multiples of \
                 {PATCH} pixels, {} at least; {width}x{height} is not (choose another image size: --image-size of `bc train`, --size of `bench pixels`)",
                2 * PATCH
            )));
        }
        let cells = (width / PATCH) * (height / PATCH);
        Ok(ImageEncoder {
            camera: camera.into(),
            width,
            height,
            stem: Dense::new(3 * PATCH * PATCH, CHANNELS, rng, dev)?,
            mix: Dense::new(CHANNELS, CELL_CHANNELS, rng, dev)?,
            readout: Dense::new(cells * CELL_CHANNELS, FEATURES, rng, dev)?,
            gamma: Var::from_tensor(&Tensor::ones(FEATURES, candle_core::DType::F32, dev)?)?,
            beta: Var::from_tensor(&Tensor::zeros(FEATURES, candle_core::DType::F32, dev)?)?,
        })
    }

    /// Number of features out.
    pub fn features(&self) -> usize {
        FEATURES
    }

    /// The camera.
    pub fn camera(&self) -> &str {
        &self.camera
    }

    /// Input width and height.
    pub fn size(&self) -> (usize, usize) {
        (self.width, self.height)
    }

    /// The trainable tensors.
    pub fn vars(&self) -> Vec<Var> {
        [&self.stem, &self.mix, &self.readout]
            .iter()
            .flat_map(|d| [d.w.clone(), d.b.clone()])
            .chain([self.gamma.clone(), self.beta.clone()])
            .collect()
    }

    /// The convolutions' output, one row of [`CELL_CHANNELS`] per cell, cells row-major within
    /// each image: `[B * fh * fw, CELL_CHANNELS]`.
    fn cells(&self, x: &Tensor) -> Result<Tensor, VisionError> {
        let b = x.dim(0)?;
        let (fw, fh) = (self.width / PATCH, self.height / PATCH);
        // [B, 3, fh, P, fw, P] -> [B, fh, fw, 3, P, P]: one row per patch, (c, ky, kx) inside.
        let patches = x
            .reshape((b, 3, fh, PATCH, fw, PATCH))?
            .permute((0, 2, 4, 1, 3, 5))?
            .contiguous()?
            .reshape((b * fh * fw, 3 * PATCH * PATCH))?;
        let h = self.stem.forward(&patches)?.relu()?;
        Ok(self.mix.forward(&h)?.relu()?)
    }

    /// The feature map before the readout, `[B, 3, H, W]` -> `[B, CELL_CHANNELS, H/4, W/4]`:
    /// what a frozen copy of this encoder gives a learner that sees.
    pub fn feature_map(&self, x: &Tensor) -> Result<Tensor, VisionError> {
        let b = x.dim(0)?;
        let (fw, fh) = (self.width / PATCH, self.height / PATCH);
        Ok(self
            .cells(x)?
            .reshape((b, fh, fw, CELL_CHANNELS))?
            .permute((0, 3, 1, 2))?
            .contiguous()?)
    }

    /// The feature map's shape `[channels, height, width]`.
    pub fn map_shape(&self) -> [usize; 3] {
        [CELL_CHANNELS, self.height / PATCH, self.width / PATCH]
    }

    /// `[B, 3, H, W]` -> `[B, features]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor, VisionError> {
        let b = x.dim(0)?;
        let (fw, fh) = (self.width / PATCH, self.height / PATCH);
        let h = self.cells(x)?;
        // Each cell's channels in turn (row-major cells): a readout with a weight per place.
        let h = self
            .readout
            .forward(&h.reshape((b, fh * fw * CELL_CHANNELS))?)?;
        Ok(reflex_mlp::norm::layer_norm_tanh(
            &h,
            self.gamma.as_tensor(),
            self.beta.as_tensor(),
            LN_EPS,
        )?)
    }

    /// Writes the encoder into `g` with its own image input (named `input`, `[B, 3, H, W]`);
    /// returns the features' value name (`[B, features]`).
    pub fn write_onnx(&self, g: &mut Graph, input: &str) -> Result<String, VisionError> {
        let h = self.write_convolutions(g, input)?;
        // [B, C, fh, fw] -> [B, fh, fw, C] -> [B, cells * C], the order the readout was trained in.
        let nhwc = g.op(
            "Transpose",
            &[&h],
            vec![("perm", Attr::Ints(vec![0, 2, 3, 1]))],
        );
        let cc = CELL_CHANNELS as i64;
        let cells = ((self.width / PATCH) * (self.height / PATCH)) as i64;
        let flat = g.reshape(&nhwc, &[-1, cells * cc]);
        let (w, b) = self.readout.plain()?;
        let y = g.linear(&flat, &w, &b, (cells * cc) as usize, FEATURES);
        let gamma = g.constant(
            "ln_gamma",
            &[FEATURES as i64],
            &self.gamma.as_tensor().to_vec1()?,
        );
        let beta = g.constant(
            "ln_beta",
            &[FEATURES as i64],
            &self.beta.as_tensor().to_vec1()?,
        );
        let y = g.op(
            "LayerNormalization",
            &[&y, &gamma, &beta],
            vec![
                ("axis", Attr::Int(-1)),
                ("epsilon", Attr::Float(LN_EPS as f32)),
            ],
        );
        Ok(g.op("Tanh", &[&y], vec![]))
    }

    /// Writes the convolutions alone with their own image input (named `input`,
    /// `[B, 3, H, W]`); returns the feature map's value name (`[B, CELL_CHANNELS, H/4, W/4]`).
    pub fn write_convolutions(&self, g: &mut Graph, input: &str) -> Result<String, VisionError> {
        let x = g.input(
            input,
            Elem::F32,
            vec![
                batch(),
                Dim::Fixed(3),
                Dim::Fixed(self.height as i64),
                Dim::Fixed(self.width as i64),
            ],
        );
        let (c, cc, p) = (CHANNELS as i64, CELL_CHANNELS as i64, PATCH as i64);
        let mut h = x;
        for (d, c_in, c_out, k) in [(&self.stem, 3, c, p), (&self.mix, c, cc, 1)] {
            let (w, b) = d.transposed()?;
            let w = g.constant("conv_w", &[c_out, c_in, k, k], &w);
            let b = g.constant("conv_b", &[c_out], &b);
            let y = g.op(
                "Conv",
                &[&h, &w, &b],
                vec![
                    ("kernel_shape", Attr::Ints(vec![k, k])),
                    ("strides", Attr::Ints(vec![k, k])),
                ],
            );
            h = g.op("Relu", &[&y], vec![]);
        }
        Ok(h)
    }
}

/// The convolutions of `encoders` (one per camera, each read by its own input
/// `image_<camera>` and giving output `features_<camera>`) as a frozen encoder file for a
/// learner that sees, with its spec.
pub fn frozen_encoder(
    encoders: &[ImageEncoder],
    name: &str,
    provenance: Option<String>,
) -> Result<(Vec<u8>, reflex_policies::features::EncoderSpec), VisionError> {
    use reflex_policies::features::{EncoderCamera, EncoderSpec};
    if encoders.is_empty() {
        return Err(VisionError::Data(
            "a policy without cameras has no image encoder to write".into(),
        ));
    }
    let mut g = Graph::new();
    let mut cameras = vec![];
    for e in encoders {
        let input = crate::image_input_name(e.camera());
        let output = format!("features_{}", e.camera());
        let map = e.write_convolutions(&mut g, &input)?;
        let [c, h, w] = e.map_shape();
        g.output(
            &map,
            &output,
            Elem::F32,
            vec![
                batch(),
                Dim::Fixed(c as i64),
                Dim::Fixed(h as i64),
                Dim::Fixed(w as i64),
            ],
        );
        cameras.push(EncoderCamera {
            camera: e.camera().into(),
            width: e.width as u32,
            height: e.height as u32,
            input,
            output,
            channels: c as u32,
            map_height: h as u32,
            map_width: w as u32,
        });
    }
    let spec = EncoderSpec {
        format: "reflex-encoder".into(),
        version: 1,
        name: name.into(),
        cameras,
        mean: MEAN,
        std: STD,
        provenance,
    };
    Ok((g.to_bytes(name, "reflex frozen image encoder"), spec))
}

/// LayerNorm's epsilon.
const LN_EPS: f64 = 1e-5;

/// Camera frames aligned one to one with the training samples, already resized and normalised
/// exactly as the policy reads them at run time (`reflex_policies::vla::image_to_nchw`).
#[derive(Clone, Debug, Default)]
pub struct Frames {
    /// Camera names, in the policy's input order.
    pub cameras: Vec<String>,
    /// Width the network reads.
    pub width: usize,
    /// Height the network reads.
    pub height: usize,
    /// Per camera, `samples * 3 * height * width` values (NCHW).
    pub data: Vec<Vec<f32>>,
}

impl Frames {
    /// Values in one frame.
    pub fn frame_len(&self) -> usize {
        3 * self.width * self.height
    }

    /// Frames held per camera.
    pub fn len(&self) -> usize {
        self.data
            .first()
            .map_or(0, |d| d.len() / self.frame_len().max(1))
    }

    /// No frames.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps the first `n` frames of every camera.
    pub fn truncate_to(&mut self, n: usize) {
        let len = self.frame_len();
        for d in &mut self.data {
            d.truncate(n * len);
        }
    }

    /// Appends one frame per camera (in `cameras` order), resizing and normalising it.
    pub fn push(&mut self, images: &[reflex_runtime::msg::Image]) {
        for (c, img) in images.iter().enumerate() {
            self.push_camera(c, img);
        }
    }

    /// Appends one frame of camera `c` (index in `cameras`), resizing and normalising it: a
    /// camera's frames can be added one camera after another (each in sample order).
    pub fn push_camera(&mut self, c: usize, image: &reflex_runtime::msg::Image) {
        let n = self.frame_len();
        if self.data.len() <= c {
            self.data.resize(c + 1, vec![]);
        }
        let d = &mut self.data[c];
        let start = d.len();
        d.resize(start + n, 0.0);
        reflex_policies::vla::image_to_nchw(
            image,
            self.width as u32,
            self.height as u32,
            &MEAN,
            &STD,
            &mut d[start..],
        );
    }
}

/// Copies frame `src` (`[3, h, w]`) into `out` shifted by (`dx`, `dy`) pixels, the border
/// replicated: the same as padding by the shift with the edge values and cropping back.
pub fn shifted(src: &[f32], w: usize, h: usize, dx: i64, dy: i64, out: &mut [f32]) {
    for c in 0..3 {
        let plane = &src[c * w * h..(c + 1) * w * h];
        for y in 0..h {
            let sy = (y as i64 + dy).clamp(0, h as i64 - 1) as usize;
            for x in 0..w {
                let sx = (x as i64 + dx).clamp(0, w as i64 - 1) as usize;
                out[c * w * h + y * w + x] = plane[sy * w + sx];
            }
        }
    }
}

/// A seeded source of shifts in `[-max, max]` pixels on each axis.
pub struct Shifts {
    max: i64,
    rng: ChaCha8Rng,
}

impl Shifts {
    /// Shifts of up to `max` pixels drawn from `seed`.
    pub fn new(max: usize, seed: u64) -> Self {
        Shifts {
            max: max as i64,
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// The next (dx, dy).
    pub fn draw(&mut self) -> (i64, i64) {
        if self.max == 0 {
            return (0, 0);
        }
        (
            self.rng.random_range(-self.max..=self.max),
            self.rng.random_range(-self.max..=self.max),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shift_moves_content_and_replicates_the_border() {
        // 3x2 image per channel: values 0..6 row-major, channel c adds 10c.
        let src: Vec<f32> = (0..3)
            .flat_map(|c| (0..6).map(move |i| (i + 10 * c) as f32))
            .collect();
        let mut out = vec![0.0; 18];
        shifted(&src, 3, 2, 1, 0, &mut out);
        // Shifted by one to the right of the source: each pixel reads its right neighbour; the
        // last column repeats the edge.
        assert_eq!(&out[..6], &[1.0, 2.0, 2.0, 4.0, 5.0, 5.0]);
        shifted(&src, 3, 2, 0, -1, &mut out);
        assert_eq!(&out[6..12], &[10.0, 11.0, 12.0, 10.0, 11.0, 12.0]);
        shifted(&src, 3, 2, 0, 0, &mut out);
        assert_eq!(out, src);
    }
}
