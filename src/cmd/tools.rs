//! `reflex bc`, `reward`, `dataset`, `teleop`, `estop`, `replay`, `viz`, `keys`: arguments and what
//! they print.

use crate::cli::{Bars, BusArgs, command_line, print_json};
use clap::{Args, Subcommand, ValueEnum};
use reflex_hardware::teleop::{DeviceKind, DeviceOptions};
use reflex_imitate::TrainConfig;
use reflex_tools::policytools::{self, TrainOptions};
use reflex_tools::teleop::TeleopEvent;
use reflex_tools::viz::{VizOptions, VizTarget};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Subcommand)]
pub enum BcCommand {
    /// Train a diffusion policy on recorded episodes and export it to ONNX with its spec.
    Train(TrainArgs),
}

#[derive(Subcommand)]
pub enum RewardCommand {
    /// Train a success classifier on recorded frames, judge it on held-out episodes, and export
    /// it to ONNX with its spec (NAME.reward.toml).
    Train(RewardTrainArgs),
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("frames").required(true).args(["demos", "runs"])))]
pub struct RewardTrainArgs {
    /// A directory written by `reflex sim demos --cameras`: frames labelled by the task's
    /// success.
    #[arg(long)]
    demos: Option<PathBuf>,
    /// Recorded runs: one run (`runs/<id>`) or a directory of them (`runs/`), recorded with
    /// cameras (`reflex run --record`); frames labelled by each episode's end:
    /// the person's success or failure key where pressed, else the robot's verdict.
    #[arg(long)]
    runs: Option<PathBuf>,
    /// A camera the classifier reads (repeat for several).
    #[arg(long = "camera", value_name = "NAME", required = true)]
    cameras: Vec<String>,
    /// Size it reads images at, WIDTHxHEIGHT (multiples of 4; default: the recorded size).
    #[arg(long, value_name = "WxH", value_parser = crate::cli::parse_size)]
    image_size: Option<(u32, u32)>,
    /// Fraction of the episodes (the last ones) held out to judge it.
    #[arg(long, default_value_t = 0.2, value_parser = crate::cli::fraction)]
    holdout: f64,
    /// Probability at or above which a frame counts as success.
    #[arg(long, default_value_t = 0.5, value_parser = crate::cli::threshold)]
    threshold: f32,
    /// Gradient steps.
    #[arg(long, default_value_t = 2000, value_parser = crate::cli::count)]
    steps: usize,
    /// Batch size.
    #[arg(long, default_value_t = 64, value_parser = crate::cli::count)]
    batch: usize,
    /// Learning rate.
    #[arg(long, default_value_t = 3e-4, value_parser = crate::cli::learning_rate)]
    lr: f64,
    /// Largest random shift of a training image, pixels.
    #[arg(long, default_value_t = 4)]
    shift: usize,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output model, e.g. models/reward.onnx.
    #[arg(long)]
    out: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub fn reward(cmd: RewardCommand) -> anyhow::Result<()> {
    let RewardCommand::Train(a) = cmd;
    let o = policytools::RewardTrainOptions {
        source: match (a.demos, a.runs) {
            (Some(d), _) => policytools::RewardSource::Demos(d),
            (None, Some(r)) => policytools::RewardSource::Runs(r),
            (None, None) => unreachable!("clap requires --demos or --runs"),
        },
        cameras: a.cameras,
        image_size: a.image_size,
        holdout: a.holdout,
        threshold: a.threshold,
        cfg: reflex_vision::reward::RewardTrainConfig {
            steps: a.steps,
            batch: a.batch,
            lr: a.lr,
            shift: a.shift,
            seed: a.seed,
        },
        out: a.out,
        command: command_line(),
    };
    let r = policytools::reward_train(&o, &Bars::new(a.json))?;
    if a.json {
        crate::cli::print_json(&r);
    } else {
        println!(
            "wrote {} and {} ({:.0} s)\nheld out: {} episodes, {} frames ({} success): accuracy {:.3}, precision {:.3}, recall {:.3} at threshold {}; {} of the {} false positives are at most {} frames before a success",
            r.model.display(),
            r.spec.display(),
            r.wall_s,
            r.held_out.episodes,
            r.held_out.frames,
            r.held_out.successes,
            r.accuracy,
            r.precision,
            r.recall,
            r.threshold,
            r.false_positives_near_success,
            r.confusion.false_positives,
            policytools::NEAR_FRAMES
        );
    }
    Ok(())
}

#[derive(Args)]
pub struct TrainArgs {
    /// A directory written by `reflex sim demos`.
    #[arg(long, required_unless_present = "dataset", conflicts_with = "dataset")]
    demos: Option<PathBuf>,
    /// A LeRobotDataset v3.0 directory (meta/info.json, data/...), e.g. one `reflex dataset
    /// export` wrote or one from the Hugging Face Hub.
    #[arg(long)]
    dataset: Option<PathBuf>,
    /// The dataset's state feature.
    #[arg(long, default_value = "observation.state")]
    state_key: String,
    /// The dataset's action feature.
    #[arg(long, default_value = "action")]
    action_key: String,
    /// Output model, e.g. models/pick.onnx (the spec is written beside it).
    #[arg(long)]
    out: PathBuf,
    /// The robot kind the policy is for, instead of the demos' (e.g. `so101/reach` for a policy
    /// trained on the simulated SO-101 that runs on the real one, which shares its layout).
    #[arg(long)]
    robot_kind: Option<String>,
    /// Use only the first N episodes.
    #[arg(long, value_parser = crate::cli::count)]
    episodes: Option<usize>,
    /// Gradient steps.
    #[arg(long, default_value_t = 4000, value_parser = crate::cli::count)]
    steps: usize,
    /// Batch size.
    #[arg(long, default_value_t = 256, value_parser = crate::cli::count)]
    batch: usize,
    /// Learning rate.
    #[arg(long, default_value_t = 1e-3, value_parser = crate::cli::learning_rate)]
    lr: f64,
    /// Hidden width.
    #[arg(long, default_value_t = 256, value_parser = crate::cli::count)]
    hidden: usize,
    /// Chunk length.
    #[arg(long, default_value_t = 16, value_parser = crate::cli::count)]
    horizon: usize,
    /// Actions executed per chunk.
    #[arg(long, default_value_t = 8, value_parser = crate::cli::count)]
    execute: usize,
    /// State fields the policy reads, comma-separated (default: the whole state); e.g.
    /// `joint_pos,gripper` to leave where the object is to the cameras.
    #[arg(long, value_delimiter = ',')]
    state_fields: Vec<String>,
    /// A camera the policy reads (repeat for several), from demos recorded with
    /// `reflex sim demos --cameras`, or a LeRobot dataset's H.264 video feature
    /// (`observation.images.NAME`).
    #[arg(long = "camera", value_name = "NAME")]
    cameras: Vec<String>,
    /// Size the policy reads images at, WIDTHxHEIGHT (default: the recorded size).
    #[arg(long, value_name = "WxH", value_parser = crate::cli::parse_size)]
    image_size: Option<(u32, u32)>,
    /// Largest random shift of a training image, pixels (DrQ's augmentation; 0: none).
    #[arg(long, default_value_t = 4)]
    shift: usize,
    /// What the policy learns: `diffusion` (DDPM noise, DDIM sampling) or `flow` (flow-matching
    /// velocity, Euler sampling; also writes NAME.vjp.onnx, which guided real-time chunking uses).
    #[arg(long, value_enum, default_value = "diffusion")]
    objective: ObjectiveArg,
    /// Euler steps of a flow policy's sampler.
    #[arg(long, default_value_t = 10, value_parser = crate::cli::count)]
    flow_steps: usize,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// `reflex bc train --objective`.
#[derive(Clone, Copy, ValueEnum)]
pub enum ObjectiveArg {
    /// Diffusion Policy's: predict the noise.
    Diffusion,
    /// Flow matching: predict the velocity from noise to the chunk.
    Flow,
}

impl From<ObjectiveArg> for reflex_imitate::Objective {
    fn from(o: ObjectiveArg) -> Self {
        match o {
            ObjectiveArg::Diffusion => reflex_imitate::Objective::Diffusion,
            ObjectiveArg::Flow => reflex_imitate::Objective::Flow,
        }
    }
}

#[derive(Subcommand)]
pub enum DatasetCommand {
    /// Write recorded episodes as a dataset other tools read (LeRobotDataset v3.0).
    Export(ExportArgs),
}

#[derive(Clone, Copy, ValueEnum)]
pub enum DatasetFormat {
    /// LeRobotDataset v3.0 (parquet data and metadata, info.json, stats.json).
    Lerobot,
}

#[derive(Args)]
pub struct ExportArgs {
    /// Recorded episodes: a directory written by `reflex sim demos`.
    #[arg(long, required_unless_present = "run", conflicts_with = "run")]
    demos: Option<PathBuf>,
    /// A run directory with recorded steps (`<run>/steps`, written by `reflex demo`).
    #[arg(long)]
    run: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value = "lerobot")]
    format: DatasetFormat,
    /// The dataset directory to create (new or empty).
    #[arg(long)]
    out: PathBuf,
    /// The task in words (default: the robot's kind).
    #[arg(long)]
    task: Option<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn dataset(cmd: DatasetCommand) -> anyhow::Result<()> {
    let DatasetCommand::Export(a) = cmd;
    let DatasetFormat::Lerobot = a.format;
    let demos = match (a.demos, a.run) {
        (Some(d), _) => d,
        (None, Some(r)) => r.join("steps"),
        (None, None) => anyhow::bail!("give --demos DIR or --run DIR"),
    };
    let r = reflex_data::dataset::export_lerobot(&reflex_data::dataset::ExportOptions {
        demos,
        out: a.out.clone(),
        task: a.task,
    })?;
    if a.json {
        print_json(&r);
    } else {
        println!(
            "wrote {} episodes, {} frames ({} data files; features {}) to {} (LeRobotDataset {})",
            r.episodes,
            r.frames,
            r.data_files,
            r.features.join(", "),
            a.out.display(),
            reflex_data::dataset::CODEBASE_VERSION
        );
    }
    Ok(())
}

pub fn bc(cmd: BcCommand) -> anyhow::Result<()> {
    let BcCommand::Train(a) = cmd;
    let source = match (a.demos, a.dataset) {
        (Some(d), _) => policytools::TrainSource::Demos(d),
        (None, Some(dir)) => policytools::TrainSource::LeRobot {
            dir,
            state_key: a.state_key,
            action_key: a.action_key,
        },
        (None, None) => anyhow::bail!("give --demos DIR or --dataset DIR"),
    };
    let o = TrainOptions {
        source,
        out: a.out,
        episodes: a.episodes,
        only: None,
        robot_kind: a.robot_kind,
        cfg: TrainConfig {
            steps: a.steps,
            batch: a.batch,
            lr: a.lr,
            hidden: a.hidden,
            layers: 3,
            horizon: a.horizon,
            execute: a.execute,
            ema: 0.995,
            shift: a.shift,
            objective: a.objective.into(),
            flow_steps: a.flow_steps,
            seed: a.seed,
        },
        state_fields: a.state_fields,
        cameras: a.cameras,
        image_size: a.image_size,
        command: command_line(),
    };
    let r = policytools::bc_train(&o, &Bars::new(false))?;
    println!(
        "wrote {} and {} (final loss {:.4}, {:.0} s)",
        r.model.display(),
        r.spec.display(),
        r.final_loss,
        r.wall_s
    );
    if let Some(v) = &r.vjp {
        println!(
            "wrote {} (the velocity's vector-Jacobian product, for guided real-time chunking)",
            v.display()
        );
    }
    if let Some(e) = &r.encoder {
        println!(
            "wrote {} (its image encoder, frozen: the features [learner.vision] encoder reads)",
            e.display()
        );
    }
    Ok(())
}

/// A teleop device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DeviceArg {
    /// This terminal's keyboard.
    Keyboard,
    /// A leader arm on a serial port (--port), its torque off; the keyboard (when there is a
    /// terminal) keeps the buttons: space takes over, y/n label, x reset, q quits.
    Leader,
    /// A gamepad's evdev node (--path /dev/input/eventN): hold the right bumper to take over.
    Gamepad,
    /// A SpaceMouse's hidraw node (--path /dev/hidrawN): push the cap to take over.
    Spacemouse,
}

