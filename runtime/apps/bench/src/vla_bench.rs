//! `reflex bench vla`: a flow VLA at its real cost on this CPU, in the two ways it can be run,
//! and the control loop at 30 Hz beside it.
//!
//! The VLA is [`crate::vla_graphs`]' SmolVLA-shaped network with random weights. Per chunk it is
//! timed as two graphs (the prefix once, the action expert at every integration step against
//! the prefix's cached keys and values: `[graph.prefix]`) and as one graph (the whole network at
//! every step), alternating, on the same observation. Then the simulator runs in wall time at
//! the loop rate twice: with the VLA on its policy thread, executing with real-time chunking at
//! whatever delay its own timings give (the start threshold), and with no policy at all, for the
//! loop's lateness on its own. The weights are random, so the arm's motion means nothing: what is
//! measured is time.

use crate::vla_graphs::{VlaShape, build, cache_names};
use reflex_agent::error::{AgentError, Result};
use reflex_policies::onnx_policy::{OnnxPolicy, RunOptions};
use reflex_policies::rtc::{RtcConfig, RtcVariant};
use reflex_runtime::clock::WallClock;
use reflex_runtime::control::{ControlLoop, LoopConfig, PolicyDriver};
use reflex_runtime::hist::percentile;
use reflex_runtime::policy::{ChunkPrefix, PolicyThread};
use reflex_runtime::robot::Robot;
use reflex_sim::{SimConfig, SimEnv, TaskKind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What to run.
#[derive(Clone, Debug)]
pub struct VlaBenchOptions {
    /// Loop rate, Hz.
    pub hz: f64,
    /// Seconds each loop run lasts.
    pub seconds: f64,
    /// Chunks timed per way of running the VLA.
    pub chunks: usize,
    /// Actions executed per chunk (of 50).
    pub execute: usize,
    /// Flow integration steps per chunk.
    pub flow_steps: usize,
    /// ONNX Runtime's intra-op threads for the VLA.
    pub threads: usize,
    /// Where the graphs are written (kept, so `reflex policy bench` can time them again).
    pub dir: PathBuf,
    /// [`VlaShape::tiny`] instead of [`VlaShape::reduced_smolvla`] (tests).
    pub tiny: bool,
    /// Real-time settings of the loop thread (`[loop.rt]`), applied once the VLA's thread has
    /// started (it does not inherit them), for both loop runs.
    pub rt: reflex_runtime::rt::RtConfig,
}

/// Per-chunk latency of one way of running the VLA.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ChunkTiming {
    /// Median chunk, µs.
    pub p50_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// Of it, the prefix graph's median (two graphs only), µs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_p50_us: Option<f64>,
    /// Of it, the expert's median over all integration steps (two graphs only), µs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expert_p50_us: Option<f64>,
}

/// The loop in wall time on the simulator.
#[derive(Clone, Debug, serde::Serialize)]
pub struct VlaLoopRun {
    /// What drove the robot.
    pub policy: String,
    /// Ticks run.
    pub ticks: u64,
    /// Median wake-up lateness, µs.
    pub lateness_p50_us: f64,
    /// 99th percentile, µs.
    pub lateness_p99_us: f64,
    /// Latest wake-up, µs.
    pub lateness_max_us: f64,
    /// Ticks missed (a whole period late).
    pub missed: u64,
    /// Steps whose work took longer than a period.
    pub overruns: u64,
    /// Median per-step work (the simulator and its camera included), µs.
    pub step_p50_us: f64,
    /// Ticks held for want of an action (after the first chunk).
    pub holds_no_chunk: u64,
    /// Chunks the loop took.
    pub chunks: u64,
    /// Episodes that ended (each new one waits for its first chunk: those ticks are holds).
    pub episodes: u64,
    /// The real-time chunking sampler the VLA's last chunk used (`None`: plain sampling, or no
    /// policy).
    pub rtc: Option<RtcVariant>,
}

