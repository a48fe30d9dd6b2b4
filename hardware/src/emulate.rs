//! Emulated servos behind a pseudo-terminal: what `reflex hw emulate` serves, so people try
//! reflex without an arm and every driver test runs through a real serial path (the kernel's tty
//! layer, the same file a USB adapter gives).
//!
//! Each servo has its model's control table (Feetech STS3215, or Dynamixel XL330-M288: model
//! number, limits, torque, goal and present position, ...), answers PING, READ, WRITE, REG_WRITE
//! and ACTION (Feetech), SYNC READ and SYNC WRITE with the protocol's status packets, and moves
//! its present position toward its goal at a bounded speed while its torque is on. Faults on
//! request: ids that never answer, a corrupted byte in every n-th status packet, a delay before
//! every answer, SYNC READs left unanswered after a number of them (a bus that fails mid-run).
//!
//! With a goal log the emulator writes a JSON line for every change of a servo's goal or torque
//! register (`{"t_unix_ns":..,"write":..,"id":..,"reg":"goal"|"torque","value":..}`, `write`
//! counting the packets that wrote goals): what a driver actually told the servos, for tests
//! and for anyone debugging a controller without an arm.

use crate::feetech::{self, BROADCAST_ID, Instruction};
use crate::{dynamixel, dynamixel::x_series, feetech::sts3215};
use serialport::{SerialPort, TTYPort};
use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub use crate::arm::{STS3215_MODEL, ServoModel, XL330_M288_MODEL};

/// Where a model keeps what the emulator moves: (model number, goal, present, torque, moving).
struct Table {
    model: (u16, u16),
    id: (u16, u16),
    goal: (u16, u16),
    present: (u16, u16),
    torque: (u16, u16),
    moving: (u16, u16),
    max_limit: (u16, u16),
    homing: (u16, u16),
    number: u16,
}

impl ServoModel {
    fn table(self) -> Table {
        match self {
            ServoModel::Sts3215 => Table {
                model: sts3215::MODEL_NUMBER,
                id: sts3215::ID,
                goal: sts3215::GOAL_POSITION,
                present: sts3215::PRESENT_POSITION,
                torque: sts3215::TORQUE_ENABLE,
                moving: sts3215::MOVING,
                max_limit: sts3215::MAX_POSITION_LIMIT,
                homing: sts3215::HOMING_OFFSET,
                number: STS3215_MODEL,
            },
            ServoModel::Xl330 => Table {
                model: x_series::MODEL_NUMBER,
                id: (7, 1),
                goal: x_series::GOAL_POSITION,
                present: x_series::PRESENT_POSITION,
                torque: x_series::TORQUE_ENABLE,
                moving: (122, 1),
                max_limit: (48, 4),
                homing: x_series::HOMING_OFFSET,
                number: XL330_M288_MODEL,
            },
        }
    }
}

/// What the emulated bus holds and which faults it injects.
#[derive(Clone, Debug)]
pub struct EmulatorConfig {
    /// The servos' model (and so the protocol).
    pub model: ServoModel,
    /// Servo ids on the bus.
    pub ids: Vec<u8>,
    /// Ids that are configured but never answer (a loose cable).
    pub silent: Vec<u8>,
    /// Corrupt one byte of every n-th status packet (0: never).
    pub corrupt_every: u64,
    /// Wait this long before each answer.
    pub delay: Duration,
    /// How fast a servo with torque on moves toward its goal, steps per second.
    pub speed: f64,
    /// Starting present position of every servo, steps.
    pub start_position: u16,
    /// Leave every SYNC READ after the first `n` unanswered (a bus that fails mid-run).
    pub drop_sync_reads_after: Option<u64>,
    /// Write goal and torque changes to this file, one JSON line each.
    pub goal_log: Option<std::path::PathBuf>,
}

impl Default for EmulatorConfig {
    fn default() -> Self {
        EmulatorConfig {
            model: ServoModel::Sts3215,
            ids: (1..=6).collect(),
            silent: vec![],
            corrupt_every: 0,
            delay: Duration::ZERO,
            speed: 4000.0,
            start_position: 2048,
            drop_sync_reads_after: None,
            goal_log: None,
        }
    }
}

