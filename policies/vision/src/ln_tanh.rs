//! LayerNorm followed by tanh over the last dimension, as one candle operation with its own
//! backward pass: `y = tanh((h - mean(h)) / sqrt(var(h) + eps) * gamma + beta)` per row.
//!
//! The image heads and the seeing base policy's encoder end this way. Composed from candle's
//! tensor operations it was nine passes over `[B, width]`, each allocating its result, plus a
//! tanh from the C library (`tanhf` via `expm1f`): together about a fifth of a pixel learner's
//! update (`perf` on `reflex bench pixels`, docs/benchmarks.md). Here the forward is one pass per
//! row and the backward one more, and in f32 the tanh is a rational function the compiler can
//! vectorise (Eigen's 13/6-degree interpolant, `generic_fast_tanh_float` in
//! Eigen/src/Core/MathFunctionsImpl.h: within a few ulp of tanh on [-9, 9], +-1 outside). f64,
//! used by the finite-difference tests, keeps the exact `tanh`. Devices other than the CPU take
//! the composed form.

use candle_core::{CpuStorage, CustomOp3, D, Layout, Result, Shape, Tensor};

/// tanh in f32 by Eigen's rational interpolant (see the module documentation).
#[inline]
#[allow(clippy::excessive_precision)] // the published coefficients, as written there
pub fn fast_tanh(x: f32) -> f32 {
    let x = x.clamp(-9.0, 9.0);
    let x2 = x * x;
    let mut p = -2.760_768_5e-16_f32;
    p = p * x2 + 2.000_187_9e-13;
    p = p * x2 - 8.604_671_5e-11;
    p = p * x2 + 5.122_297_1e-8;
    p = p * x2 + 1.485_722_4e-5;
    p = p * x2 + 6.372_619_3e-4;
    p = p * x2 + 4.893_524_6e-3;
    let mut q = 1.198_258_4e-6_f32;
    q = q * x2 + 1.185_347_1e-4;
    q = q * x2 + 2.268_434_6e-3;
    q = q * x2 + 4.893_525_2e-3;
    // Near +-9 the interpolant overshoots 1 by an ulp; tanh never does.
    (x * p / q).clamp(-1.0, 1.0)
}

/// The float types the operation runs in.
trait Real:
    Copy
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::iter::Sum
{
    fn of(x: f64) -> Self;
    fn sqrt(self) -> Self;
    fn tanh(self) -> Self;
}

impl Real for f32 {
    fn of(x: f64) -> Self {
        x as f32
    }
    fn sqrt(self) -> Self {
        f32::sqrt(self)
    }
    fn tanh(self) -> Self {
        fast_tanh(self)
    }
}

impl Real for f64 {
    fn of(x: f64) -> Self {
        x
    }
    fn sqrt(self) -> Self {
        f64::sqrt(self)
    }
    fn tanh(self) -> Self {
        f64::tanh(self)
    }
}

/// The row's mean and `1 / sqrt(var + eps)`.
fn moments<T: Real>(row: &[T], eps: f64) -> (T, T) {
    let w = T::of(row.len() as f64);
    let mean = row.iter().copied().sum::<T>() / w;
    let var = row.iter().map(|&v| (v - mean) * (v - mean)).sum::<T>() / w;
    (mean, T::of(1.0) / (var + T::of(eps)).sqrt())
}

fn forward<T: Real>(h: &[T], gamma: &[T], beta: &[T], eps: f64) -> Vec<T> {
    let w = gamma.len();
    let mut out = Vec::with_capacity(h.len());
    for row in h.chunks_exact(w) {
        let (mean, inv) = moments(row, eps);
        out.extend(
            row.iter()
                .zip(gamma)
                .zip(beta)
                .map(|((&v, &g), &b)| ((v - mean) * inv * g + b).tanh()),
        );
    }
    out
}

