//! `reflex sim ...`: serve, bench, demos, expert.

use crate::cli::{BusArgs, progress};
use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use rand::{Rng, SeedableRng};
use reflex_runtime::bus::{RobotServer, ServeMode};
use reflex_runtime::msg::ActionKind;
use reflex_runtime::robot::Robot;
use reflex_sim::demos::{DemoWriter, Episode};
use reflex_sim::{Expert, SimConfig, SimEnv, TaskKind};
use serde::Deserialize;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

#[derive(Subcommand)]
pub enum SimCommand {
    /// Serve the simulator as a robot on Zenoh (lockstep by default).
    Serve(ServeArgs),
    /// Environment steps per second on one thread, cameras off and on.
    Bench(BenchArgs),
    /// Record scripted-expert episodes to a directory.
    Demos(DemosArgs),
    /// Run the scripted expert and report its success rate.
    Expert(ExpertArgs),
    /// Write the camera images (PNG) after N expert steps of a seeded episode.
    Snapshot(SnapshotArgs),
}

#[derive(Args)]
pub struct SnapshotArgs {
    #[command(flatten)]
    sim: SimSelect,
    /// Episode seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Expert steps before the snapshot.
    #[arg(long, default_value_t = 0)]
    steps: u32,
    /// Output directory (one PNG per camera).
    #[arg(long)]
    out: PathBuf,
}

