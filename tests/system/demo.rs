//! `reflex demo`: end to end with its run directory, its configuration, the lift on fixed seeds
//! and residual against learning from scratch (docs/training.md has the full-budget figures).

use crate::common::{reflex, repo, run_ok};

/// `reflex demo ARGS --runs RUNS`, started from the repository as a user starts it.
fn demo(args: &[&str], runs: &std::path::Path) -> std::process::Command {
    let mut c = reflex();
    c.current_dir(repo())
        .arg("demo")
        .args(args)
        .arg("--runs")
        .arg(runs);
    c
}

#[test]
fn demo_runs_end_to_end_and_writes_its_summary_and_curve() {
    let dir = tempfile::tempdir().unwrap();
    let v = crate::common::json_output(&mut demo(
        &[
            "--episodes",
            "6",
            "--demos",
            "2",
            "--eval-episodes",
            "3",
            "--json",
        ],
        dir.path(),
    ));
    assert_eq!(v["episodes"], 6);
    // The refined policy judged alone on seeds training never saw, and kept.
    let h = &v["held_out"];
    assert_eq!(h["episodes"], 3, "{v}");
    assert_eq!(h["takeovers"], 0, "{v}");
    assert_eq!(h["seeds_seen_in_training"], 0, "{v}");
    assert_eq!(v["success_rate"], h["success_rate"]);
    let (lo, hi) = (
        h["success_rate_wilson_95"][0].as_f64().unwrap(),
        h["success_rate_wilson_95"][1].as_f64().unwrap(),
    );
    let rate = h["success_rate"].as_f64().unwrap();
    assert!(lo <= rate && rate <= hi && hi - lo > 0.3, "{h}");
    let ckpt = std::path::PathBuf::from(v["checkpoint"].as_str().unwrap());
    assert!(
        std::fs::metadata(&ckpt).unwrap().len() > 1000,
        "{}",
        ckpt.display()
    );
    // The residual as a file with its spec, and a config that runs it.
    let residual = std::path::PathBuf::from(v["residual"].as_str().unwrap());
    let spec = std::fs::read_to_string(residual.with_extension("policy.toml")).unwrap();
    assert!(
        spec.contains("kind = \"residual\"") && spec.contains("base_model = \"pick.onnx\""),
        "{spec}"
    );
    let refined = std::fs::read_to_string(v["refined_config"].as_str().unwrap()).unwrap();
    assert!(refined.contains("[policy.residual]"), "{refined}");
    // The run's steps as a LeRobot dataset, with who acted, the base action and the residual.
    let ds = dir.path().join("lerobot");
    run_ok(
        reflex()
            .args([
                "dataset",
                "export",
                "--run",
                v["run_dir"].as_str().unwrap(),
                "--out",
            ])
            .arg(&ds),
    );
    let c = crate::dataset::check_lerobot(&ds);
    assert_eq!(
        c["episodes"], 8,
        "6 training episodes and 2 demonstrations: {c}"
    );
    assert_eq!(c["frames"], v["env_steps"], "{c}");
    assert!(
        c["people"].as_u64().unwrap() > 0,
        "the person's steps are marked: {c}"
    );
    for f in ["reflex.person", "reflex.base_action", "reflex.residual"] {
        assert!(
            c["features"].as_array().unwrap().iter().any(|x| x == f),
            "{f}: {c}"
        );
    }
    assert_eq!(v["demonstrations"], 2);
    // Five updates per environment step (demonstrations included) from the 256th step on.
    let (steps, updates) = (
        v["env_steps"].as_u64().unwrap(),
        v["updates"].as_u64().unwrap(),
    );
    assert_eq!(updates, 5 * steps.saturating_sub(255), "{v}");
    let run = std::path::PathBuf::from(v["run_dir"].as_str().unwrap());
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(
        summary["episodes"].as_array().unwrap().len(),
        6,
        "demonstrations are not training episodes"
    );
    let png = std::fs::read(run.join("learning_curve.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    // Recordings: one per episode (the two demonstrations too), and the learning curves.
    assert!(run.join("learning.rrd").is_file());
    let rrd = std::fs::read_dir(run.join("episodes"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "rrd")
        })
        .count();
    assert_eq!(rrd, 8);
}

#[test]
fn a_partial_learner_table_keeps_the_demos_other_settings() {
    let dir = tempfile::tempdir().unwrap();
    // Only the update-to-data ratio changes; the warm-up (256) stays the demo's, not SAC's own.
    let cfg = dir.path().join("demo.toml");
    std::fs::write(&cfg, "[learner]\nutd = 2\n").unwrap();
    let v = crate::common::json_output(
        demo(
            &[
                "--episodes",
                "4",
                "--demos",
                "2",
                "--eval-episodes",
                "0",
                "--json",
                "--no-record",
            ],
            dir.path(),
        )
        .arg("--config")
        .arg(&cfg),
    );
    let (steps, updates) = (
        v["env_steps"].as_u64().unwrap(),
        v["updates"].as_u64().unwrap(),
    );
    assert_eq!(updates, 2 * steps.saturating_sub(255), "{v}");
    // An unknown key is refused, naming it.
    std::fs::write(&cfg, "[learner]\nutd_ratio = 2\n").unwrap();
    let out = demo(
        &["--episodes", "1", "--eval-episodes", "0", "--no-record"],
        dir.path(),
    )
    .arg("--config")
    .arg(&cfg)
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("utd_ratio"), "{err}");
}

