//! The messages of `onnx.proto` that reflex reads and writes, declared for `prost` (which does the
//! encoding and decoding). Field numbers and types follow onnx/onnx `onnx/onnx.proto` (proto2
//! syntax: `optional` scalars are `Option`, repeated scalars are unpacked unless the .proto says
//! `packed = true`); fields reflex never sets or reads are left out, and `prost` skips them when
//! decoding a file written by another tool.
//!
//! Only these nine messages are declared, rather than generating all of `onnx.proto` at build time:
//! that would need `protoc` (a C++ program) or a protobuf compiler crate in the build, for
//! messages reflex does not use. Every file written with these declarations is loaded back by
//! ONNX Runtime in the tests, which is the check that the numbers are right.

/// `TensorProto.DataType.FLOAT`.
pub const FLOAT: i32 = 1;

/// `ModelProto`: a graph with the format version and operator sets it needs.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelProto {
    /// `ir_version`: the ONNX file format version.
    #[prost(int64, optional, tag = "1")]
    pub ir_version: Option<i64>,
    /// `producer_name`.
    #[prost(string, optional, tag = "2")]
    pub producer_name: Option<String>,
    /// `producer_version`.
    #[prost(string, optional, tag = "3")]
    pub producer_version: Option<String>,
    /// `graph`.
    #[prost(message, optional, tag = "7")]
    pub graph: Option<GraphProto>,
    /// `opset_import`: operator set versions by domain.
    #[prost(message, repeated, tag = "8")]
    pub opset_import: Vec<OperatorSetIdProto>,
    /// `metadata_props`: free key-value pairs.
    #[prost(message, repeated, tag = "14")]
    pub metadata_props: Vec<StringStringEntryProto>,
}

/// `OperatorSetIdProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct OperatorSetIdProto {
    /// `domain`: empty for the default ONNX operators.
    #[prost(string, optional, tag = "1")]
    pub domain: Option<String>,
    /// `version`.
    #[prost(int64, optional, tag = "2")]
    pub version: Option<i64>,
}

/// `StringStringEntryProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StringStringEntryProto {
    /// `key`.
    #[prost(string, optional, tag = "1")]
    pub key: Option<String>,
    /// `value`.
    #[prost(string, optional, tag = "2")]
    pub value: Option<String>,
}

/// `GraphProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GraphProto {
    /// `node`, in topological order.
    #[prost(message, repeated, tag = "1")]
    pub node: Vec<NodeProto>,
    /// `name`.
    #[prost(string, optional, tag = "2")]
    pub name: Option<String>,
    /// `initializer`: the constants (weights).
    #[prost(message, repeated, tag = "5")]
    pub initializer: Vec<TensorProto>,
    /// `input`.
    #[prost(message, repeated, tag = "11")]
    pub input: Vec<ValueInfoProto>,
    /// `output`.
    #[prost(message, repeated, tag = "12")]
    pub output: Vec<ValueInfoProto>,
}

/// `NodeProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeProto {
    /// `input`: value names.
    #[prost(string, repeated, tag = "1")]
    pub input: Vec<String>,
    /// `output`: value names.
    #[prost(string, repeated, tag = "2")]
    pub output: Vec<String>,
    /// `name`.
    #[prost(string, optional, tag = "3")]
    pub name: Option<String>,
    /// `op_type`.
    #[prost(string, optional, tag = "4")]
    pub op_type: Option<String>,
    /// `attribute`.
    #[prost(message, repeated, tag = "5")]
    pub attribute: Vec<AttributeProto>,
}

/// `AttributeProto.AttributeType`, the values reflex writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub enum AttributeType {
    /// `UNDEFINED`.
    Undefined = 0,
    /// `FLOAT`.
    Float = 1,
    /// `INT`.
    Int = 2,
    /// `INTS`.
    Ints = 7,
}

/// `AttributeProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AttributeProto {
    /// `name`.
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    /// `f`.
    #[prost(float, optional, tag = "2")]
    pub f: Option<f32>,
    /// `i`.
    #[prost(int64, optional, tag = "3")]
    pub i: Option<i64>,
    /// `ints`.
    #[prost(int64, repeated, packed = "false", tag = "8")]
    pub ints: Vec<i64>,
    /// `type`.
    #[prost(enumeration = "AttributeType", optional, tag = "20")]
    pub r#type: Option<i32>,
}

/// `TensorProto`: a constant tensor.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorProto {
    /// `dims`.
    #[prost(int64, repeated, packed = "false", tag = "1")]
    pub dims: Vec<i64>,
    /// `data_type`: a `TensorProto.DataType` value.
    #[prost(int32, optional, tag = "2")]
    pub data_type: Option<i32>,
    /// `float_data` (packed in onnx.proto).
    #[prost(float, repeated, tag = "4")]
    pub float_data: Vec<f32>,
    /// `name`.
    #[prost(string, optional, tag = "8")]
    pub name: Option<String>,
    /// `raw_data`: little-endian values, the form reflex writes.
    #[prost(bytes = "vec", optional, tag = "9")]
    pub raw_data: Option<Vec<u8>>,
    /// `external_data`: where the values are when they are in another file (`location`,
    /// `offset`, `length`).
    #[prost(message, repeated, tag = "13")]
    pub external_data: Vec<StringStringEntryProto>,
    /// `data_location`: 1 (`EXTERNAL`) when the values are in another file.
    #[prost(int32, optional, tag = "14")]
    pub data_location: Option<i32>,
}

/// `ValueInfoProto`: a graph input or output.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueInfoProto {
    /// `name`.
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    /// `type`.
    #[prost(message, optional, tag = "2")]
    pub r#type: Option<TypeProto>,
}

/// `TypeProto`, with only its `tensor_type` member (field 1 of its `value` oneof).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeProto {
    /// `tensor_type`.
    #[prost(message, optional, tag = "1")]
    pub tensor_type: Option<TensorTypeProto>,
}

/// `TypeProto.Tensor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorTypeProto {
    /// `elem_type`: a `TensorProto.DataType` value.
    #[prost(int32, optional, tag = "1")]
    pub elem_type: Option<i32>,
    /// `shape`.
    #[prost(message, optional, tag = "2")]
    pub shape: Option<TensorShapeProto>,
}

/// `TensorShapeProto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorShapeProto {
    /// `dim`.
    #[prost(message, repeated, tag = "1")]
    pub dim: Vec<Dimension>,
}

/// `TensorShapeProto.Dimension`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Dimension {
    /// `value`: a fixed size or a named one.
    #[prost(oneof = "DimensionValue", tags = "1, 2")]
    pub value: Option<DimensionValue>,
}

/// The `value` oneof of `TensorShapeProto.Dimension`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum DimensionValue {
    /// `dim_value`.
    #[prost(int64, tag = "1")]
    DimValue(i64),
    /// `dim_param`.
    #[prost(string, tag = "2")]
    DimParam(String),
}
