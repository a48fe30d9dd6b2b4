//! The learner's layer operations in candle: a matrix product whose backward computes only the
//! gradients somebody needs, and bias + ReLU fused in one pass each way (the pixel learner and
//! the ONNX-checked reference path train through these; the state-only update is by hand, in
//! [`crate::ensemble`]).

use crate::gemm::Gemm;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};

fn f32s<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<&'a [f32]> {
    match (s, l.contiguous_offsets()) {
        (CpuStorage::F32(v), Some((a, b))) => Ok(&v[a..b]),
        _ => candle_core::bail!("{what}: expected contiguous f32 storage"),
    }
}

/// `a @ b` (2-D, or 3-D batched) whose backward computes only the gradients somebody needs.
///
/// candle's own matmul computes both operands' gradients whatever they are. A learner update
/// wastes two of them: the gradient of a data input (the first layer's input in the critic and
/// actor updates) and the critic's weight gradients in the actor update, where the critic only
/// passes gradients through to the action. Here an operand that is not tracked (plain data, or
/// a weight detached for the actor update) gets none: the same numbers, fewer matrix products.
struct NeededGradsMatmul;

impl CustomOp2 for NeededGradsMatmul {
    fn name(&self) -> &'static str {
        "matmul (needed gradients only)"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        Gemm.cpu_fwd(s1, l1, s2, l2)
    }

    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let r = a.rank();
        // Read transposed in place (strided), computed on the learner's threads.
        let ga = if a.track_op() {
            Some(grad.apply_op2_no_bwd(&b.transpose(r - 2, r - 1)?, &Gemm)?)
        } else {
            None
        };
        let gb = if b.track_op() {
            Some(a.transpose(r - 2, r - 1)?.apply_op2_no_bwd(grad, &Gemm)?)
        } else {
            None
        };
        Ok((ga, gb))
    }
}

/// `a @ b`, computing in backward only the gradients of operands that are tracked.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    a.apply_op2(b, NeededGradsMatmul)
}

/// `relu(h + b)` for `h` `[N, B, O]` and a bias `b` `[N, 1, O]`, in one pass each way.
///
/// The separate operations it replaces (a broadcast add, a ReLU, and in backward a comparison
/// against a zeroed tensor, a conversion, a product and a reduction) each allocated a tensor of
/// the layer's size. The arithmetic is theirs: ReLU passes the gradient where `h + b >= 0`
/// (multiplying by 1 or 0), and the bias gradient is the sum over the batch.
struct BiasRelu;

fn bias_dims(h: &Layout, b: &Layout) -> Result<(usize, usize, usize)> {
    let (n, rows, o) = h.shape().dims3()?;
    if b.shape().dims3()? != (n, 1, o) {
        candle_core::bail!("bias {:?} for activations {:?}", b.dims(), h.dims());
    }
    Ok((n, rows, o))
}

impl CustomOp2 for BiasRelu {
    fn name(&self) -> &'static str {
        "bias + relu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (n, rows, o) = bias_dims(l1, l2)?;
        let (h, b) = (f32s(s1, l1, self.name())?, f32s(s2, l2, self.name())?);
        // Extended row by row rather than zero-filled and then written.
        let mut out = Vec::with_capacity(h.len());
        for (k, src) in h.chunks_exact(o).enumerate() {
            let bias = &b[(k / rows) * o..(k / rows + 1) * o];
            out.extend(src.iter().zip(bias).map(|(x, c)| (x + c).max(0f32)));
        }
        Ok((CpuStorage::F32(out), Shape::from((n, rows, o))))
    }

    fn bwd(
        &self,
        h: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dpre = h.apply_op3_no_bwd(b, &grad.contiguous()?, &BiasReluGrad)?;
        let db = if b.track_op() {
            Some(dpre.apply_op1_no_bwd(&SumRows)?)
        } else {
            None
        };
        Ok((h.track_op().then_some(dpre), db))
    }
}

/// The gradient before the ReLU: `grad * (h + b >= 0)`.
struct BiasReluGrad;

impl CustomOp3 for BiasReluGrad {
    fn name(&self) -> &'static str {
        "bias + relu gradient"
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
        let (n, rows, o) = bias_dims(l1, l2)?;
        let (h, b) = (f32s(s1, l1, self.name())?, f32s(s2, l2, self.name())?);
        let g = f32s(s3, l3, self.name())?;
        if g.len() != h.len() {
            candle_core::bail!(
                "{}: gradient of {} values for {}",
                self.name(),
                g.len(),
                h.len()
            );
        }
        let mut out = Vec::with_capacity(h.len());
        for (k, (src, gr)) in h.chunks_exact(o).zip(g.chunks_exact(o)).enumerate() {
            let bias = &b[(k / rows) * o..(k / rows + 1) * o];
            out.extend(
                src.iter()
                    .zip(bias)
                    .zip(gr)
                    .map(|((x, c), gv)| gv * if x + c >= 0f32 { 1f32 } else { 0f32 }),
            );
        }
        Ok((CpuStorage::F32(out), Shape::from((n, rows, o))))
    }
}

