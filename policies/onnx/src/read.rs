//! Reading the float initializers (the weights) back out of an ONNX file, decoded by `prost` with
//! [`crate::proto`]'s messages. reflex uses it to run a residual it exported
//! (policies/learn/src/sac/export.rs) on the loop thread in plain Rust; ONNX Runtime checks at
//! load that the graph computes the same thing.

use crate::proto::{FLOAT, ModelProto, TensorProto};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// `TensorProto.DataLocation.EXTERNAL`.
const EXTERNAL: i32 = 1;

/// Where a tensor's values are kept outside the model file: the file (relative to the model's
/// folder), the byte offset and the length (`None`: to the end).
struct External {
    location: String,
    offset: u64,
    length: Option<u64>,
}

fn external(t: &TensorProto) -> Option<External> {
    if t.data_location != Some(EXTERNAL) {
        return None;
    }
    let get = |k: &str| {
        t.external_data
            .iter()
            .find(|e| e.key.as_deref() == Some(k))
            .and_then(|e| e.value.clone())
    };
    Some(External {
        location: get("location").unwrap_or_default(),
        offset: get("offset").and_then(|v| v.parse().ok()).unwrap_or(0),
        length: get("length").and_then(|v| v.parse().ok()),
    })
}

/// The external data files a model's initializers name (ONNX's external data: the weights of a
/// large model kept beside it, e.g. `model.onnx.data`), each once, in order of first use.
pub fn external_files(model: &[u8]) -> Result<Vec<String>, ReadError> {
    let m = <ModelProto as prost::Message>::decode(model).map_err(|e| ReadError(e.to_string()))?;
    let mut out: Vec<String> = vec![];
    for t in m.graph.iter().flat_map(|g| &g.initializer) {
        if let Some(e) = external(t)
            && !out.contains(&e.location)
        {
            out.push(e.location);
        }
    }
    Ok(out)
}

/// The external data files of the model at `path` that are not where it says: (the name it
/// gives, the path looked at). Empty when every file is there, or the model keeps its weights
/// inside itself.
pub fn missing_external_files(path: &Path) -> Result<Vec<(String, PathBuf)>, ReadError> {
    let bytes = std::fs::read(path).map_err(|e| ReadError(format!("{}: {e}", path.display())))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    Ok(external_files(&bytes)?
        .into_iter()
        .map(|l| {
            let p = dir.join(&l);
            (l, p)
        })
        .filter(|(_, p)| !p.is_file())
        .collect())
}

/// The float32 initializers of the model file at `path`, by name, with the values of those kept
/// in external data files read from beside it.
pub fn float_initializers_of_file(path: &Path) -> Result<HashMap<String, Initializer>, ReadError> {
    let bytes = std::fs::read(path).map_err(|e| ReadError(format!("{}: {e}", path.display())))?;
    let m =
        <ModelProto as prost::Message>::decode(&bytes[..]).map_err(|e| ReadError(e.to_string()))?;
    let graph = m
        .graph
        .ok_or_else(|| ReadError("no graph in the file".into()))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut files: HashMap<String, Vec<u8>> = HashMap::new();
    let mut out = HashMap::new();
    for mut t in graph.initializer {
        if let Some(e) = external(&t) {
            if t.data_type != Some(FLOAT) {
                continue;
            }
            if !files.contains_key(&e.location) {
                let p = dir.join(&e.location);
                let data = std::fs::read(&p).map_err(|err| {
                    ReadError(format!(
                        "initializer `{}` is kept in `{}`: {err}",
                        t.name.clone().unwrap_or_default(),
                        p.display()
                    ))
                })?;
                files.insert(e.location.clone(), data);
            }
            let data = &files[&e.location];
            let start = e.offset as usize;
            let end = e
                .length
                .map_or(data.len(), |l| start.saturating_add(l as usize));
            let Some(raw) = data.get(start..end) else {
                return Err(ReadError(format!(
                    "initializer `{}`: bytes {start}..{end} of `{}`, which has {}",
                    t.name.clone().unwrap_or_default(),
                    e.location,
                    data.len()
                )));
            };
            t.raw_data = Some(raw.to_vec());
        }
        if let Some((name, init)) = tensor(t)? {
            out.insert(name, init);
        }
    }
    Ok(out)
}

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

/// One TensorProto; `None` when it is not float32.
fn tensor(t: TensorProto) -> Result<Option<(String, Initializer)>, ReadError> {
    if t.data_type != Some(FLOAT) {
        return Ok(None);
    }
    let name = t.name.unwrap_or_default();
    let data: Vec<f32> = match t.raw_data {
        Some(raw) => {
            if raw.len() % 4 != 0 {
                return Err(ReadError(format!(
                    "initializer `{name}` has {} raw bytes, not a whole number of float32",
                    raw.len()
                )));
            }
            raw.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        }
        None => t.float_data,
    };
    // Dimensions come from the file: a product that overflows or is negative is refused.
    let n = t
        .dims
        .iter()
        .try_fold(1i64, |a, d| if *d < 0 { None } else { a.checked_mul(*d) });
    if n.is_none_or(|n| n as usize != data.len()) {
        return Err(ReadError(format!(
            "initializer `{name}` has shape {:?} but {} values",
            t.dims,
            data.len()
        )));
    }
    Ok(Some((name, Initializer { dims: t.dims, data })))
}

/// The float32 initializers of an ONNX model, by name.
pub fn float_initializers(model: &[u8]) -> Result<HashMap<String, Initializer>, ReadError> {
    let m = <ModelProto as prost::Message>::decode(model).map_err(|e| ReadError(e.to_string()))?;
    let graph = m
        .graph
        .ok_or_else(|| ReadError("no graph in the file".into()))?;
    let mut out = HashMap::new();
    for t in graph.initializer {
        if let Some((name, init)) = tensor(t)? {
            out.insert(name, init);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::write::{Dim, Elem, Graph};

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