/// What `reflex bench vla` measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct VlaBenchReport {
    /// The network's sizes.
    pub shape: VlaShape,
    /// Weights in the prefix graph, millions.
    pub prefix_params_m: f64,
    /// Weights in the expert, millions.
    pub expert_params_m: f64,
    /// Flow integration steps per chunk.
    pub flow_steps: usize,
    /// ONNX Runtime's intra-op threads.
    pub threads: usize,
    /// Prefix once, expert per step.
    pub two_graphs: ChunkTiming,
    /// The whole network per step.
    pub single_graph: ChunkTiming,
    /// The single graph's median over the two graphs'.
    pub single_over_two: f64,
    /// Largest difference between the two ways' chunks for the same observation and noise.
    pub max_abs_diff: f64,
    /// Loop rate, Hz.
    pub hz: f64,
    /// Actions executed per chunk.
    pub execute: usize,
    /// The two graphs' median chunk in control ticks (rounded up): the delay real-time chunking
    /// freezes.
    pub delay_ticks: usize,
    /// The loop with the VLA on its thread (real-time chunking, hard inpainting).
    pub with_vla: VlaLoopRun,
    /// The same loop with no policy.
    pub without_policy: VlaLoopRun,
    /// Where the graphs are.
    pub dir: String,
    /// The loop thread's real-time settings and what became of each.
    pub rt: Vec<String>,
}

/// The tokenizer the graphs' instruction goes through (a word-level vocabulary; the network's
/// embedding has a row per word).
const TOKENIZER: &str = r#"{
  "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
  "normalizer": {"type": "Lowercase"}, "pre_tokenizer": {"type": "Whitespace"},
  "post_processor": null, "decoder": null,
  "model": {"type": "WordLevel", "unk_token": "[UNK]",
            "vocab": {"[PAD]": 0, "[UNK]": 1, "pick": 2, "up": 3, "the": 4, "cube": 5, "red": 6, "and": 7}}
}"#;

fn spec_text(v: &VlaShape, name: &str, execute: usize, steps: usize, prefix: bool) -> String {
    let graph_prefix = if prefix {
        format!(
            "\n[graph.prefix]\nfile = \"{name}.prefix.onnx\"\noutputs = {:?}\n",
            cache_names(v)
        )
    } else {
        String::new()
    };
    format!(
        r#"format = "reflex-policy"
version = 1
name = "{name}"
kind = "flow"
action_dim = {a}
chunk_len = {t}
execute = {execute}
flow_steps = {steps}
robot_kind = "sim/pick"

[graph]
sample_input = "x_t"
time_input = "t"
output = "velocity"
{graph_prefix}
[[inputs]]
source = "image"
name = "image"
camera = "front"
width = {s}
height = {s}
mean = [0.5, 0.5, 0.5]
std = [0.5, 0.5, 0.5]

[[inputs]]
source = "language"
name = "tokens"
tokenizer = "tokenizer.json"
instruction = "pick up the red cube"
max_len = {l}

[[inputs]]
source = "state"
name = "state"
fields = ["joint_pos"]
"#,
        a = v.action_dim,
        t = v.chunk_len,
        s = v.image,
        l = v.tokens,
    )
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    reflex_runtime::fsio::atomic_write(path, bytes).map_err(|e| AgentError::io(path, e))
}

/// Writes the two-graph VLA (`vla.onnx` + `vla.prefix.onnx`) and the single graph
/// (`vla-single.onnx`) with their specs and tokenizer into `dir`; returns both models' paths.
pub fn write_models(
    dir: &Path,
    v: &VlaShape,
    execute: usize,
    steps: usize,
) -> Result<(PathBuf, PathBuf)> {
    std::fs::create_dir_all(dir).map_err(|e| AgentError::io(dir, e))?;
    let g = build(v, 7);
    write(&dir.join("tokenizer.json"), TOKENIZER.as_bytes())?;
    let (two, one) = (dir.join("vla.onnx"), dir.join("vla-single.onnx"));
    write(&dir.join("vla.prefix.onnx"), &g.prefix)?;
    write(&two, &g.expert)?;
    write(&one, &g.single)?;
    let spec = reflex_policies::spec::spec_path;
    write(
        &spec(&two),
        spec_text(v, "vla", execute, steps, true).as_bytes(),
    )?;
    write(
        &spec(&one),
        spec_text(v, "vla-single", execute, steps, false).as_bytes(),
    )?;
    Ok((two, one))
}

