//! Simulator configuration (`[sim]` in a reflex config file).

use crate::task::TaskKind;
use crate::world::{ArmSolver, ServoParams, SolverParams};
use reflex_runtime::config::{Invalid, Validate, in_range, key};
use reflex_runtime::msg::ActionKind;
use serde::Deserialize;

/// Cameras rendered on the CPU.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CameraConfig {
    /// Render images at all (off: state-only observations, much faster).
    pub enabled: bool,
    /// Image width, pixels.
    pub width: u32,
    /// Image height, pixels.
    pub height: u32,
}

impl Default for CameraConfig {
    fn default() -> Self {
        CameraConfig {
            enabled: false,
            width: 128,
            height: 128,
        }
    }
}

/// What the simulated robot reports in its state vector.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StateView {
    /// Everything the task's layout holds: the arm, the object's pose, the target and the vector
    /// to close (what state-only policies learn from).
    #[default]
    All,
    /// Only what a real arm's own sensors give (joint positions and velocities, the tool's pose
    /// from forward kinematics): where the object is must come from the cameras, as on an SO-101.
    Arm,
}

fn default_action() -> ActionKind {
    ActionKind::EeDelta
}
fn default_control_hz() -> f64 {
    20.0
}
/// The slowest solver rate (physics steps per second times solver iterations) the arm's servos and
/// contacts are stable and faithful at, Hz.
pub const MIN_SOLVER_HZ: f64 = 80.0;

/// Physics rate of [`SimConfig::with_multibody_arm`], Hz.
pub const MULTIBODY_PHYSICS_HZ: f64 = 200.0;

fn default_physics_hz() -> f64 {
    100.0
}
fn default_robot() -> String {
    "sim".into()
}
fn default_ee_step() -> f64 {
    0.02
}
fn default_yaw_step() -> f64 {
    0.2
}
fn default_joint_step() -> f64 {
    0.1
}

/// Everything that defines a simulated robot.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimConfig {
    /// Task: reach, push, pick or insert.
    pub task: TaskKind,
    /// Action space: ee_delta (default), ee_delta_yaw, joint_abs or joint_delta.
    #[serde(default = "default_action")]
    pub action: ActionKind,
    /// Control rate, Hz (one action per control step).
    #[serde(default = "default_control_hz")]
    pub control_hz: f64,
    /// Physics rate, Hz; must be a whole multiple of `control_hz`.
    #[serde(default = "default_physics_hz")]
    pub physics_hz: f64,
    /// Time limit in control steps (default: the task's own).
    #[serde(default)]
    pub max_episode_steps: Option<u32>,
    /// Seed of the sequence of episode seeds used when a reset names none.
    #[serde(default)]
    pub seed: u64,
    /// Robot name on the bus.
    #[serde(default = "default_robot")]
    pub robot: String,
    /// Largest end-effector step per control step for ee actions, m.
    #[serde(default = "default_ee_step")]
    pub ee_step_m: f64,
    /// Largest yaw step per control step for ee_delta_yaw, rad.
    #[serde(default = "default_yaw_step")]
    pub yaw_step_rad: f64,
    /// Largest joint step per control step for joint_delta, rad.
    #[serde(default = "default_joint_step")]
    pub joint_step_rad: f64,
    /// Cameras.
    #[serde(default)]
    pub cameras: CameraConfig,
    /// What the state vector holds: `all` (default) or `arm` (proprioception only, for
    /// learning from the cameras).
    #[serde(default)]
    pub state: StateView,
    /// Servo model.
    #[serde(default)]
    pub servo: ServoParams,
    /// Physics solver.
    #[serde(default)]
    pub solver: SolverParams,
}

impl SimConfig {
    /// A config with every default for `task`.
    pub fn for_task(task: TaskKind) -> Self {
        SimConfig {
            task,
            action: default_action(),
            control_hz: default_control_hz(),
            physics_hz: default_physics_hz(),
            max_episode_steps: None,
            seed: 0,
            robot: default_robot(),
            ee_step_m: default_ee_step(),
            yaw_step_rad: default_yaw_step(),
            joint_step_rad: default_joint_step(),
            cameras: CameraConfig::default(),
            state: StateView::All,
            servo: ServoParams::default(),
            solver: SolverParams::default(),
        }
    }

    /// The same robot with the arm and fingers as rapier's multibody, the simulator's default
    /// until 2026-11-28 and what `configs/sim/pick-multibody.toml` ships: 200 Hz physics, one
    /// solver iteration of one Gauss-Seidel pass, rapier's stabilisation and CCD, no joint warm
    /// start. About a third of the default's speed; the reference the reflex arm is checked
    /// against.
    pub fn with_multibody_arm(mut self) -> Self {
        self.physics_hz = MULTIBODY_PHYSICS_HZ;
        self.solver = SolverParams {
            prediction_distance_m: self.solver.prediction_distance_m,
            contact_hz: self.solver.contact_hz,
            ..SolverParams::multibody()
        };
        self
    }

