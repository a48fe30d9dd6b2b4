//! The mission in one process (`reflex demo`): the shipped diffusion base policy drives the
//! simulated arm through the control loop; a residual SAC learner refines it from the sparse task
//! reward; a simulated person corrects the robot when it stalls or strays. Lockstep and
//! single-threaded in simulated time, so a seed reproduces a run exactly: after every environment
//! step the learner does its updates and, at episode ends, publishes new residual weights, which
//! the loop swaps in atomically. With `--vision` ([`VisionDemo`]) the same run learns from the
//! simulator's cameras with a success classifier's reward (module `vision`).

mod vision;
pub use vision::{VISION_SHIFT, VisionDemo};

use reflex_adapters::reward::ClassifiedReward;
use reflex_agent::assemble::{Assembler, ChunkAssembler};
use reflex_agent::presets::{learner_preset, overlay_sac, read_table, state_norm};
use reflex_agent::progress::Progress;
use reflex_agent::{AgentError, error::Result};
use reflex_contracts::config::{Invalid, Validate};
use reflex_contracts::msg::{Observation, TeleopMsg, WireStep};
use reflex_contracts::policy::Policy;
use reflex_contracts::robot::Robot;
use reflex_learn::sac::hook::{ActionNorm, ResidualMlp, export_actor};
use reflex_learn::sac::steer::{NoiseTap, SteeredPolicy};
use reflex_learn::sac::{Mode, Sac, SacConfig};
use reflex_policies::onnx_policy::{OnnxPolicy, RunOptions};
use reflex_record::Recorder;
use reflex_runtime::clock::SimClock;
use reflex_runtime::control::{ControlLoop, LoopConfig, PolicyDriver};
use reflex_runtime::outbox::{OutboxReceiver, Source, outbox, outbox_with_features};
use reflex_runtime::residual::WeightsWriter;
use reflex_runtime::teleop::{TeleopWriter, teleop_channel};
use reflex_sim::config::CameraConfig;
use reflex_sim::human::{HumanConfig, SimHuman, TakeoverReasons};
use reflex_sim::{SimConfig, SimEnv, TaskKind};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// How a demo runs.
#[derive(Clone, Debug)]
pub struct DemoOptions {
    /// Episodes of training.
    pub episodes: usize,
    /// Seed of everything (episodes, learner, person).
    pub seed: u64,
    /// The base policy.
    pub model: PathBuf,
    /// Residual (default), noise (diffusion steering, DSRL) or full (SAC from scratch).
    pub mode: Mode,
    /// A simulated person corrects and demonstrates.
    pub human: bool,
    /// Episodes the person demonstrates before training (HIL-SERL starts from about 20).
    pub demos: usize,
    /// RLIF: reward -1 on the policy's step before each takeover.
    pub rlif: bool,
    /// Where runs are written (a directory per run).
    pub runs: PathBuf,
    /// Record every episode to Rerun files.
    pub record: bool,
    /// A TOML file with `[learner]` and/or `[human]` tables replacing the demo's defaults.
    pub config: Option<PathBuf>,
    /// Held-out episodes after training: the refined policy alone (0: none).
    pub eval_episodes: usize,
    /// Learning from pixels (`--vision`): cameras, the frozen encoder, the classifier's reward.
    pub vision: Option<VisionDemo>,
    /// Keep the average of the residual weights published at the ends of the last this many
    /// training episodes instead of the last ones (None: 1, the last weights).
    pub keep_average: Option<usize>,
    /// Learner steps (`utd` critic updates and an actor update each) on the person's
    /// demonstrations after they end and before the first training episode (0: none).
    pub offline_updates: usize,
    /// Real-time chunking on the base policy (`--rtc guided|hard`), in training, in the
    /// held-out episodes and in the kept `refined.toml` (`[policy.rtc]`); `None`: off.
    pub rtc: Option<reflex_policies::rtc::RtcConfig>,
    /// Simulated robots feeding the one learner (`--robots N`; 1: the demo), each with its own
    /// seed and person; `episodes` and `demos` count the fleet's.
    pub robots: usize,
    /// Threads for the learner's matrix products (`--threads`, as `[learner] threads`; 0: one
    /// fewer than the machine's cores). The figures are the same to the bit for any count.
    pub threads: usize,
    /// The simulator's task (`--task`; `pick`, or `insert` with its own base policy). The pixel
    /// demo runs `pick` only.
    pub task: TaskKind,
}

/// The largest demo fleet (`--robots`).
pub const MAX_ROBOTS: usize = 16;

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            episodes: 100,
            seed: 0,
            model: PathBuf::from("models/pick.onnx"),
            mode: Mode::Residual,
            human: true,
            demos: 20,
            rlif: true,
            runs: PathBuf::from("runs"),
            record: true,
            config: None,
            eval_episodes: 100,
            vision: None,
            keep_average: None,
            offline_updates: 0,
            rtc: None,
            robots: 1,
            threads: 1,
            task: TaskKind::Pick,
        }
    }
}

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct DemoFile {
    /// SAC's keys over the demo's preset, and for the pixel demo the heads' own keys under
    /// `[learner.vision]` (the encoder is the demo's, the base policy's `<model>.encoder.onnx`):
    /// resolved and checked in [`settings`].
    learner: Option<toml::Table>,
    human: Option<HumanConfig>,
    sim: Option<DemoSim>,
}

/// The physics the demo's `pick` runs on (docs/sim.md's `physics_hz` and `[sim.solver]`); the
/// task, the control rate, the action space and the cameras stay the demo's, which its base
/// policy was trained for.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct DemoSim {
    physics_hz: Option<f64>,
    solver: Option<toml::Table>,
}

impl Validate for DemoFile {
    fn validate(&self, _: &str) -> std::result::Result<(), Invalid> {
        if let Some(h) = &self.human {
            h.validate("human")?;
        }
        Ok(())
    }
}

/// Per-episode record of a demo run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct EpisodeRow {
    /// Training episode index (the fleet's, in the order the episodes ended).
    pub episode: usize,
    /// The robot of the fleet that ran it (0 for a demo of one robot).
    pub robot: usize,
    /// The task succeeded (with or without help).
    pub success: bool,
    /// Steps.
    pub steps: u32,
    /// Return: the rewards the learner got (learning from pixels, a success the person vetoed
    /// counts 0).
    pub ret: f32,
    /// Takeovers by the person.
    pub interventions: u32,
    /// Steps the person drove.
    pub intervention_steps: u32,
    /// Learning from pixels: whether the classifier called the episode a success (`success` is
    /// what the scene showed, as the person saw it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub classifier_success: Option<bool>,
}

/// The figures of a demo run: `summary.json`'s `summary`, and what `reflex demo --json` prints.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DemoSummary {
    /// Training episodes.
    pub episodes: usize,
    /// The run's seed.
    pub seed: u64,
    /// The learner's mode (`residual`, `full`, `noise`).
    pub mode: String,
    /// The headline: the policy alone on held-out seeds (`null` without a held-out evaluation).
    pub success_rate: Option<f64>,
    /// Success without a takeover over the first 20 training episodes.
    pub success_rate_first_20: f64,
    /// ... and over the last 20.
    pub success_rate_last_20: f64,
    /// Success, takeovers allowed, over the first 20 episodes.
    pub success_with_assistance_first_20: f64,
    /// ... and over the last 20.
    pub success_with_assistance_last_20: f64,
    /// Episodes with a takeover among the first 20.
    pub intervention_rate_first_20: f64,
    /// ... and among the last 20.
    pub intervention_rate_last_20: f64,
    /// The first episode ending a full window of 20 in which the robot alone succeeded in at
    /// least 90% (none before episode 20).
    pub episode_reaching_90pct_rolling_success: Option<usize>,
    /// Simulated robots that fed the learner.
    pub robots: usize,
    /// The robot's own time to that window: the fleet's episode there over the robots (each
    /// robot ran about this many training episodes by then).
    pub episodes_per_robot_reaching_90pct: Option<f64>,
    /// Wall time, s.
    pub wall_s: f64,
    /// Threads the learner's matrix products used.
    pub learner_threads: usize,
    /// Environment steps.
    pub env_steps: u64,
    /// Learner updates (critic).
    pub updates: u64,
    /// Why the simulated person took over.
    pub takeover_reasons: Option<reflex_sim::human::TakeoverReasons>,
    /// Demonstration episodes the person gave first.
    pub demonstrations: usize,
    /// Learner steps on the demonstrations alone before training (`--offline-updates`).
    pub offline_updates: usize,
    /// A simulated person watched.
    pub human: bool,
    /// RLIF: a takeover is the reward signal.
    pub rlif: bool,
    /// The run's directory.
    pub run_dir: String,
    /// The learning curve (PNG).
    pub learning_curve: String,
    /// The learning curves as a Rerun recording.
    pub learning_recording: String,
    /// Where the episode recordings are (with `--record`).
    pub episode_recordings: Option<String>,
    /// The learner's checkpoint.
    pub checkpoint: Option<String>,
    /// The kept residual (ONNX), when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub residual: Option<String>,
    /// Training episodes whose final weights the kept residual averages (1: the last weights).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub residual_averages_episodes: Option<u32>,
    /// A run config that runs the refined policy alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refined_config: Option<String>,
    /// The held-out evaluation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_out: Option<reflex_agent::heldout::HeldOut>,
    /// A state demo whose base reads images (an imported LeRobot policy): the base alone on the
    /// same held-out episodes as `held_out` (the pixel demo keeps it in `vision`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_held_out: Option<reflex_agent::heldout::HeldOut>,
    /// Learning from pixels: what the learner saw, the classifier's verdicts, the base alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vision: Option<VisionFigures>,
}

