//! `reflex bench bus-servo` (also `reflex hw bench`): sync reads and writes of a whole arm
//! through [`ServoArm`] (what the control loop does every tick) against the arm's emulated
//! servos behind a pseudo-terminal.

use reflex_hardware::arm::{ArmKind, ServoArm};
use reflex_hardware::emulate::{Emulator, EmulatorConfig, ServoModel};
use std::time::{Duration, Instant};

fn percentiles(mut d: Vec<Duration>) -> serde_json::Value {
    d.sort();
    if d.is_empty() {
        return serde_json::json!({"n": 0});
    }
    let at = |q: f64| d[((d.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e6;
    serde_json::json!({"p50_us": at(0.5), "p99_us": at(0.99), "max_us": at(1.0), "n": d.len()})
}

/// Runs `iters` sync reads of the six positions and `iters` sync writes of six goals on `kind`'s
/// emulated bus; returns the figures (keys `read_p50_us`, `read_p99_us`, `write_p50_us`,
/// `write_p99_us`, and the distributions) and the port used.
pub fn run(
    kind: ArmKind,
    iters: usize,
) -> reflex_agent::error::Result<(serde_json::Value, String)> {
    let setup = |e: String| reflex_agent::AgentError::setup("bench bus-servo", e);
    let emu = Emulator::start(EmulatorConfig {
        model: kind.servo_model(),
        ..Default::default()
    })
    .map_err(|e| setup(e.to_string()))?;
    let mut arm = ServoArm::open(
        kind,
        emu.path(),
        &kind.default_calibration(),
        Duration::from_millis(20),
        2,
    )
    .map_err(|e| setup(e.to_string()))?;
    let mut q = [0.0f64; 6];
    let (mut reads, mut writes) = (Vec::with_capacity(iters), Vec::with_capacity(iters));
    for k in 0..iters {
        let t = Instant::now();
        arm.read(&mut q).map_err(|e| setup(e.to_string()))?;
        reads.push(t.elapsed());
        let goal = [0.01 * (k % 100) as f64; 6];
        let t = Instant::now();
        arm.write(&goal).map_err(|e| setup(e.to_string()))?;
        writes.push(t.elapsed());
    }
    let st = arm.bus_stats();
    let (r, w) = (percentiles(reads), percentiles(writes));
    let servos = match kind.servo_model() {
        ServoModel::Sts3215 => "STS3215",
        ServoModel::Xl330 => "XL330-M288",
    };
    Ok((
        serde_json::json!({
            "robot": kind.name(),
            "transport": format!("pseudo-terminal to reflex's emulated {servos} servos (no wire: the servos' own 1 Mbps timing is not modelled)"),
            "read_p50_us": r["p50_us"],
            "read_p99_us": r["p99_us"],
            "write_p50_us": w["p50_us"],
            "write_p99_us": w["p99_us"],
            "sync_read_6_positions": r,
            "sync_write_6_goals": w,
            "retries": st.retries,
            "failures": st.failures,
        }),
        emu.path().to_string(),
    ))
}
