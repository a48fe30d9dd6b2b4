//! `reflex demo`: arguments and the summary table.

use crate::cli::{Bars, print_json};
use clap::{Args, ValueEnum};
use reflex_demo::{DemoOptions, DemoReport};
use reflex_learn::sac::Mode;
use std::path::PathBuf;

/// The learner's mode.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ModeArg {
    /// A residual on the base policy.
    Residual,
    /// Diffusion steering (DSRL): the learner picks the sampler's initial noise per chunk.
    Noise,
    /// SAC from scratch (the baseline).
    Full,
}

#[derive(Args)]
pub struct DemoArgs {
    /// Episodes of training [default: 100; with --vision, 150].
    #[arg(long, value_parser = crate::cli::count)]
    episodes: Option<usize>,
    /// Seed of everything (episodes, learner, person).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Base policy (default: models/pick.onnx; with --vision, models/pick-seeing.onnx).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Learn from pixels: the arm reports only its joints and tool pose, the base policy and
    /// the learner see the simulator's two cameras (the learner through the base policy's
    /// frozen encoder, `<model>.encoder.onnx`), and a success classifier gives the reward.
    #[arg(long)]
    vision: bool,
    /// With --vision: the success classifier (default: models/pick-reward.onnx).
    #[arg(long, requires = "vision")]
    classifier: Option<PathBuf>,
    /// With --vision: frames in a row the classifier must call success.
    #[arg(long, requires = "vision", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    consecutive_frames: u32,
    /// With --vision: the probability at which a frame counts as success (default: the
    /// classifier's own, from its spec).
    #[arg(long, requires = "vision", value_parser = crate::cli::threshold)]
    threshold: Option<f32>,
    /// Learner mode.
    #[arg(long, value_enum, default_value = "residual")]
    mode: ModeArg,
    /// No simulated person.
    #[arg(long)]
    no_human: bool,
    /// Episodes the simulated person demonstrates before training starts (HIL-SERL starts
    /// from about 20 per task); they go to the intervention buffer and are not counted as
    /// training episodes.
    #[arg(long, default_value_t = 20)]
    demos: usize,
    /// Turn RLIF off (on by default: reward -1 on the policy's step before each takeover, in
    /// addition to the task's reward).
    #[arg(long)]
    no_rlif: bool,
    /// Where runs are written (a directory per run).
    #[arg(long, default_value = "runs")]
    runs: PathBuf,
    /// Print a JSON summary at the end (and no progress bar).
    #[arg(long)]
    json: bool,
    /// Do not record the episodes to Rerun files (runs/<run-id>/episodes/).
    #[arg(long)]
    no_record: bool,
    /// A TOML file with `[learner]` (docs/learner.md) and/or `[human]` (docs/training.md) tables
    /// that replace the demo's defaults.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Held-out episodes at the end: the refined policy alone, on seeds training never saw
    /// (0: skip).
    #[arg(long, default_value_t = 100)]
    eval_episodes: usize,
    /// Keep the average of the residual weights at the ends of the last K training episodes
    /// instead of the last weights (stochastic weight averaging) [default: 1, the last weights].
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u64).range(1..))]
    keep_average: Option<u64>,
    /// Learner steps on the person's demonstrations alone, after they end and before the first
    /// training episode (each: the learner's critic updates and an actor update).
    #[arg(long, value_name = "N", default_value_t = 0)]
    offline_updates: usize,
    /// Real-time chunking on the base policy (a diffusion or flow model): `guided` (the paper's
    /// method; a flow model with a VJP graph) or `hard` (inpainting). In simulated time the
    /// policy answers at once, so it shapes the overlap only (docs/runtime.md).
    #[arg(long, value_parser = ["guided", "hard"])]
    rtc: Option<String>,
    /// Simulated robots feeding the one learner, each with its own seed and simulated person
    /// (a fleet); --episodes and --demos count the fleet's, and the learner updates per robot
    /// step as for one robot.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=reflex_demo::MAX_ROBOTS as u64))]
    robots: u64,
    /// Threads for the learner's matrix products, as `[learner] threads` (0: one fewer than
    /// this machine's cores); the figures are the same for any count, only the wall time moves.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// The simulator's task: `pick`, or `insert` (a held peg into a hole with 2 mm clearance;
    /// base policy models/insert.onnx). The pixel demo runs `pick`.
    #[arg(long, default_value = "pick", value_parser = ["pick", "insert"])]
    task: String,
}

