//! reflex's own dynamics of the arm's five joints, for the simulator's `[sim.solver] arm = "reflex"`.
//!
//! rapier integrates a multibody by rebuilding and factoring its mass matrix on every solver
//! iteration through generic, heap-backed matrices: about two thirds of a simulator step
//! (docs/sim.md, "Speed"). Here the same reduced-coordinate model of a serial chain is written
//! for exactly five revolute joints with fixed-size matrices: the joint-space mass matrix from
//! each link's Jacobian (the composite form of Featherstone's CRBA, *Rigid Body Dynamics
//! Algorithms*, 2008, ch. 6), the Coriolis, centrifugal and gravity torques by recursive
//! Newton-Euler with the joint accelerations at zero (ch. 5), and each servo's spring and damper
//! integrated implicitly (backward Euler in the motor terms, as rapier's joint motors are), so
//! that the stiff position servos stay stable at a 200 Hz step. The servos' torque limit is
//! honoured: a joint whose implicit torque would exceed it is re-solved with its torque held at
//! the limit.
//!
//! The links are then kinematic bodies in rapier, moved to where this model puts them; rapier
//! keeps what it is good at: contacts, and the two fingers (dynamic bodies on prismatic joints
//! with their own motors), which grasp by friction against the task's object.
//!
//! Kinematic bodies feel no contact, so the one contact the arm must feel is solved here: the
//! table under the tool ([`Floor`]). Points fixed to the last link (the corners of the gripper's
//! and the fingers' boxes) may not pass a horizontal plane; each step that would take one below
//! it gets a non-negative impulse along the plane's normal through the arm's effective mass (the
//! mass matrix with the implicit servo terms), by projected Gauss-Seidel over the points
//! (Stewart & Trinkle's velocity-level contact, frictionless). With the multibody, rapier's own
//! contacts stopped the gripper at the table; without this the fingertips were driven into it.

use nalgebra::{Cholesky, Isometry3, Matrix3, Point3, SMatrix, SVector, UnitQuaternion, Vector3};
use reflex_kinematics::urdf_pose;

/// Number of arm joints this model integrates.
pub const ARM_DOF: usize = 5;

type Mat = SMatrix<f64, ARM_DOF, ARM_DOF>;
type Vec5 = SVector<f64, ARM_DOF>;
/// Per link, in the base frame: joint axis, joint origin, centre of mass, inertia.
type Frames = (
    [Vector3<f64>; ARM_DOF],
    [Vector3<f64>; ARM_DOF],
    [Vector3<f64>; ARM_DOF],
    [Matrix3<f64>; ARM_DOF],
);

/// One moving link: its joint and its mass properties in its own frame.
#[derive(Clone, Debug)]
struct Link {
    /// Pose of the joint frame in the parent link's frame.
    origin: Isometry3<f64>,
    /// Joint axis in the joint frame (unit).
    axis: Vector3<f64>,
    mass: f64,
    /// Centre of mass in the link frame.
    com: Vector3<f64>,
    /// Inertia about the centre of mass, in the link frame.
    inertia: Matrix3<f64>,
}

/// Servo gains and limits of the five joints.
#[derive(Clone, Debug)]
pub struct ServoGains {
    /// Position gain, N m / rad.
    pub kp: f64,
    /// Velocity gain, N m s / rad.
    pub kd: f64,
    /// Reflected rotor inertia, kg m^2.
    pub armature: f64,
    /// Torque limit of each joint, N m.
    pub efforts: [f64; ARM_DOF],
    /// Position limits of each joint, rad.
    pub limits: [(f64, f64); ARM_DOF],
}

/// A horizontal plane that points fixed to the last link may not pass (the table's top).
#[derive(Clone, Copy, Debug)]
pub struct Floor<'a> {
    /// Height of the plane in the base frame, m.
    pub z: f64,
    /// Points in the last link's frame (at most [`Floor::MAX_POINTS`]).
    pub points: &'a [Point3<f64>],
}

impl Floor<'_> {
    /// The most points a floor contact takes.
    pub const MAX_POINTS: usize = 32;
    /// Gauss-Seidel passes over the points in contact.
    const PASSES: usize = 4;
    /// A point further above the plane than this moves freely this step, m (a 3 m/s tool covers
    /// 1.5 cm in a 5 ms step).
    const MARGIN_M: f64 = 0.02;
    /// Share of a penetration removed per step (Baumgarte): the linearised step can leave a
    /// rotating tool a little below the plane, and all of it back at once would kick the arm.
    const ERROR_REDUCTION: f64 = 0.2;
}

