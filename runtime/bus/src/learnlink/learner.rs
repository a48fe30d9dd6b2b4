//! The learner's end of the link, for one robot or a fleet of them.
//!
//! Every actor (a robot's name plus the random id of its process) has its own numbered stream:
//! the learner accepts only the number it expects next from that actor (duplicates dropped, gaps
//! refused so the actor resends), acknowledges what it persisted to that actor alone, and keeps
//! every actor's position in its checkpoint, so a restarted learner tells each actor where to
//! resend from. All actors feed one replay (the learner's [`Accepted::robot`] tags each batch).
//! Actors join and leave at any time. A robot whose spec does not fit the fleet's (other state
//! fields, actions or cameras) is refused: its batches are counted and its actor is told why.
//! Weights go to every accepted robot: one version sequence for the whole fleet.

use super::{LinkError, err};
use crate::Rejects;
use reflex_contracts::keys::{BadName, Keys};
use reflex_contracts::msg::{
    self, LearnerState, PROTOCOL_VERSION, RobotSpec, TransitionBatch, WeightsChunk, WireStep,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zenoh::Wait;

/// Batches the learner's receive queue holds. An actor sends at most `max_in_flight` (16,384)
/// steps ahead of the learner, in batches of up to 64 steps and usually at least a few (a batch
/// goes out at an episode's end or after `flush_ms`): 1024 batches cover that with room to spare.
/// A fleet shares the queue; each actor's window still bounds what it alone can queue.
pub const LEARNER_QUEUE_BATCHES: usize = 1024;

/// Floats per weight chunk on the wire (64 KiB of payload).
pub const WEIGHTS_CHUNK: usize = 16 * 1024;

/// An actor silent this long, everything it sent persisted, is forgotten: its position is no
/// longer published nor kept in checkpoints (an actor process that comes back after that is
/// taken from what it still holds, which is exactly what was persisted).
pub const FORGET_ACTOR_AFTER: Duration = Duration::from_secs(3600);

/// Robots one learner keeps records of at most, and actors: batches from more are refused and
/// counted (`too_many`), so a peer that invents names or actor ids cannot grow the learner
/// without bound (nor make it read a spec for each).
pub const MAX_ROBOTS: usize = 256;
/// See [`MAX_ROBOTS`].
pub const MAX_ACTORS: usize = 4096;

/// The robots a learner serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fleet {
    /// These robots, by name.
    Robots(Vec<String>),
    /// Every robot whose actor sends transitions on the bus (`reflex/*/learn/transitions`).
    Any,
}

impl Fleet {
    /// One robot.
    pub fn one(robot: &str) -> Result<Self, BadName> {
        Self::from_names(&[robot.to_string()])
    }

    /// Robots by name (each checked, duplicates dropped); `*` alone means every robot.
    pub fn from_names(names: &[String]) -> Result<Self, BadName> {
        if names.iter().any(|n| n == "*") {
            return Ok(Fleet::Any);
        }
        let mut v: Vec<String> = Vec::new();
        for n in names {
            Keys::new(n)?;
            if !v.contains(n) {
                v.push(n.clone());
            }
        }
        if v.is_empty() {
            return Err(BadName(String::new()));
        }
        Ok(Fleet::Robots(v))
    }

    /// `reflex/<robot>/<suffix>` for each robot, or `reflex/*/<suffix>`.
    pub fn keys(&self, suffix: &str) -> Vec<String> {
        match self {
            Fleet::Robots(r) => r.iter().map(|r| format!("reflex/{r}/{suffix}")).collect(),
            Fleet::Any => vec![format!("reflex/*/{suffix}")],
        }
    }
}

impl std::fmt::Display for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fleet::Robots(r) if r.len() == 1 => write!(f, "robot `{}`", r[0]),
            Fleet::Robots(r) => write!(f, "robots {}", r.join(", ")),
            Fleet::Any => write!(f, "every robot on the bus"),
        }
    }
}

/// The robot a `reflex/<robot>/...` key is about (a checked name), if any.
fn robot_of(key: &str) -> Option<&str> {
    let robot = key.strip_prefix("reflex/")?.split('/').next()?;
    Keys::new(robot).ok().map(|_| robot)
}

