//! The learner's matrix products on the CPU, split over threads the learner is given.
//!
//! candle hands its products to the `gemm` crate, which parallelises a product only when it
//! spans several of its cache blocks: a 256x256 layer at batch 256 is one block, so a second
//! core sat idle (measured: `reflex bench learner --threads 2` no faster than one thread). Here
//! the work is split before it reaches `gemm`: an ensemble's members go to different threads, and
//! a single product is cut into bands of rows. Each output element is still one `gemm` dot
//! product over the whole inner dimension, so a split changes which thread computes it, not its
//! value: the results are the same to the bit for any number of threads (a unit test checks).

use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Threads the learner's products may use (1: the calling thread only).
static THREADS: AtomicUsize = AtomicUsize::new(1);
/// The pool the products run on beside the calling thread: one thread fewer than the machine
/// has cores (the caller computes a share itself; a pool thread more would only spin beside it).
static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
/// Products smaller than this (multiply-adds) run on one thread: measured on 2 cores, splitting a
/// 64x64 ensemble layer at batch 100 (819,200) cost more in hand-offs than it saved (1,830 to
/// 1,430 updates/s), a 256x256 one at batch 256 (33.5 million) gained 1.46x.
const SPLIT_MIN_WORK: usize = 4_000_000;

/// Sets how many threads the learner's matrix products use, for the whole process (at least 1,
/// at most the machine's cores). Returns the number in effect.
pub fn set_threads(n: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let n = n.clamp(1, cores);
    THREADS.store(n, Ordering::Relaxed);
    n
}

/// Threads the learner's matrix products use.
pub fn threads() -> usize {
    THREADS.load(Ordering::Relaxed)
}

fn pool() -> &'static rayon::ThreadPool {
    POOL.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        rayon::ThreadPoolBuilder::new()
            .num_threads(cores.saturating_sub(1).max(1))
            .thread_name(|i| format!("reflex-gemm-{i}"))
            .build()
            .expect("the learner's GEMM thread pool (threads could not be started)")
    })
}

/// One operand as `gemm` reads it: where each batch starts and the row/column strides.
#[derive(Clone, Copy)]
struct Operand {
    start: usize,
    batch_stride: usize,
    rs: isize,
    cs: isize,
}

fn operand(l: &Layout, rank: usize) -> Operand {
    let st = l.stride();
    Operand {
        start: l.start_offset(),
        batch_stride: if rank == 3 { st[0] } else { 0 },
        rs: st[rank - 2] as isize,
        cs: st[rank - 1] as isize,
    }
}

/// A pointer that may cross to the pool's threads: each task writes a disjoint band of the
/// output, and the inputs are only read while the call that owns them waits for every task.
#[derive(Clone, Copy)]
struct Shared<T>(T);
// SAFETY: see the type's comment; `run` joins every task before its borrows end.
unsafe impl<T> Send for Shared<T> {}
unsafe impl<T> Sync for Shared<T> {}

/// `a @ b` for strided 2-D or 3-D (batched) f32 operands, with no autograd of its own: the
/// learner's forward products ([`super::nets::matmul`]) and their gradient products.
pub(crate) struct Gemm;

impl CustomOp2 for Gemm {
    fn name(&self) -> &'static str {
        "gemm (split over the learner's threads)"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (a, b) = (l1.dims(), l2.dims());
        let r = a.len();
        if !(2..=3).contains(&r) || b.len() != r || a[r - 1] != b[r - 2] || a[..r - 2] != b[..r - 2]
        {
            candle_core::bail!("gemm of {a:?} and {b:?}");
        }
        let (CpuStorage::F32(x), CpuStorage::F32(y)) = (s1, s2) else {
            candle_core::bail!("gemm: f32 operands expected");
        };
        let (m, k, n) = (a[r - 2], a[r - 1], b[r - 1]);
        let batch = if r == 3 { a[0] } else { 1 };
        let len = batch * m * n;
        let out = if k == 0 {
            vec![0f32; len]
        } else {
            // Not zero-filled first: with `read_dst` false, gemm writes every element of the
            // destination without reading it (a memset of each product was ~5% of an update).
            let mut out = Vec::<f32>::with_capacity(len);
            run(
                (x, operand(l1, r)),
                (y, operand(l2, r)),
                Shared(out.as_mut_ptr()),
                (batch, m, k, n),
            );
            // SAFETY: `run` has written all `len` elements (every batch, every row band, all n
            // columns of each row: the tasks cover [0, batch) x [0, m) exactly).
            unsafe { out.set_len(len) };
            out
        };
        let mut dims = a[..r - 2].to_vec();
        dims.extend([m, n]);
        Ok((CpuStorage::F32(out), Shape::from(dims)))
    }
}

