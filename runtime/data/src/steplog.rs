//! Every step of a run in reflex's episode format (`<run>/steps/`, docs/sim.md), with who acted,
//! the base action and the residual: what `reflex dataset export --run` turns into a LeRobot
//! dataset. Written by the demo and, with `--record`, by `reflex run` (on the outbox's thread, off
//! the loop). Each episode is written whole and atomically when it ends.

use crate::Result;
use crate::demos::{DemoWriter, Episode};
use reflex_contracts::msg::RobotSpec;
use reflex_runtime::outbox::Transition;
use std::path::Path;

/// The episodes of a run as they end.
pub struct StepLog {
    writer: DemoWriter,
    ep: Episode,
}

impl StepLog {
    /// A log in `dir` for episodes of `spec`, made by `command`.
    pub fn create(dir: &Path, spec: &RobotSpec, command: &str) -> Result<Self> {
        Ok(StepLog {
            writer: DemoWriter::create(dir, spec, command)?,
            ep: Episode::default(),
        })
    }

    /// Adds a step; `person` when a person drove it, `seed` the episode's reset seed when known.
    /// The episode is written when the step ends it.
    pub fn push(&mut self, tr: &Transition, person: bool, seed: Option<u64>) -> Result<()> {
        let ep = &mut self.ep;
        if ep.actions.is_empty() {
            ep.observations.push(tr.obs.clone());
        }
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
            ep.success = tr.success || tr.label == Some(true);
            ep.terminated = tr.terminated;
            ep.truncated = tr.truncated;
            ep.seed = seed.unwrap_or(0);
            self.writer.write(ep)?;
            *ep = Episode::default();
        }
        Ok(())
    }
}
