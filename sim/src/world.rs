//! The physical scene: an SO-101-like arm on a table, with the objects of a task, simulated by
//! rapier3d.
//!
//! The arm is one rapier multibody (reduced coordinates) built from `assets/so101.urdf` by
//! rapier3d-urdf. Every joint is position-controlled like a hobby servo: a motor with stiffness,
//! damping and an effort limit pulls the joint towards a target, and the target itself moves
//! towards the commanded position no faster than the servo's speed limit. The reflected rotor
//! inertia of the geared servo is modelled as joint armature, which is also what keeps the light
//! links stable at a 200 Hz physics step.

use nalgebra::{Isometry3, Point3, Quaternion, Translation3, UnitQuaternion, Vector3};
use rapier3d::prelude::*;
use rapier3d_urdf::{UrdfLoaderOptions, UrdfMultibodyOptions, UrdfRobot};
use reflex_arm_dynamics::{ArmDynamics, Floor, ServoGains};

pub use reflex_tabletop::model::{ARM_JOINTS, ARM_URDF, ArmModel, FINGER_JOINTS, NUM_ACTUATORS};

/// Collision groups, so that only contacts that matter are computed.
pub mod groups {
    use rapier3d::prelude::Group;
    /// The table top.
    pub const TABLE: Group = Group::GROUP_1;
    /// Arm links from the base to the wrist.
    pub const ARM: Group = Group::GROUP_2;
    /// Palm and fingers.
    pub const GRIPPER: Group = Group::GROUP_3;
    /// Movable objects (cube, peg).
    pub const OBJECT: Group = Group::GROUP_4;
    /// Fixed task fixtures (the hole).
    pub const FIXTURE: Group = Group::GROUP_5;
}

pub use reflex_tabletop::sim_config::{ArmSolver, ServoParams, SolverParams};

/// What a body in the scene is, for rendering and bookkeeping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The table.
    Table,
    /// An arm link.
    Link,
    /// A finger.
    Finger,
    /// The task's movable object.
    Object,
    /// A fixed fixture.
    Fixture,
}

/// One collider with what it is, for the renderer.
#[derive(Clone, Copy, Debug)]
pub struct ColliderInfo {
    /// Collider handle.
    pub handle: ColliderHandle,
    /// What it belongs to.
    pub part: Part,
    /// Colour, linear RGB 0..1.
    pub color: [f32; 3],
}

/// The simulated world of one episode. Rebuilt from scratch on every reset, so that an episode
/// depends only on its seed and actions, never on earlier episodes.
pub struct Scene {
    /// rapier world.
    pub world: PhysicsWorld,
    arm: ArmBackend,
    /// Rigid body of every URDF link, by link name.
    pub links: Vec<(String, RigidBodyHandle)>,
    /// The task's movable object, if any.
    pub object: Option<RigidBodyHandle>,
    /// Every collider, for rendering.
    pub colliders: Vec<ColliderInfo>,
    /// Servo targets in effect now (rate-limited towards `commanded`): 5 joints (rad) and the
    /// gripper opening (m).
    pub targets: [f32; NUM_ACTUATORS],
    /// Last commanded actuator positions.
    pub commanded: [f32; NUM_ACTUATORS],
    servo: ServoParams,
    efforts: [f32; 5],
    speeds: [f32; 5],
    finger: (f32, f32, f32),
}

/// The arm as rapier's multibody, or as reflex's dynamics driving kinematic links.
enum ArmBackend {
    Multibody {
        joints: [MultibodyJointHandle; 7],
        link_ids: [usize; 7],
    },
    Reflex(Box<ReflexArm>),
}

/// The arm integrated by [`ArmDynamics`], its links kinematic bodies in rapier, the fingers
/// dynamic bodies on prismatic joints to the gripper.
struct ReflexArm {
    dynamics: ArmDynamics,
    substeps: u32,
    /// Bodies of the five moving links, in joint order.
    bodies: [RigidBodyHandle; 5],
    /// Each finger's body and joint, and its joint frame in the gripper's frame and axis.
    fingers: [(
        RigidBodyHandle,
        ImpulseJointHandle,
        Isometry3<f64>,
        Vector3<f64>,
    ); 2],
    /// Finger positions (m) and velocities (m/s) measured after the last physics step.
    finger_pos: [f32; 2],
    finger_vel: [f32; 2],
    /// Corners of the gripper's collision box (gripper frame) and of each finger's (finger
    /// frame): what the table stops ([`ReflexArm::tool_points`]).
    gripper_corners: [Point3<f64>; 8],
    finger_corners: [[Point3<f64>; 8]; 2],
}

impl ReflexArm {
    /// The corners of the gripper's and the fingers' boxes in the gripper's frame, the fingers
    /// where they were measured last.
    fn tool_points(&self) -> [Point3<f64>; 24] {
        let mut out = [Point3::origin(); 24];
        out[..8].copy_from_slice(&self.gripper_corners);
        for (i, ((_, _, frame, axis), corners)) in
            self.fingers.iter().zip(&self.finger_corners).enumerate()
        {
            let at = frame * Translation3::from(axis * self.finger_pos[i] as f64);
            for (o, c) in out[8 * (i + 1)..8 * (i + 2)].iter_mut().zip(corners) {
                *o = at * c;
            }
        }
        out
    }
}

