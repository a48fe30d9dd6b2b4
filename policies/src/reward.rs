//! A success classifier as a file, run by ONNX Runtime: camera frames in, the probability that
//! they show the task done out. `reflex reward train` writes one (`M.onnx` and its spec
//! `M.reward.toml`); a run with `[reward] classifier = "M.onnx"` makes it the sparse reward.
//!
//! The classifier implements [`FrameEncoder`] with one value, the probability, so the runtime
//! runs it the way it runs a frozen image encoder: inline in simulated time, on its own thread
//! beside the loop in real time.

use crate::features::EncodeError;
use crate::onnx_policy::{LoadError, RunOptions, open_session};
use crate::spec::{InputSource, InputSpec};
use ort::session::{Session, SessionInputValue};
use ort::value::TensorRef;
use reflex_runtime::config::{Invalid, Validate, in_range, key};
use reflex_runtime::features::FrameEncoder;
use reflex_runtime::msg::Image;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::path::{Path, PathBuf};

/// The classifier's spec, written beside its ONNX file as `<name>.reward.toml`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardSpec {
    /// Always `reflex-reward`.
    pub format: String,
    /// Version (1).
    pub version: u16,
    /// A name for logs.
    pub name: String,
    /// The graph's output: the probability of success, `[B, 1]`.
    pub output: String,
    /// The cameras it reads, each a graph input (`source = "image"` inputs as in a policy spec).
    pub inputs: Vec<InputSpec>,
    /// Probability at or above which a frame counts as success.
    pub threshold: f32,
    /// What it was trained on and how it did on held-out episodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<String>,
}

impl RewardSpec {
    /// The spec as TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("the reward spec serialises")
    }

    /// Where the spec of `model` lives: `x.onnx` -> `x.reward.toml`.
    pub fn path_for(model: &Path) -> PathBuf {
        model.with_extension("reward.toml")
    }
}

impl Validate for RewardSpec {
    fn validate(&self, p: &str) -> Result<(), Invalid> {
        if self.format != "reflex-reward" {
            return Err(Invalid {
                key: key(p, "format"),
                value: format!("{:?}", self.format),
                allowed: "\"reflex-reward\"".into(),
            });
        }
        in_range(p, "version", self.version, 1, 1)?;
        in_range(p, "threshold", self.threshold, 0.0, 1.0)?;
        if self.inputs.is_empty()
            || !self
                .inputs
                .iter()
                .all(|i| matches!(i, InputSource::Image { .. }))
        {
            return Err(Invalid {
                key: key(p, "inputs"),
                value: format!("{} inputs", self.inputs.len()),
                allowed: "one or more `source = \"image\"` inputs".into(),
            });
        }
        for (i, inp) in self.inputs.iter().enumerate() {
            if let InputSource::Image { width, height, .. } = inp {
                let k = key(p, &format!("inputs[{i}]"));
                in_range(&k, "width", *width, 1, 4096)?;
                in_range(&k, "height", *height, 1, 4096)?;
            }
        }
        Ok(())
    }
}

/// A success classifier opened with ONNX Runtime.
pub struct SuccessClassifier {
    spec: RewardSpec,
    file: String,
    session: Session,
    nchw: Vec<Vec<f32>>,
}

impl SuccessClassifier {
    /// Opens `model` and the spec beside it.
    pub fn load(model: &Path, opts: &RunOptions) -> Result<Self, LoadError> {
        crate::onnx_policy::model_file(model)?;
        let spec: RewardSpec = reflex_runtime::config::load(&RewardSpec::path_for(model))?;
        let session = open_session(model, opts)?;
        let nchw = spec
            .inputs
            .iter()
            .map(|i| match i {
                InputSource::Image { width, height, .. } => {
                    vec![0.0; 3 * (*width * *height) as usize]
                }
                _ => Vec::new(),
            })
            .collect();
        Ok(SuccessClassifier {
            spec,
            file: model.display().to_string(),
            session,
            nchw,
        })
    }

    /// Its spec.
    pub fn spec(&self) -> &RewardSpec {
        &self.spec
    }

    /// The cameras it reads.
    pub fn cameras(&self) -> Vec<&str> {
        self.spec
            .inputs
            .iter()
            .filter_map(|i| match i {
                InputSource::Image { camera, .. } => Some(camera.as_str()),
                _ => None,
            })
            .collect()
    }

    /// The probability that `images` (found by camera name) show success.
    pub fn probability(&mut self, images: &[Image]) -> Result<f32, EncodeError> {
        let input = |message: String| EncodeError::Input {
            encoder: self.file.clone(),
            message,
        };
        for (inp, buf) in self.spec.inputs.iter().zip(&mut self.nchw) {
            let InputSource::Image {
                camera,
                width,
                height,
                mean,
                std,
                eps,
                ..
            } = inp
            else {
                continue;
            };
            let std = &crate::spec::image_divisor(std, *eps);
            crate::vla::camera_to_nchw(
                images,
                camera,
                "the classifier",
                *width,
                *height,
                mean,
                std,
                buf,
            )
            .map_err(input)?;
        }
        let rt = |e: ort::Error| EncodeError::Runtime {
            encoder: self.file.clone(),
            message: e.to_string(),
        };
        let mut feeds: Vec<(Cow<str>, SessionInputValue)> = vec![];
        for (inp, buf) in self.spec.inputs.iter().zip(&self.nchw) {
            if let InputSource::Image {
                name,
                width,
                height,
                ..
            } = inp
            {
                let shape = [1usize, 3, *height as usize, *width as usize];
                feeds.push((
                    name.as_str().into(),
                    TensorRef::from_array_view((shape, &buf[..]))
                        .map_err(rt)?
                        .into(),
                ));
            }
        }
        let outputs = self.session.run(feeds).map_err(rt)?;
        let (_, v) = outputs[self.spec.output.as_str()]
            .try_extract_tensor::<f32>()
            .map_err(rt)?;
        match v.first() {
            Some(p) if p.is_finite() => Ok(*p),
            other => Err(EncodeError::Runtime {
                encoder: self.file.clone(),
                message: format!("output `{}` is {other:?}", self.spec.output),
            }),
        }
    }
}

impl FrameEncoder for SuccessClassifier {
    fn features_len(&self) -> usize {
        1
    }

    fn encode(&mut self, images: &[Image], out: &mut [f32]) -> Result<(), String> {
        out[0] = self.probability(images).map_err(|e| e.to_string())?;
        Ok(())
    }
}
