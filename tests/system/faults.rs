//! Nothing from the network can hurt the robot: each test pins one defect found by reading the
//! code as a peer would attack it (docs/reliability.md lists them with what reflex guarantees).

use crate::common::{json_output, matching, reflex, repo};
use reflex_bench::workloads::NullRobot;
use reflex_bus::learnlink::{
    ActorLink, Fleet, LearnerLink, LinkConfig, LinkPosition, StepShape, WeightsShape,
};
use reflex_bus::robot::{RemoteRobot, RobotServer, ServeMode};
use reflex_bus::{BusConfig, Keys};
use reflex_contracts::msg::{
    self, Command, Observation, PROTOCOL_VERSION, RobotSpec, TransitionBatch, WireStep,
};
use reflex_contracts::robot::{Robot, RobotError};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};
use zenoh::Wait;

/// Two sessions on one loopback endpoint (a unix socket in `dir`).
fn pair(dir: &tempfile::TempDir) -> (zenoh::Session, zenoh::Session) {
    let ep = crate::common::unix_endpoint(dir, "bus");
    let a = BusConfig::hermetic(vec![ep.clone()], vec![])
        .open()
        .unwrap();
    let b = BusConfig::hermetic(vec![], vec![ep]).open().unwrap();
    (a, b)
}

/// A robot whose spec is whatever the test makes it.
struct Liar {
    inner: NullRobot,
    spec: RobotSpec,
}

impl Robot for Liar {
    fn spec(&self) -> &RobotSpec {
        &self.spec
    }
    fn reset(&mut self, s: Option<u64>) -> Result<&Observation, RobotError> {
        self.inner.reset(s)
    }
    fn command(&mut self, a: &[f32]) -> Result<(), RobotError> {
        self.inner.command(a)
    }
    fn observe(&mut self) -> Result<&Observation, RobotError> {
        self.inner.observe()
    }
    fn hold_action(&self, out: &mut [f32]) {
        out.fill(0.0)
    }
}

#[test]
fn a_robot_spec_with_short_action_bounds_is_refused_when_connecting_not_indexed_on_the_loop() {
    // Before: `hold_action` and the loop's clamp indexed `action.low[i]` past its end.
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = pair(&dir);
    let inner = NullRobot::new("liar", 8, 0);
    let mut spec = inner.spec().clone();
    spec.lockstep = true;
    spec.action.low.truncate(2);
    let server = RobotServer::new(&a, Liar { inner, spec }, ServeMode::Lockstep)
        .unwrap()
        .spawn();
    let err = RemoteRobot::connect(&b, "liar", Duration::from_secs(20))
        .err()
        .expect("a spec that cannot be driven is refused");
    let text = err.to_string();
    assert!(text.contains("liar") && text.contains("bounds"), "{text}");
    drop(server);
}

/// Serves a lockstep robot by hand on `a`: a valid spec and reset, then on every command the
/// observation `answer(seq)` (the test decides how wrong it is).
fn hostile_robot(
    a: &zenoh::Session,
    answer: impl Fn(u64) -> Observation + Send + Sync + 'static,
) -> Vec<Box<dyn std::any::Any>> {
    let keys = Keys::new("hostile").unwrap();
    let spec = RobotSpec::new("hostile", "test/hostile", 50.0)
        .with_state("ee_pos", 3, "m")
        .with_state("rest", 1, "")
        .with_action(
            reflex_contracts::msg::ActionKind::Box,
            &["a", "b"],
            -1.0,
            1.0,
        );
    let good = Observation {
        v: PROTOCOL_VERSION,
        episode: 1,
        state: vec![0.1, 0.0, 0.1, 0.0],
        ..Default::default()
    };
    let mut keep: Vec<Box<dyn std::any::Any>> = vec![];
    let (sk, bytes) = (keys.spec.clone(), msg::encode(&spec));
    keep.push(Box::new(
        a.declare_queryable(keys.spec.clone())
            .callback(move |q| {
                let _ = q.reply(sk.clone(), bytes.clone()).wait();
            })
            .wait()
            .unwrap(),
    ));
    let (rk, reset) = (keys.reset.clone(), msg::encode(&good));
    keep.push(Box::new(
        a.declare_queryable(keys.reset.clone())
            .callback(move |q| {
                let _ = q.reply(rk.clone(), reset.clone()).wait();
            })
            .wait()
            .unwrap(),
    ));
    let publisher = a.declare_publisher(keys.obs.clone()).wait().unwrap();
    keep.push(Box::new(
        a.declare_subscriber(keys.cmd.clone())
            .callback(move |s| {
                let c: Command = msg::decode("cmd", &s.payload().to_bytes()).unwrap();
                let _ = publisher.put(msg::encode(&answer(c.seq))).wait();
            })
            .wait()
            .unwrap(),
    ));
    keep.push(Box::new(
        a.liveliness()
            .declare_token(keys.alive_robot.clone())
            .wait()
            .unwrap(),
    ));
    keep
}

#[test]
fn observations_that_do_not_fit_the_spec_are_rejected_and_counted_never_indexed() {
    // Before: a state shorter than the spec reached the loop, which sliced `ee_pos` out of it.
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = pair(&dir);
    let _robot = hostile_robot(&a, |seq| Observation {
        v: PROTOCOL_VERSION,
        seq,
        episode: 1,
        step: seq as u32,
        // seq 1: too short; seq 2: NaN; later: good.
        state: match seq {
            1 => vec![0.1],
            2 => vec![f32::NAN, 0.0, 0.1, 0.0],
            _ => vec![0.1, 0.0, 0.1, 0.0],
        },
        ..Default::default()
    });
    let mut r = RemoteRobot::connect(&b, "hostile", Duration::from_millis(1500)).unwrap();
    r.reset(Some(1)).unwrap();
    for bad in [1, 2] {
        r.command(&[0.0, 0.0]).unwrap();
        let e = r.observe().expect_err("the bad answer never arrives");
        assert!(matches!(e, RobotError::Timeout { .. }), "step {bad}: {e}");
    }
    r.command(&[0.0, 0.0]).unwrap();
    assert_eq!(r.observe().unwrap().state.len(), 4);
    assert_eq!(r.rejects().count(), 2, "both bad observations are counted");
}

