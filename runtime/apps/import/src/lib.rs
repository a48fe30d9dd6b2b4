//! reflex-import: policies trained elsewhere made into reflex models. `reflex policy import
//! lerobot`: a LeRobot 0.6 checkpoint made into a reflex model, acting as LeRobot does.
//!
//! The order is the failure order a person wants: the checkpoint folder and the mapping onto the
//! robot are checked first, in Rust, in a second ([`checkpoint`], [`mapping`]); then the tools
//! environment is made if missing ([`tools_env`]); then LeRobot's own classes export the network
//! and report its normalisation (policies/import/lerobot_export.py, embedded); then reflex
//! writes the spec, loads the model for the robot and runs a chunk. All of it happens in a
//! temporary folder beside `--out`, and the files are renamed into place only when everything
//! passed: a failure leaves no model, spec or weights file behind.

pub mod checkpoint;
pub mod mapping;
pub mod tools_env;

use checkpoint::Checkpoint;
use mapping::Binding;
use reflex_policies::onnx_policy::{OnnxPolicy, RunOptions, check_graph, open_session};
use reflex_policies::spec::{
    DiffusionSpec, GraphIo, InputSource, Normalize, PolicyKind, PolicySpec, StatePrompt, spec_path,
};
use reflex_runtime::config::Validate;
use reflex_runtime::msg::RobotSpec;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::process::Command;
use tools_env::ToolsEnv;

/// Why an import stopped. Every message names the file, feature or option at fault and what to
/// do about it.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The checkpoint folder or one of its files.
    #[error("{path}: {message}")]
    Checkpoint {
        /// The file or folder.
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// Something the importer does not reproduce yet.
    #[error("{file}: {what} is not supported yet (reflex imports {supported})")]
    Unsupported {
        /// The file that says it.
        file: String,
        /// What it is.
        what: String,
        /// What is.
        supported: String,
    },
    /// A feature that does not map onto the robot.
    #[error("{0}")]
    Mapping(String),
    /// The robot to map onto.
    #[error("{0}")]
    Robot(String),
    /// The output path.
    #[error("--out {path}: {message}")]
    Out {
        /// The path given.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The tools environment could not be made.
    #[error(
        "the LeRobot tools environment {dir}: {message} (`make lerobot-tools` in a reflex checkout makes it by hand)"
    )]
    ToolsEnv {
        /// Its folder.
        dir: String,
        /// What failed.
        message: String,
    },
    /// The Python exporter refused or failed (its own message is on stderr above).
    #[error("exporting {checkpoint} with LeRobot failed: {message}")]
    Exporter {
        /// The checkpoint.
        checkpoint: String,
        /// What failed.
        message: String,
    },
    /// The exported model does not load or run in reflex.
    #[error("the exported model does not run in reflex: {0}")]
    Check(String),
    /// A file could not be written or moved.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The system's reason.
        source: std::io::Error,
    },
}

impl ImportError {
    fn checkpoint(path: &Path, message: impl Into<String>) -> Self {
        ImportError::Checkpoint {
            path: path.display().to_string(),
            message: message.into(),
        }
    }

