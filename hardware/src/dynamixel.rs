//! Dynamixel Protocol 2.0 (X series: Koch's XL330/XL430), as ROBOTIS's `dynamixel-sdk` builds it:
//! `FF FF FD 00 ID LEN_L LEN_H INSTR PARAMS... CRC_L CRC_H`. `LEN` counts INSTR, the parameters and
//! the CRC; the CRC is CRC-16 with polynomial 0x8005 (initial 0, no reflection) over everything
//! before it; in INSTR..PARAMS, `FF FF FD` is followed by an extra `FD` (byte stuffing), which
//! `LEN` includes. A status packet has INSTR 0x55 and an error byte before its parameters.

use crate::{PacketError, hex};

/// The id every servo obeys.
pub const BROADCAST_ID: u8 = 0xFE;
/// The instruction byte of a status packet.
pub const STATUS: u8 = 0x55;

/// Instructions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Instruction {
    /// Is the servo there (answers with its model number and firmware).
    Ping = 0x01,
    /// Read registers.
    Read = 0x02,
    /// Write registers.
    Write = 0x03,
    /// Read the same registers of several servos.
    SyncRead = 0x82,
    /// Write the same registers of several servos.
    SyncWrite = 0x83,
    /// Read different registers of several servos.
    BulkRead = 0x92,
}

/// X-series control table (XL330, XL430): (address, bytes). Values two's complement.
pub mod x_series {
    /// Model number.
    pub const MODEL_NUMBER: (u16, u16) = (0, 2);
    /// Drive mode (bit 0: reverse).
    pub const DRIVE_MODE: (u16, u16) = (10, 1);
    /// 0 current, 1 velocity, 3 position, 4 extended position, 5 current-based position, 16 PWM.
    pub const OPERATING_MODE: (u16, u16) = (11, 1);
    /// Homing offset, steps (present = actual + offset).
    pub const HOMING_OFFSET: (u16, u16) = (20, 4);
    /// 1: torque on.
    pub const TORQUE_ENABLE: (u16, u16) = (64, 1);
    /// Position P gain.
    pub const POSITION_P_GAIN: (u16, u16) = (84, 2);
    /// Goal current (current-based modes).
    pub const GOAL_CURRENT: (u16, u16) = (102, 2);
    /// Goal position, steps.
    pub const GOAL_POSITION: (u16, u16) = (116, 4);
    /// Present current.
    pub const PRESENT_CURRENT: (u16, u16) = (126, 2);
    /// Present velocity.
    pub const PRESENT_VELOCITY: (u16, u16) = (128, 4);
    /// Present position, steps.
    pub const PRESENT_POSITION: (u16, u16) = (132, 4);
    /// Steps per turn.
    pub const RESOLUTION: u32 = 4096;
}

