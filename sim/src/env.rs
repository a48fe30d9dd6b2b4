//! [`SimEnv`]: the simulator as a [`Robot`].

use crate::camera::{CameraRig, Renderer};
use crate::config::{SimConfig, StateView};
use crate::task::{TaskKind, TaskLayout};
use crate::world::{ArmModel, NUM_ACTUATORS, Scene};
use nalgebra::{Isometry3, Translation3, Vector3};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use reflex_runtime::config::Validate;
use reflex_runtime::kinematics::{IkOptions, top_down, yaw_of};
use reflex_runtime::msg::{ActionKind, Observation, PROTOCOL_VERSION, RobotSpec};
use reflex_runtime::robot::{Robot, RobotError, check_action};
use std::sync::Arc;

pub use reflex_tabletop::spec::{
    ARM_STATE_LEN, HOME_YAW, WORKSPACE_MAX, WORKSPACE_MIN, action_space, arm_state_fields,
    robot_spec, scene, state_fields,
};

/// Errors creating a simulator.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The configuration is out of range.
    #[error("sim config: key `{}` = {} is out of range; allowed: {}", .0.key, .0.value, .0.allowed)]
    Config(reflex_runtime::config::Invalid),
}

/// The simulator of one task, stepping in lockstep with its caller.
pub struct SimEnv {
    cfg: SimConfig,
    model: Arc<ArmModel>,
    scene: Scene,
    layout: TaskLayout,
    spec: RobotSpec,
    obs: Observation,
    seeds: ChaCha8Rng,
    seed: u64,
    episode: u64,
    step: u32,
    substeps: u32,
    /// End-effector goal for ee actions: position and yaw.
    ee_goal: Vector3<f64>,
    yaw_goal: f64,
    /// The tool's pose at the last observation.
    tcp: Isometry3<f64>,
    q_cmd: [f64; 5],
    opening_cmd: f64,
    ik: IkOptions,
    renderer: Option<Renderer>,
    rig: CameraRig,
    physics_steps: u64,
    /// The task's whole state layout ([`state_fields`]) whatever the robot reports, and whether
    /// the scene shows success: what a person looking at the scene sees.
    scene_state: Vec<f32>,
    scene_success: bool,
    /// The scene's success at the last step of the episode the latest reset ended.
    ended_success: Option<bool>,
}

impl SimEnv {
    /// Builds the simulator; the first episode starts at [`Robot::reset`].
    pub fn new(cfg: SimConfig) -> Result<Self, SimError> {
        cfg.validate("sim").map_err(SimError::Config)?;
        let model = Arc::new(ArmModel::so101());
        Ok(Self::with_model(cfg, model))
    }

    /// Builds the simulator sharing an already parsed arm model.
    pub fn with_model(cfg: SimConfig, model: Arc<ArmModel>) -> Self {
        let rig = CameraRig::default_rig();
        let cameras = if cfg.cameras.enabled {
            rig.cameras
                .iter()
                .map(|c| c.spec(cfg.cameras.width, cfg.cameras.height))
                .collect()
        } else {
            vec![]
        };
        let spec = robot_spec(&cfg, &model, cameras);
        let renderer = cfg
            .cameras
            .enabled
            .then(|| Renderer::new(cfg.cameras.width, cfg.cameras.height));
        let mut seeds = ChaCha8Rng::seed_from_u64(cfg.seed);
        let seed = seeds.random();
        let mut layout_rng = ChaCha8Rng::seed_from_u64(seed);
        let layout = TaskLayout::sample(cfg.task, &mut layout_rng);
        let q = [0.0; 5];
        let scene = Scene::new(
            &model,
            &cfg.servo,
            &cfg.solver,
            (1.0 / cfg.physics_hz) as f32,
            &q,
            0.0,
        );
        let substeps = cfg.substeps();
        let mut env = SimEnv {
            spec,
            obs: Observation::default(),
            seeds,
            seed,
            episode: 0,
            step: 0,
            substeps,
            ee_goal: Vector3::zeros(),
            yaw_goal: HOME_YAW,
            tcp: Isometry3::identity(),
            q_cmd: q,
            opening_cmd: 0.0,
            ik: IkOptions {
                max_iterations: 30,
                position_tolerance_m: 2e-4,
                rotation_tolerance_rad: 2e-3,
                ..Default::default()
            },
            renderer,
            rig,
            physics_steps: 0,
            scene_state: Vec::new(),
            scene_success: false,
            ended_success: None,
            scene,
            layout,
            model,
            cfg,
        };
        env.start_episode(seed);
        env
    }

