//! The policy spec: a TOML file beside each ONNX model that says what the network is, what it
//! eats and what it returns (docs/policy-spec.md is the reference for users).

use crate::sampler::{BetaSchedule, Ddim, Prediction, Sampler};
use reflex_runtime::config::{Invalid, Validate, in_range, key};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// What the network computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    /// Observation -> action chunk in one call (ACT-style).
    Chunk,
    /// A denoiser; reflex runs the DDIM sampler around it.
    Diffusion,
    /// A velocity field; reflex integrates Euler steps (pi0, SmolVLA).
    Flow,
}

/// Normalisation of a vector.
///
/// Without `eps` a zero-width range or deviation is clamped at 1e-6 (reflex's own models). With
/// `eps` the formulas are LeRobot's (0.6, `NormalizerProcessorStep`), so an imported policy sees
/// the numbers it was trained on: `min_max` replaces a zero `high - low` by `eps`; `mean_std`
/// normalises with `(x - mean) / (std + eps)` and unnormalises with `x * std + mean` (LeRobot adds
/// `eps` one way only).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Normalize {
    /// No normalisation.
    None,
    /// `2 (x - low) / (high - low) - 1`, to [-1, 1] (Diffusion Policy's convention).
    MinMax {
        /// Lower bound per component.
        low: Vec<f32>,
        /// Upper bound per component.
        high: Vec<f32>,
        /// Replaces a zero `high - low` (LeRobot's formula); absent: the width is at least 1e-6.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        eps: Option<f32>,
    },
    /// `(x - mean) / std`.
    MeanStd {
        /// Mean per component.
        mean: Vec<f32>,
        /// Standard deviation per component.
        std: Vec<f32>,
        /// Added to `std` when normalising (LeRobot's formula); absent: `std` is at least 1e-6.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        eps: Option<f32>,
    },
}

impl Normalize {
    /// The width `high - low` a min-max normalisation divides by.
    fn range(l: f32, h: f32, eps: Option<f32>) -> f32 {
        match eps {
            Some(e) if h - l == 0.0 => e,
            Some(_) => h - l,
            None => (h - l).max(1e-6),
        }
    }

    /// Normalises `x` in place (component `i` uses entry `i % len`, so one set of stats covers a
    /// stacked history or a chunk).
    pub fn apply(&self, x: &mut [f32]) {
        match self {
            Normalize::None => {}
            Normalize::MinMax { low, high, eps } => {
                for (i, v) in x.iter_mut().enumerate() {
                    let (l, h) = (low[i % low.len()], high[i % high.len()]);
                    let r = Self::range(l, h, *eps);
                    *v = 2.0 * (*v - l) / r - 1.0;
                }
            }
            Normalize::MeanStd { mean, std, eps } => {
                for (i, v) in x.iter_mut().enumerate() {
                    let s = std[i % std.len()];
                    let d = match eps {
                        Some(e) => s + e,
                        None => s.max(1e-6),
                    };
                    *v = (*v - mean[i % mean.len()]) / d;
                }
            }
        }
    }

    /// Inverse of [`Normalize::apply`] (LeRobot's unnormalisation when `eps` is given: see the
    /// type's documentation).
    pub fn invert(&self, x: &mut [f32]) {
        match self {
            Normalize::None => {}
            Normalize::MinMax { low, high, eps } => {
                for (i, v) in x.iter_mut().enumerate() {
                    let (l, h) = (low[i % low.len()], high[i % high.len()]);
                    let r = Self::range(l, h, *eps);
                    *v = (*v + 1.0) * 0.5 * r + l;
                }
            }
            Normalize::MeanStd { mean, std, eps } => {
                for (i, v) in x.iter_mut().enumerate() {
                    let s = std[i % std.len()];
                    let m = if eps.is_some() { s } else { s.max(1e-6) };
                    *v = *v * m + mean[i % mean.len()];
                }
            }
        }
    }

