//! The reflex robot protocol on Zenoh.
//!
//! One key-expression namespace per robot, `reflex/<robot>/...` (docs/protocol.md is the
//! contract):
//!
//! | key | direction | message |
//! |---|---|---|
//! | `obs` | robot -> controllers | [`Observation`] |
//! | `cmd` | controller -> robot | [`Command`] |
//! | `spec` | query, robot answers | [`RobotSpec`] |
//! | `reset` | query, robot answers | [`ResetRequest`] -> [`Observation`] |
//! | `events` | anyone | [`EpisodeEvent`] |
//! | `teleop` | teleop device -> actor | [`crate::msg::TeleopMsg`] |
//! | `status` | actor -> anyone | status (runtime issue) |
//! | `alive/robot` | liveliness token of the robot server | |
//!
//! A lockstep robot answers each command with the observation of the same sequence number; a
//! free-running robot publishes observations at its own rate. Every exchange has a deadline.

use crate::BusError;
use crossbeam::channel::{self, Receiver, RecvTimeoutError, Sender};
use reflex_contracts::keys::Keys;
use reflex_contracts::msg::{
    self, ActionKind, Command, EpisodeEvent, EventKind, Observation, PROTOCOL_VERSION,
    ResetRequest, RobotSpec,
};
use reflex_contracts::robot::{Robot, RobotError, Silence, check_action};
use reflex_contracts::stop::{StopHolder, StopSwitch};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zenoh::Wait;

fn bus_err(key: &str, e: impl std::fmt::Display) -> RobotError {
    RobotError::Bus {
        key: key.to_string(),
        message: e.to_string(),
    }
}

/// Drives a robot that speaks the reflex protocol on Zenoh, whatever it is (the simulator served
/// by `reflex sim serve`, the Gymnasium bridge, a real arm's driver process).
pub struct RemoteRobot {
    session: zenoh::Session,
    keys: Keys,
    spec: RobotSpec,
    cmd_pub: zenoh::pubsub::Publisher<'static>,
    obs_rx: Receiver<Observation>,
    aside: Arc<Aside>,
    /// Whether a command was sent since the last reset (the hold is then the last command).
    commanded: bool,
    joint_field: Option<std::ops::Range<usize>>,
    stop: Option<Arc<StopSwitch>>,
    obs: Observation,
    have_obs: bool,
    seq: u64,
    episode_floor: u64,
    timeout: Duration,
    poll_window: Duration,
    buf: Vec<u8>,
    cmd: Command,
    rejects: std::sync::Arc<crate::Rejects>,
    dropped: std::sync::Arc<crate::Rejects>,
    resent: std::sync::Arc<crate::Rejects>,
    resend_after: Duration,
    heard: Arc<Heard>,
    _obs_sub: zenoh::pubsub::Subscriber<()>,
}

/// What the controller last heard from the robot, written by Zenoh's thread and the loop's: the
/// highest `seq` of any observation that decoded (fitting the spec or not), and when the robot
/// last answered at all.
struct Heard {
    t0: Instant,
    seq: AtomicU64,
    /// Nanoseconds after `t0` of the last answer, plus one (0: never).
    at_ns: AtomicU64,
}

impl Heard {
    fn new() -> Self {
        Heard {
            t0: Instant::now(),
            seq: AtomicU64::new(0),
            at_ns: AtomicU64::new(0),
        }
    }

    fn now(&self) {
        let ns = self.t0.elapsed().as_nanos() as u64 + 1;
        self.at_ns.fetch_max(ns, Ordering::AcqRel);
    }

    fn seq(&self, seq: u64) {
        self.seq.fetch_max(seq, Ordering::AcqRel);
        self.now();
    }

    /// How long ago the robot last answered; `None`: never.
    fn ago(&self) -> Option<Duration> {
        match self.at_ns.load(Ordering::Acquire) {
            0 => None,
            ns => Some(
                self.t0
                    .elapsed()
                    .saturating_sub(Duration::from_nanos(ns - 1)),
            ),
        }
    }
}

/// The longest a lockstep controller waits for an observation before it sends the command
/// again (at most a quarter of its deadline): long next to a step of any simulator we serve,
/// short next to the deadline, so one lost observation costs a second, not the run.
const RESEND_AFTER: Duration = Duration::from_secs(1);

/// Observations queued between Zenoh's thread and the loop.
const OBS_QUEUE: usize = 64;

/// What the observation queue pushed aside when it was full: episode ends (never dropped: the
/// loop must see every end), and the rewards of the observations it dropped (added to the next
/// one the loop takes, so no reward is lost with them).
#[derive(Default)]
struct Aside {
    ends: Mutex<VecDeque<Observation>>,
    pending: AtomicUsize,
    reward_bits: AtomicU32,
}

impl Aside {
    fn add_reward(&self, r: f32) {
        let _ = self
            .reward_bits
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                Some((f32::from_bits(b) + r).to_bits())
            });
    }

    fn take_reward(&self) -> f32 {
        f32::from_bits(self.reward_bits.swap(0f32.to_bits(), Ordering::AcqRel))
    }

    /// The oldest episode end pushed aside, if any (one atomic load when there is none).
    fn take_end(&self) -> Option<Observation> {
        if self.pending.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut g = self.ends.lock().ok()?;
        let o = g.pop_front();
        self.pending.store(g.len(), Ordering::Release);
        o
    }

    fn clear(&self) {
        if let Ok(mut g) = self.ends.lock() {
            g.clear();
            self.pending.store(0, Ordering::Release);
        }
        self.take_reward();
    }
}

