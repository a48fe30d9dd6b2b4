//! Actor and learner over the bus: weights swapped atomically under a 1 kHz loop, and an actor
//! that survives its learner being killed and restarted with no transition lost or duplicated.

use crate::common::{child_stderr, reflex, repo, spawn, unix_endpoint};
use reflex_bench::workloads::{NullRobot, SweepPolicy};
use reflex_runtime::clock::WallClock;
use reflex_runtime::control::{ControlLoop, LoopConfig, PolicyDriver};
use reflex_runtime::outbox::{Source, outbox};
use reflex_runtime::residual::LinearResidual;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Runs a 1 kHz wall-clock loop for `steps` while another thread publishes weight versions as
/// fast as it can; version v sets every bias to 0.001 v (and every weight to 0), so the residual
/// of a step names the one version it was computed with. Returns (episode step, version) per step.
fn swap_under_load(steps: u64, at_episode: bool) -> (Vec<(u32, u64)>, u64, u64) {
    let (obs_dim, dim) = (8, 4);
    let robot = NullRobot::new("r", obs_dim, if at_episode { 50 } else { 0 });
    let (hook, mut writer) = LinearResidual::new(obs_dim, dim, 1.0);
    let n = hook.len();
    let (otx, orx) = outbox(8192, obs_dim, dim);
    let mut lp = ControlLoop::builder(robot, WallClock::new(Duration::from_micros(50)))
        .config(LoopConfig::at(1000.0))
        .policy(PolicyDriver::inline(Box::new(SweepPolicy::new(8, 4))))
        .residual(Box::new(hook), at_episode)
        .outbox(otx)
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let publisher = std::thread::spawn(move || {
        let mut v = 0u64;
        let mut w = vec![0.0f32; n];
        while !s.load(Ordering::Relaxed) && v < 900 {
            v += 1;
            for b in &mut w[n - dim..] {
                *b = 0.001 * v as f32;
            }
            writer.publish(v, &w);
            // Paces the swaps: a learner publishing weights about 1,400 times a second.
            std::thread::sleep(Duration::from_micros(700));
        }
        v
    });
    let mut seen = Vec::new();
    for _ in 0..steps {
        lp.step().unwrap();
        while let Some(t) = orx.try_recv() {
            if t.source == Source::Policy {
                let r = &t.residual;
                assert!(
                    r.iter().all(|x| (x - r[0]).abs() < 1e-6),
                    "a torn read: residual {r:?} mixes versions"
                );
                let v = (r[0].atanh() / 0.001).round() as u64;
                seen.push((t.step, v));
            }
            orx.recycle(t);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let last = publisher.join().unwrap();
    (seen, last, lp.stats().residual_version)
}

#[test]
fn weights_swap_atomically_while_the_loop_runs_at_1khz() {
    let (seen, published, in_use) = swap_under_load(1500, false);
    assert!(seen.len() > 1000, "policy steps recorded: {}", seen.len());
    assert!(
        seen.windows(2).all(|w| w[0].1 <= w[1].1),
        "versions only move forward"
    );
    let distinct = {
        let mut v: Vec<u64> = seen.iter().map(|s| s.1).collect();
        v.dedup();
        v.len()
    };
    assert!(
        distinct > 100,
        "the loop picked up many versions while running: {distinct}"
    );
    assert!(in_use > 0 && in_use <= published);
}

#[test]
fn at_episode_boundaries_the_residual_changes_only_when_an_episode_starts() {
    let (seen, _, _) = swap_under_load(1500, true);
    let mut changes = 0;
    for w in seen.windows(2) {
        if w[1].1 != w[0].1 {
            changes += 1;
            // Version 0 (no weights yet) is left at once; later versions wait for step 0.
            assert!(
                w[1].0 == 0 || w[0].1 == 0,
                "version changed within an episode at step {}: {w:?}",
                w[1].0
            );
        }
    }
    assert!(
        changes >= 10,
        "about one swap per 50-step episode: {changes}"
    );
}

fn learner_config(dir: &std::path::Path) -> std::path::PathBuf {
    let text = format!(
        r#"# Actor and learner on the simulator's pick task with the shipped base policy.
[robot]
source = "sim"

[sim]
task = "pick"
control_hz = 50.0

[policy]
kind = "onnx"
model = "{model}"

[run]
episodes = 10
seed = 3
clock = "wall"

[learner]
in_process = false
checkpoint = "{ckpt}"
checkpoint_every_s = 0.5

[learner.link]
resend_ms = 1000.0
drain_s = 60.0
"#,
        model = repo().join("models/pick.onnx").display(),
        ckpt = dir.join("learner/sac.ckpt").display()
    );
    let p = dir.join("hil.toml");
    std::fs::write(&p, text).unwrap();
    p
}

fn learner(cfg: &std::path::Path, ep: &str) -> std::process::Command {
    let mut c = reflex();
    c.env("RUST_LOG", "info");
    c.args([
        "learn",
        "--json",
        "--exit-when-actor-leaves",
        "--no-multicast",
        "--wait-s",
        "60",
        "--listen",
        ep,
        "--config",
    ])
    .arg(cfg);
    c
}

#[test]
fn the_actor_survives_its_learner_being_killed_and_restarted_with_no_transition_lost_or_duplicated()
{
    let dir = tempfile::tempdir().unwrap();
    let cfg = learner_config(dir.path());
    let ep = unix_endpoint(&dir, "hil");
    let ckpt = dir.path().join("learner/sac.ckpt");
    // Learner A listens; the actor connects to it.
    let mut a = spawn(learner(&cfg, &ep), &dir, "learner-a");
    let mut actor_cmd = reflex();
    actor_cmd
        .args([
            "run",
            "--json",
            "--no-multicast",
            "--connect",
            &ep,
            "--record",
        ])
        .arg(dir.path().join("runs"))
        .arg("--config")
        .arg(&cfg);
    let mut actor = spawn(actor_cmd, &dir, "actor");
    let finished = || crate::common::episodes_finished(&dir.path().join("runs"));
    // Let A checkpoint and take a whole episode of the run, then kill it hard.
    let t0 = std::time::Instant::now();
    while !ckpt.exists() || finished() < 1 {
        assert!(
            t0.elapsed().as_secs() < 60,
            "learner A never checkpointed: {}",
            child_stderr(&dir, "learner-a")
        );
        assert!(
            actor.0.try_wait().unwrap().is_none(),
            "the actor ended early: {}",
            child_stderr(&dir, "actor")
        );
        // Paces the polling.
        std::thread::sleep(Duration::from_millis(50));
    }
    a.0.kill().unwrap();
    a.0.wait().unwrap();
    // The actor keeps running without a learner: it finishes another episode.
    let before = finished();
    crate::common::wait_until("an episode finished without a learner", 60, || {
        assert!(
            actor.0.try_wait().unwrap().is_none(),
            "the actor must outlive its learner: {}",
            child_stderr(&dir, "actor")
        );
        finished() > before
    });
    // Learner B resumes from A's checkpoint on the same endpoint; the actor reconnects.
    let mut b = spawn(learner(&cfg, &ep), &dir, "learner-b");
    crate::common::wait_exit(&mut actor, "actor", &dir, 180);
    crate::common::wait_exit(&mut b, "learner-b", &dir, 60);
    let av: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("actor.out")).unwrap())
            .unwrap();
    let bv: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("learner-b.out")).unwrap())
            .unwrap();
    let link = &av["learner_link"];
    eprintln!("actor link: {link}\nlearner B: {bv}");
    let sent = link["steps"].as_u64().unwrap();
    assert_eq!(av["episodes"], 10, "{av}");
    assert!(sent > 100, "{av}");
    assert_eq!(link["lost"], 0, "{link}");
    assert!(
        link["learner_instances"].as_u64().unwrap() >= 2,
        "the actor saw both learners: {link}"
    );
    // B resumed where A's checkpoint ended and ended holding exactly what the actor sent.
    let resumed = bv["resumed_at"].as_u64().unwrap();
    assert!(
        resumed > 0 && resumed < sent,
        "B resumed from A's checkpoint: {bv}"
    );
    assert_eq!(
        bv["received"].as_u64().unwrap(),
        sent,
        "no transition lost: learner {bv} actor {link}"
    );
    assert_eq!(bv["persisted"].as_u64().unwrap(), sent, "{bv}");
    assert_eq!(
        link["persisted"].as_u64().unwrap(),
        sent,
        "the actor saw everything persisted: {link}"
    );
    // What B stored: the steps from its resume point on; the buffers hold A's checkpoint plus those.
    assert!(bv["weights_version"].as_u64().unwrap() > 0, "{bv}");
    assert!(
        link["swaps"].as_u64().unwrap() > 0,
        "new weights reached the actor: {link}"
    );
    assert!(
        av["residual_version"].as_u64().unwrap() > 0,
        "the loop ran with learned weights: {av}"
    );
    // The replay buffer counts the stored transitions once each: every step is a transition.
    let stored = bv["online_buffer"].as_u64().unwrap();
    assert_eq!(
        stored, sent,
        "online buffer = steps sent (no duplicate, no gap): {bv}"
    );
}