/// Which simulator to build: a config file, or a task with defaults.
#[derive(Args, Clone, Debug)]
pub struct SimSelect {
    /// Task (reach, push, pick, insert); ignored when --config is given.
    #[arg(long, default_value = "pick")]
    pub task: String,
    /// A TOML config file with a `[sim]` table.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Action space (ee_delta, ee_delta_yaw, joint_abs, joint_delta); overrides the config.
    #[arg(long)]
    pub action: Option<String>,
    /// Render the front and wrist cameras.
    #[arg(long)]
    pub cameras: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SimFile {
    sim: SimConfig,
}

impl reflex_runtime::config::Validate for SimFile {
    fn validate(&self, _: &str) -> Result<(), reflex_runtime::config::Invalid> {
        self.sim.validate("sim")
    }
}

fn parse_action(s: &str) -> anyhow::Result<ActionKind> {
    Ok(match s {
        "ee_delta" => ActionKind::EeDelta,
        "ee_delta_yaw" => ActionKind::EeDeltaYaw,
        "joint_abs" => ActionKind::JointAbs,
        "joint_delta" => ActionKind::JointDelta,
        other => bail!(
            "--action `{other}`: allowed values are ee_delta, ee_delta_yaw, joint_abs, joint_delta"
        ),
    })
}

impl SimSelect {
    pub fn load(&self) -> anyhow::Result<SimConfig> {
        let mut cfg = match &self.config {
            Some(p) => reflex_runtime::config::load::<SimFile>(p)?.sim,
            None => SimConfig::for_task(
                self.task
                    .parse::<TaskKind>()
                    .map_err(anyhow::Error::msg)
                    .context("--task")?,
            ),
        };
        if let Some(a) = &self.action {
            cfg.action = parse_action(a)?;
        }
        if self.cameras {
            cfg.cameras.enabled = true;
        }
        Ok(cfg)
    }
}

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    sim: SimSelect,
    /// Robot name on the bus (the `<robot>` of `reflex/<robot>/...`).
    #[arg(long)]
    robot: Option<String>,
    /// Run on a fixed clock at this rate instead of lockstep (for teleoperation).
    #[arg(long, value_name = "HZ")]
    realtime: Option<f64>,
    #[command(flatten)]
    bus: BusArgs,
}

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    sim: SimSelect,
    /// Environment steps to time (state only); the camera run takes a tenth of them.
    #[arg(long, default_value_t = 20_000)]
    steps: u64,
    /// Skip the run with cameras.
    #[arg(long)]
    no_cameras: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct DemosArgs {
    #[command(flatten)]
    sim: SimSelect,
    /// Episodes to record.
    #[arg(long, default_value_t = 20)]
    episodes: u64,
    /// Expert action noise (std as a fraction of half the action range).
    #[arg(long, default_value_t = 0.0)]
    noise: f64,
    /// Seed of the episode seeds and of the expert's noise.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Keep only successful episodes.
    #[arg(long)]
    successes_only: bool,
    /// Output directory.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
pub struct ExpertArgs {
    #[command(flatten)]
    sim: SimSelect,
    /// Episodes to run.
    #[arg(long, default_value_t = 100)]
    episodes: u64,
    /// Expert action noise.
    #[arg(long, default_value_t = 0.0)]
    noise: f64,
    /// Seed of the episode seeds.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Print every step of every episode (named state fields, action, reward) as JSON lines.
    #[arg(long)]
    trace: bool,
}

pub fn run(cmd: SimCommand) -> anyhow::Result<()> {
    match cmd {
        SimCommand::Serve(a) => serve(a),
        SimCommand::Bench(a) => bench(a),
        SimCommand::Demos(a) => demos(a),
        SimCommand::Expert(a) => expert(a),
        SimCommand::Snapshot(a) => snapshot(a),
    }
}

fn serve(a: ServeArgs) -> anyhow::Result<()> {
    let mut cfg = a.sim.load()?;
    if let Some(r) = a.robot {
        cfg.robot = r;
    }
    let env = SimEnv::new(cfg)?;
    let session = a.bus.config().open()?;
    let mode = match a.realtime {
        Some(hz) if (1.0..=1000.0).contains(&hz) => ServeMode::Realtime { hz },
        Some(hz) => bail!("--realtime {hz}: allowed 1 ..= 1000 Hz"),
        None => ServeMode::Lockstep,
    };
    let mut server = RobotServer::new(&session, env, mode)?;
    tracing::info!(
        "serving robot `{}` on reflex/{}/* ({})",
        server.keys().robot,
        server.keys().robot,
        match mode {
            ServeMode::Lockstep => "lockstep".to_string(),
            ServeMode::Realtime { hz } => format!("real time at {hz} Hz"),
        }
    );
    let stop = AtomicBool::new(false);
    let stats = server.run(&stop)?;
    tracing::info!(
        "stopped after {} steps, {} resets",
        stats.steps,
        stats.resets
    );
    Ok(())
}

/// Times `steps` environment steps driven by a fixed pseudo-random action stream.
fn time_steps(env: &mut SimEnv, steps: u64, seed: u64) -> anyhow::Result<(f64, u64)> {
    let spec = env.spec().clone();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    // Pre-drawn actions so the timing covers the simulator only.
    let actions: Vec<Vec<f32>> = (0..256)
        .map(|_| {
            spec.action
                .low
                .iter()
                .zip(&spec.action.high)
                .map(|(l, h)| l + (h - l) * rng.random::<f32>())
                .collect()
        })
        .collect();
    env.reset(Some(seed))?;
    let physics0 = env.physics_steps();
    let t0 = Instant::now();
    for i in 0..steps {
        let done = env.step(&actions[(i % 256) as usize])?.done();
        if done {
            env.reset(None)?;
        }
    }
    Ok((t0.elapsed().as_secs_f64(), env.physics_steps() - physics0))
}

fn bench(a: BenchArgs) -> anyhow::Result<()> {
    let mut cfg = a.sim.load()?;
    cfg.cameras.enabled = false;
    let mut env = SimEnv::new(cfg.clone())?;
    let (wall, physics) = time_steps(&mut env, a.steps, 1)?;
    let state = serde_json::json!({
        "steps": a.steps,
        "wall_s": wall,
        "steps_per_s": a.steps as f64 / wall,
        "physics_steps_per_s": physics as f64 / wall,
        "us_per_step": wall * 1e6 / a.steps as f64,
    });
    let mut out = serde_json::json!({
        "task": cfg.task.as_str(),
        "action": cfg.action.as_str(),
        "control_hz": cfg.control_hz,
        "physics_hz": cfg.physics_hz,
        "substeps": cfg.substeps(),
        "state_only": state,
    });
    if !a.no_cameras {
        cfg.cameras.enabled = true;
        let mut env = SimEnv::new(cfg.clone())?;
        let n = (a.steps / 10).max(10);
        let (wall, _) = time_steps(&mut env, n, 1)?;
        out["cameras"] = serde_json::json!({
            "steps": n,
            "wall_s": wall,
            "steps_per_s": n as f64 / wall,
            "us_per_step": wall * 1e6 / n as f64,
            "cameras": 2,
            "width": cfg.cameras.width,
            "height": cfg.cameras.height,
        });
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "sim bench {} ({} Hz control, {} Hz physics, {} substeps), one thread:",
            cfg.task,
            cfg.control_hz,
            cfg.physics_hz,
            cfg.substeps()
        );
        println!(
            "  state only: {:.0} steps/s ({:.1} us/step, {:.0} physics steps/s) over {} steps",
            out["state_only"]["steps_per_s"].as_f64().unwrap_or(0.0),
            out["state_only"]["us_per_step"].as_f64().unwrap_or(0.0),
            out["state_only"]["physics_steps_per_s"]
                .as_f64()
                .unwrap_or(0.0),
            a.steps
        );
        if let Some(c) = out.get("cameras") {
            println!(
                "  2 cameras {}x{}: {:.0} steps/s ({:.0} us/step) over {} steps",
                cfg.cameras.width,
                cfg.cameras.height,
                c["steps_per_s"].as_f64().unwrap_or(0.0),
                c["us_per_step"].as_f64().unwrap_or(0.0),
                c["steps"]
            );
        }
    }
    Ok(())
}