fn link_pair(
    dir: &tempfile::TempDir,
    shape: WeightsShape,
) -> (
    (zenoh::Session, zenoh::Session),
    ActorLink,
    LearnerLink,
    reflex_runtime::triple::Reader<reflex_runtime::residual::Weights>,
) {
    let (a, b) = pair(dir);
    let keys = Keys::new("w").unwrap();
    let (w, r) = reflex_runtime::triple::triple(reflex_runtime::residual::Weights::default());
    let actor = ActorLink::new(
        &a,
        &keys,
        LinkConfig::default(),
        reflex_runtime::residual::WeightsWriter::from_writer(w),
        shape,
    )
    .unwrap();
    let learner = LearnerLink::new(
        &b,
        &Fleet::one(&keys.robot).unwrap(),
        LinkPosition::default(),
    )
    .unwrap();
    ((a, b), actor, learner, r)
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !ok() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{what} never happened"
        );
        // Paces the polling.
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn weights_of_another_architecture_or_diverged_are_rejected_and_the_loop_keeps_its_last_good_ones()
{
    // Before: `total` sized an allocation with no bound, NaN marked "missing" (so NaN weights
    // corrupted the count), and the hook sliced a vector of any length.
    let dir = tempfile::tempdir().unwrap();
    let shape = WeightsShape { len: 10, arch: 77 };
    let (s, actor, mut learner, mut reader) = link_pair(&dir, shape);
    crate::common::wait_for_subscriber(&s.1, &Keys::new("w").unwrap().learn_weights);
    learner.publish_weights(1, &[0.5; 10], 77);
    wait_for("version 1", || actor.stats().weights_version == 1);
    learner.publish_weights(2, &[0.5; 3_000_000], 77); // another size: 3 M floats, not 10
    learner.publish_weights(3, &[0.5; 10], 78); // another architecture
    let mut nan = [0.25f32; 10];
    nan[4] = f32::NAN;
    learner.publish_weights(4, &nan, 77); // a diverged learner
    wait_for("three rejections", || actor.stats().rejected_weights >= 3);
    reader.update();
    assert_eq!(
        reader.get().version,
        1,
        "the loop keeps its last good weights"
    );
    assert!(reader.get().values.iter().all(|v| *v == 0.5));
    learner.publish_weights(5, &[0.75; 10], 77);
    wait_for("version 5", || actor.stats().weights_version == 5);
    // Counted per message: the 3 M-value version arrived as 184 chunks, each refused unread.
    let st = actor.stats();
    assert_eq!(st.rejected_weights, 184 + 2, "{st:?}");
}

#[test]
fn the_learner_leaves_out_steps_that_do_not_fit_the_robot() {
    // Before: the learner copied whatever lengths a `WireStep` carried into its replay buffer.
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = pair(&dir);
    let keys = Keys::new("s").unwrap();
    let mut learner = LearnerLink::new(
        &b,
        &Fleet::one(&keys.robot).unwrap(),
        LinkPosition::default(),
    )
    .unwrap();
    learner.expect_steps(StepShape {
        obs: 3,
        act: 2,
        features: None,
    });
    let publisher = a
        .declare_publisher(keys.learn_transitions.clone())
        .wait()
        .unwrap();
    let step = |obs: Vec<f32>| WireStep {
        obs: obs.clone(),
        next_obs: obs,
        base: vec![0.0; 2],
        action: vec![0.0; 2],
        ..Default::default()
    };
    let batch = TransitionBatch {
        v: PROTOCOL_VERSION,
        actor: 9,
        first_seq: 0,
        held_from: 0,
        steps: vec![
            step(vec![0.0; 3]),
            step(vec![0.0; 1]),
            step(vec![0.0, f32::INFINITY, 0.0]),
            step(vec![1.0; 3]),
        ],
        flush: false,
        offered: 0,
    };
    crate::common::wait_for_subscriber(&a, &keys.learn_transitions);
    publisher.put(msg::encode(&batch)).wait().unwrap();
    let got = learner
        .next_batch(Duration::from_secs(10))
        .expect("the batch arrives");
    assert_eq!(got.steps.len(), 2, "two good steps");
    assert_eq!(
        learner.position().received(),
        4,
        "the bad ones keep their numbers"
    );
    assert_eq!(learner.stats().rejected_steps, 2);
}

#[test]
fn a_learner_that_sees_refuses_steps_whose_features_another_encoder_or_shape_made() {
    use reflex_bus::learnlink::FeatureExpect;
    use reflex_contracts::msg::StepFeatures;
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = pair(&dir);
    let keys = Keys::new("f").unwrap();
    let mut learner = LearnerLink::new(
        &b,
        &Fleet::one(&keys.robot).unwrap(),
        LinkPosition::default(),
    )
    .unwrap();
    let expect = FeatureExpect {
        encoder: "front.encoder.onnx#1a2b".into(),
        shapes: vec![[2, 2, 3]],
    };
    learner.expect_steps(StepShape {
        obs: 3,
        act: 2,
        features: Some(expect.clone()),
    });
    // A learner without heads refuses steps that carry features.
    let blind = StepShape {
        obs: 3,
        act: 2,
        features: None,
    };
    let publisher = a
        .declare_publisher(keys.learn_transitions.clone())
        .wait()
        .unwrap();
    let step = |features: Option<StepFeatures>| WireStep {
        obs: vec![0.0; 3],
        next_obs: vec![0.0; 3],
        base: vec![0.0; 2],
        action: vec![0.0; 2],
        features,
        ..Default::default()
    };
    let good = StepFeatures {
        encoder: expect.encoder.clone(),
        shapes: expect.shapes.clone(),
        obs: vec![0.5; 12],
        next_obs: vec![0.25; 12],
    };
    let e = blind
        .check(&step(Some(good.clone())))
        .unwrap_err()
        .to_string();
    assert!(e.contains("without [learner.vision]"), "{e}");
    let mut nan = good.clone();
    nan.next_obs[7] = f32::NAN;
    // Each bad step, and what its reject says.
    let bad = [
        (step(None), "missing"),
        (
            step(Some(StepFeatures {
                encoder: "wrist.encoder.onnx#ffff".into(),
                ..good.clone()
            })),
            "made by encoder `wrist.encoder.onnx#ffff`",
        ),
        (
            // The same number of values in another shape.
            step(Some(StepFeatures {
                shapes: vec![[3, 2, 2]],
                ..good.clone()
            })),
            "of shapes [[3, 2, 2]]",
        ),
        (
            step(Some(StepFeatures {
                obs: vec![0.5; 11],
                ..good.clone()
            })),
            "`obs` has 11 values",
        ),
        (step(Some(nan)), "`next_obs`[7] is NaN"),
    ];
    let shape = StepShape {
        obs: 3,
        act: 2,
        features: Some(expect),
    };
    for (s, why) in &bad {
        let e = shape.check(s).unwrap_err().to_string();
        assert!(e.contains(why), "`{e}` does not say `{why}`");
    }
    let mut steps = vec![step(Some(good.clone()))];
    steps.extend(bad.into_iter().map(|(s, _)| s));
    steps.push(step(Some(good.clone())));
    let batch = TransitionBatch {
        v: PROTOCOL_VERSION,
        actor: 9,
        first_seq: 0,
        held_from: 0,
        steps,
        flush: false,
        offered: 0,
    };
    crate::common::wait_for_subscriber(&a, &keys.learn_transitions);
    publisher.put(msg::encode(&batch)).wait().unwrap();
    let got = learner
        .next_batch(Duration::from_secs(10))
        .expect("the batch arrives");
    assert_eq!(got.steps.len(), 2, "the two good steps");
    assert!(got.steps.iter().all(|s| s.features.as_ref() == Some(&good)));
    assert_eq!(
        learner.position().received(),
        7,
        "the bad ones keep their numbers"
    );
    assert_eq!(learner.stats().rejected_steps, 5);
}

