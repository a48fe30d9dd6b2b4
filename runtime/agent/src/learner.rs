//! The learner as a service on the bus: in its own process (`reflex learn`, on the robot or a
//! GPU workstation, for one robot or a fleet) or on a thread of the actor's (`[learner]
//! in_process = true`).
//!
//! It takes each actor's numbered transitions through [`LearnerLink`] (per actor only the next
//! number, so resends after a reconnect are dropped and gaps refused), stores them as `reflex
//! demo` does ([`crate::assemble`]: relabelling, RLIF, both buffers for a person's steps; one
//! stream per actor into one replay), trains, publishes versioned weights to every robot, and
//! checkpoints everything atomically, every actor's position included. After a crash it resumes
//! from the checkpoint and tells each actor where to resend from: no transition is lost or stored
//! twice.

use crate::assemble::Assembler;
use crate::config::{BadCheckpoint, LearnerSection, ObsNormSource, RunConfig};
use crate::progress::Progress;
use crate::{AgentError, error::Result};
use reflex_bus::learnlink::{ActorPosition, ActorStatus, Fleet, LearnerLink, LinkPosition};
use reflex_contracts::msg::RobotSpec;
use reflex_learn::sac::hook::{ActionNorm, actor_shape, export_actor};
use reflex_learn::sac::{Mode, Sac};
use reflex_policies::onnx_policy::{OnnxPolicy, RunOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Checkpoint tags of the link: `link.actor.<robot>.<actor hex>` = the steps of that actor
/// stored; the newest weights version. (`link.actor` and `link.received` alone: a checkpoint of a
/// learner that followed one actor of the config's robot.)
const TAG_ACTOR: &str = "link.actor";
const TAG_RECEIVED: &str = "link.received";
const TAG_VERSION: &str = "link.weights_version";

/// What a learner learns: for which robot, in which mode, with which settings.
#[derive(Clone, Debug)]
pub struct LearnerConfig {
    /// The robot's name on the bus (a fleet's: the one a checkpoint of a single-robot learner
    /// was about).
    pub robot: String,
    /// The robots it serves: the config's robot, or `[learner] fleet`.
    pub fleet: Fleet,
    /// `[learner]`.
    pub section: LearnerSection,
    /// Residual on a base policy, or the whole action.
    pub mode: Mode,
    /// The base policy (residual mode): relabels a person's steps with what it would have done
    /// and gives the state scaling.
    pub base_model: Option<PathBuf>,
    /// Seed of the learner.
    pub seed: u64,
}

impl LearnerConfig {
    /// The learner a run config describes.
    pub fn from_run_config(cfg: &RunConfig) -> Result<Self> {
        let section = cfg
            .learner
            .clone()
            .ok_or_else(|| AgentError::setup("the run config", "it has no [learner] table"))?;
        let robot = cfg.robot_name();
        let names = if section.fleet.is_empty() {
            vec![robot.clone()]
        } else {
            section.fleet.clone()
        };
        let fleet = Fleet::from_names(&names).map_err(|e| {
            AgentError::setup(
                "[learner] fleet",
                format!(
                    "{e}: robot names are letters, digits, `-` and `_`, or \"*\" for every robot"
                ),
            )
        })?;
        Ok(LearnerConfig {
            robot,
            fleet,
            section,
            mode: cfg.learner_mode(),
            base_model: cfg.policy.model.clone(),
            seed: cfg.seed(),
        })
    }
}

/// How a learner runs, besides its config.
#[derive(Clone, Debug, Default)]
pub struct ServeOptions {
    /// Stop when the actor has gone and everything it sent is checkpointed.
    pub exit_when_actor_leaves: bool,
    /// Stop after this many seconds.
    pub seconds: Option<f64>,
    /// How long to wait for the actor's spec.
    pub wait_s: f64,
    /// Stop when set (the in-process learner of an actor).
    pub stop: Option<Arc<AtomicBool>>,
}

/// What a learner did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LearnerReport {
    /// The robots it served.
    pub fleet: String,
    /// Each actor it knew at the end: steps received, persisted, behind, when last seen.
    pub actors: Vec<ActorStatus>,
    /// Steps already received when it started (from its checkpoint; all actors).
    pub resumed_at: u64,
    /// Steps received (all actors, counting from each one's first step).
    pub received: u64,
    /// Steps in its last checkpoint (all actors).
    pub persisted: u64,
    /// Steps dropped as duplicates (resends).
    pub duplicates_dropped: u64,
    /// Batches refused after a missing one.
    pub gaps_refused: u64,
    /// Steps left out because they did not fit the robot.
    pub rejected_steps: u64,
    /// Batches refused because their robot's spec is not the fleet's.
    pub refused_spec: u64,
    /// Episodes seen.
    pub episodes: u64,
    /// The episodes stored, by what ended them (a person's success and failure keys, resets,
    /// the task's own end).
    pub episode_ends: crate::assemble::EpisodeEnds,
    /// Newest weights version published.
    pub weights_version: u64,
    /// Checkpoints written.
    pub checkpoints: u64,
    /// Critic updates.
    pub updates: u64,
    /// Steps stored without an update because the learner was behind
    /// (`[learner] shed_updates_above`).
    pub updates_shed: u64,
    /// Transitions in the online buffer.
    pub online_buffer: usize,
    /// Transitions in the demo buffer.
    pub demo_buffer: usize,
    /// Wall time, s.
    pub wall_s: f64,
    /// The checkpoint file.
    pub checkpoint: String,
}

