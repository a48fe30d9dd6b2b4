//! Writing ONNX models: a small protobuf encoder for the parts of `onnx.proto` reflex needs
//! (ModelProto, GraphProto, NodeProto, TensorProto, ValueInfoProto, AttributeProto), and a graph
//! builder on top of it.
//!
//! reflex writes its own ONNX files (imitation-trained policies, the tiny VLA used in tests) so
//! that exporting needs no Python. Field numbers follow onnx/onnx `onnx/onnx.proto` (IR version 8,
//! opset 17); every file written here is loaded back by ONNX Runtime in the tests.

/// ONNX element types used here (`TensorProto.DataType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    /// float32
    F32 = 1,
    /// int32
    I32 = 6,
    /// int64
    I64 = 7,
}

/// A dimension of a graph input or output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dim {
    /// A fixed size.
    Fixed(i64),
    /// A named dynamic size (e.g. `batch`).
    Param(String),
}

/// Shorthand for a dynamic batch dimension.
pub fn batch() -> Dim {
    Dim::Param("batch".into())
}

#[derive(Default)]
struct Buf(Vec<u8>);

impl Buf {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }
    fn tag(&mut self, field: u32, wire: u32) {
        self.varint(((field << 3) | wire) as u64);
    }
    fn int(&mut self, field: u32, v: i64) {
        self.tag(field, 0);
        self.varint(v as u64);
    }
    fn bytes(&mut self, field: u32, b: &[u8]) {
        self.tag(field, 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
    }
    fn string(&mut self, field: u32, s: &str) {
        self.bytes(field, s.as_bytes());
    }
    fn float(&mut self, field: u32, f: f32) {
        self.tag(field, 5);
        self.0.extend_from_slice(&f.to_le_bytes());
    }
    fn msg(&mut self, field: u32, m: &Buf) {
        self.bytes(field, &m.0);
    }
}

/// An attribute of a node.
#[derive(Clone, Debug)]
pub enum Attr {
    /// An integer.
    Int(i64),
    /// A float.
    Float(f32),
    /// A list of integers.
    Ints(Vec<i64>),
}

struct Node {
    op: String,
    inputs: Vec<String>,
    outputs: Vec<String>,
    attrs: Vec<(String, Attr)>,
}

struct Tensor {
    name: String,
    elem: Elem,
    dims: Vec<i64>,
    raw: Vec<u8>,
}

struct Io {
    name: String,
    elem: Elem,
    dims: Vec<Dim>,
}

/// Builds an ONNX graph node by node.
#[derive(Default)]
pub struct Graph {
    nodes: Vec<Node>,
    inits: Vec<Tensor>,
    inputs: Vec<Io>,
    outputs: Vec<Io>,
    next: usize,
    /// Key-value metadata stored in the model (`metadata_props`).
    pub metadata: Vec<(String, String)>,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    fn fresh(&mut self, hint: &str) -> String {
        self.next += 1;
        format!("{hint}_{}", self.next)
    }

    /// Declares a graph input.
    pub fn input(&mut self, name: &str, elem: Elem, dims: Vec<Dim>) -> String {
        self.inputs.push(Io {
            name: name.into(),
            elem,
            dims,
        });
        name.into()
    }

    /// Declares `value` as a graph output named `name` (an Identity node renames it).
    pub fn output(&mut self, value: &str, name: &str, elem: Elem, dims: Vec<Dim>) {
        self.nodes.push(Node {
            op: "Identity".into(),
            inputs: vec![value.into()],
            outputs: vec![name.into()],
            attrs: vec![],
        });
        self.outputs.push(Io {
            name: name.into(),
            elem,
            dims,
        });
    }

    /// A float32 constant (initializer).
    pub fn constant(&mut self, hint: &str, dims: &[i64], data: &[f32]) -> String {
        let name = self.fresh(hint);
        self.named_constant(&name, dims, data)
    }

    /// A float32 constant under exactly `name` (weights a reader looks up by name).
    pub fn named_constant(&mut self, name: &str, dims: &[i64], data: &[f32]) -> String {
        assert_eq!(
            dims.iter().product::<i64>() as usize,
            data.len(),
            "constant {name}: shape and data disagree"
        );
        self.inits.push(Tensor {
            name: name.into(),
            elem: Elem::F32,
            dims: dims.to_vec(),
            raw: data.iter().flat_map(|x| x.to_le_bytes()).collect(),
        });
        name.into()
    }

    /// An int64 constant (shapes for Reshape, indices).
    pub fn constant_i64(&mut self, hint: &str, data: &[i64]) -> String {
        let name = self.fresh(hint);
        let raw = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.inits.push(Tensor {
            name: name.clone(),
            elem: Elem::I64,
            dims: vec![data.len() as i64],
            raw,
        });
        name
    }

