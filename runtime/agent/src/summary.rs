//! A run's figures as one serialisable type: what `reflex run --json` prints.

use crate::actor::{RunReport, StopReport};
use crate::learner::LearnerReport;
use reflex_bus::learnlink::LinkStats;
use reflex_runtime::control::EpisodeSummary;
use reflex_runtime::safety::SafetyEvent;
use std::collections::BTreeMap;
use std::time::Duration;

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// One episode of a run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct EpisodeLine {
    /// The robot's episode counter.
    pub episode: u64,
    /// The reset seed, when the robot reports one.
    pub seed: Option<u64>,
    /// Steps.
    pub steps: u32,
    /// Sum of rewards.
    #[serde(rename = "return")]
    pub ret: f32,
    /// Success (the task's, or a person's label).
    pub success: bool,
    /// Times a person took over.
    pub interventions: u32,
    /// Ended by a person's label or reset.
    pub labelled: bool,
    /// Ended by the time limit.
    pub truncated: bool,
    /// Ended by an emergency stop.
    pub estop: bool,
    /// The episode's digest in hex: equal digests, bit-identical episodes.
    pub digest: String,
}

impl From<&EpisodeSummary> for EpisodeLine {
    fn from(e: &EpisodeSummary) -> Self {
        EpisodeLine {
            episode: e.episode,
            seed: e.seed,
            steps: e.steps,
            ret: e.ret,
            success: e.success,
            interventions: e.interventions,
            labelled: e.labelled,
            truncated: e.truncated,
            estop: e.estop,
            digest: format!("{:016x}", e.digest),
        }
    }
}

/// Success rate, mean return and mean length of some episodes, with every episode.
#[derive(Clone, Debug, serde::Serialize)]
pub struct EpisodesSummary {
    /// Episodes.
    pub episodes: usize,
    /// Successes over episodes.
    pub success_rate: f64,
    /// Mean return.
    pub mean_return: f64,
    /// Mean length, steps.
    pub mean_steps: f64,
    /// Every episode.
    pub episodes_detail: Vec<EpisodeLine>,
}

impl EpisodesSummary {
    /// Summarises `eps`.
    pub fn of(eps: &[EpisodeSummary]) -> Self {
        let n = eps.len().max(1) as f64;
        EpisodesSummary {
            episodes: eps.len(),
            success_rate: eps.iter().filter(|e| e.success).count() as f64 / n,
            mean_return: eps.iter().map(|e| e.ret as f64).sum::<f64>() / n,
            mean_steps: eps.iter().map(|e| e.steps as f64).sum::<f64>() / n,
            episodes_detail: eps.iter().map(EpisodeLine::from).collect(),
        }
    }
}

/// A run's figures: success, returns, loop timing, safety, the learner, and every episode with
/// its digest.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RunSummary {
    /// The run's id.
    pub run_id: String,
    /// Episodes (training or plain).
    pub episodes: usize,
    /// Successes over episodes.
    pub success_rate: f64,
    /// Mean return.
    pub mean_return: f64,
    /// Mean length, steps.
    pub mean_steps: f64,
    /// Wall time, s.
    pub wall_s: f64,
    /// Control ticks.
    pub ticks: u64,
    /// Median wake-up lateness, µs.
    pub lateness_p50_us: f64,
    /// 99th percentile, µs.
    pub lateness_p99_us: f64,
    /// Latest wake-up, µs.
    pub lateness_max_us: f64,
    /// Median per-step work, µs.
    pub step_p50_us: f64,
    /// 99th percentile, µs.
    pub step_p99_us: f64,
    /// Steps whose work took longer than a period.
    pub overruns: u64,
    /// Ticks missed.
    pub missed: u64,
    /// Median reset time, µs.
    pub reset_p50_us: f64,
    /// Longest reset, µs.
    pub reset_max_us: f64,
    /// Holds for want of a chunk.
    pub holds_no_chunk: u64,
    /// Steps a person drove.
    pub teleop_steps: u64,
    /// Chunks used.
    pub chunks: u64,
    /// Chunks discarded as stale.
    pub stale_chunks: u64,
    /// Safety events by name.
    pub safety: BTreeMap<String, u64>,
    /// Steps published on the bus trace.
    pub traced_steps: u64,
    /// The learner link's counters.
    pub learner_link: Option<LinkStats>,
    /// The in-process learner.
    pub learner: Option<LearnerReport>,
    /// A real arm's bus.
    pub arm: Option<reflex_hardware::robot::ArmReport>,
    /// The e-stop over the run.
    pub stop: StopReport,
    /// A residual that sees: its encoder and the feature maps' counters.
    pub features: Option<crate::actor::FeatureReport>,
    /// The success classifier's verdicts, when it gave the run's reward.
    pub reward: Option<reflex_adapters::reward::RewardCounts>,
    /// Messages refused, dropped or asked for again on the bus, per key (keys with none left
    /// out): e.g. `reflex/<robot>/cmd` with the commands sent again for a lost observation.
    pub rejected: Vec<(String, u64)>,
    /// The residual version in use at the end.
    pub residual_version: u64,
    /// Recording.
    pub recording: Option<crate::actor::Recording>,
    /// Reset seeds, in order.
    pub seeds: Vec<Option<u64>>,
    /// Every episode.
    pub episodes_detail: Vec<EpisodeLine>,
    /// The evaluation episodes (the learner's deterministic action), when there were any.
    pub eval: Option<EpisodesSummary>,
}

impl RunReport {
    /// The run's figures as one serialisable value.
    pub fn summary(&self) -> RunSummary {
        let all = EpisodesSummary::of(&self.episodes);
        let s = &self.stats;
        RunSummary {
            run_id: self.run_id.clone(),
            episodes: all.episodes,
            success_rate: all.success_rate,
            mean_return: all.mean_return,
            mean_steps: all.mean_steps,
            wall_s: self.wall_s,
            ticks: s.ticks,
            lateness_p50_us: us(s.lateness.percentile(50.0)),
            lateness_p99_us: us(s.lateness.percentile(99.0)),
            lateness_max_us: us(s.lateness.max()),
            step_p50_us: us(s.step.percentile(50.0)),
            step_p99_us: us(s.step.percentile(99.0)),
            overruns: s.overruns,
            missed: s.missed,
            reset_p50_us: us(s.reset.percentile(50.0)),
            reset_max_us: us(s.reset.max()),
            holds_no_chunk: s.holds_no_chunk,
            teleop_steps: s.teleop_steps,
            chunks: s.chunks,
            stale_chunks: s.stale_chunks,
            safety: SafetyEvent::ALL
                .iter()
                .map(|e| (e.name().to_string(), self.safety.get(*e)))
                .collect(),
            traced_steps: self.traced,
            learner_link: self.link.clone(),
            learner: self.learner.clone(),
            arm: self.arm.clone(),
            stop: self.stop.clone(),
            features: self.features.clone(),
            reward: self.reward,
            rejected: self.rejected.clone(),
            residual_version: s.residual_version,
            recording: self.recording.clone(),
            seeds: self.episodes.iter().map(|e| e.seed).collect(),
            episodes_detail: all.episodes_detail,
            eval: (!self.eval.is_empty()).then(|| EpisodesSummary::of(&self.eval)),
        }
    }
}