/// What `reflex estop` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EstopAction {
    /// Latch the e-stop: the robot holds, the episode ends, nothing starts.
    Raise,
    /// Release the latched e-stop of every holder (the robot's server, its actor): the robot
    /// stays still (paused).
    Release,
    /// Resume a paused run: the next episode starts.
    Resume,
}

#[derive(Args)]
pub struct EstopArgs {
    /// raise (the default), release or resume.
    #[arg(value_enum, default_value = "raise")]
    action: EstopAction,
    /// The robot's name on the bus.
    #[arg(long)]
    robot: String,
    /// Who acts, shown in the robot's status and log (default: user@host).
    #[arg(long = "as", value_name = "NAME")]
    who: Option<String>,
    /// How long to wait for every holder of the robot's e-stop (its server, its actor) to
    /// confirm, s.
    #[arg(long, default_value_t = 5.0, value_parser = crate::cli::seconds)]
    wait_s: f64,
    /// Print the confirming reports as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    bus: BusArgs,
}

pub fn estop(a: EstopArgs) -> anyhow::Result<()> {
    use reflex_contracts::stop::StopAct;
    let act = match a.action {
        EstopAction::Raise => StopAct::Raise,
        EstopAction::Release => StopAct::Release,
        EstopAction::Resume => StopAct::Resume,
    };
    let who = a.who.clone().unwrap_or_else(|| {
        let user = std::env::var("USER").unwrap_or_else(|_| "someone".into());
        let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
        format!("{user}@{}", host.trim())
    });
    // A client of the robot's bus: its one link carries the act (see `reflex_bus::Mode`).
    let mut bus = a.bus.config();
    bus.mode = reflex_bus::Mode::Client;
    let session = bus.open()?;
    let out = reflex_tools::operator::act(
        &session,
        &a.robot,
        act,
        &who,
        Duration::from_secs_f64(a.wait_s),
    )?;
    if a.json {
        print_json(&out);
    } else {
        let next = match act {
            StopAct::Raise => format!(
                "the robot holds; release with `reflex estop release --robot {}`",
                a.robot
            ),
            StopAct::Release => format!(
                "nothing moves until `reflex estop resume --robot {}`",
                a.robot
            ),
            StopAct::Resume => "the next episode starts".to_string(),
        };
        // Each holder's count and who acted: a served robot's server and its actor count the
        // e-stops each heard, so they differ when the actor started later.
        let who: Vec<String> = out
            .holders
            .iter()
            .map(|h| format!("{}: e-stop {}, by {}", h.holder, h.estops, h.stop_by))
            .collect();
        println!(
            "`{}`: e-stop {} ({}): {next}",
            out.robot,
            out.state,
            who.join("; ")
        );
    }
    Ok(())
}

