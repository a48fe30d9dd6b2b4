//! The learner's settings are range-checked where they are read, each refusal naming its key:
//! a zero-width layer or a zero batch used to reach the learner's thread and panic it there.
#![allow(
    clippy::too_many_lines,
    reason = "a test reads as one scenario; the limit is for library code"
)]

use reflex_learn::sac::{Sac, SacConfig};
use reflex_runtime::config::Validate;

fn key_refused(c: &SacConfig) -> String {
    c.validate("learner.sac").expect_err("out of range").key
}

#[test]
fn the_defaults_pass() {
    SacConfig::default().validate("learner.sac").unwrap();
}

#[test]
fn each_setting_out_of_range_is_refused_by_name() {
    let d = SacConfig::default;
    let cases: Vec<(&str, SacConfig)> = vec![
        (
            "hidden",
            SacConfig {
                hidden: vec![],
                ..d()
            },
        ),
        (
            "hidden",
            SacConfig {
                hidden: vec![0, 16],
                ..d()
            },
        ),
        ("critics", SacConfig { critics: 0, ..d() }),
        (
            "critic_subset",
            SacConfig {
                critics: 2,
                critic_subset: 3,
                ..d()
            },
        ),
        (
            "actor_lr",
            SacConfig {
                actor_lr: 0.0,
                ..d()
            },
        ),
        (
            "critic_lr",
            SacConfig {
                critic_lr: f64::NAN,
                ..d()
            },
        ),
        (
            "discount",
            SacConfig {
                discount: 1.5,
                ..d()
            },
        ),
        ("tau", SacConfig { tau: 0.0, ..d() }),
        ("n_step", SacConfig { n_step: 0, ..d() }),
        (
            "init_temperature",
            SacConfig {
                init_temperature: -1.0,
                ..d()
            },
        ),
        ("utd", SacConfig { utd: 0, ..d() }),
        (
            "actor_every",
            SacConfig {
                actor_every: 0,
                ..d()
            },
        ),
        ("batch", SacConfig { batch: 0, ..d() }),
        (
            "demo_ratio",
            SacConfig {
                demo_ratio: 1.5,
                ..d()
            },
        ),
        (
            "action_scale",
            SacConfig {
                action_scale: -0.1,
                ..d()
            },
        ),
        (
            "action_scales",
            SacConfig {
                action_scales: vec![0.2, 11.0],
                ..d()
            },
        ),
        (
            "log_std",
            SacConfig {
                log_std: (2.0, -20.0),
                ..d()
            },
        ),
        (
            "residual_init_log_std",
            SacConfig {
                residual_init_log_std: 5.0,
                ..d()
            },
        ),
        ("capacity", SacConfig { capacity: 0, ..d() }),
        (
            "bc_weight",
            SacConfig {
                bc_weight: -1.0,
                ..d()
            },
        ),
        (
            "max_grad_norm",
            SacConfig {
                max_grad_norm: Some(0.0),
                ..d()
            },
        ),
    ];
    for (field, c) in cases {
        assert_eq!(key_refused(&c), format!("learner.sac.{field}"), "{c:?}");
    }
}

#[test]
fn a_learner_is_not_built_on_a_zero_width_layer() {
    let c = SacConfig {
        hidden: vec![0, 16],
        ..SacConfig::default()
    };
    let e = Sac::new(c, 4, 2).err().expect("refused").to_string();
    assert!(e.contains("learner.hidden") && e.contains("[0, 16]"), "{e}");
}

#[test]
fn networks_too_big_for_memory_are_refused_before_they_are_allocated() {
    // Each value is in range on its own; together they need 69 GB, which aborted the process.
    let c = SacConfig {
        critics: 256,
        hidden: vec![8192, 8192, 8192],
        ..SacConfig::default()
    };
    let e = Sac::new(c, 20, 4).err().expect("refused").to_string();
    assert!(e.contains("GB") && e.contains("critics = 256"), "{e}");
    // HIL-SERL's size is far inside the budget.
    let c = SacConfig {
        hidden: vec![256, 256],
        critics: 10,
        capacity: 1000,
        ..SacConfig::default()
    };
    Sac::new(c, 20, 4).unwrap();
}