    fn io(path: &Path, source: std::io::Error) -> Self {
        ImportError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

/// The robot the policy is mapped onto.
#[derive(Clone, Debug)]
pub enum RobotSource {
    /// A simulated robot, `sim/<task>`, with its cameras on.
    Kind(String),
    /// A robot spec as JSON (what `reflex sim spec` prints; a real robot serves its own on
    /// `reflex/<robot>/spec`).
    SpecFile(PathBuf),
}

impl RobotSource {
    /// The robot's spec.
    ///
    /// # Errors
    /// [`ImportError::Robot`] for a kind that cannot be described offline or a spec file that
    /// does not parse.
    pub fn spec(&self) -> Result<RobotSpec, ImportError> {
        match self {
            RobotSource::Kind(kind) => {
                let task = kind.strip_prefix("sim/").ok_or_else(|| {
                    ImportError::Robot(format!(
                        "--robot-kind {kind}: only simulated robots (sim/<task>) are described without the robot; \
                         for another give its spec with --robot-spec FILE"
                    ))
                })?;
                let task: reflex_sim::TaskKind =
                    task.parse().map_err(|e: reflex_sim::task::UnknownTask| {
                        ImportError::Robot(format!("--robot-kind {kind}: {e}"))
                    })?;
                let mut cfg = reflex_sim::SimConfig::for_task(task);
                cfg.cameras.enabled = true;
                let env = reflex_sim::SimEnv::new(cfg)
                    .map_err(|e| ImportError::Robot(format!("--robot-kind {kind}: {e}")))?;
                Ok(reflex_contracts::robot::Robot::spec(&env).clone())
            }
            RobotSource::SpecFile(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| ImportError::io(path, e))?;
                serde_json::from_str(&text).map_err(|e| {
                    ImportError::Robot(format!(
                        "--robot-spec {}: not a robot spec ({e}); `reflex sim spec --task pick` prints one",
                        path.display()
                    ))
                })
            }
        }
    }
}

/// What to import and where.
#[derive(Clone, Debug)]
pub struct ImportOptions {
    /// The checkpoint's `pretrained_model` folder.
    pub checkpoint: PathBuf,
    /// The model to write (`NAME.onnx`; the spec goes beside it as `NAME.policy.toml`).
    pub out: PathBuf,
    /// The robot the features map onto.
    pub robot: RobotSource,
    /// `(feature, robot name)`: a camera, or state fields separated by commas.
    pub maps: Vec<(String, String)>,
    /// The language instruction of a vision-language-action policy (`--task`).
    pub task: Option<String>,
    /// The tools environment's folder (default: [`ToolsEnv::locate`]).
    pub tools_env: Option<PathBuf>,
    /// The Python that makes the tools environment when it is missing.
    pub python: Option<PathBuf>,
    /// The command line, for the spec's `provenance`.
    pub command: String,
}

/// What an import wrote and measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ImportReport {
    /// The model.
    pub model: PathBuf,
    /// Its spec.
    pub spec: PathBuf,
    /// Every file written, the model and spec among them.
    pub files: Vec<PathBuf>,
    /// The tools environment used.
    pub tools_env: PathBuf,
    /// Whether this import made (or updated) it.
    pub made_tools_env: bool,
    /// LeRobot's version in it.
    pub lerobot_version: String,
    /// torch's.
    pub torch_version: String,
    /// The largest difference between ONNX Runtime's and torch's chunk on the exporter's check.
    pub onnx_vs_torch_max_abs: f64,
    /// Actions per chunk and executed per chunk.
    pub chunk_len: usize,
    /// Executed per chunk (`n_action_steps`).
    pub execute: usize,
    /// What the user should know that is not an error.
    pub notes: Vec<String>,
}

#[derive(Deserialize)]
struct ExportInput {
    feature: String,
    normalize: Normalize,
}

#[derive(Deserialize)]
struct ExportOutput {
    normalize: Normalize,
}

/// How a VLA's exporter says the instruction reaches its prefix graph.
#[derive(Deserialize)]
struct ExportLanguage {
    /// Graph inputs: the token ids and the attention mask.
    tokens_input: String,
    mask_input: String,
    /// The tokenizer file written beside the model (the VLM's own `tokenizer.json`).
    tokenizer: String,
    /// LeRobot's `tokenizer_max_length`: reflex pads to it (LeRobot pads to the longest in the
    /// batch; padded tokens are masked, so the actions are the same).
    max_len: usize,
    pad_id: i64,
    /// LeRobot's `NewLineTaskProcessorStep`: the task ends with a newline.
    newline: bool,
    /// pi0.5: the state feature written into the prompt at every chunk (no graph takes it).
    #[serde(default)]
    state_prompt: Option<String>,
}

fn one() -> usize {
    1
}

/// What policies/import/lerobot_export.py reports.
#[derive(Deserialize)]
struct ExportReport {
    lerobot_version: String,
    torch_version: String,
    /// `chunk` (ACT) or `diffusion` (the graph is the denoiser).
    kind: PolicyKind,
    chunk_size: usize,
    n_action_steps: usize,
    /// The chunk's row at the current observation (Diffusion Policy's `n_obs_steps - 1`).
    #[serde(default)]
    first_action: usize,
    /// Observation steps each input stacks (Diffusion Policy's `n_obs_steps`).
    #[serde(default = "one")]
    history: usize,
    temporal_ensemble_coeff: Option<f64>,
    graph: GraphIo,
    #[serde(default)]
    diffusion: Option<DiffusionSpec>,
    inputs: Vec<ExportInput>,
    output: ExportOutput,
    /// A flow policy's Euler steps (SmolVLA's `num_steps`).
    #[serde(default)]
    flow_steps: Option<usize>,
    /// The width the network samples (SmolVLA's `max_action_dim`), when wider than the action.
    #[serde(default)]
    model_action_dim: Option<usize>,
    /// A VLA's instruction input.
    #[serde(default)]
    language: Option<ExportLanguage>,
    /// The reduced variants a test built pi0 with (the exporter's `REFLEX_PI0_REDUCED`).
    #[serde(default)]
    reduced: Option<serde_json::Value>,
    opset: u32,
    files: Vec<String>,
    onnx_vs_torch_max_abs: f64,
}

