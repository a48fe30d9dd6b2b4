//! An ensemble of MLPs of one shape, forward and backward by hand on buffers kept between calls.
//!
//! The parameters are read in the layout reflex's candle networks store them
//! (`reflex_learn::sac::nets::Ensemble`): the first layer `[in, N * out]` with member `j`'s
//! block in columns `j * out ..`, later layers `[N, in, out]`, biases and LayerNorm gains and
//! offsets `[N, 1, out]`. Activations are kept member-major, `[N, rows, width]`. Between hidden
//! layers: `relu(h + b)`, or `relu(LayerNorm(h + b) * g + beta)` with LayerNorm over the layer's
//! width (epsilon 1e-5, biased variance, as `torch.nn.LayerNorm`). The last layer is affine.
//!
//! Why by hand: at the sizes a robot's learner runs (16 to 256 wide, batches of 32 to 256) a
//! SAC update through candle's autograd spent most of its time in per-operation overhead (a
//! tensor allocated per operation, the gradient store's zero tensors and additions), not in
//! arithmetic. Here the products go to [`crate::gemm::product`] (split over the learner's
//! threads) and everything else is one pass over buffers allocated on the first call and reused.

use crate::gemm::{Dst, Product, View, product};
pub use smallvec::SmallVec;

/// The shape of an ensemble.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Members.
    pub members: usize,
    /// Widths from the input to the output: `dims[0] -> dims[1] -> ... -> dims.last()`.
    pub dims: Vec<usize>,
    /// LayerNorm after every hidden layer.
    pub layer_norm: bool,
}

impl Shape {
    /// Layers (products).
    pub fn layers(&self) -> usize {
        self.dims.len() - 1
    }

    /// Output width of one member.
    pub fn out(&self) -> usize {
        *self.dims.last().expect("an ensemble has an output layer")
    }

    /// Values in layer `l`'s weight, bias and (hidden layers with LayerNorm) gain.
    fn sizes(&self, l: usize) -> (usize, usize) {
        let n = self.members;
        (n * self.dims[l] * self.dims[l + 1], n * self.dims[l + 1])
    }
}

/// One entry per layer, kept inline for networks of up to four layers (a learner's update
/// borrows its parameters several times per update without allocating).
pub type PerLayer<T> = SmallVec<[T; 4]>;

/// The parameters, borrowed in the layout of the module documentation.
pub struct Params<'a> {
    /// Weights per layer.
    pub w: PerLayer<&'a [f32]>,
    /// Biases per layer.
    pub b: PerLayer<&'a [f32]>,
    /// LayerNorm gains and offsets per hidden layer (empty without LayerNorm).
    pub ln: PerLayer<(&'a [f32], &'a [f32])>,
}

impl Params<'_> {
    /// Panics naming the first parameter whose length does not fit `shape`.
    fn check(&self, shape: &Shape) {
        let l = shape.layers();
        assert!(
            self.w.len() == l
                && self.b.len() == l
                && self.ln.len() == if shape.layer_norm { l - 1 } else { 0 },
            "{} weights, {} biases and {} norms for {l} layers",
            self.w.len(),
            self.b.len(),
            self.ln.len()
        );
        for i in 0..l {
            let (w, b) = shape.sizes(i);
            assert_eq!(self.w[i].len(), w, "layer {i}'s weight");
            assert_eq!(self.b[i].len(), b, "layer {i}'s bias");
            if let Some((g, o)) = self.ln.get(i) {
                assert!(g.len() == b && o.len() == b, "layer {i}'s LayerNorm");
            }
        }
    }
}

/// Gradients of every parameter, in the parameters' layout; allocated once per shape.
#[derive(Clone, Debug, Default)]
pub struct Grads {
    /// Per layer.
    pub w: Vec<Vec<f32>>,
    /// Per layer.
    pub b: Vec<Vec<f32>>,
    /// Per hidden layer with LayerNorm: (gain, offset).
    pub ln: Vec<(Vec<f32>, Vec<f32>)>,
}