#[test]
fn a_flood_of_commands_never_blocks_the_robot_servers_callbacks() {
    // Before: Zenoh's callback did a blocking `send` on the server's bounded queue.
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = pair(&dir);
    let mut spec_robot = NullRobot::new("flood", 4, 0);
    let _ = spec_robot.reset(None);
    let mut server = RobotServer::new(&a, spec_robot, ServeMode::Lockstep).unwrap();
    let keys = Keys::new("flood").unwrap();
    let p = b.declare_publisher(keys.cmd.clone()).wait().unwrap();
    // Before the flood, the server's command subscriber and spec queryable are known here.
    crate::common::wait_for_subscriber(&b, &keys.cmd);
    let spec_answers = || {
        b.get(keys.spec.clone())
            .timeout(Duration::from_secs(5))
            .wait()
            .unwrap()
            .recv()
            .is_ok()
    };
    crate::common::wait_until("the server's spec queryable", 20, spec_answers);
    // The server is not running: nothing drains its queue of 256.
    for seq in 1..=600u64 {
        let c = Command {
            v: PROTOCOL_VERSION,
            seq,
            action: vec![0.0; 4],
        };
        p.put(msg::encode(&c)).wait().unwrap();
    }
    let bad = Command {
        v: PROTOCOL_VERSION,
        seq: 601,
        action: vec![0.0; 3],
    };
    p.put(msg::encode(&bad)).wait().unwrap();
    // The spec still answers (within the query's 5 s timeout): Zenoh's threads are not stuck
    // in a callback.
    assert!(spec_answers(), "no spec reply after the flood");
    let stop = std::sync::atomic::AtomicBool::new(true);
    let stats = server.run(&stop).unwrap();
    assert!(
        stats.rejected_commands >= 600 - 256,
        "dropped commands are counted: {stats:?}"
    );
}

#[test]
fn a_reader_of_a_type_that_is_not_sync_is_not_sync_itself() {
    // Before: `Shared<T: Send>` was declared Sync, so a `Reader<Cell<_>>` could be shared between
    // threads, each holding `&Cell` at once.
    struct Probe<T: ?Sized>(std::marker::PhantomData<T>);
    trait NotSync {
        const SYNC: bool = false;
    }
    impl<T: ?Sized> NotSync for Probe<T> {}
    impl<T: ?Sized + Sync> Probe<T> {
        const SYNC: bool = true;
    }
    type R<T> = reflex_runtime::triple::Reader<T>;
    const { assert!(!Probe::<R<std::cell::Cell<u8>>>::SYNC) };
    const { assert!(Probe::<R<u8>>::SYNC) };
}

/// `configs/run/sim-pick-hil.toml` as the issue ran it: simulated time, 2 episodes, the learner's
/// checkpoint in `dir`, no multicast.
fn hil_config(dir: &std::path::Path) -> std::path::PathBuf {
    let text = std::fs::read_to_string(repo().join("configs/run/sim-pick-hil.toml"))
        .unwrap()
        .replace("clock = \"wall\"", "clock = \"sim\"")
        .replace(
            "runs/learner/pick-sac.ckpt",
            &dir.join("ckpt/pick-sac.ckpt").display().to_string(),
        )
        .replace("../../models/", &format!("{}/models/", repo().display()));
    let p = dir.join("hil.toml");
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn a_corrupt_checkpoint_stops_the_run_at_once_naming_the_file() {
    // Before: the in-process learner died, and every episode waited 120 s for it in silence.
    let dir = tempfile::tempdir().unwrap();
    let cfg = hil_config(dir.path());
    let ckpt = dir.path().join("ckpt/pick-sac.ckpt");
    std::fs::create_dir_all(ckpt.parent().unwrap()).unwrap();
    std::fs::write(&ckpt, b"not a checkpoint").unwrap();
    let out = reflex()
        .args([
            "run",
            "--episodes",
            "2",
            "--no-multicast",
            "--json",
            "--config",
        ])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("pick-sac.ckpt") && err.contains("on_bad_checkpoint"),
        "{err}"
    );
    // As configured: start afresh after moving the bad file aside.
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("[learner]\n", "[learner]\non_bad_checkpoint = \"fresh\"\n");
    std::fs::write(&cfg, text).unwrap();
    json_output(
        reflex()
            .args([
                "run",
                "--episodes",
                "1",
                "--no-multicast",
                "--json",
                "--config",
            ])
            .arg(&cfg),
    );
    let aside = std::fs::read_dir(ckpt.parent().unwrap())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .contains(".bad-")
        })
        .count();
    assert_eq!(aside, 1, "the bad file is kept aside");
}