/// The pixel demo's own figures.
#[derive(Clone, Debug, serde::Serialize)]
pub struct VisionFigures {
    /// The frozen encoder the learner saw through.
    pub encoder: String,
    /// The success classifier that gave the reward.
    pub classifier: String,
    /// Frames in a row it had to call success.
    pub consecutive_frames: u32,
    /// Its successes the scene confirmed (training and demonstrations).
    pub classifier_successes_confirmed: u64,
    /// Its successes the person saw were false and marked failures.
    pub classifier_successes_vetoed: u64,
    /// The base policy alone on the same held-out episodes as `held_out` (the starting point).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_held_out: Option<reflex_agent::heldout::HeldOut>,
}

/// What a demo produced.
#[derive(Clone, Debug)]
pub struct DemoReport {
    /// The run's directory.
    pub dir: PathBuf,
    /// The summary written to `summary.json` (what `--json` prints).
    pub summary: DemoSummary,
    /// Every training episode.
    pub rows: Vec<EpisodeRow>,
}

/// The first episode (1-based) that ends a full window of `k` episodes whose mean is at least
/// `rate`. Windows shorter than `k` at the start do not count: the first episode alone is a
/// "window" of 100% whenever it succeeds (the summary said "reached 90% at episode 1").
fn first_full_window_reaching(xs: &[f64], k: usize, rate: f64) -> Option<usize> {
    if k == 0 || xs.len() < k {
        return None;
    }
    xs.windows(k)
        .position(|w| w.iter().sum::<f64>() / k as f64 >= rate)
        .map(|i| i + k)
}

/// The mean of the (up to) `k` values ending at each index: the learning curve's points, where
/// the first `k - 1` average the episodes so far.
fn rolling(xs: &[f64], k: usize) -> Vec<f64> {
    (0..xs.len())
        .map(|i| {
            let lo = i.saturating_sub(k - 1);
            xs[lo..=i].iter().sum::<f64>() / (i + 1 - lo) as f64
        })
        .collect()
}

/// The residual's bound when learning from pixels: an image policy is fragile, and a residual of up
/// to half the action range (the state demo's) breaks it while the learner is still untrained;
/// 0.1 leaves the residual too little reach to correct it (docs/training.md, "Learning from
/// pixels": seeds 0-3 at 0.1 and 0.2).
pub const VISION_ACTION_SCALE: f32 = 0.2;

/// The weight of the person's corrections in the actor's loss when learning from pixels. The
/// person's takeovers after a missed grasp reopen the fingers and lift; at the state demo's 1.0
/// that pull leaves the residual a near-constant "open and up" wherever the heads cannot tell a
/// miss from an approach, which fights the descent. At 0.1 the critic leads and the corrections
/// still train the heads (docs/training.md, "Learning from pixels": 0.03, 0.1, 0.3 and 1.0 measured).
pub const VISION_BC_WEIGHT: f64 = 0.1;

/// The residual's bound on `insert`'s gripper: none. The peg starts in the grasp and has to stay
/// there, so a residual on the fingers' width can only loosen them and drop it (the motion keeps
/// the state demo's bound; docs/training.md, "The demo on insert").
pub const INSERT_GRIPPER_SCALE: f32 = 0.0;

/// Training episodes whose final residual weights the kept residual averages (1: the last
/// weights alone, the default; `--keep-average K`, stochastic weight averaging, Izmailov et al.
/// 2018). Measured on the pixel demo and not kept as its default: docs/training.md.
pub fn keep_average(o: &DemoOptions) -> usize {
    o.keep_average.unwrap_or(1).clamp(1, o.episodes.max(1))
}

/// The learner's settings before a config file's: the mode's preset, with the pixel demo's
/// residual bound and behaviour-cloning weight.
fn preset(o: &DemoOptions) -> SacConfig {
    let mut p = learner_preset(o.mode, o.seed);
    if o.vision.is_some() {
        p.action_scale = VISION_ACTION_SCALE;
        p.bc_weight = VISION_BC_WEIGHT;
    }
    if o.task == TaskKind::Insert {
        // Motion, then the gripper's width (the simulator's action layout, docs/sim.md).
        p.action_scales = vec![p.action_scale, p.action_scale, p.action_scale];
        p.action_scales.push(INSERT_GRIPPER_SCALE);
    }
    p
}

/// A value out of range in config `p`, as the config loader words it.
fn invalid_in(p: &Path, i: Invalid) -> AgentError {
    reflex_contracts::config::ConfigError::Invalid {
        file: p.display().to_string(),
        key: i.key,
        value: i.value,
        allowed: i.allowed,
    }
    .into()
}

/// What a demo runs with: the demo's settings, with a config file's tables over them.
#[derive(Debug)]
struct Settings {
    learner: SacConfig,
    human: HumanConfig,
    sim: SimConfig,
}

/// The demo's simulator: the pixel demo's cameras or the state demo's `pick`, on the physics
/// of the file's `[sim]` table if it has one.
fn sim_settings(o: &DemoOptions, file: Option<DemoSim>) -> Result<SimConfig> {
    let mut sim = match &o.vision {
        Some(v) => vision::sim_config(v),
        None => SimConfig::for_task(o.task),
    };
    if o.vision.is_none() {
        sim.cameras = cameras_for_base(&o.model)?;
    }
    let (Some(p), Some(table)) = (&o.config, file) else {
        return Ok(sim);
    };
    if let Some(hz) = table.physics_hz {
        sim.physics_hz = hz;
    }
    if let Some(t) = table.solver {
        // Keys the table leaves out keep their defaults (docs/sim.md).
        sim.solver = t.try_into().map_err(|e: toml::de::Error| {
            AgentError::setup(
                format!("config `{}`: [sim.solver]", p.display()),
                e.to_string(),
            )
        })?;
    }
    sim.validate("sim").map_err(|i| invalid_in(p, i))?;
    Ok(sim)
}

/// The state demo's cameras: off, unless the base policy reads images (an imported LeRobot ACT
/// or Diffusion Policy does); then on, rendered at the size its first image input takes, so
/// nothing is resized on the way in. The residual learner still learns from the state.
fn cameras_for_base(model: &Path) -> Result<CameraConfig> {
    // A missing model is reported where the base is loaded, with the rest of its checks.
    if !reflex_policies::spec::spec_path(model).is_file() {
        return Ok(CameraConfig::default());
    }
    let spec = reflex_policies::spec::PolicySpec::load_for(model).map_err(|e| {
        AgentError::setup(
            format!("--model {}", model.display()),
            format!("its spec: {e}"),
        )
    })?;
    Ok(spec
        .inputs
        .iter()
        .find_map(|i| match i {
            reflex_policies::spec::InputSource::Image { width, height, .. } => Some(CameraConfig {
                enabled: true,
                width: *width,
                height: *height,
            }),
            _ => None,
        })
        .unwrap_or_default())
}

