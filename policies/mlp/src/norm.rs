//! LayerNorm followed by an activation (tanh or ReLU) over the last dimension, as one candle
//! operation with its own backward pass: `y = act((h - mean(h)) / sqrt(var(h) + eps) * gamma +
//! beta)` per row, with one `gamma` and `beta` per group of rows (an ensemble's members: `h` of
//! `[N, B, W]` with `gamma` of `[N, 1, W]`; or one for all rows).
//!
//! The image heads and the seeing policy's encoder end in LayerNorm and tanh, the pixel
//! learner's critics in LayerNorm and ReLU per hidden layer. Composed from candle's tensor
//! operations that was nine passes over the activations, each allocating its result, and tanh
//! from the C library (`tanhf` via `expm1f`): with the backward passes about a fifth of a pixel
//! learner's update (`perf` on `reflex bench pixels`, docs/benchmarks.md). Here the forward is
//! one pass per row and the backward one more; in f32 tanh is a rational function the compiler
//! can vectorise (Eigen's 13/6-degree interpolant, `generic_fast_tanh_float` in
//! Eigen/src/Core/MathFunctionsImpl.h: within a few ulp of tanh on [-9, 9], +-1 outside). f64,
//! used by the finite-difference tests, keeps the exact `tanh`. Devices other than the CPU take
//! the composed form.

use candle_core::{CpuStorage, CustomOp3, D, Layout, Result, Shape, Tensor, WithDType};

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
    /// `max(0, x)`.
    fn relu(self) -> Self;
    /// 1 where `x > 0`, else 0.
    fn step(self) -> Self;
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
    fn relu(self) -> Self {
        self.max(0.0)
    }
    fn step(self) -> Self {
        if self > 0.0 { 1.0 } else { 0.0 }
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
    fn relu(self) -> Self {
        self.max(0.0)
    }
    fn step(self) -> Self {
        if self > 0.0 { 1.0 } else { 0.0 }
    }
}

/// The activation after the normalisation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    /// `tanh` (f32: the rational interpolant).
    Tanh,
    /// `max(0, x)`.
    Relu,
}

impl Act {
    #[inline]
    fn apply<T: Real>(self, z: T) -> T {
        match self {
            Act::Tanh => z.tanh(),
            Act::Relu => z.relu(),
        }
    }

    /// The derivative at the input whose output is `y`.
    #[inline]
    fn slope<T: Real>(self, y: T) -> T {
        match self {
            Act::Tanh => T::of(1.0) - y * y,
            Act::Relu => y.step(),
        }
    }
}

/// The row's mean and `1 / sqrt(var + eps)`.
fn moments<T: Real>(row: &[T], eps: f64) -> (T, T) {
    let w = T::of(row.len() as f64);
    let mean = row.iter().copied().sum::<T>() / w;
    let var = row.iter().map(|&v| (v - mean) * (v - mean)).sum::<T>() / w;
    (mean, T::of(1.0) / (var + T::of(eps)).sqrt())
}

/// Sizes of one call: rows of `width` values, `rows_per_group` consecutive rows sharing a gain
/// and offset.
#[derive(Clone, Copy)]
struct Rows {
    width: usize,
    rows_per_group: usize,
}

fn forward<T: Real>(h: &[T], gamma: &[T], beta: &[T], rows: Rows, eps: f64, act: Act) -> Vec<T> {
    let w = rows.width;
    let mut out = vec![T::of(0.0); h.len()];
    for (r, (row, o)) in h.chunks_exact(w).zip(out.chunks_exact_mut(w)).enumerate() {
        let g0 = r / rows.rows_per_group * w;
        let (g, b) = (&gamma[g0..g0 + w], &beta[g0..g0 + w]);
        let (mean, inv) = moments(row, eps);
        for (((o, &v), &g), &b) in o.iter_mut().zip(row).zip(g).zip(b) {
            *o = act.apply((v - mean) * inv * g + b);
        }
    }
    out
}