#[test]
fn an_unpaced_run_stops_at_the_next_episode_when_its_learner_cannot_read_the_checkpoint() {
    // Before: an actor not paced by its learner (a person's wall-clock run) drove every episode
    // asked for, learning nothing, and reported the checkpoint only at the end.
    let dir = tempfile::tempdir().unwrap();
    let cfg = hil_config(dir.path());
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("[learner]\n", "[learner]\npace_lockstep = false\n");
    std::fs::write(&cfg, text).unwrap();
    let ckpt = dir.path().join("ckpt/pick-sac.ckpt");
    std::fs::create_dir_all(ckpt.parent().unwrap()).unwrap();
    std::fs::write(&ckpt, b"not a checkpoint").unwrap();
    let out = reflex()
        .args(["run", "--episodes", "1000", "--no-multicast", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let (text, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(!out.status.success());
    assert!(
        err.contains("pick-sac.ckpt") && err.contains("on_bad_checkpoint"),
        "{err}"
    );
    // The path once: the error names the key, the checkpoint's own error the file.
    assert_eq!(err.matches("pick-sac.ckpt`").count(), 1, "{err}");
    let episodes = text
        .lines()
        .chain(err.lines())
        .filter(|l| l.starts_with("episode "))
        .count();
    assert!(
        episodes < 1000,
        "all {episodes} episodes ran without a learner"
    );
}

#[test]
fn the_learner_persists_every_step_before_the_actor_exits_and_the_checkpoint_grows_with_the_data() {
    // Before: the end of every run lost its last steps after a 10 s wait ("200 steps were not
    // persisted"), and the checkpoint after 200 steps was 160 MB (the preallocated capacity).
    let dir = tempfile::tempdir().unwrap();
    let cfg = hil_config(dir.path());
    let t0 = Instant::now();
    let v = json_output(
        reflex()
            .args([
                "run",
                "--episodes",
                "2",
                "--no-multicast",
                "--json",
                "--config",
            ])
            .arg(&cfg),
    );
    let wall = t0.elapsed();
    let link = &v["learner_link"];
    assert_eq!(link["persisted"], link["steps"], "{link}");
    assert_eq!(link["lost"], 0, "{link}");
    assert!(wall < Duration::from_secs(60), "{wall:?}");
    let size = std::fs::metadata(dir.path().join("ckpt/pick-sac.ckpt"))
        .unwrap()
        .len();
    let steps = link["steps"].as_u64().unwrap();
    assert!(
        size < 8 << 20,
        "{size} bytes for {steps} steps: the checkpoint should hold the data, not the capacity"
    );
    // Beside the checkpoint the learner keeps its actor as a residual file, which runs on the
    // base with no learner.
    let residual = dir.path().join("ckpt/pick-sac.residual.onnx");
    let spec = std::fs::read_to_string(residual.with_extension("policy.toml")).unwrap();
    assert!(spec.contains("base_model = \"pick.onnx\""), "{spec}");
    let kept = dir.path().join("kept.toml");
    std::fs::write(
        &kept,
        format!(
            "[robot]\nsource = \"sim\"\n[sim]\ntask = \"pick\"\n[policy]\nkind = \"onnx\"\nmodel = {:?}\n[policy.residual]\nmodel = {:?}\n[run]\nepisodes = 2\n",
            repo().join("models/pick.onnx").display().to_string(),
            residual.display().to_string()
        ),
    )
    .unwrap();
    let v = json_output(
        reflex()
            .current_dir(repo())
            .args(["run", "--json", "--config"])
            .arg(&kept),
    );
    assert_eq!(v["episodes"], 2, "{v}");
    assert!(v["learner"].is_null(), "{v}");
}

#[test]
fn a_typo_in_the_learners_sac_table_is_an_error_naming_the_key() {
    // Before: `overlay_sac(..).unwrap_or(base)` replaced a bad table with the defaults silently.
    let dir = tempfile::tempdir().unwrap();
    let cfg = hil_config(dir.path());
    let text = std::fs::read_to_string(&cfg).unwrap() + "\n[learner.sac]\nhiden = [64, 64]\n";
    std::fs::write(&cfg, text).unwrap();
    let out = reflex()
        .args(["run", "--episodes", "1", "--no-multicast", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("hiden"), "{err}");
}

#[test]
fn real_time_settings_reach_the_loop_thread_only() {
    // Before: they were applied before the helper threads started, which inherited the loop's
    // CPU pin (and SCHED_FIFO).
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 {
        panic!("this test needs two CPUs to tell a pinned thread from an unpinned one");
    }
    let runs = tempfile::tempdir().unwrap();
    let robot = NullRobot::new("rt", 8, 20);
    let mut cfg = reflex_runtime::control::LoopConfig::at(100.0);
    cfg.rt.cpu = Some(1);
    let mut actor = reflex_agent::actor::ActorBuilder::new(robot)
        .loop_config(cfg)
        .record(runs.path().to_path_buf())
        .build()
        .unwrap();
    actor
        .run_episodes(1, &reflex_agent::progress::Silent)
        .unwrap();
    // A new thread names itself once it first runs; until then /proc shows its parent's name.
    // Poll (by thread id) until both helpers have named themselves.
    let threads = || -> Vec<(String, String)> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| {
                let dir = t.ok()?.path();
                let name = std::fs::read_to_string(dir.join("comm")).ok()?;
                let status = std::fs::read_to_string(dir.join("status")).ok()?;
                let cpus = status
                    .lines()
                    .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?
                    .trim()
                    .to_string();
                Some((name.trim().to_string(), cpus))
            })
            .collect()
    };
    let t0 = Instant::now();
    let mut seen = threads();
    while !["recorder", "outbox"]
        .iter()
        .all(|h| seen.iter().any(|(n, _)| n == h))
    {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the helper threads never named themselves: {seen:?}"
        );
        // Paces the polling.
        std::thread::sleep(Duration::from_millis(20));
        seen = threads();
    }
    // The loop ran on this thread: it is the one pinned.
    let own = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    let own = own
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim();
    assert_eq!(own, "1", "the loop thread is not pinned");
    for (name, cpus) in &seen {
        if name == "recorder" || name == "outbox" {
            assert_ne!(
                cpus, "1",
                "the {name} thread inherited the loop's CPU pin: {seen:?}"
            );
        }
    }
    actor.finish().unwrap();
}

#[test]
fn a_short_soak_with_faults_loses_no_transition_and_rejects_every_hostile_message() {
    // The shortened `reflex soak` (the full one runs 1,000,000 steps; docs/reliability.md):
    // learner restarts, NaN chunks and hostile traffic on every key, through the real binary.
    let dir = tempfile::tempdir().unwrap();
    let v = json_output(
        reflex()
            .args(["soak", "--steps", "20000", "--json", "--dir"])
            .arg(dir.path()),
    );
    assert!(v["steps"].as_u64().unwrap() >= 20_000, "{v}");
    assert_eq!(v["transitions_lost"], 0, "{v}");
    assert_eq!(v["transitions_persisted"], v["transitions_sent"], "{v}");
    assert_eq!(
        v["transitions_received_by_last_learner"], v["transitions_sent"],
        "the last learner holds every step once: {v}"
    );
    assert!(v["learner_restarts"].as_u64().unwrap() >= 1, "{v}");
    assert!(v["hostile_messages"].as_u64().unwrap() > 50, "{v}");
    // E-stop drills through the bus: latched, held, released, resumed; the run went on.
    assert!(v["estop_drills"].as_u64().unwrap() >= 1, "{v}");
    assert!(v["estop_held_ticks"].as_u64().unwrap() >= 100, "{v}");
    assert!(v["safety"]["estop"].as_u64().unwrap() >= 100, "{v}");
    for key in [
        "teleop",
        "events",
        "operator",
        "learn/state",
        "learn/weights",
    ] {
        let n = v["rejected"][format!("reflex/soak/{key}")]
            .as_u64()
            .unwrap_or(0);
        assert!(n > 0, "no rejection counted on {key}: {v}");
    }
    if v["nan_chunks_injected"].as_u64().unwrap() > 0 {
        assert!(v["safety"]["non_finite"].as_u64().unwrap() > 0, "{v}");
    }
}

#[test]
fn a_soak_or_bench_stopped_by_a_signal_leaves_no_temporary_directory() {
    // Each makes a directory of its own under TMPDIR (checkpoints and socket, the fleet's
    // sockets, the TLS keys); SIGTERM in the middle of the work removes it.
    for (args, inside) in [
        (&["soak", "--steps", "1000000"][..], "soak.sock"),
        (&["bench", "bus", "--tls", "--iters", "1000000"][..], "keys"),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let mut child = reflex()
            .env("TMPDIR", tmp.path())
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let made = || {
            std::fs::read_dir(tmp.path())
                .unwrap()
                .flatten()
                .any(|d| d.path().join(inside).exists())
        };
        wait_for(&format!("{args:?} making its directory"), || {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("{args:?} ended ({status}) before making its directory");
            }
            made()
        });
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(130), "{args:?}: {err}");
        assert!(err.contains("SIGTERM: stopped"), "{args:?}: {err}");
        let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().collect();
        assert!(left.is_empty(), "{args:?} left {left:?}");
    }
}

