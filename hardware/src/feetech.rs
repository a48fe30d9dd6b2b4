//! Feetech STS/SMS servos (the STS3215 of the SO-100/SO-101), the protocol Feetech's
//! `feetech-servo-sdk` (`scservo_sdk`) calls protocol 0: `FF FF ID LEN INSTR PARAMS... CHECKSUM`,
//! `LEN` = parameters + 2, checksum = `!(ID + LEN + INSTR + PARAMS) & 0xFF`, multi-byte values
//! little-endian. A status packet is `FF FF ID LEN ERROR PARAMS... CHECKSUM`.

use crate::{PacketError, hex};

/// The id every servo obeys (and none answers).
pub const BROADCAST_ID: u8 = 0xFE;

/// Instructions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Instruction {
    /// Is the servo there.
    Ping = 0x01,
    /// Read registers.
    Read = 0x02,
    /// Write registers.
    Write = 0x03,
    /// Write registers, applied at the next [`Instruction::Action`].
    RegWrite = 0x04,
    /// Apply the registered writes.
    Action = 0x05,
    /// Read the same registers of several servos (each answers in turn).
    SyncRead = 0x82,
    /// Write the same registers of several servos (no answer).
    SyncWrite = 0x83,
}

/// The STS3215's control table: (address, bytes). hardware.md, checked against Feetech's table.
pub mod sts3215 {
    /// Model number (read by ping in the SDK).
    pub const MODEL_NUMBER: (u16, u16) = (3, 2);
    /// Servo id.
    pub const ID: (u16, u16) = (5, 1);
    /// Lower position limit, steps.
    pub const MIN_POSITION_LIMIT: (u16, u16) = (9, 2);
    /// Upper position limit, steps.
    pub const MAX_POSITION_LIMIT: (u16, u16) = (11, 2);
    /// Position loop P gain.
    pub const P_COEFFICIENT: (u16, u16) = (21, 1);
    /// Position loop D gain.
    pub const D_COEFFICIENT: (u16, u16) = (22, 1);
    /// Position loop I gain.
    pub const I_COEFFICIENT: (u16, u16) = (23, 1);
    /// Homing offset, steps, sign-magnitude with the sign in bit 11.
    pub const HOMING_OFFSET: (u16, u16) = (31, 2);
    /// 0 position, 1 velocity, 2 PWM, 3 step.
    pub const OPERATING_MODE: (u16, u16) = (33, 1);
    /// 1: torque on.
    pub const TORQUE_ENABLE: (u16, u16) = (40, 1);
    /// Acceleration.
    pub const ACCELERATION: (u16, u16) = (41, 1);
    /// Goal position, steps.
    pub const GOAL_POSITION: (u16, u16) = (42, 2);
    /// Goal velocity, steps/s, sign-magnitude bit 15.
    pub const GOAL_VELOCITY: (u16, u16) = (46, 2);
    /// EEPROM lock.
    pub const LOCK: (u16, u16) = (55, 1);
    /// Present position, steps (actual minus homing offset).
    pub const PRESENT_POSITION: (u16, u16) = (56, 2);
    /// Present velocity, steps/s, sign-magnitude bit 15.
    pub const PRESENT_VELOCITY: (u16, u16) = (58, 2);
    /// Present load.
    pub const PRESENT_LOAD: (u16, u16) = (60, 2);
    /// Present voltage, 0.1 V.
    pub const PRESENT_VOLTAGE: (u16, u16) = (62, 1);
    /// Present temperature, degrees C.
    pub const PRESENT_TEMPERATURE: (u16, u16) = (63, 1);
    /// 1 while moving.
    pub const MOVING: (u16, u16) = (66, 1);
    /// Present current.
    pub const PRESENT_CURRENT: (u16, u16) = (69, 2);
    /// Steps per turn.
    pub const RESOLUTION: u32 = 4096;
}

/// A sign-magnitude field of the servo (sign in bit `sign_bit`) as a signed value.
pub fn from_sign_magnitude(raw: u32, sign_bit: u32) -> i32 {
    let magnitude = (raw & ((1 << sign_bit) - 1)) as i32;
    if raw & (1 << sign_bit) != 0 {
        -magnitude
    } else {
        magnitude
    }
}