/// Gradients of `h`, `gamma` and `beta` from the output `y` and its gradient `dy`.
fn backward<T: Real>(
    h: &[T],
    gamma: &[T],
    y: &[T],
    dy: &[T],
    rows: Rows,
    eps: f64,
    act: Act,
) -> (Vec<T>, Vec<T>, Vec<T>) {
    let w = rows.width;
    let zero = T::of(0.0);
    let (mut dh, mut dg, mut db) = (
        vec![zero; h.len()],
        vec![zero; gamma.len()],
        vec![zero; gamma.len()],
    );
    let (mut xhat, mut dxhat) = (vec![zero; w], vec![zero; w]);
    let inv_w = T::of(1.0 / w as f64);
    for (r, row) in h.chunks_exact(w).enumerate() {
        let g0 = r / rows.rows_per_group * w;
        let (mean, inv) = moments(row, eps);
        let at = r * w;
        let (mut sum_d, mut sum_dx) = (zero, zero);
        for j in 0..w {
            let x = (row[j] - mean) * inv;
            let dz = dy[at + j] * act.slope(y[at + j]);
            dg[g0 + j] = dg[g0 + j] + dz * x;
            db[g0 + j] = db[g0 + j] + dz;
            let d = dz * gamma[g0 + j];
            xhat[j] = x;
            dxhat[j] = d;
            sum_d = sum_d + d;
            sum_dx = sum_dx + d * x;
        }
        let (mean_d, mean_dx) = (sum_d * inv_w, sum_dx * inv_w);
        for (j, out) in dh[at..at + w].iter_mut().enumerate() {
            *out = inv * (dxhat[j] - mean_d - xhat[j] * mean_dx);
        }
    }
    (dh, dg, db)
}

/// The fused operation.
struct LayerNormAct {
    eps: f64,
    act: Act,
    rows: Rows,
}

impl LayerNormAct {
    /// The forward pass on the operands' storage, each with its layout.
    fn forward_on<T: Real>(
        &self,
        h: (&[T], &Layout),
        gamma: (&[T], &Layout),
        beta: (&[T], &Layout),
    ) -> Result<Vec<T>> {
        Ok(forward(
            slice(h.0, h.1, "the input")?,
            slice(gamma.0, gamma.1, "the gain")?,
            slice(beta.0, beta.1, "the offset")?,
            self.rows,
            self.eps,
            self.act,
        ))
    }

    /// The backward pass computed in `T`, the gradients returned in `h`'s type.
    fn backward_on<T: Real + WithDType>(
        &self,
        h: &Tensor,
        gamma: &Tensor,
        y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let v = |t: &Tensor| t.to_dtype(T::DTYPE)?.flatten_all()?.to_vec1::<T>();
        let (a, b, c) = backward(
            &v(h)?,
            &v(gamma)?,
            &v(y)?,
            &v(dy)?,
            self.rows,
            self.eps,
            self.act,
        );
        let (dev, dtype) = (h.device(), h.dtype());
        Ok((
            Tensor::from_vec(a, h.shape(), dev)?.to_dtype(dtype)?,
            Tensor::from_vec(b, gamma.shape(), dev)?.to_dtype(dtype)?,
            Tensor::from_vec(c, gamma.shape(), dev)?.to_dtype(dtype)?,
        ))
    }
}

fn slice<'a, T>(v: &'a [T], l: &Layout, what: &str) -> Result<&'a [T]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&v[a..b]),
        None => candle_core::bail!("layer norm: {what} must be contiguous"),
    }
}

impl CustomOp3 for LayerNormAct {
    fn name(&self) -> &'static str {
        "layer-norm-act"
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
                CpuStorage::F32(self.forward_on((h, l1), (g, l2), (b, l3))?)
            }
            (CpuStorage::F64(h), CpuStorage::F64(g), CpuStorage::F64(b)) => {
                CpuStorage::F64(self.forward_on((h, l1), (g, l2), (b, l3))?)
            }
            _ => candle_core::bail!("layer norm: f32 or f64 operands of one type"),
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
        // f32 in f32; anything else (the tests' f64) in f64, handed back in its own type.
        let (dh, dg, db) = match h.dtype() {
            candle_core::DType::F32 => self.backward_on::<f32>(h, gamma, y, dy)?,
            _ => self.backward_on::<f64>(h, gamma, y, dy)?,
        };
        Ok((Some(dh), Some(dg), Some(db)))
    }
}

/// The composed candle form (for devices other than the CPU, and the tests).
pub fn layer_norm_act_composed(
    h: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f64,
    act: Act,
) -> Result<Tensor> {
    let mean = h.mean_keepdim(D::Minus1)?;
    let centred = h.broadcast_sub(&mean)?;
    let var = centred.sqr()?.mean_keepdim(D::Minus1)?;
    let normed = centred.broadcast_div(&(var + eps)?.sqrt()?)?;
    let z = normed.broadcast_mul(gamma)?.broadcast_add(beta)?;
    match act {
        Act::Tanh => z.tanh(),
        Act::Relu => z.relu(),
    }
}

