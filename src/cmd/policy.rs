//! `reflex policy check|bench|import|infer`: arguments and what they print.

use crate::cli::print_json;
#[cfg(feature = "import")]
use crate::cli::{Bars, command_line};
use clap::{Args, Subcommand, ValueEnum};
#[cfg(feature = "import")]
use reflex_import::{ImportOptions, RobotSource};
use reflex_tools::policytools;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum PolicyCommand {
    /// Check a model against its spec (names, shapes, element types) and the robot it is for.
    Check(CheckArgs),
    /// Time one chunk (all sampler steps) on a provider.
    Bench(PolicyBenchArgs),
    #[cfg(feature = "import")]
    /// Make a policy trained elsewhere into a reflex model (ONNX graph and spec).
    Import {
        #[command(subcommand)]
        from: ImportCommand,
    },
    #[cfg(feature = "import")]
    /// Run a model on observations from a JSON file and print its chunks and their times as
    /// JSON. The file: {"observations": [{"state": [...], "images": [{"camera": "front",
    /// "width": W, "height": H, "rgb8": [W*H*3 bytes]}], "noise": [chunk_len*action_dim]}]}
    /// (images and noise optional); each observation starts an episode.
    Infer(InferArgs),
}

#[cfg(feature = "import")]
#[derive(Subcommand)]
pub enum ImportCommand {
    /// A LeRobot 0.6 checkpoint (ACT; Diffusion Policy with one observation frame and DDIM):
    /// exported with LeRobot's own classes in the tools environment (.venv-lerobot, made on
    /// first use: about 5 GB), its features mapped onto the robot, its normalisation and sampler
    /// written into the spec (docs/bring-your-own-policy.md).
    Lerobot(LerobotImportArgs),
}

#[cfg(feature = "import")]
#[derive(Args)]
#[command(group(clap::ArgGroup::new("robot").required(true).args(["robot_kind", "robot_spec"])))]
pub struct LerobotImportArgs {
    /// The checkpoint's `pretrained_model` folder (config.json, model.safetensors, the
    /// policy_preprocessor/postprocessor files).
    checkpoint: PathBuf,
    /// The model to write, e.g. models/act.onnx (the spec goes beside it: act.policy.toml).
    #[arg(long)]
    out: PathBuf,
    /// The robot the policy drives, a simulated one: `sim/pick`.
    #[arg(long)]
    robot_kind: Option<String>,
    /// The robot the policy drives, as a robot spec JSON file (`reflex sim spec` prints one).
    #[arg(long, value_name = "FILE")]
    robot_spec: Option<PathBuf>,
    /// A feature under another name on the robot (repeatable): an image feature onto a camera,
    /// `observation.images.top=front`, or a state feature onto state fields,
    /// `observation.state=joint_pos,ee_pos`. Default: `observation.images.<cam>` reads camera
    /// `<cam>`, `observation.state` the whole state.
    #[arg(long = "map", value_name = "FEATURE=NAME", value_parser = parse_map)]
    maps: Vec<(String, String)>,
    /// The language instruction of a vision-language-action policy (SmolVLA, pi0), e.g. "pick up
    /// the cube": written into the spec, tokenised with the tokenizer the checkpoint's VLM
    /// carries (a run can change it in the spec).
    #[arg(long, value_name = "TEXT")]
    task: Option<String>,
    /// The tools environment's folder (default: .venv-lerobot in the reflex checkout or the
    /// current folder).
    #[arg(long, value_name = "DIR")]
    tools_env: Option<PathBuf>,
    /// The Python (>= 3.12) that makes the tools environment when it is missing.
    #[arg(long, value_name = "PATH")]
    python: Option<PathBuf>,
    /// Print what was written as JSON.
    #[arg(long)]
    json: bool,
}

#[cfg(feature = "import")]
fn parse_map(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() && !v.trim().is_empty() => {
            Ok((k.trim().to_string(), v.trim().to_string()))
        }
        _ => Err(format!(
            "`{s}` is not FEATURE=NAME (e.g. observation.images.top=front)"
        )),
    }
}

#[cfg(feature = "import")]
#[derive(Args)]
#[command(group(clap::ArgGroup::new("robot").args(["robot_kind", "robot_spec"])))]
pub struct InferArgs {
    /// The .onnx file (its spec beside it).
    #[arg(long)]
    model: PathBuf,
    /// The observations, JSON (the format is above).
    #[arg(long, value_name = "FILE")]
    observations: PathBuf,
    /// The robot, instead of the spec's robot_kind: a simulated one (`sim/pick`).
    #[arg(long)]
    robot_kind: Option<String>,
    /// The robot, instead of the spec's robot_kind: a robot spec JSON file.
    #[arg(long, value_name = "FILE")]
    robot_spec: Option<PathBuf>,
    /// ONNX Runtime intra-op threads.
    #[arg(long, default_value_t = 1, value_parser = crate::cli::threads)]
    threads: usize,
    /// Untimed chunks per observation before the timed ones.
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// Timed chunks per observation (the median is reported).
    #[arg(long, default_value_t = 5, value_parser = crate::cli::count)]
    repeat: usize,
}

#[derive(Args)]
pub struct CheckArgs {
    /// The .onnx file (its spec is NAME.policy.toml beside it).
    #[arg(long)]
    model: PathBuf,
}