/// Height of the table's top in the world (and the arm's base) frame, m.
const TABLE_TOP_Z: f64 = 0.0;
/// Half the table's thickness, m.
const TABLE_HALF_THICKNESS_M: f64 = 0.02;

/// The eight corners of `link`'s collision box, in the link's frame.
fn box_corners(urdf: &urdf_rs::Robot, link: &str) -> [Point3<f64>; 8] {
    let l = urdf
        .links
        .iter()
        .find(|l| l.name == link)
        .expect("link in shipped URDF");
    let c = l.collision.first().expect("the shipped links have a box");
    let urdf_rs::Geometry::Box { size } = &c.geometry else {
        panic!("link `{link}`'s collision is not a box")
    };
    let origin = reflex_runtime::kinematics::urdf_pose(&c.origin);
    std::array::from_fn(|k| {
        let sign = |bit: usize| if k & (1 << bit) == 0 { -0.5 } else { 0.5 };
        origin * Point3::new(sign(0) * size[0], sign(1) * size[1], sign(2) * size[2])
    })
}

/// Converts a rapier pose to nalgebra (f64).
pub fn to_iso(p: &Pose) -> Isometry3<f64> {
    let t = p.translation;
    let r = p.rotation;
    Isometry3::from_parts(
        Translation3::new(t.x as f64, t.y as f64, t.z as f64),
        UnitQuaternion::from_quaternion(Quaternion::new(
            r.w as f64, r.x as f64, r.y as f64, r.z as f64,
        )),
    )
}

/// Converts a nalgebra pose to rapier's.
pub fn to_pose(p: &Isometry3<f64>) -> Pose {
    let t = p.translation.vector;
    let q = p.rotation.quaternion();
    Pose::from_parts(
        Vector::new(t.x as f32, t.y as f32, t.z as f32),
        Rotation::from_xyzw(q.i as f32, q.j as f32, q.k as f32, q.w as f32),
    )
}

/// A movable or fixed box to add to the scene.
#[derive(Clone, Copy, Debug)]
pub struct BoxSpec {
    /// Half extents, m.
    pub half: [f32; 3],
    /// Pose in the base frame.
    pub pose: Isometry3<f64>,
    /// Mass, kg (ignored for fixed boxes).
    pub mass: f32,
    /// Friction coefficient.
    pub friction: f32,
    /// Colour.
    pub color: [f32; 3],
}

impl Scene {
    /// Builds the table and the arm at joint positions `q` (5 joints, rad) with the gripper at
    /// `opening` (m), and the servo targets equal to that state.
    pub fn new(
        model: &ArmModel,
        servo: &ServoParams,
        solver: &SolverParams,
        physics_dt: f32,
        q: &[f64; 5],
        opening: f32,
    ) -> Self {
        let mut world = physics_world(solver, physics_dt);
        let mut colliders = Vec::new();
        insert_table(&mut world, &mut colliders);
        let (links, arm) = match solver.arm {
            ArmSolver::Rapier => {
                let (links, joints) = insert_arm(&mut world, &mut colliders);
                let link_ids = joints.map(|h| world.multibody_joints.get(h).expect("arm joint").1);
                (links, ArmBackend::Multibody { joints, link_ids })
            }
            ArmSolver::Reflex => {
                let (links, arm) =
                    insert_reflex_arm(&mut world, &mut colliders, model, servo, solver);
                (links, ArmBackend::Reflex(Box::new(arm)))
            }
        };
        let mut targets = [0.0; NUM_ACTUATORS];
        for i in 0..5 {
            targets[i] = q[i] as f32;
        }
        targets[5] = opening;
        let mut scene = Scene {
            world,
            arm,
            links,
            object: None,
            colliders,
            targets,
            commanded: targets,
            servo: servo.clone(),
            efforts: model.efforts,
            speeds: model.speeds,
            finger: (model.finger_max_m, model.finger_effort, model.finger_speed),
        };
        scene.place_arm(&targets);
        scene.configure_motors();
        scene
    }

