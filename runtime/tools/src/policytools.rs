//! What `reflex policy check|bench` and `reflex bc train` run.

use reflex_agent::progress::Progress;
use reflex_agent::{AgentError, error::Result};
use reflex_contracts::robot::Robot;
use reflex_imitate::{BcError, TrainConfig, make_samples, train};
use reflex_policies::onnx_policy::{
    OnnxPolicy, Provider, RunOptions, check_graph, graph_io, open_session,
};
use reflex_policies::spec::{PolicySpec, spec_path};
use reflex_runtime::hist::percentile;
use reflex_sim::{SimConfig, SimEnv, TaskKind};
use reflex_vision::encoder::Frames;
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
    reflex_policies::onnx_policy::model_file(model)?;
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
    let mut problems = check_graph(&spec, &session, robot.as_ref().map(|r| r.spec()));
    // A training that diverged leaves NaN weights: the graph matches, every action is NaN.
    // Weights in external data files beside the model are read too.
    match reflex_policies::onnx_read::float_initializers_of_file(model) {
        Ok(inits) => {
            let mut bad: Vec<&String> = inits
                .iter()
                .filter(|(_, t)| t.data.iter().any(|v| !v.is_finite()))
                .map(|(name, _)| name)
                .collect();
            bad.sort();
            if !bad.is_empty() {
                problems.push(format!(
                    "weights {bad:?} hold NaN or infinite values (a training that diverged): train it again"
                ));
            }
            let external = reflex_policies::onnx_read::external_files(
                &std::fs::read(model).map_err(|e| AgentError::io(model, e))?,
            )
            .unwrap_or_default();
            if !external.is_empty() {
                lines.push(format!(
                    "  weights kept in {external:?} beside it (read and checked)"
                ));
            }
        }
        Err(e) => lines.push(format!("  weights not checked for NaN: {e}")),
    }
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
    /// With `--rtc`: the same chunks sampled by real-time chunking, timed alternately with the
    /// plain ones in the same run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rtc: Option<RtcTiming>,
}

/// Per-chunk latency of real-time chunking beside plain sampling.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RtcTiming {
    /// The sampler that ran (`guided`: with the model's VJP graph; `hard`: inpainting).
    pub variant: reflex_policies::rtc::RtcVariant,
    /// Rows of the previous chunk the new one overlaps, and of them frozen (the delay).
    pub overlap_rows: usize,
    /// Frozen rows.
    pub delay_rows: usize,
    /// Median chunk latency, µs.
    pub p50_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// Slowest chunk, µs.
    pub max_us: f64,
    /// Median over the plain chunk's median.
    pub p50_over_plain: f64,
}

