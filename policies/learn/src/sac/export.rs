//! The learner's actor as a file a robot can run without a learner: an ONNX graph (written by
//! reflex's own writer) that takes the raw state and the base action in robot units and returns
//! the refined action, and a spec `M.policy.toml` with `kind = "residual"` beside it that names
//! the base model it refines and the state scaling folded into its first layer.
//!
//! The graph computes exactly what the loop's hook computes with exploration off
//! ([`super::hook::ResidualMlp`]): `b = (base - c) / h`; `u` = the first `A` outputs of the MLP on
//! `[state, b]` (only `state` in full mode); `y = clip(b + s tanh(u), -1, 1)` (full mode:
//! `tanh(u)`); action `= y h + c`. A learner that sees puts its image heads inside the graph: one
//! input `features_<camera>` per camera (the frozen encoder's map), each head's output joining the
//! state before the MLP, and `vision` in the spec. reflex runs the file on the loop thread in plain Rust from its
//! weights ([`ResidualModel::hook`]) and checks at load, with ONNX Runtime, that the graph and
//! the weights agree ([`ResidualModel::check_with_ort`]). Anyone else runs it with any ONNX
//! runtime.

use super::hook::{ActionNorm, HeadsEval, MlpEval, ResidualMlp, export_actor};
use super::{Mode, Sac, VisionHeads};
use reflex_policies::onnx_write::{Attr, Dim, Elem, Graph, batch};
use reflex_policies::spec::{Normalize, spec_path};
use reflex_runtime::config::{Invalid, Validate, in_range, key};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Whether the file refines a base action or replaces it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResidualMode {
    /// A correction on a base policy's action (ResFiT).
    Residual,
    /// The whole action (SAC from scratch); `base_input` is fed but unused.
    Full,
}

/// Graph I/O names of a residual file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResidualGraph {
    /// `[B, state_dim]` float32, the raw state.
    pub state_input: String,
    /// `[B, action_dim]` float32, the base policy's action in robot units.
    pub base_input: String,
    /// `[B, action_dim]` float32, the action to command in robot units.
    pub output: String,
}

/// The image heads of a residual that sees: the graph takes one feature map per camera (made by
/// the frozen encoder `encoder_id` names) as input `features_<camera>`, `[B, C * H * W]`.
pub type ResidualVision = VisionHeads;

/// The graph input that takes `camera`'s feature map.
pub fn feature_input_name(camera: &str) -> String {
    format!("features_{camera}")
}

/// The spec of a residual file (`M.policy.toml` beside `M.onnx`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResidualSpec {
    /// Always `reflex-policy`.
    pub format: String,
    /// Spec format version (1).
    pub version: u16,
    /// Always `residual`.
    pub kind: String,
    /// A name for logs.
    pub name: String,
    /// Residual or full.
    pub mode: ResidualMode,
    /// File name of the base model the residual was trained on (residual mode). A run that
    /// pairs it with another base is refused.
    #[serde(default)]
    pub base_model: Option<String>,
    /// Robot state values the network takes.
    pub state_dim: usize,
    /// Action dimension.
    pub action_dim: usize,
    /// Hidden layer widths of the MLP.
    pub hidden: Vec<usize>,
    /// LayerNorm after each hidden layer.
    pub layer_norm: bool,
    /// The residual's reach, as a fraction of the action box's half width (residual mode).
    pub action_scale: f32,
    /// The reach per action component when they differ (`[learner] action_scales`); absent:
    /// `action_scale` for every component.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub action_scales: Vec<f32>,
    /// The robot's action bounds the normalisation was made with; checked against the robot.
    pub action_low: Vec<f32>,
    /// See `action_low`.
    pub action_high: Vec<f32>,
    /// The state scaling the learner used, already folded into the first layer (the graph takes
    /// the raw state); for the record.
    pub state_normalize: Normalize,
    /// Graph I/O names.
    pub graph: ResidualGraph,
    /// Learning from pixels: the image heads inside the graph and the feature maps they read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vision: Option<ResidualVision>,
    /// How it was made.
    #[serde(default)]
    pub provenance: Option<String>,
}