    fn len(&self) -> Option<usize> {
        match self {
            Normalize::None => None,
            Normalize::MinMax { low, high, .. } => Some(low.len().min(high.len())),
            Normalize::MeanStd { mean, std, .. } => Some(mean.len().min(std.len())),
        }
    }
}

fn d_norm() -> Normalize {
    Normalize::None
}
fn d_history() -> usize {
    1
}
fn is_one(n: &usize) -> bool {
    *n == 1
}
fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Where an input's values come from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "source", rename_all = "snake_case", deny_unknown_fields)]
pub enum InputSource {
    /// Named fields of the robot's state vector, concatenated (all of it when empty), stacked over
    /// the last `history` control steps (oldest first).
    State {
        /// Graph input name.
        name: String,
        /// State fields, in order.
        #[serde(default)]
        fields: Vec<String>,
        /// Observations stacked.
        #[serde(default = "d_history")]
        history: usize,
        /// Normalisation of one observation's values.
        #[serde(default = "d_norm")]
        normalize: Normalize,
    },
    /// A camera image, resized (bilinear) and normalised per channel, NCHW float32; with
    /// `history` > 1 the last `history` control steps' frames, oldest first (`[batch, history, 3,
    /// height, width]`).
    Image {
        /// Graph input name.
        name: String,
        /// Camera name in the robot spec.
        camera: String,
        /// Width the network expects.
        width: u32,
        /// Height the network expects.
        height: u32,
        /// Per-channel mean (after scaling to [0, 1]).
        mean: [f32; 3],
        /// Per-channel std.
        std: [f32; 3],
        /// Added to `std` (LeRobot's `(x - mean) / (std + eps)`); absent: `std` as it is.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        eps: Option<f32>,
        /// Frames stacked (1: the current one only, and no history dimension).
        #[serde(default = "d_history", skip_serializing_if = "is_one")]
        history: usize,
    },
    /// A language instruction tokenised with a Hugging Face `tokenizer.json` (int64 ids, padded).
    Language {
        /// Graph input name (the token ids).
        name: String,
        /// Tokenizer file, relative to the spec.
        tokenizer: PathBuf,
        /// The instruction (a run can override it).
        instruction: String,
        /// Sequence length (padded / truncated).
        max_len: usize,
        /// Id used for padding.
        #[serde(default)]
        pad_id: i64,
        /// Graph input that takes the attention mask (1 for tokens, 0 for padding), if any.
        #[serde(default)]
        mask_input: Option<String>,
        /// pi0.5's prompt: the robot's state, normalised and discretised, written into the
        /// instruction at every chunk (absent: the instruction is tokenised once, at load).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        state_prompt: Option<StatePrompt>,
    },
    /// The same values at every call (a flag, a mask, an embodiment id an export expects).
    Constant {
        /// Graph input name.
        name: String,
        /// `float32` or `int64`.
        dtype: TimeDtype,
        /// Shape without the batch dimension (`[]` for one value per batch row).
        #[serde(default)]
        shape: Vec<usize>,
        /// Values, row-major, as many as the shape holds.
        values: Vec<f64>,
    },
}

/// One graph input fed from the robot (`[[inputs]]` with its `source`).
pub type InputSpec = InputSource;

/// What an image input divides each channel by: `std`, plus `eps` when the spec gives one
/// (summed in float32, as LeRobot's torch does).
pub fn image_divisor(std: &[f32; 3], eps: Option<f32>) -> [f32; 3] {
    std.map(|s| s + eps.unwrap_or(0.0))
}

/// openpi's pi0.5 prompt (LeRobot's `Pi05PrepareStateTokenizerProcessorStep`): at every chunk
/// each of the state's values, normalised, falls into one of 256 equal bins over [-1, 1] (below
/// -1 is bin -1, from 1 - 1/128 up bin 255, as numpy's `digitize` counts), and the instruction
/// becomes `Task: {instruction}, State: {bins};\nAction: ` (the instruction stripped, `_` and
/// newlines as spaces) before it is tokenised.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatePrompt {
    /// State fields, in order (all of the state when empty).
    #[serde(default)]
    pub fields: Vec<String>,
    /// Normalisation before the bins (LeRobot's, for `observation.state`).
    pub normalize: Normalize,
}

