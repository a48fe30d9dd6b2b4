//! `reflex`: the command line. It parses arguments, calls the reflex-agent library and prints;
//! nothing else lives here (docs/architecture.md).

mod cli;
mod cmd;

use clap::{Parser, Subcommand};
#[cfg(feature = "train")]
use cmd::bc::BcCommand;
use cmd::policy::PolicyCommand;
#[cfg(feature = "sim")]
use cmd::sim::SimCommand;

/// reflex: a real-time runtime for robots that learn on the job.
#[derive(Parser)]
#[command(name = "reflex", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    #[cfg(feature = "sim")]
    /// The whole mission on the simulator: base policy, residual learner, simulated person.
    Demo(cmd::demo::DemoArgs),
    #[cfg(feature = "sim")]
    /// The simulator: serve it as a robot, benchmark it, record expert demonstrations.
    Sim {
        #[command(subcommand)]
        command: SimCommand,
    },
    /// Benchmarks that print medians and percentiles (`--json` for machines).
    #[cfg(feature = "bench")]
    Bench {
        #[command(subcommand)]
        command: cmd::bench::BenchCommand,
    },
    /// Base policies on ONNX Runtime: check a model against its spec, benchmark it.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    #[cfg(feature = "train")]
    /// Imitation learning: train a diffusion or flow policy from recorded episodes or a LeRobot dataset.
    Bc {
        #[command(subcommand)]
        command: BcCommand,
    },
    #[cfg(feature = "train")]
    /// A reward the robot can see: train a success classifier on recorded camera frames.
    Reward {
        #[command(subcommand)]
        command: cmd::reward::RewardCommand,
    },
    #[cfg(feature = "dataset")]
    /// Datasets: export recorded episodes as a LeRobotDataset v3.0.
    Dataset {
        #[command(subcommand)]
        command: cmd::dataset::DatasetCommand,
    },
    /// The actor: runs the control loop against a robot with a policy (config file).
    Run(cmd::run::RunArgs),
    #[cfg(feature = "train")]
    /// A refined policy (base + residual, as executed, with the person's corrections) made into
    /// the next base policy: trained on the run's successful rollouts (the person's actions, not
    /// the policy's, where the person took over), evaluated alone.
    Distill(cmd::distill::DistillArgs),
    /// Judge a policy alone: the config's robot and policy (and a kept residual), no learner, no
    /// person, seeds apart from training's; success with a 95% Wilson interval.
    Eval(cmd::run::EvalArgs),
    /// Open a recorded episode in the Rerun viewer, or print its summary.
    Replay(cmd::replay::ReplayArgs),
    /// The learner on the bus, for an actor started with the same config file.
    Learn(cmd::learn::LearnArgs),
    /// Drive a robot by hand from this terminal (take over, correct, label success or failure).
    Teleop(cmd::teleop::TeleopArgs),
    /// A robot's emergency stop from any computer on its bus: raise it (anyone), release it and
    /// resume (an operator), each confirmed by the robot's status.
    Estop(cmd::estop::EstopArgs),
    /// Watch a robot over the bus in Rerun (live viewer or episode files).
    Viz(cmd::viz::VizArgs),
    /// Checks what a first run needs: ONNX Runtime and its providers, serial ports, cameras,
    /// real-time permissions, clock source, disk, bus certificates; each problem with its fix.
    Doctor(DoctorArgs),
    /// Actor and learner for a long run with faults injected at random: memory, transitions,
    /// safety holds, timing.
    #[cfg(feature = "bench")]
    Soak(cmd::bench::SoakArgs),
    /// Certificates for a link only the right peers can use (TLS, mutual authentication).
    Keys {
        #[command(subcommand)]
        command: cmd::keys::KeysCommand,
    },
    /// Calibration: an arm's joints (LeRobot's format), a camera's intrinsics, hand-eye.
    Calibrate {
        #[command(subcommand)]
        command: cmd::calibrate::CalibrateCommand,
    },
    /// The tarball that installs reflex on a robot's computer as a service (binary, ONNX
    /// Runtime, models, configs, systemd unit, install script with upgrade and rollback).
    Bundle(cmd::bundle::BundleArgs),
    /// Arms and cameras on this computer: serve an arm on the bus, list the cameras; emulated
    /// servos and bus latency in a workstation build.
    Hw {
        #[command(subcommand)]
        command: cmd::hw::HwCommand,
    },
}

#[derive(clap::Args)]
struct DoctorArgs {
    /// Also check this peer's bus certificates: the directory `reflex keys init` wrote.
    #[arg(long, value_name = "DIR", requires = "tls_name")]
    tls_dir: Option<std::path::PathBuf>,
    /// The peer's name in --tls-dir.
    #[arg(long, value_name = "NAME", requires = "tls_dir")]
    tls_name: Option<String>,
    /// Also check what this robot config needs here: its model and provider, the arm's port and
    /// calibration, its bus certificates and endpoints (on a robot: /etc/reflex/robot.toml).
    #[arg(long, value_name = "FILE")]
    config: Option<std::path::PathBuf>,
    /// Print the report as JSON: every check with its area and level (ok, info, warning, problem).
    #[arg(long)]
    json: bool,
}

fn main() {
    // Before anything starts a thread: allocator thresholds and candle's thread count.
    reflex_runtime::rt::prepare_process();
    let cli = Cli::parse();
    cli::init_logging();
    let result = match cli.command {
        #[cfg(feature = "sim")]
        Command::Sim { command } => cmd::sim::run(command),
        #[cfg(feature = "bench")]
        Command::Bench { command } => cmd::bench::run(command),
        Command::Run(a) => cmd::run::run(a),
        Command::Eval(a) => cmd::run::eval(a),
        #[cfg(feature = "sim")]
        Command::Demo(a) => cmd::demo::run(a),
        #[cfg(feature = "train")]
        Command::Distill(a) => cmd::distill::run(a),
        Command::Replay(a) => cmd::replay::replay(a),
        Command::Viz(a) => cmd::viz::viz(a),
        Command::Teleop(a) => cmd::teleop::teleop(a),
        Command::Estop(a) => cmd::estop::estop(a),
        Command::Learn(a) => cmd::learn::run(a),
        Command::Bundle(a) => cmd::bundle::run(a),
        Command::Policy { command } => cmd::policy::run(command),
        #[cfg(feature = "train")]
        Command::Bc { command } => cmd::bc::bc(command),
        #[cfg(feature = "train")]
        Command::Reward { command } => cmd::reward::reward(command),
        #[cfg(feature = "dataset")]
        Command::Dataset { command } => cmd::dataset::dataset(command),
        Command::Doctor(a) => cli::doctor(
            &reflex_deploy::doctor::DoctorOptions {
                tls: a.tls_dir.zip(a.tls_name),
                config: a.config,
            },
            a.json,
        ),
        #[cfg(feature = "bench")]
        Command::Soak(a) => cmd::bench::soak(a),
        Command::Hw { command } => cmd::hw::run(command),
        Command::Calibrate { command } => cmd::calibrate::calibrate(command),
        Command::Keys { command } => cmd::keys::keys(command),
    };
    if let Err(e) = result {
        eprintln!("error: {}", cli::error_text(&e));
        std::process::exit(1);
    }
}