impl Validate for ResidualSpec {
    fn validate(&self, p: &str) -> Result<(), Invalid> {
        let bad = |k: &str, value: String, allowed: &str| Invalid {
            key: key(p, k),
            value,
            allowed: allowed.into(),
        };
        if self.format != "reflex-policy" {
            return Err(bad(
                "format",
                format!("{:?}", self.format),
                "\"reflex-policy\"",
            ));
        }
        in_range(p, "version", self.version, 1, 1)?;
        if self.kind != "residual" {
            return Err(bad(
                "kind",
                format!("{:?}", self.kind),
                "\"residual\" (base policies are [policy] model, not [policy.residual])",
            ));
        }
        in_range(p, "state_dim", self.state_dim, 1, 1 << 16)?;
        in_range(p, "action_dim", self.action_dim, 1, 1024)?;
        in_range(p, "action_scale", self.action_scale, 0.0, 10.0)?;
        if !self.action_scales.is_empty()
            && (self.action_scales.len() != self.action_dim
                || self.action_scales.iter().any(|s| !(0.0..=10.0).contains(s)))
        {
            return Err(bad(
                "action_scales",
                format!("{:?}", self.action_scales),
                &format!(
                    "one value in 0..=10 per action component ({}), or absent",
                    self.action_dim
                ),
            ));
        }
        if self.hidden.is_empty() || self.hidden.iter().any(|h| *h == 0 || *h > 1 << 16) {
            return Err(bad(
                "hidden",
                format!("{:?}", self.hidden),
                "one or more widths in 1..=65536",
            ));
        }
        for (k, v) in [
            ("action_low", &self.action_low),
            ("action_high", &self.action_high),
        ] {
            if v.len() != self.action_dim || v.iter().any(|x| !x.is_finite()) {
                return Err(bad(
                    k,
                    format!("{} values", v.len()),
                    &format!("action_dim = {} finite values", self.action_dim),
                ));
            }
        }
        if let Some(v) = &self.vision {
            if v.encoder_id.is_empty() {
                return Err(bad(
                    "vision.encoder_id",
                    "\"\"".into(),
                    "the frozen encoder's id, as the learner recorded it",
                ));
            }
            if v.features.is_empty() {
                return Err(bad(
                    "vision.features",
                    "[]".into(),
                    "one feature map per camera",
                ));
            }
            for (k, f) in v.features.iter().enumerate() {
                let p = key(p, &format!("vision.features[{k}]"));
                in_range(&p, "channels", f.channels, 1, 4096)?;
                in_range(&p, "height", f.height, 1, 1024)?;
                in_range(&p, "width", f.width, 1, 1024)?;
            }
            in_range(p, "vision.embeddings", v.embeddings, 1, 256)?;
            in_range(p, "vision.width", v.width, 1, 4096)?;
        }
        if self
            .action_low
            .iter()
            .zip(&self.action_high)
            .any(|(l, h)| l >= h)
        {
            return Err(bad(
                "action_low",
                "not below action_high".into(),
                "low < high per component",
            ));
        }
        Ok(())
    }
}

