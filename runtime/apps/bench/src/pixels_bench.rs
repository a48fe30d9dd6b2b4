//! `reflex bench pixels`: the cost of each stage of learning from pixels on this machine, in one
//! process, stage by stage:
//!
//! 1. the simulator's step with its cameras rendered, beside the same step without cameras (the
//!    difference is the rendering);
//! 2. the frozen encoder on every camera's frame (ONNX Runtime, the file `bc train` writes);
//! 3. the learner's actor with its image heads on the loop (plain Rust);
//! 4. one learner update (critics with the heads, actor, temperature) on a batch of feature rows.
//!
//! `frames_per_s` is what one core sustains through stages 1-3 (rendering, encoding, acting),
//! `steps_per_s_with_updates` the same with one update per step (an actor and its learner
//! sharing a core). Without `--encoder` a fresh encoder of the shape `bc train` writes is used:
//! its weights do not change its cost.

use reflex_agent::error::{Result, bail};
use reflex_contracts::robot::Robot;
use reflex_learn::sac::hook::{ActionNorm, ResidualMlp};
use reflex_learn::sac::replay::Transition;
use reflex_learn::sac::{Mode, Sac, SacConfig, VisionHeads};
use reflex_policies::features::{FeatureEncoder, encoder_spec_path};
use reflex_runtime::hist::Histogram;
use reflex_runtime::residual::ResidualHook;
use reflex_sim::config::SimConfig;
use reflex_sim::env::SimEnv;
use reflex_sim::task::TaskKind;
use reflex_vision::head::FeatureShape;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// What to measure.
#[derive(Clone, Debug)]
pub struct PixelsBenchOptions {
    /// The simulated task.
    pub task: TaskKind,
    /// Camera frame size (both cameras).
    pub width: u32,
    /// See `width`.
    pub height: u32,
    /// An encoder file (`<model>.encoder.onnx`); `None`: a fresh one of `bc train`'s shape.
    pub encoder: Option<PathBuf>,
    /// Environment steps timed.
    pub steps: usize,
    /// Learner updates timed.
    pub updates: usize,
    /// Learner batch size.
    pub batch: usize,
    /// The learner's random shift of the maps, places (`[learner.vision] shift`).
    pub shift: usize,
}

/// Percentiles of one stage, microseconds.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Stage {
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
}

impl Stage {
    fn of(h: &Histogram) -> Self {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        Stage {
            p50_us: us(h.percentile(50.0)),
            p99_us: us(h.percentile(99.0)),
        }
    }
}

/// What `reflex bench pixels` measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PixelsBenchReport {
    /// Task.
    pub task: String,
    /// Cameras rendered and encoded.
    pub cameras: Vec<String>,
    /// Frame width, pixels.
    pub width: u32,
    /// Frame height, pixels.
    pub height: u32,
    /// The encoder's id.
    pub encoder: String,
    /// Feature values per step (every camera's map).
    pub features: usize,
    /// Environment steps timed.
    pub steps: usize,
    /// Simulator step with cameras.
    pub sim_cameras: Stage,
    /// Simulator step without cameras.
    pub sim_no_cameras: Stage,
    /// The encoder on one step's frames (every camera).
    pub encode: Stage,
    /// The actor with its image heads on the loop.
    pub actor: Stage,
    /// One learner update.
    pub update: Stage,
    /// Learner batch size.
    pub batch: usize,
    /// The learner's random shift of the maps, places.
    pub shift: usize,
    /// Steps per second through rendering, encoding and acting (medians).
    pub frames_per_s: f64,
    /// Steps per second with one learner update each (medians).
    pub steps_per_s_with_updates: f64,
    /// Wall time of the whole bench, s.
    pub wall_s: f64,
}