/// The simulator with its front camera, as the VLA sees it.
fn sim() -> Result<SimEnv> {
    let mut cfg = SimConfig::for_task(TaskKind::Pick);
    cfg.cameras.enabled = true;
    cfg.cameras.width = 128;
    cfg.cameras.height = 128;
    Ok(SimEnv::new(cfg)?)
}

fn loop_run(
    name: &str,
    hz: f64,
    seconds: f64,
    policy: Option<OnnxPolicy>,
    rt: &reflex_runtime::rt::RtConfig,
) -> Result<(VlaLoopRun, Vec<String>)> {
    let mut env = sim()?;
    let template = env.reset(Some(0))?.clone();
    let has_policy = policy.is_some();
    let driver = match policy {
        Some(p) => PolicyDriver::Thread(PolicyThread::spawn(Box::new(p), &template)),
        None => PolicyDriver::None,
    };
    let mut lp = ControlLoop::builder(env, WallClock::new(Duration::from_micros(50)))
        .config(LoopConfig::at(hz))
        .policy(driver)
        .seed(0)
        .build()?;
    let rt = reflex_runtime::rt::apply(rt)
        .into_iter()
        .map(|r| {
            format!(
                "{}: {} ({})",
                r.setting,
                if r.ok { "ok" } else { "refused" },
                r.detail
            )
        })
        .collect();
    // Until the first chunk arrives (or for a second with no policy): not counted.
    if has_policy {
        let t0 = Instant::now();
        while lp.stats().chunks == 0 {
            if t0.elapsed() > Duration::from_secs(120) {
                return Err(AgentError::setup(
                    "reflex bench vla",
                    "the VLA gave no chunk within 120 s",
                ));
            }
            lp.run_ticks(1)?;
        }
    } else {
        lp.run_ticks(hz.round() as u64)?;
    }
    let warm = lp.stats().clone();
    lp.run_ticks((seconds * hz).round() as u64)?;
    let s = lp.stats();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let run = VlaLoopRun {
        policy: name.into(),
        ticks: s.ticks - warm.ticks,
        lateness_p50_us: us(s.lateness.percentile(50.0)),
        lateness_p99_us: us(s.lateness.percentile(99.0)),
        lateness_max_us: us(s.lateness.max()),
        missed: s.missed - warm.missed,
        overruns: s.overruns - warm.overruns,
        step_p50_us: us(s.step.percentile(50.0)),
        holds_no_chunk: s.holds_no_chunk - warm.holds_no_chunk,
        chunks: s.chunks - warm.chunks,
        episodes: s.episodes - warm.episodes,
        rtc: None,
    };
    Ok((run, rt))
}

fn timing(lat: &mut [f64], prefix: Option<&mut [f64]>) -> ChunkTiming {
    lat.sort_by(f64::total_cmp);
    let prefix_p50 = prefix.map(|p| {
        p.sort_by(f64::total_cmp);
        percentile(p, 50.0)
    });
    ChunkTiming {
        p50_us: percentile(lat, 50.0),
        p99_us: percentile(lat, 99.0),
        prefix_p50_us: prefix_p50,
        expert_p50_us: prefix_p50.map(|p| percentile(lat, 50.0) - p),
    }
}

