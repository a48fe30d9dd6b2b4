//! From the actor's steps to the learner's transitions: normalised actions, the base action of
//! the next state (for residual targets), a person's steps relabelled with what the base policy
//! would have done, RLIF's takeover penalty, and HIL-SERL's routing to the two buffers. Shared by
//! `reflex demo` (one process) and `reflex learn` (the learner on the bus).

use reflex_contracts::msg::{Observation, WireStep};
use reflex_learn::sac::hook::ActionNorm;
use reflex_learn::sac::replay::Transition as LTransition;
use reflex_learn::sac::{Mode, Sac};
use reflex_policies::onnx_policy::OnnxPolicy;

/// Turns streams of steps into stored transitions: one stream per actor (a fleet's learner
/// takes several at once, as does `reflex demo --robots N`), each with its own held step and
/// episode, stored as its steps arrive into the replay buffers' stream of the same number (whose
/// rows link each episode's steps, so n-step returns hold while actors interleave).
pub struct Assembler {
    mode: Mode,
    norm: ActionNorm,
    relabel: Option<OnnxPolicy>,
    rlif: bool,
    streams: std::collections::HashMap<u64, Stream>,
    chunk: Vec<f32>,
    act_dim: usize,
    /// Transitions pushed into the buffers.
    pub stored: u64,
    /// Episodes whose last step carried no end (an e-stop raised between a lockstep robot's
    /// steps, an actor that died mid-episode): their last step was stored as a truncation.
    pub unterminated: u64,
    /// The episodes stored, by what ended them.
    pub ends: EpisodeEnds,
}

/// The episodes a learner stored, by what ended them: where a person's keys went, as the
/// learner stored them (HIL-SERL's success key as the episode's end with reward 1; the failure
/// key and a reset as cut short).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct EpisodeEnds {
    /// The task's own end (the robot's reward said done).
    pub task: u64,
    /// A person's success label: the last step stored as the end, with reward 1.
    pub person_success: u64,
    /// A person's failure label: the last step stored as cut short.
    pub person_failure: u64,
    /// A person's reset request: the last step stored as cut short.
    pub person_reset: u64,
    /// Cut short otherwise: the time limit, an e-stop, or an episode that ended without saying
    /// so (counted in [`Assembler::unterminated`] as well).
    pub cut_short: u64,
}

impl EpisodeEnds {
    fn count(&mut self, s: &WireStep) {
        let n = match (s.label, s.reset, s.terminated) {
            (Some(true), ..) => &mut self.person_success,
            (Some(false), ..) => &mut self.person_failure,
            (None, true, _) => &mut self.person_reset,
            (None, false, true) => &mut self.task,
            (None, false, false) => &mut self.cut_short,
        };
        *n += 1;
    }
}

/// One actor's steps not stored yet.
#[derive(Default)]
struct Stream {
    held: Vec<LTransition>,
    episode: u64,
    prev_teleop: bool,
}

impl Assembler {
    /// `relabel`: a copy of the base policy (residual mode), to label a person's steps with what
    /// the base would have done on the same observation (ResFiT).
    pub fn new(
        mode: Mode,
        norm: ActionNorm,
        relabel: Option<OnnxPolicy>,
        rlif: bool,
        act_dim: usize,
    ) -> Self {
        Assembler {
            mode,
            norm,
            relabel,
            rlif,
            streams: Default::default(),
            chunk: Vec::new(),
            act_dim,
            stored: 0,
            unterminated: 0,
            ends: EpisodeEnds::default(),
        }
    }

    /// Forgets what `stream` holds (a new actor's numbering starts afresh), and ends its open
    /// episode in the buffers.
    pub fn reset(&mut self, sac: &mut Sac, stream: u64) {
        self.streams.remove(&stream);
        sac.online.end_stream(stream);
        sac.demo.end_stream(stream);
    }

    /// Steps of `stream` taken but not stored yet: its last step waits for the next (its
    /// `next_base` is that step's base).
    pub fn held(&self, stream: u64) -> u64 {
        self.streams.get(&stream).map_or(0, |s| s.held.len() as u64)
    }