/// Opens a pseudo-terminal: (controller fd, device path of the terminal side).
fn pty() -> (std::fs::File, std::fs::File) {
    use std::os::fd::FromRawFd;
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty fills two fds we then own.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty");
    // SAFETY: fresh fds from openpty.
    unsafe {
        (
            std::fs::File::from_raw_fd(master),
            std::fs::File::from_raw_fd(slave),
        )
    }
}

#[test]
fn keyboard_teleop_takes_over_moves_labels_and_hands_back() {
    use reflex_runtime::msg::TeleopMsg;
    use reflex_runtime::robot::Robot;
    use std::io::Write;
    use zenoh::Wait;
    let dir = tempfile::tempdir().unwrap();
    let ep = unix_endpoint(&dir, "kb");
    let session = reflex_bus::BusConfig::hermetic(vec![ep.clone()], vec![])
        .open()
        .unwrap();
    // The robot side: a spec to answer with, and a subscriber that keeps every teleop message.
    let mut spec = NullRobot::new("kb", 8, 0).spec().clone();
    spec.name = "kb".into();
    let bytes = reflex_runtime::msg::encode(&spec);
    let _q = session
        .declare_queryable("reflex/kb/spec")
        .callback(move |q| {
            let _ = q.reply("reflex/kb/spec", bytes.clone()).wait();
        })
        .wait()
        .unwrap();
    let got = Arc::new(std::sync::Mutex::new(Vec::<TeleopMsg>::new()));
    let g = got.clone();
    let _s = session
        .declare_subscriber("reflex/kb/teleop")
        .callback(move |s| {
            g.lock()
                .unwrap()
                .push(reflex_runtime::msg::decode("t", &s.payload().to_bytes()).unwrap());
        })
        .wait()
        .unwrap();
    // The person at a terminal: a pseudo-terminal that the test types into.
    let (mut keyboard, terminal) = pty();
    let mut child = reflex()
        .args([
            "teleop",
            "--device",
            "keyboard",
            "--robot",
            "kb",
            "--no-multicast",
            "--connect",
            &ep,
        ])
        .stdin(terminal)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("teleop.err")).unwrap())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while got.lock().unwrap().is_empty() {
        assert!(
            t0.elapsed().as_secs() < 30,
            "no teleop message: {}",
            child_stderr(&dir, "teleop")
        );
        // Paces the polling.
        std::thread::sleep(Duration::from_millis(20));
    }
    keyboard.write_all(b" ").unwrap();
    for _ in 0..10 {
        keyboard.write_all(b"w").unwrap();
        // Paces the person's key: auto-repeat at 25 Hz.
        std::thread::sleep(Duration::from_millis(40));
    }
    // Each further key is typed once the previous one has reached the bus.
    let seen = |f: &dyn Fn(&TeleopMsg) -> bool| got.lock().unwrap().iter().any(f);
    keyboard.write_all(b"c").unwrap();
    crate::common::wait_until("c: the gripper closed", 20, || {
        seen(&|m| m.intervene && m.action[3] == 0.0)
    });
    keyboard.write_all(b"y").unwrap();
    crate::common::wait_until("y: the success label", 20, || seen(&|m| m.success));
    keyboard.write_all(b"q").unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{}", child_stderr(&dir, "teleop"));
    // Quitting hands back: the last message says nobody drives and commands nothing.
    crate::common::wait_until("the hand-back message", 20, || {
        got.lock()
            .unwrap()
            .last()
            .is_some_and(|m| !m.intervene && m.action.iter().all(|v| *v == 0.0))
    });
    let msgs = got.lock().unwrap().clone();
    assert!(
        !msgs[0].intervene,
        "the policy drives until the person takes over"
    );
    let driving: Vec<&TeleopMsg> = msgs.iter().filter(|m| m.intervene).collect();
    assert!(
        driving.len() > 10,
        "{} messages while driving",
        driving.len()
    );
    assert!(
        driving
            .iter()
            .any(|m| (m.action[0] - 0.01).abs() < 1e-6 && m.action[1] == 0.0),
        "w held: +x at half the bound"
    );
    assert!(
        driving.iter().any(|m| m.action[3] == 0.0),
        "c: gripper closed"
    );
    assert_eq!(
        msgs.iter().filter(|m| m.success).count(),
        1,
        "the success label is sent once"
    );
    assert!(msgs.iter().all(|m| !m.failure && !m.reset));
    let last = msgs.last().unwrap();
    assert!(
        !last.intervene && last.action.iter().all(|v| *v == 0.0),
        "quitting hands back: {last:?}"
    );
    assert!(
        msgs.windows(2).all(|w| w[1].seq > w[0].seq),
        "sequence numbers increase"
    );
}