/// The spec of the first robot of `fleet` that answers (the actor's on `trace/spec`, else the
/// robot's own on `spec`), waiting up to `wait`: the spec a fleet's learner is built for.
pub fn first_spec(
    session: &zenoh::Session,
    fleet: &Fleet,
    wait: Duration,
) -> Result<(String, RobotSpec), LinkError> {
    let t0 = Instant::now();
    let keys: Vec<String> = fleet
        .keys("trace/spec")
        .into_iter()
        .chain(fleet.keys("spec"))
        .collect();
    loop {
        for key in &keys {
            let replies = session
                .get(key.clone())
                .timeout(Duration::from_millis(500))
                .wait()
                .map_err(|e| err(key, e))?;
            while let Ok(r) = replies.recv() {
                if let Ok(s) = r.result()
                    && let Some(robot) = robot_of(s.key_expr().as_str())
                    && let Ok(spec) = msg::decode::<RobotSpec>(key, &s.payload().to_bytes())
                {
                    return Ok((robot.to_string(), spec));
                }
            }
        }
        if t0.elapsed() >= wait {
            return Err(err(
                &keys.join(", "),
                format!(
                    "no spec from {fleet} within {:.0} s: is its `reflex run` (or `reflex sim serve`) up and on this learner's bus (--connect/--listen)?",
                    wait.as_secs_f64()
                ),
            ));
        }
        // Paces the asking while no robot is there.
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// What makes `other`'s steps unfit for a learner built for `fleet`'s spec, if anything: other
/// state fields, another action space (kind, names, bounds) or other cameras. Name, rate, scene
/// and state bounds may differ between robots of one fleet.
pub fn spec_mismatch(fleet: &RobotSpec, other: &RobotSpec) -> Option<String> {
    let state = |s: &RobotSpec| -> Vec<String> {
        s.state
            .iter()
            .map(|f| format!("{}[{}]", f.name, f.size))
            .collect()
    };
    let cams = |s: &RobotSpec| -> Vec<String> {
        s.cameras
            .iter()
            .map(|c| format!("{} {}x{}", c.name, c.width, c.height))
            .collect()
    };
    let (a, b) = (&fleet.action, &other.action);
    if state(fleet) != state(other) {
        Some(format!(
            "its state is {:?}, the fleet's {:?}",
            state(other),
            state(fleet)
        ))
    } else if (a.kind, &a.names) != (b.kind, &b.names) {
        Some(format!(
            "its actions are {:?} {:?}, the fleet's {:?} {:?}",
            b.kind, b.names, a.kind, a.names
        ))
    } else if (&a.low, &a.high) != (&b.low, &b.high) {
        Some(format!(
            "its action bounds are {:?}..{:?}, the fleet's {:?}..{:?}",
            b.low, b.high, a.low, a.high
        ))
    } else if cams(fleet) != cams(other) {
        Some(format!(
            "its cameras are {:?}, the fleet's {:?}",
            cams(other),
            cams(fleet)
        ))
    } else {
        None
    }
}

/// Where the learner stands with one actor; a checkpoint keeps it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ActorPosition {
    /// The actor's robot.
    pub robot: String,
    /// The actor's id (random per actor process).
    pub actor: u64,
    /// Next sequence number accepted from it.
    pub received: u64,
    /// Everything before this is in a checkpoint.
    pub persisted: u64,
}

/// Where a learner's link stands: each actor's position and the newest weights version.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LinkPosition {
    /// Every actor the learner knows.
    pub actors: Vec<ActorPosition>,
    /// Newest weights version published.
    pub weights_version: u64,
}

impl LinkPosition {
    /// Steps received from all actors.
    pub fn received(&self) -> u64 {
        self.actors.iter().map(|a| a.received).sum()
    }

    /// Steps persisted from all actors.
    pub fn persisted(&self) -> u64 {
        self.actors.iter().map(|a| a.persisted).sum()
    }
}

/// One actor as its learner sees it: a line of `reflex learn`'s status, an entry of its report.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct ActorStatus {
    /// The actor's robot.
    pub robot: String,
    /// The actor's id, hex.
    pub actor: String,
    /// Next sequence number accepted (steps received, counting from the actor's first).
    pub received: u64,
    /// Steps persisted in the learner's checkpoint.
    pub persisted: u64,
    /// Steps the actor has numbered that the learner has not received yet.
    pub behind: u64,
    /// Where this learner took the actor up (its checkpoint's position, or the first step the
    /// actor still held when it joined).
    pub resumed_at: u64,
    /// Steps dropped as duplicates (resends).
    pub duplicates_dropped: u64,
    /// Batches refused after a missing one.
    pub gaps_refused: u64,
    /// Steps received per second over the last few seconds.
    pub steps_per_s: f64,
    /// Steps the learner trained on (the rest were stored without updates while it was behind).
    pub trained: u64,
    /// Steps trained on per second over the last few seconds (times the update-to-data ratio:
    /// this actor's share of the updates).
    pub trained_per_s: f64,
    /// Seconds since its last batch (`None`: not heard since this learner started).
    pub last_seen_s: Option<f64>,
}