impl RemoteRobot {
    /// Finds the robot named `robot` on the bus and fetches its spec. Fails with a
    /// [`RobotError::Timeout`] naming the key when nobody serves it within `timeout`.
    pub fn connect(
        session: &zenoh::Session,
        robot: &str,
        timeout: Duration,
    ) -> Result<Self, RobotError> {
        let keys = Keys::new(robot).map_err(|e| RobotError::Device {
            robot: robot.into(),
            message: e.to_string(),
        })?;
        wait_for_token(session, &keys.alive_robot, robot, timeout)?;
        let spec: RobotSpec = query(session, &keys.spec, robot, Vec::new(), timeout)?;
        let heard = Arc::new(Heard::new());
        heard.now();
        // Everything below indexes by the spec's sizes: a spec that does not hold together is
        // refused here, before the loop sees it.
        spec.validate()?;
        let joint_field = check_spec(&spec, robot, &keys)?;
        let ObsInput {
            sub: obs_sub,
            rx: obs_rx,
            aside,
            rejects,
            dropped,
        } = subscribe_observations(session, &keys, &spec, &heard)?;
        // Lockstep waits for each answer anyway: a command must not be dropped. Free-running,
        // the loop must never wait on the network: a command that cannot be queued is dropped
        // (the robot holds on its side and the next tick sends a fresh one).
        let congestion = if spec.lockstep {
            zenoh::qos::CongestionControl::Block
        } else {
            zenoh::qos::CongestionControl::Drop
        };
        let cmd_pub = session
            .declare_publisher(keys.cmd.clone())
            .express(true)
            .congestion_control(congestion)
            .wait()
            .map_err(|e| bus_err(&keys.cmd, e))?;
        let act_dim = spec.action.dim();
        let resent = crate::Rejects::counting(
            &format!("{} (sent again: unanswered)", keys.cmd),
            "a command went again on",
        );
        Ok(RemoteRobot {
            session: session.clone(),
            keys,
            spec,
            cmd_pub,
            obs_rx,
            aside,
            commanded: false,
            joint_field,
            stop: None,
            obs: Observation::default(),
            have_obs: false,
            seq: 0,
            episode_floor: 0,
            timeout,
            poll_window: Duration::from_micros(500),
            buf: Vec::with_capacity(1024),
            cmd: Command {
                v: PROTOCOL_VERSION,
                seq: 0,
                action: Vec::with_capacity(act_dim),
            },
            rejects,
            dropped,
            resent,
            resend_after: (timeout / 4).min(RESEND_AFTER),
            heard,
            _obs_sub: obs_sub,
        })
    }

    /// Commands sent again because no observation answered them (lockstep): each one an
    /// observation lost on the way, or a robot slower than [`RemoteRobot::set_resend_after`].
    pub fn resent(&self) -> std::sync::Arc<crate::Rejects> {
        self.resent.clone()
    }

    /// How long a lockstep controller waits for the answer to a command before it sends the
    /// same command again (default: a quarter of the deadline, at most 1 s). The robot answers a
    /// command it has executed already with the same observation, without stepping again
    /// (docs/protocol.md); a robot whose step takes longer than this only gets asked twice.
    pub fn set_resend_after(&mut self, after: Duration) {
        self.resend_after = after.max(Duration::from_millis(1));
    }

    /// Observations rejected so far (malformed, or not fitting the spec), with their key.
    pub fn rejects(&self) -> std::sync::Arc<crate::Rejects> {
        self.rejects.clone()
    }

    /// Observations dropped because the loop fell [`OBS_QUEUE`] behind (the oldest go first;
    /// an episode's end is never dropped).
    pub fn dropped(&self) -> std::sync::Arc<crate::Rejects> {
        self.dropped.clone()
    }

    /// The deadline applied to every exchange.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The key expressions in use.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// How long `observe` polls its queue before it sleeps on it (default 0.5 ms). Polling
    /// saves one thread wake-up per exchange, about 60-90 us on a small VM (`reflex bench bus`
    /// shows both); zero sleeps at once.
    pub fn set_poll_window(&mut self, window: Duration) {
        self.poll_window = window;
    }

    fn recv_until(&self, deadline: Instant) -> Option<Observation> {
        let poll_end = Instant::now() + self.poll_window;
        loop {
            if let Ok(o) = self.obs_rx.try_recv() {
                return Some(o);
            }
            let now = Instant::now();
            if now >= poll_end || now >= deadline {
                break;
            }
            std::hint::spin_loop();
        }
        self.obs_rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .ok()
    }

    /// The deadline passed on `key`: says what was known of the robot (when it last answered,
    /// whether its liveliness token is still there, how often the request went again).
    fn timeout_err(&self, key: &str, resent: u32) -> RobotError {
        let present = self
            .session
            .liveliness()
            .get(self.keys.alive_robot.clone())
            .timeout(Duration::from_millis(500))
            .wait()
            .ok()
            .map(|replies| replies.recv().is_ok_and(|r| r.result().is_ok()));
        RobotError::Timeout {
            robot: self.keys.robot.clone(),
            key: key.to_string(),
            timeout: self.timeout,
            silence: Silence {
                last_answer: self.heard.ago(),
                present,
                resent,
            },
        }
    }
}

