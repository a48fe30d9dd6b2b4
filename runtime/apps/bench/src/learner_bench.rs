//! `reflex bench learner`: SAC update throughput in three network configurations, and the wall
//! time of 10k Pendulum steps with one update per step.

use crate::pendulum::{MAX_TORQUE, Pendulum};
use crate::pendulum_run::train_dense;
use reflex_agent::error::{AgentError, Result};
use reflex_learn::sac::replay::Transition;
use reflex_learn::sac::{Mode, Sac, SacConfig};
pub use reflex_mlp::kernel::Path as KernelPath;
use std::time::Instant;

/// Updates per second of one configuration: one update = one critic update + one actor and
/// temperature update on a batch, as in the SBX / SB3 step with train_freq = gradient_steps = 1.
fn updates_per_s(hidden: usize, batch: usize, critics: usize, updates: usize) -> Result<f64> {
    let cfg = SacConfig {
        mode: Mode::Full,
        hidden: vec![hidden, hidden],
        critics,
        critic_subset: 2,
        critic_layer_norm: false,
        batch,
        seed: 1,
        ..Default::default()
    };
    let mut sac = Sac::new(cfg, 3, 1)?;
    let mut env = Pendulum::new(1);
    let mut obs = env.reset();
    for _ in 0..5000 {
        let a = sac.random_action();
        let s = env.step(a[0] as f64 * MAX_TORQUE);
        sac.online.push(&Transition {
            obs: obs.to_vec(),
            action: a,
            reward: s.reward as f32,
            next_obs: s.obs.to_vec(),
            truncated: s.truncated,
            ..Default::default()
        });
        obs = if s.truncated { env.reset() } else { s.obs };
    }
    for _ in 0..20 {
        sac.train_step()?;
    }
    let t0 = Instant::now();
    for _ in 0..updates {
        sac.train_step()?;
    }
    Ok(updates as f64 / t0.elapsed().as_secs_f64())
}

/// One network configuration's update rate.
#[derive(Clone, Debug, serde::Serialize)]
pub struct UpdateRate {
    /// SAC updates per second.
    pub updates_per_s: f64,
    /// Hidden width of every layer.
    pub hidden: usize,
    /// Batch size.
    pub batch: usize,
    /// Critics in the ensemble.
    pub critics: usize,
}

/// Pendulum-v1 trained with one update per step.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PendulumRun {
    /// Environment steps.
    pub steps: usize,
    /// Wall time, s.
    pub wall_s: f64,
    /// Mean return of the final evaluation.
    pub final_return: f64,
    /// Updates made.
    pub updates: u64,
}

/// What `reflex bench learner` measured (the JSON keys name the configuration).
#[derive(Clone, Debug, serde::Serialize)]
pub struct LearnerBenchReport {
    /// Threads of the learner's matrix products in effect.
    pub threads: usize,
    /// The instruction set of the learner's matrix kernel (`avx512`, `avx2+fma`, `portable`).
    pub kernel: &'static str,
    /// 64x64, batch 100, 2 critics (SB3's default SAC).
    pub a_64x64_b100_2critics: UpdateRate,
    /// 256x256, batch 256, 2 critics (HIL-SERL, LeRobot).
    pub b_256x256_b256_2critics: UpdateRate,
    /// 256x256, batch 256, 10 critics (RLPD, REDQ).
    pub c_256x256_b256_10critics: UpdateRate,
    /// Pendulum-v1, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pendulum: Option<PendulumRun>,
}

impl LearnerBenchReport {
    /// The three configurations with their names.
    pub fn rates(&self) -> [(&'static str, &UpdateRate); 3] {
        [
            ("a_64x64_b100_2critics", &self.a_64x64_b100_2critics),
            ("b_256x256_b256_2critics", &self.b_256x256_b256_2critics),
            ("c_256x256_b256_10critics", &self.c_256x256_b256_10critics),
        ]
    }
}

/// SAC update throughput in three network configurations (`updates` timed each), and the wall
/// time of `pendulum_steps` Pendulum steps with one update per step (0 skips it), with the
/// learner's matrix products on `threads` threads (capped at the machine's cores; the number in
/// effect is reported), on the kernel path `kernel` (the processor's fastest when `None`; an
/// AVX-512 machine can time the AVX2 path an AVX2-only one runs). candle's other kernels read
/// `RAYON_NUM_THREADS`, which the caller sets before starting any thread.
pub fn run(
    updates: usize,
    pendulum_steps: usize,
    threads: usize,
    kernel: Option<KernelPath>,
) -> Result<LearnerBenchReport> {
    if let Some(path) = kernel {
        path.choose().map_err(AgentError::Failed)?;
    }
    let threads = reflex_learn::sac::gemm::set_threads(threads);
    let rate = |hidden, batch, critics| -> Result<UpdateRate> {
        Ok(UpdateRate {
            updates_per_s: updates_per_s(hidden, batch, critics, updates)?,
            hidden,
            batch,
            critics,
        })
    };
    let mut out = LearnerBenchReport {
        threads,
        kernel: KernelPath::detected().name(),
        a_64x64_b100_2critics: rate(64, 100, 2)?,
        b_256x256_b256_2critics: rate(256, 256, 2)?,
        c_256x256_b256_10critics: rate(256, 256, 10)?,
        pendulum: None,
    };
    if pendulum_steps > 0 {
        let cfg = SacConfig {
            mode: Mode::Full,
            hidden: vec![64, 64],
            batch: 100,
            critic_layer_norm: false,
            warmup_steps: 100,
            seed: 1,
            ..Default::default()
        };
        let r = train_dense(cfg, pendulum_steps, 1, 5)?;
        out.pendulum = Some(PendulumRun {
            steps: pendulum_steps,
            wall_s: r.wall_s,
            final_return: r.final_eval as f64,
            updates: r.updates as u64,
        });
    }
    Ok(out)
}
