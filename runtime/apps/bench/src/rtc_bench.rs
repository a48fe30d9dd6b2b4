//! `reflex bench rtc`: how a chunking policy behaves when its chunks arrive late, per way of
//! executing them, on the simulator in simulated time.
//!
//! A policy that takes `d` control ticks per chunk is stood in for, exactly and reproducibly,
//! by the loop's delayed inline driver: the chunk computed from the observation at tick `k` is
//! handed over at tick `k + d` (`PolicyDriver::inline_delayed`). For each delay and each
//! execution mode (synchronous: the robot waits; newest wins, ACT's temporal ensembling, real-time chunking by hard
//! inpainting or guided by the velocity's VJP), the same seeds run, and per episode the executed actions give the jerk (third
//! difference per tick) and the jump at chunk boundaries (the action's change at the tick a new
//! chunk takes over, beside its change at every other tick).

use reflex_agent::heldout::wilson_95;
use reflex_policies::onnx_policy::{OnnxPolicy, RunOptions};
use reflex_policies::rtc::RtcConfig;
use reflex_runtime::chunk::ChunkMode;
use reflex_runtime::clock::SimClock;
use reflex_runtime::control::{ControlLoop, LoopConfig, PolicyDriver};
use reflex_runtime::robot::Robot;
use reflex_sim::{SimConfig, SimEnv, TaskKind};
use serde::Serialize;
use std::path::PathBuf;

/// How the loop executes the chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecMode {
    /// Synchronous execution: the robot holds while each chunk is computed, then executes it
    /// from its first action (`[loop] chunks = { mode = "wait" }`).
    Sync,
    /// The newest chunk covering the time, switched to as soon as it arrives.
    Naive,
    /// ACT's temporal ensembling (`m = 0.01`) of every chunk covering the time.
    Ensemble,
    /// Real-time chunking, hard inpainting of the executing chunk (`[policy.rtc]` with
    /// `guidance = false`).
    RtcHard,
    /// Real-time chunking guided by the velocity's VJP (the paper's method; a flow model with a
    /// VJP graph).
    RtcGuided,
}

/// What to run.
#[derive(Clone, Debug)]
pub struct RtcBenchOptions {
    /// A diffusion or flow model (its spec beside it).
    pub model: PathBuf,
    /// Simulator task the model drives.
    pub task: TaskKind,
    /// The simulator's action space (the one the model was trained in).
    pub action: reflex_runtime::msg::ActionKind,
    /// Delays, in control ticks.
    pub delays: Vec<u32>,
    /// Modes.
    pub modes: Vec<ExecMode>,
    /// Episodes per delay and mode (the same seeds for each).
    pub episodes: u64,
    /// Seed of the episode stream and the policy's noise.
    pub seed: u64,
    /// The real-time chunking settings the RTC modes run with (`enabled` and `guidance` are set
    /// per mode).
    pub rtc: RtcConfig,
}

/// One delay and mode.
#[derive(Clone, Debug, Serialize)]
pub struct RtcCell {
    /// The mode.
    pub mode: ExecMode,
    /// Ticks from observation to hand-over.
    pub delay_ticks: u32,
    /// The delay as a fraction of the actions executed per chunk.
    pub delay_of_execute: f64,
    /// Episodes run.
    pub episodes: u64,
    /// Successes / episodes.
    pub success_rate: f64,
    /// Mean episode length, control ticks (a robot that waits takes longer).
    pub mean_steps: f64,
    /// 95% Wilson interval of the success rate.
    pub success_ci95: (f64, f64),
    /// Mean norm of the executed action's third difference, per tick (action units).
    pub jerk_mean: f64,
    /// Its 99th percentile.
    pub jerk_p99: f64,
    /// Mean change of the action at the ticks a new chunk took over.
    pub boundary_jump_mean: f64,
    /// Mean change of the action at every other tick (for scale).
    pub step_change_mean: f64,
    /// Ticks held for want of an action.
    pub holds_no_chunk: u64,
    /// Wall time of the cell.
    pub wall_s: f64,
}

/// The table.
#[derive(Clone, Debug, Serialize)]
pub struct RtcBenchReport {
    /// The model.
    pub model: String,
    /// Its actions per chunk and executed per chunk.
    pub chunk_len: usize,
    /// Actions executed per chunk.
    pub execute: usize,
    /// The RTC modes' settings.
    pub rtc: RtcConfig,
    /// Every delay and mode.
    pub cells: Vec<RtcCell>,
    /// What was not measured, said plainly.
    pub not_measured: Vec<String>,
}

fn norm(xs: impl Iterator<Item = f32>) -> f64 {
    xs.map(|x| (x as f64) * (x as f64)).sum::<f64>().sqrt()
}