    /// The task's whole state ([`state_fields`] of the task, not the robot's spec when the
    /// config's `state = "arm"` hides the scene): what a simulated person sees.
    pub fn scene_state(&self) -> &[f32] {
        &self.scene_state
    }

    /// Whether the scene shows the task done, whatever a wrapper (a success classifier) says.
    pub fn scene_success(&self) -> bool {
        self.scene_success
    }

    /// Whether the scene showed the task done at the last step of the episode the latest reset
    /// ended (`None` before any episode ran a step): what a person saw when the episode ended, read
    /// after a control loop has already started the next one.
    pub fn ended_scene_success(&self) -> Option<bool> {
        self.ended_success
    }

    /// The configuration.
    pub fn config(&self) -> &SimConfig {
        &self.cfg
    }

    /// The arm model.
    pub fn model(&self) -> &Arc<ArmModel> {
        &self.model
    }

    /// The physical scene.
    pub fn scene(&self) -> &Scene {
        &self.scene
    }

    /// This episode's layout.
    pub fn layout(&self) -> &TaskLayout {
        &self.layout
    }

    /// Seed of the current episode.
    pub fn episode_seed(&self) -> u64 {
        self.seed
    }

    /// Physics steps taken since creation.
    pub fn physics_steps(&self) -> u64 {
        self.physics_steps
    }

    /// Joint positions (5 arm joints) from a tool-centre-point pose goal, by IK seeded at `seed`.
    pub fn ik_top_down(&self, pos: &Vector3<f64>, yaw: f64, seed: &[f64; 5]) -> [f64; 5] {
        let target = Isometry3::from_parts(Translation3::from(*pos), top_down(yaw));
        let sol = self.model.ik_chain.ik(&target, seed, &self.ik);
        [sol.q[0], sol.q[1], sol.q[2], sol.q[3], sol.q[4]]
    }

    /// Pose of the tool centre point from the measured joints.
    pub fn tcp_pose(&self) -> Isometry3<f64> {
        let q = self.scene.joint_positions();
        let q64 = [
            q[0] as f64,
            q[1] as f64,
            q[2] as f64,
            q[3] as f64,
            q[4] as f64,
        ];
        self.model.chain.fk(&q64)
    }

    /// The current observation (what `observe` returns), without a mutable borrow.
    pub fn obs(&self) -> &Observation {
        &self.obs
    }

    /// The current end-effector goal (position, yaw) of ee action spaces.
    pub fn ee_goal(&self) -> (Vector3<f64>, f64) {
        (self.ee_goal, self.yaw_goal)
    }

    fn start_episode(&mut self, seed: u64) {
        self.seed = seed;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        self.layout = TaskLayout::sample(self.cfg.task, &mut rng);
        // Place the arm with its tool top-down at the layout's start point. The IK seed is an
        // elbow-up configuration, so every episode starts on the same branch.
        let t = self.layout.tcp_start;
        let seed_q = [t.y.atan2(t.x), 0.0, 0.0, 0.0, 0.0];
        let q = self.ik_top_down(&t, HOME_YAW, &seed_q);
        let opening = self.layout.opening_start as f32;
        self.scene = Scene::new(
            &self.model,
            &self.cfg.servo,
            &self.cfg.solver,
            (1.0 / self.cfg.physics_hz) as f32,
            &q,
            opening,
        );
        let tcp = self.model.chain.fk(&q);
        crate::task::populate(&mut self.layout, &mut self.scene, &tcp);
        self.q_cmd = q;
        self.opening_cmd = opening as f64;
        if self.cfg.task == TaskKind::Insert {
            // Squeeze the peg, then let the grasp settle before the episode's first step.
            self.opening_cmd = 0.0;
        }
        self.apply_command();
        for _ in 0..(0.25 * self.cfg.physics_hz) as u32 {
            self.scene.step_physics();
        }
        let tcp = self.tcp_pose();
        self.ee_goal = tcp.translation.vector;
        self.yaw_goal = yaw_of(&tcp.rotation);
        self.step = 0;
        self.update_obs(0.0);
    }

