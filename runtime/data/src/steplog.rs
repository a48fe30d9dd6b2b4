//! Every step of a run in reflex's episode format (`<run>/steps/`, docs/sim.md), with who acted,
//! the base action, the residual and the camera frames the loop handed out: what `reflex dataset
//! export --run` turns into a LeRobot dataset and `reflex reward train --runs` learns success
//! from. Written by the demo and, with `--record`, by `reflex run` (on the outbox's thread, off
//! the loop). Each episode is written whole and atomically when it ends.

use crate::Result;
use crate::demos::{CameraStream, DemoWriter, Episode};
use reflex_contracts::msg::RobotSpec;
use reflex_runtime::outbox::{Frames, Transition};
use std::path::Path;

/// The episodes of a run as they end.
pub struct StepLog {
    writer: DemoWriter,
    ep: Episode,
    /// The robot's episode counter and the step of each transition of the episode in progress.
    episode: Option<u64>,
    steps: Vec<u32>,
    /// Frames of the episode in progress: (episode, step, one image per camera).
    frames: Vec<(u64, u32, Vec<Vec<u8>>)>,
    /// Camera names and sizes, from the first frame set.
    cameras: Vec<(String, u32, u32)>,
    /// Frame sets not kept: not rgb8, another size or camera list than the first, or of no
    /// observation of the episode they came with.
    pub frames_rejected: u64,
}

impl StepLog {
    /// A log in `dir` for episodes of `spec`, made by `command`.
    pub fn create(dir: &Path, spec: &RobotSpec, command: &str) -> Result<Self> {
        Ok(StepLog {
            writer: DemoWriter::create(dir, spec, command)?,
            ep: Episode::default(),
            episode: None,
            steps: vec![],
            frames: vec![],
            cameras: vec![],
            frames_rejected: 0,
        })
    }

    /// Adds the camera frames of one observation (they come before the transition that starts
    /// from that observation, and the last observation's before the transition that ends the
    /// episode). Copies the pixels: the caller recycles `f`.
    pub fn push_frames(&mut self, f: &Frames) {
        let same = |(name, w, h): &(String, u32, u32), i: &reflex_contracts::msg::Image| {
            *name == i.camera && *w == i.width && *h == i.height
        };
        let ok = !f.images.is_empty()
            && f.images.iter().all(|i| {
                i.encoding == "rgb8" && i.data.len() == i.width as usize * i.height as usize * 3
            })
            && (self.cameras.is_empty()
                || (self.cameras.len() == f.images.len()
                    && self.cameras.iter().zip(&f.images).all(|(c, i)| same(c, i))));
        if !ok {
            self.frames_rejected += 1;
            return;
        }
        if self.cameras.is_empty() {
            self.cameras = f
                .images
                .iter()
                .map(|i| (i.camera.clone(), i.width, i.height))
                .collect();
        }
        let images = f.images.iter().map(|i| i.data.clone()).collect();
        self.frames.push((f.episode, f.step, images));
    }

    /// Adds a step; `person` when a person drove it, `seed` the episode's reset seed when known.
    /// The episode is written when the step ends it.
    pub fn push(&mut self, tr: &Transition, person: bool, seed: Option<u64>) -> Result<()> {
        let ep = &mut self.ep;
        if ep.actions.is_empty() {
            ep.observations.push(tr.obs.clone());
            self.episode = Some(tr.episode);
        }
        self.steps.push(tr.step);
        ep.observations.push(tr.next_obs.clone());
        ep.actions.push(tr.action.clone());
        ep.rewards.push(tr.reward);
        if let Some(p) = tr.success_score {
            ep.success_scores.push(p);
        }
        ep.ret += tr.reward;
        ep.actors.push(person as u8);
        ep.base_actions.push(tr.base.clone());
        ep.residuals.push(tr.residual.clone());
        if tr.ends_episode() {
            // A person's key is the verdict, over the robot's or a classifier's.
            ep.success = tr.label.unwrap_or(tr.success);
            ep.person_label = tr.label;
            ep.terminated = tr.terminated;
            ep.truncated = tr.truncated;
            ep.seed = seed.unwrap_or(0);
            self.attach_frames();
            self.writer.write(&mut self.ep)?;
            self.ep = Episode::default();
            self.steps.clear();
            self.episode = None;
        }
        Ok(())
    }

