//! `reflex hw serve`: a real arm served on the bus as a robot for controllers on other
//! computers.

use reflex_agent::AgentError;
use reflex_hardware::arm::ArmKind;
use reflex_hardware::robot::ArmRobot;
use std::time::{Duration, Instant};

/// Serves the arm of a run config on the bus until `stop` is set (or `seconds` pass): what
/// `reflex hw serve` runs. The server filters every command against the spec's ranges and
/// `[safety]`'s per-step limits unless `[serve] filter = false`, obeys the robot's e-stop on its
/// own, and holds the arm when no command comes ([`reflex_bus::robot::RobotServer`]). A bus
/// without TLS needs `[bus] insecure = true` (then a warning every minute).
pub fn serve_config(
    cfg: &reflex_agent::config::RunConfig,
    bus: &reflex_bus::BusConfig,
    stop: &std::sync::atomic::AtomicBool,
    seconds: Option<f64>,
) -> reflex_agent::error::Result<reflex_bus::robot::ServeStats> {
    use reflex_bus::robot::{CommandFilter, RobotServer, ServeMode};
    use std::sync::atomic::Ordering;
    let kind = match cfg.robot.source {
        reflex_agent::config::RobotSource::So101 => ArmKind::So101Follower,
        reflex_agent::config::RobotSource::Koch => ArmKind::KochFollower,
        other => {
            return Err(AgentError::setup(
                "[robot] source",
                format!("`reflex hw serve` serves a real arm (so101 or koch), not {other:?}"),
            ));
        }
    };
    let arm_cfg = cfg
        .arm
        .as_ref()
        .ok_or_else(|| AgentError::setup("[robot] source", "a real arm needs an [arm] table"))?;
    let mut on_bus = cfg.clone();
    on_bus.bus.enabled = true;
    let _insecure = reflex_agent::actor::check_arm_bus(&on_bus, bus)?;
    let mut robot = ArmRobot::open(kind, &cfg.robot_name(), arm_cfg)?;
    robot.set_on_exit(cfg.robot.on_exit);
    let session = cfg.bus_config(bus).open()?;
    let mut server = RobotServer::new(
        &session,
        robot,
        ServeMode::Realtime {
            hz: arm_cfg.control_hz,
        },
    )?;
    if cfg.serve.filter.unwrap_or(true) {
        server = server.with_filter(CommandFilter {
            max_joint_step_rad: cfg.safety.max_joint_step_rad,
            max_ee_step_m: cfg.safety.max_ee_step_m,
            max_gripper_step: cfg.safety.max_gripper_step_m,
        });
    }
    if let Some(ms) = cfg.serve.watchdog_ms {
        server = server.with_watchdog(Duration::from_secs_f64(ms / 1e3));
    }
    tracing::info!(
        "serving arm `{}` ({}) on reflex/{}/* at {} Hz, command filter {}",
        cfg.robot_name(),
        kind.name(),
        cfg.robot_name(),
        arm_cfg.control_hz,
        if cfg.serve.filter.unwrap_or(true) {
            "on"
        } else {
            "off"
        }
    );
    // The server stops on the caller's flag or after `seconds`.
    let done = std::sync::atomic::AtomicBool::new(false);
    let t0 = Instant::now();
    let stats = std::thread::scope(|scope| {
        scope.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                if stop.load(Ordering::Relaxed)
                    || seconds.is_some_and(|s| t0.elapsed().as_secs_f64() >= s)
                {
                    done.store(true, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let r = server.run(&done);
        done.store(true, Ordering::Relaxed);
        r
    })?;
    Ok(stats)
}