/// Gradients of `h`, `gamma` and `beta` from the output `y` and its gradient `dy`.
fn backward<T: Real>(
    h: &[T],
    gamma: &[T],
    y: &[T],
    dy: &[T],
    eps: f64,
) -> (Vec<T>, Vec<T>, Vec<T>) {
    let w = gamma.len();
    let zero = T::of(0.0);
    let (mut dh, mut dg, mut db) = (vec![zero; h.len()], vec![zero; w], vec![zero; w]);
    let mut xhat = vec![zero; w];
    let mut dxhat = vec![zero; w];
    let inv_w = T::of(1.0 / w as f64);
    for (r, row) in h.chunks_exact(w).enumerate() {
        let (mean, inv) = moments(row, eps);
        let at = r * w;
        let (mut sum_d, mut sum_dx) = (zero, zero);
        for j in 0..w {
            let x = (row[j] - mean) * inv;
            let t = y[at + j];
            let dz = dy[at + j] * (T::of(1.0) - t * t);
            dg[j] = dg[j] + dz * x;
            db[j] = db[j] + dz;
            let d = dz * gamma[j];
            xhat[j] = x;
            dxhat[j] = d;
            sum_d = sum_d + d;
            sum_dx = sum_dx + d * x;
        }
        let (mean_d, mean_dx) = (sum_d * inv_w, sum_dx * inv_w);
        for j in 0..w {
            dh[at + j] = inv * (dxhat[j] - mean_d - xhat[j] * mean_dx);
        }
    }
    (dh, dg, db)
}

/// The fused operation on `[.., width]`, `gamma` and `beta` of `[width]`.
struct LnTanh {
    eps: f64,
}

fn slice<'a, T>(v: &'a [T], l: &Layout, what: &str) -> Result<&'a [T]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&v[a..b]),
        None => candle_core::bail!("layer norm + tanh: {what} must be contiguous"),
    }
}

impl CustomOp3 for LnTanh {
    fn name(&self) -> &'static str {
        "layer-norm-tanh"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let shape = l1.shape().clone();
        let out = match (s1, s2, s3) {
            (CpuStorage::F32(h), CpuStorage::F32(g), CpuStorage::F32(b)) => {
                CpuStorage::F32(forward(
                    slice(h, l1, "the input")?,
                    slice(g, l2, "the gain")?,
                    slice(b, l3, "the offset")?,
                    self.eps,
                ))
            }
            (CpuStorage::F64(h), CpuStorage::F64(g), CpuStorage::F64(b)) => {
                CpuStorage::F64(forward(
                    slice(h, l1, "the input")?,
                    slice(g, l2, "the gain")?,
                    slice(b, l3, "the offset")?,
                    self.eps,
                ))
            }
            _ => candle_core::bail!("layer norm + tanh: f32 or f64 operands of one type"),
        };
        Ok((out, shape))
    }

    fn bwd(
        &self,
        h: &Tensor,
        gamma: &Tensor,
        _beta: &Tensor,
        y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let w = gamma.elem_count();
        let flat = |t: &Tensor| t.flatten_all();
        let (dh, dg, db) = match h.dtype() {
            candle_core::DType::F32 => {
                let v = |t: &Tensor| flat(t)?.to_vec1::<f32>();
                let (a, b, c) = backward(&v(h)?, &v(gamma)?, &v(y)?, &v(dy)?, self.eps);
                let dev = h.device();
                (
                    Tensor::from_vec(a, h.shape(), dev)?,
                    Tensor::from_vec(b, w, dev)?,
                    Tensor::from_vec(c, w, dev)?,
                )
            }
            _ => {
                let v = |t: &Tensor| flat(&t.to_dtype(candle_core::DType::F64)?)?.to_vec1::<f64>();
                let (a, b, c) = backward(&v(h)?, &v(gamma)?, &v(y)?, &v(dy)?, self.eps);
                let dev = h.device();
                (
                    Tensor::from_vec(a, h.shape(), dev)?.to_dtype(h.dtype())?,
                    Tensor::from_vec(b, w, dev)?.to_dtype(h.dtype())?,
                    Tensor::from_vec(c, w, dev)?.to_dtype(h.dtype())?,
                )
            }
        };
        Ok((
            Some(dh),
            Some(dg.reshape(gamma.shape())?),
            Some(db.reshape(gamma.shape())?),
        ))
    }
}

