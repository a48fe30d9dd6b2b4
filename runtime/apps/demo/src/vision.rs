//! `reflex demo --vision`: the demo learning from pixels. The simulated arm reports only its own
//! joints and tool pose (`[sim] state = "arm"`) and renders its two cameras; the base policy
//! reads the cameras; the learner sees through the base policy's frozen encoder (maps computed
//! inline on the loop's frame, carried with every transition); a success classifier on the same
//! cameras, not the simulator, gives the reward and ends episodes. The simulated person watches
//! the scene itself: they demonstrate, take over as in the state demo, and mark a classifier's
//! success they can see is false as a failure (HIL-SERL's operator does the same; the count is
//! reported), which is the only way the simulator's truth reaches the learner.

use reflex_adapters::reward::ClassifiedReward;
use reflex_agent::config::VisionSection;
use reflex_agent::error::Result;
use reflex_contracts::msg::{Observation, RobotSpec, StepFeatures};
use reflex_policies::features::FeatureEncoder;
use reflex_policies::onnx_policy::OnnxPolicy;
use reflex_runtime::features::LoopFeatures;
use reflex_runtime::outbox::Transition;
use reflex_sim::{SimConfig, SimEnv, StateView, TaskKind};
use std::path::PathBuf;

/// What `reflex demo --vision` reads besides the base policy.
#[derive(Clone, Debug)]
pub struct VisionDemo {
    /// The frozen image encoder the learner sees through (default: the base policy's own,
    /// `<model>.encoder.onnx` beside it).
    pub encoder: PathBuf,
    /// The success classifier whose verdict is the reward (`reflex reward train` writes it).
    pub classifier: PathBuf,
    /// Frames in a row the classifier must call success.
    pub consecutive_frames: u32,
    /// Probability at or above which a frame counts as success (default: the classifier's).
    pub threshold: Option<f32>,
    /// Camera images' size, pixels (width, height): the base policy's, encoder's and classifier's.
    pub camera_size: (u32, u32),
}

impl VisionDemo {
    /// The shipped pixel models: `pick-seeing.onnx`'s encoder and `pick-reward.onnx` beside `model`.
    pub fn beside(model: &std::path::Path) -> Self {
        let dir = model.parent().unwrap_or(std::path::Path::new("."));
        let stem = model
            .file_stem()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_default();
        VisionDemo {
            encoder: dir.join(format!("{stem}.encoder.onnx")),
            classifier: dir.join("pick-reward.onnx"),
            consecutive_frames: 2,
            threshold: None,
            camera_size: (64, 64),
        }
    }
}

/// A demo config's `[learner.vision]`: the learner's heads, on the demo's own encoder (the keys
/// of a run's `[learner.vision]` but `encoder` and the real-time `max_map_age_frames`).
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeadKeys {
    /// Learned spatial embeddings per map channel (default: SERL's 8).
    pub embeddings: Option<usize>,
    /// Width of each camera's head (default: SERL's 256).
    pub width: Option<usize>,
    /// The person's corrections also train the heads (default: true; `false` is SERL's recipe).
    pub bc_trains_heads: Option<bool>,
    /// DrQ's random shift of the maps, places (default: [`VISION_SHIFT`]).
    pub shift: Option<usize>,
}

/// The pixel demo's random shift of the maps in each sampled batch, places: one place of the
/// shipped encoder's 16x16 map is 4 of its 64x64 pixels, SERL's shift of its images. With it the
/// pixel demo reached 93 / 85 / 92 / 93 % held out on seeds 0-3, against 88 / 83 / 74 / 86 %
/// without (docs/training.md, "Learning from pixels").
pub const VISION_SHIFT: usize = 1;

impl HeadKeys {
    /// The run's `[learner.vision]` these keys describe on `v`'s encoder (checked and resolved
    /// as a run's is).
    pub fn section(&self, v: &VisionDemo) -> VisionSection {
        let mut s = VisionSection::with_encoder(v.encoder.clone());
        s.embeddings = self.embeddings.unwrap_or(s.embeddings);
        s.width = self.width.unwrap_or(s.width);
        s.bc_trains_heads = self.bc_trains_heads.unwrap_or(s.bc_trains_heads);
        s.shift = self.shift.unwrap_or(VISION_SHIFT);
        s
    }
}

/// The simulator of the pixel demo: `pick` with both cameras and the arm's own state only.
pub fn sim_config(v: &VisionDemo) -> SimConfig {
    let mut c = SimConfig::for_task(TaskKind::Pick);
    c.cameras.enabled = true;
    (c.cameras.width, c.cameras.height) = v.camera_size;
    c.state = StateView::Arm;
    c
}

/// The robot judged by the classifier (inline: the verdict on the frame in hand).
pub fn judged(env: SimEnv, v: &VisionDemo) -> Result<ClassifiedReward<SimEnv>> {
    reflex_agent::actor::judged_by(
        env,
        &v.classifier,
        v.threshold,
        v.consecutive_frames,
        true,
        0,
        &Default::default(),
    )
}

/// The encoder's maps for the loop (inline), the learner's heads, and what each step's maps
/// say of themselves.
pub struct Seeing {
    /// The loop's features: the state then every camera's maps.
    pub features: LoopFeatures,
    /// `[learner.vision]` resolved: the heads the learner trains.
    pub heads: reflex_learn::sac::VisionHeads,
    /// Encoder identity and map shapes, with empty maps the steps fill.
    pub header: StepFeatures,
}

