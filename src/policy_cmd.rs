//! `reflex policy check|bench` and `reflex bc train`.

use crate::cli::{percentile, progress};
use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use reflex_policies::bc::{TrainConfig, make_samples, train};
use reflex_policies::onnx_policy::{
    OnnxPolicy, Provider, RunOptions, check_graph, graph_io, open_session,
};
use reflex_policies::spec::{PolicySpec, spec_path};
use reflex_runtime::msg::RobotSpec;
use reflex_runtime::robot::Robot;
use reflex_sim::{SimConfig, SimEnv, TaskKind};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Subcommand)]
pub enum PolicyCommand {
    /// Check a model against its spec (names, shapes, element types) and the robot it is for.
    Check(CheckArgs),
    /// Time one chunk (all sampler steps) on a provider.
    Bench(BenchArgs),
}

#[derive(Subcommand)]
pub enum BcCommand {
    /// Train a diffusion policy on recorded episodes and export it to ONNX with its spec.
    Train(TrainArgs),
}

#[derive(Args)]
pub struct CheckArgs {
    /// The .onnx file (its spec is NAME.policy.toml beside it).
    #[arg(long)]
    model: PathBuf,
}

#[derive(Args)]
pub struct BenchArgs {
    /// The .onnx file.
    #[arg(long)]
    model: PathBuf,
    /// Execution provider: cpu, cuda, tensorrt.
    #[arg(long, default_value = "cpu")]
    provider: String,
    /// ONNX Runtime intra-op threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Chunks to time.
    #[arg(long, default_value_t = 500)]
    iters: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct TrainArgs {
    /// A directory written by `reflex sim demos`.
    #[arg(long)]
    demos: PathBuf,
    /// Output model, e.g. models/pick.onnx (the spec is written beside it).
    #[arg(long)]
    out: PathBuf,
    /// Use only the first N episodes.
    #[arg(long)]
    episodes: Option<usize>,
    /// Gradient steps.
    #[arg(long, default_value_t = 4000)]
    steps: usize,
    /// Batch size.
    #[arg(long, default_value_t = 256)]
    batch: usize,
    /// Learning rate.
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    /// Hidden width.
    #[arg(long, default_value_t = 256)]
    hidden: usize,
    /// Chunk length.
    #[arg(long, default_value_t = 16)]
    horizon: usize,
    /// Actions executed per chunk.
    #[arg(long, default_value_t = 8)]
    execute: usize,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// The robot a policy spec names (`sim/<task>`), to check and run it against.
pub fn robot_for(spec: &PolicySpec, cameras: bool) -> anyhow::Result<Option<SimEnv>> {
    let Some(kind) = &spec.robot_kind else {
        return Ok(None);
    };
    let Some(task) = kind.strip_prefix("sim/") else {
        return Ok(None);
    };
    let mut cfg = SimConfig::for_task(task.parse::<TaskKind>().map_err(anyhow::Error::msg)?);
    cfg.cameras.enabled = cameras;
    Ok(Some(SimEnv::new(cfg)?))
}

fn needs_cameras(spec: &PolicySpec) -> bool {
    spec.inputs
        .iter()
        .any(|i| matches!(i, reflex_policies::spec::InputSource::Image { .. }))
}

pub fn check(a: CheckArgs) -> anyhow::Result<()> {
    if !a.model.exists() {
        bail!("model `{}` does not exist", a.model.display());
    }
    let spec = PolicySpec::load_for(&a.model)?;
    let session = open_session(&a.model, &RunOptions::default())?;
    let robot = robot_for(&spec, needs_cameras(&spec))?;
    let (ins, outs) = graph_io(&session);
    println!(
        "model {} ({:?}, chunk {} x {}, {} executed)",
        a.model.display(),
        spec.kind,
        spec.chunk_len,
        spec.action_dim,
        spec.execute
    );
    for i in &ins {
        println!("  input  {:<16} {:<8} {:?}", i.name, i.elem, i.dims);
    }
    for o in &outs {
        println!("  output {:<16} {:<8} {:?}", o.name, o.elem, o.dims);
    }
    let problems = check_graph(&spec, &session, robot.as_ref().map(|r| r.spec()));
    if !problems.is_empty() {
        bail!(
            "model `{}` does not match its spec `{}`:\n  - {}",
            a.model.display(),
            spec_path(&a.model).display(),
            problems.join("\n  - ")
        );
    }
    if let Some(r) = &robot {
        // Loading for the robot checks the state fields, cameras and action space too.
        OnnxPolicy::load(&a.model, r.spec(), &RunOptions::default())?;
        println!("matches its spec and robot kind `{}`: ok", r.spec().kind);
    } else {
        println!("matches its spec: ok (no robot kind to check against)");
    }
    Ok(())
}

pub fn bench(a: BenchArgs) -> anyhow::Result<()> {
    let spec = PolicySpec::load_for(&a.model)?;
    let mut robot = robot_for(&spec, needs_cameras(&spec))?.context(
        "policy bench needs a spec with robot_kind = \"sim/<task>\" to make observations",
    )?;
    let provider = Provider::parse(&a.provider).map_err(anyhow::Error::msg)?;
    let opts = RunOptions {
        provider,
        intra_threads: a.threads,
        seed: 0,
    };
    let mut policy = OnnxPolicy::load(&a.model, robot.spec(), &opts)?;
    let obs = robot.reset(Some(1))?.clone();
    let mut out = vec![0.0f32; spec.chunk_len * spec.action_dim];
    for _ in 0..20 {
        policy.infer_chunk(&obs, &mut out)?;
    }
    let mut lat = Vec::with_capacity(a.iters);
    for _ in 0..a.iters {
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
    let v = serde_json::json!({
        "model": a.model.display().to_string(),
        "provider": opts.provider.name(),
        "intra_threads": a.threads,
        "network_calls_per_chunk": calls,
        "iters": a.iters,
        "p50_us": percentile(&lat, 50.0),
        "p99_us": percentile(&lat, 99.0),
        "max_us": lat.last().copied().unwrap_or(f64::NAN),
    });
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "{} on {} ({} thread{}): {} network calls per chunk; per chunk p50 {:.0} us, p99 {:.0} us, max {:.0} us over {} chunks",
            a.model.display(),
            opts.provider.name(),
            a.threads,
            if a.threads == 1 { "" } else { "s" },
            calls,
            v["p50_us"].as_f64().unwrap_or(0.0),
            v["p99_us"].as_f64().unwrap_or(0.0),
            v["max_us"].as_f64().unwrap_or(0.0),
            a.iters
        );
    }
    Ok(())
}

/// Writes a model and its spec atomically.
pub fn write_model(out: &Path, onnx: &[u8], spec: &PolicySpec) -> anyhow::Result<()> {
    if let Some(d) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    reflex_runtime::fsio::atomic_write(out, onnx)
        .with_context(|| format!("writing {}", out.display()))?;
    let sp = spec_path(out);
    reflex_runtime::fsio::atomic_write(&sp, spec.to_toml().as_bytes())
        .with_context(|| format!("writing {}", sp.display()))?;
    Ok(())
}

pub fn bc_train(a: TrainArgs) -> anyhow::Result<()> {
    let m = reflex_sim::demos::read_manifest(&a.demos)?;
    let take = a.episodes.unwrap_or(m.episodes.len()).min(m.episodes.len());
    let mut eps = vec![];
    for e in &m.episodes[..take] {
        let ep = reflex_sim::demos::read_episode(&a.demos, e)?;
        eps.push((ep.observations, ep.actions));
    }
    let samples = make_samples(&eps, a.horizon);
    let spec_robot: &RobotSpec = &m.spec;
    let cfg = TrainConfig {
        steps: a.steps,
        batch: a.batch,
        lr: a.lr,
        hidden: a.hidden,
        layers: 3,
        horizon: a.horizon,
        execute: a.execute,
        ema: 0.995,
        seed: a.seed,
    };
    let name = a
        .out
        .file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_else(|| "policy".into());
    tracing::info!(
        "training `{name}` on {take} episodes ({} samples) from {}",
        samples.len(),
        a.demos.display()
    );
    let pb = progress(a.steps as u64, "steps");
    let t0 = Instant::now();
    let mut trained = train(
        &samples,
        spec_robot.action.dim(),
        &cfg,
        &name,
        vec![],
        Some(spec_robot.kind.clone()),
        |step, loss| {
            pb.set_position(step as u64);
            pb.set_message(format!("loss {loss:.4}"));
        },
    )?;
    pb.finish_and_clear();
    trained.spec.provenance = Some(format!(
        "{} (demos: {}; {take} episodes, {} samples; trained in {:.0} s)",
        crate::cli::command_line(),
        m.command,
        samples.len(),
        t0.elapsed().as_secs_f64()
    ));
    let onnx = trained.net.to_onnx()?;
    write_model(&a.out, &onnx, &trained.spec)?;
    println!(
        "wrote {} and {} (final loss {:.4}, {:.0} s)",
        a.out.display(),
        spec_path(&a.out).display(),
        trained.losses.last().copied().unwrap_or(f32::NAN),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
