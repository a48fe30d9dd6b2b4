//! The learner's settings as measured on the demo (docs/training.md explains each choice), and
//! how a config's partial `[learner]` table is laid over them.

use crate::AgentError;
use reflex_contracts::msg::RobotSpec;
use reflex_policies::onnx_policy::OnnxPolicy;

pub use reflex_config::{OverlayError, overlay_sac};
pub use reflex_learn::sac::learner_preset;

/// The learner's state scaling from the base policy's own input normalisation (half widths of
/// at least 0.05, so a component that hardly varied in the demonstrations is not blown up), for
/// the state components the policy reads: all of them, or the fields it names (an image policy
/// reads the arm's joints and tool pose beside its cameras). A component it does not read is
/// scaled by `robot`'s own bounds where they are finite, and left as it is otherwise. A base
/// that normalises its state by mean and standard deviation (LeRobot's ACT and Diffusion Policy)
/// gives no bounds: then every component takes the robot's.
pub fn state_norm(base: &OnnxPolicy, robot: &RobotSpec) -> Option<reflex_learn::sac::ObsNorm> {
    let bounds = base
        .spec()
        .state_bounds(robot)
        .unwrap_or_else(|| vec![None; robot.state_dim()]);
    let own = state_bounds_of(robot);
    let (lo, hi): (Vec<f32>, Vec<f32>) = bounds
        .iter()
        .zip(own)
        .map(|(b, o)| b.or(o).unwrap_or((-1.0, 1.0)))
        .unzip();
    Some(reflex_learn::sac::ObsNorm::from_bounds(&lo, &hi, 0.05))
}

/// Per state component, the robot spec's finite `(low, high)`, where it gives one.
fn state_bounds_of(robot: &RobotSpec) -> Vec<Option<(f32, f32)>> {
    let mut out = Vec::with_capacity(robot.state_dim());
    for f in &robot.state {
        for k in 0..f.size as usize {
            let b = match (&f.low, &f.high) {
                (Some(l), Some(h)) => l
                    .get(k)
                    .zip(h.get(k))
                    .filter(|(l, h)| l.is_finite() && h.is_finite() && h > l)
                    .map(|(l, h)| (*l, *h)),
                _ => None,
            };
            out.push(b);
        }
    }
    out
}

/// The learner's state scaling from the bounds in the robot's spec, for learning without a
/// base policy. Every state value needs finite bounds; otherwise the error names the fields
/// without them and says what to set.
pub fn state_norm_from_spec(
    spec: &reflex_contracts::msg::RobotSpec,
) -> Result<reflex_learn::sac::ObsNorm, AgentError> {
    let (mut lo, mut hi, mut missing) = (vec![], vec![], vec![]);
    for f in &spec.state {
        match (&f.low, &f.high) {
            (Some(l), Some(h)) if l.iter().chain(h).all(|v| v.is_finite()) => {
                lo.extend_from_slice(l);
                hi.extend_from_slice(h);
            }
            _ => missing.push(f.name.clone()),
        }
    }
    if !missing.is_empty() {
        return Err(AgentError::setup(
            format!("robot `{}`", spec.name),
            format!(
                "the learner scales the state by the bounds in the robot's spec when there is no base policy, and state field(s) {} have no finite bounds: give them bounds in the robot's spec (the Gymnasium bridge takes them from the observation space), or set [learner] obs_norm = \"off\" to learn on the raw state",
                missing.join(", ")
            ),
        ));
    }
    Ok(reflex_learn::sac::ObsNorm::from_bounds(&lo, &hi, 1e-3))
}

/// The table `name` of a TOML file (empty when absent).
pub fn read_table(path: &std::path::Path, name: &str) -> crate::error::Result<toml::Table> {
    let text = std::fs::read_to_string(path).map_err(|e| AgentError::io(path, e))?;
    let all: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        AgentError::setup(format!("config `{}`", path.display()), e.to_string())
    })?;
    Ok(match all.get(name) {
        Some(toml::Value::Table(t)) => t.clone(),
        _ => toml::Table::new(),
    })
}