    /// Physics steps per control step.
    pub fn substeps(&self) -> u32 {
        (self.physics_hz / self.control_hz).round() as u32
    }

    /// Time limit in control steps.
    pub fn max_steps(&self) -> u32 {
        self.max_episode_steps
            .unwrap_or_else(|| self.task.default_max_steps())
    }
}

impl Validate for SimConfig {
    fn validate(&self, p: &str) -> Result<(), Invalid> {
        if self.action == ActionKind::Box {
            return Err(Invalid {
                key: key(p, "action"),
                value: "\"box\"".into(),
                allowed: "ee_delta, ee_delta_yaw, joint_abs, joint_delta".into(),
            });
        }
        in_range(p, "control_hz", self.control_hz, 1.0, 100.0)?;
        in_range(p, "physics_hz", self.physics_hz, self.control_hz, 2000.0)?;
        let ratio = self.physics_hz / self.control_hz;
        if (ratio - ratio.round()).abs() > 1e-9 {
            return Err(Invalid {
                key: key(p, "physics_hz"),
                value: self.physics_hz.to_string(),
                allowed: format!("a whole multiple of control_hz = {}", self.control_hz),
            });
        }
        if let Some(m) = self.max_episode_steps {
            in_range(p, "max_episode_steps", m, 1, 100_000)?;
        }
        in_range(p, "ee_step_m", self.ee_step_m, 0.001, 0.1)?;
        in_range(p, "yaw_step_rad", self.yaw_step_rad, 0.01, 1.0)?;
        in_range(p, "joint_step_rad", self.joint_step_rad, 0.001, 1.0)?;
        let c = key(p, "cameras");
        in_range(&c, "width", self.cameras.width, 16, 1024)?;
        in_range(&c, "height", self.cameras.height, 16, 1024)?;
        let s = key(p, "servo");
        in_range(&s, "stiffness", self.servo.stiffness, 0.1, 1000.0)?;
        in_range(&s, "damping", self.servo.damping, 0.0, 100.0)?;
        in_range(&s, "armature", self.servo.armature, 0.0, 1.0)?;
        in_range(
            &s,
            "finger_stiffness",
            self.servo.finger_stiffness,
            1.0,
            10000.0,
        )?;
        in_range(&s, "finger_damping", self.servo.finger_damping, 0.0, 1000.0)?;
        let v = key(p, "solver");
        in_range(&v, "iterations", self.solver.iterations, 1, 32)?;
        in_range(&v, "arm_substeps", self.solver.arm_substeps, 1, 32)?;
        in_range(&v, "pgs_iterations", self.solver.pgs_iterations, 1, 8)?;
        in_range(
            &v,
            "stabilization_iterations",
            self.solver.stabilization_iterations,
            0,
            8,
        )?;
        // rapier integrates the arm once per solver iteration: the servos (about 12 Hz closed-loop
        // on the heaviest joint) and the finger contacts need that step to be 12.5 ms or shorter.
        // Below it the experts start to fail (docs/sim.md, "Speed"). reflex's arm has its own
        // substeps and the same floor; rapier's iterations then only carry the fingers and objects.
        let solver_hz = self.physics_hz * self.solver.iterations as f64;
        let arm_hz = self.physics_hz * self.solver.arm_substeps as f64;
        if self.solver.arm == ArmSolver::Reflex && arm_hz < MIN_SOLVER_HZ {
            return Err(Invalid {
                key: key(&v, "arm_substeps"),
                value: self.solver.arm_substeps.to_string(),
                allowed: format!(
                    "physics_hz x arm_substeps >= {MIN_SOLVER_HZ} (physics_hz = {}: arm_substeps >= {})",
                    self.physics_hz,
                    (MIN_SOLVER_HZ / self.physics_hz).ceil()
                ),
            });
        }
        if solver_hz < MIN_SOLVER_HZ {
            return Err(Invalid {
                key: key(&v, "iterations"),
                value: self.solver.iterations.to_string(),
                allowed: format!(
                    "physics_hz x iterations >= {MIN_SOLVER_HZ} (physics_hz = {}: iterations >= {})",
                    self.physics_hz,
                    (MIN_SOLVER_HZ / self.physics_hz).ceil()
                ),
            });
        }
        in_range(
            &v,
            "prediction_distance_m",
            self.solver.prediction_distance_m,
            0.0001,
            0.05,
        )?;
        in_range(&v, "contact_hz", self.solver.contact_hz, 1.0, 90.0)?;
        if reflex_runtime::keys::Keys::new(&self.robot).is_err() {
            return Err(Invalid {
                key: key(p, "robot"),
                value: format!("\"{}\"", self.robot),
                allowed: "letters, digits, `-` and `_`".into(),
            });
        }
        Ok(())
    }
}