/// The learner's state scaling for `spec` under `source`.
fn obs_norm(
    source: ObsNormSource,
    base: Option<&OnnxPolicy>,
    spec: &RobotSpec,
) -> Result<Option<reflex_learn::sac::ObsNorm>> {
    Ok(match (source, base) {
        (ObsNormSource::Off, _) => None,
        (ObsNormSource::Auto, Some(b)) => crate::presets::state_norm(b, spec),
        (ObsNormSource::Auto, None) | (ObsNormSource::Spec, _) => {
            Some(crate::presets::state_norm_from_spec(spec)?)
        }
    })
}

/// The action normalisation the learner and the actor's hook share: widened by the residual's
/// scale in residual mode, the plain action box in full mode.
pub fn action_norm(spec: &RobotSpec, sac: &Sac) -> ActionNorm {
    let scales = if sac.cfg.mode == Mode::Residual {
        sac.cfg.residual_bounds(sac.act_dim)
    } else {
        vec![]
    };
    ActionNorm::new(&spec.action.low, &spec.action.high, &scales)
}

/// The residual file a learner keeps beside its checkpoint: `X.ckpt` -> `X.residual.onnx`.
pub fn residual_path(ckpt: &Path) -> PathBuf {
    ckpt.with_extension("residual.onnx")
}

/// The checkpoint before the newest (kept so that a corrupt newest one loses one interval).
pub fn previous_checkpoint(ckpt: &Path) -> PathBuf {
    let mut p = ckpt.as_os_str().to_owned();
    p.push(".prev");
    PathBuf::from(p)
}