/// An ONNX Runtime execution provider.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ProviderArg {
    /// The CPU.
    Cpu,
    /// CUDA (an ONNX Runtime build with it and a GPU).
    Cuda,
    /// TensorRT (an ONNX Runtime build with it and a GPU).
    Tensorrt,
}

#[derive(Args)]
pub struct PolicyBenchArgs {
    /// The .onnx file.
    #[arg(long)]
    model: PathBuf,
    /// Execution provider.
    #[arg(long, value_enum, default_value = "cpu")]
    provider: ProviderArg,
    /// ONNX Runtime intra-op threads.
    #[arg(long, default_value_t = 1, value_parser = crate::cli::threads)]
    threads: usize,
    /// Chunks to time.
    #[arg(long, default_value_t = 500, value_parser = crate::cli::count)]
    iters: usize,
    /// Also time real-time chunking's chunks (alternating with plain ones): `guided` (the
    /// paper's method; a flow model with a VJP graph) or `hard` (inpainting).
    #[arg(long, value_parser = ["guided", "hard"])]
    rtc: Option<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(cmd: PolicyCommand) -> anyhow::Result<()> {
    match cmd {
        PolicyCommand::Check(a) => check(&a.model),
        #[cfg(feature = "import")]
        PolicyCommand::Import {
            from: ImportCommand::Lerobot(a),
        } => import_lerobot(a),
        #[cfg(feature = "import")]
        PolicyCommand::Infer(a) => infer(a),
        PolicyCommand::Bench(a) => bench(a),
    }
}

fn check(model: &std::path::Path) -> anyhow::Result<()> {
    let r = policytools::check(model)?;
    for l in &r.lines {
        println!("{l}");
    }
    match r.robot_kind {
        Some(k) => println!("matches its spec and robot kind `{k}`: ok"),
        None => println!("matches its spec: ok (no robot kind to check against)"),
    }
    Ok(())
}

#[cfg(feature = "import")]
fn import_lerobot(a: LerobotImportArgs) -> anyhow::Result<()> {
    let robot = match (a.robot_kind, a.robot_spec) {
        (Some(k), _) => RobotSource::Kind(k),
        (None, Some(f)) => RobotSource::SpecFile(f),
        (None, None) => unreachable!("clap requires one"),
    };
    let o = ImportOptions {
        checkpoint: a.checkpoint,
        out: a.out,
        robot,
        maps: a.maps,
        task: a.task,
        tools_env: a.tools_env,
        python: a.python,
        command: command_line(),
    };
    let r = reflex_import::import_lerobot(&o, &Bars::new(a.json))?;
    if a.json {
        print_json(&r);
    } else {
        for n in &r.notes {
            println!("note: {n}");
        }
        println!(
            "wrote {} and {} (chunk {}, {} executed; LeRobot {}, ONNX Runtime within {:.1e} of torch)",
            r.model.display(),
            r.spec.display(),
            r.chunk_len,
            r.execute,
            r.lerobot_version,
            r.onnx_vs_torch_max_abs
        );
        println!(
            "check it: reflex policy check --model {}",
            r.model.display()
        );
    }
    Ok(())
}

#[cfg(feature = "import")]
fn infer(a: InferArgs) -> anyhow::Result<()> {
    let robot = match (a.robot_kind, a.robot_spec) {
        (Some(k), _) => Some(RobotSource::Kind(k)),
        (None, Some(f)) => Some(RobotSource::SpecFile(f)),
        (None, None) => None,
    };
    let r = reflex_tools::policy_infer::infer(
        &a.model,
        &a.observations,
        robot,
        a.threads,
        a.warmup,
        a.repeat,
    )?;
    print_json(&r);
    Ok(())
}

fn bench(a: PolicyBenchArgs) -> anyhow::Result<()> {
    let provider = match a.provider {
        ProviderArg::Cpu => "cpu",
        ProviderArg::Cuda => "cuda",
        ProviderArg::Tensorrt => "tensorrt",
    };
    let v = policytools::bench(
        &a.model,
        provider,
        a.threads,
        a.iters,
        a.rtc.as_deref().map(|r| r == "guided"),
    )?;
    if a.json {
        print_json(&v);
    } else {
        println!(
            "{} on {} ({} thread{}): {} network calls per chunk; per chunk p50 {:.0} us, p99 {:.0} us, max {:.0} us over {} chunks",
            a.model.display(),
            provider,
            a.threads,
            if a.threads == 1 { "" } else { "s" },
            v.network_calls_per_chunk,
            v.p50_us,
            v.p99_us,
            v.max_us,
            v.iters
        );
        if let Some(g) = &v.graphs {
            println!(
                "two graphs: prefix once p50 {:.0} us (p99 {:.0} us), action expert p50 {:.0} us over the steps ({:.0} us a step)",
                g.prefix_p50_us, g.prefix_p99_us, g.expert_p50_us, g.expert_step_p50_us
            );
        }
        if let Some(r) = &v.rtc {
            println!(
                "real-time chunking ({:?}, {} overlapping rows, {} frozen): per chunk p50 {:.0} us, p99 {:.0} us, max {:.0} us ({:.2}x plain)",
                r.variant,
                r.overlap_rows,
                r.delay_rows,
                r.p50_us,
                r.p99_us,
                r.max_us,
                r.p50_over_plain
            );
        }
    }
    Ok(())
}
