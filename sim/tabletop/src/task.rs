//! The tasks: what is on the table, how an episode is randomised, and when it succeeded.
//!
//! Every task draws its randomisation from the episode's seed only, ends with a sparse success
//! signal (reward 1 on the success step, 0 otherwise; the episode terminates on success) and has
//! a time limit in control steps. `track` is the one whose target moves: it succeeds when the tool
//! has stayed on the moving target for [`TRACK_HOLD_TICKS`] control ticks in a row, so a policy
//! that acts on old observations falls behind it (what makes inference delay visible).

use nalgebra::{Isometry3, Translation3, UnitQuaternion, Vector3};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;
use std::fmt;
use std::str::FromStr;

/// The five tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskKind {
    /// Bring the tool centre point to a target point in the air.
    Reach,
    /// Push a cube into a target region on the table.
    Push,
    /// Grasp a cube and lift it by at least 5 cm.
    Pick,
    /// Insert a held peg into a hole with 2 mm clearance per side.
    Insert,
    /// Follow a target point that sweeps back and forth along an arc around the base at
    /// 4-6 cm/s, staying within 2 cm of it for half a second.
    Track,
}

impl TaskKind {
    /// All tasks.
    pub const ALL: [TaskKind; 5] = [
        TaskKind::Reach,
        TaskKind::Push,
        TaskKind::Pick,
        TaskKind::Insert,
        TaskKind::Track,
    ];

    /// Config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskKind::Reach => "reach",
            TaskKind::Push => "push",
            TaskKind::Pick => "pick",
            TaskKind::Insert => "insert",
            TaskKind::Track => "track",
        }
    }

    /// Default time limit, control steps at the default 20 Hz.
    pub fn default_max_steps(self) -> u32 {
        match self {
            TaskKind::Reach => 60,
            TaskKind::Push => 150,
            TaskKind::Pick => 100,
            TaskKind::Insert => 100,
            TaskKind::Track => 100,
        }
    }

    /// `true` when the task has a movable object whose pose is observed.
    pub fn has_object(self) -> bool {
        !matches!(self, TaskKind::Reach | TaskKind::Track)
    }
}

impl fmt::Display for TaskKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A task name the simulator does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown task `{0}`; allowed: reach, push, pick, insert, track")]
pub struct UnknownTask(pub String);

impl FromStr for TaskKind {
    type Err = UnknownTask;
    fn from_str(s: &str) -> Result<Self, UnknownTask> {
        TaskKind::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| UnknownTask(s.to_string()))
    }
}

/// Side of the pick/push cube, m.
pub const CUBE_SIZE_M: f64 = 0.03;
/// Cross-section side of the peg, m.
pub const PEG_SIZE_M: f64 = 0.02;
/// Length of the peg, m.
pub const PEG_LENGTH_M: f64 = 0.06;
/// Side of the square hole, m (2 mm clearance per side around the peg).
pub const HOLE_SIZE_M: f64 = 0.024;
/// Height of the hole fixture, m.
pub const HOLE_DEPTH_M: f64 = 0.03;
/// How deep the peg's bottom must be below the fixture's top for success, m.
pub const INSERT_DEPTH_M: f64 = 0.015;
/// Lift required by `pick`, m.
pub const PICK_LIFT_M: f64 = 0.05;
/// Success radius of `reach`, m.
pub const REACH_TOLERANCE_M: f64 = 0.02;
/// Control ticks in a row the tool must stay within [`REACH_TOLERANCE_M`] of `track`'s moving
/// target (half a second at the default 20 Hz).
pub const TRACK_HOLD_TICKS: u32 = 10;
/// Success radius of `push` (cube centre to goal centre, in the table plane), m.
pub const PUSH_TOLERANCE_M: f64 = 0.025;
/// Where the peg sits in the grasp: its centre lies this far beyond the tool centre point along
/// the tool's z axis (towards the fingertips): 3.5 cm of it between the finger pads, 2.5 cm below.
pub const PEG_GRASP_OFFSET_M: f64 = 0.005;

/// The randomised layout of one episode.
#[derive(Clone, Debug)]
pub struct TaskLayout {
    /// Task.
    pub kind: TaskKind,
    /// `reach`: target point; `push`: goal centre on the table; `pick`: the cube's start position
    /// raised by the required lift; `insert`: centre of the hole's opening.
    pub target: Vector3<f64>,
    /// Start pose of the object, if any.
    pub object_start: Option<Isometry3<f64>>,
    /// Start position of the tool centre point.
    pub tcp_start: Vector3<f64>,
    /// Start gripper opening, m.
    pub opening_start: f64,
    /// `track`: how the target moves (`target` is where it is now).
    pub motion: Option<TargetMotion>,
    /// `track`: control ticks in a row the tool has been on the target.
    pub on_target_ticks: u32,
}

/// `track`'s target: a point at a fixed radius and height that sweeps its bearing back and forth
/// between `-limit` and `limit` at a constant angular speed (a triangle wave in the bearing).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TargetMotion {
    /// Distance from the base axis, m.
    pub radius: f64,
    /// Height above the table, m.
    pub z: f64,
    /// Bearing at time 0, rad.
    pub bearing0: f64,
    /// Angular speed, rad/s; its sign is the first direction of travel.
    pub omega: f64,
    /// Largest bearing either side, rad.
    pub limit: f64,
}

