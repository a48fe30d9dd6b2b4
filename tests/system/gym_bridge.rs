//! The Python bridge serves a Gymnasium environment as a reflex robot; reflex driving it must see
//! exactly what Python sees driving the environment directly.

use crate::common::{child_stderr, python, repo, run_ok, spawn, unix_endpoint};
use reflex_bus::BusConfig;
use reflex_bus::robot::RemoteRobot;
use reflex_runtime::robot::Robot;
use std::time::Duration;

#[test]
fn pendulum_through_reflex_equals_pendulum_driven_directly() {
    let dir = tempfile::tempdir().unwrap();
    let ep = unix_endpoint(&dir, "gym");
    let mut cmd = std::process::Command::new(python());
    cmd.arg(repo().join("sim/python/reflex_gym_bridge.py"))
        .args([
            "--env",
            "Pendulum-v1",
            "--robot",
            "pendulum",
            "--no-multicast",
            "--listen",
            &ep,
        ]);
    let _bridge = spawn(cmd, &dir, "bridge");
    let session = BusConfig::hermetic(vec![], vec![ep]).open().unwrap();
    let mut robot = RemoteRobot::connect(&session, "pendulum", Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}\nbridge stderr:\n{}", child_stderr(&dir, "bridge")));
    let spec = robot.spec().clone();
    assert_eq!(spec.kind, "gym/Pendulum-v1");
    assert_eq!((spec.state_dim(), spec.action.dim()), (3, 1));
    assert_eq!((spec.action.low[0], spec.action.high[0]), (-2.0, 2.0));
    assert_eq!(spec.max_episode_steps, 200);

    // A torque schedule that swings the pendulum through a few regimes, some of it clipped.
    let actions: Vec<Vec<f32>> = (0..200)
        .map(|t| vec![(2.5 * (0.07 * t as f32).sin()).clamp(-2.0, 2.0)])
        .collect();
    let seed = 42;
    let mut states = vec![robot.reset(Some(seed)).unwrap().state.clone()];
    let mut rewards = vec![];
    let mut truncated = false;
    for a in &actions {
        let o = robot.step(a).unwrap();
        states.push(o.state.clone());
        rewards.push(o.reward);
        truncated = o.truncated;
    }
    assert!(truncated, "Pendulum-v1 ends by its 200-step time limit");

    let actions_file = dir.path().join("actions.json");
    std::fs::write(&actions_file, serde_json::to_string(&actions).unwrap()).unwrap();
    let out = run_ok(
        std::process::Command::new(python())
            .arg(repo().join("tests/system/pendulum_direct.py"))
            .arg(seed.to_string())
            .arg(&actions_file),
    );
    let direct: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let direct_states: Vec<Vec<f32>> = direct["states"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            s.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        })
        .collect();
    let direct_rewards: Vec<f32> = direct["rewards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(states.len(), direct_states.len());
    for (t, (a, b)) in states.iter().zip(&direct_states).enumerate() {
        assert_eq!(a, b, "state differs at step {t}");
    }
    assert_eq!(rewards, direct_rewards);
}
