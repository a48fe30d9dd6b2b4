//! `reflex bc train`: behaviour cloning of a diffusion or flow policy, and what it prints.

use crate::cli::{Bars, ObjectiveArg, command_line};
use clap::{Args, Subcommand};
use reflex_imitate::TrainConfig;
use reflex_tools::bctrain::{self, TrainOptions};
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum BcCommand {
    /// Train a diffusion or flow policy on recorded episodes and export it to ONNX with its spec.
    Train(TrainArgs),
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
    /// Print what was written and the final loss as JSON (`model`, `spec`, `vjp`, `encoder`,
    /// `final_loss`, `wall_s`).
    #[arg(long)]
    json: bool,
}

pub fn bc(cmd: BcCommand) -> anyhow::Result<()> {
    let BcCommand::Train(a) = cmd;
    let source = match (a.demos, a.dataset) {
        (Some(d), _) => bctrain::TrainSource::Demos(d),
        (None, Some(dir)) => bctrain::TrainSource::LeRobot {
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
        skip_before_takeover: None,
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
    let r = bctrain::bc_train(&o, &Bars::new(false))?;
    if a.json {
        crate::cli::print_json(&r);
        return Ok(());
    }
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