/// The learner's, the person's and the simulator's settings: the demo's, with a config file's
/// tables over them.
fn settings(o: &DemoOptions) -> Result<Settings> {
    let file: DemoFile = match &o.config {
        Some(p) => reflex_contracts::config::load(p)?,
        None => DemoFile::default(),
    };
    // Keys in the file's [learner] replace the demo's settings; the rest stay the demo's.
    let learner = match (&o.config, file.learner) {
        (Some(p), Some(mut t)) => {
            let at = |table: &str, e: String| {
                AgentError::setup(format!("config `{}`: {table}", p.display()), e)
            };
            let mut base = preset(o);
            // A run config's spelling: its SAC keys sit in [learner.sac], the demo's in [learner].
            if t.contains_key("sac") {
                return Err(at(
                    "[learner.sac]",
                    "a demo config takes SAC's keys in [learner] itself (a run config's [learner] holds the link and checkpoint, hence its [learner.sac]): move them up into [learner]".into(),
                ));
            }
            // The heads' keys are resolved on the demo's encoder, then the rest of the table
            // goes over the preset.
            if let Some(keys) = t.remove("vision") {
                let Some(v) = &o.vision else {
                    return Err(at(
                        "[learner.vision]",
                        "the learner's image heads belong to the pixel demo: add --vision or drop the table".into(),
                    ));
                };
                // toml's own message names the key at fault.
                let keys: vision::HeadKeys = keys
                    .try_into()
                    .map_err(|e: toml::de::Error| at("[learner.vision]", e.to_string()))?;
                let section = keys.section(v);
                section
                    .validate("learner.vision")
                    .map_err(|i| invalid_in(p, i))?;
                base.vision = Some(section.heads()?);
            }
            // A file's single bound covers every component, `insert`'s gripper included, unless
            // the file also gives them one by one.
            if t.contains_key("action_scale") && !t.contains_key("action_scales") {
                base.action_scales.clear();
            }
            let l = SacConfig {
                mode: o.mode,
                ..overlay_sac(base, &t).map_err(|e| at("[learner]", e.0))?
            };
            l.validate("learner").map_err(|i| invalid_in(p, i))?;
            l
        }
        _ => preset(o),
    };
    // The person's seed follows the demo's unless the file's [human] table sets one; so does
    // whether they press success.
    let given = match (&o.config, &file.human) {
        (Some(p), Some(_)) => read_table(p, "human")?,
        _ => toml::Table::new(),
    };
    let mut human = file.human.unwrap_or_default();
    if !given.contains_key("seed") {
        human.seed = o.seed;
    }
    if o.vision.is_some() && !given.contains_key("labels_success") {
        // Learning from pixels, success is the classifier's word: a person pressing success on
        // what the scene shows would end the episode a frame before the classifier does, with
        // its reward (0) on a success, and would bring the simulator's truth in as a reward. The
        // person only vetoes the classifier's false successes (`VisionRig::judge_end`).
        human.labels_success = false;
    }
    let sim = sim_settings(o, file.sim)?;
    Ok(Settings {
        learner,
        human,
        sim,
    })
}

/// One simulated robot of the demo: its loop, the person beside it, and what carries its steps
/// to the learner and its recordings to disk. A fleet (`--robots N`) is several of them feeding
/// one learner.
struct Arm {
    /// The robot's number in the fleet (0 for the demo's one robot).
    index: usize,
    lp: ControlLoop<ClassifiedReward<SimEnv>, SimClock>,
    teleop: TeleopWriter,
    orx: OutboxReceiver,
    weights: Option<WeightsWriter>,
    tap: Option<NoiseTap>,
    asm: Assembler,
    chunk_asm: ChunkAssembler,
    vision: Option<vision::VisionRig>,
    /// A base that reads images (the pixel demo's, or an imported one): its person's steps
    /// relabelled on their frames.
    seen_relabel: Option<vision::PersonRelabel>,
    human: Option<SimHuman>,
    msg: TeleopMsg,
    count: PersonCount,
    /// Demonstrations this robot's person still gives before training.
    demos_left: usize,
    recorder: Option<Recorder>,
    log: Option<reflex_data::steplog::StepLog>,
    /// The step on its way to the learner (reused).
    wire: WireStep,
}

/// The robots and the one learner they feed.
struct Rig {
    arms: Vec<Arm>,
    sac: Sac,
    norm: ActionNorm,
}

/// Robot `i`'s seed in a fleet on the demo's `seed`: the seed itself for the first robot (a
/// fleet of one is the demo), a SplitMix64 stream apart for each other (episodes, base policy,
/// residual noise, person).
pub fn robot_seed(seed: u64, i: usize) -> u64 {
    if i == 0 {
        return seed;
    }
    let mut z = (seed ^ 0x464c_4545_5400_0000 ^ i as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) >> 1
}

/// Robot `i`'s share of the fleet's `demos` demonstrations (the first robots give one more when
/// they do not divide evenly).
fn demos_of(demos: usize, robots: usize, i: usize) -> usize {
    demos / robots + usize::from(i < demos % robots)
}

/// Where robot `i`'s recordings go: the run's own `episodes/` and `steps/` for the first robot
/// (what `reflex distill` and `reflex replay` read), `robot<i>/` for the others.
fn arm_dir(dir: &Path, i: usize) -> PathBuf {
    if i == 0 {
        dir.to_path_buf()
    } else {
        dir.join(format!("robot{i}"))
    }
}

/// A robot's simulator (judged by the classifier when learning from pixels), its base policy
/// and the base's second copy that relabels the person's steps.
struct ArmParts {
    robot: ClassifiedReward<SimEnv>,
    seeing: Option<vision::Seeing>,
    base: OnnxPolicy,
    relabel: OnnxPolicy,
    seed: u64,
}

fn arm_parts(o: &DemoOptions, sim: SimConfig, seed: u64) -> Result<ArmParts> {
    let v = o.vision.as_ref();
    let env = SimEnv::new(sim)?;
    let seeing = v.map(|v| vision::seeing(v, env.spec())).transpose()?;
    let robot = match v {
        Some(v) => vision::judged(env, v)?,
        None => ClassifiedReward::passthrough(env),
    };
    let spec = robot.spec().clone();
    let load = |seed: u64| {
        OnnxPolicy::load(
            &o.model,
            &spec,
            &RunOptions {
                seed,
                ..Default::default()
            },
        )
    };
    let mut base = load(seed)?;
    if let Some(rtc) = &o.rtc {
        if base.spec().kind == reflex_policies::spec::PolicyKind::Chunk {
            return Err(AgentError::setup(
                "--rtc",
                format!(
                    "{} is a chunk policy: nothing to inpaint",
                    o.model.display()
                ),
            ));
        }
        if rtc.guidance && !base.has_vjp() {
            return Err(AgentError::setup(
                "--rtc guided",
                format!(
                    "{} has no VJP graph ([graph.vjp]; `reflex bc train --objective flow` writes one): use --rtc hard",
                    o.model.display()
                ),
            ));
        }
        base.set_rtc(rtc.clone());
    }
    // A second copy labels person-driven steps with what the base would have done (ResFiT's
    // relabelling of demonstration transitions).
    let relabel = load(seed ^ 1)?;
    Ok(ArmParts {
        robot,
        seeing,
        base,
        relabel,
        seed,
    })
}

fn build_rig(
    o: &DemoOptions,
    learner_cfg: SacConfig,
    human_cfg: &HumanConfig,
    sim: SimConfig,
    dir: &Path,
) -> Result<Rig> {
    if o.vision.is_some() && o.mode != Mode::Residual {
        return Err(AgentError::setup(
            "--vision",
            "the pixel demo refines its image base policy with a residual; drop --mode",
        ));
    }
    if o.robots > 1 && o.mode == Mode::Noise {
        return Err(AgentError::setup(
            "--robots",
            "a fleet runs the residual or the full learner: noise mode stores a chunk's transition as it closes, and a fleet's chunks would interleave in the buffer its n-step returns walk; drop --mode noise",
        ));
    }
    if o.rtc.is_some() && o.mode != Mode::Residual {
        return Err(AgentError::setup(
            "--rtc",
            "real-time chunking runs on the base a residual refines; drop --mode",
        ));
    }
    let parts = (0..o.robots.max(1))
        .map(|i| arm_parts(o, sim.clone(), robot_seed(o.seed, i)))
        .collect::<Result<Vec<_>>>()?;
    // The first robot sizes the learner: every robot is the same simulated arm.
    let first = &parts[0];
    let spec = first.robot.spec().clone();
    let (obs_dim, act_dim) = (spec.state_dim(), spec.action.dim());
    let mut learner_cfg = learner_cfg;
    if learner_cfg.obs_norm.is_none() {
        learner_cfg.obs_norm = state_norm(&first.relabel, &spec);
    }
    // The heads a config's `[learner.vision]` resolved, else SERL's on the demo's encoder.
    if learner_cfg.vision.is_none() {
        learner_cfg.vision = first.seeing.as_ref().map(|s| s.heads.clone());
    }
    let noise_dim = match o.mode {
        Mode::Noise => first.relabel.noise_len(),
        _ => act_dim,
    };
    if o.mode == Mode::Noise && noise_dim == 0 {
        return Err(AgentError::setup(
            "--mode noise",
            format!(
                "it steers a diffusion or flow policy; {} is neither",
                o.model.display()
            ),
        ));
    }
    let sac = Sac::new(learner_cfg, obs_dim, noise_dim)?;
    let scales = if o.mode == Mode::Residual {
        sac.cfg.residual_bounds(sac.act_dim)
    } else {
        vec![]
    };
    let norm = ActionNorm::new(&spec.action.low, &spec.action.high, &scales);
    let arms = parts
        .into_iter()
        .enumerate()
        .map(|(i, p)| build_arm(o, p, i, &sac, &norm, human_cfg, dir))
        .collect::<Result<Vec<_>>>()?;
    Ok(Rig { arms, sac, norm })
}