/// Reads the newest good checkpoint: `ckpt`, or what `[learner] on_bad_checkpoint` says when it
/// cannot be read. `None`: start afresh.
fn load_checkpoint(cfg: &LearnerConfig, ckpt: &Path) -> Result<Option<Sac>> {
    if ckpt.is_dir() {
        let file = ckpt.join("learner.ckpt");
        let says = format!(
            "`{}` is a directory: name a file, e.g. `{}`",
            ckpt.display(),
            file.display()
        );
        return Err(AgentError::setup("[learner] checkpoint", says));
    }
    let prev = previous_checkpoint(ckpt);
    if !ckpt.exists() {
        if prev.exists() {
            // A crash between keeping the previous one and writing the new one.
            tracing::warn!(
                "`{}` is missing; resuming from `{}`",
                ckpt.display(),
                prev.display()
            );
            return Ok(Some(Sac::load(&prev)?));
        }
        return Ok(None);
    }
    let err = match Sac::load(ckpt) {
        Ok(s) => return Ok(Some(s)),
        Err(e) => e,
    };
    let aside = |p: &Path| {
        let mut a = p.as_os_str().to_owned();
        a.push(format!(".bad-{}", crate::run_id("at")));
        let a = PathBuf::from(a);
        std::fs::rename(p, &a).map_err(|e| AgentError::io(p, e))?;
        tracing::warn!("moved the unreadable checkpoint to `{}`", a.display());
        Ok::<_, AgentError>(())
    };
    match cfg.section.on_bad_checkpoint {
        BadCheckpoint::Stop => Err(AgentError::setup(
            "[learner] checkpoint",
            format!(
                "{err}. Nothing was trained. Set [learner] on_bad_checkpoint = \"previous\" to resume from `{}`{}, or \"fresh\" to move it aside and start afresh",
                prev.display(),
                if prev.exists() {
                    " (present)"
                } else {
                    " (absent)"
                }
            ),
        )),
        BadCheckpoint::Previous if prev.exists() => {
            aside(ckpt)?;
            Ok(Some(Sac::load(&prev)?))
        }
        BadCheckpoint::Previous => Err(AgentError::setup(
            "[learner] checkpoint",
            format!(
                "{err}, and there is no previous checkpoint `{}`",
                prev.display()
            ),
        )),
        BadCheckpoint::Fresh => {
            aside(ckpt)?;
            Ok(None)
        }
    }
}

/// Resumes from the newest good checkpoint (checking it fits the robot), else starts afresh.
fn resume_or_start(
    cfg: &LearnerConfig,
    ckpt: &Path,
    spec: &RobotSpec,
    base: Option<&OnnxPolicy>,
) -> Result<Sac> {
    let (obs_dim, act_dim) = (spec.state_dim(), spec.action.dim());
    let mut sc = cfg.section.learner_sac(cfg.mode, cfg.seed)?;
    if let Some(mut s) = load_checkpoint(cfg, ckpt)? {
        match reflex_learn::sac::VisionHeads::resume(&mut s.cfg.vision, &sc.vision) {
            Err(e) => {
                return Err(AgentError::setup(
                    format!("checkpoint `{}`", ckpt.display()),
                    format!(
                        "{e}: move the checkpoint away to start afresh, or name the encoder and heads it was trained with"
                    ),
                ));
            }
            Ok(Some((was, now))) => tracing::info!(
                "[learner.vision] shift = {now} from here on (the checkpoint trained with {was})"
            ),
            Ok(None) => {}
        }
        if (s.state_dim, s.act_dim, s.cfg.mode) != (obs_dim, act_dim, cfg.mode) {
            return Err(AgentError::setup(
                format!("checkpoint `{}`", ckpt.display()),
                format!(
                    "it is a {:?} learner for observations of {} and actions of {}; robot `{}` needs a {:?} learner for {obs_dim} and {act_dim}: move it away to start afresh",
                    s.cfg.mode, s.state_dim, s.act_dim, cfg.robot, cfg.mode
                ),
            ));
        }
        tracing::info!(
            "resuming from {} ({} steps received)",
            ckpt.display(),
            position_in(&s, &cfg.robot).received()
        );
        return Ok(s);
    }
    if sc.obs_norm.is_none() {
        sc.obs_norm = obs_norm(cfg.section.obs_norm, base, spec)?;
    }
    Ok(Sac::new(sc, obs_dim, act_dim)?)
}

/// Writes the checkpoint with every actor's position (`stored`: steps stored of each) in its
/// tags, keeping the one before as `<file>.prev` (each is written atomically: a crash leaves one
/// of the two whole).
fn save(sac: &mut Sac, ckpt: &Path, stored: &LinkPosition) -> Result<()> {
    sac.tags
        .retain(|k, _| !k.starts_with(TAG_ACTOR) && k != TAG_RECEIVED);
    for a in &stored.actors {
        sac.tags
            .insert(format!("{TAG_ACTOR}.{}.{:x}", a.robot, a.actor), a.received);
    }
    sac.tags.insert(TAG_VERSION.into(), stored.weights_version);
    if let Some(d) = ckpt.parent() {
        std::fs::create_dir_all(d).map_err(|e| AgentError::io(d, e))?;
    }
    if ckpt.exists() {
        std::fs::rename(ckpt, previous_checkpoint(ckpt)).map_err(|e| AgentError::io(ckpt, e))?;
    }
    sac.save(ckpt)?;
    Ok(())
}

