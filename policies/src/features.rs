//! A frozen image encoder as a file: an ONNX graph that turns each camera's image into a feature
//! map, and its spec `M.encoder.toml` beside it. A learner that sees reads these maps (through its
//! trainable heads) instead of the images: the actor runs the file once per frame with ONNX
//! Runtime, where the base policy already runs, and sends the maps with each step.
//!
//! reflex writes such a file itself from the image encoder a policy was trained with
//! (`reflex bc train --camera ...` writes `<model>.encoder.onnx`): its convolutions without the
//! policy's readout, so the maps keep where things are. Nothing is downloaded.
//!
//! The file's identity ([`encoder_id`]: its name and a digest of its bytes) travels with every
//! step's maps; a learner refuses maps made by another file.

use crate::onnx_policy::{LoadError, RunOptions, open_session};
use ort::session::{Session, SessionInputValue};
use ort::value::TensorRef;
use reflex_runtime::config::{Invalid, Validate, in_range, key};
use reflex_runtime::msg::Image;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::path::{Path, PathBuf};

/// One camera of an encoder file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EncoderCamera {
    /// The robot's camera.
    pub camera: String,
    /// Width the graph reads (images are resized to it).
    pub width: u32,
    /// Height the graph reads.
    pub height: u32,
    /// Graph input, `[B, 3, height, width]` float32, normalised with `mean` and `std`.
    pub input: String,
    /// Graph output, `[B, channels, map_height, map_width]` float32.
    pub output: String,
    /// Channels of the map.
    pub channels: u32,
    /// Rows of the map.
    pub map_height: u32,
    /// Columns of the map.
    pub map_width: u32,
}

impl EncoderCamera {
    /// The map's shape, `[channels, height, width]`.
    pub fn shape(&self) -> [u32; 3] {
        [self.channels, self.map_height, self.map_width]
    }

    /// Values in one map.
    pub fn map_len(&self) -> usize {
        self.shape().iter().map(|d| *d as usize).product()
    }
}

/// The spec of an encoder file (`M.encoder.toml` beside `M.encoder.onnx`, see
/// [`encoder_spec_path`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EncoderSpec {
    /// Always `reflex-encoder`.
    pub format: String,
    /// Spec format version (1).
    pub version: u16,
    /// A name for logs.
    pub name: String,
    /// Cameras, in the order their maps follow each other in a step.
    pub cameras: Vec<EncoderCamera>,
    /// Per-channel mean of the input normalisation (pixels scaled to [0, 1] first).
    pub mean: [f32; 3],
    /// Per-channel standard deviation of the input normalisation.
    pub std: [f32; 3],
    /// How it was made.
    #[serde(default)]
    pub provenance: Option<String>,
}

impl Validate for EncoderSpec {
    fn validate(&self, p: &str) -> Result<(), Invalid> {
        let bad = |k: &str, value: String, allowed: &str| Invalid {
            key: key(p, k),
            value,
            allowed: allowed.into(),
        };
        if self.format != "reflex-encoder" {
            return Err(bad(
                "format",
                format!("{:?}", self.format),
                "\"reflex-encoder\"",
            ));
        }
        in_range(p, "version", self.version, 1, 1)?;
        if self.cameras.is_empty() {
            return Err(bad("cameras", "[]".into(), "one or more cameras"));
        }
        for (i, c) in self.cameras.iter().enumerate() {
            let p = key(p, &format!("cameras[{i}]"));
            in_range(&p, "width", c.width, 1, 8192)?;
            in_range(&p, "height", c.height, 1, 8192)?;
            in_range(&p, "channels", c.channels, 1, 4096)?;
            in_range(&p, "map_height", c.map_height, 1, 1024)?;
            in_range(&p, "map_width", c.map_width, 1, 1024)?;
        }
        if self.std.iter().any(|s| !(*s > 0.0 && s.is_finite())) {
            return Err(bad(
                "std",
                format!("{:?}", self.std),
                "three positive finite values",
            ));
        }
        Ok(())
    }
}

impl EncoderSpec {
    /// The spec as TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("an encoder spec serialises")
    }
}

/// The spec file beside encoder `model`.
/// `M.encoder.onnx` (the name `reflex bc train` gives it) has `M.encoder.toml`; any other
/// `X.onnx` has `X.encoder.toml`.
pub fn encoder_spec_path(model: &Path) -> PathBuf {
    let stem = model.file_stem().map(|s| s.to_string_lossy().into_owned());
    match stem {
        Some(s) if s.ends_with(".encoder") => model.with_extension("toml"),
        _ => model.with_extension("encoder.toml"),
    }
}

/// Where `reflex bc train --out M.onnx` writes the encoder of a policy that sees.
pub fn encoder_path_for(policy: &Path) -> PathBuf {
    policy.with_extension("encoder.onnx")
}

