//! `reflex bench learner`: SAC update throughput in three network configurations, and the wall
//! time of 10k Pendulum steps with one update per step.

use crate::pendulum::{MAX_TORQUE, Pendulum};
use crate::pendulum_run::train_dense;
use reflex_agent::error::Result;
use reflex_policies::sac::replay::Transition;
use reflex_policies::sac::{Mode, Sac, SacConfig};
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

/// SAC update throughput in three network configurations (`updates` timed each), and the wall
/// time of `pendulum_steps` Pendulum steps with one update per step (0 skips it), with the
/// learner's matrix products on `threads` threads (capped at the machine's cores; the number in
/// effect is reported). candle's other kernels read `RAYON_NUM_THREADS`, which the caller sets
/// before starting any thread.
pub fn run(updates: usize, pendulum_steps: usize, threads: usize) -> Result<serde_json::Value> {
    let threads = reflex_policies::sac::gemm::set_threads(threads);
    let rows = [
        ("a_64x64_b100_2critics", 64, 100, 2),
        ("b_256x256_b256_2critics", 256, 256, 2),
        ("c_256x256_b256_10critics", 256, 256, 10),
    ];
    let mut out = serde_json::json!({ "threads": threads });
    for (name, h, b, n) in rows {
        let u = updates_per_s(h, b, n, updates)?;
        out[name] =
            serde_json::json!({ "updates_per_s": u, "hidden": h, "batch": b, "critics": n });
    }
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
        out["pendulum"] = serde_json::json!({ "steps": pendulum_steps, "wall_s": r.wall_s, "final_return": r.final_eval, "updates": r.updates });
    }
    Ok(out)
}
