//! `reflex hw ...`: servo buses. `emulate` serves emulated servos on a pseudo-terminal;
//! `bench` times sync reads and writes over one.

use clap::{Args, Subcommand};
#[cfg(feature = "emulate")]
use reflex_hardware::emulate::{Emulator, EmulatorConfig, ServoModel};
#[cfg(feature = "emulate")]
use std::io::Write;
#[cfg(feature = "emulate")]
use std::time::{Duration, Instant};

#[derive(Subcommand)]
pub enum HwCommand {
    #[cfg(feature = "emulate")]
    /// Emulated servos behind a pseudo-terminal (prints the port to open), until stopped.
    Emulate(EmulateArgs),
    /// Serve the arm of a run config on the bus (a robot driver for an actor on another
    /// computer), with the serving side's own command filter and e-stop.
    Serve(ServeArgs),
    /// Sync-read and sync-write latency over an emulated bus.
    #[cfg(feature = "bench")]
    Bench(crate::cli::ServoBenchArgs),
    /// The cameras of this computer (V4L2): formats reflex decodes, sizes, frame rates, and
    /// whether this user may open them.
    Cameras(CamerasArgs),
}

#[derive(Args)]
pub struct CamerasArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

fn cameras(a: CamerasArgs) -> anyhow::Result<()> {
    let list = reflex_cameras::v4l2::list_cameras();
    if a.json {
        crate::cli::print_json(&list);
        return Ok(());
    }
    if list.is_empty() {
        println!(
            "no cameras (/dev/video*); without one, a folder of images is a camera: device = \"files:DIR\" (docs/hardware.md)"
        );
    }
    for c in &list {
        match &c.error {
            Some(e) => println!("{}: {e}", c.path),
            None if !c.captures => println!(
                "{}: {} ({}): not a video capture node",
                c.path, c.card, c.driver
            ),
            None => {
                println!("{}: {} ({}, {})", c.path, c.card, c.driver, c.bus_info);
                for f in &c.formats {
                    let sizes: Vec<String> = f
                        .sizes
                        .iter()
                        .map(|s| {
                            let fps: Vec<String> =
                                s.fps.iter().map(|r| format!("{r:.0}")).collect();
                            format!("{}x{} @ {} fps", s.width, s.height, fps.join("/"))
                        })
                        .collect();
                    println!(
                        "  {} ({}{}): {}",
                        f.fourcc,
                        f.description,
                        f.reflex_format
                            .as_deref()
                            .map(|r| format!(", format = \"{r}\""))
                            .unwrap_or_else(|| ", not decoded by reflex".into()),
                        sizes.join(", ")
                    );
                }
            }
        }
    }
    Ok(())
}

#[cfg(feature = "emulate")]
#[derive(Args)]
pub struct EmulateArgs {
    /// Which arm's servos.
    #[arg(long, value_enum, default_value = "so101-follower")]
    robot: crate::cli::ArmArg,
    /// An id that never answers (repeatable).
    #[arg(long = "silent", value_name = "ID")]
    silent: Vec<u8>,
    /// Corrupt one byte of every N-th status packet.
    #[arg(long, default_value_t = 0)]
    corrupt_every: u64,
    /// Wait this long before every answer, ms.
    #[arg(long, default_value_t = 0.0)]
    delay_ms: f64,
    /// Stop after this many seconds (default: until interrupted).
    #[arg(long, value_parser = crate::cli::seconds)]
    seconds: Option<f64>,
    /// Also make PATH a symbolic link to the port (a fixed name for configs; removed on exit).
    #[arg(long, value_name = "PATH")]
    link: Option<std::path::PathBuf>,
    /// Write every change of a servo's goal or torque register to FILE, a JSON line each
    /// (`t_unix_ns`, `write`, `id`, `reg`, `value`): what a controller told the servos.
    #[arg(long, value_name = "FILE")]
    goal_log: Option<std::path::PathBuf>,
    /// Leave every SYNC READ after the first N unanswered (a bus that fails mid-run).
    #[arg(long, value_name = "N")]
    drop_sync_reads_after: Option<u64>,
}

#[derive(Args)]
pub struct ServeArgs {
    /// The robot's run config: `[robot]` (so101 or koch), `[arm]`, `[safety]` (the filter's
    /// step limits), `[serve]`, `[bus]`.
    #[arg(long)]
    config: std::path::PathBuf,
    /// Stop after this many seconds (default: until interrupted).
    #[arg(long, value_parser = crate::cli::seconds)]
    seconds: Option<f64>,
    /// Print the serving counters as JSON when stopped.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    bus: crate::cli::BusArgs,
}

#[cfg(feature = "emulate")]
fn config(a: &EmulateArgs) -> EmulatorConfig {
    let model = a.robot.kind().servo_model();
    EmulatorConfig {
        model,
        silent: a.silent.clone(),
        corrupt_every: a.corrupt_every,
        delay: Duration::from_secs_f64(a.delay_ms / 1e3),
        drop_sync_reads_after: a.drop_sync_reads_after,
        goal_log: a.goal_log.clone(),
        ..Default::default()
    }
}

pub fn run(cmd: HwCommand) -> anyhow::Result<()> {
    match cmd {
        HwCommand::Cameras(a) => cameras(a),
        #[cfg(feature = "emulate")]
        HwCommand::Emulate(a) => {
            let cfg = config(&a);
            let model = match cfg.model {
                ServoModel::Sts3215 => "Feetech STS3215",
                ServoModel::Xl330 => "Dynamixel XL330-M288",
            };
            let emu = Emulator::start(cfg)?;
            let mut shown = emu.path().to_string();
            if let Some(link) = &a.link {
                // Replace a link left by an earlier run; never a regular file someone keeps.
                if std::fs::symlink_metadata(link).is_ok_and(|m| m.file_type().is_symlink()) {
                    std::fs::remove_file(link)?;
                }
                std::os::unix::fs::symlink(emu.path(), link).map_err(|e| {
                    anyhow::anyhow!("--link {}: cannot create the link: {e}", link.display())
                })?;
                shown = format!("{} (linked from {})", emu.path(), link.display());
            }
            println!(
                "emulated {model} servos 1-6 on {shown} (open it at 1000000 baud; Ctrl-C stops)"
            );
            std::io::stdout().flush()?;
            let stop = reflex_agent::signals::stop_on_signals();
            let t0 = Instant::now();
            while a.seconds.is_none_or(|s| t0.elapsed().as_secs_f64() < s) && !stop.finish_asked() {
                std::thread::sleep(Duration::from_millis(50));
            }
            if let Some(link) = &a.link {
                let _ = std::fs::remove_file(link);
            }
            Ok(())
        }
        #[cfg(feature = "bench")]
        HwCommand::Bench(a) => crate::cli::servo_bench(&a),
        HwCommand::Serve(a) => {
            let cfg = reflex_agent::config::RunConfig::load(&a.config)?;
            let stop = reflex_agent::signals::stop_on_signals();
            let stats = reflex_tools::serve::serve_config(
                &cfg,
                &a.bus.config(),
                stop.finish_flag(),
                a.seconds,
            )?;
            if a.json {
                crate::cli::print_json(&stats);
            } else {
                println!(
                    "served {} steps, {} resets; {} commands refused (filter or malformed), {} held by the e-stop, {} watchdog trips",
                    stats.steps,
                    stats.resets,
                    stats.rejected_commands,
                    stats.held_while_stopped,
                    stats.watchdog_trips
                );
            }
            Ok(())
        }
    }
}
