//! `reflex bench learner`: SAC update throughput in three network configurations, and the wall
//! time of 10k Pendulum steps with one update per step.

use clap::Args;
use reflex_policies::pendulum::{MAX_TORQUE, Pendulum};
use reflex_policies::sac::pendulum_run::train_dense;
use reflex_policies::sac::replay::Transition;
use reflex_policies::sac::{Mode, Sac, SacConfig};
use std::time::Instant;

#[derive(Args)]
pub struct LearnerBenchArgs {
    /// Updates timed per configuration.
    #[arg(long, default_value_t = 1000)]
    updates: usize,
    /// Environment steps of the Pendulum run (0 skips it).
    #[arg(long, default_value_t = 10_000)]
    pendulum_steps: usize,
    /// Threads the learner's matrix products may use.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Restricts candle's CPU kernels to `n` threads (candle reads RAYON_NUM_THREADS), so the learner
/// leaves the control loop a core.
pub fn pin_threads(n: usize) {
    // SAFETY: called at start-up before any other thread exists that reads the environment.
    unsafe { std::env::set_var("RAYON_NUM_THREADS", n.max(1).to_string()) };
}

/// Updates per second of one configuration: one update = one critic update + one actor and
/// temperature update on a batch, as in the SBX / SB3 step with train_freq = gradient_steps = 1.
fn updates_per_s(
    hidden: usize,
    batch: usize,
    critics: usize,
    updates: usize,
) -> anyhow::Result<f64> {
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

pub fn run(a: LearnerBenchArgs) -> anyhow::Result<()> {
    pin_threads(a.threads);
    let rows = [
        ("a_64x64_b100_2critics", 64, 100, 2),
        ("b_256x256_b256_2critics", 256, 256, 2),
        ("c_256x256_b256_10critics", 256, 256, 10),
    ];
    let mut out = serde_json::json!({ "threads": a.threads });
    for (name, h, b, n) in rows {
        let u = updates_per_s(h, b, n, a.updates)?;
        out[name] =
            serde_json::json!({ "updates_per_s": u, "hidden": h, "batch": b, "critics": n });
        if !a.json {
            println!("{name:<26} {u:>8.1} updates/s");
        }
    }
    if a.pendulum_steps > 0 {
        let cfg = SacConfig {
            mode: Mode::Full,
            hidden: vec![64, 64],
            batch: 100,
            critic_layer_norm: false,
            warmup_steps: 100,
            seed: 1,
            ..Default::default()
        };
        let r = train_dense(cfg, a.pendulum_steps, 1, 5)?;
        out["pendulum"] = serde_json::json!({ "steps": a.pendulum_steps, "wall_s": r.wall_s, "final_return": r.final_eval, "updates": r.updates });
        if !a.json {
            println!(
                "pendulum {} steps (64x64, batch 100, 1 update/step): {:.1} s, final return {:.0}",
                a.pendulum_steps, r.wall_s, r.final_eval
            );
        }
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    Ok(())
}
