//! A reward the robot can see: a success classifier judges each new frame, and its verdict
//! replaces the robot's own reward and success (HIL-SERL's reward classifier; LeRobot's port of
//! it). A frame counts as success when the classifier's probability is at or above a threshold;
//! `consecutive_frames` such frames in a row give reward 1, success, and end the episode. The
//! robot still says when an episode is over otherwise (its time limit, a failure it detects
//! itself), but an end the robot calls a success (a simulator's own task check) does not end a
//! judged episode: the classifier decides that; a person's success or failure key still overrides everything (the loop ends the
//! episode with the person's label).
//!
//! [`ClassifiedReward`] wraps any [`Robot`]; the classifier runs as a [`FeatureDriver`] with one
//! value: inline in simulated time (the verdict on the frame in hand), on its own thread in real
//! time (the newest verdict, which may be a frame or two behind; older than allowed, no verdict).
//! The probability goes out with every observation as `success_score`, so the recording and the
//! step log show it.

use reflex_contracts::msg::{Observation, RobotSpec};
use reflex_contracts::robot::{Robot, RobotError};
use reflex_runtime::features::{FeatureDriver, FrameKey, LoopFeatures};
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
        // The robot's own ends still end the episode, except an end it calls success (a
        // simulator's task check): the classifier's verdict replaces that one, or the truth
        // the classifier stands in for would leak into the run as an unexplained end.
        let robot_end = o.terminated && !o.success;
        o.reward = hit as u8 as f32;
        o.success = hit;
        o.terminated = hit || robot_end;
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

    fn attach_stop(&mut self, stop: std::sync::Arc<reflex_contracts::stop::StopSwitch>) {
        self.inner.attach_stop(stop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reflex_contracts::msg::{
        ActionKind, ActionSpec, CameraSpec, Image, PROTOCOL_VERSION, StateField,
    };
    use reflex_runtime::features::{FeatureFeed, FrameEncoder};

    /// A free-running robot with one 2x1 camera whose red value is the step; its own task
    /// "succeeds" at every step (which the classifier must override).
    struct Cam {
        spec: RobotSpec,
        obs: Observation,
    }

    fn cam() -> Cam {
        let spec = RobotSpec {
            v: PROTOCOL_VERSION,
            name: "cam".into(),
            kind: "test".into(),
            control_hz: 10.0,
            lockstep: false,
            state: vec![StateField::new("x", 1, "")],
            action: ActionSpec {
                kind: ActionKind::EeDelta,
                names: vec!["a".into()],
                low: vec![-1.0],
                high: vec![1.0],
            },
            cameras: vec![CameraSpec {
                name: "front".into(),
                width: 2,
                height: 1,
                intrinsics: None,
                mount: None,
            }],
            joints: vec![],
            max_episode_steps: 0,
            scene: None,
        };
        let obs = Observation {
            state: vec![0.0],
            reward: 5.0,
            success: true,
            images: vec![Image {
                camera: "front".into(),
                width: 2,
                height: 1,
                encoding: "rgb8".into(),
                data: vec![0; 6],
                seq: 0,
                age_ns: 0,
            }],
            ..Default::default()
        };
        Cam { spec, obs }
    }

    impl Robot for Cam {
        fn spec(&self) -> &RobotSpec {
            &self.spec
        }
        fn reset(&mut self, _: Option<u64>) -> Result<&Observation, RobotError> {
            self.obs.episode += 1;
            self.obs.step = 0;
            self.obs.images[0].data[0] = 0;
            Ok(&self.obs)
        }
        fn command(&mut self, _: &[f32]) -> Result<(), RobotError> {
            self.obs.step += 1;
            self.obs.seq += 1;
            self.obs.images[0].data[0] = self.obs.step as u8;
            Ok(())
        }
        fn observe(&mut self) -> Result<&Observation, RobotError> {
            Ok(&self.obs)
        }
        fn hold_action(&self, out: &mut [f32]) {
            out.fill(0.0)
        }
    }

    /// Probability: the red value over 10 (steps 5 and on reach 0.5).
    struct Red;

    impl FrameEncoder for Red {
        fn features_len(&self) -> usize {
            1
        }
        fn encode(&mut self, images: &[Image], out: &mut [f32]) -> Result<(), String> {
            out[0] = images[0].data[0] as f32 / 10.0;
            Ok(())
        }
    }

    const RULE: RewardRule = RewardRule {
        threshold: 0.5,
        consecutive_frames: 3,
    };

    #[test]
    fn inline_three_frames_at_the_threshold_end_the_episode_as_a_success() {
        let mut r = ClassifiedReward::new(cam(), FeatureDriver::Inline(Box::new(Red)), RULE);
        let o = r.reset(None).unwrap();
        assert_eq!((o.reward, o.success, o.terminated), (0.0, false, false));
        assert_eq!(o.success_score, Some(0.0));
        let mut ended_at = None;
        for step in 1..=10u32 {
            r.command(&[0.0]).unwrap();
            let o = r.observe().unwrap();
            if o.terminated {
                assert_eq!((o.reward, o.success), (1.0, true));
                ended_at = Some(step);
                break;
            }
            assert_eq!(
                (o.reward, o.success),
                (0.0, false),
                "the robot's own success"
            );
        }
        // Steps 5, 6, 7 reach 0.5: the third of them ends it.
        assert_eq!(ended_at, Some(7));
        // The same frame again: judged once, the verdict stays.
        assert!(r.observe().unwrap().terminated);
        let c = r.counts().unwrap();
        assert_eq!((c.frames, c.above, c.successes, c.unjudged), (8, 3, 1, 0));
        // A reset starts the count again.
        assert!(!r.reset(None).unwrap().terminated);
    }

    #[test]
    fn on_its_own_thread_the_newest_verdict_ends_the_episode() {
        let c = cam();
        let feed = FeatureFeed::start(Box::new(Red), &c.obs.images).unwrap();
        let driver = FeatureDriver::Thread {
            feed,
            max_age_frames: 1_000,
        };
        let mut r = ClassifiedReward::new(c, driver, RULE);
        r.reset(None).unwrap();
        let t0 = std::time::Instant::now();
        loop {
            r.command(&[0.0]).unwrap();
            if r.observe().unwrap().terminated {
                break;
            }
            assert!(t0.elapsed().as_secs() < 20, "never a success");
            // Gives the classifier's thread its turn, as a period would.
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let o = r.observe().unwrap();
        assert!(o.success && o.success_score.unwrap() >= 0.5);
    }

    #[test]
    fn the_robots_own_success_does_not_end_a_judged_episode_its_failures_do() {
        let mut c = cam();
        // The robot calls every step a success and ends the episode on it (a simulator's task
        // check): the classifier, below its threshold at step 1, stands in for that verdict.
        c.obs.terminated = true;
        let mut r = ClassifiedReward::new(c, FeatureDriver::Inline(Box::new(Red)), RULE);
        r.reset(None).unwrap();
        r.command(&[0.0]).unwrap();
        let o = r.observe().unwrap();
        assert_eq!((o.reward, o.success, o.terminated), (0.0, false, false));
        // A failure the robot detects itself still ends it, as a failure.
        let mut c = cam();
        c.obs.terminated = true;
        c.obs.success = false;
        let mut r = ClassifiedReward::new(c, FeatureDriver::Inline(Box::new(Red)), RULE);
        r.reset(None).unwrap();
        r.command(&[0.0]).unwrap();
        let o = r.observe().unwrap();
        assert_eq!((o.reward, o.success, o.terminated), (0.0, false, true));
    }

    #[test]
    fn without_a_classifier_the_robot_is_untouched() {
        let mut r = ClassifiedReward::passthrough(cam());
        let o = r.reset(None).unwrap();
        assert_eq!((o.reward, o.success, o.success_score), (5.0, true, None));
        assert!(r.counts().is_none());
    }
}
