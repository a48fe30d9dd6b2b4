//! `reflex learn --config F`: the learner as its own process, on this machine or a GPU
//! workstation, talking to the actor (`reflex run --config F`, the same file) over the bus.
//!
//! It takes the actor's numbered transitions (accepting only the next number, so resends after a
//! reconnect are dropped and gaps refused), stores them as `reflex demo` does (relabelling, RLIF,
//! both buffers for a person's steps), trains, publishes versioned residual weights in chunks,
//! and checkpoints everything atomically, sequence numbers included. After a crash it resumes
//! from the checkpoint and tells the actor where to resend from: no transition is lost or stored
//! twice.

use crate::assemble::Assembler;
use crate::cli::BusArgs;
use anyhow::{Context, bail};
use clap::Args;
use reflex_policies::onnx_policy::{OnnxPolicy, RunOptions};
use reflex_policies::sac::hook::{ActionNorm, export_actor};
use reflex_policies::sac::{Mode, Sac, SacConfig};
use reflex_runtime::bus::Keys;
use reflex_runtime::learnlink::LinkConfig;
use reflex_runtime::msg::{self, LearnerState, PROTOCOL_VERSION, TransitionBatch, WeightsChunk};
use serde::Deserialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use zenoh::Wait;

fn d_ckpt() -> PathBuf {
    PathBuf::from("runs/learner/sac.ckpt")
}
fn d_every() -> f64 {
    10.0
}
fn d_one() -> u64 {
    1
}

/// `[learner]` of a run config: shared by the actor (`reflex run`) and the learner.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LearnerSection {
    /// Checkpoint file of the learner (resumed from when it exists).
    #[serde(default = "d_ckpt")]
    pub checkpoint: PathBuf,
    /// Seconds between checkpoints (the actor keeps what is not in one yet).
    #[serde(default = "d_every")]
    pub checkpoint_every_s: f64,
    /// Publish new weights every this many episodes.
    #[serde(default = "d_one")]
    pub publish_every_episodes: u64,
    /// RLIF: reward -1 on the step before each takeover.
    #[serde(default)]
    pub rlif: bool,
    /// SAC hyperparameters (docs/learner.md); keys not given keep the demo's values.
    #[serde(default)]
    pub sac: Option<toml::Table>,
    /// The actor's side of the link.
    #[serde(default)]
    pub link: LinkConfig,
    /// Run the learner inside `reflex run` (a thread on the same bus session) rather than as a
    /// separate `reflex learn` process.
    #[serde(default = "d_true")]
    pub in_process: bool,
    /// With `[run] clock = "sim"`: before each episode, let the learner take every step so far
    /// (the actor runs ahead of it otherwise). Never inside an episode.
    #[serde(default = "d_true")]
    pub pace_lockstep: bool,
}

fn d_true() -> bool {
    true
}

impl LearnerSection {
    /// The SAC settings: the demo's, with the keys of `[learner.sac]` replacing them (always the
    /// residual mode: the learner refines a base policy).
    pub fn sac_config(&self, seed: u64) -> SacConfig {
        let base = crate::demo::demo_learner(Mode::Residual, seed);
        let c = match &self.sac {
            Some(t) => crate::demo::overlay_sac(base.clone(), t).unwrap_or(base),
            None => base,
        };
        SacConfig {
            mode: Mode::Residual,
            ..c
        }
    }

    /// Checks ranges, naming the key.
    pub fn validate(&self) -> Result<(), reflex_runtime::config::Invalid> {
        use reflex_runtime::config::{Validate, in_range};
        in_range(
            "learner",
            "checkpoint_every_s",
            self.checkpoint_every_s,
            0.05,
            86_400.0,
        )?;
        in_range(
            "learner",
            "publish_every_episodes",
            self.publish_every_episodes,
            1,
            1_000_000,
        )?;
        if let Some(t) = &self.sac {
            crate::demo::overlay_sac(crate::demo::demo_learner(Mode::Residual, 0), t).map_err(
                |e| reflex_runtime::config::Invalid {
                    key: "learner.sac".into(),
                    value: e,
                    allowed: "the SAC keys of docs/learner.md".into(),
                },
            )?;
        }
        self.link.validate("learner.link")
    }
}

