//! The fixed-rate control loop.
//!
//! Each tick: wait for the deadline -> read the e-stop -> read the newest observation -> take new
//! chunks from the policy and ask for the next one -> choose the action (a person's command while
//! they intervene, otherwise the chunk's action plus the residual, otherwise hold) -> safety ->
//! command the robot -> hand the transition to the outbox. While the e-stop is latched or paused
//! a tick only commands the robot's hold (docs/runtime.md, "Stopping") and shows the held robot
//! to its watchers ([`crate::outbox::Held`]). Nothing on this path waits for inference, logging,
//! the network or the learner, and after warm-up nothing on it allocates (a test counts).

use crate::chunk::{ActionChunk, ChunkMode, ChunkQueue};
use crate::clock::Clock;
use crate::config::{Invalid, Validate, in_range, key};
use crate::features::LoopFeatures;
use crate::hist::Histogram;
use crate::kinematics::Chain;
use crate::msg::{LoopFigures, Observation, RobotSpec};
use crate::outbox::{Frames, Held, OutboxSender, Source};
use crate::policy::{ChunkSpec, PastObs, Policy, PolicyThread};
use crate::residual::ResidualHook;
use crate::robot::{Robot, RobotError};
use crate::safety::{Safety, SafetyConfig, SafetyCounters, SafetyEvent, SafetyInput};
use crate::schedule::{CatchUp, Schedule};
use crate::teleop::TeleopReader;
use crate::triple::Writer;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use reflex_contracts::stop::{StopState, StopSwitch};
use serde::Deserialize;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

fn d_catch_up() -> CatchUp {
    CatchUp::Skip
}
fn d_chunks() -> ChunkMode {
    ChunkMode::NewestWins
}
fn d_capacity() -> usize {
    8
}
fn d_status() -> f64 {
    200.0
}

/// `[loop]` in a config.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoopConfig {
    /// Loop rate, Hz (10-1000).
    pub hz: f64,
    /// What to do after an overrun.
    #[serde(default = "d_catch_up")]
    pub catch_up: CatchUp,
    /// How chunks are executed: `{ mode = "newest_wins" }`, `{ mode = "ensemble", m = 0.01 }` or
    /// `{ mode = "wait" }` (synchronous: the robot holds while each chunk is computed).
    #[serde(default = "d_chunks")]
    pub chunks: ChunkMode,
    /// Chunks kept for ensembling.
    #[serde(default = "d_capacity")]
    pub chunk_capacity: usize,
    /// How often the loop publishes a status snapshot, ms.
    #[serde(default = "d_status")]
    pub status_period_ms: f64,
    /// Real-time settings of the loop thread.
    #[serde(default)]
    pub rt: crate::rt::RtConfig,
    /// Spin (instead of sleeping) for the last part of each wait, us (wall clock only).
    #[serde(default = "d_spin")]
    pub spin_us: f64,
}

fn d_spin() -> f64 {
    50.0
}

impl LoopConfig {
    /// Defaults at `hz`.
    pub fn at(hz: f64) -> Self {
        LoopConfig {
            hz,
            catch_up: d_catch_up(),
            chunks: d_chunks(),
            chunk_capacity: d_capacity(),
            status_period_ms: d_status(),
            rt: Default::default(),
            spin_us: d_spin(),
        }
    }

    /// The period.
    pub fn period(&self) -> Duration {
        Duration::from_secs_f64(1.0 / self.hz)
    }
}

impl Validate for LoopConfig {
    fn validate(&self, p: &str) -> Result<(), Invalid> {
        in_range(p, "hz", self.hz, 10.0, 1000.0)?;
        in_range(p, "chunk_capacity", self.chunk_capacity, 1, 64)?;
        in_range(p, "status_period_ms", self.status_period_ms, 10.0, 60_000.0)?;
        in_range(p, "spin_us", self.spin_us, 0.0, 1000.0)?;
        if let ChunkMode::Ensemble { m } = self.chunks {
            in_range(&key(p, "chunks"), "m", m, 0.0, 10.0)?;
        }
        if let Some(prio) = self.rt.fifo_priority {
            in_range(&key(p, "rt"), "fifo_priority", prio, 1, 99)?;
        }
        Ok(())
    }
}

/// How the policy runs.
pub enum PolicyDriver {
    /// On its own thread (real time).
    Thread(PolicyThread),
    /// Called by the loop when a chunk is due (simulated time only).
    Inline {
        /// The policy.
        policy: Box<dyn Policy>,
        /// Its output buffer.
        chunk: ActionChunk,
        /// Ticks between computing a chunk and executing it: 0 for an inline policy; more to
        /// stand for a slow policy in simulated time (`reflex bench rtc`).
        delay: u32,
        /// When the chunk in flight is handed over (`delay > 0`).
        due: Option<Duration>,
        /// What the loop executes meanwhile, for a policy that wants it.
        prefix: Vec<f32>,
    },
    /// No base policy: the loop holds unless a person drives.
    None,
}

impl PolicyDriver {
    /// Runs `policy` inline (for simulated time).
    pub fn inline(policy: Box<dyn Policy>) -> Self {
        Self::inline_delayed(policy, 0)
    }

    /// Runs `policy` inline, each chunk handed to the loop `delay` ticks after the observation
    /// it was computed from, as a policy that takes that long would: a slow policy's latency
    /// made exact and reproducible in simulated time. With it the loop gathers what it executes
    /// meanwhile for a policy that wants it (real-time chunking) and asks early (the start
    /// threshold), as for a policy thread.
    pub fn inline_delayed(policy: Box<dyn Policy>, delay: u32) -> Self {
        let s = policy.chunk_spec();
        let mut chunk = ActionChunk::with_capacity(s.len, s.dim);
        chunk.data.resize(s.len * s.dim, 0.0);
        let prefix = vec![
            0.0;
            if policy.wants_prefix() {
                s.len * s.dim
            } else {
                0
            }
        ];
        PolicyDriver::Inline {
            policy,
            chunk,
            delay,
            due: None,
            prefix,
        }
    }

    fn spec(&self) -> Option<ChunkSpec> {
        match self {
            PolicyDriver::Thread(t) => Some(t.spec()),
            PolicyDriver::Inline { policy, .. } => Some(policy.chunk_spec()),
            PolicyDriver::None => None,
        }
    }

    fn past_steps(&self) -> usize {
        match self {
            PolicyDriver::Thread(t) => t.past_steps(),
            PolicyDriver::Inline { policy, .. } => policy.past_steps(),
            PolicyDriver::None => 0,
        }
    }
}