pub fn run(a: DemoArgs) -> anyhow::Result<()> {
    let task: reflex_sim::task::TaskKind = a
        .task
        .parse()
        .map_err(|e: reflex_sim::task::UnknownTask| anyhow::anyhow!("--task: {e}"))?;
    let model = a.model.unwrap_or_else(|| {
        PathBuf::from(if a.vision {
            "models/pick-seeing.onnx"
        } else {
            match task {
                reflex_sim::task::TaskKind::Insert => "models/insert.onnx",
                _ => "models/pick.onnx",
            }
        })
    });
    let vision = a.vision.then(|| {
        let mut v = reflex_demo::VisionDemo::beside(&model);
        if let Some(c) = a.classifier {
            v.classifier = c;
        }
        v.consecutive_frames = a.consecutive_frames;
        v.threshold = a.threshold;
        v
    });
    let o = DemoOptions {
        episodes: a.episodes.unwrap_or(if a.vision { 150 } else { 100 }),
        seed: a.seed,
        model,
        vision,
        mode: match a.mode {
            ModeArg::Residual => Mode::Residual,
            ModeArg::Noise => Mode::Noise,
            ModeArg::Full => Mode::Full,
        },
        human: !a.no_human,
        demos: a.demos,
        rlif: !a.no_rlif,
        runs: a.runs,
        record: !a.no_record,
        config: a.config,
        eval_episodes: a.eval_episodes,
        keep_average: a.keep_average.map(|k| k as usize),
        offline_updates: a.offline_updates,
        rtc: a.rtc.as_deref().map(|r| reflex_policies::rtc::RtcConfig {
            enabled: true,
            guidance: r == "guided",
            ..Default::default()
        }),
        robots: a.robots as usize,
        threads: a.threads,
        task,
    };
    let r = reflex_demo::run(&o, &Bars::new(a.json))?;
    if a.json {
        print_json(&r.summary);
    } else {
        print_table(&o, &r);
    }
    Ok(())
}

fn print_table(o: &DemoOptions, r: &DemoReport) {
    let s = &r.summary;
    println!(
        "reflex demo: pick{}, {} learner, simulated person {}",
        if o.vision.is_some() {
            " from pixels (the classifier's reward)"
        } else {
            ""
        },
        s.mode,
        if o.human { "on" } else { "off" }
    );
    println!("  {:<28} {:>8} {:>8}", "", "first 20", "last 20");
    for (label, first, last) in [
        (
            "success (robot alone)",
            s.success_rate_first_20,
            s.success_rate_last_20,
        ),
        (
            "success (with takeovers)",
            s.success_with_assistance_first_20,
            s.success_with_assistance_last_20,
        ),
        (
            "episodes with a takeover",
            s.intervention_rate_first_20,
            s.intervention_rate_last_20,
        ),
    ] {
        println!(
            "  {label:<28} {:>7.0}% {:>7.0}%",
            first * 100.0,
            last * 100.0
        );
    }
    let base = s.vision.as_ref().and_then(|v| v.base_held_out.as_ref());
    if let Some(h) = base.or(s.base_held_out.as_ref()) {
        let (lo, hi) = h.success_rate_wilson_95;
        println!(
            "  held out, base policy alone ({} new seeds): {:.0}% success (95% CI {:.0}-{:.0}%)",
            h.episodes,
            h.success_rate * 100.0,
            lo * 100.0,
            hi * 100.0,
        );
    }
    if let Some(h) = &s.held_out {
        let (lo, hi) = h.success_rate_wilson_95;
        println!(
            "  held out, robot alone ({} new seeds, no person): {:.0}% success (95% CI {:.0}-{:.0}%), mean {:.1} steps",
            h.episodes,
            h.success_rate * 100.0,
            lo * 100.0,
            hi * 100.0,
            h.mean_steps
        );
    }
    if let Some(v) = &s.vision {
        println!(
            "  classifier's successes: {} confirmed by the scene, {} false (the person marked them failures)",
            v.classifier_successes_confirmed, v.classifier_successes_vetoed
        );
    }
    println!(
        "  learner checkpoint: {}",
        s.checkpoint.as_deref().unwrap_or("")
    );
    if let (Some(model), Some(config)) = (&s.residual, &s.refined_config) {
        println!("  refined policy: {model} (run it alone: reflex run --config {config})");
    }
    println!(
        "  {} episodes, {} environment steps, {} learner updates, {:.0} s",
        s.episodes, s.env_steps, s.updates, s.wall_s
    );
    match s.episode_reaching_90pct_rolling_success {
        Some(e) if s.robots > 1 => println!(
            "  rolling 20-episode success reached 90% at the fleet's episode {e} ({:.1} per robot of {})",
            e as f64 / s.robots as f64,
            s.robots
        ),
        Some(e) => println!("  rolling 20-episode success reached 90% at episode {e}"),
        None => println!("  rolling 20-episode success did not reach 90%"),
    }
    println!(
        "  learning curve (green: success, red: takeovers, over the last 20 episodes; blue: held out): {}",
        r.dir.join("learning_curve.png").display()
    );
}