fn wait_for_token(
    session: &zenoh::Session,
    key: &str,
    robot: &str,
    timeout: Duration,
) -> Result<(), RobotError> {
    // Liveliness queries answer from the local token table, which fills as peers connect; poll
    // until the deadline so a robot that starts a moment later is still found.
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let replies = session
            .liveliness()
            .get(key)
            .timeout(
                left.min(Duration::from_millis(200))
                    .max(Duration::from_millis(10)),
            )
            .wait()
            .map_err(|e| bus_err(key, e))?;
        if replies.recv().is_ok() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(RobotError::Timeout {
                robot: robot.into(),
                key: key.into(),
                timeout,
                silence: Silence::default(),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn query<T: serde::de::DeserializeOwned + msg::Versioned>(
    session: &zenoh::Session,
    key: &str,
    robot: &str,
    payload: Vec<u8>,
    timeout: Duration,
) -> Result<T, RobotError> {
    let replies = session
        .get(key)
        .payload(payload)
        .timeout(timeout)
        .wait()
        .map_err(|e| bus_err(key, e))?;
    // Take the first good answer; remember an error reply in case no good one follows.
    let mut error = None;
    while let Ok(reply) = replies.recv() {
        match reply.into_result() {
            Ok(sample) => return Ok(msg::decode::<T>(key, &sample.payload().to_bytes())?),
            Err(e) => error = Some(String::from_utf8_lossy(&e.payload().to_bytes()).into_owned()),
        }
    }
    Err(match error {
        Some(message) if message != "Timeout" => RobotError::Device {
            robot: robot.into(),
            message: format!("`{key}` answered with an error: {message}"),
        },
        _ => RobotError::Timeout {
            robot: robot.into(),
            key: key.into(),
            timeout,
            silence: Silence::default(),
        },
    })
}

/// A peer's observation with its images' frame counters cleared: they are not trusted to skip
/// copies (a wrong one would leave the actor looking at old pixels).
fn without_frame_counters(mut o: Observation) -> Observation {
    for img in &mut o.images {
        img.seq = 0;
    }
    o
}

impl Robot for RemoteRobot {
    fn spec(&self) -> &RobotSpec {
        &self.spec
    }

    fn reset(&mut self, seed: Option<u64>) -> Result<&Observation, RobotError> {
        let req = msg::encode(&ResetRequest {
            v: PROTOCOL_VERSION,
            seed,
        });
        let reply: Result<Observation, RobotError> = query(
            &self.session,
            &self.keys.reset,
            &self.keys.robot,
            req,
            self.timeout,
        );
        let obs = match reply {
            Ok(o) => o,
            // The robot's server hears the same e-stop and refuses or cuts its reset short.
            Err(_) if self.stop.as_ref().is_some_and(|s| !s.may_move()) => {
                return Err(RobotError::Stopped {
                    robot: self.keys.robot.clone(),
                    what: "the reset",
                    state: self.stop.as_ref().map_or("latched", |s| s.state().as_str()),
                });
            }
            Err(RobotError::Timeout { key, .. }) => return Err(self.timeout_err(&key, 0)),
            Err(e) => return Err(e),
        };
        self.heard.now();
        obs.check_against(&self.spec)?;
        let obs = without_frame_counters(obs);
        // Anything queued from the previous episode is stale now.
        while self.obs_rx.try_recv().is_ok() {}
        self.aside.clear();
        self.commanded = false;
        self.seq = self.seq.max(obs.seq);
        self.episode_floor = obs.episode;
        self.obs = obs;
        self.have_obs = true;
        Ok(&self.obs)
    }

    fn command(&mut self, action: &[f32]) -> Result<(), RobotError> {
        check_action(&self.keys.robot, self.spec.action.dim(), action)?;
        self.seq += 1;
        // Reused: no allocation per command on the loop thread once the vectors have grown.
        self.cmd.seq = self.seq;
        self.cmd.action.clear();
        self.cmd.action.extend_from_slice(action);
        msg::encode_into(&self.cmd, &mut self.buf);
        self.commanded = true;
        self.cmd_pub
            .put(self.buf.as_slice())
            .wait()
            .map_err(|e| bus_err(&self.keys.cmd, e))
    }

    /// Lockstep: the answer to the last command (waited for once, then kept until the next
    /// command), or the reset's observation before any command. Free-running: the newest
    /// observation; its `reward` is the sum of the rewards of every observation that arrived
    /// since the previous call (0 when none did), and an observation that ends the episode is
    /// never skipped over.
    fn observe(&mut self) -> Result<&Observation, RobotError> {
        if self.spec.lockstep {
            if self.have_obs && self.obs.seq >= self.seq {
                return Ok(&self.obs);
            }
            let start = Instant::now();
            let deadline = start + self.timeout;
            let mut resend_at = start + self.resend_after;
            let mut resent = 0u32;
            loop {
                match self.recv_until(deadline.min(resend_at)) {
                    Some(o) if o.seq >= self.seq => {
                        self.obs = o;
                        self.have_obs = true;
                        return Ok(&self.obs);
                    }
                    Some(_) => continue,
                    None if Instant::now() >= deadline => {
                        return Err(self.timeout_err(&self.keys.obs, resent));
                    }
                    None => {
                        resend_at = Instant::now() + self.resend_after;
                        // An answer that came and did not fit the spec would come again just
                        // the same: only an answer that never came is asked for again.
                        if self.heard.seq.load(Ordering::Acquire) < self.seq {
                            resent += 1;
                            self.resent.reject(&format_args!(
                                "nothing answered command {} within {:.2} s: sent it again (the robot answers a repeat without stepping)",
                                self.seq,
                                self.resend_after.as_secs_f64()
                            ));
                            self.cmd_pub
                                .put(self.buf.as_slice())
                                .wait()
                                .map_err(|e| bus_err(&self.keys.cmd, e))?;
                        }
                    }
                }
            }
        }
        let mut reward = self.aside.take_reward();
        // An episode end pushed aside is older than anything queued: it comes first.
        while let Some(o) = self.aside.take_end() {
            if o.episode < self.episode_floor {
                continue;
            }
            self.obs = o;
            self.obs.reward += reward;
            self.have_obs = true;
            return Ok(&self.obs);
        }
        let mut got = false;
        if !self.have_obs {
            match self.obs_rx.recv_timeout(self.timeout) {
                Ok(o) => {
                    reward += o.reward;
                    self.obs = o;
                    got = true;
                }
                Err(_) => return Err(self.timeout_err(&self.keys.obs, 0)),
            }
        }
        while !self.obs.done() || !got {
            let Ok(o) = self.obs_rx.try_recv() else { break };
            if o.episode < self.episode_floor {
                continue; // published before the last reset, delivered after it
            }
            reward += o.reward;
            self.obs = o;
            got = true;
        }
        self.obs.reward = reward;
        self.have_obs = true;
        Ok(&self.obs)
    }

    /// Keeps the robot where it was last told to be: the last command for absolute spaces
    /// (before any command in an episode, the measured `joint_pos` for joint targets); zero
    /// steps for delta spaces, with an end-effector space's absolute gripper at its last
    /// command (or measured opening). Only a generic `box` space with nothing commanded yet
    /// falls back to zero (or the middle of a range that excludes it): its meaning is the
    /// environment's. The server applies its own robot's hold between commands.
    fn hold_action(&self, out: &mut [f32]) {
        let a = &self.spec.action;
        let last = (self.commanded && self.cmd.action.len() == out.len())
            .then_some(self.cmd.action.as_slice());
        let measured = self
            .joint_field
            .as_ref()
            .filter(|r| r.end <= self.obs.state.len())
            .map(|r| &self.obs.state[r.clone()]);
        let neutral = |i: usize| {
            if a.low[i] <= 0.0 && a.high[i] >= 0.0 {
                0.0
            } else {
                0.5 * (a.low[i] + a.high[i])
            }
        };
        let n = out.len();
        match a.kind {
            ActionKind::JointAbs | ActionKind::Box => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = match (last, measured) {
                        (Some(l), _) => l[i],
                        (None, Some(q)) if q.len() == n => q[i],
                        _ => neutral(i),
                    };
                }
            }
            ActionKind::JointDelta => out.fill(0.0),
            ActionKind::EeDelta | ActionKind::EeDeltaYaw => {
                out.fill(0.0);
                // The gripper (the last component) is an absolute opening.
                out[n - 1] = match (last, measured) {
                    (Some(l), _) => l[n - 1],
                    (None, Some(q)) if !q.is_empty() => q[q.len() - 1],
                    _ => neutral(n - 1),
                }
                .clamp(a.low[n - 1], a.high[n - 1]);
            }
        }
    }

    fn attach_stop(&mut self, stop: Arc<StopSwitch>) {
        self.stop = Some(stop);
    }
}

/// Commands into the server's queue. Zenoh's callback never waits: a command that finds the
/// queue full is dropped and counted (the controller's next command supersedes it), as is one
/// that does not decode or does not fit the action space.
fn command_subscriber(
    session: &zenoh::Session,
    keys: &Keys,
    dim: usize,
    tx: Sender<Incoming>,
    rejects: &std::sync::Arc<crate::Rejects>,
) -> Result<zenoh::pubsub::Subscriber<()>, zenoh::Error> {
    let (cmd_key, r) = (keys.cmd.clone(), rejects.clone());
    session
        .declare_subscriber(keys.cmd.clone())
        .callback(move |sample| {
            let c = match msg::decode::<Command>(&cmd_key, &sample.payload().to_bytes()) {
                Ok(c) => c,
                Err(e) => return r.reject(&e),
            };
            if c.action.len() != dim {
                return r.reject(&format!(
                    "command {} has {} components, the action space has {dim}",
                    c.seq,
                    c.action.len()
                ));
            }
            if tx.try_send(Incoming::Cmd(c)).is_err() {
                r.reject(&"the robot's command queue is full");
            }
        })
        .wait()
}

/// Reset queries into the server's queue; a full queue answers the query with an error.
fn reset_queryable(
    session: &zenoh::Session,
    keys: &Keys,
    tx: Sender<Incoming>,
) -> Result<zenoh::query::Queryable<()>, zenoh::Error> {
    let reset_key = keys.reset.clone();
    session
        .declare_queryable(keys.reset.clone())
        .callback(move |query| {
            let seed = match query.payload().map(|p| p.to_bytes()) {
                Some(b) if !b.is_empty() => match msg::decode::<ResetRequest>(&reset_key, &b) {
                    Ok(r) => r.seed,
                    Err(e) => {
                        let _ = query.reply_err(e.to_string()).wait();
                        return;
                    }
                },
                _ => None,
            };
            if let Err(e) = tx.try_send(Incoming::Reset(query, seed)) {
                let Incoming::Reset(q, _) = e.into_inner() else {
                    unreachable!("a reset was sent")
                };
                let _ = q
                    .reply_err("the robot is busy: its queue is full; retry")
                    .wait();
            }
        })
        .wait()
}

/// How a served robot advances.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ServeMode {
    /// One step per received command, as fast as the controller drives it.
    Lockstep,
    /// A fixed rate: every tick applies the newest command (or holds) and publishes an observation.
    Realtime {
        /// Tick rate, Hz.
        hz: f64,
    },
}