/// The arm's state and model.
#[derive(Clone, Debug)]
pub struct ArmDynamics {
    links: [Link; ARM_DOF],
    gains: ServoGains,
    /// Joint positions, rad.
    pub q: [f64; ARM_DOF],
    /// Joint velocities, rad/s.
    pub qd: [f64; ARM_DOF],
    /// Link poses in the base frame at `q` (kept current by every call that moves `q`).
    poses: [Isometry3<f64>; ARM_DOF],
}

/// Inertia of a URDF `<inertial>` about its centre of mass, expressed in the link frame.
fn urdf_inertia(i: &urdf_rs::Inertial) -> (f64, Vector3<f64>, Matrix3<f64>) {
    let o = urdf_pose(&i.origin);
    let t = &i.inertia;
    let local = Matrix3::new(
        t.ixx, t.ixy, t.ixz, //
        t.ixy, t.iyy, t.iyz, //
        t.ixz, t.iyz, t.izz,
    );
    let r = o.rotation.to_rotation_matrix();
    (
        i.mass.value,
        o.translation.vector,
        r.matrix() * local * r.matrix().transpose(),
    )
}

/// Adds a body of `mass` at `com` with inertia `inertia` (about its own centre) to a lumped body.
fn lump(
    (m1, c1, i1): (f64, Vector3<f64>, Matrix3<f64>),
    (m2, c2, i2): (f64, Vector3<f64>, Matrix3<f64>),
) -> (f64, Vector3<f64>, Matrix3<f64>) {
    let m = m1 + m2;
    let c = (c1 * m1 + c2 * m2) / m;
    // Parallel axis theorem: I about c = I_own + m (|d|^2 E - d d^T).
    let shift =
        |mass: f64, d: Vector3<f64>| mass * (Matrix3::identity() * d.dot(&d) - d * d.transpose());
    (m, c, i1 + shift(m1, c1 - c) + i2 + shift(m2, c2 - c))
}

impl ArmDynamics {
    /// The model of `urdf`'s chain `joints` (five revolute joints, base to tool). The links after
    /// the last joint that `lumped` names (the fingers) are added to the last link at the pose
    /// `lumped_at` gives them in its frame: the arm carries them, rapier moves them.
    pub fn from_urdf(
        urdf: &urdf_rs::Robot,
        joints: &[&str; ARM_DOF],
        lumped: &[(&str, Isometry3<f64>)],
        gains: ServoGains,
    ) -> Result<Self, String> {
        let mut links = Vec::with_capacity(ARM_DOF);
        for name in joints {
            let j = urdf
                .joints
                .iter()
                .find(|j| j.name == *name)
                .ok_or_else(|| format!("joint `{name}` is not in the URDF"))?;
            if !matches!(j.joint_type, urdf_rs::JointType::Revolute) {
                return Err(format!("joint `{name}` is not revolute"));
            }
            let child = urdf
                .links
                .iter()
                .find(|l| l.name == j.child.link)
                .ok_or_else(|| format!("link `{}` is not in the URDF", j.child.link))?;
            let axis = Vector3::new(j.axis.xyz[0], j.axis.xyz[1], j.axis.xyz[2]).normalize();
            links.push((urdf_pose(&j.origin), axis, urdf_inertia(&child.inertial)));
        }
        let last = links.last_mut().expect("five links");
        for (name, pose) in lumped {
            let l = urdf
                .links
                .iter()
                .find(|l| l.name == *name)
                .ok_or_else(|| format!("link `{name}` is not in the URDF"))?;
            let (m, c, i) = urdf_inertia(&l.inertial);
            let r = pose.rotation.to_rotation_matrix();
            let moved = (
                m,
                pose * nalgebra::Point3::from(c),
                r.matrix() * i * r.matrix().transpose(),
            );
            last.2 = lump(last.2, (moved.0, moved.1.coords, moved.2));
        }
        let links: [Link; ARM_DOF] = std::array::from_fn(|k| {
            let (origin, axis, (mass, com, inertia)) = links[k];
            Link {
                origin,
                axis,
                mass,
                com,
                inertia,
            }
        });
        let mut arm = ArmDynamics {
            links,
            gains,
            q: [0.0; ARM_DOF],
            qd: [0.0; ARM_DOF],
            poses: [Isometry3::identity(); ARM_DOF],
        };
        arm.update_poses();
        Ok(arm)
    }