/// Robot `i` of the fleet, wired to the learner `sac`; its records under the run's `dir`.
fn build_arm(
    o: &DemoOptions,
    p: ArmParts,
    i: usize,
    sac: &Sac,
    norm: &ActionNorm,
    human_cfg: &HumanConfig,
    dir: &Path,
) -> Result<Arm> {
    let dir = arm_dir(dir, i);
    let ArmParts {
        robot,
        seeing,
        base,
        relabel,
        seed,
    } = p;
    let spec = robot.spec().clone();
    let (obs_dim, act_dim) = (spec.state_dim(), spec.action.dim());
    let (teleop, teleop_rx) = teleop_channel(act_dim);
    let (otx, orx) = match &sac.cfg.vision {
        Some(h) => {
            let n = h.features.iter().map(|f| f.len()).sum();
            outbox_with_features(4096, obs_dim, act_dim, n)
        }
        None => outbox(4096, obs_dim, act_dim),
    };
    let chain = reflex_sim::world::ArmModel::so101().chain;
    // The learner's weights reach the loop through one writer: the residual hook's or the
    // steered policy's.
    let (mut tap, mut weights) = (None, None);
    let driver = match o.mode {
        Mode::Residual => PolicyDriver::inline(Box::new(base) as Box<dyn Policy>),
        Mode::Noise => {
            let (p, w, t) = SteeredPolicy::new(base, sac, true, seed ^ 7)?;
            tap = Some(t);
            weights = Some(w);
            PolicyDriver::inline(Box::new(p))
        }
        Mode::Full => PolicyDriver::None,
    };
    let mut b = ControlLoop::builder(robot, SimClock::new())
        .config(LoopConfig::at(spec.control_hz))
        .policy(driver)
        .chain(Some(chain))
        .seed(seed);
    if o.mode == Mode::Residual {
        let (hook, w) = ResidualMlp::new(sac, norm.clone(), true, seed ^ 7)?;
        b = b.residual(Box::new(hook), false);
        weights = Some(w);
    }
    // The learner's relabeller reads the state only; an image policy relabels the person's
    // steps in the rig, on the frames the person acted on.
    let reads_images = relabel
        .spec()
        .inputs
        .iter()
        .any(|i| matches!(i, reflex_policies::spec::InputSource::Image { .. }));
    let mut vision = None;
    if let Some(s) = seeing {
        b = b.features(s.features);
        vision = Some(vision::VisionRig::new(s.header));
    }
    let (relabel, seen_relabel) = if reads_images {
        (None, Some(vision::PersonRelabel::new(relabel, act_dim)))
    } else {
        (Some(relabel), None)
    };
    let lp = b.teleop(teleop_rx).outbox(otx).build()?;
    let human = person(o, human_cfg, &spec, i)?;
    let (recorder, log) = records(o, &dir, &spec)?;
    Ok(Arm {
        index: i,
        lp,
        vision,
        seen_relabel,
        asm: Assembler::new(o.mode, norm.clone(), relabel, o.rlif, act_dim),
        chunk_asm: ChunkAssembler::new(o.rlif),
        teleop,
        orx,
        weights,
        tap,
        msg: TeleopMsg {
            action: vec![0.0; act_dim],
            ..Default::default()
        },
        demos_left: if human.is_some() {
            demos_of(o.demos, o.robots.max(1), i)
        } else {
            0
        },
        human,
        count: PersonCount::default(),
        recorder,
        log,
        wire: WireStep::default(),
    })
}

/// Robot `i`'s simulated person (none with `--no-human`), with a seed of its own.
fn person(
    o: &DemoOptions,
    human_cfg: &HumanConfig,
    spec: &reflex_contracts::msg::RobotSpec,
    i: usize,
) -> Result<Option<SimHuman>> {
    // The person sees the whole scene, whatever the robot's state reports.
    let scene_spec = reflex_contracts::msg::RobotSpec {
        state: reflex_sim::env::state_fields(o.task),
        ..spec.clone()
    };
    let cfg = HumanConfig {
        seed: robot_seed(human_cfg.seed, i),
        ..human_cfg.clone()
    };
    Ok(o.human
        .then(|| SimHuman::new(&scene_spec, cfg))
        .transpose()?)
}

/// A robot's recordings under `dir` (with `--record`): every episode to Rerun, off the loop
/// (the recorder's own thread and bounded queue), and the step log.
fn records(
    o: &DemoOptions,
    dir: &Path,
    spec: &reflex_contracts::msg::RobotSpec,
) -> Result<(Option<Recorder>, Option<reflex_data::steplog::StepLog>)> {
    if !o.record {
        return Ok((None, None));
    }
    let recorder = reflex_agent::tap::make_recorder(
        Some(dir.join("episodes")),
        reflex_record::Live::Off,
        spec,
        true,
    )?;
    let log = reflex_data::steplog::StepLog::create(&dir.join("steps"), spec, &provenance(o))?;
    Ok((Some(recorder), Some(log)))
}

/// The step log's and the residual's provenance: the demo command with the task, the base, the
/// seed, the episodes, the mode, the `--config` file, `--vision` and `--robots` (not every
/// option).
fn provenance(o: &DemoOptions) -> String {
    let mut line = format!(
        "reflex demo --task {} --model {} --seed {} --episodes {} --mode {}",
        o.task.as_str(),
        o.model.display(),
        o.seed,
        o.episodes,
        mode_name(o.mode)
    );
    if let Some(c) = &o.config {
        line.push_str(&format!(" --config {}", c.display()));
    }
    if o.vision.is_some() {
        line.push_str(" --vision");
    }
    if o.robots > 1 {
        line.push_str(&format!(" --robots {}", o.robots));
    }
    line
}

/// The person's takeovers in the current episode, counted by the demo itself: in `full` mode the
/// learner's own commands share the teleop path, so the loop cannot tell them apart.
#[derive(Default)]
struct PersonCount {
    interventions: u32,
    steps: u32,
    before: bool,
}

impl PersonCount {
    fn note(&mut self, now: bool) {
        self.interventions += (now && !self.before) as u32;
        self.steps += now as u32;
        self.before = now;
    }
}

impl Rig {
    /// One control step of robot `a`: its person looks and acts, the loop steps, the learner
    /// takes the step and trains. Says whether an episode ended.
    fn step(&mut self, a: usize, o: &DemoOptions) -> Result<bool> {
        let Rig { arms, sac, norm } = self;
        let arm = &mut arms[a];
        arm.person_and_learner_act(o, sac, norm)?;
        let before = arm.lp.episodes().len();
        arm.lp.step()?;
        arm.learn_from_step(o, sac)?;
        Ok(arm.lp.episodes().len() > before)
    }

    /// Demonstrations the fleet's people still give before training.
    fn demos_left(&self) -> usize {
        self.arms.iter().map(|a| a.demos_left).sum()
    }
}

impl Arm {
    /// The steered policy alone on `o.eval_episodes` more episodes (noise mode, which keeps no
    /// residual file): nobody takes over, no training, the held-out seed stream (checked against
    /// training's in [`HeldOut`]); the steered policy still samples its noise from the actor's
    /// Gaussian.
    fn evaluate_alone(
        &mut self,
        o: &DemoOptions,
        progress: &dyn Progress,
    ) -> Result<Vec<reflex_runtime::control::EpisodeSummary>> {
        let dim = self.lp.robot().spec().action.dim();
        let msg = TeleopMsg {
            action: vec![0.0; dim],
            seq: u64::MAX / 2,
            ..Default::default()
        };
        self.teleop.send(&msg); // nobody drives from here on
        self.lp.set_residual_explore(false);
        self.lp
            .restart_with_seed(reflex_agent::heldout::held_out_seed(o.seed))?;
        let start = self.lp.episodes().len();
        progress.start(o.eval_episodes as u64, "held-out episodes");
        progress.message("the steered policy alone");
        while self.lp.episodes().len() - start < o.eval_episodes {
            let before = self.lp.episodes().len();
            self.lp.step()?;
            while let Some(tr) = self.orx.try_recv() {
                self.orx.recycle(tr);
            }
            if let Some(t) = &self.tap {
                while let Some(n) = t.try_recv() {
                    t.recycle(n);
                }
            }
            if self.lp.episodes().len() > before {
                progress.inc(1);
            }
        }
        progress.finish();
        self.lp.set_residual_explore(true);
        Ok(self.lp.episodes()[start..].to_vec())
    }

