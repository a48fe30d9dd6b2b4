//! The learner's matrix kernel: one order of arithmetic on every x86-64 processor.
//!
//! Why not the `gemm` crate, which candle uses: it picks its micro-kernel (AVX-512, AVX2 + FMA,
//! SSE) and its cache blocking from the processor it runs on, and both decide in which order a
//! dot product's terms are added. A seeded run then reproduced itself on one machine only: on an
//! AVX2-only EPYC, `make demo`'s seed 0 printed other success rates than on the AVX-512 EPYC the
//! README was written on, and its allocations per update (gemm's packing buffers, sized from the
//! caches) broke a test bound (issue 54).
//!
//! Here every output element is one chain of fused multiply-adds over the inner dimension, in
//! order from `0` to `k - 1`, starting from `+0.0`; when accumulating, the chain's result is then
//! added to the destination. A fused multiply-add rounds once, exactly as IEEE 754 defines it,
//! so the chain's value depends on nothing but its inputs. The vector width decides only how many
//! output columns are computed side by side (16 with AVX2, 32 with AVX-512), never the order of
//! a sum, and no block size comes from the caches. The bits are the same with AVX-512, with
//! AVX2 + FMA, and with neither, where `f32::mul_add` is the C library's `fmaf` (exact, slow:
//! only x86-64 processors from before 2013 take that path). A unit test compares every path
//! this processor has against a scalar loop, to the bit; the system test `cpus::` runs the
//! learner as an AVX2-only processor under qemu and compares its parameters with this one's.
//! Off x86-64 the products still go to `gemm` (see the function `elsewhere`).
//!
//! Layout: a tile is `MR` rows of `a` (read in place, one broadcast per element) against one or
//! two panels of [`PANEL`] columns of `b`, copied panel by panel (the last zero-padded past `n`);
//! each panel group meets every block of rows before the next group is read.

// Off x86-64 only `elsewhere` runs; the tiles stay compiled for the portable path's tests.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code, unused_imports))]

use std::cell::RefCell;
use std::sync::OnceLock;

/// The path of this process's products, fixed at the first product (or by [`Path::choose`]).
static CHOSEN: OnceLock<Path> = OnceLock::new();

/// Columns per packed panel of `b`.
pub const PANEL: usize = 16;

/// The instruction set a product runs on. Every path gives the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// 512-bit vectors, 8 rows by 32 columns per tile.
    Avx512,
    /// 256-bit vectors with FMA, 6 rows by 16 columns per tile.
    Avx2Fma,
    /// Whatever the compiler makes of the portable loop (`fmaf` for each multiply-add).
    Portable,
}

impl Path {
    /// The path this process's products run on: the fastest this processor has, unless
    /// [`Path::choose`] pinned another before the first product (looked up once).
    pub fn detected() -> Path {
        *CHOSEN.get_or_init(Path::fastest)
    }

    /// The fastest path this processor runs.
    pub fn fastest() -> Path {
        if Path::Avx512.available() {
            Path::Avx512
        } else if Path::Avx2Fma.available() {
            Path::Avx2Fma
        } else {
            Path::Portable
        }
    }

    /// Pins the path every later product of this process runs on, e.g. AVX2 on an AVX-512
    /// processor, to time what an AVX2-only machine runs (`reflex bench learner --kernel`). The
    /// bits do not change (every path computes the same sums in the same order), only the speed.
    /// Refused when the processor lacks the path, or when products already ran on another one.
    pub fn choose(self) -> Result<(), String> {
        if !self.available() {
            return Err(format!(
                "this processor cannot run the {} kernel path (it has: {})",
                self.name(),
                Path::fastest().name()
            ));
        }
        let now = *CHOSEN.get_or_init(|| self);
        if now != self {
            return Err(format!(
                "the kernel path is already {} in this process; choose {} before the first product",
                now.name(),
                self.name()
            ));
        }
        Ok(())
    }

    /// The path named `avx512`, `avx2` (or `avx2+fma`) or `portable`.
    pub fn parse(name: &str) -> Result<Path, String> {
        match name {
            "avx512" => Ok(Path::Avx512),
            "avx2" | "avx2+fma" => Ok(Path::Avx2Fma),
            "portable" => Ok(Path::Portable),
            other => Err(format!(
                "unknown kernel path '{other}': use avx512, avx2 or portable"
            )),
        }
    }

    /// Whether this processor can run the path.
    pub fn available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                Path::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
                Path::Avx2Fma => {
                    std::arch::is_x86_feature_detected!("avx2")
                        && std::arch::is_x86_feature_detected!("fma")
                }
                Path::Portable => true,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Path::Portable
        }
    }

    /// `avx512`, `avx2+fma` or `portable` (benchmark reports).
    pub fn name(self) -> &'static str {
        match self {
            Path::Avx512 => "avx512",
            Path::Avx2Fma => "avx2+fma",
            Path::Portable => "portable",
        }
    }
}

/// A matrix read through strides: element `(r, c)` at `start + r * rs + c * cs`.
#[derive(Clone, Copy)]
pub struct Strided<'a> {
    /// The values the matrix lies in.
    pub data: &'a [f32],
    /// Index of element `(0, 0)`.
    pub start: usize,
    /// Row stride.
    pub rs: isize,
    /// Column stride.
    pub cs: isize,
}