/// Runs one expert episode; returns it with the states, actions and rewards.
pub fn run_episode(env: &mut SimEnv, expert: &mut Expert, seed: u64) -> anyhow::Result<Episode> {
    let mut ep = Episode {
        seed,
        ..Default::default()
    };
    let mut action = vec![0.0f32; env.spec().action.dim()];
    let mut obs = env.reset(Some(seed))?.clone();
    expert.reset();
    ep.observations.push(obs.state.clone());
    loop {
        expert.act(&obs, &mut action);
        let o = env.step(&action)?;
        obs.copy_from(o);
        ep.observations.push(obs.state.clone());
        ep.actions.push(action.clone());
        ep.rewards.push(obs.reward);
        ep.ret += obs.reward;
        if obs.done() {
            ep.success = obs.success;
            ep.terminated = obs.terminated;
            ep.truncated = obs.truncated;
            return Ok(ep);
        }
    }
}

fn demos(a: DemosArgs) -> anyhow::Result<()> {
    let cfg = a.sim.load()?;
    let mut env = SimEnv::new(cfg)?;
    let mut expert = Expert::new(env.spec(), a.noise, a.seed ^ 0x5eed)?;
    let command = crate::cli::command_line();
    let mut writer = DemoWriter::create(&a.out, env.spec(), &command)?;
    let mut seeds = rand_chacha::ChaCha8Rng::seed_from_u64(a.seed);
    let pb = progress(a.episodes, "episodes");
    let (mut written, mut successes, mut tried) = (0u64, 0u64, 0u64);
    while written < a.episodes {
        tried += 1;
        if a.successes_only && tried > a.episodes * 20 {
            bail!(
                "only {successes} of {tried} episodes succeeded; lower --noise or drop --successes-only"
            );
        }
        let seed: u64 = seeds.random();
        let mut ep = run_episode(&mut env, &mut expert, seed)?;
        successes += ep.success as u64;
        if a.successes_only && !ep.success {
            continue;
        }
        writer.write(&mut ep)?;
        written += 1;
        pb.inc(1);
    }
    pb.finish_and_clear();
    println!(
        "wrote {written} episodes to {} ({successes} of {tried} run episodes succeeded)",
        a.out.display()
    );
    Ok(())
}