/// Why a residual file could not be written or used; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum ResidualError {
    /// I/O.
    #[error("residual `{path}`: {source}")]
    Io {
        /// File.
        path: String,
        /// Error.
        source: std::io::Error,
    },
    /// The spec is missing or invalid.
    #[error(transparent)]
    Spec(#[from] reflex_runtime::config::ConfigError),
    /// The file and its spec disagree, or the graph computes something else than its weights.
    #[error("residual `{path}`: {message}")]
    Invalid {
        /// File.
        path: String,
        /// What is wrong and what to do.
        message: String,
    },
    /// The learner's networks could not be read.
    #[error("residual export: {0}")]
    Candle(#[from] candle_core::Error),
    /// ONNX Runtime could not load or run the file.
    #[error(transparent)]
    Load(#[from] reflex_policies::onnx_policy::LoadError),
}

fn invalid(path: &Path, message: impl Into<String>) -> ResidualError {
    ResidualError::Invalid {
        path: path.display().to_string(),
        message: message.into(),
    }
}

/// Layer widths of the MLP a spec describes (input first, head last).
fn dims(spec: &ResidualSpec) -> Vec<usize> {
    let seen = spec.vision.as_ref().map_or(0, VisionHeads::seen_len);
    let input = spec.state_dim
        + seen
        + match spec.mode {
            ResidualMode::Residual => spec.action_dim,
            ResidualMode::Full => 0,
        };
    let mut d = vec![input];
    d.extend_from_slice(&spec.hidden);
    d.push(2 * spec.action_dim);
    d
}

/// The residual's reach per action component (residual mode).
fn bounds_of(spec: &ResidualSpec) -> Vec<f32> {
    if spec.action_scales.is_empty() {
        vec![spec.action_scale; spec.action_dim]
    } else {
        spec.action_scales.clone()
    }
}

fn norm_of(spec: &ResidualSpec) -> ActionNorm {
    let scales = match spec.mode {
        ResidualMode::Residual => bounds_of(spec),
        ResidualMode::Full => vec![],
    };
    ActionNorm::new(&spec.action_low, &spec.action_high, &scales)
}

/// The ONNX graph of `spec` with the flat hook-layout weights `w`.
fn graph(spec: &ResidualSpec, w: &[f32]) -> Graph {
    let a = spec.action_dim as i64;
    let norm = norm_of(spec);
    let d = dims(spec);
    let mut g = Graph::new();
    let state = g.input(
        &spec.graph.state_input,
        Elem::F32,
        vec![batch(), Dim::Fixed(spec.state_dim as i64)],
    );
    let base = g.input(
        &spec.graph.base_input,
        Elem::F32,
        vec![batch(), Dim::Fixed(a)],
    );
    let c = g.named_constant("action.center", &[a], &norm.center);
    let h = g.named_constant("action.half", &[a], &norm.half);
    let shifted = g.op("Sub", &[&base, &c], vec![]);
    let base_n = g.op("Div", &[&shifted, &h], vec![]);
    // State, each camera's head output, base action: the order the learner's actor reads.
    let mut parts = vec![state.clone()];
    let mut off = 0;
    if let Some(v) = &spec.vision {
        for (k, f) in v.features.iter().enumerate() {
            let hd = v.dims(k);
            let input = g.input(
                &feature_input_name(&f.camera),
                Elem::F32,
                vec![batch(), Dim::Fixed(f.len() as i64)],
            );
            let n = hd.weights_len();
            parts.push(reflex_vision::head::write_onnx(
                &mut g,
                &input,
                &hd,
                &format!("head.{}", f.camera),
                &w[off..off + n],
            ));
            off += n;
        }
    }
    if spec.mode == ResidualMode::Residual {
        parts.push(base_n.clone());
    }
    let mut x = if parts.len() == 1 {
        state.clone()
    } else {
        let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
        g.concat(&refs, 1)
    };
    let last = d.len() - 2;
    let mut take = |n: usize| {
        let s = &w[off..off + n];
        off += n;
        s
    };
    for l in 0..=last {
        let (i, o) = (d[l], d[l + 1]);
        let wl = g.named_constant(&format!("l{l}.w"), &[i as i64, o as i64], take(i * o));
        let bl = g.named_constant(&format!("l{l}.b"), &[o as i64], take(o));
        let y = g.op("MatMul", &[&x, &wl], vec![]);
        x = g.op("Add", &[&y, &bl], vec![]);
        if l < last {
            if spec.layer_norm {
                let gamma = g.named_constant(&format!("l{l}.gamma"), &[o as i64], take(o));
                let beta = g.named_constant(&format!("l{l}.beta"), &[o as i64], take(o));
                x = g.op(
                    "LayerNormalization",
                    &[&x, &gamma, &beta],
                    vec![("axis", Attr::Int(-1)), ("epsilon", Attr::Float(1e-5))],
                );
            }
            x = g.op("Relu", &[&x], vec![]);
        }
    }
    // The head's first A outputs are the Gaussian's means; the rest (log-stds) serve training.
    let starts = g.constant_i64("starts", &[0]);
    let ends = g.constant_i64("ends", &[a]);
    let axes = g.constant_i64("axes", &[1]);
    let u = g.op("Slice", &[&x, &starts, &ends, &axes], vec![]);
    let t = g.op("Tanh", &[&u], vec![]);
    let y = match spec.mode {
        ResidualMode::Residual => {
            let s = g.constant("scale", &[a], &bounds_of(spec));
            let st = g.op("Mul", &[&t, &s], vec![]);
            let sum = g.op("Add", &[&base_n, &st], vec![]);
            let lo = g.constant("lo", &[], &[-1.0]);
            let hi = g.constant("hi", &[], &[1.0]);
            g.op("Clip", &[&sum, &lo, &hi], vec![])
        }
        ResidualMode::Full => t,
    };
    let scaled = g.op("Mul", &[&y, &h], vec![]);
    let action = g.op("Add", &[&scaled, &c], vec![]);
    g.output(
        &action,
        &spec.graph.output,
        Elem::F32,
        vec![batch(), Dim::Fixed(a)],
    );
    g
}

/// What [`write_residual`] needs beside the learner.
pub struct ExportInfo<'a> {
    /// A name for logs.
    pub name: &'a str,
    /// The robot's action bounds (what the learner's action normalisation was made from).
    pub action_low: &'a [f32],
    /// See `action_low`.
    pub action_high: &'a [f32],
    /// The base model the residual refines (residual mode).
    pub base_model: Option<&'a Path>,
    /// How it was made, for the record.
    pub provenance: String,
}

/// The spec of `sac`'s actor as a residual file.
pub fn residual_spec(sac: &Sac, info: &ExportInfo) -> Result<ResidualSpec, ResidualError> {
    let mode = match sac.cfg.mode {
        Mode::Residual => ResidualMode::Residual,
        Mode::Full => ResidualMode::Full,
        Mode::Noise => {
            return Err(ResidualError::Invalid {
                path: info.name.into(),
                message: "a noise-mode learner steers a diffusion policy's noise; it has no residual to export".into(),
            });
        }
    };
    let state_normalize = match &sac.cfg.obs_norm {
        Some(n) => Normalize::MinMax {
            low: n.center.iter().zip(&n.half).map(|(c, h)| c - h).collect(),
            high: n.center.iter().zip(&n.half).map(|(c, h)| c + h).collect(),
            eps: None,
        },
        None => Normalize::None,
    };
    Ok(ResidualSpec {
        format: "reflex-policy".into(),
        version: 1,
        kind: "residual".into(),
        name: info.name.into(),
        mode,
        base_model: match mode {
            ResidualMode::Residual => info
                .base_model
                .and_then(|p| p.file_name())
                .map(|f| f.to_string_lossy().into_owned()),
            ResidualMode::Full => None,
        },
        state_dim: sac.state_dim,
        action_dim: sac.act_dim,
        hidden: sac.cfg.hidden.clone(),
        layer_norm: sac.cfg.actor_layer_norm,
        action_scale: sac.cfg.action_scale,
        action_scales: sac.cfg.action_scales.clone(),
        action_low: info.action_low.to_vec(),
        action_high: info.action_high.to_vec(),
        state_normalize,
        graph: ResidualGraph {
            state_input: "state".into(),
            base_input: "base_action".into(),
            output: "action".into(),
        },
        vision: sac.cfg.vision.clone(),
        provenance: Some(info.provenance.clone()),
    })
}

/// Writes `sac`'s actor to `model` (ONNX) and its spec beside it, each atomically (a crash
/// leaves the previous pair or the new one, never half a file).
pub fn write_residual(
    sac: &Sac,
    info: &ExportInfo,
    model: &Path,
) -> Result<ResidualSpec, ResidualError> {
    write_residual_weights(sac, &export_actor(sac)?, info, model)
}

/// [`write_residual`] with other weights in `sac`'s actor's layout ([`export_actor`]'s), such
/// as an average of the ones it published over its last episodes.
pub fn write_residual_weights(
    sac: &Sac,
    w: &[f32],
    info: &ExportInfo,
    model: &Path,
) -> Result<ResidualSpec, ResidualError> {
    let spec = residual_spec(sac, info)?;
    spec.validate("")
        .map_err(|e| invalid(model, format!("{}: {} ({})", e.key, e.value, e.allowed)))?;
    let (len, _) = super::hook::actor_shape(sac);
    if w.len() != len {
        return Err(invalid(
            model,
            format!(
                "{} weights given for an actor of {len} (not this learner's layout)",
                w.len()
            ),
        ));
    }
    let bytes = graph(&spec, w).to_bytes(&spec.name, "reflex residual export");
    let io = |p: &Path, e| ResidualError::Io {
        path: p.display().to_string(),
        source: e,
    };
    if let Some(d) = model.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(d).map_err(|e| io(d, e))?;
    }
    reflex_runtime::fsio::atomic_write(model, &bytes).map_err(|e| io(model, e))?;
    let sp = spec_path(model);
    let text = toml::to_string_pretty(&spec).expect("a spec serialises");
    reflex_runtime::fsio::atomic_write(&sp, text.as_bytes()).map_err(|e| io(&sp, e))?;
    Ok(spec)
}

