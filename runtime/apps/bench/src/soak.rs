//! `reflex soak`: the actor and its in-process learner for a long run with faults injected at
//! random, reporting what a deployment cares about: resident memory over time (flat after
//! warm-up), steps the actor sent against steps the learner took (equal), safety holds, the
//! loop's per-step work.
//!
//! The robot is the test double `NullRobot` (episodes of 200 steps) and the policy a sweeping
//! chunk policy, so the run measures the runtime, not a simulator. Faults, each drawn from the
//! seed: the learner stopped and restarted from its checkpoint; NaN chunks from the policy;
//! undecodable bytes and messages of the wrong shape on every key the actor and the learner
//! read (teleop, events, operator, learner state, weights, transitions), releases that answer
//! no e-stop; emergency-stop drills (an e-stop on the bus, the loop held, an operator's release
//! and resume). Not injected here: dropped network links and a slow or full disk
//! (docs/reliability.md).

use crate::workloads::{NullRobot, SweepPolicy};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use reflex_agent::actor::{ActorBuilder, ClockChoice, LearnerSetup};
use reflex_agent::progress::Progress;
use reflex_agent::{AgentError, error::Result};
use reflex_bus::{BusConfig, Keys};
use reflex_contracts::msg::{self, Observation, OperatorKind, OperatorMsg, PROTOCOL_VERSION};
use reflex_contracts::policy::{ChunkSpec, Policy, PolicyError};
use reflex_contracts::stop::StopAct;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use zenoh::Wait;

/// How long and how hard to soak.
#[derive(Clone, Debug)]
pub struct SoakOptions {
    /// Control steps.
    pub steps: u64,
    /// Seed of the faults (and of the run).
    pub seed: u64,
    /// Where the learner's checkpoints and the bus socket live.
    pub dir: PathBuf,
    /// Inject faults (off: a clean run of the same length, the baseline).
    pub faults: bool,
}

/// A policy that returns a chunk of NaN with probability `p`.
struct Faulty {
    inner: SweepPolicy,
    p: f64,
    rng: ChaCha8Rng,
    nan_chunks: Arc<AtomicU64>,
}

