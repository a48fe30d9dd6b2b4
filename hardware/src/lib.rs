//! reflex-hardware: the arms people use for robot learning and the devices a person drives them
//! with.
//!
//! - [`robot`]: an SO-101 or Koch follower as a [`reflex_contracts::robot::Robot`], with its
//!   cameras (reflex-cameras);
//! - [`leader`], [`devices`], [`keyboard`]: the leader arm, a gamepad, a SpaceMouse and this
//!   terminal's keys as [`reflex_contracts::teleop::Teleop`] devices;
//! - [`arm`], [`calibrate`]: whole arms in joint units through LeRobot's calibration, and the
//!   guided calibration procedure.
//!
//! Underneath, the packet layers, each a faithful implementation of a public protocol, checked byte
//! for byte against the vendors' own Python SDKs (tests/system/servo_packets.rs), a Feetech bus
//! on a serial port ([`bus`]) and, with the feature `emulate` (a test double: workstation builds
//! only), emulated Feetech and Dynamixel servos behind a pseudo-terminal (`emulate`):
//! - [`feetech`]: Feetech STS/SMS ("protocol 0", SO-100/SO-101's STS3215), little-endian;
//! - [`dynamixel`]: Dynamixel Protocol 2.0 (Koch's XL330/XL430), CRC-16 and byte stuffing.
//!
//! Each decoder takes bytes from a serial line, which can be corrupt, cut short or from another
//! servo: every failure is a [`PacketError`] that says what came back, never a panic.

pub mod arm;
pub mod bus;
pub mod calibrate;
pub mod devices;
pub mod dynamixel;
#[cfg(any(test, feature = "emulate"))]
pub mod emulate;
pub mod feetech;
pub mod keyboard;
pub mod leader;
pub mod robot;
pub mod teleop;

/// Why bytes from the bus are not the status packet that was expected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    /// Fewer bytes than a whole packet.
    #[error("a status packet cut short: {got} bytes of {need} ({bytes})")]
    Short {
        /// Bytes received.
        got: usize,
        /// Bytes a whole packet needs.
        need: usize,
        /// What came back, in hex.
        bytes: String,
    },
    /// No header where the packet should start.
    #[error("no packet header in {0}")]
    NoHeader(String),
    /// The checksum or CRC does not match.
    #[error("checksum mismatch: computed {computed:#06x}, received {received:#06x} ({bytes})")]
    Checksum {
        /// What the bytes sum to.
        computed: u16,
        /// What the packet carries.
        received: u16,
        /// What came back, in hex.
        bytes: String,
    },
    /// A length field that no packet of this protocol has.
    #[error("impossible length field {0}")]
    Length(usize),
    /// A status packet from another servo than the one asked.
    #[error("a status packet from id {got}, expected id {want}")]
    WrongId {
        /// The id in the packet.
        got: u8,
        /// The id asked.
        want: u8,
    },
    /// Not a status packet (Dynamixel: the instruction byte is not 0x55).
    #[error("not a status packet: instruction {0:#04x}")]
    NotStatus(u8),
}

/// Bytes as space-separated hex, for error messages.
pub fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(" ")
}
