//! The trainable head a learner that sees puts on each camera's frozen feature map, in SERL's
//! shape (Luo et al. 2024, serl_launcher's `SpatialLearnedEmbeddings` pooling and bottleneck;
//! ../shared/design/recipes.md, "Learning from pixels"):
//!
//! 1. spatial learned embeddings: for every channel `c` of the `C x H x W` map and each of `F`
//!    learned kernels, `e[c, f] = sum_{y,x} map[c, y, x] K[c, y, x, f]` (a weighted sum over the
//!    places, one set of weights per channel and embedding: where something is stays known,
//!    unlike global pooling);
//! 2. a linear layer from the `C * F` embeddings to `width` (256 in SERL);
//! 3. LayerNorm, then tanh.
//!
//! SERL also puts dropout (0.1) after the embeddings during training; reflex leaves it out, so the
//! head computes the same function in training, on the loop and in the exported graph.
//!
//! The head exists three times with one weight layout ([`SpatialHead::flat`]): in candle for
//! training ([`SpatialHead`]), in plain Rust on preallocated buffers for the control loop
//! ([`HeadEval`]), and as ONNX operators for the exported residual ([`write_onnx`]).

use crate::VisionError;
use candle_core::{DType, Device, Tensor, Var};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use reflex_policies::onnx_write::{Attr, Graph};
use serde::{Deserialize, Serialize};

/// Learned embeddings per channel in SERL's head (`num_spatial_blocks`).
pub const EMBEDDINGS: usize = 8;
/// Width of the head's output in SERL (`bottleneck_dim`).
pub const WIDTH: usize = 256;
/// LayerNorm's epsilon.
const LN_EPS: f64 = 1e-5;

/// One camera's feature map as the frozen encoder produces it: `[channels, height, width]`,
/// row-major (NCHW without the batch).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeatureShape {
    /// The camera the map comes from.
    pub camera: String,
    /// Channels.
    pub channels: usize,
    /// Rows of places.
    pub height: usize,
    /// Columns of places.
    pub width: usize,
}

impl FeatureShape {
    /// Values in one map.
    pub fn len(&self) -> usize {
        self.channels * self.places()
    }

    /// A map without values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Places (`height * width`).
    pub fn places(&self) -> usize {
        self.height * self.width
    }
}

/// The sizes of one head: its input map, embeddings per channel and output width.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeadDims {
    /// Input channels.
    pub channels: usize,
    /// Input places (`height * width`).
    pub places: usize,
    /// Learned embeddings per channel.
    pub embeddings: usize,
    /// Output width.
    pub width: usize,
}

impl HeadDims {
    /// The head of `shape` with `embeddings` per channel and `width` outputs.
    pub fn new(shape: &FeatureShape, embeddings: usize, width: usize) -> Self {
        HeadDims {
            channels: shape.channels,
            places: shape.places(),
            embeddings,
            width,
        }
    }

    /// Values in the map the head reads.
    pub fn input_len(&self) -> usize {
        self.channels * self.places
    }

    fn pooled(&self) -> usize {
        self.channels * self.embeddings
    }

    /// Values in the flat weight vector ([`SpatialHead::flat`]): kernel, linear weight and bias,
    /// LayerNorm gain and offset.
    pub fn weights_len(&self) -> usize {
        self.input_len() * self.embeddings + self.pooled() * self.width + 3 * self.width
    }
}

/// The head in candle: kernel `[C, places, F]`, linear `[C F, width]` and `[width]`, LayerNorm
/// gain and offset `[width]`.
pub struct SpatialHead {
    dims: HeadDims,
    kernel: Var,
    w: Var,
    b: Var,
    gamma: Var,
    beta: Var,
}