/// Computes every batch's `a @ b` into `dst` (contiguous `[batch, m, n]`, room for all of it,
/// written without being read), split into at most [`threads`] tasks: whole batches when there
/// are enough, otherwise bands of rows.
fn run(
    a: (&[f32], Operand),
    b: (&[f32], Operand),
    dst: Shared<*mut f32>,
    dims: (usize, usize, usize, usize),
) {
    let (batch, m, k, n) = dims;
    let (a, oa) = a;
    let (b, ob) = b;
    let threads = threads();
    let work = batch * m * k * n;
    let tasks = if threads <= 1 || work < SPLIT_MIN_WORK {
        1
    } else {
        threads
    };
    // A task: batches [b0, b1) and, within each, rows [r0, r1).
    let product =
        move |dst: Shared<*mut f32>, (b0, b1): (usize, usize), (r0, r1): (usize, usize)| {
            for i in b0..b1 {
                let pa = oa.start + i * oa.batch_stride;
                let pb = ob.start + i * ob.batch_stride;
                // SAFETY: the offsets and strides come from candle's layouts of `a` and `b` (checked
                // shapes above), every element read lies inside them; the task owns output rows
                // [r0, r1) of batch i, contiguous with row stride n.
                unsafe {
                    gemm::gemm(
                        r1 - r0,
                        n,
                        k,
                        dst.0.add(i * m * n + r0 * n),
                        1,
                        n as isize,
                        false,
                        a.as_ptr().add(pa).offset(r0 as isize * oa.rs),
                        oa.cs,
                        oa.rs,
                        b.as_ptr().add(pb),
                        ob.cs,
                        ob.rs,
                        0.0,
                        1.0,
                        false,
                        false,
                        false,
                        gemm::Parallelism::None,
                    );
                }
            }
        };
    if tasks == 1 {
        product(dst, (0, batch), (0, m));
        return;
    }
    let parts: Vec<((usize, usize), (usize, usize))> = if batch >= tasks {
        (0..tasks)
            .map(|t| ((batch * t / tasks, batch * (t + 1) / tasks), (0, m)))
            .collect()
    } else {
        (0..tasks)
            .map(|t| ((0, batch), (m * t / tasks, m * (t + 1) / tasks)))
            .collect()
    };
    // In place: the calling thread takes the first share itself instead of waiting on the pool.
    pool().in_place_scope(|s| {
        for &(bs, rows) in &parts[1..] {
            s.spawn(move |_| product(dst, bs, rows));
        }
        // The caller's own share, while the others run.
        product(dst, parts[0].0, parts[0].1);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    #[test]
    fn the_split_products_equal_candles_to_the_bit_for_any_thread_count() {
        let dev = Device::Cpu;
        let t = |shape: &[usize], seed: u64| {
            let n: usize = shape.iter().product();
            let v: Vec<f32> = (0..n)
                .map(|i| (((i as u64 * 2_654_435_761 + seed) % 1000) as f32 - 500.0) / 250.0)
                .collect();
            Tensor::from_vec(v, shape, &dev).unwrap()
        };
        // Batched ensemble layers, a single large product, a transposed operand (the gradient
        // products read `a^T` and `b^T` as strided views), and one below the split size.
        let cases = [
            (t(&[2, 256, 64], 1), t(&[2, 64, 96], 2)),
            (t(&[300, 128], 3), t(&[128, 64], 4)),
            (
                t(&[3, 64, 200], 5).transpose(1, 2).unwrap(),
                t(&[3, 64, 50], 6),
            ),
            (t(&[40, 16], 7), t(&[16, 8], 8).t().unwrap().t().unwrap()),
            (
                t(&[5, 128, 96], 9),
                t(&[96, 64], 10).broadcast_as((5, 96, 64)).unwrap(),
            ),
        ];
        for threads in [1, 2, 3] {
            set_threads(threads);
            for (a, b) in &cases {
                let want: Vec<f32> = a
                    .matmul(b)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap();
                let got: Vec<f32> = a
                    .apply_op2_no_bwd(b, &Gemm)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap();
                assert_eq!(want.len(), got.len());
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&want),
                    bits(&got),
                    "{:?} @ {:?} on {threads} threads",
                    a.dims(),
                    b.dims()
                );
            }
        }
        set_threads(1);
    }
}