/// `reflex policy import lerobot`: see the module's documentation. `progress` receives one line
/// per phase; pip's and the exporter's own output go to stderr.
///
/// # Errors
/// Any [`ImportError`]; nothing is left at `--out` then.
pub fn import_lerobot(
    o: &ImportOptions,
    progress: &dyn reflex_agent::progress::Progress,
) -> Result<ImportReport, ImportError> {
    let name = model_name(&o.out)?;
    let ckpt = Checkpoint::open(&o.checkpoint)?;
    let robot = o.robot.spec()?;
    let mut notes = vec![];
    let bindings = mapping::bind(&ckpt, &robot, &o.maps, &mut notes)?;
    let task = match (ckpt.takes_language(), &o.task) {
        (true, None) => {
            return Err(ImportError::Checkpoint {
                path: o.checkpoint.join("config.json").display().to_string(),
                message: format!(
                    "a `{}` policy acts on a language instruction: give it with --task \"...\" (e.g. --task \"pick up the cube\")",
                    ckpt.policy_type
                ),
            });
        }
        (false, Some(_)) => {
            notes.push(format!(
                "--task is ignored: a `{}` policy takes no instruction",
                ckpt.policy_type
            ));
            None
        }
        (_, t) => t.clone(),
    };

    let env = ToolsEnv::locate(o.tools_env.as_deref());
    let made_tools_env = !env.is_current();
    if made_tools_env {
        progress.line(&format!(
            "making the LeRobot tools environment {} (first use: LeRobot 0.6.1 and torch, about 5 GB; pip's output follows)",
            env.dir().display()
        ));
        env.create(o.python.as_deref())?;
    }

    let parent = match o.out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(|e| ImportError::io(&parent, e))?;
    // Beside the destination, so the final renames stay on one filesystem; removed on any error.
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}.import-"))
        .tempdir_in(&parent)
        .map_err(|e| ImportError::io(&parent, e))?;
    let staged = tmp.path().join("model");
    std::fs::create_dir(&staged).map_err(|e| ImportError::io(&staged, e))?;
    let report_path = tmp.path().join("export.json");
    let staged_model = staged.join(format!("{name}.onnx"));

    let report = export(&env, &ckpt, &staged_model, &report_path, progress)?;
    if let Some(c) = report.temporal_ensemble_coeff {
        notes.push(format!(
            "the checkpoint ensembles chunks in time (temporal_ensemble_coeff = {c}): run it with \
             [loop] chunks = {{ mode = \"ensemble\", m = {c} }} in the run config"
        ));
    }

    let spec = policy_spec(
        &name,
        &ckpt,
        (&robot, &bindings),
        &report,
        task.as_deref(),
        &o.command,
    )?;
    let staged_spec = spec_path(&staged_model);
    std::fs::write(&staged_spec, spec.to_toml()).map_err(|e| ImportError::io(&staged_spec, e))?;
    progress.line("loading the model in reflex for the robot and running one chunk");
    check_runs(&staged_model, &spec, &robot, &env)?;

    let moved = move_into_place(&report, &name, &staged, &parent)?;
    Ok(ImportReport {
        model: o.out.clone(),
        spec: spec_path(&o.out),
        files: moved,
        tools_env: env.dir().to_path_buf(),
        made_tools_env,
        lerobot_version: report.lerobot_version,
        torch_version: report.torch_version,
        onnx_vs_torch_max_abs: report.onnx_vs_torch_max_abs,
        chunk_len: spec.chunk_len,
        execute: spec.execute,
        notes,
    })
}

/// The model's name from `out`, which must be NAME.onnx.
fn model_name(out: &Path) -> Result<String, ImportError> {
    let out_err = |m: &str| ImportError::Out {
        path: out.display().to_string(),
        message: m.into(),
    };
    if out.extension().and_then(|e| e.to_str()) != Some("onnx") {
        return Err(out_err(
            "name the model file, NAME.onnx (its spec is written beside it as NAME.policy.toml)",
        ));
    }
    out.file_stem()
        .and_then(|s| s.to_str())
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .ok_or_else(|| out_err("the model's name is not valid text"))
}

