//! `reflex`: the command-line entry point. Wires the crates together; every subcommand's logic
//! lives in a module of its own.

mod assemble;
mod bench_bus;
mod bench_learner;
mod bench_loop;
mod cli;
mod demo;
mod learn_cmd;
mod plot;
mod policy_cmd;
mod replay;
mod run_cmd;
mod sim_cmd;
mod teleop_cmd;
mod viz_cmd;

use clap::{Parser, Subcommand};

/// reflex: a real-time runtime for robots that learn on the job.
#[derive(Parser)]
#[command(name = "reflex", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The whole mission on the simulator: base policy, residual learner, simulated person.
    Demo(demo::DemoArgs),
    /// The simulator: serve it as a robot, benchmark it, record expert demonstrations.
    Sim {
        #[command(subcommand)]
        command: sim_cmd::SimCommand,
    },
    /// Benchmarks that print medians and percentiles (`--json` for machines).
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
    },
    /// Base policies on ONNX Runtime: check a model against its spec, benchmark it.
    Policy {
        #[command(subcommand)]
        command: policy_cmd::PolicyCommand,
    },
    /// Imitation learning: train a diffusion policy from recorded episodes.
    Bc {
        #[command(subcommand)]
        command: policy_cmd::BcCommand,
    },
    /// The actor: runs the control loop against a robot with a policy (config file).
    Run(run_cmd::RunArgs),
    /// Open a recorded episode in the Rerun viewer, or print its summary.
    Replay(replay::ReplayArgs),
    /// The residual learner on the bus, for an actor started with the same config file.
    Learn(learn_cmd::LearnArgs),
    /// Drive a robot by hand from this terminal (take over, correct, label success or failure).
    Teleop(teleop_cmd::TeleopArgs),
    /// Watch a robot over the bus in Rerun (live viewer or episode files).
    Viz(viz_cmd::VizArgs),
    /// Checks the installation: finds ONNX Runtime and says how to install what is missing.
    Doctor,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Observation -> command round trip between two processes over Zenoh on loopback.
    Bus(bench_bus::BusBenchArgs),
    /// The control loop's wake-up lateness, misses and per-step overhead.
    Loop(bench_loop::LoopBenchArgs),
    /// SAC update throughput and the wall time of 10k Pendulum steps.
    Learner(bench_learner::LearnerBenchArgs),
}

/// glibc returns large freed blocks (> 128 KiB) to the OS and maps fresh zeroed pages for the next
/// one; candle allocates a new buffer per tensor operation, so the learner spent a quarter of its
/// time in page faults and page clearing. Keeping freed memory in the process removes that.
fn tune_allocator() {
    #[cfg(target_os = "linux")]
    // SAFETY: mallopt only changes allocator thresholds; called before other threads start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

fn main() {
    tune_allocator();
    cli::init_logging();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Sim { command } => sim_cmd::run(command),
        Command::Bench {
            command: BenchCommand::Bus(a),
        } => bench_bus::run(a),
        Command::Bench {
            command: BenchCommand::Loop(a),
        } => bench_loop::run(a),
        Command::Bench {
            command: BenchCommand::Learner(a),
        } => bench_learner::run(a),
        Command::Run(a) => run_cmd::run(a),
        Command::Demo(a) => demo::run(a),
        Command::Replay(a) => replay::run(a),
        Command::Viz(a) => viz_cmd::run(a),
        Command::Teleop(a) => teleop_cmd::run(a),
        Command::Learn(a) => learn_cmd::run(a),
        Command::Policy {
            command: policy_cmd::PolicyCommand::Check(a),
        } => policy_cmd::check(a),
        Command::Policy {
            command: policy_cmd::PolicyCommand::Bench(a),
        } => policy_cmd::bench(a),
        Command::Bc {
            command: policy_cmd::BcCommand::Train(a),
        } => policy_cmd::bc_train(a),
        Command::Doctor => cli::doctor(),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