/// CRC-16/BUYPASS: polynomial 0x8005, MSB first, initial value `crc`.
pub fn crc16(mut crc: u16, bytes: &[u8]) -> u16 {
    for b in bytes {
        crc ^= (*b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x8005
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// An instruction packet for `id` with `params` (stuffed), into `out`.
pub fn instruction(out: &mut Vec<u8>, id: u8, instr: u8, params: &[u8]) {
    out.clear();
    out.extend_from_slice(&[0xFF, 0xFF, 0xFD, 0x00, id, 0, 0, instr]);
    // Stuffing looks back at the two bytes before each one, starting from the length field,
    // as the SDK does (`addStuffing`).
    let unstuffed_len = (params.len() + 3) as u16;
    let mut prev = [unstuffed_len as u8, (unstuffed_len >> 8) as u8, instr];
    for p in params {
        out.push(*p);
        if *p == 0xFD && prev[1] == 0xFF && prev[2] == 0xFF {
            out.push(0xFD);
        }
        prev = [prev[1], prev[2], *p];
    }
    let len = (out.len() - 7 + 2) as u16;
    out[5] = len as u8;
    out[6] = (len >> 8) as u8;
    let crc = crc16(0, out);
    out.extend_from_slice(&crc.to_le_bytes());
}

/// PING `id`.
pub fn ping(out: &mut Vec<u8>, id: u8) {
    instruction(out, id, Instruction::Ping as u8, &[]);
}

/// READ `len` bytes at `addr` of `id`.
pub fn read(out: &mut Vec<u8>, id: u8, addr: u16, len: u16) {
    let [a0, a1] = addr.to_le_bytes();
    let [l0, l1] = len.to_le_bytes();
    instruction(out, id, Instruction::Read as u8, &[a0, a1, l0, l1]);
}

/// WRITE `data` at `addr` of `id`.
pub fn write(out: &mut Vec<u8>, id: u8, addr: u16, data: &[u8]) {
    let mut params = Vec::with_capacity(2 + data.len());
    params.extend_from_slice(&addr.to_le_bytes());
    params.extend_from_slice(data);
    instruction(out, id, Instruction::Write as u8, &params);
}

/// SYNC READ `len` bytes at `addr` of every servo in `ids`.
pub fn sync_read(out: &mut Vec<u8>, addr: u16, len: u16, ids: &[u8]) {
    let mut params = Vec::with_capacity(4 + ids.len());
    params.extend_from_slice(&addr.to_le_bytes());
    params.extend_from_slice(&len.to_le_bytes());
    params.extend_from_slice(ids);
    instruction(out, BROADCAST_ID, Instruction::SyncRead as u8, &params);
}

/// SYNC WRITE `len` bytes at `addr`: for each (id, data) of `items`, `data`.
pub fn sync_write<'a>(
    out: &mut Vec<u8>,
    addr: u16,
    len: u16,
    items: impl IntoIterator<Item = (u8, &'a [u8])>,
) {
    let mut params = vec![];
    params.extend_from_slice(&addr.to_le_bytes());
    params.extend_from_slice(&len.to_le_bytes());
    for (id, data) in items {
        params.push(id);
        params.extend_from_slice(&data[..len as usize]);
    }
    instruction(out, BROADCAST_ID, Instruction::SyncWrite as u8, &params);
}

/// BULK READ: for each (id, addr, len) of `items`.
pub fn bulk_read(out: &mut Vec<u8>, items: &[(u8, u16, u16)]) {
    let mut params = Vec::with_capacity(5 * items.len());
    for (id, addr, len) in items {
        params.push(*id);
        params.extend_from_slice(&addr.to_le_bytes());
        params.extend_from_slice(&len.to_le_bytes());
    }
    instruction(out, BROADCAST_ID, Instruction::BulkRead as u8, &params);
}

/// The error byte of a status packet: bit 7 an alert (hardware error, see Hardware Error Status),
/// bits 0-6 the result of the instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatusError(pub u8);

impl StatusError {
    /// The servo raised a hardware alert.
    pub fn alert(self) -> bool {
        self.0 & 0x80 != 0
    }

    /// What the instruction's result code means (ROBOTIS e-Manual, Protocol 2.0, Status Packet).
    pub fn result(self) -> Option<&'static str> {
        match self.0 & 0x7F {
            0 => None,
            1 => Some("result fail"),
            2 => Some("instruction error"),
            3 => Some("CRC error"),
            4 => Some("data range error"),
            5 => Some("data length error"),
            6 => Some("data limit error"),
            7 => Some("access error"),
            _ => Some("unknown error"),
        }
    }
}

/// A status packet with its parameters unstuffed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// The servo.
    pub id: u8,
    /// Its error byte.
    pub error: StatusError,
    /// Parameters.
    pub params: Vec<u8>,
}

/// A packet as read from the bus: id, instruction byte (0x55 for a status), parameters
/// unstuffed (a status's first one is its error byte), and the bytes it used.
pub fn parse_packet(bytes: &[u8]) -> Result<(u8, u8, Vec<u8>, usize), PacketError> {
    let start = bytes
        .windows(4)
        .position(|w| w == [0xFF, 0xFF, 0xFD, 0x00])
        .ok_or_else(|| PacketError::NoHeader(hex(bytes)))?;
    let b = &bytes[start..];
    if b.len() < 10 {
        return Err(PacketError::Short {
            got: b.len(),
            need: 10,
            bytes: hex(b),
        });
    }
    let len = u16::from_le_bytes([b[5], b[6]]) as usize;
    if len < 3 {
        return Err(PacketError::Length(len));
    }
    let total = 7 + len;
    if b.len() < total {
        return Err(PacketError::Short {
            got: b.len(),
            need: total,
            bytes: hex(b),
        });
    }
    let computed = crc16(0, &b[..total - 2]);
    let received = u16::from_le_bytes([b[total - 2], b[total - 1]]);
    if computed != received {
        return Err(PacketError::Checksum {
            computed,
            received,
            bytes: hex(&b[..total]),
        });
    }
    // Unstuff the parameters: FF FF FD FD -> FF FF FD.
    let raw = &b[8..total - 2];
    let mut params = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        params.push(raw[i]);
        let n = params.len();
        if raw[i] == 0xFD
            && n >= 3
            && params[n - 2] == 0xFF
            && params[n - 3] == 0xFF
            && raw.get(i + 1) == Some(&0xFD)
        {
            i += 1;
        }
        i += 1;
    }
    Ok((b[4], b[7], params, start + total))
}

/// The first status packet in `bytes` (leading noise skipped) and the bytes it used.
pub fn parse_status(bytes: &[u8]) -> Result<(Status, usize), PacketError> {
    let (id, instr, mut params, used) = parse_packet(bytes)?;
    if instr != STATUS {
        return Err(PacketError::NotStatus(instr));
    }
    if params.is_empty() {
        return Err(PacketError::Length(0));
    }
    let error = StatusError(params.remove(0));
    Ok((Status { id, error, params }, used))
}

/// A status packet for `id` (what a servo, or the emulator, sends), stuffed.
pub fn status(out: &mut Vec<u8>, id: u8, error: u8, params: &[u8]) {
    let mut p = Vec::with_capacity(1 + params.len());
    p.push(error);
    p.extend_from_slice(params);
    instruction(out, id, STATUS, &p);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_matches_the_protocol_manuals_example() {
        // ROBOTIS e-Manual, Protocol 2.0, PING example: FF FF FD 00 01 03 00 01 -> CRC 19 4E.
        assert_eq!(
            crc16(0, &[0xFF, 0xFF, 0xFD, 0x00, 0x01, 0x03, 0x00, 0x01]),
            0x4E19
        );
    }

    #[test]
    fn stuffed_parameters_read_back_unstuffed_and_corruption_is_caught() {
        let params = [0xFF, 0xFF, 0xFD, 0x01, 0xFF, 0xFF, 0xFD];
        let mut p = vec![];
        status(&mut p, 7, 0, &params);
        assert_eq!(p.len(), 11 + params.len() + 2, "two FD stuffed");
        let (s, used) = parse_status(&p).unwrap();
        assert_eq!((s.id, s.params.as_slice(), used), (7, &params[..], p.len()));
        for i in 0..p.len() {
            let mut q = p.clone();
            q[i] ^= 0x01;
            assert!(
                parse_status(&q).map(|(s, _)| s.params) != Ok(params.to_vec()),
                "byte {i}"
            );
        }
        for cut in 0..p.len() {
            assert!(parse_status(&p[..cut]).is_err());
        }
    }
}
