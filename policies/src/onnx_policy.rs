//! Base policies on ONNX Runtime: loading a model with its spec, checking one against the other,
//! preparing inputs from robot observations, running the sampler, and returning action chunks.

use crate::rtc::{Prefix, RtcConfig, RtcScratch, RtcVariant, rtc_ddim_sample, rtc_flow_sample};
use crate::sampler::Ddim;
use crate::spec::{InputSource, PolicyKind, PolicySpec, TimeDtype, TimeShape, spec_path};
use ort::session::{Session, SessionInputValue};
use ort::value::TensorRef;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use reflex_runtime::msg::{Observation, RobotSpec};
use reflex_runtime::policy::{ChunkPrefix, ChunkSpec, Policy, PolicyError};
use serde::Deserialize;
use std::borrow::Cow;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// Where the network runs (`[policy.provider]`).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Provider {
    /// The CPU provider (everywhere).
    #[default]
    Cpu,
    /// NVIDIA CUDA (Jetson, workstation GPUs).
    Cuda {
        /// GPU index.
        #[serde(default)]
        device_id: i32,
    },
    /// NVIDIA TensorRT, with CUDA behind it for unsupported nodes.
    Tensorrt {
        /// GPU index.
        #[serde(default)]
        device_id: i32,
        /// Build fp16 engines.
        #[serde(default)]
        fp16: bool,
        /// Directory where built engines are cached (building one takes minutes on a Jetson).
        #[serde(default)]
        engine_cache_dir: Option<PathBuf>,
    },
}

impl Provider {
    /// Parses the command-line spelling: `cpu`, `cuda`, `tensorrt`.
    pub fn parse(s: &str) -> Result<Self, LoadError> {
        match s {
            "cpu" => Ok(Provider::Cpu),
            "cuda" => Ok(Provider::Cuda { device_id: 0 }),
            "tensorrt" => Ok(Provider::Tensorrt {
                device_id: 0,
                fp16: true,
                engine_cache_dir: None,
            }),
            o => Err(LoadError::UnknownProvider(o.to_string())),
        }
    }

    /// Name in messages.
    pub fn name(&self) -> &'static str {
        match self {
            Provider::Cpu => "cpu",
            Provider::Cuda { .. } => "cuda",
            Provider::Tensorrt { .. } => "tensorrt",
        }
    }
}

/// How to run a model.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunOptions {
    /// Execution provider.
    pub provider: Provider,
    /// Threads ONNX Runtime may use inside one operator (keep it below the core count so the
    /// control loop keeps a core).
    pub intra_threads: usize,
    /// Seed of the sampler's noise.
    pub seed: u64,
    /// Actions executed per chunk before the next inference, in place of the spec's `execute`
    /// (`[policy] execute`): smaller looks again sooner, at more inferences a second.
    pub execute: Option<usize>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            provider: Provider::Cpu,
            intra_threads: 1,
            seed: 0,
            execute: None,
        }
    }
}

/// Why a policy could not be loaded. Each variant names the file, input or provider at fault.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// ONNX Runtime itself is missing.
    #[error(transparent)]
    Runtime(#[from] crate::ort_env::OrtError),
    /// The model file is missing, or the path names a directory.
    #[error(
        "model `{0}` does not exist or is not a file: give the path of the .onnx file (its spec is read from beside it)"
    )]
    Missing(String),
    /// The spec file is missing or invalid.
    #[error(transparent)]
    Spec(#[from] reflex_runtime::config::ConfigError),
    /// ONNX Runtime could not load the model (corrupt file, unsupported operator, ...).
    #[error("model `{path}` could not be loaded by ONNX Runtime: {message}")]
    Model {
        /// Model file.
        path: String,
        /// ONNX Runtime's message.
        message: String,
    },
    /// The execution provider could not be registered. reflex never falls back silently.
    #[error(
        "execution provider `{provider}` could not be registered for `{path}`: {message}. It needs an ONNX Runtime \
         build with that provider (on a Jetson: NVIDIA's onnxruntime-gpu wheel) and a working GPU; \
         choose provider = \"cpu\" to run on the CPU"
    )]
    Provider {
        /// Provider name.
        provider: &'static str,
        /// Model file.
        path: String,
        /// ONNX Runtime's message.
        message: String,
    },
    /// A provider name that does not exist.
    #[error("provider `{0}`: allowed values are cpu, cuda, tensorrt")]
    UnknownProvider(String),
    /// The spec and the graph disagree.
    #[error("model `{path}` does not match its spec `{spec}`:\n  - {}", problems.join("\n  - "))]
    Mismatch {
        /// Model file.
        path: String,
        /// Spec file.
        spec: String,
        /// One line per mismatch.
        problems: Vec<String>,
    },
    /// The policy does not fit the robot.
    #[error("policy `{policy}` does not fit robot `{robot}`: {message}")]
    Robot {
        /// Policy name.
        policy: String,
        /// Robot name.
        robot: String,
        /// What does not fit.
        message: String,
    },
    /// `[policy] execute` outside the model's chunk.
    #[error(
        "[policy] execute = {execute}: model `{path}` predicts {chunk_len} actions a chunk, so execute is 1 ..= {chunk_len}"
    )]
    Execute {
        /// The value asked for.
        execute: usize,
        /// Model file.
        path: String,
        /// The spec's chunk length.
        chunk_len: usize,
    },
    /// The tokenizer could not be loaded.
    #[error("tokenizer `{path}`: {message}")]
    Tokenizer {
        /// File.
        path: String,
        /// Message.
        message: String,
    },
}

/// Checks that `path` names a file before the spec beside it is read: a missing model, or a
/// directory, was reported as a missing spec file.
pub fn model_file(path: &Path) -> Result<(), LoadError> {
    if path.is_file() {
        Ok(())
    } else {
        Err(LoadError::Missing(path.display().to_string()))
    }
}

/// Opens an ONNX Runtime session with the chosen provider.
pub fn open_session(path: &Path, opts: &RunOptions) -> Result<Session, LoadError> {
    model_file(path)?;
    let env = crate::ort_env::ensure()?;
    let p = path.display().to_string();
    let model_err = |e: &dyn std::fmt::Display| LoadError::Model {
        path: p.clone(),
        message: e.to_string(),
    };
    let mut b = Session::builder(env).map_err(|e| model_err(&e))?;
    b = b
        .with_intra_threads(opts.intra_threads.max(1))
        .map_err(|e| model_err(&e))?;
    b = b.with_inter_threads(1).map_err(|e| model_err(&e))?;
    let eps = match &opts.provider {
        Provider::Cpu => vec![],
        Provider::Cuda { device_id } => vec![
            ort::ep::CUDA::default()
                .with_device_id(*device_id)
                .build()
                .error_on_failure(),
        ],
        Provider::Tensorrt {
            device_id,
            fp16,
            engine_cache_dir,
        } => {
            let mut trt = ort::ep::TensorRT::default()
                .with_device_id(*device_id)
                .with_fp16(*fp16);
            if let Some(dir) = engine_cache_dir {
                trt = trt
                    .with_engine_cache(true)
                    .with_engine_cache_path(dir.display());
            }
            vec![
                trt.build().error_on_failure(),
                ort::ep::CUDA::default()
                    .with_device_id(*device_id)
                    .build()
                    .error_on_failure(),
            ]
        }
    };
    if !eps.is_empty() {
        b = b
            .with_execution_providers(eps)
            .map_err(|e| LoadError::Provider {
                provider: opts.provider.name(),
                path: p.clone(),
                message: e.to_string(),
            })?;
    }
    b.commit_from_file(path).map_err(|e| {
        // Weights kept in an external data file that did not travel with the model: say which.
        if let Ok(missing) = crate::onnx_read::missing_external_files(path)
            && let Some((name, at)) = missing.first()
        {
            return model_err(&format!(
                "its weights are kept in `{name}` (ONNX external data), which is not beside it at {}: copy that file with the model",
                at.display()
            ));
        }
        let m = e.to_string();
        if opts.provider != Provider::Cpu
            && (m.contains("provider")
                || m.contains("Provider")
                || m.contains("CUDA")
                || m.contains("TensorRT"))
        {
            LoadError::Provider {
                provider: opts.provider.name(),
                path: p.clone(),
                message: m,
            }
        } else {
            model_err(&m)
        }
    })
}