impl Grads {
    /// Zeroed gradients for `shape`.
    pub fn new(shape: &Shape) -> Self {
        let mut g = Grads::default();
        for l in 0..shape.layers() {
            let (w, b) = shape.sizes(l);
            g.w.push(vec![0.0; w]);
            g.b.push(vec![0.0; b]);
            if shape.layer_norm && l + 1 < shape.layers() {
                g.ln.push((vec![0.0; b], vec![0.0; b]));
            }
        }
        g
    }

    /// Every gradient in the order of `reflex_learn`'s `Ensemble::vars`: weights, biases, then
    /// each LayerNorm's gain and offset.
    pub fn in_var_order(&self) -> impl Iterator<Item = &[f32]> + Clone {
        self.w.iter().chain(&self.b).map(Vec::as_slice).chain(
            self.ln
                .iter()
                .flat_map(|(g, o)| [g.as_slice(), o.as_slice()]),
        )
    }
}

/// What a forward pass keeps for its backward pass, and its output.
#[derive(Clone, Debug, Default)]
pub struct Tape {
    rows: usize,
    /// Per hidden layer: `h + b` (without LayerNorm) or the normalised `x_hat` (with it).
    pre: Vec<Vec<f32>>,
    /// Per hidden layer with LayerNorm: `1 / sqrt(var + eps)` per member and row.
    inv_std: Vec<Vec<f32>>,
    /// Per hidden layer: its output after the ReLU, `[N, rows, width]`.
    act: Vec<Vec<f32>>,
    /// The ensemble's output, `[N, rows, out]`.
    pub out: Vec<f32>,
    /// Backward scratch: the gradient at the current layer and at the one before.
    grad: [Vec<f32>; 2],
}

const LN_EPS: f32 = 1e-5;

impl Tape {
    fn fit(&mut self, shape: &Shape, rows: usize) {
        let hidden = shape.layers() - 1;
        let n = shape.members;
        let widest = shape.dims[1..].iter().max().copied().unwrap_or(0);
        self.rows = rows;
        self.pre.resize_with(hidden, Vec::new);
        self.act.resize_with(hidden, Vec::new);
        self.inv_std.resize_with(hidden, Vec::new);
        for l in 0..hidden {
            let len = n * rows * shape.dims[l + 1];
            self.pre[l].resize(len, 0.0);
            self.act[l].resize(len, 0.0);
            self.inv_std[l].resize(if shape.layer_norm { n * rows } else { 0 }, 0.0);
        }
        self.out.resize(n * rows * shape.out(), 0.0);
        for g in &mut self.grad {
            g.resize(n * rows * widest.max(shape.dims[0]), 0.0);
        }
    }
}

/// The input of a pass: `rows` rows of `shape.dims[0]` values, row `r` starting at
/// `start + r * stride` (a prefix of wider rows may be read in place).
#[derive(Clone, Copy, Debug)]
pub struct Input<'a> {
    /// The values.
    pub data: &'a [f32],
    /// Where row 0 starts.
    pub start: usize,
    /// Distance between rows.
    pub stride: usize,
    /// Rows.
    pub rows: usize,
}