#[derive(Args)]
pub struct LearnArgs {
    /// The run config (the actor's); its `[learner]` table configures the learner.
    #[arg(long)]
    config: PathBuf,
    /// Stop when the actor has gone (its liveliness token) and everything it sent is checkpointed.
    #[arg(long)]
    exit_when_actor_leaves: bool,
    /// Stop after this many seconds.
    #[arg(long)]
    seconds: Option<f64>,
    /// How long to wait for the actor's spec, s.
    #[arg(long, default_value_t = 600.0)]
    wait_s: f64,
    /// Print a JSON summary at the end.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    bus: BusArgs,
}

const TAG_ACTOR: &str = "link.actor";
const TAG_RECEIVED: &str = "link.received";
const TAG_VERSION: &str = "link.weights_version";
/// Floats per weight chunk (64 KiB of payload).
const CHUNK: usize = 16 * 1024;

/// How a learner runs, besides its config.
pub struct LearnOpts {
    /// Stop when the actor has gone and everything it sent is checkpointed.
    pub exit_when_actor_leaves: bool,
    /// Stop after this many seconds.
    pub seconds: Option<f64>,
    /// How long to wait for the actor's spec.
    pub wait_s: f64,
    /// Show a progress spinner.
    pub progress: bool,
    /// Stop when set (the in-process learner of `reflex run`).
    pub stop: Option<Arc<AtomicBool>>,
}

pub fn run(a: LearnArgs) -> anyhow::Result<()> {
    let (file, cfg_dir) = crate::run_cmd::load_for_learner(&a.config)?;
    let mut bus = file.bus_config(&a.bus);
    bus.multicast_scouting &= !a.bus.no_multicast;
    let session = bus.open()?;
    let out = serve(
        &session,
        &file,
        &cfg_dir,
        &LearnOpts {
            exit_when_actor_leaves: a.exit_when_actor_leaves,
            seconds: a.seconds,
            wait_s: a.wait_s,
            progress: !a.json,
            stop: None,
        },
    )
    .with_context(|| format!("learner for config `{}`", a.config.display()))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "learner: {} steps received ({} duplicates dropped, {} gaps refused), {} episodes, weights v{}, checkpoint {}",
            out["received"],
            out["duplicates_dropped"],
            out["gaps_refused"],
            out["episodes"],
            out["weights_version"],
            out["checkpoint"].as_str().unwrap_or("")
        );
    }
    Ok(())
}

