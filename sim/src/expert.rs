//! Scripted experts: one state machine per task that reads only the observation (so it can drive
//! a served simulator over the bus just as well as an in-process one) and writes an action in
//! whatever action space the robot has.
//!
//! The noise knob adds Gaussian noise of `noise` x half the action range to every component; it is
//! how imperfect demonstrations are made, and how the simulated human of later stages errs.

use crate::task::{CUBE_SIZE_M, HOLE_DEPTH_M, PEG_LENGTH_M, TaskKind};
use crate::world::ArmModel;
use nalgebra::{Isometry3, Translation3, UnitQuaternion, Vector3};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use reflex_runtime::kinematics::{IkOptions, top_down, yaw_of};
use reflex_runtime::msg::{ActionKind, Observation, RobotSpec};
use std::ops::Range;

/// Why an expert cannot drive a robot.
#[derive(Debug, thiserror::Error)]
pub enum ExpertError {
    /// The robot is not one of the simulator's tasks.
    #[error(
        "robot kind `{0}` has no scripted expert (expected sim/reach, sim/push, sim/pick or sim/insert)"
    )]
    UnknownKind(String),
    /// A state field the expert needs is missing.
    #[error("robot spec lacks the state field `{0}` the scripted expert needs")]
    MissingField(String),
}

/// Where the expert wants the tool next.
#[derive(Clone, Copy, Debug)]
pub struct EeTarget {
    /// Tool centre point, base frame, m.
    pub pos: Vector3<f64>,
    /// Top-down yaw, rad (only honoured by action spaces with yaw or joints).
    pub yaw: f64,
    /// Gripper opening, m.
    pub opening: f64,
    /// Largest step towards `pos` per control step, m.
    pub max_step: f64,
}

/// The largest tool step of the experts' fast moves, m.
const FAST_STEP_M: f64 = 0.02;
/// How far ahead along its velocity the expert aims at `track`'s moving target, s.
const TRACK_LEAD_S: f64 = 0.1;

/// Where each task's state machine is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Reach has one phase: go to the target.
    Reach,
    /// Pick.
    Pick(PickPhase),
    /// Push.
    Push(PushPhase),
    /// Insert.
    Insert(InsertPhase),
}

/// The phases of `pick`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PickPhase {
    /// Above the cube, fingers open and aligned with a face pair.
    Above,
    /// Down to grasping height.
    Descend,
    /// Close until the fingers stop on the cube.
    Close,
    /// Lift to the target height.
    Lift,
}

/// The phases of `push`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PushPhase {
    /// Above the spot behind the cube, on the line to the goal.
    Behind,
    /// Down to pushing height.
    Lower,
    /// Along the line to the goal.
    Push,
}

/// The phases of `insert`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InsertPhase {
    /// Above the hole, the peg's lower tip centred on it.
    Hover,
    /// Down into the hole.
    Descend,
}

impl Phase {
    /// Where `task` starts.
    pub fn first(task: TaskKind) -> Self {
        match task {
            TaskKind::Reach | TaskKind::Track => Phase::Reach,
            TaskKind::Pick => Phase::Pick(PickPhase::Above),
            TaskKind::Push => Phase::Push(PushPhase::Behind),
            TaskKind::Insert => Phase::Insert(InsertPhase::Hover),
        }
    }
}

/// What every task reads from the observation.
struct Sensed {
    ee: Vector3<f64>,
    yaw_now: f64,
    goal: Vector3<f64>,
    opening_now: f64,
}

struct PickCtx {
    cube: Vector3<f64>,
    yaw: f64,
    grasp_z: f64,
}

struct PushCtx {
    cube: Vector3<f64>,
    dir: nalgebra::Vector2<f64>,
    behind: nalgebra::Vector2<f64>,
}

struct InsertCtx {
    bottom_z: f64,
    err: nalgebra::Vector2<f64>,
    hover: f64,
    entered: bool,
}