/// Timing and counters of the loop.
#[derive(Clone, Debug, Default)]
pub struct LoopStats {
    /// Wake-up lateness (time between the deadline and the start of the step).
    pub lateness: Histogram,
    /// Time from wake-up to the end of the step (the loop's own work plus the robot I/O).
    pub step: Histogram,
    /// Steps run.
    pub ticks: u64,
    /// Steps that ended after the next deadline.
    pub overruns: u64,
    /// Ticks skipped after overruns.
    pub missed: u64,
    /// Steps that held because no chunk covered the time.
    pub holds_no_chunk: u64,
    /// Chunks received from the policy.
    pub chunks: u64,
    /// Chunks discarded because they came from before a reset or a hand-back.
    pub stale_chunks: u64,
    /// Steps driven by a person.
    pub teleop_steps: u64,
    /// Episodes finished.
    pub episodes: u64,
    /// Residual weight version in use.
    pub residual_version: u64,
    /// Time the robot took to reset (a real arm moving to its start pose): not part of any
    /// step's time, and the schedule restarts after it, so it is not counted as missed ticks.
    pub reset: Histogram,
    /// Ticks held because the e-stop was latched (no episode in progress).
    pub stopped_ticks: u64,
    /// Ticks held after a release, waiting for an operator to resume.
    pub paused_ticks: u64,
    /// A person's labels and reset requests refused because the e-stop was latched or paused.
    pub refused_while_stopped: u64,
    /// Resets (moves to a start pose) the e-stop interrupted.
    pub resets_stopped: u64,
}

/// A low-rate snapshot for the status publisher.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoopStatus {
    /// The loop's figures, as [`crate::msg::StatusMsg`] carries them.
    pub figures: LoopFigures,
    /// Safety counters.
    pub safety: SafetyCounters,
    /// The e-stop as the loop last saw it.
    pub stop: StopState,
}

/// How an episode went.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EpisodeSummary {
    /// Episode counter of the robot.
    pub episode: u64,
    /// Seed it was reset with.
    pub seed: Option<u64>,
    /// Steps.
    pub steps: u32,
    /// Sum of rewards.
    pub ret: f32,
    /// Success (from the task, or a person's label).
    pub success: bool,
    /// Times a person took over.
    pub interventions: u32,
    /// Steps a person drove.
    pub intervention_steps: u32,
    /// Ended by a person's label or reset rather than by the robot.
    pub labelled: bool,
    /// Ended by the robot's time limit.
    pub truncated: bool,
    /// Ended by an emergency stop (neither a success nor a failure of the task).
    pub estop: bool,
    /// FNV-1a hash of the bits of every state, action, next state and reward of the episode, in
    /// order: two runs with equal digests saw bit-identical episodes.
    pub digest: u64,
}

/// FNV-1a offset basis: the digest of an empty episode.
pub const DIGEST_START: u64 = 0xcbf2_9ce4_8422_2325;

/// Folds `bytes` into an FNV-1a hash.
pub fn digest_bytes(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Folds the bit patterns of `xs` into an FNV-1a hash (no allocation).
pub fn digest_f32(h: u64, xs: &[f32]) -> u64 {
    xs.iter()
        .fold(h, |h, x| digest_bytes(h, &x.to_bits().to_le_bytes()))
}

/// What a person asked for in one tick.
#[derive(Clone, Copy, Debug, Default)]
struct PersonInput {
    /// `Some(true)`: success, `Some(false)`: failure.
    label: Option<bool>,
    /// A reset.
    reset: bool,
}

impl PersonInput {
    /// Whether the step `after` closes is its episode's last (the robot's end, or the person's
    /// label or reset): that observation's frames are kept whatever the frame rate, since a
    /// success is seen there.
    fn ends(&self, after: &Observation) -> bool {
        after.terminated || after.truncated || self.label.is_some() || self.reset
    }
}

/// The part of the observation that closes a step (state, reward, end flags), copied without
/// the images.
#[derive(Clone, Debug, Default)]
struct StepOutcome {
    state: Vec<f32>,
    reward: f32,
    terminated: bool,
    truncated: bool,
    success: bool,
    success_score: Option<f32>,
}

impl StepOutcome {
    fn copy_from(&mut self, o: &Observation) {
        self.state.clone_from(&o.state);
        self.reward = o.reward;
        self.terminated = o.terminated;
        self.truncated = o.truncated;
        self.success = o.success;
        self.success_score = o.success_score;
    }
}

/// Errors that stop the loop.
#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    /// The robot failed.
    #[error(transparent)]
    Robot(#[from] RobotError),
    /// The policy's chunks do not fit the robot.
    #[error(
        "policy chunk dimension {policy} does not match robot `{robot}` action dimension {want}"
    )]
    Dim {
        /// Policy action dimension.
        policy: usize,
        /// Robot name.
        robot: String,
        /// Robot action dimension.
        want: usize,
    },
    /// The config is out of range.
    #[error("loop config: key `{}` = {} is out of range; allowed: {}", .0.key, .0.value, .0.allowed)]
    Config(Invalid),
    /// An episode was asked to start while the e-stop is latched.
    #[error(
        "robot `{robot}`: the emergency stop is latched (raised by {by}): release it (`reflex estop release`) before an episode can start"
    )]
    Latched {
        /// Robot name.
        robot: String,
        /// Who raised it.
        by: String,
    },
}