/// `reflex policy bench`: per-chunk latency (all sampler steps) on a provider; with `rtc`
/// (`Some(guided)`), real-time chunking's chunks too, alternating with the plain ones, with the
/// policy's own previous chunk as the executing one (overlap `chunk_len - execute` rows, delay
/// half of it, at least one).
pub fn bench(
    model: &Path,
    provider: &str,
    threads: usize,
    iters: usize,
    rtc: Option<bool>,
) -> Result<PolicyBenchReport> {
    reflex_policies::onnx_policy::model_file(model)?;
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
        execute: None,
    };
    let mut policy = OnnxPolicy::load(model, robot.spec(), &opts)?;
    let obs = robot.reset(Some(1))?.clone();
    let mut out = vec![0.0f32; spec.chunk_len * spec.action_dim];
    for _ in 0..20 {
        policy.infer_chunk(&obs, &mut out)?;
    }
    let overlap = spec.chunk_len - spec.execute;
    let delay = (overlap / 2).max(1).min(overlap);
    if rtc.is_some() {
        if spec.kind == reflex_policies::spec::PolicyKind::Chunk || overlap == 0 {
            return Err(AgentError::setup(
                "reflex policy bench --rtc",
                format!(
                    "`{}` is a chunk policy or executes its whole chunk (execute = chunk_len): real-time chunking has nothing to inpaint",
                    model.display()
                ),
            ));
        }
        if rtc == Some(true) && !policy.has_vjp() {
            return Err(AgentError::setup(
                "reflex policy bench --rtc guided",
                format!(
                    "`{}` has no VJP graph ([graph.vjp] in its spec; `reflex bc train --objective flow` writes one): time `--rtc hard`",
                    model.display()
                ),
            ));
        }
        policy.set_rtc(reflex_policies::rtc::RtcConfig {
            enabled: true,
            guidance: rtc == Some(true),
            ..Default::default()
        });
    }
    // The executing chunk: the policy's own, shifted by what was executed.
    let dim = spec.action_dim;
    let mut executing = vec![0.0f32; out.len()];
    executing[..overlap * dim].copy_from_slice(&out[spec.execute * dim..]);
    let mut rtc_out = vec![0.0f32; out.len()];
    let mut variant = None;
    let (mut lat, mut rtc_lat) = (Vec::with_capacity(iters), vec![]);
    for _ in 0..iters {
        let t0 = Instant::now();
        policy.infer_chunk(&obs, &mut out)?;
        lat.push(t0.elapsed().as_secs_f64() * 1e6);
        if rtc.is_some() {
            let prefix = reflex_runtime::policy::ChunkPrefix {
                actions: &executing,
                covered: overlap,
                delay,
            };
            let t0 = Instant::now();
            policy.infer_chunk_with(&obs, Some(&prefix), &mut rtc_out)?;
            rtc_lat.push(t0.elapsed().as_secs_f64() * 1e6);
            variant = policy.rtc_variant();
        }
    }
    lat.sort_by(|x, y| x.total_cmp(y));
    rtc_lat.sort_by(|x, y| x.total_cmp(y));
    let plain_p50 = percentile(&lat, 50.0);
    let rtc = variant.map(|variant| RtcTiming {
        variant,
        overlap_rows: overlap,
        delay_rows: delay,
        p50_us: percentile(&rtc_lat, 50.0),
        p99_us: percentile(&rtc_lat, 99.0),
        max_us: rtc_lat.last().copied().unwrap_or(f64::NAN),
        p50_over_plain: percentile(&rtc_lat, 50.0) / plain_p50,
    });
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
        p50_us: plain_p50,
        p99_us: percentile(&lat, 99.0),
        max_us: lat.last().copied().unwrap_or(f64::NAN),
        rtc,
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
    /// Use only the episodes of these indices (reflex's demos and step logs).
    pub only: Option<Vec<u64>>,
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
    /// A flow policy's vector-Jacobian-product graph (`<model>.vjp.onnx`, named in the spec).
    pub vjp: Option<PathBuf>,
    /// A policy that sees: its image encoder's convolutions as a frozen encoder file
    /// (`<model>.encoder.onnx`), the features a learner that sees reads.
    pub encoder: Option<PathBuf>,
    /// Final loss.
    pub final_loss: f32,
    /// Wall time, s.
    pub wall_s: f64,
}

