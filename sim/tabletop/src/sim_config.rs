//! Simulator configuration (`[sim]` in a reflex config file).

use crate::task::TaskKind;
use reflex_contracts::config::{Invalid, Validate, in_range, key};
use reflex_contracts::msg::ActionKind;
use serde::Deserialize;

/// Servo model parameters (config `[sim.servo]`).
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServoParams {
    /// Position gain of the arm joints, N m / rad.
    pub stiffness: f32,
    /// Velocity gain of the arm joints, N m s / rad.
    pub damping: f32,
    /// Reflected rotor inertia of each arm joint, kg m^2.
    pub armature: f32,
    /// Position gain of the fingers, N / m.
    pub finger_stiffness: f32,
    /// Velocity gain of the fingers, N s / m.
    pub finger_damping: f32,
}

impl Default for ServoParams {
    fn default() -> Self {
        // The STS3215 has a 1:345 gearbox; its rotor inertia reflected through it is of the order
        // of 0.01 kg m^2. Gains give a ~10 Hz closed-loop bandwidth on the heaviest joint.
        ServoParams {
            stiffness: 60.0,
            damping: 1.5,
            armature: 0.01,
            finger_stiffness: 1000.0,
            finger_damping: 10.0,
        }
    }
}

/// Physics solver parameters (config `[sim.solver]`).
#[derive(Clone, Debug, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SolverParams {
    /// rapier solver iterations (small steps) per physics step.
    pub iterations: usize,
    /// Speculative contact margin, m.
    #[serde(serialize_with = "shortest")]
    pub prediction_distance_m: f32,
    /// Natural frequency of contact springs, Hz (rapier's default is 30).
    #[serde(serialize_with = "shortest")]
    pub contact_hz: f32,
    /// Who integrates the arm's five joints: `rapier` (one rapier multibody with the fingers) or
    /// `reflex` (reflex's own reduced-coordinate dynamics, reflex-arm-dynamics; rapier then moves the
    /// links as kinematic bodies and simulates the fingers and the contacts).
    pub arm: ArmSolver,
    /// With `arm = "reflex"`: arm integration steps per physics step.
    pub arm_substeps: u32,
    /// Gauss-Seidel passes over the constraints in each solver iteration (rapier's
    /// `num_internal_pgs_iterations`). The fingers on impulse joints (`arm = "reflex"`) need 3 at
    /// one iteration to hold a peg through an insertion; the multibody's fingers need 1.
    pub pgs_iterations: usize,
    /// rapier's stabilisation passes per iteration (`num_internal_stabilization_iterations`):
    /// the position-error correction after the velocity passes. 0 leaves penetration to the
    /// contacts' springs alone.
    pub stabilization_iterations: usize,
    /// Start each step's joint solve from the last step's impulses (rapier's
    /// `warmstart_joints`). With the fingers on impulse joints it holds the peg in fewer passes.
    pub warmstart_joints: bool,
    /// rapier's continuous collision detection: fast dynamic bodies are swept between steps and
    /// stopped at their first impact. At 100 Hz or more nothing in the tasks moves far enough
    /// in a step to tunnel (a falling cube travels under 1.5 cm against a 4 cm table).
    pub ccd: bool,
}

/// An `f32` written as its shortest decimal (0.002, not 0.0020000000949949026): read back, it is
/// the same `f32`.
fn shortest<S: serde::Serializer>(v: &f32, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(v.to_string().parse().unwrap_or(*v as f64))
}

impl SolverParams {
    /// rapier's multibody for the arm and fingers with rapier's own settings otherwise (one
    /// Gauss-Seidel pass, a stabilisation pass, CCD, no joint warm start): the simulator's
    /// default until 2026-11-28, at 200 Hz physics ([`SimConfig::with_multibody_arm`]).
    pub fn multibody() -> Self {
        SolverParams {
            arm: ArmSolver::Rapier,
            pgs_iterations: 1,
            stabilization_iterations: 1,
            warmstart_joints: false,
            ccd: true,
            ..Default::default()
        }
    }
}

/// Who integrates the arm (config `[sim.solver] arm`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ArmSolver {
    /// rapier's multibody: the arm and fingers as one reduced-coordinate body.
    Rapier,
    /// reflex's own dynamics of the five joints; fingers and contacts in rapier (the default).
    #[default]
    Reflex,
}

impl Default for SolverParams {
    /// reflex's arm at 100 Hz physics (set in [`SimConfig`]): the arm in two 5 ms steps
    /// per physics step, rapier's one iteration of two warm-started Gauss-Seidel passes for the
    /// fingers, objects and contacts, no stabilisation pass, no CCD (docs/sim.md, "Speed").
    fn default() -> Self {
        SolverParams {
            iterations: 1,
            prediction_distance_m: 0.002,
            contact_hz: 30.0,
            arm: ArmSolver::Reflex,
            arm_substeps: 2,
            pgs_iterations: 2,
            stabilization_iterations: 0,
            warmstart_joints: true,
            ccd: false,
        }
    }
}

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
        if reflex_contracts::keys::Keys::new(&self.robot).is_err() {
            return Err(Invalid {
                key: key(p, "robot"),
                value: format!("\"{}\"", self.robot),
                allowed: "letters, digits, `-` and `_`".into(),
            });
        }
        Ok(())
    }
}
