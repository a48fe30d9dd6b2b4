//! reflex-bus: the reflex protocol on Zenoh (docs/protocol.md is the contract).
//!
//! - [`robot`]: [`robot::RemoteRobot`] drives any robot that speaks the protocol (the simulator
//!   served by `reflex sim serve`, the Gymnasium bridge, a driver on another computer);
//!   [`robot::RobotServer`] serves any [`reflex_contracts::robot::Robot`];
//! - [`status`], [`teleop`]: the actor's status out, a person's teleop and emergency stops in;
//! - [`trace`]: the decimated step trace for `reflex viz`, and the watcher that reads it;
//! - [`learnlink`]: both halves of the actor-learner link: numbered transitions with resend,
//!   versioned chunked weights, the learner's acknowledgements.
//!
//! Nothing here runs on the control loop's thread.
#![warn(missing_docs)]

pub mod learnlink;
pub mod robot;
pub mod status;
pub mod teleop;
pub mod trace;

use std::path::PathBuf;
use zenoh::Wait;

pub use reflex_contracts::keys::Keys;

/// Errors opening or using the bus.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// The Zenoh configuration is invalid.
    #[error("Zenoh configuration: {0}")]
    Config(String),
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
}

impl BusConfig {
    /// A config that touches nothing but the given endpoints: no scouting of any kind.
    pub fn hermetic(listen: Vec<String>, connect: Vec<String>) -> Self {
        BusConfig {
            listen,
            connect,
            multicast_scouting: false,
            config_file: None,
        }
    }

    /// Builds the Zenoh config.
    pub fn to_zenoh(&self) -> Result<zenoh::Config, BusError> {
        let mut c = match &self.config_file {
            Some(p) => zenoh::Config::from_file(p)
                .map_err(|e| BusError::Config(format!("file `{}`: {e}", p.display())))?,
            None => zenoh::Config::default(),
        };
        let set = |c: &mut zenoh::Config, k: &str, v: String| {
            c.insert_json5(k, &v)
                .map_err(|e| BusError::Config(format!("{k} = {v}: {e}")))
        };
        set(&mut c, "mode", "\"peer\"".into())?;
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