enum Incoming {
    Cmd(Command),
    Reset(zenoh::query::Query, Option<u64>),
}

/// The serving side's own safety filter. Every command a [`RobotServer`] is about to execute
/// must lie inside the spec's action bounds and within a per-step limit of where the robot is
/// told to be now (its hold action: the current targets); anything else is refused, counted on
/// the command key like every other reject, and the robot holds that tick. The limit is per
/// controller step: a free-running server executes only the newest of the commands that arrive
/// within one of its ticks, so a command may lie one step further per command skipped since the
/// last one executed (at most [`CommandFilter::MAX_PERIODS`] steps in all, however many a flood
/// sends); the first command after a reset gets two (a controller steps from the pose it
/// measured, which may trail the target). Ticks without a command add nothing: an idle robot's
/// targets do not move, so neither may the next command jump. A controller whose
/// own safety layer clips to the same limits never meets it; a hostile or broken one cannot
/// make the robot jump. `reflex hw serve` turns it on for arms by default (`[serve] filter`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CommandFilter {
    /// Largest change of a joint target per command, rad (joint actions; a yaw step).
    pub max_joint_step_rad: f32,
    /// Largest end-effector translation per command, m (end-effector actions).
    pub max_ee_step_m: f32,
    /// Largest change of the gripper per command, in its action units.
    pub max_gripper_step: f32,
}

impl CommandFilter {
    /// The most controller steps one command may span.
    pub const MAX_PERIODS: u32 = 3;

