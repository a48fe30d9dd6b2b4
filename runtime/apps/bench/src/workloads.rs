//! Robots and policies for tests and benchmarks of the loop itself: they do no work and allocate
//! nothing per step, so what is measured is the runtime.

use reflex_contracts::msg::{
    ActionKind, ActionSpec, Observation, PROTOCOL_VERSION, RobotSpec, StateField,
};
use reflex_contracts::policy::{ChunkSpec, Policy, PolicyError};
use reflex_contracts::robot::{Robot, RobotError};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// A robot with an `ee_delta`-shaped action space that integrates its commands into a position,
/// publishes a new observation per command, and can be told to freeze its observations (to test
/// the watchdog) from another thread.
pub struct NullRobot {
    spec: RobotSpec,
    obs: Observation,
    /// Commands received.
    pub commands: Arc<AtomicU64>,
    /// While set, `observe` keeps returning the last observation unchanged.
    pub freeze: Arc<AtomicBool>,
    last: Vec<f32>,
    episode_steps: u32,
    /// Cameras whose newest frames go into each observation, as a real arm's do.
    cameras: Vec<reflex_cameras::Capture>,
    epoch: std::time::Instant,
}

impl NullRobot {
    /// A robot with `state_dim` state values (the first three are the end-effector position) and
    /// an action of 4 components (dx, dy, dz, gripper). `episode_steps` = 0 means never-ending
    /// episodes.
    pub fn new(name: &str, state_dim: usize, episode_steps: u32) -> Self {
        assert!(state_dim >= 3);
        let mut state = vec![StateField::new("ee_pos", 3, "m")];
        if state_dim > 3 {
            state.push(StateField::new("rest", (state_dim - 3) as u32, ""));
        }
        let spec = RobotSpec {
            v: PROTOCOL_VERSION,
            name: name.into(),
            kind: "test/null".into(),
            control_hz: 1000.0,
            lockstep: false,
            state,
            action: ActionSpec {
                kind: ActionKind::EeDelta,
                names: vec![
                    "dx_m".into(),
                    "dy_m".into(),
                    "dz_m".into(),
                    "gripper_m".into(),
                ],
                low: vec![-0.02, -0.02, -0.02, 0.0],
                high: vec![0.02, 0.02, 0.02, 0.07],
            },
            cameras: vec![],
            joints: vec![],
            max_episode_steps: episode_steps,
            scene: None,
        };
        let mut obs = Observation {
            v: PROTOCOL_VERSION,
            state: vec![0.0; state_dim],
            ..Default::default()
        };
        obs.state[..3].copy_from_slice(&[0.2, 0.0, 0.1]);
        NullRobot {
            spec,
            obs,
            commands: Arc::new(AtomicU64::new(0)),
            freeze: Arc::new(AtomicBool::new(false)),
            last: vec![0.0; 4],
            episode_steps,
            cameras: Vec::new(),
            epoch: std::time::Instant::now(),
        }
    }

    /// Adds cameras: their specs to the robot's, their newest frames to every observation
    /// (copied only when a new one came, as the arm does; nothing allocated per step).
    pub fn with_cameras(
        mut self,
        cameras: Vec<(reflex_cameras::CameraConfig, reflex_cameras::Capture)>,
        epoch: std::time::Instant,
    ) -> Self {
        for (cfg, cap) in cameras {
            self.spec.cameras.push(cfg.spec());
            self.obs.images.push(cfg.blank_image());
            self.cameras.push(cap);
        }
        self.epoch = epoch;
        self
    }

    /// The cameras' counters.
    pub fn camera_stats(&self) -> Vec<reflex_cameras::CameraStats> {
        self.cameras.iter().map(|c| c.stats()).collect()
    }

    /// The last command received.
    pub fn last_command(&self) -> &[f32] {
        &self.last
    }
}

impl Robot for NullRobot {
    fn spec(&self) -> &RobotSpec {
        &self.spec
    }

    fn reset(&mut self, _seed: Option<u64>) -> Result<&Observation, RobotError> {
        self.obs.episode += 1;
        self.obs.step = 0;
        self.obs.truncated = false;
        self.obs.state[..3].copy_from_slice(&[0.2, 0.0, 0.1]);
        Ok(&self.obs)
    }

    fn command(&mut self, action: &[f32]) -> Result<(), RobotError> {
        self.last.copy_from_slice(action);
        self.commands.fetch_add(1, Ordering::Relaxed);
        if !self.freeze.load(Ordering::Relaxed) {
            for (s, a) in self.obs.state[..3].iter_mut().zip(action) {
                *s = (*s + a).clamp(0.06, 0.34);
            }
            self.obs.step += 1;
            self.obs.seq += 1;
            self.obs.truncated = self.episode_steps > 0 && self.obs.step >= self.episode_steps;
        }
        Ok(())
    }

    fn observe(&mut self) -> Result<&Observation, RobotError> {
        let now = self.epoch.elapsed();
        for (cap, img) in self.cameras.iter_mut().zip(&mut self.obs.images) {
            if let Some(f) = cap.newer(now) {
                img.data.copy_from_slice(&f.image.data);
                img.seq = f.seq;
            }
        }
        Ok(&self.obs)
    }

    fn hold_action(&self, out: &mut [f32]) {
        out.fill(0.0);
        out[3] = self.last[3];
    }
}

/// A policy whose chunks sweep the first action component sinusoidally with the observation's
/// first value: cheap, deterministic, and different every call.
pub struct SweepPolicy {
    spec: ChunkSpec,
    calls: u64,
    prefix: Option<u64>,
}

impl SweepPolicy {
    /// Chunks of `len` actions of dimension 4, `execute` of them used before the next request.
    pub fn new(len: usize, execute: usize) -> Self {
        SweepPolicy {
            spec: ChunkSpec {
                len,
                execute,
                dim: 4,
            },
            calls: 0,
            prefix: None,
        }
    }

    /// The same policy asking for what the loop executes meanwhile (as real-time chunking
    /// does), so the loop's prefix path runs; it blends the prefix's first row into its chunk.
    pub fn with_prefix(mut self) -> Self {
        self.prefix = Some(0);
        self
    }

    /// Requests that came with a non-empty prefix (for a policy made [`Self::with_prefix`]).
    pub fn prefixed_calls(&self) -> u64 {
        self.prefix.unwrap_or(0)
    }
}

impl Policy for SweepPolicy {
    fn name(&self) -> &str {
        "sweep"
    }

    fn chunk_spec(&self) -> ChunkSpec {
        self.spec
    }

    fn infer(&mut self, obs: &Observation, out: &mut [f32]) -> Result<(), PolicyError> {
        self.calls += 1;
        for i in 0..self.spec.len {
            let phase = (self.calls as f32 * 0.1 + i as f32 * 0.05 + obs.state[0]).sin();
            out[i * 4..i * 4 + 4].copy_from_slice(&[0.005 * phase, -0.005 * phase, 0.0, 0.03]);
        }
        Ok(())
    }

    fn wants_prefix(&self) -> bool {
        self.prefix.is_some()
    }

    fn infer_with_prefix(
        &mut self,
        obs: &Observation,
        prefix: &reflex_contracts::policy::ChunkPrefix<'_>,
        out: &mut [f32],
    ) -> Result<(), PolicyError> {
        self.infer(obs, out)?;
        if let Some(n) = &mut self.prefix {
            *n += 1;
            let first = &prefix.actions[..4];
            for (o, p) in out[..4].iter_mut().zip(first) {
                *o = 0.5 * (*o + p);
            }
        }
        Ok(())
    }
}