struct Fields {
    joint_pos: Range<usize>,
    ee_pos: Range<usize>,
    ee_quat: Range<usize>,
    object_pos: Option<Range<usize>>,
    object_quat: Option<Range<usize>>,
    target_pos: Range<usize>,
    target_vel: Option<Range<usize>>,
}

/// A scripted expert for one of the simulator's tasks.
pub struct Expert {
    task: TaskKind,
    kind: ActionKind,
    low: Vec<f32>,
    high: Vec<f32>,
    f: Fields,
    model: ArmModel,
    noise: f64,
    rng: ChaCha8Rng,
    phase: Phase,
    phase_steps: u32,
    last_opening: f64,
    start_z: f64,
    ik: IkOptions,
    resume: bool,
}

fn wrap(a: f64) -> f64 {
    let two_pi = 2.0 * std::f64::consts::PI;
    (a + std::f64::consts::PI).rem_euclid(two_pi) - std::f64::consts::PI
}

/// Yaw about z of a quaternion (xyzw) for an object resting on its face.
fn object_yaw(q: &[f32]) -> f64 {
    let r = UnitQuaternion::from_quaternion(nalgebra::Quaternion::new(
        q[3] as f64,
        q[0] as f64,
        q[1] as f64,
        q[2] as f64,
    ));
    let x = r * Vector3::x();
    x.y.atan2(x.x)
}

impl Expert {
    /// An expert for the robot described by `spec`, with action noise `noise` (0 = none) drawn
    /// from `seed`.
    pub fn new(spec: &RobotSpec, noise: f64, seed: u64) -> Result<Self, ExpertError> {
        let task = spec
            .kind
            .strip_prefix("sim/")
            .and_then(|t| t.parse::<TaskKind>().ok())
            .ok_or_else(|| ExpertError::UnknownKind(spec.kind.clone()))?;
        let need = |n: &str| {
            spec.field(n)
                .ok_or_else(|| ExpertError::MissingField(n.into()))
        };
        let f = Fields {
            joint_pos: need("joint_pos")?,
            ee_pos: need("ee_pos")?,
            ee_quat: need("ee_quat")?,
            object_pos: spec.field("object_pos"),
            object_quat: spec.field("object_quat"),
            target_pos: need("target_pos")?,
            target_vel: spec.field("target_vel"),
        };
        if task == TaskKind::Track && f.target_vel.is_none() {
            return Err(ExpertError::MissingField("target_vel".into()));
        }
        if task.has_object() && f.object_pos.is_none() {
            return Err(ExpertError::MissingField("object_pos".into()));
        }
        Ok(Expert {
            task,
            kind: spec.action.kind,
            low: spec.action.low.clone(),
            high: spec.action.high.clone(),
            f,
            model: ArmModel::so101(),
            noise,
            rng: ChaCha8Rng::seed_from_u64(seed),
            phase: Phase::first(task),
            phase_steps: 0,
            last_opening: 0.0,
            start_z: 0.0,
            resume: false,
            ik: IkOptions {
                max_iterations: 30,
                position_tolerance_m: 2e-4,
                rotation_tolerance_rad: 2e-3,
                ..Default::default()
            },
        })
    }

    /// Forgets the episode's progress (call at every reset; `act` also does it when it sees step 0).
    pub fn reset(&mut self) {
        self.phase = Phase::first(self.task);
        self.phase_steps = 0;
        self.resume = false;
    }

    /// Takes over mid-episode: the next action starts from the phase the scene is in (for `pick`,
    /// a cube already between closed fingers is lifted, not let go).
    pub fn take_over(&mut self) {
        self.reset();
        self.resume = true;
    }

