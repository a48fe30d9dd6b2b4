//! `reflex distill`: a refined policy made into the next base.

use crate::cli::{Bars, command_line, print_json};
use clap::Args;
use reflex_tools::distill::{DistillOptions, distill};
use std::path::PathBuf;

#[derive(Args)]
pub struct DistillArgs {
    /// A run directory with a refined policy and its step log (`runs/<id>`, as `reflex demo`
    /// writes it).
    #[arg(long)]
    run: PathBuf,
    /// The new base model to write, e.g. models/pick-distilled.onnx (its spec beside it).
    #[arg(long)]
    out: PathBuf,
    /// Train on every episode of the run, failed ones too (default: the successful ones).
    #[arg(long)]
    all_episodes: bool,
    /// Leave out the policy's steps within N steps before a person took over (the steps the
    /// person judged going wrong), `all` of them (the default: the distilled base learns the
    /// person's correction in those states instead), or none (0).
    #[arg(long, default_value = "all", value_parser = window)]
    skip_before_takeover: usize,
    /// Gradient steps (4000 left the distilled `pick` base 6-19 points under the refined
    /// policy; 12000 brought it within 0-7, docs/training.md).
    #[arg(long, default_value_t = 12000, value_parser = crate::cli::count)]
    steps: usize,
    /// Batch size.
    #[arg(long, default_value_t = 256, value_parser = crate::cli::count)]
    batch: usize,
    /// Hidden width.
    #[arg(long, default_value_t = 256, value_parser = crate::cli::count)]
    hidden: usize,
    /// Actions executed per chunk (default: the base's).
    #[arg(long, value_parser = crate::cli::count)]
    execute: Option<usize>,
    /// What the new base learns (default: the base's kind).
    #[arg(long, value_enum)]
    objective: Option<crate::cli::ObjectiveArg>,
    /// Held-out episodes of the new base alone, on the run's held-out seed stream (0: skip).
    #[arg(long, default_value_t = 100)]
    eval_episodes: u64,
    /// Seed of the training (with --candidates N: the first of N seeds).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Train this many new bases with consecutive seeds, run each alone on a validation seed
    /// stream (apart from the run's training and held-out episodes) and keep the best.
    #[arg(long, default_value_t = 1, value_parser = crate::cli::count)]
    candidates: usize,
    /// Validation episodes per candidate (with --candidates above 1).
    #[arg(long, default_value_t = 100, value_parser = crate::cli::count64)]
    validation_episodes: u64,
    /// Print a JSON report.
    #[arg(long)]
    json: bool,
}

/// A step count, or `all` (every step).
fn window(s: &str) -> Result<usize, String> {
    if s == "all" {
        return Ok(usize::MAX);
    }
    s.parse::<usize>()
        .map_err(|_| format!("`{s}` is not a number of steps or `all`"))
}

pub fn run(a: DistillArgs) -> anyhow::Result<()> {
    let o = DistillOptions {
        run: a.run,
        out: a.out,
        all_episodes: a.all_episodes,
        skip_before_takeover: a.skip_before_takeover,
        steps: a.steps,
        batch: a.batch,
        hidden: a.hidden,
        execute: a.execute,
        objective: a.objective.map(Into::into),
        eval_episodes: a.eval_episodes,
        seed: a.seed,
        candidates: a.candidates,
        validation_episodes: a.validation_episodes,
        command: command_line(),
    };
    let r = distill(&o, &Bars::new(a.json))?;
    if a.json {
        print_json(&r);
        return Ok(());
    }
    for c in &r.candidates {
        println!(
            "candidate with training seed {}: {} of {} validation episodes alone{}",
            c.seed,
            c.validation.successes,
            c.validation.episodes,
            if c.seed == r.seed { " (kept)" } else { "" }
        );
    }
    println!(
        "wrote {} and {}: distilled from {} of the {} episodes of {} ({} of their steps driven by a person, {} of the policy's before a takeover left out), final loss {:.4}, {:.0} s",
        r.model.display(),
        r.spec.display(),
        r.episodes_used,
        r.episodes_in_run,
        r.run.display(),
        r.person_steps,
        r.steps_skipped_before_takeover,
        r.final_loss,
        r.train_wall_s
    );
    if let Some(h) = &r.held_out {
        let (lo, hi) = h.success_rate_wilson_95;
        println!(
            "the new base alone, {} held-out episodes of the run: success {:.1}% (95% Wilson {:.1}-{:.1}%){}",
            h.episodes,
            100.0 * h.success_rate,
            100.0 * lo,
            100.0 * hi,
            r.refined_held_out
                .as_ref()
                .and_then(|v| v.get("success_rate"))
                .and_then(|v| v.as_f64())
                .map(|s| format!("; the refined policy: {:.1}%", 100.0 * s))
                .unwrap_or_default()
        );
    }
    println!("refine it again: reflex demo --model {}", r.model.display());
    Ok(())
}
