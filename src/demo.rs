//! `reflex demo`: the mission in one process. The shipped diffusion base policy drives the
//! simulated arm through the control loop; a residual SAC learner refines it from the sparse task
//! reward; a simulated person corrects the robot when it stalls or strays. Lockstep and
//! single-threaded in simulated time, so a seed reproduces a run exactly: after every environment
//! step the learner does its updates and, at episode ends, publishes new residual weights, which
//! the loop swaps in atomically.

use crate::cli::progress;
use anyhow::Context;
use clap::Args;
use reflex_policies::onnx_policy::{OnnxPolicy, RunOptions};
use reflex_policies::sac::hook::{ActionNorm, ResidualMlp, export_actor};
use reflex_policies::sac::steer::SteeredPolicy;
use reflex_policies::sac::{Mode, Sac, SacConfig};
use reflex_runtime::clock::SimClock;
use reflex_runtime::control::{ControlLoop, LoopConfig, PolicyDriver};
use reflex_runtime::msg::{Observation, TeleopMsg};
use reflex_runtime::outbox::{Source, outbox};
use reflex_runtime::policy::Policy;
use reflex_runtime::robot::Robot;
use reflex_runtime::safety::SafetyConfig;
use reflex_runtime::teleop::teleop_channel;
use reflex_sim::human::{HumanConfig, SimHuman};
use reflex_sim::{SimConfig, SimEnv, TaskKind};
use std::path::PathBuf;
use std::time::Instant;

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
    /// Learner mode: residual (default), noise (diffusion steering, DSRL: the learner picks the
    /// sampler's initial noise per chunk) or full (SAC from scratch, the baseline).
    #[arg(long, default_value = "residual")]
    mode: String,
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
}

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct DemoFile {
    learner: Option<SacConfig>,
    human: Option<HumanConfig>,
}

impl reflex_runtime::config::Validate for DemoFile {
    fn validate(&self, _: &str) -> Result<(), reflex_runtime::config::Invalid> {
        use reflex_runtime::config::in_range;
        if let Some(l) = &self.learner {
            in_range(
                "learner",
                "critic_subset",
                l.critic_subset,
                1,
                l.critics.max(1),
            )?;
            in_range("learner", "batch", l.batch, 1, 65_536)?;
            in_range("learner", "utd", l.utd, 1, 1000)?;
            in_range("learner", "discount", l.discount, 0.0, 1.0)?;
            in_range("learner", "demo_ratio", l.demo_ratio, 0.0, 1.0)?;
            in_range("learner", "action_scale", l.action_scale, 0.0, 2.0)?;
            in_range("learner", "bc_weight", l.bc_weight, 0.0, 1000.0)?;
        }
        if let Some(h) = &self.human {
            in_range("human", "rate", h.rate, 0.0, 1.0)?;
        }
        Ok(())
    }
}

/// Per-episode record of a demo run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct EpisodeRow {
    pub episode: usize,
    pub success: bool,
    pub steps: u32,
    pub ret: f32,
    pub interventions: u32,
    pub intervention_steps: u32,
}

fn rolling(xs: &[f64], k: usize) -> Vec<f64> {
    (0..xs.len())
        .map(|i| {
            let lo = i.saturating_sub(k - 1);
            xs[lo..=i].iter().sum::<f64>() / (i + 1 - lo) as f64
        })
        .collect()
}

/// The learner's settings for the demo (docs/training.md explains each choice).
pub fn demo_learner(mode: Mode, seed: u64) -> SacConfig {
    if mode == Mode::Noise {
        // One decision per chunk: a few hundred transitions in 100 episodes, so many updates per
        // transition (DSRL uses ~20) are cheap.
        return SacConfig {
            mode,
            hidden: vec![256, 256],
            critics: 2,
            critic_subset: 2,
            critic_layer_norm: true,
            batch: 256,
            utd: 10,
            discount: 0.97,
            n_step: 1,
            init_temperature: 0.01,
            entropy_in_target: false,
            bootstrap_truncation: false,
            noise_bound: 1.5,
            demo_ratio: 0.0,
            warmup_steps: 32,
            capacity: 200_000,
            seed,
            ..Default::default()
        };
    }
    SacConfig {
        mode,
        hidden: vec![128, 128],
        critics: 2,
        critic_subset: 2,
        critic_layer_norm: true,
        batch: 256,
        utd: 5,
        discount: 0.97,
        n_step: 3,
        init_temperature: 0.01,
        entropy_in_target: false,
        bootstrap_truncation: false,
        action_scale: 0.5,
        bc_weight: 1.0,
        demo_ratio: 0.5,
        warmup_steps: 256,
        capacity: 200_000,
        seed,
        ..Default::default()
    }
}