    /// Places the arm at `q` at rest.
    pub fn set_state(&mut self, q: &[f64; ARM_DOF]) {
        self.q = *q;
        self.qd = [0.0; ARM_DOF];
        self.update_poses();
    }

    /// Link poses in the base frame at the current `q`.
    pub fn poses(&self) -> &[Isometry3<f64>; ARM_DOF] {
        &self.poses
    }

    fn update_poses(&mut self) {
        let mut t = Isometry3::identity();
        for (k, l) in self.links.iter().enumerate() {
            let rot = UnitQuaternion::from_scaled_axis(l.axis * self.q[k]);
            t = t * l.origin * rot;
            self.poses[k] = t;
        }
    }

    /// World-frame joint axes, joint origins, centres of mass and inertias at the current poses.
    fn frames(&self) -> Frames {
        let mut z = [Vector3::zeros(); ARM_DOF];
        let mut o = [Vector3::zeros(); ARM_DOF];
        let mut c = [Vector3::zeros(); ARM_DOF];
        let mut inertia = [Matrix3::zeros(); ARM_DOF];
        for (k, (l, t)) in self.links.iter().zip(&self.poses).enumerate() {
            let r = t.rotation.to_rotation_matrix();
            // The joint rotates about its own origin: the child frame's origin is the joint's.
            z[k] = r * l.axis;
            o[k] = t.translation.vector;
            c[k] = (t * nalgebra::Point3::from(l.com)).coords;
            inertia[k] = r.matrix() * l.inertia * r.matrix().transpose();
        }
        (z, o, c, inertia)
    }

    /// The joint-space mass matrix (without the servos' armature) at the current `q`.
    pub fn mass_matrix(&self) -> Mat {
        self.mass_matrix_in(&self.frames())
    }

    fn mass_matrix_in(&self, (z, o, c, inertia): &Frames) -> Mat {
        let mut m = Mat::zeros();
        for b in 0..ARM_DOF {
            let l = &self.links[b];
            let mut jv = [Vector3::zeros(); ARM_DOF];
            for j in 0..=b {
                jv[j] = z[j].cross(&(c[b] - o[j]));
            }
            for j in 0..=b {
                let iz = inertia[b] * z[j];
                for k in 0..=j {
                    let v = l.mass * jv[j].dot(&jv[k]) + z[k].dot(&iz);
                    m[(j, k)] += v;
                    if j != k {
                        m[(k, j)] += v;
                    }
                }
            }
        }
        m
    }

    /// Coriolis, centrifugal and gravity torques at the current `q` and `qd` (what the joints
    /// must supply to keep every joint acceleration at zero), by recursive Newton-Euler.
    pub fn bias_torques(&self, gravity: &Vector3<f64>) -> Vec5 {
        self.bias_torques_in(&self.frames(), gravity)
    }

    fn bias_torques_in(&self, (z, o, c, inertia): &Frames, gravity: &Vector3<f64>) -> Vec5 {
        let mut w = [Vector3::zeros(); ARM_DOF];
        let mut f = [Vector3::zeros(); ARM_DOF];
        let mut n = [Vector3::zeros(); ARM_DOF];
        // The base accelerates up at g: gravity acting on every link, with no separate term.
        let (mut w_p, mut a_p, mut o_p) = (Vector3::zeros(), -gravity, o[0]);
        let mut alpha_p = Vector3::zeros();
        for k in 0..ARM_DOF {
            let wz = z[k] * self.qd[k];
            let wk = w_p + wz;
            let alpha = alpha_p + w_p.cross(&wz);
            let d = o[k] - o_p;
            let a_o = a_p + alpha_p.cross(&d) + w_p.cross(&w_p.cross(&d));
            let r = c[k] - o[k];
            let a_c = a_o + alpha.cross(&r) + wk.cross(&wk.cross(&r));
            f[k] = a_c * self.links[k].mass;
            n[k] = inertia[k] * alpha + wk.cross(&(inertia[k] * wk));
            w[k] = wk;
            (w_p, a_p, o_p, alpha_p) = (wk, a_o, o[k], alpha);
        }
        let mut tau = Vec5::zeros();
        let (mut f_c, mut n_c) = (Vector3::zeros(), Vector3::zeros());
        for k in (0..ARM_DOF).rev() {
            // Moments about this joint's origin of the link's own force and of everything beyond.
            let child_o = if k + 1 < ARM_DOF { o[k + 1] } else { o[k] };
            let n_k = n[k] + (c[k] - o[k]).cross(&f[k]) + n_c + (child_o - o[k]).cross(&f_c);
            let f_k = f[k] + f_c;
            tau[k] = z[k].dot(&n_k);
            (f_c, n_c) = (f_k, n_k);
        }
        tau
    }

