//! Kinematics of a serial chain read from a URDF: forward kinematics, the geometric Jacobian and
//! damped-least-squares (DLS) inverse kinematics.
//!
//! One implementation serves the simulator (end-effector action spaces, scripted experts), the
//! safety layer (workspace box on the commanded pose) and the hardware drivers, so that a joint
//! vector means the same pose everywhere. Angles in rad, lengths in m, poses as `T_base_link`
//! (the link frame expressed in the chain's base frame).
//!
//! Forward kinematics allocates nothing, so the control loop may call it every step.

use nalgebra::{DMatrix, Isometry3, Matrix6, Translation3, Unit, UnitQuaternion, Vector3, Vector6};
use smallvec::{SmallVec, smallvec};
use std::path::Path;

/// Errors building a chain from a URDF.
#[derive(Debug, thiserror::Error)]
pub enum KinematicsError {
    /// The URDF file could not be read or parsed.
    #[error("URDF `{path}`: {message}")]
    Urdf {
        /// File at fault.
        path: String,
        /// Parser message.
        message: String,
    },
    /// A link named in the request is not in the URDF.
    #[error("URDF `{path}` has no link named `{link}` (links: {known})")]
    NoLink {
        /// File at fault.
        path: String,
        /// Missing link.
        link: String,
        /// Links the file does have.
        known: String,
    },
    /// The tip is not below the base in the kinematic tree.
    #[error("URDF `{path}`: link `{tip}` is not a descendant of `{base}`")]
    NotAChain {
        /// File at fault.
        path: String,
        /// Base link.
        base: String,
        /// Tip link.
        tip: String,
    },
    /// A joint type the chain does not support.
    #[error(
        "URDF `{path}`: joint `{joint}` has unsupported type {kind} (revolute, continuous, prismatic and fixed are supported)"
    )]
    Unsupported {
        /// File at fault.
        path: String,
        /// Joint name.
        joint: String,
        /// Its type.
        kind: String,
    },
}

/// Kind of a movable joint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JointKind {
    /// Rotation about the axis (rad).
    Revolute,
    /// Translation along the axis (m).
    Prismatic,
}

/// One movable joint of the chain, with every fixed transform before it folded into `origin`.
#[derive(Clone, Debug)]
pub struct ChainJoint {
    /// URDF joint name.
    pub name: String,
    /// Revolute or prismatic.
    pub kind: JointKind,
    /// Pose of the joint frame in the previous movable joint's child frame (or the base).
    pub origin: Isometry3<f64>,
    /// Joint axis in the joint frame.
    pub axis: Unit<Vector3<f64>>,
    /// Lower position limit.
    pub lower: f64,
    /// Upper position limit.
    pub upper: f64,
    /// Name of the link this joint moves.
    pub child_link: String,
}

/// A serial kinematic chain from a base link to a tip link.
#[derive(Clone, Debug)]
pub struct Chain {
    joints: Vec<ChainJoint>,
    /// Fixed transform from the last movable joint's child frame to the tip frame.
    tip: Isometry3<f64>,
    base_link: String,
    tip_link: String,
}

/// A URDF `<origin>` as a pose (rpy: fixed-axis roll about x, then pitch about y, then yaw
/// about z).
pub fn urdf_pose(p: &urdf_rs::Pose) -> Isometry3<f64> {
    let t = Translation3::new(p.xyz[0], p.xyz[1], p.xyz[2]);
    // URDF rpy: fixed-axis roll about x, then pitch about y, then yaw about z.
    let r = UnitQuaternion::from_euler_angles(p.rpy[0], p.rpy[1], p.rpy[2]);
    Isometry3::from_parts(t, r)
}

/// The motion of a joint of `kind` about or along `axis` at position `q` (rad or m), in its
/// joint frame.
pub fn joint_motion(kind: JointKind, axis: &Unit<Vector3<f64>>, q: f64) -> Isometry3<f64> {
    match kind {
        JointKind::Revolute => Isometry3::from_parts(
            Translation3::identity(),
            UnitQuaternion::from_axis_angle(axis, q),
        ),
        JointKind::Prismatic => Isometry3::from_parts(
            Translation3::from(axis.into_inner() * q),
            UnitQuaternion::identity(),
        ),
    }
}

