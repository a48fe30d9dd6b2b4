//! `reflex bench bus-servo` (also `reflex hw bench`): sync reads and writes of a whole arm
//! through [`ServoArm`] (what the control loop does every tick) against the arm's emulated
//! servos behind a pseudo-terminal.

use reflex_hardware::arm::{ArmKind, ServoArm};
use reflex_hardware::emulate::{Emulator, EmulatorConfig, ServoModel};
use std::time::{Duration, Instant};

/// The distribution of one kind of transaction.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Latency {
    /// Median, µs.
    pub p50_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// Slowest, µs.
    pub max_us: f64,
    /// Transactions timed.
    pub n: usize,
}

fn percentiles(d: Vec<Duration>) -> Latency {
    let mut us: Vec<f64> = d.iter().map(|d| d.as_secs_f64() * 1e6).collect();
    us.sort_by(f64::total_cmp);
    let at = |p: f64| reflex_runtime::hist::percentile(&us, p);
    Latency {
        p50_us: at(50.0),
        p99_us: at(99.0),
        max_us: at(100.0),
        n: us.len(),
    }
}

/// What `reflex bench bus-servo` measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ServoBenchReport {
    /// The arm whose servos were emulated.
    pub robot: String,
    /// What carried the bytes.
    pub transport: String,
    /// Median sync read of the six positions, µs.
    pub read_p50_us: f64,
    /// 99th percentile, µs.
    pub read_p99_us: f64,
    /// Median sync write of six goals, µs.
    pub write_p50_us: f64,
    /// 99th percentile, µs.
    pub write_p99_us: f64,
    /// The reads' distribution.
    pub sync_read_6_positions: Latency,
    /// The writes' distribution.
    pub sync_write_6_goals: Latency,
    /// Attempts repeated after a timeout or a corrupt answer.
    pub retries: u64,
    /// Transactions that failed after every retry.
    pub failures: u64,
}

/// Runs `iters` sync reads of the six positions and `iters` sync writes of six goals on `kind`'s
/// emulated bus; returns the figures and the port used.
pub fn run(kind: ArmKind, iters: usize) -> reflex_agent::error::Result<(ServoBenchReport, String)> {
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
        ServoBenchReport {
            robot: kind.name().into(),
            transport: format!(
                "pseudo-terminal to reflex's emulated {servos} servos (no wire: the servos' own 1 Mbps timing is not modelled)"
            ),
            read_p50_us: r.p50_us,
            read_p99_us: r.p99_us,
            write_p50_us: w.p50_us,
            write_p99_us: w.p99_us,
            sync_read_6_positions: r,
            sync_write_6_goals: w,
            retries: st.retries,
            failures: st.failures,
        },
        emu.path().to_string(),
    ))
}