    fn apply_command(&mut self) {
        let mut cmd = [0.0f32; NUM_ACTUATORS];
        for ((q, c), (lo, hi)) in self
            .q_cmd
            .iter_mut()
            .zip(cmd.iter_mut())
            .zip(self.model.limits)
        {
            *q = q.clamp(lo, hi);
            *c = *q as f32;
        }
        self.opening_cmd = self
            .opening_cmd
            .clamp(0.0, self.model.max_opening_m() as f64);
        cmd[5] = self.opening_cmd as f32;
        self.scene.command(&cmd);
    }

    fn interpret(&mut self, a: &[f32]) {
        let clamp3 = |v: Vector3<f64>| {
            Vector3::new(
                v.x.clamp(WORKSPACE_MIN[0], WORKSPACE_MAX[0]),
                v.y.clamp(WORKSPACE_MIN[1], WORKSPACE_MAX[1]),
                v.z.clamp(WORKSPACE_MIN[2], WORKSPACE_MAX[2]),
            )
        };
        let lim = &self.spec.action;
        let c = |i: usize| (a[i].clamp(lim.low[i], lim.high[i])) as f64;
        match self.cfg.action {
            ActionKind::EeDelta | ActionKind::EeDeltaYaw => {
                // The pose `update_obs` computed after the last physics step: nothing moved since.
                let measured = self.tcp.translation.vector;
                // Track the goal, not the measured pose, so small steps add up exactly; re-anchor
                // on the measured pose when the arm could not follow (blocked by contact).
                if (self.ee_goal - measured).norm() > 0.03 {
                    self.ee_goal = measured;
                }
                self.ee_goal = clamp3(self.ee_goal + Vector3::new(c(0), c(1), c(2)));
                let grip = if self.cfg.action == ActionKind::EeDeltaYaw {
                    self.yaw_goal += c(3);
                    // Keep the yaw goal within reach of the wrist: +-90 degrees around home.
                    self.yaw_goal = self.yaw_goal.clamp(HOME_YAW - 1.57, HOME_YAW + 1.57);
                    c(4)
                } else {
                    c(3)
                };
                self.q_cmd = self.ik_top_down(&self.ee_goal, self.yaw_goal, &self.q_cmd);
                self.opening_cmd = grip;
            }
            ActionKind::JointAbs => {
                for i in 0..5 {
                    self.q_cmd[i] = c(i);
                }
                self.opening_cmd = c(5);
            }
            ActionKind::JointDelta => {
                for i in 0..5 {
                    self.q_cmd[i] += c(i);
                }
                self.opening_cmd += c(5);
            }
            ActionKind::Box => unreachable!("rejected by SimConfig::validate"),
        }
    }

