//! reflex-bus: the reflex protocol on Zenoh (docs/protocol.md is the contract).
//!
//! - [`robot`]: [`robot::RemoteRobot`] drives any robot that speaks the protocol (the simulator
//!   served by `reflex sim serve`, the Gymnasium bridge, a driver on another computer);
//!   [`robot::RobotServer`] serves any [`reflex_contracts::robot::Robot`];
//! - [`status`], [`teleop`]: the actor's status out, a person's teleop in;
//! - [`stop`]: every holder's e-stop: emergency stops, an operator's release and resume in, its
//!   state out (the robot server's with no actor);
//! - [`trace`]: the decimated step trace for `reflex viz`, and the watcher that reads it;
//! - [`learnlink`]: both halves of the actor-learner link: numbered transitions with resend,
//!   versioned chunked weights, the learner's acknowledgements.
//!
//! Nothing here runs on the control loop's thread.

pub mod learnlink;
pub mod robot;
pub mod secure;
pub mod status;
pub mod stop;
pub mod teleop;
pub mod trace;

use std::path::PathBuf;
use zenoh::Wait;

pub use reflex_contracts::keys::Keys;

/// Something that counts messages that did not decode or did not fit.
pub(crate) trait CountsBad: Send + Sync + 'static {
    /// One more, and why.
    fn bad(&self, why: &dyn std::fmt::Display);
}

/// Messages rejected on one key expression (malformed, another protocol version, or not fitting
/// the robot's spec): counted, and logged at most once a second so that a flood cannot flood the
/// log. Never a panic: the receiver goes on with what it had.
#[derive(Debug)]
pub struct Rejects {
    key: String,
    verb: &'static str,
    count: std::sync::atomic::AtomicU64,
    last_log_ms: std::sync::atomic::AtomicU64,
    t0: std::time::Instant,
}

impl Rejects {
    /// A counter for `key`.
    pub fn new(key: &str) -> std::sync::Arc<Self> {
        Self::counting(key, "rejected a message on")
    }

    /// A counter for `key` of something other than rejected messages (commands sent again,
    /// observations dropped), logged as "`verb` `key` (N so far): why".
    pub fn counting(key: &str, verb: &'static str) -> std::sync::Arc<Self> {
        std::sync::Arc::new(Rejects {
            key: key.to_string(),
            verb,
            count: Default::default(),
            last_log_ms: std::sync::atomic::AtomicU64::new(u64::MAX),
            t0: std::time::Instant::now(),
        })
    }

    /// Counts one rejected message and logs `why` unless a rejection was logged in the last
    /// second.
    pub fn reject(&self, why: &dyn std::fmt::Display) {
        use std::sync::atomic::Ordering::Relaxed;
        let n = self.count.fetch_add(1, Relaxed) + 1;
        let now = self.t0.elapsed().as_millis() as u64;
        let last = self.last_log_ms.load(Relaxed);
        if (last == u64::MAX || now.saturating_sub(last) >= 1000)
            && self
                .last_log_ms
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_ok()
        {
            tracing::warn!("{} `{}` ({n} so far): {why}", self.verb, self.key);
        }
    }

    /// Messages rejected so far.
    pub fn count(&self) -> u64 {
        self.count.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The key expression.
    pub fn key(&self) -> &str {
        &self.key
    }
}

impl CountsBad for Rejects {
    fn bad(&self, why: &dyn std::fmt::Display) {
        self.reject(why);
    }
}

/// Subscribes to `key`, decodes every sample as `M` (checking its protocol version) and hands
/// it to `on_msg` on Zenoh's thread; a sample that does not decode is counted in `bad` and
/// logged.
pub(crate) fn subscribe_decoded<M, B, F>(
    session: &zenoh::Session,
    key: &str,
    bad: std::sync::Arc<B>,
    on_msg: F,
) -> Result<zenoh::pubsub::Subscriber<()>, zenoh::Error>
where
    M: serde::de::DeserializeOwned + reflex_contracts::msg::Versioned,
    B: CountsBad,
    F: Fn(M) + Send + Sync + 'static,
{
    let k = key.to_string();
    session
        .declare_subscriber(key.to_string())
        .callback(
            move |s| match reflex_contracts::msg::decode::<M>(&k, &s.payload().to_bytes()) {
                Ok(m) => on_msg(m),
                Err(e) => bad.bad(&e),
            },
        )
        .wait()
}

/// Errors opening or using the bus.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// The Zenoh configuration is invalid.
    #[error("Zenoh configuration: {0}")]
    Config(String),
    /// Certificates and keys could not be made (`reflex keys`).
    #[error("keys: {0}")]
    Keys(String),
    /// The session could not be opened (e.g. an endpoint cannot be bound).
    #[error("cannot open the Zenoh session (listen {listen:?}, connect {connect:?}): {message}")]
    Open {
        /// Listen endpoints asked for.
        listen: Vec<String>,
        /// Connect endpoints asked for.
        connect: Vec<String>,
        /// What Zenoh said.
        message: String,
    },
    /// A robot name that cannot be part of a key expression.
    #[error(transparent)]
    BadName(#[from] reflex_contracts::keys::BadName),
    /// A declaration failed.
    #[error("bus error on `{key}`: {message}")]
    Declare {
        /// Key expression involved.
        key: String,
        /// What Zenoh said.
        message: String,
    },
}

/// How this process joins the Zenoh network.
#[derive(Clone, Debug, Default)]
pub struct BusConfig {
    /// Endpoints to listen on, e.g. `tcp/127.0.0.1:7447`, `unixsock-stream//tmp/reflex.sock`.
    pub listen: Vec<String>,
    /// Endpoints to connect to.
    pub connect: Vec<String>,
    /// Multicast scouting (peer discovery on the LAN). Off in tests.
    pub multicast_scouting: bool,
    /// A Zenoh JSON5 config file to start from (its values are overridden by the fields above).
    pub config_file: Option<PathBuf>,
    /// TLS with mutual authentication (`tls/` endpoints): this peer's certificate and key and
    /// the authority it trusts ([`secure`]).
    pub tls: Option<secure::TlsFiles>,
    /// Access control on the robot's key space (the robot's side): who may do what.
    pub access: Option<(String, secure::Access)>,
    /// How this process takes part in the Zenoh network.
    pub mode: Mode,
}

/// A Zenoh session's role.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// A peer (the default): it meets the peers it hears of and talks to them directly.
    #[default]
    Peer,
    /// A router (a fleet's learner on a workstation, `reflex learn --router`): the peers
    /// connected to it reach each other through it.
    Router,
    /// A client: one link to the peer or router it connects to, which carries everything, and
    /// no links of its own to other peers. For a short operator command (`reflex estop`): a
    /// peer that joins for a second makes the others open links to it and move their routes
    /// while it acts, and under load an e-stop sent in that window did not reach the actor.
    Client,
}