/// Runs LeRobot's own classes in the tools environment to export the checkpoint's graph to
/// `staged_model`; returns the exporter's report.
fn export(
    env: &ToolsEnv,
    ckpt: &Checkpoint,
    staged_model: &Path,
    report_path: &Path,
    progress: &dyn reflex_agent::progress::Progress,
) -> Result<ExportReport, ImportError> {
    let script = report_path.with_file_name("lerobot_export.py");
    std::fs::write(&script, tools_env::EXPORTER).map_err(|e| ImportError::io(&script, e))?;
    progress.line(&format!(
        "exporting {} ({}) with LeRobot in {}",
        ckpt.dir.display(),
        ckpt.policy_type,
        env.dir().display()
    ));
    tools_env::run(
        Command::new(env.python())
            .arg(&script)
            .arg("--checkpoint")
            .arg(&ckpt.dir)
            .arg("--onnx")
            .arg(staged_model)
            .arg("--report")
            .arg(report_path),
        "the exporter (lerobot_export.py)",
    )
    .map_err(|message| ImportError::Exporter {
        checkpoint: ckpt.dir.display().to_string(),
        message,
    })?;
    std::fs::read_to_string(report_path)
        .map_err(|e| ImportError::io(report_path, e))
        .and_then(|t| {
            serde_json::from_str(&t).map_err(|e| ImportError::Exporter {
                checkpoint: ckpt.dir.display().to_string(),
                message: format!("its report {} does not parse: {e}", report_path.display()),
            })
        })
}

/// Moves the staged files into `parent`: the weights files, the spec, the model last (what
/// reflex opens first); on an error the files already moved are removed.
fn move_into_place(
    report: &ExportReport,
    name: &str,
    staged: &Path,
    parent: &Path,
) -> Result<Vec<PathBuf>, ImportError> {
    let mut names: Vec<String> = report
        .files
        .iter()
        .filter(|f| **f != format!("{name}.onnx"))
        .cloned()
        .collect();
    names.push(format!("{name}.policy.toml"));
    names.push(format!("{name}.onnx"));
    let mut moved: Vec<PathBuf> = vec![];
    for f in &names {
        let (from, to) = (staged.join(f), parent.join(f));
        if let Err(e) = std::fs::rename(&from, &to) {
            for m in &moved {
                let _ = std::fs::remove_file(m);
            }
            return Err(ImportError::io(&to, e));
        }
        moved.push(to);
    }
    Ok(moved)
}

/// The reflex spec of the exported graph: inputs named by LeRobot's feature keys, fed from the
/// bound state fields and cameras, normalised with the checkpoint's statistics by LeRobot's
/// formulas.
fn policy_spec(
    name: &str,
    ckpt: &Checkpoint,
    (robot, bindings): (&RobotSpec, &[Binding]),
    report: &ExportReport,
    task: Option<&str>,
    command: &str,
) -> Result<PolicySpec, ImportError> {
    let mut inputs = bound_inputs(ckpt, bindings, report)?;
    if let (Some(l), Some(task)) = (&report.language, task) {
        let mut instruction = task.to_string();
        if l.newline && !instruction.ends_with('\n') {
            instruction.push('\n');
        }
        // pi0.5 reads the state only through its prompt: the state input moves into it.
        let state_prompt = match &l.state_prompt {
            None => None,
            Some(feature) => {
                let at = inputs
                    .iter()
                    .position(|i| matches!(i, InputSource::State { name, .. } if name == feature));
                match at.map(|k| inputs.remove(k)) {
                    Some(InputSource::State {
                        fields, normalize, ..
                    }) => Some(StatePrompt { fields, normalize }),
                    _ => {
                        return Err(ImportError::Exporter {
                            checkpoint: ckpt.dir.display().to_string(),
                            message: format!(
                                "its report writes the state `{feature}` into the prompt, which is no state input of the checkpoint"
                            ),
                        });
                    }
                }
            }
        };
        inputs.push(InputSource::Language {
            name: l.tokens_input.clone(),
            tokenizer: PathBuf::from(&l.tokenizer),
            instruction,
            max_len: l.max_len,
            pad_id: l.pad_id,
            mask_input: Some(l.mask_input.clone()),
            state_prompt,
        });
    }
    let spec = PolicySpec {
        format: "reflex-policy".into(),
        version: 1,
        name: name.into(),
        kind: report.kind,
        action_dim: ckpt.action.numel(),
        chunk_len: report.chunk_size,
        execute: report.n_action_steps,
        first_action: report.first_action,
        model_action_dim: report.model_action_dim,
        robot_kind: Some(robot.kind.clone()),
        action_normalize: report.output.normalize.clone(),
        graph: report.graph.clone(),
        inputs,
        diffusion: report.diffusion.clone(),
        flow_steps: report.flow_steps.unwrap_or(10),
        provenance: Some(format!(
            "{command} (LeRobot {} `{}` checkpoint {}{}; exported by torch {} at opset {}, ONNX Runtime within {:.1e} of torch)",
            report.lerobot_version,
            ckpt.policy_type,
            ckpt.dir.display(),
            report.reduced.as_ref().map_or(String::new(), |r| format!(
                ", built with reduced variants {r}"
            )),
            report.torch_version,
            report.opset,
            report.onnx_vs_torch_max_abs
        )),
    };
    spec.validate("").map_err(|e| ImportError::Exporter {
        checkpoint: ckpt.dir.display().to_string(),
        message: format!(
            "the spec made from its report is invalid: `{}` = {} (allowed: {})",
            e.key, e.value, e.allowed
        ),
    })?;
    Ok(spec)
}