/// `reflex run --json --until-stopped --config cfg` (on the bus at `ep`, robot `sim`) and, once it
/// runs, `reflex teleop --device keyboard` typing from a pseudo-terminal, following the actor
/// (it prints who drives once it has the actor's status).
fn actor_and_keyboard(
    dir: &tempfile::TempDir,
    ep: &str,
    cfg: &std::path::Path,
) -> (
    crate::common::ChildGuard,
    crate::common::StatusWatch,
    std::fs::File,
    crate::common::ChildGuard,
) {
    let mut run = reflex();
    run.args(["run", "--json", "--until-stopped", "--config"])
        .arg(cfg);
    let actor = spawn(run, dir, "actor");
    let watch = crate::common::StatusWatch::new(ep, "sim");
    watch.wait("the actor running", |m| m.figures.ticks > 20);
    let (keyboard, terminal) = pty();
    let teleop = crate::common::ChildGuard(
        reflex()
            .args([
                "teleop",
                "--device",
                "keyboard",
                "--robot",
                "sim",
                "--no-multicast",
            ])
            .args(["--connect", ep])
            .stdin(terminal)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("teleop.err")).unwrap())
            .spawn()
            .unwrap(),
    );
    crate::common::wait_until("the teleop following the actor", 60, || {
        child_stderr(dir, "teleop").contains("drives")
    });
    (actor, watch, keyboard, teleop)
}

