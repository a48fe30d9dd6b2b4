//! The actor: the control loop driving one robot with a base policy, and everything around it
//! that never holds the loop up: the recorder, the bus (status out, teleop and e-stop in, the
//! trace for `reflex viz`), the residual (or full) learner's weights in and the steps out.
//!
//! ```no_run
//! # fn demo(robot: reflex_sim::SimEnv, policy: Box<dyn reflex_contracts::policy::Policy>)
//! #     -> Result<(), reflex_agent::AgentError> {
//! use reflex_agent::actor::{ActorBuilder, ClockChoice};
//! let mut actor = ActorBuilder::new(robot)
//!     .policy(policy)
//!     .clock(ClockChoice::Sim)
//!     .seed(7)
//!     .record("runs".into())
//!     .build()?;
//! actor.run_episodes(10, &reflex_agent::progress::Silent)?;
//! let report = actor.finish()?;
//! println!("{} episodes", report.episodes.len());
//! # Ok(()) }
//! ```

use crate::config::{ClockKind, LearnerSection, PolicyKind, RobotSource, RunConfig};
use crate::learner::{LearnerConfig, LearnerReport, ServeOptions, action_norm};
use crate::progress::Progress;
use crate::stop::StopHandle;
use crate::tap::{RecordingTap, make_recorder};
use crate::{AgentError, error::Result};
use reflex_bus::learnlink::{ActorLink, LinkProgress, LinkStats, SwapPoint};
use reflex_bus::robot::RemoteRobot;
use reflex_bus::{BusConfig, Keys};
use reflex_contracts::msg::{Image, Observation, RobotSpec};
use reflex_contracts::policy::{ChunkSpec, Policy, PolicyError};
use reflex_contracts::robot::Robot;
use reflex_contracts::stop::{StopState, StopSwitch};
use reflex_learn::sac::hook::ResidualMlp;
use reflex_learn::sac::{Mode, Sac};
use reflex_policies::features::FeatureEncoder;
use reflex_record::Live;
use reflex_runtime::clock::{Clock, SimClock, WallClock};
use reflex_runtime::control::{ControlLoop, EpisodeSummary, LoopConfig, LoopStats, PolicyDriver};
use reflex_runtime::features::{FeatureDriver, LoopFeatures};
use reflex_runtime::kinematics::Chain;
use reflex_runtime::policy::PolicyThread;
use reflex_runtime::safety::{SafetyConfig, SafetyCounters};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

mod builder;
mod from_config;
mod wires;

pub use builder::*;
pub use from_config::*;
pub use wires::obs_template;
use wires::*;

/// What a run produced.
#[derive(Debug)]
pub struct RunReport {
    /// The run's id.
    pub run_id: String,
    /// Every training (or plain) episode.
    pub episodes: Vec<EpisodeSummary>,
    /// The evaluation episodes (the learner's deterministic action), after the others.
    pub eval: Vec<EpisodeSummary>,
    /// Wall time of the episodes, s.
    pub wall_s: f64,
    /// The loop's timing and counters.
    pub stats: LoopStats,
    /// Safety events by kind.
    pub safety: SafetyCounters,
    /// Recording: directory, steps recorded, steps dropped, episode files, frames dropped.
    pub recording: Option<Recording>,
    /// Steps published on the bus trace (for `reflex viz`).
    pub traced: u64,
    /// The learner link's counters, when learning.
    pub link: Option<LinkStats>,
    /// The in-process learner's report.
    pub learner: Option<LearnerReport>,
    /// A real arm's bus timing and counters.
    pub arm: Option<reflex_hardware::robot::ArmReport>,
    /// The e-stop over the run.
    pub stop: StopReport,
    /// The frozen image encoder's maps, for a residual that sees.
    pub features: Option<FeatureReport>,
    /// The success classifier's verdicts, when it gave the run's reward (`[reward]`).
    pub reward: Option<reflex_adapters::reward::RewardCounts>,
    /// Messages refused, dropped or asked for again on the bus, per key (as in the status),
    /// keys with none left out: a remote robot's observations that did not fit its spec, the
    /// commands sent again because no observation answered them, a person's bad teleop.
    pub rejected: Vec<(String, u64)>,
}

