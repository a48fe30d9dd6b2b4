//! A person's input from the bus: teleop messages on `reflex/<robot>/teleop` into the loop's
//! lock-free teleop channel, and emergency stops on `reflex/<robot>/events` into a flag the loop
//! checks every tick.

use reflex_contracts::keys::Keys;
use reflex_contracts::msg::{self, EpisodeEvent, EventKind, TeleopMsg};
use reflex_runtime::teleop::TeleopWriter;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use zenoh::Wait;

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

/// Sets `flag` when an `estop` event arrives on `reflex/<robot>/events` (the loop latches it at
/// its next tick). Keep the returned subscriber alive as long as the loop should listen.
pub fn subscribe_estop(
    session: &zenoh::Session,
    keys: &Keys,
    flag: Arc<AtomicBool>,
) -> Result<zenoh::pubsub::Subscriber<()>, zenoh::Error> {
    let key = keys.events.clone();
    session
        .declare_subscriber(keys.events.clone())
        .callback(move |sample| {
            if let Ok(ev) = msg::decode::<EpisodeEvent>(&key, &sample.payload().to_bytes())
                && ev.kind == EventKind::Estop
            {
                flag.store(true, Ordering::Relaxed);
            }
        })
        .wait()
}