    /// Sets the arm's joint coordinates directly (used at reset only; physics does the rest).
    fn place_arm(&mut self, pos: &[f32; NUM_ACTUATORS]) {
        let PhysicsWorld {
            multibody_joints,
            bodies,
            ..
        } = &mut self.world;
        match &mut self.arm {
            ArmBackend::Multibody { joints, link_ids } => {
                let (mb, _) = multibody_joints.get_mut(joints[0]).expect("arm multibody");
                let mut disp = vec![0.0; mb.ndofs()];
                for k in 0..7 {
                    let value = if k < 5 { pos[k] } else { 0.5 * pos[5] };
                    let link = mb.link(link_ids[k]).expect("arm link");
                    disp[link.assembly_id()] = value;
                }
                mb.apply_displacements(&disp);
                mb.forward_kinematics(bodies, false);
                mb.update_rigid_bodies(bodies, false);
            }
            ArmBackend::Reflex(arm) => {
                let q = std::array::from_fn(|k| pos[k] as f64);
                arm.dynamics.set_state(&q);
                for (h, pose) in arm.bodies.iter().zip(arm.dynamics.poses()) {
                    bodies[*h].set_position(to_pose(pose), true);
                }
                let gripper = arm.dynamics.poses()[4];
                for (i, (h, _, frame, axis)) in arm.fingers.iter().enumerate() {
                    let d = 0.5 * pos[5] as f64;
                    let p = gripper * frame * Translation3::from(axis * d);
                    let b = &mut bodies[*h];
                    b.set_position(to_pose(&p), true);
                    b.set_linvel(Vector::ZERO, true);
                    b.set_angvel(Vector::ZERO, true);
                    arm.finger_pos[i] = d as f32;
                    arm.finger_vel[i] = 0.0;
                }
            }
        }
    }

    /// The finger joints' motors (both backends) and the multibody's armature.
    fn configure_motors(&mut self) {
        let (kp, kd, max) = (
            self.servo.finger_stiffness,
            self.servo.finger_damping,
            self.finger.1,
        );
        let target = 0.5 * self.targets[5];
        let (mb, link_ids) = match &self.arm {
            ArmBackend::Reflex(arm) => {
                for (_, j, _, _) in &arm.fingers {
                    let data = finger_joint(&mut self.world, *j);
                    data.set_motor_model(JointAxis::LinX, MotorModel::ForceBased);
                    data.set_motor_position(JointAxis::LinX, target, kp, kd);
                    data.set_motor_max_force(JointAxis::LinX, max);
                }
                return;
            }
            ArmBackend::Multibody { joints, link_ids } => (
                self.world
                    .multibody_joints
                    .get_mut(joints[0])
                    .expect("arm multibody")
                    .0,
                *link_ids,
            ),
        };
        for (k, id) in link_ids.iter().enumerate() {
            let arm = k < 5;
            let link = mb.link_mut(*id).expect("arm link");
            let axis = if arm {
                JointAxis::AngX
            } else {
                JointAxis::LinX
            };
            let (kp, kd, max) = if arm {
                (self.servo.stiffness, self.servo.damping, self.efforts[k])
            } else {
                (kp, kd, max)
            };
            let target = if arm { self.targets[k] } else { target };
            link.joint
                .data
                .set_motor_model(axis, MotorModel::ForceBased);
            link.joint.data.set_motor_position(axis, target, kp, kd);
            link.joint.data.set_motor_max_force(axis, max);
        }
        let armature = self.servo.armature;
        let dofs: Vec<(usize, bool)> = (0..7)
            .map(|k| (mb.link(link_ids[k]).expect("arm link").assembly_id(), k < 5))
            .collect();
        let arm_armature = mb.armature_mut();
        for (dof, arm) in dofs {
            // Fingers: a lead-screw-like reflected mass, small next to the arm joints.
            arm_armature[dof] = if arm { armature } else { FINGER_ARMATURE_KG };
        }
    }

    /// Adds a dynamic box (a task object) and remembers it as the scene's object.
    pub fn add_object(&mut self, b: &BoxSpec) -> RigidBodyHandle {
        let body = self
            .world
            .bodies
            .insert(RigidBodyBuilder::dynamic().pose(to_pose(&b.pose)));
        let h = self.world.colliders.insert_with_parent(
            ColliderBuilder::cuboid(b.half[0], b.half[1], b.half[2])
                .mass(b.mass)
                .friction(b.friction)
                .collision_groups(InteractionGroups::new(
                    groups::OBJECT,
                    Group::ALL,
                    InteractionTestMode::And,
                )),
            body,
            &mut self.world.bodies,
        );
        self.colliders.push(ColliderInfo {
            handle: h,
            part: Part::Object,
            color: b.color,
        });
        self.object = Some(body);
        body
    }

    /// Adds fixed boxes forming one fixture.
    pub fn add_fixture(&mut self, boxes: &[BoxSpec]) {
        let body = self.world.bodies.insert(RigidBodyBuilder::fixed());
        for b in boxes {
            let h = self.world.colliders.insert_with_parent(
                ColliderBuilder::cuboid(b.half[0], b.half[1], b.half[2])
                    .position(to_pose(&b.pose))
                    .friction(b.friction)
                    .collision_groups(InteractionGroups::new(
                        groups::FIXTURE,
                        groups::OBJECT | groups::GRIPPER | groups::ARM,
                        InteractionTestMode::And,
                    )),
                body,
                &mut self.world.bodies,
            );
            self.colliders.push(ColliderInfo {
                handle: h,
                part: Part::Fixture,
                color: b.color,
            });
        }
    }