impl Strided<'_> {
    /// Panics unless every element of a `rows x cols` matrix lies inside `data`.
    fn check(&self, rows: usize, cols: usize, what: &str) {
        assert!(
            self.rs >= 0 && self.cs >= 0,
            "{what}: negative strides ({}, {})",
            self.rs,
            self.cs
        );
        if rows == 0 || cols == 0 {
            return;
        }
        let last = self.start + (rows - 1) * self.rs as usize + (cols - 1) * self.cs as usize;
        assert!(
            last < self.data.len(),
            "{what} of {rows}x{cols} (start {}, strides {} and {}) outside its {} values",
            self.start,
            self.rs,
            self.cs,
            self.data.len()
        );
    }

    fn at(&self, r: usize, c: usize) -> f32 {
        self.data[self.start + r * self.rs as usize + c * self.cs as usize]
    }
}

/// Rows of the destination, each `n` long, `rs` apart, from `ptr` (a pointer, not a slice: the
/// learner's threads write disjoint column blocks of the same rows, so their rows' spans overlap
/// although the elements each writes do not).
#[derive(Clone, Copy)]
pub struct Rows {
    /// Row 0's first element.
    pub ptr: *mut f32,
    /// Row stride.
    pub rs: usize,
}

thread_local! {
    /// The panels of `b` this thread copies (a transposed `b`, or the last, narrower panel):
    /// grown to the largest product once, then reused, so a product allocates nothing in steady
    /// state.
    static PACK: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `MR` rows of `a` as a tile reads them: row `r`'s element `i` at `offs[r] + i * cs`. Rows past
/// the matrix repeat its last row (their results are not stored), so a tile never branches.
#[derive(Clone, Copy)]
struct ARows<'a, const MR: usize> {
    data: &'a [f32],
    offs: [usize; MR],
    cs: usize,
}

impl<'a, const MR: usize> ARows<'a, MR> {
    /// Rows `r0 ..` of `a` (at least one inside it), `k` elements each.
    fn new(a: &Strided<'a>, r0: usize, m: usize, k: usize) -> Self {
        let offs = std::array::from_fn(|r| a.start + (r0 + r).min(m - 1) * a.rs as usize);
        let cs = a.cs as usize;
        // What the tiles' unchecked reads rely on (`product` checked `a` as a whole).
        assert!(offs.iter().all(|o| o + (k - 1) * cs < a.data.len()));
        ARows {
            data: a.data,
            offs,
            cs,
        }
    }
}

/// [`PANEL`] columns of `b` as a tile reads them: row `i`'s values at `start + i * rs ..`.
#[derive(Clone, Copy)]
struct Panel<'a> {
    data: &'a [f32],
    start: usize,
    rs: usize,
}

impl<'a> Panel<'a> {
    fn new(data: &'a [f32], start: usize, rs: usize, k: usize) -> Self {
        // What the tiles' unchecked reads rely on.
        assert!(start + (k - 1) * rs + PANEL <= data.len());
        Panel { data, start, rs }
    }
}

/// `b` copied panel by panel: panel `p`, inner index `i`, column `c` at `(p * k + i) * PANEL + c`,
/// columns past `n` zero. Every panel is copied, also those whose rows `b` holds contiguously:
/// read in place, a panel's rows lie a row of `b` apart (1 KB for a 256-wide layer), so its 256
/// rows fall into a few of the first level cache's sets and were fetched again for every block
/// of rows; copied, a panel (16 KB at k = 256) stays there while every block of rows passes it.
/// `reflex bench kernel`: the 256-wide forward and weight-gradient products 10-20 % faster with
/// the copy than in place, copy included.
struct Panels<'a> {
    copy: &'a [f32],
    k: usize,
}

impl<'a> Panels<'a> {
    fn get(&self, p: usize) -> Panel<'a> {
        Panel::new(self.copy, p * self.k * PANEL, PANEL, self.k)
    }

    /// Copies `b` (`k x n`, checked to lie inside its slice) into `out`'s panels. `out` grows
    /// to the largest product once; nothing is cleared that is then written.
    fn fill(b: &Strided, k: usize, n: usize, out: &mut Vec<f32>) {
        let panels = n.div_ceil(PANEL);
        if out.len() < panels * k * PANEL {
            out.resize(panels * k * PANEL, 0.0);
        }
        let (rs, cs) = (b.rs as usize, b.cs as usize);
        for (p, panel) in out.chunks_exact_mut(k * PANEL).take(panels).enumerate() {
            let c0 = p * PANEL;
            let width = PANEL.min(n - c0);
            if cs == 1 {
                // Rows contiguous: one copy of `width` values per inner index.
                for (i, row) in panel.chunks_exact_mut(PANEL).enumerate() {
                    let s = b.start + i * rs + c0;
                    if width == PANEL {
                        // A fixed length: moved in registers, not by a call to memmove.
                        row.copy_from_slice(&b.data[s..s + PANEL]);
                    } else {
                        row[..width].copy_from_slice(&b.data[s..s + width]);
                        row[width..].fill(0.0);
                    }
                }
            } else {
                // Columns contiguous (a transposed `b`, `rs` 1) or neither: walk each column.
                for c in 0..PANEL {
                    let rows = panel.chunks_exact_mut(PANEL);
                    if c < width {
                        let s = b.start + (c0 + c) * cs;
                        for (i, row) in rows.enumerate() {
                            row[c] = b.data[s + i * rs];
                        }
                    } else {
                        rows.for_each(|row| row[c] = 0.0);
                    }
                }
            }
        }
    }
}