impl SpatialHead {
    /// A head with fresh weights of `dtype`: the kernel normal with standard deviation
    /// `1 / sqrt(C * places)` (SERL's LeCun-normal over the whole map), the linear layer uniform
    /// within `1 / sqrt(fan in)`, LayerNorm at identity.
    pub fn new(
        dims: HeadDims,
        rng: &mut ChaCha8Rng,
        dtype: DType,
        dev: &Device,
    ) -> Result<Self, VisionError> {
        if dims.channels == 0 || dims.places == 0 || dims.embeddings == 0 || dims.width == 0 {
            return Err(VisionError::Data(format!(
                "an image head needs a non-empty feature map, embeddings and width; got {dims:?}"
            )));
        }
        let std = 1.0 / (dims.input_len() as f32).sqrt();
        let kernel: Vec<f32> = (0..dims.input_len() * dims.embeddings)
            .map(|_| std * <StandardNormal as Distribution<f32>>::sample(&StandardNormal, rng))
            .collect();
        let k = 1.0 / (dims.pooled() as f32).sqrt();
        let mut draw = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| (rng.random::<f32>() * 2.0 - 1.0) * k)
                .collect()
        };
        let w = draw(dims.pooled() * dims.width);
        let b = draw(dims.width);
        let var = |v: Vec<f32>, shape: &[usize]| -> Result<Var, VisionError> {
            Ok(Var::from_tensor(
                &Tensor::from_vec(v, shape, dev)?.to_dtype(dtype)?,
            )?)
        };
        Ok(SpatialHead {
            kernel: var(kernel, &[dims.channels, dims.places, dims.embeddings])?,
            w: var(w, &[dims.pooled(), dims.width])?,
            b: var(b, &[dims.width])?,
            gamma: var(vec![1.0; dims.width], &[dims.width])?,
            beta: var(vec![0.0; dims.width], &[dims.width])?,
            dims,
        })
    }

    /// Its sizes.
    pub fn dims(&self) -> &HeadDims {
        &self.dims
    }

    /// The trainable tensors, in the flat layout's order.
    pub fn vars(&self) -> Vec<Var> {
        vec![
            self.kernel.clone(),
            self.w.clone(),
            self.b.clone(),
            self.gamma.clone(),
            self.beta.clone(),
        ]
    }

    /// `[B, C * places]` -> `[B, width]` in (-1, 1).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor, VisionError> {
        let p = |v: &Var| v.as_tensor().clone();
        let d = &self.dims;
        let n = x.dim(0)?;
        // [B, C, places] -> [C, B, places] @ [C, places, F] -> [C, B, F] -> [B, C F].
        let pooled = x
            .reshape((n, d.channels, d.places))?
            .transpose(0, 1)?
            .contiguous()?
            .matmul(&p(&self.kernel))?
            .transpose(0, 1)?
            .contiguous()?
            .reshape((n, d.pooled()))?;
        let h = pooled.matmul(&p(&self.w))?.broadcast_add(&p(&self.b))?;
        Ok(reflex_mlp::norm::layer_norm_tanh(
            &h,
            self.gamma.as_tensor(),
            self.beta.as_tensor(),
            LN_EPS,
        )?)
    }

    /// The weights flattened (as f32) in the layout [`HeadEval`] and [`write_onnx`] read.
    pub fn flat(&self) -> Result<Vec<f32>, VisionError> {
        let mut out = Vec::with_capacity(self.dims.weights_len());
        for v in self.vars() {
            out.extend(
                v.as_tensor()
                    .to_dtype(DType::F32)?
                    .flatten_all()?
                    .to_vec1::<f32>()?,
            );
        }
        Ok(out)
    }

    /// Sets the weights from the flat layout.
    pub fn set_flat(&self, w: &[f32]) -> Result<(), VisionError> {
        if w.len() != self.dims.weights_len() {
            return Err(VisionError::Data(format!(
                "an image head of {:?} takes {} weights, not {}",
                self.dims,
                self.dims.weights_len(),
                w.len()
            )));
        }
        let mut off = 0;
        for v in self.vars() {
            let t = v.as_tensor();
            let n = t.elem_count();
            v.set(
                &Tensor::from_slice(&w[off..off + n], t.dims(), t.device())?.to_dtype(t.dtype())?,
            )?;
            off += n;
        }
        Ok(())
    }
}

/// The head in plain Rust on preallocated buffers (the control loop's copy: no candle, no
/// allocation per step), from the flat layout of [`SpatialHead::flat`].
pub struct HeadEval {
    dims: HeadDims,
    pooled: Vec<f32>,
}

impl HeadEval {
    /// An evaluator for heads of `dims`.
    pub fn new(dims: HeadDims) -> Self {
        HeadEval {
            pooled: vec![0.0; dims.pooled()],
            dims,
        }
    }

