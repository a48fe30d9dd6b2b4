//! The robot protocol on Zenoh: served simulator == in-process simulator, and clear errors when a
//! peer is missing.

use crate::common::{child_stderr, reflex, spawn, unix_endpoint};
use reflex_bus::BusConfig;
use reflex_bus::robot::{RemoteRobot, RobotServer, ServeMode};
use reflex_runtime::robot::{Robot, RobotError};
use reflex_sim::{Expert, SimConfig, SimEnv, TaskKind};
use std::time::Duration;

fn bits(v: &[Vec<f32>]) -> Vec<u32> {
    v.iter().flatten().map(|x| x.to_bits()).collect()
}

/// Records a noisy-expert episode in process: (states, actions, rewards, done flags).
fn in_process(task: TaskKind, seed: u64, steps: usize) -> (Vec<Vec<f32>>, Vec<Vec<f32>>, Vec<f32>) {
    let mut env = SimEnv::new(SimConfig::for_task(task)).unwrap();
    let mut expert = Expert::new(env.spec(), 0.3, seed).unwrap();
    let mut action = vec![0.0; env.spec().action.dim()];
    let mut obs = env.reset(Some(seed)).unwrap().clone();
    let (mut states, mut actions, mut rewards) = (vec![obs.state.clone()], vec![], vec![]);
    for _ in 0..steps {
        expert.act(&obs, &mut action);
        obs.copy_from(env.step(&action).unwrap());
        states.push(obs.state.clone());
        actions.push(action.clone());
        rewards.push(obs.reward);
    }
    (states, actions, rewards)
}

fn replay(robot: &mut dyn Robot, seed: u64, actions: &[Vec<f32>]) -> (Vec<Vec<f32>>, Vec<f32>) {
    let mut states = vec![robot.reset(Some(seed)).unwrap().state.clone()];
    let mut rewards = vec![];
    for a in actions {
        let o = robot.step(a).unwrap();
        states.push(o.state.clone());
        rewards.push(o.reward);
    }
    (states, rewards)
}

#[test]
fn simulator_served_in_another_process_gives_identical_trajectories() {
    let dir = tempfile::tempdir().unwrap();
    let ep = unix_endpoint(&dir, "sim");
    let mut cmd = reflex();
    cmd.args([
        "sim",
        "serve",
        "--task",
        "pick",
        "--robot",
        "arm1",
        "--no-multicast",
        "--listen",
        &ep,
    ]);
    let _server = spawn(cmd, &dir, "serve");
    let session = BusConfig::hermetic(vec![], vec![ep.clone()])
        .open()
        .unwrap();
    let mut remote = RemoteRobot::connect(&session, "arm1", Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{e}\nserver stderr:\n{}", child_stderr(&dir, "serve")));
    assert_eq!(remote.spec().kind, "sim/pick");
    assert!(remote.spec().lockstep);
    for seed in [11, 12] {
        let (states, actions, rewards) = in_process(TaskKind::Pick, seed, 80);
        let (remote_states, remote_rewards) = replay(&mut remote, seed, &actions);
        assert_eq!(
            bits(&states),
            bits(&remote_states),
            "seed {seed}: served trajectory differs"
        );
        assert_eq!(rewards, remote_rewards);
    }
}

#[test]
fn robot_server_in_process_over_a_socket_matches_and_reports_episode_end() {
    let dir = tempfile::tempdir().unwrap();
    let ep = crate::common::unix_endpoint(&dir, "bus");
    let server_session = BusConfig::hermetic(vec![ep.clone()], vec![])
        .open()
        .unwrap();
    let mut cfg = SimConfig::for_task(TaskKind::Reach);
    cfg.robot = "reacher".into();
    let server = RobotServer::new(
        &server_session,
        SimEnv::new(cfg).unwrap(),
        ServeMode::Lockstep,
    )
    .unwrap()
    .spawn();
    let client = BusConfig::hermetic(vec![], vec![ep]).open().unwrap();
    let events = client
        .declare_subscriber("reflex/reacher/events")
        .wait()
        .unwrap();
    let mut remote = RemoteRobot::connect(&client, "reacher", Duration::from_secs(10)).unwrap();
    let (states, actions, _) = in_process(TaskKind::Reach, 3, 40);
    let (remote_states, _) = replay(&mut remote, 3, &actions);
    assert_eq!(bits(&states), bits(&remote_states));
    // Drive an expert episode to its end through the bus: the robot announces it.
    let mut expert = Expert::new(remote.spec(), 0.0, 0).unwrap();
    let mut obs = remote.reset(Some(4)).unwrap().clone();
    let mut action = vec![0.0; remote.spec().action.dim()];
    for _ in 0..remote.spec().max_episode_steps {
        expert.act(&obs, &mut action);
        obs = remote.step(&action).unwrap().clone();
        if obs.done() {
            break;
        }
    }
    assert!(obs.success, "reach expert should succeed");
    let mut kinds = vec![];
    while let Ok(Some(s)) = events.recv_timeout(Duration::from_millis(500)) {
        let ev: reflex_runtime::msg::EpisodeEvent =
            reflex_runtime::msg::decode("events", &s.payload().to_bytes()).unwrap();
        kinds.push(ev.kind);
    }
    use reflex_runtime::msg::EventKind::*;
    assert!(
        kinds.contains(&Reset) && kinds.contains(&Success) && kinds.contains(&Done),
        "{kinds:?}"
    );
    let stats = server.stop().unwrap();
    assert_eq!(stats.resets, 2);
}

#[test]
fn missing_robot_is_a_timeout_that_names_the_key_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let ep = unix_endpoint(&dir, "nobody");
    let session = BusConfig::hermetic(vec![ep], vec![]).open().unwrap();
    // Returning at all is the deadline honoured (nobody will ever answer).
    let err = RemoteRobot::connect(&session, "ghost", Duration::from_millis(500))
        .err()
        .expect("nobody serves `ghost`");
    assert!(matches!(err, RobotError::Timeout { .. }));
    let text = err.to_string();
    assert!(
        text.contains("reflex/ghost/alive/robot") && text.contains("reflex sim serve"),
        "{text}"
    );
}

#[test]
fn robot_that_stops_answering_times_out_naming_the_observation_key() {
    let dir = tempfile::tempdir().unwrap();
    let ep = crate::common::unix_endpoint(&dir, "bus");
    let server_session = BusConfig::hermetic(vec![ep.clone()], vec![])
        .open()
        .unwrap();
    let mut cfg = SimConfig::for_task(TaskKind::Reach);
    cfg.robot = "flaky".into();
    let server = RobotServer::new(
        &server_session,
        SimEnv::new(cfg).unwrap(),
        ServeMode::Lockstep,
    )
    .unwrap()
    .spawn();
    let client = BusConfig::hermetic(vec![], vec![ep]).open().unwrap();
    let mut remote = RemoteRobot::connect(&client, "flaky", Duration::from_secs(10)).unwrap();
    remote.reset(Some(1)).unwrap();
    server.stop().unwrap();
    drop(server_session);
    let hold = vec![0.0, 0.0, 0.0, 0.04];
    let err = remote.step(&hold).expect_err("no robot answers any more");
    assert!(err.to_string().contains("reflex/flaky/obs"), "{err}");
}

use zenoh::Wait;
