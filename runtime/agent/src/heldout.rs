//! Judging a policy alone: success with a 95% Wilson score interval, mean return and length,
//! takeovers (which must be zero when nobody watches), and a check that the seeds are not ones
//! training saw.

use crate::actor::{RunOptions, RunReport, run_config};
use crate::config::RunConfig;
use crate::progress::Progress;
use crate::{AgentError, error::Result};
use reflex_runtime::control::EpisodeSummary;
use std::path::PathBuf;

/// The seed of the held-out episode stream of a run trained with episode seed `train_seed`: a
/// different generator stream (SplitMix64 of the seed with a tag), so an evaluation never
/// replays training's episodes, and not an involution, so evaluating the evaluation's own
/// config draws a third stream rather than training's. Below 2^63, so a TOML file (signed
/// 64-bit integers) holds it as `[run] seed`.
pub fn held_out_seed(train_seed: u64) -> u64 {
    let mut z = (train_seed ^ 0x4845_4c44_4f55_5421).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) >> 1
}

/// The 95% Wilson score interval of `k` successes in `n` trials (Wilson 1927; it stays inside
/// [0, 1] and is honest at small `n` and at rates near 0 or 1, unlike the normal approximation).
pub fn wilson_95(k: u64, n: u64) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let z = 1.959_963_984_540_054_f64;
    let (n, p) = (n as f64, k as f64 / n as f64);
    let z2n = z * z / n;
    let centre = (p + z2n / 2.0) / (1.0 + z2n);
    let half = z / (1.0 + z2n) * (p * (1.0 - p) / n + z2n / (4.0 * n)).sqrt();
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

/// What a held-out evaluation found.
#[derive(Clone, Debug, serde::Serialize)]
pub struct HeldOut {
    /// Episodes run.
    pub episodes: u64,
    /// Episodes that succeeded.
    pub successes: u64,
    /// `successes / episodes`.
    pub success_rate: f64,
    /// 95% Wilson score interval of the success rate.
    pub success_rate_wilson_95: (f64, f64),
    /// Mean return.
    pub mean_return: f64,
    /// Mean episode length, steps.
    pub mean_steps: f64,
    /// Takeovers during the evaluation (zero: nobody drives).
    pub takeovers: u64,
    /// Evaluation seeds that training also used (zero: the seeds are held out); absent when
    /// training's seeds are not known here (`reflex eval`: a seed stream apart by construction).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seeds_seen_in_training: Option<u64>,
}

impl HeldOut {
    /// Summarises `eval`, checking its seeds against those of `train` when they are known.
    pub fn of(eval: &[EpisodeSummary], train: Option<&[EpisodeSummary]>) -> HeldOut {
        let n = eval.len() as u64;
        let k = eval.iter().filter(|e| e.success).count() as u64;
        let mean = |f: &dyn Fn(&EpisodeSummary) -> f64| {
            eval.iter().map(f).sum::<f64>() / (n.max(1) as f64)
        };
        HeldOut {
            episodes: n,
            successes: k,
            success_rate: k as f64 / n.max(1) as f64,
            success_rate_wilson_95: wilson_95(k, n),
            mean_return: mean(&|e| e.ret as f64),
            mean_steps: mean(&|e| e.steps as f64),
            takeovers: eval.iter().map(|e| e.interventions as u64).sum(),
            seeds_seen_in_training: train.map(|train| {
                let trained: std::collections::HashSet<u64> =
                    train.iter().filter_map(|e| e.seed).collect();
                eval.iter()
                    .filter(|e| e.seed.is_some_and(|s| trained.contains(&s)))
                    .count() as u64
            }),
        }
    }
}

/// What `reflex eval` is asked.
#[derive(Clone, Debug, Default)]
pub struct EvalOptions {
    /// Episodes.
    pub episodes: u64,
    /// A residual file to run instead of the config's `[policy.residual]`.
    pub residual: Option<PathBuf>,
    /// Seed of the episode stream (default: [`held_out_seed`] of the config's `[run] seed`).
    pub seed: Option<u64>,
    /// How the actor reaches the bus (remote robots).
    pub run: RunOptions,
}