/// `--offline-updates` and `--keep-average` as a user runs them: the learner's steps on the
/// demonstrations alone come on top of one per environment step, the kept residual averages the
/// episodes asked for and is judged held out; offline updates with no demonstrations are refused.
#[test]
fn a_demo_configs_sim_table_sets_the_physics_and_the_kept_files_keep_it() {
    // docs/training.md: `--config` with a `[sim]` table runs the demo on other physics, here
    // rapier's multibody (configs/sim/pick-multibody.toml's keys); refined.toml must run the
    // kept policy on the same physics, not on the defaults.
    use reflex_sim::{SimConfig, TaskKind};
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("multibody.toml");
    std::fs::write(
        &f,
        "[sim]\nphysics_hz = 200.0\n\n[sim.solver]\narm = \"rapier\"\npgs_iterations = 1\n\
         stabilization_iterations = 1\nwarmstart_joints = false\nccd = true\n",
    )
    .unwrap();
    let runs = dir.path().join("runs");
    let v = crate::common::json_output(&mut demo(
        &[
            "--episodes",
            "2",
            "--demos",
            "1",
            "--eval-episodes",
            "2",
            "--no-record",
            "--json",
            "--config",
            f.to_str().unwrap(),
        ],
        &runs,
    ));
    assert_eq!(v["episodes"], 2, "{v}");
    let refined = std::fs::read_to_string(v["refined_config"].as_str().unwrap()).unwrap();
    let table: toml::Table = toml::from_str(&refined).unwrap();
    let kept: SimConfig = table["sim"].clone().try_into().unwrap();
    let multibody = SimConfig::for_task(TaskKind::Pick).with_multibody_arm();
    assert_eq!(format!("{kept:?}"), format!("{multibody:?}"), "{refined}");
    // A key the demo does not take is refused before anything runs, naming the file and key.
    std::fs::write(&f, "[sim]\ntask = \"reach\"\n").unwrap();
    let out = demo(&["--config", f.to_str().unwrap()], &runs)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("multibody.toml") && err.contains("task"),
        "{err}"
    );
}

#[test]
fn the_offline_phase_and_the_kept_average_run_through_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let v = crate::common::json_output(&mut demo(
        &[
            "--episodes",
            "3",
            "--demos",
            "2",
            "--offline-updates",
            "7",
            "--keep-average",
            "2",
            "--eval-episodes",
            "2",
            "--json",
            "--no-record",
        ],
        dir.path(),
    ));
    let (steps, updates) = (
        v["env_steps"].as_u64().unwrap(),
        v["updates"].as_u64().unwrap(),
    );
    // The demo's preset: five critic updates a step after a warm-up of 256 steps.
    assert_eq!(updates, 5 * (steps.saturating_sub(255) + 7), "{v}");
    assert_eq!(v["offline_updates"], 7, "{v}");
    assert_eq!(v["residual_averages_episodes"], 2, "{v}");
    assert_eq!(v["held_out"]["episodes"], 2, "{v}");
    let out = demo(
        &[
            "--no-human",
            "--offline-updates",
            "7",
            "--episodes",
            "1",
            "--no-record",
        ],
        dir.path(),
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--offline-updates"),
        "{err}"
    );
}

