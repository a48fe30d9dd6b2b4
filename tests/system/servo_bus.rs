//! Feetech servos over a real serial path: reflex's bus driver against its emulated servos on a
//! pseudo-terminal (retries, corrupt answers, a silent id), and Feetech's own SDK as a client of
//! `reflex hw emulate` in another process.

use crate::common::{python, reflex, repo};
use reflex_hardware::bus::{BusError, DynamixelBus, FeetechBus};
use reflex_hardware::dynamixel::x_series;
use reflex_hardware::emulate::{
    Emulator, EmulatorConfig, STS3215_MODEL, ServoModel, XL330_M288_MODEL,
};
use reflex_hardware::feetech::sts3215;
use std::io::BufRead;
use std::time::{Duration, Instant};

const IDS: [u8; 6] = [1, 2, 3, 4, 5, 6];

/// The deadline of one exchange with servos emulated by a thread of this process. These tests
/// check the protocols, not timing: a deadline far above a loaded machine's scheduling delays
/// (20 ms, a real bus's, was missed three times in a row with a busy thread per core), so that
/// only a silent servo goes unanswered.
const EMULATED_DEADLINE: Duration = Duration::from_millis(250);

#[test]
fn the_bus_driver_reads_writes_and_moves_emulated_servos_over_a_pseudo_terminal() {
    let emu = Emulator::start(EmulatorConfig::default()).unwrap();
    let mut bus = FeetechBus::open(emu.path(), 1_000_000).unwrap();
    bus.timeout = EMULATED_DEADLINE;
    for id in IDS {
        bus.ping(id).unwrap();
        assert_eq!(
            bus.read(id, sts3215::MODEL_NUMBER, "Model_Number").unwrap(),
            STS3215_MODEL as u32
        );
        bus.write(id, sts3215::TORQUE_ENABLE, 1, "Torque_Enable")
            .unwrap();
    }
    let goals = [1000u32, 1500, 2000, 2500, 3000, 3500];
    bus.sync_write(sts3215::GOAL_POSITION, &IDS, &goals)
        .unwrap();
    let mut pos = [0u32; 6];
    let t0 = Instant::now();
    loop {
        bus.sync_read(
            sts3215::PRESENT_POSITION,
            "Present_Position",
            &IDS,
            &mut pos,
        )
        .unwrap();
        if pos == goals || t0.elapsed() > Duration::from_secs(3) {
            break;
        }
    }
    assert_eq!(pos, goals, "the servos reach their goals");
    let st = bus.stats();
    assert_eq!((st.retries, st.failures), (0, 0), "{st:?}");
}

#[test]
fn corrupt_answers_are_retried_and_a_silent_servo_is_an_error_naming_port_id_and_register() {
    // Every 7th answer corrupt: one sync read of 4 servos meets at most one, its retry none.
    let emu = Emulator::start(EmulatorConfig {
        corrupt_every: 7,
        ..Default::default()
    })
    .unwrap();
    let mut bus = FeetechBus::open(emu.path(), 1_000_000).unwrap();
    bus.timeout = EMULATED_DEADLINE;
    let mut pos = [0u32; 4];
    for _ in 0..50 {
        bus.sync_read(
            sts3215::PRESENT_POSITION,
            "Present_Position",
            &[1, 2, 3, 4],
            &mut pos,
        )
        .unwrap();
        assert_eq!(pos, [2048; 4]);
    }
    let st = bus.stats();
    assert!(st.corrupt > 0 && st.retries >= st.corrupt, "{st:?}");
    assert_eq!(st.failures, 0, "every corrupt answer was recovered: {st:?}");
    drop(bus);
    let emu = Emulator::start(EmulatorConfig {
        silent: vec![5],
        ..Default::default()
    })
    .unwrap();
    let mut bus = FeetechBus::open(emu.path(), 1_000_000).unwrap();
    bus.timeout = EMULATED_DEADLINE;
    let e = bus
        .sync_read(
            sts3215::PRESENT_POSITION,
            "Present_Position",
            &[4, 5, 6],
            &mut pos[..3],
        )
        .unwrap_err();
    match &e {
        BusError::NoAnswer { id, attempts, .. } => assert_eq!((*id, *attempts), (5, 3)),
        other => panic!("{other}"),
    }
    let msg = e.to_string();
    assert!(
        msg.contains(emu.path()) && msg.contains("servo 5") && msg.contains("Present_Position"),
        "{msg}"
    );
    // A silent servo does not hang the bus: the next exchanges go on.
    assert!(bus.ping(5).is_err() && bus.ping(6).is_ok());
}