/// How a residual that sees got its feature maps over a run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct FeatureReport {
    /// The encoder's identity (file name and digest).
    pub encoder: String,
    /// The loop's counters: steps with missing or stale maps, frames the inline encoder failed on,
    /// and how many frames behind the maps in use were at the end.
    pub r#loop: reflex_runtime::features::FeatureCounts,
    /// The encoder thread's counters (real time only): frames offered, encoded, skipped, failed.
    pub thread: Option<reflex_runtime::features::FeedCounts>,
}

/// What the e-stop did over a run.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct StopReport {
    /// `running`, `latched` or `paused` when the run ended.
    pub state: &'static str,
    /// E-stops raised.
    pub estops: u64,
    /// Who raised the last one.
    pub raised_by: String,
    /// Wall time of the last one, ns since the Unix epoch (0: none).
    pub last_raised_unix_ns: u64,
    /// Episodes an e-stop ended.
    pub episodes_stopped: u64,
    /// Ticks held latched.
    pub stopped_ticks: u64,
    /// Ticks held after a release, before a resume.
    pub paused_ticks: u64,
    /// A person's labels and resets refused while stopped.
    pub refused_while_stopped: u64,
    /// Moves to a start pose the e-stop cut short.
    pub resets_stopped: u64,
}

/// What the recorder wrote.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Recording {
    /// Directory of the episode files.
    pub dir: PathBuf,
    /// Steps recorded.
    pub steps_recorded: u64,
    /// Steps dropped (the recorder fell behind).
    pub steps_dropped: u64,
    /// Episode files written.
    pub episode_files: u64,
    /// Camera-frame sets dropped.
    pub frames_dropped: u64,
    /// Errors writing recordings (the loop never waits for them).
    pub write_errors: u64,
    /// Episode files cut short by a failed write (a full disk): kept as `episode_N.rrd.partial`,
    /// their summaries say `"complete": false`.
    pub episodes_incomplete: u64,
}

/// How long an actor in simulated time waits between episodes for a learner in another process
/// to catch up before it goes on without it.
const REMOTE_PACE_LIMIT: Duration = Duration::from_secs(120);

/// A running actor.
pub struct Actor<R: Robot> {
    lp: ControlLoop<R, Box<dyn Clock>>,
    parts: Parts,
    pace: bool,
    /// In simulated time, wait for room in the camera frames' pool before each step.
    pace_frames: bool,
    run_id: String,
    recording: bool,
    done: Vec<EpisodeSummary>,
    eval: Vec<EpisodeSummary>,
    t0: Instant,
    /// Print a line per episode through the progress sink (`reflex run`).
    pub episode_lines: bool,
    /// Asked from outside to end the run ([`Actor::stop_handle`]).
    stop: StopHandle,
    last_stop: (StopState, u64),
    /// The frozen encoder's identity (empty for a residual that does not see).
    encoder_id: String,
}

impl<R: Robot> Actor<R> {
    /// The run's id.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The control loop (its robot, counters, episodes).
    pub fn control_loop(&self) -> &ControlLoop<R, Box<dyn Clock>> {
        &self.lp
    }

    /// The e-stop the actor obeys.
    pub fn stop_switch(&self) -> Arc<StopSwitch> {
        self.lp.stop_switch().clone()
    }

    /// Ends [`Actor::run_episodes`] from another thread: `finish()` after the episode in
    /// progress (at once while the e-stop holds the robot), `stop_now()` at the next tick.
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// Obeys `handle` from now on (one shared with other work, or the signals' handle).
    pub fn set_stop_handle(&mut self, handle: StopHandle) {
        self.stop = handle;
    }