/// A residual file read back: its spec and its weights in the hook's layout.
#[derive(Clone, Debug)]
pub struct ResidualModel {
    /// The file.
    pub path: PathBuf,
    /// Its spec.
    pub spec: ResidualSpec,
    weights: Vec<f32>,
}

impl ResidualModel {
    /// Reads `model` and the spec beside it; every weight's shape is checked against the spec.
    pub fn load(model: &Path) -> Result<Self, ResidualError> {
        if !model.is_file() {
            return Err(invalid(
                model,
                "does not exist or is not a file: give the path of the residual's .onnx file (its \
                 spec is read from beside it)",
            ));
        }
        let spec: ResidualSpec = reflex_runtime::config::load(&spec_path(model)).map_err(|e| {
            // A base policy's spec sits at the same path and fails as an unknown field.
            if reflex_policies::spec::PolicySpec::load_for(model).is_ok() {
                invalid(
                    model,
                    "is a base policy (its spec is a policy's, not a residual's): give it as the \
                     base ([policy] model or --model), and as the residual the `residual.onnx` a \
                     learner kept",
                )
            } else {
                e.into()
            }
        })?;
        let bytes = std::fs::read(model).map_err(|e| ResidualError::Io {
            path: model.display().to_string(),
            source: e,
        })?;
        let mut inits = reflex_policies::onnx_read::float_initializers(&bytes)
            .map_err(|e| invalid(model, e.to_string()))?;
        let d = dims(&spec);
        let last = d.len() - 2;
        let mut weights = Vec::with_capacity(MlpEval::weights_len(&d, spec.layer_norm));
        let mut want: Vec<(String, Vec<i64>)> = vec![];
        if let Some(v) = &spec.vision {
            for (k, f) in v.features.iter().enumerate() {
                let hd = v.dims(k);
                let (c, p, e, w) = (
                    hd.channels as i64,
                    hd.places as i64,
                    hd.embeddings as i64,
                    hd.width as i64,
                );
                let pre = format!("head.{}", f.camera);
                want.push((format!("{pre}.kernel"), vec![c, p, e]));
                want.push((format!("{pre}.w"), vec![c * e, w]));
                for t in ["b", "gamma", "beta"] {
                    want.push((format!("{pre}.{t}"), vec![w]));
                }
            }
        }
        for l in 0..=last {
            let (i, o) = (d[l] as i64, d[l + 1] as i64);
            want.push((format!("l{l}.w"), vec![i, o]));
            want.push((format!("l{l}.b"), vec![o]));
            if spec.layer_norm && l < last {
                want.push((format!("l{l}.gamma"), vec![o]));
                want.push((format!("l{l}.beta"), vec![o]));
            }
        }
        for (name, want) in want {
            let t = inits.remove(&name).ok_or_else(|| {
                invalid(model, format!("has no weight `{name}`, which its spec ({} -> {:?} -> {}) needs; was it written by reflex's residual export?", d[0], spec.hidden, d[last + 1]))
            })?;
            if t.dims != want {
                return Err(invalid(
                    model,
                    format!(
                        "weight `{name}` has shape {:?}, its spec says {want:?}",
                        t.dims
                    ),
                ));
            }
            weights.extend(t.data);
        }
        if weights.iter().any(|v| !v.is_finite()) {
            return Err(invalid(model, "has weights that are NaN or infinite"));
        }
        Ok(ResidualModel {
            path: model.to_path_buf(),
            spec,
            weights,
        })
    }