#[test]
fn the_dynamixel_bus_moves_emulated_xl330_servos_over_a_pseudo_terminal() {
    let emu = Emulator::start(EmulatorConfig {
        model: ServoModel::Xl330,
        silent: vec![6],
        ..Default::default()
    })
    .unwrap();
    let mut bus = DynamixelBus::open(emu.path(), 1_000_000).unwrap();
    bus.timeout = EMULATED_DEADLINE;
    let ids = [1u8, 2, 3, 4, 5];
    for id in ids {
        bus.ping(id).unwrap();
        assert_eq!(
            bus.read(id, x_series::MODEL_NUMBER, "Model_Number")
                .unwrap(),
            XL330_M288_MODEL as u32
        );
        bus.write(id, x_series::TORQUE_ENABLE, 1, "Torque_Enable")
            .unwrap();
    }
    let goals = [1000u32, 1500, 2000, 2500, 3000];
    bus.sync_write(x_series::GOAL_POSITION, &ids, &goals)
        .unwrap();
    let mut pos = [0u32; 5];
    let t0 = Instant::now();
    while pos != goals && t0.elapsed() < Duration::from_secs(3) {
        bus.sync_read(
            x_series::PRESENT_POSITION,
            "Present_Position",
            &ids,
            &mut pos,
        )
        .unwrap();
    }
    assert_eq!(pos, goals);
    let e = bus.ping(6).unwrap_err().to_string();
    assert!(e.contains("servo 6") && e.contains("PING"), "{e}");
}

/// Runs the vendor SDK client (tests/system/servo_sdk_client.py) against `reflex hw emulate
/// --robot ROBOT` in another process; returns what it saw.
fn sdk_against_emulator(robot: &str, sdk: &str) -> serde_json::Value {
    let mut emu = reflex()
        .args(["hw", "emulate", "--robot", robot, "--seconds", "60"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(emu.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .split_whitespace()
        .find(|w| w.starts_with("/dev/"))
        .unwrap_or_else(|| panic!("no port in {line:?}"))
        .to_string();
    let out = std::process::Command::new(python())
        .arg(repo().join("tests/system/servo_sdk_client.py"))
        .arg(&port)
        .arg(sdk)
        .output()
        .unwrap();
    let _ = emu.kill();
    let _ = emu.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_dynamixel_sdk_talks_to_reflex_hw_emulate_over_the_pseudo_terminal() {
    let v = sdk_against_emulator("koch-follower", "dynamixel");
    assert_eq!(v["model"], XL330_M288_MODEL, "{v}");
    assert_eq!(v["goal_written"], true, "{v}");
    assert_eq!(
        v["sync_result"], "[TxRxResult] Communication success!",
        "{v}"
    );
    assert_eq!(v["positions"]["2"], 3000, "servo 2 moved to its goal: {v}");
    assert_eq!(v["positions"].as_object().unwrap().len(), 6, "{v}");
    assert!(
        v["missing"].as_str().unwrap().contains("no status packet"),
        "{v}"
    );
}

#[test]
fn feetechs_own_sdk_talks_to_reflex_hw_emulate_over_the_pseudo_terminal() {
    let v = sdk_against_emulator("so101-follower", "feetech");
    assert_eq!(v["model"], STS3215_MODEL, "{v}");
    assert_eq!(v["goal_written"], true, "{v}");
    assert_eq!(
        v["sync_result"], "[TxRxResult] Communication success!",
        "{v}"
    );
    assert_eq!(v["positions"]["2"], 3000, "servo 2 moved to its goal: {v}");
    assert_eq!(v["positions"]["1"], 2048, "{v}");
    assert_eq!(v["positions"].as_object().unwrap().len(), 6, "{v}");
    assert!(
        v["missing"].as_str().unwrap().contains("no status packet"),
        "{v}"
    );
}

#[test]
fn reflex_hw_bench_times_sync_reads_and_writes_over_the_emulated_bus() {
    let v = crate::common::json_output(reflex().args(["hw", "bench", "--iters", "50", "--json"]));
    for k in ["sync_read_6_positions", "sync_write_6_goals"] {
        assert_eq!(v[k]["n"], 50, "{v}");
        assert!(v[k]["p50_us"].as_f64().unwrap() > 0.0, "{v}");
    }
    assert_eq!(v["failures"], 0, "{v}");
}

#[test]
fn reflex_bench_bus_servo_times_a_whole_arm_on_either_protocol() {
    for robot in ["so101-follower", "koch-follower"] {
        let v = crate::common::json_output(reflex().args([
            "bench",
            "bus-servo",
            "--robot",
            robot,
            "--iters",
            "50",
            "--json",
        ]));
        assert_eq!(v["robot"], robot, "{v}");
        assert_eq!(v["sync_read_6_positions"]["n"], 50, "{v}");
        let (p50, p99) = (
            v["read_p50_us"].as_f64().unwrap(),
            v["read_p99_us"].as_f64().unwrap(),
        );
        assert!(p50 > 0.0 && p50 <= p99, "{v}");
        assert_eq!(v["failures"], 0, "{v}");
    }
}