    /// Moves the kept frames of the episode in progress into it, each at its observation: the
    /// transition of step `s` starts from observation `i` where `steps[i] == s`, and the last
    /// observation is the step after the last transition's.
    fn attach_frames(&mut self) {
        let frames = std::mem::take(&mut self.frames);
        let (Some(episode), Some(&last)) = (self.episode, self.steps.last()) else {
            self.frames_rejected += frames.len() as u64;
            return;
        };
        let mut streams: Vec<CameraStream> = self
            .cameras
            .iter()
            .map(|(c, w, h)| CameraStream::new(c, *w, *h))
            .collect();
        let mut at = Vec::with_capacity(frames.len());
        for (e, step, images) in frames {
            let obs = if step == last + 1 {
                Some(self.steps.len())
            } else {
                self.steps.binary_search(&step).ok()
            };
            match obs {
                Some(i) if e == episode && at.last().is_none_or(|&p| p < i as u32) => {
                    at.push(i as u32);
                    for (s, px) in streams.iter_mut().zip(images) {
                        s.frames.push(serde_bytes::ByteBuf::from(px));
                    }
                }
                _ => self.frames_rejected += 1,
            }
        }
        if at.is_empty() {
            return;
        }
        // Every observation has its frame: the plain layout, readable by older tools.
        if at.len() != self.ep.observations.len() {
            self.ep.frame_observations = at;
        }
        self.ep.cameras = streams;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reflex_contracts::msg::Image;

    fn spec() -> RobotSpec {
        use reflex_contracts::msg::{ActionKind, ActionSpec, PROTOCOL_VERSION, StateField};
        RobotSpec {
            v: PROTOCOL_VERSION,
            name: "sim".into(),
            kind: "test".into(),
            control_hz: 20.0,
            lockstep: true,
            state: vec![StateField::new("x", 1, "m")],
            action: ActionSpec {
                kind: ActionKind::Box,
                names: vec!["a".into()],
                low: vec![-1.0],
                high: vec![1.0],
            },
            cameras: vec![],
            joints: vec![],
            max_episode_steps: 10,
            scene: None,
        }
    }

    fn frames(episode: u64, step: u32, v: u8) -> Frames {
        Frames {
            episode,
            step,
            t: Default::default(),
            images: vec![Image {
                camera: "front".into(),
                width: 2,
                height: 1,
                encoding: "rgb8".into(),
                data: vec![v; 6],
                seq: 0,
                age_ns: 0,
            }],
        }
    }

    fn tr(episode: u64, step: u32, end: bool) -> Transition {
        let mut t = Transition::with_dims(1, 1);
        t.episode = episode;
        t.step = step;
        t.obs[0] = step as f32;
        t.next_obs[0] = step as f32 + 1.0;
        t.terminated = end;
        t
    }

    #[test]
    fn frames_land_on_their_observations_and_a_person_label_is_the_verdict() {
        let dir = tempfile::tempdir().unwrap();
        let spec = spec();
        let mut log = StepLog::create(dir.path(), &spec, "test").unwrap();
        // Episode 3: frames at steps 0 and 2 and the last observation (step 4); a frame of
        // another episode and one of a step that never came are not kept.
        log.push_frames(&frames(3, 0, 10));
        log.push(&tr(3, 0, false), false, None).unwrap();
        log.push(&tr(3, 1, false), false, None).unwrap();
        log.push_frames(&frames(3, 2, 12));
        log.push_frames(&frames(9, 2, 99));
        log.push(&tr(3, 2, false), false, None).unwrap();
        log.push_frames(&frames(3, 7, 77));
        let mut last = tr(3, 3, true);
        last.success = true;
        last.label = Some(false);
        log.push_frames(&frames(3, 4, 14));
        log.push(&last, true, Some(5)).unwrap();
        assert_eq!(log.frames_rejected, 2);
        let m = crate::demos::read_manifest(dir.path()).unwrap();
        let ep = crate::demos::read_episode(dir.path(), &m.episodes[0]).unwrap();
        assert_eq!(ep.observations.len(), 5);
        assert_eq!(ep.frame_observations, vec![0, 2, 4]);
        let px: Vec<u8> = ep.cameras[0].frames.iter().map(|f| f[0]).collect();
        assert_eq!(px, vec![10, 12, 14]);
        assert_eq!((ep.frame_at(1), ep.frame_at(3), ep.frame_at(4)), (0, 1, 2));
        // The classifier said success, the person's failure key overrides it.
        assert!(!ep.success);
        assert_eq!(ep.person_label, Some(false));
        // Next episode: every observation has a frame, so the plain layout is written.
        log.push_frames(&frames(4, 0, 1));
        log.push_frames(&frames(4, 1, 2));
        log.push(&tr(4, 0, true), false, None).unwrap();
        let m = crate::demos::read_manifest(dir.path()).unwrap();
        let ep = crate::demos::read_episode(dir.path(), &m.episodes[1]).unwrap();
        assert!(ep.frame_observations.is_empty());
        assert_eq!(ep.cameras[0].frames.len(), 2);
        assert_eq!(ep.person_label, None);
    }

    #[test]
    fn frames_of_another_size_are_rejected_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let spec = spec();
        let mut log = StepLog::create(dir.path(), &spec, "test").unwrap();
        log.push_frames(&frames(0, 0, 1));
        let mut odd = frames(0, 1, 2);
        odd.images[0].width = 1;
        log.push_frames(&odd);
        let mut short = frames(0, 1, 2);
        short.images[0].data.pop();
        log.push_frames(&short);
        assert_eq!(log.frames_rejected, 2);
    }
}