    /// Its sizes.
    pub fn dims(&self) -> &HeadDims {
        &self.dims
    }

    /// Writes the head's output for the map `x` (`C * places` values) into `out` (`width`
    /// values) with weights `w`. Returns false, leaving `out` at zero, when a length is wrong.
    pub fn run(&mut self, w: &[f32], x: &[f32], out: &mut [f32]) -> bool {
        let d = &self.dims;
        let (p, f, width) = (d.places, d.embeddings, d.width);
        if w.len() != d.weights_len() || x.len() != d.input_len() || out.len() != width {
            out.fill(0.0);
            return false;
        }
        let (kernel, rest) = w.split_at(d.input_len() * f);
        let (lin, rest) = rest.split_at(d.pooled() * width);
        let (bias, rest) = rest.split_at(width);
        let (gamma, beta) = rest.split_at(width);
        for c in 0..d.channels {
            let e = &mut self.pooled[c * f..(c + 1) * f];
            e.fill(0.0);
            let k = &kernel[c * p * f..(c + 1) * p * f];
            for (v, row) in x[c * p..(c + 1) * p].iter().zip(k.chunks_exact(f)) {
                for (acc, kv) in e.iter_mut().zip(row) {
                    *acc += v * kv;
                }
            }
        }
        out.copy_from_slice(bias);
        for (v, row) in self.pooled.iter().zip(lin.chunks_exact(width)) {
            for (acc, wv) in out.iter_mut().zip(row) {
                *acc += v * wv;
            }
        }
        let mean = out.iter().sum::<f32>() / width as f32;
        let var = out.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / width as f32;
        let inv = 1.0 / (var + LN_EPS as f32).sqrt();
        for ((o, g), b) in out.iter_mut().zip(gamma).zip(beta) {
            *o = ((*o - mean) * inv * g + b).tanh();
        }
        true
    }
}