/// Counters of the learner's side of the link (all actors).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LearnerLinkStats {
    /// Steps dropped because they had been received before (resends).
    pub duplicates_dropped: u64,
    /// Batches refused because one before them was missing.
    pub gaps_refused: u64,
    /// Batches that did not decode.
    pub undecodable: u64,
    /// Steps left out because they did not fit the robot (lengths, non-finite values).
    pub rejected_steps: u64,
    /// Batches dropped because the learner's queue was full (the actor resends them).
    pub queue_full: u64,
    /// Batches refused because their robot's spec is not the fleet's.
    pub refused_spec: u64,
    /// Batches put off because their robot's spec could not be read yet (the actor resends).
    pub spec_unknown: u64,
    /// Batches refused because the learner already knows [`MAX_ROBOTS`] robots or
    /// [`MAX_ACTORS`] actors.
    pub too_many: u64,
}

/// Steps a learner should take, in order.
#[derive(Debug, Default)]
pub struct Accepted {
    /// The actor's robot: every step of the batch is tagged with it.
    pub robot: String,
    /// The actor.
    pub actor: u64,
    /// A new actor started this batch (the learner starts a new stream for it).
    pub new_actor: bool,
    /// The steps not received before, consecutive (malformed ones left out and counted).
    pub steps: Vec<WireStep>,
    /// The actor is stopping: persist now.
    pub flush: bool,
}

/// The sizes a learner expects of every step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepShape {
    /// Observation length.
    pub obs: usize,
    /// Action length (the base action's too).
    pub act: usize,
    /// Learning from pixels: the encoder and map shapes every step's features must have; `None`:
    /// steps carry no features.
    pub features: Option<FeatureExpect>,
}

/// The features a learner that sees expects with every step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeatureExpect {
    /// The encoder's identity.
    pub encoder: String,
    /// Each camera's map, `[channels, height, width]`.
    pub shapes: Vec<[u32; 3]>,
}

impl FeatureExpect {
    /// Values in one step's maps (every camera).
    pub fn len(&self) -> usize {
        self.shapes
            .iter()
            .map(|s| s.iter().map(|d| *d as usize).product::<usize>())
            .sum()
    }

    /// No values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why a step does not fit the robot.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StepError {
    /// A vector of the wrong length.
    #[error("step {step} of episode {episode}: `{field}` has {got} values, the robot {want}")]
    Length {
        /// Episode of the step.
        episode: u64,
        /// Step index.
        step: u32,
        /// `obs`, `next_obs`, `action` or `base`.
        field: &'static str,
        /// Values sent.
        got: usize,
        /// Values the robot has.
        want: usize,
    },
    /// A value that is not finite.
    #[error("step {step} of episode {episode}: `{field}`[{index}] is {value}")]
    NotFinite {
        /// Episode of the step.
        episode: u64,
        /// Step index.
        step: u32,
        /// `obs`, `next_obs`, `action`, `base` or `reward`.
        field: &'static str,
        /// Position in the vector.
        index: usize,
        /// The value.
        value: f32,
    },
    /// Features that are not the ones the learner reads: missing, unexpected, from another
    /// encoder, or of other shapes.
    #[error("step {step} of episode {episode}: features {problem}")]
    Features {
        /// Episode of the step.
        episode: u64,
        /// Step index.
        step: u32,
        /// What is wrong.
        problem: String,
    },
}

impl StepShape {
    /// What is wrong with `s`, if anything: a length that is not the robot's, or a value that is
    /// not finite.
    pub fn check(&self, s: &WireStep) -> Result<(), StepError> {
        let (episode, step) = (s.episode, s.step);
        for (field, v, want) in [
            ("obs", &s.obs, self.obs),
            ("next_obs", &s.next_obs, self.obs),
            ("action", &s.action, self.act),
            ("base", &s.base, self.act),
        ] {
            if v.len() != want {
                return Err(StepError::Length {
                    episode,
                    step,
                    field,
                    got: v.len(),
                    want,
                });
            }
            if let Some(index) = v.iter().position(|x| !x.is_finite()) {
                return Err(StepError::NotFinite {
                    episode,
                    step,
                    field,
                    index,
                    value: v[index],
                });
            }
        }
        if !s.reward.is_finite() {
            return Err(StepError::NotFinite {
                episode,
                step,
                field: "reward",
                index: 0,
                value: s.reward,
            });
        }
        self.check_features(s)
    }

