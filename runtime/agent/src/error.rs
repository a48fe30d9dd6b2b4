//! The agent's error: what failed, naming the file, key, topic or device at fault.

/// Errors of the agent's services.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// A config file is malformed or out of range (names the file and the key).
    #[error(transparent)]
    Config(#[from] reflex_contracts::config::ConfigError),
    /// Settings that do not fit together (names the file and what to change).
    #[error("{context}: {message}")]
    Setup {
        /// The file, command or option at fault.
        context: String,
        /// What is wrong and what to do.
        message: String,
    },
    /// A robot's description cannot be driven.
    #[error(transparent)]
    Spec(#[from] reflex_contracts::validate::SpecError),
    /// The bus.
    #[error(transparent)]
    Bus(#[from] reflex_bus::BusError),
    /// The learner link.
    #[error(transparent)]
    Link(#[from] reflex_bus::learnlink::LinkError),
    /// The viz trace.
    #[error(transparent)]
    Trace(#[from] reflex_bus::trace::VizError),
    /// The robot's ROS 2 node could not start.
    #[error(transparent)]
    Ros2(#[from] reflex_ros2::Ros2Error),
    /// The robot.
    #[error(transparent)]
    Robot(#[from] reflex_contracts::robot::RobotError),
    /// The control loop.
    #[error(transparent)]
    Loop(#[from] reflex_runtime::control::LoopError),
    /// Kinematics (a URDF for the workspace check).
    #[error(transparent)]
    Kinematics(#[from] reflex_runtime::kinematics::KinematicsError),
    /// A base policy could not be loaded.
    #[error(transparent)]
    PolicyLoad(#[from] reflex_policies::onnx_policy::LoadError),
    /// A base policy failed.
    #[error(transparent)]
    Policy(#[from] reflex_contracts::policy::PolicyError),
    /// ONNX Runtime itself.
    #[error(transparent)]
    Ort(#[from] reflex_policies::ort_env::OrtError),
    #[cfg(feature = "train")]
    /// Behaviour cloning.
    #[error(transparent)]
    Bc(#[from] reflex_imitate::BcError),
    /// A learner checkpoint.
    #[error(transparent)]
    Checkpoint(#[from] reflex_learn::sac::checkpoint::CheckpointError),
    /// A kept residual file.
    #[error(transparent)]
    Residual(#[from] reflex_learn::sac::export::ResidualError),
    /// Diffusion steering.
    #[error(transparent)]
    Steer(#[from] reflex_learn::sac::steer::SteerError),
    /// The learner's tensors (transparent: the chain `reflex` prints says candle's message once).
    #[error(transparent)]
    Learner(#[from] candle_core::Error),
    #[cfg(feature = "sim")]
    /// The simulator.
    #[error(transparent)]
    Sim(#[from] reflex_sim::env::SimError),
    #[cfg(feature = "sim")]
    /// A scripted expert.
    #[error(transparent)]
    Expert(#[from] reflex_sim::expert::ExpertError),
    /// Recorded episodes, datasets and plots.
    #[error(transparent)]
    Data(#[from] reflex_data::DataError),
    /// Recorded demonstrations.
    #[error(transparent)]
    Demos(#[from] reflex_data::demos::DemoError),
    /// The recorder.
    #[error(transparent)]
    Record(#[from] reflex_record::RecorderError),
    /// A file or directory.
    #[error("`{path}`: {source}")]
    Io {
        /// The path at fault.
        path: String,
        /// The system's error.
        source: std::io::Error,
    },
    /// A failure whose message names what failed.
    #[error("{0}")]
    Failed(String),
    /// A message that did not decode.
    #[error(transparent)]
    Decode(#[from] reflex_contracts::msg::DecodeError),
    /// A teleop device.
    #[error(transparent)]
    Teleop(#[from] reflex_contracts::teleop::TeleopError),
}

impl AgentError {
    /// A [`AgentError::Setup`] error.
    pub fn setup(context: impl Into<String>, message: impl Into<String>) -> Self {
        AgentError::Setup {
            context: context.into(),
            message: message.into(),
        }
    }

    /// An I/O error at `path`.
    pub fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        AgentError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

impl From<reflex_config::SetupError> for AgentError {
    fn from(e: reflex_config::SetupError) -> Self {
        AgentError::Setup {
            context: e.context,
            message: e.message,
        }
    }
}

/// Results of the agent.
pub type Result<T, E = AgentError> = std::result::Result<T, E>;

/// Maps any error to [`AgentError::Setup`] under `what` (the key, topic or file at fault).
pub fn ctx<E: std::fmt::Display>(what: impl Into<String>) -> impl FnOnce(E) -> AgentError {
    let what = what.into();
    move |e| AgentError::setup(what, e.to_string())
}

/// A plain failure with its message (the message names what failed).
pub fn bail(message: String) -> AgentError {
    AgentError::Failed(message)
}