    /// The action normalisation the file was made with.
    pub fn action_norm(&self) -> ActionNorm {
        norm_of(&self.spec)
    }

    /// The file as the loop's hook (deterministic: the Gaussian's mean, as the graph computes).
    pub fn hook(&self) -> ResidualMlp {
        let heads = self
            .spec
            .vision
            .as_ref()
            .map_or(vec![], VisionHeads::all_dims);
        ResidualMlp::frozen(
            HeadsEval::new(self.spec.state_dim, heads),
            MlpEval::new(dims(&self.spec), self.spec.layer_norm),
            self.spec.mode == ResidualMode::Full,
            self.action_norm(),
            bounds_of(&self.spec),
            self.weights.clone(),
        )
    }

    /// Runs the file with ONNX Runtime on `probes` states and base actions drawn across the
    /// action box and its normalised state range, and compares with [`Self::hook`]; returns the
    /// largest difference in robot units. A file whose graph was edited apart from its weights
    /// shows here.
    pub fn check_with_ort(&self, probes: usize, seed: u64) -> Result<f32, ResidualError> {
        use ort::value::TensorRef;
        use rand::{Rng, SeedableRng};
        use reflex_runtime::residual::ResidualHook;
        let (s, a) = (self.spec.state_dim, self.spec.action_dim);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let (lo, hi) = match &self.spec.state_normalize {
            Normalize::MinMax { low, high, .. } if low.len() == s && high.len() == s => {
                (low.clone(), high.clone())
            }
            _ => (vec![-1.0; s], vec![1.0; s]),
        };
        let states: Vec<f32> = (0..probes)
            .flat_map(|_| {
                (0..s)
                    .map(|k| lo[k] + (hi[k] - lo[k]) * rng.random::<f32>())
                    .collect::<Vec<_>>()
            })
            .collect();
        let (al, ah) = (&self.spec.action_low, &self.spec.action_high);
        let bases: Vec<f32> = (0..probes)
            .flat_map(|_| {
                (0..a)
                    .map(|k| al[k] + (ah[k] - al[k]) * rng.random::<f32>())
                    .collect::<Vec<_>>()
            })
            .collect();
        // Feature maps as a frozen encoder's ReLU leaves them: non-negative, about unit size.
        let features: Vec<(String, usize, Vec<f32>)> = self
            .spec
            .vision
            .iter()
            .flat_map(|v| &v.features)
            .map(|f| {
                let n = f.len();
                let x = (0..probes * n).map(|_| rng.random::<f32>()).collect();
                (feature_input_name(&f.camera), n, x)
            })
            .collect();
        let mut session =
            reflex_policies::onnx_policy::open_session(&self.path, &Default::default())?;
        let err = |e: ort::Error| invalid(&self.path, format!("ONNX Runtime: {e}"));
        let mut feeds: Vec<(std::borrow::Cow<str>, ort::session::SessionInputValue)> = vec![
            (
                self.spec.graph.state_input.as_str().into(),
                TensorRef::from_array_view(([probes, s], &states[..]))
                    .map_err(err)?
                    .into(),
            ),
            (
                self.spec.graph.base_input.as_str().into(),
                TensorRef::from_array_view(([probes, a], &bases[..]))
                    .map_err(err)?
                    .into(),
            ),
        ];
        for (name, n, x) in &features {
            feeds.push((
                name.as_str().into(),
                TensorRef::from_array_view(([probes, *n], &x[..]))
                    .map_err(err)?
                    .into(),
            ));
        }
        let outputs = session.run(feeds).map_err(err)?;
        let (_, got) = outputs[self.spec.graph.output.as_str()]
            .try_extract_tensor::<f32>()
            .map_err(err)?;
        let mut hook = self.hook();
        let (mut r, mut worst) = (vec![0.0f32; a], 0.0f32);
        let mut row = vec![];
        for p in 0..probes {
            let base = &bases[p * a..(p + 1) * a];
            row.clear();
            row.extend_from_slice(&states[p * s..(p + 1) * s]);
            for (_, n, x) in &features {
                row.extend_from_slice(&x[p * n..(p + 1) * n]);
            }
            hook.residual(&row, base, &mut r);
            for k in 0..a {
                worst = worst.max((base[k] + r[k] - got[p * a + k]).abs());
            }
        }
        Ok(worst)
    }
}