/// `dst (+)= a @ b` for `a` `m x k`, `b` `k x n`, on `path` (which must be
/// [available](Path::available)).
///
/// Panics when an operand reaches outside its slice, or when `path` is not available.
///
/// # Safety
/// For every row `r < m`, the `n` elements from `dst.ptr + r * dst.rs` must be valid for writes
/// (and initialised when `accumulate`), and nothing else may access them during the call.
pub unsafe fn product(
    path: Path,
    (m, k, n): (usize, usize, usize),
    a: Strided,
    b: Strided,
    dst: Rows,
    accumulate: bool,
) {
    assert!(
        path.available(),
        "the {} path on a processor without it",
        path.name()
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        // Empty sums: +0.0, added or stored.
        for r in 0..m {
            for c in 0..n {
                // SAFETY: row r < m, column c < n (the caller's rows).
                unsafe {
                    let o = dst.ptr.add(r * dst.rs + c);
                    o.write(if accumulate { *o + 0.0 } else { 0.0 });
                }
            }
        }
        return;
    }
    a.check(m, k, "lhs");
    b.check(k, n, "rhs");
    #[cfg(not(target_arch = "x86_64"))]
    {
        // SAFETY: the operands were checked above; the destination is the caller's contract.
        unsafe { elsewhere(path, (m, k, n), a, b, dst, accumulate) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    PACK.with_borrow_mut(|copy| {
        let job = Job {
            m,
            k,
            n,
            a,
            dst,
            accumulate,
        };
        #[cfg(target_arch = "x86_64")]
        if n <= NARROW && a.rs == 1 && path != Path::Portable {
            // SAFETY: `available` checked the path's features above; `job` carries the caller's
            // contract.
            unsafe { narrow::product(path, &job, &b) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if n <= NARROW_ROW_MAJOR && a.cs == 1 && path != Path::Portable {
            // SAFETY: both vector paths have AVX2 and FMA (`available` checked them above);
            // `job` carries the caller's contract.
            unsafe { narrow::row_major(&job, &b) };
            return;
        }
        Panels::fill(&b, k, n, copy);
        let panels = Panels { copy, k };
        match path {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `available` checked AVX-512F above; `job` carries the caller's contract.
            Path::Avx512 => unsafe { rows_avx512(&job, &panels) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `available` checked AVX2 and FMA above; `job` carries the caller's contract.
            Path::Avx2Fma => unsafe { rows_avx2(&job, &panels) },
            // SAFETY: `job` carries the caller's contract.
            _ => unsafe { rows::<6, 1>(&job, &panels, tile::<6, 1>, tile::<6, 1>) },
        }
    });
}

/// Off x86-64 (a Jetson's or a Raspberry Pi's ARM cores) the products go to the `gemm` crate and
/// its NEON kernels, as before this module: the tiles here have no NEON version yet, and the
/// portable one cannot be measured on the x86 machines reflex is built on. The bits there are
/// `gemm`'s, the same from run to run on one machine, not necessarily the same as on x86-64.
///
/// # Safety
/// [`product`]'s contract, with the operands checked.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn elsewhere(
    _path: Path,
    (m, k, n): (usize, usize, usize),
    a: Strided,
    b: Strided,
    dst: Rows,
    accumulate: bool,
) {
    // SAFETY: `a` and `b` lie inside their slices (checked by the caller); `dst` is the
    // caller's, m rows of n values `dst.rs` apart.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.ptr,
            1,
            dst.rs as isize,
            accumulate,
            a.data.as_ptr().add(a.start),
            a.cs,
            a.rs,
            b.data.as_ptr().add(b.start),
            b.cs,
            b.rs,
            if accumulate { 1.0 } else { 0.0 },
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

/// One product's operands and destination.
struct Job<'a> {
    m: usize,
    k: usize,
    n: usize,
    a: Strided<'a>,
    dst: Rows,
    accumulate: bool,
}

/// # Safety
/// The processor has AVX-512F and FMA; `job.dst` satisfies [`product`]'s contract.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn rows_avx512(job: &Job, panels: &Panels) {
    // SAFETY: this function's contract.
    unsafe { rows::<8, 2>(job, panels, x86::tile_avx512::<2>, x86::tile_avx512::<1>) }
}

/// # Safety
/// The processor has AVX2 and FMA; `job.dst` satisfies [`product`]'s contract.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rows_avx2(job: &Job, panels: &Panels) {
    // SAFETY: this function's contract.
    unsafe { rows::<6, 1>(job, panels, x86::tile_avx2, x86::tile_avx2) }
}

/// Where a tile puts its `MR x (NP * PANEL)` results: row `r` from `rows[r]`, written, or added
/// to what is there when `accumulate` (`dst + chain`, one rounding, as the definition says).
#[derive(Clone, Copy)]
struct Out<const MR: usize> {
    rows: [*mut f32; MR],
    accumulate: bool,
}

/// A tile's function: `MR` rows of `a` against `NP` panels of `b` into `out` (see [`tile`]).
///
/// # Safety (of calling one)
/// The processor runs the tile; each `out.rows[r]` is valid for `NP * PANEL` writes (and reads
/// when accumulating), and nothing else accesses them during the call.
type Tile<const MR: usize, const NP: usize> = unsafe fn(usize, ARows<MR>, [Panel; NP], Out<MR>);

/// All rows, `MR` at a time, against `NP` panels at a time (`full`), the last odd panel alone
/// (`one`). A whole tile goes straight to the destination from the registers; a tile at the
/// bottom or right edge goes to a scratch tile first and only its part inside the matrix is
/// copied (the same values: the copy adds nothing). Inlined into each path's function, whose
/// instructions the tiles use.
///
/// # Safety
/// The processor runs the tiles; `job.dst` satisfies [`product`]'s contract.
#[inline(always)]
unsafe fn rows<const MR: usize, const NP: usize>(
    job: &Job,
    panels: &Panels,
    full: Tile<MR, NP>,
    one: Tile<MR, 1>,
) {
    let Job {
        m,
        k,
        n,
        a,
        dst,
        accumulate,
    } = *job;
    let count = n.div_ceil(PANEL);
    let mut scratch = [[[0.0f32; PANEL]; NP]; MR];
    // Panels outer, rows inner: a panel group (16 KB per panel at k = 256) stays in the first
    // level cache while every row block of `a` passes it.
    let mut p = 0;
    while p < count {
        let np = NP.min(count - p);
        let c0 = p * PANEL;
        let width = (np * PANEL).min(n - c0);
        for r0 in (0..m).step_by(MR) {
            let mr = MR.min(m - r0);
            let ar = ARows::<MR>::new(&a, r0, m, k);
            let whole = mr == MR && width == NP * PANEL;
            let out = if whole {
                Out {
                    // SAFETY: rows r0 .. r0 + MR <= m, columns c0 .. c0 + NP * PANEL <= n: the
                    // caller's rows (`product`'s contract).
                    rows: std::array::from_fn(|r| unsafe { dst.ptr.add((r0 + r) * dst.rs + c0) }),
                    accumulate,
                }
            } else {
                Out {
                    rows: std::array::from_fn(|r| scratch[r].as_mut_ptr().cast::<f32>()),
                    accumulate: false,
                }
            };
            // SAFETY: the processor runs the tiles (this function's contract); `out` points at
            // MR rows of NP * PANEL values: the destination's (checked above) or `scratch`'s.
            unsafe {
                if np == NP {
                    full(k, ar, std::array::from_fn(|q| panels.get(p + q)), out);
                } else {
                    // The last panel alone (AVX-512 with an odd number of panels): its elements
                    // are the same chains, so the bits do not change.
                    let out1 = Out {
                        rows: out.rows,
                        accumulate: out.accumulate,
                    };
                    one(k, ar, [panels.get(p)], out1);
                }
            }
            if !whole {
                for (r, tile_r) in scratch.iter().enumerate().take(mr) {
                    let vals = &tile_r.as_flattened()[..width];
                    // SAFETY: row `r0 + r < m`, columns `c0 .. c0 + width <= n`:
                    // inside the caller's rows, which nothing else accesses and which are
                    // initialised when accumulating (`product`'s contract). Overwriting copies
                    // without forming a reference, so the rows may start uninitialised.
                    let o = unsafe { dst.ptr.add((r0 + r) * dst.rs + c0) };
                    if accumulate {
                        // SAFETY: as above; accumulated rows are initialised.
                        let o = unsafe { std::slice::from_raw_parts_mut(o, width) };
                        for (o, v) in o.iter_mut().zip(vals) {
                            *o += *v;
                        }
                    } else {
                        // SAFETY: as above; a copy forms no reference to the destination.
                        unsafe { std::ptr::copy_nonoverlapping(vals.as_ptr(), o, width) };
                    }
                }
            }
        }
        p += np;
    }
}

/// One tile, portably: `MR` rows of `a` against `NP` panels of `b`; element `(r, c)` is
/// `fma(a[r, k-1], b[k-1, c], ... fma(a[r, 0], b[0, c], 0))`, stored or added into `out`.
///
/// # Safety
/// [`Tile`]'s.
unsafe fn tile<const MR: usize, const NP: usize>(
    k: usize,
    a: ARows<MR>,
    b: [Panel; NP],
    out: Out<MR>,
) {
    let mut acc = [[[0.0f32; PANEL]; NP]; MR];
    for i in 0..k {
        for (q, bq) in b.iter().enumerate() {
            let s = bq.start + i * bq.rs;
            let bv = &bq.data[s..s + PANEL];
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let av = a.data[a.offs[r] + i * a.cs];
                for (o, bc) in acc_r[q].iter_mut().zip(bv) {
                    *o = av.mul_add(*bc, *o);
                }
            }
        }
    }
    for (row, acc_r) in out.rows.iter().zip(&acc) {
        // SAFETY: [`Tile`]'s contract: NP * PANEL values from `row`.
        let o = unsafe { std::slice::from_raw_parts_mut(*row, NP * PANEL) };
        for (o, v) in o.iter_mut().zip(acc_r.as_flattened()) {
            *o = if out.accumulate { *o + *v } else { *v };
        }
    }
}

/// Products at most this many columns wide, whose `a` is stored transposed (rows adjacent), run
/// lanes over rows (`narrow`): a panel of 16 columns computed for the one column of a critic's
/// output layer's weight gradient did 16 times the work.
const NARROW: usize = 8;

/// Products at most this many columns wide with `a` row-major (a critic's output layer forward)
/// run lanes over rows too, the rows transposed eight by eight in registers on the way
/// (`narrow::row_major`). A separate transpose pass first cost more than the panel's waste;
/// the panel computed 16 columns for one (`reflex bench kernel`, critic output layer forward).
const NARROW_ROW_MAJOR: usize = 2;

/// Narrow products: each vector holds one column's values for 16 (AVX-512) or 8 (AVX2) rows, and
/// each lane runs its element's chain in inner order, so the bits are the panels' and the scalar
/// loop's. `a` is stored transposed (a weight gradient reads activations^T): a block's rows are
/// adjacent, one vector load per inner index.
#[cfg(target_arch = "x86_64")]
mod narrow {
    use super::{Job, NARROW, Path, Strided};
    use std::arch::x86_64::*;

    /// # Safety
    /// The processor runs `path` (not [`Path::Portable`]); `job.dst` satisfies
    /// [`super::product`]'s contract, `job.n <= NARROW`, `job.a.rs == 1`, and `job.a` and `b`
    /// were checked.
    pub(super) unsafe fn product(path: Path, job: &Job, b: &Strided) {
        macro_rules! columns {
            ($f:ident) => {
                match job.n {
                    1 => $f::<1>(job, b),
                    2 => $f::<2>(job, b),
                    3 => $f::<3>(job, b),
                    4 => $f::<4>(job, b),
                    5 => $f::<5>(job, b),
                    6 => $f::<6>(job, b),
                    7 => $f::<7>(job, b),
                    _ => $f::<NARROW>(job, b),
                }
            };
        }
        // SAFETY: this function's contract.
        unsafe {
            match path {
                Path::Avx512 => columns!(avx512),
                _ => columns!(avx2),
            }
        }
    }

    /// Rows past the last whole block, one scalar chain per element (fused multiply-adds, as
    /// the lanes do).
    ///
    /// # Safety
    /// As [`product`]'s.
    #[inline(always)]
    unsafe fn tail(job: &Job, b: &Strided, from: usize) {
        for r in from..job.m {
            for c in 0..job.n {
                let s = (0..job.k).fold(0.0f32, |s, i| job.a.at(r, i).mul_add(b.at(i, c), s));
                // SAFETY: row r < m, column c < n: the caller's rows.
                unsafe {
                    let o = job.dst.ptr.add(r * job.dst.rs + c);
                    o.write(if job.accumulate { *o + s } else { s });
                }
            }
        }
    }

    /// `a` row-major (`cs` 1), `n <= NARROW_ROW_MAJOR`: lanes over eight rows, `R` blocks of
    /// eight rows at a time (independent chains, so the multiply-adds' latency overlaps). Each
    /// step loads eight inner values of each of the eight rows, transposes them in registers into
    /// eight vectors of one inner index each, and runs the eight multiply-adds in inner order:
    /// every lane is its element's chain, the bits the panels' and the scalar loop's.
    ///
    /// # Safety
    /// As [`product`]'s, `job.a.cs == 1`, on a processor with AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn row_major(job: &Job, b: &Strided) {
        // SAFETY: this function's contract.
        unsafe {
            match job.n {
                1 => row_major_n::<1>(job, b),
                _ => row_major_n::<{ super::NARROW_ROW_MAJOR }>(job, b),
            }
        }
    }

    /// # Safety
    /// As [`row_major`]'s, `job.n == C`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn row_major_n<const C: usize>(job: &Job, b: &Strided) {
        const R: usize = 4;
        let m = job.m;
        let mut r0 = 0;
        while r0 + 8 * R <= m {
            // SAFETY: rows r0 .. r0 + 8R < m (this function's contract for the rest).
            unsafe { row_blocks::<R, C>(job, b, r0) };
            r0 += 8 * R;
        }
        while r0 + 8 <= m {
            // SAFETY: as above for rows r0 .. r0 + 8.
            unsafe { row_blocks::<1, C>(job, b, r0) };
            r0 += 8;
        }
        // SAFETY: this function's contract.
        unsafe { tail(job, b, r0) };
    }

    /// Eight rows' next eight inner values, as eight vectors of one inner index each.
    #[inline(always)]
    fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
        // SAFETY: register-only AVX shuffles; the callers run with AVX2 enabled.
        unsafe {
            let t0 = _mm256_unpacklo_ps(r[0], r[1]);
            let t1 = _mm256_unpackhi_ps(r[0], r[1]);
            let t2 = _mm256_unpacklo_ps(r[2], r[3]);
            let t3 = _mm256_unpackhi_ps(r[2], r[3]);
            let t4 = _mm256_unpacklo_ps(r[4], r[5]);
            let t5 = _mm256_unpackhi_ps(r[4], r[5]);
            let t6 = _mm256_unpacklo_ps(r[6], r[7]);
            let t7 = _mm256_unpackhi_ps(r[6], r[7]);
            // Inner index j of rows 0-3 | j + 4 of rows 0-3 (and rows 4-7 below).
            let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
            let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
            let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
            let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
            let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
            let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
            [
                _mm256_permute2f128_ps::<0x20>(u0, u4),
                _mm256_permute2f128_ps::<0x20>(u1, u5),
                _mm256_permute2f128_ps::<0x20>(u2, u6),
                _mm256_permute2f128_ps::<0x20>(u3, u7),
                _mm256_permute2f128_ps::<0x31>(u0, u4),
                _mm256_permute2f128_ps::<0x31>(u1, u5),
                _mm256_permute2f128_ps::<0x31>(u2, u6),
                _mm256_permute2f128_ps::<0x31>(u3, u7),
            ]
        }
    }

    /// `R` blocks of eight rows from `r0` (all inside `a`).
    ///
    /// # Safety
    /// As [`row_major_n`]'s, rows `r0 .. r0 + 8R` inside the product.
    #[inline(always)]
    unsafe fn row_blocks<const R: usize, const C: usize>(job: &Job, b: &Strided, r0: usize) {
        let (k, a) = (job.k, &job.a);
        let rs = a.rs as usize;
        let base = a.start + r0 * rs;
        // What the unchecked loads below rely on: the last row's last inner value.
        assert!(base + (8 * R - 1) * rs + k <= a.data.len());
        let ap = a.data.as_ptr();
        // SAFETY: AVX2 and FMA (the caller's contract); every load is inside `a` (above).
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); C]; R];
            let whole = k / 8 * 8;
            for i in (0..whole).step_by(8) {
                let bv: [[__m256; C]; 8] = std::array::from_fn(|j| {
                    std::array::from_fn(|c| _mm256_set1_ps(b.at(i + j, c)))
                });
                for (blk, acc_b) in acc.iter_mut().enumerate() {
                    let rows: [__m256; 8] = std::array::from_fn(|l| {
                        _mm256_loadu_ps(ap.add(base + (8 * blk + l) * rs + i))
                    });
                    let cols = transpose8(rows);
                    for (col, bj) in cols.iter().zip(&bv) {
                        for (acc_c, bjc) in acc_b.iter_mut().zip(bj) {
                            *acc_c = _mm256_fmadd_ps(*col, *bjc, *acc_c);
                        }
                    }
                }
            }
            for i in whole..k {
                for (blk, acc_b) in acc.iter_mut().enumerate() {
                    let row = |l: usize| *ap.add(base + (8 * blk + l) * rs + i);
                    let col = _mm256_setr_ps(
                        row(0),
                        row(1),
                        row(2),
                        row(3),
                        row(4),
                        row(5),
                        row(6),
                        row(7),
                    );
                    for (c, acc_c) in acc_b.iter_mut().enumerate() {
                        *acc_c = _mm256_fmadd_ps(col, _mm256_set1_ps(b.at(i, c)), *acc_c);
                    }
                }
            }
            for (blk, acc_b) in acc.iter().enumerate() {
                for (c, acc_c) in acc_b.iter().enumerate() {
                    let mut lanes = [0.0f32; 8];
                    _mm256_storeu_ps(lanes.as_mut_ptr(), *acc_c);
                    for (l, v) in lanes.iter().enumerate() {
                        // Row r0 + 8 blk + l < m, column c < n: the caller's rows.
                        let o = job.dst.ptr.add((r0 + 8 * blk + l) * job.dst.rs + c);
                        o.write(if job.accumulate { *o + *v } else { *v });
                    }
                }
            }
        }
    }

    macro_rules! narrow_path {
        ($name:ident, $feat:literal, $lanes:literal, $vec:ty, $zero:ident, $load:ident,
         $set1:ident, $fma:ident, $store:ident) => {
            /// # Safety
            /// As [`product`]'s, on a processor with this function's features.
            #[target_feature(enable = $feat)]
            unsafe fn $name<const C: usize>(job: &Job, b: &Strided) {
                /// `R` blocks of `L` rows from `r0`, side by side (independent chains, so the
                /// multiply-adds' latency overlaps).
                ///
                /// # Safety
                /// As the outer function's, rows `r0 .. r0 + R L` inside the product.
                #[target_feature(enable = $feat)]
                unsafe fn blocks<const R: usize, const C: usize>(
                    job: &Job,
                    b: &Strided,
                    r0: usize,
                ) {
                    const L: usize = $lanes;
                    let (a, k) = (&job.a, job.k);
                    debug_assert_eq!(a.rs, 1);
                    let (col, start, stride) = (a.data, a.start + r0, a.cs as usize);
                    // What the unchecked loads below rely on.
                    assert!(start + (k - 1) * stride + R * L <= col.len());
                    let mut acc: [[$vec; C]; R] = [[$zero(); C]; R];
                    for i in 0..k {
                        let bv: [$vec; C] = std::array::from_fn(|c| $set1(b.at(i, c)));
                        for (blk, acc_b) in acc.iter_mut().enumerate() {
                            let at = start + i * stride + blk * L;
                            // SAFETY: checked above for every i < k and block.
                            let av = unsafe { $load(col.as_ptr().add(at)) };
                            for (acc_c, bc) in acc_b.iter_mut().zip(&bv) {
                                *acc_c = $fma(av, *bc, *acc_c);
                            }
                        }
                    }
                    for (blk, acc_b) in acc.iter().enumerate() {
                        for (c, acc_c) in acc_b.iter().enumerate() {
                            let mut lanes = [0.0f32; L];
                            // SAFETY: `lanes` holds L values.
                            unsafe { $store(lanes.as_mut_ptr(), *acc_c) };
                            for (l, v) in lanes.iter().enumerate() {
                                // SAFETY: row r0 + blk L + l < m, column c < n: the caller's
                                // rows.
                                unsafe {
                                    let r = r0 + blk * L + l;
                                    let o = job.dst.ptr.add(r * job.dst.rs + c);
                                    o.write(if job.accumulate { *o + *v } else { *v });
                                }
                            }
                        }
                    }
                }
                const L: usize = $lanes;
                let m = job.m;
                let mut r0 = 0;
                // Four blocks side by side while their accumulators fit the registers.
                if C <= 2 {
                    while r0 + 4 * L <= m {
                        // SAFETY: rows r0 .. r0 + 4L < m; this function's contract.
                        unsafe { blocks::<4, C>(job, b, r0) };
                        r0 += 4 * L;
                    }
                }
                while r0 + L <= m {
                    // SAFETY: rows r0 .. r0 + L < m; this function's contract.
                    unsafe { blocks::<1, C>(job, b, r0) };
                    r0 += L;
                }
                // SAFETY: this function's contract.
                unsafe { tail(job, b, r0) };
            }
        };
    }

    narrow_path!(
        avx512,
        "avx512f,fma",
        16,
        __m512,
        _mm512_setzero_ps,
        _mm512_loadu_ps,
        _mm512_set1_ps,
        _mm512_fmadd_ps,
        _mm512_storeu_ps
    );
    narrow_path!(
        avx2,
        "avx2,fma",
        8,
        __m256,
        _mm256_setzero_ps,
        _mm256_loadu_ps,
        _mm256_set1_ps,
        _mm256_fmadd_ps,
        _mm256_storeu_ps
    );
}

