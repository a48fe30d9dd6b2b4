//! Teleoperation input to the loop: the newest [`TeleopMsg`] from a device, lock-free.
//!
//! A device (a keyboard, a gamepad, a leader arm, the simulated human, or the bus subscriber
//! for `reflex/<robot>/teleop`) writes with a [`TeleopWriter`]; the loop reads with a
//! [`TeleopReader`] and never waits.
//!
//! The channel keeps only the newest message, which is right for the person's command and the
//! intervention control but not for the one-shot buttons (success, failure, reset): a device that
//! sends faster than the loop runs (the keyboard's 50 Hz stream against a 20 Hz loop) would
//! replace the one message that carried a press before the loop read it, and the press would be
//! lost. So the writer also counts every press it has sent, the counts travel with each message,
//! and the loop acts on the counts that moved since its last read ([`Presses`]): a press is seen
//! once however many messages follow it before the loop looks.

use crate::msg::{self, TeleopMsg};
use crate::triple::{Reader, Writer, triple};

/// How many times each one-shot button has been pressed since the channel was opened, and which
/// label the person gave last.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Presses {
    /// Success labels.
    pub success: u64,
    /// Failure labels.
    pub failure: u64,
    /// Reset requests.
    pub reset: u64,
    /// The newest label pressed (`true`: success): a person who presses success and then, before
    /// the loop looks, failure has corrected themselves. Within one message success counts last.
    pub last_label: Option<bool>,
}

impl Presses {
    /// The presses in `self` that `earlier` had not counted yet (`last_label` is `self`'s).
    pub fn since(&self, earlier: &Presses) -> Presses {
        Presses {
            success: self.success.saturating_sub(earlier.success),
            failure: self.failure.saturating_sub(earlier.failure),
            reset: self.reset.saturating_sub(earlier.reset),
            last_label: self.last_label,
        }
    }

    /// The label the presses since an earlier look give: none if no label was pressed since,
    /// else the newest one.
    pub fn label(&self) -> Option<bool> {
        if self.success + self.failure > 0 {
            self.last_label
        } else {
            None
        }
    }
}

/// One slot of the channel: the newest message and the presses sent up to it.
#[derive(Clone)]
struct Slot {
    msg: TeleopMsg,
    presses: Presses,
}

/// The device side.
pub struct TeleopWriter {
    writer: Writer<Slot>,
    presses: Presses,
}

/// The loop side.
pub struct TeleopReader(Reader<Slot>);

/// A teleop channel for actions of `dim` components.
pub fn teleop_channel(dim: usize) -> (TeleopWriter, TeleopReader) {
    let (w, r) = triple(Slot {
        msg: TeleopMsg {
            v: msg::PROTOCOL_VERSION,
            action: vec![0.0; dim],
            ..Default::default()
        },
        presses: Presses::default(),
    });
    (
        TeleopWriter {
            writer: w,
            presses: Presses::default(),
        },
        TeleopReader(r),
    )
}

impl TeleopWriter {
    /// Publishes a message (copied into a preallocated slot). Each of its one-shot buttons that
    /// is set counts as one press.
    pub fn send(&mut self, m: &TeleopMsg) {
        self.presses.success += u64::from(m.success);
        self.presses.failure += u64::from(m.failure);
        self.presses.reset += u64::from(m.reset);
        if m.failure {
            self.presses.last_label = Some(false);
        }
        if m.success {
            self.presses.last_label = Some(true);
        }
        let presses = self.presses;
        let slot = self.writer.slot();
        slot.msg.v = m.v;
        slot.msg.seq = m.seq;
        slot.msg.action.clone_from(&m.action);
        slot.msg.intervene = m.intervene;
        slot.msg.success = m.success;
        slot.msg.failure = m.failure;
        slot.msg.reset = m.reset;
        slot.presses = presses;
        self.writer.publish();
    }
}

impl TeleopReader {
    /// Takes the newest message if a new one arrived.
    pub fn update(&mut self) -> bool {
        self.0.update()
    }

    /// The newest message taken. Its `success`, `failure` and `reset` say only what that one
    /// message carried: read the buttons with [`TeleopReader::presses`].
    pub fn get(&self) -> &TeleopMsg {
        &self.0.get().msg
    }

    /// Every press sent up to the newest message taken, including those of messages the loop
    /// never saw.
    pub fn presses(&self) -> Presses {
        self.0.get().presses
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(seq: u64, success: bool, failure: bool, reset: bool) -> TeleopMsg {
        TeleopMsg {
            seq,
            action: vec![0.0; 2],
            success,
            failure,
            reset,
            ..Default::default()
        }
    }

    #[test]
    fn a_press_in_a_message_the_reader_never_took_still_counts_once() {
        let (mut w, mut r) = teleop_channel(2);
        // The device's stream outruns the reader: the success press is in the second of five
        // messages, the failure in the fourth, and the reader looks once after all of them.
        w.send(&msg(1, false, false, false));
        w.send(&msg(2, true, false, false));
        w.send(&msg(3, false, false, false));
        w.send(&msg(4, false, true, false));
        w.send(&msg(5, false, false, false));
        assert!(r.update());
        assert_eq!(r.get().seq, 5);
        assert!(
            !r.get().success && !r.get().failure,
            "the newest carries no press"
        );
        let seen = Presses::default();
        let now = r.presses();
        assert_eq!(
            now.since(&seen),
            Presses {
                success: 1,
                failure: 1,
                reset: 0,
                last_label: Some(false)
            }
        );
        // The person pressed success, then failure: their last word stands.
        assert_eq!(now.since(&seen).label(), Some(false));
        // Nothing new: the same presses, so none since the last look.
        w.send(&msg(6, false, false, false));
        assert!(r.update());
        assert_eq!(r.presses().since(&now).label(), None);
        assert_eq!(r.presses().since(&now).reset, 0);
        // A reset press read in the very message that carries it.
        w.send(&msg(7, false, false, true));
        assert!(r.update());
        assert_eq!(r.presses().since(&now).reset, 1);
    }
}