    fn update_obs(&mut self, reward: f32) {
        let q = self.scene.joint_positions();
        let qd = self.scene.joint_velocities();
        let tcp = self.tcp_pose();
        self.tcp = tcp;
        let obj = self.scene.object.map(|h| self.scene.body_pose(h));
        let t_s = self.step as f64 / self.cfg.control_hz;
        self.layout.advance(t_s, &tcp.translation.vector);
        let success = self.layout.success(&tcp.translation.vector, obj.as_ref());
        let o = &mut self.obs;
        o.v = PROTOCOL_VERSION;
        o.episode = self.episode;
        o.step = self.step;
        o.time_ns = (t_s * 1e9).round() as u64;
        let s = &mut o.state;
        s.clear();
        s.extend_from_slice(&q);
        s.extend_from_slice(&qd);
        let t = tcp.translation.vector;
        let r = tcp.rotation.quaternion();
        s.extend_from_slice(&[t.x as f32, t.y as f32, t.z as f32]);
        s.extend_from_slice(&[r.i as f32, r.j as f32, r.k as f32, r.w as f32]);
        if self.cfg.task.has_object() {
            let p = obj.expect("task with object");
            let (t, r) = (p.translation.vector, p.rotation.quaternion());
            s.extend_from_slice(&[t.x as f32, t.y as f32, t.z as f32]);
            s.extend_from_slice(&[r.i as f32, r.j as f32, r.k as f32, r.w as f32]);
        }
        let g = self.layout.target;
        s.extend_from_slice(&[g.x as f32, g.y as f32, g.z as f32]);
        // The vector a policy has to close, given directly: what moves towards the target.
        let from = match (self.cfg.task, obj.as_ref()) {
            (TaskKind::Reach | TaskKind::Track, _) | (_, None) => t,
            (TaskKind::Insert, Some(p)) => {
                let half =
                    p.rotation * nalgebra::Vector3::new(0.0, 0.0, crate::task::PEG_LENGTH_M / 2.0);
                let (a, b) = (p.translation.vector + half, p.translation.vector - half);
                if a.z < b.z { a } else { b }
            }
            (_, Some(p)) => p.translation.vector,
        };
        let d = g - from;
        s.extend_from_slice(&[d.x as f32, d.y as f32, d.z as f32]);
        if self.cfg.task == TaskKind::Track {
            let v = self.layout.target_velocity(t_s);
            s.extend_from_slice(&[v.x as f32, v.y as f32, v.z as f32]);
        }
        self.scene_state.clear();
        self.scene_state.extend_from_slice(s);
        self.scene_success = success;
        if self.cfg.state == StateView::Arm {
            s.truncate(ARM_STATE_LEN);
        }
        o.success = success;
        o.reward = reward.max(if success && self.step > 0 { 1.0 } else { 0.0 });
        o.terminated = success;
        o.truncated = !success && self.step >= self.cfg.max_steps();
        if let Some(r) = &mut self.renderer {
            r.render_all(&self.scene, &self.layout, &self.rig, &mut o.images);
        }
    }
}

impl Robot for SimEnv {
    fn spec(&self) -> &RobotSpec {
        &self.spec
    }

    fn reset(&mut self, seed: Option<u64>) -> Result<&Observation, RobotError> {
        let seed = seed.unwrap_or_else(|| self.seeds.random());
        self.ended_success = (self.step > 0).then_some(self.scene_success);
        self.episode += 1;
        self.start_episode(seed);
        Ok(&self.obs)
    }

    fn command(&mut self, action: &[f32]) -> Result<(), RobotError> {
        check_action(&self.spec.name, self.spec.action.dim(), action)?;
        self.interpret(action);
        self.apply_command();
        for _ in 0..self.substeps {
            self.scene.step_physics();
        }
        self.physics_steps += self.substeps as u64;
        self.step += 1;
        self.update_obs(0.0);
        Ok(())
    }

    fn observe(&mut self) -> Result<&Observation, RobotError> {
        Ok(&self.obs)
    }

    fn hold_action(&self, out: &mut [f32]) {
        out.fill(0.0);
        match self.cfg.action {
            ActionKind::EeDelta => out[3] = self.opening_cmd as f32,
            ActionKind::EeDeltaYaw => out[4] = self.opening_cmd as f32,
            ActionKind::JointAbs => {
                for (o, q) in out.iter_mut().zip(self.q_cmd) {
                    *o = q as f32;
                }
                out[5] = self.opening_cmd as f32;
            }
            ActionKind::JointDelta | ActionKind::Box => {}
        }
    }
}
