//! `reflex run` driving robots on the bus, run the way a user runs it: the robot in one process
//! (`reflex sim serve`, the Gymnasium bridge), the actor in another, the shipped config files
//! from docs/sim.md with only the endpoint changed to a unix socket in the test's temporary
//! directory (nothing to collide with).

use crate::common::{
    child_stderr, json_output, python, reflex, repo, run_ok, spawn, unix_endpoint,
};
use std::path::{Path, PathBuf};

/// The shipped config `configs/run/<name>` with its endpoint replaced by `ep` and its model path
/// made absolute, written into `dir`.
pub fn shipped_config(name: &str, dir: &Path, ep: &str, extra: &str) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("configs/run").join(name)).unwrap();
    assert!(
        text.contains("tcp/127.0.0.1:7457"),
        "{name} no longer names the documented endpoint"
    );
    let text = text
        .replace("tcp/127.0.0.1:7457", ep)
        .replace("../../models/", &format!("{}/models/", repo().display()));
    let p = dir.join(name);
    std::fs::write(&p, format!("{text}\n{extra}")).unwrap();
    p
}

/// `reflex sim serve --task pick --robot arm --listen EP --no-multicast [extra...]`.
fn serve_pick(dir: &tempfile::TempDir, ep: &str, extra: &[&str]) -> crate::common::ChildGuard {
    let mut cmd = reflex();
    cmd.args([
        "sim",
        "serve",
        "--task",
        "pick",
        "--robot",
        "arm",
        "--listen",
        ep,
        "--no-multicast",
    ])
    .args(extra);
    spawn(cmd, dir, "serve")
}

