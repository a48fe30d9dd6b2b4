//! What `reflex sim ...` runs: serve the simulator as a robot on the bus, time it, record and
//! score its scripted experts, snapshot its cameras.

use rand::{Rng, SeedableRng};
use reflex_agent::AgentError;
use reflex_agent::error::Result;
use reflex_agent::progress::Progress;
use reflex_bus::BusConfig;
use reflex_bus::robot::{RobotServer, ServeMode, ServeStats};
use reflex_contracts::robot::Robot;
use reflex_data::demos::{CameraStream, DemoWriter, Episode};
use reflex_sim::{Expert, SimConfig, SimEnv};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Instant;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SimFile {
    sim: SimConfig,
}

impl reflex_contracts::config::Validate for SimFile {
    fn validate(&self, _: &str) -> std::result::Result<(), reflex_contracts::config::Invalid> {
        self.sim.validate("sim")
    }
}

/// The `[sim]` table of a TOML file.
pub fn load_sim_config(path: &Path) -> Result<SimConfig> {
    Ok(reflex_contracts::config::load::<SimFile>(path)?.sim)
}

/// The robot spec the simulator of `cfg` serves (`reflex sim spec`): state fields, action space,
/// cameras. A policy importer or a peer maps onto it without starting the simulator's server.
pub fn robot_spec(cfg: SimConfig) -> Result<reflex_runtime::msg::RobotSpec> {
    Ok(SimEnv::new(cfg)?.spec().clone())
}

/// Serves the simulator of `cfg` on the bus until `stop` is set: lockstep, or on its own clock.
pub fn serve(
    cfg: SimConfig,
    mode: ServeMode,
    bus: &BusConfig,
    stop: &AtomicBool,
) -> Result<ServeStats> {
    if let ServeMode::Realtime { hz } = mode
        && !(1.0..=1000.0).contains(&hz)
    {
        return Err(AgentError::setup(
            "--realtime",
            format!("{hz} Hz: allowed 1 ..= 1000 Hz"),
        ));
    }
    let env = SimEnv::new(cfg)?;
    let session = bus.open()?;
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
    let stats = server.run(stop)?;
    tracing::info!(
        "stopped after {} steps, {} resets",
        stats.steps,
        stats.resets
    );
    Ok(stats)
}

/// Times `steps` environment steps driven by a fixed pseudo-random action stream; returns the
/// wall time and the physics steps taken.
fn time_steps(env: &mut SimEnv, steps: u64, seed: u64) -> Result<(f64, u64)> {
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

/// Stepping speed of one configuration.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StepRate {
    /// Steps timed.
    pub steps: u64,
    /// Their wall time, s.
    pub wall_s: f64,
    /// Environment steps per second.
    pub steps_per_s: f64,
    /// Physics steps per second (state only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub physics_steps_per_s: Option<f64>,
    /// Wall time per environment step, µs.
    pub us_per_step: f64,
    /// Cameras rendering (with cameras).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cameras: Option<u32>,
    /// Their width, px.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub width: Option<u32>,
    /// Their height, px.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub height: Option<u32>,
}

/// What `reflex sim bench` measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SimBenchReport {
    /// The task.
    pub task: String,
    /// The action space.
    pub action: String,
    /// Control rate, Hz.
    pub control_hz: f64,
    /// Physics rate, Hz.
    pub physics_hz: f64,
    /// Physics steps per control step.
    pub substeps: u32,
    /// Who integrates the arm: `rapier` (its multibody) or `reflex` (reflex's own dynamics).
    pub arm: String,
    /// Without cameras.
    pub state_only: StepRate,
    /// With both cameras rendering every step (absent with `no_cameras`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cameras: Option<StepRate>,
}