    fn check_features(&self, s: &WireStep) -> Result<(), StepError> {
        let (episode, step) = (s.episode, s.step);
        let problem = |p: String| StepError::Features {
            episode,
            step,
            problem: p,
        };
        let (want, got) = match (&self.features, &s.features) {
            (None, None) => return Ok(()),
            (Some(w), None) => {
                return Err(problem(format!(
                    "missing: this learner reads encoder `{}`'s maps with every step",
                    w.encoder
                )));
            }
            (None, Some(g)) => {
                return Err(problem(format!(
                    "from encoder `{}` sent to a learner without [learner.vision]",
                    g.encoder
                )));
            }
            (Some(w), Some(g)) => (w, g),
        };
        if got.encoder != want.encoder {
            return Err(problem(format!(
                "made by encoder `{}`, this learner's heads read encoder `{}`",
                got.encoder, want.encoder
            )));
        }
        if got.shapes != want.shapes {
            return Err(problem(format!(
                "of shapes {:?}, this learner's heads read {:?}",
                got.shapes, want.shapes
            )));
        }
        let n = want.len();
        for (field, v) in [("obs", &got.obs), ("next_obs", &got.next_obs)] {
            if v.len() != n {
                return Err(problem(format!(
                    "`{field}` has {} values where the shapes make {n}",
                    v.len()
                )));
            }
            if let Some(i) = v.iter().position(|x| !x.is_finite()) {
                return Err(problem(format!("`{field}`[{i}] is {}", v[i])));
            }
        }
        Ok(())
    }
}

/// Whether the learner takes a robot's steps.
enum Verdict {
    /// Its spec fits the fleet's (or the learner checks none).
    Accepted,
    /// Its spec does not fit: why.
    Refused(String),
    /// Its spec has not been read yet; the next attempt not before this.
    Unknown(Instant),
}

/// A robot the learner has heard of.
struct Robot {
    keys: Keys,
    verdict: Verdict,
    _token: zenoh::liveliness::LivelinessToken,
    last_refusal: Option<Instant>,
}

/// One actor's stream.
struct Actor {
    received: u64,
    persisted: u64,
    offered: u64,
    resumed_at: u64,
    duplicates: u64,
    gaps: u64,
    /// Its last batch (`None`: known from the checkpoint only).
    heard: Option<Instant>,
    /// Known since (this learner's start for one from the checkpoint).
    since: Instant,
    window: (u64, u64, Instant),
    rate: f64,
    trained: u64,
    trained_rate: f64,
}

impl Actor {
    fn new(at: u64, now: Instant) -> Self {
        Actor {
            received: at,
            persisted: at,
            offered: at,
            resumed_at: at,
            duplicates: 0,
            gaps: 0,
            heard: None,
            since: now,
            window: (at, 0, now),
            rate: 0.0,
            trained: 0,
            trained_rate: 0.0,
        }
    }
}

/// The learner's end of the link: takes every actor's numbered batches (per actor, only the
/// next expected number), reports what it holds of each on its robot's `learn/state`, publishes
/// versioned weights in chunks on every accepted robot's `learn/weights`, and holds a liveliness
/// token on each robot's `alive/learner`.
pub struct LearnerLink {
    session: zenoh::Session,
    fleet: Fleet,
    rx: crossbeam::channel::Receiver<(String, TransitionBatch)>,
    instance: u64,
    robots: BTreeMap<String, Robot>,
    actors: BTreeMap<(String, u64), Actor>,
    weights_version: u64,
    stats: LearnerLinkStats,
    undecodable: Arc<Rejects>,
    queue_full: Arc<Rejects>,
    step_rejects: Arc<Rejects>,
    refused: Arc<Rejects>,
    spec_unknown: Arc<Rejects>,
    weights: Vec<f32>,
    arch: u64,
    shape: Option<StepShape>,
    spec: Option<RobotSpec>,
    last_state: Instant,
    last_weights: Instant,
    buf: Vec<u8>,
    _subs: Vec<zenoh::pubsub::Subscriber<()>>,
}