    /// Runs `n` more episodes. In simulated time with a learner, the actor lets the learner
    /// take every step so far before each episode (between episodes nothing waits on the robot),
    /// so training follows the data as it would at the robot's own pace. A learner that stopped
    /// ends the run at once with its error. While the e-stop holds the robot the loop keeps
    /// ticking (holding) and no episode counts; a finish request then ends the run at once.
    pub fn run_episodes(&mut self, n: u64, progress: &dyn Progress) -> Result<&[EpisodeSummary]> {
        progress.start(n, "episodes");
        let start = self.done.len();
        let mut seen = self.lp.episodes().len();
        self.pace_learner()?;
        let mut safety_before = self.lp.safety_counters();
        let mut version_before = self.lp.stats().residual_version;
        while ((self.done.len() - start) as u64) < n {
            if self.stop.now_asked() {
                tracing::warn!(
                    "asked to stop now: ending the run after {} episodes, the one in progress unfinished",
                    self.done.len() - start
                );
                break;
            }
            if self.stop.finish_asked() && !self.lp.in_episode() {
                tracing::info!("asked to stop while the robot is held: ending the run");
                break;
            }
            if self.pace && self.pace_frames {
                self.pace_frames();
            }
            self.lp.step()?;
            self.note_stop_change(progress);
            if self.lp.episodes().len() == seen {
                continue;
            }
            let new = self.lp.episodes()[seen..].to_vec();
            seen += new.len();
            for e in new {
                self.done.push(e);
                let ok = self.done[start..].iter().filter(|e| e.success).count();
                progress.message(&format!("{ok} ok"));
                if self.episode_lines {
                    progress.line(&self.episode_line(&safety_before, version_before));
                }
                progress.inc(1);
                safety_before = self.lp.safety_counters();
                version_before = self.lp.stats().residual_version;
            }
            if self.stop.finish_asked() {
                tracing::info!(
                    "asked to stop: ending the run after {} episodes",
                    self.done.len() - start
                );
                break;
            }
            if ((self.done.len() - start) as u64) < n {
                self.pace_learner()?;
            }
        }
        progress.finish();
        Ok(&self.done[start..])
    }

    /// A line for the person watching when the e-stop changes state.
    fn note_stop_change(&mut self, progress: &dyn Progress) {
        let sw = self.lp.stop_switch().clone();
        let now = (sw.state(), sw.raises());
        if now == self.last_stop {
            return;
        }
        self.last_stop = now;
        if !self.episode_lines {
            return;
        }
        let robot = &self.lp.robot().spec().name;
        let line = match now.0 {
            StopState::Latched => format!(
                "EMERGENCY STOP {} latched (raised by {}): the robot holds, no episode starts; release with `reflex estop release --robot {robot}`",
                now.1,
                sw.raised_by()
            ),
            StopState::Paused => format!(
                "e-stop released by {}: paused, nothing moves; resume with `reflex estop resume --robot {robot}`",
                sw.released_resumed_by().0
            ),
            StopState::Running => format!(
                "resumed by {}: the next episode starts",
                sw.released_resumed_by().1
            ),
        };
        progress.line(&line);
    }

    /// What a person watching wants after each episode: how it ended and who drove, the robot's
    /// own success over the last 20 episodes, takeovers, the weights in use and the learner's
    /// lag, loop timing, and the safety layer's clipping summarised (holds and e-stops are
    /// warned on their own).
    fn episode_line(
        &self,
        safety_before: &reflex_runtime::safety::SafetyCounters,
        version_before: u64,
    ) -> String {
        use reflex_runtime::safety::SafetyEvent;
        let Some(e) = self.done.last() else {
            return String::new();
        };
        let how = match (e.success, e.labelled, e.truncated) {
            _ if e.estop => "EMERGENCY STOP",
            (true, true, _) => "success (labelled)",
            (true, false, _) => "success",
            (false, true, _) => "failure (labelled)",
            (false, false, true) => "time limit",
            (false, false, false) => "failure",
        };
        let recent = &self.done[self.done.len().saturating_sub(20)..];
        let alone = recent
            .iter()
            .filter(|e| e.success && e.interventions == 0)
            .count();
        let st = self.lp.stats();
        let mut line = format!(
            "episode {:>4}: {how:<18} {:>4} steps | robot alone {alone}/{} of the last {} | takeovers {}",
            e.episode,
            e.steps,
            recent.len(),
            recent.len(),
            e.interventions
        );
        if e.interventions > 0 {
            line.push_str(&format!(" ({} steps)", e.intervention_steps));
        }
        if self.parts.link_progress.is_some() || st.residual_version > 0 {
            line.push_str(&format!(
                " | weights v{} (+{})",
                st.residual_version,
                st.residual_version.saturating_sub(version_before)
            ));
            if let Some((offered, received)) = self.link_progress() {
                line.push_str(&format!(
                    ", learner {} steps behind",
                    offered.saturating_sub(received)
                ));
            }
        }
        line.push_str(&format!(
            " | lateness p99 {:.0} us",
            st.lateness.percentile(99.0).as_secs_f64() * 1e6
        ));
        let now = self.lp.safety_counters();
        let acted: Vec<String> = SafetyEvent::ALL
            .iter()
            .enumerate()
            .filter_map(|(i, k)| {
                let d = now.0[i].saturating_sub(safety_before.0[i]);
                (d > 0).then(|| format!("{} {d}", k.name()))
            })
            .collect();
        if !acted.is_empty() {
            line.push_str(&format!(" | safety: {}", acted.join(", ")));
        }
        line
    }

