//! reflex-ros2: reflex inside ROS 2. The robot appears as a ROS 2 node on rmw_zenoh (Jazzy
//! 0.2.4 and later, Kilted, Lyrical), on the Zenoh session reflex already has, with no ROS 2 code
//! linked (docs/ros2.md).
//!
//! - [`RobotTopics`] runs on the outbox's consumer thread (never the loop's): every step's
//!   `sensor_msgs/JointState` on `<ns>/joint_states` and the arm's links on `/tf`
//!   (`tf2_msgs/TFMessage`, posed from the URDF by forward kinematics), and each camera's
//!   `sensor_msgs/Image` and `CameraInfo` on `<ns>/<camera>/image_raw` and `.../camera_info`;
//!   while the e-stop holds the robot, the same from the loop's held ticks. Rates are kept by
//!   deadline on the loop's clock ([`pace::Pace`]).
//! - [`Ros2Node`] holds the node's liveliness tokens (what `ros2 node list` and `ros2 topic list`
//!   read), the loop's `diagnostic_msgs/DiagnosticArray` on `/diagnostics` (from the actor's own
//!   status), and the two inputs: `std_msgs/Bool` on `<ns>/estop` raises reflex's e-stop (`true`
//!   only: releasing stays a deliberate act on reflex's operator key), and
//!   `geometry_msgs/TwistStamped` on `<ns>/servo/twist` drives an `ee_delta` robot as a teleop
//!   device (MoveIt Servo's input), handing control back when twists stop coming.
//!
//! Everything that arrives is checked (attachment, CDR, frame, finite values) and counted in the
//! key's [`Rejects`]. A latched e-stop is warned once; `true`s that find it latched already (an
//! e-stop node that repeats its state) are counted, not warned ([`Ros2Counters::estop_repeats`],
//! `/diagnostics`).

pub mod cdr;
pub mod msgs;
pub mod pace;
mod topics;
pub mod wire;

pub use topics::{RobotTopics, TopicCounters};

use msgs::{RosType, Time};
use reflex_bus::Rejects;
use reflex_contracts::config::Invalid;
use reflex_contracts::keys::Keys;
use reflex_contracts::msg::{self, ActionKind, RobotSpec, StatusMsg, TeleopMsg};
use reflex_contracts::stop::{StopState, StopSwitch};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use wire::{EntityKind, Graph, Qos};
use zenoh::Wait;
use zenoh::sample::Locality;

/// `[ros2]` of a run config (docs/ros2.md).
#[derive(Clone, Debug, PartialEq)]
pub struct Ros2Config {
    /// `ROS_DOMAIN_ID`.
    pub domain: u32,
    /// The node's namespace; its topics are relative to it (`/so101` -> `/so101/joint_states`).
    pub namespace: String,
    /// The node's name.
    pub node: String,
    /// Joint states and TF at most this often, Hz (every step of a slower robot).
    pub state_hz: f64,
    /// Camera images at most this often, Hz.
    pub image_hz: f64,
    /// A twist stream that falls silent this long hands the robot back to its policy, s.
    pub twist_timeout_s: f64,
    /// Put before every TF frame name (robot_state_publisher's `frame_prefix`), e.g. `so101/`.
    pub frame_prefix: String,
}

impl Ros2Config {
    /// The defaults for robot `robot`: domain 0, namespace `/<robot>`, node `reflex`, joint
    /// states at up to 50 Hz, images at up to 10 Hz, twists released after 0.2 s.
    pub fn for_robot(robot: &str) -> Self {
        Ros2Config {
            domain: 0,
            namespace: format!("/{robot}"),
            node: "reflex".into(),
            state_hz: 50.0,
            image_hz: 10.0,
            twist_timeout_s: 0.2,
            frame_prefix: String::new(),
        }
    }

