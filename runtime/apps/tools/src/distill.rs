//! `reflex distill`: a refined policy (a base with the residual its learner kept) made into the
//! next base policy, by behaviour cloning on its own rollouts.
//!
//! A run's step log (`<run>/steps`, written by `reflex demo` and `reflex run --record`) holds
//! every step as executed: the base's action plus the residual, or the person's when they took
//! over. Training a new base of the same architecture on those actions, from the episodes that
//! succeeded, folds the residual and the person's corrections into the base itself (the
//! "distill the refined policy back into the base" step of policy-improvement loops such as
//! RL-100 and PA-RL; reflex's own recipe, not theirs). The distilled base is then evaluated alone
//! on the run's held-out seed stream (the one `refined.toml` runs), so its figure sits beside the
//! refined policy's, and a second round of residual learning can start from it
//! (`reflex demo --model NAME.onnx`).
//!
//! The policy's steps before a person took over are left out by default: the person stepped in
//! because they were going wrong (RLIF's reading of an intervention, Luo et al. 2023), and what
//! the new base should do in those states is what the person did next. Keeping only the
//! person's labels where they intervened is HG-DAgger's aggregation (Kelly et al. 2019); the
//! episodes the policy finished alone stay whole.

use crate::bctrain::{TrainOptions, TrainReport, TrainSource, bc_train};
use reflex_agent::config::RunConfig;
use reflex_agent::heldout::{EvalOptions, HeldOut, evaluate_config, held_out_seed};
use reflex_agent::progress::Progress;
use reflex_agent::{AgentError, error::Result};
use reflex_imitate::{Objective, TrainConfig};
use reflex_policies::spec::{InputSpec, PolicyKind, PolicySpec};
use std::path::{Path, PathBuf};

/// What to distil and how.
#[derive(Clone, Debug)]
pub struct DistillOptions {
    /// The run directory (`refined.toml` and `steps/` in it).
    pub run: PathBuf,
    /// The new base model to write (its spec beside it).
    pub out: PathBuf,
    /// Train on every episode, failed ones too (default: the successful ones only).
    pub all_episodes: bool,
    /// The policy's steps within this many steps before a person took over are not learned
    /// from (0: every step is; `usize::MAX`, the command's default: every policy step before a
    /// takeover).
    pub skip_before_takeover: usize,
    /// Gradient steps.
    pub steps: usize,
    /// Batch size.
    pub batch: usize,
    /// Hidden width.
    pub hidden: usize,
    /// Actions executed per chunk, in place of the base's.
    pub execute: Option<usize>,
    /// What the new base learns, in place of the base's kind (diffusion or flow).
    pub objective: Option<Objective>,
    /// Held-out episodes of the distilled base alone (0: skip).
    pub eval_episodes: u64,
    /// Seed of the training (candidate `c` trains with `seed + c`).
    pub seed: u64,
    /// Trainings with different seeds, of which the one the validation episodes favour is kept
    /// (1: the one training, no validation).
    pub candidates: usize,
    /// Episodes each candidate runs alone on the validation stream (a stream apart from the
    /// run's training and held-out ones) when there are several candidates.
    pub validation_episodes: u64,
    /// The command line (the model's provenance).
    pub command: String,
}

/// One candidate's validation figure.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Candidate {
    /// Its training seed.
    pub seed: u64,
    /// Its final training loss.
    pub final_loss: f32,
    /// The new base alone on the validation stream.
    pub validation: HeldOut,
}