/// Runs one delay and mode.
fn cell(
    o: &RtcBenchOptions,
    mode: ExecMode,
    delay: u32,
) -> Result<(RtcCell, usize, usize), Box<dyn std::error::Error + Send + Sync>> {
    let started = std::time::Instant::now();
    let mut sim = SimConfig::for_task(o.task);
    sim.action = o.action;
    let env = SimEnv::new(sim)?;
    let spec = env.spec().clone();
    let opts = RunOptions {
        seed: o.seed,
        ..RunOptions::default()
    };
    let mut policy = OnnxPolicy::load(&o.model, &spec, &opts)?;
    let (len, execute) = (policy.spec().chunk_len, policy.spec().execute);
    if mode == ExecMode::RtcGuided && !policy.has_vjp() {
        return Err(format!(
            "{}: mode rtc_guided needs a flow model with a VJP graph ([graph.vjp] in its spec; `reflex bc train --objective flow` writes one)",
            o.model.display()
        )
        .into());
    }
    policy.set_rtc(RtcConfig {
        enabled: matches!(mode, ExecMode::RtcHard | ExecMode::RtcGuided),
        guidance: mode == ExecMode::RtcGuided,
        ..o.rtc.clone()
    });
    let mut cfg = LoopConfig::at(spec.control_hz);
    cfg.chunks = match mode {
        ExecMode::Ensemble => ChunkMode::Ensemble { m: 0.01 },
        ExecMode::Sync => ChunkMode::Wait,
        _ => ChunkMode::NewestWins,
    };
    let mut lp = ControlLoop::builder(env, SimClock::new())
        .config(cfg)
        .policy(PolicyDriver::inline_delayed(Box::new(policy), delay))
        .seed(o.seed)
        .build()?;
    let (mut jerks, mut jumps, mut steps) = (vec![], vec![], vec![]);
    let mut hist: Vec<Vec<f32>> = vec![];
    let (mut episodes_seen, mut chunks_seen) = (0, lp.stats().chunks);
    while (lp.episodes().len() as u64) < o.episodes {
        lp.step()?;
        if lp.episodes().len() != episodes_seen {
            episodes_seen = lp.episodes().len();
            hist.clear();
            chunks_seen = lp.stats().chunks;
            continue;
        }
        let a = lp.last_action().to_vec();
        let boundary = lp.stats().chunks != chunks_seen;
        chunks_seen = lp.stats().chunks;
        if let Some(prev) = hist.last() {
            let change = norm(a.iter().zip(prev).map(|(x, y)| x - y));
            if boundary {
                jumps.push(change);
            } else {
                steps.push(change);
            }
        }
        hist.push(a);
        if hist.len() >= 4 {
            let n = hist.len();
            let (a0, a1, a2, a3) = (&hist[n - 1], &hist[n - 2], &hist[n - 3], &hist[n - 4]);
            jerks.push(norm(
                (0..a0.len()).map(|i| a0[i] - 3.0 * a1[i] + 3.0 * a2[i] - a3[i]),
            ));
        }
    }
    let eps = &lp.episodes()[..o.episodes as usize];
    let k = eps.iter().filter(|e| e.success).count() as u64;
    jerks.sort_by(f64::total_cmp);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    Ok((
        RtcCell {
            mode,
            delay_ticks: delay,
            delay_of_execute: delay as f64 / execute as f64,
            episodes: o.episodes,
            success_rate: k as f64 / o.episodes as f64,
            mean_steps: eps.iter().map(|e| e.steps as f64).sum::<f64>() / eps.len().max(1) as f64,
            success_ci95: wilson_95(k, o.episodes),
            jerk_mean: mean(&jerks),
            jerk_p99: reflex_runtime::hist::percentile(&jerks, 99.0),
            boundary_jump_mean: mean(&jumps),
            step_change_mean: mean(&steps),
            holds_no_chunk: lp.stats().holds_no_chunk,
            wall_s: started.elapsed().as_secs_f64(),
        },
        len,
        execute,
    ))
}

/// Runs every delay and mode, reporting each cell through `progress` as it finishes.
pub fn run(
    o: &RtcBenchOptions,
    progress: &mut dyn FnMut(&RtcCell),
) -> Result<RtcBenchReport, Box<dyn std::error::Error + Send + Sync>> {
    let mut cells = vec![];
    let (mut chunk_len, mut execute) = (0, 0);
    for &delay in &o.delays {
        for &mode in &o.modes {
            let (c, l, e) = cell(o, mode, delay)?;
            (chunk_len, execute) = (l, e);
            progress(&c);
            cells.push(c);
        }
    }
    Ok(RtcBenchReport {
        model: o.model.display().to_string(),
        chunk_len,
        execute,
        rtc: o.rtc.clone(),
        cells,
        not_measured: o
            .modes
            .iter()
            .all(|m| *m != ExecMode::RtcGuided)
            .then(|| "guided RTC (the paper's method): not among the modes run".to_string())
            .into_iter()
            .chain((o.task != TaskKind::Track).then(|| {
                format!(
                    "a task where timing matters: {} has a static target (`--task track` with a model trained on it has a moving one)",
                    o.task
                )
            }))
            .collect(),
    })
}