    /// The data key prefix of this node's relative topics, `<domain>/<namespace>` (for access
    /// rules).
    pub fn key_prefix(&self) -> String {
        let ns = self.namespace.trim_start_matches('/');
        if ns.is_empty() {
            self.domain.to_string()
        } else {
            format!("{}/{ns}", self.domain)
        }
    }
}

impl reflex_contracts::config::Validate for Ros2Config {
    /// Names as ROS 2 allows them, rates and the twist timeout in range; the error names the key.
    fn validate(&self, p: &str) -> Result<(), Invalid> {
        use reflex_contracts::config::{in_range, key};
        let name = |k: &str, value: &str, e: Result<(), wire::NameError>| {
            e.map_err(|e| Invalid {
                key: key(p, k),
                value: format!("{value:?}"),
                allowed: e.why.to_string(),
            })
        };
        name(
            "namespace",
            &self.namespace,
            wire::check_namespace(&self.namespace),
        )?;
        name("node", &self.node, wire::check_node(&self.node))?;
        in_range(p, "state_hz", self.state_hz, 0.1, 10_000.0)?;
        in_range(p, "image_hz", self.image_hz, 0.1, 1_000.0)?;
        in_range(p, "twist_timeout_s", self.twist_timeout_s, 0.01, 5.0)?;
        if self.frame_prefix.contains(char::is_whitespace) {
            return Err(Invalid {
                key: key(p, "frame_prefix"),
                value: format!("{:?}", self.frame_prefix),
                allowed: "a prefix without whitespace, e.g. \"so101/\"".into(),
            });
        }
        Ok(())
    }
}

/// Errors starting the ROS 2 node.
#[derive(Debug, thiserror::Error)]
pub enum Ros2Error {
    /// A value of `[ros2]` ROS 2 or reflex would refuse.
    #[error("[ros2] {} = {} is refused; allowed: {}", .0.key, .0.value, .0.allowed)]
    Config(Invalid),
    /// A declaration on the session failed.
    #[error("ROS 2 over Zenoh, key `{key}`: {message}")]
    Bus {
        /// The key expression.
        key: String,
        /// Zenoh's message.
        message: String,
    },
    /// The robot's arm model cannot be posed for TF.
    #[error("ROS 2 TF for robot `{robot}`: {message}")]
    Model {
        /// The robot.
        robot: String,
        /// What is wrong.
        message: String,
    },
}

fn bus_err(key: &str, e: impl std::fmt::Display) -> Ros2Error {
    Ros2Error::Bus {
        key: key.to_string(),
        message: e.to_string(),
    }
}

/// What the node did, for the run's report and the tests.
#[derive(Debug, Default)]
pub struct Ros2Counters {
    /// Samples published, all topics.
    pub published: AtomicU64,
    /// E-stops raised from ROS 2.
    pub estops: AtomicU64,
    /// Of those, the `true`s that found the e-stop latched already (an e-stop node repeating
    /// its state, a button held down): counted here and in `/diagnostics`, not warned again.
    pub estop_repeats: AtomicU64,
    /// Twists taken as teleop commands.
    pub twists: AtomicU64,
    /// Times a twist stream fell silent and the robot went back to its policy.
    pub twist_timeouts: AtomicU64,
}

/// Entity ids of the node, from 1 (0 is the node itself).
struct Ids(AtomicU32);