    /// The phase the state machine is in.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    fn goto(&mut self, phase: Phase) {
        if self.phase != phase {
            self.phase = phase;
            self.phase_steps = 0;
        }
    }

    fn v3(obs: &Observation, r: &Range<usize>) -> Vector3<f64> {
        let s = &obs.state[r.clone()];
        Vector3::new(s[0] as f64, s[1] as f64, s[2] as f64)
    }

    /// The expert's end-effector target for this observation.
    pub fn target(&mut self, obs: &Observation) -> EeTarget {
        if obs.step == 0 {
            self.reset();
        }
        self.phase_steps += 1;
        let q = &obs.state[self.f.ee_quat.clone()];
        let ee_rot = UnitQuaternion::from_quaternion(nalgebra::Quaternion::new(
            q[3] as f64,
            q[0] as f64,
            q[1] as f64,
            q[2] as f64,
        ));
        let s = Sensed {
            ee: Self::v3(obs, &self.f.ee_pos),
            yaw_now: yaw_of(&ee_rot),
            goal: Self::v3(obs, &self.f.target_pos),
            opening_now: obs.state[self.f.joint_pos.start + 5] as f64,
        };
        match self.task {
            TaskKind::Reach => EeTarget {
                pos: s.goal,
                yaw: s.yaw_now,
                opening: 0.04,
                max_step: FAST_STEP_M,
            },
            TaskKind::Track => {
                // Aim where the target will be when the arm gets there: the servos follow a
                // command about a tenth of a second late.
                let vel = Self::v3(obs, self.f.target_vel.as_ref().expect("checked in new"));
                EeTarget {
                    pos: s.goal + vel * TRACK_LEAD_S,
                    yaw: s.yaw_now,
                    opening: 0.04,
                    max_step: FAST_STEP_M,
                }
            }
            TaskKind::Pick => self.pick(obs, &s),
            TaskKind::Push => self.push(obs, &s),
            TaskKind::Insert => self.insert(obs, &s),
        }
    }

    fn object(&self, obs: &Observation) -> Vector3<f64> {
        Self::v3(obs, self.f.object_pos.as_ref().expect("checked in new"))
    }

    fn object_quat<'a>(&self, obs: &'a Observation) -> &'a [f32] {
        &obs.state[self.f.object_quat.clone().expect("checked in new")]
    }

    /// Pick: above the cube with the fingers along a face pair, down, close, lift.
    fn pick(&mut self, obs: &Observation, s: &Sensed) -> EeTarget {
        let cube = self.object(obs);
        if std::mem::take(&mut self.resume)
            && (cube - s.ee).norm() < 0.02
            && s.opening_now < CUBE_SIZE_M + 0.005
        {
            // Already holding it: keep squeezing and lift.
            self.start_z = cube.z;
            self.goto(Phase::Pick(PickPhase::Lift));
        }
        let cube_yaw = object_yaw(self.object_quat(obs));
        // Fingers close along the tool's y axis: align it with a cube face, choosing the face pair
        // nearest to the current yaw.
        let face = wrap(cube_yaw - s.yaw_now);
        let quarter = std::f64::consts::FRAC_PI_2;
        let c = PickCtx {
            cube,
            yaw: s.yaw_now + (face - quarter * (face / quarter).round()),
            grasp_z: cube.z.max(0.012),
        };
        loop {
            if let Some(t) = self.pick_step(s, &c) {
                return t;
            }
        }
    }

    /// One phase of `pick`: the target, or `None` after moving to another phase.
    fn pick_step(&mut self, s: &Sensed, c: &PickCtx) -> Option<EeTarget> {
        let Phase::Pick(phase) = self.phase else {
            unreachable!("pick phases only")
        };
        let (ee, cube) = (s.ee, c.cube);
        let target = |pos, yaw, opening, max_step| EeTarget {
            pos,
            yaw,
            opening,
            max_step,
        };
        match phase {
            PickPhase::Above => {
                let above = Vector3::new(cube.x, cube.y, cube.z + 0.07);
                let yaw_ok = !matches!(
                    self.kind,
                    ActionKind::EeDeltaYaw | ActionKind::JointAbs | ActionKind::JointDelta
                ) || wrap(c.yaw - s.yaw_now).abs() < 0.05;
                if (ee.xy() - cube.xy()).norm() < 0.006 && (ee.z - above.z).abs() < 0.015 && yaw_ok
                {
                    return self.next(Phase::Pick(PickPhase::Descend));
                }
                Some(target(above, c.yaw, 0.06, FAST_STEP_M))
            }
            PickPhase::Descend => {
                if (ee.z - c.grasp_z).abs() < 0.005 || self.phase_steps > 20 {
                    return self.next(Phase::Pick(PickPhase::Close));
                }
                let at = Vector3::new(cube.x, cube.y, c.grasp_z);
                Some(target(at, c.yaw, 0.06, 0.015))
            }
            PickPhase::Close => {
                // Close until the fingers stop moving on the cube.
                let settled =
                    self.phase_steps > 3 && (s.opening_now - self.last_opening).abs() < 5e-4;
                self.last_opening = s.opening_now;
                if (settled && s.opening_now < CUBE_SIZE_M + 0.003) || self.phase_steps > 12 {
                    self.start_z = cube.z;
                    return self.next(Phase::Pick(PickPhase::Lift));
                }
                let at = Vector3::new(cube.x, cube.y, c.grasp_z);
                Some(target(at, c.yaw, 0.0, 0.01))
            }
            PickPhase::Lift => {
                // Lift; start over if the cube slipped out.
                if cube.z < CUBE_SIZE_M && ee.z > cube.z + 0.04 {
                    return self.next(Phase::Pick(PickPhase::Above));
                }
                let up = Vector3::new(ee.x, ee.y, s.goal.z + 0.06);
                Some(target(up, s.yaw_now, 0.0, 0.015))
            }
        }
    }

    /// Push: above the spot behind the cube, down to pushing height, push along the line to the
    /// goal.
    fn push(&mut self, obs: &Observation, s: &Sensed) -> EeTarget {
        let cube = self.object(obs);
        let to_goal = s.goal.xy() - cube.xy();
        let dist = to_goal.norm();
        let dir = if dist > 1e-6 {
            to_goal / dist
        } else {
            nalgebra::Vector2::x()
        };
        let c = PushCtx {
            cube,
            dir,
            behind: cube.xy() - dir * 0.045,
        };
        loop {
            if let Some(t) = self.push_step(s, &c) {
                return t;
            }
        }
    }

    /// One phase of `push`: the target, or `None` after moving to another phase.
    fn push_step(&mut self, s: &Sensed, c: &PushCtx) -> Option<EeTarget> {
        let Phase::Push(phase) = self.phase else {
            unreachable!("push phases only")
        };
        const PUSH_Z_M: f64 = 0.02;
        let (ee, behind) = (s.ee, c.behind);
        let target = |pos, max_step| EeTarget {
            pos,
            yaw: s.yaw_now,
            opening: 0.0,
            max_step,
        };
        match phase {
            PushPhase::Behind => {
                let above = Vector3::new(behind.x, behind.y, 0.07);
                if (ee.xy() - behind).norm() < 0.006 && (ee.z - above.z).abs() < 0.02 {
                    return self.next(Phase::Push(PushPhase::Lower));
                }
                // Travel high when far from the spot, so the tool never sweeps the cube.
                let pos = if ee.z < 0.05 && (ee.xy() - behind).norm() > 0.01 {
                    Vector3::new(ee.x, ee.y, 0.08)
                } else {
                    above
                };
                Some(target(pos, FAST_STEP_M))
            }
            PushPhase::Lower => {
                if (ee.z - PUSH_Z_M).abs() < 0.005 {
                    return self.next(Phase::Push(PushPhase::Push));
                }
                Some(target(Vector3::new(behind.x, behind.y, PUSH_Z_M), 0.015))
            }
            PushPhase::Push => {
                // Push along the line through the cube towards the goal; re-approach when the
                // tool has drifted off that line.
                let rel = ee.xy() - c.cube.xy();
                let lateral = (rel.x * c.dir.y - rel.y * c.dir.x).abs();
                if lateral > 0.012 || rel.dot(&c.dir) > 0.0 {
                    return self.next(Phase::Push(PushPhase::Behind));
                }
                let aim = s.goal.xy() - c.dir * 0.03;
                Some(target(Vector3::new(aim.x, aim.y, PUSH_Z_M), 0.008))
            }
        }
    }

    /// Insert: hover above the hole with the peg's lower tip centred on it, then descend.
    fn insert(&mut self, obs: &Observation, s: &Sensed) -> EeTarget {
        let peg = self.object(obs);
        let pq = self.object_quat(obs);
        let peg_rot = UnitQuaternion::from_quaternion(nalgebra::Quaternion::new(
            pq[3] as f64,
            pq[0] as f64,
            pq[1] as f64,
            pq[2] as f64,
        ));
        // Align the peg's lower tip, not its centre: a peg tilted by a few degrees in the grasp is
        // off by more than the clearance at its tip.
        let half = peg_rot * Vector3::new(0.0, 0.0, PEG_LENGTH_M / 2.0);
        let tip = if half.z < 0.0 { peg + half } else { peg - half };
        let c = InsertCtx {
            bottom_z: tip.z,
            err: s.goal.xy() - tip.xy(),
            hover: s.goal.z + 0.01,
            entered: tip.z < s.goal.z - 0.003,
        };
        loop {
            if let Some(t) = self.insert_step(s, &c) {
                return t;
            }
        }
    }

    /// One phase of `insert`: the target, or `None` after moving to another phase.
    fn insert_step(&mut self, s: &Sensed, c: &InsertCtx) -> Option<EeTarget> {
        let Phase::Insert(phase) = self.phase else {
            unreachable!("insert phases only")
        };
        let ee = s.ee;
        let aim = ee.xy() + c.err;
        match phase {
            InsertPhase::Hover => {
                // Hover 1 cm above the opening and centre the peg (not the tool) on it.
                if c.err.norm() < 0.0008 && (c.bottom_z - c.hover).abs() < 0.003 {
                    return self.next(Phase::Insert(InsertPhase::Descend));
                }
                // Far off: travel above the fixture first, then come down.
                let lift = if c.err.norm() > 0.005 { 0.03 } else { 0.0 };
                let z = ee.z + (c.hover + lift - c.bottom_z);
                let step = if c.err.norm() > 0.02 { 0.01 } else { 0.005 };
                Some(EeTarget {
                    pos: Vector3::new(aim.x, aim.y, z),
                    yaw: s.yaw_now,
                    opening: 0.0,
                    max_step: step,
                })
            }
            InsertPhase::Descend => {
                // Descend while centred; back off to realign if the peg drifts before it has
                // entered (after that the hole's walls guide it).
                if !c.entered && c.err.norm() > 0.0012 {
                    return self.next(Phase::Insert(InsertPhase::Hover));
                }
                let floor = ee.z + (s.goal.z - HOLE_DEPTH_M + 0.004 - c.bottom_z);
                Some(EeTarget {
                    pos: Vector3::new(aim.x, aim.y, (ee.z - 0.005).max(floor)),
                    yaw: s.yaw_now,
                    opening: 0.0,
                    max_step: 0.005,
                })
            }
        }
    }

    /// Moves to `phase`; the caller's phase loop then runs it in the same step.
    fn next(&mut self, phase: Phase) -> Option<EeTarget> {
        self.goto(phase);
        None
    }

    /// Writes the expert's action for `obs` into `out` (length = action dimension).
    pub fn act(&mut self, obs: &Observation, out: &mut [f32]) {
        let t = self.target(obs);
        let ee = Self::v3(obs, &self.f.ee_pos);
        let mut d = t.pos - ee;
        let n = d.amax();
        if n > t.max_step {
            d *= t.max_step / n;
        }
        let q = &obs.state[self.f.ee_quat.clone()];
        let ee_rot = UnitQuaternion::from_quaternion(nalgebra::Quaternion::new(
            q[3] as f64,
            q[0] as f64,
            q[1] as f64,
            q[2] as f64,
        ));
        let yaw_now = yaw_of(&ee_rot);
        match self.kind {
            ActionKind::EeDelta => {
                out[..3].copy_from_slice(&[d.x as f32, d.y as f32, d.z as f32]);
                out[3] = t.opening as f32;
            }
            ActionKind::EeDeltaYaw => {
                out[..3].copy_from_slice(&[d.x as f32, d.y as f32, d.z as f32]);
                out[3] = wrap(t.yaw - yaw_now) as f32;
                out[4] = t.opening as f32;
            }
            ActionKind::JointAbs | ActionKind::JointDelta => {
                let jp = &obs.state[self.f.joint_pos.clone()];
                let q_now = [
                    jp[0] as f64,
                    jp[1] as f64,
                    jp[2] as f64,
                    jp[3] as f64,
                    jp[4] as f64,
                ];
                let target = Isometry3::from_parts(Translation3::from(ee + d), top_down(t.yaw));
                let sol = self.model.ik_chain.ik(&target, &q_now, &self.ik);
                for i in 0..5 {
                    out[i] = if self.kind == ActionKind::JointAbs {
                        sol.q[i] as f32
                    } else {
                        (sol.q[i] - q_now[i]) as f32
                    };
                }
                out[5] = if self.kind == ActionKind::JointAbs {
                    t.opening as f32
                } else {
                    (t.opening - jp[5] as f64) as f32
                };
            }
            ActionKind::Box => unreachable!("sim robots have no box actions"),
        }
        for (i, o) in out.iter_mut().enumerate() {
            if self.noise > 0.0 {
                let half = 0.5 * (self.high[i] - self.low[i]) as f64;
                let z: f64 = StandardNormal.sample(&mut self.rng);
                *o += (self.noise * half * z) as f32;
            }
            *o = o.clamp(self.low[i], self.high[i]);
        }
    }
}

