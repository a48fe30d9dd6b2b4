//! A leader arm as a teleop device: `reflex teleop --device leader --port P`.
//!
//! The person moves the leader (its torque off); the device turns its joints into a command in
//! the follower's action space:
//! - joint targets (`joint_abs`): the leader's joints, reached through a blend: on takeover the
//!   command starts at the follower's measured pose and moves toward the leader by at most
//!   `max_joint_step_rad` per message, so the follower never jumps to a leader held elsewhere;
//! - joint steps (`joint_delta`): leader minus follower, clipped to the action bounds;
//! - end-effector steps (`ee_delta`, SO-101): the leader's tool position by the arm model's
//!   forward kinematics minus the follower's, clipped to the step bound, and the leader's gripper.
//!
//! The follower's pose comes from its observation (the actor's step trace on the bus). Without
//! one, the device commands nothing (zeros for steps, no takeover blend can start).

use crate::arm::{ArmKind, ServoArm};
use nalgebra::Vector3;
use reflex_contracts::msg::{ActionKind, Observation, RobotSpec, TeleopMsg};
use reflex_contracts::teleop::{Teleop, TeleopError};
use reflex_tabletop::ArmModel;
use std::time::Duration;

const BODY: usize = 5;

/// A leader arm on its bus, mapped onto a follower's action space.
pub struct LeaderArm {
    arm: ServoArm,
    name: String,
    spec: RobotSpec,
    model: Option<ArmModel>,
    /// Leader joints (body rad, gripper fraction).
    q: Vec<f64>,
    /// The blended joint command (joint_abs), in the follower's units.
    cmd: Vec<f64>,
    blending_from_follower: bool,
    /// Largest joint command change per second while blending, rad/s.
    max_joint_speed: f64,
    period: f64,
    last_poll: Option<std::time::Instant>,
    was_intervening: bool,
    /// The follower's episode the blend started in.
    episode: Option<u64>,
}

fn err(device: &str, e: impl std::fmt::Display) -> TeleopError {
    TeleopError {
        device: device.into(),
        message: e.to_string(),
    }
}

impl LeaderArm {
    /// Opens the leader `kind` on `port` with `calibration` (LeRobot's file for the leader),
    /// turns its torque off, and maps it onto `spec` (the follower's description).
    /// `max_joint_step_rad` bounds the blend toward the leader per control period of the
    /// follower (`spec.control_hz`), however often the device is polled.
    pub fn open(
        kind: ArmKind,
        port: &str,
        calibration: &reflex_calibration::Calibration,
        spec: &RobotSpec,
        max_joint_step_rad: f64,
    ) -> Result<Self, TeleopError> {
        let name = format!("{} on {port}", kind.name());
        let mut arm = ServoArm::open(kind, port, calibration, Duration::from_millis(20), 2)
            .map_err(|e| err(&name, e))?;
        arm.set_torque(false).map_err(|e| err(&name, e))?;
        let model = spec.kind.starts_with("so101/").then(ArmModel::so101);
        if matches!(
            spec.action.kind,
            ActionKind::EeDelta | ActionKind::EeDeltaYaw
        ) && model.is_none()
        {
            return Err(err(
                &name,
                format!(
                    "the follower `{}` ({}) takes end-effector steps, and reflex has the kinematics of the SO-101 only: give that robot a joint action space",
                    spec.name, spec.kind
                ),
            ));
        }
        if spec.joints.len() != arm.dof() && spec.action.kind != ActionKind::EeDelta {
            return Err(err(
                &name,
                format!(
                    "the follower `{}` has {} joints, the leader {}",
                    spec.name,
                    spec.joints.len(),
                    arm.dof()
                ),
            ));
        }
        let n = arm.dof();
        Ok(LeaderArm {
            arm,
            name,
            spec: spec.clone(),
            model,
            q: vec![0.0; n],
            cmd: vec![0.0; n],
            blending_from_follower: false,
            max_joint_speed: max_joint_step_rad * spec.control_hz,
            period: 1.0 / spec.control_hz,
            last_poll: None,
            was_intervening: false,
            episode: None,
        })
    }

    /// The gripper in the follower's unit: metres of opening on the SO-101 model, else the
    /// fraction of its range.
    fn gripper(&self, fraction: f64) -> f64 {
        self.model
            .as_ref()
            .map_or(fraction, |m| fraction * m.max_opening_m() as f64)
    }

    /// The leader's joints in the follower's units (gripper converted).
    fn target(&self, k: usize) -> f64 {
        if k == BODY {
            self.gripper(self.q[k])
        } else {
            self.q[k]
        }
    }