impl Ids {
    fn next(&self) -> u32 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

/// One ROS 2 publisher: its data key, its liveliness token and its numbered attachments.
pub(crate) struct Pub {
    publisher: zenoh::pubsub::Publisher<'static>,
    _token: zenoh::liveliness::LivelinessToken,
    gid: [u8; 16],
    seq: i64,
    counters: Arc<Ros2Counters>,
}

impl Pub {
    pub(crate) fn declare(
        node: &NodeCtx,
        topic_fq: &str,
        ty: &RosType,
        qos: Qos,
    ) -> Result<Self, Ros2Error> {
        let token =
            node.graph
                .entity_token(node.ids.next(), EntityKind::Publisher, topic_fq, ty, qos);
        let key = wire::data_key(node.graph.domain, topic_fq, ty);
        let publisher = node
            .session
            .declare_publisher(key.clone())
            // Never wait for a slow ROS 2 subscriber: these puts run on the outbox's thread (which
            // also feeds the recorder and the learner) and on the status path. Under congestion
            // a sample is dropped, which a reliable ROS 2 subscriber sees as a sequence gap.
            .congestion_control(zenoh::qos::CongestionControl::Drop)
            .wait()
            .map_err(|e| bus_err(&key, e))?;
        let t = node
            .session
            .liveliness()
            .declare_token(token.clone())
            .wait()
            .map_err(|e| bus_err(&token, e))?;
        Ok(Pub {
            publisher,
            _token: t,
            gid: wire::gid(&token),
            seq: 0,
            counters: node.counters.clone(),
        })
    }

    pub(crate) fn put(&mut self, payload: &[u8]) {
        self.seq += 1;
        let att = wire::Attachment {
            seq: self.seq,
            source_ns: msgs::unix_ns(),
            gid: self.gid,
        }
        .encode();
        match self.publisher.put(payload).attachment(att).wait() {
            Ok(()) => {
                self.counters.published.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => tracing::debug!("ROS 2 on {}: {e}", self.publisher.key_expr()),
        }
    }
}

/// What every entity of the node is declared with.
pub(crate) struct NodeCtx {
    session: zenoh::Session,
    graph: Graph,
    ids: Arc<Ids>,
    counters: Arc<Ros2Counters>,
    cfg: Ros2Config,
}

impl NodeCtx {
    pub(crate) fn topic(&self, relative: &str) -> String {
        wire::qualify(&self.cfg.namespace, relative)
    }