/// What `reflex eval --json` prints: the held-out figures (without training's seeds, which
/// are not known here), the seed stream, the wall time and every episode's seed.
#[derive(Clone, Debug, serde::Serialize)]
pub struct EvalSummary {
    /// The held-out figures.
    #[serde(flatten)]
    pub held_out: HeldOut,
    /// The seed of the evaluation's seed stream.
    pub seed: u64,
    /// Wall time, s.
    pub wall_s: f64,
    /// Every episode's reset seed.
    pub seeds: Vec<Option<u64>>,
}

impl EvalSummary {
    /// From what [`evaluate_config`] returns.
    pub fn new(h: &HeldOut, report: &RunReport, seed: u64) -> Self {
        EvalSummary {
            held_out: h.clone(),
            seed,
            wall_s: report.wall_s,
            seeds: report.episodes.iter().map(|e| e.seed).collect(),
        }
    }
}

/// `reflex eval`: the config's robot and policy alone (no learner, nobody driving), the kept
/// residual's deterministic action when there is one, on a seed stream apart from training's.
/// A takeover during the evaluation is an error: the figure would not be the policy's.
pub fn evaluate_config(
    cfg: &RunConfig,
    o: &EvalOptions,
    progress: &dyn Progress,
) -> Result<(HeldOut, RunReport, u64)> {
    let mut cfg = cfg.clone();
    if cfg.learner.take().is_some() {
        tracing::info!("reflex eval: the config's [learner] is left out (the policy alone)");
    }
    if let Some(r) = &o.residual {
        cfg.policy.residual = Some(crate::config::ResidualSection {
            model: r.clone(),
            encoder: None,
        });
    }
    let seed = o.seed.unwrap_or_else(|| held_out_seed(cfg.run.seed));
    cfg.run.seed = seed;
    cfg.run.episodes = o.episodes;
    cfg.run.eval_episodes = 0;
    let report = run_config(
        &cfg,
        &RunOptions {
            episodes: None,
            ..o.run.clone()
        },
        progress,
    )?;
    let h = HeldOut::of(&report.episodes, None);
    if h.takeovers > 0 {
        return Err(AgentError::setup(
            "reflex eval",
            format!(
                "a person took over {} times during the evaluation, so its success rate is not the policy's; stop teleop on this robot and evaluate again",
                h.takeovers
            ),
        ));
    }
    Ok((h, report, seed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_out_seeds_differ_from_training_and_from_their_own_held_out() {
        for s in [0u64, 1, 2, 3, 42, u64::MAX] {
            let h = held_out_seed(s);
            assert!(h <= i64::MAX as u64, "a TOML integer");
            assert_ne!(h, s);
            assert_ne!(
                held_out_seed(h),
                s,
                "evaluating an evaluation must not replay training"
            );
            assert_ne!(held_out_seed(h), h);
        }
    }

    #[test]
    fn wilson_matches_published_values() {
        // Newcombe (1998), table I: 81 of 263 -> 0.2553 .. 0.3662; 15 of 148 -> 0.0624 .. 0.1605.
        let (lo, hi) = wilson_95(81, 263);
        assert!(
            (lo - 0.2553).abs() < 5e-4 && (hi - 0.3662).abs() < 5e-4,
            "{lo} {hi}"
        );
        let (lo, hi) = wilson_95(15, 148);
        assert!(
            (lo - 0.0624).abs() < 5e-4 && (hi - 0.1605).abs() < 5e-4,
            "{lo} {hi}"
        );
        // The ends stay inside [0, 1] and are not degenerate.
        let (lo, hi) = wilson_95(0, 10);
        assert!(lo == 0.0 && (hi - 0.2775).abs() < 5e-4, "{lo} {hi}");
        let (lo, hi) = wilson_95(10, 10);
        assert!(
            (lo - 0.7225).abs() < 5e-4 && (hi - 1.0).abs() < 1e-12,
            "{lo} {hi}"
        );
    }
}