/// What the emulated bus saw.
#[derive(Debug, Default)]
pub struct EmulatorCounters {
    /// Instruction packets decoded.
    pub instructions: AtomicU64,
    /// Status packets sent.
    pub answers: AtomicU64,
    /// Status packets sent with a corrupted byte.
    pub corrupted: AtomicU64,
    /// Bytes that were not a valid instruction packet.
    pub garbage: AtomicU64,
    /// SYNC READs received.
    pub sync_reads: AtomicU64,
}

/// A running emulated bus; dropped, it stops.
pub struct Emulator {
    path: String,
    stop: Arc<AtomicBool>,
    hand: Arc<std::sync::Mutex<Vec<(u8, f64)>>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// What it saw.
    pub counters: Arc<EmulatorCounters>,
}

impl Emulator {
    /// Opens a pseudo-terminal and serves the servos of `cfg` on it.
    pub fn start(cfg: EmulatorConfig) -> Result<Self, serialport::Error> {
        let log = match &cfg.goal_log {
            Some(p) => Some(GoalLog::create(p).map_err(|e| {
                serialport::Error::new(
                    serialport::ErrorKind::Io(e.kind()),
                    format!("goal log `{}`: {e}", p.display()),
                )
            })?),
            None => None,
        };
        let (master, slave) = TTYPort::pair()?;
        let path = slave.name().ok_or_else(|| {
            serialport::Error::new(serialport::ErrorKind::NoDevice, "a pty without a name")
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(EmulatorCounters::default());
        let hand = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (s, c, h) = (stop.clone(), counters.clone(), hand.clone());
        let thread = std::thread::Builder::new()
            .name("servo-emulator".into())
            .spawn(move || {
                // The slave end stays open here, so the master never reads EIO between clients.
                let _slave = slave;
                serve(master, cfg, &s, &c, &h, log)
            })
            .map_err(|e| {
                serialport::Error::new(serialport::ErrorKind::Io(e.kind()), e.to_string())
            })?;
        Ok(Emulator {
            path,
            stop,
            hand,
            thread: Some(thread),
            counters,
        })
    }

    /// The serial device to open (`/dev/pts/N`).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// A person moves servo `id` by hand to `steps` of its mechanical range (0..4096, before
    /// any homing offset). A servo holding with its torque on resists: then nothing moves.
    pub fn move_by_hand(&self, id: u8, steps: f64) {
        if let Ok(mut h) = self.hand.lock() {
            h.push((id, steps));
        }
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Servo {
    id: u8,
    regs: [u8; 256],
    registered: Option<(u16, Vec<u8>)>,
    position: f64,
}

impl Servo {
    fn new(id: u8, start: u16, t: &Table) -> Self {
        let mut s = Servo {
            id,
            regs: [0u8; 256],
            registered: None,
            position: start as f64,
        };
        s.put(t.model, t.number as u32);
        s.put(t.id, id as u32);
        s.put(t.max_limit, 4095);
        s.put(t.goal, start as u32);
        s.put(t.present, start as u32);
        s
    }

    fn put(&mut self, (addr, len): (u16, u16), v: u32) {
        for k in 0..len as usize {
            self.regs[addr as usize + k] = (v >> (8 * k)) as u8;
        }
    }

    fn get(&self, (addr, len): (u16, u16)) -> u32 {
        (0..len as usize).fold(0, |v, k| {
            v | (self.regs[addr as usize + k] as u32) << (8 * k)
        })
    }

    fn read(&self, addr: u16, len: u16) -> Vec<u8> {
        let a = (addr as usize).min(256);
        self.regs[a..(a + len as usize).min(256)].to_vec()
    }

    fn write(&mut self, addr: u16, data: &[u8]) {
        for (k, b) in data.iter().enumerate() {
            if let Some(r) = self.regs.get_mut(addr as usize + k) {
                *r = *b;
            }
        }
    }

    /// The homing offset register as a signed value: Feetech's sign-magnitude (sign in bit
    /// 11), Dynamixel's two's complement.
    fn homing(&self, model: ServoModel, t: &Table) -> f64 {
        let raw = self.get(t.homing);
        match model {
            ServoModel::Sts3215 => feetech::from_sign_magnitude(raw, 11) as f64,
            ServoModel::Xl330 => raw as i32 as f64,
        }
    }

    /// Moves toward the goal for `dt` while torque is on. Positions in the registers are the
    /// mechanical position shifted by the homing offset as each family does it: Feetech
    /// reports `actual - offset` wrapped to one turn, Dynamixel `actual + offset`.
    fn advance(&mut self, dt: f64, speed: f64, model: ServoModel, t: &Table) {
        let off = self.homing(model, t);
        let goal_reg = self.get(t.goal);
        let goal = match model {
            ServoModel::Sts3215 => {
                let g = feetech::from_sign_magnitude(goal_reg, 15) as f64;
                (g + off).rem_euclid(4096.0)
            }
            ServoModel::Xl330 => goal_reg as i32 as f64 - off,
        };
        let on = self.get(t.torque) != 0;
        if on {
            self.position += (goal - self.position).clamp(-speed * dt, speed * dt);
        }
        let present = match model {
            ServoModel::Sts3215 => ((self.position - off).round() as i64).rem_euclid(4096) as u32,
            ServoModel::Xl330 => (self.position + off).round() as i64 as i32 as u32,
        };
        self.put(t.present, present);
        self.put(t.moving, (on && (goal - self.position).abs() > 0.5) as u32);
    }
}

/// An instruction, whichever protocol carried it.
enum Cmd {
    Ping,
    Read(u16, u16),
    Write(u16, Vec<u8>),
    RegWrite(u16, Vec<u8>),
    Action,
    SyncRead(u16, u16, Vec<u8>),
    SyncWrite(u16, u16, Vec<u8>),
    Other,
}

/// Decodes the first instruction packet in `buf`: (id, command, bytes used).
fn decode(model: ServoModel, buf: &[u8]) -> Result<(u8, Cmd, usize), crate::PacketError> {
    let le = |p: &[u8], i: usize| u16::from_le_bytes([p[i], p[i + 1]]);
    match model {
        ServoModel::Sts3215 => {
            let (c, used) = feetech::parse_instruction(buf)?;
            let p = c.params;
            let cmd = match c.instruction {
                x if x == Instruction::Ping as u8 => Cmd::Ping,
                x if x == Instruction::Read as u8 && p.len() == 2 => {
                    Cmd::Read(p[0] as u16, p[1] as u16)
                }
                x if x == Instruction::Write as u8 && !p.is_empty() => {
                    Cmd::Write(p[0] as u16, p[1..].to_vec())
                }
                x if x == Instruction::RegWrite as u8 && !p.is_empty() => {
                    Cmd::RegWrite(p[0] as u16, p[1..].to_vec())
                }
                x if x == Instruction::Action as u8 => Cmd::Action,
                x if x == Instruction::SyncRead as u8 && p.len() >= 2 => {
                    Cmd::SyncRead(p[0] as u16, p[1] as u16, p[2..].to_vec())
                }
                x if x == Instruction::SyncWrite as u8 && p.len() >= 2 => {
                    Cmd::SyncWrite(p[0] as u16, p[1] as u16, p[2..].to_vec())
                }
                _ => Cmd::Other,
            };
            Ok((c.id, cmd, used))
        }
        ServoModel::Xl330 => {
            let (id, instr, p, used) = dynamixel::parse_packet(buf)?;
            use dynamixel::Instruction as I;
            let cmd = match instr {
                x if x == I::Ping as u8 => Cmd::Ping,
                x if x == I::Read as u8 && p.len() == 4 => Cmd::Read(le(&p, 0), le(&p, 2)),
                x if x == I::Write as u8 && p.len() >= 2 => Cmd::Write(le(&p, 0), p[2..].to_vec()),
                x if x == I::SyncRead as u8 && p.len() >= 4 => {
                    Cmd::SyncRead(le(&p, 0), le(&p, 2), p[4..].to_vec())
                }
                x if x == I::SyncWrite as u8 && p.len() >= 4 => {
                    Cmd::SyncWrite(le(&p, 0), le(&p, 2), p[4..].to_vec())
                }
                _ => Cmd::Other,
            };
            Ok((id, cmd, used))
        }
    }
}

/// Goal and torque changes, one JSON line each, written as they happen (a test reads the file
/// while the emulator runs).
struct GoalLog {
    file: std::fs::File,
    last: Vec<(u8, u32, u32)>,
    writes: u64,
}

impl GoalLog {
    fn create(path: &std::path::Path) -> std::io::Result<Self> {
        Ok(GoalLog {
            file: std::fs::File::create(path)?,
            last: Vec::new(),
            writes: 0,
        })
    }

    /// Notes the servos' goal and torque registers after a packet that may have written them.
    fn note(&mut self, servos: &[Servo], t: &Table) {
        self.writes += 1;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let mut lines = String::new();
        for s in servos {
            let (goal, torque) = (s.get(t.goal), s.get(t.torque));
            let k = match self.last.iter().position(|(id, _, _)| *id == s.id) {
                Some(k) => k,
                None => {
                    // First sight: the power-on values, logged as they are.
                    self.last.push((s.id, u32::MAX, u32::MAX));
                    self.last.len() - 1
                }
            };
            let (_, g0, t0) = self.last[k];
            for (reg, old, new) in [("goal", g0, goal), ("torque", t0, torque)] {
                if old != new {
                    lines.push_str(&format!(
                        "{{\"t_unix_ns\":{now},\"write\":{},\"id\":{},\"reg\":\"{reg}\",\"value\":{new}}}\n",
                        self.writes, s.id
                    ));
                }
            }
            self.last[k] = (s.id, goal, torque);
        }
        if !lines.is_empty() {
            let _ = self.file.write_all(lines.as_bytes());
        }
    }
}

fn serve(
    mut port: TTYPort,
    cfg: EmulatorConfig,
    stop: &AtomicBool,
    c: &EmulatorCounters,
    hand: &std::sync::Mutex<Vec<(u8, f64)>>,
    mut log: Option<GoalLog>,
) {
    let _ = port.set_timeout(Duration::from_millis(2));
    let table = cfg.model.table();
    let mut servos: Vec<Servo> = cfg
        .ids
        .iter()
        .map(|id| Servo::new(*id, cfg.start_position, &table))
        .collect();
    let (mut buf, mut chunk, mut out) = (Vec::<u8>::new(), [0u8; 512], Vec::<u8>::new());
    let mut last = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if let Ok(n) = port.read(&mut chunk) {
            buf.extend_from_slice(&chunk[..n]);
        }
        let dt = last.elapsed().as_secs_f64();
        last = Instant::now();
        if let Ok(mut h) = hand.lock() {
            for (id, steps) in h.drain(..) {
                if let Some(s) = servos.iter_mut().find(|s| s.id == id)
                    && s.get(table.torque) == 0
                {
                    s.position = steps.clamp(0.0, 4095.0);
                }
            }
        }
        for s in servos.iter_mut() {
            s.advance(dt, cfg.speed, cfg.model, &table);
        }
        loop {
            match decode(cfg.model, &buf) {
                Ok((id, cmd, used)) => {
                    c.instructions.fetch_add(1, Ordering::Relaxed);
                    let writes = matches!(cmd, Cmd::Write(..) | Cmd::SyncWrite(..) | Cmd::Action);
                    let sync_read = matches!(cmd, Cmd::SyncRead(..));
                    let mut answers = execute(&mut servos, &cfg, &table, id, cmd);
                    if sync_read {
                        let n = c.sync_reads.fetch_add(1, Ordering::Relaxed) + 1;
                        if cfg.drop_sync_reads_after.is_some_and(|k| n > k) {
                            answers.clear();
                        }
                    }
                    buf.drain(..used);
                    if let Some(l) = &mut log
                        && writes
                    {
                        l.note(&servos, &table);
                    }
                    for (id, params) in answers {
                        if !cfg.delay.is_zero() {
                            std::thread::sleep(cfg.delay);
                        }
                        match cfg.model {
                            ServoModel::Sts3215 => feetech::status(&mut out, id, 0, &params),
                            ServoModel::Xl330 => dynamixel::status(&mut out, id, 0, &params),
                        }
                        let n = c.answers.fetch_add(1, Ordering::Relaxed) + 1;
                        if cfg.corrupt_every > 0 && n.is_multiple_of(cfg.corrupt_every) {
                            let k = out.len() - 2;
                            out[k] ^= 0x5A;
                            c.corrupted.fetch_add(1, Ordering::Relaxed);
                        }
                        let _ = port.write_all(&out);
                    }
                }
                Err(crate::PacketError::Short { .. }) => break,
                // A lone 0xFF at the end may be the start of the next header.
                Err(crate::PacketError::NoHeader(_)) if buf.last() == Some(&0xFF) => {
                    let keep = buf.len() - 1;
                    buf.drain(..keep);
                    break;
                }
                Err(_) => {
                    // Not a packet: drop up to the next header candidate.
                    c.garbage.fetch_add(1, Ordering::Relaxed);
                    let skip = buf
                        .iter()
                        .skip(1)
                        .position(|b| *b == 0xFF)
                        .map_or(buf.len(), |p| p + 1);
                    buf.drain(..skip);
                    if buf.is_empty() {
                        break;
                    }
                }
            }
        }
    }
}

/// Carries out one instruction; returns the status packets to send, in order.
fn execute(
    servos: &mut [Servo],
    cfg: &EmulatorConfig,
    t: &Table,
    id: u8,
    cmd: Cmd,
) -> Vec<(u8, Vec<u8>)> {
    let answers = |i: u8| !cfg.silent.contains(&i);
    let mut out = vec![];
    let unicast = id != BROADCAST_ID;
    match cmd {
        Cmd::Ping => {
            for s in servos.iter().filter(|s| s.id == id && answers(s.id)) {
                // Dynamixel answers a ping with its model number and firmware version.
                let params = match cfg.model {
                    ServoModel::Sts3215 => vec![],
                    ServoModel::Xl330 => {
                        let [lo, hi] = t.number.to_le_bytes();
                        vec![lo, hi, 52]
                    }
                };
                out.push((s.id, params));
            }
        }
        Cmd::Read(addr, len) => {
            for s in servos.iter().filter(|s| s.id == id && answers(s.id)) {
                out.push((s.id, s.read(addr, len)));
            }
        }
        Cmd::Write(addr, data) => {
            for s in servos.iter_mut().filter(|s| s.id == id || !unicast) {
                s.write(addr, &data);
                if unicast && answers(s.id) {
                    out.push((s.id, vec![]));
                }
            }
        }
        Cmd::RegWrite(addr, data) => {
            for s in servos.iter_mut().filter(|s| s.id == id || !unicast) {
                s.registered = Some((addr, data.clone()));
                if unicast && answers(s.id) {
                    out.push((s.id, vec![]));
                }
            }
        }
        Cmd::Action => {
            for s in servos.iter_mut().filter(|s| s.id == id || !unicast) {
                if let Some((a, d)) = s.registered.take() {
                    s.write(a, &d);
                }
            }
        }
        Cmd::SyncRead(addr, len, ids) => {
            for want in ids {
                if let Some(s) = servos.iter().find(|s| s.id == want && answers(s.id)) {
                    out.push((s.id, s.read(addr, len)));
                }
            }
        }
        Cmd::SyncWrite(addr, len, items) => {
            for item in items.chunks_exact(len as usize + 1) {
                if let Some(s) = servos.iter_mut().find(|s| s.id == item[0]) {
                    s.write(addr, &item[1..]);
                }
            }
        }
        Cmd::Other => {}
    }
    out
}
