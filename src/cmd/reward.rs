//! `reflex reward train`: a success classifier from recorded camera frames.

use crate::cli::{Bars, command_line};
use clap::{Args, Subcommand};
use reflex_tools::rewardtrain;
use std::path::PathBuf;

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
    let o = rewardtrain::RewardTrainOptions {
        source: match (a.demos, a.runs) {
            (Some(d), _) => rewardtrain::RewardSource::Demos(d),
            (None, Some(r)) => rewardtrain::RewardSource::Runs(r),
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
    let r = rewardtrain::reward_train(&o, &Bars::new(a.json))?;
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
            rewardtrain::NEAR_FRAMES
        );
    }
    Ok(())
}