impl LearnerLink {
    /// Declares the learner of `fleet` on the bus, resuming from `pos` (a checkpoint's, or the
    /// default). Until [`LearnerLink::expect_spec`] it takes every robot's steps unchecked.
    pub fn new(
        session: &zenoh::Session,
        fleet: &Fleet,
        pos: LinkPosition,
    ) -> Result<Self, LinkError> {
        // Bounded: an actor keeps at most `max_in_flight` steps ahead of what the learner took
        // (back-pressure on its side), so in normal operation the queue never fills; a batch
        // that finds it full (a flood from a broken or hostile peer) is dropped and counted,
        // and a real actor resends it when the learner reports the gap.
        let (tx, rx) = crossbeam::channel::bounded(LEARNER_QUEUE_BATCHES);
        let keys = fleet.keys("learn/transitions");
        let undecodable = Rejects::new(&keys.join(", "));
        let queue_full = Rejects::new(&format!("{} (learner queue full)", keys.join(", ")));
        let mut subs = Vec::new();
        for key in &keys {
            let (tx, bad, full) = (tx.clone(), undecodable.clone(), queue_full.clone());
            let sub = session
                .declare_subscriber(key.clone())
                .callback(move |s| {
                    let k = s.key_expr().as_str();
                    let Some(robot) = robot_of(k) else {
                        return bad.reject(&format_args!("`{k}` names no robot"));
                    };
                    let b = match msg::decode::<TransitionBatch>(k, &s.payload().to_bytes()) {
                        Ok(b) => b,
                        Err(e) => return bad.reject(&e),
                    };
                    if let Err(crossbeam::channel::TrySendError::Full((_, b))) =
                        tx.try_send((robot.to_string(), b))
                    {
                        full.reject(&format_args!(
                            "{LEARNER_QUEUE_BATCHES} batches wait already: dropped a batch of {} steps from {} of `{robot}`",
                            b.steps.len(),
                            b.first_seq
                        ));
                    }
                })
                .wait()
                .map_err(|e| err(key, e))?;
            subs.push(sub);
        }
        let now = Instant::now();
        let mut link = LearnerLink {
            session: session.clone(),
            fleet: fleet.clone(),
            rx,
            instance: rand::random::<u64>() | 1,
            robots: BTreeMap::new(),
            actors: BTreeMap::new(),
            weights_version: pos.weights_version,
            stats: LearnerLinkStats::default(),
            step_rejects: Rejects::new(&keys.join(", ")),
            refused: Rejects::new(&format!("{} (robot of another spec)", keys.join(", "))),
            spec_unknown: Rejects::new(&format!("{} (robot's spec not read yet)", keys.join(", "))),
            undecodable,
            queue_full,
            weights: Vec::new(),
            arch: 0,
            shape: None,
            spec: None,
            last_state: now,
            last_weights: now,
            buf: Vec::with_capacity(64 * 1024),
            _subs: subs,
        };
        if let Fleet::Robots(names) = fleet {
            for n in names {
                link.robot(n)?;
            }
        }
        for a in pos.actors {
            link.robot(&a.robot)?;
            link.actors
                .insert((a.robot, a.actor), Actor::new(a.received, now));
        }
        Ok(link)
    }

    /// The record of `robot`, made (with the learner's liveliness token) on first use.
    fn robot(&mut self, robot: &str) -> Result<&mut Robot, LinkError> {
        if !self.robots.contains_key(robot) {
            if self.robots.len() >= MAX_ROBOTS {
                return Err(err(
                    robot,
                    format!("this learner already serves {MAX_ROBOTS} robots"),
                ));
            }
            let keys = Keys::new(robot).map_err(|e| err(robot, e))?;
            let token = self
                .session
                .liveliness()
                .declare_token(keys.alive_learner.clone())
                .wait()
                .map_err(|e| err(&keys.alive_learner, e))?;
            self.robots.insert(
                robot.to_string(),
                Robot {
                    keys,
                    verdict: if self.spec.is_some() {
                        Verdict::Unknown(Instant::now())
                    } else {
                        Verdict::Accepted
                    },
                    _token: token,
                    last_refusal: None,
                },
            );
        }
        Ok(self.robots.get_mut(robot).expect("just made"))
    }

    /// Checks every step against `shape` from now on (the robot's sizes).
    pub fn expect_steps(&mut self, shape: StepShape) {
        self.shape = Some(shape);
    }

    /// Takes only robots whose spec fits `spec` (see [`spec_mismatch`]) from now on; `robot`'s
    /// spec is `spec` itself.
    pub fn expect_spec(&mut self, robot: &str, spec: RobotSpec) -> Result<(), LinkError> {
        self.spec = Some(spec);
        for r in self.robots.values_mut() {
            r.verdict = Verdict::Unknown(Instant::now());
        }
        self.robot(robot)?.verdict = Verdict::Accepted;
        Ok(())
    }

