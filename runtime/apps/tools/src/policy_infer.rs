//! `reflex policy infer`: a model run on observations read from a file, its chunks written out.
//! It is how another program compares its own policy with reflex's (policies/import/parity.py
//! against LeRobot): the same observations in, the chunks and the time each took out.
//!
//! The file is JSON:
//! ```json
//! {"observations": [
//!   {"state": [0.1, ...],
//!    "images": [{"camera": "front", "width": 128, "height": 128, "rgb8": [12, 40, ...]}],
//!    "noise": [0.3, ...],
//!    "past": [{"state": [...], "images": [...]}]}
//! ]}
//! ```
//! `images` (row-major rgb8 bytes), `noise` and `past` are optional. `noise` is the initial
//! sample of a diffusion or flow policy (chunk_len x action_dim), for a DDPM policy optionally
//! followed by the noise of each later step. `past` holds the observations of the control steps
//! before this one, oldest first, for a policy with a history (`history` > 1 in its spec); without
//! it the observation stands in for them, as at an episode's start.

use reflex_agent::AgentError;
use reflex_agent::error::Result;
use reflex_import::RobotSource;
use reflex_policies::onnx_policy::{OnnxPolicy, RunOptions};
use reflex_policies::spec::PolicySpec;
use reflex_runtime::msg::{Image, Observation};
use reflex_runtime::policy::Policy;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Instant;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ImageIn {
    camera: String,
    width: u32,
    height: u32,
    rgb8: Vec<u8>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ObservationIn {
    state: Vec<f32>,
    #[serde(default)]
    images: Vec<ImageIn>,
    #[serde(default)]
    noise: Option<Vec<f32>>,
    #[serde(default)]
    past: Vec<ObservationIn>,
}

impl ObservationIn {
    /// The observation the policy takes (its noise, if any, is set apart by the caller).
    fn into_observation(self) -> Observation {
        Observation {
            state: self.state,
            images: self
                .images
                .into_iter()
                .map(|i| Image {
                    camera: i.camera,
                    width: i.width,
                    height: i.height,
                    encoding: "rgb8".into(),
                    seq: 0,
                    age_ns: 0,
                    data: i.rgb8,
                })
                .collect(),
            ..Observation::default()
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ObservationsFile {
    observations: Vec<ObservationIn>,
}

/// The chunks and their times.
#[derive(Clone, Debug, Serialize)]
pub struct InferReport {
    /// The model.
    pub model: String,
    /// Actions per chunk.
    pub chunk_len: usize,
    /// Components per action.
    pub action_dim: usize,
    /// One chunk per observation, `[chunk_len][action_dim]`, in the robot's units.
    pub chunks: Vec<Vec<Vec<f32>>>,
    /// Per observation, the median time of `repeat` chunks on it, µs.
    pub chunk_us: Vec<f64>,
    /// The median over all observations' chunks, µs.
    pub p50_us: f64,
    /// ONNX Runtime's intra-op threads.
    pub intra_threads: usize,
    /// Chunks timed per observation (after `warmup` untimed).
    pub repeat: usize,
}

/// Runs `model` on every observation of `observations` (the file format is in the module's
/// documentation) for the robot the spec names (`sim/<task>`) or `robot`. Each chunk is
/// computed `warmup + repeat` times; the first is the one reported, and every repeat must equal
/// it (a chunk policy is a function; a sampled one gets the same noise each time).
///
/// # Errors
/// The file, the robot or the model at fault, by name.
pub fn infer(
    model: &Path,
    observations: &Path,
    robot: Option<RobotSource>,
    threads: usize,
    warmup: usize,
    repeat: usize,
) -> Result<InferReport> {
    reflex_policies::onnx_policy::model_file(model)?;
    let spec = PolicySpec::load_for(model)?;
    let robot = robot_for(model, &spec, robot)?;
    let file = read_observations(observations)?;
    let opts = RunOptions {
        intra_threads: threads,
        ..RunOptions::default()
    };
    let mut policy = OnnxPolicy::load(model, &robot, &opts)?;
    let n = spec.rows() * spec.action_dim;
    let (noise0, noise_all) = (
        policy.noise_len(),
        policy.noise_len() + policy.step_noise_len(),
    );
    let mut chunk = vec![0.0f32; n];
    let mut again = vec![0.0f32; n];
    let (mut chunks, mut chunk_us, mut all) = (vec![], vec![], vec![]);
    for (k, mut o) in file.observations.into_iter().enumerate() {
        let bad =
            |m: String| AgentError::setup(format!("{} observation {k}", observations.display()), m);
        let past = take_past(&mut o, robot.state_dim(), &robot.kind, &bad)?;
        let noise = o.noise.take();
        if !past.is_empty() && past.len() != policy.past_steps() {
            return Err(bad(format!(
                "`past` holds {} observations; the policy reads {} before the current one",
                past.len(),
                policy.past_steps()
            )));
        }
        let obs = o.into_observation();
        let mut times = Vec::with_capacity(repeat);
        for r in 0..warmup + repeat {
            if let Some(noise) = &noise {
                if noise.len() != noise0 && noise.len() != noise_all {
                    return Err(bad(format!(
                        "noise has {} values; the chunk has {noise0} ({} x {}){}",
                        noise.len(),
                        spec.chunk_len,
                        spec.action_dim,
                        if noise_all > noise0 {
                            format!(", {noise_all} with every DDPM step's noise")
                        } else {
                            String::new()
                        }
                    )));
                }
                policy.set_next_noise_from(noise);
            }
            if !past.is_empty() {
                policy.observe_past(&past);
            }
            let out = if r == 0 { &mut chunk } else { &mut again };
            let t0 = Instant::now();
            policy.infer_chunk(&obs, out)?;
            let us = t0.elapsed().as_secs_f64() * 1e6;
            if r >= warmup {
                times.push(us);
            }
            if r > 0
                && again != chunk
                && (noise.is_some() || spec.kind == reflex_policies::spec::PolicyKind::Chunk)
            {
                return Err(bad(
                    "the same observation gave two different chunks: the model is not deterministic".into(),
                ));
            }
        }
        times.sort_by(f64::total_cmp);
        all.extend_from_slice(&times);
        chunk_us.push(reflex_runtime::hist::percentile(&times, 50.0));
        chunks.push(chunk.chunks(spec.action_dim).map(<[f32]>::to_vec).collect());
    }
    all.sort_by(f64::total_cmp);
    Ok(InferReport {
        model: model.display().to_string(),
        chunk_len: spec.rows(),
        action_dim: spec.action_dim,
        chunks,
        chunk_us,
        p50_us: reflex_runtime::hist::percentile(&all, 50.0),
        intra_threads: threads,
        repeat,
    })
}

/// The `past` observations `o` carries, each checked as the observation itself: a state of the
/// robot's size, no `noise` or `past` of its own.
fn take_past(
    o: &mut ObservationIn,
    state_dim: usize,
    kind: &str,
    bad: &dyn Fn(String) -> AgentError,
) -> Result<Vec<Observation>> {
    let past = std::mem::take(&mut o.past);
    for (what, p) in std::iter::once(("state", &*o)).chain(past.iter().map(|p| ("past state", p))) {
        if p.state.len() != state_dim {
            return Err(bad(format!(
                "{what} has {} values; robot `{kind}` has {state_dim}",
                p.state.len()
            )));
        }
    }
    if past.iter().any(|p| p.noise.is_some() || !p.past.is_empty()) {
        return Err(bad(
            "a past observation carries `noise` or `past`: only the observation inferred on does"
                .into(),
        ));
    }
    Ok(past
        .into_iter()
        .map(ObservationIn::into_observation)
        .collect())
}

/// The robot the model runs for: `robot`, else the one its spec names.
fn robot_for(
    model: &Path,
    spec: &PolicySpec,
    robot: Option<RobotSource>,
) -> Result<reflex_contracts::msg::RobotSpec> {
    let robot = match robot {
        Some(r) => r,
        None => RobotSource::Kind(spec.robot_kind.clone().ok_or_else(|| {
            AgentError::setup(
                format!("spec of `{}`", model.display()),
                "names no robot_kind: give the robot with --robot-kind or --robot-spec",
            )
        })?),
    };
    robot
        .spec()
        .map_err(|e| AgentError::setup("robot", e.to_string()))
}

fn read_observations(observations: &Path) -> Result<ObservationsFile> {
    let text =
        std::fs::read_to_string(observations).map_err(|e| AgentError::io(observations, e))?;
    serde_json::from_str(&text).map_err(|e| {
        AgentError::setup(
            observations.display().to_string(),
            format!(
                "not an observations file ({e}); the format is in `reflex policy infer --help`"
            ),
        )
    })
}