/// `tanh(LayerNorm(h) * gamma + beta)` over `h`'s last dimension (`gamma`, `beta`: that many
/// values, any shape).
pub fn layer_norm_tanh(h: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f64) -> Result<Tensor> {
    let width = h.dim(D::Minus1)?;
    if gamma.elem_count() != width || beta.elem_count() != width {
        candle_core::bail!(
            "layer norm + tanh over {width} values with {} gains and {} offsets",
            gamma.elem_count(),
            beta.elem_count()
        );
    }
    if !h.device().is_cpu() {
        let mean = h.mean_keepdim(D::Minus1)?;
        let centred = h.broadcast_sub(&mean)?;
        let var = centred.sqr()?.mean_keepdim(D::Minus1)?;
        let normed = centred.broadcast_div(&(var + eps)?.sqrt()?)?;
        return normed.broadcast_mul(gamma)?.broadcast_add(beta)?.tanh();
    }
    h.contiguous()?.apply_op3(
        &gamma.flatten_all()?.contiguous()?,
        &beta.flatten_all()?.contiguous()?,
        LnTanh { eps },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};

    #[test]
    fn the_rational_tanh_is_within_a_few_ulp_of_tanh() {
        let mut worst = 0f64;
        for i in -200_000..=200_000 {
            let x = i as f32 * 1e-4; // [-20, 20]
            let y = fast_tanh(x);
            assert!(y.abs() <= 1.0, "tanh({x}) = {y}");
            let err = (y as f64 - (x as f64).tanh()).abs();
            worst = worst.max(err);
        }
        assert!(worst < 5e-7, "largest error {worst}");
        assert_eq!(fast_tanh(0.0), 0.0);
        assert_eq!(fast_tanh(-30.0), -1.0);
        assert_eq!(fast_tanh(30.0), 1.0);
    }

    /// The composed candle form the operation replaces.
    fn composed(h: &Tensor, g: &Tensor, b: &Tensor) -> Tensor {
        let mean = h.mean_keepdim(D::Minus1).unwrap();
        let c = h.broadcast_sub(&mean).unwrap();
        let var = c.sqr().unwrap().mean_keepdim(D::Minus1).unwrap();
        let n = c
            .broadcast_div(&(var + 1e-5).unwrap().sqrt().unwrap())
            .unwrap();
        n.broadcast_mul(g)
            .unwrap()
            .broadcast_add(b)
            .unwrap()
            .tanh()
            .unwrap()
    }

    fn values(seed: u64, n: usize, scale: f64) -> Vec<f64> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * scale
            })
            .collect()
    }

    #[test]
    fn values_and_gradients_match_the_composed_form() {
        let dev = Device::Cpu;
        let (rows, w) = (5, 7);
        for dtype in [DType::F64, DType::F32] {
            let t = |v: Vec<f64>, shape: &[usize]| {
                Var::from_tensor(
                    &Tensor::from_vec(v, shape, &dev)
                        .unwrap()
                        .to_dtype(dtype)
                        .unwrap(),
                )
                .unwrap()
            };
            let h = t(values(1, rows * w, 2.0), &[rows, w]);
            let g = t(values(2, w, 0.5).iter().map(|v| 1.0 + v).collect(), &[1, w]);
            let b = t(values(3, w, 0.3), &[w]);
            let probe = Tensor::from_vec(values(4, rows * w, 1.0), (rows, w), &dev)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let run = |fused: bool| {
                let y = if fused {
                    layer_norm_tanh(h.as_tensor(), g.as_tensor(), b.as_tensor(), 1e-5).unwrap()
                } else {
                    composed(h.as_tensor(), g.as_tensor(), b.as_tensor())
                };
                let grads = y
                    .mul(&probe)
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .backward()
                    .unwrap();
                let mut out = vec![y.flatten_all().unwrap()];
                for v in [&h, &g, &b] {
                    let gv = grads
                        .get(v.as_tensor())
                        .expect("a gradient for every input");
                    assert_eq!(gv.dims(), v.as_tensor().dims());
                    out.push(gv.flatten_all().unwrap());
                }
                out.iter()
                    .map(|t| t.to_dtype(DType::F64).unwrap().to_vec1::<f64>().unwrap())
                    .collect::<Vec<_>>()
            };
            let tol = if dtype == DType::F64 { 1e-12 } else { 2e-5 };
            for (k, (a, e)) in run(true).iter().zip(run(false)).enumerate() {
                for (x, y) in a.iter().zip(&e) {
                    assert!(
                        (x - y).abs() <= tol * (1.0 + y.abs()),
                        "{dtype:?}, output {k}: fused {x}, composed {y}"
                    );
                }
            }
        }
    }
}
