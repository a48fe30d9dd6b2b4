//! The learner's matrix products on the CPU, split over threads the learner is given.
//!
//! The arithmetic is [`crate::kernel`]'s: every output element one fused multiply-add chain over
//! the whole inner dimension, in order, the same bits on every x86-64 processor. The `gemm`
//! crate (candle's) parallelises a product only when it spans several of its cache blocks: a
//! 256x256 layer at batch 256 is one block, so a second core sat idle (measured: `reflex bench
//! learner --threads 2` no faster than one thread). Here the work is split before the kernel:
//! an ensemble's members go to different threads, and a single product is cut into bands of
//! rows. A split changes which thread computes an element, not its value: the results are the
//! same to the bit for any number of threads (a unit test checks).
//!
//! [`product`] is the same split for callers that manage their own buffers (the hand-written
//! networks in [`crate::ensemble`]): strided operands and destination, optionally accumulating.

use crate::kernel::{self, Path, Rows, Strided};
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

/// The threads a `threads` setting asks for (`[learner] threads`, `reflex demo --threads`): 0 is
/// one fewer than this machine's cores (at least one), so that a control loop on the same
/// computer keeps its core.
pub fn threads_for(setting: usize) -> usize {
    match setting {
        0 => std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .saturating_sub(1)
            .max(1),
        n => n,
    }
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

/// A matrix operand as the kernel reads it: where each batch starts and the row/column strides.
#[derive(Clone, Copy, Debug)]
pub struct View {
    /// Offset of batch 0's first element.
    pub start: usize,
    /// Distance between consecutive batches (0: the same matrix for every batch).
    pub batch_stride: usize,
    /// Row stride.
    pub rs: isize,
    /// Column stride.
    pub cs: isize,
}

impl View {
    /// A row-major matrix starting at `start` with rows `rs` apart (columns adjacent).
    pub fn rows(start: usize, rs: usize) -> Self {
        View {
            start,
            batch_stride: 0,
            rs: rs as isize,
            cs: 1,
        }
    }

    /// The transpose of this view (rows and columns swapped in place, nothing copied).
    pub fn t(self) -> Self {
        View {
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }

    /// The same view with batches `batch_stride` apart.
    pub fn batched(self, batch_stride: usize) -> Self {
        View {
            batch_stride,
            ..self
        }
    }

    fn of(l: &Layout, rank: usize) -> Self {
        let st = l.stride();
        View {
            start: l.start_offset(),
            batch_stride: if rank == 3 { st[0] } else { 0 },
            rs: st[rank - 2] as isize,
            cs: st[rank - 1] as isize,
        }
    }

    /// One past the largest element index this view reads for `batch` matrices of `rows x cols`
    /// (0 when empty).
    fn extent(&self, batch: usize, rows: usize, cols: usize) -> usize {
        if batch == 0 || rows == 0 || cols == 0 {
            return 0;
        }
        let last = self.start as isize
            + ((batch - 1) * self.batch_stride) as isize
            + (rows as isize - 1) * self.rs
            + (cols as isize - 1) * self.cs;
        last as usize + 1
    }
}

/// The destination of a product: row-major rows `rs` apart, batches `batch_stride` apart.
#[derive(Clone, Copy, Debug)]
pub struct Dst {
    /// Offset of batch 0's first element.
    pub start: usize,
    /// Distance between consecutive batches.
    pub batch_stride: usize,
    /// Row stride (columns are adjacent).
    pub rs: usize,
}

impl Dst {
    /// Contiguous `[batch, m, n]` from the start.
    pub fn contiguous(m: usize, n: usize) -> Self {
        Dst {
            start: 0,
            batch_stride: m * n,
            rs: n,
        }
    }
}

/// One batched product `dst[i] (+)= a[i] @ b[i]` for `i < batch`, each `m x k` by `k x n`.
#[derive(Clone, Copy, Debug)]
pub struct Product {
    /// Matrices in the batch.
    pub batch: usize,
    /// Rows of `a` and of the result.
    pub m: usize,
    /// Columns of `a`, rows of `b`.
    pub k: usize,
    /// Columns of `b` and of the result.
    pub n: usize,
    /// Add to the destination instead of overwriting it.
    pub accumulate: bool,
}

/// A pointer that may cross to the pool's threads: each task writes a disjoint band of the
/// output, and the inputs are only read while the call that owns them waits for every task.
#[derive(Clone, Copy)]
struct Shared<T>(T);
// SAFETY: see the type's comment; `run` joins every task before its borrows end.
unsafe impl<T> Send for Shared<T> {}
// SAFETY: as for `Send`: the tasks share it only to write disjoint bands.
unsafe impl<T> Sync for Shared<T> {}

/// Computes `p` from `a` and `b` (read through their views) into `dst` (written through its
/// layout; read as well when accumulating), split over the learner's threads when the product is
/// big enough. Each output element is one multiply-add chain over the whole inner dimension
/// whatever the split, so the bits do not depend on the number of threads.
///
/// Panics when a view reaches outside its slice, or when the destination's rows or batches
/// overlap (every element must be written by exactly one task).
pub fn product(p: Product, a: (&[f32], View), b: (&[f32], View), dst: (&mut [f32], Dst)) {
    let (a, va) = a;
    let (b, vb) = b;
    let (d, vd) = dst;
    assert!(
        va.extent(p.batch, p.m, p.k) <= a.len(),
        "lhs view {va:?} outside {} values",
        a.len()
    );
    assert!(
        vb.extent(p.batch, p.k, p.n) <= b.len(),
        "rhs view {vb:?} outside {} values",
        b.len()
    );
    if p.batch == 0 || p.m == 0 || p.n == 0 {
        return;
    }
    // Every destination element must belong to one (batch, row, column): rows side by side,
    // and batches either stacked (one after another) or interleaved (column blocks of the same
    // rows, as an ensemble's first layer keeps its members).
    let stacked = vd.batch_stride >= (p.m - 1) * vd.rs + p.n;
    let interleaved = vd.batch_stride >= p.n && (p.batch - 1) * vd.batch_stride + p.n <= vd.rs;
    assert!(
        vd.rs >= p.n && (p.batch == 1 || stacked || interleaved),
        "destination {vd:?} overlaps itself for {p:?}"
    );
    let end = vd.start + (p.batch - 1) * vd.batch_stride + (p.m - 1) * vd.rs + p.n;
    assert!(
        end <= d.len(),
        "destination {vd:?} outside {} values",
        d.len()
    );
    if p.k == 0 {
        if !p.accumulate {
            for i in 0..p.batch {
                for r in 0..p.m {
                    let o = vd.start + i * vd.batch_stride + r * vd.rs;
                    d[o..o + p.n].fill(0.0);
                }
            }
        }
        return;
    }
    run(p, (a, va), (b, vb), (Shared(d.as_mut_ptr()), vd));
}

/// `a @ b` for strided 2-D or 3-D (batched) f32 operands, with no autograd of its own: the
/// learner's candle products (`reflex_learn`'s `matmul`) and their gradient products.
pub struct Gemm;

impl CustomOp2 for Gemm {
    fn name(&self) -> &'static str {
        "gemm (reflex_mlp::kernel, split over the learner's threads)"
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
            // Not zero-filled first: when not accumulating, the kernel writes every element of
            // the destination without reading it (a memset of each product was ~5% of an
            // update).
            let mut out = Vec::<f32>::with_capacity(len);
            run(
                Product {
                    batch,
                    m,
                    k,
                    n,
                    accumulate: false,
                },
                (x, View::of(l1, r)),
                (y, View::of(l2, r)),
                (Shared(out.as_mut_ptr()), Dst::contiguous(m, n)),
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

/// Computes every batch's `a @ b` into `dst` (room for all of it; read only when
/// accumulating), split into at most [`threads`] tasks: whole batches when there are enough,
/// otherwise bands of rows. The callers have checked that the views lie inside their slices.
fn run(p: Product, a: (&[f32], View), b: (&[f32], View), dst: (Shared<*mut f32>, Dst)) {
    let Product {
        batch,
        m,
        k,
        n,
        accumulate,
    } = p;
    let (a, oa) = a;
    let (b, ob) = b;
    let (dst, od) = dst;
    let threads = threads();
    let path = Path::detected();
    let work = batch * m * k * n;
    let tasks = if threads <= 1 || work < SPLIT_MIN_WORK {
        1
    } else {
        threads
    };
    // A task: batches [b0, b1) and, within each, rows [r0, r1) and columns [c0, c1).
    let task = move |dst: Shared<*mut f32>,
                     Share {
                         batches,
                         rows,
                         cols,
                     }: Share| {
        let ((b0, b1), (r0, r1), (c0, c1)) = (batches, rows, cols);
        for i in b0..b1 {
            let pa = oa.start + i * oa.batch_stride;
            let pb = ob.start + i * ob.batch_stride;
            let a = Strided {
                data: a,
                start: (pa as isize + r0 as isize * oa.rs) as usize,
                rs: oa.rs,
                cs: oa.cs,
            };
            let b = Strided {
                data: b,
                start: (pb as isize + c0 as isize * ob.cs) as usize,
                rs: ob.rs,
                cs: ob.cs,
            };
            // SAFETY: the task owns destination rows [r0, r1), columns [c0, c1) of batch i (row
            // stride `od.rs`), inside the destination the caller checked.
            unsafe {
                let rows = Rows {
                    ptr: dst.0.add(od.start + i * od.batch_stride + r0 * od.rs + c0),
                    rs: od.rs,
                };
                kernel::product(path, (r1 - r0, k, c1 - c0), a, b, rows, accumulate);
            }
        }
    };
    let whole = Share {
        batches: (0, batch),
        rows: (0, m),
        cols: (0, n),
    };
    if tasks == 1 {
        task(dst, whole);
        return;
    }
    // Task t's share (computed, not collected: no allocation per product): whole batches when
    // there are enough; otherwise bands of columns, a whole number of the kernel's column
    // blocks each, so that each thread packs only its own panels of `b` (bands of rows would
    // each pack all of `b`); bands of rows when `b` is too narrow to cut.
    let blocks = n.div_ceil(COLUMN_BLOCK);
    let share = move |t: usize| {
        let cut = |len: usize, t: usize| len * t / tasks;
        if batch >= tasks {
            Share {
                batches: (cut(batch, t), cut(batch, t + 1)),
                ..whole
            }
        } else if blocks >= tasks {
            let col = |t: usize| (cut(blocks, t) * COLUMN_BLOCK).min(n);
            Share {
                cols: (col(t), col(t + 1)),
                ..whole
            }
        } else {
            Share {
                rows: (cut(m, t), cut(m, t + 1)),
                ..whole
            }
        }
    };
    // In place: the calling thread takes the first share itself instead of waiting on the pool.
    pool().in_place_scope(|s| {
        for t in 1..tasks {
            let sh = share(t);
            s.spawn(move |_| task(dst, sh));
        }
        task(dst, share(0));
    });
}

/// Columns a thread's band of a split product is a whole number of: the widest tile's (two
/// panels with AVX-512), so that no band ends in a narrower tile than one thread would use.
const COLUMN_BLOCK: usize = 2 * kernel::PANEL;

/// One task's part of a product: half-open ranges of batches, rows and columns.
#[derive(Clone, Copy)]
struct Share {
    batches: (usize, usize),
    rows: (usize, usize),
    cols: (usize, usize),
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    /// A 2-D or 3-D tensor as batches of rows.
    fn batched(t: &Tensor) -> Vec<Vec<Vec<f32>>> {
        match t.rank() {
            2 => vec![t.to_vec2().unwrap()],
            _ => t.to_vec3().unwrap(),
        }
    }

    #[test]
    fn the_split_products_equal_the_scalar_chains_to_the_bit_for_any_thread_count() {
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
            // Above SPLIT_MIN_WORK, so split on two and three threads: bands of columns (a
            // 256x256 layer, with a band ending inside a block), bands of rows (too narrow a
            // `b` to cut), whole batches.
            (t(&[256, 256], 11), t(&[256, 240], 12)),
            (t(&[1100, 256], 13), t(&[256, 20], 14)),
            (t(&[2, 256, 128], 15), t(&[2, 128, 70], 16)),
        ];
        for threads in [1, 2, 3] {
            set_threads(threads);
            for (a, b) in &cases {
                // The definition, read through candle's own indexing of the strided operands.
                let (a3, b3) = (batched(a), batched(b));
                let mut want = Vec::new();
                for (am, bm) in a3.iter().zip(&b3) {
                    for row in am {
                        for c in 0..bm[0].len() {
                            let chain = row
                                .iter()
                                .zip(bm)
                                .fold(0f32, |s, (x, b_row)| x.mul_add(b_row[c], s));
                            want.push(chain);
                        }
                    }
                }
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