#[derive(Args)]
pub struct TeleopArgs {
    /// Input device.
    #[arg(long, value_enum, default_value = "keyboard")]
    device: DeviceArg,
    /// The robot's name on the bus.
    #[arg(long)]
    robot: String,
    /// Messages per second.
    #[arg(long, default_value_t = 50.0, value_parser = crate::cli::hertz)]
    rate_hz: f64,
    /// A key counts as held for this long after its last press, ms.
    #[arg(long, default_value_t = 250.0)]
    hold_ms: f64,
    /// Fraction of the action bounds a held key commands.
    #[arg(long, default_value_t = 0.5)]
    speed: f32,
    /// How long to wait for the robot's spec, s.
    #[arg(long, default_value_t = 15.0, value_parser = crate::cli::seconds)]
    wait_s: f64,
    /// The leader arm's serial port (--device leader).
    #[arg(long)]
    port: Option<String>,
    /// The device file of a gamepad (/dev/input/eventN) or a SpaceMouse (/dev/hidrawN).
    #[arg(long)]
    path: Option<PathBuf>,
    /// Which leader arm: so101-leader or koch-leader.
    #[arg(long, default_value = "so101-leader")]
    leader: String,
    /// The leader's LeRobot calibration file (default: zero at step 2048, for emulated servos).
    #[arg(long)]
    calibration: Option<PathBuf>,
    /// Largest change of a joint command per control period of the robot while the follower is
    /// brought to the leader, rad. Keep it under half the actor's `[safety] max_joint_step_rad`
    /// (0.1 by default): a tick can see two messages' worth of change when delivery jitters.
    #[arg(long, default_value_t = 0.04)]
    max_joint_step_rad: f64,
    /// Take over from the start and keep driving (no keyboard needed; labels need one).
    #[arg(long)]
    intervene: bool,
    #[command(flatten)]
    bus: BusArgs,
}

