//! A servo bus on a serial port, for either protocol ([`Feetech`], [`Dynamixel`]): every
//! transaction (an instruction out, the status packets back) under a deadline, retried a
//! configured number of times, counted. A servo that stays silent is an error naming the port,
//! the id and the register, never a hang or a panic: the caller (a robot profile) holds the arm
//! safe on it.

use crate::PacketError;
use crate::{dynamixel, feetech};
use serialport::SerialPort;

/// A register: (address, bytes).
pub type Register = (u16, u16);

/// What a bus needs from a protocol: its packet builders and its status parser.
pub trait Protocol {
    /// Name for messages.
    const NAME: &'static str;
    /// PING `id`.
    fn ping(out: &mut Vec<u8>, id: u8);
    /// READ `reg` of `id`.
    fn read(out: &mut Vec<u8>, id: u8, reg: Register);
    /// WRITE `data` to `reg` of `id`.
    fn write(out: &mut Vec<u8>, id: u8, reg: Register, data: &[u8]);
    /// SYNC READ `reg` of `ids`.
    fn sync_read(out: &mut Vec<u8>, reg: Register, ids: &[u8]);
    /// SYNC WRITE `reg`: `data[k]` (`reg.1` bytes) to `ids[k]`.
    fn sync_write(out: &mut Vec<u8>, reg: Register, ids: &[u8], data: &[[u8; 4]]);
    /// The first status packet in `bytes`: (id, error byte, bytes used); its parameters into
    /// `params`.
    fn status(bytes: &[u8], params: &mut Vec<u8>) -> Result<(u8, u8, usize), PacketError>;
}

/// Feetech STS/SMS (protocol 0).
pub struct Feetech;
/// Dynamixel Protocol 2.0.
pub struct Dynamixel;

impl Protocol for Feetech {
    const NAME: &'static str = "Feetech STS";
    fn ping(out: &mut Vec<u8>, id: u8) {
        feetech::ping(out, id)
    }
    fn read(out: &mut Vec<u8>, id: u8, reg: Register) {
        feetech::read(out, id, reg.0 as u8, reg.1 as u8)
    }
    fn write(out: &mut Vec<u8>, id: u8, reg: Register, data: &[u8]) {
        feetech::write(out, id, reg.0 as u8, data, false)
    }
    fn sync_read(out: &mut Vec<u8>, reg: Register, ids: &[u8]) {
        feetech::sync_read(out, reg.0 as u8, reg.1 as u8, ids)
    }
    fn sync_write(out: &mut Vec<u8>, reg: Register, ids: &[u8], data: &[[u8; 4]]) {
        let n = reg.1 as usize;
        feetech::sync_write(
            out,
            reg.0 as u8,
            reg.1 as u8,
            ids.iter().zip(data).map(|(id, d)| (*id, &d[..n])),
        )
    }
    fn status(bytes: &[u8], params: &mut Vec<u8>) -> Result<(u8, u8, usize), PacketError> {
        let (s, used) = feetech::parse_status(bytes)?;
        params.clear();
        params.extend_from_slice(s.params);
        Ok((s.id, s.error, used))
    }
}

impl Protocol for Dynamixel {
    const NAME: &'static str = "Dynamixel 2.0";
    fn ping(out: &mut Vec<u8>, id: u8) {
        dynamixel::ping(out, id)
    }
    fn read(out: &mut Vec<u8>, id: u8, reg: Register) {
        dynamixel::read(out, id, reg.0, reg.1)
    }
    fn write(out: &mut Vec<u8>, id: u8, reg: Register, data: &[u8]) {
        dynamixel::write(out, id, reg.0, data)
    }
    fn sync_read(out: &mut Vec<u8>, reg: Register, ids: &[u8]) {
        dynamixel::sync_read(out, reg.0, reg.1, ids)
    }
    fn sync_write(out: &mut Vec<u8>, reg: Register, ids: &[u8], data: &[[u8; 4]]) {
        let n = reg.1 as usize;
        dynamixel::sync_write(
            out,
            reg.0,
            reg.1,
            ids.iter().zip(data).map(|(id, d)| (*id, &d[..n])),
        )
    }
    fn status(bytes: &[u8], params: &mut Vec<u8>) -> Result<(u8, u8, usize), PacketError> {
        let (s, used) = dynamixel::parse_status(bytes)?;
        params.clear();
        params.extend_from_slice(&s.params);
        Ok((s.id, s.error.0, used))
    }
}
use std::io::{Read, Write};
use std::time::{Duration, Instant};