    /// Adds a node with one output; returns the output's name.
    pub fn op(&mut self, op: &str, inputs: &[&str], attrs: Vec<(&str, Attr)>) -> String {
        let out = self.fresh(&op.to_lowercase());
        self.nodes.push(Node {
            op: op.into(),
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            outputs: vec![out.clone()],
            attrs: attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        });
        out
    }

    /// `x W + b` with `W` given as `[in, out]` row-major and `b` as `[out]`.
    pub fn linear(
        &mut self,
        x: &str,
        w_in_out: &[f32],
        b: &[f32],
        n_in: usize,
        n_out: usize,
    ) -> String {
        let w = self.constant("w", &[n_in as i64, n_out as i64], w_in_out);
        let bias = self.constant("b", &[n_out as i64], b);
        let y = self.op("MatMul", &[x, &w], vec![]);
        self.op("Add", &[&y, &bias], vec![])
    }

    /// SiLU: `x * sigmoid(x)`.
    pub fn silu(&mut self, x: &str) -> String {
        let s = self.op("Sigmoid", &[x], vec![]);
        self.op("Mul", &[x, &s], vec![])
    }

    /// Reshape to `shape` (`-1` and `0` as in ONNX).
    pub fn reshape(&mut self, x: &str, shape: &[i64]) -> String {
        let s = self.constant_i64("shape", shape);
        self.op("Reshape", &[x, &s], vec![])
    }

    /// Concatenation along `axis`.
    pub fn concat(&mut self, xs: &[&str], axis: i64) -> String {
        self.op("Concat", xs, vec![("axis", Attr::Int(axis))])
    }

    fn value_info(io: &Io) -> Buf {
        let mut shape = Buf::default();
        for d in &io.dims {
            let mut dim = Buf::default();
            match d {
                Dim::Fixed(v) => dim.int(1, *v),
                Dim::Param(p) => dim.string(2, p),
            }
            shape.msg(1, &dim);
        }
        let mut tensor = Buf::default();
        tensor.int(1, io.elem as i64);
        tensor.msg(2, &shape);
        let mut ty = Buf::default();
        ty.msg(1, &tensor);
        let mut vi = Buf::default();
        vi.string(1, &io.name);
        vi.msg(2, &ty);
        vi
    }

    /// Serialises the model (IR 8, opset 17).
    pub fn to_bytes(&self, graph_name: &str, producer: &str) -> Vec<u8> {
        let mut g = Buf::default();
        for n in &self.nodes {
            let mut nb = Buf::default();
            for i in &n.inputs {
                nb.string(1, i);
            }
            for o in &n.outputs {
                nb.string(2, o);
            }
            nb.string(3, &n.outputs[0]);
            nb.string(4, &n.op);
            for (k, v) in &n.attrs {
                let mut a = Buf::default();
                a.string(1, k);
                match v {
                    Attr::Float(f) => {
                        a.float(2, *f);
                        a.int(20, 1);
                    }
                    Attr::Int(i) => {
                        a.int(3, *i);
                        a.int(20, 2);
                    }
                    Attr::Ints(is) => {
                        for i in is {
                            a.int(8, *i);
                        }
                        a.int(20, 7);
                    }
                }
                nb.msg(5, &a);
            }
            g.msg(1, &nb);
        }
        g.string(2, graph_name);
        for t in &self.inits {
            let mut tb = Buf::default();
            for d in &t.dims {
                tb.int(1, *d);
            }
            tb.int(2, t.elem as i64);
            tb.string(8, &t.name);
            tb.bytes(9, &t.raw);
            g.msg(5, &tb);
        }
        for i in &self.inputs {
            g.msg(11, &Self::value_info(i));
        }
        for o in &self.outputs {
            g.msg(12, &Self::value_info(o));
        }
        let mut m = Buf::default();
        m.int(1, 8);
        m.string(2, producer);
        m.string(3, env!("CARGO_PKG_VERSION"));
        m.msg(7, &g);
        let mut opset = Buf::default();
        opset.string(1, "");
        opset.int(2, 17);
        m.msg(8, &opset);
        for (k, v) in &self.metadata {
            let mut kv = Buf::default();
            kv.string(1, k);
            kv.string(2, v);
            m.msg(14, &kv);
        }
        m.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_match_protobuf() {
        let mut b = Buf::default();
        b.varint(1);
        b.varint(300);
        b.varint(u64::MAX);
        assert_eq!(&b.0[..3], &[0x01, 0xAC, 0x02]);
        assert_eq!(b.0.len(), 3 + 10);
        let mut b = Buf::default();
        b.int(1, -1); // negative int64: ten bytes, as protobuf encodes it
        assert_eq!(b.0.len(), 11);
    }
}