pub fn teleop(a: TeleopArgs) -> anyhow::Result<()> {
    use reflex_contracts::msg::EventKind;
    let session = a.bus.config().open()?;
    let spec =
        reflex_tools::teleop::fetch_spec(&session, &a.robot, Duration::from_secs_f64(a.wait_s))?;
    let follow = std::sync::Arc::new(reflex_tools::teleop::Follow::default());
    let _watch = reflex_tools::teleop::follow(&session, &a.robot, follow.clone())?;
    let kind = match a.device {
        DeviceArg::Keyboard => DeviceKind::Keyboard,
        DeviceArg::Leader => DeviceKind::Leader,
        DeviceArg::Gamepad => DeviceKind::Gamepad,
        DeviceArg::Spacemouse => DeviceKind::SpaceMouse,
    };
    let options = DeviceOptions {
        port: a.port.clone(),
        path: a.path.clone(),
        leader: a.leader.clone(),
        calibration: a.calibration.clone(),
        speed: a.speed,
        hold: Duration::from_secs_f64(a.hold_ms / 1e3),
        max_joint_step_rad: a.max_joint_step_rad,
        intervene: a.intervene,
    };
    let mut dev = reflex_hardware::teleop::open(kind, &spec, &options)?;
    match a.device {
        DeviceArg::Keyboard => eprint!(
            "teleop `{}` ({}): w/s a/d r/f move, o/c gripper, space take over / hand back, y success, n failure, x reset, e E-STOP, u release, g resume, q quit\r\n",
            spec.name, spec.kind
        ),
        DeviceArg::Leader => eprint!(
            "teleop `{}` ({}) from the leader arm {}: {}\r\n",
            spec.name,
            spec.kind,
            dev.name(),
            if a.intervene {
                "driving from the start (Ctrl-C stops)"
            } else {
                "space take over / hand back, y success, n failure, x reset, e E-STOP, u release, g resume, q quit"
            }
        ),
        DeviceArg::Gamepad => eprint!(
            "teleop `{}` ({}) from the {}: hold the right bumper to drive; left stick: forward/back and left/right, right stick: up/down; triggers: gripper; A success, B failure, Y reset\r\n",
            spec.name,
            spec.kind,
            dev.name()
        ),
        DeviceArg::Spacemouse => eprint!(
            "teleop `{}` ({}) from the {}: push the cap to drive; left button closes the gripper, right opens it; labels from the keyboard (y, n, x)\r\n",
            spec.name,
            spec.kind,
            dev.name()
        ),
    }
    reflex_tools::teleop::drive(
        dev.as_mut(),
        &session,
        &a.robot,
        a.rate_hz,
        Some(&follow),
        &mut |e| match e {
            TeleopEvent::Driving(true) => eprint!("-- you drive\r\n"),
            TeleopEvent::Driving(false) => eprint!("-- the policy drives\r\n"),
            TeleopEvent::Sent(what) => eprint!("-- sent: {what}\r\n"),
            TeleopEvent::Robot(ev) => {
                let what = match ev.kind {
                    EventKind::Success => "success",
                    EventKind::Failure => "failure",
                    EventKind::Done => "episode over",
                    EventKind::Reset => "new episode",
                    EventKind::Estop => "EMERGENCY STOP",
                };
                if matches!(ev.kind, EventKind::Success | EventKind::Failure) {
                    eprint!(
                        "-- the robot recorded: {what} (episode {}, step {}, from {})\r\n",
                        ev.episode, ev.step, ev.source
                    );
                } else {
                    eprint!("-- {what}: episode {} at step {}\r\n", ev.episode, ev.step);
                }
            }
            TeleopEvent::Status(ep, person) => eprint!(
                "-- episode {ep}: {} drives\r\n",
                if person { "you" } else { "the policy" }
            ),
            TeleopEvent::Stop(state, n, by) => match state {
                "latched" => eprint!(
                    "-- EMERGENCY STOP {n} latched (by {by}): the robot holds; u releases\r\n"
                ),
                "paused" => {
                    eprint!("-- e-stop released (by {by}): nothing moves until g resumes\r\n")
                }
                _ if n > 0 => eprint!("-- running again (resumed by {by})\r\n"),
                _ => {}
            },
            TeleopEvent::Connected(_) => {}
        },
    )?;
    drop(dev);
    eprintln!("teleop: handed back, bye");
    Ok(())
}