/// An encoder file's identity: its file name and the FNV-1a 64 digest of its bytes.
pub fn encoder_id(model: &Path, bytes: &[u8]) -> String {
    use reflex_runtime::control::{DIGEST_START, digest_bytes};
    let h = digest_bytes(DIGEST_START, bytes);
    let name = model.file_name().map_or_else(
        || model.display().to_string(),
        |f| f.to_string_lossy().into_owned(),
    );
    format!("{name}#{h:016x}")
}

/// Why an image could not be encoded.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    /// The images do not match the encoder's cameras.
    #[error("encoder `{encoder}`: {message}")]
    Input {
        /// The encoder's id.
        encoder: String,
        /// What is wrong and what to do.
        message: String,
    },
    /// ONNX Runtime failed.
    #[error("encoder `{encoder}`: ONNX Runtime: {message}")]
    Runtime {
        /// The encoder's id.
        encoder: String,
        /// ONNX Runtime's message.
        message: String,
    },
}

/// An encoder file opened with ONNX Runtime: images in, one feature map per camera out.
pub struct FeatureEncoder {
    spec: EncoderSpec,
    id: String,
    session: Session,
    nchw: Vec<Vec<f32>>,
}

impl FeatureEncoder {
    /// Opens `model` and the spec beside it.
    pub fn load(model: &Path, opts: &RunOptions) -> Result<Self, LoadError> {
        crate::onnx_policy::model_file(model)?;
        let spec: EncoderSpec = reflex_runtime::config::load(&encoder_spec_path(model))?;
        let bytes = std::fs::read(model).map_err(|e| LoadError::Model {
            path: model.display().to_string(),
            message: e.to_string(),
        })?;
        let session = open_session(model, opts)?;
        Ok(FeatureEncoder {
            id: encoder_id(model, &bytes),
            nchw: spec
                .cameras
                .iter()
                .map(|c| vec![0.0; 3 * (c.width * c.height) as usize])
                .collect(),
            spec,
            session,
        })
    }

    /// Its identity ([`encoder_id`]).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Its spec.
    pub fn spec(&self) -> &EncoderSpec {
        &self.spec
    }

    /// Values in one step's maps (every camera).
    pub fn features_len(&self) -> usize {
        self.spec.cameras.iter().map(EncoderCamera::map_len).sum()
    }

    /// Encodes one image per camera (`images` in the spec's camera order, found by name) into
    /// `out` (`features_len` values, maps concatenated in camera order).
    pub fn encode(&mut self, images: &[Image], out: &mut [f32]) -> Result<(), EncodeError> {
        let input = |message: String| EncodeError::Input {
            encoder: self.id.clone(),
            message,
        };
        if out.len() != self.features_len() {
            return Err(input(format!(
                "{} output values for maps of {}",
                out.len(),
                self.features_len()
            )));
        }
        for (c, buf) in self.spec.cameras.iter().zip(&mut self.nchw) {
            crate::vla::camera_to_nchw(
                images,
                &c.camera,
                "the encoder",
                c.width,
                c.height,
                &self.spec.mean,
                &self.spec.std,
                buf,
            )
            .map_err(input)?;
        }
        let rt = |e: ort::Error| EncodeError::Runtime {
            encoder: self.id.clone(),
            message: e.to_string(),
        };
        let mut feeds: Vec<(Cow<str>, SessionInputValue)> = vec![];
        for (c, buf) in self.spec.cameras.iter().zip(&self.nchw) {
            let shape = [1usize, 3, c.height as usize, c.width as usize];
            feeds.push((
                c.input.as_str().into(),
                TensorRef::from_array_view((shape, &buf[..]))
                    .map_err(rt)?
                    .into(),
            ));
        }
        let outputs = self.session.run(feeds).map_err(rt)?;
        let mut off = 0;
        for c in &self.spec.cameras {
            let (_, v) = outputs[c.output.as_str()]
                .try_extract_tensor::<f32>()
                .map_err(rt)?;
            let n = c.map_len();
            if v.len() != n {
                return Err(EncodeError::Runtime {
                    encoder: self.id.clone(),
                    message: format!(
                        "output `{}` has {} values, the spec's map {:?} has {n}",
                        c.output,
                        v.len(),
                        c.shape()
                    ),
                });
            }
            out[off..off + n].copy_from_slice(v);
            off += n;
        }
        Ok(())
    }
}

impl reflex_runtime::features::FrameEncoder for FeatureEncoder {
    fn features_len(&self) -> usize {
        FeatureEncoder::features_len(self)
    }

    fn encode(&mut self, images: &[Image], out: &mut [f32]) -> Result<(), String> {
        FeatureEncoder::encode(self, images, out).map_err(|e| e.to_string())
    }
}