fn expert(a: ExpertArgs) -> anyhow::Result<()> {
    let cfg = a.sim.load()?;
    let task = cfg.task;
    let mut env = SimEnv::new(cfg)?;
    let mut expert = Expert::new(env.spec(), a.noise, a.seed ^ 0x5eed)?;
    let mut seeds = rand_chacha::ChaCha8Rng::seed_from_u64(a.seed);
    let pb = progress(a.episodes, "episodes");
    let (mut successes, mut steps) = (0u64, 0u64);
    let t0 = Instant::now();
    let mut failed = Vec::new();
    for _ in 0..a.episodes {
        let seed: u64 = seeds.random();
        let ep = run_episode(&mut env, &mut expert, seed)?;
        if a.trace {
            let spec = env.spec();
            for (t, state) in ep.observations.iter().enumerate() {
                let mut line = serde_json::Map::new();
                line.insert("seed".into(), seed.into());
                line.insert("step".into(), t.into());
                for f in &spec.state {
                    let r = spec.field(&f.name).expect("own field");
                    line.insert(f.name.clone(), serde_json::json!(state[r]));
                }
                if let Some(act) = ep.actions.get(t) {
                    line.insert("action".into(), serde_json::json!(act));
                }
                println!("{}", serde_json::Value::Object(line));
            }
        }
        if ep.success {
            successes += 1;
        } else {
            failed.push(seed);
        }
        steps += ep.actions.len() as u64;
        pb.inc(1);
        pb.set_message(format!("{successes} ok"));
    }
    pb.finish_and_clear();
    let wall = t0.elapsed().as_secs_f64();
    let rate = successes as f64 / a.episodes as f64;
    if a.json {
        println!(
            "{}",
            serde_json::json!({"task": task.as_str(), "episodes": a.episodes, "noise": a.noise, "success_rate": rate,
                "mean_steps": steps as f64 / a.episodes as f64, "wall_s": wall, "failed_seeds": failed})
        );
    } else {
        println!(
            "scripted expert on `{task}`: {successes}/{} successful ({:.1}%), {:.1} steps per episode, {wall:.1} s",
            a.episodes,
            100.0 * rate,
            steps as f64 / a.episodes as f64
        );
        if !failed.is_empty() {
            println!("failed seeds: {:?}", &failed[..failed.len().min(10)]);
        }
    }
    Ok(())
}

/// Writes an rgb8 image as PNG.
pub fn write_png(
    path: &std::path::Path,
    width: u32,
    height: u32,
    rgb: &[u8],
) -> anyhow::Result<()> {
    let mut bytes = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut bytes, width, height);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc.write_header()?;
        w.write_image_data(rgb)?;
    }
    reflex_runtime::fsio::atomic_write(path, &bytes)
        .with_context(|| format!("writing {}", path.display()))
}

fn snapshot(a: SnapshotArgs) -> anyhow::Result<()> {
    let mut cfg = a.sim.load()?;
    cfg.cameras.enabled = true;
    let mut env = SimEnv::new(cfg)?;
    let mut expert = Expert::new(env.spec(), 0.0, 0)?;
    let mut action = vec![0.0f32; env.spec().action.dim()];
    let mut obs = env.reset(Some(a.seed))?.clone();
    for _ in 0..a.steps {
        expert.act(&obs, &mut action);
        obs.copy_from(env.step(&action)?);
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    for img in &obs.images {
        let p = a.out.join(format!("{}.png", img.camera));
        write_png(&p, img.width, img.height, &img.data)?;
        println!("{}", p.display());
    }
    Ok(())
}