#[derive(Args)]
pub struct ReplayArgs {
    /// An episode recording (`episode_NNNNNN.rrd`) or a directory of them.
    path: PathBuf,
    /// Print the episode's steps, return, success, takeovers and timing instead of opening a viewer.
    #[arg(long)]
    summary: bool,
}

pub fn replay(a: ReplayArgs) -> anyhow::Result<()> {
    if !a.summary {
        return Ok(reflex_tools::replay::open(&a.path)?);
    }
    let head = [
        "episode",
        "steps",
        "return",
        "success",
        "takeovers",
        "takeover",
        "lateness p99",
        "dropped",
    ];
    let unit = ["", "", "", "", "", "steps", "us", "steps"];
    for row in [head, unit] {
        println!(
            "{:<22} {:>6} {:>7} {:>8} {:>9} {:>10} {:>12} {:>8}",
            row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7]
        );
    }
    for (f, s) in reflex_tools::replay::summaries(&a.path)? {
        println!(
            "{:<22} {:>6} {:>7.2} {:>8} {:>9} {:>10} {:>12.0} {:>8}",
            f.file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_default(),
            s.steps,
            s.ret,
            s.success,
            s.interventions,
            s.intervention_steps,
            s.lateness_p99_us,
            s.dropped_steps
        );
    }
    Ok(())
}