/// A signed value as the servo's sign-magnitude field; `None` when it does not fit.
pub fn to_sign_magnitude(value: i32, sign_bit: u32) -> Option<u32> {
    let m = value.unsigned_abs();
    (m < (1 << sign_bit)).then(|| if value < 0 { m | (1 << sign_bit) } else { m })
}

fn checksum(body: &[u8]) -> u8 {
    !body.iter().fold(0u8, |s, b| s.wrapping_add(*b))
}

/// An instruction packet for `id` with `params`, into `out` (cleared first; no allocation once
/// `out` has grown to the largest packet).
pub fn instruction(out: &mut Vec<u8>, id: u8, instr: Instruction, params: &[u8]) {
    out.clear();
    out.extend_from_slice(&[0xFF, 0xFF, id, (params.len() + 2) as u8, instr as u8]);
    out.extend_from_slice(params);
    let c = checksum(&out[2..]);
    out.push(c);
}

/// PING `id`.
pub fn ping(out: &mut Vec<u8>, id: u8) {
    instruction(out, id, Instruction::Ping, &[]);
}

/// READ `len` bytes at `addr` of `id`.
pub fn read(out: &mut Vec<u8>, id: u8, addr: u8, len: u8) {
    instruction(out, id, Instruction::Read, &[addr, len]);
}

/// WRITE `data` at `addr` of `id` (REG_WRITE with `registered`).
pub fn write(out: &mut Vec<u8>, id: u8, addr: u8, data: &[u8], registered: bool) {
    out.clear();
    let instr = if registered {
        Instruction::RegWrite
    } else {
        Instruction::Write
    };
    out.extend_from_slice(&[0xFF, 0xFF, id, (data.len() + 3) as u8, instr as u8, addr]);
    out.extend_from_slice(data);
    let c = checksum(&out[2..]);
    out.push(c);
}

/// ACTION (apply registered writes) on `id` (or [`BROADCAST_ID`]).
pub fn action(out: &mut Vec<u8>, id: u8) {
    instruction(out, id, Instruction::Action, &[]);
}

/// SYNC READ `len` bytes at `addr` of every servo in `ids` (each answers with a status packet).
pub fn sync_read(out: &mut Vec<u8>, addr: u8, len: u8, ids: &[u8]) {
    out.clear();
    out.extend_from_slice(&[
        0xFF,
        0xFF,
        BROADCAST_ID,
        (ids.len() + 4) as u8,
        Instruction::SyncRead as u8,
        addr,
        len,
    ]);
    out.extend_from_slice(ids);
    let c = checksum(&out[2..]);
    out.push(c);
}

/// SYNC WRITE `len` bytes at `addr`: for each (id, data) of `items`, `data` (`len` bytes).
pub fn sync_write<'a>(
    out: &mut Vec<u8>,
    addr: u8,
    len: u8,
    items: impl IntoIterator<Item = (u8, &'a [u8])>,
) {
    out.clear();
    out.extend_from_slice(&[
        0xFF,
        0xFF,
        BROADCAST_ID,
        0,
        Instruction::SyncWrite as u8,
        addr,
        len,
    ]);
    for (id, data) in items {
        out.push(id);
        out.extend_from_slice(&data[..len as usize]);
    }
    // LEN counts INSTR, the address, the data length, the parameters and the checksum.
    out[3] = (out.len() - 3) as u8;
    let c = checksum(&out[2..]);
    out.push(c);
}

/// A status packet: who answered, its error byte, its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status<'a> {
    /// The servo.
    pub id: u8,
    /// Error bits (0: none): 1 voltage, 2 angle (sensor), 4 overheat, 8 overele (current), 32
    /// overload.
    pub error: u8,
    /// Parameters (the data read).
    pub params: &'a [u8],
}

/// The first status packet in `bytes` (leading noise skipped up to its header) and the bytes
/// it used, checked: header, length, checksum.
pub fn parse_status(bytes: &[u8]) -> Result<(Status<'_>, usize), PacketError> {
    let ((id, error, params), used) = frame(bytes)?;
    Ok((Status { id, error, params }, used))
}