impl BusConfig {
    /// A config that touches nothing but the given endpoints: no scouting of any kind.
    pub fn hermetic(listen: Vec<String>, connect: Vec<String>) -> Self {
        BusConfig {
            listen,
            connect,
            multicast_scouting: false,
            ..Default::default()
        }
    }

    /// Builds the Zenoh config.
    pub fn to_zenoh(&self) -> Result<zenoh::Config, BusError> {
        let mut c = match &self.config_file {
            Some(p) => zenoh::Config::from_file(p).map_err(|e| {
                BusError::Config(format!("file `{}`: {}", p.display(), zenoh_text(&e)))
            })?,
            None => zenoh::Config::default(),
        };
        // Zenoh's own message for a malformed endpoint is a parser's debug dump: say it plainly.
        for e in self.listen.iter().chain(&self.connect) {
            if !e
                .split_once('/')
                .is_some_and(|(p, a)| !p.is_empty() && !a.is_empty())
            {
                return Err(BusError::Config(format!(
                    "endpoint `{e}` (--listen / --connect or [bus]): write it as PROTOCOL/ADDRESS, e.g. tcp/0.0.0.0:7447, tls/robot.local:7447 or unixsock-stream/PATH"
                )));
            }
        }
        let set = |c: &mut zenoh::Config, k: &str, v: String| {
            c.insert_json5(k, &v)
                .map_err(|e| BusError::Config(format!("{k} = {v}: {}", zenoh_text(&e))))
        };
        let mode = match self.mode {
            Mode::Peer => "peer",
            Mode::Router => "router",
            Mode::Client => "client",
        };
        set(&mut c, "mode", format!("{mode:?}"))?;
        let json_list = |v: &[String]| serde_json_list(v);
        if !self.listen.is_empty() {
            set(&mut c, "listen/endpoints", json_list(&self.listen))?;
        }
        if !self.connect.is_empty() {
            set(&mut c, "connect/endpoints", json_list(&self.connect))?;
        }
        if !self.multicast_scouting {
            set(&mut c, "scouting/multicast/enabled", "false".into())?;
        }
        if let Some(t) = &self.tls {
            t.check()?;
            let path = |p: &std::path::Path| format!("{:?}", p.display().to_string());
            let tls = "transport/link/tls";
            set(&mut c, &format!("{tls}/root_ca_certificate"), path(&t.ca))?;
            for side in ["listen", "connect"] {
                set(&mut c, &format!("{tls}/{side}_certificate"), path(&t.cert))?;
                set(&mut c, &format!("{tls}/{side}_private_key"), path(&t.key))?;
            }
            set(&mut c, &format!("{tls}/enable_mtls"), "true".into())?;
            // Certificates that expire during a session end its links.
            set(
                &mut c,
                &format!("{tls}/close_link_on_expiration"),
                "true".into(),
            )?;
            let plain: Vec<&String> = self
                .listen
                .iter()
                .chain(&self.connect)
                .filter(|e| !e.starts_with("tls/"))
                .collect();
            if !plain.is_empty() {
                return Err(BusError::Config(format!(
                    "TLS is configured, and these endpoints are not TLS: {plain:?}; use tls/HOST:PORT, or an unauthenticated peer could join through them"
                )));
            }
        }
        if let Some((robot, access)) = &self.access {
            set(&mut c, "access_control", access.zenoh_acl(robot))?;
        }
        Ok(c)
    }

    /// Opens a session.
    pub fn open(&self) -> Result<zenoh::Session, BusError> {
        let config = self.to_zenoh()?;
        zenoh::open(config).wait().map_err(|e| BusError::Open {
            listen: self.listen.clone(),
            connect: self.connect.clone(),
            message: e.to_string(),
        })
    }
}

fn serde_json_list(v: &[String]) -> String {
    let items: Vec<String> = v
        .iter()
        .map(|s| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\"")))
        .collect();
    format!("[{}]", items.join(","))
}

/// Zenoh's error text without the source location it appends (" at /…/src/x.rs:12."), which
/// names a file in the build machine's crate cache, not anything the user can change.
fn zenoh_text(e: &dyn std::fmt::Display) -> String {
    let t = e.to_string();
    match t.rfind(" at /") {
        Some(i) if t[i..].contains(".rs:") => t[..i].to_string(),
        _ => t,
    }
}
