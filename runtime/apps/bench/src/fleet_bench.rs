//! `reflex bench fleet`: how many actors one learner keeps up with. For each fleet size, that
//! many simulated actors (the simulator's `pick` spec, each on its own robot name and link) hand
//! the learner steps as fast as it takes them, and the real learner service (`reflex learn`'s,
//! the demo's settings in full mode) ingests, stores and trains on them. Reported per size: steps
//! ingested per second, steps trained on per second (the rest were stored without updates
//! during the warm-up or because the learner was behind, `[learner] shed_updates_above`),
//! critic updates per second,
//! and from the trained rate how many 20 Hz robots one learner serves at its full
//! update-to-data ratio.

use reflex_agent::config::LearnerSection;
use reflex_agent::error::Result;
use reflex_agent::learner::{LearnerConfig, ServeOptions, serve};
use reflex_agent::progress::Silent;
use reflex_bus::learnlink::{ActorLink, Fleet, LinkConfig, WeightsShape};
use reflex_bus::{BusConfig, Keys};
use reflex_contracts::msg;
use reflex_contracts::robot::Robot;
use reflex_learn::sac::{Mode, Sac};
use reflex_sim::config::SimConfig;
use reflex_sim::env::SimEnv;
use reflex_sim::task::TaskKind;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use zenoh::Wait;

/// What to measure.
#[derive(Clone, Debug)]
pub struct FleetBenchOptions {
    /// Fleet sizes, in order.
    pub actors: Vec<usize>,
    /// Steps each actor hands over.
    pub steps_per_actor: u64,
    /// Threads of the learner's matrix products (0: the learner's default).
    pub threads: usize,
    /// Scratch directory (checkpoints).
    pub dir: PathBuf,
}

/// One fleet size.
#[derive(Clone, Debug, serde::Serialize)]
pub struct FleetPoint {
    /// Actors.
    pub actors: usize,
    /// Steps all actors handed over.
    pub steps: u64,
    /// From the first step offered to the learner having taken every step, s.
    pub wall_s: f64,
    /// Steps ingested (received, stored) per second.
    pub steps_per_s: f64,
    /// Steps the learner trained on per second: critic updates per second over the updates
    /// per step (steps stored during the warm-up or while it was behind had none).
    pub trained_steps_per_s: f64,
    /// Critic updates per second.
    pub updates_per_s: f64,
    /// Steps stored without updates because the learner was behind.
    pub updates_shed: u64,
    /// Steps every actor saw persisted (must equal `steps`).
    pub persisted: u64,
    /// 20 Hz robots one learner trains on at its full update-to-data ratio:
    /// `trained_steps_per_s / 20`.
    pub robots_at_20hz: f64,
}

/// The bench's figures.
#[derive(Clone, Debug, serde::Serialize)]
pub struct FleetBenchReport {
    /// The learner measured.
    pub learner: String,
    /// Threads of its matrix products.
    pub threads: usize,
    /// One entry per fleet size.
    pub points: Vec<FleetPoint>,
    /// Wall time of the whole bench, s.
    pub wall_s: f64,
}

/// Runs the bench.
pub fn run(o: &FleetBenchOptions) -> Result<FleetBenchReport> {
    let t0 = Instant::now();
    let spec = SimEnv::new(SimConfig::for_task(TaskKind::Pick))?
        .spec()
        .clone();
    // The simulator's state has no bounds in its spec, and these steps no base policy: the
    // learner sees the raw (random) state.
    let mut section = LearnerSection {
        threads: o.threads,
        obs_norm: reflex_agent::config::ObsNormSource::Off,
        ..Default::default()
    };
    let sc = section.learner_sac(Mode::Full, 0)?;
    let utd = sc.utd;
    let learner = format!(
        "full SAC, hidden {:?}, batch {}, {} critic updates per step, demo preset (pick: {} state, {} actions)",
        sc.hidden,
        sc.batch,
        sc.utd,
        spec.state_dim(),
        spec.action.dim()
    );
    let (len, arch) =
        reflex_learn::sac::hook::actor_shape(&Sac::new(sc, spec.state_dim(), spec.action.dim())?);
    let mut points = Vec::new();
    for (i, &n) in o.actors.iter().enumerate() {
        section.checkpoint = o.dir.join(format!("fleet-{n}-{i}.ckpt"));
        points.push(point(
            o,
            &spec,
            &section,
            n,
            WeightsShape { len, arch },
            utd,
        )?);
    }
    Ok(FleetBenchReport {
        learner,
        threads: reflex_learn::sac::gemm::set_threads(section.learner_threads()),
        points,
        wall_s: t0.elapsed().as_secs_f64(),
    })
}