/// Opens the encoder and resolves the learner's heads on it.
pub fn seeing(v: &VisionDemo, spec: &RobotSpec) -> Result<Seeing> {
    let enc = FeatureEncoder::load(&v.encoder, &Default::default())?;
    let (features, header) = reflex_agent::actor::loop_features(enc, spec, true, 0)?;
    Ok(Seeing {
        features,
        heads: HeadKeys::default().section(v).heads()?,
        header: header.empty_features(),
    })
}

/// The pixel demo's per-step work beside the state demo's: the base policy's action on the
/// frames a person acted on, the maps each step carries, and the person's verdict on the
/// classifier's successes.
pub struct VisionRig {
    /// What each step's maps say of themselves, reused for every step.
    pub header: StepFeatures,
    /// The classifier's successes the person saw were false and marked as failures.
    pub vetoed: u64,
    /// The classifier's successes the scene confirmed.
    pub confirmed: u64,
    /// Reward the vetoes took away since the episode's row was last written.
    removed: f32,
}

/// A copy of the base policy that labels the person's steps with what the base would have done
/// (ResFiT's relabelling), on the observation the person acted in, camera frames included: the
/// learner's own relabeller reads the state alone, so a base that reads images is relabelled here.
pub struct PersonRelabel {
    relabel: OnnxPolicy,
    chunk: Vec<f32>,
    /// The base action of the state the person just acted in.
    pub base: Option<Vec<f32>>,
}

impl PersonRelabel {
    /// The relabeller around `relabel`, a copy of the base.
    pub fn new(relabel: OnnxPolicy, act_dim: usize) -> Self {
        let n = relabel.spec().rows() * act_dim;
        PersonRelabel {
            relabel,
            chunk: vec![0.0; n],
            base: None,
        }
    }

    /// Before a step the person drives: what the base policy would have done on `obs` (with the
    /// camera frames the person saw).
    pub fn note_person(&mut self, obs: &Observation, act_dim: usize) -> Result<()> {
        self.relabel.infer_chunk(obs, &mut self.chunk)?;
        let base = self.base.get_or_insert_with(|| vec![0.0; act_dim]);
        base.copy_from_slice(&self.chunk[..act_dim]);
        Ok(())
    }
}

impl VisionRig {
    /// The per-step work for the maps `header` describes.
    pub fn new(header: StepFeatures) -> Self {
        VisionRig {
            header,
            vetoed: 0,
            removed: 0.0,
            confirmed: 0,
        }
    }

    /// The person's verdict on a step that ends an episode: a classifier's success the scene
    /// did not show is marked a failure (reward 0, label false, still the episode's end). The
    /// episode is cut short there, not ended by the task: the scene the classifier took for a
    /// success is nearly always a step or two from one, so its value is bootstrapped from the
    /// next state rather than fixed at zero (the same frames end real successes, and a zero
    /// there would teach the critic that the moment before a lift is worthless).
    pub fn judge_end(&mut self, tr: &mut Transition, scene_success: Option<bool>) {
        if !(tr.ends_episode() && tr.success && tr.label.is_none()) {
            return;
        }
        if scene_success == Some(false) {
            self.removed += tr.reward;
            tr.reward = 0.0;
            tr.success = false;
            tr.label = Some(false);
            tr.terminated = false;
            tr.truncated = true;
            self.vetoed += 1;
        } else {
            self.confirmed += 1;
        }
    }

    /// The reward the person's vetoes took from the episode that just ended (the loop's return
    /// still holds it; the learner got 0), and nothing for the next one.
    pub fn take_removed_reward(&mut self) -> f32 {
        std::mem::take(&mut self.removed)
    }

    /// The step's maps into `step` (the learner's rows are state then maps).
    pub fn maps_into(&mut self, tr: &Transition, step: &mut reflex_contracts::msg::WireStep) {
        let f = step.features.get_or_insert_with(|| self.header.clone());
        f.obs.clone_from(&tr.features);
        f.next_obs.clone_from(&tr.next_features);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A classifier's success at the end of an episode.
    fn classifier_end() -> Transition {
        Transition {
            reward: 1.0,
            terminated: true,
            success: true,
            ..Transition::with_dims(1, 1)
        }
    }

    #[test]
    fn a_vetoed_success_is_a_failure_cut_short_and_a_confirmed_one_stays_terminal() {
        let mut rig = VisionRig::new(StepFeatures::default());
        let mut t = classifier_end();
        rig.judge_end(&mut t, Some(false));
        assert_eq!((t.reward, t.success, t.label), (0.0, false, Some(false)));
        // Still the episode's last step, but bootstrapped: not the task's end.
        assert!(t.ends_episode() && !t.terminated && t.truncated);
        assert_eq!((rig.vetoed, rig.confirmed), (1, 0));
        // The episode's row gets the reward the veto took away, once.
        assert_eq!(rig.take_removed_reward(), 1.0);
        assert_eq!(rig.take_removed_reward(), 0.0);

        let mut t = classifier_end();
        rig.judge_end(&mut t, Some(true));
        assert_eq!((t.reward, t.success, t.label), (1.0, true, None));
        assert!(t.terminated && !t.truncated);
        assert_eq!((rig.vetoed, rig.confirmed), (1, 1));
        assert_eq!(rig.take_removed_reward(), 0.0);

        // A step that ends nothing is left alone.
        let mut t = Transition::with_dims(1, 1);
        rig.judge_end(&mut t, Some(false));
        assert!(!t.ends_episode() && t.reward == 0.0);
        assert_eq!((rig.vetoed, rig.confirmed), (1, 1));
    }
}
