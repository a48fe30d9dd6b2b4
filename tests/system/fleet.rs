//! One learner for a fleet: every actor has its own numbered stream into the one learner, the
//! learner keeps each actor's position across a restart, weights reach every robot, and a robot
//! of another spec is refused and told why.

use crate::common::{
    child_stderr, episodes_finished as finished, reflex, repo, spawn, unix_endpoint, wait_exit,
    wait_until,
};
use reflex_bus::learnlink::{
    ActorLink, Fleet, LearnerLink, LinkConfig, LinkPosition, StepShape, WeightsShape,
};
use reflex_bus::{BusConfig, Keys};
use reflex_contracts::msg::{self, ActionKind, RobotSpec};
use std::collections::BTreeMap;
use std::time::Duration;
use zenoh::Wait;

fn spec(name: &str, actions: &[&str]) -> RobotSpec {
    RobotSpec::new(name, "test/fleet", 20.0)
        .with_state("q", 2, "rad")
        .with_action(ActionKind::Box, actions, -1.0, 1.0)
}

fn actor(session: &zenoh::Session, robot: &str, act: usize) -> ActorLink {
    let (w, _r) = reflex_runtime::triple::triple(reflex_runtime::residual::Weights::default());
    ActorLink::new(
        session,
        &Keys::new(robot).unwrap(),
        LinkConfig {
            batch_steps: 8,
            flush_ms: 5.0,
            ..Default::default()
        },
        reflex_runtime::residual::WeightsWriter::from_writer(w),
        WeightsShape {
            len: 4 * act,
            arch: 0,
        },
    )
    .unwrap()
}

#[test]
fn one_learner_keeps_each_actors_numbering_and_refuses_a_robot_of_another_spec() {
    let dir = tempfile::tempdir().unwrap();
    let ep = unix_endpoint(&dir, "fleet");
    let robots = BusConfig::hermetic(vec![ep.clone()], vec![])
        .open()
        .unwrap();
    let ws = BusConfig::hermetic(vec![], vec![ep]).open().unwrap();
    // Each robot answers for its spec; `odd` has two actions where the fleet has one.
    let mut specs = vec![];
    for (name, s) in [
        ("arm-1", spec("arm-1", &["x"])),
        ("arm-2", spec("arm-2", &["x"])),
        ("odd", spec("odd", &["x", "y"])),
    ] {
        let key = Keys::new(name).unwrap().spec;
        let bytes = msg::encode(&s);
        specs.push(
            robots
                .declare_queryable(key.clone())
                .callback(move |q| {
                    let _ = q.reply(key.clone(), bytes.clone()).wait();
                })
                .wait()
                .unwrap(),
        );
    }
    let mut learner = LearnerLink::new(&ws, &Fleet::Any, LinkPosition::default()).unwrap();
    learner.expect_spec("arm-1", spec("arm-1", &["x"])).unwrap();
    learner.expect_steps(StepShape {
        obs: 2,
        act: 1,
        features: None,
    });
    let mut actors = [
        (actor(&robots, "arm-1", 1), 100u32, 1),
        (actor(&robots, "arm-2", 1), 60, 1),
        (actor(&robots, "odd", 2), 30, 2),
    ];
    for (a, n, act) in &mut actors {
        let mut t = reflex_runtime::outbox::Transition::with_dims(2, *act);
        for i in 0..*n {
            t.step = i;
            a.offer(&t);
        }
    }
    let mut taken: BTreeMap<String, usize> = BTreeMap::new();
    wait_until("both arms' steps taken and `odd` told why not", 30, || {
        for (a, _, _) in &mut actors {
            a.tick();
        }
        while let Some(b) = learner.next_batch(Duration::from_millis(20)) {
            *taken.entry(b.robot.clone()).or_default() += b.steps.len();
            let pos = learner.position();
            let p = pos
                .actors
                .iter()
                .find(|p| p.robot == b.robot && p.actor == b.actor)
                .unwrap();
            learner.persisted(&b.robot, b.actor, p.received);
        }
        learner.tick();
        taken.get("arm-1") == Some(&100)
            && taken.get("arm-2") == Some(&60)
            && actors[2].0.stats().refused_by_learner.is_some()
            && actors[..2]
                .iter()
                .all(|(a, n, _)| a.stats().persisted == *n as u64)
    });
    // Each actor has its own numbering: two positions, each at its own count.
    let pos = learner.position();
    let by_robot: BTreeMap<&str, (u64, u64)> = pos
        .actors
        .iter()
        .map(|p| (p.robot.as_str(), (p.received, p.persisted)))
        .collect();
    assert_eq!(by_robot.len(), 2, "{pos:?}");
    assert_eq!(by_robot["arm-1"], (100, 100));
    assert_eq!(by_robot["arm-2"], (60, 60));
    assert!(!taken.contains_key("odd"), "{taken:?}");
    let st = learner.stats();
    assert!(st.refused_spec >= 1, "{st:?}");
    let why = actors[2].0.stats().refused_by_learner.unwrap();
    assert!(why.contains("odd") && why.contains("actions"), "{why}");
    // The refused actor keeps its steps (nothing persisted), for a learner of its own.
    assert_eq!(actors[2].0.stats().persisted, 0);
    // One weights stream: every accepted robot gets each version; `odd` gets none.
    learner.publish_weights(1, &[0.5; 4], 0);
    wait_until("version 1 on both arms", 20, || {
        actors[..2]
            .iter()
            .all(|(a, _, _)| a.stats().weights_version == 1)
    });
    assert_eq!(actors[2].0.stats().weights_version, 0);
    let report = learner.actors();
    assert!(report.iter().all(|a| a.behind == 0), "{report:?}");
}