/// Stops the actor as a person would (SIGTERM) and reads its JSON report.
fn stop_actor(actor: &mut crate::common::ChildGuard, dir: &tempfile::TempDir) -> serde_json::Value {
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(actor.0.id() as i32, libc::SIGTERM) };
    crate::common::wait_until("the actor to exit", 120, || {
        actor.0.try_wait().unwrap().is_some()
    });
    serde_json::from_str(&std::fs::read_to_string(dir.path().join("actor.out")).unwrap())
        .unwrap_or_else(|e| panic!("{e}: {}", child_stderr(dir, "actor")))
}

#[test]
fn the_keyboards_e_u_and_g_keys_raise_release_and_resume_a_running_actors_estop() {
    use crate::common::wait_until;
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let ep = unix_endpoint(&dir, "actor");
    // The shipped expert config on the wall clock, on the bus.
    let text = std::fs::read_to_string(repo().join("configs/run/sim-pick-expert.toml"))
        .unwrap()
        .replace("clock = \"sim\"", "clock = \"wall\"")
        .replace(
            "[run]",
            &format!("[bus]\nenabled = true\nno_multicast = true\nlisten = [\"{ep}\"]\n\n[run]"),
        );
    let cfg = dir.path().join("actor.toml");
    std::fs::write(&cfg, text).unwrap();
    let (mut actor, watch, mut keyboard, mut teleop) = actor_and_keyboard(&dir, &ep, &cfg);
    // Each key once the teleop has seen the last one's effect in the actor's status (a release
    // names the e-stop the status shows).
    for (key, state, shown) in [
        (b"e", "latched", "EMERGENCY STOP 1 latched"),
        (b"u", "paused", "released"),
        (b"g", "running", "running again"),
    ] {
        keyboard.write_all(key).unwrap();
        watch.wait(state, |m| m.stop == state && m.figures.estops == 1);
        wait_until(shown, 60, || child_stderr(&dir, "teleop").contains(shown));
    }
    keyboard.write_all(b"q").unwrap();
    assert!(teleop.0.wait().unwrap().success());
    let said = child_stderr(&dir, "teleop");
    assert!(
        said.contains("EMERGENCY STOP 1 latched")
            && said.contains("released")
            && said.contains("running again"),
        "{said}"
    );
    let v = stop_actor(&mut actor, &dir);
    assert_eq!(v["stop"]["estops"], 1, "{v}");
    assert!(v["stop"]["stopped_ticks"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["stop"]["state"], "running", "{v}");
}

#[test]
fn by_default_the_learner_runs_inside_reflex_run_and_takes_every_step() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = learner_config(dir.path());
    let text = std::fs::read_to_string(&cfg).unwrap();
    let text = text
        .replace("in_process = false\n", "")
        .replace("clock = \"wall\"", "clock = \"sim\"")
        .replace("episodes = 10", "episodes = 4")
        .replace("[run]", "[bus]\nno_multicast = true\n\n[run]");
    std::fs::write(&cfg, text).unwrap();
    let v = crate::common::json_output(reflex().args(["run", "--json", "--config"]).arg(&cfg));
    let (link, learner) = (&v["learner_link"], &v["learner"]);
    let steps = link["steps"].as_u64().unwrap();
    assert!(steps > 50, "{v}");
    assert_eq!(learner["received"].as_u64().unwrap(), steps, "{learner}");
    assert_eq!(
        learner["online_buffer"].as_u64().unwrap(),
        steps,
        "each step stored once: {learner}"
    );
    assert_eq!(learner["episodes"], 4);
    assert_eq!(link["lost"], 0);
    // Paced lockstep: weights after each episode, taken as the next one starts.
    assert!(v["residual_version"].as_u64().unwrap() >= 3, "{v}");
}