/// The demo's summary, and the directory its run lives in (kept while the value is alive).
fn demo_summary(mode: &str, episodes: u32) -> (tempfile::TempDir, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let v = crate::common::json_output(&mut demo(
        &[
            "--mode",
            mode,
            "--episodes",
            &episodes.to_string(),
            "--seed",
            "0",
            "--json",
            "--no-record",
        ],
        dir.path(),
    ));
    (dir, v)
}

#[test]
fn the_demo_lifts_the_base_within_100_episodes() {
    // The full budget on seed 0. Measured with the learner's fixed-order kernel, the same on
    // every x86-64 processor (docs/training.md, seeds 0-7): 15-45% in the first 20 episodes,
    // 65-95% in the last 20 with 5-35% takeovers, 87-98% held out; seed 0 20 / 85%, 15%, 95%.
    // The bounds hold over all eight seeds, so a change that moves seed 0 by a few episodes
    // does not fail a demo that still lifts the base (38-46% alone) to >= 85% held out.
    let (_dir, v) = demo_summary("residual", 100);
    let f64_of = |k: &str| v[k].as_f64().unwrap();
    let (first, last) = (
        f64_of("success_rate_first_20"),
        f64_of("success_rate_last_20"),
    );
    // The base's level at the start (the person's takeovers included), well above it at the end.
    assert!((0.1..=0.6).contains(&first), "first 20: {first}: {v}");
    assert!(last >= 0.6, "last 20: {last}: {v}");
    assert!(
        f64_of("intervention_rate_last_20") <= 0.4,
        "the person still takes over often: {v}"
    );
    assert_eq!(v["rlif"], true);
    assert_eq!(v["demonstrations"], 20);
    // The refined policy alone on 100 held-out seeds (seed 0 measured 95/100, 95% CI 89-98%;
    // 87-98% over seeds 0-7; the base alone is at 38-46%).
    let h = &v["held_out"];
    assert_eq!(h["episodes"], 100, "{v}");
    assert_eq!(h["takeovers"], 0, "{v}");
    assert_eq!(h["seeds_seen_in_training"], 0, "{v}");
    let held = h["success_rate"].as_f64().unwrap();
    assert!(held >= 0.85, "held out: {held}: {h}");
    // What the demo kept runs without a learner: `reflex run` on its config, in a process of
    // its own, replays the held-out episodes (the demo judged the same files the same way).
    let config = v["refined_config"].as_str().unwrap();
    let run = crate::common::json_output(
        reflex()
            .current_dir(repo())
            .args(["run", "--config", config, "--json"]),
    );
    assert_eq!(run["episodes"], 100, "{run}");
    assert!(run["learner"].is_null(), "no learner runs: {run}");
    let (lo, hi) = (
        h["success_rate_wilson_95"][0].as_f64().unwrap(),
        h["success_rate_wilson_95"][1].as_f64().unwrap(),
    );
    let rate = run["success_rate"].as_f64().unwrap();
    assert!(
        lo <= rate && rate <= hi,
        "reflex run on refined.toml: {rate}, the demo's held-out interval {lo}-{hi}"
    );
    assert_eq!(
        run["success_rate"], h["success_rate"],
        "the same episodes: {run}"
    );
    assert_eq!(
        run["mean_steps"], h["mean_steps"],
        "the same episodes: {run}"
    );
    // `reflex eval` judges it again on another held-out stream, nobody driving.
    let e = crate::common::json_output(reflex().current_dir(repo()).args([
        "eval",
        "--config",
        config,
        "--episodes",
        "40",
        "--json",
    ]));
    assert_eq!(e["episodes"], 40, "{e}");
    assert_eq!(e["takeovers"], 0, "{e}");
    assert!(e["success_rate"].as_f64().unwrap() >= 0.75, "{e}");
}