/// `reflex sim bench`: steps per second on one thread, state only and (unless `no_cameras`)
/// with both cameras rendering a tenth of the steps.
pub fn bench(mut cfg: SimConfig, steps: u64, no_cameras: bool) -> Result<SimBenchReport> {
    cfg.cameras.enabled = false;
    let mut env = SimEnv::new(cfg.clone())?;
    let (wall, physics) = time_steps(&mut env, steps, 1)?;
    let mut out = SimBenchReport {
        task: cfg.task.as_str().into(),
        action: cfg.action.as_str().into(),
        control_hz: cfg.control_hz,
        physics_hz: cfg.physics_hz,
        substeps: cfg.substeps(),
        arm: match cfg.solver.arm {
            reflex_sim::world::ArmSolver::Rapier => "rapier",
            reflex_sim::world::ArmSolver::Reflex => "reflex",
        }
        .into(),
        state_only: StepRate {
            steps,
            wall_s: wall,
            steps_per_s: steps as f64 / wall,
            physics_steps_per_s: Some(physics as f64 / wall),
            us_per_step: wall * 1e6 / steps as f64,
            cameras: None,
            width: None,
            height: None,
        },
        cameras: None,
    };
    if !no_cameras {
        cfg.cameras.enabled = true;
        let mut env = SimEnv::new(cfg.clone())?;
        let n = (steps / 10).max(10);
        let (wall, _) = time_steps(&mut env, n, 1)?;
        out.cameras = Some(StepRate {
            steps: n,
            wall_s: wall,
            steps_per_s: n as f64 / wall,
            physics_steps_per_s: None,
            us_per_step: wall * 1e6 / n as f64,
            cameras: Some(2),
            width: Some(cfg.cameras.width),
            height: Some(cfg.cameras.height),
        });
    }
    Ok(out)
}

