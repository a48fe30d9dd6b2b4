//! What `reflex policy check|bench` run, and how a trained model is written.

use reflex_agent::{AgentError, error::Result};
use reflex_contracts::msg::{Observation, RobotSpec};
#[cfg(feature = "sim")]
use reflex_contracts::robot::Robot;
use reflex_policies::onnx_policy::{
    OnnxPolicy, Provider, RunOptions, check_graph, graph_io, open_session,
};
use reflex_policies::spec::{PolicySpec, spec_path};
use reflex_runtime::hist::percentile;
use std::path::Path;
use std::time::Instant;

/// What a policy is checked and timed against: its robot's spec and one observation.
pub struct Target {
    /// The robot's spec.
    pub spec: RobotSpec,
    /// An observation of it: the simulator's first after reset with the workstation build; the
    /// robot build (no simulator) gives zeros, enough to check shapes and time a chunk.
    pub obs: Observation,
}

/// The robot a policy spec names (`sim/<task>`), to check and run it against. Without the
/// simulator (the robot build) the spec comes from reflex-tabletop and the observation is zeros;
/// an image policy, whose cameras only the simulator describes, is refused there.
pub fn target_for(spec: &PolicySpec, cameras: bool) -> Result<Option<Target>> {
    let Some(kind) = &spec.robot_kind else {
        return Ok(None);
    };
    let Some(task) = kind.strip_prefix("sim/") else {
        return Ok(None);
    };
    let task: reflex_tabletop::TaskKind =
        task.parse()
            .map_err(|e: reflex_tabletop::task::UnknownTask| {
                AgentError::setup("robot_kind", e.to_string())
            })?;
    let mut cfg = reflex_tabletop::sim_config::SimConfig::for_task(task);
    cfg.cameras.enabled = cameras;
    #[cfg(feature = "sim")]
    {
        let mut env = reflex_sim::SimEnv::new(cfg)?;
        let obs = env.reset(Some(1))?.clone();
        Ok(Some(Target {
            spec: env.spec().clone(),
            obs,
        }))
    }
    #[cfg(not(feature = "sim"))]
    {
        if cameras {
            return Err(AgentError::setup(
                "robot_kind",
                format!(
                    "the policy reads the cameras of the simulator's {kind}, which only a \
                     workstation build (feature `sim`) describes: check or time it there"
                ),
            ));
        }
        let spec = reflex_tabletop::spec::robot_spec(
            &cfg,
            &reflex_tabletop::ArmModel::so101(),
            Vec::new(),
        );
        let obs = reflex_agent::actor::obs_template(&spec);
        Ok(Some(Target { spec, obs }))
    }
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
    let robot = target_for(&spec, needs_cameras(&spec))?;
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
    let mut problems = check_graph(&spec, &session, robot.as_ref().map(|r| &r.spec));
    // A two-graph VLA: the prefix graph beside it, against the spec's inputs and outputs.
    if let Some(p) = &spec.graph.prefix {
        let path = model.parent().unwrap_or(Path::new(".")).join(&p.file);
        match open_session(&path, &RunOptions::default()) {
            Ok(prefix) => {
                lines.push(format!(
                    "  prefix graph {} (once per chunk)",
                    path.display()
                ));
                let r = robot.as_ref().map(|r| &r.spec);
                problems.extend(
                    reflex_policies::onnx_policy::check_prefix_graph(&spec, &prefix, r)
                        .into_iter()
                        .map(|m| format!("prefix graph {}: {m}", path.display())),
                );
            }
            Err(e) => problems.push(format!("[graph.prefix] {}: {e}", path.display())),
        }
    }
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
        OnnxPolicy::load(model, &r.spec, &RunOptions::default())?;
    }
    Ok(CheckReport {
        lines,
        robot_kind: robot.map(|r| r.spec.kind.clone()),
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
    /// A two-graph VLA (`[graph.prefix]`): each graph's share of the chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub graphs: Option<GraphTimes>,
    /// With `--rtc`: the same chunks sampled by real-time chunking, timed alternately with the
    /// plain ones in the same run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rtc: Option<RtcTiming>,
}

/// A two-graph VLA's chunk, graph by graph.
#[derive(Clone, Debug, serde::Serialize)]
pub struct GraphTimes {
    /// The prefix graph, once per chunk: median, µs.
    pub prefix_p50_us: f64,
    /// Its 99th percentile, µs.
    pub prefix_p99_us: f64,
    /// The action expert over all integration steps (the chunk less the prefix): median, µs.
    pub expert_p50_us: f64,
    /// One expert call (the median over the steps), µs.
    pub expert_step_p50_us: f64,
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

/// Turns on real-time chunking for `policy bench --rtc`, refusing a policy it cannot apply to.
fn rtc_for_bench(
    policy: &mut OnnxPolicy,
    spec: &PolicySpec,
    model: &Path,
    guided: bool,
    overlap: usize,
) -> Result<()> {
    if spec.kind == reflex_policies::spec::PolicyKind::Chunk || overlap == 0 {
        return Err(AgentError::setup(
            "reflex policy bench --rtc",
            format!(
                "`{}` is a chunk policy or executes its whole chunk (execute = chunk_len): real-time chunking has nothing to inpaint",
                model.display()
            ),
        ));
    }
    if let Some(why) = policy.rtc_unsupported() {
        return Err(AgentError::setup(
            "reflex policy bench --rtc",
            format!("`{}`: {why}", model.display()),
        ));
    }
    if guided && !policy.has_vjp() {
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
        guidance: guided,
        ..Default::default()
    });
    Ok(())
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
    let robot = target_for(&spec, needs_cameras(&spec))?.ok_or_else(|| {
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
    let mut policy = OnnxPolicy::load(model, &robot.spec, &opts)?;
    let obs = robot.obs;
    let mut out = vec![0.0f32; spec.rows() * spec.action_dim];
    // Warm-up: 20 chunks, or a tenth of the timed ones when that is fewer (a chunk of LeRobot's
    // default Diffusion Policy takes seconds on a CPU).
    for _ in 0..(iters / 10).clamp(1, 20) {
        policy.infer_chunk(&obs, &mut out)?;
    }
    let overlap = spec.rows() - spec.execute;
    let delay = (overlap / 2).max(1).min(overlap);
    if let Some(guided) = rtc {
        rtc_for_bench(&mut policy, &spec, model, guided, overlap)?;
    }
    // The executing chunk: the policy's own, shifted by what was executed.
    let dim = spec.action_dim;
    let mut executing = vec![0.0f32; out.len()];
    executing[..overlap * dim].copy_from_slice(&out[spec.execute * dim..]);
    let mut rtc_out = vec![0.0f32; out.len()];
    let mut variant = None;
    let (mut lat, mut rtc_lat) = (Vec::with_capacity(iters), vec![]);
    let (mut prefix_lat, mut expert_lat) = (vec![], vec![]);
    for _ in 0..iters {
        let t0 = Instant::now();
        policy.infer_chunk(&obs, &mut out)?;
        let chunk = t0.elapsed().as_secs_f64() * 1e6;
        lat.push(chunk);
        if let Some(p) = policy.last_prefix_time() {
            prefix_lat.push(p.as_secs_f64() * 1e6);
            expert_lat.push(chunk - p.as_secs_f64() * 1e6);
        }
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
    prefix_lat.sort_by(|x, y| x.total_cmp(y));
    expert_lat.sort_by(|x, y| x.total_cmp(y));
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
        graphs: (!prefix_lat.is_empty()).then(|| GraphTimes {
            prefix_p50_us: percentile(&prefix_lat, 50.0),
            prefix_p99_us: percentile(&prefix_lat, 99.0),
            expert_p50_us: percentile(&expert_lat, 50.0),
            expert_step_p50_us: percentile(&expert_lat, 50.0) / calls.max(1) as f64,
        }),
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