    /// Takes one step of the only stream.
    pub fn push(&mut self, sac: &mut Sac, s: &WireStep) -> crate::error::Result<()> {
        self.push_from(sac, 0, s)
    }

    /// Takes one step of `stream`; stores what it completes.
    pub fn push_from(
        &mut self,
        sac: &mut Sac,
        stream: u64,
        s: &WireStep,
    ) -> crate::error::Result<()> {
        let mut st = self.streams.remove(&stream).unwrap_or_default();
        let r = self.push_into(sac, stream, &mut st, s);
        self.streams.insert(stream, st);
        r
    }

    fn push_into(
        &mut self,
        sac: &mut Sac,
        stream: u64,
        st: &mut Stream,
        s: &WireStep,
    ) -> crate::error::Result<()> {
        let residual = self.mode == Mode::Residual;
        if s.episode != st.episode
            && let Some(p) = st.held.last_mut()
        {
            // The held episode ended without saying so: its last step is stored as cut short,
            // bootstrapping from its own base action rather than the next episode's.
            if residual {
                p.next_base.clone_from(&p.base);
            }
            p.truncated = true;
            self.store_all(sac, stream, &mut st.held);
            self.unterminated += 1;
            self.ends.cut_short += 1;
            st.prev_teleop = false;
        }
        st.episode = s.episode;
        let person = s.teleop;
        let mut base_n = s.base.clone();
        if person
            && residual
            && let Some(p) = &mut self.relabel
        {
            let o = Observation {
                state: s.obs.clone(),
                step: s.step,
                ..Default::default()
            };
            self.chunk.resize(p.spec().rows() * self.act_dim, 0.0);
            p.infer_chunk(&o, &mut self.chunk)?;
            base_n.copy_from_slice(&self.chunk[..self.act_dim]);
        }
        self.norm.to_norm(&mut base_n);
        let mut act_n = s.action.clone();
        self.norm.to_norm(&mut act_n);
        for v in act_n.iter_mut() {
            *v = v.clamp(-1.0, 1.0);
        }
        // RLIF: the policy step right before a takeover gets -1.
        let takeover = person && !st.prev_teleop;
        st.prev_teleop = person;
        if self.rlif
            && takeover
            && let Some(p) = st.held.last_mut()
        {
            p.reward -= 1.0;
        }
        // Learning from pixels, a row is the state and then the encoder's maps (the link checked
        // them against the learner's heads).
        let row = |state: &[f32], maps: Option<&Vec<f32>>| -> Vec<f32> {
            let mut r = state.to_vec();
            r.extend(maps.into_iter().flatten());
            r
        };
        let f = s.features.as_ref();
        let t = LTransition {
            obs: row(&s.obs, f.map(|f| &f.obs)),
            base: if residual { base_n.clone() } else { vec![] },
            action: act_n,
            reward: step_reward(s),
            next_obs: row(&s.next_obs, f.map(|f| &f.next_obs)),
            next_base: if residual { base_n } else { vec![] },
            terminated: s.terminated || s.label == Some(true),
            // An end nobody called the task's (a person's failure key or reset, an e-stop) is
            // stored as cut short: unflagged, the buffer would link the next episode's first row
            // to it and n-step returns would walk across the reset.
            truncated: s.truncated
                || (s.ends_episode() && !(s.terminated || s.label == Some(true))),
            intervention: person,
        };
        if residual && let Some(p) = st.held.last_mut() {
            p.next_base.copy_from_slice(&t.base);
        }
        self.store_all(sac, stream, &mut st.held);
        st.held.push(t);
        if s.ends_episode() {
            self.store_all(sac, stream, &mut st.held);
            self.ends.count(s);
            st.prev_teleop = false;
        }
        Ok(())
    }

    fn store_all(&mut self, sac: &mut Sac, stream: u64, held: &mut Vec<LTransition>) {
        for t in held.drain(..) {
            reflex_learn::sac::hil::route_from(sac, stream, &t);
            self.stored += 1;
        }
    }
}