impl TargetMotion {
    /// The target's position and velocity `t_s` seconds into the episode.
    pub fn at(&self, t_s: f64) -> (Vector3<f64>, Vector3<f64>) {
        let l = self.limit;
        // Unfold the reflections: u runs over one period of length 4l.
        let u = (self.bearing0 + self.omega * t_s + l).rem_euclid(4.0 * l);
        let (bearing, dir) = if u < 2.0 * l {
            (u - l, 1.0)
        } else {
            (3.0 * l - u, -1.0)
        };
        let w = self.omega * dir;
        let (sin, cos) = bearing.sin_cos();
        let pos = Vector3::new(self.radius * cos, self.radius * sin, self.z);
        let vel = Vector3::new(-self.radius * sin * w, self.radius * cos * w, 0.0);
        (pos, vel)
    }
}

fn uniform(rng: &mut ChaCha8Rng, lo: f64, hi: f64) -> f64 {
    lo + (hi - lo) * rng.random::<f64>()
}

/// A point on the table drawn in polar form around the arm's base (radius in m, bearing in rad),
/// which is the shape of what a top-down gripper can reach.
fn polar(rng: &mut ChaCha8Rng, r: (f64, f64), bearing: f64, z: f64) -> Vector3<f64> {
    let (rr, a) = (uniform(rng, r.0, r.1), uniform(rng, -bearing, bearing));
    Vector3::new(rr * a.cos(), rr * a.sin(), z)
}

impl TaskLayout {
    /// Draws a layout from `rng` (seeded from the episode's seed).
    pub fn sample(kind: TaskKind, rng: &mut ChaCha8Rng) -> Self {
        let home = Vector3::new(0.20, 0.0, 0.14);
        match kind {
            TaskKind::Reach => TaskLayout {
                kind,
                target: {
                    // In polar form around the base, inside what a top-down tool reaches.
                    let (r, a) = (uniform(rng, 0.14, 0.26), uniform(rng, -0.5, 0.5));
                    Vector3::new(r * a.cos(), r * a.sin(), uniform(rng, 0.03, 0.14))
                },
                object_start: None,
                tcp_start: home,
                opening_start: 0.04,
                motion: None,
                on_target_ticks: 0,
            },
            TaskKind::Track => {
                let radius = uniform(rng, 0.17, 0.23);
                let speed = uniform(rng, 0.04, 0.06);
                let limit = 0.45;
                let direction = if rng.random::<bool>() { 1.0 } else { -1.0 };
                let motion = TargetMotion {
                    radius,
                    z: uniform(rng, 0.05, 0.10),
                    bearing0: uniform(rng, -limit, limit),
                    omega: direction * speed / radius,
                    limit,
                };
                TaskLayout {
                    kind,
                    target: motion.at(0.0).0,
                    object_start: None,
                    tcp_start: home,
                    opening_start: 0.04,
                    motion: Some(motion),
                    on_target_ticks: 0,
                }
            }
            TaskKind::Push => {
                let cube = polar(rng, (0.16, 0.22), 0.4, CUBE_SIZE_M / 2.0);
                // Goal 6-10 cm away in a random direction, kept inside the reachable table area
                // (the pusher works from behind the cube, so the goal stays within 24 cm).
                let mut goal;
                loop {
                    let a = uniform(rng, -std::f64::consts::PI, std::f64::consts::PI);
                    let d = uniform(rng, 0.06, 0.10);
                    goal = cube + Vector3::new(d * a.cos(), d * a.sin(), 0.0);
                    let r = goal.xy().norm();
                    if (0.13..=0.24).contains(&r) && goal.y.atan2(goal.x).abs() <= 0.6 {
                        break;
                    }
                }
                let yaw = uniform(rng, -0.3, 0.3);
                TaskLayout {
                    kind,
                    target: goal,
                    object_start: Some(Isometry3::from_parts(
                        Translation3::from(cube),
                        UnitQuaternion::from_axis_angle(&Vector3::z_axis(), yaw),
                    )),
                    tcp_start: home,
                    opening_start: 0.0,
                    motion: None,
                    on_target_ticks: 0,
                }
            }
            TaskKind::Pick => {
                let cube = polar(rng, (0.15, 0.24), 0.45, CUBE_SIZE_M / 2.0);
                let yaw = uniform(rng, -0.2, 0.2);
                TaskLayout {
                    kind,
                    target: cube + Vector3::new(0.0, 0.0, PICK_LIFT_M),
                    object_start: Some(Isometry3::from_parts(
                        Translation3::from(cube),
                        UnitQuaternion::from_axis_angle(&Vector3::z_axis(), yaw),
                    )),
                    tcp_start: home,
                    opening_start: 0.06,
                    motion: None,
                    on_target_ticks: 0,
                }
            }
            TaskKind::Insert => {
                let hole = polar(rng, (0.16, 0.24), 0.4, HOLE_DEPTH_M);
                // Start above the table with the peg in the grasp, a few cm off the hole.
                let tcp = Vector3::new(
                    hole.x + uniform(rng, -0.04, 0.04),
                    hole.y + uniform(rng, -0.04, 0.04),
                    0.14,
                );
                TaskLayout {
                    kind,
                    target: hole,
                    object_start: None,
                    tcp_start: tcp,
                    opening_start: PEG_SIZE_M,
                    motion: None,
                    on_target_ticks: 0,
                }
            }
        }
    }

