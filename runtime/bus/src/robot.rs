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
    self, Command, EpisodeEvent, EventKind, Observation, PROTOCOL_VERSION, ResetRequest, RobotSpec,
};
use reflex_contracts::robot::{Robot, RobotError, check_action};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    obs: Observation,
    have_obs: bool,
    seq: u64,
    episode_floor: u64,
    timeout: Duration,
    poll_window: Duration,
    buf: Vec<u8>,
    cmd: Command,
    rejects: std::sync::Arc<crate::Rejects>,
    _obs_sub: zenoh::pubsub::Subscriber<()>,
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
        // Everything below indexes by the spec's sizes: a spec that does not hold together is
        // refused here, before the loop sees it.
        spec.validate()?;
        if spec.name != robot {
            return Err(RobotError::Device {
                robot: robot.into(),
                message: format!(
                    "`{}` answered with the spec of robot `{}`",
                    keys.spec, spec.name
                ),
            });
        }
        // Observations are decoded and checked against the spec on Zenoh's thread and handed
        // over through a small channel; the newest matters, older ones are skipped by `observe`.
        // One that does not fit the spec never reaches the loop: it is counted and dropped.
        let (tx, obs_rx) = channel::bounded::<Observation>(64);
        let rejects = crate::Rejects::new(&keys.obs);
        let (obs_key, r, sp) = (keys.obs.clone(), rejects.clone(), spec.clone());
        let obs_sub = session
            .declare_subscriber(keys.obs.clone())
            .callback(move |sample| {
                let o = match msg::decode::<Observation>(&obs_key, &sample.payload().to_bytes()) {
                    Ok(o) => o,
                    Err(e) => return r.reject(&e),
                };
                if let Err(e) = o.check_against(&sp) {
                    return r.reject(&e);
                }
                let _ = tx.try_send(o);
            })
            .wait()
            .map_err(|e| bus_err(&keys.obs, e))?;
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
        Ok(RemoteRobot {
            session: session.clone(),
            keys,
            spec,
            cmd_pub,
            obs_rx,
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
            _obs_sub: obs_sub,
        })
    }

    /// Observations rejected so far (malformed, or not fitting the spec), with their key.
    pub fn rejects(&self) -> std::sync::Arc<crate::Rejects> {
        self.rejects.clone()
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

    fn timeout_err(&self, key: &str) -> RobotError {
        RobotError::Timeout {
            robot: self.keys.robot.clone(),
            key: key.to_string(),
            timeout: self.timeout,
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
        },
    })
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
        let obs: Observation = query(
            &self.session,
            &self.keys.reset,
            &self.keys.robot,
            req,
            self.timeout,
        )?;
        obs.check_against(&self.spec)?;
        // Anything queued from the previous episode is stale now.
        while self.obs_rx.try_recv().is_ok() {}
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
            let deadline = Instant::now() + self.timeout;
            loop {
                match self.recv_until(deadline) {
                    Some(o) if o.seq >= self.seq => {
                        self.obs = o;
                        self.have_obs = true;
                        return Ok(&self.obs);
                    }
                    Some(_) => continue,
                    None => return Err(self.timeout_err(&self.keys.obs)),
                }
            }
        }
        let mut reward = 0.0;
        let mut got = false;
        if !self.have_obs {
            match self.obs_rx.recv_timeout(self.timeout) {
                Ok(o) => {
                    reward += o.reward;
                    self.obs = o;
                    got = true;
                }
                Err(_) => return Err(self.timeout_err(&self.keys.obs)),
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

    fn hold_action(&self, out: &mut [f32]) {
        // Without a model of the remote robot the neutral action is the midpoint for absolute
        // spaces; delta spaces hold with zero steps. Servers apply their own hold between commands.
        for (i, o) in out.iter_mut().enumerate() {
            let (lo, hi) = (self.spec.action.low[i], self.spec.action.high[i]);
            *o = if lo <= 0.0 && hi >= 0.0 {
                0.0
            } else {
                0.5 * (lo + hi)
            };
        }
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
    _token: zenoh::liveliness::LivelinessToken,
    _cmd_sub: zenoh::pubsub::Subscriber<()>,
    _reset_q: zenoh::query::Queryable<()>,
    _spec_q: zenoh::query::Queryable<()>,
}

/// Counters of a served robot, returned when it stops.
#[derive(Clone, Debug, Default)]
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
}

impl<R: Robot> RobotServer<R> {
    /// Declares everything on the bus under `reflex/<robot>/...`, where `<robot>` is the spec's
    /// name.
    pub fn new(session: &zenoh::Session, robot: R, mode: ServeMode) -> Result<Self, BusError> {
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
        self.seed = seed;
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
                Ok(())
            }
            Err(e) => {
                let _ = query.reply_err(e.to_string()).wait();
                Err(e)
            }
        }
    }

    /// Serves until `stop` is set. Returns the counters.
    pub fn run(&mut self, stop: &AtomicBool) -> Result<ServeStats, RobotError> {
        let mut stats = self.serve(stop)?;
        stats.rejected_commands = self.cmd_rejects.count();
        stats.watchdog_trips = self.counters.watchdog_trips.load(Ordering::Relaxed);
        Ok(stats)
    }

    fn serve(&mut self, stop: &AtomicBool) -> Result<ServeStats, RobotError> {
        let mut stats = ServeStats::default();
        let mut seq = 0u64;
        match self.mode {
            ServeMode::Lockstep => {
                while !stop.load(Ordering::Relaxed) {
                    match self.rx.recv_timeout(Duration::from_millis(50)) {
                        Ok(Incoming::Cmd(c)) => {
                            seq = c.seq;
                            self.counters.commands.fetch_add(1, Ordering::Relaxed);
                            if let Err(e) = self.robot.command(&c.action) {
                                tracing::warn!("command {} rejected: {e}", c.seq);
                            } else {
                                stats.steps += 1;
                            }
                            self.publish_obs(seq)?;
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
                    Ok(Incoming::Cmd(c)) => pending = Some(c),
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
                    self.robot.command(&c.action)
                }
                None => {
                    stats.holds += 1;
                    self.starved(now, last_cmd);
                    // A delta command is applied once; between commands the robot holds.
                    self.robot.hold_action(&mut self.hold);
                    let hold = std::mem::take(&mut self.hold);
                    let r = self.robot.command(&hold);
                    self.hold = hold;
                    r
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