/// What distillation produced.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DistillReport {
    /// The run distilled.
    pub run: PathBuf,
    /// The base policy the run refined.
    pub base: PathBuf,
    /// The new base model and its spec.
    pub model: PathBuf,
    /// Its spec.
    pub spec: PathBuf,
    /// Episodes trained on / episodes in the run's step log.
    pub episodes_used: usize,
    /// Episodes in the run's step log.
    pub episodes_in_run: usize,
    /// Steps of those episodes a person drove.
    pub person_steps: usize,
    /// The policy's steps left out as leading to a takeover (`--skip-before-takeover`).
    pub steps_skipped_before_takeover: usize,
    /// Final training loss.
    pub final_loss: f32,
    /// Training wall time, s.
    pub train_wall_s: f64,
    /// The distilled base alone on the run's held-out seed stream (absent with 0 episodes).
    pub held_out: Option<HeldOut>,
    /// Evaluation seeds that were also in the distillation data (zero: held out).
    pub seeds_seen_in_distillation: Option<u64>,
    /// The refined policy's held-out figure from the run's summary, when it has one.
    pub refined_held_out: Option<serde_json::Value>,
    /// With several candidates: each one's validation figure, and the seed kept.
    pub candidates: Vec<Candidate>,
    /// The training seed of the base written.
    pub seed: u64,
    /// The validation stream's seed (with several candidates).
    pub validation_seed: Option<u64>,
}

/// The run's refined config (`refined.toml`) and the base it names.
fn refined_config(run: &Path) -> Result<(RunConfig, PathBuf)> {
    let path = run.join("refined.toml");
    if !path.is_file() {
        return Err(AgentError::setup(
            "reflex distill --run",
            format!(
                "{} has no refined.toml: give the directory of a run that kept a refined policy (`reflex demo` writes runs/<id>/refined.toml)",
                run.display()
            ),
        ));
    }
    let cfg = RunConfig::load(&path)?;
    let base = cfg.policy.model.clone().ok_or_else(|| {
        AgentError::setup(
            path.display().to_string(),
            "[policy] names no model: distillation trains a new base of the base's architecture"
                .to_string(),
        )
    })?;
    Ok((cfg, base))
}

/// The base's architecture as training settings: its chunk, what it executes, its kind, and
/// the state fields it reads (`--execute` and `--objective` replace the second and third). A
/// base that reads cameras or is a chunk policy is refused.
fn base_settings(base: &Path, o: &DistillOptions) -> Result<(TrainConfig, Vec<String>)> {
    let spec = PolicySpec::load_for(base)?;
    let objective = match spec.kind {
        PolicyKind::Diffusion | PolicyKind::Flow if o.objective.is_some() => {
            o.objective.expect("checked")
        }
        PolicyKind::Diffusion => Objective::Diffusion,
        PolicyKind::Flow => Objective::Flow,
        other => {
            return Err(AgentError::setup(
                base.display().to_string(),
                format!(
                    "a {other:?} base: reflex distils into the diffusion and flow policies it trains itself"
                ),
            ));
        }
    };
    let mut fields = vec![];
    for i in &spec.inputs {
        match i {
            InputSpec::State { fields: f, .. } => fields.clone_from(f),
            InputSpec::Image { camera, .. } => {
                return Err(AgentError::setup(
                    base.display().to_string(),
                    format!(
                        "the base reads camera `{camera}`; distilling a policy that sees is not built yet (a run's step log keeps frames at 15 Hz, not at every step)"
                    ),
                ));
            }
            _ => {}
        }
    }
    let cfg = TrainConfig {
        steps: o.steps,
        batch: o.batch,
        hidden: o.hidden,
        horizon: spec.chunk_len,
        execute: o.execute.unwrap_or(spec.execute),
        objective,
        flow_steps: spec.flow_steps,
        seed: o.seed,
        ..TrainConfig::default()
    };
    Ok((cfg, fields))
}