    /// Moves a moving target to where it is `t_s` seconds into the episode and counts the ticks
    /// the tool has been on it; call once per control tick, before [`TaskLayout::success`]. Does
    /// nothing for a task whose target stands still.
    pub fn advance(&mut self, t_s: f64, tcp: &Vector3<f64>) {
        if let Some(m) = self.motion {
            self.target = m.at(t_s).0;
            if (tcp - self.target).norm() < REACH_TOLERANCE_M {
                self.on_target_ticks += 1;
            } else {
                self.on_target_ticks = 0;
            }
        }
    }

    /// The target's velocity now, m/s (zero for a target that stands still).
    pub fn target_velocity(&self, t_s: f64) -> Vector3<f64> {
        self.motion.map_or_else(Vector3::zeros, |m| m.at(t_s).1)
    }

    /// Whether the task is solved in this state.
    pub fn success(&self, tcp: &Vector3<f64>, object: Option<&Isometry3<f64>>) -> bool {
        match self.kind {
            TaskKind::Reach => (tcp - self.target).norm() < REACH_TOLERANCE_M,
            TaskKind::Track => self.on_target_ticks >= TRACK_HOLD_TICKS,
            TaskKind::Push => {
                let o = object.expect("push has an object").translation.vector;
                (o.xy() - self.target.xy()).norm() < PUSH_TOLERANCE_M && o.z < CUBE_SIZE_M
            }
            TaskKind::Pick => {
                object.expect("pick has an object").translation.vector.z >= self.target.z
            }
            TaskKind::Insert => {
                let peg = object.expect("insert has a peg");
                let bottom = peg * nalgebra::Point3::new(0.0, 0.0, PEG_LENGTH_M / 2.0);
                let top = peg * nalgebra::Point3::new(0.0, 0.0, -PEG_LENGTH_M / 2.0);
                // Whichever end is lower is the one in the hole.
                let low = if bottom.z < top.z { bottom } else { top };
                low.z <= self.target.z - INSERT_DEPTH_M
                    && (low.coords.xy() - self.target.xy()).norm() < HOLE_SIZE_M / 2.0
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn the_track_target_sweeps_its_arc_at_its_speed_and_turns_at_the_limits() {
        let layout = TaskLayout::sample(TaskKind::Track, &mut ChaCha8Rng::seed_from_u64(3));
        let m = layout.motion.expect("track has a moving target");
        let (dt, mut turns) = (0.001, 0);
        let mut last_vel = m.at(0.0).1;
        for i in 0..40_000 {
            let t = i as f64 * dt;
            let (p, v) = m.at(t);
            let bearing = p.y.atan2(p.x);
            assert!(bearing.abs() <= m.limit + 1e-9, "bearing {bearing} at {t}");
            assert!((p.xy().norm() - m.radius).abs() < 1e-9 && p.z == m.z);
            assert!((v.norm() - m.omega.abs() * m.radius).abs() < 1e-9);
            // The velocity is the position's derivative (away from the turns).
            let (p2, _) = m.at(t + 1e-6);
            if v.dot(&last_vel) > 0.0 {
                assert!(((p2 - p) / 1e-6 - v).norm() < 1e-3 * v.norm() + 1e-6);
            } else {
                turns += 1;
            }
            last_vel = v;
        }
        // 40 s at 4-6 cm/s over an arc of 0.9 rad at 17-23 cm (a sweep takes at most 5.2 s).
        assert!(turns >= 4, "{turns} turns");
    }

    #[test]
    fn track_succeeds_only_after_the_tool_stays_on_the_target_for_the_hold() {
        let mut layout = TaskLayout::sample(TaskKind::Track, &mut ChaCha8Rng::seed_from_u64(5));
        let m = layout.motion.unwrap();
        for tick in 0..TRACK_HOLD_TICKS {
            let t = tick as f64 * 0.05;
            layout.advance(t, &m.at(t).0);
            assert_eq!(
                layout.success(&m.at(t).0, None),
                tick + 1 >= TRACK_HOLD_TICKS
            );
        }
        // One tick off the target starts the count again.
        layout.advance(1.0, &Vector3::zeros());
        assert!(!layout.success(&Vector3::zeros(), None));
        assert_eq!(layout.on_target_ticks, 0);
        // A target that stands still is not moved.
        let mut reach = TaskLayout::sample(TaskKind::Reach, &mut ChaCha8Rng::seed_from_u64(5));
        let before = reach.target;
        reach.advance(3.0, &Vector3::zeros());
        assert_eq!(reach.target, before);
    }
}
