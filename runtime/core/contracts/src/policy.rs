//! The base-policy contract: an observation in, a chunk of actions out. ONNX Runtime policies,
//! the simulator's scripted experts and anything an integrator writes implement it; the control
//! loop runs it on its own thread or inline (reflex-runtime's `PolicyThread`).

use crate::msg::Observation;

/// The shape of what a policy produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkSpec {
    /// Actions per chunk.
    pub len: usize,
    /// Actions executed before the loop asks for a new chunk (<= `len`).
    pub execute: usize,
    /// Action dimension.
    pub dim: usize,
}

/// Why a policy failed.
#[derive(Debug, thiserror::Error)]
#[error("policy `{policy}`: {message}")]
pub struct PolicyError {
    /// Policy name.
    pub policy: String,
    /// What went wrong.
    pub message: String,
}

/// What the robot is executing while a chunk is computed: the executing chunk's actions at the
/// new chunk's times, for a policy that samples its chunk as an inpainting of it (real-time
/// chunking, arXiv 2506.07339). Robot action units, row-major.
#[derive(Clone, Copy, Debug)]
pub struct ChunkPrefix<'a> {
    /// `len * dim` values; rows at and after `covered` are unspecified.
    pub actions: &'a [f32],
    /// Rows the executing chunk covers, from the new chunk's first.
    pub covered: usize,
    /// Rows the robot will have executed from the executing chunk by the time the new one
    /// arrives (the inference delay in control ticks, estimated from the policy's own timings).
    pub delay: usize,
}

/// A base policy: observation in, action chunk out.
pub trait Policy: Send {
    /// Name for logs and errors.
    fn name(&self) -> &str;
    /// The chunk shape.
    fn chunk_spec(&self) -> ChunkSpec;
    /// Called at each episode start.
    fn reset(&mut self) {}
    /// Writes `len * dim` action values for `obs` into `out`.
    fn infer(&mut self, obs: &Observation, out: &mut [f32]) -> Result<(), PolicyError>;
    /// As [`Policy::infer`], knowing what the robot executes meanwhile. A policy that cannot use
    /// it (the default) ignores it.
    fn infer_with_prefix(
        &mut self,
        obs: &Observation,
        prefix: &ChunkPrefix<'_>,
        out: &mut [f32],
    ) -> Result<(), PolicyError> {
        let _ = prefix;
        self.infer(obs, out)
    }
    /// Whether [`Policy::infer_with_prefix`] uses the prefix (the loop gathers it only then).
    fn wants_prefix(&self) -> bool {
        false
    }
    /// Observations of the control steps before the current one the policy reads (LeRobot's
    /// `n_obs_steps - 1`); the loop keeps them ([`PastObs`]) and hands them over with
    /// [`Policy::observe_past`] before each inference.
    fn past_steps(&self) -> usize {
        0
    }
    /// The [`Policy::past_steps`] observations before the next inference's, oldest first (at an
    /// episode's start, copies of its first observation).
    fn observe_past(&mut self, past: &[Observation]) {
        let _ = past;
    }
}

/// The observations of the last `n` control steps before the current one, oldest first, kept
/// for a policy that reads a history ([`Policy::past_steps`]). An episode's first observation
/// fills every slot (as LeRobot's observation queue starts); a step is added when the robot's
/// step counter moves, so a free-running loop that reads the same observation twice keeps it once.
/// Buffers are reused: after the first steps nothing allocates.
#[derive(Clone, Debug, Default)]
pub struct PastObs {
    frames: Vec<Observation>,
    started: bool,
}

impl PastObs {
    /// Keeps `n` past observations (0: none, and [`PastObs::note`] does nothing).
    pub fn new(n: usize) -> Self {
        PastObs {
            frames: vec![Observation::default(); n],
            started: false,
        }
    }

    /// Notes that `next` replaces `current` as the loop's observation.
    pub fn note(&mut self, current: &Observation, next: &Observation) {
        if self.frames.is_empty() {
            return;
        }
        if !self.started || next.episode != current.episode || next.step == 0 {
            for f in &mut self.frames {
                f.copy_from(next);
            }
            self.started = true;
        } else if next.step != current.step {
            self.frames.rotate_left(1);
            if let Some(last) = self.frames.last_mut() {
                last.copy_from(current);
            }
        }
    }

    /// The past observations, oldest first.
    pub fn frames(&self) -> &[Observation] {
        &self.frames
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(episode: u64, step: u32) -> Observation {
        Observation {
            episode,
            step,
            state: vec![episode as f32 * 100.0 + step as f32],
            ..Default::default()
        }
    }

    fn steps(p: &PastObs) -> Vec<u32> {
        p.frames().iter().map(|o| o.step).collect()
    }

    #[test]
    fn past_observations_are_the_previous_control_steps_and_restart_with_each_episode() {
        let mut p = PastObs::new(2);
        let mut cur = Observation::default();
        let mut take = |p: &mut PastObs, next: Observation| {
            p.note(&cur, &next);
            cur = next;
        };
        take(&mut p, obs(1, 0));
        assert_eq!(steps(&p), [0, 0], "the first observation fills the history");
        take(&mut p, obs(1, 1));
        assert_eq!(steps(&p), [0, 0]);
        take(&mut p, obs(1, 1));
        assert_eq!(steps(&p), [0, 0], "the same step read twice is kept once");
        take(&mut p, obs(1, 2));
        assert_eq!(steps(&p), [0, 1]);
        take(&mut p, obs(1, 3));
        assert_eq!(steps(&p), [1, 2]);
        assert_eq!(p.frames()[1].state, [102.0]);
        take(&mut p, obs(2, 0));
        assert_eq!(steps(&p), [0, 0]);
        assert!(
            p.frames().iter().all(|o| o.episode == 2),
            "a new episode forgets the last"
        );
        let mut none = PastObs::new(0);
        none.note(&obs(1, 0), &obs(1, 1));
        assert!(none.frames().is_empty());
    }
}