    /// Sets new commanded actuator positions (5 joints in rad, gripper opening in m), clamped to
    /// the joint limits by the caller.
    pub fn command(&mut self, cmd: &[f32; NUM_ACTUATORS]) {
        self.commanded = *cmd;
    }

    /// Advances physics by one step of `dt`, moving the servo targets towards the commanded
    /// positions within the speed limits.
    pub fn step_physics(&mut self) {
        let dt = self.world.integration_parameters.dt;
        match &mut self.arm {
            ArmBackend::Multibody { joints, link_ids } => {
                self.targets = rate_limited(
                    &self.targets,
                    &self.commanded,
                    &self.speeds,
                    self.finger.2,
                    dt,
                );
                let (mb, _) = self
                    .world
                    .multibody_joints
                    .get_mut(joints[0])
                    .expect("arm multibody");
                for (k, id) in link_ids.iter().enumerate() {
                    let arm = k < 5;
                    let link = mb.link_mut(*id).expect("arm link");
                    let (axis, target, kp, kd) = if arm {
                        (
                            JointAxis::AngX,
                            self.targets[k],
                            self.servo.stiffness,
                            self.servo.damping,
                        )
                    } else {
                        (
                            JointAxis::LinX,
                            0.5 * self.targets[5],
                            self.servo.finger_stiffness,
                            self.servo.finger_damping,
                        )
                    };
                    link.joint.data.set_motor_position(axis, target, kp, kd);
                }
                self.world.step();
            }
            ArmBackend::Reflex(arm) => {
                // The arm first, in substeps, its targets moving within the speed limits; then
                // rapier sweeps the links to where it ended and moves the fingers and objects.
                let h = dt / arm.substeps as f32;
                let g = self.world.gravity;
                let gravity = nalgebra::Vector3::new(g.x as f64, g.y as f64, g.z as f64);
                let tool = arm.tool_points();
                let floor = Floor {
                    z: TABLE_TOP_Z,
                    points: &tool,
                };
                for _ in 0..arm.substeps {
                    self.targets = rate_limited(
                        &self.targets,
                        &self.commanded,
                        &self.speeds,
                        self.finger.2,
                        h,
                    );
                    let t = std::array::from_fn(|k| self.targets[k] as f64);
                    arm.dynamics.step(h as f64, &t, &gravity, Some(floor));
                }
                for (b, pose) in arm.bodies.iter().zip(arm.dynamics.poses()) {
                    self.world.bodies[*b].set_next_kinematic_position(to_pose(pose));
                }
                let (kp, kd) = (self.servo.finger_stiffness, self.servo.finger_damping);
                for (_, j, _, _) in &arm.fingers {
                    finger_joint(&mut self.world, *j).set_motor_position(
                        JointAxis::LinX,
                        0.5 * self.targets[5],
                        kp,
                        kd,
                    );
                }
                self.world.step();
                let gripper = arm.dynamics.poses()[4].inverse();
                for (i, (h, _, frame, axis)) in arm.fingers.iter().enumerate() {
                    let p = gripper * to_iso(self.world.bodies[*h].position());
                    let d = (p.translation.vector - frame.translation.vector).dot(axis) as f32;
                    arm.finger_vel[i] = (d - arm.finger_pos[i]) / dt;
                    arm.finger_pos[i] = d;
                }
            }
        }
    }

    /// Measured joint positions: five arm joints (rad) and the gripper opening (m).
    pub fn joint_positions(&self) -> [f32; NUM_ACTUATORS] {
        self.measure(
            |mb, link, revolute| {
                let j = mb.link(link).expect("arm link").joint();
                // A revolute joint's angle is its fourth coordinate, a prismatic's offset its first.
                j.coords()[if revolute { 3 } else { 0 }]
            },
            |arm| (arm.dynamics.q, arm.finger_pos),
        )
    }

    /// Measured joint velocities: five arm joints (rad/s) and the gripper opening rate (m/s).
    pub fn joint_velocities(&self) -> [f32; NUM_ACTUATORS] {
        self.measure(
            |mb, link, _| mb.joint_velocity(mb.link(link).expect("arm link"))[0],
            |arm| (arm.dynamics.qd, arm.finger_vel),
        )
    }

    /// Five arm joints, then the two fingers summed into the gripper opening, read per multibody
    /// link by `multibody` (given whether the link's joint is revolute) or from reflex's arm and
    /// fingers by `reflex`.
    fn measure(
        &self,
        multibody: impl Fn(&Multibody, usize, bool) -> f32,
        reflex: impl Fn(&ReflexArm) -> ([f64; 5], [f32; 2]),
    ) -> [f32; NUM_ACTUATORS] {
        let mut out = [0.0; NUM_ACTUATORS];
        let (arm, fingers) = match &self.arm {
            ArmBackend::Multibody { joints, link_ids } => {
                let (mb, _) = self
                    .world
                    .multibody_joints
                    .get(joints[0])
                    .expect("arm multibody");
                let v: [f32; 7] = std::array::from_fn(|k| multibody(mb, link_ids[k], k < 5));
                (std::array::from_fn(|k| v[k] as f64), [v[5], v[6]])
            }
            ArmBackend::Reflex(arm) => reflex(arm),
        };
        for (o, v) in out.iter_mut().zip(arm) {
            *o = v as f32;
        }
        out[5] = fingers[0] + fingers[1];
        out
    }