/// The spec's inputs for the features bound to the robot: named by LeRobot's feature keys,
/// normalised with the checkpoint's statistics.
fn bound_inputs(
    ckpt: &Checkpoint,
    bindings: &[Binding],
    report: &ExportReport,
) -> Result<Vec<InputSource>, ImportError> {
    let pre = ckpt.dir.join(checkpoint::PREPROCESSOR);
    let mut inputs = Vec::with_capacity(bindings.len() + 1);
    for b in bindings {
        let norm = report
            .inputs
            .iter()
            .find(|i| i.feature == b.feature())
            .map(|i| i.normalize.clone())
            .ok_or_else(|| ImportError::Exporter {
                checkpoint: ckpt.dir.display().to_string(),
                message: format!("its report has no input `{}`", b.feature()),
            })?;
        inputs.push(match b {
            Binding::State { feature, fields } => InputSource::State {
                name: feature.clone(),
                fields: fields.clone(),
                history: report.history,
                normalize: norm,
            },
            Binding::Image {
                feature,
                camera,
                width,
                height,
            } => {
                let (mean, std, eps) = match norm {
                    Normalize::None => ([0.0; 3], [1.0; 3], None),
                    Normalize::MeanStd { mean, std, eps } => {
                        match (<[f32; 3]>::try_from(mean), <[f32; 3]>::try_from(std)) {
                            (Ok(m), Ok(s)) => (m, s, eps),
                            _ => {
                                return Err(ImportError::checkpoint(
                                    &pre,
                                    format!("the statistics of `{feature}` are not one per colour channel"),
                                ));
                            }
                        }
                    }
                    Normalize::MinMax { .. } => {
                        return Err(ImportError::Unsupported {
                            file: pre.display().to_string(),
                            what: format!("min-max normalisation of image `{feature}`"),
                            supported: "mean/std or no normalisation of images".into(),
                        });
                    }
                };
                InputSource::Image {
                    name: feature.clone(),
                    camera: camera.clone(),
                    width: *width,
                    height: *height,
                    mean,
                    std,
                    eps,
                    history: report.history,
                }
            }
        });
    }
    Ok(inputs)
}

/// Loads the staged model for `robot` as `reflex run` would and runs one chunk on a neutral
/// observation (zero state, grey images): the graph, the spec and the robot agree, and the
/// actions are numbers.
fn check_runs(
    model: &Path,
    spec: &PolicySpec,
    robot: &RobotSpec,
    env: &ToolsEnv,
) -> Result<(), ImportError> {
    let check = |m: String| ImportError::Check(m);
    // A machine with only the tools environment has the same ONNX Runtime release in it.
    if reflex_policies::ort_env::find_onnxruntime().is_err()
        && let Some(lib) = env.onnxruntime()
    {
        reflex_policies::ort_env::init(&reflex_policies::ort_env::Found {
            path: lib,
            source: reflex_policies::ort_env::Source::Python,
        })
        .map_err(|e| check(e.to_string()))?;
    }
    let session = open_session(model, &RunOptions::default()).map_err(|e| check(e.to_string()))?;
    let problems = check_graph(spec, &session, Some(robot));
    if !problems.is_empty() {
        return Err(check(problems.join("; ")));
    }
    drop(session);
    let mut policy =
        OnnxPolicy::load(model, robot, &RunOptions::default()).map_err(|e| check(e.to_string()))?;
    // The loop's observation template, with mid-grey frames.
    let mut obs = reflex_agent::actor::obs_template(robot);
    for img in &mut obs.images {
        img.data.fill(128);
    }
    let mut chunk = vec![0.0f32; spec.rows() * spec.action_dim];
    policy
        .infer_chunk(&obs, &mut chunk)
        .map_err(|e| check(e.to_string()))?;
    if let Some(i) = chunk.iter().position(|v| !v.is_finite()) {
        return Err(check(format!(
            "action {} of a chunk on a neutral observation is {}",
            i, chunk[i]
        )));
    }
    Ok(())
}