    pub(crate) fn frame(&self, name: &str) -> String {
        format!("{}{name}", self.cfg.frame_prefix)
    }
}

pub(crate) const STATE_QOS: Qos = Qos {
    reliable: true,
    depth: 10,
};
pub(crate) const TF_QOS: Qos = Qos {
    reliable: true,
    depth: 100,
};
pub(crate) const IMAGE_QOS: Qos = Qos {
    reliable: false,
    depth: 5,
};

/// The node's tokens, subscriptions and diagnostics; dropping it takes the node off the graph.
pub struct Ros2Node {
    _tokens: Vec<zenoh::liveliness::LivelinessToken>,
    _subs: Vec<zenoh::pubsub::Subscriber<()>>,
    stop: Arc<AtomicBool>,
    watchdog: Option<std::thread::JoinHandle<()>>,
    /// What it did.
    pub counters: Arc<Ros2Counters>,
    /// Rejected messages on the e-stop and twist topics (for the actor's status).
    pub rejects: Vec<Arc<Rejects>>,
    /// The node's fully qualified name, e.g. `/so101/reflex`.
    pub name: String,
}

impl Drop for Ros2Node {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.watchdog.take() {
            let _ = t.join();
        }
    }
}

/// A ROS 2 subscription: its token and a subscriber that checks each sample's attachment.
fn subscribe(
    node: &NodeCtx,
    topic_fq: &str,
    ty: &RosType,
    rejects: Arc<Rejects>,
    tokens: &mut Vec<zenoh::liveliness::LivelinessToken>,
    on_msg: impl Fn(&[u8]) -> Result<(), String> + Send + Sync + 'static,
) -> Result<zenoh::pubsub::Subscriber<()>, Ros2Error> {
    let token = node.graph.entity_token(
        node.ids.next(),
        EntityKind::Subscription,
        topic_fq,
        ty,
        STATE_QOS,
    );
    let key = wire::data_key(node.graph.domain, topic_fq, ty);
    let sub = node
        .session
        .declare_subscriber(key.clone())
        .allowed_origin(Locality::Remote)
        .callback(move |s| {
            let checked = match s.attachment() {
                None => Err("no attachment (rmw_zenoh always sends one)".to_string()),
                Some(a) => wire::Attachment::decode(&a.to_bytes()).map(|_| ()),
            }
            .and_then(|()| on_msg(&s.payload().to_bytes()));
            if let Err(why) = checked {
                rejects.reject(&why);
            }
        })
        .wait()
        .map_err(|e| bus_err(&key, e))?;
    tokens.push(
        node.session
            .liveliness()
            .declare_token(token.clone())
            .wait()
            .map_err(|e| bus_err(&token, e))?,
    );
    Ok(sub)
}

/// A twist stream turned into teleop messages on the actor's own teleop key.
struct TwistTeleop {
    publisher: zenoh::pubsub::Publisher<'static>,
    kind: ActionKind,
    low: Vec<f32>,
    high: Vec<f32>,
    dt: f64,
    frames: [String; 2],
    gripper: Arc<AtomicU32>,
    last: Option<Instant>,
    seq: u64,
    msg: TeleopMsg,
}

impl TwistTeleop {
    fn take(&mut self, payload: &[u8]) -> Result<(), String> {
        let t = msgs::TwistStamped::read(payload).map_err(|e| e.to_string())?;
        if !t.frame_id.is_empty() && !self.frames.contains(&t.frame_id) {
            return Err(format!(
                "twist in frame `{}`: reflex takes twists in `{}` (the arm's base) or with no frame",
                t.frame_id, self.frames[1]
            ));
        }
        let a = &mut self.msg.action;
        for (v, l) in a.iter_mut().zip(t.linear) {
            *v = (l * self.dt) as f32;
        }
        let grip = match self.kind {
            ActionKind::EeDeltaYaw => {
                a[3] = (t.angular[2] * self.dt) as f32;
                4
            }
            _ => 3,
        };
        a[grip] = f32::from_bits(self.gripper.load(Ordering::Relaxed));
        for ((v, lo), hi) in a.iter_mut().zip(&self.low).zip(&self.high) {
            *v = v.clamp(*lo, *hi);
        }
        self.msg.intervene = true;
        self.send();
        self.last = Some(Instant::now());
        Ok(())
    }

    fn send(&mut self) {
        self.seq += 1;
        self.msg.seq = self.seq;
        if let Err(e) = self.publisher.put(msg::encode(&self.msg)).wait() {
            tracing::warn!("ROS 2 twist to teleop: {e}");
        }
    }