impl StatePrompt {
    /// The bins numpy's `digitize(x, linspace(-1, 1, 257)[:-1]) - 1` gives: how many of the
    /// edges `-1 + k / 128` (k = 0..255) are at most `x`, less one (NaN sorts last).
    pub fn bin(x: f32) -> i32 {
        if x.is_nan() {
            return 255;
        }
        let x = f64::from(x);
        (0..256)
            .filter(|k| -1.0 + f64::from(*k) / 128.0 <= x)
            .count() as i32
            - 1
    }

    /// Writes the prompt for `instruction` and the normalised `state` into `out`.
    pub fn write(instruction: &str, state: &[f32], out: &mut String) {
        use std::fmt::Write;
        out.clear();
        let task = instruction.trim().replace(['_', '\n'], " ");
        let _ = write!(out, "Task: {task}, State: ");
        for (i, v) in state.iter().enumerate() {
            let sep = if i == 0 { "" } else { " " };
            let _ = write!(out, "{sep}{}", Self::bin(*v));
        }
        out.push_str(";\nAction: ");
    }
}

impl InputSource {
    /// The graph input name.
    pub fn name(&self) -> &str {
        match self {
            InputSource::State { name, .. }
            | InputSource::Image { name, .. }
            | InputSource::Language { name, .. }
            | InputSource::Constant { name, .. } => name,
        }
    }
}

/// The DDPM/DDIM schedule of a diffusion policy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiffusionSpec {
    /// Training steps of the noise schedule.
    pub train_steps: usize,
    /// DDIM steps at inference.
    pub inference_steps: usize,
    /// Beta schedule.
    pub schedule: BetaSchedule,
    /// First beta (linear schedule).
    pub beta_start: f64,
    /// Last beta (linear schedule).
    pub beta_end: f64,
    /// Clip the predicted clean sample to [-clip, clip] (0 = off).
    pub clip_sample: f64,
    /// What the network predicts.
    pub prediction: Prediction,
    /// How a chunk is sampled: `ddim` (deterministic given the initial noise) or `ddpm`
    /// (stochastic: fresh noise at every step but the last, diffusers' `fixed_small` variance).
    #[serde(skip_serializing_if = "Sampler::is_ddim")]
    pub sampler: Sampler,
}

impl Default for DiffusionSpec {
    fn default() -> Self {
        DiffusionSpec {
            train_steps: 100,
            inference_steps: 10,
            schedule: BetaSchedule::SquaredcosCapV2,
            beta_start: 1e-4,
            beta_end: 0.02,
            clip_sample: 1.0,
            prediction: Prediction::Epsilon,
            sampler: Sampler::Ddim,
        }
    }
}

impl DiffusionSpec {
    /// The sampler.
    pub fn ddim(&self) -> Ddim {
        Ddim::new(
            self.schedule,
            self.train_steps,
            self.inference_steps,
            self.beta_start,
            self.beta_end,
            self.clip_sample,
            self.prediction,
        )
        .with_sampler(self.sampler)
    }
}

fn d_flow_steps() -> usize {
    10
}

/// Element type of the time input and of constant inputs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeDtype {
    /// float32 (reflex's own exports, flow policies).
    #[default]
    Float32,
    /// int64: the training step as an integer (LeRobot's and diffusers' diffusion exports).
    Int64,
}

impl TimeDtype {
    /// The name ONNX Runtime gives the type.
    pub fn ort_name(self) -> &'static str {
        match self {
            TimeDtype::Float32 => "float32",
            TimeDtype::Int64 => "int64",
        }
    }
}