/// What one graph input or output looks like: element type and shape (-1 = dynamic).
#[derive(Clone, Debug, PartialEq)]
pub struct IoShape {
    /// Name.
    pub name: String,
    /// Element type, as ONNX Runtime names it.
    pub elem: String,
    /// Dimensions, -1 for dynamic.
    pub dims: Vec<i64>,
}

fn describe(o: &ort::value::Outlet) -> IoShape {
    let t = o.dtype();
    IoShape {
        name: o.name().to_string(),
        elem: t
            .tensor_type()
            .map(|e| format!("{e:?}").to_lowercase())
            .unwrap_or_else(|| "non-tensor".into()),
        dims: t
            .tensor_shape()
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default(),
    }
}

/// The graph's inputs and outputs.
pub fn graph_io(session: &Session) -> (Vec<IoShape>, Vec<IoShape>) {
    (
        session.inputs().iter().map(describe).collect(),
        session.outputs().iter().map(describe).collect(),
    )
}

/// The shape (without the batch dimension) and element type the spec expects for each graph
/// input, given the robot's state layout (`None`: not known without a robot).
fn expected_inputs(
    spec: &PolicySpec,
    robot: Option<&RobotSpec>,
) -> Vec<(String, &'static str, Option<Vec<i64>>)> {
    let mut v = vec![];
    let (t, a) = (spec.chunk_len as i64, spec.model_dim() as i64);
    if let Some(s) = &spec.graph.sample_input {
        v.push((s.clone(), "float32", Some(vec![t, a])));
    }
    if let Some(s) = &spec.graph.time_input {
        let dims = match spec.graph.time_shape {
            TimeShape::Batch1 => vec![1],
            TimeShape::Batch => vec![],
        };
        v.push((s.clone(), spec.graph.time_dtype.ort_name(), Some(dims)));
    }
    match &spec.graph.prefix {
        // A two-graph VLA's model takes the prefix graph's outputs, of any shape.
        Some(p) => v.extend(p.outputs.iter().map(|o| (o.clone(), "float32", None))),
        None => observation_inputs(spec, robot, &mut v),
    }
    v
}

/// The graph inputs the spec's `[[inputs]]` feed: the model's, or a two-graph VLA's prefix
/// graph's.
fn observation_inputs(
    spec: &PolicySpec,
    robot: Option<&RobotSpec>,
    v: &mut Vec<(String, &'static str, Option<Vec<i64>>)>,
) {
    for i in &spec.inputs {
        match i {
            InputSource::State {
                name,
                fields,
                history,
                ..
            } => {
                let n = robot.map(|r| {
                    if fields.is_empty() {
                        r.state_dim()
                    } else {
                        fields
                            .iter()
                            .filter_map(|f| r.field(f))
                            .map(|r| r.len())
                            .sum()
                    }
                });
                v.push((
                    name.clone(),
                    "float32",
                    n.map(|n| vec![(n * history) as i64]),
                ));
            }
            InputSource::Image {
                name,
                width,
                height,
                history,
                ..
            } => {
                let frame = [3, *height as i64, *width as i64];
                let dims = if *history > 1 {
                    std::iter::once(*history as i64).chain(frame).collect()
                } else {
                    frame.to_vec()
                };
                v.push((name.clone(), "float32", Some(dims)));
            }
            InputSource::Constant {
                name, dtype, shape, ..
            } => v.push((
                name.clone(),
                dtype.ort_name(),
                Some(shape.iter().map(|d| *d as i64).collect()),
            )),
            InputSource::Language {
                name,
                max_len,
                mask_input,
                ..
            } => {
                v.push((name.clone(), "int64", Some(vec![*max_len as i64])));
                if let Some(m) = mask_input {
                    v.push((m.clone(), "int64", Some(vec![*max_len as i64])));
                }
            }
        }
    }
}

/// Every way a two-graph VLA's prefix graph disagrees with the spec: it must take exactly the
/// spec's `[[inputs]]` and return each output `[graph.prefix]` names as float32.
pub fn check_prefix_graph(
    spec: &PolicySpec,
    session: &Session,
    robot: Option<&RobotSpec>,
) -> Vec<String> {
    let Some(p) = &spec.graph.prefix else {
        return vec![];
    };
    let (inputs, outputs) = graph_io(session);
    let mut expected = vec![];
    observation_inputs(spec, robot, &mut expected);
    let mut problems = vec![];
    for (name, elem, dims) in &expected {
        input_problems(spec, &inputs, name, elem, dims.as_deref(), &mut problems);
    }
    for g in inputs
        .iter()
        .filter(|g| !expected.iter().any(|e| e.0 == g.name))
    {
        problems.push(format!(
            "prefix graph input `{}` ({} {:?}) is not fed by any spec input",
            g.name, g.elem, g.dims
        ));
    }
    for o in &p.outputs {
        match outputs.iter().find(|g| &g.name == o) {
            None => problems.push(format!(
                "graph.prefix.outputs names `{o}`, which the prefix graph does not return (its outputs: {})",
                outputs.iter().map(|g| g.name.as_str()).collect::<Vec<_>>().join(", ")
            )),
            Some(g) if g.elem != "float32" => problems.push(format!(
                "prefix output `{o}` is {}; reflex passes float32 prefix tensors only",
                g.elem
            )),
            Some(_) => {}
        }
    }
    problems
}

/// Every way the graph disagrees with the spec (empty when they agree). `robot` lets the state
/// input sizes be checked too.
pub fn check_graph(spec: &PolicySpec, session: &Session, robot: Option<&RobotSpec>) -> Vec<String> {
    if let Some(r) = robot {
        let missing = missing_state_fields(spec, r);
        if !missing.is_empty() {
            return missing;
        }
    }
    let (inputs, outputs) = graph_io(session);
    let expected = expected_inputs(spec, robot);
    let mut problems = vec![];
    for (name, elem, dims) in &expected {
        input_problems(spec, &inputs, name, elem, dims.as_deref(), &mut problems);
    }
    for g in &inputs {
        if !expected.iter().any(|(n, _, _)| n == &g.name) {
            // A fixed-size input nothing feeds: say how to feed it a constant.
            let tail: Vec<i64> = g.dims.iter().skip(1).copied().collect();
            let fix = if spec.graph.prefix.is_some() {
                "; a two-graph policy's model takes the prefix graph's outputs: name it in [graph.prefix] outputs".to_string()
            } else if matches!(g.elem.as_str(), "float32" | "int64") && tail.iter().all(|d| *d > 0)
            {
                let n: i64 = tail.iter().product();
                format!(
                    "; if it takes the same values at every call, add to the spec: [[inputs]] source = \"constant\", name = \"{}\", dtype = \"{}\", shape = {tail:?}, values = [{n} values]",
                    g.name, g.elem
                )
            } else {
                String::new()
            };
            problems.push(format!(
                "graph input `{}` ({} {:?}) is not fed by any spec input{fix}",
                g.name, g.elem, g.dims
            ));
        }
    }
    output_problems(spec, &outputs, &mut problems);
    problems
}

/// The state fields the spec's inputs read that robot `r` does not have.
fn missing_state_fields(spec: &PolicySpec, r: &RobotSpec) -> Vec<String> {
    let mut problems = vec![];
    for i in &spec.inputs {
        let (name, fields) = match i {
            InputSource::State { name, fields, .. } => (name, fields),
            InputSource::Language {
                name,
                state_prompt: Some(p),
                ..
            } => (name, &p.fields),
            _ => continue,
        };
        for f in fields {
            if r.field(f).is_none() {
                problems.push(format!(
                    "input `{name}` needs the state field `{f}`, which robot `{}` does not have (fields: {})",
                    r.name,
                    r.state.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", ")
                ));
            }
        }
    }
    problems
}