/// Runs the bench.
pub fn run(o: &PixelsBenchOptions) -> Result<PixelsBenchReport> {
    let t_start = Instant::now();
    // A fresh encoder in a directory of the bench's own unless one is given.
    let (path, _scratch) = match &o.encoder {
        Some(p) => (p.clone(), None),
        None => {
            let s = crate::scratch::Scratch::new("bench-pixels")?;
            (fresh_encoder(o, s.path())?, Some(s))
        }
    };
    let mut encoder = FeatureEncoder::load(&path, &Default::default())?;
    let cameras: Vec<String> = encoder
        .spec()
        .cameras
        .iter()
        .map(|c| c.camera.clone())
        .collect();
    let (mut env, mut blind) = sims(o, &cameras, &path)?;
    let state_dim = env.spec().state_dim();
    let act_dim = env.spec().action.dim();
    let features = encoder.features_len();
    let mut sac = heads_learner(o, &encoder, state_dim, act_dim)?;
    let spec = env.spec().clone();
    let norm = ActionNorm::new(
        &spec.action.low,
        &spec.action.high,
        &sac.cfg.residual_bounds(sac.act_dim),
    );
    let (mut hook, _writer) = ResidualMlp::new(&sac, norm, true, 1)?;
    let mut h = Timings::new();
    let mut hold = vec![0.0; act_dim];
    env.hold_action(&mut hold);
    env.reset(Some(1))?;
    blind.reset(Some(1))?;
    let mut row = vec![0.0; state_dim + features];
    let mut prev: Option<Vec<f32>> = None;
    let (base, mut out) = (hold.clone(), vec![0.0; act_dim]);
    for step in 0..o.steps {
        let t = Instant::now();
        env.command(&hold)?;
        let obs = env.observe()?;
        h.sim.record(t.elapsed());
        row[..state_dim].copy_from_slice(&obs.state);
        let t = Instant::now();
        encoder
            .encode(&obs.images, &mut row[state_dim..])
            .map_err(|e| bail(e.to_string()))?;
        h.enc.record(t.elapsed());
        let done = obs.done();
        let t = Instant::now();
        hook.residual(&row, &base, &mut out);
        h.act.record(t.elapsed());
        let t = Instant::now();
        blind.command(&hold)?;
        let b_done = blind.observe()?.done();
        h.blind.record(t.elapsed());
        if let Some(p) = prev.take() {
            sac.online.push(&Transition {
                obs: p,
                base: vec![0.0; act_dim],
                action: vec![0.0; act_dim],
                next_obs: row.clone(),
                next_base: vec![0.0; act_dim],
                truncated: done,
                ..Default::default()
            });
        }
        prev = Some(row.clone());
        if done || step % 200 == 199 {
            env.reset(None)?;
            prev = None;
        }
        if b_done {
            blind.reset(None)?;
        }
    }
    if sac.online.is_empty() {
        return Err(bail(
            "no transitions to learn from: give --steps 2 or more".into(),
        ));
    }
    time_updates(&mut sac, o.updates, &mut h.upd)?;
    Ok(h.report(o, cameras, encoder.id(), features, t_start))
}

/// The stages' times.
struct Timings {
    sim: Histogram,
    blind: Histogram,
    enc: Histogram,
    act: Histogram,
    upd: Histogram,
}

impl Timings {
    fn new() -> Self {
        Timings {
            sim: Histogram::new(),
            blind: Histogram::new(),
            enc: Histogram::new(),
            act: Histogram::new(),
            upd: Histogram::new(),
        }
    }

    fn report(
        &self,
        o: &PixelsBenchOptions,
        cameras: Vec<String>,
        encoder: &str,
        features: usize,
        t_start: Instant,
    ) -> PixelsBenchReport {
        let (sim, enc, act, upd) = (
            Stage::of(&self.sim),
            Stage::of(&self.enc),
            Stage::of(&self.act),
            Stage::of(&self.upd),
        );
        let per_frame = sim.p50_us + enc.p50_us + act.p50_us;
        PixelsBenchReport {
            task: o.task.to_string(),
            cameras,
            width: o.width,
            height: o.height,
            encoder: encoder.into(),
            features,
            steps: o.steps,
            frames_per_s: 1e6 / per_frame,
            steps_per_s_with_updates: 1e6 / (per_frame + upd.p50_us),
            sim_cameras: sim,
            sim_no_cameras: Stage::of(&self.blind),
            encode: enc,
            actor: act,
            update: upd,
            batch: o.batch,
            shift: o.shift,
            wall_s: t_start.elapsed().as_secs_f64(),
        }
    }
}