/// Trains the new base on the run's rollouts, writes it, and evaluates it alone.
pub fn distill(o: &DistillOptions, progress: &dyn Progress) -> Result<DistillReport> {
    let (refined, base) = refined_config(&o.run)?;
    let (cfg, state_fields) = base_settings(&base, o)?;
    let steps_dir = o.run.join("steps");
    let manifest = reflex_data::demos::read_manifest(&steps_dir).map_err(|e| {
        AgentError::setup(
            "reflex distill --run",
            format!(
                "{e}: the run has no step log to learn from (`reflex demo` writes one unless --no-record; `reflex run --record` does)"
            ),
        )
    })?;
    let keep: Vec<u64> = manifest
        .episodes
        .iter()
        .filter(|e| o.all_episodes || e.success)
        .map(|e| e.index)
        .collect();
    if keep.is_empty() {
        return Err(AgentError::setup(
            "reflex distill",
            format!(
                "{} holds no successful episode to learn from ({} in all): train longer, or pass --all-episodes",
                steps_dir.display(),
                manifest.episodes.len()
            ),
        ));
    }
    let (mut person_steps, mut skipped) = (0, 0);
    let mut seeds = std::collections::BTreeSet::new();
    for e in manifest.episodes.iter().filter(|e| keep.contains(&e.index)) {
        let ep = reflex_data::demos::read_episode(&steps_dir, e)?;
        person_steps += ep.actors.iter().filter(|a| **a == 1).count();
        skipped += crate::bctrain::before_takeover_kept(
            &ep.actors,
            ep.actions.len(),
            o.skip_before_takeover,
        )
        .iter()
        .filter(|k| !**k)
        .count();
        seeds.insert(e.seed);
    }
    let train = TrainOptions {
        source: TrainSource::Demos(steps_dir.clone()),
        out: o.out.clone(),
        episodes: None,
        only: Some(keep.clone()),
        skip_before_takeover: Some(o.skip_before_takeover).filter(|w| *w > 0),
        robot_kind: None,
        cfg,
        state_fields,
        cameras: vec![],
        image_size: None,
        command: format!(
            "{} (the refined policy of run {}: base {} with its residual, as executed; {} of {} episodes{}; {skipped} of the policy's steps before a takeover left out)",
            o.command,
            o.run.display(),
            base.display(),
            keep.len(),
            manifest.episodes.len(),
            if o.all_episodes {
                ""
            } else {
                ", the successful ones"
            }
        ),
    };
    let picked = train_candidates(o, &refined, &train, progress)?;
    let (trained, seed) = (picked.trained, picked.seed);
    let (held_out, seen) = judge_alone(o, &refined, &seeds, progress)?;
    let refined_held_out = std::fs::read(o.run.join("summary.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v.get("summary")?.get("held_out").cloned())
        .filter(|v| !v.is_null());
    Ok(DistillReport {
        run: o.run.clone(),
        base,
        model: trained.model,
        spec: trained.spec,
        episodes_used: keep.len(),
        episodes_in_run: manifest.episodes.len(),
        person_steps,
        steps_skipped_before_takeover: skipped,
        final_loss: trained.final_loss,
        train_wall_s: trained.wall_s,
        held_out,
        seeds_seen_in_distillation: seen,
        refined_held_out,
        candidates: picked.candidates,
        seed,
        validation_seed: picked.validation_seed,
    })
}

/// The refined run's config with the new base at `out` alone: no residual.
fn alone(refined: &RunConfig, out: &Path) -> RunConfig {
    let mut cfg = refined.clone();
    cfg.policy.model = Some(out.to_path_buf());
    cfg.policy.residual = None;
    cfg
}

/// The new base alone on the run's held-out stream (the one `refined.toml` runs), and how many
/// of those episodes' seeds the distillation data held (none expected).
fn judge_alone(
    o: &DistillOptions,
    refined: &RunConfig,
    seeds: &std::collections::BTreeSet<u64>,
    progress: &dyn Progress,
) -> Result<(Option<HeldOut>, Option<u64>)> {
    if o.eval_episodes == 0 {
        return Ok((None, None));
    }
    let e = EvalOptions {
        episodes: o.eval_episodes,
        residual: None,
        seed: Some(refined.run.seed),
        run: Default::default(),
    };
    let (h, report, _) = evaluate_config(&alone(refined, &o.out), &e, progress)?;
    let seen = report
        .episodes
        .iter()
        .filter(|e| e.seed.is_some_and(|s| seeds.contains(&s)))
        .count() as u64;
    Ok((Some(h), Some(seen)))
}

/// What [`train_candidates`] kept.
struct Picked {
    trained: TrainReport,
    seed: u64,
    candidates: Vec<Candidate>,
    validation_seed: Option<u64>,
}

/// Trains `o.candidates` new bases (seeds `o.seed ..`), each to `o.out`; with more than one,
/// runs each alone on the validation stream and keeps the files of the one with the most
/// successes (the first on a tie). One training's seed moves a distilled base's held-out figure
/// by several points (docs/training.md); choosing on episodes apart from the held-out ones
/// keeps the held-out figure honest.
fn train_candidates(
    o: &DistillOptions,
    refined: &RunConfig,
    train: &TrainOptions,
    progress: &dyn Progress,
) -> Result<Picked> {
    let n = o.candidates.max(1);
    if n == 1 {
        return Ok(Picked {
            trained: bc_train(train, progress)?,
            seed: o.seed,
            candidates: vec![],
            validation_seed: None,
        });
    }
    // A third stream: evaluating the held-out stream's own seed draws neither training's
    // episodes nor the held-out ones (`held_out_seed`).
    let validation_seed = held_out_seed(refined.run.seed);
    let stash = o.out.with_extension("candidate");
    let mut candidates = vec![];
    // The kept candidate: its index, validation successes and files.
    let mut best: Option<(usize, u64, TrainReport)> = None;
    for c in 0..n {
        let seed = o.seed + c as u64;
        progress.message(&format!(
            "candidate {} of {n} (training seed {seed})",
            c + 1
        ));
        let mut t = train.clone();
        t.cfg.seed = seed;
        let trained = bc_train(&t, progress)?;
        let e = EvalOptions {
            episodes: o.validation_episodes,
            residual: None,
            seed: Some(validation_seed),
            run: Default::default(),
        };
        let (validation, _, _) = evaluate_config(&alone(refined, &o.out), &e, progress)?;
        let successes = validation.successes;
        candidates.push(Candidate {
            seed,
            final_loss: trained.final_loss,
            validation,
        });
        if best.as_ref().is_none_or(|(_, s, _)| successes > *s) {
            stash_files(&trained, &stash, true)?;
            best = Some((c, successes, trained));
        }
    }
    let (b, _, trained) = best.expect("at least one candidate");
    if b + 1 != n {
        // The last candidate's files are at `o.out`: put the kept one's back.
        stash_files(&trained, &stash, false)?;
    }
    let _ = std::fs::remove_dir_all(&stash);
    Ok(Picked {
        trained,
        seed: o.seed + b as u64,
        candidates,
        validation_seed: Some(validation_seed),
    })
}

/// Copies a trained base's files (model, spec, VJP graph) into `stash` (`save`) or back from it,
/// each through a temporary file and a rename, so a crash leaves either file whole.
fn stash_files(t: &TrainReport, stash: &Path, save: bool) -> Result<()> {
    std::fs::create_dir_all(stash)
        .map_err(|e| AgentError::setup(stash.display().to_string(), e.to_string()))?;
    let files = [Some(&t.model), Some(&t.spec), t.vjp.as_ref()];
    for f in files.into_iter().flatten() {
        let name = f.file_name().expect("a written file has a name");
        let kept = stash.join(name);
        let (from, to) = if save { (f, &kept) } else { (&kept, f) };
        let tmp = to.with_extension("partial");
        std::fs::copy(from, &tmp)
            .and_then(|_| std::fs::rename(&tmp, to))
            .map_err(|e| {
                AgentError::setup(
                    to.display().to_string(),
                    format!("keeping the chosen candidate's {}: {e}", from.display()),
                )
            })?;
    }
    Ok(())
}