/// The learner on `session` for the robot of `file`; returns its summary.
pub fn serve(
    session: &zenoh::Session,
    file: &crate::run_cmd::RunFile,
    cfg_dir: &std::path::Path,
    o: &LearnOpts,
) -> anyhow::Result<serde_json::Value> {
    crate::bench_learner::pin_threads(1);
    let ls = file
        .learner
        .clone()
        .context("the config has no [learner] table")?;
    let robot = file.robot_name();
    let keys = Keys::new(&robot).map_err(anyhow::Error::msg)?;
    let token = session
        .liveliness()
        .declare_token(keys.alive_learner.clone())
        .wait()
        .map_err(anyhow::Error::msg)?;
    tracing::info!("learner for `{robot}`: waiting for the actor's spec");
    let spec = reflex_runtime::viz::fetch_spec(session, &keys, Duration::from_secs_f64(o.wait_s))?;
    let (obs_dim, act_dim) = (spec.state_dim(), spec.action.dim());

    let model = file.model_path(cfg_dir).context(
        "the learner relabels a person's steps with the base policy: [policy] kind = \"onnx\" with a model",
    )?;
    let relabel = OnnxPolicy::load(&model, &spec, &RunOptions::default())?;

    // Resume or start.
    let ckpt = if ls.checkpoint.is_relative() {
        std::env::current_dir()?.join(&ls.checkpoint)
    } else {
        ls.checkpoint.clone()
    };
    let mut sac = if ckpt.exists() {
        let s = Sac::load(&ckpt)?;
        if (s.obs_dim, s.act_dim) != (obs_dim, act_dim) {
            bail!(
                "checkpoint `{}` is for observations of {} and actions of {}, the robot `{robot}` has {obs_dim} and {act_dim}: move it away to start afresh",
                ckpt.display(),
                s.obs_dim,
                s.act_dim
            );
        }
        tracing::info!(
            "resuming from {} ({} steps received)",
            ckpt.display(),
            s.tags.get(TAG_RECEIVED).copied().unwrap_or(0)
        );
        s
    } else {
        let mut cfg = ls.sac_config(file.seed());
        if cfg.obs_norm.is_none() {
            cfg.obs_norm = crate::demo::state_norm(&relabel, obs_dim);
        }
        Sac::new(cfg, obs_dim, act_dim)?
    };
    let resumed_at = sac.tags.get(TAG_RECEIVED).copied().unwrap_or(0);
    let mut actor = sac.tags.get(TAG_ACTOR).copied().unwrap_or(0);
    let mut received = resumed_at;
    let mut version = sac.tags.get(TAG_VERSION).copied().unwrap_or(0);
    let mut persisted = received;

    let norm = ActionNorm::new(&spec.action.low, &spec.action.high, sac.cfg.action_scale);
    let mut asm = Assembler::new(Mode::Residual, norm, Some(relabel), ls.rlif, act_dim);

    let (tx, rx) = crossbeam::channel::unbounded::<TransitionBatch>();
    let k = keys.learn_transitions.clone();
    let _sub = session
        .declare_subscriber(keys.learn_transitions.clone())
        .callback(
            move |s| match msg::decode::<TransitionBatch>(&k, &s.payload().to_bytes()) {
                Ok(b) => {
                    let _ = tx.send(b);
                }
                Err(e) => tracing::warn!("{e}"),
            },
        )
        .wait()
        .map_err(anyhow::Error::msg)?;
    let state_pub = session
        .declare_publisher(keys.learn_state.clone())
        .wait()
        .map_err(anyhow::Error::msg)?;
    let weights_pub = session
        .declare_publisher(keys.learn_weights.clone())
        .congestion_control(zenoh::qos::CongestionControl::Block)
        .wait()
        .map_err(anyhow::Error::msg)?;
    let instance = rand::random::<u64>() | 1;
    let gaps_total = std::cell::Cell::new(0u64);
    let queued = rx.clone();
    let publish_state = |actor: u64, received: u64, persisted: u64, version: u64| {
        let m = LearnerState {
            v: PROTOCOL_VERSION,
            instance,
            actor,
            received,
            persisted,
            weights_version: version,
            gaps: gaps_total.get(),
            queued: queued.len() as u64,
        };
        let _ = state_pub.put(msg::encode(&m)).wait();
    };
    let mut weights: Vec<f32> = export_actor(&sac)?;
    let publish_weights = |version: u64, w: &[f32]| {
        for (i, c) in w.chunks(CHUNK).enumerate() {
            let m = WeightsChunk {
                v: PROTOCOL_VERSION,
                version,
                offset: (i * CHUNK) as u32,
                total: w.len() as u32,
                values: c.to_vec(),
            };
            let _ = weights_pub.put(msg::encode(&m)).wait();
        }
    };
    if version > 0 {
        publish_weights(version, &weights);
    }

    let (mut duplicates, mut gaps, mut episodes, mut checkpoints) = (0u64, 0u64, 0u64, 0u64);
    let t0 = Instant::now();
    let (mut last_ckpt, mut last_state, mut last_weights) =
        (Instant::now(), Instant::now(), Instant::now());
    let mut actor_seen = false;
    let mut last_batch = Instant::now();
    let pb = if o.progress {
        indicatif::ProgressBar::new_spinner()
    } else {
        indicatif::ProgressBar::hidden()
    };
    let save = |sac: &mut Sac, actor: u64, stored_upto: u64, version: u64| -> anyhow::Result<()> {
        sac.tags.insert(TAG_ACTOR.into(), actor);
        sac.tags.insert(TAG_RECEIVED.into(), stored_upto);
        sac.tags.insert(TAG_VERSION.into(), version);
        if let Some(d) = ckpt.parent() {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        sac.save(&ckpt)?;
        Ok(())
    };
    loop {
        let mut got = false;
        if let Ok(b) = rx.recv_timeout(Duration::from_millis(20)) {
            got = true;
            last_batch = Instant::now();
            if b.actor != actor {
                // An actor this learner has no record of: it takes everything the actor still
                // holds (the steps before were persisted by another learner); a batch after that
                // is refused as a gap and the actor resends from there.
                tracing::info!(
                    "actor {:x} joined; it holds steps from {}",
                    b.actor,
                    b.held_from
                );
                actor = b.actor;
                received = b.held_from;
                persisted = b.held_from;
                asm.reset();
            }
            let end = b.first_seq + b.steps.len() as u64;
            if b.first_seq > received {
                gaps += 1; // a batch went missing: refuse, the actor resends from `received`
                gaps_total.set(gaps);
            } else if end <= received {
                duplicates += b.steps.len() as u64;
            } else {
                let skip = (received - b.first_seq) as usize;
                duplicates += skip as u64;
                for s in &b.steps[skip..] {
                    asm.push(&mut sac, s)?;
                    sac.train_step()?;
                    received += 1;
                    if s.ends_episode() {
                        episodes += 1;
                        if episodes.is_multiple_of(ls.publish_every_episodes) {
                            version += 1;
                            weights = export_actor(&sac)?;
                            publish_weights(version, &weights);
                            last_weights = Instant::now();
                        }
                    }
                }
            }
            publish_state(actor, received, persisted, version);
        }
        // A step held for its successor is not stored yet: checkpoints cover what is stored.
        let stored_upto = received - asm.holds_one() as u64;
        if actor != 0
            && stored_upto > persisted
            && last_ckpt.elapsed().as_secs_f64() >= ls.checkpoint_every_s
        {
            save(&mut sac, actor, stored_upto, version)?;
            persisted = stored_upto;
            checkpoints += 1;
            last_ckpt = Instant::now();
            publish_state(actor, received, persisted, version);
        }
        if last_state.elapsed() > Duration::from_millis(500) {
            publish_state(actor, received, persisted, version);
            last_state = Instant::now();
        }
        if version > 0 && last_weights.elapsed() > Duration::from_secs(5) {
            // For an actor that started late or lost a chunk.
            publish_weights(version, &weights);
            last_weights = Instant::now();
        }
        pb.set_message(format!(
            "received {received}, checkpointed {persisted}, {episodes} episodes, weights v{version}, {} updates",
            sac.counters.critic_updates
        ));
        pb.tick();
        if !got {
            let alive = session
                .liveliness()
                .get(keys.alive_actor.clone())
                .timeout(Duration::from_millis(200))
                .wait()
                .map(|r| r.recv().is_ok())
                .unwrap_or(false);
            actor_seen |= alive;
            if o.exit_when_actor_leaves
                && actor_seen
                && !alive
                && last_batch.elapsed() > Duration::from_secs(1)
                && rx.is_empty()
            {
                break;
            }
        }
        if o.seconds.is_some_and(|s| t0.elapsed().as_secs_f64() >= s)
            || o.stop.as_ref().is_some_and(|s| s.load(Ordering::Relaxed))
        {
            break;
        }
    }
    pb.finish_and_clear();
    // The last checkpoint: everything stored (an episode's held step has no successor now and is
    // stored by the actor's resend after the next start, if any).
    let stored_upto = received - asm.holds_one() as u64;
    if actor != 0 && stored_upto > persisted {
        save(&mut sac, actor, stored_upto, version)?;
        persisted = stored_upto;
        checkpoints += 1;
        publish_state(actor, received, persisted, version);
    }
    drop(token);
    let out = serde_json::json!({
        "robot": robot,
        "actor": format!("{actor:x}"),
        "resumed_at": resumed_at,
        "received": received,
        "persisted": persisted,
        "duplicates_dropped": duplicates,
        "gaps_refused": gaps,
        "episodes": episodes,
        "weights_version": version,
        "checkpoints": checkpoints,
        "updates": sac.counters.critic_updates,
        "online_buffer": sac.online.len(),
        "demo_buffer": sac.demo.len(),
        "wall_s": t0.elapsed().as_secs_f64(),
        "checkpoint": ckpt.display().to_string(),
    });
    Ok(out)
}