    /// Whether `robot`'s batches are taken: its spec read (once) and compared with the fleet's.
    fn admit(&mut self, robot: &str, actor: u64) -> bool {
        let now = Instant::now();
        let (keys, due, refused) = match self.robot(robot) {
            Err(e) => {
                self.stats.too_many += 1;
                self.refused.reject(&e);
                return false;
            }
            Ok(r) => match &r.verdict {
                Verdict::Accepted => return true,
                Verdict::Refused(why) => (r.keys.clone(), false, Some(why.clone())),
                Verdict::Unknown(next) => (r.keys.clone(), now >= *next, None),
            },
        };
        let why = match refused {
            Some(why) => why,
            None if !due => {
                self.stats.spec_unknown += 1;
                self.spec_unknown.reject(&format_args!(
                    "robot `{robot}`'s spec is not read yet; its actor resends"
                ));
                return false;
            }
            None => match self.judge(&keys) {
                Ok(None) => {
                    tracing::info!("robot `{robot}` joins the fleet");
                    self.set_verdict(robot, Verdict::Accepted);
                    self.send_weights_to(robot);
                    return true;
                }
                Ok(Some(why)) => {
                    tracing::error!(
                        "refusing robot `{robot}`: {why}; it needs a learner of its own"
                    );
                    self.set_verdict(robot, Verdict::Refused(why.clone()));
                    why
                }
                Err(e) => {
                    self.set_verdict(robot, Verdict::Unknown(now + Duration::from_secs(2)));
                    self.stats.spec_unknown += 1;
                    self.spec_unknown.reject(&e);
                    return false;
                }
            },
        };
        self.stats.refused_spec += 1;
        self.refused
            .reject(&format_args!("robot `{robot}`, actor {actor:x}: {why}"));
        // The actor is told why, at most once a second.
        let r = self.robots.get_mut(robot).expect("made above");
        if r.last_refusal
            .is_none_or(|t| t.elapsed() > Duration::from_secs(1))
        {
            r.last_refusal = Some(now);
            let m = LearnerState {
                v: PROTOCOL_VERSION,
                instance: self.instance,
                actor,
                refused: format!("robot `{robot}` does not fit this learner's fleet: {why}"),
                ..Default::default()
            };
            self.put(&keys.learn_state, &m);
        }
        false
    }

    /// Whether the robot of `keys` fits the fleet: `Some(why)` when it does not. Reads its spec
    /// (up to a second, once per robot) when the learner checks specs.
    fn judge(&self, keys: &Keys) -> Result<Option<String>, crate::trace::VizError> {
        match &self.spec {
            None => Ok(None),
            Some(fleet) => crate::trace::fetch_spec(&self.session, keys, Duration::from_secs(1))
                .map(|theirs| spec_mismatch(fleet, &theirs)),
        }
    }

    fn set_verdict(&mut self, robot: &str, v: Verdict) {
        if let Some(r) = self.robots.get_mut(robot) {
            r.verdict = v;
        }
    }

    /// Where the link stands with every actor.
    pub fn position(&self) -> LinkPosition {
        LinkPosition {
            actors: self
                .actors
                .iter()
                .map(|((robot, id), a)| ActorPosition {
                    robot: robot.clone(),
                    actor: *id,
                    received: a.received,
                    persisted: a.persisted,
                })
                .collect(),
            weights_version: self.weights_version,
        }
    }

    /// Each actor as the learner sees it.
    pub fn actors(&self) -> Vec<ActorStatus> {
        self.actors
            .iter()
            .map(|((robot, id), a)| ActorStatus {
                robot: robot.clone(),
                actor: format!("{id:x}"),
                received: a.received,
                persisted: a.persisted,
                behind: a.offered.saturating_sub(a.received),
                resumed_at: a.resumed_at,
                duplicates_dropped: a.duplicates,
                gaps_refused: a.gaps,
                steps_per_s: a.rate,
                trained: a.trained,
                trained_per_s: a.trained_rate,
                last_seen_s: a.heard.map(|t| t.elapsed().as_secs_f64()),
            })
            .collect()
    }

    /// The robots the learner serves.
    pub fn fleet(&self) -> &Fleet {
        &self.fleet
    }

