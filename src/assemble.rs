//! From the actor's steps to the learner's transitions: normalised actions, the base action of
//! the next state (for residual targets), a person's steps relabelled with what the base policy
//! would have done, RLIF's takeover penalty, and HIL-SERL's routing to the two buffers. Shared by
//! `reflex demo` (one process) and `reflex learn` (the learner on the bus).

use reflex_policies::onnx_policy::OnnxPolicy;
use reflex_policies::sac::hook::ActionNorm;
use reflex_policies::sac::replay::Transition as LTransition;
use reflex_policies::sac::{Mode, Sac};
use reflex_runtime::msg::{Observation, WireStep};

/// Turns a stream of steps into stored transitions.
pub struct Assembler {
    mode: Mode,
    norm: ActionNorm,
    relabel: Option<OnnxPolicy>,
    rlif: bool,
    pending: Option<LTransition>,
    prev_teleop: bool,
    chunk: Vec<f32>,
    act_dim: usize,
    /// Transitions pushed into the buffers.
    pub stored: u64,
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
            pending: None,
            prev_teleop: false,
            chunk: Vec::new(),
            act_dim,
            stored: 0,
        }
    }

    /// Forgets the held step (a new actor's numbering starts afresh).
    pub fn reset(&mut self) {
        self.pending = None;
        self.prev_teleop = false;
    }

    /// The last step is held until the next one arrives (its `next_base` is that step's base);
    /// `true` when a step is held.
    pub fn holds_one(&self) -> bool {
        self.pending.is_some()
    }

    /// Takes one step; stores the one before it (and this one if it ends the episode).
    pub fn push(&mut self, sac: &mut Sac, s: &WireStep) -> anyhow::Result<()> {
        let person = s.teleop;
        let residual = self.mode == Mode::Residual;
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
            self.chunk.resize(p.spec().chunk_len * self.act_dim, 0.0);
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
        let takeover = person && !self.prev_teleop;
        self.prev_teleop = person;
        if self.rlif
            && takeover
            && let Some(p) = &mut self.pending
        {
            p.reward -= 1.0;
        }
        let t = LTransition {
            obs: s.obs.clone(),
            base: if residual { base_n.clone() } else { vec![] },
            action: act_n,
            reward: s.reward,
            next_obs: s.next_obs.clone(),
            next_base: if residual { base_n } else { vec![] },
            terminated: s.terminated || s.label == Some(true),
            truncated: s.truncated,
            intervention: person,
        };
        if let Some(mut p) = self.pending.take() {
            if residual {
                p.next_base.copy_from_slice(&t.base);
            }
            self.store(sac, &p);
        }
        if s.ends_episode() {
            self.store(sac, &t);
            self.prev_teleop = false;
        } else {
            self.pending = Some(t);
        }
        Ok(())
    }

    fn store(&mut self, sac: &mut Sac, t: &LTransition) {
        reflex_policies::sac::hil::route(sac, t);
        self.stored += 1;
    }
}