/// The learner's state scaling from the base policy's own input normalisation (half widths of
/// at least 0.05, so a component that hardly varied in the demonstrations is not blown up).
pub fn state_norm(base: &OnnxPolicy, state_dim: usize) -> Option<reflex_policies::sac::ObsNorm> {
    base.spec()
        .state_bounds(state_dim)
        .map(|(lo, hi)| reflex_policies::sac::ObsNorm::from_bounds(lo, hi, 0.05))
}

/// `base` with the keys of `table` replacing its own (a partial table keeps the other values).
pub fn overlay_sac(base: SacConfig, table: &toml::Table) -> Result<SacConfig, String> {
    let mut t = match toml::Value::try_from(&base).map_err(|e| e.to_string())? {
        toml::Value::Table(t) => t,
        _ => unreachable!("a struct serialises to a table"),
    };
    for (k, v) in table {
        t.insert(k.clone(), v.clone());
    }
    toml::Value::Table(t)
        .try_into::<SacConfig>()
        .map_err(|e| e.to_string())
}

/// The table `name` of a TOML file (empty when absent).
pub fn read_table(path: &std::path::Path, name: &str) -> anyhow::Result<toml::Table> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config `{}`", path.display()))?;
    let all: toml::Table = text
        .parse()
        .with_context(|| format!("config `{}`", path.display()))?;
    Ok(match all.get(name) {
        Some(toml::Value::Table(t)) => t.clone(),
        _ => toml::Table::new(),
    })
}