/// An instruction packet as a servo (or the emulator) receives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Command<'a> {
    /// The servo addressed ([`BROADCAST_ID`]: all).
    pub id: u8,
    /// The instruction byte.
    pub instruction: u8,
    /// Its parameters.
    pub params: &'a [u8],
}

/// The first instruction packet in `bytes` and the bytes it used (same framing as a status).
pub fn parse_instruction(bytes: &[u8]) -> Result<(Command<'_>, usize), PacketError> {
    let ((id, instruction, params), used) = frame(bytes)?;
    Ok((
        Command {
            id,
            instruction,
            params,
        },
        used,
    ))
}

/// `FF FF ID LEN CODE PARAMS CHECKSUM`: (id, code, params) and the bytes used.
#[allow(clippy::type_complexity)]
fn frame(bytes: &[u8]) -> Result<((u8, u8, &[u8]), usize), PacketError> {
    let start = bytes
        .windows(2)
        .position(|w| w == [0xFF, 0xFF])
        .ok_or_else(|| PacketError::NoHeader(hex(bytes)))?;
    // A third 0xFF is still header (the SDK skips repeated 0xFF the same way).
    let mut s = start;
    while bytes.get(s + 2) == Some(&0xFF) {
        s += 1;
    }
    let b = &bytes[s..];
    if b.len() < 6 {
        return Err(PacketError::Short {
            got: b.len(),
            need: 6,
            bytes: hex(b),
        });
    }
    let len = b[3] as usize;
    if len < 2 {
        return Err(PacketError::Length(len));
    }
    let total = len + 4;
    if b.len() < total {
        return Err(PacketError::Short {
            got: b.len(),
            need: total,
            bytes: hex(b),
        });
    }
    let computed = checksum(&b[2..total - 1]);
    if computed != b[total - 1] {
        return Err(PacketError::Checksum {
            computed: computed as u16,
            received: b[total - 1] as u16,
            bytes: hex(&b[..total]),
        });
    }
    Ok(((b[2], b[4], &b[5..total - 1]), s + total))
}

/// A status packet for `id` with `error` and `params` (what a servo, or the emulator, sends).
pub fn status(out: &mut Vec<u8>, id: u8, error: u8, params: &[u8]) {
    out.clear();
    out.extend_from_slice(&[0xFF, 0xFF, id, (params.len() + 2) as u8, error]);
    out.extend_from_slice(params);
    let c = checksum(&out[2..]);
    out.push(c);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_magnitude_round_trips_and_refuses_what_does_not_fit() {
        assert_eq!(from_sign_magnitude(0x0800 | 5, 11), -5);
        assert_eq!(from_sign_magnitude(5, 11), 5);
        assert_eq!(to_sign_magnitude(-2047, 11), Some(0x0FFF));
        assert_eq!(
            to_sign_magnitude(2048, 11),
            None,
            "beyond 11 bits of magnitude"
        );
        for v in -2047..=2047 {
            assert_eq!(
                from_sign_magnitude(to_sign_magnitude(v, 11).unwrap(), 11),
                v
            );
        }
    }

    #[test]
    fn a_status_packet_reads_back_and_every_corruption_is_an_error() {
        let mut p = vec![];
        status(&mut p, 3, 0, &[0x00, 0x08]);
        let (s, used) = parse_status(&p).unwrap();
        assert_eq!(
            (s.id, s.error, s.params, used),
            (3, 0, &[0x00, 0x08][..], p.len())
        );
        for i in 2..p.len() {
            let mut q = p.clone();
            q[i] ^= 0x10;
            assert!(parse_status(&q).is_err(), "byte {i} flipped went unnoticed");
        }
        for cut in 0..p.len() {
            assert!(parse_status(&p[..cut]).is_err());
        }
        let mut noisy = vec![0x00, 0x13, 0xFF];
        noisy.extend_from_slice(&p);
        assert_eq!(parse_status(&noisy).unwrap().0, s);
    }
}