/// Diffusion steering (`noise` mode): one learner transition per chunk the policy started. Its
/// action is the noise the sampler started from, its reward the sum over the chunk's steps, its
/// next observation the one the next chunk starts from. A person's steps carry no noise, so they
/// are not learner transitions in this mode: a takeover closes the open chunk (with RLIF's -1 when
/// asked), and the policy's next chunk after the hand-back opens a new one.
#[derive(Default)]
pub struct ChunkAssembler {
    rlif: bool,
    open: Option<LTransition>,
    /// Chunk transitions pushed into the buffer.
    pub stored: u64,
}

impl ChunkAssembler {
    /// With `rlif`, the chunk a person takes over from gets -1.
    pub fn new(rlif: bool) -> Self {
        ChunkAssembler {
            rlif,
            ..Default::default()
        }
    }

    /// Takes one step; `noise` is the chunk's noise when the policy inferred a chunk at this step.
    pub fn push(&mut self, sac: &mut Sac, s: &WireStep, noise: Option<&[f32]>) {
        if s.teleop {
            if let Some(mut t) = self.open.take() {
                t.next_obs.clone_from(&s.obs);
                if self.rlif {
                    t.reward -= 1.0;
                }
                self.store(sac, &t);
            }
            return;
        }
        if let Some(w) = noise {
            if let Some(mut t) = self.open.take() {
                t.next_obs.clone_from(&s.obs);
                self.store(sac, &t);
            }
            self.open = Some(LTransition {
                obs: s.obs.clone(),
                base: vec![],
                action: w.to_vec(),
                reward: 0.0,
                next_obs: vec![],
                next_base: vec![],
                terminated: false,
                truncated: false,
                intervention: false,
            });
        }
        if let Some(t) = &mut self.open {
            t.reward += step_reward(s);
            if s.ends_episode() {
                t.next_obs.clone_from(&s.next_obs);
                t.terminated = s.terminated || s.label == Some(true);
                t.truncated = !t.terminated;
                let t = self.open.take().expect("open");
                self.store(sac, &t);
            }
        }
    }

    fn store(&mut self, sac: &mut Sac, t: &LTransition) {
        reflex_learn::sac::hil::route(sac, t);
        self.stored += 1;
    }
}