impl Chain {
    /// Reads the chain `base_link -> tip_link` from a URDF file.
    pub fn from_urdf_file(
        path: &Path,
        base_link: &str,
        tip_link: &str,
    ) -> Result<Self, KinematicsError> {
        let text = std::fs::read_to_string(path).map_err(|e| KinematicsError::Urdf {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Self::from_urdf_str(&text, &path.display().to_string(), base_link, tip_link)
    }

    /// Reads the chain `base_link -> tip_link` from URDF text; `origin` names it in errors.
    pub fn from_urdf_str(
        text: &str,
        origin: &str,
        base_link: &str,
        tip_link: &str,
    ) -> Result<Self, KinematicsError> {
        let robot = urdf_rs::read_from_string(text).map_err(|e| KinematicsError::Urdf {
            path: origin.to_string(),
            message: e.to_string(),
        })?;
        Self::from_urdf(&robot, origin, base_link, tip_link)
    }

    /// Builds the chain from a parsed URDF.
    pub fn from_urdf(
        robot: &urdf_rs::Robot,
        origin: &str,
        base_link: &str,
        tip_link: &str,
    ) -> Result<Self, KinematicsError> {
        let known = || {
            robot
                .links
                .iter()
                .map(|l| l.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        for link in [base_link, tip_link] {
            if !robot.links.iter().any(|l| l.name == link) {
                return Err(KinematicsError::NoLink {
                    path: origin.into(),
                    link: link.into(),
                    known: known(),
                });
            }
        }
        // Walk up from the tip to the base through parent joints.
        let mut path = Vec::new();
        let mut link = tip_link.to_string();
        while link != base_link {
            let Some(j) = robot.joints.iter().find(|j| j.child.link == link) else {
                return Err(KinematicsError::NotAChain {
                    path: origin.into(),
                    base: base_link.into(),
                    tip: tip_link.into(),
                });
            };
            path.push(j);
            link = j.parent.link.clone();
        }
        path.reverse();
        let mut joints = Vec::new();
        let mut pending = Isometry3::identity();
        for j in path {
            let o = urdf_pose(&j.origin);
            let kind = match j.joint_type {
                urdf_rs::JointType::Fixed => {
                    pending *= o;
                    continue;
                }
                urdf_rs::JointType::Revolute => JointKind::Revolute,
                urdf_rs::JointType::Continuous => JointKind::Revolute,
                urdf_rs::JointType::Prismatic => JointKind::Prismatic,
                ref other => {
                    return Err(KinematicsError::Unsupported {
                        path: origin.into(),
                        joint: j.name.clone(),
                        kind: format!("{other:?}"),
                    });
                }
            };
            let (lower, upper) = if matches!(j.joint_type, urdf_rs::JointType::Continuous) {
                (f64::NEG_INFINITY, f64::INFINITY)
            } else {
                (j.limit.lower, j.limit.upper)
            };
            joints.push(ChainJoint {
                name: j.name.clone(),
                kind,
                origin: pending * o,
                axis: Unit::new_normalize(Vector3::new(
                    j.axis.xyz[0],
                    j.axis.xyz[1],
                    j.axis.xyz[2],
                )),
                lower,
                upper,
                child_link: j.child.link.clone(),
            });
            pending = Isometry3::identity();
        }
        Ok(Chain {
            joints,
            tip: pending,
            base_link: base_link.into(),
            tip_link: tip_link.into(),
        })
    }

    /// Movable joints, base to tip.
    pub fn joints(&self) -> &[ChainJoint] {
        &self.joints
    }

    /// Number of movable joints.
    pub fn dof(&self) -> usize {
        self.joints.len()
    }

    /// Base link name.
    pub fn base_link(&self) -> &str {
        &self.base_link
    }

    /// Tip link name.
    pub fn tip_link(&self) -> &str {
        &self.tip_link
    }

    fn joint_motion(j: &ChainJoint, q: f64) -> Isometry3<f64> {
        joint_motion(j.kind, &j.axis, q)
    }

    /// Pose of the tip, `T_base_tip`, for joint positions `q` (one per movable joint).
    ///
    /// # Panics
    /// If `q.len() != self.dof()`.
    pub fn fk(&self, q: &[f64]) -> Isometry3<f64> {
        assert_eq!(
            q.len(),
            self.dof(),
            "joint vector length must equal the chain's dof"
        );
        let mut t = Isometry3::identity();
        for (j, &qi) in self.joints.iter().zip(q) {
            t = t * j.origin * Self::joint_motion(j, qi);
        }
        t * self.tip
    }

    /// Poses of every movable joint's child link, `T_base_link`, written into `out` (no allocation).
    ///
    /// # Panics
    /// If `q` or `out` is shorter than the chain's dof.
    pub fn link_poses(&self, q: &[f64], out: &mut [Isometry3<f64>]) {
        let mut t = Isometry3::identity();
        for ((j, &qi), o) in self.joints.iter().zip(q).zip(out.iter_mut()) {
            t = t * j.origin * Self::joint_motion(j, qi);
            *o = t;
        }
    }

    /// Geometric Jacobian of the tip (rows: linear velocity xyz, angular velocity xyz, in the base
    /// frame; one column per joint).
    pub fn jacobian(&self, q: &[f64]) -> DMatrix<f64> {
        let mut frames: Frames = smallvec![Isometry3::identity(); self.dof()];
        let tip = self.fk_with_frames(q, &mut frames).translation.vector;
        let mut cols: Columns = smallvec![Vector6::zeros(); self.dof()];
        self.jacobian_columns(&frames, &tip, &mut cols);
        DMatrix::from_fn(6, self.dof(), |r, c| cols[c][r])
    }

    /// Forward kinematics that also keeps each joint's frame before its motion (`T_base_parent *
    /// origin`, what the Jacobian's columns are made of) in `frames`: the same products as
    /// [`Chain::fk`], so the same pose to the last bit.
    fn fk_with_frames(&self, q: &[f64], frames: &mut [Isometry3<f64>]) -> Isometry3<f64> {
        let mut t = Isometry3::identity();
        for ((j, &qi), frame) in self.joints.iter().zip(q).zip(frames.iter_mut()) {
            *frame = t * j.origin;
            t = *frame * Self::joint_motion(j, qi);
        }
        t * self.tip
    }

    /// The Jacobian's columns (one per joint, into `cols`) from the joint frames of
    /// [`Chain::fk_with_frames`] and the tip's position.
    fn jacobian_columns(
        &self,
        frames: &[Isometry3<f64>],
        tip: &Vector3<f64>,
        cols: &mut [Vector6<f64>],
    ) {
        for ((j, frame), col) in self.joints.iter().zip(frames).zip(cols.iter_mut()) {
            let axis_w = frame.rotation * j.axis.into_inner();
            let (lin, ang) = match j.kind {
                JointKind::Revolute => (axis_w.cross(&(tip - frame.translation.vector)), axis_w),
                JointKind::Prismatic => (axis_w, Vector3::zeros()),
            };
            *col = Vector6::new(lin.x, lin.y, lin.z, ang.x, ang.y, ang.z);
        }
    }

    /// Narrows the limits of joint `i` (e.g. to keep IK on one elbow branch).
    ///
    /// # Panics
    /// If `i` is out of range.
    pub fn set_limits(&mut self, i: usize, lower: f64, upper: f64) {
        self.joints[i].lower = lower;
        self.joints[i].upper = upper;
    }

    /// Clamps `q` into the joint limits.
    pub fn clamp(&self, q: &mut [f64]) {
        for (j, qi) in self.joints.iter().zip(q.iter_mut()) {
            *qi = qi.clamp(j.lower, j.upper);
        }
    }

    /// Damped-least-squares IK towards `target` (`T_base_tip`) starting from `q0`.
    ///
    /// Each iteration solves `dq = Jᵀ (J Jᵀ + λ² I)⁻¹ W e` with the pose error `e` (position, then
    /// rotation as a rotation vector) weighted per row by `opts.weights`, limits the step, and
    /// clamps to the joint limits. The damping keeps the step bounded near singularities and for
    /// unreachable targets, where it returns the closest pose it found.
    ///
    /// The 6x6 system lives on the stack and the Jacobian's columns in a small inline buffer, so a
    /// chain of up to 8 joints allocates only the returned joint vector. The sums run in the order
    /// of nalgebra's products of dynamic-size matrices up to five columns, so for arms of up to five
    /// joints (SO-101, Koch) the result is bit-for-bit that of the plain `DMatrix` formulation (a
    /// unit test keeps that one as its reference); from six joints on nalgebra hands the product
    /// to `matrixmultiply` and the two differ in the last bits.
    pub fn ik(&self, target: &Isometry3<f64>, q0: &[f64], opts: &IkOptions) -> IkSolution {
        let n = self.dof();
        let mut q: Joints = SmallVec::from_slice(q0);
        self.clamp(&mut q);
        let w = Vector6::from(opts.weights);
        let mut best_q = q.clone();
        let mut best = (f64::INFINITY, 0.0, 0.0);
        let mut frames: Frames = smallvec![Isometry3::identity(); n];
        let mut cols: Columns = smallvec![Vector6::zeros(); n];
        let damping2 = opts.damping * opts.damping;
        let mut iterations = 0;
        for it in 0..opts.max_iterations {
            iterations = it + 1;
            let cur = self.fk_with_frames(&q, &mut frames);
            let (pos_err, rot_err) = pose_error(target, &cur);
            let e = weighted_error(&pos_err, &rot_err, &w);
            let score = e.norm();
            if score < best.0 {
                best = (score, pos_err.norm(), rot_err.norm());
                best_q.copy_from_slice(&q);
            }
            // Only the rotation components that carry weight have to meet the tolerance.
            let rot_ok =
                (0..3).all(|i| w[3 + i] == 0.0 || rot_err[i].abs() <= opts.rotation_tolerance_rad);
            if pos_err.norm() < opts.position_tolerance_m && rot_ok {
                return IkSolution {
                    q: q.to_vec(),
                    position_error_m: pos_err.norm(),
                    rotation_error_rad: rot_err.norm(),
                    iterations,
                    converged: true,
                };
            }
            self.jacobian_columns(&frames, &cur.translation.vector, &mut cols);
            for col in cols.iter_mut() {
                col.component_mul_assign(&w);
            }
            // J Jᵀ + λ² I, each entry summed over the joints in order.
            let mut jjt = Matrix6::zeros();
            for r in 0..6 {
                for c in 0..6 {
                    let mut acc = cols[0][r] * cols[0][c];
                    for col in &cols[1..] {
                        acc += col[r] * col[c];
                    }
                    jjt[(r, c)] = acc + if r == c { damping2 } else { 0.0 };
                }
            }
            let Some(y) = jjt.lu().solve(&e) else { break };
            // dq = Jᵀ y, and the largest component for the step limit.
            let mut dq: Joints = smallvec![0.0; n];
            for (d, col) in dq.iter_mut().zip(&cols) {
                let mut acc = col[0] * y[0];
                for r in 1..6 {
                    acc += col[r] * y[r];
                }
                *d = acc;
            }
            let step = dq.iter().fold(0.0_f64, |m, d| m.max(d.abs()));
            let scale = (step > opts.max_step_rad).then(|| opts.max_step_rad / step);
            for (qi, d) in q.iter_mut().zip(&dq) {
                *qi += scale.map_or(*d, |s| d * s);
            }
            self.clamp(&mut q);
        }
        let cur = self.fk(&q);
        let (p, r) = pose_error(target, &cur);
        let score = weighted_error(&p, &r, &w).norm();
        if score < best.0 {
            best = (score, p.norm(), r.norm());
            best_q = q;
        }
        IkSolution {
            q: best_q.to_vec(),
            position_error_m: best.1,
            rotation_error_rad: best.2,
            iterations,
            converged: false,
        }
    }
}

/// Joint vectors inside [`Chain::ik`]: inline up to 8 joints.
type Joints = SmallVec<[f64; 8]>;
/// The Jacobian's columns inside [`Chain::ik`].
type Columns = SmallVec<[Vector6<f64>; 8]>;
/// The joints' frames inside [`Chain::ik`].
type Frames = SmallVec<[Isometry3<f64>; 8]>;

/// The pose error as one 6-vector (position, then rotation), each row times its weight.
fn weighted_error(pos: &Vector3<f64>, rot: &Vector3<f64>, w: &Vector6<f64>) -> Vector6<f64> {
    Vector6::new(
        pos.x * w[0],
        pos.y * w[1],
        pos.z * w[2],
        rot.x * w[3],
        rot.y * w[4],
        rot.z * w[5],
    )
}

/// Position error (m) and rotation error (rotation vector, rad) of `current` towards `target`,
/// both in the base frame.
pub fn pose_error(
    target: &Isometry3<f64>,
    current: &Isometry3<f64>,
) -> (Vector3<f64>, Vector3<f64>) {
    let dp = target.translation.vector - current.translation.vector;
    let dr = (target.rotation * current.rotation.inverse()).scaled_axis();
    (dp, dr)
}

/// Options of [`Chain::ik`].
#[derive(Clone, Debug)]
pub struct IkOptions {
    /// Row weights of the pose error: x, y, z (per m), then rotation about x, y, z (per rad). A
    /// zero weight frees that component (e.g. position-only IK: `[1, 1, 1, 0, 0, 0]`).
    pub weights: [f64; 6],
    /// Damping λ of the least-squares step.
    pub damping: f64,
    /// Largest joint change per iteration, rad (or m for prismatic joints).
    pub max_step_rad: f64,
    /// Iteration budget.
    pub max_iterations: usize,
    /// Converged when the position error is below this, m...
    pub position_tolerance_m: f64,
    /// ...and the rotation error below this, rad (ignored when all rotation weights are zero).
    pub rotation_tolerance_rad: f64,
}

impl Default for IkOptions {
    fn default() -> Self {
        IkOptions {
            weights: [1.0, 1.0, 1.0, 0.1, 0.1, 0.1],
            damping: 0.01,
            max_step_rad: 0.3,
            max_iterations: 100,
            position_tolerance_m: 1e-4,
            rotation_tolerance_rad: 1e-3,
        }
    }
}

/// Result of [`Chain::ik`]: the best joint vector found and how far its pose is from the target.
#[derive(Clone, Debug)]
pub struct IkSolution {
    /// Joint positions (within limits).
    pub q: Vec<f64>,
    /// Remaining position error, m.
    pub position_error_m: f64,
    /// Remaining rotation error, rad.
    pub rotation_error_rad: f64,
    /// Iterations used.
    pub iterations: usize,
    /// Both tolerances were met.
    pub converged: bool,
}

/// Rotation that points a tool's +z axis straight down (-z of the base) with the tool's +x axis
/// at `yaw` about the base z axis: the usual top-down grasp orientation.
pub fn top_down(yaw: f64) -> UnitQuaternion<f64> {
    UnitQuaternion::from_axis_angle(&Vector3::z_axis(), yaw)
        * UnitQuaternion::from_axis_angle(&Vector3::x_axis(), std::f64::consts::PI)
}

/// Yaw (rad, about base z) of a top-down tool orientation: the heading of its +x axis.
pub fn yaw_of(rot: &UnitQuaternion<f64>) -> f64 {
    let x: Vector3<f64> = rot * Vector3::x();
    x.y.atan2(x.x)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A planar two-link arm (lengths 1.0 and 0.5) on a yaw joint, with a fixed tool offset: small
    /// enough to check by hand.
    const ARM: &str = r#"<robot name="t">
      <link name="base"/><link name="l0"/><link name="l1"/><link name="l2"/><link name="tool"/>
      <joint name="yaw" type="revolute"><parent link="base"/><child link="l0"/>
        <origin xyz="0 0 0.2" rpy="0 0 0"/><axis xyz="0 0 1"/><limit lower="-3" upper="3" effort="1" velocity="1"/></joint>
      <joint name="j1" type="revolute"><parent link="l0"/><child link="l1"/>
        <origin xyz="0 0 0" rpy="0 0 0"/><axis xyz="0 1 0"/><limit lower="-3" upper="3" effort="1" velocity="1"/></joint>
      <joint name="j2" type="revolute"><parent link="l1"/><child link="l2"/>
        <origin xyz="0 0 1.0" rpy="0 0 0"/><axis xyz="0 1 0"/><limit lower="-3" upper="3" effort="1" velocity="1"/></joint>
      <joint name="tool_fixed" type="fixed"><parent link="l2"/><child link="tool"/>
        <origin xyz="0 0 0.5" rpy="0 0 0"/></joint>
    </robot>"#;

    fn chain() -> Chain {
        Chain::from_urdf_str(ARM, "test", "base", "tool").unwrap()
    }

    #[test]
    fn fk_matches_hand_computation() {
        let c = chain();
        assert_eq!(c.dof(), 3);
        // Straight up.
        let t = c.fk(&[0.0, 0.0, 0.0]);
        assert!((t.translation.vector - Vector3::new(0.0, 0.0, 1.7)).norm() < 1e-12);
        // Shoulder forward 90 degrees: link 1 along +x, then elbow back up 90 degrees.
        let h = std::f64::consts::FRAC_PI_2;
        let t = c.fk(&[0.0, h, -h]);
        assert!(
            (t.translation.vector - Vector3::new(1.0, 0.0, 0.7)).norm() < 1e-12,
            "{t}"
        );
        // Yaw the whole arm by 90 degrees: +x becomes +y.
        let t = c.fk(&[h, h, 0.0]);
        assert!(
            (t.translation.vector - Vector3::new(0.0, 1.5, 0.2)).norm() < 1e-12,
            "{t}"
        );
    }

    #[test]
    fn jacobian_matches_finite_differences() {
        let c = chain();
        let q = [0.3, -0.4, 0.9];
        let jac = c.jacobian(&q);
        let eps = 1e-6;
        for i in 0..3 {
            let mut qp = q;
            qp[i] += eps;
            let mut qm = q;
            qm[i] -= eps;
            let dp = (c.fk(&qp).translation.vector - c.fk(&qm).translation.vector) / (2.0 * eps);
            let (_, dr) = pose_error(&c.fk(&qp), &c.fk(&qm));
            let dr = dr / (2.0 * eps);
            for r in 0..3 {
                assert!((jac[(r, i)] - dp[r]).abs() < 1e-6, "linear row {r} col {i}");
                assert!(
                    (jac[(r + 3, i)] - dr[r]).abs() < 1e-6,
                    "angular row {r} col {i}"
                );
            }
        }
    }

    #[test]
    fn ik_recovers_reachable_positions() {
        let c = chain();
        let opts = IkOptions {
            weights: [1.0, 1.0, 1.0, 0.0, 0.0, 0.0],
            ..Default::default()
        };
        for q_true in [[0.2, 0.5, 0.8], [-1.0, -0.3, 1.2], [2.0, 0.9, -0.5]] {
            let target = c.fk(&q_true);
            let sol = c.ik(&target, &[0.0, 0.1, 0.1], &opts);
            assert!(sol.converged, "{sol:?}");
            assert!(sol.position_error_m < 1e-4);
        }
    }

    #[test]
    fn ik_of_unreachable_target_stays_bounded_and_in_limits() {
        let c = chain();
        let target = Isometry3::translation(5.0, 0.0, 0.2);
        let sol = c.ik(
            &target,
            &[0.0, 0.0, 0.0],
            &IkOptions {
                weights: [1.0, 1.0, 1.0, 0.0, 0.0, 0.0],
                ..Default::default()
            },
        );
        assert!(!sol.converged);
        assert!(sol.q.iter().all(|q| q.is_finite() && q.abs() <= 3.0));
        // The best it can do is stretch towards the target: 1.5 m reach from (0, 0, 0.2). Damped
        // steps slow down near the stretched-out singularity, so it gets close, not exact.
        assert!(
            sol.position_error_m >= 3.5 - 1e-9 && sol.position_error_m < 3.55,
            "{sol:?}"
        );
    }

    #[test]
    fn missing_link_names_the_file_and_alternatives() {
        let err = Chain::from_urdf_str(ARM, "arm.urdf", "base", "gripper")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("arm.urdf") && err.contains("gripper") && err.contains("tool"),
            "{err}"
        );
    }

    /// The IK before it moved to stack-sized matrices: every product through `DMatrix`. Kept as
    /// the reference the simulator's recorded trajectories were made with.
    fn ik_reference(c: &Chain, target: &Isometry3<f64>, q0: &[f64], opts: &IkOptions) -> Vec<f64> {
        use nalgebra::DVector;
        let n = c.dof();
        let mut q = q0.to_vec();
        c.clamp(&mut q);
        let w = opts.weights;
        let error = |q: &[f64]| {
            let (p, r) = pose_error(target, &c.fk(q));
            (
                DVector::from_fn(6, |i, _| if i < 3 { p[i] * w[i] } else { r[i - 3] * w[i] }),
                p,
                r,
            )
        };
        let mut best = (f64::INFINITY, q.clone());
        for _ in 0..opts.max_iterations {
            let (e, p, r) = error(&q);
            if e.norm() < best.0 {
                best = (e.norm(), q.clone());
            }
            let rot_ok =
                (0..3).all(|i| w[3 + i] == 0.0 || r[i].abs() <= opts.rotation_tolerance_rad);
            if p.norm() < opts.position_tolerance_m && rot_ok {
                return q;
            }
            let mut jac = c.jacobian(&q);
            for r in 0..6 {
                for col in 0..n {
                    jac[(r, col)] *= w[r];
                }
            }
            let jjt =
                &jac * jac.transpose() + DMatrix::identity(6, 6) * (opts.damping * opts.damping);
            let Some(y) = jjt.lu().solve(&e) else { break };
            let mut dq = jac.transpose() * y;
            let step = dq.amax();
            if step > opts.max_step_rad {
                dq *= opts.max_step_rad / step;
            }
            for i in 0..n {
                q[i] += dq[i];
            }
            c.clamp(&mut q);
        }
        if error(&q).0.norm() < best.0 {
            best.1 = q;
        }
        best.1
    }

    #[test]
    fn ik_on_the_stack_is_bit_identical_to_the_dmatrix_formulation() {
        let urdf = include_str!("../../../../sim/assets/so101.urdf");
        let arm = Chain::from_urdf_str(urdf, "so101.urdf", "base", "tcp").unwrap();
        assert_eq!(arm.dof(), 5);
        // A fixed sequence of joint targets spread over the limits (a 64-bit LCG), reached from
        // the previous solution as the simulator does, with full-pose and position-only weights
        // and with iteration budgets that end unconverged.
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut uniform = || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        let mut seed = vec![0.0; 5];
        for k in 0..300 {
            let q_true: Vec<f64> = arm
                .joints()
                .iter()
                .map(|j| j.lower + (j.upper - j.lower) * uniform())
                .collect();
            let mut target = arm.fk(&q_true);
            target.translation.vector.x += 0.05 * (uniform() - 0.5);
            let opts = IkOptions {
                weights: if k % 2 == 0 {
                    [1.0, 1.0, 1.0, 0.1, 0.1, 0.1]
                } else {
                    [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
                },
                max_iterations: [3, 20, 100][k % 3],
                ..Default::default()
            };
            let got = arm.ik(&target, &seed, &opts).q;
            let want = ik_reference(&arm, &target, &seed, &opts);
            let bits = |q: &[f64]| q.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "target {k}: {got:?} vs {want:?}");
            seed = got;
        }
        // The three-joint test arm as well.
        let c = chain();
        let target = c.fk(&[0.4, -0.2, 1.1]);
        let opts = IkOptions::default();
        assert_eq!(
            c.ik(&target, &[0.0, 0.1, 0.1], &opts).q,
            ik_reference(&c, &target, &[0.0, 0.1, 0.1], &opts)
        );
    }

    #[test]
    fn top_down_points_tool_z_down() {
        let r = top_down(0.7);
        let z = r * Vector3::z();
        assert!((z - Vector3::new(0.0, 0.0, -1.0)).norm() < 1e-12);
        assert!((yaw_of(&r) - 0.7).abs() < 1e-12);
    }
}