/// What does not fit between the spec's input `name` (fed as `elem`, shape `dims` after the
/// batch) and the graph's input of that name.
fn input_problems(
    spec: &PolicySpec,
    inputs: &[IoShape],
    name: &str,
    elem: &str,
    dims: Option<&[i64]>,
    problems: &mut Vec<String>,
) {
    let Some(g) = inputs.iter().find(|g| g.name == name) else {
        problems.push(format!(
            "input `{name}` named in the spec is not in the graph (graph inputs: {})",
            inputs
                .iter()
                .map(|g| g.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
        return;
    };
    let is_time = spec.graph.time_input.as_deref() == Some(name);
    if g.elem != *elem {
        let fix = match g.elem.as_str() {
            "int64" | "float32" if is_time => format!(
                "; set `time_dtype = \"{}\"` under [graph] in the spec",
                g.elem
            ),
            _ => String::new(),
        };
        problems.push(format!(
            "input `{name}`: the graph takes {}, the spec feeds {elem}{fix}",
            g.elem
        ));
    }
    if let Some(d) = dims {
        let graph_tail: Vec<i64> = g.dims.iter().skip(1).copied().collect();
        let fits = graph_tail.len() == d.len()
            && graph_tail.iter().zip(d).all(|(g, e)| *g == -1 || g == e);
        if !fits {
            let fix = match g.dims.len() {
                1 if is_time => "; set `time_shape = \"batch\"` under [graph] in the spec",
                2 if is_time => "; set `time_shape = \"batch_1\"` under [graph] in the spec",
                _ => "",
            };
            let fed = std::iter::once("batch".to_string())
                .chain(d.iter().map(|x| x.to_string()))
                .collect::<Vec<_>>()
                .join(", ");
            problems.push(format!(
                "input `{name}`: the graph's shape is {:?}, the spec feeds [{fed}]{fix}",
                g.dims
            ));
        }
    }
}

/// What does not fit between the spec's output and the graph's.
fn output_problems(spec: &PolicySpec, outputs: &[IoShape], problems: &mut Vec<String>) {
    match outputs.iter().find(|o| o.name == spec.graph.output) {
        None => problems.push(format!(
            "output `{}` named in the spec is not in the graph (graph outputs: {})",
            spec.graph.output,
            outputs
                .iter()
                .map(|g| g.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
        Some(o) => {
            if o.elem != "float32" {
                problems.push(format!(
                    "output `{}` is {}, expected float32",
                    o.name, o.elem
                ));
            }
            let want = [spec.chunk_len as i64, spec.model_dim() as i64];
            let tail: Vec<i64> = o.dims.iter().skip(1).copied().collect();
            let fits = tail.len() == 2 && tail.iter().zip(&want).all(|(g, e)| *g == -1 || g == e);
            if !fits {
                problems.push(format!("output `{}`: the graph's shape is {:?}, the spec expects [batch, {}, {}] (chunk_len, {})", o.name, o.dims, want[0], want[1], if spec.model_action_dim.is_some() { "model_action_dim" } else { "action_dim" }));
            }
        }
    }
}

/// The feeds of one ONNX Runtime call, borrowing the policy's buffers.
type Feeds<'a> = Vec<(Cow<'a, str>, SessionInputValue<'a>)>;

/// The sampler's time input in the dtype and shape the graph takes.
fn time_feed<'a>(
    g: &crate::spec::GraphIo,
    time: &'a [f32; 1],
    time_i64: &'a [i64; 1],
) -> Result<SessionInputValue<'a>, ort::Error> {
    Ok(match (g.time_dtype, g.time_shape) {
        (TimeDtype::Float32, TimeShape::Batch1) => {
            TensorRef::from_array_view(([1usize, 1], &time[..]))?.into()
        }
        (TimeDtype::Float32, TimeShape::Batch) => {
            TensorRef::from_array_view(([1usize], &time[..]))?.into()
        }
        (TimeDtype::Int64, TimeShape::Batch1) => {
            TensorRef::from_array_view(([1usize, 1], &time_i64[..]))?.into()
        }
        (TimeDtype::Int64, TimeShape::Batch) => {
            TensorRef::from_array_view(([1usize], &time_i64[..]))?.into()
        }
    })
}

/// The prepared observation inputs (state, images, constants, tokens) as feeds.
fn input_feeds<'a>(
    inputs: &'a [(String, Prepared)],
    feeds: &mut Feeds<'a>,
) -> Result<(), ort::Error> {
    for (name, p) in inputs {
        match p {
            Prepared::State { data, .. } => feeds.push((
                name.as_str().into(),
                TensorRef::from_array_view(([1usize, data.len()], &data[..]))?.into(),
            )),
            Prepared::Image {
                data,
                width,
                height,
                history,
                ..
            } => {
                let (h, w) = (*height as usize, *width as usize);
                let t = if *history > 1 {
                    TensorRef::from_array_view(([1usize, *history, 3, h, w], &data[..]))?
                } else {
                    TensorRef::from_array_view(([1usize, 3, h, w], &data[..]))?
                };
                feeds.push((name.as_str().into(), t.into()));
            }
            Prepared::Constant {
                shape,
                f32s,
                i64s,
                int,
            } => feeds.push((
                name.as_str().into(),
                if *int {
                    TensorRef::from_array_view((shape.clone(), &i64s[..]))?.into()
                } else {
                    TensorRef::from_array_view((shape.clone(), &f32s[..]))?.into()
                },
            )),
            Prepared::Tokens { ids, mask, .. } => {
                feeds.push((
                    name.as_str().into(),
                    TensorRef::from_array_view(([1usize, ids.len()], &ids[..]))?.into(),
                ));
                if let Some((m, v)) = mask {
                    feeds.push((
                        m.as_str().into(),
                        TensorRef::from_array_view(([1usize, v.len()], &v[..]))?.into(),
                    ));
                }
            }
        }
    }
    Ok(())
}

enum Prepared {
    State {
        data: Vec<f32>,
        ranges: Vec<Range<usize>>,
        history: usize,
        normalize: crate::spec::Normalize,
    },
    Image {
        data: Vec<f32>,
        camera: String,
        width: u32,
        height: u32,
        mean: [f32; 3],
        std: [f32; 3],
        history: usize,
    },
    Tokens {
        ids: Vec<i64>,
        mask: Option<(String, Vec<i64>)>,
        /// pi0.5: the prompt is rebuilt from the state at every chunk.
        prompt: Option<Box<Prompt>>,
    },
    Constant {
        shape: Vec<usize>,
        f32s: Vec<f32>,
        i64s: Vec<i64>,
        int: bool,
    },
}

/// A pi0.5 prompt's tokenizer, state fields and buffers (see [`crate::spec::StatePrompt`]).
struct Prompt {
    tokenizer: tokenizers::Tokenizer,
    path: PathBuf,
    instruction: String,
    ranges: Vec<Range<usize>>,
    normalize: crate::spec::Normalize,
    max_len: usize,
    pad_id: i64,
    values: Vec<f32>,
    text: String,
    mask: Vec<i64>,
}

impl Prompt {
    /// Rewrites `ids` (and `mask`, when the graph takes one) for the state of `obs`.
    fn tokens(
        &mut self,
        obs: &Observation,
        ids: &mut Vec<i64>,
        mask: Option<&mut Vec<i64>>,
    ) -> Result<(), String> {
        self.values.clear();
        for r in &self.ranges {
            let src = obs
                .state
                .get(r.clone())
                .ok_or("observation too short for the prompt's state")?;
            self.values.extend_from_slice(src);
        }
        self.normalize.apply(&mut self.values);
        crate::spec::StatePrompt::write(&self.instruction, &self.values, &mut self.text);
        let mask = mask.unwrap_or(&mut self.mask);
        crate::vla::encode(
            &self.tokenizer,
            &self.text,
            self.max_len,
            self.pad_id,
            ids,
            mask,
        )
        .map_err(|e| format!("tokenizer {}: {e}", self.path.display()))
    }
}

/// The robot's state ranges `fields` name (all of the state when empty), for input `input`.
fn state_ranges(
    fields: &[String],
    robot: &RobotSpec,
    input: &str,
    bad: &dyn Fn(String) -> LoadError,
) -> Result<Vec<Range<usize>>, LoadError> {
    if fields.is_empty() {
        return Ok(std::iter::once(0..robot.state_dim()).collect());
    }
    fields
        .iter()
        .map(|f| {
            robot.field(f).ok_or_else(|| {
                bad(format!(
                    "input `{input}` needs the state field `{f}`, which the robot does not have"
                ))
            })
        })
        .collect()
}

/// An ONNX policy ready to run for one robot.
pub struct OnnxPolicy {
    spec: PolicySpec,
    session: Session,
    inputs: Vec<(String, Prepared)>,
    ddim: Option<Ddim>,
    noise: Vec<f32>,
    /// DDPM's noise for its steps after the initial sample (`noise_draws` chunks).
    step_noise: Vec<f32>,
    /// The observations of the steps before the next inference's (`past_steps` of them) and
    /// whether the loop handed them over for it (without, the current one stands in for them, as
    /// at an episode's start).
    past: Vec<Observation>,
    past_given: bool,
    next_noise: Option<Vec<f32>>,
    noise_pending: bool,
    x: Vec<f32>,
    out: Vec<f32>,
    time: [f32; 1],
    time_i64: [i64; 1],
    rng: ChaCha8Rng,
    trace: Option<Vec<Vec<f32>>>,
    rtc: Rtc,
    vjp: Option<VjpSession>,
    prefix: Option<PrefixSession>,
}

/// A two-graph VLA's prefix graph (`[graph.prefix]`) and what it returned for the chunk being
/// sampled (buffers reused from chunk to chunk).
struct PrefixSession {
    session: Session,
    /// Each output the model takes: name, shape, values.
    outputs: Vec<(String, Vec<usize>, Vec<f32>)>,
    /// How long its last run took.
    last: std::time::Duration,
}

/// Opens the prefix graph `p` names beside `model` and checks it against the spec.
fn load_prefix(
    model: &Path,
    spec: &PolicySpec,
    p: &crate::spec::PrefixGraph,
    robot: &RobotSpec,
    opts: &RunOptions,
) -> Result<PrefixSession, LoadError> {
    let dir = model.parent().unwrap_or(Path::new("."));
    let path = dir.join(&p.file);
    let mismatch = |problems| LoadError::Mismatch {
        path: path.display().to_string(),
        spec: spec_path(model).display().to_string(),
        problems,
    };
    if !path.is_file() {
        return Err(mismatch(vec![format!(
            "graph.prefix.file names `{}`, which does not exist: the two graphs travel together (NAME.onnx and NAME.prefix.onnx)",
            path.display()
        )]));
    }
    let session = open_session(&path, opts)?;
    let problems = check_prefix_graph(spec, &session, Some(robot));
    if !problems.is_empty() {
        return Err(mismatch(problems));
    }
    Ok(PrefixSession {
        session,
        outputs: p
            .outputs
            .iter()
            .map(|o| (o.clone(), vec![], vec![]))
            .collect(),
        last: std::time::Duration::ZERO,
    })
}

/// A flow policy's vector-Jacobian-product graph (`[graph.vjp]`), loaded beside the model, with
/// its cotangent and result buffers.
struct VjpSession {
    session: Session,
    cotangent_input: String,
    output: String,
    e: Vec<f32>,
    out: Vec<f32>,
}

/// Real-time chunking's settings and buffers (sized at load, reused every chunk).
struct Rtc {
    cfg: RtcConfig,
    target: Vec<f32>,
    x: Vec<f32>,
    v: Vec<f32>,
    noise: Vec<f32>,
    scratch: RtcScratch,
    last: Option<RtcVariant>,
}

/// The buffers of one graph input, sized for `robot`, its fields and cameras checked.
fn prepare_input(
    i: &InputSource,
    robot: &RobotSpec,
    dir: &Path,
    bad: &dyn Fn(String) -> LoadError,
) -> Result<Prepared, LoadError> {
    Ok(match i {
        InputSource::State {
            fields,
            history,
            normalize,
            ..
        } => {
            let ranges = state_ranges(fields, robot, i.name(), bad)?;
            let n: usize = ranges.iter().map(|r| r.len()).sum();
            Prepared::State {
                data: vec![0.0; n * history],
                ranges,
                history: *history,
                normalize: normalize.clone(),
            }
        }
        InputSource::Image {
            camera,
            width,
            height,
            mean,
            std,
            eps,
            history,
            ..
        } => {
            if !robot.cameras.iter().any(|c| &c.name == camera) {
                return Err(bad(format!(
                    "input `{}` needs camera `{camera}`; the robot has {:?} (enable its cameras? one of them under another name is mapped to `{camera}` in the run config's [robot.cameras])",
                    i.name(),
                    robot.cameras.iter().map(|c| &c.name).collect::<Vec<_>>()
                )));
            }
            Prepared::Image {
                data: vec![0.0; (3 * width * height) as usize * history],
                camera: camera.clone(),
                width: *width,
                height: *height,
                mean: *mean,
                std: crate::spec::image_divisor(std, *eps),
                history: *history,
            }
        }
        InputSource::Language {
            tokenizer,
            instruction,
            max_len,
            pad_id,
            mask_input,
            state_prompt,
            ..
        } => {
            let path = dir.join(tokenizer);
            let (ids, mask) = crate::vla::tokenize(&path, instruction, *max_len, *pad_id)?;
            let prompt = match state_prompt {
                None => None,
                Some(sp) => Some(Box::new(Prompt {
                    tokenizer: crate::vla::load_tokenizer(&path)?,
                    path,
                    instruction: instruction.clone(),
                    ranges: state_ranges(&sp.fields, robot, i.name(), bad)?,
                    normalize: sp.normalize.clone(),
                    max_len: *max_len,
                    pad_id: *pad_id,
                    values: Vec::with_capacity(robot.state_dim()),
                    text: String::new(),
                    mask: Vec::with_capacity(*max_len),
                })),
            };
            Prepared::Tokens {
                ids,
                mask: mask_input.clone().map(|m| (m, mask)),
                prompt,
            }
        }
        InputSource::Constant {
            dtype,
            shape,
            values,
            ..
        } => Prepared::Constant {
            shape: std::iter::once(1).chain(shape.iter().copied()).collect(),
            f32s: values.iter().map(|v| *v as f32).collect(),
            i64s: values.iter().map(|v| *v as i64).collect(),
            int: *dtype == TimeDtype::Int64,
        },
    })
}

/// Opens the VJP graph `v` names beside `model` and checks its inputs and output against the
/// spec: the model's inputs, the cotangent, and the output.
fn load_vjp(
    model: &Path,
    spec: &PolicySpec,
    v: &crate::spec::VjpGraph,
    opts: &RunOptions,
) -> Result<VjpSession, LoadError> {
    let dir = model.parent().unwrap_or(Path::new("."));
    let path = dir.join(&v.file);
    if !path.is_file() {
        return Err(LoadError::Mismatch {
            path: model.display().to_string(),
            spec: spec_path(model).display().to_string(),
            problems: vec![format!(
                "graph.vjp.file names `{}`, which does not exist: write it again with the model (`reflex bc train --objective flow` writes NAME.vjp.onnx), or remove [graph.vjp] to sample without guidance",
                path.display()
            )],
        });
    }
    let session = open_session(&path, opts)?;
    let mut problems = vec![];
    let has_in = |n: &str| session.inputs().iter().any(|i| i.name() == n);
    // Like the model, a two-graph VLA's VJP graph takes the prefix graph's outputs.
    let observed: Vec<String> = match &spec.graph.prefix {
        Some(p) => p.outputs.clone(),
        None => spec.inputs.iter().map(|i| i.name().to_string()).collect(),
    };
    let wanted = observed
        .into_iter()
        .chain(spec.graph.sample_input.clone())
        .chain(spec.graph.time_input.clone())
        .chain(std::iter::once(v.cotangent_input.clone()));
    for n in wanted {
        if !has_in(&n) {
            problems.push(format!("the VJP graph has no input `{n}`"));
        }
    }
    if !session.outputs().iter().any(|o| o.name() == v.output) {
        problems.push(format!("the VJP graph has no output `{}`", v.output));
    }
    if !problems.is_empty() {
        return Err(LoadError::Mismatch {
            path: path.display().to_string(),
            spec: spec_path(model).display().to_string(),
            problems,
        });
    }
    let n = spec.chunk_len * spec.model_dim();
    Ok(VjpSession {
        session,
        cotangent_input: v.cotangent_input.clone(),
        output: v.output.clone(),
        e: vec![0.0; n],
        out: vec![0.0; n],
    })
}

impl OnnxPolicy {
    /// Loads `model` and the spec beside it, checks both against each other and against `robot`.
    pub fn load(model: &Path, robot: &RobotSpec, opts: &RunOptions) -> Result<Self, LoadError> {
        model_file(model)?;
        let mut spec = PolicySpec::load_for(model)?;
        if let Some(execute) = opts.execute {
            if !(1..=spec.rows()).contains(&execute) {
                return Err(LoadError::Execute {
                    execute,
                    path: model.display().to_string(),
                    chunk_len: spec.rows(),
                });
            }
            spec.execute = execute;
        }
        let session = open_session(model, opts)?;
        let problems = check_graph(&spec, &session, Some(robot));
        if !problems.is_empty() {
            return Err(LoadError::Mismatch {
                path: model.display().to_string(),
                spec: spec_path(model).display().to_string(),
                problems,
            });
        }
        let bad = |m: String| LoadError::Robot {
            policy: spec.name.clone(),
            robot: robot.name.clone(),
            message: m,
        };
        if robot.action.dim() != spec.action_dim {
            return Err(bad(format!(
                "the policy outputs {} action components, the robot takes {}",
                spec.action_dim,
                robot.action.dim()
            )));
        }
        if let Some(k) = &spec.robot_kind
            && k != &robot.kind
        {
            return Err(bad(format!(
                "the policy was made for robot kind `{k}`, this robot is `{}`",
                robot.kind
            )));
        }
        let dir = model.parent().unwrap_or(Path::new("."));
        let inputs = spec
            .inputs
            .iter()
            .map(|i| Ok((i.name().to_string(), prepare_input(i, robot, dir, &bad)?)))
            .collect::<Result<Vec<_>, LoadError>>()?;
        let n = spec.chunk_len * spec.model_dim();
        let (spec_rows, spec_dim) = (spec.chunk_len, spec.model_dim());
        let ddim = (spec.kind == PolicyKind::Diffusion)
            .then(|| spec.diffusion.clone().unwrap_or_default().ddim());
        let vjp = match &spec.graph.vjp {
            Some(v) => Some(load_vjp(model, &spec, v, opts)?),
            None => None,
        };
        let prefix = match &spec.graph.prefix {
            Some(p) => Some(load_prefix(model, &spec, p, robot, opts)?),
            None => None,
        };
        let draws = ddim.as_ref().map_or(0, Ddim::noise_draws);
        let past = vec![Observation::default(); spec.past_steps()];
        Ok(OnnxPolicy {
            spec,
            session,
            inputs,
            ddim,
            noise: vec![0.0; n],
            step_noise: vec![0.0; n * draws],
            past,
            past_given: false,
            next_noise: None,
            noise_pending: false,
            x: vec![0.0; n],
            out: vec![0.0; n],
            time: [0.0],
            time_i64: [0],
            rng: ChaCha8Rng::seed_from_u64(opts.seed),
            trace: None,
            rtc: Rtc {
                cfg: RtcConfig::default(),
                target: vec![0.0; n],
                x: vec![0.0; n],
                v: vec![0.0; n],
                noise: Vec::with_capacity(n),
                scratch: RtcScratch::new(spec_rows, spec_dim),
                last: None,
            },
            vjp,
            prefix,
        })
    }

    /// How long the prefix graph of a two-graph VLA took for the last chunk (`None`: one graph).
    pub fn last_prefix_time(&self) -> Option<std::time::Duration> {
        self.prefix.as_ref().map(|p| p.last)
    }

    /// Whether the model carries a VJP graph, so real-time chunking guides its sampling (the
    /// paper's method) rather than inpainting hard.
    pub fn has_vjp(&self) -> bool {
        self.vjp.is_some()
    }

    /// `J_v(x)^T e` at the noisy chunk `x` (normalised units) and flow time `t` for the last
    /// prepared observation, through the VJP graph; `None` without one.
    pub fn vjp_at(
        &mut self,
        obs: &Observation,
        x: &[f32],
        t: f32,
        e: &[f32],
        out: &mut [f32],
    ) -> Option<Result<(), PolicyError>> {
        self.vjp.as_ref()?;
        Some(self.prepare(obs).and_then(|()| {
            self.x.copy_from_slice(x);
            self.time[0] = t;
            self.run_vjp(e, out)
        }))
    }

    /// Runs the VJP graph at `self.x` and `self.time` with cotangent `e` into `out`.
    fn run_vjp(&mut self, e: &[f32], out: &mut [f32]) -> Result<(), PolicyError> {
        let v = self.vjp.as_mut().expect("a VJP graph is loaded");
        v.e.copy_from_slice(e);
        self.run_on(true, true)?;
        out.copy_from_slice(&self.vjp.as_ref().expect("loaded").out);
        Ok(())
    }

    /// Real-time chunking (`[policy.rtc]`): with it enabled, a diffusion or flow policy samples
    /// each chunk as an inpainting of the chunk the robot executes meanwhile (docs/runtime.md).
    /// A chunk policy (ACT-style) has no sampler to guide and ignores it; one that cannot use it
    /// ([`Self::rtc_unsupported`]) keeps it off, with a warning.
    pub fn set_rtc(&mut self, cfg: RtcConfig) {
        if let (true, Some(why)) = (cfg.enabled, self.rtc_unsupported()) {
            tracing::warn!(
                "policy `{}`: real-time chunking stays off: {why}",
                self.spec.name
            );
            return;
        }
        self.rtc.cfg = cfg;
    }

    /// Why real-time chunking cannot sample this policy's chunks (`None`: it can): DDPM adds fresh
    /// noise at every step, which the inpainting sampler does not model, and a chunk that starts
    /// before its observation (`first_action`) is not laid out as the executing one.
    pub fn rtc_unsupported(&self) -> Option<String> {
        if self.ddim.as_ref().is_some_and(|d| d.noise_draws() > 0) {
            return Some("it samples with DDPM; real-time chunking needs DDIM or flow".into());
        }
        if let Some(w) = self
            .spec
            .model_action_dim
            .filter(|&w| w != self.spec.action_dim)
        {
            return Some(format!(
                "the network samples {w} components a row for the robot's {} (model_action_dim); \
                 the inpainting sampler works in the robot's",
                self.spec.action_dim
            ));
        }
        (self.spec.first_action > 0).then(|| {
            format!(
                "its chunk starts {} rows before the observation (first_action)",
                self.spec.first_action
            )
        })
    }

    /// Which real-time chunking sampler produced the last chunk (`None`: plain sampling).
    pub fn rtc_variant(&self) -> Option<RtcVariant> {
        self.rtc.last
    }

    /// The spec.
    pub fn spec(&self) -> &PolicySpec {
        &self.spec
    }

    /// Uses `noise` (chunk_len x the network's width, standard normal units) as the initial sample of the
    /// next inference instead of drawing it (deterministic tests; diffusion steering). For a DDPM
    /// policy it may go on with the noise of every later step ([`Self::step_noise_len`] more
    /// values), as a parity check passes what the reference drew; otherwise those are drawn.
    pub fn set_next_noise(&mut self, noise: Vec<f32>) {
        self.next_noise = Some(noise);
        self.noise_pending = true;
    }

    /// [`Self::set_next_noise`] from a slice, reusing the held buffer (no allocation once the
    /// first call sized it): what a steering actor on the control loop calls every chunk.
    pub fn set_next_noise_from(&mut self, noise: &[f32]) {
        match &mut self.next_noise {
            Some(v) if v.len() == noise.len() => v.copy_from_slice(noise),
            _ => self.next_noise = Some(noise.to_vec()),
        }
        self.noise_pending = true;
    }

    /// Values of noise a DDPM policy draws after the initial sample (0 for any other): injected
    /// noise may carry them after the initial chunk ([`Self::set_next_noise`]).
    pub fn step_noise_len(&self) -> usize {
        self.step_noise.len()
    }

    /// Values of the initial noise of one chunk (chunk_len x the network's width,
    /// `model_action_dim` when given; 0 for a chunk policy).
    pub fn noise_len(&self) -> usize {
        match self.spec.kind {
            PolicyKind::Chunk => 0,
            _ => self.noise.len(),
        }
    }

    fn prepare(&mut self, obs: &Observation) -> Result<(), PolicyError> {
        let name = self.spec.name.clone();
        let given = std::mem::take(&mut self.past_given);
        let past = &self.past;
        // Frame `k` of `h` (oldest first): the current observation last, the loop's past ones
        // before it; without them (no loop, or an episode's start) the current one.
        let frame = |k: usize, h: usize| -> &Observation {
            let back = h - 1 - k;
            match past.len().checked_sub(back) {
                Some(i) if back > 0 && given => &past[i],
                _ => obs,
            }
        };
        for (input, p) in &mut self.inputs {
            match p {
                Prepared::State {
                    data,
                    ranges,
                    history,
                    normalize,
                } => {
                    let n: usize = ranges.iter().map(|r| r.len()).sum();
                    for k in 0..*history {
                        let o = frame(k, *history);
                        let dst = &mut data[k * n..(k + 1) * n];
                        let mut at = 0;
                        for r in ranges.iter() {
                            let src = o.state.get(r.clone()).ok_or_else(|| PolicyError {
                                policy: name.clone(),
                                message: format!("observation too short for input `{input}`"),
                            })?;
                            dst[at..at + src.len()].copy_from_slice(src);
                            at += src.len();
                        }
                        normalize.apply(dst);
                    }
                }
                Prepared::Image {
                    data,
                    camera,
                    width,
                    height,
                    mean,
                    std,
                    history,
                } => {
                    let per = data.len() / *history;
                    for k in 0..*history {
                        crate::vla::camera_to_nchw(
                            &frame(k, *history).images,
                            camera,
                            "the policy",
                            *width,
                            *height,
                            mean,
                            std,
                            &mut data[k * per..(k + 1) * per],
                        )
                        .map_err(|message| PolicyError {
                            policy: name.clone(),
                            message,
                        })?;
                    }
                }
                Prepared::Tokens {
                    ids,
                    mask,
                    prompt: Some(prompt),
                } => prompt
                    .tokens(obs, ids, mask.as_mut().map(|(_, m)| m))
                    .map_err(|message| PolicyError {
                        policy: name.clone(),
                        message: format!("input `{input}`: {message}"),
                    })?,
                Prepared::Tokens { prompt: None, .. } | Prepared::Constant { .. } => {}
            }
        }
        self.run_prefix()
    }

    /// A two-graph VLA: runs the prefix graph on the prepared inputs, once per chunk, and keeps
    /// its outputs for the model's integration steps.
    fn run_prefix(&mut self) -> Result<(), PolicyError> {
        let Some(p) = &mut self.prefix else {
            return Ok(());
        };
        let err = |e: ort::Error| PolicyError {
            policy: self.spec.name.clone(),
            message: format!("prefix graph: {e}"),
        };
        let t0 = std::time::Instant::now();
        let mut feeds: Feeds = Vec::with_capacity(self.inputs.len() + 1);
        input_feeds(&self.inputs, &mut feeds).map_err(err)?;
        let outputs = p.session.run(feeds).map_err(err)?;
        for (name, shape, data) in &mut p.outputs {
            let (sh, values) = outputs[name.as_str()]
                .try_extract_tensor::<f32>()
                .map_err(err)?;
            shape.clear();
            shape.extend(sh.iter().map(|d| *d as usize));
            data.clear();
            data.extend_from_slice(values);
        }
        p.last = t0.elapsed();
        Ok(())
    }

    fn run_graph(&mut self, sample: bool) -> Result<(), PolicyError> {
        self.run_on(sample, false)
    }

    /// Runs the model (its output into `self.out`), or with `vjp` the VJP graph (the cotangent
    /// from and the result into the [`VjpSession`]'s buffers).
    fn run_on(&mut self, sample: bool, vjp: bool) -> Result<(), PolicyError> {
        let err = |e: ort::Error| PolicyError {
            policy: self.spec.name.clone(),
            message: e.to_string(),
        };
        let (t, a) = (self.spec.chunk_len, self.spec.model_dim());
        let mut feeds: Feeds = Vec::with_capacity(self.inputs.len() + 2);
        if sample {
            let g = &self.spec.graph;
            let s = g.sample_input.as_deref().expect("validated");
            feeds.push((
                s.into(),
                TensorRef::from_array_view(([1usize, t, a], &self.x[..]))
                    .map_err(err)?
                    .into(),
            ));
            let tn = g.time_input.as_deref().expect("validated");
            let time = time_feed(g, &self.time, &self.time_i64).map_err(err)?;
            feeds.push((tn.into(), time));
        }
        match &self.prefix {
            Some(p) => {
                for (name, shape, data) in &p.outputs {
                    let t = TensorRef::from_array_view((shape.clone(), &data[..])).map_err(err)?;
                    feeds.push((name.as_str().into(), t.into()));
                }
            }
            None => input_feeds(&self.inputs, &mut feeds).map_err(err)?,
        }
        if vjp {
            let v = self.vjp.as_mut().expect("a VJP graph is loaded");
            feeds.push((
                v.cotangent_input.as_str().into(),
                TensorRef::from_array_view(([1usize, t, a], &v.e[..]))
                    .map_err(err)?
                    .into(),
            ));
            let outputs = v.session.run(feeds).map_err(err)?;
            let (_, data) = outputs[v.output.as_str()]
                .try_extract_tensor::<f32>()
                .map_err(err)?;
            v.out.copy_from_slice(&data[..t * a]);
            return Ok(());
        }
        let output = self.spec.graph.output.clone();
        let outputs = self.session.run(feeds).map_err(err)?;
        let (_, data) = outputs[output.as_str()]
            .try_extract_tensor::<f32>()
            .map_err(err)?;
        self.out.copy_from_slice(&data[..t * a]);
        Ok(())
    }

    /// One chunk by real-time chunking from the noise in `self.x` into `self.x`: the prefix in
    /// the network's units, then the flow sampler guided toward it (with the model's VJP graph,
    /// [`RtcVariant::Guided`]; without one, or with `guidance = false`, hard inpainting), or
    /// DDIM with the prefix inpainted; `rtc_variant` says which ran.
    fn sample_rtc(&mut self, p: &ChunkPrefix<'_>) -> Result<(), PolicyError> {
        let (rows, dim) = (self.spec.chunk_len, self.spec.action_dim);
        let covered = p.covered.min(rows);
        let mut target = std::mem::take(&mut self.rtc.target);
        target[..covered * dim].copy_from_slice(&p.actions[..covered * dim]);
        target[covered * dim..].fill(0.0);
        // One row's statistics cover every row (`Normalize::apply` indexes modulo its length).
        self.spec
            .action_normalize
            .apply(&mut target[..covered * dim]);
        let prefix = Prefix {
            target: &target,
            delay: p.delay,
            end: covered,
        };
        let mut x = std::mem::take(&mut self.rtc.x);
        let mut v = std::mem::take(&mut self.rtc.v);
        x.copy_from_slice(&self.x);
        let result = if self.spec.kind == PolicyKind::Diffusion {
            let ddim = self.ddim.clone().expect("diffusion has a schedule");
            let mut noise = std::mem::take(&mut self.rtc.noise);
            let r = rtc_ddim_sample(&ddim, dim, prefix, &mut x, &mut v, &mut noise, |x, t, o| {
                self.x.copy_from_slice(x);
                self.time[0] = t as f32;
                self.time_i64[0] = t as i64;
                self.run_graph(true)?;
                o.copy_from_slice(&self.out);
                Ok(())
            });
            self.rtc.noise = noise;
            r
        } else {
            let mut scratch = std::mem::take(&mut self.rtc.scratch);
            let cfg = self.rtc.cfg.clone();
            let steps = self.spec.flow_steps;
            let guided = cfg.guidance && self.vjp.is_some();
            // Both the velocity and the VJP run graphs of this policy, one at a time.
            let me = std::cell::RefCell::new(&mut *self);
            let mut vjp = |x: &[f32], t: f32, e: &[f32], out: &mut [f32]| {
                let mut p = me.borrow_mut();
                p.x.copy_from_slice(x);
                p.time[0] = t;
                p.run_vjp(e, out)
            };
            let r = rtc_flow_sample(
                &cfg,
                steps,
                dim,
                prefix,
                &mut x,
                &mut v,
                &mut scratch,
                |x, t, v| {
                    let mut p = me.borrow_mut();
                    p.x.copy_from_slice(x);
                    p.time[0] = t;
                    p.run_graph(true)?;
                    v.copy_from_slice(&p.out);
                    Ok(())
                },
                guided.then_some(&mut vjp as crate::rtc::Vjp<'_, PolicyError>),
            );
            self.rtc.scratch = scratch;
            r
        };
        self.x.copy_from_slice(&x);
        self.rtc.x = x;
        self.rtc.v = v;
        self.rtc.target = target;
        self.rtc.last = Some(result?);
        Ok(())
    }

    /// Keeps the sample after every denoising step of the following inferences (normalised
    /// units; diffusion and flow), for comparing a sampler step by step with another
    /// implementation. Off by default: it allocates per step.
    pub fn set_trace(&mut self, on: bool) {
        self.trace = on.then(Vec::new);
    }

    /// The samples kept since [`Self::set_trace`], one per denoising step, and clears them.
    pub fn take_trace(&mut self) -> Vec<Vec<f32>> {
        self.trace.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// The initial noise of the next chunk (and DDPM's per-step noise): injected, or drawn.
    fn draw_noise(&mut self) -> Result<(), PolicyError> {
        let injected = std::mem::take(&mut self.noise_pending)
            .then_some(self.next_noise.as_ref())
            .flatten();
        let (n0, ns) = (self.noise.len(), self.step_noise.len());
        let mut steps_given = false;
        match injected {
            Some(n) if n.len() == n0 => self.noise.copy_from_slice(n),
            Some(n) if ns > 0 && n.len() == n0 + ns => {
                self.noise.copy_from_slice(&n[..n0]);
                self.step_noise.copy_from_slice(&n[n0..]);
                steps_given = true;
            }
            Some(n) => {
                return Err(PolicyError {
                    policy: self.spec.name.clone(),
                    message: format!(
                        "injected noise has {} values, the chunk has {n0}{}",
                        n.len(),
                        if ns > 0 {
                            format!(" (or {} with every DDPM step's)", n0 + ns)
                        } else {
                            String::new()
                        }
                    ),
                });
            }
            None => {
                for v in self.noise.iter_mut() {
                    *v = StandardNormal.sample(&mut self.rng);
                }
            }
        }
        if !steps_given {
            for v in self.step_noise.iter_mut() {
                *v = StandardNormal.sample(&mut self.rng);
            }
        }
        Ok(())
    }

    /// Computes a chunk (in robot action units) for `obs` into `out`.
    pub fn infer_chunk(&mut self, obs: &Observation, out: &mut [f32]) -> Result<(), PolicyError> {
        self.infer_chunk_with(obs, None, out)
    }

    /// As [`Self::infer_chunk`], inpainting the chunk toward `prefix` (what the robot executes
    /// meanwhile) when real-time chunking is on and the policy samples.
    pub fn infer_chunk_with(
        &mut self,
        obs: &Observation,
        prefix: Option<&ChunkPrefix<'_>>,
        out: &mut [f32],
    ) -> Result<(), PolicyError> {
        let (skip, dim) = (self.spec.first_action, self.spec.action_dim);
        if out.len() != self.spec.rows() * dim {
            return Err(PolicyError {
                policy: self.spec.name.clone(),
                message: format!(
                    "the chunk buffer holds {} values; this policy writes {} rows of {dim}",
                    out.len(),
                    self.spec.rows()
                ),
            });
        }
        self.prepare(obs)?;
        self.rtc.last = None;
        match self.spec.kind {
            PolicyKind::Chunk => {
                self.run_graph(false)?;
                executed_rows(&self.out, self.spec.model_dim(), skip, dim, out);
            }
            PolicyKind::Diffusion | PolicyKind::Flow => {
                self.draw_noise()?;
                self.x.copy_from_slice(&self.noise);
                let guided = prefix
                    .filter(|p| self.rtc.cfg.enabled && p.covered > 0 && self.trace.is_none());
                if let Some(p) = guided {
                    self.sample_rtc(p)?;
                } else if self.spec.kind == PolicyKind::Diffusion {
                    let ddim = self.ddim.clone().expect("diffusion has a schedule");
                    let n = self.noise.len();
                    for (i, &t) in ddim.timesteps.iter().enumerate() {
                        self.time[0] = t as f32;
                        self.time_i64[0] = t as i64;
                        self.run_graph(true)?;
                        let out = std::mem::take(&mut self.out);
                        if ddim.noise_draws() > 0 {
                            // Step i draws the i-th chunk of noise (none at t = 0, the last).
                            let z = self.step_noise.get(i * n..(i + 1) * n).unwrap_or(&[]);
                            ddim.step_ddpm(t, &out, &mut self.x, z);
                        } else {
                            ddim.step(t, &out, &mut self.x);
                        }
                        self.out = out;
                        if let Some(tr) = &mut self.trace {
                            tr.push(self.x.clone());
                        }
                    }
                } else {
                    let steps = self.spec.flow_steps;
                    for k in 0..steps {
                        self.time[0] = k as f32 / steps as f32;
                        self.run_graph(true)?;
                        let dt = 1.0 / steps as f32;
                        for (x, v) in self.x.iter_mut().zip(&self.out) {
                            *x += dt * v;
                        }
                        if let Some(tr) = &mut self.trace {
                            tr.push(self.x.clone());
                        }
                    }
                }
                executed_rows(&self.x, self.spec.model_dim(), skip, dim, out);
            }
        }
        self.spec.action_normalize.invert(out);
        if let (Some(_), Some(p)) = (self.rtc.last, prefix) {
            // The frozen rows in robot units exactly as the loop executes them, not through a
            // normalisation round trip.
            let dim = self.spec.action_dim;
            let frozen = p.delay.min(p.covered).min(self.spec.chunk_len);
            out[..frozen * dim].copy_from_slice(&p.actions[..frozen * dim]);
        }
        Ok(())
    }
}

/// The robot's part of the network's chunk `chunk` (rows of `width`): from row `skip` on, the
/// first `dim` components of each row, into `out`.
fn executed_rows(chunk: &[f32], width: usize, skip: usize, dim: usize, out: &mut [f32]) {
    if width == dim {
        out.copy_from_slice(&chunk[skip * dim..]);
        return;
    }
    for (o, row) in out
        .chunks_exact_mut(dim)
        .zip(chunk[skip * width..].chunks_exact(width))
    {
        o.copy_from_slice(&row[..dim]);
    }
}

impl Policy for OnnxPolicy {
    fn name(&self) -> &str {
        &self.spec.name
    }

    fn chunk_spec(&self) -> ChunkSpec {
        ChunkSpec {
            len: self.spec.rows(),
            execute: self.spec.execute,
            dim: self.spec.action_dim,
        }
    }

    fn past_steps(&self) -> usize {
        self.past.len()
    }

    fn observe_past(&mut self, past: &[Observation]) {
        for (dst, src) in self.past.iter_mut().zip(past) {
            dst.copy_from(src);
        }
        self.past_given = past.len() >= self.past.len();
    }

    fn infer(&mut self, obs: &Observation, out: &mut [f32]) -> Result<(), PolicyError> {
        self.infer_chunk(obs, out)
    }

    fn infer_with_prefix(
        &mut self,
        obs: &Observation,
        prefix: &ChunkPrefix<'_>,
        out: &mut [f32],
    ) -> Result<(), PolicyError> {
        self.infer_chunk_with(obs, Some(prefix), out)
    }

    fn wants_prefix(&self) -> bool {
        self.rtc.cfg.enabled && self.spec.kind != PolicyKind::Chunk
    }
}