    /// Why `a` is refused, if it is; `hold` is the robot's hold action now, `periods` the
    /// controller steps the command may span (1, plus the commands skipped since the last one
    /// executed).
    pub fn check(
        &self,
        spec: &msg::ActionSpec,
        a: &[f32],
        hold: &[f32],
        periods: u32,
    ) -> Result<(), String> {
        let k = periods.clamp(1, Self::MAX_PERIODS) as f32;
        // A controller that clips to the same limit in f32 lands a rounding error past it.
        let over = |v: f32, max: f32| v.abs() > k * max * (1.0 + 1e-4) + 1e-6;
        for (i, v) in a.iter().enumerate() {
            let (lo, hi) = (spec.low[i], spec.high[i]);
            let slack = 1e-4 * (hi - lo).abs().max(1e-3);
            if !(lo - slack..=hi + slack).contains(v) {
                return Err(format!(
                    "`{}` = {v} is outside its range [{lo}, {hi}]",
                    spec.names[i]
                ));
            }
        }
        let n = a.len();
        let step = |i: usize, d: f32, max: f32| {
            if over(d, max) {
                Err(format!(
                    "`{}` changes by {d:+.4} in one command; the limit is {max} per step ({k} steps)",
                    spec.names[i]
                ))
            } else {
                Ok(())
            }
        };
        match spec.kind {
            ActionKind::JointAbs | ActionKind::JointDelta => {
                // Absolute targets change from the current ones; deltas are the change.
                let absolute = spec.kind == ActionKind::JointAbs;
                for (i, (v, h)) in a.iter().zip(hold).enumerate() {
                    let max = if i + 1 == n {
                        self.max_gripper_step
                    } else {
                        self.max_joint_step_rad
                    };
                    step(i, if absolute { v - h } else { *v }, max)?;
                }
            }
            ActionKind::EeDelta | ActionKind::EeDeltaYaw => {
                for (i, v) in a.iter().enumerate().take(3) {
                    step(i, *v, self.max_ee_step_m)?;
                }
                if spec.kind == ActionKind::EeDeltaYaw {
                    step(3, a[3], self.max_joint_step_rad)?;
                }
                step(n - 1, a[n - 1] - hold[n - 1], self.max_gripper_step)?;
            }
            ActionKind::Box => {}
        }
        Ok(())
    }
}

/// Serves any [`Robot`] on the bus: answers spec and reset queries, executes commands, publishes
/// observations and episode events, and holds a liveliness token while it runs.
pub struct RobotServer<R: Robot> {
    robot: R,
    keys: Keys,
    mode: ServeMode,
    rx: Receiver<Incoming>,
    obs_pub: zenoh::pubsub::Publisher<'static>,
    events_pub: zenoh::pubsub::Publisher<'static>,
    buf: Vec<u8>,
    hold: Vec<f32>,
    seed: Option<u64>,
    cmd_rejects: std::sync::Arc<crate::Rejects>,
    counters: Arc<ServeCounters>,
    watchdog: Duration,
    filter: Option<CommandFilter>,
    reference: Vec<f32>,
    /// Controller steps the next command may span: 1, plus commands skipped since the last one
    /// executed (and one after a reset).
    periods: u32,
    stop: Arc<StopSwitch>,
    /// Lockstep: the last command executed and whether its observation is in `buf` (not after
    /// a reset), to answer a command sent again without stepping again.
    last_cmd: Option<u64>,
    answered: bool,
    _stop: crate::stop::StopInputs,
    _token: zenoh::liveliness::LivelinessToken,
    _cmd_sub: zenoh::pubsub::Subscriber<()>,
    _reset_q: zenoh::query::Queryable<()>,
    _spec_q: zenoh::query::Queryable<()>,
}

/// Counters of a served robot, returned when it stops.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ServeStats {
    /// Steps executed.
    pub steps: u64,
    /// Resets answered.
    pub resets: u64,
    /// Realtime ticks without a fresh command (the robot held).
    pub holds: u64,
    /// Commands rejected (malformed, the wrong size, or the queue full).
    pub rejected_commands: u64,
    /// Times the watchdog found no controller and held the robot.
    pub watchdog_trips: u64,
    /// Commands the e-stop turned into holds (latched or paused).
    pub held_while_stopped: u64,
    /// Lockstep: commands that came again with the number of the last one executed (their
    /// observation was lost on the way, or the controller gave up waiting), answered with the
    /// same observation without stepping.
    pub repeated_commands: u64,
}

/// Live counters of a served robot, readable from any thread while it runs.
#[derive(Debug, Default)]
pub struct ServeCounters {
    /// Commands from a controller executed.
    pub commands: AtomicU64,
    /// Times the watchdog found no controller and held the robot.
    pub watchdog_trips: AtomicU64,
    /// The watchdog holds the robot now (no command for longer than the watchdog period).
    pub holding: AtomicBool,
    /// Commands the e-stop turned into holds.
    pub held_while_stopped: AtomicU64,
    /// Lockstep: commands answered again without stepping (see [`ServeStats`]).
    pub repeated_commands: AtomicU64,
}