    /// Hands the robot back when the stream has been silent for `timeout`; true if it did.
    fn expire(&mut self, timeout: Duration) -> bool {
        if self.last.is_some_and(|l| l.elapsed() >= timeout) {
            self.last = None;
            self.msg.intervene = false;
            self.send();
            return true;
        }
        false
    }
}

/// Builds the diagnostics of one status message: the control loop, the e-stop, and the learner
/// when the actor learns.
pub fn diagnostics(s: &StatusMsg, hardware_id: &str) -> Vec<msgs::DiagnosticStatus> {
    use msgs::{DiagnosticStatus, Level};
    let f = &s.figures;
    let kv = |k: &str, v: String| (k.to_string(), v);
    let mut values = vec![
        kv("rate_hz", format!("{:.2}", f.rate_hz)),
        kv("lateness_p50_us", format!("{:.1}", f.lateness_p50_us)),
        kv("lateness_p99_us", format!("{:.1}", f.lateness_p99_us)),
        kv("step_p99_us", format!("{:.1}", f.step_p99_us)),
        kv("missed", f.missed.to_string()),
        kv("overruns", f.overruns.to_string()),
        kv("holds_no_chunk", f.holds_no_chunk.to_string()),
        kv("chunk_age_ms", format!("{:.1}", f.chunk_age_ms)),
        kv("episode", f.episode.to_string()),
        kv("intervening", f.intervening.to_string()),
        kv(
            "stopped",
            matches!(s.stop.as_str(), "latched" | "paused").to_string(),
        ),
        kv("residual_version", f.residual_version.to_string()),
        kv("outbox_dropped", f.outbox_dropped.to_string()),
        kv("recorder_dropped", s.recorder_dropped.to_string()),
    ];
    values.extend(
        s.safety
            .iter()
            .map(|(k, v)| (format!("safety.{k}"), v.to_string())),
    );
    values.extend(
        s.rejected
            .iter()
            .map(|(k, v)| (format!("rejected.{k}"), v.to_string())),
    );
    let loop_level = if f.missed > 0 || f.outbox_dropped > 0 {
        Level::Warn
    } else {
        Level::Ok
    };
    let stop_level = match s.stop.as_str() {
        "latched" => Level::Error,
        "paused" => Level::Warn,
        _ => Level::Ok,
    };
    let mut out = vec![
        DiagnosticStatus {
            level: loop_level,
            name: format!("reflex: {} control loop", s.robot),
            // Joint states and TF keep coming while the robot is stopped: the loop's own status
            // says so, so nobody takes them for a robot at work.
            message: match s.stop.as_str() {
                st @ ("latched" | "paused") => format!(
                    "stopped (e-stop {st}), holding: {:.1} Hz, {} missed deadlines",
                    f.rate_hz, f.missed
                ),
                _ => format!("{:.1} Hz, {} missed deadlines", f.rate_hz, f.missed),
            },
            hardware_id: hardware_id.to_string(),
            values,
        },
        DiagnosticStatus {
            level: stop_level,
            name: format!("reflex: {} e-stop", s.robot),
            message: match s.stop.as_str() {
                "" => "unknown".to_string(),
                st if s.stop_by.is_empty() => st.to_string(),
                st => format!("{st} by {}", s.stop_by),
            },
            hardware_id: hardware_id.to_string(),
            values: vec![kv("estops", f.estops.to_string())],
        },
    ];
    if let Some(l) = s.learner {
        let behind = l.offered.saturating_sub(l.taken);
        out.push(DiagnosticStatus {
            // About where a learner starts shedding updates (docs/learner.md, shed_updates_above).
            level: if behind > 5_000 {
                Level::Warn
            } else {
                Level::Ok
            },
            name: format!("reflex: {} learner", s.robot),
            message: format!("{behind} steps behind"),
            hardware_id: hardware_id.to_string(),
            values: vec![
                kv("steps_offered", l.offered.to_string()),
                kv("steps_taken", l.taken.to_string()),
                kv("steps_behind", behind.to_string()),
            ],
        });
    }
    out
}

/// Starts the node for robot `spec` on `session`: its tokens, diagnostics, e-stop and twist
/// inputs, and the publishers the outbox thread feeds ([`RobotTopics`]).
pub fn start(
    session: &zenoh::Session,
    cfg: &Ros2Config,
    spec: &RobotSpec,
    keys: &Keys,
    stop: Arc<StopSwitch>,
) -> Result<(Ros2Node, RobotTopics), Ros2Error> {
    reflex_contracts::config::Validate::validate(cfg, "ros2").map_err(Ros2Error::Config)?;
    let node = NodeCtx {
        session: session.clone(),
        graph: Graph {
            domain: cfg.domain,
            zid: session.zid().to_string(),
            namespace: cfg.namespace.clone(),
            node: cfg.node.clone(),
        },
        ids: Arc::new(Ids(AtomicU32::new(1))),
        counters: Arc::new(Ros2Counters::default()),
        cfg: cfg.clone(),
    };
    let node_token = node.graph.node_token();
    let mut tokens = vec![
        session
            .liveliness()
            .declare_token(node_token.clone())
            .wait()
            .map_err(|e| bus_err(&node_token, e))?,
    ];
    let mut topics = RobotTopics::new(&node, spec)?;
    let mut subs = Vec::new();

    // Diagnostics from the actor's own status, at most once a second.
    subs.push(diagnostics_input(&node, keys, spec, &topics)?);

    // The e-stop: `true` raises reflex's own, latching; `false` is no release.
    let (sub, estop_rejects) = estop_input(&node, spec, stop, &mut tokens)?;
    subs.push(sub);
    let mut rejects = vec![estop_rejects];

    // Twists drive an end-effector robot.
    let stop_flag = Arc::new(AtomicBool::new(false));
    let mut twist_teleop = None;
    if let Some((sub, twist_rejects, twist)) =
        twist_input(&node, keys, spec, &mut topics, &mut tokens)?
    {
        subs.push(sub);
        rejects.push(twist_rejects);
        twist_teleop = Some(twist);
    }
    // The robot's URDF on `<ns>/robot_description` every 2 s, as robot_state_publisher offers it
    // (rmw_zenoh matches on key, not on durability: a late RViz has it within 2 s).
    let mut description = description_topic(&node, spec)?;
    let (s, counters) = (stop_flag.clone(), node.counters.clone());
    let timeout = Duration::from_secs_f64(cfg.twist_timeout_s);
    let watchdog = Some(
        std::thread::Builder::new()
            .name("ros2".into())
            .spawn(move || {
                let mut described = None::<Instant>;
                while !s.load(Ordering::Relaxed) {
                    if let Some((p, w)) = &mut description
                        && described.is_none_or(|t| t.elapsed() >= Duration::from_secs(2))
                    {
                        p.put(w.bytes());
                        described = Some(Instant::now());
                    }
                    if let Some(twist) = &twist_teleop
                        && let Ok(mut t) = twist.lock()
                        && t.expire(timeout)
                    {
                        counters.twist_timeouts.fetch_add(1, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            })
            .expect("spawn the ROS 2 node's thread"),
    );
    let name = wire::qualify(&cfg.namespace, &cfg.node);
    tracing::info!(
        "ROS 2: node `{name}` on domain {} (rmw_zenoh, Jazzy wire format)",
        cfg.domain
    );
    Ok((
        Ros2Node {
            _tokens: tokens,
            _subs: subs,
            stop: stop_flag,
            watchdog,
            counters: node.counters.clone(),
            rejects,
            name,
        },
        topics,
    ))
}

/// `/diagnostics` from the actor's own status: at most once a second, and at once when the
/// e-stop changes, with what the node itself counted.
fn diagnostics_input(
    node: &NodeCtx,
    keys: &Keys,
    spec: &RobotSpec,
    topics: &RobotTopics,
) -> Result<zenoh::pubsub::Subscriber<()>, Ros2Error> {
    let diag = Mutex::new((
        Pub::declare(node, "/diagnostics", &msgs::DIAGNOSTIC_ARRAY, STATE_QOS)?,
        None::<Instant>,
        cdr::Writer::new(),
        reflex_contracts::stop::StopState::default(),
    ));
    let (status_key, hw) = (keys.status.clone(), spec.name.clone());
    let (node_counters, topic_counters) = (node.counters.clone(), topics.counters());
    node.session
        .declare_subscriber(status_key.clone())
        .allowed_origin(Locality::SessionLocal)
        .callback(move |s| {
            let Ok(m) = msg::decode::<StatusMsg>(&status_key, &s.payload().to_bytes()) else {
                return;
            };
            let Ok(mut d) = diag.lock() else { return };
            let (p, last, w, last_stop) = &mut *d;
            // Once a second, and a change of the e-stop at once.
            if last.is_some_and(|l| l.elapsed() < Duration::from_secs(1)) && *last_stop == m.stop {
                return;
            }
            *last = Some(Instant::now());
            *last_stop = m.stop;
            let mut d = diagnostics(&m, &hw);
            // What the node itself did while stopped: the robot's topics kept going, and
            // repeated ROS 2 e-stops were counted rather than warned.
            let n = |c: &AtomicU64| c.load(Ordering::Relaxed).to_string();
            d[1].values.extend([
                (
                    "ros2_estop_repeats".to_string(),
                    n(&node_counters.estop_repeats),
                ),
                (
                    "held_joint_states".to_string(),
                    n(&topic_counters.held_states),
                ),
                ("held_images".to_string(), n(&topic_counters.held_images)),
            ]);
            msgs::write_diagnostics(w, Time::now(), &d);
            p.put(w.bytes());
        })
        .wait()
        .map_err(|e| bus_err(&keys.status, e))
}

/// `<ns>/estop`: `true` raises reflex's own e-stop, latching; `false` releases nothing.
fn estop_input(
    node: &NodeCtx,
    spec: &RobotSpec,
    stop: Arc<StopSwitch>,
    tokens: &mut Vec<zenoh::liveliness::LivelinessToken>,
) -> Result<(zenoh::pubsub::Subscriber<()>, Arc<Rejects>), Ros2Error> {
    let estop_topic = node.topic("estop");
    let estop_rejects = Rejects::new(&wire::data_key(node.cfg.domain, &estop_topic, &msgs::BOOL));
    let (counters, robot) = (node.counters.clone(), spec.name.clone());
    let sub = subscribe(
        node,
        &estop_topic,
        &msgs::BOOL,
        estop_rejects.clone(),
        tokens,
        move |payload| {
            let raise = msgs::read_bool(payload).map_err(|e| e.to_string())?;
            if raise {
                let latched_already = stop.state() == StopState::Latched;
                // Raised again even when latched: a newer raise voids a release that answers
                // an older one, as long as ROS 2 keeps asking for the stop.
                stop.raise("ros2");
                counters.estops.fetch_add(1, Ordering::Relaxed);
                if latched_already {
                    // An e-stop node may publish `true` over and over; the latch was warned once.
                    let n = counters.estop_repeats.fetch_add(1, Ordering::Relaxed) + 1;
                    tracing::debug!(
                        "ROS 2 e-stop `true` on `{robot}` while latched ({n} repeats): counted"
                    );
                } else {
                    tracing::warn!(
                        "EMERGENCY STOP on `{robot}` raised from ROS 2 (e-stop {}): the robot holds; release it with `reflex estop release --robot {robot}`, then resume",
                        stop.raises()
                    );
                }
            } else {
                tracing::info!(
                    "ROS 2 e-stop `false` on `{robot}` ignored: an e-stop is released only with `reflex estop release`"
                );
            }
            Ok(())
        },
    )?;
    Ok((sub, estop_rejects))
}

/// A robot's twist input and what it shares.
type TwistInput = (
    zenoh::pubsub::Subscriber<()>,
    Arc<Rejects>,
    Arc<Mutex<TwistTeleop>>,
);

/// `<ns>/servo/twist` drives an end-effector robot through reflex's teleop (none for another
/// action space); the gripper's command is shared with the topics.
fn twist_input(
    node: &NodeCtx,
    keys: &Keys,
    spec: &RobotSpec,
    topics: &mut RobotTopics,
    tokens: &mut Vec<zenoh::liveliness::LivelinessToken>,
) -> Result<Option<TwistInput>, Ros2Error> {
    if !matches!(
        spec.action.kind,
        ActionKind::EeDelta | ActionKind::EeDeltaYaw
    ) {
        return Ok(None);
    }
    let grip = if spec.action.kind == ActionKind::EeDeltaYaw {
        4
    } else {
        3
    };
    let gripper = Arc::new(AtomicU32::new(spec.action.high[grip].to_bits()));
    topics.gripper = Some((grip, gripper.clone()));
    let base = spec
        .scene
        .as_ref()
        .and_then(|s| s.arm.as_ref())
        .map_or("base_link".to_string(), |a| a.base_link.clone());
    let publisher = node
        .session
        .declare_publisher(keys.teleop.clone())
        .allowed_destination(Locality::SessionLocal)
        .wait()
        .map_err(|e| bus_err(&keys.teleop, e))?;
    let twist = Arc::new(Mutex::new(TwistTeleop {
        publisher,
        kind: spec.action.kind,
        low: spec.action.low.clone(),
        high: spec.action.high.clone(),
        dt: 1.0 / spec.control_hz,
        frames: [base.clone(), node.frame(&base)],
        gripper,
        last: None,
        seq: 0,
        msg: TeleopMsg {
            v: msg::PROTOCOL_VERSION,
            action: vec![0.0; spec.action.dim()],
            ..Default::default()
        },
    }));
    let twist_topic = node.topic("servo/twist");
    let twist_rejects = Rejects::new(&wire::data_key(
        node.cfg.domain,
        &twist_topic,
        &msgs::TWIST_STAMPED,
    ));
    let (t, counters) = (twist.clone(), node.counters.clone());
    let sub = subscribe(
        node,
        &twist_topic,
        &msgs::TWIST_STAMPED,
        twist_rejects.clone(),
        tokens,
        move |payload| {
            t.lock()
                .map_err(|_| "twist state poisoned".to_string())?
                .take(payload)?;
            counters.twists.fetch_add(1, Ordering::Relaxed);
            Ok(())
        },
    )?;
    Ok(Some((sub, twist_rejects, twist)))
}

/// The robot's URDF as a `std_msgs/String` publisher and its message (none without an arm).
fn description_topic(
    node: &NodeCtx,
    spec: &RobotSpec,
) -> Result<Option<(Pub, cdr::Writer)>, Ros2Error> {
    Ok(match spec.scene.as_ref().and_then(|s| s.arm.as_ref()) {
        Some(a) => {
            let qos = Qos {
                reliable: true,
                depth: 1,
            };
            let p = Pub::declare(node, &node.topic("robot_description"), &msgs::STRING, qos)?;
            let mut w = cdr::Writer::new();
            w.start().string(&a.urdf);
            Some((p, w))
        }
        None => None,
    })
}

#[cfg(test)]
mod node_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diagnostics_say_what_is_wrong_at_the_level_ros_2_tools_colour() {
        let mut s = StatusMsg {
            robot: "arm".into(),
            stop: reflex_contracts::stop::StopState::Latched,
            stop_by: "ros2".into(),
            ..Default::default()
        };
        let d = diagnostics(&s, "arm");
        assert_eq!(d.len(), 2, "no learner, no learner status");
        assert_eq!(d[0].level, msgs::Level::Ok);
        // Joint states keep flowing while stopped: the loop's own status says it is stopped.
        assert!(
            d[0].message.starts_with("stopped (e-stop latched)"),
            "{}",
            d[0].message
        );
        assert!(
            d[0].values
                .contains(&("stopped".to_string(), "true".to_string()))
        );
        assert_eq!(
            (d[1].level, d[1].message.as_str()),
            (msgs::Level::Error, "latched by ros2")
        );
        s.figures.missed = 3;
        s.stop = reflex_contracts::stop::StopState::Running;
        s.stop_by.clear();
        s.learner = Some(reflex_contracts::msg::LearnerLag {
            offered: 9_000,
            taken: 1_000,
        });
        let d = diagnostics(&s, "arm");
        assert_eq!(d[0].level, msgs::Level::Warn);
        assert!(d[0].message.starts_with("0.0 Hz"), "{}", d[0].message);
        assert_eq!(d[1].level, msgs::Level::Ok);
        assert_eq!(d[2].name, "reflex: arm learner");
        assert_eq!(d[2].level, msgs::Level::Warn);
        assert!(
            d[2].values
                .contains(&("steps_behind".to_string(), "8000".to_string()))
        );
    }
}