/// Why a transaction failed.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// The port could not be opened.
    #[error(
        "serial port `{port}`: {message} (is the adapter plugged in, and are you in the dialout group?)"
    )]
    Open {
        /// The port.
        port: String,
        /// What the system said.
        message: String,
    },
    /// Reading or writing the port failed.
    #[error("serial port `{port}`: {source}")]
    Io {
        /// The port.
        port: String,
        /// The error.
        source: std::io::Error,
    },
    /// No valid answer within the deadline, after every retry.
    #[error(
        "serial port `{port}`: servo {id} did not answer {what} after {attempts} attempts ({last})"
    )]
    NoAnswer {
        /// The port.
        port: String,
        /// The servo.
        id: u8,
        /// The instruction and register, e.g. `READ Present_Position (56, 2 bytes)`.
        what: String,
        /// Attempts made.
        attempts: u32,
        /// What the last attempt got: a timeout, or the packet error.
        last: String,
    },
    /// The servo answered with its error bits set.
    #[error("serial port `{port}`: servo {id} reports error bits {bits:#04x} on {what}")]
    Servo {
        /// The port.
        port: String,
        /// The servo.
        id: u8,
        /// The instruction and register.
        what: String,
        /// The status packet's error byte.
        bits: u8,
    },
}

/// Counters of a bus.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BusStats {
    /// Transactions started.
    pub transactions: u64,
    /// Attempts repeated after a timeout or a corrupt answer.
    pub retries: u64,
    /// Transactions that failed after every retry.
    pub failures: u64,
    /// Answers that failed their checksum or framing.
    pub corrupt: u64,
    /// Attempts that timed out.
    pub timeouts: u64,
    /// Answers from another servo than the one awaited (late answers to an earlier attempt),
    /// skipped.
    pub stale: u64,
}

/// A servo bus speaking protocol `P`.
pub struct ServoBus<P: Protocol> {
    port: Box<dyn SerialPort>,
    name: String,
    tx: Vec<u8>,
    rx: Vec<u8>,
    /// Deadline of one attempt.
    pub timeout: Duration,
    /// Attempts after the first.
    pub retries: u32,
    stats: BusStats,
    scratch: Vec<u8>,
    data: Vec<[u8; 4]>,
    _protocol: std::marker::PhantomData<P>,
}

/// A Feetech STS bus (SO-100/SO-101).
pub type FeetechBus = ServoBus<Feetech>;
/// A Dynamixel Protocol 2.0 bus (Koch).
pub type DynamixelBus = ServoBus<Dynamixel>;

impl<P: Protocol> ServoBus<P> {
    /// Opens `port` at `baud` (1,000,000 for the SO-101's STS3215 and the Koch's X series).
    pub fn open(port: &str, baud: u32) -> Result<Self, BusError> {
        // The port is opened with an exclusive lock (TIOCEXCL and flock). A lock still held
        // a moment after its owner closed the port is a child process forked in between and not
        // yet exec'd (its copy of the descriptor shares the lock until exec closes it): worth a
        // few short retries. A lock held for longer is another program using the adapter.
        let deadline = std::time::Instant::now() + Duration::from_millis(500);
        let p = loop {
            match serialport::new(port, baud)
                .timeout(Duration::from_millis(1))
                .open()
            {
                Ok(p) => break p,
                Err(e)
                    if e.to_string().contains("exclusive lock")
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => {
                    return Err(BusError::Open {
                        port: port.into(),
                        message: e.to_string(),
                    });
                }
            }
        };
        Ok(ServoBus {
            port: p,
            name: port.into(),
            tx: Vec::with_capacity(64),
            rx: Vec::with_capacity(256),
            timeout: Duration::from_millis(20),
            retries: 2,
            stats: BusStats::default(),
            scratch: Vec::with_capacity(64),
            data: Vec::with_capacity(16),
            _protocol: std::marker::PhantomData,
        })
    }

    /// The port's name.
    pub fn port(&self) -> &str {
        &self.name
    }

    /// Counters so far.
    pub fn stats(&self) -> BusStats {
        self.stats
    }

    fn send(&mut self) -> Result<(), BusError> {
        // Whatever is left from an earlier answer is stale.
        let _ = self.port.clear(serialport::ClearBuffer::Input);
        self.rx.clear();
        self.port
            .write_all(&self.tx)
            .and_then(|_| self.port.flush())
            .map_err(|source| BusError::Io {
                port: self.name.clone(),
                source,
            })
    }