/// Runs the ensemble on `x`, keeping what [`backward`] needs in `tape`; the output is
/// `tape.out`, `[N, rows, out]`.
pub fn forward(shape: &Shape, p: &Params<'_>, x: Input<'_>, tape: &mut Tape) {
    p.check(shape);
    tape.fit(shape, x.rows);
    let n = shape.members;
    let rows = x.rows;
    let last = shape.layers() - 1;
    for l in 0..=last {
        let (i, o) = (shape.dims[l], shape.dims[l + 1]);
        let (lhs, lhs_view) = if l == 0 {
            (x.data, View::rows(x.start, x.stride))
        } else {
            (
                tape.act[l - 1].as_slice(),
                View::rows(0, i).batched(rows * i),
            )
        };
        let rhs_view = if l == 0 {
            View::rows(0, n * o).batched(o)
        } else {
            View::rows(0, o).batched(i * o)
        };
        let dst = if l == last {
            &mut tape.out
        } else {
            &mut tape.pre[l]
        };
        product(
            Product {
                batch: n,
                m: rows,
                k: i,
                n: o,
                accumulate: false,
            },
            (lhs, lhs_view),
            (p.w[l], rhs_view),
            (dst, Dst::contiguous(rows, o)),
        );
        let bias = p.b[l];
        if l == last {
            add_bias(&mut tape.out, bias, rows, o);
            continue;
        }
        add_bias(&mut tape.pre[l], bias, rows, o);
        let (pre, act) = (&mut tape.pre[l], &mut tape.act[l]);
        match p.ln.get(l) {
            Some((g, beta)) => {
                let inv = &mut tape.inv_std[l];
                for (k, (row, out)) in pre
                    .chunks_exact_mut(o)
                    .zip(act.chunks_exact_mut(o))
                    .enumerate()
                {
                    let j = k / rows;
                    let (g, beta) = (&g[j * o..(j + 1) * o], &beta[j * o..(j + 1) * o]);
                    let mean = sum_lanes(row, row, |x, _| x) / o as f32;
                    let var = sum_lanes(row, row, |x, _| (x - mean) * (x - mean)) / o as f32;
                    let s = 1.0 / (var + LN_EPS).sqrt();
                    inv[k] = s;
                    for (((x, a), g), b) in row.iter_mut().zip(out.iter_mut()).zip(g).zip(beta) {
                        let xh = (*x - mean) * s;
                        *x = xh;
                        *a = (xh * g + b).max(0.0);
                    }
                }
            }
            None => {
                for (a, h) in act.iter_mut().zip(pre.iter()) {
                    *a = h.max(0.0);
                }
            }
        }
    }
}

/// `sum f(a_k, b_k)` in sixteen interleaved partial sums: the lanes of vector registers, where
/// a single running sum would be a chain of dependent additions (the compiler may not reorder
/// float sums by itself).
#[inline(always)]
fn sum_lanes(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut acc = [0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for k in 0..16 {
            acc[k] += f(x[k], y[k]);
        }
    }
    let mut total: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        total += f(*x, *y);
    }
    total
}

fn add_bias(h: &mut [f32], b: &[f32], rows: usize, o: usize) {
    for (k, row) in h.chunks_exact_mut(o).enumerate() {
        let j = k / rows;
        for (v, c) in row.iter_mut().zip(&b[j * o..(j + 1) * o]) {
            *v += c;
        }
    }
}

/// Sums `[N, rows, o]` over the rows into `[N, o]`, in row order from zero.
fn sum_rows(x: &[f32], rows: usize, o: usize, out: &mut [f32]) {
    out.fill(0.0);
    for (dst, block) in out.chunks_exact_mut(o).zip(x.chunks_exact(rows * o)) {
        for row in block.chunks_exact(o) {
            for (d, v) in dst.iter_mut().zip(row) {
                *d += v;
            }
        }
    }
}

/// Where the gradient with respect to the input goes: columns `cols.0 .. cols.0 + cols.1` of
/// the input, written as `[rows, cols.1]` into `data` (summed over the members).
pub struct InputGrad<'a> {
    /// `[rows, cols.1]`.
    pub data: &'a mut [f32],
    /// First column and number of columns.
    pub cols: (usize, usize),
}