/// Writes a head with flat weights `w` into `g` on the value `x` (`[B, C * places]`), its
/// weights named `<prefix>.kernel`, `.w`, `.b`, `.gamma`, `.beta`; returns the output's value
/// name (`[B, width]`).
pub fn write_onnx(g: &mut Graph, x: &str, dims: &HeadDims, prefix: &str, w: &[f32]) -> String {
    assert_eq!(
        w.len(),
        dims.weights_len(),
        "head weights and dims disagree"
    );
    let (c, p, f, width) = (
        dims.channels as i64,
        dims.places as i64,
        dims.embeddings as i64,
        dims.width as i64,
    );
    let mut off = 0;
    let mut take = |n: usize| {
        let s = &w[off..off + n];
        off += n;
        s
    };
    let kernel = g.named_constant(
        &format!("{prefix}.kernel"),
        &[c, p, f],
        take(dims.input_len() * dims.embeddings),
    );
    let lin = g.named_constant(
        &format!("{prefix}.w"),
        &[c * f, width],
        take(dims.pooled() * dims.width),
    );
    let bias = g.named_constant(&format!("{prefix}.b"), &[width], take(dims.width));
    let gamma = g.named_constant(&format!("{prefix}.gamma"), &[width], take(dims.width));
    let beta = g.named_constant(&format!("{prefix}.beta"), &[width], take(dims.width));
    let perm = || vec![("perm", Attr::Ints(vec![1, 0, 2]))];
    let m = g.reshape(x, &[-1, c, p]);
    let m = g.op("Transpose", &[&m], perm());
    let e = g.op("MatMul", &[&m, &kernel], vec![]);
    let e = g.op("Transpose", &[&e], perm());
    let e = g.reshape(&e, &[-1, c * f]);
    let h = g.op("MatMul", &[&e, &lin], vec![]);
    let h = g.op("Add", &[&h, &bias], vec![]);
    let h = g.op(
        "LayerNormalization",
        &[&h, &gamma, &beta],
        vec![
            ("axis", Attr::Int(-1)),
            ("epsilon", Attr::Float(LN_EPS as f32)),
        ],
    );
    g.op("Tanh", &[&h], vec![])
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn dims() -> HeadDims {
        HeadDims {
            channels: 3,
            places: 6,
            embeddings: 4,
            width: 5,
        }
    }

    fn input(rng: &mut ChaCha8Rng, n: usize, len: usize) -> Vec<f32> {
        (0..n * len)
            .map(|_| rng.random::<f32>() * 2.0 - 1.0)
            .collect()
    }

    /// Every weight's and the input's gradient of a scalar loss on the head's output against
    /// central differences, in f64 so that the comparison measures the backward pass and not
    /// rounding.
    #[test]
    fn the_heads_gradients_match_finite_differences() {
        let dev = Device::Cpu;
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let head = SpatialHead::new(dims(), &mut rng, DType::F64, &dev).unwrap();
        // Move LayerNorm off identity so its gradients are exercised with general values.
        let d = dims();
        let mut w = head.flat().unwrap();
        let n_ln = 2 * d.width;
        let len = w.len();
        for v in &mut w[len - n_ln..] {
            *v += rng.random::<f32>() - 0.5;
        }
        head.set_flat(&w).unwrap();
        let n = 3;
        let x = Var::from_tensor(
            &Tensor::from_vec(input(&mut rng, n, d.input_len()), (n, d.input_len()), &dev)
                .unwrap()
                .to_dtype(DType::F64)
                .unwrap(),
        )
        .unwrap();
        let probe = Tensor::from_vec(input(&mut rng, n, d.width), (n, d.width), &dev)
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap();
        let loss = |h: &SpatialHead, x: &Tensor| -> Tensor {
            h.forward(x)
                .unwrap()
                .mul(&probe)
                .unwrap()
                .sum_all()
                .unwrap()
        };
        let grads = loss(&head, x.as_tensor()).backward().unwrap();
        let eps = 1e-6;
        let mut checked = 0;
        let mut vars = head.vars();
        vars.push(x.clone());
        for v in vars {
            let g = grads
                .get(&v)
                .expect("every weight and the input get a gradient")
                .flatten_all()
                .unwrap()
                .to_vec1::<f64>()
                .unwrap();
            let base = v
                .as_tensor()
                .flatten_all()
                .unwrap()
                .to_vec1::<f64>()
                .unwrap();
            for (i, gi) in g.iter().enumerate() {
                let at = |delta: f64| -> f64 {
                    let mut p = base.clone();
                    p[i] += delta;
                    v.set(&Tensor::from_vec(p, v.as_tensor().dims(), &dev).unwrap())
                        .unwrap();
                    loss(&head, x.as_tensor()).to_scalar::<f64>().unwrap()
                };
                let numeric = (at(eps) - at(-eps)) / (2.0 * eps);
                v.set(&Tensor::from_vec(base.clone(), v.as_tensor().dims(), &dev).unwrap())
                    .unwrap();
                assert!(
                    (numeric - gi).abs() <= 1e-6 * (1.0 + numeric.abs()),
                    "gradient {i} of a {:?} tensor: backward {gi}, finite differences {numeric}",
                    v.as_tensor().dims()
                );
                checked += 1;
            }
        }
        assert_eq!(checked, d.weights_len() + n * d.input_len());
    }

    #[test]
    fn the_plain_rust_head_computes_what_candle_computes() {
        let dev = Device::Cpu;
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let d = HeadDims {
            channels: 8,
            places: 16,
            embeddings: EMBEDDINGS,
            width: 32,
        };
        let head = SpatialHead::new(d.clone(), &mut rng, DType::F32, &dev).unwrap();
        let n = 4;
        let xs = input(&mut rng, n, d.input_len());
        let want = head
            .forward(&Tensor::from_slice(&xs, (n, d.input_len()), &dev).unwrap())
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        let w = head.flat().unwrap();
        let mut eval = HeadEval::new(d.clone());
        let mut out = vec![0.0; d.width];
        for (r, row) in want.iter().enumerate() {
            assert!(eval.run(
                &w,
                &xs[r * d.input_len()..(r + 1) * d.input_len()],
                &mut out
            ));
            for (a, b) in out.iter().zip(row) {
                assert!((a - b).abs() < 1e-5, "{a} vs {b}");
            }
        }
        // Wrong lengths give zeros, never a panic.
        assert!(!eval.run(&w[1..], &xs[..d.input_len()], &mut out));
        assert!(out.iter().all(|v| *v == 0.0));
    }
}
