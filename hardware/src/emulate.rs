//! Emulated Feetech servos behind a pseudo-terminal: what `reflex hw emulate` serves, so people
//! try reflex without an arm and every driver test runs through a real serial path (the kernel's
//! tty layer, the same file a USB adapter gives).
//!
//! Each servo has the STS3215's control table (model number, limits, torque, goal and present
//! position, ...), answers PING, READ, WRITE, REG_WRITE/ACTION, SYNC READ and SYNC WRITE with the
//! protocol's status packets, and moves its present position toward its goal at a bounded speed
//! while its torque is on. Faults on request: ids that never answer, a corrupted byte in every
//! n-th status packet, a delay before every answer.

use crate::feetech::{self, BROADCAST_ID, Instruction, sts3215 as reg};
use serialport::{SerialPort, TTYPort};
use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The STS3215's model number (what PING's follow-up read of address 3 returns).
pub const STS3215_MODEL: u16 = 777;

/// What the emulated bus holds and which faults it injects.
#[derive(Clone, Debug)]
pub struct EmulatorConfig {
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
}

impl Default for EmulatorConfig {
    fn default() -> Self {
        EmulatorConfig {
            ids: (1..=6).collect(),
            silent: vec![],
            corrupt_every: 0,
            delay: Duration::ZERO,
            speed: 4000.0,
            start_position: 2048,
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
}

/// A running emulated bus; dropped, it stops.
pub struct Emulator {
    path: String,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// What it saw.
    pub counters: Arc<EmulatorCounters>,
}

impl Emulator {
    /// Opens a pseudo-terminal and serves the servos of `cfg` on it.
    pub fn start(cfg: EmulatorConfig) -> Result<Self, serialport::Error> {
        let (master, slave) = TTYPort::pair()?;
        let path = slave.name().ok_or_else(|| {
            serialport::Error::new(serialport::ErrorKind::NoDevice, "a pty without a name")
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(EmulatorCounters::default());
        let (s, c) = (stop.clone(), counters.clone());
        let thread = std::thread::Builder::new()
            .name("servo-emulator".into())
            .spawn(move || {
                // The slave end stays open here, so the master never reads EIO between clients.
                let _slave = slave;
                serve(master, cfg, &s, &c)
            })
            .map_err(|e| {
                serialport::Error::new(serialport::ErrorKind::Io(e.kind()), e.to_string())
            })?;
        Ok(Emulator {
            path,
            stop,
            thread: Some(thread),
            counters,
        })
    }

    /// The serial device to open (`/dev/pts/N`).
    pub fn path(&self) -> &str {
        &self.path
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
    registered: Option<(u8, Vec<u8>)>,
    position: f64,
}

impl Servo {
    fn new(id: u8, start: u16) -> Self {
        let mut regs = [0u8; 256];
        let mut put = |(addr, len): (u8, u8), v: u32| {
            for k in 0..len as usize {
                regs[addr as usize + k] = (v >> (8 * k)) as u8;
            }
        };
        put(reg::MODEL_NUMBER, STS3215_MODEL as u32);
        put(reg::ID, id as u32);
        put(reg::MAX_POSITION_LIMIT, 4095);
        put(reg::P_COEFFICIENT, 32);
        put(reg::GOAL_POSITION, start as u32);
        put(reg::PRESENT_POSITION, start as u32);
        put(reg::PRESENT_VOLTAGE, 120);
        put(reg::PRESENT_TEMPERATURE, 30);
        Servo {
            id,
            regs,
            registered: None,
            position: start as f64,
        }
    }

    fn get(&self, (addr, len): (u8, u8)) -> u32 {
        (0..len as usize).fold(0, |v, k| {
            v | (self.regs[addr as usize + k] as u32) << (8 * k)
        })
    }

    fn write(&mut self, addr: u8, data: &[u8]) {
        for (k, b) in data.iter().enumerate() {
            if let Some(r) = self.regs.get_mut(addr as usize + k) {
                *r = *b;
            }
        }
    }

    /// Moves toward the goal for `dt` while torque is on.
    fn advance(&mut self, dt: f64, speed: f64) {
        let goal = self.get(reg::GOAL_POSITION).min(4095) as f64;
        if self.get(reg::TORQUE_ENABLE) != 0 {
            let step = (goal - self.position).clamp(-speed * dt, speed * dt);
            self.position += step;
        }
        let p = self.position.round() as u32;
        let moving = (goal - self.position).abs() > 0.5 && self.get(reg::TORQUE_ENABLE) != 0;
        let [lo, hi, ..] = p.to_le_bytes();
        self.write(reg::PRESENT_POSITION.0, &[lo, hi]);
        self.write(reg::MOVING.0, &[moving as u8]);
    }
}

fn serve(mut port: TTYPort, cfg: EmulatorConfig, stop: &AtomicBool, c: &EmulatorCounters) {
    let _ = port.set_timeout(Duration::from_millis(2));
    let mut servos: Vec<Servo> = cfg
        .ids
        .iter()
        .map(|id| Servo::new(*id, cfg.start_position))
        .collect();
    let (mut buf, mut chunk, mut out) = (Vec::<u8>::new(), [0u8; 512], Vec::<u8>::new());
    let mut last = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if let Ok(n) = port.read(&mut chunk) {
            buf.extend_from_slice(&chunk[..n]);
        }
        let dt = last.elapsed().as_secs_f64();
        last = Instant::now();
        for s in servos.iter_mut() {
            s.advance(dt, cfg.speed);
        }
        loop {
            match feetech::parse_instruction(&buf) {
                Ok((cmd, used)) => {
                    c.instructions.fetch_add(1, Ordering::Relaxed);
                    let answers = execute(&mut servos, &cfg, cmd.id, cmd.instruction, cmd.params);
                    buf.drain(..used);
                    for (id, params) in answers {
                        if !cfg.delay.is_zero() {
                            std::thread::sleep(cfg.delay);
                        }
                        feetech::status(&mut out, id, 0, &params);
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
    id: u8,
    instr: u8,
    params: &[u8],
) -> Vec<(u8, Vec<u8>)> {
    let answers = |i: u8| !cfg.silent.contains(&i);
    let mut out = vec![];
    let addressed = |s: &Servo| s.id == id || id == BROADCAST_ID;
    match instr {
        x if x == Instruction::Ping as u8 => {
            for s in servos.iter().filter(|s| s.id == id && answers(s.id)) {
                out.push((s.id, vec![]));
            }
        }
        x if x == Instruction::Read as u8 && params.len() == 2 => {
            for s in servos.iter().filter(|s| s.id == id && answers(s.id)) {
                let (a, n) = (params[0] as usize, params[1] as usize);
                out.push((s.id, s.regs[a..(a + n).min(256)].to_vec()));
            }
        }
        x if (x == Instruction::Write as u8 || x == Instruction::RegWrite as u8)
            && !params.is_empty() =>
        {
            for s in servos.iter_mut().filter(|s| addressed(s)) {
                if x == Instruction::Write as u8 {
                    s.write(params[0], &params[1..]);
                } else {
                    s.registered = Some((params[0], params[1..].to_vec()));
                }
                if id != BROADCAST_ID && answers(s.id) {
                    out.push((s.id, vec![]));
                }
            }
        }
        x if x == Instruction::Action as u8 => {
            for s in servos.iter_mut().filter(|s| addressed(s)) {
                if let Some((a, d)) = s.registered.take() {
                    s.write(a, &d);
                }
            }
        }
        x if x == Instruction::SyncRead as u8 && params.len() >= 2 => {
            let (a, n) = (params[0] as usize, params[1] as usize);
            for want in &params[2..] {
                if let Some(s) = servos.iter().find(|s| s.id == *want && answers(s.id)) {
                    out.push((s.id, s.regs[a..(a + n).min(256)].to_vec()));
                }
            }
        }
        x if x == Instruction::SyncWrite as u8 && params.len() >= 2 => {
            let (a, n) = (params[0], params[1] as usize);
            for item in params[2..].chunks_exact(n + 1) {
                if let Some(s) = servos.iter_mut().find(|s| s.id == item[0]) {
                    s.write(a, &item[1..]);
                }
            }
        }
        _ => {}
    }
    out
}