#[derive(Args)]
pub struct VizArgs {
    /// The robot's name on the bus (default: the robot of --config).
    #[arg(long, required_unless_present = "config")]
    robot: Option<String>,
    /// A config whose [robot] name and [bus] (endpoints, TLS) are used, e.g.
    /// configs/deploy/viewer.toml; flags given beside it win.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Where the stream goes: spawn (start a viewer), connect or connect=ADDR (a running viewer),
    /// save=DIR (episode files, no viewer).
    #[arg(long, default_value = "spawn")]
    rerun: String,
    /// Stop after this many episodes have ended (default: run until interrupted).
    #[arg(long, value_parser = crate::cli::count64)]
    episodes: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long, value_parser = crate::cli::seconds)]
    seconds: Option<f64>,
    /// How long to wait for the actor (or the robot) to answer, s.
    #[arg(long, default_value_t = 15.0, value_parser = crate::cli::seconds)]
    wait_s: f64,
    /// Print a JSON summary at the end.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    bus: BusArgs,
}

pub fn viz(a: VizArgs) -> anyhow::Result<()> {
    let target = VizTarget::parse(&a.rerun)?;
    let (robot, bus) = match &a.config {
        Some(path) => {
            let cfg = reflex_agent::config::RunConfig::load(path)?;
            let mut bus = cfg.bus_config(&a.bus.config());
            // Access rules guard a robot's own key space; a viewer enforces none.
            bus.access = None;
            (a.robot.clone().unwrap_or_else(|| cfg.robot_name()), bus)
        }
        None => (a.robot.clone().unwrap_or_default(), a.bus.config()),
    };
    let session = bus.open()?;
    let o = VizOptions {
        episodes: a.episodes,
        seconds: a.seconds,
        wait_s: a.wait_s,
    };
    let out = reflex_tools::viz::watch(&session, &robot, target, &o, &Bars::spinner(a.json))?;
    if a.json {
        print_json(&out);
    } else {
        println!(
            "watched `{}`: {} steps, {} episodes ended{}",
            out.robot,
            out.steps,
            out.episodes_ended,
            out.dir
                .as_deref()
                .map(|d| format!(", files in {d}"))
                .unwrap_or_default()
        );
    }
    Ok(())
}

