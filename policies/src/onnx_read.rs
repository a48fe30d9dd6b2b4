//! Reading the float initializers (the weights) back out of an ONNX file: a protobuf decoder
//! for the path `ModelProto.graph (7) -> GraphProto.initializer (5) -> TensorProto` and nothing
//! else. reflex uses it to run a residual it exported (policies/src/sac/export.rs) on the loop
//! thread in plain Rust; ONNX Runtime checks at load that the graph computes the same thing.
//!
//! Field numbers follow onnx/onnx `onnx/onnx.proto`: TensorProto `dims` = 1, `data_type` = 2,
//! `float_data` = 4, `name` = 8, `raw_data` = 9. Unknown fields are skipped by wire type.

use std::collections::HashMap;

/// A float32 initializer.
#[derive(Clone, Debug, PartialEq)]
pub struct Initializer {
    /// Shape.
    pub dims: Vec<i64>,
    /// Values, row-major.
    pub data: Vec<f32>,
}

/// Why a file could not be read as ONNX.
#[derive(Debug, thiserror::Error)]
#[error("not a readable ONNX model: {0}")]
pub struct ReadError(String);

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn done(&self) -> bool {
        self.at >= self.b.len()
    }

    fn varint(&mut self) -> Result<u64, ReadError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self
                .b
                .get(self.at)
                .ok_or_else(|| ReadError("a varint runs past the end".into()))?;
            self.at += 1;
            v |= ((byte & 0x7f) as u64) << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(ReadError("a varint longer than 10 bytes".into()))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ReadError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|e| *e <= self.b.len())
            .ok_or_else(|| ReadError(format!("a field of {n} bytes runs past the end")))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    /// The next field: its number, wire type and (for length-delimited fields) its bytes.
    fn field(&mut self) -> Result<(u64, Field<'a>), ReadError> {
        let key = self.varint()?;
        let (num, wire) = (key >> 3, key & 7);
        let f = match wire {
            0 => Field::Varint(self.varint()?),
            1 => Field::Fixed(self.take(8)?),
            2 => {
                let n = self.varint()? as usize;
                Field::Bytes(self.take(n)?)
            }
            5 => Field::Fixed(self.take(4)?),
            w => return Err(ReadError(format!("field {num} has wire type {w}"))),
        };
        Ok((num, f))
    }
}

enum Field<'a> {
    Varint(u64),
    Fixed(&'a [u8]),
    Bytes(&'a [u8]),
}

fn f32s(b: &[u8]) -> impl Iterator<Item = f32> + '_ {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

/// One TensorProto; `None` when it is not float32.
fn tensor(b: &[u8]) -> Result<Option<(String, Initializer)>, ReadError> {
    let mut c = Cursor { b, at: 0 };
    let (mut name, mut dims, mut elem, mut data) = (String::new(), vec![], 1u64, vec![]);
    while !c.done() {
        match c.field()? {
            (1, Field::Varint(d)) => dims.push(d as i64),
            (1, Field::Bytes(packed)) => {
                let mut p = Cursor { b: packed, at: 0 };
                while !p.done() {
                    dims.push(p.varint()? as i64);
                }
            }
            (2, Field::Varint(t)) => elem = t,
            (4, Field::Bytes(packed)) => data.extend(f32s(packed)),
            (4, Field::Fixed(one)) => data.extend(f32s(one)),
            (8, Field::Bytes(s)) => {
                name = String::from_utf8(s.to_vec())
                    .map_err(|_| ReadError("an initializer name is not UTF-8".into()))?
            }
            (9, Field::Bytes(raw)) => data.extend(f32s(raw)),
            _ => {}
        }
    }
    if elem != 1 {
        return Ok(None);
    }
    // Dimensions come from the file: a product that overflows or is negative is refused.
    let n = dims
        .iter()
        .try_fold(1i64, |a, d| if *d < 0 { None } else { a.checked_mul(*d) });
    if n.is_none_or(|n| n as usize != data.len()) {
        return Err(ReadError(format!(
            "initializer `{name}` has shape {dims:?} but {} values",
            data.len()
        )));
    }
    Ok(Some((name, Initializer { dims, data })))
}

/// The float32 initializers of an ONNX model, by name.
pub fn float_initializers(model: &[u8]) -> Result<HashMap<String, Initializer>, ReadError> {
    let mut out = HashMap::new();
    let mut m = Cursor { b: model, at: 0 };
    let mut graphs = 0;
    while !m.done() {
        if let (7, Field::Bytes(graph)) = m.field()? {
            graphs += 1;
            let mut g = Cursor { b: graph, at: 0 };
            while !g.done() {
                if let (5, Field::Bytes(t)) = g.field()?
                    && let Some((name, init)) = tensor(t)?
                {
                    out.insert(name, init);
                }
            }
        }
    }
    if graphs == 0 {
        return Err(ReadError("no graph in the file".into()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onnx_write::{Dim, Elem, Graph};

    #[test]
    fn reads_back_what_the_writer_wrote() {
        let mut g = Graph::new();
        let x = g.input("x", Elem::F32, vec![Dim::Fixed(1), Dim::Fixed(2)]);
        let w = g.named_constant("layer.w", &[2, 3], &[1.0, -2.0, 3.5, 0.0, 1e-7, -8.0]);
        let y = g.op("MatMul", &[&x, &w], vec![]);
        g.output(&y, "y", Elem::F32, vec![Dim::Fixed(1), Dim::Fixed(3)]);
        let _ = g.constant_i64("shape", &[1, 3]);
        let inits = float_initializers(&g.to_bytes("t", "test")).unwrap();
        assert_eq!(
            inits.len(),
            1,
            "the int64 constant is not a float initializer"
        );
        assert_eq!(
            inits["layer.w"],
            Initializer {
                dims: vec![2, 3],
                data: vec![1.0, -2.0, 3.5, 0.0, 1e-7, -8.0]
            }
        );
    }

    #[test]
    fn truncated_or_foreign_bytes_are_errors_not_panics() {
        let mut g = Graph::new();
        let x = g.input("x", Elem::F32, vec![Dim::Fixed(1)]);
        let c = g.named_constant("c", &[4], &[1.0, 2.0, 3.0, 4.0]);
        let y = g.op("Add", &[&x, &c], vec![]);
        g.output(&y, "y", Elem::F32, vec![Dim::Fixed(4)]);
        let bytes = g.to_bytes("t", "test");
        for cut in 0..bytes.len() {
            let _ = float_initializers(&bytes[..cut]);
        }
        assert!(float_initializers(b"not a model at all").is_err());
        assert!(float_initializers(&[]).is_err());
    }
}
