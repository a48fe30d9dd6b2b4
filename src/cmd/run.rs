//! `reflex run --config FILE`: arguments and the run's report.

use crate::cli::{Bars, BusArgs, print_json};
use anyhow::Context;
use clap::Args;
use reflex_agent::actor::{RunOptions, RunReport, run_config};
use reflex_agent::config::RunConfig;
use reflex_runtime::safety::SafetyEvent;
use std::path::PathBuf;

#[derive(Args)]
pub struct RunArgs {
    /// The actor's TOML config (see configs/run/).
    #[arg(long)]
    config: PathBuf,
    /// Episodes to run (overrides `[run] episodes`).
    #[arg(long, conflicts_with = "until_stopped", value_parser = crate::cli::count64)]
    episodes: Option<u64>,
    /// Run episodes until SIGTERM or Ctrl-C (a service), then end after the episode in progress:
    /// it finishes, is recorded, and the summary is printed.
    #[arg(long)]
    until_stopped: bool,
    /// Print a JSON summary.
    #[arg(long)]
    json: bool,
    /// Record every episode to RUNS/<run-id>/episodes/episode_NNNNNN.rrd.
    #[arg(long, value_name = "RUNS")]
    record: Option<PathBuf>,
    /// Live view: off, spawn (start a viewer), connect or connect=ADDR (a running viewer).
    #[arg(long, default_value = "off")]
    rerun: String,
    /// Rate of the step trace on the bus for `reflex viz`, Hz (0: off; default `[bus] trace_hz`).
    #[arg(long, value_name = "HZ", value_parser = crate::cli::trace_hz)]
    trace_hz: Option<f64>,
    /// The robot's name on the bus (overrides `[robot] name`): one config for every robot of a
    /// fleet (docs/deploy.md).
    #[arg(long, value_name = "NAME")]
    robot_name: Option<String>,
    /// Seed of the run (overrides `[run] seed`): each robot of a fleet its own episodes.
    #[arg(long)]
    seed: Option<u64>,
    #[command(flatten)]
    bus: BusArgs,
}

pub fn run(a: RunArgs) -> anyhow::Result<()> {
    let mut cfg = RunConfig::load(&a.config)?;
    if let Some(n) = &a.robot_name {
        reflex_contracts::keys::Keys::new(n).context("--robot-name")?;
        cfg.robot.name = Some(n.clone());
    }
    if let Some(s) = a.seed {
        cfg.run.seed = s;
    }
    let bus = a.bus.config();
    if a.trace_hz.is_some_and(|hz| hz > 0.0) && !cfg.uses_bus(&bus) {
        anyhow::bail!(
            "--trace-hz: the trace goes out on the bus, which `{}` leaves off: set [bus] enabled = true, or give --listen / --connect",
            a.config.display()
        );
    }
    let o = RunOptions {
        bus,
        episodes: if a.until_stopped {
            Some(u64::MAX)
        } else {
            a.episodes
        },
        record: a.record,
        live: reflex_tools::replay::with_viewer(reflex_record::Live::parse(&a.rerun)?),
        trace_hz: a.trace_hz,
        episode_lines: true,
        stop: Some(reflex_agent::signals::stop_on_signals()),
    };
    let report = run_config(&cfg, &o, &Bars::new(a.json))?;
    if a.json {
        print_json(&report.summary());
    } else {
        print_text(&report);
    }
    Ok(())
}

#[derive(Args)]
pub struct EvalArgs {
    /// The run config whose robot and policy are judged (its [learner] is left out).
    #[arg(long)]
    config: PathBuf,
    /// Episodes.
    #[arg(long, default_value_t = 100, value_parser = crate::cli::count64)]
    episodes: u64,
    /// A kept residual (`residual.onnx` with its spec) to run on the config's base policy.
    #[arg(long, value_name = "FILE")]
    residual: Option<PathBuf>,
    /// Seed of the episode stream (default: a held-out stream derived from `[run] seed`).
    #[arg(long)]
    seed: Option<u64>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    bus: BusArgs,
}