/// A TCP relay between a controller and a robot server that the test can cut (every open
/// connection shut, new ones refused) and restore: a network link that drops.
struct Relay {
    port: u16,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    open: std::sync::Arc<std::sync::Mutex<Vec<(std::net::TcpStream, UnixStream)>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Relay {
    /// A TCP listener on an OS-chosen loopback port (held for the relay's life) whose connections
    /// are forwarded to the unix socket `target`.
    fn to(target: std::path::PathBuf) -> Relay {
        use std::sync::atomic::Ordering::Relaxed;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let relay = Relay {
            port: listener.local_addr().unwrap().port(),
            cut: Default::default(),
            open: Default::default(),
            stop: Default::default(),
        };
        let (cut, open, stop) = (relay.cut.clone(), relay.open.clone(), relay.stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Relaxed) {
                let Ok((client, _)) = listener.accept() else {
                    // Paces the non-blocking accept loop of this relay.
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                if cut.load(Relaxed) {
                    continue; // refused: dropped at once
                }
                client.set_nonblocking(false).unwrap();
                let Ok(server) = UnixStream::connect(&target) else {
                    continue;
                };
                open.lock()
                    .unwrap()
                    .push((client.try_clone().unwrap(), server.try_clone().unwrap()));
                let (mut c_in, mut s_out) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut c_in, &mut s_out);
                    let _ = s_out.shutdown(std::net::Shutdown::Both);
                });
                let (mut s_in, mut c_out) = (server, client);
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut s_in, &mut c_out);
                    let _ = c_out.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        relay
    }

    fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::Relaxed);
        for (c, s) in self.open.lock().unwrap().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    fn restore(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.cut();
    }
}

#[test]
fn a_dropped_link_to_a_remote_robot_holds_it_on_its_own_side_and_work_resumes_after() {
    use reflex_agent::actor::{ActorBuilder, ClockChoice};
    use reflex_runtime::safety::SafetyEvent;
    use std::sync::atomic::Ordering::Relaxed;
    // The robot side: a free-running robot at 100 Hz behind a TCP relay.
    let socket_dir = tempfile::tempdir().unwrap();
    let server_ep = crate::common::unix_endpoint(&socket_dir, "robot");
    let robot_bus = BusConfig::hermetic(vec![server_ep.clone()], vec![])
        .open()
        .unwrap();
    let server = RobotServer::new(
        &robot_bus,
        NullRobot::new("far", 6, 0),
        ServeMode::Realtime { hz: 100.0 },
    )
    .unwrap();
    let counters = server.counters();
    let _serving = server.spawn();
    let target = socket_dir.path().join("robot.sock");
    let relay = Relay::to(target);
    // The controller: the actor on the wall clock, through the relay.
    let bus = BusConfig::hermetic(vec![], vec![format!("tcp/127.0.0.1:{}", relay.port)])
        .open()
        .unwrap();
    let robot = RemoteRobot::connect(&bus, "far", Duration::from_secs(5)).unwrap();
    let mut actor = ActorBuilder::new(robot)
        .policy(Box::new(reflex_bench::workloads::SweepPolicy::new(8, 4)))
        .clock(ClockChoice::Wall {
            spin: Duration::from_micros(200),
        })
        .build()
        .unwrap();
    actor.run_ticks(100).unwrap();
    let before = counters.commands.load(Relaxed);
    assert!(before > 50, "{before} commands reached the robot in 1 s");
    assert_eq!(counters.watchdog_trips.load(Relaxed), 0);

    // Link down for 1.5 s: the robot's own watchdog holds it; the actor's loop keeps its rate
    // and holds too (its observations went stale), and nothing fails.
    relay.cut();
    let stale0 = actor
        .control_loop()
        .safety_counters()
        .get(SafetyEvent::ObsStale);
    actor.run_ticks(150).unwrap();
    let during = counters.commands.load(Relaxed) - before;
    assert!(during <= 5, "{during} commands crossed a cut link");
    assert!(counters.holding.load(Relaxed), "the robot is not held");
    assert_eq!(counters.watchdog_trips.load(Relaxed), 1);
    let stale = actor
        .control_loop()
        .safety_counters()
        .get(SafetyEvent::ObsStale)
        - stale0;
    assert!(
        stale > 100,
        "the actor held on only {stale} of 150 stale ticks"
    );

    // Link back: Zenoh reconnects on its own (its retry backs off up to 4 s); commands resume,
    // the robot leaves its hold, the actor acts on fresh observations again.
    relay.restore();
    let t0 = Instant::now();
    let resumed = counters.commands.load(Relaxed);
    while counters.commands.load(Relaxed) < resumed + 50 {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "commands did not resume within 15 s of the link coming back"
        );
        actor.run_ticks(20).unwrap();
    }
    assert!(
        !counters.holding.load(Relaxed),
        "still held after commands resumed"
    );
    let stale_end = actor
        .control_loop()
        .safety_counters()
        .get(SafetyEvent::ObsStale);
    actor.run_ticks(100).unwrap();
    let stale_after = actor
        .control_loop()
        .safety_counters()
        .get(SafetyEvent::ObsStale)
        - stale_end;
    assert!(
        stale_after < 10,
        "{stale_after} stale ticks after the link came back"
    );
}