/// `x` `[N, B, O]` summed over `B` to `[N, 1, O]`, adding the rows in order from zero as
/// candle's reduction does (the same bits), in one contiguous pass instead of an index
/// computation per element.
struct SumRows;

impl CustomOp1 for SumRows {
    fn name(&self) -> &'static str {
        "sum over rows"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (n, rows, o) = l.shape().dims3()?;
        let x = f32s(s, l, self.name())?;
        let mut out = vec![0f32; n * o];
        for (dst, block) in out.chunks_exact_mut(o).zip(x.chunks_exact(rows * o)) {
            for row in block.chunks_exact(o) {
                for (d, v) in dst.iter_mut().zip(row) {
                    *d += v;
                }
            }
        }
        Ok((CpuStorage::F32(out), Shape::from((n, 1, o))))
    }
}

/// `relu(h + b)`, fused (see [`BiasRelu`]).
pub fn bias_relu(h: &Tensor, b: &Tensor) -> Result<Tensor> {
    h.contiguous()?.apply_op2(&b.contiguous()?, BiasRelu)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn uniform(seed: u64, n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| {
                ((((i as u64 + 1) * 2_654_435_761 + seed * 97) % 2000) as f32 - 1000.0) / 1000.0
            })
            .collect()
    }

    fn rand_var(seed: u64, shape: (usize, usize, usize)) -> Var {
        let v = uniform(seed, shape.0 * shape.1 * shape.2);
        Var::from_tensor(&Tensor::from_vec(v, shape, &Device::Cpu).unwrap()).unwrap()
    }

    /// Equal to rounding: candle's products sum in the order its `gemm` picks for the processor,
    /// reflex's in one fixed order ([`crate::kernel`]), so the last bits may differ.
    fn assert_close(x: &[f32], y: &[f32], what: &str) {
        assert_eq!(x.len(), y.len(), "{what}: lengths");
        for (i, (a, b)) in x.iter().zip(y).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                "{what}[{i}]: {a} against candle's {b}"
            );
        }
    }

    fn flat(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    }

    #[test]
    fn the_needed_gradients_matmul_gives_candles_numbers_and_skips_untracked_operands() {
        let (a, b) = (rand_var(1, (2, 5, 4)), rand_var(2, (2, 4, 3)));
        let weights = Tensor::from_vec(uniform(14, 2 * 5 * 3), (2, 5, 3), &Device::Cpu).unwrap();
        let loss = |y: Tensor| y.mul(&weights).unwrap().sum_all().unwrap();
        let ours = loss(matmul(a.as_tensor(), b.as_tensor()).unwrap());
        let theirs = loss(a.as_tensor().matmul(b.as_tensor()).unwrap());
        assert_close(&flat(&ours), &flat(&theirs), "loss");
        let (g1, g2) = (ours.backward().unwrap(), theirs.backward().unwrap());
        for (v, what) in [(&a, "d loss / d a"), (&b, "d loss / d b")] {
            assert_close(&flat(g1.get(v).unwrap()), &flat(g2.get(v).unwrap()), what);
        }
        // A detached right operand gets no gradient; the left one still the same.
        let frozen = b.as_tensor().detach();
        let g = loss(matmul(a.as_tensor(), &frozen).unwrap())
            .backward()
            .unwrap();
        assert!(g.get(&frozen).is_none() && g.get(b.as_tensor()).is_none());
        assert_eq!(flat(g.get(&a).unwrap()), flat(g1.get(&a).unwrap()));
    }

    #[test]
    fn the_fused_bias_relu_gives_candles_numbers_forward_and_backward() {
        let h = rand_var(3, (2, 6, 5));
        let b = rand_var(4, (2, 1, 5));
        // An exact zero before the ReLU, where the gradient's convention matters.
        let mut hv = h
            .as_tensor()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let bv = b
            .as_tensor()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        hv[7] = -bv[2];
        h.set(&Tensor::from_vec(hv, (2, 6, 5), &Device::Cpu).unwrap())
            .unwrap();
        let w = Tensor::from_vec(uniform(7, 60), (2, 6, 5), &Device::Cpu).unwrap();
        let ours = bias_relu(h.as_tensor(), b.as_tensor())
            .unwrap()
            .mul(&w)
            .unwrap()
            .sum_all()
            .unwrap();
        let theirs = h
            .as_tensor()
            .broadcast_add(b.as_tensor())
            .unwrap()
            .relu()
            .unwrap()
            .mul(&w)
            .unwrap()
            .sum_all()
            .unwrap();
        assert_eq!(
            ours.to_scalar::<f32>().unwrap().to_bits(),
            theirs.to_scalar::<f32>().unwrap().to_bits()
        );
        let (g1, g2) = (ours.backward().unwrap(), theirs.backward().unwrap());
        let bits = |t: &Tensor| -> Vec<u32> {
            t.flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        };
        for v in [&h, &b] {
            assert_eq!(bits(g1.get(v).unwrap()), bits(g2.get(v).unwrap()));
        }
    }
}