/// The tiles in the processor's vector registers, with intrinsics: left to vectorise [`tile`]
/// for these targets, the compiler chose gathers and scatters over the rows and ran 35 times
/// slower than `gemm`.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{ARows, Out, PANEL, Panel};
    use std::arch::x86_64::*;

    /// [`super::tile`] for 6 rows and one panel: two 8-wide accumulators per row.
    ///
    /// # Safety
    /// [`super::Tile`]'s, with AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile_avx2(k: usize, a: ARows<6>, b: [Panel; 1], out: Out<6>) {
        let mut acc = [[_mm256_setzero_ps(); 2]; 6];
        let (ap, bp) = (a.data.as_ptr(), b[0].data.as_ptr());
        for i in 0..k {
            // SAFETY: `Panel::new` and `ARows::new` checked every index below for `i < k`.
            unsafe {
                let row = bp.add(b[0].start + i * b[0].rs);
                let (b0, b1) = (_mm256_loadu_ps(row), _mm256_loadu_ps(row.add(8)));
                for (acc_r, off) in acc.iter_mut().zip(a.offs) {
                    let av = _mm256_set1_ps(*ap.add(off + i * a.cs));
                    acc_r[0] = _mm256_fmadd_ps(av, b0, acc_r[0]);
                    acc_r[1] = _mm256_fmadd_ps(av, b1, acc_r[1]);
                }
            }
        }
        for (row, acc_r) in out.rows.iter().zip(&acc) {
            for (h, v) in acc_r.iter().enumerate() {
                // SAFETY: [`super::Tile`]'s contract: 16 values from `row`.
                unsafe {
                    let o = row.add(8 * h);
                    let v = if out.accumulate {
                        _mm256_add_ps(_mm256_loadu_ps(o), *v)
                    } else {
                        *v
                    };
                    _mm256_storeu_ps(o, v);
                }
            }
        }
    }

    /// [`super::tile`] for 8 rows and `NP` panels: one 16-wide accumulator per row and panel.
    ///
    /// # Safety
    /// [`super::Tile`]'s, with AVX-512F and FMA.
    #[target_feature(enable = "avx512f,fma")]
    pub(super) unsafe fn tile_avx512<const NP: usize>(
        k: usize,
        a: ARows<8>,
        b: [Panel; NP],
        out: Out<8>,
    ) {
        let mut acc = [[_mm512_setzero_ps(); NP]; 8];
        let ap = a.data.as_ptr();
        for i in 0..k {
            // SAFETY: `Panel::new` and `ARows::new` checked every index below for `i < k`.
            unsafe {
                let bv: [__m512; NP] = std::array::from_fn(|q| {
                    _mm512_loadu_ps(b[q].data.as_ptr().add(b[q].start + i * b[q].rs))
                });
                for (acc_r, off) in acc.iter_mut().zip(a.offs) {
                    let av = _mm512_set1_ps(*ap.add(off + i * a.cs));
                    for (acc_rq, bq) in acc_r.iter_mut().zip(&bv) {
                        *acc_rq = _mm512_fmadd_ps(av, *bq, *acc_rq);
                    }
                }
            }
        }
        for (row, acc_r) in out.rows.iter().zip(&acc) {
            for (q, v) in acc_r.iter().enumerate() {
                // SAFETY: [`super::Tile`]'s contract: NP * 16 values from `row`.
                unsafe {
                    let o = row.add(PANEL * q);
                    let v = if out.accumulate {
                        _mm512_add_ps(_mm512_loadu_ps(o), *v)
                    } else {
                        *v
                    };
                    _mm512_storeu_ps(o, v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_chosen_by_name_once_per_process() {
        assert_eq!(Path::parse("avx2"), Ok(Path::Avx2Fma));
        assert_eq!(Path::parse("avx2+fma"), Ok(Path::Avx2Fma));
        assert_eq!(Path::parse("avx512"), Ok(Path::Avx512));
        assert!(
            Path::parse("sse")
                .unwrap_err()
                .contains("avx512, avx2 or portable")
        );
        // Other tests may already have run products on the fastest path: choosing it holds.
        Path::fastest().choose().unwrap();
        assert_eq!(Path::detected(), Path::fastest());
        if Path::fastest() != Path::Portable {
            let e = Path::Portable.choose().unwrap_err();
            assert!(e.contains("already"), "{e}");
        }
    }

    /// The definition: each element one fused multiply-add chain in inner order, then added.
    fn reference(
        (m, k, n): (usize, usize, usize),
        a: Strided,
        b: Strided,
        d: &mut [f32],
        drs: usize,
        acc: bool,
    ) {
        for r in 0..m {
            for c in 0..n {
                let mut s = 0.0f32;
                for i in 0..k {
                    s = a.at(r, i).mul_add(b.at(i, c), s);
                }
                let o = &mut d[r * drs + c];
                *o = if acc { *o + s } else { s };
            }
        }
    }

    fn values(len: usize, seed: u64) -> Vec<f32> {
        // Values spread over several binades, so that a different summation order shows.
        (0..len as u64)
            .map(|i| {
                let h = (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed).wrapping_mul(0xBF58_476D);
                let u = ((h >> 11) % 2001) as f32 / 1000.0 - 1.0;
                u * [1.0, 37.0, 0.013, 900.0][(h % 4) as usize]
            })
            .collect()
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn every_path_this_processor_has_gives_the_scalar_chains_bits() {
        let paths = [Path::Avx512, Path::Avx2Fma, Path::Portable];
        let have: Vec<Path> = paths.into_iter().filter(|p| p.available()).collect();
        eprintln!("paths on this processor: {have:?}");
        // Shapes with row and column tails, odd panel counts, k = 1, and both strides of each
        // operand (the backward products read transposes).
        for &(m, k, n) in &[
            (1, 1, 1),
            (7, 3, 17),
            (13, 64, 33),
            (64, 256, 256),
            (33, 100, 48),
            (256, 20, 9),
            // Narrow products (lanes over rows), with and without row tails.
            (37, 50, 1),
            (100, 64, 3),
            (16, 5, 8),
            (5, 7, 2),
            // A critic's output layer (four blocks of eight rows at a time) and blocks of
            // eight with a tail of inner values.
            (256, 256, 1),
            (77, 17, 2),
        ] {
            for (ta, tb, accumulate) in [
                (false, false, false),
                (true, false, true),
                (false, true, false),
                (true, true, true),
            ] {
                let av = values(m * k, 1);
                let bv = values(k * n, 2);
                let a = if ta {
                    Strided {
                        data: &av,
                        start: 0,
                        rs: 1,
                        cs: m as isize,
                    }
                } else {
                    Strided {
                        data: &av,
                        start: 0,
                        rs: k as isize,
                        cs: 1,
                    }
                };
                let b = if tb {
                    Strided {
                        data: &bv,
                        start: 0,
                        rs: 1,
                        cs: k as isize,
                    }
                } else {
                    Strided {
                        data: &bv,
                        start: 0,
                        rs: n as isize,
                        cs: 1,
                    }
                };
                let drs = n + 3;
                let init = values(m * drs, 3);
                let mut want = init.clone();
                reference((m, k, n), a, b, &mut want, drs, accumulate);
                for &path in &have {
                    let mut got = init.clone();
                    // SAFETY: `got` holds m rows of drs >= n values, borrowed for the call.
                    unsafe {
                        product(
                            path,
                            (m, k, n),
                            a,
                            b,
                            Rows {
                                ptr: got.as_mut_ptr(),
                                rs: drs,
                            },
                            accumulate,
                        )
                    };
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert!(
                        bits(&want) == bits(&got),
                        "{} path differs from the scalar chains for {m}x{k}x{n} \
                         (a^T {ta}, b^T {tb}, accumulate {accumulate})",
                        path.name()
                    );
                }
            }
        }
    }

    #[test]
    fn the_order_of_summation_shows_in_the_bits() {
        // The test above can only see a different path if a different order changes the bits on
        // its inputs: summing one of its dot products backwards must differ somewhere.
        let (k, n) = (256, 64);
        let a = values(k, 1);
        let b = values(k * n, 2);
        let differs = (0..n).any(|c| {
            let fwd = (0..k).fold(0.0f32, |s, i| a[i].mul_add(b[i * n + c], s));
            let bwd = (0..k)
                .rev()
                .fold(0.0f32, |s, i| a[i].mul_add(b[i * n + c], s));
            fwd.to_bits() != bwd.to_bits()
        });
        assert!(
            differs,
            "the test inputs cannot tell one summation order from another"
        );
    }
}