/// Trains a diffusion or flow policy on recorded episodes and exports it to ONNX with its spec.
pub fn bc_train(o: &TrainOptions, progress: &dyn Progress) -> Result<TrainReport> {
    // The episodes, the action size, the robot kind and where they came from.
    let mut frames = None;
    let (mut eps, action_dim, kind, origin) = match &o.source {
        TrainSource::Demos(dir) => demos_episodes(o, dir, &mut frames)?,
        TrainSource::LeRobot { dir, .. } if !o.state_fields.is_empty() => {
            return Err(reflex_agent::error::bail(format!(
                "{}: --state-fields reads reflex's demos (--demos); a LeRobot dataset's state is \
                 one feature (--state-key)",
                dir.display()
            )));
        }
        TrainSource::LeRobot {
            dir,
            state_key,
            action_key,
        } => {
            let mut d = reflex_data::dataset::read_lerobot(dir, state_key, action_key)?;
            d.episodes.truncate(o.episodes.unwrap_or(d.episodes.len()));
            if !o.cameras.is_empty() {
                frames = Some(lerobot_frames(dir, &o.cameras, o.image_size, &d.episodes)?);
            }
            let origin = format!(
                "LeRobot dataset {} ({state_key}{} -> {action_key})",
                dir.display(),
                o.cameras
                    .iter()
                    .map(|c| format!(", camera {c}"))
                    .collect::<String>()
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
    // A flow policy's VJP graph goes first: the spec that names it is written last.
    let vjp = write_vjp(&mut trained, &o.out)?;
    write_model(&o.out, &onnx, &trained.spec)?;
    let encoder = write_encoder(&trained, &o.out, &name)?;
    Ok(TrainReport {
        model: o.out.clone(),
        spec: spec_path(&o.out),
        vjp,
        encoder,
        final_loss: trained.losses.last().copied().unwrap_or(f32::NAN),
        wall_s: t0.elapsed().as_secs_f64(),
    })
}

/// The episodes of reflex's demos in `dir` (the state fields `o` names, and the frames of its
/// cameras into `frames`), the action size, the robot kind and where they came from.
fn demos_episodes(
    o: &TrainOptions,
    dir: &Path,
    frames: &mut Option<Frames>,
) -> Result<(
    Vec<reflex_imitate::EpisodeData>,
    usize,
    Option<String>,
    String,
)> {
    let m = reflex_data::demos::read_manifest(dir)?;
    let take = o.episodes.unwrap_or(m.episodes.len()).min(m.episodes.len());
    let ranges = state_ranges(&m.spec, &o.state_fields, dir)?;
    let mut eps = vec![];
    let chosen = m.episodes[..take]
        .iter()
        .filter(|e| o.only.as_ref().is_none_or(|k| k.contains(&e.index)));
    for e in chosen {
        let ep = reflex_data::demos::read_episode(dir, e)?;
        if !o.cameras.is_empty() && !ep.actions.is_empty() {
            if !ep.frame_observations.is_empty() {
                return Err(reflex_agent::error::bail(format!(
                    "{}: episode {} kept camera frames at some steps only (a run's step \
                     log above 15 Hz); behaviour cloning needs the frame of every step: \
                     record with `reflex sim demos --cameras`, or export the run with \
                     `reflex dataset export` and train from the dataset",
                    dir.join(&e.file).display(),
                    e.index
                )));
            }
            let f = add_frames(frames, &ep, &o.cameras, o.image_size, dir, e)?;
            // One frame per sample: the observations that have an action.
            f.truncate_to(f.len() - 1);
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
    Ok((eps, m.spec.action.dim(), Some(m.spec.kind.clone()), origin))
}

/// A flow policy's VJP graph beside `out`, named in its spec (`None`: not a flow policy).
fn write_vjp(trained: &mut reflex_imitate::Trained, out: &Path) -> Result<Option<PathBuf>> {
    if trained.spec.kind != reflex_policies::spec::PolicyKind::Flow {
        return Ok(None);
    }
    let path = reflex_policies::spec::vjp_path_for(out);
    let bytes = trained.net.to_onnx_vjp()?;
    reflex_runtime::fsio::atomic_write(&path, &bytes).map_err(|e| AgentError::io(&path, e))?;
    trained.spec.graph.vjp = Some(reflex_policies::spec::VjpGraph {
        file: path
            .file_name()
            .map(|f| f.to_string_lossy().to_string())
            .unwrap_or_default(),
        cotangent_input: "cotangent".into(),
        output: "vjp".into(),
    });
    Ok(Some(path))
}

/// The frozen image encoder of a policy that sees, beside `out` with its spec (`None`: it sees
/// nothing).
fn write_encoder(
    trained: &reflex_imitate::Trained,
    out: &Path,
    name: &str,
) -> Result<Option<PathBuf>> {
    if trained.net.encoders().is_empty() {
        return Ok(None);
    }
    let path = reflex_policies::features::encoder_path_for(out);
    let (bytes, spec) = reflex_vision::encoder::frozen_encoder(
        trained.net.encoders(),
        &format!("{name}.encoder"),
        Some(format!("the image encoder of `{}`, frozen", out.display())),
    )
    .map_err(BcError::from)?;
    reflex_runtime::fsio::atomic_write(&path, &bytes).map_err(|e| AgentError::io(&path, e))?;
    let sp = reflex_policies::features::encoder_spec_path(&path);
    reflex_runtime::fsio::atomic_write(&sp, spec.to_toml().as_bytes())
        .map_err(|e| AgentError::io(&sp, e))?;
    Ok(Some(path))
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

/// Appends an episode's frames of `cameras` to `frames` (one per observation, or one per entry of
/// its `frame_observations`); the first episode fixes the size unless `size` does.
fn add_frames<'a>(
    frames: &'a mut Option<Frames>,
    ep: &reflex_data::demos::Episode,
    cameras: &[String],
    size: Option<(u32, u32)>,
    dir: &Path,
    entry: &reflex_data::demos::EpisodeEntry,
) -> Result<&'a mut Frames> {
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
    for t in 0..ep.frame_count() {
        let images: Vec<_> = streams.iter().map(|s| s.image(t)).collect();
        f.push(&images);
    }
    Ok(f)
}

/// The frames of `cameras` from a LeRobot dataset's video features, one per frame of `eps` (the
/// dataset's rows, episode by episode); every episode must have as many frames as rows.
fn lerobot_frames(
    dir: &Path,
    cameras: &[String],
    size: Option<(u32, u32)>,
    eps: &[reflex_data::dataset::EpisodeData],
) -> Result<Frames> {
    let mut frames: Option<Frames> = None;
    for (c, camera) in cameras.iter().enumerate() {
        let mut per_episode = vec![0usize; eps.len()];
        let key = reflex_data::videos::read_camera(dir, camera, eps.len(), |e, rgb, w, h| {
            let f = frames.get_or_insert_with(|| {
                let (fw, fh) = size.unwrap_or((w, h));
                Frames {
                    cameras: cameras.to_vec(),
                    width: fw as usize,
                    height: fh as usize,
                    data: vec![],
                }
            });
            let image = reflex_runtime::msg::Image {
                camera: camera.clone(),
                width: w,
                height: h,
                encoding: "rgb8".into(),
                data: rgb.to_vec(),
                seq: 0,
                age_ns: 0,
            };
            f.push_camera(c, &image);
            per_episode[e] += 1;
            Ok(())
        })?;
        if let Some(e) = (0..eps.len()).find(|e| per_episode[*e] != eps[*e].0.len()) {
            return Err(reflex_agent::error::bail(format!(
                "{}: episode {e} has {} frames of `{key}` and {} rows of data",
                dir.display(),
                per_episode[e],
                eps[e].0.len()
            )));
        }
    }
    frames.ok_or_else(|| reflex_agent::error::bail(format!("{}: no frames", dir.display())))
}

/// What `reflex reward train` asks for.
#[derive(Clone, Debug)]
pub struct RewardTrainOptions {
    /// Where the labelled frames come from.
    pub source: RewardSource,
    /// Cameras the classifier reads.
    pub cameras: Vec<String>,
    /// Size it reads images at, (width, height) (default: the recorded size).
    pub image_size: Option<(u32, u32)>,
    /// Fraction of the episodes (the last ones) held out to judge it.
    pub holdout: f64,
    /// Probability at or above which a frame counts as success.
    pub threshold: f32,
    /// Training settings.
    pub cfg: reflex_vision::reward::RewardTrainConfig,
    /// Output model (its spec is written beside it as `<name>.reward.toml`).
    pub out: PathBuf,
    /// The command that trains it (recorded as its provenance).
    pub command: String,
}

/// Where `reflex reward train` finds labelled frames.
#[derive(Clone, Debug)]
pub enum RewardSource {
    /// A directory written by `reflex sim demos --cameras`: labels from the task's success.
    Demos(PathBuf),
    /// Recorded runs: a run directory (`runs/<id>`, its step log in `steps/`) or a directory of
    /// them (`runs/`), written by `reflex run --record` with cameras. Labels from each step's
    /// reward and each episode's end: the person's success or failure key where one was pressed,
    /// else the robot's (or a classifier's) verdict.
    Runs(PathBuf),
}

impl RewardSource {
    /// The episode directories (each a manifest and its episode files), in order.
    pub fn episode_dirs(&self) -> Result<Vec<PathBuf>> {
        let runs = match self {
            RewardSource::Demos(d) => return Ok(vec![d.clone()]),
            RewardSource::Runs(d) => d,
        };
        let has_log = |d: &Path| d.join("steps").join("manifest.json").is_file();
        if has_log(runs) {
            return Ok(vec![runs.join("steps")]);
        }
        let entries = std::fs::read_dir(runs).map_err(|e| {
            reflex_agent::error::bail(format!(
                "--runs {}: {e}; name one run (runs/<id>) or a directory of runs (runs/)",
                runs.display()
            ))
        })?;
        let mut dirs: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|d| has_log(d))
            .map(|d| d.join("steps"))
            .collect();
        dirs.sort();
        if dirs.is_empty() {
            return Err(reflex_agent::error::bail(format!(
                "{}: no run with a step log here (a run keeps one in <run>/steps/ when it is \
                 recorded with cameras: `reflex run --record DIR`)",
                runs.display()
            )));
        }
        Ok(dirs)
    }

    /// The directory named on the command line.
    pub fn dir(&self) -> &Path {
        match self {
            RewardSource::Demos(d) | RewardSource::Runs(d) => d,
        }
    }
}

/// Frames and how many of them show success.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct FrameCount {
    /// Episodes.
    pub episodes: usize,
    /// Frames.
    pub frames: usize,
    /// Frames labelled success.
    pub successes: usize,
}

/// What training the classifier produced and how it did on the held-out episodes.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RewardTrainReport {
    /// The model written.
    pub model: PathBuf,
    /// Its spec.
    pub spec: PathBuf,
    /// What it trained on.
    pub train: FrameCount,
    /// What it was judged on.
    pub held_out: FrameCount,
    /// The held-out frames' confusion counts at the threshold.
    pub confusion: reflex_vision::reward::Confusion,
    /// Held-out accuracy.
    pub accuracy: f64,
    /// Held-out precision (success calls that were right).
    pub precision: f64,
    /// Held-out recall (success frames found).
    pub recall: f64,
    /// Of the false positives, those at most [`NEAR_FRAMES`] frames before a success frame of
    /// the same episode: the task all but done (a success that ends an episode labels one frame,
    /// and the frames just before it look alike).
    pub false_positives_near_success: u64,
    /// The threshold.
    pub threshold: f32,
    /// Mean loss of the last 100 steps.
    pub final_loss: f32,
    /// Wall time, s.
    pub wall_s: f64,
}

/// How close before a success frame a false positive counts as "near" it.
pub const NEAR_FRAMES: usize = 2;

/// Whether each observation of `ep` shows success: the one after a step that the task rewarded
/// (the simulator's sparse reward is 1 on success), or the last of a successful episode; a
/// person's success or failure key at the end decides the last one.
pub fn success_labels(ep: &reflex_data::demos::Episode) -> Vec<bool> {
    let last = ep.observations.len().saturating_sub(1);
    (0..ep.observations.len())
        .map(|i| match ep.person_label {
            Some(label) if i == last => label,
            _ => {
                (i >= 1 && ep.rewards.get(i - 1).is_some_and(|r| *r >= 1.0))
                    || (i == last && ep.success)
            }
        })
        .collect()
}

/// Trains a success classifier on recorded frames, judges it on held-out episodes, and exports
/// it to ONNX with its spec.
pub fn reward_train(o: &RewardTrainOptions, progress: &dyn Progress) -> Result<RewardTrainReport> {
    let t0 = Instant::now();
    check_reward_options(o)?;
    let LabelledFrames {
        train_f,
        held_f,
        train_y,
        held_y,
        held_near,
        train_eps,
        held_eps,
        n_held,
        commands,
    } = read_labelled(o)?;
    let count = |f: &Option<Frames>, y: &[bool], episodes| FrameCount {
        episodes,
        frames: f.as_ref().map_or(0, |f| f.len()),
        successes: y.iter().filter(|&&l| l).count(),
    };
    let (train_c, held_c) = (
        count(&train_f, &train_y, train_eps),
        count(&held_f, &held_y, held_eps),
    );
    let train_f = train_f.ok_or_else(|| {
        reflex_agent::error::bail(format!(
            "{}: no episodes with frames to train on",
            o.source.dir().display()
        ))
    })?;
    if train_c.successes == 0 || train_c.successes == train_c.frames {
        return Err(reflex_agent::error::bail(format!(
            "{}: the {} training episodes (the last {n_held} are held out) give {} success \
             and {} failure frames; a classifier needs both: record more episodes, with \
             successes and failures, or hold out fewer (--holdout)",
            o.source.dir().display(),
            train_c.episodes,
            train_c.successes,
            train_c.frames - train_c.successes
        )));
    }
    tracing::info!(
        "training a success classifier on {} frames ({} success) of {} episodes, cameras {:?} at {}x{}; {} episodes held out",
        train_c.frames,
        train_c.successes,
        train_c.episodes,
        train_f.cameras,
        train_f.width,
        train_f.height,
        n_held
    );
    progress.start(o.cfg.steps as u64, "steps");
    let mut final_loss = f32::NAN;
    let mut last = 0u64;
    let net = reflex_vision::reward::train(&train_f, &train_y, &o.cfg, |step, loss| {
        progress.inc(step as u64 - last.min(step as u64));
        last = step as u64;
        progress.message(&format!("loss {loss:.4}"));
        final_loss = loss;
    })
    .map_err(BcError::from)?;
    progress.finish();
    let probs = match &held_f {
        Some(h) => probabilities(&net, h)?,
        None => vec![],
    };
    let confusion = reflex_vision::reward::Confusion::of(&probs, &held_y, o.threshold);
    let near = probs
        .iter()
        .zip(&held_near)
        .filter(|(p, n)| **p >= o.threshold && **n)
        .count() as u64;
    let name = o
        .out
        .file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_else(|| "reward".into());
    let mut spec = net.spec(&name, o.threshold);
    spec.provenance = Some(provenance(
        o,
        &commands,
        (&train_c, &held_c),
        &confusion,
        near,
        t0.elapsed().as_secs_f64(),
    ));
    let sp = write_classifier(&o.out, &net, &spec)?;
    Ok(RewardTrainReport {
        model: o.out.clone(),
        spec: sp,
        train: train_c,
        held_out: held_c,
        confusion,
        accuracy: confusion.accuracy(),
        precision: confusion.precision(),
        recall: confusion.recall(),
        false_positives_near_success: near,
        threshold: o.threshold,
        final_loss,
        wall_s: t0.elapsed().as_secs_f64(),
    })
}

/// The classifier's options that cannot work, refused before anything is read.
fn check_reward_options(o: &RewardTrainOptions) -> Result<()> {
    if o.cameras.is_empty() {
        return Err(reflex_agent::error::bail(
            "name the camera(s) the classifier reads: --camera NAME".into(),
        ));
    }
    if !(0.0..1.0).contains(&o.holdout) {
        return Err(reflex_agent::error::bail(format!(
            "--holdout {} is not a fraction in [0, 1)",
            o.holdout
        )));
    }
    Ok(())
}

/// The recorded frames and their success labels, training's and the held-out episodes' (the
/// last `holdout` of them).
struct LabelledFrames {
    train_f: Option<Frames>,
    held_f: Option<Frames>,
    train_y: Vec<bool>,
    held_y: Vec<bool>,
    /// Per held-out frame: a few frames before a success frame of its episode.
    held_near: Vec<bool>,
    train_eps: usize,
    held_eps: usize,
    n_held: usize,
    /// The commands that recorded the episodes.
    commands: Vec<String>,
}

fn read_labelled(o: &RewardTrainOptions) -> Result<LabelledFrames> {
    let dirs = o.source.episode_dirs()?;
    let mut entries = vec![];
    let mut commands = vec![];
    for d in &dirs {
        let m = reflex_data::demos::read_manifest(d)?;
        entries.extend(m.episodes.into_iter().map(|e| (d.clone(), e)));
        commands.push(m.command);
    }
    let n_eps = entries.len();
    let n_held = ((n_eps as f64 * o.holdout).ceil() as usize).min(n_eps.saturating_sub(1));
    let (mut train_f, mut held_f) = (None, None);
    let (mut train_y, mut held_y) = (vec![], vec![]);
    // Held-out frames a few frames before a success frame of their episode.
    let mut held_near = vec![];
    let mut without_frames = 0;
    let (mut train_eps, mut held_eps) = (0, 0);
    for (k, (dir, e)) in entries.iter().enumerate() {
        let ep = reflex_data::demos::read_episode(dir, e)?;
        // A run's episode that kept no frame (ended before its first, or every frame set
        // dropped) has nothing to learn from; demos recorded without cameras are an error below.
        if ep.cameras.is_empty() && matches!(o.source, RewardSource::Runs(_)) {
            without_frames += 1;
            continue;
        }
        let held = k >= n_eps - n_held;
        // Held-out frames are read at the size the training frames were.
        let size = o.image_size.or_else(|| {
            train_f
                .as_ref()
                .map(|f: &Frames| (f.width as u32, f.height as u32))
        });
        let (f, y) = if held {
            held_eps += 1;
            (&mut held_f, &mut held_y)
        } else {
            train_eps += 1;
            (&mut train_f, &mut train_y)
        };
        add_frames(f, &ep, &o.cameras, size, dir, e)?;
        let labels = success_labels(&ep);
        let frames = (0..ep.frame_count()).map(|j| ep.frame_observation(j));
        if held {
            held_near.extend(frames.clone().map(|i| {
                !labels[i] && labels[i + 1..(i + 1 + NEAR_FRAMES).min(labels.len())].contains(&true)
            }));
        }
        y.extend(frames.map(|i| labels[i]));
    }
    if without_frames > 0 {
        tracing::warn!(
            "{without_frames} of {n_eps} recorded episodes kept no camera frame and are not used"
        );
    }
    Ok(LabelledFrames {
        train_f,
        held_f,
        train_y,
        held_y,
        held_near,
        train_eps,
        held_eps,
        n_held,
        commands,
    })
}

/// The classifier's success probability of every frame in `h`, 256 frames at a time.
fn probabilities(net: &reflex_vision::reward::RewardNet, h: &Frames) -> Result<Vec<f32>> {
    let mut probs = vec![];
    let len = h.frame_len();
    for start in (0..h.len()).step_by(256) {
        let n = 256.min(h.len() - start);
        let views: Vec<&[f32]> = h
            .data
            .iter()
            .map(|d| &d[start * len..(start + n) * len])
            .collect();
        probs.extend(net.probabilities(&views, n).map_err(BcError::from)?);
    }
    Ok(probs)
}

/// The spec's provenance: the command, the data, and the held-out figures.
fn provenance(
    o: &RewardTrainOptions,
    commands: &[String],
    (train_c, held_c): (&FrameCount, &FrameCount),
    confusion: &reflex_vision::reward::Confusion,
    near: u64,
    wall_s: f64,
) -> String {
    format!(
        "{} ({} {}: {}; {} frames of {} episodes, {} success; held out {} episodes, {} frames: accuracy {:.3}, precision {:.3}, recall {:.3}, {} of {} false positives within {NEAR_FRAMES} frames before a success; trained in {:.0} s)",
        o.command,
        match o.source {
            RewardSource::Demos(_) => "demos",
            RewardSource::Runs(_) => "runs",
        },
        o.source.dir().display(),
        commands.join("; "),
        train_c.frames,
        train_c.episodes,
        train_c.successes,
        held_c.episodes,
        held_c.frames,
        confusion.accuracy(),
        confusion.precision(),
        confusion.recall(),
        near,
        confusion.false_positives,
        wall_s
    )
}

/// Writes the classifier's ONNX graph to `out` and its spec beside it; returns the spec's path.
fn write_classifier(
    out: &Path,
    net: &reflex_vision::reward::RewardNet,
    spec: &reflex_vision::reward::RewardSpec,
) -> Result<PathBuf> {
    let onnx = net.to_onnx().map_err(BcError::from)?;
    if let Some(d) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(d).map_err(|e| AgentError::io(d, e))?;
    }
    reflex_runtime::fsio::atomic_write(out, &onnx).map_err(|e| AgentError::io(out, e))?;
    let sp = reflex_vision::reward::RewardSpec::path_for(out);
    reflex_runtime::fsio::atomic_write(&sp, spec.to_toml().as_bytes())
        .map_err(|e| AgentError::io(&sp, e))?;
    Ok(sp)
}