impl Policy for Faulty {
    fn name(&self) -> &str {
        "sweep with NaN faults"
    }
    fn chunk_spec(&self) -> ChunkSpec {
        self.inner.chunk_spec()
    }
    fn reset(&mut self) {
        self.inner.reset()
    }
    fn infer(
        &mut self,
        obs: &Observation,
        out: &mut [f32],
    ) -> std::result::Result<(), PolicyError> {
        self.inner.infer(obs, out)?;
        if self.rng.random_bool(self.p) {
            out.fill(f32::NAN);
            self.nan_chunks.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// Publishes garbage and wrong-shaped messages on the actor's and learner's keys until stopped.
fn hostile_peer(
    endpoint: String,
    seed: u64,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
) -> std::thread::JoinHandle<Result<()>> {
    std::thread::spawn(move || {
        let session = BusConfig::hermetic(vec![], vec![endpoint]).open()?;
        let keys = Keys::new("soak").map_err(reflex_bus::BusError::from)?;
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xbad);
        let targets = [
            keys.teleop.clone(),
            keys.events.clone(),
            keys.operator.clone(),
            keys.learn_state.clone(),
            keys.learn_weights.clone(),
            keys.learn_transitions.clone(),
        ];
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(rng.random_range(10..100)));
            let key = &targets[rng.random_range(0..targets.len())];
            let payload = match rng.random_range(0..8) {
                0..=3 => (0..rng.random_range(0..300))
                    .map(|_| rng.random())
                    .collect(),
                4 => msg::encode(&reflex_contracts::msg::WeightsChunk {
                    v: PROTOCOL_VERSION,
                    version: u64::MAX / 2,
                    offset: 0,
                    total: rng.random_range(1..100_000),
                    arch: rng.random(),
                    values: vec![f32::NAN; 8],
                }),
                5 | 6 => msg::encode(&reflex_contracts::msg::TeleopMsg {
                    v: PROTOCOL_VERSION,
                    seq: rng.random(),
                    intervene: true,
                    action: vec![1.0; rng.random_range(0..3)],
                    ..Default::default()
                }),
                // A release that answers no e-stop this robot raised: refused and counted.
                _ => msg::encode(&OperatorMsg {
                    v: PROTOCOL_VERSION,
                    kind: OperatorKind::Release,
                    estops: u64::MAX,
                    source: "soak hostile peer".into(),
                    to: String::new(),
                }),
            };
            if session.put(key.clone(), payload).wait().is_ok() {
                sent.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    })
}

/// An e-stop drill through the bus, as a person would do it: an `estop` event, the loop held
/// for a while (it must latch within `LATCH_TICKS`), an operator's release (paused, still
/// held) and resume. Returns the ticks the robot was held.
fn estop_drill(
    actor: &mut reflex_agent::actor::Actor<NullRobot>,
    session: &zenoh::Session,
    keys: &Keys,
) -> Result<u64> {
    const TICKS: u64 = 5000;
    let sw = actor.stop_switch();
    let fail = |what: &str| AgentError::setup("soak e-stop drill", what.to_string());
    // Acts as an operator would (again every 250 ticks: a put may race a fresh subscription)
    // until the stop is in the state the act leads to.
    let until = |actor: &mut reflex_agent::actor::Actor<NullRobot>, act: StopAct| -> Result<()> {
        for i in 0..TICKS {
            if sw.state() == act.leads_to() {
                return Ok(());
            }
            if i % 250 == 0 {
                reflex_tools::operator::publish(session, keys, act, sw.raises(), "soak drill")?;
            }
            actor.run_ticks(1)?;
        }
        Err(fail(&format!(
            "the stop did not become {} within {TICKS} ticks",
            act.leads_to().as_str()
        )))
    };
    let held0 = actor.control_loop().stats().stopped_ticks;
    until(actor, StopAct::Raise)?;
    actor.run_ticks(100)?;
    if actor.control_loop().in_episode() {
        return Err(fail(
            "an episode is in progress while the e-stop is latched",
        ));
    }
    until(actor, StopAct::Release)?;
    actor.run_ticks(20)?;
    until(actor, StopAct::Resume)?;
    Ok(actor.control_loop().stats().stopped_ticks - held0)
}

/// Resident memory of this process, MB (Linux; 0 elsewhere).
fn rss_mb() -> f64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<f64>().ok())
        .unwrap_or(0.0);
    pages * 4096.0 / 1e6
}

/// The actor under soak: the NullRobot at 1 kHz on the wall clock, a sweeping policy that
/// returns NaN chunks at random (counted in `nan_chunks`), and an in-process SAC learner with
/// small nets checkpointing into `o.dir`.
fn soak_actor(
    o: &SoakOptions,
    session: zenoh::Session,
    nan_chunks: Arc<AtomicU64>,
) -> Result<reflex_agent::actor::Actor<NullRobot>> {
    let policy = Faulty {
        inner: SweepPolicy::new(8, 4),
        p: if o.faults { 0.002 } else { 0.0 },
        rng: ChaCha8Rng::seed_from_u64(o.seed),
        nan_chunks,
    };
    let section = reflex_agent::config::LearnerSection {
        checkpoint: o.dir.join("learner.ckpt"),
        checkpoint_every_s: 5.0,
        preset: reflex_agent::config::Preset::Sac,
        // NullRobot's state has no bounds; its values are small, so the raw state is fine.
        obs_norm: reflex_agent::config::ObsNormSource::Off,
        sac: Some(
            toml::from_str("hidden = [16, 16]\nbatch = 32\nwarmup_steps = 200\ncapacity = 100000")
                .expect("a valid table"),
        ),
        ..Default::default()
    };
    ActorBuilder::new(NullRobot::new("soak", 16, 200))
        .policy(Box::new(policy))
        .clock(ClockChoice::Wall {
            spin: Duration::from_micros(50),
        })
        .seed(o.seed)
        .bus(session)
        .learner(LearnerSetup {
            section,
            base_model: None,
        })
        .build()
}

