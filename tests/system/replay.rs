//! Recordings: episodes recorded from the simulator read back with Rerun's own tools, the
//! recorder never holding the loop up, and `reflex replay`.

use crate::common::{reflex, reflex_outside_the_project, repo, run_ok};
use reflex_bench::workloads::{NullRobot, SweepPolicy};
use reflex_record::{Live, Recorder, RecorderConfig};
use reflex_runtime::clock::SimClock;
use reflex_runtime::control::{ControlLoop, LoopConfig, PolicyDriver};
use reflex_runtime::outbox::outbox;
use reflex_runtime::robot::Robot;
use std::path::{Path, PathBuf};
use std::process::Command;

pub(crate) fn rerun_cli() -> PathBuf {
    let p = repo().join(".venv/bin/rerun");
    assert!(
        p.exists(),
        "{} is missing: `make venv` installs rerun-sdk 0.36.3 (the version of the rerun crate)",
        p.display()
    );
    p
}

/// `rerun rrd print -v FILE`'s output: the entities and their components in a recording.
pub(crate) fn rrd_print(f: &Path) -> String {
    let out = Command::new(rerun_cli())
        .env("CI", "1")
        .args(["rrd", "print", "-v"])
        .arg(f)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "rerun rrd print {}: {}",
        f.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn record_pick(runs: &Path, episodes: u32) -> (serde_json::Value, PathBuf) {
    let v = crate::common::json_output(
        reflex()
            .args(["run", "--config"])
            .arg(repo().join("configs/run/sim-pick-expert.toml"))
            .args(["--episodes", &episodes.to_string(), "--json", "--record"])
            .arg(runs),
    );
    let dir = PathBuf::from(
        v["recording"]["dir"]
            .as_str()
            .expect("a recording dir in the summary"),
    );
    (v, dir)
}

#[test]
fn recorded_episodes_pass_rerun_verify_and_hold_the_expected_entities() {
    let runs = tempfile::tempdir().unwrap();
    let (v, dir) = record_pick(runs.path(), 2);
    assert_eq!(v["recording"]["episode_files"], 2);
    assert_eq!(v["recording"]["steps_dropped"], 0);
    // The same run's steps in reflex's episode format export as a LeRobot dataset.
    let ds = runs.path().join("lerobot");
    run_ok(
        reflex()
            .args(["dataset", "export", "--run"])
            .arg(dir.parent().unwrap())
            .arg("--out")
            .arg(&ds),
    );
    let c = crate::dataset::check_lerobot(&ds);
    assert_eq!(c["episodes"], 2, "{c}");
    assert_eq!(c["frames"], v["ticks"], "{c}");
    assert_eq!(c["people"], 0, "nobody drove: {c}");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rrd"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 2, "{files:?}");
    for f in &files {
        let out = Command::new(rerun_cli())
            .env("CI", "1")
            .args(["rrd", "verify"])
            .arg(f)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "rerun rrd verify {}: {}{}",
            f.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let text = rrd_print(f);
        for entity in [
            "/world/arm/gripper",
            "/world/arm/shoulder/shape",
            "/world/object",
            "/world/target",
            "/world/ee_path",
            "/joints/shoulder_pan/measured",
            "/action/dx_m/base",
            "/action/dx_m/residual",
            "/action/gripper_m/executed",
            "/episode/intervention",
            "/episode/reward",
            "/timing/lateness_us",
            "/telemetry/dropped",
            "/events",
        ] {
            assert!(
                text.contains(entity),
                "{}: entity {entity} missing from `rerun rrd print -v`",
                f.display()
            );
        }
        // Both timelines index the step data.
        let out = Command::new(rerun_cli())
            .env("CI", "1")
            .args(["rrd", "print", "-vv"])
            .arg(f)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        for timeline in ["index_name: step", "index_name: time"] {
            assert!(
                text.contains(timeline),
                "{}: timeline `{timeline}` missing",
                f.display()
            );
        }
        // The episode's summary agrees with the run.
        let s = reflex_record::read_summary(f).unwrap();
        assert!(s.steps > 5);
        assert!(s.success, "the scripted expert succeeds on these seeds");
    }
    // A sample of values, read back through `rerun rrd print -vvv`: the reward series is 0 until
    // the last step, which is 1 with the success event logged at that step.
    let s = reflex_record::read_summary(&files[0]).unwrap();
    let last = u64::from(s.steps) - 1;
    let out = Command::new(rerun_cli())
        .env("CI", "1")
        .args(["rrd", "print", "-vvv"])
        .arg(&files[0])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let rows = entity_rows(&text, "/episode/reward");
    assert_eq!(rows.len() as u64, last + 1, "one reward row per step");
    for (step, v) in &rows {
        let want = if *step == last { 1.0 } else { 0.0 };
        assert_eq!(*v, want, "reward at step {step}");
    }
    assert!(
        text.contains(&format!("step {last}: episode ends (success)")),
        "the success event is missing"
    );
}

/// The (step, value) rows of a scalar entity in `rerun rrd print -vvv` output.
fn entity_rows(text: &str, entity: &str) -> Vec<(u64, f64)> {
    let head = format!("- {entity} - ");
    let mut rows = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with("Chunk(") {
            inside = line.contains(&head);
            continue;
        }
        if !inside || !line.contains("row_") {
            continue;
        }
        // │ │ row_… ┆ log_time ┆ step ┆ time ┆ [value] │ │
        let cells: Vec<&str> = line
            .split('┆')
            .map(|c| c.trim_matches(|ch: char| ch.is_whitespace() || ch == '│'))
            .collect();
        let step = cells[2].parse().unwrap();
        let v = cells[4]
            .trim_matches(|c| c == '[' || c == ']')
            .parse()
            .unwrap();
        rows.push((step, v));
    }
    rows
}