/// The scripted expert behind the loop's [`reflex_runtime::policy::Policy`] interface: each chunk
/// is the expert's action for the observation, repeated `len` times (the loop asks again after
/// one step, so a late chunk still has an action for the next tick).
pub struct ExpertPolicy {
    expert: Expert,
    dim: usize,
    len: usize,
}

impl ExpertPolicy {
    /// An expert policy for the robot described by `spec`.
    pub fn new(spec: &RobotSpec, noise: f64, seed: u64, len: usize) -> Result<Self, ExpertError> {
        Ok(ExpertPolicy {
            expert: Expert::new(spec, noise, seed)?,
            dim: spec.action.dim(),
            len: len.max(1),
        })
    }
}

impl reflex_runtime::policy::Policy for ExpertPolicy {
    fn name(&self) -> &str {
        "scripted-expert"
    }

    fn chunk_spec(&self) -> reflex_runtime::policy::ChunkSpec {
        reflex_runtime::policy::ChunkSpec {
            len: self.len,
            execute: 1,
            dim: self.dim,
        }
    }

    fn reset(&mut self) {
        self.expert.reset();
    }

    fn infer(
        &mut self,
        obs: &Observation,
        out: &mut [f32],
    ) -> Result<(), reflex_runtime::policy::PolicyError> {
        let (first, rest) = out.split_at_mut(self.dim);
        self.expert.act(obs, first);
        for chunk in rest.chunks_mut(self.dim) {
            chunk.copy_from_slice(first);
        }
        Ok(())
    }
}