/// The ONNX Runtime library of the project's .venv (`make test` makes it): the learner below runs
/// in a scratch directory, where reflex's own search (working directory and its parents) does not
/// reach the checkout.
fn project_onnxruntime() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH") {
        return p.into();
    }
    let lib = repo().join(".venv/lib");
    std::fs::read_dir(&lib)
        .unwrap_or_else(|e| panic!("{}: {e} (run `make venv`)", lib.display()))
        .flatten()
        .map(|py| py.path().join("site-packages/onnxruntime/capi"))
        .flat_map(std::fs::read_dir)
        .flatten()
        .flatten()
        .map(|f| f.path())
        .find(|f| f.to_string_lossy().contains("libonnxruntime.so."))
        .expect("onnxruntime in .venv (run `make venv`)")
}

#[test]
fn one_learner_serves_three_robots_through_its_own_restart_and_every_step_is_persisted() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = repo().join("configs/run/fleet-pick.toml");
    let router = unix_endpoint(&dir, "router");
    let learner = |name: &str, robots: &[&str]| {
        let mut c = reflex();
        // In the scratch directory: the config's checkpoint path is relative to it.
        c.current_dir(dir.path())
            .env("RUST_LOG", "info")
            .env("ORT_DYLIB_PATH", project_onnxruntime())
            .args([
                "learn",
                "--json",
                "--exit-when-actor-leaves",
                "--no-multicast",
                "--wait-s",
                "60",
                "--router",
                "--listen",
                &router,
                "--config",
            ]);
        c.arg(&cfg);
        for r in robots {
            c.args(["--robot", r]);
        }
        spawn(c, &dir, name)
    };
    let socket = |name: &str| dir.path().join(format!("{name}.sock"));
    // A serves the robots the config's `[learner] fleet` names.
    let mut a = learner("learner-a", &[]);
    wait_until("the learner's router listens", 30, || {
        socket("router").exists()
    });
    let mut sims = vec![];
    let mut runs = vec![];
    for i in 1..=3 {
        let (robot, sim) = (format!("arm-{i}"), format!("sim-{i}"));
        let ep = unix_endpoint(&dir, &sim);
        let mut c = reflex();
        c.args(["sim", "serve", "--task", "pick", "--robot", &robot]);
        c.args(["--no-multicast", "--listen", &ep]);
        sims.push(spawn(c, &dir, &sim));
        wait_until("the simulator listens", 30, || socket(&sim).exists());
        let mut c = reflex();
        c.args(["run", "--json", "--no-multicast", "--robot-name", &robot]);
        c.args([
            "--seed",
            &i.to_string(),
            "--connect",
            &ep,
            "--connect",
            &router,
        ]);
        c.arg("--record").arg(dir.path().join(&robot));
        c.arg("--config").arg(&cfg);
        runs.push(spawn(c, &dir, &robot));
    }
    let ckpt = dir.path().join("fleet/sac.ckpt");
    // Learner A checkpoints and every robot finishes an episode; then A is killed hard.
    wait_until("a checkpoint and an episode on every robot", 300, || {
        for (i, r) in runs.iter_mut().enumerate() {
            let name = format!("arm-{}", i + 1);
            assert!(
                r.0.try_wait().unwrap().is_none(),
                "{name} ended early: {}",
                child_stderr(&dir, &name)
            );
        }
        ckpt.exists() && (1..=3).all(|i| finished(&dir.path().join(format!("arm-{i}"))) >= 1)
    });
    a.0.kill().unwrap();
    a.0.wait().unwrap();
    // Learner B resumes from A's checkpoint on the same endpoint and takes every robot that
    // shows up (`--robot '*'`); every robot reconnects.
    let mut b = learner("learner-b", &["*"]);
    for (i, r) in runs.iter_mut().enumerate() {
        wait_exit(r, &format!("arm-{}", i + 1), &dir, 600);
    }
    wait_exit(&mut b, "learner-b", &dir, 120);
    let json = |name: &str| -> serde_json::Value {
        serde_json::from_str(
            &std::fs::read_to_string(dir.path().join(format!("{name}.out"))).unwrap(),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}: {}", child_stderr(&dir, name)))
    };
    let bv = json("learner-b");
    eprintln!("learner B: {bv}");
    let actors = bv["actors"].as_array().unwrap();
    let mut total = 0;
    for i in 1..=3 {
        let robot = format!("arm-{i}");
        let av = json(&robot);
        let link = &av["learner_link"];
        let sent = link["steps"].as_u64().unwrap();
        total += sent;
        eprintln!(
            "{robot}: success {} over {} episodes, residual v{}, link {link}",
            av["success_rate"], av["episodes"], av["residual_version"]
        );
        assert_eq!(av["episodes"], 10, "{av}");
        assert_eq!(link["lost"], 0, "{link}");
        assert_eq!(
            link["persisted"].as_u64().unwrap(),
            sent,
            "sent = persisted: {link}"
        );
        assert!(
            link["learner_instances"].as_u64().unwrap() >= 2,
            "{robot} saw both learners: {link}"
        );
        assert!(
            link["swaps"].as_u64().unwrap() > 0,
            "weights reached {robot}: {link}"
        );
        assert!(av["residual_version"].as_u64().unwrap() > 0, "{av}");
        // The learner's own account of this actor: everything received and persisted.
        let mine: Vec<&serde_json::Value> = actors.iter().filter(|x| x["robot"] == robot).collect();
        assert_eq!(mine.len(), 1, "one actor of {robot}: {bv}");
        assert_eq!(mine[0]["received"].as_u64().unwrap(), sent, "{bv}");
        assert_eq!(mine[0]["persisted"].as_u64().unwrap(), sent, "{bv}");
        assert_eq!(mine[0]["behind"], 0, "{bv}");
    }
    let resumed = bv["resumed_at"].as_u64().unwrap();
    assert!(
        resumed > 0 && resumed < total,
        "B resumed from A's checkpoint: {bv}"
    );
    assert_eq!(bv["received"].as_u64().unwrap(), total, "{bv}");
    assert_eq!(bv["persisted"].as_u64().unwrap(), total, "{bv}");
    // One replay: every robot's every step stored once.
    assert_eq!(bv["online_buffer"].as_u64().unwrap(), total, "{bv}");
}

#[test]
fn bench_fleet_reports_each_fleet_sizes_rates_with_every_step_persisted() {
    let mut c = reflex();
    c.env("ORT_DYLIB_PATH", project_onnxruntime()).args([
        "bench", "fleet", "--actors", "1,2", "--steps", "300", "--json",
    ]);
    let v = crate::common::json_output(&mut c);
    let points = v["points"].as_array().unwrap();
    assert_eq!(points.len(), 2, "{v}");
    for (p, n) in points.iter().zip([1u64, 2]) {
        assert_eq!(p["actors"], n, "{p}");
        assert_eq!(p["steps"], 300 * n, "{p}");
        assert_eq!(p["persisted"], 300 * n, "every step persisted: {p}");
        for k in [
            "steps_per_s",
            "trained_steps_per_s",
            "updates_per_s",
            "robots_at_20hz",
        ] {
            assert!(p[k].as_f64().unwrap() > 0.0, "{k}: {p}");
        }
    }
}