impl<R: Robot> RobotServer<R> {
    /// Declares everything on the bus under `reflex/<robot>/...`, where `<robot>` is the spec's
    /// name.
    ///
    /// The server obeys the robot's e-stop on its own (`estop` events, an operator's release
    /// and resume addressed to the robot): while it is latched or paused every command becomes
    /// the robot's hold, resets are refused, and a move the robot makes on its own (a reset)
    /// stops. It reports that e-stop itself on `reflex/<robot>/stop/robot` (published and
    /// queryable), so an operator can release and resume it with no actor running.
    pub fn new(session: &zenoh::Session, mut robot: R, mode: ServeMode) -> Result<Self, BusError> {
        let mut spec = robot.spec().clone();
        spec.lockstep = matches!(mode, ServeMode::Lockstep);
        if let ServeMode::Realtime { hz } = mode {
            spec.control_hz = hz;
        }
        let keys = Keys::new(&spec.name)?;
        let declare = |key: &str, e: zenoh::Error| BusError::Declare {
            key: key.into(),
            message: e.to_string(),
        };
        // Bound: a controller that floods commands faster than the robot steps is told by
        // back-pressure on its own side; 256 covers any burst a well-behaved controller sends.
        let (tx, rx) = channel::bounded::<Incoming>(256);
        let cmd_rejects = crate::Rejects::new(&keys.cmd);
        let cmd_sub =
            command_subscriber(session, &keys, spec.action.dim(), tx.clone(), &cmd_rejects)
                .map_err(|e| declare(&keys.cmd, e))?;
        let reset_q = reset_queryable(session, &keys, tx).map_err(|e| declare(&keys.reset, e))?;
        let spec_bytes = msg::encode(&spec);
        let spec_key = keys.spec.clone();
        let spec_q = session
            .declare_queryable(keys.spec.clone())
            .callback(move |query| {
                let _ = query.reply(spec_key.clone(), spec_bytes.clone()).wait();
            })
            .wait()
            .map_err(|e| declare(&keys.spec, e))?;
        let obs_pub = session
            .declare_publisher(keys.obs.clone())
            .express(true)
            .congestion_control(zenoh::qos::CongestionControl::Block)
            .wait()
            .map_err(|e| declare(&keys.obs, e))?;
        let events_pub = session
            .declare_publisher(keys.events.clone())
            .wait()
            .map_err(|e| declare(&keys.events, e))?;
        let stop = StopSwitch::new();
        let (event_rejects, operator_rejects) = (
            crate::Rejects::new(&keys.events),
            crate::Rejects::new(&keys.operator),
        );
        let stop_inputs = crate::stop::StopInputs::open(
            session,
            &keys,
            StopHolder::Robot,
            stop.clone(),
            event_rejects.clone(),
            operator_rejects.clone(),
        )?
        .publishing(
            session,
            &keys,
            StopHolder::Robot,
            stop.clone(),
            vec![event_rejects, operator_rejects],
        )?;
        robot.attach_stop(stop.clone());
        let token = session
            .liveliness()
            .declare_token(keys.alive_robot.clone())
            .wait()
            .map_err(|e| declare(&keys.alive_robot, e))?;
        let hold = vec![0.0; spec.action.dim()];
        let watchdog = match mode {
            // Five periods without a command, and never less than 50 ms.
            ServeMode::Realtime { hz } => Duration::from_secs_f64((5.0 / hz).max(0.05)),
            ServeMode::Lockstep => Duration::MAX,
        };
        Ok(RobotServer {
            robot,
            keys,
            mode,
            rx,
            obs_pub,
            events_pub,
            buf: Vec::with_capacity(4096),
            hold,
            seed: None,
            cmd_rejects,
            counters: Arc::default(),
            watchdog,
            filter: None,
            reference: vec![0.0; spec.action.dim()],
            periods: 1,
            stop,
            last_cmd: None,
            answered: false,
            _stop: stop_inputs,
            _token: token,
            _cmd_sub: cmd_sub,
            _reset_q: reset_q,
            _spec_q: spec_q,
        })
    }

    /// The key expressions served.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// Live counters (commands, watchdog trips, holding now).
    pub fn counters(&self) -> Arc<ServeCounters> {
        self.counters.clone()
    }

    /// Commands rejected so far (malformed, the wrong size, the queue full, or refused by the
    /// filter), with their key.
    pub fn command_rejects(&self) -> std::sync::Arc<crate::Rejects> {
        self.cmd_rejects.clone()
    }

    /// Checks every command with `filter` before the robot executes it ([`CommandFilter`]).
    pub fn with_filter(mut self, filter: CommandFilter) -> Self {
        self.filter = Some(filter);
        self
    }

    /// The e-stop this server obeys (raised and released from the bus; tests may act on it).
    pub fn stop_switch(&self) -> Arc<StopSwitch> {
        self.stop.clone()
    }

    /// Sends the robot its hold.
    fn hold(&mut self) -> Result<(), RobotError> {
        self.robot.hold_action(&mut self.hold);
        let hold = std::mem::take(&mut self.hold);
        let r = self.robot.command(&hold);
        self.hold = hold;
        r
    }

    /// A controller's command, unless the e-stop holds the robot or the filter refuses it
    /// (then the robot holds).
    fn execute(&mut self, c: &Command) -> Result<(), RobotError> {
        if !self.stop.may_move() {
            self.counters
                .held_while_stopped
                .fetch_add(1, Ordering::Relaxed);
            return self.hold();
        }
        if let Some(f) = self.filter {
            self.robot.hold_action(&mut self.reference);
            if let Err(why) = f.check(
                &self.robot.spec().action,
                &c.action,
                &self.reference,
                self.periods,
            ) {
                self.cmd_rejects.reject(&format_args!(
                    "command {} refused by the robot's filter: {why}",
                    c.seq
                ));
                return self.hold();
            }
        }
        self.periods = 1;
        self.robot.command(&c.action)
    }

    /// A free-running robot whose controller has sent nothing for `after` is held, counted and
    /// logged once, until commands resume (default: five periods, at least 50 ms). Every tick
    /// without a fresh command holds anyway; the watchdog makes a lost link visible.
    pub fn with_watchdog(mut self, after: Duration) -> Self {
        if matches!(self.mode, ServeMode::Realtime { .. }) {
            self.watchdog = after;
        }
        self
    }

    /// Notes a command from the controller at `now` (ends a watchdog hold).
    fn fed(&mut self, now: Instant, last: &mut Option<Instant>) {
        if let Some(t) = *last
            && self.counters.holding.swap(false, Ordering::Relaxed)
        {
            tracing::info!(
                "robot `{}`: commands resumed after {:.2} s without a controller",
                self.keys.robot,
                now.duration_since(t).as_secs_f64()
            );
        }
        *last = Some(now);
        self.counters.commands.fetch_add(1, Ordering::Relaxed);
    }