/// Shape of the time input.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeShape {
    /// `[B, 1]` (reflex's own exports).
    #[default]
    Batch1,
    /// `[B]` (LeRobot's and diffusers' UNets).
    Batch,
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// Names of the graph's sampler-facing inputs and its output.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GraphIo {
    /// Input that takes the noisy chunk (`[B, T, A]`; diffusion and flow).
    #[serde(default)]
    pub sample_input: Option<String>,
    /// Input that takes the timestep (diffusion: the training step, flow: t in [0, 1]); its type
    /// and shape are `time_dtype` and `time_shape`.
    #[serde(default)]
    pub time_input: Option<String>,
    /// `float32` (default) or `int64` (diffusion only: the step is an integer).
    #[serde(default, skip_serializing_if = "is_default")]
    pub time_dtype: TimeDtype,
    /// `batch_1` for `[B, 1]` (default) or `batch` for `[B]`.
    #[serde(default, skip_serializing_if = "is_default")]
    pub time_shape: TimeShape,
    /// Output: the chunk (chunk), the noise or sample prediction (diffusion), or the velocity (flow).
    pub output: String,
    /// A second graph that returns the velocity network's vector-Jacobian product (flow only),
    /// for guided real-time chunking (`[policy.rtc]`); without one, RTC inpaints hard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vjp: Option<VjpGraph>,
    /// A sampled policy's first graph (`[graph.prefix]`): run once per chunk on the observation
    /// inputs; the model (a VLA's action expert, a diffusion policy's U-Net) then takes its
    /// outputs in place of those inputs at every integration or denoising step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<PrefixGraph>,
}

/// The prefix graph of a two-graph policy (a flow VLA: pi0, SmolVLA; or a diffusion policy's
/// observation encoders): it takes the spec's `[[inputs]]` (images, instruction, state) and
/// returns the prefix's embeddings, its cached keys and values, or a conditioning vector,
/// float32 tensors of any shape, which the model takes under the same names beside the noisy
/// chunk and the time. The expensive part then runs once per chunk rather than once per step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefixGraph {
    /// The ONNX file, relative to the model's folder (`NAME.prefix.onnx`).
    pub file: String,
    /// Its outputs the model takes, by name.
    pub outputs: Vec<String>,
}

/// A flow policy's vector-Jacobian-product graph: the model's inputs plus a cotangent `e` shaped
/// like the chunk, and one output `J^T e`, `J` the Jacobian of the velocity with respect to the
/// noisy chunk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VjpGraph {
    /// The ONNX file, relative to the model's folder (`NAME.vjp.onnx` as reflex writes it).
    pub file: String,
    /// The input that takes the cotangent (`[B, T, A]`).
    pub cotangent_input: String,
    /// The output (`[B, T, A]`).
    pub output: String,
}

/// Where reflex writes the VJP graph of the model at `model`: `NAME.vjp.onnx` beside it.
pub fn vjp_path_for(model: &std::path::Path) -> std::path::PathBuf {
    model.with_extension("vjp.onnx")
}