#[test]
fn a_throttled_recorder_drops_only_counted_telemetry_and_never_the_loop_or_the_learner() {
    let runs = tempfile::tempdir().unwrap();
    let robot = NullRobot::new("r", 8, 0);
    let spec = robot.spec().clone();
    let template = reflex_runtime::msg::Observation {
        state: vec![0.0; 8],
        ..Default::default()
    };
    let _ = template;
    let (otx, orx) = outbox(64, 8, 4);
    let mut lp = ControlLoop::builder(robot, SimClock::new())
        .config(LoopConfig::at(100.0))
        .policy(PolicyDriver::inline(Box::new(SweepPolicy::new(8, 4))))
        .outbox(otx)
        .build()
        .unwrap();
    // 20 ms per step: far slower than the loop; a queue of 8.
    let rec = Recorder::spawn(RecorderConfig {
        dir: runs.path().join("episodes"),
        live: Live::Off,
        queue: 8,
        spec,
        throttle: Some(std::time::Duration::from_millis(20)),
        files: true,
        count_gaps: true,
    })
    .unwrap();
    let mut learner_seen = 0u64;
    for _ in 0..300 {
        lp.step().unwrap();
        while let Some(t) = orx.try_recv() {
            learner_seen += 1; // the learner's copy: every step
            rec.record(&t);
            orx.recycle(t);
        }
    }
    assert_eq!(lp.stats().ticks, 300);
    // The null robot runs on its own clock: each step is closed by the next tick's observation,
    // so after 300 ticks 299 steps are complete.
    assert_eq!(
        learner_seen, 299,
        "the learner must get every completed step"
    );
    assert_eq!(lp.outbox().unwrap().dropped(), 0);
    let stats = rec.finish();
    let (recorded, dropped) = (
        stats.recorded.load(std::sync::atomic::Ordering::Relaxed),
        stats.dropped.load(std::sync::atomic::Ordering::Relaxed),
    );
    assert_eq!(recorded + dropped, 299);
    assert!(
        dropped > 200,
        "a 20 ms/step recorder with a queue of 8 should drop most of 299 steps: {dropped}"
    );
    let s = reflex_record::read_summary(&runs.path().join("episodes/episode_000001.rrd")).unwrap();
    assert_eq!(
        s.dropped_steps, dropped,
        "the recording states what it lost"
    );
}