    /// The person looks at the robot and decides; in `full` mode the learner's own (exploring)
    /// action is the command, through the same teleop path (the loop has no base policy).
    fn person_and_learner_act(
        &mut self,
        o: &DemoOptions,
        sac: &mut Sac,
        norm: &ActionNorm,
    ) -> Result<()> {
        // The person looks at the scene (all of it, whatever the robot's state reports).
        let env = self.lp.robot().inner();
        let mut obs_now: Observation = env.obs().clone();
        obs_now.state.clear();
        obs_now.state.extend_from_slice(env.scene_state());
        let msg = &mut self.msg;
        match &mut self.human {
            Some(h) if self.demos_left > 0 => h.demonstrate(&obs_now, msg),
            Some(h) => h.act(&obs_now, msg),
            None => msg.intervene = false,
        }
        self.count.note(msg.intervene);
        if msg.intervene
            && let Some(r) = &mut self.seen_relabel
        {
            r.note_person(env.obs(), msg.action.len())?;
        }
        if o.mode == Mode::Full && !msg.intervene {
            let an = if (sac.counters.env_steps as usize) < sac.cfg.warmup_steps {
                sac.random_action()
            } else {
                sac.act(&obs_now.state, &[], false)?
            };
            let mut act = an.clone();
            norm.to_robot(&mut act);
            msg.action.copy_from_slice(&act);
            msg.intervene = true;
            msg.seq += 1;
            self.teleop.send(msg);
            msg.intervene = false;
        } else {
            self.teleop.send(msg);
        }
        Ok(())
    }

    /// Hands the step's transitions to the recorder and the learner, and trains.
    fn learn_from_step(&mut self, o: &DemoOptions, sac: &mut Sac) -> Result<()> {
        // The noise of a chunk the steered policy started in this step.
        let mut noise = self.tap.as_ref().and_then(|t| t.try_recv());
        let step = &mut self.wire;
        while let Some(mut tr) = self.orx.try_recv() {
            if let Some(v) = &mut self.vision
                && self.human.is_some()
            {
                v.judge_end(&mut tr, self.lp.robot().inner().ended_scene_success());
            }
            if let Some(r) = &self.recorder {
                r.record(&tr);
            }
            // In `full` mode the learner's own commands also travel the teleop path; only the
            // simulated person's are interventions.
            tr.to_wire(step);
            step.teleop = tr.source == Source::Teleop
                && (o.mode != Mode::Full || self.human.as_ref().is_some_and(|h| h.intervening()));
            if let Some(v) = &mut self.vision {
                v.maps_into(&tr, step);
            }
            if step.teleop
                && let Some(b) = self.seen_relabel.as_ref().and_then(|r| r.base.as_ref())
            {
                step.base.clone_from(b);
            }
            if let Some(l) = &mut self.log {
                let seed = self.lp.episodes().last().and_then(|e| e.seed);
                l.push(&tr, step.teleop, seed)?;
            }
            if o.mode == Mode::Noise {
                let before = self.chunk_asm.stored;
                self.chunk_asm.push(sac, step, noise.as_deref());
                if let (Some(n), Some(t)) = (noise.take(), &self.tap) {
                    t.recycle(n);
                }
                // One learner step per chunk transition (the learner's time runs in chunks).
                for _ in before..self.chunk_asm.stored {
                    sac.train_step()?;
                }
            } else {
                // Each robot is a stream of its own in the buffers (its episodes' rows link).
                self.asm.push_from(sac, self.index as u64, step)?;
            }
            self.orx.recycle(tr);
        }
        if o.mode != Mode::Noise {
            sac.train_step()?;
        }
        Ok(())
    }
}

/// Runs the demo; writes `summary.json`, `learning_curve.png`, `learning.rrd` and (when
/// recording) every episode under `runs/<run-id>/`. With `robots` > 1 the simulated robots take
/// turns stepping (each step its own learner steps, as for one robot) and feed one learner;
/// each takes the newest weights at the end of its own episodes.
pub fn run(o: &DemoOptions, progress: &dyn Progress) -> Result<DemoReport> {
    let t0 = Instant::now();
    check(o)?;
    reflex_learn::sac::gemm::set_threads(reflex_learn::sac::gemm::threads_for(o.threads));
    let Settings {
        learner: learner_cfg,
        human: human_cfg,
        sim,
    } = settings(o)?;
    let sim_text = sim_section(o, &sim)?;
    let dir = o
        .runs
        .join(reflex_agent::run_id(&format!("demo-seed{}", o.seed)));
    std::fs::create_dir_all(&dir).map_err(|e| AgentError::io(&dir, e))?;
    let mut rig = build_rig(o, learner_cfg, &human_cfg, sim, &dir)?;
    let spec = rig.arms[0].lp.robot().spec().clone();
    let t = train(&mut rig, o, progress)?;
    let (rows, average, n) = (t.rows, t.average.mean(), t.average.n);
    let wall = t0.elapsed().as_secs_f64();
    // Keep what was learned, then judge it alone on seeds training never saw.
    let ckpt = dir.join("learner.ckpt");
    rig.sac.save(&ckpt)?;
    let kept = keep_refined(o, &sim_text, &dir, &rig.sac, average.as_deref(), &spec)?;
    let judged = judge(o, &mut rig, kept.as_ref(), &sim_text, &dir, progress)?;
    let people = rig.finish();
    let mut r = summarize(
        o,
        &dir,
        rows,
        wall,
        &rig.sac,
        people.reasons,
        judged.held.as_ref(),
    )?;
    r.summary.checkpoint = Some(ckpt.display().to_string());
    if let Some((model, config)) = &kept {
        r.summary.residual = Some(model.display().to_string());
        r.summary.residual_averages_episodes = Some(n.max(1));
        r.summary.refined_config = Some(config.display().to_string());
    }
    // The headline is the policy alone on held-out seeds; training's figures keep their own
    // names (`success_rate_last_20`).
    r.summary.success_rate = judged.held.as_ref().map(|h| h.success_rate);
    r.summary.held_out = judged.held;
    if o.vision.is_none() {
        r.summary.base_held_out = judged.base_held.clone();
    }
    if let Some(v) = &o.vision {
        r.summary.vision = Some(VisionFigures {
            encoder: v.encoder.display().to_string(),
            classifier: v.classifier.display().to_string(),
            consecutive_frames: v.consecutive_frames,
            classifier_successes_confirmed: people.confirmed,
            classifier_successes_vetoed: people.vetoed,
            base_held_out: judged.base_held,
        });
    }
    let summary_file = dir.join("summary.json");
    let body =
        serde_json::to_vec_pretty(&serde_json::json!({ "summary": r.summary, "episodes": r.rows }))
            .expect("json of plain values");
    reflex_runtime::fsio::atomic_write(&summary_file, &body)
        .map_err(|e| AgentError::io(&summary_file, e))?;
    Ok(r)
}

/// Options that cannot run together, refused before anything is built.
fn check(o: &DemoOptions) -> Result<()> {
    if o.offline_updates > 0 && !(o.human && o.demos > 0) {
        return Err(AgentError::setup(
            "--offline-updates",
            "the offline updates train on the person's demonstrations, and this run has none (--no-human or --demos 0)",
        ));
    }
    if o.vision.is_some() && o.task != TaskKind::Pick {
        return Err(AgentError::setup(
            "--task",
            format!(
                "the pixel demo runs `pick` (its base policy, encoder and classifier are pick's), not `{}`",
                o.task.as_str()
            ),
        ));
    }
    if !matches!(o.task, TaskKind::Pick | TaskKind::Insert) {
        return Err(AgentError::setup(
            "--task",
            format!(
                "`{}`: the demo runs `pick` and `insert`, the tasks with a shipped base policy (models/pick.onnx, models/insert.onnx)",
                o.task.as_str()
            ),
        ));
    }
    if !(1..=MAX_ROBOTS).contains(&o.robots) {
        return Err(AgentError::setup(
            "--robots",
            format!(
                "{} robots: a demo fleet has 1 to {MAX_ROBOTS} (each is a simulator and two copies of the base policy in this process)",
                o.robots
            ),
        ));
    }
    Ok(())
}

/// The demonstrations, then the training episodes: the robots take turns stepping until the
/// fleet has run `o.episodes` training episodes.
fn train(rig: &mut Rig, o: &DemoOptions, progress: &dyn Progress) -> Result<Tally> {
    let mut t = Tally {
        rows: vec![],
        version: 0,
        rate: UpdateRate::new(rig.sac.counters.critic_updates),
        average: WeightMean::default(),
    };
    if rig.demos_left() > 0 {
        progress.start(rig.demos_left() as u64, "demonstrations");
        progress.message("the person demonstrates before training starts");
    } else {
        progress.start(o.episodes as u64, "episodes");
    }
    while t.rows.len() < o.episodes {
        let demonstrating = rig.demos_left() > 0;
        for a in 0..rig.arms.len() {
            // While the fleet's people demonstrate, a robot whose share is given waits.
            if demonstrating && rig.arms[a].demos_left == 0 {
                continue;
            }
            if rig.step(a, o)? {
                t.episode_ended(rig, a, o, progress)?;
            }
            if t.rows.len() >= o.episodes {
                break;
            }
        }
    }
    progress.finish();
    Ok(t)
}

