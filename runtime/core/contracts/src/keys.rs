//! The key expressions of the reflex protocol: one namespace per robot, `reflex/<robot>/...`
//! (docs/protocol.md lists what travels on each).

/// A robot name that cannot be part of a key expression.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("robot name `{0}` is not usable in a key expression: use letters, digits, `-` and `_`")]
pub struct BadName(pub String);

/// The key expressions of one robot.
#[derive(Clone, Debug)]
pub struct Keys {
    /// Robot name.
    pub robot: String,
    /// `reflex/<robot>/obs`
    pub obs: String,
    /// `reflex/<robot>/cmd`
    pub cmd: String,
    /// `reflex/<robot>/spec`
    pub spec: String,
    /// `reflex/<robot>/reset`
    pub reset: String,
    /// `reflex/<robot>/events`
    pub events: String,
    /// `reflex/<robot>/teleop`
    pub teleop: String,
    /// `reflex/<robot>/operator`: an operator's release and resume of the e-stop
    pub operator: String,
    /// `reflex/<robot>/status`
    pub status: String,
    /// `reflex/<robot>/stop/robot`: the robot server's own e-stop ([`crate::msg::StopStatus`])
    pub stop_robot: String,
    /// `reflex/<robot>/stop/actor`: the actor's e-stop ([`crate::msg::StopStatus`])
    pub stop_actor: String,
    /// `reflex/<robot>/stop/*`: every holder of an e-stop of the robot (a query's key)
    pub stop_any: String,
    /// `reflex/<robot>/alive/robot`
    pub alive_robot: String,
    /// `reflex/<robot>/trace`
    pub trace: String,
    /// `reflex/<robot>/trace/spec`
    pub trace_spec: String,
    /// `reflex/<robot>/trace/frames`
    pub trace_frames: String,
    /// `reflex/<robot>/learn/transitions`
    pub learn_transitions: String,
    /// `reflex/<robot>/learn/state`
    pub learn_state: String,
    /// `reflex/<robot>/learn/weights`
    pub learn_weights: String,
    /// `reflex/<robot>/alive/learner`
    pub alive_learner: String,
    /// `reflex/<robot>/alive/actor`
    pub alive_actor: String,
}

impl Keys {
    /// The key on which `holder` reports its e-stop: `stop/robot` or `stop/actor`.
    pub fn stop_of(&self, holder: crate::stop::StopHolder) -> &str {
        match holder {
            crate::stop::StopHolder::Robot => &self.stop_robot,
            crate::stop::StopHolder::Actor => &self.stop_actor,
        }
    }

    /// Key expressions for `robot`, which must be a plain name.
    pub fn new(robot: &str) -> Result<Self, BadName> {
        let ok = !robot.is_empty()
            && robot
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !ok {
            return Err(BadName(robot.to_string()));
        }
        let k = |s: &str| format!("reflex/{robot}/{s}");
        Ok(Keys {
            robot: robot.to_string(),
            obs: k("obs"),
            cmd: k("cmd"),
            spec: k("spec"),
            reset: k("reset"),
            events: k("events"),
            teleop: k("teleop"),
            operator: k("operator"),
            status: k("status"),
            stop_robot: k("stop/robot"),
            stop_actor: k("stop/actor"),
            stop_any: k("stop/*"),
            alive_robot: k("alive/robot"),
            trace: k("trace"),
            trace_spec: k("trace/spec"),
            trace_frames: k("trace/frames"),
            learn_transitions: k("learn/transitions"),
            learn_state: k("learn/state"),
            learn_weights: k("learn/weights"),
            alive_learner: k("alive/learner"),
            alive_actor: k("alive/actor"),
        })
    }
}