/// The control loop of one robot.
pub struct ControlLoop<R: Robot, C: Clock> {
    robot: R,
    clock: C,
    cfg: LoopConfig,
    schedule: Schedule,
    driver: PolicyDriver,
    chunk_spec: Option<ChunkSpec>,
    /// The steps before the current observation, for a policy that reads a history.
    past: PastObs,
    chunks: ChunkQueue,
    safety: Safety,
    residual: Option<Box<dyn ResidualHook>>,
    teleop: Option<TeleopReader>,
    outbox: Option<OutboxSender>,
    frames: Option<(OutboxSender<Frames>, u32)>,
    held: Option<(OutboxSender<Held>, u32)>,
    /// Ticks held since the loop started (the held pool's cadence counts them).
    held_ticks: u64,
    features: Option<LoopFeatures>,
    swap_at_episode: bool,
    status: Option<Writer<LoopStatus>>,
    spec: RobotSpec,
    obs: Observation,
    after: StepOutcome,
    step_open: bool,
    open_tr: Option<Box<crate::outbox::Transition>>,
    base: Vec<f32>,
    res: Vec<f32>,
    action: Vec<f32>,
    hold: Vec<f32>,
    ee_field: Option<Range<usize>>,
    joint_field: Option<Range<usize>>,
    generation: u64,
    last_obs_key: (u64, u32, u64, u64),
    last_obs_change: Duration,
    last_policy_ok: Duration,
    last_teleop_change: Duration,
    teleop_seq: u64,
    teleop_seen: bool,
    /// The teleop channel's button presses the loop has acted on.
    teleop_presses: crate::teleop::Presses,
    /// A new episode began: the presses taken at its first look are not its own.
    teleop_resync: bool,
    intervening: bool,
    request_pending: bool,
    /// This tick's deadline: where a waiting robot's chunk starts (its wake-up time jitters).
    deadline: Duration,
    chunk_age: Duration,
    policy_latency: Duration,
    latency: crate::policy::LatencyWindow,
    stats: LoopStats,
    last_status: (Duration, u64),
    seeds: ChaCha8Rng,
    episode: EpisodeSummary,
    finished: Vec<EpisodeSummary>,
    /// Time spent in robot resets during the current tick.
    reset_took: Duration,
    /// An episode is in progress (between a completed reset and its end).
    episode_open: bool,
    /// The seed of a reset the e-stop interrupted: the next start uses it again.
    pending_seed: Option<u64>,
    stop: Arc<StopSwitch>,
    /// E-stops raised as of the last tick: a higher count is a new e-stop.
    seen_raises: u64,
}

/// Builds a [`ControlLoop`]: `ControlLoop::builder(robot, clock).policy(driver).seed(7).build()`.
pub struct ControlLoopBuilder<R: Robot, C: Clock> {
    robot: R,
    clock: C,
    cfg: Option<LoopConfig>,
    safety: SafetyConfig,
    driver: PolicyDriver,
    chain: Option<Chain>,
    seed: u64,
    residual: Option<Box<dyn ResidualHook>>,
    swap_at_episode: bool,
    teleop: Option<TeleopReader>,
    outbox: Option<OutboxSender>,
    frames: Option<(OutboxSender<Frames>, u32)>,
    held: Option<(OutboxSender<Held>, u32)>,
    features: Option<LoopFeatures>,
    status: Option<Writer<LoopStatus>>,
    stop: Option<Arc<StopSwitch>>,
}

impl<R: Robot, C: Clock> ControlLoopBuilder<R, C> {
    /// Rate, chunk handling, real-time settings (default: the robot's rate, clamped to
    /// 10-1000 Hz, and the defaults of [`LoopConfig`]).
    pub fn config(mut self, cfg: LoopConfig) -> Self {
        self.cfg = Some(cfg);
        self
    }

    /// The safety layer's limits (default: [`SafetyConfig::default`]).
    pub fn safety(mut self, safety: SafetyConfig) -> Self {
        self.safety = safety;
        self
    }

    /// How the base policy runs (default: none, the loop holds unless a person drives).
    pub fn policy(mut self, driver: PolicyDriver) -> Self {
        self.driver = driver;
        self
    }

    /// The arm's kinematics: enables the workspace check for joint action spaces.
    pub fn chain(mut self, chain: Option<Chain>) -> Self {
        self.chain = chain;
        self
    }

    /// Seed of the sequence of episode seeds (default 0).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// A residual added to the base action; `swap_at_episode` takes new weights only as an
    /// episode starts (otherwise at any step).
    pub fn residual(mut self, hook: Box<dyn ResidualHook>, swap_at_episode: bool) -> Self {
        self.residual = Some(hook);
        self.swap_at_episode = swap_at_episode;
        self
    }

    /// A person's input.
    pub fn teleop(mut self, reader: TeleopReader) -> Self {
        self.teleop = Some(reader);
        self
    }

    /// Where every step goes (recorder, bus, learner).
    pub fn outbox(mut self, outbox: OutboxSender) -> Self {
        self.outbox = Some(outbox);
        self
    }

    /// Camera frames of every `every`-th step (nothing for robots without cameras).
    pub fn frames(mut self, frames: OutboxSender<Frames>, every: u32) -> Self {
        self.frames = Some((frames, every.max(1)));
        self
    }

    /// The robot as every `every`-th held tick saw it (no episode: the e-stop holds it), with
    /// the images at the frames' cadence ([`ControlLoopBuilder::frames`]): for watchers of the
    /// live robot, which the outbox's steps stop feeding while it is stopped.
    pub fn held(mut self, held: OutboxSender<Held>, every: u32) -> Self {
        self.held = Some((held, every.max(1)));
        self
    }

    /// A frozen image encoder's feature maps beside the state, for a residual that sees: the
    /// residual reads the state followed by the maps of the same observation (nothing while they
    /// are missing or stale), and each transition carries the maps of its two observations.
    pub fn features(mut self, features: LoopFeatures) -> Self {
        self.features = Some(features);
        self
    }

    /// Status snapshots.
    pub fn status(mut self, writer: Writer<LoopStatus>) -> Self {
        self.status = Some(writer);
        self
    }

    /// The e-stop this loop obeys, shared with whoever raises, releases and resumes it (the
    /// bus, a teleop device, a test); default: a switch of its own ([`ControlLoop::stop_switch`]).
    /// The robot gets it too ([`Robot::attach_stop`]).
    pub fn stop_switch(mut self, stop: Arc<StopSwitch>) -> Self {
        self.stop = Some(stop);
        self
    }

    /// Checks the settings against the robot and builds the loop.
    pub fn build(self) -> Result<ControlLoop<R, C>, LoopError> {
        let hz = self.robot.spec().control_hz;
        let cfg = self
            .cfg
            .unwrap_or_else(|| LoopConfig::at(hz.clamp(10.0, 1000.0)));
        let mut lp = ControlLoop::new(
            self.robot,
            self.clock,
            cfg,
            self.safety,
            self.driver,
            self.chain,
            self.seed,
        )?;
        lp.residual = self.residual;
        lp.swap_at_episode = self.swap_at_episode;
        lp.teleop = self.teleop;
        lp.outbox = self.outbox;
        lp.frames = self.frames;
        lp.held = self.held;
        lp.features = self.features;
        lp.status = self.status;
        if let Some(stop) = self.stop {
            lp.seen_raises = stop.raises();
            lp.stop = stop;
        }
        lp.robot.attach_stop(lp.stop.clone());
        Ok(lp)
    }
}