fn point(
    o: &FleetBenchOptions,
    spec: &msg::RobotSpec,
    section: &LearnerSection,
    n: usize,
    shape: WeightsShape,
    utd: usize,
) -> Result<FleetPoint> {
    let ep = format!(
        "unixsock-stream/{}",
        o.dir.join(format!("fleet-{n}.sock")).display()
    );
    let _ = std::fs::remove_file(o.dir.join(format!("fleet-{n}.sock")));
    let robots = BusConfig::hermetic(vec![ep.clone()], vec![]).open()?;
    let ws = BusConfig::hermetic(vec![], vec![ep]).open()?;
    let names: Vec<String> = (1..=n).map(|i| format!("bench-{i}")).collect();
    let queryables = answer_specs(&robots, spec, &names)?;
    let cfg = LearnerConfig {
        robot: names[0].clone(),
        fleet: Fleet::from_names(&names).map_err(reflex_bus::BusError::from)?,
        section: section.clone(),
        mode: Mode::Full,
        base_model: None,
        seed: 0,
    };
    let learner = std::thread::spawn({
        let (ws, cfg) = (ws.clone(), cfg.clone());
        move || {
            let so = ServeOptions {
                exit_when_actor_leaves: true,
                wait_s: 30.0,
                ..Default::default()
            };
            serve(&ws, &cfg, &so, &Silent)
        }
    });
    let (sd, ad) = (spec.state_dim(), spec.action.dim());
    let steps = o.steps_per_actor;
    let start = Instant::now();
    let mut actors = Vec::new();
    let mut taken = Vec::new();
    for name in &names {
        let (w, _r) = reflex_runtime::triple::triple(reflex_runtime::residual::Weights::default());
        let link = ActorLink::new(
            &robots,
            &Keys::new(name).map_err(reflex_bus::BusError::from)?,
            LinkConfig {
                drain_s: 120.0,
                ..Default::default()
            },
            reflex_runtime::residual::WeightsWriter::from_writer(w),
            shape,
        )?;
        taken.push(link.progress());
        let seed = actors.len() as u64;
        actors.push(std::thread::spawn(move || act(link, steps, sd, ad, seed)));
    }
    // Ingest ends when the learner has taken every actor's every step.
    let all_taken = |t: &[Arc<reflex_bus::learnlink::LinkProgress>]| {
        t.iter()
            .all(|p| p.received.load(Ordering::Relaxed) >= steps)
    };
    while !all_taken(&taken) {
        if learner.is_finished() {
            break;
        }
        // Paces the polling (the measured work runs on the actor and learner threads).
        std::thread::sleep(Duration::from_millis(5));
    }
    let wall_s = start.elapsed().as_secs_f64();
    if !all_taken(&taken) {
        // The learner stopped before taking everything: its error, not a figure.
        learner.join().expect("learner thread")?;
        return Err(reflex_agent::AgentError::setup(
            "bench fleet",
            "the learner stopped before taking every step",
        ));
    }
    let persisted: u64 = actors
        .into_iter()
        .map(|a| a.join().expect("actor thread").persisted)
        .sum();
    let report = learner.join().expect("learner thread")?;
    drop(queryables);
    let total = steps * n as u64;
    let trained = report.updates as f64 / utd as f64;
    Ok(FleetPoint {
        actors: n,
        steps: total,
        wall_s,
        steps_per_s: total as f64 / wall_s,
        trained_steps_per_s: trained / wall_s,
        updates_per_s: report.updates as f64 / wall_s,
        updates_shed: report.updates_shed,
        persisted,
        robots_at_20hz: trained / wall_s / 20.0,
    })
}

/// Every robot answers for its spec, as `reflex run` does (alive as long as the result).
fn answer_specs(
    robots: &zenoh::Session,
    spec: &msg::RobotSpec,
    names: &[String],
) -> Result<Vec<zenoh::query::Queryable<()>>> {
    let mut queryables = Vec::new();
    for name in names {
        let key = Keys::new(name).map_err(reflex_bus::BusError::from)?.spec;
        let mut s = spec.clone();
        s.name = name.clone();
        let bytes = msg::encode(&s);
        queryables.push(
            robots
                .declare_queryable(key.clone())
                .callback(move |q| {
                    let _ = q.reply(key.clone(), bytes.clone()).wait();
                })
                .wait()
                .map_err(|e| {
                    reflex_agent::AgentError::setup("bench fleet", format!("spec of `{name}`: {e}"))
                })?,
        );
    }
    Ok(queryables)
}

/// One actor: `steps` steps of 100-step episodes with random states, offered as fast as the
/// link takes them, then drained until the learner persisted them.
fn act(
    mut link: ActorLink,
    steps: u64,
    sd: usize,
    ad: usize,
    seed: u64,
) -> reflex_bus::learnlink::LinkStats {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut t = reflex_runtime::outbox::Transition::with_dims(sd, ad);
    for k in 0..steps {
        t.episode = k / 100;
        t.step = (k % 100) as u32;
        // The last step ends its episode too: the learner takes an episode's steps when it ends,
        // so a run shorter than one episode was never taken and the bench waited for ever.
        t.truncated = k % 100 == 99 || k + 1 == steps;
        t.reward = if rng.random::<f32>() < 0.05 { 1.0 } else { 0.0 };
        for v in t.obs.iter_mut().chain(t.next_obs.iter_mut()) {
            *v = rng.random_range(-1.0..1.0);
        }
        for v in t.action.iter_mut() {
            *v = rng.random_range(-1.0..1.0);
        }
        link.offer(&t);
        link.tick();
    }
    link.finish()
}