/// The policy spec file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySpec {
    /// Always `reflex-policy`.
    pub format: String,
    /// Spec format version (1).
    pub version: u16,
    /// A name for logs.
    pub name: String,
    /// Network kind.
    pub kind: PolicyKind,
    /// Action dimension.
    pub action_dim: usize,
    /// Actions per chunk.
    pub chunk_len: usize,
    /// Actions executed per chunk before the next inference.
    pub execute: usize,
    /// The row of the network's chunk at the time of the observation it was computed from, which
    /// the robot executes first: LeRobot Diffusion Policy's `n_obs_steps - 1` (its chunk starts at
    /// the oldest step it saw). The rows before it are past and dropped; `execute` counts from it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub first_action: usize,
    /// Components of each chunk row the network works in, when wider than the robot's action:
    /// SmolVLA and pi0 pad actions with zeros to their `max_action_dim` (32) and sample all of
    /// them; the robot executes the first `action_dim`. Absent: `action_dim`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_action_dim: Option<usize>,
    /// Robot kind the policy was made for (e.g. `sim/pick`); checked when given.
    #[serde(default)]
    pub robot_kind: Option<String>,
    /// Normalisation of actions (the network works in normalised units).
    #[serde(default = "d_norm")]
    pub action_normalize: Normalize,
    /// Graph I/O names.
    pub graph: GraphIo,
    /// Inputs fed from the robot.
    pub inputs: Vec<InputSpec>,
    /// Diffusion schedule (kind = diffusion).
    #[serde(default)]
    pub diffusion: Option<DiffusionSpec>,
    /// Euler steps (kind = flow).
    #[serde(default = "d_flow_steps")]
    pub flow_steps: usize,
    /// How the model was made (command line, seed), for the record.
    #[serde(default)]
    pub provenance: Option<String>,
}

impl PolicySpec {
    /// The VJP graph is for flow policies only, a prefix graph for sampled ones (flow, diffusion),
    /// and a prefix graph names an output.
    fn validate_second_graphs(&self, p: &str) -> Result<(), Invalid> {
        if let Some(v) = &self.graph.vjp
            && self.kind != PolicyKind::Flow
        {
            return Err(Invalid {
                key: key(&key(p, "graph"), "vjp"),
                value: format!("{:?}", v.file),
                allowed:
                    "a VJP graph only for kind = \"flow\" (guided RTC is derived for flow policies)"
                        .into(),
            });
        }
        if let Some(g) = &self.graph.prefix
            && (self.kind == PolicyKind::Chunk || g.outputs.is_empty())
        {
            return Err(Invalid {
                key: key(&key(p, "graph"), "prefix"),
                value: format!("{:?} with outputs {:?}", g.file, g.outputs),
                allowed: "a prefix graph only for kind = \"flow\" or \"diffusion\", naming at least one output"
                    .into(),
            });
        }
        Ok(())
    }
}