    /// Counters so far.
    pub fn stats(&self) -> LearnerLinkStats {
        LearnerLinkStats {
            undecodable: self.undecodable.count(),
            rejected_steps: self.step_rejects.count(),
            queue_full: self.queue_full.count(),
            ..self.stats
        }
    }

    /// Batches waiting to be taken.
    pub fn queued(&self) -> usize {
        self.rx.len()
    }

    /// Waits up to `timeout` for a batch of an accepted robot; returns the steps of it this
    /// learner has not had from its actor, marking them received. `None` when nothing arrived.
    pub fn next_batch(&mut self, timeout: Duration) -> Option<Accepted> {
        let deadline = Instant::now() + timeout;
        loop {
            let (robot, b) = self.rx.recv_deadline(deadline).ok()?;
            let key = (robot, b.actor);
            if self.actors.len() >= MAX_ACTORS && !self.actors.contains_key(&key) {
                self.stats.too_many += 1;
                self.refused.reject(&format_args!(
                    "actor {:x} of `{}`: this learner already follows {MAX_ACTORS} actors",
                    key.1, key.0
                ));
                continue;
            }
            let robot = key.0;
            if self.admit(&robot, b.actor) {
                return Some(self.take(robot, b));
            }
        }
    }

    fn take(&mut self, robot: String, b: TransitionBatch) -> Accepted {
        let now = Instant::now();
        let mut out = Accepted {
            robot,
            actor: b.actor,
            flush: b.flush,
            ..Default::default()
        };
        let a = self
            .actors
            .entry((out.robot.clone(), b.actor))
            .or_insert_with(|| {
                // An actor this learner has no record of: it takes everything the actor still
                // holds (the steps before were persisted by another learner); a batch after that
                // is refused as a gap and the actor resends from there.
                tracing::info!(
                    "actor {:x} of `{}` joined; it holds steps from {}",
                    b.actor,
                    out.robot,
                    b.held_from
                );
                out.new_actor = true;
                Actor::new(b.held_from, now)
            });
        a.heard = Some(now);
        let end = b.first_seq + b.steps.len() as u64;
        a.offered = a.offered.max(b.offered).max(end);
        if b.first_seq > a.received {
            a.gaps += 1; // the actor resends from `received`
            self.stats.gaps_refused += 1;
        } else if end <= a.received {
            a.duplicates += b.steps.len() as u64;
            self.stats.duplicates_dropped += b.steps.len() as u64;
        } else {
            let skip = (a.received - b.first_seq) as usize;
            a.duplicates += skip as u64;
            self.stats.duplicates_dropped += skip as u64;
            let shape = self.shape.as_ref();
            let rejects = &self.step_rejects;
            // A malformed step keeps its number (the actor does not resend it) but is not stored.
            out.steps = b
                .steps
                .into_iter()
                .skip(skip)
                .filter(|s| match shape.map(|sh| sh.check(s)) {
                    Some(Err(e)) => {
                        rejects.reject(&format_args!("robot `{}`: {e}", out.robot));
                        false
                    }
                    _ => true,
                })
                .collect();
            a.received = end;
        }
        out
    }

    /// The learner trained on `n` more steps of `actor` of `robot` (for its rates).
    pub fn trained(&mut self, robot: &str, actor: u64, n: u64) {
        if let Some(a) = self.actors.get_mut(&(robot.to_string(), actor)) {
            a.trained += n;
        }
    }

    /// Everything `actor` of `robot` sent before `upto` is now in a checkpoint: it may forget it.
    pub fn persisted(&mut self, robot: &str, actor: u64, upto: u64) {
        if let Some(a) = self.actors.get_mut(&(robot.to_string(), actor)) {
            a.persisted = upto.min(a.received);
        }
        self.publish_state(robot, actor);
    }

    /// Reports what the learner holds of `actor` on its robot's `learn/state`.
    pub fn publish_state(&mut self, robot: &str, actor: u64) {
        let Some(a) = self.actors.get(&(robot.to_string(), actor)) else {
            return;
        };
        let Some(key) = self.robots.get(robot).map(|r| r.keys.learn_state.clone()) else {
            return;
        };
        let m = LearnerState {
            v: PROTOCOL_VERSION,
            instance: self.instance,
            actor,
            received: a.received,
            persisted: a.persisted,
            weights_version: self.weights_version,
            gaps: a.gaps,
            queued: self.rx.len() as u64,
            refused: String::new(),
        };
        self.put(&key, &m);
    }

