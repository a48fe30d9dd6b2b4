//! `reflex sim ...`: serve, bench, demos, expert, snapshot.

use crate::cli::{Bars, BusArgs, command_line, print_json};
use clap::{Args, Subcommand, ValueEnum};
use reflex_bus::robot::ServeMode;
use reflex_contracts::msg::ActionKind;
use reflex_sim::{SimConfig, TaskKind};
use reflex_tools::simtools::{self, DemosOptions};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

#[derive(Subcommand)]
pub enum SimCommand {
    /// Serve the simulator as a robot on Zenoh (lockstep by default).
    Serve(ServeArgs),
    /// Environment steps per second on one thread, cameras off and on.
    Bench(BenchArgs),
    /// Record scripted-expert episodes to a directory.
    Demos(DemosArgs),
    /// Run the scripted expert and report its success rate.
    Expert(ExpertArgs),
    /// Write the camera images (PNG) after N expert steps of a seeded episode.
    Snapshot(SnapshotArgs),
    /// Render a calibration board (chessboard or ChArUco) through a simulated camera from
    /// seeded poses (PNG), with the truth (truth.json): try `reflex calibrate camera|hand-eye`
    /// without a camera.
    BoardViews(BoardViewsArgs),
    /// Print the robot spec the simulator serves (state fields, action space, cameras) as
    /// JSON: what `reflex policy import lerobot --robot-spec` and other peers map onto.
    Spec(SpecArgs),
}

#[derive(Args)]
pub struct SpecArgs {
    #[command(flatten)]
    sim: SimSelect,
}

/// A task of the simulator.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum TaskArg {
    /// Move the tool to a point.
    Reach,
    /// Push the cube into a goal region.
    Push,
    /// Lift the cube.
    Pick,
    /// Put the peg in the hole.
    Insert,
    /// Follow a moving target.
    Track,
}

/// An action space of the simulator.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ActionArg {
    /// End-effector translation step and gripper opening.
    EeDelta,
    /// The same plus a yaw step.
    EeDeltaYaw,
    /// Absolute joint targets.
    JointAbs,
    /// Joint target steps.
    JointDelta,
}

/// Which simulator to build: a config file, or a task with defaults.
#[derive(Args, Clone, Debug)]
pub struct SimSelect {
    /// Task; ignored when --config is given.
    #[arg(long, value_enum, default_value = "pick")]
    pub task: TaskArg,
    /// A TOML config file with a `[sim]` table.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Action space; overrides the config.
    #[arg(long, value_enum)]
    pub action: Option<ActionArg>,
    /// Render the front and wrist cameras.
    #[arg(long)]
    pub cameras: bool,
    /// Camera image size, WIDTHxHEIGHT (default: the config's, else 128x128).
    #[arg(long, value_name = "WxH", value_parser = crate::cli::sim_camera_size)]
    pub camera_size: Option<(u32, u32)>,
}