#[test]
fn the_pixel_demo_takes_its_reward_from_the_classifier_and_the_person_vetoes_false_successes() {
    // `reflex demo --vision` as a user runs it, with a threshold no frame can miss: the
    // classifier calls the first frames a success, the scene shows nothing of the kind, and the
    // simulated person marks every one of those ends a failure. The arm reports only its own
    // state; the base alone and the refined policy are judged on the same held-out episodes by
    // the simulator.
    let dir = tempfile::tempdir().unwrap();
    let v = crate::common::json_output(&mut demo(
        &[
            "--vision",
            "--threshold",
            "0",
            "--consecutive-frames",
            "2",
            "--episodes",
            "4",
            "--demos",
            "2",
            "--eval-episodes",
            "4",
            "--json",
        ],
        dir.path(),
    ));
    let vis = &v["vision"];
    assert_eq!(vis["classifier_successes_vetoed"], 6, "{v}");
    assert_eq!(vis["classifier_successes_confirmed"], 0, "{v}");
    assert!(
        vis["encoder"]
            .as_str()
            .unwrap()
            .ends_with("pick-seeing.encoder.onnx")
    );
    let summary: serde_json::Value = serde_json::from_slice(
        &std::fs::read(std::path::Path::new(v["run_dir"].as_str().unwrap()).join("summary.json"))
            .unwrap(),
    )
    .unwrap();
    for row in summary["episodes"].as_array().unwrap() {
        assert_eq!(row["classifier_success"], true, "{row}");
        assert_eq!(row["success"], false, "{row}");
        assert_eq!(row["steps"], 1, "{row}");
    }
    for h in [&v["held_out"], &vis["base_held_out"]] {
        assert_eq!(h["episodes"], 4, "{v}");
        assert_eq!(h["seeds_seen_in_training"], 0, "{v}");
    }
    let run_dir = std::path::Path::new(v["run_dir"].as_str().unwrap());
    for f in ["refined.toml", "base.toml"] {
        let text = std::fs::read_to_string(run_dir.join(f)).unwrap();
        assert!(
            text.contains("state = \"arm\"") && text.contains("[sim.cameras]"),
            "{f}: {text}"
        );
        assert!(!text.contains("[reward]"), "the simulator judges {f}");
    }
    let spec = std::fs::read_to_string(
        std::path::PathBuf::from(v["residual"].as_str().unwrap()).with_extension("policy.toml"),
    )
    .unwrap();
    assert!(spec.contains("pick-seeing.encoder.onnx"), "{spec}");
    // The pixel demo refines with a residual only.
    let out = reflex()
        .current_dir(repo())
        .args(["demo", "--vision", "--mode", "full", "--episodes", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--vision"), "{err}");
}

#[test]
fn the_state_demo_refines_a_base_that_reads_images_and_measures_it_alone_first() {
    // A base that reads cameras (an imported LeRobot ACT does; here the shipped image policy) in
    // the state demo: the simulator renders its cameras at the size the policy takes, the
    // person's steps are relabelled on the frames they were taken on (the learner's own
    // relabeller reads only the state, and failed with "no image from camera" before), and the
    // base alone is measured on the same held-out episodes as the refined policy.
    let dir = tempfile::tempdir().unwrap();
    let v = crate::common::json_output(&mut demo(
        &[
            "--model",
            "models/pick-seeing.onnx",
            "--episodes",
            "3",
            "--demos",
            "1",
            "--eval-episodes",
            "4",
            "--json",
        ],
        dir.path(),
    ));
    assert!(v.get("vision").is_none(), "{v}");
    for h in [&v["held_out"], &v["base_held_out"]] {
        assert_eq!(h["episodes"], 4, "{v}");
        assert_eq!(h["seeds_seen_in_training"], 0, "{v}");
    }
    assert!(v["demonstrations"].as_u64().unwrap() >= 1, "{v}");
    let run_dir = std::path::Path::new(v["run_dir"].as_str().unwrap());
    for f in ["refined.toml", "base.toml"] {
        let text = std::fs::read_to_string(run_dir.join(f)).unwrap();
        assert!(
            text.contains("[sim.cameras]") && text.contains("width = 64"),
            "{f}: {text}"
        );
        assert!(
            !text.contains("state = \"arm\""),
            "the state demo's full state: {f}: {text}"
        );
    }
}

#[test]
fn the_pixel_demo_takes_per_component_bounds_and_a_height_watching_person_from_its_config() {
    // docs/learner.md's `[learner] action_scales` and docs/training.md's `[human] close_high_m`,
    // given to `reflex demo --vision --config` in a file as a user writes one.
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("pixels.toml");
    std::fs::write(
        &cfg,
        "[learner]\naction_scales = [0.1, 0.1, 0.1, 0.5]\n\n[human]\nclose_high_m = 0.04\n",
    )
    .unwrap();
    let demo_with = |cfg: &std::path::Path| {
        let mut c = demo(
            &[
                "--vision",
                "--episodes",
                "2",
                "--demos",
                "1",
                "--eval-episodes",
                "1",
                "--json",
                "--no-record",
            ],
            dir.path(),
        );
        c.arg("--config").arg(cfg);
        c
    };
    let v = crate::common::json_output(&mut demo_with(&cfg));
    assert_eq!(v["episodes"], 2, "{v}");
    assert!(v["takeover_reasons"]["closing_high"].is_u64(), "{v}");
    let spec = std::fs::read_to_string(
        std::path::PathBuf::from(v["residual"].as_str().unwrap()).with_extension("policy.toml"),
    )
    .unwrap();
    assert!(spec.contains("action_scales"), "{spec}");
    // One bound per action component (four on `pick`), or the run is refused naming the key.
    std::fs::write(&cfg, "[learner]\naction_scales = [0.2, 0.2]\n").unwrap();
    let out = demo_with(&cfg).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("action_scales") && err.contains("(4)"),
        "{err}"
    );
}

#[test]
fn a_fleet_demo_runs_every_robot_with_its_own_seed_person_and_records_into_one_learner() {
    // Two robots, a short run with recording on: the layout a user finds, the fleet's rows.
    let dir = tempfile::tempdir().unwrap();
    let v = crate::common::json_output(&mut demo(
        &[
            "--robots",
            "2",
            "--episodes",
            "6",
            "--demos",
            "3",
            "--eval-episodes",
            "2",
            "--json",
        ],
        dir.path(),
    ));
    assert_eq!(v["robots"], 2, "{v}");
    assert_eq!(v["episodes"], 6, "{v}");
    assert_eq!(v["demonstrations"], 3, "{v}");
    let run = std::path::PathBuf::from(v["run_dir"].as_str().unwrap());
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("summary.json")).unwrap()).unwrap();
    let robots: Vec<u64> = summary["episodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["robot"].as_u64().unwrap())
        .collect();
    assert_eq!(robots.len(), 6, "{summary}");
    for r in [0, 1] {
        assert!(
            robots.contains(&r),
            "robot {r} ran no training episode: {robots:?}"
        );
    }
    // Each robot's episodes and steps where a user looks: the first robot's in the run's own
    // folders (what `reflex distill` and `reflex replay` read), the second's under robot1/.
    for d in [run.clone(), run.join("robot1")] {
        for sub in ["episodes", "steps"] {
            let p = d.join(sub);
            assert!(
                p.is_dir() && std::fs::read_dir(&p).unwrap().next().is_some(),
                "{} is empty or missing",
                p.display()
            );
        }
    }
    assert!(
        !run.join("robot2").exists(),
        "a third robot's folder in a fleet of two"
    );
    // A fleet out of range is refused by the flag's name.
    let out = demo(&["--robots", "0", "--json"], dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--robots"), "{err}");
}

#[test]
fn the_insert_demo_runs_its_own_base_on_insert_and_keeps_insert_in_the_refined_config() {
    let dir = tempfile::tempdir().unwrap();
    let v = crate::common::json_output(&mut demo(
        &[
            "--task",
            "insert",
            "--episodes",
            "3",
            "--demos",
            "1",
            "--eval-episodes",
            "2",
            "--json",
            "--no-record",
        ],
        dir.path(),
    ));
    assert_eq!(v["episodes"], 3, "{v}");
    assert_eq!(v["held_out"]["episodes"], 2, "{v}");
    let refined = std::fs::read_to_string(v["refined_config"].as_str().unwrap()).unwrap();
    assert!(refined.contains("task = \"insert\""), "{refined}");
    assert!(refined.contains("models/insert.onnx"), "{refined}");
    // The pixel demo is pick's; a task without a shipped base is refused with the flag named.
    let o = demo(
        &["--task", "insert", "--vision", "--episodes", "1"],
        dir.path(),
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--task"), "{err}");
}

#[test]
fn the_learner_on_two_threads_learns_the_same_to_the_bit_as_on_one() {
    // `--threads` moves only the wall time: the split of a product over threads keeps every
    // sum's order (docs/learner.md). 128-wide layers at batch 256 are split on two threads.
    let dir = tempfile::tempdir().unwrap();
    let run = |threads: &str| {
        let v = crate::common::json_output(&mut demo(
            &[
                "--robots",
                "2",
                "--episodes",
                "8",
                "--demos",
                "2",
                "--eval-episodes",
                "4",
                "--threads",
                threads,
                "--json",
                "--no-record",
            ],
            dir.path(),
        ));
        let run = std::path::PathBuf::from(v["run_dir"].as_str().unwrap());
        let summary: serde_json::Value =
            serde_json::from_slice(&std::fs::read(run.join("summary.json")).unwrap()).unwrap();
        (
            v,
            summary["episodes"].clone(),
            std::fs::read(run.join("residual.onnx")).unwrap(),
        )
    };
    let (one, rows1, res1) = run("1");
    let (two, rows2, res2) = run("2");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(one["learner_threads"], 1, "{one}");
    assert_eq!(two["learner_threads"], 2.min(cores), "{two}");
    assert!(one["updates"].as_u64().unwrap() > 0, "{one}");
    assert_eq!(one["updates"], two["updates"]);
    assert_eq!(rows1, rows2, "the episodes differ with the thread count");
    assert!(
        res1 == res2,
        "the kept residual differs with the thread count"
    );
    assert_eq!(one["held_out"], two["held_out"]);
}

#[test]
fn four_robots_learning_together_lift_the_base_with_a_quarter_of_the_episodes_each() {
    // 100 training episodes over four robots, 25 each. Measured on seeds 0-3 (docs/training.md,
    // "Several robots, one learner"): 97 / 94 / 97 / 89 % held out; the base alone makes 38-46 %.
    let dir = tempfile::tempdir().unwrap();
    let v = crate::common::json_output(&mut demo(
        &[
            "--robots",
            "4",
            "--episodes",
            "100",
            "--seed",
            "0",
            "--json",
            "--no-record",
        ],
        dir.path(),
    ));
    assert_eq!(v["robots"], 4, "{v}");
    let summary: serde_json::Value = serde_json::from_slice(
        &std::fs::read(std::path::Path::new(v["run_dir"].as_str().unwrap()).join("summary.json"))
            .unwrap(),
    )
    .unwrap();
    let mut per_robot = [0u32; 4];
    for r in summary["episodes"].as_array().unwrap() {
        per_robot[r["robot"].as_u64().unwrap() as usize] += 1;
    }
    // The robots take turns, so each ran about a quarter of the fleet's episodes (an episode
    // lasts 20-150 steps).
    assert!(
        per_robot.iter().all(|&n| (15..=35).contains(&n)),
        "episodes per robot: {per_robot:?}"
    );
    let h = &v["held_out"];
    assert_eq!(h["episodes"], 100, "{v}");
    assert_eq!(h["takeovers"], 0, "{v}");
    assert_eq!(
        h["seeds_seen_in_training"], 0,
        "no robot of the fleet trained on a held-out seed: {v}"
    );
    let held = h["success_rate"].as_f64().unwrap();
    assert!(
        held >= 0.75,
        "the fleet's refined policy alone: {held}, the base alone 38-46%: {h}"
    );
}
