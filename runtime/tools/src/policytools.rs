//! What `reflex policy check|bench` and `reflex bc train` run.

use reflex_agent::progress::Progress;
use reflex_agent::{AgentError, error::Result};
use reflex_contracts::robot::Robot;
use reflex_learn::bc::{TrainConfig, make_samples, train};
use reflex_learn::vision::Frames;
use reflex_policies::onnx_policy::{
    OnnxPolicy, Provider, RunOptions, check_graph, graph_io, open_session,
};
use reflex_policies::spec::{PolicySpec, spec_path};
use reflex_sim::{SimConfig, SimEnv, TaskKind};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The robot a policy spec names (`sim/<task>`), to check and run it against.
pub fn robot_for(spec: &PolicySpec, cameras: bool) -> Result<Option<SimEnv>> {
    let Some(kind) = &spec.robot_kind else {
        return Ok(None);
    };
    let Some(task) = kind.strip_prefix("sim/") else {
        return Ok(None);
    };
    let task: TaskKind = task.parse().map_err(|e: reflex_sim::task::UnknownTask| {
        AgentError::setup("robot_kind", e.to_string())
    })?;
    let mut cfg = SimConfig::for_task(task);
    cfg.cameras.enabled = cameras;
    Ok(Some(SimEnv::new(cfg)?))
}

fn needs_cameras(spec: &PolicySpec) -> bool {
    spec.inputs
        .iter()
        .any(|i| matches!(i, reflex_policies::spec::InputSource::Image { .. }))
}

/// What `reflex policy check` found: the graph's inputs and outputs, and what it was checked
/// against.
#[derive(Clone, Debug)]
pub struct CheckReport {
    /// One line per input and output: name, element type, shape.
    pub lines: Vec<String>,
    /// The robot kind it was checked against, if the spec names one.
    pub robot_kind: Option<String>,
}

/// Checks a model against its spec (names, shapes, element types) and the robot it is for.
pub fn check(model: &Path) -> Result<CheckReport> {
    if !model.exists() {
        return Err(reflex_agent::error::bail(format!(
            "model `{}` does not exist",
            model.display()
        )));
    }
    let spec = PolicySpec::load_for(model)?;
    let session = open_session(model, &RunOptions::default())?;
    let robot = robot_for(&spec, needs_cameras(&spec))?;
    let (ins, outs) = graph_io(&session);
    let mut lines = vec![format!(
        "model {} ({:?}, chunk {} x {}, {} executed)",
        model.display(),
        spec.kind,
        spec.chunk_len,
        spec.action_dim,
        spec.execute
    )];
    for i in &ins {
        lines.push(format!(
            "  input  {:<16} {:<8} {:?}",
            i.name, i.elem, i.dims
        ));
    }
    for o in &outs {
        lines.push(format!(
            "  output {:<16} {:<8} {:?}",
            o.name, o.elem, o.dims
        ));
    }
    let problems = check_graph(&spec, &session, robot.as_ref().map(|r| r.spec()));
    if !problems.is_empty() {
        return Err(reflex_agent::error::bail(format!(
            "{}\nmodel `{}` does not match its spec `{}`:\n  - {}",
            lines.join("\n"),
            model.display(),
            spec_path(model).display(),
            problems.join("\n  - ")
        )));
    }
    if let Some(r) = &robot {
        // Loading for the robot checks the state fields, cameras and action space too.
        OnnxPolicy::load(model, r.spec(), &RunOptions::default())?;
    }
    Ok(CheckReport {
        lines,
        robot_kind: robot.map(|r| r.spec().kind.clone()),
    })
}

/// Percentile of already sorted values (nearest rank).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// What `reflex policy bench` measured: the latency of one whole chunk (every sampler step).
#[derive(Clone, Debug, serde::Serialize)]
pub struct PolicyBenchReport {
    /// The model.
    pub model: String,
    /// The execution provider.
    pub provider: String,
    /// ONNX Runtime's intra-op threads.
    pub intra_threads: usize,
    /// Network evaluations per chunk (sampler steps; 1 for a plain chunk policy).
    pub network_calls_per_chunk: u32,
    /// Chunks timed.
    pub iters: usize,
    /// Median chunk latency, µs.
    pub p50_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// Slowest chunk, µs.
    pub max_us: f64,
}