/// The backward pass of the last [`forward`] on `tape` (same `x`, same parameters): from the
/// gradient `dout` of the output (`[N, rows, out]`), the parameters' gradients into `grads`
/// (overwritten; `None` skips them, as when a critic only scores an actor's actions) and the
/// input's gradient into `dx` when asked for.
#[allow(
    clippy::too_many_lines,
    reason = "hand-derived gradient: the forward and backward passes read as one derivation"
)]
pub fn backward(
    shape: &Shape,
    p: &Params<'_>,
    x: Input<'_>,
    tape: &mut Tape,
    dout: &[f32],
    mut grads: Option<&mut Grads>,
    dx: Option<InputGrad<'_>>,
) {
    let n = shape.members;
    let rows = tape.rows;
    assert_eq!(
        rows, x.rows,
        "backward over other rows than the forward pass"
    );
    assert_eq!(dout.len(), n * rows * shape.out(), "output gradient");
    let last = shape.layers() - 1;
    let [mut cur, mut prev] = std::mem::take(&mut tape.grad);
    cur[..dout.len()].copy_from_slice(dout);
    for l in (0..=last).rev() {
        let (i, o) = (shape.dims[l], shape.dims[l + 1]);
        let dpre = &cur[..n * rows * o];
        if let Some(g) = grads.as_deref_mut() {
            sum_rows(dpre, rows, o, &mut g.b[l]);
            let (lhs, lhs_view, dst) = if l == 0 {
                // x^T for every member (batch stride 0); member j's block of columns.
                (
                    x.data,
                    View::rows(x.start, x.stride).t(),
                    Dst {
                        start: 0,
                        batch_stride: o,
                        rs: n * o,
                    },
                )
            } else {
                (
                    tape.act[l - 1].as_slice(),
                    View::rows(0, i).batched(rows * i).t(),
                    Dst::contiguous(i, o),
                )
            };
            product(
                Product {
                    batch: n,
                    m: i,
                    k: rows,
                    n: o,
                    accumulate: false,
                },
                (lhs, lhs_view),
                (dpre, View::rows(0, o).batched(rows * o)),
                (&mut g.w[l], dst),
            );
        }
        if l == 0 {
            if let Some(d) = dx {
                let (c0, w) = d.cols;
                assert!(c0 + w <= i, "input columns {c0}..{} of {i}", c0 + w);
                assert_eq!(d.data.len(), rows * w, "input gradient");
                // dx = sum over members of dpre_j @ W0_j^T, restricted to the asked columns.
                for j in 0..n {
                    product(
                        Product {
                            batch: 1,
                            m: rows,
                            k: o,
                            n: w,
                            accumulate: j > 0,
                        },
                        (dpre, View::rows(j * rows * o, o)),
                        (p.w[0], View::rows(c0 * n * o + j * o, n * o).t()),
                        (&mut *d.data, Dst::contiguous(rows, w)),
                    );
                }
            }
            break;
        }
        // The gradient at the previous layer's output: dpre @ W^T per member.
        product(
            Product {
                batch: n,
                m: rows,
                k: o,
                n: i,
                accumulate: false,
            },
            (dpre, View::rows(0, o).batched(rows * o)),
            (p.w[l], View::rows(0, o).batched(i * o).t()),
            (&mut prev[..n * rows * i], Dst::contiguous(rows, i)),
        );
        // Through the previous hidden layer's activation to its pre-activation.
        let h = l - 1;
        let dact = &mut prev[..n * rows * i];
        match p.ln.get(h) {
            Some((gain, beta)) => {
                let xhat = &tape.pre[h];
                let inv = &tape.inv_std[h];
                let mut lng = grads.as_deref_mut().map(|g| {
                    let (dg, db) = &mut g.ln[h];
                    dg.fill(0.0);
                    db.fill(0.0);
                    (dg, db)
                });
                for (k, (d, xh)) in dact
                    .chunks_exact_mut(i)
                    .zip(xhat.chunks_exact(i))
                    .enumerate()
                {
                    let j = k / rows;
                    let (g, b) = (&gain[j * i..(j + 1) * i], &beta[j * i..(j + 1) * i]);
                    // d holds dL/da; through the ReLU (passing where z >= 0) to dL/dz, then
                    // dL/dx_hat = dz * g; the gain's and offset's gradients on the way.
                    for ((dv, x), (gc, bc)) in d.iter_mut().zip(xh).zip(g.iter().zip(b)) {
                        let z = x * gc + bc;
                        *dv = if z >= 0.0 { *dv } else { 0.0 };
                    }
                    if let Some((dg, db)) = lng.as_mut() {
                        let (dg, db) = (&mut dg[j * i..(j + 1) * i], &mut db[j * i..(j + 1) * i]);
                        for (((dgc, dbc), dz), x) in
                            dg.iter_mut().zip(db.iter_mut()).zip(&*d).zip(xh)
                        {
                            *dgc += dz * x;
                            *dbc += dz;
                        }
                    }
                    for (dv, gc) in d.iter_mut().zip(g) {
                        *dv *= gc;
                    }
                    let m1 = sum_lanes(d, d, |x, _| x) / i as f32;
                    let m2 = sum_lanes(d, xh, |x, y| x * y) / i as f32;
                    let s = inv[k];
                    for (dv, x) in d.iter_mut().zip(xh) {
                        *dv = s * (*dv - m1 - x * m2);
                    }
                }
            }
            None => {
                // A select rather than a branch, so that it vectorises.
                for (d, pre) in dact.iter_mut().zip(&tape.pre[h]) {
                    *d = if *pre >= 0.0 { *d } else { 0.0 };
                }
            }
        }
        std::mem::swap(&mut cur, &mut prev);
    }
    tape.grad = [cur, prev];
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vals(seed: usize, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let h = ((i + seed * 1000 + 1) as u64 * 2_654_435_761) % 10_007;
                (h as f32 / 10_007.0 * 2.0 - 1.0) * scale
            })
            .collect()
    }

    /// Every parameter's and the input's gradient against central differences (in f64 sums of
    /// f32 passes), for two members with and without LayerNorm, reading a prefix of wider rows.
    #[test]
    #[allow(
        clippy::too_many_lines,
        reason = "hand-derived gradient: the forward and backward passes read as one derivation"
    )]
    fn gradients_match_finite_differences() {
        for layer_norm in [false, true] {
            let shape = Shape {
                members: 2,
                dims: vec![3, 5, 4, 2],
                layer_norm,
            };
            let mut w: Vec<Vec<f32>> = (0..3).map(|l| vals(l, shape.sizes(l).0, 0.8)).collect();
            let mut b: Vec<Vec<f32>> = (0..3)
                .map(|l| vals(10 + l, shape.sizes(l).1, 0.3))
                .collect();
            let mut ln: Vec<(Vec<f32>, Vec<f32>)> = if layer_norm {
                (0..2)
                    .map(|l| {
                        let g = vals(20 + l, shape.sizes(l).1, 0.3);
                        (
                            g.iter().map(|v| 1.0 + v).collect(),
                            vals(30 + l, shape.sizes(l).1, 0.2),
                        )
                    })
                    .collect()
            } else {
                vec![]
            };
            let rows = 4;
            // Rows of 4 values of which the network reads the first 3.
            let mut x = vals(40, rows * 4, 1.0);
            let dout = vals(50, 2 * rows * 2, 1.0);
            let loss = |w: &[Vec<f32>], b: &[Vec<f32>], ln: &[(Vec<f32>, Vec<f32>)], x: &[f32]| {
                let p = Params {
                    w: w.iter().map(Vec::as_slice).collect(),
                    b: b.iter().map(Vec::as_slice).collect(),
                    ln: ln
                        .iter()
                        .map(|(g, o)| (g.as_slice(), o.as_slice()))
                        .collect(),
                };
                let mut t = Tape::default();
                forward(
                    &shape,
                    &p,
                    Input {
                        data: x,
                        start: 0,
                        stride: 4,
                        rows,
                    },
                    &mut t,
                );
                let l = t
                    .out
                    .iter()
                    .zip(&dout)
                    .map(|(o, d)| (o * d) as f64)
                    .sum::<f64>();
                // Which ReLUs pass: a difference across a kink is not a derivative.
                let active: Vec<bool> = t.act.iter().flatten().map(|a| *a > 0.0).collect();
                (l, active)
            };
            let mut grads = Grads::new(&shape);
            let mut dx = vec![0f32; rows * 3];
            {
                let p = Params {
                    w: w.iter().map(Vec::as_slice).collect(),
                    b: b.iter().map(Vec::as_slice).collect(),
                    ln: ln
                        .iter()
                        .map(|(g, o)| (g.as_slice(), o.as_slice()))
                        .collect(),
                };
                let input = Input {
                    data: &x,
                    start: 0,
                    stride: 4,
                    rows,
                };
                let mut t = Tape::default();
                forward(&shape, &p, input, &mut t);
                let dx_cols = InputGrad {
                    data: &mut dx,
                    cols: (0, 3),
                };
                backward(
                    &shape,
                    &p,
                    input,
                    &mut t,
                    &dout,
                    Some(&mut grads),
                    Some(dx_cols),
                );
            }
            // Small: LayerNorm over five units of small spread bends sharply (3e-3 was off by 7%
            // on a bias); f32 noise at this step is ~3e-4 against the 2e-3 tolerance.
            let h = 5e-4f32;
            let at_start = loss(&w, &b, &ln, &x).1;
            let mut skipped = 0;
            let mut check = |what: String,
                             analytic: f32,
                             plus: (f64, Vec<bool>),
                             minus: (f64, Vec<bool>)| {
                if plus.1 != at_start || minus.1 != at_start {
                    skipped += 1;
                    return;
                }
                let fd = (plus.0 - minus.0) / (2.0 * h as f64);
                assert!(
                    (fd - analytic as f64).abs() < 2e-3 * (1.0 + fd.abs()),
                    "{what} (layer norm {layer_norm}): finite difference {fd}, backward {analytic}"
                );
            };
            for l in 0..3 {
                for k in 0..w[l].len() {
                    let v = w[l][k];
                    w[l][k] = v + h;
                    let p = loss(&w, &b, &ln, &x);
                    w[l][k] = v - h;
                    let m = loss(&w, &b, &ln, &x);
                    w[l][k] = v;
                    check(format!("w[{l}][{k}]"), grads.w[l][k], p, m);
                }
                for k in 0..b[l].len() {
                    let v = b[l][k];
                    b[l][k] = v + h;
                    let p = loss(&w, &b, &ln, &x);
                    b[l][k] = v - h;
                    let m = loss(&w, &b, &ln, &x);
                    b[l][k] = v;
                    check(format!("b[{l}][{k}]"), grads.b[l][k], p, m);
                }
            }
            for l in 0..ln.len() {
                for k in 0..ln[l].0.len() {
                    let v = ln[l].0[k];
                    ln[l].0[k] = v + h;
                    let p = loss(&w, &b, &ln, &x);
                    ln[l].0[k] = v - h;
                    let m = loss(&w, &b, &ln, &x);
                    ln[l].0[k] = v;
                    check(format!("gain[{l}][{k}]"), grads.ln[l].0[k], p, m);
                    let v = ln[l].1[k];
                    ln[l].1[k] = v + h;
                    let p = loss(&w, &b, &ln, &x);
                    ln[l].1[k] = v - h;
                    let m = loss(&w, &b, &ln, &x);
                    ln[l].1[k] = v;
                    check(format!("offset[{l}][{k}]"), grads.ln[l].1[k], p, m);
                }
            }
            for r in 0..rows {
                for c in 0..3 {
                    let v = x[r * 4 + c];
                    x[r * 4 + c] = v + h;
                    let p = loss(&w, &b, &ln, &x);
                    x[r * 4 + c] = v - h;
                    let m = loss(&w, &b, &ln, &x);
                    x[r * 4 + c] = v;
                    check(format!("x[{r}][{c}]"), dx[r * 3 + c], p, m);
                }
            }
            assert!(skipped < 10, "{skipped} coordinates crossed a ReLU kink");
        }
    }
}
