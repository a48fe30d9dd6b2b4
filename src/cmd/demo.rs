//! `reflex demo`: arguments and the summary table.

use crate::cli::{Bars, print_json};
use clap::{Args, ValueEnum};
use reflex_agent::demo::{DemoOptions, DemoReport};
use reflex_policies::sac::Mode;
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
    /// Episodes of training.
    #[arg(long, default_value_t = 100)]
    episodes: usize,
    /// Seed of everything (episodes, learner, person).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Base policy.
    #[arg(long, default_value = "models/pick.onnx")]
    model: PathBuf,
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
}

pub fn run(a: DemoArgs) -> anyhow::Result<()> {
    let o = DemoOptions {
        episodes: a.episodes,
        seed: a.seed,
        model: a.model,
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
    };
    let r = reflex_agent::demo::run(&o, &Bars::new(a.json))?;
    if a.json {
        print_json(&r.summary);
    } else {
        print_table(&o, &r);
    }
    Ok(())
}

fn print_table(o: &DemoOptions, r: &DemoReport) {
    let s = &r.summary;
    let pct = |k: &str| s[k].as_f64().unwrap_or(f64::NAN) * 100.0;
    println!(
        "reflex demo: pick, {} learner, simulated person {}",
        s["mode"].as_str().unwrap_or(""),
        if o.human { "on" } else { "off" }
    );
    println!("  {:<28} {:>8} {:>8}", "", "first 20", "last 20");
    for (label, key) in [
        ("success (robot alone)", "success_rate"),
        ("success (with takeovers)", "success_with_assistance"),
        ("episodes with a takeover", "intervention_rate"),
    ] {
        let first = if key == "success_rate" {
            pct("success_rate_first_20")
        } else {
            pct(&format!("{key}_first_20"))
        };
        println!(
            "  {label:<28} {first:>7.0}% {:>7.0}%",
            pct(&format!("{key}_last_20"))
        );
    }
    let h = &s["held_out"];
    if let Some(rate) = h["success_rate"].as_f64() {
        let ci = &h["success_rate_wilson_95"];
        println!(
            "  held out, robot alone ({} new seeds, no person): {:.0}% success (95% CI {:.0}-{:.0}%), mean {:.1} steps",
            h["episodes"],
            rate * 100.0,
            ci[0].as_f64().unwrap_or(f64::NAN) * 100.0,
            ci[1].as_f64().unwrap_or(f64::NAN) * 100.0,
            h["mean_steps"].as_f64().unwrap_or(f64::NAN)
        );
    }
    println!(
        "  learner checkpoint: {}",
        s["checkpoint"].as_str().unwrap_or("")
    );
    if let (Some(model), Some(config)) = (s["residual"].as_str(), s["refined_config"].as_str()) {
        println!("  refined policy: {model} (run it alone: reflex run --config {config})");
    }
    println!(
        "  {} episodes, {} environment steps, {} learner updates, {:.0} s",
        s["episodes"],
        s["env_steps"],
        s["updates"],
        s["wall_s"].as_f64().unwrap_or(0.0)
    );
    match s["episode_reaching_90pct_rolling_success"].as_u64() {
        Some(e) => println!("  rolling 20-episode success reached 90% at episode {e}"),
        None => println!("  rolling 20-episode success did not reach 90%"),
    }
    println!(
        "  learning curve (green: success, red: takeovers, over the last 20 episodes; blue: held out): {}",
        r.dir.join("learning_curve.png").display()
    );
}