pub fn eval(a: EvalArgs) -> anyhow::Result<()> {
    let cfg = RunConfig::load(&a.config)?;
    let o = reflex_agent::heldout::EvalOptions {
        episodes: a.episodes,
        residual: a.residual,
        seed: a.seed,
        run: RunOptions {
            bus: a.bus.config(),
            ..Default::default()
        },
    };
    let (h, report, seed) = reflex_agent::heldout::evaluate_config(&cfg, &o, &Bars::new(a.json))?;
    let (lo, hi) = h.success_rate_wilson_95;
    if a.json {
        print_json(&reflex_agent::heldout::EvalSummary::new(&h, &report, seed));
    } else {
        println!(
            "{} episodes alone (seed stream {seed}): success {:.1}% (95% Wilson {:.1}-{:.1}%), mean return {:.2}, {:.1} steps per episode, {} takeovers, {:.1} s",
            h.episodes,
            100.0 * h.success_rate,
            100.0 * lo,
            100.0 * hi,
            h.mean_return,
            h.mean_steps,
            h.takeovers,
            report.wall_s
        );
    }
    Ok(())
}

fn print_text(r: &RunReport) {
    let s = r.summary();
    println!(
        "{} episodes: {} successful ({:.1}%), mean return {:.2}, {:.1} steps per episode, {:.1} s",
        s.episodes,
        r.episodes.iter().filter(|e| e.success).count(),
        100.0 * s.success_rate,
        s.mean_return,
        s.mean_steps,
        s.wall_s
    );
    println!(
        "loop: {} ticks, lateness p50 {:.0} us / p99 {:.0} us / max {:.0} us, step p99 {:.0} us, {} overruns, {} missed, {} holds (no chunk)",
        s.ticks,
        s.lateness_p50_us,
        s.lateness_p99_us,
        s.lateness_max_us,
        s.step_p99_us,
        s.overruns,
        s.missed,
        s.holds_no_chunk
    );
    println!(
        "policy: {} chunks used, {} discarded as stale (from before a reset or hand-back)",
        s.chunks, s.stale_chunks
    );
    let acted: Vec<String> = SafetyEvent::ALL
        .iter()
        .filter(|e| r.safety.get(**e) > 0)
        .map(|e| format!("{} {}", e.name(), r.safety.get(*e)))
        .collect();
    println!(
        "safety: {}",
        if acted.is_empty() {
            "no interventions".into()
        } else {
            acted.join(", ")
        }
    );
    if r.stop.estops > 0 {
        println!(
            "e-stop: {} raised (last by {}), {} episodes ended by it, {} ticks held latched, {} paused; {} when the run ended",
            r.stop.estops,
            r.stop.raised_by,
            r.stop.episodes_stopped,
            r.stop.stopped_ticks,
            r.stop.paused_ticks,
            r.stop.state
        );
    }
    if !r.rejected.is_empty() {
        // Lost, refused or dropped messages are counted, never silent.
        let each: Vec<String> = r
            .rejected
            .iter()
            .map(|(k, n)| format!("{n} on `{k}`"))
            .collect();
        println!("bus: {}", each.join(", "));
    }
    if let Some(a) = &r.arm
        && !a.on_exit.is_empty()
    {
        println!(
            "arm on exit: {}{}",
            a.on_exit,
            if a.on_exit_ok {
                ""
            } else {
                " (FAILED: the bus did not answer)"
            }
        );
    }
    if let Some(e) = &s.eval {
        println!(
            "evaluation (the learner's deterministic action): {} episodes, {:.1}% successful, mean return {:.2}",
            e.episodes,
            100.0 * e.success_rate,
            e.mean_return
        );
    }
    if let Some(rec) = &r.recording {
        println!(
            "recording: {} episodes in {} ({} steps, {} dropped)",
            rec.episode_files,
            rec.dir.display(),
            rec.steps_recorded,
            rec.steps_dropped
        );
        if rec.episodes_incomplete > 0 {
            println!(
                "recording: {} episode files are incomplete (kept as .rrd.partial; {} write errors)",
                rec.episodes_incomplete, rec.write_errors
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use reflex_agent::config::RunConfig;

    #[test]
    fn every_shipped_run_config_loads_and_validates() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/run");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "toml") {
                RunConfig::load(&p).unwrap_or_else(|e| panic!("{}: {e:#}", p.display()));
                n += 1;
            }
        }
        assert!(n >= 4, "configs found: {n}");
    }

    #[test]
    fn a_learner_table_with_the_scripted_expert_is_refused_naming_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.toml");
        std::fs::write(
            &p,
            "[robot]\nsource = \"sim\"\n[sim]\ntask = \"pick\"\n[policy]\nkind = \"expert\"\n[learner]\n",
        )
        .unwrap();
        let e = format!("{:#}", RunConfig::load(&p).unwrap_err());
        assert!(e.contains("learner") && e.contains("onnx"), "{e}");
    }
}