    /// Every actor's state, and for a robot with no actor yet a state about no actor (its
    /// actor, if one comes, then sends all it holds).
    fn publish_states(&mut self) {
        let known: Vec<(String, u64)> = self.actors.keys().cloned().collect();
        for (robot, id) in &known {
            self.publish_state(robot, *id);
        }
        let silent: Vec<String> = self
            .robots
            .iter()
            .filter(|(n, r)| {
                matches!(r.verdict, Verdict::Accepted | Verdict::Unknown(_))
                    && !known.iter().any(|(k, _)| k == *n)
            })
            .map(|(_, r)| r.keys.learn_state.clone())
            .collect();
        for key in silent {
            let m = LearnerState {
                v: PROTOCOL_VERSION,
                instance: self.instance,
                weights_version: self.weights_version,
                queued: self.rx.len() as u64,
                ..Default::default()
            };
            self.put(&key, &m);
        }
        self.last_state = Instant::now();
    }

    fn put(&mut self, key: &str, m: &impl serde::Serialize) {
        msg::encode_into(m, &mut self.buf);
        // Block: a state that tells an actor what is persisted must not be dropped under load;
        // this is the learner's thread, not a loop's.
        if let Err(e) = self
            .session
            .put(key, self.buf.as_slice())
            .congestion_control(zenoh::qos::CongestionControl::Block)
            .wait()
        {
            tracing::debug!("publishing on {key}: {e}");
        }
    }

    /// Publishes a new weights version of the architecture `arch` to every accepted robot (and
    /// keeps it for robots and actors that come later).
    pub fn publish_weights(&mut self, version: u64, w: &[f32], arch: u64) {
        self.arch = arch;
        self.weights_version = version;
        self.weights.clear();
        self.weights.extend_from_slice(w);
        self.send_weights();
    }

    fn send_weights(&mut self) {
        let accepted: Vec<String> = self
            .robots
            .iter()
            .filter(|(_, r)| matches!(r.verdict, Verdict::Accepted))
            .map(|(n, _)| n.clone())
            .collect();
        for robot in accepted {
            self.send_weights_to(&robot);
        }
        self.last_weights = Instant::now();
    }

    fn send_weights_to(&mut self, robot: &str) {
        let Some(key) = self.robots.get(robot).map(|r| r.keys.learn_weights.clone()) else {
            return;
        };
        for i in 0..self.weights.len().div_ceil(WEIGHTS_CHUNK) {
            let c =
                &self.weights[i * WEIGHTS_CHUNK..((i + 1) * WEIGHTS_CHUNK).min(self.weights.len())];
            let m = WeightsChunk {
                v: PROTOCOL_VERSION,
                version: self.weights_version,
                offset: (i * WEIGHTS_CHUNK) as u32,
                total: self.weights.len() as u32,
                arch: self.arch,
                values: c.to_vec(),
            };
            self.put(&key, &m);
        }
    }

    /// Periodic duties: every actor's state twice a second, its rate every 2 s, the newest
    /// weights again every 5 s (for an actor that started late or lost a chunk), and actors long
    /// gone with everything persisted forgotten.
    pub fn tick(&mut self) {
        let now = Instant::now();
        for a in self.actors.values_mut() {
            let dt = now.duration_since(a.window.2).as_secs_f64();
            if dt >= 2.0 {
                a.rate = (a.received.saturating_sub(a.window.0)) as f64 / dt;
                a.trained_rate = (a.trained.saturating_sub(a.window.1)) as f64 / dt;
                a.window = (a.received, a.trained, now);
            }
        }
        self.actors.retain(|(robot, id), a| {
            let quiet = now.duration_since(a.heard.unwrap_or(a.since));
            let keep = quiet < FORGET_ACTOR_AFTER || a.persisted < a.received;
            if !keep {
                tracing::info!("forgetting actor {id:x} of `{robot}`: silent for an hour");
            }
            keep
        });
        if self.last_state.elapsed() > Duration::from_millis(500) {
            self.publish_states();
        }
        if !self.weights.is_empty() && self.last_weights.elapsed() > Duration::from_secs(5) {
            self.send_weights();
        }
    }

    /// Whether any actor of the fleet holds its liveliness token on the bus now (waits up to
    /// 200 ms).
    pub fn actor_alive(&self, session: &zenoh::Session) -> bool {
        self.fleet.keys("alive/actor").into_iter().any(|k| {
            session
                .liveliness()
                .get(k)
                .timeout(Duration::from_millis(200))
                .wait()
                .map(|r| r.recv().is_ok())
                .unwrap_or(false)
        })
    }
}