/// The held-out evaluations: the refined policy alone, and for the pixel demo the base alone on
/// the same episodes.
struct Judged {
    held: Option<reflex_agent::heldout::HeldOut>,
    base_held: Option<reflex_agent::heldout::HeldOut>,
}

fn judge(
    o: &DemoOptions,
    rig: &mut Rig,
    kept: Option<&(PathBuf, PathBuf)>,
    sim_text: &str,
    dir: &Path,
    progress: &dyn Progress,
) -> Result<Judged> {
    let trained: Vec<reflex_runtime::control::EpisodeSummary> = rig
        .arms
        .iter()
        .flat_map(|a| a.lp.episodes().iter().cloned())
        .collect();
    // A run config judged as a robot would run it: `reflex run --config` in this process.
    let run = |config: &Path| -> Result<reflex_agent::heldout::HeldOut> {
        let cfg = reflex_agent::config::RunConfig::load(config)?;
        let report = reflex_agent::actor::run_config(&cfg, &Default::default(), progress)?;
        Ok(reflex_agent::heldout::HeldOut::of(
            &report.episodes,
            Some(&trained),
        ))
    };
    let held = match (kept, o.eval_episodes) {
        (_, 0) => None,
        // The kept files (fresh base policy, the residual read back from its file).
        (Some((_, config)), _) => {
            progress.message("the refined policy alone, from the kept files");
            Some(run(config)?)
        }
        (None, _) => {
            let alone = rig.arms[0].evaluate_alone(o, progress)?;
            Some(reflex_agent::heldout::HeldOut::of(&alone, Some(&trained)))
        }
    };
    // The pixel demo's base, and a state demo's base that reads images (an imported LeRobot
    // policy), are measured alone on the same held-out episodes: their starting point.
    let alone = rig.arms[0].seen_relabel.is_some();
    let base_held = match (alone, o.eval_episodes) {
        (true, n) if n > 0 => {
            progress.message("the base policy alone, on the same held-out episodes");
            Some(run(&keep_base(o, sim_text, dir)?)?)
        }
        _ => None,
    };
    Ok(Judged { held, base_held })
}

/// What the fleet's people did, summed over the robots.
struct People {
    reasons: Option<TakeoverReasons>,
    confirmed: u64,
    vetoed: u64,
}

impl Rig {
    /// Flushes every robot's recordings and sums what their people did.
    fn finish(&mut self) -> People {
        let mut p = People {
            reasons: None,
            confirmed: 0,
            vetoed: 0,
        };
        for arm in &mut self.arms {
            if let Some(r) = arm.recorder.take() {
                let st = r.finish();
                let dropped = st.dropped.load(std::sync::atomic::Ordering::Relaxed);
                if dropped > 0 {
                    tracing::warn!("the recorder dropped {dropped} steps (it fell behind)");
                }
            }
            if let Some(h) = &arm.human {
                p.reasons.get_or_insert_default().add(&h.reasons);
            }
            if let Some(v) = &arm.vision {
                p.confirmed += v.confirmed;
                p.vetoed += v.vetoed;
            }
        }
        p
    }
}

/// Keeps the refined policy as files a robot runs without a learner: the residual (ONNX and its
/// spec) and `refined.toml`, a run config of the base with that residual on the held-out seed
/// stream, so `reflex run --config refined.toml` runs the held-out evaluation again. Noise mode
/// steers a diffusion policy's noise and has no residual to keep (its checkpoint is kept).
fn keep_refined(
    o: &DemoOptions,
    sim: &str,
    dir: &std::path::Path,
    sac: &Sac,
    average: Option<&[f32]>,
    spec: &reflex_contracts::msg::RobotSpec,
) -> Result<Option<(PathBuf, PathBuf)>> {
    if o.mode == Mode::Noise {
        return Ok(None);
    }
    let model = dir.join("residual.onnx");
    let base = std::fs::canonicalize(&o.model).map_err(|e| AgentError::io(&o.model, e))?;
    let info = reflex_learn::sac::export::ExportInfo {
        name: &format!("{} residual, demo seed {}", o.task.as_str(), o.seed),
        action_low: &spec.action.low,
        action_high: &spec.action.high,
        base_model: Some(&base),
        provenance: provenance(o),
    };
    match average {
        Some(w) => reflex_learn::sac::export::write_residual_weights(sac, w, &info, &model)?,
        None => reflex_learn::sac::export::write_residual(sac, &info, &model)?,
    };
    let policy = match o.mode {
        Mode::Full => "kind = \"none\"".to_string(),
        _ => format!(
            "kind = \"onnx\"\nmodel = {:?}\nseed = {}",
            base.display().to_string(),
            o.seed
        ),
    };
    let rtc = match &o.rtc {
        Some(r) => format!(
            "[policy.rtc]\nenabled = true\nguidance = {}\n\n",
            r.guidance
        ),
        None => String::new(),
    };
    let text = format!(
        "# The refined policy of this demo run: the base policy with the residual its learner kept,\n\
         # no learner. `reflex run --config refined.toml` runs the demo's held-out episodes again;\n\
         # `reflex eval --config refined.toml` judges it on another held-out seed stream.\n\
         [robot]\nsource = \"sim\"\n\n{sim}\n[policy]\n{policy}\n\n\
         [policy.residual]\nmodel = \"residual.onnx\"\n\n{rtc}{run}",
        run = run_section(o),
    );
    let config = dir.join("refined.toml");
    reflex_runtime::fsio::atomic_write(&config, text.as_bytes())
        .map_err(|e| AgentError::io(&config, e))?;
    Ok(Some((model, config)))
}

/// The `[sim]` tables of a config that runs this demo's robot: `pick` on the physics the demo
/// trained on, spelled out so that the kept files keep running on it whatever the defaults
/// become, with the cameras when the base reads images, and for the pixel demo the arm's own
/// state.
fn sim_section(o: &DemoOptions, sim: &SimConfig) -> Result<String> {
    let solver = toml::to_string(&sim.solver)
        .map_err(|e| AgentError::setup("[sim.solver]", e.to_string()))?;
    let physics = format!(
        "physics_hz = {:?}\n\n[sim.solver]\n{solver}",
        sim.physics_hz
    );
    Ok(match &o.vision {
        // A base that reads images keeps its cameras in the kept configs too.
        None if sim.cameras.enabled => format!(
            "[sim]\ntask = \"{}\"\n{physics}\n[sim.cameras]\nenabled = true\nwidth = {}\nheight = {}\n",
            o.task.as_str(),
            sim.cameras.width,
            sim.cameras.height
        ),
        None => format!("[sim]\ntask = \"{}\"\n{physics}", o.task.as_str()),
        Some(v) => format!(
            "[sim]\ntask = \"pick\"\nstate = \"arm\"\n{physics}\n[sim.cameras]\nenabled = true\nwidth = {}\nheight = {}\n",
            v.camera_size.0, v.camera_size.1
        ),
    })
}

/// The `[run]` table of the held-out evaluation: the simulator's own success judges it.
fn run_section(o: &DemoOptions) -> String {
    format!(
        "\n[run]\nepisodes = {}\nseed = {}\nclock = \"sim\"\n",
        o.eval_episodes.max(1),
        reflex_agent::heldout::held_out_seed(o.seed)
    )
}

/// `base.toml`: the base policy alone on the held-out episodes `refined.toml` runs, the pixel
/// demo's starting point measured on the same seeds.
fn keep_base(o: &DemoOptions, sim: &str, dir: &Path) -> Result<PathBuf> {
    let base = std::fs::canonicalize(&o.model).map_err(|e| AgentError::io(&o.model, e))?;
    let text = format!(
        "# The base policy of this demo run alone, on the held-out episodes of refined.toml.\n\
         [robot]\nsource = \"sim\"\n\n{}\n[policy]\nkind = \"onnx\"\nmodel = {:?}\nseed = {}\n{}",
        sim,
        base.display().to_string(),
        o.seed,
        run_section(o)
    );
    let config = dir.join("base.toml");
    reflex_runtime::fsio::atomic_write(&config, text.as_bytes())
        .map_err(|e| AgentError::io(&config, e))?;
    Ok(config)
}

/// The demo's running count of episodes.
struct Tally {
    rows: Vec<EpisodeRow>,
    version: u64,
    rate: UpdateRate,
    /// The residual weights at the ends of the last [`keep_average`] episodes so far.
    average: WeightMean,
}

/// The mean of weight vectors of one layout, summed in f64.
#[derive(Default)]
struct WeightMean {
    sum: Vec<f64>,
    n: u32,
}