impl<R: Robot, C: Clock> ControlLoop<R, C> {
    /// A builder for a loop driving `robot` on `clock`; everything else has a default.
    pub fn builder(robot: R, clock: C) -> ControlLoopBuilder<R, C> {
        ControlLoopBuilder {
            robot,
            clock,
            cfg: None,
            safety: SafetyConfig::default(),
            driver: PolicyDriver::None,
            chain: None,
            seed: 0,
            residual: None,
            swap_at_episode: false,
            teleop: None,
            outbox: None,
            frames: None,
            held: None,
            features: None,
            status: None,
            stop: None,
        }
    }

    fn new(
        robot: R,
        clock: C,
        cfg: LoopConfig,
        safety: SafetyConfig,
        driver: PolicyDriver,
        chain: Option<Chain>,
        seed: u64,
    ) -> Result<Self, LoopError> {
        cfg.validate("loop").map_err(LoopError::Config)?;
        safety.validate("safety").map_err(LoopError::Config)?;
        let spec = robot.spec().clone();
        let dim = spec.action.dim();
        let chunk_spec = driver.spec();
        if let Some(cs) = chunk_spec
            && cs.dim != dim
        {
            return Err(LoopError::Dim {
                policy: cs.dim,
                robot: spec.name.clone(),
                want: dim,
            });
        }
        let len = chunk_spec.map_or(1, |c| c.len);
        let start = clock.now();
        Ok(ControlLoop {
            schedule: Schedule::new(cfg.period(), cfg.catch_up, start),
            chunks: ChunkQueue::new(cfg.chunk_capacity, len, dim, cfg.chunks),
            safety: Safety::new(safety, &spec.action, chain),
            residual: None,
            teleop: None,
            outbox: None,
            frames: None,
            held: None,
            held_ticks: 0,
            features: None,
            swap_at_episode: false,
            status: None,
            obs: Observation {
                state: vec![0.0; spec.state_dim()],
                ..Default::default()
            },
            after: StepOutcome {
                state: vec![0.0; spec.state_dim()],
                ..Default::default()
            },
            step_open: false,
            open_tr: None,
            base: vec![0.0; dim],
            res: vec![0.0; dim],
            action: vec![0.0; dim],
            hold: vec![0.0; dim],
            ee_field: spec.field("ee_pos"),
            joint_field: spec.field("joint_pos"),
            generation: 0,
            last_obs_key: (u64::MAX, 0, 0, 0),
            last_obs_change: start,
            last_policy_ok: start,
            last_teleop_change: start,
            teleop_seq: 0,
            teleop_seen: false,
            teleop_presses: Default::default(),
            teleop_resync: false,
            intervening: false,
            request_pending: false,
            deadline: Duration::ZERO,
            chunk_age: Duration::ZERO,
            policy_latency: Duration::ZERO,
            latency: Default::default(),
            stats: LoopStats::default(),
            last_status: (start, 0),
            seeds: ChaCha8Rng::seed_from_u64(seed),
            episode: EpisodeSummary::default(),
            finished: Vec::new(),
            reset_took: Duration::ZERO,
            episode_open: false,
            pending_seed: None,
            stop: StopSwitch::new(),
            seen_raises: 0,
            chunk_spec,
            past: PastObs::new(driver.past_steps()),
            spec,
            driver,
            robot,
            clock,
            cfg,
        })
    }

    /// The residual samples around the learner's action (`true`, training) or takes its mean
    /// (`false`, evaluation); from the next step on.
    pub fn set_residual_explore(&mut self, on: bool) {
        if let Some(r) = &mut self.residual {
            r.set_explore(on);
        }
    }

    /// Raises the emergency stop (as an `estop` event on the bus does): from the next tick the
    /// robot holds, the episode in progress ends as `estop`, and nothing starts until an operator
    /// releases and resumes ([`StopSwitch`]).
    pub fn estop(&mut self) {
        self.stop.raise("local");
    }

    /// The e-stop this loop obeys.
    pub fn stop_switch(&self) -> &Arc<StopSwitch> {
        &self.stop
    }

    /// Whether an episode is in progress (false while the e-stop holds the robot between
    /// episodes).
    pub fn in_episode(&self) -> bool {
        self.episode_open
    }

    /// The robot.
    pub fn robot(&self) -> &R {
        &self.robot
    }