    /// Reads until a whole status packet from `id` arrives or `deadline` passes; returns its
    /// error byte and copies its parameters into `params`.
    fn receive(&mut self, id: u8, deadline: Instant, params: &mut Vec<u8>) -> Result<u8, String> {
        let mut chunk = [0u8; 256];
        loop {
            match P::status(&self.rx, params) {
                Ok((got, error, used)) => {
                    self.rx.drain(..used);
                    if got == id {
                        return Ok(error);
                    }
                    // A late answer to an earlier attempt (another servo's): not this one's,
                    // so keep waiting for it until the deadline.
                    self.stats.stale += 1;
                    continue;
                }
                Err(PacketError::Short { .. }) | Err(PacketError::NoHeader(_)) => {}
                Err(e) => {
                    self.stats.corrupt += 1;
                    return Err(e.to_string());
                }
            }
            if Instant::now() >= deadline {
                self.stats.timeouts += 1;
                return Err(format!(
                    "no status packet within {:.1} ms",
                    self.timeout.as_secs_f64() * 1e3
                ));
            }
            match self.port.read(&mut chunk) {
                Ok(n) => self.rx.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    /// Sends the packet in `tx` and waits for `id`'s answer, with retries.
    fn transact(
        &mut self,
        id: u8,
        what: &dyn Fn() -> String,
        params: &mut Vec<u8>,
    ) -> Result<(), BusError> {
        self.stats.transactions += 1;
        let mut last = String::new();
        for attempt in 0..=self.retries {
            if attempt > 0 {
                self.stats.retries += 1;
            }
            self.send()?;
            match self.receive(id, Instant::now() + self.timeout, params) {
                Ok(0) => return Ok(()),
                Ok(bits) => {
                    return Err(BusError::Servo {
                        port: self.name.clone(),
                        id,
                        what: what(),
                        bits,
                    });
                }
                Err(e) => last = e,
            }
        }
        self.stats.failures += 1;
        Err(BusError::NoAnswer {
            port: self.name.clone(),
            id,
            what: what(),
            attempts: self.retries + 1,
            last,
        })
    }

    /// PING `id`; `Ok` when it answers.
    pub fn ping(&mut self, id: u8) -> Result<(), BusError> {
        P::ping(&mut self.tx, id);
        let mut p = std::mem::take(&mut self.scratch);
        let r = self.transact(id, &|| "PING".into(), &mut p);
        self.scratch = p;
        r
    }

    /// Reads register `reg` = (address, bytes) of `id` as a little-endian value.
    pub fn read(&mut self, id: u8, reg: Register, name: &str) -> Result<u32, BusError> {
        P::read(&mut self.tx, id, reg);
        let mut p = std::mem::take(&mut self.scratch);
        let r = self.transact(
            id,
            &|| format!("READ {name} ({}, {} bytes)", reg.0, reg.1),
            &mut p,
        );
        let value = p.iter().rev().fold(0u32, |v, b| (v << 8) | *b as u32);
        let len = p.len();
        self.scratch = p;
        r?;
        if len != reg.1 as usize {
            return Err(BusError::NoAnswer {
                port: self.name.clone(),
                id,
                what: format!("READ {name}"),
                attempts: 1,
                last: format!("{len} bytes instead of {}", reg.1),
            });
        }
        Ok(value)
    }

    /// Writes `value` to register `reg` of `id` and waits for its acknowledgement.
    pub fn write(&mut self, id: u8, reg: Register, value: u32, name: &str) -> Result<(), BusError> {
        let bytes = value.to_le_bytes();
        P::write(&mut self.tx, id, reg, &bytes[..reg.1 as usize]);
        let mut p = std::mem::take(&mut self.scratch);
        let r = self.transact(
            id,
            &|| format!("WRITE {name} ({}, {} bytes)", reg.0, reg.1),
            &mut p,
        );
        self.scratch = p;
        r
    }

    /// Reads `reg` of every servo in `ids` with one SYNC READ; `out[k]` gets `ids[k]`'s value.
    /// A servo that does not answer makes the whole read repeat (up to the retries), then an
    /// error naming it.
    pub fn sync_read(
        &mut self,
        reg: Register,
        name: &str,
        ids: &[u8],
        out: &mut [u32],
    ) -> Result<(), BusError> {
        self.stats.transactions += 1;
        let mut params = std::mem::take(&mut self.scratch);
        let mut last = (0u8, String::new());
        'attempt: for attempt in 0..=self.retries {
            if attempt > 0 {
                self.stats.retries += 1;
            }
            P::sync_read(&mut self.tx, reg, ids);
            if let Err(e) = self.send() {
                self.scratch = params;
                return Err(e);
            }
            // The servos answer one after another; one deadline per servo.
            for (k, id) in ids.iter().enumerate() {
                match self.receive(*id, Instant::now() + self.timeout, &mut params) {
                    Ok(_) if params.len() == reg.1 as usize => {
                        out[k] = params.iter().rev().fold(0u32, |v, b| (v << 8) | *b as u32);
                    }
                    Ok(_) => {
                        last = (*id, format!("{} bytes instead of {}", params.len(), reg.1));
                        continue 'attempt;
                    }
                    Err(e) => {
                        last = (*id, e);
                        continue 'attempt;
                    }
                }
            }
            self.scratch = params;
            return Ok(());
        }
        self.scratch = params;
        self.stats.failures += 1;
        Err(BusError::NoAnswer {
            port: self.name.clone(),
            id: last.0,
            what: format!("SYNC READ {name} ({}, {} bytes)", reg.0, reg.1),
            attempts: self.retries + 1,
            last: last.1,
        })
    }

    /// Writes `values[k]` to `reg` of `ids[k]` with one SYNC WRITE (no answer).
    pub fn sync_write(
        &mut self,
        reg: Register,
        ids: &[u8],
        values: &[u32],
    ) -> Result<(), BusError> {
        self.data.clear();
        self.data.extend(values.iter().map(|v| v.to_le_bytes()));
        P::sync_write(&mut self.tx, reg, ids, &self.data);
        self.stats.transactions += 1;
        self.send()
    }
}