fn run_json(cfg: &Path, episodes: u32, dir: &tempfile::TempDir) -> serde_json::Value {
    let out = reflex()
        .args([
            "run",
            "--json",
            "--episodes",
            &episodes.to_string(),
            "--config",
        ])
        .arg(cfg)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "reflex run failed:\n{}\nserver stderr:\n{}",
        String::from_utf8_lossy(&out.stderr),
        child_stderr(dir, "serve")
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn details(v: &serde_json::Value) -> Vec<(u64, u64, u64, String)> {
    v["episodes_detail"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["seed"].as_u64().unwrap(),
                e["steps"].as_u64().unwrap(),
                e["return"].as_f64().unwrap().to_bits(),
                e["digest"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn reflex_run_against_a_served_simulator_in_lockstep_gives_the_in_process_episodes_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let ep = unix_endpoint(&dir, "bus");
    let _server = serve_pick(&dir, &ep, &[]);
    let remote = shipped_config("remote-pick.toml", dir.path(), &ep, "");
    let served = run_json(&remote, 3, &dir);

    // The same policy, seeds and task with the simulator in this process.
    let text = std::fs::read_to_string(&remote).unwrap();
    let local_text = text
        .replace("source = \"remote\"", "source = \"sim\"")
        .replace("[bus]", "[sim]\ntask = \"pick\"\nrobot = \"arm\"\n\n[bus]");
    let local = dir.path().join("local.toml");
    std::fs::write(&local, local_text).unwrap();
    let in_process = run_json(&local, 3, &dir);

    let (a, b) = (details(&served), details(&in_process));
    assert_eq!(a.len(), 3);
    assert!(
        a.iter().all(|(_, steps, _, _)| *steps > 1),
        "episodes ran: {a:?}"
    );
    assert_eq!(
        a, b,
        "served and in-process episodes differ (seed, steps, return bits, digest of every state, action and reward)"
    );
    assert_eq!(served["safety"], in_process["safety"]);
}

#[test]
fn reflex_run_drives_a_free_running_served_simulator_on_the_wall_clock() {
    let dir = tempfile::tempdir().unwrap();
    let ep = unix_endpoint(&dir, "bus");
    let _server = serve_pick(&dir, &ep, &["--realtime", "20"]);
    let cfg = shipped_config("remote-pick-realtime.toml", dir.path(), &ep, "");
    let v = run_json(&cfg, 2, &dir);
    let eps = v["episodes_detail"].as_array().unwrap();
    assert_eq!(eps.len(), 2);
    for e in eps {
        let steps = e["steps"].as_u64().unwrap();
        // pick's time limit is 100 of the robot's own ticks; the robot counts the ticks it held
        // before the loop's first command too, so the loop sees about 100 steps at most. The two
        // clocks are independent: when the robot's tick runs late (a loaded CI machine), the loop
        // ticks on time and sees one more step (101 was seen under CI load).
        assert!(
            (2..=103).contains(&steps),
            "an episode of {steps} steps: {v}"
        );
        assert!(
            e["success"].as_bool().unwrap() || (e["truncated"] == true && steps >= 90),
            "an episode ended neither by success nor by the robot's time limit: {e}"
        );
    }
    // The loop acts on observations that keep coming: the watchdog never found them stale, and
    // the policy thread kept up: at least one chunk per `execute` = 8 steps (models/pick.policy.toml).
    // (A fixed "more than 10 chunks" failed when both episodes succeeded in 26 steps: 8 chunks
    // for 52 steps is a policy that kept up.)
    assert_eq!(v["safety"]["obs_stale"], 0, "{v}");
    let steps: u64 = eps.iter().map(|e| e["steps"].as_u64().unwrap()).sum();
    assert!(v["chunks"].as_u64().unwrap() * 8 >= steps, "{v}");
}

#[test]
fn reflex_run_drives_a_gymnasium_environment_served_by_the_bridge() {
    let dir = tempfile::tempdir().unwrap();
    let ep = unix_endpoint(&dir, "bus");
    let mut cmd = std::process::Command::new(python());
    cmd.arg(repo().join("sim/python/reflex_gym_bridge.py"))
        .args([
            "--env",
            "Pendulum-v1",
            "--robot",
            "pendulum",
            "--listen",
            &ep,
            "--no-multicast",
        ]);
    let _bridge = spawn(cmd, &dir, "serve");
    // No base policy and nobody at the controls: the loop holds (zero torque) for two episodes.
    let cfg = dir.path().join("pendulum.toml");
    std::fs::write(
        &cfg,
        format!(
            "[robot]\nsource = \"remote\"\nname = \"pendulum\"\ntimeout_ms = 60000\n\n\
             [policy]\nkind = \"none\"\n\n[bus]\nenabled = true\nconnect = [\"{ep}\"]\n\
             no_multicast = true\n\n[run]\nepisodes = 2\nseed = 4\nclock = \"sim\"\n"
        ),
    )
    .unwrap();
    let v = json_output(reflex().args(["run", "--json", "--config"]).arg(&cfg));
    let eps = v["episodes_detail"].as_array().unwrap();
    assert_eq!(eps.len(), 2);
    // Python drives Pendulum-v1 directly with the same seeds and zero torque: same returns.
    let actions = dir.path().join("zeros.json");
    std::fs::write(
        &actions,
        serde_json::to_string(&vec![[0.0f32]; 200]).unwrap(),
    )
    .unwrap();
    for e in eps {
        assert_eq!(e["steps"], 200, "Pendulum-v1 ends by its time limit: {e}");
        let seed = e["seed"].as_u64().unwrap();
        let out = run_ok(
            std::process::Command::new(python())
                .arg(repo().join("tests/system/pendulum_direct.py"))
                .arg(seed.to_string())
                .arg(&actions),
        );
        let direct: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let want: f64 = direct["rewards"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_f64().unwrap() as f32 as f64)
            .sum();
        let got = e["return"].as_f64().unwrap();
        assert!(
            (got - want).abs() < 1e-3 * want.abs().max(1.0),
            "seed {seed}: reflex saw return {got}, Python {want}"
        );
    }
}

/// The bridge serving `tests/python/dict_image_env.py` (gymnasium's `module:EnvId` form, with
/// constructor kwargs and a person's action in `info`).
fn serve_dict_env(dir: &tempfile::TempDir, ep: &str) -> crate::common::ChildGuard {
    let mut cmd = std::process::Command::new(python());
    cmd.env("PYTHONPATH", repo().join("tests/python"))
        .arg(repo().join("sim/python/reflex_gym_bridge.py"))
        .args([
            "--env",
            "dict_image_env:DictImage-v0",
            "--env-kwargs",
            r#"{"size": 16, "person_every": 5}"#,
            "--intervention-key",
            "person_action",
            "--robot",
            "dict",
            "--listen",
            ep,
            "--no-multicast",
        ]);
    spawn(cmd, dir, "serve")
}

#[test]
fn a_dict_observation_with_a_camera_arrives_as_named_fields_and_a_camera_and_its_persons_takeovers_reach_the_actor()
 {
    let dir = tempfile::tempdir().unwrap();
    let ep = unix_endpoint(&dir, "bus");
    let _bridge = serve_dict_env(&dir, &ep);
    // The spec a controller sees.
    let session = reflex_bus::BusConfig::hermetic(vec![], vec![ep.clone()])
        .open()
        .unwrap();
    let robot = reflex_bus::robot::RemoteRobot::connect(
        &session,
        "dict",
        std::time::Duration::from_secs(60),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", child_stderr(&dir, "serve")));
    let spec = reflex_contracts::robot::Robot::spec(&robot).clone();
    drop(robot);
    drop(session);
    spec.validate().unwrap();
    let fields: Vec<(&str, u32)> = spec
        .state
        .iter()
        .map(|f| (f.name.as_str(), f.size))
        .collect();
    assert_eq!(fields, vec![("position", 2), ("velocity", 2)]);
    assert_eq!(spec.state[0].low.as_deref(), Some(&[-1.0f32, -1.0][..]));
    assert!(
        spec.state[1]
            .high
            .as_ref()
            .unwrap()
            .iter()
            .all(|h| h.is_infinite())
    );
    assert_eq!(spec.cameras.len(), 1);
    assert_eq!(
        (
            spec.cameras[0].name.as_str(),
            spec.cameras[0].width,
            spec.cameras[0].height
        ),
        ("camera", 16, 16)
    );
    assert_eq!(spec.max_episode_steps, 30);

    // The actor with no base policy: the environment's person takes over every fifth step.
    let cfg = dir.path().join("dict.toml");
    std::fs::write(
        &cfg,
        format!(
            "[robot]\nsource = \"remote\"\nname = \"dict\"\ntimeout_ms = 60000\n\n\
             [policy]\nkind = \"none\"\n\n[bus]\nenabled = true\nconnect = [\"{ep}\"]\n\
             no_multicast = true\n\n[run]\nepisodes = 2\nseed = 1\nclock = \"sim\"\n"
        ),
    )
    .unwrap();
    let runs = tempfile::tempdir().unwrap();
    let v = json_output(
        reflex()
            .args(["run", "--json", "--config"])
            .arg(&cfg)
            .arg("--record")
            .arg(runs.path()),
    );
    let eps = v["episodes_detail"].as_array().unwrap();
    assert_eq!(eps.len(), 2);
    for e in eps {
        let steps = e["steps"].as_u64().unwrap();
        assert!((1..=30).contains(&steps), "{e}");
        assert!(
            e["interventions"].as_u64().unwrap() >= 1 || steps < 5,
            "the environment's person never reached the actor: {e}"
        );
    }
    // The camera is recorded under its own name.
    let rec_dir = v["recording"]["dir"].as_str().unwrap();
    let first = std::path::Path::new(rec_dir).join("episode_000001.rrd");
    let text = crate::replay::rrd_print(&first);
    assert!(
        text.contains("/camera/camera"),
        "no camera entity in {first:?}:\n{text}"
    );
}

#[test]
fn reflex_run_learns_gymnasium_pendulum_served_by_the_bridge_from_scratch_within_20k_steps() {
    let dir = tempfile::tempdir().unwrap();
    let ep = unix_endpoint(&dir, "bus");
    let mut cmd = std::process::Command::new(python());
    cmd.arg(repo().join("sim/python/reflex_gym_bridge.py"))
        .args([
            "--env",
            "Pendulum-v1",
            "--robot",
            "pendulum",
            "--listen",
            &ep,
            "--no-multicast",
        ]);
    let _bridge = spawn(cmd, &dir, "serve");
    let ckpt = dir.path().join("sac.ckpt");
    let cfg = shipped_config("gym-pendulum-sac.toml", dir.path(), &ep, "")
        .to_string_lossy()
        .to_string();
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("runs/pendulum/sac.ckpt", &ckpt.display().to_string());
    std::fs::write(&cfg, text).unwrap();
    let t0 = std::time::Instant::now();
    let v = json_output(reflex().args(["run", "--json", "--config", &cfg]));
    let wall = t0.elapsed().as_secs_f64();
    let train = v["episodes_detail"].as_array().unwrap();
    let steps: u64 = train
        .iter()
        .map(|e| e["steps"].as_u64().unwrap())
        .sum::<u64>()
        + v["eval"]["episodes_detail"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["steps"].as_u64().unwrap())
            .sum::<u64>();
    let eval = v["eval"]["mean_return"].as_f64().unwrap();
    let first: f64 = train[..10]
        .iter()
        .map(|e| e["return"].as_f64().unwrap())
        .sum::<f64>()
        / 10.0;
    eprintln!(
        "Pendulum-v1 over the bridge: first 10 episodes {first:.0}, evaluation {eval:.0} after {steps} steps, {wall:.0} s"
    );
    assert!(steps <= 20_000, "{steps} steps");
    assert!(
        eval > -200.0,
        "mean evaluation return {eval:.0} (first 10 training episodes {first:.0}): {}",
        v["learner"]
    );
    assert!(
        v["learner"]["updates"].as_u64().unwrap() > 10_000,
        "{}",
        v["learner"]
    );
}

/// A nested Dict observation (proprioception under `agent`, cameras grouped under `pixels`, one
/// of them grey and one channels-first) arrives as dotted state fields and one camera per
/// image, never as a flattened image in the state; the images arrive as RGB, and `reflex run`
/// records each camera.
#[test]
fn a_nested_dict_observation_gives_one_camera_per_image_wherever_it_sits() {
    let dir = tempfile::tempdir().unwrap();
    let ep = unix_endpoint(&dir, "bus");
    let mut cmd = std::process::Command::new(python());
    cmd.env("PYTHONPATH", repo().join("tests/python"))
        .arg(repo().join("sim/python/reflex_gym_bridge.py"))
        .args([
            "--env",
            "dict_image_env:NestedImage-v0",
            "--robot",
            "nested",
            "--listen",
            &ep,
            "--no-multicast",
        ]);
    let _bridge = spawn(cmd, &dir, "serve");
    let session = reflex_bus::BusConfig::hermetic(vec![], vec![ep.clone()])
        .open()
        .unwrap();
    let mut robot = reflex_bus::robot::RemoteRobot::connect(
        &session,
        "nested",
        std::time::Duration::from_secs(60),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", child_stderr(&dir, "serve")));
    let spec = reflex_contracts::robot::Robot::spec(&robot).clone();
    spec.validate().unwrap();
    let fields: Vec<(&str, u32)> = spec
        .state
        .iter()
        .map(|f| (f.name.as_str(), f.size))
        .collect();
    assert_eq!(fields, vec![("agent.pos", 2), ("agent.vel", 2)]);
    let cams: Vec<(&str, u32, u32)> = spec
        .cameras
        .iter()
        .map(|c| (c.name.as_str(), c.width, c.height))
        .collect();
    assert_eq!(
        cams,
        vec![
            ("pixels.front", 16, 16),
            ("pixels.top", 32, 16),
            ("pixels.wrist", 8, 8)
        ]
    );
    let obs = reflex_contracts::robot::Robot::reset(&mut robot, Some(1))
        .unwrap()
        .clone();
    assert_eq!(obs.state.len(), 4);
    let top = &obs.images[1];
    assert_eq!(
        (top.width, top.height, top.data.len()),
        (32, 16, 32 * 16 * 3)
    );
    assert_eq!(&top.data[..3], &[7, 0, 0], "channels first, sent as RGB");
    let wrist = &obs.images[2];
    assert!(
        wrist.data.chunks(3).all(|p| p[0] == p[1] && p[1] == p[2]),
        "grey sent as RGB"
    );
    assert!(wrist.data.contains(&255), "the point is in the grey camera");
    drop(robot);
    drop(session);

    let cfg = dir.path().join("nested.toml");
    std::fs::write(
        &cfg,
        format!(
            "[robot]\nsource = \"remote\"\nname = \"nested\"\ntimeout_ms = 60000\n\n\
             [policy]\nkind = \"none\"\n\n[bus]\nenabled = true\nconnect = [\"{ep}\"]\n\
             no_multicast = true\n\n[run]\nepisodes = 1\nseed = 1\nclock = \"sim\"\n"
        ),
    )
    .unwrap();
    let runs = tempfile::tempdir().unwrap();
    let v = json_output(
        reflex()
            .args(["run", "--json", "--config"])
            .arg(&cfg)
            .arg("--record")
            .arg(runs.path()),
    );
    // The bridge numbers episodes itself (the reset above was its first): the run's one episode
    // is whichever file the recorder wrote.
    let rec_dir = std::path::Path::new(v["recording"]["dir"].as_str().unwrap());
    let first = std::fs::read_dir(rec_dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "rrd"))
        .expect("an episode file");
    let text = crate::replay::rrd_print(&first);
    for cam in ["pixels.front", "pixels.top", "pixels.wrist"] {
        assert!(
            text.contains(&format!("/camera/{cam}")),
            "no {cam} in {first:?}:\n{text}"
        );
    }
}