#[test]
fn replay_summary_prints_each_episode_and_a_missing_viewer_says_how_to_install_it() {
    let runs = tempfile::tempdir().unwrap();
    let (_, dir) = record_pick(runs.path(), 1);
    let out = run_ok(reflex().args(["replay", "--summary"]).arg(&dir));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("episode_000001.rrd") && text.contains("true"),
        "{text}"
    );
    // No viewer on PATH and no project environment above a temp directory, nor above the binary.
    let empty = tempfile::tempdir().unwrap();
    let out = reflex_outside_the_project(empty.path())
        .env("PATH", empty.path())
        .args(["replay"])
        .arg(&dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("rerun-sdk==0.36.3"),
        "{err}"
    );
}

#[test]
fn viz_watches_an_actor_over_the_bus_and_writes_readable_episodes() {
    let dir = tempfile::tempdir().unwrap();
    let ep = crate::common::unix_endpoint(&dir, "viz");
    // The actor at 20 Hz on the wall clock, so the watcher sees whole episodes.
    let cfg = std::fs::read_to_string(repo().join("configs/run/sim-pick-expert.toml")).unwrap();
    // With cameras: their frames reach the watcher too, at a few per second.
    let cfg =
        cfg.replace("clock = \"sim\"", "clock = \"wall\"") + "\n[sim.cameras]\nenabled = true\n";
    assert!(cfg.contains("clock = \"wall\""));
    let cfg_path = dir.path().join("wall.toml");
    std::fs::write(&cfg_path, cfg).unwrap();
    let save = dir.path().join("viz");
    let mut viz = reflex();
    viz.args([
        "viz",
        "--robot",
        "sim",
        "--episodes",
        "2",
        "--json",
        "--no-multicast",
        "--wait-s",
        "60",
        "--listen",
        &ep,
    ])
    .arg("--rerun")
    .arg(format!("save={}", save.display()));
    let mut viz = crate::common::spawn(viz, &dir, "viz");
    let actor = reflex()
        .args(["run", "--config"])
        .arg(&cfg_path)
        .args([
            "--episodes",
            "4",
            "--json",
            "--no-multicast",
            "--trace-hz",
            "20",
            "--connect",
            &ep,
        ])
        .output()
        .unwrap();
    assert!(
        actor.status.success(),
        "{}",
        String::from_utf8_lossy(&actor.stderr)
    );
    let a: serde_json::Value = serde_json::from_slice(&actor.stdout).unwrap();
    assert!(
        a["traced_steps"].as_u64().unwrap() > 40,
        "the actor publishes every step at 20 Hz: {a}"
    );
    // The watcher stops on its own after two episodes.
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(s) = viz.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed().as_secs() < 60,
            "viz did not stop: {}",
            crate::common::child_stderr(&dir, "viz")
        );
        // Paces the polling.
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(
        status.success(),
        "{}",
        crate::common::child_stderr(&dir, "viz")
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("viz.out")).unwrap())
            .unwrap();
    assert!(v["episodes_ended"].as_u64().unwrap() >= 2, "{v}");
    assert!(
        v["statuses"].as_u64().unwrap() > 0,
        "the actor's status reaches the watcher: {v}"
    );
    assert_eq!(v["undecodable"], 0);
    // How many frames arrive depends on the wall clock (a few a second over a short run), so
    // only their arrival is asserted; the second episode's images are checked in its file below.
    assert!(
        v["frames"].as_u64().unwrap() > 0,
        "camera frames reach the watcher: {v}"
    );
    // An episode the watcher saw whole (the second) verifies and holds the arm, actions and status.
    let f = PathBuf::from(v["dir"].as_str().unwrap()).join("episode_000002.rrd");
    run_ok(
        Command::new(rerun_cli())
            .env("CI", "1")
            .args(["rrd", "verify"])
            .arg(&f),
    );
    let text = rrd_print(&f);
    for entity in [
        "/world/arm/gripper",
        "/world/object",
        "/action/dx_m/executed",
        "/episode/reward",
        "/status/rate_hz",
        // The simulator's cameras are calibrated (their pinholes and mounts are in the spec):
        // images under their pinholes, the wrist's moving with the gripper.
        "/world/cameras/front/image",
        "/world/arm/gripper/cameras/wrist/image",
    ] {
        assert!(text.contains(entity), "{}: {entity} missing", f.display());
    }
    let s = reflex_record::read_summary(&f).unwrap();
    assert!(s.success, "{s:?}");
}