    /// Runs `n` more episodes with the learner's deterministic action (its mean, no exploration
    /// noise), kept apart from the training episodes in the report's `eval`.
    pub fn evaluate(&mut self, n: u64, progress: &dyn Progress) -> Result<&[EpisodeSummary]> {
        self.lp.set_residual_explore(false);
        let start = self.done.len();
        let r = self.run_episodes(n, progress).map(|_| ());
        self.lp.set_residual_explore(true);
        r?;
        self.eval.extend_from_slice(&self.done[start..]);
        self.done.truncate(start);
        Ok(&self.eval)
    }

    /// Simulated time only: waits, before the loop's next tick, until the camera frames' pool
    /// has room for this step's frames and an episode's last, so the recording and the step log
    /// keep every frame handed out (in real time the loop never waits: a full pool is a counted
    /// drop). Bounded: a consumer that stops returning buffers for [`FRAME_PACE_LIMIT`] is not
    /// waited for again in this run; it costs drops, not a hung run.
    fn pace_frames(&mut self) {
        let Some(pool) = self.lp.frame_pool() else {
            return;
        };
        let t0 = Instant::now();
        while pool.free() < 2 {
            if t0.elapsed() > FRAME_PACE_LIMIT {
                tracing::warn!(
                    "the camera frames' consumer has held every buffer for {FRAME_PACE_LIMIT:?}; \
                     going on without waiting for it (frames it misses are counted as dropped)"
                );
                self.pace_frames = false;
                return;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    fn pace_learner(&mut self) -> Result<()> {
        // Paced or not (a person's wall-clock run is not), a stopped in-process learner ends the
        // run at this episode boundary instead of letting the robot go on for nothing.
        if self.parts.learner.as_ref().is_some_and(|h| h.is_finished()) {
            return Err(self.learner_stopped());
        }
        let (Some(p), Some(ob)) = (&self.parts.link_progress, self.lp.outbox()) else {
            return Ok(());
        };
        if !self.pace {
            return Ok(());
        }
        let (sent, t0) = (ob.sent(), Instant::now());
        let p = p.clone();
        while p.received.load(Ordering::Relaxed) < sent {
            if self.parts.learner.as_ref().is_some_and(|h| h.is_finished()) {
                return Err(self.learner_stopped());
            }
            if self.parts.learner.is_none() && t0.elapsed() > REMOTE_PACE_LIMIT {
                tracing::warn!(
                    "the learner on the bus has not taken the last {} steps within {:?}; going on without it (they stay queued for it)",
                    sent - p.received.load(Ordering::Relaxed),
                    REMOTE_PACE_LIMIT
                );
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }

    /// Messages rejected so far per key the actor reads (as in its status); empty without a bus.
    pub fn rejected(&self) -> Vec<(String, u64)> {
        self.parts
            .rejects
            .iter()
            .map(|r| (r.key().to_string(), r.count()))
            .collect()
    }

    /// Stops the in-process learner (it checkpoints what it holds) and starts a new one, which
    /// resumes from that checkpoint; the link resends what the new one lacks. Returns the old
    /// one's report. For fault drills (`reflex soak`) and restarts after a configuration change.
    pub fn restart_learner(&mut self) -> Result<LearnerReport> {
        let Some((session, cfg)) = self.parts.learner_restart.clone() else {
            return Err(AgentError::setup(
                "restart_learner",
                "this actor has no in-process learner",
            ));
        };
        self.parts.learner_stop.store(true, Ordering::Relaxed);
        let report = match self.parts.learner.take().map(|h| h.join()) {
            Some(Ok(r)) => r?,
            Some(Err(_)) => return Err(AgentError::setup("the in-process learner", "it panicked")),
            None => {
                return Err(AgentError::setup(
                    "the in-process learner",
                    "it is not running",
                ));
            }
        };
        let stop = Arc::new(AtomicBool::new(false));
        self.parts.learner = Some(spawn_learner(session, cfg, stop.clone()));
        self.parts.learner_stop = stop;
        Ok(report)
    }

    /// Runs `n` ticks of the loop (no episode accounting; for drills and benchmarks).
    pub fn run_ticks(&mut self, n: u64) -> Result<()> {
        Ok(self.lp.run_ticks(n)?)
    }

    /// The link to the learner's counters so far (steps sent, persisted, weights), if learning.
    pub fn link_progress(&self) -> Option<(u64, u64)> {
        let p = self.parts.link_progress.as_ref()?;
        Some((
            p.offered.load(Ordering::Relaxed),
            p.received.load(Ordering::Relaxed),
        ))
    }

    /// The in-process learner ended while the actor needs it: its error, or a plain statement.
    fn learner_stopped(&mut self) -> AgentError {
        match self.parts.learner.take().map(|h| h.join()) {
            Some(Ok(Err(e))) => e,
            Some(Err(_)) => AgentError::setup("the in-process learner", "it panicked"),
            _ => AgentError::setup("the in-process learner", "it stopped before the run ended"),
        }
    }

    /// Stops the threads, drains the recorder and the learner link, returns the report.
    pub fn finish(mut self) -> Result<RunReport> {
        let wall_s = self.t0.elapsed().as_secs_f64();
        // The tap drains the link first (the learner persists the last steps), then the learner
        // stops.
        let tap = self.parts.tap.take().map(|t| (t.dir.clone(), t.finish()));
        self.parts.learner_stop.store(true, Ordering::Relaxed);
        let learner = match self.parts.learner.take().map(|h| h.join()) {
            Some(Ok(r)) => Some(r?),
            Some(Err(_)) => return Err(AgentError::setup("the in-process learner", "it panicked")),
            None => None,
        };
        let (mut recording, mut traced, mut link) = (None, 0, None);
        if let Some((dir, r)) = tap {
            traced = r.traced;
            link = r.link.clone();
            if self.recording {
                recording = Some(Recording {
                    dir,
                    steps_recorded: r.recorded,
                    steps_dropped: r.dropped,
                    episode_files: r.episodes,
                    frames_dropped: r.frames_dropped,
                    write_errors: r.write_errors,
                    episodes_incomplete: r.incomplete,
                });
            }
        }
        let sw = self.lp.stop_switch().clone();
        let st = self.lp.stats();
        let stop = StopReport {
            state: sw.state().as_str(),
            estops: sw.raises(),
            raised_by: sw.raised_by(),
            last_raised_unix_ns: sw.last_raised_unix_ns(),
            episodes_stopped: self
                .done
                .iter()
                .chain(&self.eval)
                .filter(|e| e.estop)
                .count() as u64,
            stopped_ticks: st.stopped_ticks,
            paused_ticks: st.paused_ticks,
            refused_while_stopped: st.refused_while_stopped,
            resets_stopped: st.resets_stopped,
        };
        Ok(RunReport {
            stop,
            rejected: self
                .rejected()
                .into_iter()
                .filter(|(_, n)| *n > 0)
                .collect(),
            run_id: self.run_id.clone(),
            episodes: std::mem::take(&mut self.done),
            eval: std::mem::take(&mut self.eval),
            wall_s,
            stats: self.lp.stats().clone(),
            safety: self.lp.safety_counters(),
            recording,
            traced,
            link,
            learner,
            arm: None,
            reward: None,
            features: self.lp.features().map(|f| {
                let (r#loop, thread) = f.counts();
                FeatureReport {
                    encoder: self.encoder_id.clone(),
                    r#loop,
                    thread,
                }
            }),
        })
    }
}