    /// Pose of a rigid body in the base frame.
    pub fn body_pose(&self, h: RigidBodyHandle) -> Isometry3<f64> {
        to_iso(self.world.bodies[h].position())
    }

    /// Pose of a URDF link in the base frame.
    pub fn link_pose(&self, name: &str) -> Option<Isometry3<f64>> {
        self.links
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, h)| self.body_pose(*h))
    }

    /// Linear velocity of a body, m/s.
    pub fn body_linvel(&self, h: RigidBodyHandle) -> Vector3<f64> {
        let v = self.world.bodies[h].linvel();
        Vector3::new(v.x as f64, v.y as f64, v.z as f64)
    }

    /// `true` while both fingers touch the object.
    pub fn object_grasped(&self) -> bool {
        let Some(obj) = self.object else { return false };
        let obj_colliders = self.world.bodies[obj].colliders();
        let mut touching = [false; 2];
        for (i, name) in FINGER_JOINTS.iter().enumerate() {
            let Some((_, fh)) = self.links.iter().find(|(n, _)| n == name) else {
                continue;
            };
            for fc in self.world.bodies[*fh].colliders() {
                for oc in obj_colliders {
                    if let Some(pair) = self.world.narrow_phase.contact_pair(*fc, *oc)
                        && pair.has_any_active_contact()
                    {
                        touching[i] = true;
                    }
                }
            }
        }
        touching[0] && touching[1]
    }
}

/// Reflected mass of each finger's lead-screw-like drive, kg: small next to the arm joints' rotor
/// inertia, and what keeps the light fingers stable against a contact.
const FINGER_ARMATURE_KG: f32 = 0.05;

/// A finger's prismatic joint (reflex's arm), to set its motor.
fn finger_joint(world: &mut PhysicsWorld, j: ImpulseJointHandle) -> &mut GenericJoint {
    &mut world
        .impulse_joints
        .get_mut(j, false)
        .expect("finger joint")
        .data
}

/// Servo targets moved towards `commanded` by at most the speed limits over `dt`.
fn rate_limited(
    targets: &[f32; NUM_ACTUATORS],
    commanded: &[f32; NUM_ACTUATORS],
    speeds: &[f32; 5],
    finger_speed: f32,
    dt: f32,
) -> [f32; NUM_ACTUATORS] {
    std::array::from_fn(|k| {
        let vmax = if k < 5 { speeds[k] } else { 2.0 * finger_speed };
        targets[k] + (commanded[k] - targets[k]).clamp(-vmax * dt, vmax * dt)
    })
}

/// The physics world with reflex's solver settings.
fn physics_world(solver: &SolverParams, physics_dt: f32) -> PhysicsWorld {
    let mut world = PhysicsWorld::new();
    world.gravity = Vector::new(0.0, 0.0, -9.81);
    world.integration_parameters.dt = physics_dt;
    world.integration_parameters.num_solver_iterations = solver.iterations;
    // rapier's default speculative margin is 2 cm; at the hole's 2 mm clearance it produces
    // ghost contacts on the rim that hold an aligned peg up (pinned by
    // `aligned_peg_drops_into_the_hole`).
    world.integration_parameters.normalized_prediction_distance = solver.prediction_distance_m;
    world
        .integration_parameters
        .contact_softness
        .natural_frequency = solver.contact_hz;
    world.integration_parameters.num_internal_pgs_iterations = solver.pgs_iterations;
    world
        .integration_parameters
        .num_internal_stabilization_iterations = solver.stabilization_iterations;
    world.integration_parameters.warmstart_joints = solver.warmstart_joints;
    // rapier runs CCD with `max_ccd_substeps` >= 1 and skips it at 0.
    world.integration_parameters.max_ccd_substeps = usize::from(solver.ccd);
    world
}

/// The table: its top surface at z = 0.
fn insert_table(world: &mut PhysicsWorld, colliders: &mut Vec<ColliderInfo>) {
    let table = world
        .bodies
        .insert(RigidBodyBuilder::fixed().translation(Vector::new(
            0.2,
            0.0,
            (TABLE_TOP_Z - TABLE_HALF_THICKNESS_M) as f32,
        )));
    let h = world.colliders.insert_with_parent(
        ColliderBuilder::cuboid(0.45, 0.45, TABLE_HALF_THICKNESS_M as f32)
            .friction(0.8)
            .collision_groups(InteractionGroups::new(
                groups::TABLE,
                groups::GRIPPER | groups::OBJECT,
                InteractionTestMode::And,
            )),
        table,
        &mut world.bodies,
    );
    colliders.push(ColliderInfo {
        handle: h,
        part: Part::Table,
        color: [0.55, 0.45, 0.35],
    });
}

