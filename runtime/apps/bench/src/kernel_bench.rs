//! `reflex bench kernel`: the learner's matrix kernel ([`reflex_mlp::kernel`]) against the `gemm`
//! crate (candle's CPU products, which the learner used before) on the products of one SAC
//! update, in the same process, alternating.
//!
//! What it answers: the price of computing every product in one order of arithmetic on every
//! processor (the same bits on AVX-512, AVX2 and older machines) instead of letting `gemm` pick
//! its kernel and blocking from the processor. Each product is timed on one thread.

use reflex_mlp::kernel::{self, Path, Rows, Strided};
use std::time::Instant;

/// One product shape, `m x k` by `k x n`, as a layer of the learner computes it.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Shape {
    /// What the product is in a SAC update.
    pub what: &'static str,
    /// Rows of the result (the batch for forward products).
    pub m: usize,
    /// Inner dimension.
    pub k: usize,
    /// Columns of the result.
    pub n: usize,
    /// `a` is read transposed (a weight gradient: activations^T @ output gradient).
    pub a_transposed: bool,
}

/// The products of a 256-wide SAC update at batch 256 (HIL-SERL's, RLPD's size) and of the
/// demo's 128-wide one.
pub const SHAPES: [Shape; 7] = [
    Shape {
        what: "hidden layer forward, 256 wide, batch 256",
        m: 256,
        k: 256,
        n: 256,
        a_transposed: false,
    },
    Shape {
        what: "hidden layer weight gradient, 256 wide, batch 256",
        m: 256,
        k: 256,
        n: 256,
        a_transposed: true,
    },
    Shape {
        what: "first layer forward, 23 inputs, 256 wide, batch 256",
        m: 256,
        k: 23,
        n: 256,
        a_transposed: false,
    },
    Shape {
        what: "hidden layer forward, 128 wide, batch 256",
        m: 256,
        k: 128,
        n: 128,
        a_transposed: false,
    },
    Shape {
        what: "hidden layer forward, 64 wide, batch 100",
        m: 100,
        k: 64,
        n: 64,
        a_transposed: false,
    },
    Shape {
        what: "critic output layer forward, 256 wide, batch 256",
        m: 256,
        k: 256,
        n: 1,
        a_transposed: false,
    },
    Shape {
        what: "critic output layer weight gradient, 256 wide, batch 256",
        m: 256,
        k: 256,
        n: 1,
        a_transposed: true,
    },
];

/// One shape's medians.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ShapeTiming {
    /// The product.
    pub shape: Shape,
    /// reflex's kernel on the processor's fastest path, median microseconds per product.
    pub kernel_p50_us: f64,
    /// The `gemm` crate (one thread), median microseconds per product.
    pub gemm_p50_us: f64,
    /// `gemm_p50_us / kernel_p50_us`: above 1, reflex's kernel is faster.
    pub speedup: f64,
    /// The kernel's rate, billions of floating-point operations (a multiply-add is two) per
    /// second.
    pub kernel_gflop_per_s: f64,
}

/// What `reflex bench kernel` measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct KernelBenchReport {
    /// The kernel path this processor runs (`avx512`, `avx2+fma`, `portable`).
    pub path: &'static str,
    /// Timed repetitions of each product (alternating kernel and `gemm`).
    pub reps: usize,
    /// Per shape.
    pub shapes: Vec<ShapeTiming>,
}

fn values(len: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x % 2000) as f32 / 1000.0 - 1.0
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    reflex_runtime::hist::percentile(&v, 50.0)
}

/// Times each of [`SHAPES`] `reps` times with either implementation, alternating.
pub fn run(reps: usize) -> KernelBenchReport {
    let path = Path::detected();
    let reps = reps.max(1);
    let shapes = SHAPES
        .iter()
        .map(|&s| {
            let a = values(s.m * s.k, 1);
            let b = values(s.k * s.n, 2);
            let mut d = vec![0f32; s.m * s.n];
            let (ars, acs) = if s.a_transposed {
                (1, s.m as isize)
            } else {
                (s.k as isize, 1)
            };
            let mut ours = Vec::with_capacity(reps);
            let mut theirs = Vec::with_capacity(reps);
            for rep in 0..reps + 3 {
                let t0 = Instant::now();
                // SAFETY: `d` holds m rows of n values, borrowed for the call.
                unsafe {
                    kernel::product(
                        path,
                        (s.m, s.k, s.n),
                        Strided {
                            data: &a,
                            start: 0,
                            rs: ars,
                            cs: acs,
                        },
                        Strided {
                            data: &b,
                            start: 0,
                            rs: s.n as isize,
                            cs: 1,
                        },
                        Rows {
                            ptr: d.as_mut_ptr(),
                            rs: s.n,
                        },
                        false,
                    )
                };
                let t1 = Instant::now();
                std::hint::black_box(&d);
                // SAFETY: the operands and the destination are the slices above, with the
                // strides of their shapes; the destination is not read (beta 0, read_dst false).
                unsafe {
                    gemm::gemm(
                        s.m,
                        s.n,
                        s.k,
                        d.as_mut_ptr(),
                        1,
                        s.n as isize,
                        false,
                        a.as_ptr(),
                        acs,
                        ars,
                        b.as_ptr(),
                        1,
                        s.n as isize,
                        0.0,
                        1.0,
                        false,
                        false,
                        false,
                        gemm::Parallelism::None,
                    )
                };
                let t2 = Instant::now();
                std::hint::black_box(&d);
                // The first three are warm-up (packing buffers, caches).
                if rep >= 3 {
                    ours.push((t1 - t0).as_secs_f64() * 1e6);
                    theirs.push((t2 - t1).as_secs_f64() * 1e6);
                }
            }
            let (k50, g50) = (median(ours), median(theirs));
            ShapeTiming {
                shape: s,
                kernel_p50_us: k50,
                gemm_p50_us: g50,
                speedup: g50 / k50,
                kernel_gflop_per_s: 2.0 * (s.m * s.k * s.n) as f64 / k50 / 1e3,
            }
        })
        .collect();
    KernelBenchReport {
        path: path.name(),
        reps,
        shapes,
    }
}