    /// Trips the watchdog when commands had been flowing and stopped for longer than allowed.
    fn starved(&mut self, now: Instant, last: Option<Instant>) {
        if let Some(t) = last
            && now.duration_since(t) > self.watchdog
            && !self.counters.holding.swap(true, Ordering::Relaxed)
        {
            self.counters.watchdog_trips.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                "robot `{}`: no command on `{}` for {} ms: holding until a controller returns",
                self.keys.robot,
                self.keys.cmd,
                now.duration_since(t).as_millis()
            );
        }
    }

    fn event(&mut self, kind: EventKind, obs_episode: u64, step: u32) {
        let ev = EpisodeEvent {
            v: PROTOCOL_VERSION,
            kind,
            episode: obs_episode,
            step,
            seed: self.seed,
            source: "robot".into(),
            act: 0,
        };
        if let Err(e) = self.events_pub.put(msg::encode(&ev)).wait() {
            tracing::warn!("cannot publish on {}: {e}", self.keys.events);
        }
    }

    fn publish_obs(&mut self, seq: u64) -> Result<(), RobotError> {
        let obs = self.robot.observe()?;
        let (episode, step, done, success, truncated) = (
            obs.episode,
            obs.step,
            obs.done(),
            obs.success,
            obs.truncated,
        );
        let mut o = obs.clone();
        o.seq = seq;
        msg::encode_into(&o, &mut self.buf);
        self.obs_pub
            .put(self.buf.as_slice())
            .wait()
            .map_err(|e| bus_err(&self.keys.obs, e))?;
        if done {
            self.event(
                if success {
                    EventKind::Success
                } else if truncated {
                    EventKind::Done
                } else {
                    EventKind::Failure
                },
                episode,
                step,
            );
            if success {
                self.event(EventKind::Done, episode, step);
            }
        }
        Ok(())
    }

    fn handle_reset(
        &mut self,
        query: zenoh::query::Query,
        seed: Option<u64>,
        seq: u64,
    ) -> Result<(), RobotError> {
        if !self.stop.may_move() {
            let r = &self.keys.robot;
            let _ = query
                .reply_err(format!(
                    "robot `{r}`: its server's emergency stop is {} (raised by {}): no reset until it is released and resumed (`reflex estop release --robot {r}`, then `reflex estop resume --robot {r}`, from any computer on its bus)",
                    self.stop.state().as_str(),
                    self.stop.raised_by()
                ))
                .wait();
            return Ok(());
        }
        self.seed = seed;
        // A repeat of the last command of the previous episode is stale now, not lost.
        self.answered = false;
        match self.robot.reset(seed) {
            Ok(obs) => {
                let mut o = obs.clone();
                o.seq = seq;
                let (episode, step) = (o.episode, o.step);
                let bytes = msg::encode(&o);
                query
                    .reply(self.keys.reset.clone(), bytes)
                    .wait()
                    .map_err(|e| bus_err(&self.keys.reset, e))?;
                self.event(EventKind::Reset, episode, step);
                // The controller's first command steps from the pose it measured: two steps.
                self.periods = 2;
                Ok(())
            }
            Err(e) => {
                let _ = query.reply_err(e.to_string()).wait();
                Err(e)
            }
        }
    }

    /// Lockstep: command `seq` came again. A controller sends a command again only when no
    /// observation answered it, so it gets the same observation again (still in `buf`), and the
    /// robot does not step twice; a repeat of the last command before a reset is ignored.
    fn repeat(&mut self, seq: u64) -> Result<(), RobotError> {
        if !self.answered {
            self.cmd_rejects.reject(&format_args!(
                "command {seq} came again after a reset: ignored (it belonged to the episode before)"
            ));
            return Ok(());
        }
        let n = self
            .counters
            .repeated_commands
            .fetch_add(1, Ordering::Relaxed)
            + 1;
        tracing::warn!(
            "robot `{}`: command {seq} came again ({n} so far): its observation was lost on the way or came late; sent it again without stepping",
            self.keys.robot
        );
        self.obs_pub
            .put(self.buf.as_slice())
            .wait()
            .map_err(|e| bus_err(&self.keys.obs, e))
    }

    /// Serves until `stop` is set. Returns the counters.
    pub fn run(&mut self, stop: &AtomicBool) -> Result<ServeStats, RobotError> {
        let mut stats = self.serve(stop)?;
        stats.rejected_commands = self.cmd_rejects.count();
        stats.watchdog_trips = self.counters.watchdog_trips.load(Ordering::Relaxed);
        stats.held_while_stopped = self.counters.held_while_stopped.load(Ordering::Relaxed);
        stats.repeated_commands = self.counters.repeated_commands.load(Ordering::Relaxed);
        Ok(stats)
    }

    fn serve(&mut self, stop: &AtomicBool) -> Result<ServeStats, RobotError> {
        let mut stats = ServeStats::default();
        let mut seq = 0u64;
        match self.mode {
            ServeMode::Lockstep => {
                while !stop.load(Ordering::Relaxed) {
                    match self.rx.recv_timeout(Duration::from_millis(50)) {
                        Ok(Incoming::Cmd(c)) if self.last_cmd == Some(c.seq) => {
                            self.repeat(c.seq)?;
                        }
                        Ok(Incoming::Cmd(c)) => {
                            seq = c.seq;
                            self.last_cmd = Some(seq);
                            self.counters.commands.fetch_add(1, Ordering::Relaxed);
                            if let Err(e) = self.execute(&c) {
                                tracing::warn!("command {} rejected: {e}", c.seq);
                            } else {
                                stats.steps += 1;
                            }
                            self.publish_obs(seq)?;
                            self.answered = true;
                        }
                        Ok(Incoming::Reset(q, s)) => {
                            stats.resets += 1;
                            if let Err(e) = self.handle_reset(q, s, seq) {
                                tracing::warn!("reset failed: {e}");
                            }
                        }
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                }
            }
            ServeMode::Realtime { hz } => self.serve_realtime(hz, stop, &mut stats)?,
        }
        Ok(stats)
    }

    /// Free-running: one tick per period, the newest command or a hold, an observation each tick.
    fn serve_realtime(
        &mut self,
        hz: f64,
        stop: &AtomicBool,
        stats: &mut ServeStats,
    ) -> Result<(), RobotError> {
        let mut seq = 0u64;
        let period = Duration::from_secs_f64(1.0 / hz);
        let mut next = Instant::now() + period;
        let mut pending: Option<Command> = None;
        let mut last_cmd: Option<Instant> = None;
        while !stop.load(Ordering::Relaxed) {
            // Collect what arrived until the tick.
            loop {
                let left = next.saturating_duration_since(Instant::now());
                match self.rx.recv_timeout(left) {
                    Ok(Incoming::Cmd(c)) => {
                        if pending.replace(c).is_some() {
                            // Skipped for a newer one: the newer may lie a step further.
                            self.periods = self.periods.saturating_add(1);
                        }
                    }
                    Ok(Incoming::Reset(q, s)) => {
                        stats.resets += 1;
                        pending = None;
                        // A new episode: the controller's first command is not late yet.
                        last_cmd = last_cmd.map(|_| Instant::now());
                        if let Err(e) = self.handle_reset(q, s, seq) {
                            tracing::warn!("reset failed: {e}");
                        }
                    }
                    Err(RecvTimeoutError::Timeout) => break,
                    Err(RecvTimeoutError::Disconnected) => return Ok(()),
                }
            }
            next += period;
            let now = Instant::now();
            if next < now {
                // Fell behind (e.g. a slow reset): restart the schedule instead of bursting.
                next = now + period;
            }
            let result = match pending.take() {
                Some(c) => {
                    seq = c.seq;
                    self.fed(now, &mut last_cmd);
                    self.execute(&c)
                }
                None => {
                    stats.holds += 1;
                    self.starved(now, last_cmd);
                    // A delta command is applied once; between commands the robot holds.
                    self.hold()
                }
            };
            match result {
                Ok(()) => stats.steps += 1,
                Err(e) => tracing::warn!("tick command rejected: {e}"),
            }
            self.publish_obs(seq)?;
        }
        Ok(())
    }

    /// Runs the server on its own thread until the returned handle is stopped.
    pub fn spawn(mut self) -> ServerHandle<R>
    where
        R: 'static,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("serve-{}", self.keys.robot))
            .spawn(move || {
                let stats = self.run(&s);
                (self, stats)
            })
            .expect("spawn robot server thread");
        ServerHandle {
            stop,
            thread: Some(thread),
        }
    }

    /// Gives the robot back.
    pub fn into_robot(self) -> R {
        self.robot
    }
}