/// `reflex policy bench`: per-chunk latency (all sampler steps) on a provider.
pub fn bench(
    model: &Path,
    provider: &str,
    threads: usize,
    iters: usize,
) -> Result<PolicyBenchReport> {
    let spec = PolicySpec::load_for(model)?;
    let mut robot = robot_for(&spec, needs_cameras(&spec))?.ok_or_else(|| {
        AgentError::setup(
            format!("spec of `{}`", model.display()),
            "policy bench needs robot_kind = \"sim/<task>\" to make observations",
        )
    })?;
    let provider = Provider::parse(provider)?;
    let opts = RunOptions {
        provider,
        intra_threads: threads,
        seed: 0,
    };
    let mut policy = OnnxPolicy::load(model, robot.spec(), &opts)?;
    let obs = robot.reset(Some(1))?.clone();
    let mut out = vec![0.0f32; spec.chunk_len * spec.action_dim];
    for _ in 0..20 {
        policy.infer_chunk(&obs, &mut out)?;
    }
    let mut lat = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t0 = Instant::now();
        policy.infer_chunk(&obs, &mut out)?;
        lat.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    lat.sort_by(|x, y| x.total_cmp(y));
    let calls = match spec.kind {
        reflex_policies::spec::PolicyKind::Diffusion => {
            spec.diffusion.clone().unwrap_or_default().inference_steps
        }
        reflex_policies::spec::PolicyKind::Flow => spec.flow_steps,
        reflex_policies::spec::PolicyKind::Chunk => 1,
    };
    Ok(PolicyBenchReport {
        model: model.display().to_string(),
        provider: opts.provider.name().into(),
        intra_threads: threads,
        network_calls_per_chunk: calls as u32,
        iters,
        p50_us: percentile(&lat, 50.0),
        p99_us: percentile(&lat, 99.0),
        max_us: lat.last().copied().unwrap_or(f64::NAN),
    })
}

/// Writes a model and its spec atomically.
pub fn write_model(out: &Path, onnx: &[u8], spec: &PolicySpec) -> Result<()> {
    if let Some(d) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(d).map_err(|e| AgentError::io(d, e))?;
    }
    reflex_runtime::fsio::atomic_write(out, onnx).map_err(|e| AgentError::io(out, e))?;
    let sp = spec_path(out);
    reflex_runtime::fsio::atomic_write(&sp, spec.to_toml().as_bytes())
        .map_err(|e| AgentError::io(&sp, e))?;
    Ok(())
}

/// Where `reflex bc train` reads its episodes.
#[derive(Clone, Debug)]
pub enum TrainSource {
    /// A directory written by `reflex sim demos`.
    Demos(PathBuf),
    /// A LeRobotDataset v3.0 directory, and the state and action features to train on.
    LeRobot {
        /// The dataset's root (with `meta/info.json`).
        dir: PathBuf,
        /// State feature (default `observation.state`).
        state_key: String,
        /// Action feature (default `action`).
        action_key: String,
    },
}

/// What `reflex bc train` asks for.
#[derive(Clone, Debug)]
pub struct TrainOptions {
    /// The episodes.
    pub source: TrainSource,
    /// Output model (its spec is written beside it).
    pub out: PathBuf,
    /// Use only the first N episodes.
    pub episodes: Option<usize>,
    /// The robot kind to write into the spec instead of the episodes' own.
    pub robot_kind: Option<String>,
    /// The network and optimiser settings.
    pub cfg: TrainConfig,
    /// State fields the policy reads (empty: all of them); reflex's demos only.
    pub state_fields: Vec<String>,
    /// Cameras the policy reads, each through its own encoder; reflex's demos only.
    pub cameras: Vec<String>,
    /// Size the policy reads images at, (width, height) (default: the recorded size).
    pub image_size: Option<(u32, u32)>,
    /// The command that trains it (recorded as the model's provenance).
    pub command: String,
}

/// What training produced.
#[derive(Clone, Debug)]
pub struct TrainReport {
    /// The model written.
    pub model: PathBuf,
    /// Its spec.
    pub spec: PathBuf,
    /// Final loss.
    pub final_loss: f32,
    /// Wall time, s.
    pub wall_s: f64,
}