/// Runs one expert episode; returns it with the states, actions and rewards.
pub fn run_episode(env: &mut SimEnv, expert: &mut Expert, seed: u64) -> Result<Episode> {
    let mut ep = Episode {
        seed,
        ..Default::default()
    };
    let mut action = vec![0.0f32; env.spec().action.dim()];
    let mut obs = env.reset(Some(seed))?.clone();
    expert.reset();
    ep.observations.push(obs.state.clone());
    ep.cameras = obs
        .images
        .iter()
        .map(|i| CameraStream::new(&i.camera, i.width, i.height))
        .collect();
    keep_frames(&mut ep.cameras, &obs.images);
    loop {
        expert.act(&obs, &mut action);
        let o = env.step(&action)?;
        obs.copy_from(o);
        ep.observations.push(obs.state.clone());
        keep_frames(&mut ep.cameras, &obs.images);
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

/// Appends each camera's image to its stream (the streams were made from the first observation's
/// cameras, in the same order).
fn keep_frames(streams: &mut [CameraStream], images: &[reflex_runtime::msg::Image]) {
    for (s, i) in streams.iter_mut().zip(images) {
        s.push(&i.data);
    }
}

/// What `reflex sim demos` asks for.
#[derive(Clone, Debug)]
pub struct DemosOptions {
    /// Episodes to write.
    pub episodes: u64,
    /// Expert action noise (std as a fraction of half the action range).
    pub noise: f64,
    /// Seed of the episode seeds and of the expert's noise.
    pub seed: u64,
    /// Keep only successful episodes.
    pub successes_only: bool,
    /// Output directory.
    pub out: PathBuf,
    /// The command that made them (recorded with the episodes).
    pub command: String,
}

/// How recording went: episodes written, successes, episodes run.
#[derive(Clone, Copy, Debug)]
pub struct DemosReport {
    /// Written.
    pub written: u64,
    /// Successful among those run.
    pub successes: u64,
    /// Run.
    pub tried: u64,
}

/// Records scripted-expert episodes.
pub fn demos(cfg: SimConfig, o: &DemosOptions, progress: &dyn Progress) -> Result<DemosReport> {
    let mut env = SimEnv::new(cfg)?;
    let mut expert = Expert::new(env.spec(), o.noise, o.seed ^ 0x5eed)?;
    let mut writer = DemoWriter::create(&o.out, env.spec(), &o.command)?;
    let mut seeds = rand_chacha::ChaCha8Rng::seed_from_u64(o.seed);
    progress.start(o.episodes, "episodes");
    let mut r = DemosReport {
        written: 0,
        successes: 0,
        tried: 0,
    };
    while r.written < o.episodes {
        r.tried += 1;
        if o.successes_only && r.tried > o.episodes * 20 {
            return Err(reflex_agent::error::bail(format!(
                "only {} of {} episodes succeeded; lower --noise or drop --successes-only",
                r.successes, r.tried
            )));
        }
        let seed: u64 = seeds.random();
        let mut ep = run_episode(&mut env, &mut expert, seed)?;
        r.successes += ep.success as u64;
        if o.successes_only && !ep.success {
            continue;
        }
        writer.write(&mut ep)?;
        r.written += 1;
        progress.inc(1);
    }
    progress.finish();
    Ok(r)
}

/// How the scripted expert did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ExpertReport {
    /// The task.
    pub task: String,
    /// Episodes run.
    pub episodes: u64,
    /// The expert's action noise.
    pub noise: f64,
    /// Successes over episodes.
    pub success_rate: f64,
    /// Successful episodes.
    pub successes: u64,
    /// Mean episode length, steps.
    pub mean_steps: f64,
    /// Wall time, s.
    pub wall_s: f64,
    /// Reset seeds of the failed episodes.
    pub failed_seeds: Vec<u64>,
}

/// Scores the scripted expert over `episodes` seeded episodes; `trace` receives every step of
/// every episode (named state fields and the action) when given.
pub fn expert(
    cfg: SimConfig,
    episodes: u64,
    noise: f64,
    seed: u64,
    mut trace: Option<&mut dyn FnMut(serde_json::Value)>,
    progress: &dyn Progress,
) -> Result<ExpertReport> {
    let task = cfg.task;
    let mut env = SimEnv::new(cfg)?;
    let mut expert = Expert::new(env.spec(), noise, seed ^ 0x5eed)?;
    let mut seeds = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    progress.start(episodes, "episodes");
    let (mut successes, mut steps) = (0u64, 0u64);
    let t0 = Instant::now();
    let mut failed = Vec::new();
    for _ in 0..episodes {
        let seed: u64 = seeds.random();
        let ep = run_episode(&mut env, &mut expert, seed)?;
        if let Some(f) = trace.as_deref_mut() {
            trace_episode(env.spec(), seed, &ep, f);
        }
        if ep.success {
            successes += 1;
        } else {
            failed.push(seed);
        }
        steps += ep.actions.len() as u64;
        progress.inc(1);
        progress.message(&format!("{successes} ok"));
    }
    progress.finish();
    let wall = t0.elapsed().as_secs_f64();
    Ok(ExpertReport {
        task: task.as_str().into(),
        episodes,
        noise,
        success_rate: successes as f64 / episodes as f64,
        successes,
        mean_steps: steps as f64 / episodes as f64,
        wall_s: wall,
        failed_seeds: failed,
    })
}

fn trace_episode(
    spec: &reflex_contracts::msg::RobotSpec,
    seed: u64,
    ep: &Episode,
    f: &mut dyn FnMut(serde_json::Value),
) {
    for (t, state) in ep.observations.iter().enumerate() {
        let mut line = serde_json::Map::new();
        line.insert("seed".into(), seed.into());
        line.insert("step".into(), t.into());
        for field in &spec.state {
            if let Some(r) = spec.field(&field.name) {
                line.insert(field.name.clone(), serde_json::json!(state[r]));
            }
        }
        if let Some(act) = ep.actions.get(t) {
            line.insert("action".into(), serde_json::json!(act));
        }
        f(serde_json::Value::Object(line));
    }
}

/// Writes the camera images (PNG) after `steps` expert steps of the episode `seed`; returns the
/// files written.
pub fn snapshot(mut cfg: SimConfig, seed: u64, steps: u32, out: &Path) -> Result<Vec<PathBuf>> {
    cfg.cameras.enabled = true;
    let mut env = SimEnv::new(cfg)?;
    let mut expert = Expert::new(env.spec(), 0.0, 0)?;
    let mut action = vec![0.0f32; env.spec().action.dim()];
    let mut obs = env.reset(Some(seed))?.clone();
    for _ in 0..steps {
        expert.act(&obs, &mut action);
        obs.copy_from(env.step(&action)?);
    }
    std::fs::create_dir_all(out).map_err(|e| AgentError::io(out, e))?;
    let mut files = vec![];
    for img in &obs.images {
        let p = out.join(format!("{}.png", img.camera));
        reflex_data::plot::write_png(&p, img.width, img.height, &img.data)?;
        files.push(p);
    }
    Ok(files)
}