/// `act(LayerNorm(h) * gamma + beta)` over `h`'s last dimension of `W` values. `gamma` and
/// `beta` hold `G * W` values (any shape, e.g. `[W]` or an ensemble's `[N, 1, W]`), group `g`'s
/// applying to the `g`-th of `G` equal runs of consecutive rows.
pub fn layer_norm_act(
    h: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f64,
    act: Act,
) -> Result<Tensor> {
    let width = h.dim(D::Minus1)?;
    let rows = h.elem_count() / width.max(1);
    let params = gamma.elem_count();
    let groups = params / width.max(1);
    if width == 0
        || !params.is_multiple_of(width)
        || beta.elem_count() != params
        || groups == 0
        || !rows.is_multiple_of(groups)
    {
        candle_core::bail!(
            "layer norm over rows of {width} values ({rows} rows) with {params} gains and {} offsets",
            beta.elem_count()
        );
    }
    if !h.device().is_cpu() {
        return layer_norm_act_composed(h, gamma, beta, eps, act);
    }
    h.contiguous()?.apply_op3(
        &gamma.contiguous()?,
        &beta.contiguous()?,
        LayerNormAct {
            eps,
            act,
            rows: Rows {
                width,
                rows_per_group: rows / groups,
            },
        },
    )
}

/// [`layer_norm_act`] with tanh and one gain and offset for all rows.
pub fn layer_norm_tanh(h: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f64) -> Result<Tensor> {
    layer_norm_act(h, gamma, beta, eps, Act::Tanh)
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

    /// Values and every gradient of the fused operation against the composed candle form, for
    /// both activations, one gain for all rows and one per ensemble member.
    #[test]
    fn values_and_gradients_match_the_composed_form() {
        let dev = Device::Cpu;
        let (members, rows, w) = (3, 5, 7);
        for dtype in [DType::F64, DType::F32] {
            for act in [Act::Tanh, Act::Relu] {
                for per_member in [false, true] {
                    let t = |v: Vec<f64>, shape: &[usize]| {
                        Var::from_tensor(
                            &Tensor::from_vec(v, shape, &dev)
                                .unwrap()
                                .to_dtype(dtype)
                                .unwrap(),
                        )
                        .unwrap()
                    };
                    let p_shape: &[usize] = if per_member { &[members, 1, w] } else { &[w] };
                    let np = p_shape.iter().product();
                    let h = t(values(1, members * rows * w, 2.0), &[members, rows, w]);
                    let g = t(
                        values(2, np, 0.5).iter().map(|v| 1.0 + v).collect(),
                        p_shape,
                    );
                    let b = t(values(3, np, 0.3), p_shape);
                    let probe = Tensor::from_vec(
                        values(4, members * rows * w, 1.0),
                        (members, rows, w),
                        &dev,
                    )
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                    let run = |fused: bool| {
                        let (hh, gg, bb) = (h.as_tensor(), g.as_tensor(), b.as_tensor());
                        let y = if fused {
                            layer_norm_act(hh, gg, bb, 1e-5, act).unwrap()
                        } else {
                            layer_norm_act_composed(hh, gg, bb, 1e-5, act).unwrap()
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
                                "{dtype:?} {act:?} per member {per_member}, output {k}: fused {x}, composed {y}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn parameters_that_do_not_divide_the_rows_are_refused() {
        let dev = Device::Cpu;
        let h = Tensor::zeros((4, 6), DType::F32, &dev).unwrap();
        let p = |n: usize| Tensor::ones(n, DType::F32, &dev).unwrap();
        let e = layer_norm_act(&h, &p(5), &p(5), 1e-5, Act::Relu)
            .unwrap_err()
            .to_string();
        assert!(e.contains("rows of 6 values (4 rows) with 5 gains"), "{e}");
        let e = layer_norm_act(&h, &p(18), &p(18), 1e-5, Act::Relu)
            .unwrap_err()
            .to_string();
        assert!(e.contains("with 18 gains"), "{e}");
        assert!(layer_norm_act(&h, &p(12), &p(12), 1e-5, Act::Relu).is_ok());
    }
}