impl Validate for PolicySpec {
    fn validate(&self, p: &str) -> Result<(), Invalid> {
        if self.format != "reflex-policy" {
            return Err(Invalid {
                key: key(p, "format"),
                value: format!("{:?}", self.format),
                allowed: "\"reflex-policy\"".into(),
            });
        }
        in_range(p, "version", self.version, 1, 1)?;
        in_range(p, "action_dim", self.action_dim, 1, 1024)?;
        in_range(p, "chunk_len", self.chunk_len, 1, 1024)?;
        in_range(p, "first_action", self.first_action, 0, self.chunk_len - 1)?;
        if let Some(w) = self.model_action_dim {
            in_range(p, "model_action_dim", w, self.action_dim, 1024)?;
        }
        in_range(p, "execute", self.execute, 1, self.rows())?;
        if let Some(n) = self.action_normalize.len()
            && n != self.action_dim
        {
            return Err(Invalid {
                key: key(p, "action_normalize"),
                value: format!("{n} components"),
                allowed: format!("action_dim = {} components", self.action_dim),
            });
        }
        match self.kind {
            PolicyKind::Chunk => {}
            PolicyKind::Diffusion | PolicyKind::Flow => {
                for (k, v) in [
                    ("sample_input", &self.graph.sample_input),
                    ("time_input", &self.graph.time_input),
                ] {
                    if v.is_none() {
                        return Err(Invalid {
                            key: key(&key(p, "graph"), k),
                            value: "(missing)".into(),
                            allowed: format!(
                                "the graph input name; required for kind = {:?}",
                                self.kind
                            ),
                        });
                    }
                }
                if self.kind == PolicyKind::Flow && self.graph.time_dtype == TimeDtype::Int64 {
                    return Err(Invalid {
                        key: key(&key(p, "graph"), "time_dtype"),
                        value: "\"int64\"".into(),
                        allowed: "\"float32\" for kind = \"flow\" (t runs through [0, 1])".into(),
                    });
                }
                self.validate_second_graphs(p)?;
                if self.kind == PolicyKind::Diffusion {
                    let d = self.diffusion.clone().unwrap_or_default();
                    let dk = key(p, "diffusion");
                    in_range(&dk, "train_steps", d.train_steps, 1, 10_000)?;
                    in_range(&dk, "inference_steps", d.inference_steps, 1, d.train_steps)?;
                } else {
                    in_range(p, "flow_steps", self.flow_steps, 1, 1000)?;
                }
            }
        }
        for (i, inp) in self.inputs.iter().enumerate() {
            let k = format!(
                "{}inputs[{i}]",
                if p.is_empty() {
                    String::new()
                } else {
                    format!("{p}.")
                }
            );
            match inp {
                InputSource::State { history, .. } => in_range(&k, "history", *history, 1, 64)?,
                InputSource::Image {
                    width,
                    height,
                    history,
                    ..
                } => {
                    in_range(&k, "width", *width, 1, 4096)?;
                    in_range(&k, "height", *height, 1, 4096)?;
                    in_range(&k, "history", *history, 1, 64)?;
                }
                InputSource::Language { max_len, .. } => {
                    in_range(&k, "max_len", *max_len, 1, 4096)?
                }
                InputSource::Constant { shape, values, .. } => {
                    let n: usize = shape.iter().product();
                    if n != values.len() || n > 1 << 20 {
                        return Err(Invalid {
                            key: format!("{k}.values"),
                            value: format!("{} values", values.len()),
                            allowed: format!(
                                "{n} values (the product of shape {shape:?}, at most 2^20)"
                            ),
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

/// Where the spec of a model lives: `M.policy.toml` beside `M.onnx`.
pub fn spec_path(model: &Path) -> PathBuf {
    model.with_extension("policy.toml")
}

impl PolicySpec {
    /// Reads and validates the spec beside `model`.
    pub fn load_for(model: &Path) -> Result<Self, reflex_runtime::config::ConfigError> {
        reflex_runtime::config::load(&spec_path(model))
    }

    /// The actions of a chunk the loop sees: from `first_action` to the end of the network's.
    pub fn rows(&self) -> usize {
        self.chunk_len.saturating_sub(self.first_action)
    }

    /// Components of each chunk row in the network (`model_action_dim`, else `action_dim`).
    pub fn model_dim(&self) -> usize {
        self.model_action_dim.unwrap_or(self.action_dim)
    }

    /// Control steps before the current one any input reads (its `history` less one).
    pub fn past_steps(&self) -> usize {
        self.inputs
            .iter()
            .map(|i| match i {
                InputSource::State { history, .. } | InputSource::Image { history, .. } => {
                    history - 1
                }
                _ => 0,
            })
            .max()
            .unwrap_or(0)
    }

    /// Writes the spec as TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("a spec serialises")
    }

    /// A chunking policy's spec built in Rust rather than written as TOML: the graph reads the
    /// robot's whole state, unnormalised, at `state_input` and returns `chunk_len` actions of
    /// `action_dim` at `output`, of which the loop executes `execute`. The other keys keep their
    /// defaults; set the fields for more (normalisation, cameras, a diffusion or flow sampler).
    pub fn chunk(
        name: &str,
        (action_dim, chunk_len, execute): (usize, usize, usize),
        state_input: &str,
        output: &str,
    ) -> Self {
        PolicySpec {
            format: "reflex-policy".into(),
            version: 1,
            name: name.into(),
            kind: PolicyKind::Chunk,
            action_dim,
            chunk_len,
            execute,
            first_action: 0,
            model_action_dim: None,
            robot_kind: None,
            action_normalize: d_norm(),
            graph: GraphIo {
                sample_input: None,
                time_input: None,
                time_dtype: TimeDtype::default(),
                time_shape: TimeShape::default(),
                output: output.into(),
                vjp: None,
                prefix: None,
            },
            inputs: vec![InputSource::State {
                name: state_input.into(),
                fields: Vec::new(),
                history: d_history(),
                normalize: d_norm(),
            }],
            diffusion: None,
            flow_steps: d_flow_steps(),
            provenance: None,
        }
    }

    /// Writes the spec beside `model` (`NAME.policy.toml`, where [`PolicySpec::load_for`] and
    /// the ONNX policy read it), atomically.
    pub fn write_for(&self, model: &Path) -> std::io::Result<PathBuf> {
        let path = spec_path(model);
        reflex_runtime::fsio::atomic_write(&path, self.to_toml().as_bytes())?;
        Ok(path)
    }
}

impl PolicySpec {
    /// The bounds of `robot`'s state vector as this policy normalises it, for the learner to
    /// scale its own inputs with: the `(low, high)` of the policy's min-max normalised state
    /// input, placed at the state components it reads: the whole state (no field selection), or
    /// the fields it names wherever they sit in the robot's state. A component the policy does
    /// not read gets `None` (`robot`'s own bounds, or none, are for the caller to decide).
    /// `None` when the policy reads no state this way.
    pub fn state_bounds(
        &self,
        robot: &reflex_runtime::msg::RobotSpec,
    ) -> Option<Vec<Option<(f32, f32)>>> {
        let state_dim = robot.state_dim();
        self.inputs.iter().find_map(|i| {
            let InputSource::State {
                fields,
                normalize: Normalize::MinMax { low, high, .. },
                ..
            } = i
            else {
                return None;
            };
            let ranges: Vec<std::ops::Range<usize>> = if fields.is_empty() {
                std::iter::once(0..state_dim).collect()
            } else {
                fields
                    .iter()
                    .map(|f| robot.field(f))
                    .collect::<Option<_>>()?
            };
            let n: usize = ranges.iter().map(|r| r.len()).sum();
            if low.len() != n || high.len() != n {
                return None;
            }
            let mut out = vec![None; state_dim];
            let pairs = low.iter().zip(high).map(|(l, h)| (*l, *h));
            for (k, b) in ranges.into_iter().flatten().zip(pairs) {
                out[k] = Some(b);
            }
            Some(out)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reflex_runtime::msg::{RobotSpec, StateField};

    fn spec_with_state(fields: &str, low: &str, high: &str) -> PolicySpec {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/pick.policy.toml"),
        )
        .unwrap();
        let mut spec: PolicySpec = toml::from_str(&text).unwrap();
        let state: InputSource = toml::from_str(&format!(
            "source = \"state\"\nname = \"obs\"\nfields = {fields}\nhistory = 1\n[normalize]\nkind = \"min_max\"\nlow = {low}\nhigh = {high}\n"
        ))
        .unwrap();
        spec.inputs = vec![state];
        spec
    }

    #[test]
    fn eps_gives_lerobots_formulas_and_its_absence_reflexs() {
        // LeRobot 0.6 (NormalizerProcessorStep): (x - mean) / (std + eps) one way, x * std + mean
        // back; a zero min-max width becomes eps.
        let lerobot: Normalize = toml::from_str(
            "kind = \"mean_std\"\nmean = [1.0, 0.0]\nstd = [0.5, 0.0]\neps = 1e-8\n",
        )
        .unwrap();
        let mut x = [2.0f32, 3e-8];
        lerobot.apply(&mut x);
        assert_eq!(x[0], (2.0f32 - 1.0) / (0.5 + 1e-8));
        assert_eq!(x[1], 3e-8 / 1e-8);
        let mut y = [2.0f32, 5.0];
        lerobot.invert(&mut y);
        assert_eq!(y, [2.0 * 0.5 + 1.0, 0.0]);
        // Without eps (every spec written before it existed): std clamped at 1e-6 both ways.
        let reflex: Normalize =
            toml::from_str("kind = \"mean_std\"\nmean = [0.0]\nstd = [0.0]\n").unwrap();
        let mut z = [1e-6f32];
        reflex.apply(&mut z);
        assert_eq!(z, [1.0]);
        assert!(!reflex.to_toml_fragment().contains("eps"));
        let flat: Normalize =
            toml::from_str("kind = \"min_max\"\nlow = [2.0]\nhigh = [2.0]\neps = 1e-8\n").unwrap();
        let mut w = [2.0f32 + 1e-7];
        flat.apply(&mut w);
        assert_eq!(w[0], 2.0 * (2.0f32 + 1e-7 - 2.0) / 1e-8 - 1.0);
    }

    impl Normalize {
        fn to_toml_fragment(&self) -> String {
            toml::to_string(self).unwrap()
        }
    }

    #[test]
    fn state_bounds_sit_where_the_policys_fields_sit_in_the_robots_state() {
        let mut robot = RobotSpec::new("arm", "test", 20.0);
        robot.state = vec![
            StateField::new("joint_pos", 2, "rad"),
            StateField::new("joint_vel", 2, "rad/s"),
            StateField::new("ee_pos", 3, "m"),
        ];
        // The whole state, no field named.
        let whole = spec_with_state("[]", "[0, 1, 2, 3, 4, 5, 6]", "[1, 2, 3, 4, 5, 6, 7]");
        let b = whole.state_bounds(&robot).unwrap();
        assert_eq!(b[0], Some((0.0, 1.0)));
        assert_eq!(b[6], Some((6.0, 7.0)));
        // An image policy's named fields, in its own order: each lands at its field's place,
        // the one it does not read is left to the caller.
        let named = spec_with_state(
            "[\"ee_pos\", \"joint_pos\"]",
            "[10, 11, 12, 20, 21]",
            "[13, 14, 15, 22, 23]",
        );
        let b = named.state_bounds(&robot).unwrap();
        assert_eq!(
            b[4..7],
            [Some((10.0, 13.0)), Some((11.0, 14.0)), Some((12.0, 15.0))]
        );
        assert_eq!(b[0..2], [Some((20.0, 22.0)), Some((21.0, 23.0))]);
        assert_eq!(b[2..4], [None, None]);
        // Bounds of another length, or a field the robot lacks: no bounds.
        assert!(
            spec_with_state("[]", "[0, 1]", "[1, 2]")
                .state_bounds(&robot)
                .is_none()
        );
        assert!(
            spec_with_state("[\"object_pos\"]", "[0, 0, 0]", "[1, 1, 1]")
                .state_bounds(&robot)
                .is_none()
        );
    }
}

#[cfg(test)]
mod prompt_tests {
    use super::StatePrompt;

    #[test]
    fn pi05_bins_are_numpys_digitize_and_the_prompt_is_lerobots() {
        // numpy 2 (LeRobot's tools environment): digitize(x, linspace(-1, 1, 257)[:-1]) - 1 on
        // float32 values, edges and either side of zero included.
        let cases: [(f32, i32); 14] = [
            (-1.5, -1),
            (-1.0, 0),
            (-0.999_999_94, 0),
            (-1e-30, 127),
            (0.0, 128),
            (1e-30, 128),
            (0.003_906_25, 128),
            (0.007_812_5, 129),
            (0.5, 192),
            (0.992_187_5, 255),
            (0.99, 254),
            (1.0, 255),
            (2.0, 255),
            (f32::NAN, 255),
        ];
        for (x, want) in cases {
            assert_eq!(StatePrompt::bin(x), want, "bin of {x}");
        }
        // Pi05PrepareStateTokenizerProcessorStep's prompt for the same task and state.
        let mut out = String::new();
        StatePrompt::write(" pick_up the\ncube \n", &[-1.2, 0.3, 0.999], &mut out);
        assert_eq!(out, "Task: pick up the cube, State: -1 166 255;\nAction: ");
    }
}