/// What a link of the arm collides with, and how it is drawn.
fn link_groups(name: &str) -> (Part, InteractionGroups, [f32; 3]) {
    let gripper = InteractionGroups::new(
        groups::GRIPPER,
        groups::TABLE | groups::OBJECT | groups::FIXTURE,
        InteractionTestMode::And,
    );
    match name {
        "finger_left" | "finger_right" => (Part::Finger, gripper, [0.15, 0.15, 0.15]),
        "gripper" => (Part::Link, gripper, [0.95, 0.78, 0.15]),
        _ => (
            Part::Link,
            InteractionGroups::new(
                groups::ARM,
                groups::OBJECT | groups::FIXTURE,
                InteractionTestMode::And,
            ),
            [0.95, 0.78, 0.15],
        ),
    }
}

/// The shipped arm as rapier bodies, colliders and joints, with each link's and joint's URDF
/// name: built from the URDF once per process and copied into every episode's world (an
/// episode's scene is rebuilt at every reset, and parsing the URDF was a few per cent of the
/// simulator's time).
struct ArmBlueprint {
    robot: UrdfRobot,
    link_names: Vec<String>,
    joint_names: Vec<String>,
}

fn arm_blueprint() -> &'static ArmBlueprint {
    static ARM: std::sync::OnceLock<ArmBlueprint> = std::sync::OnceLock::new();
    ARM.get_or_init(|| {
        let options = UrdfLoaderOptions {
            make_roots_fixed: true,
            rigid_body_blueprint: RigidBodyBuilder::dynamic().can_sleep(false),
            collider_blueprint: ColliderBuilder::default().density(0.0).friction(1.2),
            ..Default::default()
        };
        let (robot, urdf) = UrdfRobot::from_str(ARM_URDF, options, std::path::Path::new("."))
            .expect("shipped URDF loads");
        // The loader drops frame-only links (the `tcp`), so map its elements back by index.
        let link_names = robot
            .links
            .iter()
            .map(|l| urdf.links[l.urdf_link_index].name.clone())
            .collect();
        let joint_names = robot
            .joints
            .iter()
            .map(|j| urdf.joints[j.urdf_joint_index].name.clone())
            .collect();
        ArmBlueprint {
            robot,
            link_names,
            joint_names,
        }
    })
}

/// The arm from the shipped URDF as a multibody; returns its links and its actuated joints
/// (five arm joints, then the two fingers).
fn insert_arm(
    world: &mut PhysicsWorld,
    colliders: &mut Vec<ColliderInfo>,
) -> (Vec<(String, RigidBodyHandle)>, [MultibodyJointHandle; 7]) {
    let arm = arm_blueprint();
    let (link_names, joint_names) = (arm.link_names.clone(), &arm.joint_names);
    let handles = arm.robot.clone().insert_using_multibody_joints(
        &mut world.bodies,
        &mut world.colliders,
        &mut world.multibody_joints,
        UrdfMultibodyOptions::DISABLE_SELF_CONTACTS,
    );
    let links = register_links(world, colliders, &handles.links, &link_names);
    let joint_of = |name: &str| -> MultibodyJointHandle {
        let i = joint_names
            .iter()
            .position(|n| n == name)
            .expect("joint in shipped URDF");
        handles.joints[i]
            .joint
            .expect("movable joint inserted as a multibody joint")
    };
    let joints = [
        joint_of(ARM_JOINTS[0]),
        joint_of(ARM_JOINTS[1]),
        joint_of(ARM_JOINTS[2]),
        joint_of(ARM_JOINTS[3]),
        joint_of(ARM_JOINTS[4]),
        joint_of(FINGER_JOINTS[0]),
        joint_of(FINGER_JOINTS[1]),
    ];
    (links, joints)
}

/// Gives every inserted link's colliders their collision groups, lists them for the renderer, and
/// returns each link's body by URDF name.
fn register_links(
    world: &mut PhysicsWorld,
    colliders: &mut Vec<ColliderInfo>,
    inserted: &[rapier3d_urdf::UrdfLinkHandle],
    names: &[String],
) -> Vec<(String, RigidBodyHandle)> {
    let mut links = Vec::new();
    for (link, name) in inserted.iter().zip(names) {
        let (part, groups, color) = link_groups(name);
        for c in &link.colliders {
            if let Some(col) = world.colliders.get_mut(c.handle) {
                col.set_collision_groups(groups);
            }
            colliders.push(ColliderInfo {
                handle: c.handle,
                part,
                color,
            });
        }
        links.push((name.clone(), link.body));
    }
    links
}

