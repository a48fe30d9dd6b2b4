//! SAC on the Pendulum port: the learning benchmark (`reflex bench learner`) and the learning
//! tests (dense Pendulum-v1; and a sparse-success variant with a weakened base controller for the
//! residual mode).

use super::replay::Transition;
use super::{Mode, Sac, SacConfig};
use crate::pendulum::{MAX_TORQUE, Pendulum, swing_up};
use std::time::Instant;

/// What a training run produced.
#[derive(Clone, Debug, Default)]
pub struct RunResult {
    /// Return (or success) of each training episode.
    pub episode_returns: Vec<f64>,
    /// Mean return (dense) or success rate (sparse) of deterministic evaluation episodes at the end.
    pub final_eval: f64,
    /// Largest |residual| seen (residual mode), normalised units.
    pub max_residual: f32,
    /// Wall time, s.
    pub wall_s: f64,
    /// Updates performed.
    pub updates: u64,
}

/// Dense Pendulum-v1: `steps` environment steps with one `train_step` each, the first
/// `cfg.warmup_steps` with uniformly random actions; then `eval_episodes` deterministic episodes.
///
/// `cfg.mode` may be `full`, or `noise` with an identity base (the action is the chosen noise): the
/// check that diffusion steering reduces to plain SAC when the base is the identity.
pub fn train_dense(
    cfg: SacConfig,
    steps: usize,
    env_seed: u64,
    eval_episodes: usize,
) -> candle_core::Result<RunResult> {
    let t0 = Instant::now();
    let warm = cfg.warmup_steps;
    let mode = if cfg.mode == Mode::Residual {
        Mode::Full
    } else {
        cfg.mode
    };
    let mut sac = Sac::new(SacConfig { mode, ..cfg }, 3, 1)?;
    let mut env = Pendulum::new(env_seed);
    let mut obs = env.reset();
    let mut ret = 0.0;
    let mut out = RunResult::default();
    for step in 0..steps {
        let a = if step < warm {
            sac.random_action()
        } else {
            sac.act(&obs, &[], false)?
        };
        let s = env.step(a[0] as f64 * MAX_TORQUE);
        ret += s.reward;
        sac.online.push(&Transition {
            obs: obs.to_vec(),
            action: a,
            reward: s.reward as f32,
            next_obs: s.obs.to_vec(),
            truncated: s.truncated,
            ..Default::default()
        });
        sac.train_step()?;
        obs = s.obs;
        if s.truncated {
            out.episode_returns.push(ret);
            ret = 0.0;
            obs = env.reset();
        }
    }
    let mut eval_env = Pendulum::new(env_seed ^ 0xe7a1);
    let mut total = 0.0;
    for _ in 0..eval_episodes {
        let mut o = eval_env.reset();
        loop {
            let a = sac.act(&o, &[], true)?;
            let s = eval_env.step(a[0] as f64 * MAX_TORQUE);
            total += s.reward;
            o = s.obs;
            if s.truncated {
                break;
            }
        }
    }
    out.final_eval = total / eval_episodes.max(1) as f64;
    out.wall_s = t0.elapsed().as_secs_f64();
    out.updates = sac.counters.critic_updates;
    Ok(out)
}

/// The sparse task: from a hanging start, reward 1 and the episode ends when the pendulum is
/// upright and still (`Pendulum::upright`), 0 otherwise, 200-step limit.
/// The base is `swing_up` with gain `base_gain`. Returns the per-episode success.
///
/// Residual mode: the learner sees the observation and the base action normalised over the range
/// widened by `1 + action_scale` (ResFiT), and its combined action `clamp(base + residual)` is
/// executed. Full mode: the learner acts alone (from scratch), same budget.
pub fn train_sparse(
    cfg: SacConfig,
    episodes: usize,
    base_gain: f64,
    env_seed: u64,
    eval_episodes: usize,
) -> candle_core::Result<RunResult> {
    let t0 = Instant::now();
    let mode = cfg.mode;
    let scale = cfg.action_scale;
    let widened = MAX_TORQUE
        * (1.0
            + if mode == Mode::Residual {
                scale as f64
            } else {
                0.0
            });
    let mut sac = Sac::new(cfg, 3, 1)?;
    let mut env = Pendulum::new(env_seed);
    let mut out = RunResult::default();
    let base_of = |o: &[f32; 3]| vec![(swing_up(o, base_gain) / widened) as f32];
    let run_episode = |sac: &mut Sac,
                       env: &mut Pendulum,
                       learn: bool,
                       deterministic: bool,
                       max_res: &mut f32|
     -> candle_core::Result<bool> {
        let mut obs = env.reset();
        loop {
            let base = base_of(&obs);
            let a = if mode == Mode::Residual
                || !learn
                || sac.counters.env_steps as usize >= sac.cfg.warmup_steps
            {
                sac.act(&obs, &base, deterministic)?
            } else {
                sac.random_action()
            };
            if mode == Mode::Residual {
                *max_res = max_res.max((a[0] - base[0]).abs().min(f32::MAX));
            }
            let s = env.step(a[0] as f64 * widened);
            let success = env.upright();
            if learn {
                sac.online.push(&Transition {
                    obs: obs.to_vec(),
                    base: if mode == Mode::Residual {
                        base.clone()
                    } else {
                        vec![]
                    },
                    action: a,
                    reward: success as u8 as f32,
                    next_obs: s.obs.to_vec(),
                    next_base: if mode == Mode::Residual {
                        base_of(&s.obs)
                    } else {
                        vec![]
                    },
                    terminated: success,
                    truncated: s.truncated && !success,
                    intervention: false,
                });
                sac.train_step()?;
            }
            if success || s.truncated {
                return Ok(success);
            }
            obs = s.obs;
        }
    };
    let mut max_res = 0.0f32;
    for _ in 0..episodes {
        let ok = run_episode(&mut sac, &mut env, true, false, &mut max_res)?;
        out.episode_returns.push(ok as u8 as f64);
    }
    let mut eval_env = Pendulum::new(env_seed ^ 0xe7a1);
    let mut wins = 0;
    let mut ignore = 0.0;
    for _ in 0..eval_episodes {
        wins += run_episode(&mut sac, &mut eval_env, false, true, &mut ignore)? as usize;
    }
    out.final_eval = wins as f64 / eval_episodes.max(1) as f64;
    out.max_residual = max_res;
    out.wall_s = t0.elapsed().as_secs_f64();
    out.updates = sac.counters.critic_updates;
    Ok(out)
}

/// Success rate of the base controller alone, deterministic, over `episodes` seeded episodes.
pub fn base_success(base_gain: f64, env_seed: u64, episodes: usize) -> f64 {
    let mut env = Pendulum::new(env_seed ^ 0xe7a1);
    let mut wins = 0;
    for _ in 0..episodes {
        let mut o = env.reset_hanging();
        loop {
            let s = env.step(swing_up(&o, base_gain));
            if env.upright() {
                wins += 1;
                break;
            }
            if s.truncated {
                break;
            }
            o = s.obs;
        }
    }
    wins as f64 / episodes as f64
}