    /// Advances the arm by `h` seconds with the servos pulling towards `targets` (rad), under
    /// `gravity`, the tool kept above `floor` when there is one.
    pub fn step(
        &mut self,
        h: f64,
        targets: &[f64; ARM_DOF],
        gravity: &Vector3<f64>,
        floor: Option<Floor<'_>>,
    ) {
        let g = &self.gains;
        let frames = self.frames();
        let mut m = self.mass_matrix_in(&frames);
        for k in 0..ARM_DOF {
            m[(k, k)] += g.armature;
        }
        let bias = self.bias_torques_in(&frames, gravity);
        let qd = Vec5::from(self.qd);
        let momentum = m * qd;
        // Backward Euler in the servo terms: tau = kp (target - q - h qd') - kd qd'.
        let mut saturated: [Option<f64>; ARM_DOF] = [None; ARM_DOF];
        let mut next = qd;
        let mut solver = None;
        for _pass in 0..3 {
            let mut a = m;
            let mut rhs = momentum - bias * h;
            for k in 0..ARM_DOF {
                match saturated[k] {
                    Some(tau) => rhs[k] += h * tau,
                    None => {
                        a[(k, k)] += h * g.kd + h * h * g.kp;
                        rhs[k] += h * g.kp * (targets[k] - self.q[k]);
                    }
                }
            }
            let Some(ch) = Cholesky::new(a) else { return };
            next = ch.solve(&rhs);
            solver = Some(ch);
            let mut changed = false;
            for k in 0..ARM_DOF {
                if saturated[k].is_some() {
                    continue;
                }
                let tau = g.kp * (targets[k] - self.q[k] - h * next[k]) - g.kd * next[k];
                if tau.abs() > g.efforts[k] {
                    saturated[k] = Some(tau.signum() * g.efforts[k]);
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        if let (Some(floor), Some(ch)) = (floor, &solver) {
            self.stop_at(&floor, &frames, ch, h, &mut next);
        }
        for k in 0..ARM_DOF {
            let (lo, hi) = g.limits[k];
            let mut q = self.q[k] + h * next[k];
            let mut v = next[k];
            // A joint stop: the joint stays at its limit and loses the velocity into it.
            if q < lo {
                q = lo;
                v = v.max(0.0);
            } else if q > hi {
                q = hi;
                v = v.min(0.0);
            }
            self.q[k] = q;
            self.qd[k] = v;
        }
        self.update_poses();
    }

    /// Changes the joint velocities `next` of a step of `h` s so that no point of `floor` ends
    /// below it: per point, the impulse `λ >= 0` along the plane's normal that the effective mass
    /// (factored in `ch`) turns into the missing upward speed, accumulated over a few projected
    /// Gauss-Seidel passes so that several corners on the table share the load.
    fn stop_at(
        &self,
        floor: &Floor<'_>,
        (z, o, _, _): &Frames,
        ch: &Cholesky<f64, nalgebra::Const<ARM_DOF>>,
        h: f64,
        next: &mut Vec5,
    ) {
        let tool = self.poses[ARM_DOF - 1];
        debug_assert!(
            floor.points.len() <= Floor::MAX_POINTS,
            "too many floor points"
        );
        let n = floor.points.len().min(Floor::MAX_POINTS);
        // Per point near the plane: its height above it, the row of the Jacobian that maps joint
        // velocities to its vertical speed, the joint response to a unit impulse, and the
        // impulse so far.
        let mut rows = [(0.0, Vec5::zeros(), Vec5::zeros(), 0.0); Floor::MAX_POINTS];
        let mut near = 0;
        for local in &floor.points[..n] {
            let p = tool * local;
            let gap = p.z - floor.z;
            if gap > Floor::MARGIN_M {
                continue;
            }
            let jz = Vec5::from_fn(|k, _| z[k].cross(&(p.coords - o[k])).z);
            rows[near] = (gap, jz, ch.solve(&jz), 0.0);
            near += 1;
        }
        for _ in 0..Floor::PASSES {
            for (gap, jz, response, lambda) in rows[..near].iter_mut() {
                // The slowest downward speed that still ends on the plane (a point below it
                // comes back by a share of its depth).
                let floor_speed = if *gap >= 0.0 {
                    -*gap / h
                } else {
                    -Floor::ERROR_REDUCTION * *gap / h
                };
                let speed = jz.dot(next);
                let mass = jz.dot(response);
                if mass <= 0.0 {
                    continue;
                }
                let total = (*lambda + (floor_speed - speed) / mass).max(0.0);
                *next += *response * (total - *lambda);
                *lambda = total;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The simulator's arm (sim/assets/so101.urdf) and its five arm joints.
    const JOINTS: [&str; ARM_DOF] = [
        "shoulder_pan",
        "shoulder_lift",
        "elbow_flex",
        "wrist_flex",
        "wrist_roll",
    ];

    fn urdf() -> urdf_rs::Robot {
        urdf_rs::read_from_string(include_str!("../../assets/so101.urdf")).unwrap()
    }

    fn arm() -> ArmDynamics {
        let urdf = urdf();
        let joint = |name: &str| urdf.joints.iter().find(|j| j.name == name).unwrap();
        let gains = ServoGains {
            kp: 60.0,
            kd: 1.5,
            armature: 0.01,
            efforts: JOINTS.map(|n| joint(n).limit.effort),
            limits: JOINTS.map(|n| (joint(n).limit.lower, joint(n).limit.upper)),
        };
        ArmDynamics::from_urdf(&urdf, &JOINTS, &[], gains).unwrap()
    }

    /// Potential energy of the links at `q`.
    fn potential(a: &mut ArmDynamics, q: &[f64; 5], g: f64) -> f64 {
        a.set_state(q);
        a.links
            .iter()
            .zip(a.poses())
            .map(|(l, t)| l.mass * g * (t * nalgebra::Point3::from(l.com)).z)
            .sum()
    }

    #[test]
    fn gravity_torques_are_the_gradient_of_the_potential_energy() {
        let mut a = arm();
        let gravity = Vector3::new(0.0, 0.0, -9.81);
        for q in [
            [0.0; 5],
            [0.3, -0.4, 0.5, 0.6, -0.7],
            [-1.0, 1.2, -0.9, 0.2, 2.0],
        ] {
            a.set_state(&q);
            let tau = a.bias_torques(&gravity);
            for k in 0..5 {
                let e = 1e-6;
                let (mut lo, mut hi) = (q, q);
                lo[k] -= e;
                hi[k] += e;
                let grad =
                    (potential(&mut a, &hi, 9.81) - potential(&mut a, &lo, 9.81)) / (2.0 * e);
                assert!(
                    (tau[k] - grad).abs() < 1e-6,
                    "joint {k} at {q:?}: {} vs {grad}",
                    tau[k]
                );
            }
        }
    }

    #[test]
    fn the_mass_matrix_gives_the_links_kinetic_energy() {
        // 1/2 qd^T M qd must equal the links' kinetic energy from finite-differenced poses.
        let mut a = arm();
        let q = [0.3, -0.4, 0.5, 0.6, -0.7];
        let qd = [0.5, -1.0, 0.7, 1.3, -0.4];
        a.set_state(&q);
        let m = a.mass_matrix();
        let v = Vec5::from(qd);
        let from_matrix = 0.5 * v.dot(&(m * v));
        let e = 1e-7;
        let (mut before, mut after) = (q, q);
        for k in 0..5 {
            before[k] -= e * qd[k];
            after[k] += e * qd[k];
        }
        let (mut pa, mut pb) = (a.clone(), a.clone());
        pa.set_state(&before);
        pb.set_state(&after);
        let mut kinetic = 0.0;
        for (k, l) in a.links.iter().enumerate() {
            let (t0, t1) = (pa.poses[k], pb.poses[k]);
            let c0 = t0 * nalgebra::Point3::from(l.com);
            let c1 = t1 * nalgebra::Point3::from(l.com);
            let vel = (c1 - c0) / (2.0 * e);
            let w = (t1.rotation * t0.rotation.inverse()).scaled_axis() / (2.0 * e);
            let r = a.poses[k].rotation.to_rotation_matrix();
            let iw = r.matrix() * l.inertia * r.matrix().transpose();
            kinetic += 0.5 * l.mass * vel.norm_squared() + 0.5 * w.dot(&(iw * w));
        }
        assert!(
            (from_matrix - kinetic).abs() < 1e-6 * kinetic.max(1e-3),
            "{from_matrix} vs {kinetic}"
        );
        // Symmetric and positive definite.
        assert!((m - m.transpose()).norm() < 1e-12);
        assert!(Cholesky::new(m).is_some());
    }

    #[test]
    fn the_servos_settle_on_their_targets_and_a_stalled_one_pushes_no_harder_than_its_limit() {
        let mut a = arm();
        let gravity = Vector3::new(0.0, 0.0, -9.81);
        a.set_state(&[0.0; 5]);
        let target = [0.5, -0.3, 0.4, 0.2, 1.0];
        for _ in 0..400 {
            a.step(1.0 / 200.0, &target, &gravity, None);
        }
        for (k, t) in target.iter().enumerate() {
            // Gravity sags a loaded joint by its torque over the stiffness (a few mrad).
            assert!((a.q[k] - t).abs() < 0.02, "joint {k}: {}", a.q[k]);
            assert!(a.qd[k].abs() < 1e-3, "joint {k} still moving: {}", a.qd[k]);
        }
        // A target far away: the speed reached is bounded by the torque limit, not the gain.
        let mut b = arm();
        b.set_state(&[0.0; 5]);
        let far = [0.0, 0.0, 0.0, 0.0, 100.0];
        b.step(1.0 / 200.0, &far, &gravity, None);
        let m = b.mass_matrix()[(4, 4)] + 0.01;
        assert!(b.qd[4] <= 3.0 / m / 200.0 * 1.01 + 1e-9, "{}", b.qd[4]);
    }
    #[test]
    fn the_tool_stops_at_the_floor_and_passes_it_without_one() {
        let gravity = Vector3::new(0.0, 0.0, -9.81);
        // The tool centre point of the shipped arm, 9.5 cm out of the gripper's frame, and a
        // forward-reaching pose that points it down.
        let tcp = Point3::new(0.0, 0.0, 0.095);
        let q0 = [0.0, 0.6, 0.6, 1.2, 0.0];
        let mut free = arm();
        free.set_state(&q0);
        let start = free.poses()[ARM_DOF - 1] * tcp;
        // Joint targets that move the tcp 6 cm down (least-norm step on the Jacobian's z row),
        // with the floor 2 cm below where it starts.
        let (z, o, _, _) = free.frames();
        let jz = Vec5::from_fn(|k, _| z[k].cross(&(start.coords - o[k])).z);
        let dq = jz * (-0.06 / jz.norm_squared());
        let targets: [f64; ARM_DOF] = std::array::from_fn(|k| q0[k] + dq[k]);
        let floor_z = start.z - 0.02;
        let points = [tcp];
        let mut stopped = free.clone();
        let mut lowest = f64::INFINITY;
        for _ in 0..400 {
            free.step(1.0 / 200.0, &targets, &gravity, None);
            let floor = Floor {
                z: floor_z,
                points: &points,
            };
            stopped.step(1.0 / 200.0, &targets, &gravity, Some(floor));
            lowest = lowest.min((stopped.poses()[ARM_DOF - 1] * tcp).z);
        }
        let through = (free.poses()[ARM_DOF - 1] * tcp).z;
        let rests = (stopped.poses()[ARM_DOF - 1] * tcp).z;
        assert!(
            through < floor_z - 0.02,
            "without a floor: {through} vs {floor_z}"
        );
        assert!(
            lowest > floor_z - 0.002,
            "went {} m below",
            floor_z - lowest
        );
        // Pressed down by its servos, it rests on the floor, and still.
        assert!(rests < floor_z + 0.002, "{rests} vs {floor_z}");
        assert!(
            stopped.qd.iter().all(|v| v.abs() < 1e-2),
            "{:?}",
            stopped.qd
        );
    }
}