impl SimSelect {
    fn load(&self) -> anyhow::Result<SimConfig> {
        let mut cfg = match &self.config {
            Some(p) => simtools::load_sim_config(p)?,
            None => SimConfig::for_task(match self.task {
                TaskArg::Reach => TaskKind::Reach,
                TaskArg::Push => TaskKind::Push,
                TaskArg::Pick => TaskKind::Pick,
                TaskArg::Insert => TaskKind::Insert,
                TaskArg::Track => TaskKind::Track,
            }),
        };
        if let Some(a) = self.action {
            cfg.action = match a {
                ActionArg::EeDelta => ActionKind::EeDelta,
                ActionArg::EeDeltaYaw => ActionKind::EeDeltaYaw,
                ActionArg::JointAbs => ActionKind::JointAbs,
                ActionArg::JointDelta => ActionKind::JointDelta,
            };
        }
        if self.cameras {
            cfg.cameras.enabled = true;
        }
        if let Some((w, h)) = self.camera_size {
            cfg.cameras.width = w;
            cfg.cameras.height = h;
        }
        Ok(cfg)
    }
}

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    sim: SimSelect,
    /// Robot name on the bus (the `<robot>` of `reflex/<robot>/...`).
    #[arg(long)]
    robot: Option<String>,
    /// Run on a fixed clock at this rate instead of lockstep (1-1000 Hz).
    #[arg(long, value_name = "HZ", value_parser = crate::cli::hertz)]
    realtime: Option<f64>,
    #[command(flatten)]
    bus: BusArgs,
}

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    sim: SimSelect,
    /// Environment steps to time (state only); the camera run takes a tenth of them.
    #[arg(long, default_value_t = 20_000)]
    steps: u64,
    /// Skip the run with cameras.
    #[arg(long)]
    no_cameras: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct DemosArgs {
    #[command(flatten)]
    sim: SimSelect,
    /// Episodes to record.
    #[arg(long, default_value_t = 20, value_parser = crate::cli::count64)]
    episodes: u64,
    /// Expert action noise (std as a fraction of half the action range).
    #[arg(long, default_value_t = 0.0)]
    noise: f64,
    /// Seed of the episode seeds and of the expert's noise.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Keep only successful episodes.
    #[arg(long)]
    successes_only: bool,
    /// Output directory.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
pub struct ExpertArgs {
    #[command(flatten)]
    sim: SimSelect,
    /// Episodes to run.
    #[arg(long, default_value_t = 100, value_parser = crate::cli::count64)]
    episodes: u64,
    /// Expert action noise.
    #[arg(long, default_value_t = 0.0)]
    noise: f64,
    /// Seed of the episode seeds.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Print every step of every episode (named state fields, action, reward) as JSON lines.
    #[arg(long)]
    trace: bool,
}

#[derive(Args)]
pub struct SnapshotArgs {
    #[command(flatten)]
    sim: SimSelect,
    /// Episode seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Expert steps before the snapshot.
    #[arg(long, default_value_t = 0)]
    steps: u32,
    /// Output directory (one PNG per camera).
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
pub struct BoardViewsArgs {
    /// The simulator's camera: front or wrist.
    #[arg(long, default_value = "front")]
    camera: String,
    /// Image size, WIDTHxHEIGHT.
    #[arg(long, default_value = "640x480", value_parser = crate::cli::parse_size)]
    size: (u32, u32),
    /// The board.
    #[arg(long, default_value = "chessboard:9x6:0.025")]
    board: reflex_calibration::board::Board,
    /// Views.
    #[arg(long, default_value_t = 20)]
    views: usize,
    /// Seed of the poses.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Lens distortion added to the camera's pinhole: k1,k2,p1,p2,k3 (OpenCV's order).
    #[arg(long, default_value = "0,0,0,0,0", value_parser = parse_distortion, allow_hyphen_values = true)]
    distortion: Distortion,
    /// Hand-eye views: the camera on the arm (wrist) over a board on the table; writes
    /// poses.json with the arm's joints for each view.
    #[arg(long)]
    hand_eye: bool,
    /// Output folder.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Clone, Copy)]
struct Distortion([f64; 5]);

fn parse_distortion(s: &str) -> Result<Distortion, String> {
    let v: Result<Vec<f64>, _> = s.split(',').map(|x| x.trim().parse::<f64>()).collect();
    match v {
        Ok(v) if v.len() == 5 && v.iter().all(|x| x.is_finite()) => {
            Ok(Distortion([v[0], v[1], v[2], v[3], v[4]]))
        }
        _ => Err(format!("`{s}` is not five numbers k1,k2,p1,p2,k3")),
    }
}

pub fn run(cmd: SimCommand) -> anyhow::Result<()> {
    match cmd {
        SimCommand::Serve(a) => {
            let mut cfg = a.sim.load()?;
            if let Some(r) = a.robot {
                cfg.robot = r;
            }
            let mode = match a.realtime {
                Some(hz) => ServeMode::Realtime { hz },
                None => ServeMode::Lockstep,
            };
            simtools::serve(cfg, mode, &a.bus.config(), &AtomicBool::new(false))?;
        }
        SimCommand::Spec(a) => print_json(&simtools::robot_spec(a.sim.load()?)?),
        SimCommand::Bench(a) => {
            let out = simtools::bench(a.sim.load()?, a.steps, a.no_cameras)?;
            if a.json {
                print_json(&out);
            } else {
                print_bench(&out);
            }
        }
        SimCommand::Demos(a) => {
            let o = DemosOptions {
                episodes: a.episodes,
                noise: a.noise,
                seed: a.seed,
                successes_only: a.successes_only,
                out: a.out.clone(),
                command: command_line(),
            };
            let r = simtools::demos(a.sim.load()?, &o, &Bars::new(false))?;
            println!(
                "wrote {} episodes to {} ({} of {} run episodes succeeded)",
                r.written,
                a.out.display(),
                r.successes,
                r.tried
            );
        }
        SimCommand::Expert(a) => expert(a)?,
        SimCommand::BoardViews(a) => {
            let o = reflex_tools::boardviews::BoardViewsOptions {
                camera: a.camera.clone(),
                width: a.size.0,
                height: a.size.1,
                board: a.board,
                views: a.views,
                seed: a.seed,
                distortion: a.distortion.0,
                hand_eye: a.hand_eye,
                out: a.out.clone(),
            };
            let t = reflex_tools::boardviews::board_views(&o, &Bars::new(false))?;
            let k = &t.camera.camera_matrix;
            println!(
                "wrote {} views of {} seen by `{}` to {} (fx {:.2} fy {:.2} cx {:.2} cy {:.2} px; truth.json{})",
                t.views.len(),
                t.board,
                t.camera_name,
                a.out.display(),
                k[0][0],
                k[1][1],
                k[0][2],
                k[1][2],
                if a.hand_eye { ", poses.json" } else { "" }
            );
        }
        SimCommand::Snapshot(a) => {
            for p in simtools::snapshot(a.sim.load()?, a.seed, a.steps, &a.out)? {
                println!("{}", p.display());
            }
        }
    }
    Ok(())
}

fn expert(a: ExpertArgs) -> anyhow::Result<()> {
    let mut print_line = |v: serde_json::Value| println!("{v}");
    let trace: Option<&mut dyn FnMut(serde_json::Value)> =
        if a.trace { Some(&mut print_line) } else { None };
    let cfg = a.sim.load()?;
    let task = cfg.task;
    let out = simtools::expert(cfg, a.episodes, a.noise, a.seed, trace, &Bars::new(a.json))?;
    if a.json {
        println!("{}", serde_json::to_string(&out)?);
    } else {
        println!(
            "scripted expert on `{task}`: {}/{} successful ({:.1}%), {:.1} steps per episode, {:.1} s",
            out.successes,
            out.episodes,
            100.0 * out.success_rate,
            out.mean_steps,
            out.wall_s
        );
        let failed = &out.failed_seeds;
        if !failed.is_empty() {
            println!("failed seeds: {:?}", &failed[..failed.len().min(10)]);
        }
    }
    Ok(())
}

fn print_bench(out: &simtools::SimBenchReport) {
    println!(
        "sim bench {} ({} Hz control, {} Hz physics, {} substeps), one thread:",
        out.task, out.control_hz, out.physics_hz, out.substeps
    );
    let s = &out.state_only;
    println!(
        "  state only: {:.0} steps/s ({:.1} us/step, {:.0} physics steps/s) over {} steps",
        s.steps_per_s,
        s.us_per_step,
        s.physics_steps_per_s.unwrap_or(f64::NAN),
        s.steps
    );
    if let Some(c) = &out.cameras {
        println!(
            "  2 cameras {}x{}: {:.0} steps/s ({:.0} us/step) over {} steps",
            c.width.unwrap_or(0),
            c.height.unwrap_or(0),
            c.steps_per_s,
            c.us_per_step,
            c.steps
        );
    }
}