/// Runs the benchmark; `progress` hears what is being done.
pub fn run(o: &VlaBenchOptions, progress: &mut dyn FnMut(&str)) -> Result<VlaBenchReport> {
    let mut env = sim()?;
    let obs = env.reset(Some(0))?.clone();
    let spec = env.spec().clone();
    let joints = spec
        .field("joint_pos")
        .ok_or_else(|| AgentError::setup("reflex bench vla", "the simulator has no joint_pos"))?;
    let v = if o.tiny {
        VlaShape::tiny(joints.len(), spec.action.dim(), 8)
    } else {
        VlaShape::reduced_smolvla(joints.len(), spec.action.dim(), 8)
    };
    if !(1..=v.chunk_len).contains(&o.execute) {
        return Err(AgentError::setup(
            "--execute",
            format!("must be 1-{} (the chunk's length)", v.chunk_len),
        ));
    }
    progress("writing the graphs");
    let (two, one) = write_models(&o.dir, &v, o.execute, o.flow_steps)?;
    let opts = RunOptions {
        intra_threads: o.threads,
        ..RunOptions::default()
    };
    let mut p2 = OnnxPolicy::load(&two, &spec, &opts)?;
    let mut p1 = OnnxPolicy::load(&one, &spec, &opts)?;
    let n = v.chunk_len * v.action_dim;
    let noise: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37).sin()).collect();
    let (mut c2, mut c1) = (vec![0.0f32; n], vec![0.0f32; n]);
    let (mut l2, mut l1, mut lp) = (vec![], vec![], vec![]);
    let mut max_abs_diff = 0.0f64;
    // One of each to warm up, then alternating.
    for i in 0..=o.chunks {
        progress(&format!("timing chunk {i} of {}", o.chunks));
        p2.set_next_noise_from(&noise);
        let t0 = Instant::now();
        p2.infer_chunk(&obs, &mut c2)?;
        let d2 = t0.elapsed().as_secs_f64() * 1e6;
        p1.set_next_noise_from(&noise);
        let t0 = Instant::now();
        p1.infer_chunk(&obs, &mut c1)?;
        let d1 = t0.elapsed().as_secs_f64() * 1e6;
        for (a, b) in c1.iter().zip(&c2) {
            max_abs_diff = max_abs_diff.max((a - b).abs() as f64);
        }
        if i > 0 {
            l2.push(d2);
            l1.push(d1);
            lp.push(p2.last_prefix_time().unwrap_or_default().as_secs_f64() * 1e6);
        }
    }
    drop(p1);
    let two_graphs = timing(&mut l2, Some(&mut lp));
    let single_graph = timing(&mut l1, None);
    let period_us = 1e6 / o.hz;
    let delay_ticks = (two_graphs.p50_us / period_us).ceil() as usize;
    // The RTC path runs once here so the run can say which sampler it uses.
    p2.set_rtc(RtcConfig {
        enabled: true,
        ..RtcConfig::default()
    });
    let prefix = ChunkPrefix {
        actions: &c2,
        covered: v.chunk_len - o.execute,
        delay: delay_ticks.min(v.chunk_len - o.execute),
    };
    let mut scratch = vec![0.0f32; n];
    p2.infer_chunk_with(&obs, Some(&prefix), &mut scratch)?;
    let variant = p2.rtc_variant();
    progress(&format!(
        "the loop at {} Hz with the VLA for {} s",
        o.hz, o.seconds
    ));
    let (mut with_vla, rt) = loop_run("vla (two graphs, rtc)", o.hz, o.seconds, Some(p2), &o.rt)?;
    with_vla.rtc = variant;
    progress(&format!("the loop with no policy for {} s", o.seconds));
    let (without_policy, _) = loop_run("none", o.hz, o.seconds, None, &o.rt)?;
    let (pp, ep) = v.parameters();
    Ok(VlaBenchReport {
        shape: v,
        prefix_params_m: pp as f64 / 1e6,
        expert_params_m: ep as f64 / 1e6,
        flow_steps: o.flow_steps,
        threads: o.threads,
        single_over_two: single_graph.p50_us / two_graphs.p50_us,
        two_graphs,
        single_graph,
        max_abs_diff,
        hz: o.hz,
        execute: o.execute,
        delay_ticks,
        with_vla,
        without_policy,
        dir: o.dir.display().to_string(),
        rt,
    })
}
