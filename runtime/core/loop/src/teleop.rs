//! Teleoperation input to the loop: the newest [`TeleopMsg`] from a device, lock-free.
//!
//! A device (a keyboard, a gamepad, a leader arm, the simulated human, or the bus subscriber
//! for `reflex/<robot>/teleop`) writes with a [`TeleopWriter`]; the loop reads with a
//! [`TeleopReader`] and never waits.

use crate::msg::{self, TeleopMsg};
use crate::triple::{Reader, Writer, triple};

/// The device side.
pub struct TeleopWriter(Writer<TeleopMsg>);
/// The loop side.
pub struct TeleopReader(Reader<TeleopMsg>);

/// A teleop channel for actions of `dim` components.
pub fn teleop_channel(dim: usize) -> (TeleopWriter, TeleopReader) {
    let (w, r) = triple(TeleopMsg {
        v: msg::PROTOCOL_VERSION,
        action: vec![0.0; dim],
        ..Default::default()
    });
    (TeleopWriter(w), TeleopReader(r))
}

impl TeleopWriter {
    /// Publishes a message (copied into a preallocated slot).
    pub fn send(&mut self, m: &TeleopMsg) {
        let slot = self.0.slot();
        slot.v = m.v;
        slot.seq = m.seq;
        slot.action.clone_from(&m.action);
        slot.intervene = m.intervene;
        slot.success = m.success;
        slot.failure = m.failure;
        slot.reset = m.reset;
        self.0.publish();
    }
}

impl TeleopReader {
    /// Takes the newest message if a new one arrived.
    pub fn update(&mut self) -> bool {
        self.0.update()
    }

    /// The newest message taken.
    pub fn get(&self) -> &TeleopMsg {
        self.0.get()
    }
}