/// The link position a checkpoint's tags hold (see [`TAG_ACTOR`]).
fn position_in(sac: &Sac, robot: &str) -> LinkPosition {
    let mut actors: Vec<ActorPosition> = sac
        .tags
        .iter()
        .filter_map(|(k, v)| {
            let (robot, hex) = k
                .strip_prefix(TAG_ACTOR)?
                .strip_prefix('.')?
                .split_once('.')?;
            Some(ActorPosition {
                robot: robot.into(),
                actor: u64::from_str_radix(hex, 16).ok()?,
                received: *v,
                persisted: *v,
            })
        })
        .collect();
    if let (Some(&actor), Some(&n)) = (sac.tags.get(TAG_ACTOR), sac.tags.get(TAG_RECEIVED))
        && actor != 0
    {
        actors.push(ActorPosition {
            robot: robot.into(),
            actor,
            received: n,
            persisted: n,
        });
    }
    LinkPosition {
        actors,
        weights_version: sac.tags.get(TAG_VERSION).copied().unwrap_or(0),
    }
}

/// The learner's working state between batches.
struct Session<'a> {
    cfg: &'a LearnerConfig,
    ckpt: PathBuf,
    sac: Sac,
    link: LearnerLink,
    asm: Assembler,
    resumed_at: u64,
    episodes: u64,
    checkpoints: u64,
    last_ckpt: Instant,
    updates_shed: u64,
    /// The robot's action bounds, for the residual file kept beside each checkpoint.
    action_bounds: (Vec<f32>, Vec<f32>),
}

impl Session<'_> {
    /// Stores and trains on every new step of a batch; publishes weights at episode ends.
    fn take(&mut self, timeout: Duration) -> Result<bool> {
        let Some(batch) = self.link.next_batch(timeout) else {
            return Ok(false);
        };
        // One assembling stream per actor (ids are random 64-bit numbers per actor process).
        let stream = batch.actor;
        if batch.new_actor {
            self.asm.reset(&mut self.sac, stream);
        }
        let flush = batch.flush;
        // Behind the robot: store this batch without training on it, so the queue stays
        // bounded and no step is lost (the update-to-data ratio drops instead).
        let shed =
            self.link.queued() * batch.steps.len().max(1) > self.cfg.section.shed_updates_above;
        for s in &batch.steps {
            self.asm.push_from(&mut self.sac, stream, s)?;
            if shed {
                self.updates_shed += 1;
            } else {
                self.sac.train_step()?;
            }
            if s.ends_episode() {
                self.episodes += 1;
                if self
                    .episodes
                    .is_multiple_of(self.cfg.section.publish_every_episodes)
                {
                    let v = self.link.position().weights_version + 1;
                    let w = export_actor(&self.sac)?;
                    self.link.publish_weights(v, &w, actor_shape(&self.sac).1);
                }
            }
        }
        let trained = if shed { 0 } else { batch.steps.len() as u64 };
        self.link.trained(&batch.robot, batch.actor, trained);
        if flush {
            // The actor is stopping and waits for this: persist everything stored now.
            self.checkpoint(true)?;
        }
        self.link.publish_state(&batch.robot, batch.actor);
        Ok(true)
    }

    /// Writes the actor beside the checkpoint as a residual file a robot runs without a learner
    /// (`<checkpoint>.residual.onnx` and its spec; docs/training.md). Noise mode has none.
    fn keep_residual(&self) -> Result<()> {
        if self.cfg.mode == Mode::Noise {
            return Ok(());
        }
        let model = residual_path(&self.ckpt);
        let info = reflex_learn::sac::export::ExportInfo {
            name: &format!("{} residual", self.cfg.robot),
            action_low: &self.action_bounds.0,
            action_high: &self.action_bounds.1,
            base_model: self.cfg.base_model.as_deref(),
            provenance: format!(
                "learner checkpoint {} after {} steps, {} updates",
                self.ckpt.display(),
                self.link.position().persisted(),
                self.sac.counters.critic_updates
            ),
        };
        reflex_learn::sac::export::write_residual(&self.sac, &info, &model)?;
        Ok(())
    }

    /// Checkpoints what is stored of every actor (steps held for their successor, or for their
    /// episode's end, are not stored yet).
    fn checkpoint(&mut self, force: bool) -> Result<()> {
        let mut stored = self.link.position();
        for a in &mut stored.actors {
            a.received -= self.asm.held(a.actor);
        }
        let due =
            force || self.last_ckpt.elapsed().as_secs_f64() >= self.cfg.section.checkpoint_every_s;
        if due && stored.actors.iter().any(|a| a.received > a.persisted) {
            save(&mut self.sac, &self.ckpt, &stored)?;
            self.keep_residual()?;
            for a in &stored.actors {
                self.link.persisted(&a.robot, a.actor, a.received);
            }
            self.checkpoints += 1;
            self.last_ckpt = Instant::now();
        }
        Ok(())
    }
}