/// Trains a diffusion policy on recorded episodes and exports it to ONNX with its spec.
pub fn bc_train(o: &TrainOptions, progress: &dyn Progress) -> Result<TrainReport> {
    // The episodes, the action size, the robot kind and where they came from.
    let mut frames = None;
    let (mut eps, action_dim, kind, origin) = match &o.source {
        TrainSource::Demos(dir) => {
            let m = reflex_data::demos::read_manifest(dir)?;
            let take = o.episodes.unwrap_or(m.episodes.len()).min(m.episodes.len());
            let ranges = state_ranges(&m.spec, &o.state_fields, dir)?;
            let mut eps = vec![];
            for e in &m.episodes[..take] {
                let ep = reflex_data::demos::read_episode(dir, e)?;
                if !o.cameras.is_empty() {
                    add_frames(&mut frames, &ep, &o.cameras, o.image_size, dir, e)?;
                }
                let obs = match &ranges {
                    Some(r) => ep
                        .observations
                        .iter()
                        .map(|s| {
                            r.iter()
                                .flat_map(|r| s[r.clone()].iter().copied())
                                .collect()
                        })
                        .collect(),
                    None => ep.observations,
                };
                eps.push((obs, ep.actions));
            }
            let origin = format!("demos {}: {}", dir.display(), m.command);
            (eps, m.spec.action.dim(), Some(m.spec.kind.clone()), origin)
        }
        TrainSource::LeRobot { dir, .. } if !o.cameras.is_empty() || !o.state_fields.is_empty() => {
            return Err(reflex_agent::error::bail(format!(
                "{}: --camera and --state-fields read reflex's demos (--demos); a LeRobot dataset's \
                 state is one feature (--state-key) and its video features are not read yet",
                dir.display()
            )));
        }
        TrainSource::LeRobot {
            dir,
            state_key,
            action_key,
        } => {
            let d = reflex_data::dataset::read_lerobot(dir, state_key, action_key)?;
            let origin = format!(
                "LeRobot dataset {} ({state_key} -> {action_key})",
                dir.display()
            );
            (d.episodes, d.action_dim, d.robot_type, origin)
        }
    };
    let kind = o.robot_kind.clone().or(kind);
    eps.truncate(o.episodes.unwrap_or(eps.len()));
    let take = eps.len();
    let samples = make_samples(&eps, o.cfg.horizon);
    let name = o
        .out
        .file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_else(|| "policy".into());
    tracing::info!(
        "training `{name}` on {take} episodes ({} samples{}) from {origin}",
        samples.len(),
        frames.as_ref().map_or(String::new(), |f| format!(
            ", cameras {:?} at {}x{}",
            f.cameras, f.width, f.height
        )),
    );
    progress.start(o.cfg.steps as u64, "steps");
    let t0 = Instant::now();
    let mut last = 0u64;
    let mut trained = train(
        &samples,
        frames.as_ref(),
        action_dim,
        &o.cfg,
        &name,
        o.state_fields.clone(),
        kind,
        |step, loss| {
            progress.inc(step as u64 - last.min(step as u64));
            last = step as u64;
            progress.message(&format!("loss {loss:.4}"));
        },
    )?;
    progress.finish();
    trained.spec.provenance = Some(format!(
        "{} ({origin}; {take} episodes, {} samples; trained in {:.0} s)",
        o.command,
        samples.len(),
        t0.elapsed().as_secs_f64()
    ));
    let onnx = trained.net.to_onnx()?;
    write_model(&o.out, &onnx, &trained.spec)?;
    Ok(TrainReport {
        model: o.out.clone(),
        spec: spec_path(&o.out),
        final_loss: trained.losses.last().copied().unwrap_or(f32::NAN),
        wall_s: t0.elapsed().as_secs_f64(),
    })
}

/// The ranges of `fields` in the demos' state vector (`None`: all of it); an unknown field is
/// named with the ones there are.
fn state_ranges(
    spec: &reflex_runtime::msg::RobotSpec,
    fields: &[String],
    dir: &Path,
) -> Result<Option<Vec<std::ops::Range<usize>>>> {
    if fields.is_empty() {
        return Ok(None);
    }
    let ranges = fields
        .iter()
        .map(|f| {
            spec.field(f).ok_or_else(|| {
                reflex_agent::error::bail(format!(
                    "{}: the demos' state has no field `{f}`; it has {:?}",
                    dir.display(),
                    spec.state.iter().map(|s| &s.name).collect::<Vec<_>>()
                ))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Some(ranges))
}

/// Appends an episode's frames of `cameras` to `frames`, one per step that has an action (the
/// samples `make_samples` cuts); the first episode fixes the size unless `size` does.
fn add_frames(
    frames: &mut Option<Frames>,
    ep: &reflex_data::demos::Episode,
    cameras: &[String],
    size: Option<(u32, u32)>,
    dir: &Path,
    entry: &reflex_data::demos::EpisodeEntry,
) -> Result<()> {
    if ep.actions.is_empty() {
        return Ok(());
    }
    let streams = cameras
        .iter()
        .map(|c| {
            ep.cameras.iter().find(|s| &s.camera == c).ok_or_else(|| {
                reflex_agent::error::bail(format!(
                    "{}: episode {} has no frames of camera `{c}` (it has {:?}); record with \
                     `reflex sim demos --cameras`",
                    dir.join(&entry.file).display(),
                    entry.index,
                    ep.cameras.iter().map(|s| &s.camera).collect::<Vec<_>>()
                ))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let f = frames.get_or_insert_with(|| {
        let (w, h) = size.unwrap_or((streams[0].width, streams[0].height));
        Frames {
            cameras: cameras.to_vec(),
            width: w as usize,
            height: h as usize,
            data: vec![],
        }
    });
    for t in 0..ep.actions.len() {
        let images: Vec<_> = streams.iter().map(|s| s.image(t)).collect();
        f.push(&images);
    }
    Ok(())
}