#[derive(Subcommand)]
pub enum KeysCommand {
    /// A certificate authority for a robot and a certificate for each of its peers, for TLS with
    /// mutual authentication on the bus (docs/deploy.md).
    Init(KeysInitArgs),
    /// Certificates for more peers (another operator's teleop, a second viewer), signed by the
    /// authority `keys init` made: nobody else needs new keys. Needs `ca.key` in --dir.
    Add(KeysAddArgs),
}

#[derive(Args)]
pub struct KeysAddArgs {
    /// The directory `reflex keys init` wrote (`ca.pem` and `ca.key`).
    #[arg(long, default_value = "keys")]
    dir: PathBuf,
    /// A new peer (repeatable); add its name to the robot's [bus.access] for a role.
    #[arg(long = "peer", value_name = "NAME", required = true)]
    peers: Vec<String>,
    /// A DNS name or IP address the peer is reached at (repeatable).
    #[arg(long = "host", value_name = "NAME")]
    hosts: Vec<String>,
    /// Days the certificates are valid.
    #[arg(long, default_value_t = 365, value_parser = crate::cli::days)]
    days: i64,
}

#[derive(Args)]
pub struct KeysInitArgs {
    /// The robot's name on the bus (named in the authority).
    #[arg(long)]
    robot: String,
    /// Where to write the keys (`ca.pem`, `ca.key`, `<peer>.pem`, `<peer>.key`).
    #[arg(long, default_value = "keys")]
    dir: PathBuf,
    /// A peer (repeatable): its name is its certificate's common name, e.g. robot, learner,
    /// teleop, viewer.
    #[arg(long = "peer", value_name = "NAME", required = true)]
    peers: Vec<String>,
    /// A DNS name or IP address the robot is reached at (repeatable).
    #[arg(long = "host", value_name = "NAME")]
    hosts: Vec<String>,
    /// Days the certificates are valid.
    #[arg(long, default_value_t = 365, value_parser = crate::cli::days)]
    days: i64,
}

pub fn keys(cmd: KeysCommand) -> anyhow::Result<()> {
    let a = match cmd {
        KeysCommand::Init(a) => a,
        KeysCommand::Add(a) => {
            let added = reflex_bus::secure::add_peers(&a.dir, &a.peers, &a.hosts, &|_| {
                reflex_bus::secure::valid_for_days(a.days)
            })?;
            for (name, cert, key) in &added {
                println!(
                    "peer `{name}`: {} and {} (mode 600), signed by {}",
                    cert.display(),
                    key.display(),
                    a.dir.join("ca.pem").display()
                );
            }
            println!(
                "copy ca.pem and the new pair to the peer; give it a role in the robot's [bus.access] (learners, teleops or viewers) and restart the robot's reflex"
            );
            return Ok(());
        }
    };
    let set = reflex_bus::secure::init_keys(&a.dir, &a.robot, &a.peers, &a.hosts, &|_| {
        reflex_bus::secure::valid_for_days(a.days)
    })?;
    println!(
        "certificate authority: {} (its key {} signs new peers: keep it off the robot)",
        set.ca.display(),
        a.dir.join("ca.key").display()
    );
    for (name, cert, key) in &set.peers {
        println!(
            "peer `{name}`: {} and {} (mode 600)",
            cert.display(),
            key.display()
        );
    }
    println!(
        "each peer: [bus] tls = {{ dir = \"{}\", name = \"NAME\" }} in its config, or --tls-dir {} --tls-name NAME; endpoints tls/HOST:PORT",
        a.dir.display(),
        a.dir.display()
    );
    Ok(())
}
