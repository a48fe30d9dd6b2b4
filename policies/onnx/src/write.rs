//! Writing ONNX models: a graph builder whose `to_bytes` encodes `onnx.proto`'s ModelProto with
//! `prost` ([`crate::proto`]).
//!
//! reflex writes its own ONNX files (imitation-trained policies, residual exports, the tiny VLA used
//! in tests) so that exporting needs no Python. Every file written here is loaded back by ONNX
//! Runtime in the tests.

use crate::proto as pb;

/// The ONNX file format version written (IR 8: ONNX 1.10 and later read it).
pub const IR_VERSION: i64 = 8;
/// The default-domain operator set the graphs are written against.
pub const OPSET: i64 = 17;

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

    fn value_info(io: &Io) -> pb::ValueInfoProto {
        let dim = io
            .dims
            .iter()
            .map(|d| pb::Dimension {
                value: Some(match d {
                    Dim::Fixed(v) => pb::DimensionValue::DimValue(*v),
                    Dim::Param(p) => pb::DimensionValue::DimParam(p.clone()),
                }),
            })
            .collect();
        pb::ValueInfoProto {
            name: Some(io.name.clone()),
            r#type: Some(pb::TypeProto {
                tensor_type: Some(pb::TensorTypeProto {
                    elem_type: Some(io.elem as i32),
                    shape: Some(pb::TensorShapeProto { dim }),
                }),
            }),
        }
    }

    fn attribute(name: &str, v: &Attr) -> pb::AttributeProto {
        let mut a = pb::AttributeProto {
            name: Some(name.into()),
            ..Default::default()
        };
        let ty = match v {
            Attr::Float(f) => {
                a.f = Some(*f);
                pb::AttributeType::Float
            }
            Attr::Int(i) => {
                a.i = Some(*i);
                pb::AttributeType::Int
            }
            Attr::Ints(is) => {
                a.ints = is.clone();
                pb::AttributeType::Ints
            }
        };
        a.r#type = Some(ty as i32);
        a
    }

    /// The model as its protobuf message (IR 8, opset 17).
    pub fn to_proto(&self, graph_name: &str, producer: &str) -> pb::ModelProto {
        let node = self
            .nodes
            .iter()
            .map(|n| pb::NodeProto {
                input: n.inputs.clone(),
                output: n.outputs.clone(),
                name: Some(n.outputs[0].clone()),
                op_type: Some(n.op.clone()),
                attribute: n.attrs.iter().map(|(k, v)| Self::attribute(k, v)).collect(),
            })
            .collect();
        let initializer = self
            .inits
            .iter()
            .map(|t| pb::TensorProto {
                dims: t.dims.clone(),
                data_type: Some(t.elem as i32),
                name: Some(t.name.clone()),
                raw_data: Some(t.raw.clone()),
                ..Default::default()
            })
            .collect();
        pb::ModelProto {
            ir_version: Some(IR_VERSION),
            producer_name: Some(producer.into()),
            producer_version: Some(env!("CARGO_PKG_VERSION").into()),
            graph: Some(pb::GraphProto {
                node,
                name: Some(graph_name.into()),
                initializer,
                input: self.inputs.iter().map(Self::value_info).collect(),
                output: self.outputs.iter().map(Self::value_info).collect(),
            }),
            opset_import: vec![pb::OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(OPSET),
            }],
            metadata_props: self
                .metadata
                .iter()
                .map(|(k, v)| pb::StringStringEntryProto {
                    key: Some(k.clone()),
                    value: Some(v.clone()),
                })
                .collect(),
        }
    }

    /// Serialises the model (IR 8, opset 17).
    pub fn to_bytes(&self, graph_name: &str, producer: &str) -> Vec<u8> {
        prost::Message::encode_to_vec(&self.to_proto(graph_name, producer))
    }
}