/// Everything a learner needs before its first batch: the robot's spec from the bus, the base
/// policy for relabelling (residual mode), the learner resumed or fresh, the link.
fn start<'a>(
    session: &zenoh::Session,
    cfg: &'a LearnerConfig,
    o: &ServeOptions,
) -> Result<Session<'a>> {
    let threads = reflex_learn::sac::gemm::set_threads(cfg.section.learner_threads());
    tracing::info!(
        "learner for {}: waiting for a robot's spec ({threads} thread{} for its matrix products)",
        cfg.fleet,
        if threads == 1 { "" } else { "s" }
    );
    let (first, spec) =
        reflex_bus::learnlink::first_spec(session, &cfg.fleet, Duration::from_secs_f64(o.wait_s))?;
    spec.validate()?;
    let relabel = match (cfg.mode, &cfg.base_model) {
        (Mode::Residual, Some(m)) => Some(OnnxPolicy::load(m, &spec, &RunOptions::default())?),
        (Mode::Residual, None) => {
            // Once a process: the soak restarts its learner about ten times.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| tracing::warn!(
                "the residual learner has no base model to relabel a person's steps with: they keep the base action the actor recorded (zeros while a person drives)"
            ));
            None
        }
        _ => None,
    };
    let ckpt = if cfg.section.checkpoint.is_relative() {
        std::env::current_dir()
            .map_err(|e| AgentError::io(Path::new("."), e))?
            .join(&cfg.section.checkpoint)
    } else {
        cfg.section.checkpoint.clone()
    };
    let sac = resume_or_start(cfg, &ckpt, &spec, relabel.as_ref())?;
    let pos = position_in(&sac, &cfg.robot);
    let (resumed_at, weights_version) = (pos.received(), pos.weights_version);
    let mut link = LearnerLink::new(session, &cfg.fleet, pos)?;
    link.expect_spec(&first, spec.clone())?;
    link.expect_steps(reflex_bus::learnlink::StepShape {
        obs: spec.state_dim(),
        act: spec.action.dim(),
        features: sac
            .cfg
            .vision
            .as_ref()
            .map(|v| reflex_bus::learnlink::FeatureExpect {
                encoder: v.encoder_id.clone(),
                shapes: v
                    .features
                    .iter()
                    .map(|f| [f.channels as u32, f.height as u32, f.width as u32])
                    .collect(),
            }),
    });
    if weights_version > 0 {
        link.publish_weights(weights_version, &export_actor(&sac)?, actor_shape(&sac).1);
    }
    let norm = action_norm(&spec, &sac);
    // Several actors' steps interleave: each actor is a stream of its own in the buffers.
    let asm = Assembler::new(cfg.mode, norm, relabel, cfg.section.rlif, spec.action.dim());
    Ok(Session {
        cfg,
        ckpt,
        sac,
        link,
        asm,
        resumed_at,
        episodes: 0,
        checkpoints: 0,
        last_ckpt: Instant::now(),
        updates_shed: 0,
        action_bounds: (spec.action.low.clone(), spec.action.high.clone()),
    })
}

