//! A reward the robot can see: a success classifier judges each new frame, and its verdict
//! replaces the robot's own reward and success (HIL-SERL's reward classifier; LeRobot's port of
//! it). A frame counts as success when the classifier's probability is at or above a threshold;
//! `consecutive_frames` such frames in a row give reward 1, success, and end the episode. The
//! robot still says when an episode is over otherwise (its time limit, a failure it detects
//! itself); a person's success or failure key still overrides everything (the loop ends the
//! episode with the person's label).
//!
//! [`ClassifiedReward`] wraps any [`Robot`]; the classifier runs as a [`FeatureDriver`] with one
//! value: inline in simulated time (the verdict on the frame in hand), on its own thread in real
//! time (the newest verdict, which may be a frame or two behind; older than allowed, no verdict).
//! The probability goes out with every observation as `success_score`, so the recording and the
//! step log show it.

use crate::features::{FeatureDriver, FrameKey, LoopFeatures};
use crate::msg::{Observation, RobotSpec};
use crate::robot::{Robot, RobotError};
use std::time::Instant;

/// How a classifier's probabilities become the run's reward.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RewardRule {
    /// Probability at or above which a frame shows success.
    pub threshold: f32,
    /// Frames in a row at or above it before the episode counts as a success.
    pub consecutive_frames: u32,
}

/// Counters of the classifier's verdicts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RewardCounts {
    /// Frames judged.
    pub frames: u64,
    /// Frames at or above the threshold.
    pub above: u64,
    /// Episodes the classifier ended as a success.
    pub successes: u64,
    /// Frames without a verdict (the classifier failed, or its newest verdict was too old).
    pub unjudged: u64,
}

/// A robot whose reward, success and end of episode come from a success classifier (see the
/// module's documentation). Without a classifier it passes everything through untouched.
pub struct ClassifiedReward<R: Robot> {
    inner: R,
    judge: Option<Judge>,
}

struct Judge {
    scorer: LoopFeatures,
    rule: RewardRule,
    obs: Observation,
    run: u32,
    score: Option<f32>,
    last: Option<FrameKey>,
    epoch: Instant,
    counts: RewardCounts,
}

impl<R: Robot> ClassifiedReward<R> {
    /// `inner` unchanged.
    pub fn passthrough(inner: R) -> Self {
        ClassifiedReward { inner, judge: None }
    }

    /// `inner` judged by `classifier` under `rule`.
    pub fn new(inner: R, classifier: FeatureDriver, rule: RewardRule) -> Self {
        let obs = Observation {
            state: vec![0.0; inner.spec().state_dim()],
            ..Default::default()
        };
        ClassifiedReward {
            inner,
            judge: Some(Judge {
                scorer: LoopFeatures::new(classifier, 0),
                rule,
                obs,
                run: 0,
                score: None,
                last: None,
                epoch: Instant::now(),
                counts: RewardCounts::default(),
            }),
        }
    }

    /// The robot inside.
    pub fn inner(&self) -> &R {
        &self.inner
    }

    /// The verdicts so far (`None` without a classifier).
    pub fn counts(&self) -> Option<RewardCounts> {
        self.judge.as_ref().map(|j| j.counts)
    }
}

impl Judge {
    /// Judges `self.obs` (just copied from the robot) if it is a new frame, and writes the
    /// verdict into it.
    fn judge(&mut self) {
        let o = &mut self.obs;
        let key = (o.episode, o.step, o.seq, o.time_ns);
        if self.last != Some(key) {
            self.last = Some(key);
            self.scorer
                .observe(key, &[], &o.images, self.epoch.elapsed());
            self.counts.frames += 1;
            if self.scorer.fresh() {
                let p = self.scorer.maps()[0];
                self.score = Some(p);
                if p >= self.rule.threshold {
                    self.run += 1;
                    self.counts.above += 1;
                    if self.run == self.rule.consecutive_frames {
                        self.counts.successes += 1;
                    }
                } else {
                    self.run = 0;
                }
            } else {
                self.score = None;
                self.counts.unjudged += 1;
            }
        }
        let hit = self.run >= self.rule.consecutive_frames;
        o.reward = hit as u8 as f32;
        o.success = hit;
        o.terminated = hit || o.terminated;
        o.success_score = self.score;
    }
}

impl<R: Robot> Robot for ClassifiedReward<R> {
    fn spec(&self) -> &RobotSpec {
        self.inner.spec()
    }

    fn reset(&mut self, seed: Option<u64>) -> Result<&Observation, RobotError> {
        let Some(j) = &mut self.judge else {
            return self.inner.reset(seed);
        };
        let o = self.inner.reset(seed)?;
        j.obs.copy_from(o);
        j.run = 0;
        j.score = None;
        j.judge();
        Ok(&j.obs)
    }

    fn command(&mut self, action: &[f32]) -> Result<(), RobotError> {
        self.inner.command(action)
    }

    fn observe(&mut self) -> Result<&Observation, RobotError> {
        let Some(j) = &mut self.judge else {
            return self.inner.observe();
        };
        let o = self.inner.observe()?;
        // The same frame again keeps its verdict (judged once per frame).
        j.obs.copy_from(o);
        j.judge();
        Ok(&j.obs)
    }

    fn hold_action(&self, out: &mut [f32]) {
        self.inner.hold_action(out)
    }

    fn attach_stop(&mut self, stop: std::sync::Arc<crate::contracts::stop::StopSwitch>) {
        self.inner.attach_stop(stop)
    }
}