/// The simulator with the cameras the encoder reads, and the same one without cameras.
fn sims(
    o: &PixelsBenchOptions,
    cameras: &[String],
    path: &std::path::Path,
) -> Result<(SimEnv, SimEnv)> {
    let mut cfg = SimConfig::for_task(o.task);
    cfg.cameras.enabled = true;
    cfg.cameras.width = o.width;
    cfg.cameras.height = o.height;
    let env = SimEnv::new(cfg.clone())?;
    cfg.cameras.enabled = false;
    let blind = SimEnv::new(cfg)?;
    let have: Vec<String> = env.spec().cameras.iter().map(|c| c.name.clone()).collect();
    if let Some(c) = cameras.iter().find(|c| !have.contains(c)) {
        return Err(bail(format!(
            "encoder `{}` reads camera `{c}`; the simulator has {have:?}",
            path.display()
        )));
    }
    Ok((env, blind))
}

/// The residual learner with image heads on `encoder`'s feature maps.
fn heads_learner(
    o: &PixelsBenchOptions,
    encoder: &FeatureEncoder,
    state_dim: usize,
    act_dim: usize,
) -> Result<Sac> {
    let vision = VisionHeads {
        encoder_id: encoder.id().into(),
        features: encoder
            .spec()
            .cameras
            .iter()
            .map(|c| FeatureShape {
                camera: c.camera.clone(),
                channels: c.channels as usize,
                height: c.map_height as usize,
                width: c.map_width as usize,
            })
            .collect(),
        embeddings: reflex_vision::head::EMBEDDINGS,
        width: reflex_vision::head::WIDTH,
        bc_trains_heads: true,
        shift: o.shift,
    };
    Ok(Sac::new(
        SacConfig {
            mode: Mode::Residual,
            batch: o.batch,
            vision: Some(vision),
            capacity: o.steps.max(o.batch),
            seed: 1,
            ..Default::default()
        },
        state_dim,
        act_dim,
    )?)
}

/// Warm-up updates (first-touch allocations), then `n` timed ones into `h`.
fn time_updates(sac: &mut Sac, n: usize, h: &mut Histogram) -> Result<()> {
    for _ in 0..3 {
        sac.train_step()?;
    }
    for _ in 0..n {
        let t = Instant::now();
        sac.train_step()?;
        h.record(t.elapsed());
    }
    Ok(())
}

/// A fresh encoder of `bc train`'s shape for both simulator cameras, written to `dir`
/// (returned path: the file).
fn fresh_encoder(o: &PixelsBenchOptions, dir: &std::path::Path) -> Result<PathBuf> {
    use rand::SeedableRng;
    use reflex_vision::encoder::{ImageEncoder, frozen_encoder};
    let path = dir.join("bench.encoder.onnx");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let (w, h) = (o.width as usize, o.height as usize);
    let encoders = ["front", "wrist"]
        .iter()
        .map(|c| ImageEncoder::new(c, w, h, &mut rng, &candle_core::Device::Cpu))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| bail(e.to_string()))?;
    let (bytes, spec) =
        frozen_encoder(&encoders, "bench", None).map_err(|e| bail(e.to_string()))?;
    let io = |p: &std::path::Path, e| reflex_agent::error::AgentError::io(p, e);
    std::fs::write(&path, bytes).map_err(|e| io(&path, e))?;
    let sp = encoder_spec_path(&path);
    std::fs::write(&sp, spec.to_toml()).map_err(|e| io(&sp, e))?;
    Ok(path)
}