impl WeightMean {
    fn add(&mut self, w: &[f32]) {
        self.sum.resize(w.len(), 0.0);
        self.sum
            .iter_mut()
            .zip(w)
            .for_each(|(s, v)| *s += *v as f64);
        self.n += 1;
    }

    /// The mean, when more than one vector went in (one is the last weights themselves).
    fn mean(&self) -> Option<Vec<f32>> {
        (self.n > 1).then(|| {
            self.sum
                .iter()
                .map(|v| (v / self.n as f64) as f32)
                .collect()
        })
    }
}

impl Tally {
    /// An episode of robot `a` ended: a demonstration counted down (the last of the fleet's
    /// starts training), or a training episode recorded and the newest residual published to
    /// that robot (swapped in at its episode boundary).
    fn episode_ended(
        &mut self,
        rig: &mut Rig,
        a: usize,
        o: &DemoOptions,
        progress: &dyn Progress,
    ) -> Result<()> {
        let arm = &mut rig.arms[a];
        let removed = arm
            .vision
            .as_mut()
            .map_or(0.0, vision::VisionRig::take_removed_reward);
        if arm.demos_left > 0 {
            arm.demos_left -= 1;
            arm.count = PersonCount::default();
            progress.inc(1);
            if rig.arms.iter().all(|x| x.demos_left == 0) {
                progress.finish();
                if o.offline_updates > 0 {
                    progress.start(o.offline_updates as u64, "offline updates");
                    progress.message("the learner trains on the demonstrations alone");
                    for _ in 0..o.offline_updates {
                        rig.sac.train_offline()?;
                        progress.inc(1);
                    }
                    progress.finish();
                }
                progress.start(o.episodes as u64, "episodes");
            }
            return Ok(());
        }
        let e = arm.lp.episodes().last().expect("just finished").clone();
        // Learning from pixels the classifier's verdict is the reward, not the result: the row
        // says what the scene showed at the end.
        let (success, classifier_success) = match &arm.vision {
            Some(_) => (
                arm.lp
                    .robot()
                    .inner()
                    .ended_scene_success()
                    .unwrap_or(false),
                Some(e.success),
            ),
            None => (e.success, None),
        };
        self.rows.push(EpisodeRow {
            episode: self.rows.len(),
            robot: a,
            success,
            classifier_success,
            steps: e.steps,
            ret: e.ret - removed,
            interventions: arm.count.interventions,
            intervention_steps: arm.count.steps,
        });
        arm.count = PersonCount::default();
        let averaged = keep_average(o) > 1 && self.rows.len() + keep_average(o) > o.episodes;
        if arm.weights.is_some() || averaged {
            let w = export_actor(&rig.sac)?;
            if averaged {
                self.average.add(&w);
            }
            if let Some(wr) = &mut arm.weights {
                self.version += 1;
                wr.publish(self.version, &w);
            }
        }
        let ups = self.rate.per_s(rig.sac.counters.critic_updates);
        progress.message(&episode_line(&self.rows, ups));
        progress.inc(1);
        Ok(())
    }
}

/// Learner updates per second, measured over at least half a second.
struct UpdateRate {
    t: Instant,
    n: u64,
    per_s: f64,
}

impl UpdateRate {
    fn new(n: u64) -> Self {
        UpdateRate {
            t: Instant::now(),
            n,
            per_s: 0.0,
        }
    }

    fn per_s(&mut self, n: u64) -> f64 {
        let dt = self.t.elapsed().as_secs_f64();
        if dt > 0.5 {
            self.per_s = (n - self.n) as f64 / dt;
            self.t = Instant::now();
            self.n = n;
        }
        self.per_s
    }
}

/// The progress line: robot-alone success and takeovers over the last 20 episodes.
fn episode_line(rows: &[EpisodeRow], ups: f64) -> String {
    let last: Vec<&EpisodeRow> = rows.iter().rev().take(20).collect();
    let n = last.len() as f64;
    let sr = last
        .iter()
        .filter(|r| r.success && r.interventions == 0)
        .count() as f64
        / n;
    let ir = last.iter().filter(|r| r.interventions > 0).count() as f64 / n;
    format!(
        "success(20) {:>3.0}%  interventions(20) {:>3.0}%  {:>4.0} updates/s",
        sr * 100.0,
        ir * 100.0,
        ups
    )
}

fn window(v: &[f64], from: usize, to: usize) -> f64 {
    if to > from {
        v[from..to].iter().sum::<f64>() / (to - from) as f64
    } else {
        f64::NAN
    }
}

/// The learning curves: `learning_curve.png` (rolling success and takeovers, the held-out band)
/// and `learning.rrd`.
fn draw_curves(
    o: &DemoOptions,
    dir: &Path,
    rows: &[EpisodeRow],
    (succ, intv): (&[f64], &[f64]),
    held: Option<&reflex_agent::heldout::HeldOut>,
) -> Result<()> {
    let (s20, i20) = (rolling(succ, 20), rolling(intv, 20));
    let title = format!(
        "reflex demo, {} mode, seed {}{}",
        mode_name(o.mode),
        o.seed,
        if o.robots > 1 {
            format!(", {} robots", o.robots)
        } else {
            String::new()
        }
    );
    reflex_data::plot::curves_png(
        &dir.join("learning_curve.png"),
        &reflex_data::plot::Chart {
            title: &title,
            x_label: "training episode",
            y_label: "rate over the last 20 episodes (%)",
            series: &[
                reflex_data::plot::Series {
                    label: "success, robot alone",
                    values: &s20,
                    rgb: [30, 160, 60],
                },
                reflex_data::plot::Series {
                    label: "episodes with a takeover",
                    values: &i20,
                    rgb: [210, 50, 40],
                },
            ],
            band: held.map(|h| reflex_data::plot::Band {
                rate: h.success_rate,
                low: h.success_rate_wilson_95.0,
                high: h.success_rate_wilson_95.1,
                label: format!("held-out success, {} episodes (95% CI)", h.episodes),
            }),
        },
    )?;
    let points: Vec<reflex_record::LearningPoint> = rows
        .iter()
        .map(|r| reflex_record::LearningPoint {
            success: r.success && r.interventions == 0,
            intervened: r.interventions > 0,
            ret: r.ret,
            steps: r.steps,
        })
        .collect();
    reflex_record::write_learning_curves(&dir.join("learning.rrd"), &points, 20)?;
    Ok(())
}

fn summarize(
    o: &DemoOptions,
    dir: &Path,
    rows: Vec<EpisodeRow>,
    wall: f64,
    sac: &Sac,
    reasons: Option<TakeoverReasons>,
    held: Option<&reflex_agent::heldout::HeldOut>,
) -> Result<DemoReport> {
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
    draw_curves(o, dir, &rows, (&succ, &intv), held)?;
    let n = rows.len();
    let (first, last) = (
        window(&succ, 0, n.min(20)),
        window(&succ, n.saturating_sub(20), n),
    );
    let reached = first_full_window_reaching(&succ, 20, 0.9);
    let summary = DemoSummary {
        episodes: n,
        seed: o.seed,
        mode: mode_name(o.mode).into(),
        success_rate: None,
        success_rate_first_20: first,
        success_rate_last_20: last,
        success_with_assistance_first_20: window(&assisted, 0, n.min(20)),
        success_with_assistance_last_20: window(&assisted, n.saturating_sub(20), n),
        intervention_rate_first_20: window(&intv, 0, n.min(20)),
        intervention_rate_last_20: window(&intv, n.saturating_sub(20), n),
        episode_reaching_90pct_rolling_success: reached,
        robots: o.robots,
        episodes_per_robot_reaching_90pct: reached.map(|e| e as f64 / o.robots.max(1) as f64),
        wall_s: wall,
        learner_threads: reflex_learn::sac::gemm::threads(),
        env_steps: sac.counters.env_steps,
        updates: sac.counters.critic_updates,
        takeover_reasons: reasons,
        demonstrations: if o.human { o.demos } else { 0 },
        offline_updates: o.offline_updates,
        human: o.human,
        rlif: o.rlif,
        run_dir: dir.display().to_string(),
        learning_curve: dir.join("learning_curve.png").display().to_string(),
        learning_recording: dir.join("learning.rrd").display().to_string(),
        episode_recordings: o.record.then(|| dir.join("episodes").display().to_string()),
        checkpoint: None,
        residual: None,
        residual_averages_episodes: None,
        refined_config: None,
        held_out: None,
        base_held_out: None,
        vision: None,
    };
    Ok(DemoReport {
        dir: dir.to_path_buf(),
        summary,
        rows,
    })
}