#[test]
fn a_full_disk_while_recording_marks_the_episodes_incomplete_and_the_run_goes_on() {
    // The disk "fills" at 20 kB per file: RLIMIT_FSIZE makes every write past it fail (EFBIG,
    // with SIGXFSZ ignored), as ENOSPC would. The run must finish its episodes, say which
    // recordings are incomplete and keep them under a name that says so.
    let dir = tempfile::tempdir().unwrap();
    let cfg = repo().join("configs/run/sim-pick-bc.toml");
    let full = json_output(
        std::process::Command::new("sh")
            .env("RUST_LOG", "warn")
            .args([
                "-c",
                // `timeout`: a run that hangs on the full disk fails the test instead.
                "trap '' XFSZ; exec timeout 300 prlimit --fsize=20000 -- \"$0\" \"$@\"",
                env!("CARGO_BIN_EXE_reflex"),
                "run",
                "--episodes",
                "3",
                "--json",
                "--record",
            ])
            .arg(dir.path())
            .arg("--config")
            .arg(&cfg),
    );
    assert_eq!(full["episodes"], 3, "{full}");
    let rec = &full["recording"];
    assert!(rec["steps_recorded"].as_u64().unwrap() > 0, "{rec}");
    assert_eq!(rec["episodes_incomplete"], 3, "{rec}");
    let ep_dir = std::path::PathBuf::from(rec["dir"].as_str().unwrap());
    assert!(ep_dir.join("episode_000001.rrd.partial").is_file());
    assert!(!ep_dir.join("episode_000001.rrd").exists());
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ep_dir.join("episode_000001.json")).unwrap())
            .unwrap();
    assert_eq!(summary["complete"], false, "{summary}");
    assert_eq!(summary["recording"], "episode_000001.rrd.partial");
    // After the failed write the run records no more episode files, and says so per episode.
    let second: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ep_dir.join("episode_000002.json")).unwrap())
            .unwrap();
    assert_eq!(second["complete"], false, "{second}");
    assert!(!ep_dir.join("episode_000002.rrd.partial").exists());
    // The same run with room to write: complete files, the same episodes.
    let dir2 = tempfile::tempdir().unwrap();
    let ok = json_output(
        reflex()
            .args(["run", "--episodes", "3", "--json", "--record"])
            .arg(dir2.path())
            .arg("--config")
            .arg(&cfg),
    );
    assert_eq!(ok["recording"]["episodes_incomplete"], 0);
    let steps = |v: &serde_json::Value| -> Vec<u64> {
        v["episodes_detail"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["steps"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(
        steps(&full),
        steps(&ok),
        "the full disk changed the episodes"
    );
}

/// Whether a subscriber matches `p` (its declaration has reached this session).
/// Every command a robot executes, for the server's side of a link.
struct Logged<R: Robot> {
    inner: R,
    log: std::sync::Arc<std::sync::Mutex<Vec<Vec<f32>>>>,
}

impl<R: Robot> Robot for Logged<R> {
    fn spec(&self) -> &RobotSpec {
        self.inner.spec()
    }
    fn reset(&mut self, s: Option<u64>) -> Result<&Observation, RobotError> {
        self.log.lock().unwrap().clear();
        self.inner.reset(s)
    }
    fn command(&mut self, a: &[f32]) -> Result<(), RobotError> {
        self.log.lock().unwrap().push(a.to_vec());
        self.inner.command(a)
    }
    fn observe(&mut self) -> Result<&Observation, RobotError> {
        self.inner.observe()
    }
    fn hold_action(&self, out: &mut [f32]) {
        self.inner.hold_action(out)
    }
}

/// A base policy that always asks for the same absolute pose.
struct Pose(Vec<f32>);

impl reflex_contracts::policy::Policy for Pose {
    fn name(&self) -> &str {
        "pose"
    }
    fn chunk_spec(&self) -> reflex_contracts::policy::ChunkSpec {
        reflex_contracts::policy::ChunkSpec {
            len: 1,
            execute: 1,
            dim: self.0.len(),
        }
    }
    fn infer(
        &mut self,
        _: &Observation,
        out: &mut [f32],
    ) -> Result<(), reflex_contracts::policy::PolicyError> {
        out.copy_from_slice(&self.0);
        Ok(())
    }
}

/// The largest change between consecutive commands: (body joints, gripper).
fn largest_steps(commands: &[Vec<f32>]) -> (f32, f32) {
    let mut worst = (0.0f32, 0.0f32);
    for w in commands.windows(2) {
        let n = w[0].len();
        for (i, (b, a)) in w[1].iter().zip(&w[0]).enumerate() {
            let d = (b - a).abs();
            if i + 1 == n {
                worst.1 = worst.1.max(d);
            } else {
                worst.0 = worst.0.max(d);
            }
        }
    }
    worst
}

#[test]
fn a_remote_absolute_joint_robot_held_on_stale_observations_never_steps_past_the_limit() {
    // Before: a remote robot's hold for absolute joint targets was the middle of each range (0
    // here), and the safety layer let holds through without its step limit: when the link
    // went quiet the actor commanded a jump from wherever the arm was to the middle.
    use reflex_agent::actor::{ActorBuilder, ClockChoice};
    use reflex_runtime::safety::{SafetyConfig, SafetyEvent};
    let mut cfg = reflex_sim::SimConfig::for_task(reflex_sim::TaskKind::Reach);
    cfg.action = reflex_contracts::msg::ActionKind::JointAbs;
    cfg.max_episode_steps = Some(100_000);
    cfg.robot = "joints".into();
    let log = std::sync::Arc::new(std::sync::Mutex::new(vec![]));
    let robot = Logged {
        inner: reflex_sim::SimEnv::new(cfg).unwrap(),
        log: log.clone(),
    };
    let socket_dir = tempfile::tempdir().unwrap();
    let server_ep = crate::common::unix_endpoint(&socket_dir, "robot");
    let robot_bus = BusConfig::hermetic(vec![server_ep.clone()], vec![])
        .open()
        .unwrap();
    let _serving = RobotServer::new(&robot_bus, robot, ServeMode::Realtime { hz: 50.0 })
        .unwrap()
        .spawn();
    let relay = Relay::to(socket_dir.path().join("robot.sock"));
    let bus = BusConfig::hermetic(vec![], vec![format!("tcp/127.0.0.1:{}", relay.port)])
        .open()
        .unwrap();
    let remote = RemoteRobot::connect(&bus, "joints", Duration::from_secs(5)).unwrap();
    let limits = SafetyConfig::default();
    let (max_joint, max_grip) = (limits.max_joint_step_rad, limits.max_gripper_step_m);
    let mut actor = ActorBuilder::new(remote)
        .policy(Box::new(Pose(vec![0.8, 0.3, -0.3, 0.2, 0.0, 0.03])))
        .clock(ClockChoice::Wall {
            spin: Duration::from_micros(200),
        })
        .safety(limits)
        .build()
        .unwrap();
    let mut sent: Vec<Vec<f32>> = vec![];
    let tick = |actor: &mut reflex_agent::actor::Actor<RemoteRobot>,
                sent: &mut Vec<Vec<f32>>,
                n: usize| {
        for _ in 0..n {
            actor.run_ticks(1).unwrap();
            sent.push(actor.control_loop().last_action().to_vec());
        }
    };
    // The arm ramps out to the pose (8 ticks at the limit), far from the middle of its ranges.
    tick(&mut actor, &mut sent, 25);
    assert!(
        (sent.last().unwrap()[0] - 0.8).abs() < 1e-4,
        "{:?}",
        sent.last()
    );
    relay.cut();
    let stale0 = actor
        .control_loop()
        .safety_counters()
        .get(SafetyEvent::ObsStale);
    tick(&mut actor, &mut sent, 40);
    let stale = actor
        .control_loop()
        .safety_counters()
        .get(SafetyEvent::ObsStale)
        - stale0;
    assert!(
        stale > 20,
        "the actor held on only {stale} of 40 ticks without observations"
    );
    let held = sent.last().unwrap();
    assert!(
        (held[0] - 0.8).abs() < 1e-4 && (held[5] - 0.03).abs() < 1e-4,
        "the hold is not where the arm was: {held:?}"
    );
    let (joint, grip) = largest_steps(&sent);
    assert!(
        joint <= max_joint + 1e-5 && grip <= max_grip + 1e-5,
        "the actor commanded steps of {joint} rad and {grip} (limits {max_joint}, {max_grip})"
    );
    // What the robot executed: its own holds between commands and the commands that arrived.
    // A free-running server executes the newest command of those that arrive within one of its
    // ticks (RobotServer, CommandFilter's documentation), so when a loaded machine delays its
    // tick one executed step spans the skipped commands' steps too: at most
    // CommandFilter::MAX_PERIODS of them when the filter is on. The jump this test guards
    // against (to the middle of the range, 0.8 rad here) is far beyond that.
    let executed = log.lock().unwrap().clone();
    assert!(executed.len() > 20, "{} commands executed", executed.len());
    let (joint, grip) = largest_steps(&executed);
    let k = reflex_bus::robot::CommandFilter::MAX_PERIODS as f32;
    assert!(
        joint <= k * max_joint + 1e-5 && grip <= k * max_grip + 1e-5,
        "the robot executed steps of {joint} rad and {grip} (limits {max_joint}, {max_grip} per actor step)"
    );
}

#[test]
fn a_served_arm_refuses_and_counts_out_of_range_and_over_limit_commands_and_its_servos_never_see_them()
 {
    // Before: `RobotServer` checked a command's length only: a peer on the bus could send a
    // served arm any target at all.
    use reflex_bus::robot::CommandFilter;
    use reflex_hardware::arm::ArmKind;
    use reflex_hardware::emulate::{Emulator, EmulatorConfig};
    use reflex_hardware::robot::ArmRobot;
    use reflex_hardware::robot::ArmSection;
    let dir = tempfile::tempdir().unwrap();
    let goals = dir.path().join("goals.jsonl");
    let emu = Emulator::start(EmulatorConfig {
        goal_log: Some(goals.clone()),
        ..Default::default()
    })
    .unwrap();
    let cfg: ArmSection = toml::from_str(&format!(
        "port = \"{}\"\ntask = \"joints\"\naction = \"joint_abs\"\nstart_speed_rad_s = 3.0\n{}",
        emu.path(),
        crate::common::EMULATED_BUS
    ))
    .unwrap();
    let arm = ArmRobot::open(ArmKind::So101Follower, "so101", &cfg).unwrap();
    let (a, b) = pair(&dir);
    let server = RobotServer::new(&a, arm, ServeMode::Realtime { hz: 50.0 })
        .unwrap()
        .with_filter(CommandFilter {
            max_joint_step_rad: 0.05,
            max_ee_step_m: 0.01,
            max_gripper_step: 0.05,
        });
    let rejects = server.command_rejects();
    let serving = server.spawn();
    let mut remote = RemoteRobot::connect(&b, "so101", Duration::from_secs(20)).unwrap();
    let here = remote.reset(Some(0)).unwrap().state[..6].to_vec();
    let keys = Keys::new("so101").unwrap();
    let hostile = b.declare_publisher(keys.cmd.clone()).wait().unwrap();
    wait_for("the server's subscription", || matching(&hostile));
    let send = |seq: u64, action: Vec<f32>| {
        hostile
            .put(msg::encode(&Command {
                v: PROTOCOL_VERSION,
                seq,
                action,
            }))
            .wait()
            .unwrap();
    };
    let with = |d0: f32| {
        let mut a = here.clone();
        a[0] += d0;
        a
    };
    // Out of range (10 rad on a joint whose range is one turn), then half a radian in one step.
    let mut far = here.clone();
    far[0] = 10.0;
    send(1, far);
    wait_for("the out-of-range command refused", || rejects.count() >= 1);
    send(2, with(0.5));
    wait_for("the over-limit command refused", || rejects.count() >= 2);
    // A step inside the limit goes through.
    send(3, with(0.03));
    let step = |rad: f32| 2048 + (rad as f64 * 4096.0 / std::f64::consts::TAU).round() as u64;
    wait_for("the good command on the servo", || {
        std::fs::read_to_string(&goals)
            .unwrap_or_default()
            .lines()
            .any(|l| {
                l.contains("\"id\":1,\"reg\":\"goal\"")
                    && l.contains(&format!("\"value\":{}}}", step(here[0] + 0.03)))
            })
    });
    let stats = serving.stop().unwrap();
    assert_eq!(stats.rejected_commands, 2, "{stats:?}");
    // The shoulder's goal register only ever held the start and the good step.
    let log = std::fs::read_to_string(&goals).unwrap();
    let shoulder: Vec<u64> = log
        .lines()
        .filter(|l| l.contains("\"id\":1,\"reg\":\"goal\""))
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["value"].as_u64().unwrap()
        })
        .collect();
    let limit = step(here[0] + 0.05);
    assert!(
        shoulder.iter().all(|g| *g <= limit),
        "a refused goal reached the servo: {shoulder:?} (limit {limit})"
    );
    drop(emu);
}

