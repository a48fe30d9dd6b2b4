//! The hand-written state-only update (`Sac::by_hand`, the default) against candle's autograd on
//! the same batches: every mode, LayerNorm or not, critic subsets, the entropy term off,
//! behaviour cloning on demonstration rows, state scaling, gradient clipping and weight decay.
//! Both agents start from the same seed and draw the same batches and noise, so after each
//! update their parameters, losses and actions must agree to rounding.

use reflex_learn::sac::replay::Transition;
use reflex_learn::sac::{Mode, ObsNorm, Sac, SacConfig};

const STATE: usize = 5;
const ACT: usize = 3;

/// A deterministic pseudo-random value in [-1, 1] (no generator shared with the agents).
fn val(i: usize) -> f32 {
    ((((i as u64 + 7) * 2_654_435_761) % 20_001) as f32 - 10_000.0) / 10_000.0
}

fn fill(sac: &mut Sac, base: bool) {
    let mut k = 0;
    let mut next = |n: usize, scale: f32| -> Vec<f32> {
        let v = (0..n).map(|j| val(k * 31 + j) * scale).collect();
        k += 1;
        v
    };
    for t in 0..120 {
        let obs = next(STATE, 2.0);
        let tr = Transition {
            obs: obs.clone(),
            base: if base { next(ACT, 1.0) } else { vec![] },
            action: next(ACT, 1.0),
            reward: (t % 7 == 0) as u8 as f32,
            next_obs: next(STATE, 2.0),
            next_base: if base { next(ACT, 1.0) } else { vec![] },
            terminated: t % 11 == 0,
            truncated: t % 13 == 0,
            intervention: t % 3 == 0,
        };
        if t % 4 == 0 {
            sac.demo.push(&tr);
        } else {
            sac.online.push(&tr);
        }
    }
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn check(name: &str, cfg: SacConfig) {
    let base = cfg.mode == Mode::Residual;
    let mut candle = Sac::new(cfg.clone(), STATE, ACT).unwrap();
    candle.by_hand = false;
    let mut hand = Sac::new(cfg, STATE, ACT).unwrap();
    assert!(hand.by_hand, "the hand-written update is the default");
    fill(&mut candle, base);
    fill(&mut hand, base);
    assert_eq!(candle.parameters().unwrap(), hand.parameters().unwrap());
    let mut worst = 0f32;
    for step in 0..6 {
        let a = candle.train_step().unwrap().expect("an update");
        let b = hand.train_step().unwrap().expect("an update");
        for (what, x, y) in [
            ("critic loss", a.critic_loss, b.critic_loss),
            ("mean Q", a.q_mean, b.q_mean),
            ("actor loss", a.actor_loss, b.actor_loss),
            ("entropy", a.entropy, b.entropy),
            ("temperature", a.temperature, b.temperature),
        ] {
            assert!(
                (x - y).abs() <= 1e-4 * (1.0 + x.abs()),
                "{name}, update {step}: {what} {x} (candle) vs {y} (by hand)"
            );
        }
        let d = max_diff(&candle.parameters().unwrap(), &hand.parameters().unwrap());
        worst = worst.max(d);
        assert!(d < 2e-5, "{name}, update {step}: parameters differ by {d}");
    }
    let obs: Vec<f32> = (0..STATE).map(|j| val(900 + j)).collect();
    let b: Vec<f32> = if base {
        (0..ACT).map(|j| val(950 + j) * 0.9).collect()
    } else {
        vec![]
    };
    for deterministic in [true, false] {
        let x = candle.act(&obs, &b, deterministic).unwrap();
        let y = hand.act(&obs, &b, deterministic).unwrap();
        assert!(
            max_diff(&x, &y) < 1e-5,
            "{name}: act({deterministic}) {x:?} vs {y:?}"
        );
    }
    eprintln!("{name}: parameters within {worst:e} of candle's after 6 updates");
}

fn small(mode: Mode) -> SacConfig {
    SacConfig {
        mode,
        hidden: vec![24, 16],
        batch: 32,
        seed: 11,
        ..Default::default()
    }
}

#[test]
fn residual_with_layer_norm_behaviour_cloning_and_state_scaling() {
    check(
        "residual",
        SacConfig {
            critic_layer_norm: true,
            bc_weight: 0.7,
            demo_ratio: 0.5,
            obs_norm: Some(ObsNorm {
                center: vec![0.1, -0.2, 0.0, 0.5, 1.0],
                half: vec![2.0, 1.5, 0.5, 3.0, 1.0],
            }),
            ..small(Mode::Residual)
        },
    );
}

#[test]
fn residual_with_a_bound_per_action_component() {
    check(
        "per-component bounds",
        SacConfig {
            action_scales: vec![0.1, 0.9, 0.4],
            bc_weight: 0.5,
            demo_ratio: 0.5,
            ..small(Mode::Residual)
        },
    );
}

#[test]
fn full_with_a_critic_subset_actor_layer_norm_clipping_and_weight_decay() {
    check(
        "full",
        SacConfig {
            critics: 5,
            critic_subset: 2,
            critic_layer_norm: false,
            actor_layer_norm: true,
            entropy_in_target: false,
            max_grad_norm: Some(0.5),
            weight_decay: 0.01,
            bc_weight: 0.3,
            ..small(Mode::Full)
        },
    );
}

#[test]
fn noise_steering_with_three_critics() {
    check(
        "noise",
        SacConfig {
            critics: 3,
            critic_subset: 3,
            noise_bound: 1.5,
            ..small(Mode::Noise)
        },
    );
}

#[test]
fn the_hand_written_update_gives_the_same_bits_on_one_and_two_threads() {
    // 256 wide at batch 256: big enough that the products are split between threads.
    let run = |threads: usize| {
        reflex_learn::sac::gemm::set_threads(threads);
        let mut sac = Sac::new(
            SacConfig {
                hidden: vec![256, 256],
                batch: 256,
                critic_layer_norm: true,
                ..small(Mode::Residual)
            },
            STATE,
            ACT,
        )
        .unwrap();
        fill(&mut sac, true);
        for _ in 0..2 {
            sac.train_step().unwrap();
        }
        sac.parameters().unwrap()
    };
    let one = run(1);
    let two = run(2);
    reflex_learn::sac::gemm::set_threads(1);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert!(
        bits(&one) == bits(&two),
        "thread count changed the parameters"
    );
}

#[test]
fn the_demo_presets_sizes() {
    check(
        "demo preset",
        // The preset itself, with the default warm-up and capacity this test was written with.
        SacConfig {
            warmup_steps: 0,
            capacity: 1_000_000,
            ..reflex_learn::sac::learner_preset(Mode::Residual, 3)
        },
    );
}