/// The command-line spelling of a learner mode.
pub fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Residual => "residual",
        Mode::Full => "full",
        Mode::Noise => "noise",
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_rolling_figure_counts_only_full_windows() {
        // The summary once said "reached 90% at episode 1": a first success averaged over a
        // window of one episode.
        let mut xs = vec![1.0; 5];
        xs.extend([0.0; 3]);
        xs.extend([1.0; 30]);
        assert_eq!(first_full_window_reaching(&xs[..19], 20, 0.9), None);
        // Episodes 1-5 succeed, 6-8 fail, 9 on succeed: the first window of 20 with at most two
        // failures ends at episode 26 (episodes 7-26 hold only the failures of 7 and 8).
        assert_eq!(first_full_window_reaching(&xs, 20, 0.9), Some(26));
        assert_eq!(first_full_window_reaching(&[1.0; 20], 20, 0.9), Some(20));
        assert_eq!(first_full_window_reaching(&[0.0; 40], 20, 0.9), None);
    }

    use super::*;

    fn pixel_options(config: Option<PathBuf>) -> DemoOptions {
        let model = PathBuf::from("models/pick-seeing.onnx");
        DemoOptions {
            vision: Some(VisionDemo::beside(&model)),
            model,
            config,
            ..Default::default()
        }
    }

    #[test]
    fn the_pixel_demo_has_its_own_bound_and_bc_weight_and_a_config_replaces_each() {
        let state = settings(&DemoOptions::default()).unwrap().learner;
        let pixels = settings(&pixel_options(None)).unwrap().learner;
        assert_eq!(pixels.action_scale, VISION_ACTION_SCALE);
        assert_eq!(pixels.bc_weight, VISION_BC_WEIGHT);
        // The state demo keeps its own preset.
        assert_eq!(state.action_scale, 0.5);
        assert_eq!(state.bc_weight, 1.0);

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pixels.toml");
        std::fs::write(&file, "[learner]\nbc_weight = 1.0\n").unwrap();
        let over = settings(&pixel_options(Some(file))).unwrap().learner;
        // The key the file names replaces the demo's; the one it leaves out stays the demo's.
        assert_eq!(over.bc_weight, 1.0);
        assert_eq!(over.action_scale, VISION_ACTION_SCALE);
    }

    #[test]
    fn inserts_residual_leaves_the_gripper_alone_unless_a_file_sets_one_bound_for_all() {
        let insert = |config| DemoOptions {
            task: TaskKind::Insert,
            config,
            ..Default::default()
        };
        let l = settings(&insert(None)).unwrap().learner;
        assert_eq!(l.action_scales, [0.5, 0.5, 0.5, INSERT_GRIPPER_SCALE]);
        assert!(
            settings(&DemoOptions::default())
                .unwrap()
                .learner
                .action_scales
                .is_empty()
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("insert.toml");
        std::fs::write(&file, "[learner]\naction_scale = 0.1\n").unwrap();
        let l = settings(&insert(Some(file.clone()))).unwrap().learner;
        assert!(l.action_scales.is_empty() && l.action_scale == 0.1, "{l:?}");
        std::fs::write(&file, "[learner]\nutd = 2\n").unwrap();
        let l = settings(&insert(Some(file))).unwrap().learner;
        assert_eq!(l.action_scales, [0.5, 0.5, 0.5, INSERT_GRIPPER_SCALE]);
    }

    #[test]
    fn the_kept_average_is_the_mean_of_the_episodes_weights_and_one_episode_is_no_average() {
        let mut m = WeightMean::default();
        m.add(&[1.0, -2.0, 0.5]);
        assert_eq!(m.mean(), None, "one episode's weights are the last weights");
        m.add(&[3.0, 2.0, 0.25]);
        m.add(&[2.0, 3.0, 0.0]);
        assert_eq!(m.mean(), Some(vec![2.0, 1.0, 0.25]));
        // The window is the last K training episodes, never more than were trained.
        let o = |k, episodes| DemoOptions {
            keep_average: k,
            episodes,
            ..pixel_options(None)
        };
        assert_eq!(keep_average(&o(Some(10), 150)), 10);
        assert_eq!(keep_average(&o(Some(10), 4)), 4);
        assert_eq!(keep_average(&o(None, 150)), 1);
        assert_eq!(keep_average(&DemoOptions::default()), 1);
    }

    #[test]
    fn a_demo_config_sets_the_heads_keys_on_the_demos_encoder_and_only_for_the_pixel_demo() {
        let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../models");
        let model = models.join("pick-seeing.onnx");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("heads.toml");
        std::fs::write(
            &file,
            "[learner]\nbc_weight = 0.5\n\n[learner.vision]\nbc_trains_heads = false\nwidth = 64\nshift = 2\n",
        )
        .unwrap();
        let pixels = DemoOptions {
            vision: Some(VisionDemo::beside(&model)),
            model: model.clone(),
            config: Some(file.clone()),
            ..Default::default()
        };
        let l = settings(&pixels).unwrap().learner;
        let heads = l.vision.expect("the table's heads");
        assert!(!heads.bc_trains_heads);
        assert_eq!(heads.width, 64);
        assert_eq!(heads.shift, 2);
        assert_eq!(
            heads.embeddings, 8,
            "SERL's default where the table is silent"
        );
        // Resolved on the demo's encoder: its identity and map shapes.
        let default = vision::HeadKeys::default()
            .section(pixels.vision.as_ref().unwrap())
            .heads()
            .unwrap();
        assert_eq!(
            default.shift,
            vision::VISION_SHIFT,
            "the pixel demo shifts its maps"
        );
        assert_eq!(heads.encoder_id, default.encoder_id);
        assert_eq!(heads.features, default.features);
        assert_eq!(l.bc_weight, 0.5);

        // The state demo has no heads to set: refused, naming the file and the table.
        let state = DemoOptions {
            config: Some(file.clone()),
            ..Default::default()
        };
        let e = settings(&state).unwrap_err().to_string();
        assert!(
            e.contains("heads.toml") && e.contains("[learner.vision]"),
            "{e}"
        );
        // The encoder is the demo's (beside the base policy), not the table's; a range is checked.
        for (body, key) in [
            ("encoder = \"x.onnx\"", "encoder"),
            ("embeddings = 0", "embeddings"),
            ("width = \"wide\"", "width"),
            ("shift = 9", "shift"),
        ] {
            std::fs::write(&file, format!("[learner.vision]\n{body}\n")).unwrap();
            let e = settings(&pixels).unwrap_err().to_string();
            assert!(e.contains("heads.toml") && e.contains(key), "{e}");
        }
    }
    #[test]
    fn a_demo_configs_sim_table_sets_the_physics_and_keeps_the_demos_task_and_cameras() {
        use reflex_sim::world::ArmSolver;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("physics.toml");
        std::fs::write(
            &file,
            "[sim]\nphysics_hz = 100.0\n\n[sim.solver]\narm = \"reflex\"\npgs_iterations = 2\n",
        )
        .unwrap();
        let o = |vision: bool| DemoOptions {
            config: Some(file.clone()),
            ..if vision {
                pixel_options(None)
            } else {
                DemoOptions::default()
            }
        };
        for vision in [false, true] {
            let sim = settings(&o(vision)).unwrap().sim;
            assert_eq!(sim.physics_hz, 100.0);
            assert_eq!(sim.solver.arm, ArmSolver::Reflex);
            assert_eq!(sim.solver.pgs_iterations, 2);
            // Keys the table leaves out keep their defaults.
            assert_eq!(sim.solver.arm_substeps, 2);
            assert_eq!(sim.task, TaskKind::Pick);
            assert_eq!(sim.cameras.enabled, vision);
        }
        // Without a file the demo's physics are the simulator's defaults.
        let plain = settings(&DemoOptions::default()).unwrap().sim;
        assert_eq!(
            plain.physics_hz,
            SimConfig::for_task(TaskKind::Pick).physics_hz
        );
        // The kept files (refined.toml, base.toml) run on the physics the demo trained on.
        for vision in [false, true] {
            let sim = settings(&o(vision)).unwrap().sim;
            let text = sim_section(&o(vision), &sim).unwrap();
            let table: toml::Table = toml::from_str(&text).unwrap();
            let kept: SimConfig = table["sim"].clone().try_into().unwrap();
            assert_eq!(format!("{kept:?}"), format!("{sim:?}"), "{text}");
        }
        // A wrong key and a value out of range are refused, naming the file and the key.
        for (body, key) in [
            ("[sim]\ntask = \"reach\"\n", "task"),
            ("[sim.solver]\npgs = 2\n", "pgs"),
            ("[sim.solver]\npgs_iterations = 0\n", "pgs_iterations"),
            ("[sim]\nphysics_hz = 30.0\n", "physics_hz"),
        ] {
            std::fs::write(&file, body).unwrap();
            let e = settings(&o(false)).map(|_| ()).unwrap_err().to_string();
            assert!(e.contains("physics.toml") && e.contains(key), "{body}: {e}");
        }
    }
}