pub fn run(a: DemoArgs) -> anyhow::Result<()> {
    crate::bench_learner::pin_threads(1);
    let mode = match a.mode.as_str() {
        "residual" => Mode::Residual,
        "full" => Mode::Full,
        "noise" => Mode::Noise,
        o => anyhow::bail!("--mode `{o}`: allowed values are residual, noise, full"),
    };
    let t0 = Instant::now();
    let env = SimEnv::new(SimConfig::for_task(TaskKind::Pick))?;
    let spec = env.spec().clone();
    let (obs_dim, act_dim) = (spec.state_dim(), spec.action.dim());
    let opts = RunOptions {
        seed: a.seed,
        ..Default::default()
    };
    let base = OnnxPolicy::load(&a.model, &spec, &opts)
        .with_context(|| format!("loading the base policy {}", a.model.display()))?;
    // A second copy labels person-driven steps with what the base would have done (ResFiT's
    // relabelling of demonstration transitions).
    let relabel = OnnxPolicy::load(
        &a.model,
        &spec,
        &RunOptions {
            seed: a.seed ^ 1,
            ..Default::default()
        },
    )?;
    let file: DemoFile = match &a.config {
        Some(p) => reflex_runtime::config::load(p)?,
        None => DemoFile::default(),
    };
    // Keys in the file's [learner] replace the demo's settings; the rest stay the demo's.
    let mut learner_cfg = match (&a.config, &file.learner) {
        (Some(p), Some(_)) => {
            let t = read_table(p, "learner")?;
            SacConfig {
                mode,
                ..overlay_sac(demo_learner(mode, a.seed), &t)
                    .map_err(|e| anyhow::anyhow!("config `{}`: [learner] {e}", p.display()))?
            }
        }
        _ => demo_learner(mode, a.seed),
    };
    // The person's seed follows `--seed` unless the file's [human] table sets one.
    let human_cfg = match (&a.config, file.human.clone()) {
        (Some(p), Some(h)) if read_table(p, "human")?.contains_key("seed") => h,
        (_, h) => HumanConfig {
            seed: a.seed,
            ..h.unwrap_or_default()
        },
    };
    if learner_cfg.obs_norm.is_none() {
        learner_cfg.obs_norm = state_norm(&relabel, obs_dim);
    }
    let noise_dim = match mode {
        Mode::Noise => relabel.noise_len(),
        _ => act_dim,
    };
    if mode == Mode::Noise && noise_dim == 0 {
        anyhow::bail!(
            "--mode noise steers a diffusion or flow policy; {} is neither",
            a.model.display()
        );
    }
    let mut sac = Sac::new(learner_cfg, obs_dim, noise_dim)?;
    let scale = if mode == Mode::Residual {
        sac.cfg.action_scale
    } else {
        0.0
    };
    let norm = ActionNorm::new(&spec.action.low, &spec.action.high, scale);
    let (mut teleop_tx, teleop_rx) = teleop_channel(act_dim);
    let (otx, orx) = outbox(4096, obs_dim, act_dim);
    let chain = reflex_sim::world::ArmModel::so101().chain;
    // The learner's weights reach the loop through one writer: the residual hook's or the
    // steered policy's.
    let mut tap = None;
    let mut weights = None;
    let driver = match mode {
        Mode::Residual => PolicyDriver::inline(Box::new(base) as Box<dyn Policy>),
        Mode::Noise => {
            let (p, w, t) =
                SteeredPolicy::new(base, &sac, true, a.seed ^ 7).map_err(anyhow::Error::msg)?;
            tap = Some(t);
            weights = Some(w);
            PolicyDriver::inline(Box::new(p))
        }
        Mode::Full => PolicyDriver::None,
    };
    let mut lp = ControlLoop::new(
        env,
        SimClock::new(),
        LoopConfig::at(spec.control_hz),
        SafetyConfig::default(),
        driver,
        Some(chain),
        a.seed,
    )?;
    if mode == Mode::Residual {
        let (hook, w) = ResidualMlp::new(&sac, norm.clone(), true, a.seed ^ 7)?;
        lp.set_residual(Box::new(hook));
        weights = Some(w);
    }
    lp.set_teleop(teleop_rx);
    lp.set_outbox(otx);
    let mut human = (!a.no_human)
        .then(|| SimHuman::new(&spec, human_cfg.clone()))
        .transpose()?;
    let mut msg = TeleopMsg {
        action: vec![0.0; act_dim],
        ..Default::default()
    };
    let run_id = format!("demo-{}-seed{}", chrono_like_stamp(), a.seed);
    let dir = a.runs.join(&run_id);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // Every episode to Rerun, off the loop (the recorder's own thread and bounded queue).
    let recorder = if a.no_record {
        None
    } else {
        Some(crate::run_cmd::make_recorder(
            Some(dir.join("episodes")),
            reflex_runtime::recorder::Live::Off,
            &spec,
            true,
        )?)
    };

    let pb = if a.json {
        indicatif::ProgressBar::hidden()
    } else {
        progress(a.episodes as u64, "episodes")
    };
    let mut rows: Vec<EpisodeRow> = vec![];
    let mut asm =
        crate::assemble::Assembler::new(mode, norm.clone(), Some(relabel), !a.no_rlif, act_dim);
    let mut chunk_asm = crate::assemble::ChunkAssembler::new(!a.no_rlif);
    let mut step = reflex_runtime::msg::WireStep::default();
    let mut version = 0u64;
    let mut upd_t = Instant::now();
    let mut upd_n = sac.counters.critic_updates;
    let mut ups = 0.0;
    let full_act =
        |sac: &mut Sac, obs: &[f32]| -> anyhow::Result<Vec<f32>> { Ok(sac.act(obs, &[], false)?) };
    let (mut ep_interventions, mut ep_intervention_steps, mut person_before) = (0u32, 0u32, false);
    let mut demos_left = if human.is_some() { a.demos } else { 0 };
    let demo_pb = (demos_left > 0 && !a.json).then(|| {
        // The training bar waits until the demonstrations are done.
        pb.set_draw_target(indicatif::ProgressDrawTarget::hidden());
        let p = progress(demos_left as u64, "demonstrations");
        p.set_message("the person demonstrates before training starts");
        p
    });
    while rows.len() < a.episodes {
        // The person looks at the robot and decides.
        let obs_now: Observation = lp.robot().obs().clone();
        match &mut human {
            Some(h) if demos_left > 0 => h.demonstrate(&obs_now, &mut msg),
            Some(h) => h.act(&obs_now, &mut msg),
            None => msg.intervene = false,
        }
        // The person's takeovers, counted here: in `full` mode the learner's own commands share
        // the teleop path, so the loop's own takeover count cannot tell them apart.
        let person_now = msg.intervene;
        ep_interventions += (person_now && !person_before) as u32;
        ep_intervention_steps += person_now as u32;
        person_before = person_now;
        if mode == Mode::Full && !msg.intervene {
            // From scratch: the learner's own (exploring) action is the command, through the same
            // teleop path (the loop has no base policy).
            let an = if (sac.counters.env_steps as usize) < sac.cfg.warmup_steps {
                sac.random_action()
            } else {
                full_act(&mut sac, &obs_now.state)?
            };
            let mut act = an.clone();
            norm.to_robot(&mut act);
            msg.action.copy_from_slice(&act);
            msg.intervene = true;
            msg.seq += 1;
            teleop_tx.send(&msg);
            msg.intervene = false;
        } else {
            teleop_tx.send(&msg);
        }
        let episodes_before = lp.episodes().len();
        lp.step()?;
        // The noise of a chunk the steered policy started in this step.
        let mut noise = tap.as_ref().and_then(|t| t.try_recv());
        while let Some(tr) = orx.try_recv() {
            if let Some(r) = &recorder {
                r.record(&tr);
            }
            // In `full` mode the learner's own commands also travel the teleop path; only the
            // simulated person's are interventions.
            step.fill(&tr);
            step.teleop = tr.source == Source::Teleop
                && (mode != Mode::Full || human.as_ref().is_some_and(|h| h.intervening()));
            if mode == Mode::Noise {
                let before = chunk_asm.stored;
                chunk_asm.push(&mut sac, &step, noise.as_deref());
                if let (Some(n), Some(t)) = (noise.take(), &tap) {
                    t.recycle(n);
                }
                // One learner step per chunk transition (the learner's time runs in chunks).
                for _ in before..chunk_asm.stored {
                    sac.train_step()?;
                }
            } else {
                asm.push(&mut sac, &step)?;
            }
            orx.recycle(tr);
        }
        if mode != Mode::Noise {
            sac.train_step()?;
        }
        // Episode ends: record, publish the new residual (swapped in at the episode boundary).
        if lp.episodes().len() > episodes_before && demos_left > 0 {
            demos_left -= 1;
            (ep_interventions, ep_intervention_steps, person_before) = (0, 0, false);
            if let Some(p) = &demo_pb {
                p.inc(1);
                if demos_left == 0 {
                    p.finish_and_clear();
                    pb.set_draw_target(indicatif::ProgressDrawTarget::stderr());
                }
            }
        } else if lp.episodes().len() > episodes_before {
            let e = lp.episodes().last().expect("just finished").clone();
            rows.push(EpisodeRow {
                episode: rows.len(),
                success: e.success,
                steps: e.steps,
                ret: e.ret,
                interventions: ep_interventions,
                intervention_steps: ep_intervention_steps,
            });
            (ep_interventions, ep_intervention_steps, person_before) = (0, 0, false);
            if let Some(w) = &mut weights {
                version += 1;
                w.publish(version, &export_actor(&sac)?);
            }
            let dt = upd_t.elapsed().as_secs_f64();
            if dt > 0.5 {
                ups = (sac.counters.critic_updates - upd_n) as f64 / dt;
                upd_t = Instant::now();
                upd_n = sac.counters.critic_updates;
            }
            let last: Vec<&EpisodeRow> = rows.iter().rev().take(20).collect();
            let sr = last
                .iter()
                .filter(|r| r.success && r.interventions == 0)
                .count() as f64
                / last.len() as f64;
            let ir = last.iter().filter(|r| r.interventions > 0).count() as f64 / last.len() as f64;
            pb.set_message(format!(
                "success(20) {:>3.0}%  interventions(20) {:>3.0}%  {:>4.0} updates/s",
                sr * 100.0,
                ir * 100.0,
                ups
            ));
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    let wall = t0.elapsed().as_secs_f64();
    if let Some(r) = recorder {
        let st = r.finish();
        if st.dropped.load(std::sync::atomic::Ordering::Relaxed) > 0 {
            tracing::warn!(
                "the recorder dropped {} steps (it fell behind)",
                st.dropped.load(std::sync::atomic::Ordering::Relaxed)
            );
        }
    }
    let reasons = human.as_ref().map(|h| h.reasons);
    summarize(&a, &dir, &rows, wall, &sac, reasons)
}

/// A sortable stamp from the system clock (no date library): seconds since the epoch.
pub fn chrono_like_stamp() -> String {
    let s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!("{s}")
}

fn summarize(
    a: &DemoArgs,
    dir: &std::path::Path,
    rows: &[EpisodeRow],
    wall: f64,
    sac: &Sac,
    reasons: Option<reflex_sim::human::TakeoverReasons>,
) -> anyhow::Result<()> {
    // The headline: success without a takeover (the robot's own); `success` counts assisted
    // episodes too.
    let succ: Vec<f64> = rows
        .iter()
        .map(|r| (r.success && r.interventions == 0) as u8 as f64)
        .collect();
    let assisted: Vec<f64> = rows.iter().map(|r| r.success as u8 as f64).collect();
    let intv: Vec<f64> = rows
        .iter()
        .map(|r| (r.interventions > 0) as u8 as f64)
        .collect();
    let (s20, i20) = (rolling(&succ, 20), rolling(&intv, 20));
    crate::plot::curves_png(
        &dir.join("learning_curve.png"),
        &[(&s20, [30, 160, 60]), (&i20, [210, 50, 40])],
    )?;
    let points: Vec<reflex_runtime::recorder::LearningPoint> = rows
        .iter()
        .map(|r| reflex_runtime::recorder::LearningPoint {
            success: r.success && r.interventions == 0,
            intervened: r.interventions > 0,
            ret: r.ret,
            steps: r.steps,
        })
        .collect();
    reflex_runtime::recorder::write_learning_curves(&dir.join("learning.rrd"), &points, 20)
        .map_err(anyhow::Error::msg)?;
    let window = |v: &[f64], from: usize, to: usize| {
        if to > from {
            v[from..to].iter().sum::<f64>() / (to - from) as f64
        } else {
            f64::NAN
        }
    };
    let n = rows.len();
    let first = window(&succ, 0, n.min(20));
    let last = window(&succ, n.saturating_sub(20), n);
    let first_i = window(&intv, 0, n.min(20));
    let last_i = window(&intv, n.saturating_sub(20), n);
    let reached = s20.iter().position(|s| *s >= 0.9).map(|i| i + 1);
    let summary = serde_json::json!({
        "episodes": n,
        "seed": a.seed,
        "mode": a.mode,
        "success_rate_first_20": first,
        "success_rate_last_20": last,
        "success_rate": last,
        "success_with_assistance_last_20": window(&assisted, n.saturating_sub(20), n),
        "intervention_rate_first_20": first_i,
        "intervention_rate_last_20": last_i,
        "episode_reaching_90pct_rolling_success": reached,
        "wall_s": wall,
        "env_steps": sac.counters.env_steps,
        "updates": sac.counters.critic_updates,
        "takeover_reasons": reasons,
        "demonstrations": if a.no_human { 0 } else { a.demos },
        "rlif": !a.no_rlif,
        "run_dir": dir.display().to_string(),
        "learning_curve": dir.join("learning_curve.png").display().to_string(),
        "learning_recording": dir.join("learning.rrd").display().to_string(),
        "episode_recordings": (!a.no_record).then(|| dir.join("episodes").display().to_string()),
    });
    let rows_json =
        serde_json::to_vec_pretty(&serde_json::json!({ "summary": summary, "episodes": rows }))?;
    reflex_runtime::fsio::atomic_write(&dir.join("summary.json"), &rows_json)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
        return Ok(());
    }
    println!(
        "reflex demo: pick, {} learner, simulated person {}",
        a.mode,
        if a.no_human { "off" } else { "on" }
    );
    println!("  {:<28} {:>8} {:>8}", "", "first 20", "last 20");
    println!(
        "  {:<28} {:>7.0}% {:>7.0}%",
        "success (robot alone)",
        first * 100.0,
        last * 100.0
    );
    println!(
        "  {:<28} {:>7.0}% {:>7.0}%",
        "success (with takeovers)",
        window(&assisted, 0, n.min(20)) * 100.0,
        window(&assisted, n.saturating_sub(20), n) * 100.0
    );
    println!(
        "  {:<28} {:>7.0}% {:>7.0}%",
        "episodes with a takeover",
        first_i * 100.0,
        last_i * 100.0
    );
    println!(
        "  {} episodes, {} environment steps, {} learner updates, {:.0} s",
        n, sac.counters.env_steps, sac.counters.critic_updates, wall
    );
    match reached {
        Some(e) => println!("  rolling 20-episode success reached 90% at episode {e}"),
        None => println!("  rolling 20-episode success did not reach 90%"),
    }
    println!(
        "  learning curve (green: success, red: takeovers; last 20 episodes): {}",
        dir.join("learning_curve.png").display()
    );
    Ok(())
}
