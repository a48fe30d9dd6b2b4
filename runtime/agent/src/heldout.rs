//! Judging a policy alone: success with a 95% Wilson score interval, mean return and length,
//! takeovers (which must be zero when nobody watches), and a check that the seeds are not ones
//! training saw.

use reflex_runtime::control::EpisodeSummary;

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
    /// Evaluation seeds that training also used (zero: the seeds are held out).
    pub seeds_seen_in_training: u64,
}

impl HeldOut {
    /// Summarises `eval`, checking its seeds against those of `train`.
    pub fn of(eval: &[EpisodeSummary], train: &[EpisodeSummary]) -> HeldOut {
        let n = eval.len() as u64;
        let k = eval.iter().filter(|e| e.success).count() as u64;
        let trained: std::collections::HashSet<u64> = train.iter().filter_map(|e| e.seed).collect();
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
            seeds_seen_in_training: eval
                .iter()
                .filter(|e| e.seed.is_some_and(|s| trained.contains(&s)))
                .count() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