    /// Fills `m.action` from the leader and the follower's observation.
    fn command(&mut self, obs: Option<&Observation>, m: &mut TeleopMsg, dt: f64) {
        let a = &self.spec.action;
        m.action.resize(a.dim(), 0.0);
        let follower = obs.filter(|o| o.state.len() >= 12).map(|o| &o.state[..]);
        let clip = |i: usize, v: f64| (v as f32).clamp(a.low[i], a.high[i]);
        match a.kind {
            ActionKind::JointAbs => {
                // The blend starts where the follower is: at a takeover, and again at every new
                // episode (the robot's reset may have moved it).
                let episode = obs.map(|o| o.episode);
                let starting = (m.intervene && !self.was_intervening)
                    || (episode.is_some() && episode != self.episode);
                if starting || !self.blending_from_follower {
                    self.blending_from_follower = false;
                    if let Some(s) = follower {
                        for (c, x) in self.cmd.iter_mut().zip(s) {
                            *c = *x as f64;
                        }
                        self.blending_from_follower = true;
                        self.episode = episode;
                    }
                }
                if !self.blending_from_follower {
                    // Not before the follower's pose is known: a command from nowhere could jump.
                    m.intervene = false;
                }
                if !m.intervene {
                    self.blending_from_follower = false;
                }
                for k in 0..self.cmd.len().min(m.action.len()) {
                    let t = self.target(k);
                    let step = self.max_joint_speed * dt;
                    let lim = if k == BODY {
                        self.gripper(step / std::f64::consts::PI)
                    } else {
                        step
                    };
                    self.cmd[k] += (t - self.cmd[k]).clamp(-lim, lim);
                    m.action[k] = clip(k, self.cmd[k]);
                }
            }
            ActionKind::JointDelta => {
                for k in 0..m.action.len().min(self.q.len()) {
                    m.action[k] = match follower {
                        Some(s) => clip(k, self.target(k) - s[k] as f64),
                        None => 0.0,
                    };
                }
            }
            ActionKind::EeDelta | ActionKind::EeDeltaYaw => {
                let (Some(model), Some(s)) = (&self.model, follower) else {
                    m.action.fill(0.0);
                    return;
                };
                if s.len() < 15 {
                    m.action.fill(0.0);
                    return;
                }
                let p = model.chain.fk(&self.q[..BODY]).translation.vector;
                // The follower's tool position: state fields joint_pos(6), joint_vel(6), ee_pos.
                let f = Vector3::new(s[12] as f64, s[13] as f64, s[14] as f64);
                let d = p - f;
                for i in 0..3 {
                    m.action[i] = clip(i, d[i]);
                }
                let last = m.action.len() - 1;
                if a.kind == ActionKind::EeDeltaYaw {
                    m.action[3] = 0.0;
                }
                m.action[last] = clip(last, self.gripper(self.q[BODY]));
            }
            ActionKind::Box => m.action.fill(0.0),
        }
        self.was_intervening = m.intervene;
    }
}

impl LeaderArm {
    /// `so101-leader on /dev/ttyACM1`.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Teleop for LeaderArm {
    fn name(&self) -> &str {
        &self.name
    }

    /// Reads the leader and writes the command; `m.intervene` and the buttons are left to
    /// whoever owns them (the keyboard, or `--intervene`).
    fn poll(&mut self, obs: Option<&Observation>, m: &mut TeleopMsg) -> Result<bool, TeleopError> {
        self.arm.read(&mut self.q).map_err(|e| err(&self.name, e))?;
        // The blend advances with time, not with polls: one period's step per period.
        let now = std::time::Instant::now();
        let dt = self
            .last_poll
            .replace(now)
            .map_or(self.period, |t| (now - t).as_secs_f64().min(self.period));
        self.command(obs, m, dt);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emulate::{Emulator, EmulatorConfig};

    #[test]
    fn a_leader_on_an_emulated_bus_reads_and_maps_onto_joint_targets() {
        let emu = Emulator::start(EmulatorConfig::default()).unwrap();
        let mut spec = RobotSpec::new("f", "koch/joints", 50.0);
        spec.joints = (0..6).map(|k| format!("j{k}")).collect();
        spec.action = reflex_contracts::msg::ActionSpec {
            kind: ActionKind::JointAbs,
            names: spec.joints.clone(),
            low: vec![-3.0; 6],
            high: vec![3.0; 6],
        };
        let cal = ArmKind::So101Leader.default_calibration();
        let mut l = LeaderArm::open(ArmKind::So101Leader, emu.path(), &cal, &spec, 0.05).unwrap();
        let mut m = TeleopMsg {
            intervene: true,
            ..Default::default()
        };
        // The follower 0.3 rad away from the leader (at zero) on its first joint.
        let mut obs = Observation {
            state: vec![0.0; 12],
            ..Default::default()
        };
        obs.state[0] = 0.3;
        l.poll(Some(&obs), &mut m).unwrap();
        assert!((m.action[0] - 0.25).abs() < 1e-3, "{:?}", m.action);
        for _ in 0..10 {
            std::thread::sleep(Duration::from_millis(20));
            l.poll(Some(&obs), &mut m).unwrap();
        }
        assert!(
            m.action[0].abs() < 2e-3,
            "converged to the leader: {:?}",
            m.action
        );
    }
}