    /// The robot, mutably.
    pub fn robot_mut(&mut self) -> &mut R {
        &mut self.robot
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Timing and counters.
    pub fn stats(&self) -> &LoopStats {
        &self.stats
    }

    /// Safety counters.
    pub fn safety_counters(&self) -> SafetyCounters {
        self.safety.counters()
    }

    /// The feature maps beside the state, if the residual sees (for their counters).
    pub fn features(&self) -> Option<&LoopFeatures> {
        self.features.as_ref()
    }

    /// The outbox, if any (for its counters).
    pub fn outbox(&self) -> Option<&OutboxSender> {
        self.outbox.as_ref()
    }

    /// The camera frames' pool, when frames are handed out.
    pub fn frame_pool(&self) -> Option<&OutboxSender<Frames>> {
        self.frames.as_ref().map(|(f, _)| f)
    }

    /// Episodes finished so far.
    pub fn episodes(&self) -> &[EpisodeSummary] {
        &self.finished
    }

    /// The last action sent to the robot.
    pub fn last_action(&self) -> &[f32] {
        &self.action
    }

    /// Whether a person is driving.
    pub fn intervening(&self) -> bool {
        self.intervening
    }

    /// Draws episode seeds from a new stream seeded with `seed` and restarts the episode in
    /// progress with the first of them (an evaluation on held-out seeds after training; the
    /// unfinished episode is not counted).
    pub fn restart_with_seed(&mut self, seed: u64) -> Result<(), LoopError> {
        self.seeds = ChaCha8Rng::seed_from_u64(seed);
        self.pending_seed = None;
        self.episode_open = false;
        self.step_open = false;
        self.start_if_running()
    }

    /// Starts a new episode now (resets the robot with the next seed), as a person's deliberate
    /// act: refused while the e-stop is latched; after a release it resumes the run.
    pub fn start_episode(&mut self) -> Result<(), LoopError> {
        match self.stop.state() {
            StopState::Latched => {
                return Err(LoopError::Latched {
                    robot: self.spec.name.clone(),
                    by: self.stop.raised_by(),
                });
            }
            StopState::Paused => {
                let _ = self.stop.resume(self.stop.raises(), "local");
            }
            StopState::Running => {}
        }
        self.seen_raises = self.stop.raises();
        self.begin_episode()
    }

    /// Starts the next episode when the e-stop allows it (the loop's own starts).
    fn start_if_running(&mut self) -> Result<(), LoopError> {
        if self.stop.may_move() && self.stop.raises() == self.seen_raises {
            self.begin_episode()
        } else {
            Ok(())
        }
    }

    fn begin_episode(&mut self) -> Result<(), LoopError> {
        let seed: u64 = match self.pending_seed.take() {
            Some(s) => s,
            None => self.seeds.random(),
        };
        let before = self.clock.now();
        let reset = self.robot.reset(Some(seed));
        let now = self.clock.now();
        let took = now.saturating_sub(before);
        self.stats.reset.record(took);
        self.reset_took = self.reset_took.saturating_add(took);
        if !took.is_zero() {
            // A tick about to start is due now, not when it was due before the reset.
            self.schedule.restart(now);
        }
        match reset {
            Ok(o) => {
                self.past.note(&self.obs, o);
                self.obs.copy_from(o);
            }
            Err(RobotError::Stopped { .. }) => {
                // The e-stop cut the move to the start pose short: no episode; the same seed
                // is used when the run goes on.
                self.stats.resets_stopped += 1;
                self.pending_seed = Some(seed);
                self.episode_open = false;
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        }
        self.generation += 1;
        self.chunks.clear();
        self.request_pending = false;
        self.last_policy_ok = now;
        self.last_obs_change = now;
        self.last_obs_key = (
            self.obs.episode,
            self.obs.step,
            self.obs.seq,
            self.obs.time_ns,
        );
        self.safety.reset();
        if let PolicyDriver::Inline { policy, due, .. } = &mut self.driver {
            policy.reset();
            *due = None;
        }
        self.step_open = false;
        self.teleop_resync = true;
        self.episode = EpisodeSummary {
            episode: self.obs.episode,
            seed: Some(seed),
            digest: DIGEST_START,
            ..Default::default()
        };
        self.episode_open = true;
        Ok(())
    }

    /// Ends the episode in progress and starts the next one unless the e-stop holds the robot.
    fn end_episode(&mut self, success: bool, labelled: bool) -> Result<(), LoopError> {
        self.episode.success = success;
        self.episode.labelled = labelled;
        self.stats.episodes += 1;
        tracing::debug!(
            "episode {} ended after {} steps: success {}, return {:.2}",
            self.episode.episode,
            self.episode.steps,
            success,
            self.episode.ret
        );
        self.finished.push(self.episode.clone());
        self.episode_open = false;
        self.step_open = false;
        self.start_if_running()
    }

    fn push_chunk(&mut self, t: Duration) {
        let waiting = self.cfg.chunks == ChunkMode::Wait;
        let execute = self.chunk_spec.map_or(0, |cs| cs.execute.min(cs.len));
        match &mut self.driver {
            PolicyDriver::Thread(pt) => {
                while let Some(c) = pt.poll() {
                    if c.generation == self.generation {
                        if waiting {
                            // The robot waited: the chunk starts at this tick, at its first
                            // action, and ends after the actions it executes. Timed from the
                            // tick's deadline, not its wake-up, so a later tick that wakes less
                            // late still indexes the next row (not the same one again).
                            self.chunks.push_from(&c.chunk, self.deadline, execute);
                        } else {
                            self.chunks.push(&c.chunk);
                        }
                        self.policy_latency = c.latency;
                        // On the loop's clock, from the request to this tick: the rows of the
                        // chunk already in the past, hand-over included.
                        self.latency.push(t.saturating_sub(c.chunk.t_start));
                        self.stats.chunks += 1;
                        self.request_pending = false;
                    } else {
                        self.stats.stale_chunks += 1;
                    }
                }
            }
            PolicyDriver::Inline { chunk, due, .. } if due.is_some_and(|at| t >= at) => {
                *due = None;
                self.latency.push(t.saturating_sub(chunk.t_start));
                if waiting {
                    // The robot waited: the chunk starts at this tick, at its first action.
                    chunk.t_start = self.deadline;
                }
                self.chunks.push(chunk);
                self.stats.chunks += 1;
                self.request_pending = false;
            }
            PolicyDriver::Inline { .. } | PolicyDriver::None => {}
        }
    }

    fn maybe_request(&mut self, t: Duration) {
        let Some(cs) = self.chunk_spec else { return };
        // A thread delivers its chunk a tick or more after the request; an inline policy answers
        // at once (or, delayed, exactly `delay` ticks later).
        let lead = matches!(self.driver, PolicyDriver::Thread(_)) as usize;
        let waiting = self.cfg.chunks == ChunkMode::Wait;
        let delayed = match &self.driver {
            PolicyDriver::Inline { due: Some(_), .. } => return, // one chunk in flight
            PolicyDriver::Inline { delay, .. } => *delay > 0,
            _ => false,
        };
        // A waiting robot's chunks end after the actions they execute.
        let len = if waiting {
            cs.execute.min(cs.len)
        } else {
            cs.len
        };
        // A threaded policy is also asked when the executing chunk's remaining actions fall to
        // what its recent inference times need (the start threshold), so a slow policy's chunk
        // arrives before the loop runs out of actions while the policy keeps up.
        let dt = self.schedule.period();
        let delay = self.latency.ticks(dt);
        let need = crate::chunk::request_due(
            self.chunks.newest_remaining(t),
            len,
            cs.execute,
            // A waiting robot asks only when its chunk is spent (no early start).
            ((lead > 0 || delayed) && !waiting).then_some(delay),
            lead,
        );
        if !need || self.intervening {
            return;
        }
        match &mut self.driver {
            PolicyDriver::Thread(pt) => {
                // Keep the newest observation flowing to the policy while a request is open: it
                // always infers from the freshest state. A policy that samples its chunk as an
                // inpainting (real-time chunking) gets what the loop will execute meanwhile.
                let chunks = &self.chunks;
                let past = self.past.frames();
                pt.request_with_prefix(t, dt, &self.obs, past, self.generation, |prefix| {
                    (chunks.planned(t, dt, cs.dim, prefix), delay)
                });
                self.request_pending = true;
            }
            PolicyDriver::Inline {
                policy,
                chunk,
                delay: ticks,
                due,
                prefix,
                ..
            } => {
                if !self.past.frames().is_empty() {
                    policy.observe_past(self.past.frames());
                }
                let result = if prefix.is_empty() {
                    policy.infer(&self.obs, &mut chunk.data)
                } else {
                    let covered = self.chunks.planned(t, dt, cs.dim, prefix);
                    let p = crate::policy::ChunkPrefix {
                        actions: prefix,
                        covered,
                        delay: *ticks as usize,
                    };
                    policy.infer_with_prefix(&self.obs, &p, &mut chunk.data)
                };
                match result {
                    Ok(()) => {
                        chunk.t_start = t;
                        chunk.dt = dt;
                        // Waiting, a chunk ends after the actions it executes, so the robot
                        // holds rather than running on into the rest of the old plan.
                        chunk.len = len;
                        chunk.dim = cs.dim;
                        chunk.seq += 1;
                        if *ticks > 0 {
                            *due = Some(t + dt * *ticks);
                        } else {
                            self.chunks.push(chunk);
                            self.stats.chunks += 1;
                        }
                    }
                    Err(e) => tracing::warn!("{e}"),
                }
            }
            PolicyDriver::None => {}
        }
    }

    /// Runs one tick: waits for its deadline, then observes, decides, filters and commands.
    ///
    /// Which observation closes a step depends on how the robot advances (docs/runtime.md):
    /// - lockstep (`RobotSpec::lockstep`, simulators): the robot's answer to this tick's command,
    ///   read at once; an episode that ends there restarts at the end of the tick;
    /// - free-running (hardware, real-time servers): the newest observation at the start of the
    ///   next tick, the same one the next action is chosen from. A tick that closes an episode
    ///   (task end, a person's label or reset) resets the robot and commands nothing.
    ///
    /// The e-stop is read at the start of every tick (two atomic loads). A new e-stop ends the
    /// episode in progress as `estop` (a free-running robot's open step closes with the newest
    /// observation; a lockstep robot's step closes flagged when the stop arrived during it), and
    /// from then on every tick commands the robot's hold, step-limited, until an operator
    /// releases (still holding: paused) and resumes; the next tick after the resume starts the
    /// next episode. Held ticks belong to no episode.
    pub fn step(&mut self) -> Result<(), LoopError> {
        if !self.episode_open {
            self.start_if_running()?;
        }
        let deadline = self.schedule.deadline();
        let t = self.clock.sleep_until(deadline);
        let lateness = t.saturating_sub(deadline);
        self.deadline = deadline;
        let estop = self.note_stop();
        self.read_observation(t)?;
        if estop && self.episode_open {
            self.end_by_estop()?;
        }
        if !self.episode_open || !self.stop.may_move() {
            return self.hold_tick(t, lateness);
        }
        let person = self.read_teleop(t);
        if !self.spec.lockstep && self.close_free_running(person, t)? {
            self.finish_tick(t, lateness);
            return Ok(());
        }
        self.push_chunk(t);
        self.maybe_request(t);
        self.chunks.expire(t);
        let mut source = self.choose_action(t);
        let verdict = self.apply_safety(t);
        if verdict.held {
            source = Source::Hold;
        }
        self.robot.command(&self.action)?;
        self.episode.steps += 1;
        self.open_step(t, lateness, source, verdict.flags);
        if self.spec.lockstep {
            let after = self.robot.observe()?;
            self.after.copy_from(after);
            if let Some(f) = &mut self.features {
                let key = (after.episode, after.step, after.seq, after.time_ns);
                f.after_lockstep(key, &after.images, t);
            }
            if let Some((fo, _)) = &mut self.frames
                && person.ends(after)
            {
                send_frames(fo, after, t);
            }
            // An e-stop raised while the robot stepped: this step is the episode's last.
            let estop = self.stop.raises() != self.seen_raises;
            let done = self.close_step(person, estop);
            self.finish_tick(t, lateness);
            if estop {
                self.note_stop();
                self.episode.estop = true;
                self.end_episode(false, false)?;
            } else {
                self.end_if(person, done)?;
            }
        } else {
            self.finish_tick(t, lateness);
        }
        Ok(())
    }

    /// Reads the e-stop: mirrors a latch into the safety layer; returns whether an e-stop was
    /// raised since the last call. No logging here (formatting allocates): the status thread
    /// reports stops.
    fn note_stop(&mut self) -> bool {
        let raises = self.stop.raises();
        let new = raises != self.seen_raises;
        self.seen_raises = raises;
        if new || self.stop.state() == StopState::Latched {
            self.safety.estop();
        } else {
            self.safety.clear_estop();
        }
        new
    }

    /// The e-stop ends the episode in progress.
    fn end_by_estop(&mut self) -> Result<(), LoopError> {
        if self.step_open {
            // Free-running: the step the last tick opened closes with the newest observation.
            self.after.copy_from(&self.obs);
            self.close_step(PersonInput::default(), true);
        }
        self.episode.estop = true;
        self.end_episode(false, false)
    }

    /// A tick with no episode in progress (the e-stop latched, or released and waiting for a
    /// resume): the robot's hold, step-limited; a person's labels and resets are refused, their
    /// takeover ignored; nothing is counted as a step of any episode.
    fn hold_tick(&mut self, t: Duration, lateness: Duration) -> Result<(), LoopError> {
        let person = self.read_teleop(t);
        if person.label.is_some() || person.reset {
            self.stats.refused_while_stopped += 1;
        }
        let latched = self.stop.state() == StopState::Latched;
        self.robot.hold_action(&mut self.hold);
        let input = SafetyInput {
            joint_pos: self
                .joint_field
                .as_ref()
                .map(|r| &self.obs.state[r.clone()]),
            ee_pos: None,
            obs_age: t.saturating_sub(self.last_obs_change),
            policy_age: None,
            teleop_age: None,
        };
        let why = if latched {
            SafetyEvent::Estop as u32
        } else {
            0
        };
        self.safety.hold(&mut self.action, &self.hold, &input, why);
        if latched {
            self.stats.stopped_ticks += 1;
        } else {
            self.stats.paused_ticks += 1;
        }
        self.base.fill(0.0);
        self.res.fill(0.0);
        self.robot.command(&self.action)?;
        if self.spec.lockstep {
            // A lockstep robot answers every command; take the answer so the next tick reads a
            // fresh observation.
            let o = self.robot.observe()?;
            self.past.note(&self.obs, o);
            self.obs.copy_from(o);
        }
        self.send_held(t);
        self.finish_tick(t, lateness);
        Ok(())
    }

    /// Hands a held tick's observation to the held pool, if one is attached: the state every
    /// `every`-th held tick, the images with the frames' cadence. Like the outbox: a free buffer
    /// or nothing (counted), copies into buffers of the working size, never a wait.
    fn send_held(&mut self, t: Duration) {
        let Some((tx, every)) = &mut self.held else {
            return;
        };
        let k = self.held_ticks;
        self.held_ticks += 1;
        let images = !self.obs.images.is_empty()
            && self
                .frames
                .as_ref()
                .is_some_and(|(_, e)| k.is_multiple_of(u64::from(*e)));
        if !images && !k.is_multiple_of(u64::from(*every)) {
            return;
        }
        let Some(mut h) = tx.slot() else { return };
        h.t = t;
        h.state.clone_from(&self.obs.state);
        h.fresh_images = images;
        if images {
            h.images.truncate(self.obs.images.len());
            for (i, img) in self.obs.images.iter().enumerate() {
                match h.images.get_mut(i) {
                    Some(d) => d.copy_from(img),
                    None => h.images.push(img.clone()),
                }
            }
        }
        tx.send(h);
    }

    fn read_observation(&mut self, t: Duration) -> Result<(), LoopError> {
        let o = self.robot.observe()?;
        self.past.note(&self.obs, o);
        self.obs.copy_from(o);
        let k = (
            self.obs.episode,
            self.obs.step,
            self.obs.seq,
            self.obs.time_ns,
        );
        if k != self.last_obs_key {
            self.last_obs_key = k;
            self.last_obs_change = t;
        }
        if let Some(f) = &mut self.features {
            f.observe(k, &self.obs.state, &self.obs.images, t);
        }
        Ok(())
    }

    /// A person's input: takeover, hand-back, labels, reset requests.
    fn read_teleop(&mut self, t: Duration) -> PersonInput {
        let mut input = PersonInput::default();
        // The first look of an episode: what was pressed until now was for the episode that
        // ended, or came while the robot was being reset, so none of it is this episode's.
        let resync = std::mem::take(&mut self.teleop_resync);
        let Some(tr) = &mut self.teleop else {
            return input;
        };
        if tr.update() {
            let m = tr.get();
            if !self.teleop_seen || m.seq != self.teleop_seq {
                self.teleop_seen = true;
                self.teleop_seq = m.seq;
                self.last_teleop_change = t;
            }
            // The buttons by their counts, so that a press in a message the loop never took
            // (the device sends faster than the loop runs) still counts, once.
            let presses = tr.presses();
            let new = presses.since(&self.teleop_presses);
            self.teleop_presses = presses;
            if !resync {
                input.label = new.label();
                input.reset = new.reset > 0;
            }
        }
        let want = self.teleop_seen && tr.get().intervene;
        if want && !self.intervening {
            self.episode.interventions += 1;
        }
        if !want && self.intervening {
            // Hand-back: chunks computed before the takeover describe a state that is gone.
            self.chunks.clear();
            self.generation += 1;
            self.request_pending = false;
            self.last_policy_ok = t;
        }
        self.intervening = want;
        input
    }

    /// Free-running robots: the newest observation closes the step left open by the last tick.
    /// Returns `true` when the episode ended (the robot has been reset).
    fn close_free_running(&mut self, person: PersonInput, t: Duration) -> Result<bool, LoopError> {
        let done = if self.step_open {
            if let Some((fo, _)) = &mut self.frames
                && person.ends(&self.obs)
            {
                send_frames(fo, &self.obs, t);
            }
            self.after.copy_from(&self.obs);
            self.close_step(person, false)
        } else {
            false
        };
        let ends = done || person.label.is_some() || person.reset;
        self.end_if(person, done)?;
        Ok(ends)
    }

    fn end_if(&mut self, person: PersonInput, done: bool) -> Result<(), LoopError> {
        if let Some(s) = person.label {
            self.end_episode(s, true)
        } else if person.reset {
            self.end_episode(false, true)
        } else if done {
            let success = self.after.success;
            self.episode.truncated = self.after.truncated && !self.after.terminated;
            self.end_episode(success, false)
        } else {
            Ok(())
        }
    }

    /// A person's command, else the chunk's action plus the residual, else hold.
    fn choose_action(&mut self, t: Duration) -> Source {
        if self.intervening {
            let m = self
                .teleop
                .as_ref()
                .expect("intervening implies a teleop input")
                .get();
            if m.action.len() == self.action.len() {
                self.action.copy_from_slice(&m.action);
            } else {
                self.action.fill(f32::NAN); // rejected by safety as non-finite
            }
            self.base.fill(0.0);
            self.res.fill(0.0);
            self.stats.teleop_steps += 1;
            self.episode.intervention_steps += 1;
            return Source::Teleop;
        }
        let Some(b) = self.chunks.action_at(t, &mut self.base) else {
            self.robot.hold_action(&mut self.action);
            self.base.fill(0.0);
            self.res.fill(0.0);
            self.stats.holds_no_chunk += 1;
            return Source::Hold;
        };
        self.chunk_age = b.age;
        self.last_policy_ok = t;
        if let Some(r) = &mut self.residual {
            // New weights at any step, or only as an episode starts.
            if !self.swap_at_episode || self.obs.step == 0 || self.stats.residual_version == 0 {
                self.stats.residual_version = r.refresh();
            }
            match &self.features {
                None => r.residual(&self.obs.state, &self.base, &mut self.res),
                Some(f) if f.fresh() => r.residual(f.row(), &self.base, &mut self.res),
                // No maps yet, or too old: the residual would see another moment than the state.
                Some(_) => self.res.fill(0.0),
            }
        } else {
            self.res.fill(0.0);
        }
        let a = &self.spec.action;
        for i in 0..self.action.len() {
            self.action[i] = (self.base[i] + self.res[i]).clamp(a.low[i], a.high[i]);
        }
        Source::Policy
    }

    fn apply_safety(&mut self, t: Duration) -> crate::safety::Verdict {
        self.robot.hold_action(&mut self.hold);
        let ee = self.ee_field.as_ref().map(|r| {
            let s = &self.obs.state[r.clone()];
            [s[0] as f64, s[1] as f64, s[2] as f64]
        });
        let input = SafetyInput {
            joint_pos: self
                .joint_field
                .as_ref()
                .map(|r| &self.obs.state[r.clone()]),
            ee_pos: ee,
            obs_age: t.saturating_sub(self.last_obs_change),
            policy_age: (!self.intervening && self.chunk_spec.is_some())
                .then(|| t.saturating_sub(self.last_policy_ok)),
            teleop_age: self
                .intervening
                .then(|| t.saturating_sub(self.last_teleop_change)),
        };
        self.safety.filter(&mut self.action, &self.hold, &input)
    }

    /// The first half of a step's record, known once the action is sent: the state it was chosen
    /// in, who chose it, how the loop fared; and the camera frames of that state.
    fn open_step(&mut self, t: Duration, lateness: Duration, source: Source, flags: u32) {
        self.step_open = true;
        self.episode.digest = digest_f32(self.episode.digest, &self.obs.state);
        self.episode.digest = digest_f32(self.episode.digest, &self.action);
        self.send_frames(t);
        let Some(ob) = &mut self.outbox else { return };
        // A slot left from a step that never closed (the run stopped) is reused.
        let Some(mut tr) = self.open_tr.take().or_else(|| ob.slot()) else {
            return;
        };
        tr.episode = self.obs.episode;
        tr.step = self.obs.step;
        tr.t = t;
        tr.obs.clone_from(&self.obs.state);
        if let Some(f) = &self.features {
            tr.features.clear();
            tr.features.extend_from_slice(f.maps());
        }
        tr.base.copy_from_slice(&self.base);
        tr.residual.copy_from_slice(&self.res);
        tr.action.copy_from_slice(&self.action);
        tr.source = source;
        tr.safety_flags = flags;
        tr.lateness = lateness;
        tr.chunk_age = self.chunk_age;
        tr.policy_latency = self.policy_latency;
        self.open_tr = Some(tr);
    }

    /// The second half, from the observation that closes the step (`self.after`): reward, end of
    /// episode, next state; the whole transition goes to the outbox. Returns whether the episode
    /// is over by the task.
    fn close_step(&mut self, person: PersonInput, estop: bool) -> bool {
        self.step_open = false;
        let a = &self.after;
        self.episode.ret += a.reward;
        self.episode.digest = digest_f32(self.episode.digest, &a.state);
        self.episode.digest = digest_f32(self.episode.digest, &[a.reward]);
        let done = a.terminated || a.truncated;
        if let (Some(ob), Some(mut tr)) = (&mut self.outbox, self.open_tr.take()) {
            tr.next_obs.clone_from(&a.state);
            if let Some(f) = &self.features {
                // A lockstep robot's next observation was encoded as the step closed; a
                // free-running robot's is the one this tick read, whose maps are in the row.
                let next = if self.spec.lockstep {
                    f.next_maps()
                } else {
                    f.maps()
                };
                tr.next_features.clear();
                tr.next_features.extend_from_slice(next);
            }
            tr.reward = a.reward;
            tr.terminated = a.terminated;
            tr.truncated = a.truncated;
            tr.success = a.success;
            tr.success_score = a.success_score;
            tr.label = person.label;
            tr.reset_requested = person.reset;
            tr.estop = estop;
            ob.send(tr);
        }
        done
    }

    /// Camera frames of the state the action was chosen in, ahead of the step's transition.
    fn send_frames(&mut self, t: Duration) {
        if let Some((fo, every)) = &mut self.frames
            && self.obs.step.is_multiple_of(*every)
        {
            send_frames(fo, &self.obs, t);
        }
    }
    fn finish_tick(&mut self, t: Duration, lateness: Duration) {
        let end = self.clock.now();
        self.stats.lateness.record(lateness);
        let reset = std::mem::take(&mut self.reset_took);
        self.stats
            .step
            .record(end.saturating_sub(t).saturating_sub(reset));
        self.stats.ticks += 1;
        if !reset.is_zero() {
            // The grid starts again when the reset is over: the next tick is due now.
            self.schedule
                .restart(end.saturating_sub(self.schedule.period()));
        }
        let next = self.schedule.finish(end);
        self.stats.missed += next.missed;
        self.stats.overruns += next.overrun as u64;
        self.publish_status(end);
    }

    fn publish_status(&mut self, now: Duration) {
        let Some(w) = &mut self.status else { return };
        let period = Duration::from_secs_f64(self.cfg.status_period_ms / 1e3);
        if now.saturating_sub(self.last_status.0) < period {
            return;
        }
        let dt = (now - self.last_status.0).as_secs_f64();
        let dticks = self.stats.ticks - self.last_status.1;
        self.last_status = (now, self.stats.ticks);
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let s = w.slot();
        s.figures = LoopFigures {
            t_s: now.as_secs_f64(),
            ticks: self.stats.ticks,
            rate_hz: dticks as f64 / dt,
            lateness_p50_us: us(self.stats.lateness.percentile(50.0)),
            lateness_p99_us: us(self.stats.lateness.percentile(99.0)),
            lateness_max_us: us(self.stats.lateness.max()),
            step_p99_us: us(self.stats.step.percentile(99.0)),
            overruns: self.stats.overruns,
            missed: self.stats.missed,
            holds_no_chunk: self.stats.holds_no_chunk,
            chunk_age_ms: self.chunk_age.as_secs_f64() * 1e3,
            intervening: self.intervening,
            episode: self.obs.episode,
            outbox_dropped: self.outbox.as_ref().map_or(0, |o| o.dropped()),
            residual_version: self.stats.residual_version,
            estops: self.seen_raises,
            feature_age_ms: self
                .features
                .as_ref()
                .map_or(0.0, |f| f.age(now).as_secs_f64().min(1e6) * 1e3),
            feature_stale: self.features.as_ref().map_or(0, |f| f.counts().0.stale),
        };
        s.safety = self.safety.counters();
        s.stop = self.stop.state();
        w.publish();
    }

    /// Runs `n` ticks.
    pub fn run_ticks(&mut self, n: u64) -> Result<(), LoopError> {
        for _ in 0..n {
            self.step()?;
        }
        Ok(())
    }

    /// Runs until `n` more episodes have finished; returns their summaries.
    pub fn run_episodes(&mut self, n: usize) -> Result<Vec<EpisodeSummary>, LoopError> {
        let start = self.finished.len();
        while self.finished.len() < start + n {
            self.step()?;
        }
        Ok(self.finished[start..start + n].to_vec())
    }
}

/// Hands `obs`'s camera frames to the outbox's frame pool (none when it is empty: counted there).
/// Reuses the buffer's image vectors: no allocation once each buffer has been used.
fn send_frames(fo: &mut OutboxSender<Frames>, obs: &Observation, t: Duration) {
    if obs.images.is_empty() {
        return;
    }
    let Some(mut f) = fo.slot() else { return };
    f.episode = obs.episode;
    f.step = obs.step;
    f.t = t;
    f.images.truncate(obs.images.len());
    for (i, img) in obs.images.iter().enumerate() {
        match f.images.get_mut(i) {
            Some(d) => d.copy_from(img),
            None => f.images.push(img.clone()),
        }
    }
    fo.send(f);
}
