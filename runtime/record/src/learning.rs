//! Run-level files: the learning curves of a training run, and episode summaries.

use crate::RecorderError;
use std::path::Path;

/// An episode's summary, written beside its recording as `episode_NNNNNN.json`.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EpisodeFileSummary {
    /// The robot's episode counter.
    pub episode: u64,
    /// Steps recorded.
    pub steps: u32,
    /// Sum of rewards.
    #[serde(rename = "return")]
    pub ret: f32,
    /// Success (from the task, or a person's label).
    pub success: bool,
    /// Times a person took over.
    pub interventions: u32,
    /// Steps a person drove.
    pub intervention_steps: u32,
    /// Median lateness of the loop's ticks, µs.
    pub lateness_p50_us: f64,
    /// 99th percentile, µs.
    pub lateness_p99_us: f64,
    /// Latest tick, µs.
    pub lateness_max_us: f64,
    /// Steps offered to the recorder and not recorded (queue full, or lost at the episode's end).
    pub dropped_steps: u64,
    /// The episode file is whole (absent: no file was written, e.g. live view only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub complete: Option<bool>,
    /// The episode file's name (`.partial` when cut short); `null` when none was written.
    #[serde(default)]
    pub recording: Option<String>,
}

/// Reads an episode's JSON summary (what `reflex replay --summary` prints).
pub fn read_summary(recording: &Path) -> Result<EpisodeFileSummary, RecorderError> {
    let p = recording.with_extension("json");
    let text = std::fs::read_to_string(&p).map_err(|e| RecorderError::File {
        path: p.display().to_string(),
        message: format!("{e} (episodes recorded by reflex have one beside the .rrd)"),
    })?;
    serde_json::from_str(&text).map_err(|e| RecorderError::File {
        path: p.display().to_string(),
        message: e.to_string(),
    })
}

/// One episode of a run, for the run-level learning-curve recording.
#[derive(Clone, Debug, Default)]
pub struct LearningPoint {
    /// The robot succeeded without a takeover.
    pub success: bool,
    /// A person took over at least once.
    pub intervened: bool,
    /// Return of the episode.
    pub ret: f32,
    /// Length in steps.
    pub steps: u32,
}

/// Writes `path` (an `.rrd`): per episode on the `episode` timeline, success and takeover (0/1),
/// their rolling means over `window` episodes, return and length; with a blueprint of two plots.
pub fn write_learning_curves(
    path: &Path,
    points: &[LearningPoint],
    window: usize,
) -> Result<(), RecorderError> {
    use rerun::blueprint::{Blueprint, TimeSeriesView, Vertical};
    let fail = |e: &dyn std::fmt::Display| RecorderError::File {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let rec = rerun::RecordingStreamBuilder::new("reflex")
        .recording_id("learning")
        .save(path)
        .map_err(|e| fail(&e))?;
    let bp = Blueprint::new(Vertical::new([
        TimeSeriesView::new("success and takeovers")
            .with_origin("rate")
            .into(),
        TimeSeriesView::new("return and length")
            .with_origin("episode")
            .into(),
    ]));
    let _ = bp.send(
        &rec,
        rerun::blueprint::BlueprintActivation {
            make_active: true,
            make_default: true,
        },
    );
    let w = window.max(1);
    for (i, p) in points.iter().enumerate() {
        rec.set_time_sequence("episode", i as i64);
        let from = (i + 1).saturating_sub(w);
        let recent = &points[from..=i];
        let mean = |f: fn(&LearningPoint) -> bool| {
            recent.iter().filter(|p| f(p)).count() as f64 / recent.len() as f64
        };
        let log = |k: &str, v: f64| {
            let _ = rec.log(k, &rerun::Scalars::single(v));
        };
        log("rate/success_rolling", mean(|p| p.success));
        log("rate/takeover_rolling", mean(|p| p.intervened));
        log("rate/success", p.success as u8 as f64);
        log("rate/takeover", p.intervened as u8 as f64);
        log("episode/return", p.ret as f64);
        log("episode/steps", p.steps as f64);
    }
    rec.flush_blocking().map_err(|e| fail(&e))
}