/// Resident memory at one point of the soak.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RssSample {
    /// Control steps so far.
    pub step: u64,
    /// Resident set size, MB.
    pub rss_mb: f64,
    /// Wall time so far, s.
    pub wall_s: f64,
}

/// What `reflex soak` measured and counted.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SoakReport {
    /// Control steps run.
    pub steps: u64,
    /// Episodes run.
    pub episodes: usize,
    /// Wall time, s.
    pub wall_s: f64,
    /// Control steps per second.
    pub steps_per_s: f64,
    /// Median per-step work of the loop, µs.
    pub step_p50_us: f64,
    /// 99th percentile, µs.
    pub step_p99_us: f64,
    /// 99th percentile of the wake-up lateness, µs.
    pub lateness_p99_us: f64,
    /// Ticks missed.
    pub missed: u64,
    /// Steps whose work took longer than a period.
    pub overruns: u64,
    /// Resident memory, sampled twenty times.
    pub rss_mb: Vec<RssSample>,
    /// Growth of resident memory from the end of the first quarter (warm-up) to the end, MB.
    pub rss_growth_after_warmup_mb: f64,
    /// Transitions the actor sent to the learner.
    pub transitions_sent: u64,
    /// Transitions the learners acknowledged as persisted.
    pub transitions_persisted: u64,
    /// Transitions the last learner received.
    pub transitions_received_by_last_learner: Option<u64>,
    /// Updates the last learner made.
    pub updates_by_last_learner: Option<u64>,
    /// Updates the last learner shed to keep up.
    pub updates_shed_by_last_learner: Option<u64>,
    /// Transitions lost on the way.
    pub transitions_lost: u64,
    /// Transitions not persisted when the actor stopped.
    pub transitions_unpersisted_at_exit: u64,
    /// Transitions sent again after a learner lacked them.
    pub resent: u64,
    /// Weight messages the actor refused.
    pub rejected_weights: u64,
    /// Learner restarts injected.
    pub learner_restarts: u64,
    /// Learner instances the actor saw.
    pub learner_instances_seen: u64,
    /// Chunks of NaN actions injected.
    pub nan_chunks_injected: u64,
    /// Hostile messages published at the robot.
    pub hostile_messages: u64,
    /// E-stop drills (raise, release, resume).
    pub estop_drills: u64,
    /// Ticks held by those drills.
    pub estop_held_ticks: u64,
    /// Safety events by name.
    pub safety: std::collections::BTreeMap<String, u64>,
    /// Faults were injected.
    pub faults: bool,
    /// Messages from other processes rejected, by key expression.
    pub rejected: std::collections::BTreeMap<String, u64>,
}

/// Growth of resident memory from the end of the first quarter (warm-up) to the end, MB.
fn rss_growth(rss: &[RssSample]) -> f64 {
    let after = &rss[rss.len() / 4..];
    match (after.first(), after.last()) {
        (Some(a), Some(b)) => b.rss_mb - a.rss_mb,
        _ => 0.0,
    }
}