#[test]
fn camera_images_are_recorded_at_every_step_of_an_episode() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = std::fs::read_to_string(repo().join("configs/run/sim-pick-expert.toml")).unwrap();
    let cfg = cfg.replace(
        "control_hz = 20.0",
        "control_hz = 20.0\ncameras = { enabled = true, width = 64, height = 48 }",
    );
    let cfg_path = dir.path().join("cams.toml");
    std::fs::write(&cfg_path, cfg).unwrap();
    let v = crate::common::json_output(
        reflex()
            .args(["run", "--config"])
            .arg(&cfg_path)
            .args(["--episodes", "2", "--json", "--record"])
            .arg(dir.path()),
    );
    let rec = PathBuf::from(v["recording"]["dir"].as_str().unwrap());
    let frames_dropped = v["recording"]["frames_dropped"].as_u64().unwrap();
    // At 20 Hz every step's frames are kept (up to ~15 frames per second of control: 20/15
    // rounds to every step) and each episode's last observation's, except what the frame pool
    // dropped and counted (in simulated time the actor waits for the recorder, so none).
    let (mut steps, mut rows) = (0, [0u64; 2]);
    for id in [1, 2] {
        let f = rec.join(format!("episode_00000{id}.rrd"));
        steps += u64::from(reflex_record::read_summary(&f).unwrap().steps);
        let text = rrd_print(&f);
        // Each camera is a pinhole where the spec mounts it (static: the mount and the lens).
        for origin in ["/world/cameras/front", "/world/arm/gripper/cameras/wrist"] {
            assert!(
                text.lines()
                    .any(|l| l.contains(&format!("- {origin} - ")) && l.contains("Pinhole")),
                "no pinhole at {origin}:\n{text}"
            );
        }
        for (k, cam) in [
            "/world/cameras/front/image",
            "/world/arm/gripper/cameras/wrist/image",
        ]
        .iter()
        .enumerate()
        {
            for line in text.lines().filter(|l| l.contains(&format!("- {cam} - "))) {
                assert!(line.contains("Image:buffer"), "{line}");
                let n: u64 = line
                    .split(" with ")
                    .nth(1)
                    .and_then(|r| r.split(' ').next())
                    .and_then(|n| n.parse().ok())
                    .unwrap();
                rows[k] += n;
            }
        }
    }
    for (k, cam) in ["front", "wrist"].iter().enumerate() {
        assert!(
            rows[k] > steps / 2,
            "camera {cam}: {} frames for {steps} steps",
            rows[k]
        );
        assert_eq!(
            rows[k] + frames_dropped,
            steps + 2,
            "camera {cam}: frames recorded + dropped = one per step and the last of each episode"
        );
    }
}

#[test]
fn a_missing_live_viewer_never_stops_the_run_or_its_files() {
    let runs = tempfile::tempdir().unwrap();
    // Port 1 on loopback: nothing listens, the connection is refused at once.
    let out = run_ok(
        reflex()
            .args(["run", "--config"])
            .arg(repo().join("configs/run/sim-pick-expert.toml"))
            .args([
                "--episodes",
                "2",
                "--json",
                "--rerun",
                "connect=rerun+http://127.0.0.1:1/proxy",
                "--record",
            ])
            .arg(runs.path()),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no live view") && err.contains("127.0.0.1:1"),
        "the missing viewer is reported: {err}"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["episodes"], 2);
    assert_eq!(v["recording"]["episode_files"], 2, "{v}");
}