type ServeResult<R> = (RobotServer<R>, Result<ServeStats, RobotError>);

/// A [`RobotServer`] running on its own thread.
pub struct ServerHandle<R: Robot + 'static> {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<ServeResult<R>>>,
}

impl<R: Robot + 'static> ServerHandle<R> {
    /// Stops the server and returns its counters.
    pub fn stop(mut self) -> Result<ServeStats, RobotError> {
        self.stop.store(true, Ordering::Relaxed);
        let (_, stats) = self
            .thread
            .take()
            .expect("joined once")
            .join()
            .expect("robot server thread panicked");
        stats
    }
}

impl<R: Robot + 'static> Drop for ServerHandle<R> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Refuses a spec of another robot, or absolute joint actions without measured joint
/// positions to hold them at; returns the range of `joint_pos` in the state.
fn check_spec(
    spec: &RobotSpec,
    robot: &str,
    keys: &Keys,
) -> Result<Option<std::ops::Range<usize>>, RobotError> {
    if spec.name != robot {
        return Err(RobotError::Device {
            robot: robot.into(),
            message: format!(
                "`{}` answered with the spec of robot `{}`",
                keys.spec, spec.name
            ),
        });
    }
    let joint_field = spec.field("joint_pos");
    if spec.action.kind == ActionKind::JointAbs
        && joint_field.as_ref().map(|r| r.len()) != Some(spec.action.dim())
    {
        return Err(RobotError::Device {
            robot: robot.into(),
            message: format!(
                "its actions are absolute joint targets ({} of them) but its state has no `joint_pos` field of that size: without measured joint positions no hold can keep it where it is; add `joint_pos` to its spec",
                spec.action.dim()
            ),
        });
    }
    Ok(joint_field)
}

/// A remote robot's observations: the subscriber, the queue the loop reads, the episode ends
/// set aside, and the counts of what was refused or dropped.
struct ObsInput {
    sub: zenoh::pubsub::Subscriber<()>,
    rx: Receiver<Observation>,
    aside: Arc<Aside>,
    rejects: Arc<crate::Rejects>,
    dropped: Arc<crate::Rejects>,
}

fn subscribe_observations(
    session: &zenoh::Session,
    keys: &Keys,
    spec: &RobotSpec,
    heard: &Arc<Heard>,
) -> Result<ObsInput, RobotError> {
    // Observations are decoded and checked against the spec on Zenoh's thread and handed
    // over through a small queue; the newest matters, older ones are skipped by `observe`.
    // One that does not fit the spec never reaches the loop: it is counted and dropped.
    // When the loop falls 64 behind, the oldest is dropped (counted) to make room for the
    // newest, except an episode's end, which waits aside until the loop takes it.
    let (tx, obs_rx) = channel::bounded::<Observation>(OBS_QUEUE);
    let aside = Arc::new(Aside::default());
    let rejects = crate::Rejects::new(&keys.obs);
    let dropped = crate::Rejects::new(&format!("{} (oldest dropped, loop behind)", keys.obs));
    let (obs_key, r, sp) = (keys.obs.clone(), rejects.clone(), spec.clone());
    let (oldest, a, d) = (obs_rx.clone(), aside.clone(), dropped.clone());
    let h = heard.clone();
    let sub = session
        .declare_subscriber(keys.obs.clone())
        .callback(move |sample| {
            let o = match msg::decode::<Observation>(&obs_key, &sample.payload().to_bytes()) {
                Ok(o) => o,
                Err(e) => return r.reject(&e),
            };
            // An answer, even one refused below: asking for it again would get it again.
            h.seq(o.seq);
            if let Err(e) = o.check_against(&sp) {
                return r.reject(&e);
            }
            let mut o = without_frame_counters(o);
            for _ in 0..2 {
                match tx.try_send(o) {
                    Ok(()) => return,
                    Err(channel::TrySendError::Disconnected(_)) => return,
                    Err(channel::TrySendError::Full(back)) => o = back,
                }
                if let Ok(old) = oldest.try_recv() {
                    if old.done() {
                        if let Ok(mut g) = a.ends.lock() {
                            g.push_back(old);
                            a.pending.store(g.len(), Ordering::Release);
                        }
                    } else {
                        a.add_reward(old.reward);
                        d.reject(&format_args!(
                            "the loop is {OBS_QUEUE} observations behind: dropped the oldest (seq {}) for the newest",
                            old.seq
                        ));
                    }
                }
            }
            d.reject(&"the observation queue stayed full: dropped the newest");
        })
        .wait()
        .map_err(|e| bus_err(&keys.obs, e))?;
    Ok(ObsInput {
        sub,
        rx: obs_rx,
        aside,
        rejects,
        dropped,
    })
}