/// Runs the soak; returns its figures.
pub fn run(o: &SoakOptions, progress: &dyn Progress) -> Result<SoakReport> {
    std::fs::create_dir_all(&o.dir).map_err(|e| AgentError::io(&o.dir, e))?;
    let endpoint = format!("unixsock-stream/{}", o.dir.join("soak.sock").display());
    let _ = std::fs::remove_file(o.dir.join("soak.sock"));
    let session = BusConfig::hermetic(vec![endpoint.clone()], vec![]).open()?;
    let operator = BusConfig::hermetic(vec![], vec![endpoint.clone()]).open()?;
    let keys = Keys::new("soak").map_err(reflex_bus::BusError::from)?;
    let nan_chunks = Arc::new(AtomicU64::new(0));
    let mut actor = soak_actor(o, session, nan_chunks.clone())?;
    let stop = Arc::new(AtomicBool::new(false));
    let hostile_sent = Arc::new(AtomicU64::new(0));
    let peer = o
        .faults
        .then(|| hostile_peer(endpoint, o.seed, stop.clone(), hostile_sent.clone()));
    let mut rng = ChaCha8Rng::seed_from_u64(o.seed ^ 0x50a4);
    let (t0, mut rss, mut restarts) = (Instant::now(), vec![], 0u64);
    let (mut drills, mut drill_held) = (0u64, 0u64);
    let every = (o.steps / 20).max(1);
    let mut next_sample = 0;
    progress.start(o.steps, "steps");
    let mut ticks = 0;
    while ticks < o.steps {
        actor.run_episodes(1, &reflex_agent::progress::Silent)?;
        let now = actor.control_loop().stats().ticks;
        progress.inc(now - ticks);
        ticks = now;
        if ticks >= next_sample {
            rss.push(RssSample {
                step: ticks,
                rss_mb: rss_mb(),
                wall_s: t0.elapsed().as_secs_f64(),
            });
            next_sample += every;
        }
        // About ten learner restarts per soak.
        if o.faults && rng.random_bool((10.0 * 200.0 / o.steps as f64).min(1.0)) {
            actor.restart_learner()?;
            restarts += 1;
        }
        // About five e-stop drills per soak (at least one).
        if o.faults
            && (drills == 0 && ticks > o.steps / 2
                || rng.random_bool((5.0 * 200.0 / o.steps as f64).min(1.0)))
        {
            drill_held += estop_drill(&mut actor, &operator, &keys)?;
            drills += 1;
        }
    }
    progress.finish();
    stop.store(true, Ordering::Relaxed);
    if let Some(p) = peer {
        let _ = p.join();
    }
    let wall = t0.elapsed().as_secs_f64();
    let stats = actor.control_loop().stats().clone();
    let safety = actor.control_loop().safety_counters();
    let rejected: std::collections::BTreeMap<_, _> = actor.rejected().into_iter().collect();
    let report = actor.finish()?;
    let link = report.link.clone().unwrap_or_default();
    let learner = report.learner.clone();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    Ok(SoakReport {
        steps: stats.ticks,
        episodes: report.episodes.len(),
        wall_s: wall,
        steps_per_s: stats.ticks as f64 / wall,
        step_p50_us: us(stats.step.percentile(50.0)),
        step_p99_us: us(stats.step.percentile(99.0)),
        lateness_p99_us: us(stats.lateness.percentile(99.0)),
        missed: stats.missed,
        overruns: stats.overruns,
        rss_growth_after_warmup_mb: rss_growth(&rss),
        rss_mb: rss,
        transitions_sent: link.steps,
        transitions_persisted: link.persisted,
        transitions_received_by_last_learner: learner.as_ref().map(|l| l.received),
        updates_by_last_learner: learner.as_ref().map(|l| l.updates),
        updates_shed_by_last_learner: learner.as_ref().map(|l| l.updates_shed),
        transitions_lost: link.lost,
        transitions_unpersisted_at_exit: link.unpersisted_at_exit,
        resent: link.resent,
        rejected_weights: link.rejected_weights,
        learner_restarts: restarts,
        learner_instances_seen: link.learner_instances,
        nan_chunks_injected: nan_chunks.load(Ordering::Relaxed),
        hostile_messages: hostile_sent.load(Ordering::Relaxed),
        estop_drills: drills,
        estop_held_ticks: drill_held,
        safety: reflex_runtime::safety::SafetyEvent::ALL
            .iter()
            .map(|e| (e.name().to_string(), safety.get(*e)))
            .collect(),
        faults: o.faults,
        rejected: rejected.into_iter().collect(),
    })
}