/// A step's reward for the learner: the robot's, or 1 where a person labelled the step a success.
/// The success key is the reward when nothing on the robot checks the task (HIL-SERL's operator
/// marks success the same way); the robot's own reward at that step is often still 0 (a real arm
/// with no task check, or a classifier a frame behind), and a success stored as a terminal zero
/// would teach the critic that finishing the task is worth nothing.
fn step_reward(s: &WireStep) -> f32 {
    if s.label == Some(true) {
        s.reward.max(1.0)
    } else {
        s.reward
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reflex_learn::sac::SacConfig;

    fn step(i: u32, teleop: bool, reward: f32, terminated: bool) -> WireStep {
        WireStep {
            step: i,
            obs: vec![i as f32, 0.0],
            next_obs: vec![i as f32 + 1.0, 0.0],
            base: vec![0.0; 2],
            action: vec![0.0; 2],
            teleop,
            reward,
            terminated,
            ..Default::default()
        }
    }

    fn noise_sac() -> Sac {
        let cfg = SacConfig {
            mode: Mode::Noise,
            hidden: vec![8],
            ..Default::default()
        };
        Sac::new(cfg, 2, 3).unwrap()
    }

    #[test]
    fn steering_stores_one_transition_per_chunk_with_its_summed_reward() {
        let mut sac = noise_sac();
        let mut asm = ChunkAssembler::new(false);
        let (w0, w1) = ([0.1f32, 0.2, 0.3], [-0.5f32, 0.0, 0.5]);
        for i in 0..12 {
            let noise = match i {
                0 => Some(&w0[..]),
                8 => Some(&w1[..]),
                _ => None,
            };
            let r = if i == 11 { 1.0 } else { 0.0 };
            asm.push(&mut sac, &step(i, false, r, i == 11), noise);
        }
        assert_eq!(asm.stored, 2);
        let (a, b) = (sac.online.get(0), sac.online.get(1));
        assert_eq!((a.obs[0], a.next_obs[0], a.reward), (0.0, 8.0, 0.0));
        assert_eq!(a.action, w0);
        assert!(!a.terminated);
        assert_eq!((b.obs[0], b.next_obs[0], b.reward), (8.0, 12.0, 1.0));
        assert_eq!(b.action, w1);
        assert!(b.terminated && !b.truncated);
    }

    #[test]
    fn a_learner_that_sees_stores_the_state_then_the_encoders_maps_in_each_row() {
        use reflex_contracts::msg::StepFeatures;
        use reflex_learn::sac::VisionHeads;
        use reflex_vision::head::FeatureShape;
        let cfg = SacConfig {
            mode: Mode::Full,
            hidden: vec![8],
            vision: Some(VisionHeads {
                encoder_id: "e".into(),
                features: vec![FeatureShape {
                    camera: "front".into(),
                    channels: 1,
                    height: 1,
                    width: 3,
                }],
                embeddings: 2,
                width: 4,
                bc_trains_heads: true,
                shift: 0,
            }),
            ..Default::default()
        };
        let mut sac = Sac::new(cfg, 2, 2).unwrap();
        assert_eq!((sac.state_dim, sac.obs_dim), (2, 5));
        let norm = ActionNorm::new(&[-1.0, -1.0], &[1.0, 1.0], &[]);
        let mut asm = Assembler::new(Mode::Full, norm, None, false, 2);
        let mut s = step(0, false, 1.0, true);
        s.features = Some(StepFeatures {
            encoder: "e".into(),
            shapes: vec![[1, 1, 3]],
            obs: vec![0.1, 0.2, 0.3],
            next_obs: vec![0.4, 0.5, 0.6],
        });
        asm.push(&mut sac, &s).unwrap();
        let t = sac.online.get(0);
        assert_eq!(t.obs, [0.0, 0.0, 0.1, 0.2, 0.3]);
        assert_eq!(t.next_obs, [1.0, 0.0, 0.4, 0.5, 0.6]);
    }

    /// A small full-mode learner for 2 state and 2 action values, and its assembler.
    fn full_sac_and_assembler() -> (Sac, Assembler) {
        let cfg = SacConfig {
            mode: Mode::Full,
            hidden: vec![8],
            ..Default::default()
        };
        let norm = ActionNorm::new(&[-1.0, -1.0], &[1.0, 1.0], &[]);
        (
            Sac::new(cfg, 2, 2).unwrap(),
            Assembler::new(Mode::Full, norm, None, false, 2),
        )
    }

    #[test]
    fn two_actors_interleaved_keep_their_own_held_steps_and_each_episode_links_its_own_rows() {
        let (mut sac, mut asm) = full_sac_and_assembler();
        // Actor 7's steps carry obs[1] = 7, actor 9's obs[1] = 9; each episode is 3 steps, with
        // reward 1 at every step of actor 9 and 0 at actor 7's.
        for i in 0..3u32 {
            for actor in [7u64, 9] {
                let mut s = step(i, false, (actor == 9) as u8 as f32, i == 2);
                s.obs[1] = actor as f32;
                asm.push_from(&mut sac, actor, &s).unwrap();
                // Each step waits only for its successor's base action.
                assert_eq!(asm.held(actor), if i == 2 { 0 } else { 1 });
            }
        }
        assert_eq!(asm.stored, 6);
        let tag: Vec<f32> = (0..6).map(|k| sac.online.get(k).obs[1]).collect();
        // Stored as they came: a step when its successor arrives, an episode's last two together.
        assert_eq!(tag, [7.0, 9.0, 7.0, 7.0, 9.0, 9.0]);
        // The 3-step return of actor 9's first step walks its own rows only.
        let ns = reflex_learn::sac::replay::NStep {
            n: 3,
            gamma: 1.0,
            bootstrap_truncation: true,
        };
        assert_eq!(sac.online.nstep(1, &ns).0, 3.0);
        assert_eq!(sac.online.nstep(0, &ns).0, 0.0);
        // A new actor under a used number starts a new episode.
        asm.reset(&mut sac, 9);
        assert_eq!(asm.held(9), 0);
    }

    #[test]
    fn an_episode_that_ended_without_saying_so_is_stored_as_cut_short_not_joined_to_the_next() {
        let (mut sac, mut asm) = full_sac_and_assembler();
        // Episode 1's last step carries no end (an e-stop between two lockstep steps); episode 2
        // follows.
        for (episode, i) in [(1, 0), (1, 1), (2, 0), (2, 1)] {
            let mut s = step(i, false, 0.0, false);
            s.episode = episode;
            s.obs[1] = episode as f32;
            asm.push(&mut sac, &s).unwrap();
        }
        assert_eq!(asm.unterminated, 1);
        // Stored: episode 1's two steps (the second as a truncation), episode 2's first.
        assert_eq!(asm.stored, 3);
        let t = sac.online.get(1);
        assert_eq!((t.obs[0], t.obs[1]), (1.0, 1.0));
        assert!(t.truncated && !t.terminated);
        // An end flagged by an e-stop closes the episode at once.
        let mut s = step(2, false, 0.0, false);
        s.episode = 2;
        s.estop = true;
        asm.push(&mut sac, &s).unwrap();
        assert_eq!(asm.stored, 5);
        assert_eq!(asm.held(0), 0);
    }

    #[test]
    fn a_persons_success_label_is_a_terminal_reward_of_one_and_a_failure_label_adds_nothing() {
        let (mut sac, mut asm) = full_sac_and_assembler();
        // Episode 1 ends on a person's success key, the robot's own reward still 0; episode 2
        // on their failure key.
        for (episode, label) in [(1, Some(true)), (2, Some(false))] {
            let mut a = step(0, false, 0.0, false);
            a.episode = episode;
            asm.push(&mut sac, &a).unwrap();
            let mut b = step(1, false, 0.0, false);
            b.episode = episode;
            b.label = label;
            asm.push(&mut sac, &b).unwrap();
        }
        for i in 0..2 {
            let mut next = step(i, false, 0.0, false);
            next.episode = 3;
            asm.push(&mut sac, &next).unwrap();
        }
        assert_eq!(asm.stored, 5);
        assert_eq!(
            asm.ends,
            EpisodeEnds {
                person_success: 1,
                person_failure: 1,
                ..Default::default()
            },
            "episode 3 is still open"
        );
        let (win, lose) = (sac.online.get(1), sac.online.get(3));
        assert_eq!(win.reward, 1.0);
        assert!(win.terminated);
        assert_eq!(lose.reward, 0.0);
        // The failure key cuts the episode short: the 3-step walk from episode 2's first row
        // stops at its last row instead of going on into episode 3's.
        assert!(!lose.terminated && lose.truncated);
        let ns = reflex_learn::sac::replay::NStep {
            n: 3,
            gamma: 1.0,
            bootstrap_truncation: true,
        };
        assert_eq!(sac.online.nstep(2, &ns).2, 3);
    }

    #[test]
    fn a_takeover_closes_the_open_chunk_with_rlifs_penalty() {
        for rlif in [false, true] {
            let mut sac = noise_sac();
            let mut asm = ChunkAssembler::new(rlif);
            let w = [0.0f32; 3];
            asm.push(&mut sac, &step(0, false, 0.0, false), Some(&w));
            asm.push(&mut sac, &step(1, false, 0.0, false), None);
            // The person drives steps 2..5: no learner transitions of their own in this mode.
            for i in 2..5 {
                asm.push(&mut sac, &step(i, true, 0.0, false), None);
            }
            assert_eq!(asm.stored, 1);
            let t = sac.online.get(0);
            assert_eq!((t.obs[0], t.next_obs[0]), (0.0, 2.0));
            assert_eq!(t.reward, if rlif { -1.0 } else { 0.0 });
            assert!(!t.terminated && !t.truncated);
            // After the hand-back the policy's next chunk opens a new transition.
            asm.push(&mut sac, &step(5, false, 0.0, false), Some(&w));
            asm.push(&mut sac, &step(6, false, 1.0, true), None);
            assert_eq!(asm.stored, 2);
            assert_eq!(sac.online.get(1).reward, 1.0);
        }
    }
}
