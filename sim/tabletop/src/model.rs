//! The SO-101 arm as its URDF describes it: joints, limits, the kinematic chain to the tool.

use reflex_kinematics::Chain;

/// The arm's URDF, shipped in the crate.
pub const ARM_URDF: &str = include_str!("../../assets/so101.urdf");
/// Arm joints in command order.
pub const ARM_JOINTS: [&str; 5] = [
    "shoulder_pan",
    "shoulder_lift",
    "elbow_flex",
    "wrist_flex",
    "wrist_roll",
];
/// The two gripper fingers (prismatic, each 0..=`finger_max_m`).
pub const FINGER_JOINTS: [&str; 2] = ["finger_left", "finger_right"];
/// Number of commanded actuators: five arm joints and the gripper opening.
pub const NUM_ACTUATORS: usize = 6;

/// The arm's kinematic model and actuator limits, read from the URDF once.
#[derive(Clone, Debug)]
pub struct ArmModel {
    /// Parsed URDF.
    pub urdf: urdf_rs::Robot,
    /// Chain from `base` to the tool centre point `tcp`, with the URDF's limits.
    pub chain: Chain,
    /// The same chain with the elbow kept 10 degrees short of straight, so that damped
    /// least-squares IK never crosses the stretched-out singularity onto the elbow-down branch.
    pub ik_chain: Chain,
    /// Position limits of the five arm joints, rad.
    pub limits: [(f64, f64); 5],
    /// Effort limits of the five arm joints, N m.
    pub efforts: [f32; 5],
    /// Speed limits of the five arm joints, rad/s.
    pub speeds: [f32; 5],
    /// Travel of one finger, m (the opening is twice this).
    pub finger_max_m: f32,
    /// Finger force limit, N.
    pub finger_effort: f32,
    /// Finger speed limit, m/s.
    pub finger_speed: f32,
}

impl ArmModel {
    /// Parses the shipped URDF.
    pub fn so101() -> Self {
        let urdf = urdf_rs::read_from_string(ARM_URDF).expect("the shipped URDF parses");
        let chain = Chain::from_urdf(&urdf, "sim/assets/so101.urdf", "base", "tcp")
            .expect("the shipped URDF has a base->tcp chain");
        let joint = |name: &str| {
            urdf.joints
                .iter()
                .find(|j| j.name == name)
                .expect("joint in shipped URDF")
        };
        let mut limits = [(0.0, 0.0); 5];
        let mut efforts = [0.0; 5];
        let mut speeds = [0.0; 5];
        for (i, name) in ARM_JOINTS.iter().enumerate() {
            let j = joint(name);
            limits[i] = (j.limit.lower, j.limit.upper);
            efforts[i] = j.limit.effort as f32;
            speeds[i] = j.limit.velocity as f32;
        }
        let f = joint(FINGER_JOINTS[0]);
        let mut ik_chain = chain.clone();
        // Elbow zero is the right-angle "L" pose. The upper arm's link is tilted 13.9 degrees
        // forward by its 28 mm offset, so the arm is straight at -(pi/2 - 0.2428) = -1.328 rad.
        let straight = -(std::f64::consts::FRAC_PI_2 - (0.028f64).atan2(0.113));
        ik_chain.set_limits(2, straight + 0.17, limits[2].1);
        ArmModel {
            ik_chain,
            chain,
            limits,
            efforts,
            speeds,
            finger_max_m: f.limit.upper as f32,
            finger_effort: f.limit.effort as f32,
            finger_speed: f.limit.velocity as f32,
            urdf,
        }
    }

    /// Largest gripper opening (distance between the finger pads), m.
    pub fn max_opening_m(&self) -> f32 {
        2.0 * self.finger_max_m
    }
}