/// The learner on `session` for `cfg.robot`, until the options say stop; returns its report.
pub fn serve(
    session: &zenoh::Session,
    cfg: &LearnerConfig,
    o: &ServeOptions,
    progress: &dyn Progress,
) -> Result<LearnerReport> {
    let mut s = start(session, cfg, o)?;
    let t0 = Instant::now();
    let (mut actor_seen, mut last_batch) = (false, Instant::now());
    loop {
        let got = s.take(Duration::from_millis(20))?;
        if got {
            // Steps arriving mean an actor is there, even if it is gone by the next idle moment
            // (its last checkpoint acknowledged, it may exit before this loop ever polls idle).
            last_batch = Instant::now();
            actor_seen = true;
        }
        s.checkpoint(false)?;
        s.link.tick();
        progress.message(&s.status_lines());
        if !got {
            let alive = s.link.actor_alive(session);
            actor_seen |= alive;
            if o.exit_when_actor_leaves
                && actor_seen
                && !alive
                && last_batch.elapsed() > Duration::from_secs(1)
                && s.link.queued() == 0
            {
                break;
            }
        }
        if o.seconds.is_some_and(|x| t0.elapsed().as_secs_f64() >= x)
            || o.stop.as_ref().is_some_and(|x| x.load(Ordering::Relaxed))
        {
            break;
        }
    }
    // The last checkpoint: everything stored (an episode's held step has no successor now and is
    // stored by the actor's resend after the next start, if any).
    s.checkpoint(true)?;
    progress.finish();
    Ok(s.report(t0.elapsed().as_secs_f64()))
}

impl Session<'_> {
    /// The learner's status: a line for the whole, then one per actor (received, persisted,
    /// behind, rate, last seen).
    fn status_lines(&self) -> String {
        let p = self.link.position();
        let mut text = format!(
            "{}: received {}, checkpointed {}, {} episodes, weights v{}, {} updates",
            self.cfg.fleet,
            p.received(),
            p.persisted(),
            self.episodes,
            p.weights_version,
            self.sac.counters.critic_updates
        );
        for a in self.link.actors() {
            text.push_str(&format!(
                "\n  {} {}: received {}, persisted {}, behind {}, {:.0} steps/s, {:.0} updates/s, {}",
                a.robot,
                a.actor,
                a.received,
                a.persisted,
                a.behind,
                a.steps_per_s,
                a.trained_per_s * self.sac.cfg.utd as f64,
                match a.last_seen_s {
                    Some(t) => format!("seen {t:.1} s ago"),
                    None => "not seen since the start".into(),
                }
            ));
        }
        text
    }

    fn report(&self, wall_s: f64) -> LearnerReport {
        let p = self.link.position();
        let st = self.link.stats();
        LearnerReport {
            fleet: self.cfg.fleet.to_string(),
            actors: self.link.actors(),
            resumed_at: self.resumed_at,
            received: p.received(),
            persisted: p.persisted(),
            duplicates_dropped: st.duplicates_dropped,
            gaps_refused: st.gaps_refused,
            rejected_steps: st.rejected_steps,
            refused_spec: st.refused_spec,
            episodes: self.episodes,
            episode_ends: self.asm.ends,
            weights_version: p.weights_version,
            checkpoints: self.checkpoints,
            updates: self.sac.counters.critic_updates,
            updates_shed: self.updates_shed,
            online_buffer: self.sac.online.len(),
            demo_buffer: self.sac.demo.len(),
            wall_s,
            checkpoint: self.ckpt.display().to_string(),
        }
    }
}