/// The arm for [`ArmSolver::Reflex`]: the five moving links kinematic bodies (reflex's
/// [`ArmDynamics`] moves them), the fingers dynamic bodies on the URDF's prismatic joints to the
/// gripper, with the same motors as the multibody's.
fn insert_reflex_arm(
    world: &mut PhysicsWorld,
    colliders: &mut Vec<ColliderInfo>,
    model: &ArmModel,
    servo: &ServoParams,
    solver: &SolverParams,
) -> (Vec<(String, RigidBodyHandle)>, ReflexArm) {
    let blueprint = arm_blueprint();
    let mut robot = blueprint.robot.clone();
    for (link, name) in robot.links.iter_mut().zip(&blueprint.link_names) {
        if FINGER_JOINTS.contains(&name.as_str()) {
            // The finger's drive: its reflected mass moves with it along the joint.
            link.body.set_additional_mass(FINGER_ARMATURE_KG, false);
        } else if name != "base" {
            link.body
                .set_body_type(RigidBodyType::KinematicPositionBased, false);
        }
    }
    let finger_joint_names: Vec<&String> = blueprint
        .joint_names
        .iter()
        .filter(|n| FINGER_JOINTS.contains(&n.as_str()))
        .collect();
    robot.joints = robot
        .joints
        .into_iter()
        .zip(&blueprint.joint_names)
        .filter(|(_, n)| FINGER_JOINTS.contains(&n.as_str()))
        .map(|(j, _)| j)
        .collect();
    let handles = robot.insert_using_impulse_joints(
        &mut world.bodies,
        &mut world.colliders,
        &mut world.impulse_joints,
    );
    let links = register_links(world, colliders, &handles.links, &blueprint.link_names);
    let body_of = |link: &str| -> RigidBodyHandle {
        links
            .iter()
            .find(|(n, _)| n == link)
            .expect("link in shipped URDF")
            .1
    };
    let urdf_joint = |name: &str| {
        model
            .urdf
            .joints
            .iter()
            .find(|j| j.name == name)
            .expect("joint in shipped URDF")
    };
    let bodies = ARM_JOINTS.map(|j| body_of(&urdf_joint(j).child.link));
    let fingers = FINGER_JOINTS.map(|name| {
        let j = urdf_joint(name);
        let k = finger_joint_names
            .iter()
            .position(|n| n.as_str() == name)
            .expect("finger joint inserted");
        let axis = Vector3::new(j.axis.xyz[0], j.axis.xyz[1], j.axis.xyz[2]).normalize();
        (
            body_of(&j.child.link),
            handles.joints[k].joint,
            reflex_runtime::kinematics::urdf_pose(&j.origin),
            axis,
        )
    });
    // The arm carries the fingers: their mass is lumped into the gripper at half travel.
    let lumped: Vec<(&str, Isometry3<f64>)> = fingers
        .iter()
        .zip(FINGER_JOINTS)
        .map(|((_, _, frame, axis), name)| {
            let d = 0.5 * model.finger_max_m as f64;
            (name, frame * Translation3::from(axis * d))
        })
        .collect();
    let gains = ServoGains {
        kp: servo.stiffness as f64,
        kd: servo.damping as f64,
        armature: servo.armature as f64,
        efforts: model.efforts.map(f64::from),
        limits: model.limits,
    };
    let dynamics = ArmDynamics::from_urdf(&model.urdf, &ARM_JOINTS, &lumped, gains)
        .expect("the shipped URDF has the arm's five revolute joints");
    let arm = ReflexArm {
        dynamics,
        substeps: solver.arm_substeps,
        bodies,
        fingers,
        finger_pos: [0.0; 2],
        finger_vel: [0.0; 2],
        gripper_corners: box_corners(&model.urdf, "gripper"),
        finger_corners: FINGER_JOINTS.map(|name| box_corners(&model.urdf, name)),
    };
    (links, arm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::{HOLE_DEPTH_M, PEG_LENGTH_M, TaskKind, TaskLayout};
    use rand::SeedableRng;

    fn scene() -> (ArmModel, Scene) {
        let model = ArmModel::so101();
        let s = Scene::new(
            &model,
            &ServoParams::default(),
            &SolverParams::default(),
            1.0 / 100.0,
            &[0.0; 5],
            0.04,
        );
        (model, s)
    }

    #[test]
    fn urdf_fk_matches_rapier_link_poses() {
        // Regression guard: the shared kinematics and the physics must agree on what a joint
        // vector means, or IK actions would land somewhere else than the simulator puts the arm.
        for solver in [SolverParams::multibody(), SolverParams::default()] {
            fk_matches(&solver);
        }
    }

    fn fk_matches(solver: &SolverParams) {
        let model = ArmModel::so101();
        let q = [0.3, -0.4, 0.5, 0.6, -0.7];
        let s = Scene::new(
            &model,
            &ServoParams::default(),
            solver,
            1.0 / 200.0,
            &q,
            0.04,
        );
        let mut poses = [Isometry3::identity(); 5];
        model.chain.link_poses(&q, &mut poses);
        for (i, j) in model.chain.joints().iter().enumerate() {
            let rapier = s.link_pose(&j.child_link).unwrap();
            let d = (rapier.translation.vector - poses[i].translation.vector).norm();
            let a = rapier.rotation.angle_to(&poses[i].rotation);
            assert!(d < 1e-5 && a < 1e-4, "{}: {d} m, {a} rad", j.child_link);
        }
        let measured = s.joint_positions();
        for i in 0..5 {
            assert!((measured[i] as f64 - q[i]).abs() < 1e-6);
        }
        assert!((measured[5] - 0.04).abs() < 1e-6);
    }

    /// The arm at `start` (gripper open 3 cm) at 200 Hz under rapier's multibody and under
    /// reflex's arm, both commanded to `goal`.
    fn both_solvers(model: &ArmModel, start: &[f64; 5], goal: &[f32; NUM_ACTUATORS]) -> [Scene; 2] {
        [SolverParams::multibody(), SolverParams::default()].map(|solver| {
            let mut s = Scene::new(
                model,
                &ServoParams::default(),
                &solver,
                1.0 / 200.0,
                start,
                0.03,
            );
            s.command(goal);
            s
        })
    }

    #[test]
    fn both_arm_solvers_move_the_arm_alike_through_a_servo_step() {
        // reflex's arm dynamics and rapier's multibody model the same URDF, servos and armature:
        // through a large step of every joint in free space they must trace the same motion (the
        // multibody carries the fingers as moving bodies, reflex lumps them into the gripper, and
        // the two integrate at 200 Hz with different implicit schemes: 0.011 rad apart at worst
        // when written, against moves of 0.3 to 0.8 rad).
        let model = ArmModel::so101();
        let start = [0.0, 0.2, -0.3, 0.4, 0.0];
        let goal: [f32; NUM_ACTUATORS] = [0.6, -0.4, 0.5, -0.4, 0.8, 0.03];
        let mut scenes = both_solvers(&model, &start, &goal);
        let mut worst = 0.0f32;
        for step in 1..=200 {
            for s in &mut scenes {
                s.step_physics();
            }
            let (a, b) = (scenes[0].joint_positions(), scenes[1].joint_positions());
            for k in 0..5 {
                worst = worst.max((a[k] - b[k]).abs());
            }
            if step == 200 {
                for k in 0..5 {
                    assert!((a[k] - goal[k]).abs() < 0.02 && (b[k] - goal[k]).abs() < 0.02);
                }
            }
        }
        assert!(worst < 0.02, "the two arms drift {worst} rad apart");
    }

    #[test]
    fn both_arm_solvers_stop_the_tool_at_the_table() {
        // A top-down tool sent 3 cm below the table's top: rapier's multibody is stopped by the
        // contacts of its gripper and fingers, reflex's arm by its floor (the corners of the same
        // collision boxes). Both must rest with the fingertips (1 cm past the tool centre point)
        // on the table, within a few millimetres of each other (16.8 and 12.5 mm when written:
        // rapier's soft contacts hold the multibody's fingers a little above the plane).
        use reflex_runtime::kinematics::{IkOptions, top_down};
        let model = ArmModel::so101();
        let ik = |z: f64| {
            let target = Isometry3::from_parts(Translation3::new(0.25, 0.0, z), top_down(0.0));
            let q = model
                .ik_chain
                .ik(&target, &[0.0, 0.3, 0.3, 1.0, 0.0], &IkOptions::default())
                .q;
            [q[0], q[1], q[2], q[3], q[4]]
        };
        let start = ik(0.06);
        let below = ik(-0.03);
        let goal: [f32; NUM_ACTUATORS] =
            std::array::from_fn(|k| if k < 5 { below[k] as f32 } else { 0.03 });
        let rest = both_solvers(&model, &start, &goal).map(|mut s| {
            for _ in 0..200 {
                s.step_physics();
            }
            let q = s.joint_positions().map(f64::from);
            model.chain.fk(&q[..5]).translation.z
        });
        for z in rest {
            assert!((0.005..0.02).contains(&z), "tool centre at {z} m: {rest:?}");
        }
        assert!((rest[0] - rest[1]).abs() < 0.006, "{rest:?}");
    }

    #[test]
    fn aligned_peg_drops_into_the_hole() {
        // Regression: with rapier's default 2 cm speculative margin, contacts generated on the
        // hole's rim held a peg 1 mm off centre at the top of the hole, so no insertion could ever
        // succeed. The solver now uses a 2 mm margin.
        let (_, mut s) = scene();
        let mut layout = TaskLayout::sample(
            TaskKind::Insert,
            &mut rand_chacha::ChaCha8Rng::seed_from_u64(1),
        );
        let tcp = Isometry3::translation(0.0, 0.3, 0.5); // far away: only the fixture matters
        crate::task::populate(&mut layout, &mut s, &tcp);
        let h = s.object.unwrap();
        let c = layout.target;
        let start = Isometry3::translation(
            c.x + 0.001,
            c.y - 0.001,
            HOLE_DEPTH_M + PEG_LENGTH_M / 2.0 + 0.005,
        );
        s.world.bodies[h].set_position(to_pose(&start), true);
        for _ in 0..200 {
            s.step_physics();
        }
        let z = s.body_pose(h).translation.z;
        assert!(z < PEG_LENGTH_M / 2.0 + 0.002, "peg stuck at z = {z}");
    }
}