#[test]
fn when_the_loop_falls_behind_the_newest_observation_is_kept_and_an_episode_end_is_never_dropped() {
    // Before: the queue of 64 dropped the newest observation when full, so a loop that fell
    // behind acted on old ones.
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = pair(&dir);
    let keys = Keys::new("burst").unwrap();
    let mut spec = RobotSpec::new("burst", "test/burst", 50.0)
        .with_state("ee_pos", 3, "m")
        .with_action(reflex_contracts::msg::ActionKind::Box, &["u"], -1.0, 1.0);
    spec.lockstep = false;
    let obs = |seq: u64, episode: u64, done: bool| Observation {
        v: PROTOCOL_VERSION,
        seq,
        episode,
        state: vec![seq as f32, 0.0, 0.0],
        reward: done as u8 as f32,
        terminated: done,
        success: done,
        ..Default::default()
    };
    let (sk, sb) = (keys.spec.clone(), msg::encode(&spec));
    let _spec_q = a
        .declare_queryable(keys.spec.clone())
        .callback(move |q| {
            let _ = q.reply(sk.clone(), sb.clone()).wait();
        })
        .wait()
        .unwrap();
    let _token = a
        .liveliness()
        .declare_token(keys.alive_robot.clone())
        .wait()
        .unwrap();
    let mut robot = RemoteRobot::connect(&b, "burst", Duration::from_secs(20)).unwrap();
    let publisher = a.declare_publisher(keys.obs.clone()).wait().unwrap();
    wait_for("the robot's subscription", || matching(&publisher));
    // 200 observations while the loop reads none: the episode ends at 50, the next runs on.
    for seq in 1..=200u64 {
        let o = if seq <= 50 {
            obs(seq, 1, seq == 50)
        } else {
            obs(seq, 2, false)
        };
        publisher.put(msg::encode(&o)).wait().unwrap();
    }
    let dropped = robot.dropped();
    wait_for("the queue to overflow", || dropped.count() >= 200 - 64 - 1);
    let first = robot.observe().unwrap().clone();
    assert_eq!(
        (first.seq, first.done(), first.reward),
        (50, true, 1.0),
        "the episode end"
    );
    let next = robot.observe().unwrap().clone();
    assert_eq!(next.seq, 200, "the newest observation, not an old one");
    assert!(
        dropped.count() >= 135 && dropped.count() <= 149,
        "{}",
        dropped.count()
    );
}

