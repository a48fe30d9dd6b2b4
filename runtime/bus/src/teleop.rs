//! A person's input from the bus: teleop messages on `reflex/<robot>/teleop` into the loop's
//! lock-free teleop channel. The e-stop's inputs are in [`crate::stop`].

use crate::Rejects;
use reflex_contracts::keys::Keys;
use reflex_contracts::msg::TeleopMsg;
use reflex_runtime::teleop::TeleopWriter;
use std::sync::{Arc, Mutex};

/// Feeds `reflex/<robot>/teleop` from the bus into a teleop channel. A message that does not
/// decode, or that intervenes with an action that is not `action_dim` finite values, is counted in `rejects` and never
/// reaches the loop. Keep the returned subscriber alive as long as the loop should listen.
pub fn subscribe(
    session: &zenoh::Session,
    keys: &Keys,
    writer: TeleopWriter,
    action_dim: usize,
    rejects: Arc<Rejects>,
) -> Result<zenoh::pubsub::Subscriber<()>, zenoh::Error> {
    let writer = Mutex::new(writer);
    let r = rejects.clone();
    crate::subscribe_decoded(session, &keys.teleop, rejects, move |m: TeleopMsg| {
        // The loop reads the action only while a person intervenes: then it must fit the robot.
        let fits = !m.intervene
            || (m.action.len() == action_dim && m.action.iter().all(|v| v.is_finite()));
        if !fits {
            r.reject(&format_args!(
                "teleop action of {} values (finite: {}) for a robot with {action_dim}",
                m.action.len(),
                m.action.iter().all(|v| v.is_finite())
            ));
        } else if let Ok(mut w) = writer.lock() {
            w.send(&m);
        }
    })
}
