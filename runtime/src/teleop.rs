//! Teleoperation input to the loop: the newest [`TeleopMsg`] from a device, lock-free.
//!
//! A device (a keyboard, a gamepad, a leader arm, the simulated human, or the bus subscriber
//! for `reflex/<robot>/teleop`) writes with a [`TeleopWriter`]; the loop reads with a
//! [`TeleopReader`] and never waits.

use crate::bus::Keys;
use crate::msg::{self, TeleopMsg};
use crate::triple::{Reader, Writer, triple};
use std::sync::{Arc, Mutex};
use zenoh::Wait;

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

/// Feeds `reflex/<robot>/teleop` from the bus into a teleop channel. Keep the returned
/// subscriber alive as long as the loop should listen.
pub fn subscribe(
    session: &zenoh::Session,
    keys: &Keys,
    writer: TeleopWriter,
) -> Result<zenoh::pubsub::Subscriber<()>, zenoh::Error> {
    let key = keys.teleop.clone();
    let writer = Arc::new(Mutex::new(writer));
    session
        .declare_subscriber(keys.teleop.clone())
        .callback(move |sample| {
            match msg::decode::<TeleopMsg>(&key, &sample.payload().to_bytes()) {
                Ok(m) => {
                    if let Ok(mut w) = writer.lock() {
                        w.send(&m);
                    }
                }
                Err(e) => tracing::warn!("{e}"),
            }
        })
        .wait()
}