/// The documented workflow of docs/training.md ("Keyboard teleop"), as a person runs it: the
/// shipped `configs/run/sim-pick-hil.toml` in `reflex run` (the learner in its process) and
/// `reflex teleop --device keyboard` in another terminal. Each of `y`, `n` and `x` must reach the
/// learner as that episode's stored end, exactly once: the keyboard sends a press in one message
/// of its 50 Hz stream, and the 20 Hz loop must not lose it to the messages after it.
#[test]
fn the_keyboards_y_n_and_x_keys_reach_the_learner_as_one_success_failure_and_reset_each() {
    use crate::common::wait_until;
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let ep = unix_endpoint(&dir, "hil");
    let text = std::fs::read_to_string(repo().join("configs/run/sim-pick-hil.toml"))
        .unwrap()
        .replace(
            "../../models/pick.onnx",
            &repo().join("models/pick.onnx").display().to_string(),
        )
        .replace(
            "runs/learner/pick-sac.ckpt",
            &dir.path()
                .join("learner/pick-sac.ckpt")
                .display()
                .to_string(),
        )
        .replace(
            "[bus]\nenabled = true",
            &format!("[bus]\nenabled = true\nno_multicast = true\nlisten = [\"{ep}\"]"),
        );
    assert!(text.contains(&ep) && text.contains("in_process = true"));
    let cfg = dir.path().join("hil.toml");
    std::fs::write(&cfg, text).unwrap();
    let (mut actor, watch, mut keyboard, mut teleop) = actor_and_keyboard(&dir, &ep, &cfg);
    // The person takes over and holds the arm still: from here an episode ends by a key or by
    // its time limit, never by the base policy's success.
    keyboard.write_all(b" ").unwrap();
    watch.wait("the person driving", |m| m.figures.intervening);
    let lines = |what: &str| child_stderr(&dir, "actor").matches(what).count();
    // Each key once the actor has ended an episode by the one before (a reset ends it as a
    // failure the person called), so that no two presses reach one step of the loop.
    for (key, what, n) in [
        (b"y", "success (labelled)", 1),
        (b"n", "failure (labelled)", 1),
        (b"x", "failure (labelled)", 2),
    ] {
        keyboard.write_all(key).unwrap();
        wait_until(what, 60, || lines(what) >= n);
    }
    keyboard.write_all(b"q").unwrap();
    assert!(teleop.0.wait().unwrap().success());
    let v = stop_actor(&mut actor, &dir);
    let ends = &v["learner"]["episode_ends"];
    assert_eq!(ends["person_success"], 1, "{v}");
    assert_eq!(ends["person_failure"], 1, "{v}");
    assert_eq!(ends["person_reset"], 1, "{v}");
    assert_eq!(lines("success (labelled)"), 1);
    assert_eq!(lines("failure (labelled)"), 2);
    assert_eq!(v["learner_link"]["lost"], 0, "{v}");
}