#[test]
fn the_learners_queue_is_bounded_and_the_actor_sends_no_further_ahead_than_its_window() {
    // Before: the learner's receive queue was unbounded (a flood of batches grew it without
    // limit) and the actor sent everything it had, however far behind the learner was.
    use reflex_bus::learnlink::LEARNER_QUEUE_BATCHES;
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = pair(&dir);
    let keys = Keys::new("q").unwrap();
    let learner = LearnerLink::new(
        &b,
        &Fleet::one(&keys.robot).unwrap(),
        LinkPosition::default(),
    )
    .unwrap();
    // Blocking on a full transport queue, as the actor's link publishes: every batch of the
    // flood reaches the learner (Zenoh's default, Drop, loses some on a loaded machine, and the
    // count below would never reach 3000).
    let flood = a
        .declare_publisher(keys.learn_transitions.clone())
        .congestion_control(zenoh::qos::CongestionControl::Block)
        .wait()
        .unwrap();
    wait_for("the learner's subscription", || matching(&flood));
    let step = WireStep {
        obs: vec![0.0; 2],
        next_obs: vec![0.0; 2],
        base: vec![0.0],
        action: vec![0.0],
        ..Default::default()
    };
    for i in 0..3000u64 {
        let batch = TransitionBatch {
            v: PROTOCOL_VERSION,
            actor: 5,
            first_seq: i,
            held_from: 0,
            steps: vec![step.clone()],
            flush: false,
            offered: 0,
        };
        flood.put(msg::encode(&batch)).wait().unwrap();
    }
    wait_for("the queue full and the rest counted", || {
        learner.stats().queue_full + learner.queued() as u64 >= 3000
    });
    assert_eq!(learner.queued(), LEARNER_QUEUE_BATCHES);
    assert_eq!(
        learner.stats().queue_full,
        3000 - LEARNER_QUEUE_BATCHES as u64
    );
    drop(learner);
    // An actor with no learner sends its window and keeps the rest.
    let (w, _r) = reflex_runtime::triple::triple(reflex_runtime::residual::Weights::default());
    let mut actor = ActorLink::new(
        &a,
        &Keys::new("window").unwrap(),
        LinkConfig {
            max_in_flight: 100,
            batch_steps: 64,
            ..Default::default()
        },
        reflex_runtime::residual::WeightsWriter::from_writer(w),
        WeightsShape { len: 1, arch: 0 },
    )
    .unwrap();
    let mut t = reflex_runtime::outbox::Transition::with_dims(2, 1);
    for i in 0..1000u32 {
        t.step = i;
        actor.offer(&t);
    }
    actor.tick();
    let st = actor.stats();
    assert_eq!(st.steps, 1000);
    assert_eq!(st.batches, 2, "64 + 36 steps sent, the rest held: {st:?}");
    assert_eq!(st.lost, 0);
}

/// A robot of any action kind with four joints it reports as `joint_pos`.
struct Kinded {
    spec: RobotSpec,
    obs: Observation,
}

impl Kinded {
    fn new(name: &str, kind: reflex_contracts::msg::ActionKind) -> Self {
        let mut spec = RobotSpec::new(name, "test/kinded", 50.0)
            .with_state("joint_pos", 4, "rad, then the gripper in m")
            .with_action(kind, &["a", "b", "c", "gripper_m"], -1.0, 1.0);
        // An absolute range that excludes zero: a middle-of-the-range hold would be 0.5.
        spec.action.low = vec![0.2, -1.0, -1.0, 0.0];
        spec.action.high = vec![0.8, 1.0, 1.0, 0.08];
        let obs = Observation {
            v: PROTOCOL_VERSION,
            episode: 1,
            state: vec![0.7, -0.4, 0.3, 0.05],
            ..Default::default()
        };
        Kinded { spec, obs }
    }
}

impl Robot for Kinded {
    fn spec(&self) -> &RobotSpec {
        &self.spec
    }
    fn reset(&mut self, _: Option<u64>) -> Result<&Observation, RobotError> {
        Ok(&self.obs)
    }
    fn command(&mut self, _: &[f32]) -> Result<(), RobotError> {
        Ok(())
    }
    fn observe(&mut self) -> Result<&Observation, RobotError> {
        Ok(&self.obs)
    }
    fn hold_action(&self, out: &mut [f32]) {
        out.fill(0.0)
    }
}

#[test]
fn a_remote_robots_hold_is_where_it_was_last_told_to_be_for_every_action_kind() {
    // Before: the hold of every absolute component was 0 or the middle of its range.
    use reflex_contracts::msg::ActionKind as K;
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = pair(&dir);
    let command = [0.6f32, 0.01, -0.02, 0.03];
    // (kind, hold right after a reset, hold after `command`)
    let cases = [
        (K::JointAbs, [0.7, -0.4, 0.3, 0.05], command),
        (K::JointDelta, [0.0; 4], [0.0; 4]),
        (K::EeDelta, [0.0, 0.0, 0.0, 0.05], [0.0, 0.0, 0.0, 0.03]),
        (K::Box, [0.7, -0.4, 0.3, 0.05], command),
    ];
    for (i, (kind, at_reset, after)) in cases.into_iter().enumerate() {
        let name = format!("kind{i}");
        let _server = RobotServer::new(&a, Kinded::new(&name, kind), ServeMode::Lockstep)
            .unwrap()
            .spawn();
        let mut robot = RemoteRobot::connect(&b, &name, Duration::from_secs(20)).unwrap();
        robot.reset(Some(0)).unwrap();
        let mut hold = [9.0f32; 4];
        robot.hold_action(&mut hold);
        assert_eq!(hold, at_reset, "{kind:?} right after a reset");
        robot.command(&command).unwrap();
        robot.hold_action(&mut hold);
        assert_eq!(hold, after, "{kind:?} after a command");
    }
    // Absolute joint targets without measured joint positions cannot be held: refused.
    let mut blind = Kinded::new("blind", K::JointAbs);
    blind.spec.state[0].name = "q".into();
    let _server = RobotServer::new(&a, blind, ServeMode::Lockstep)
        .unwrap()
        .spawn();
    let err = RemoteRobot::connect(&b, "blind", Duration::from_secs(20))
        .err()
        .expect("refused");
    assert!(err.to_string().contains("joint_pos"), "{err}");
}
