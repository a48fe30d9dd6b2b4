//! `reflex bench bus`: observation -> command round trip between two processes on loopback.
//!
//! The parent plays the robot: it publishes an [`Observation`] on `reflex/<robot>/obs` and waits
//! for the [`Command`] that a child process (the controller, `--echo`) publishes on
//! `reflex/<robot>/cmd` after decoding it. Both ends encode and decode the real messages, so the
//! figure is what a remote controller sees: serialisation, Zenoh, TCP on loopback, and back.

use reflex_agent::error::{Result, ctx};
use reflex_bus::BusConfig;
use reflex_contracts::msg::{self, Command, Image, Observation, PROTOCOL_VERSION};
use reflex_runtime::hist::percentile;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use zenoh::Wait;

const ROBOT: &str = "bench";

fn free_port() -> Result<u16> {
    // The OS picks a free loopback port; Zenoh binds it a moment later.
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(ctx("binding a loopback port"))?;
    Ok(l.local_addr()
        .map_err(ctx("binding a loopback port"))?
        .port())
}

/// The echoing controller (`reflex bench bus --echo`, started by [`run`] as a child process):
/// answers every observation with a command of the same sequence number.
pub fn echo(bus: &BusConfig) -> Result<()> {
    let session = bus.open()?;
    let keys = reflex_contracts::keys::Keys::new(ROBOT).map_err(reflex_bus::BusError::from)?;
    let publisher = session
        .declare_publisher(keys.cmd.clone())
        .express(true)
        .wait()
        .map_err(ctx("the benchmark's bus"))?;
    // Answer from Zenoh's receive callback: no hand-over to another thread on the way back.
    let obs_key = keys.obs.clone();
    let state = std::sync::Mutex::new((
        Vec::<u8>::with_capacity(256),
        Command {
            v: PROTOCOL_VERSION,
            seq: 0,
            action: vec![0.0; 6],
        },
    ));
    let _sub = session
        .declare_subscriber(keys.obs.clone())
        .callback(move |sample| {
            let Ok(obs) = msg::decode::<Observation>(&obs_key, &sample.payload().to_bytes()) else {
                return;
            };
            let mut st = state.lock().expect("echo state");
            let (buf, cmd) = &mut *st;
            cmd.seq = obs.seq;
            cmd.action[0] = obs.state.first().copied().unwrap_or(0.0);
            msg::encode_into(cmd, buf);
            let _ = publisher.put(buf.as_slice()).wait();
        })
        .wait()
        .map_err(ctx("the benchmark's bus"))?;
    let _token = session
        .liveliness()
        .declare_token(format!("reflex/{ROBOT}/alive/echo"))
        .wait()
        .map_err(ctx("the benchmark's bus"))?;
    // Runs until its standard input closes: the parent holds the other end of that pipe, which
    // closes when the parent ends, however it ends (killed by a signal too), so no echo process
    // outlives its bench.
    let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
    Ok(())
}

struct KillOnDrop(Child);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn measure(
    session: &zenoh::Session,
    obs: &mut Observation,
    warmup: usize,
    iters: usize,
    spin: bool,
) -> Result<(usize, Vec<f64>)> {
    let keys = reflex_contracts::keys::Keys::new(ROBOT).map_err(reflex_bus::BusError::from)?;
    let publisher = session
        .declare_publisher(keys.obs.clone())
        .express(true)
        .wait()
        .map_err(ctx("the benchmark's bus"))?;
    let sub = session
        .declare_subscriber(keys.cmd.clone())
        .wait()
        .map_err(ctx("the benchmark's bus"))?;
    let mut buf = Vec::new();
    let mut lat = Vec::with_capacity(iters);
    let mut bytes = 0;
    for i in 0..warmup + iters {
        obs.seq += 1;
        let t0 = Instant::now();
        msg::encode_into(obs, &mut buf);
        bytes = buf.len();
        publisher
            .put(buf.as_slice())
            .wait()
            .map_err(ctx("the benchmark's bus"))?;
        let wait_start = Instant::now();
        loop {
            let next = if spin {
                // Spin on the queue: the transport without the wake-up of a sleeping thread, as
                // a loop that polls its inbox every tick sees it.
                let mut got = None;
                while got.is_none() && wait_start.elapsed() < Duration::from_secs(5) {
                    got = sub.try_recv().map_err(ctx("the benchmark's bus"))?;
                    std::hint::spin_loop();
                }
                got
            } else {
                sub.recv_timeout(Duration::from_secs(5))
                    .map_err(ctx("the benchmark's bus"))?
            };
            let Some(s) = next else {
                return Err(reflex_agent::error::bail(format!(
                    "no command back on {} within 5 s (the echo process stopped?)",
                    keys.cmd
                )));
            };
            let c: Command = msg::decode(&keys.cmd, &s.payload().to_bytes())?;
            if c.seq == obs.seq {
                break;
            }
        }
        if i >= warmup {
            lat.push(t0.elapsed().as_secs_f64() * 1e6);
        }
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    Ok((bytes, lat))
}

/// Round trips of one payload and one way of waiting.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RoundTrips {
    /// Size of the encoded observation, bytes.
    pub bytes: usize,
    /// Round trips timed.
    pub iters: usize,
    /// Median, µs.
    pub p50_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// Slowest, µs.
    pub max_us: f64,
}

/// Round trips over one transport: a 1 KB state and a 128x128 camera frame, each answered by
/// polling (as the loop does) and by blocking.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BusRun {
    /// The endpoint (`tcp/...` or `tls/...`).
    pub transport: String,
    /// 200 floats of state, the answer polled for.
    pub obs_1kb_poll: RoundTrips,
    /// The same, a thread blocked on the answer.
    pub obs_1kb_block: RoundTrips,
    /// A 128x128 RGB frame with 30 floats of state, polled.
    pub obs_image_128_poll: RoundTrips,
    /// The same, blocked.
    pub obs_image_128_block: RoundTrips,
}

impl BusRun {
    /// The four measurements with their names.
    pub fn rows(&self) -> [(&'static str, &RoundTrips); 4] {
        [
            ("obs_1kb_poll", &self.obs_1kb_poll),
            ("obs_1kb_block", &self.obs_1kb_block),
            ("obs_image_128_poll", &self.obs_image_128_poll),
            ("obs_image_128_block", &self.obs_image_128_block),
        ]
    }
}

/// What `reflex bench bus` measured: one transport, or plain TCP and TLS side by side.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(untagged)]
pub enum BusBenchReport {
    /// One transport.
    One(BusRun),
    /// `--tls`: the same over TCP and over TLS with mutual authentication.
    Both {
        /// Plain TCP.
        tcp: BusRun,
        /// TLS.
        tls: BusRun,
    },
}

/// Observation -> command round trips between this process (the robot) and a child `reflex bench
/// bus --echo` (the controller) over TCP on loopback, `iters` per payload; `listen` picks the
/// endpoint (default: a free port). With `tls`, the same again over TLS with mutual
/// authentication (keys made for the run in a temporary directory), in the same invocation:
/// `{"tcp": {...}, "tls": {...}}`.
pub fn run(iters: usize, listen: Option<String>, tls: bool) -> Result<BusBenchReport> {
    if !tls {
        return run_one(iters, listen, None).map(BusBenchReport::One);
    }
    let scratch = crate::scratch::Scratch::new("bench-keys")?;
    let dir = scratch.path().join("keys");
    let names = ["robot".to_string(), "controller".to_string()];
    reflex_bus::secure::init_keys(&dir, ROBOT, &names, &[], &|_| {
        reflex_bus::secure::valid_for_days(1)
    })?;
    let plain = run_one(iters, None, None);
    let secure = run_one(
        iters,
        Some(format!("tls/127.0.0.1:{}", free_port()?)),
        Some(&dir),
    );
    drop(scratch);
    Ok(BusBenchReport::Both {
        tcp: plain?,
        tls: secure?,
    })
}

fn run_one(iters: usize, listen: Option<String>, keys: Option<&std::path::Path>) -> Result<BusRun> {
    let endpoint = match listen {
        Some(e) => e,
        None => format!("tcp/127.0.0.1:{}", free_port()?),
    };
    let mut bus = BusConfig::hermetic(vec![endpoint.clone()], vec![]);
    bus.tls = keys.map(|d| reflex_bus::secure::TlsFiles::in_dir(d, "robot"));
    let session = bus.open()?;
    let exe = std::env::current_exe().map_err(ctx("finding the reflex executable"))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args([
        "bench",
        "bus",
        "--echo",
        "--no-multicast",
        "--connect",
        &endpoint,
    ]);
    if let Some(d) = keys {
        cmd.arg("--tls-dir")
            .arg(d)
            .args(["--tls-name", "controller"]);
    }
    let child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .map_err(ctx("starting the echo process"))?;
    let _child = KillOnDrop(child);
    // Wait for the echo process to appear on the bus.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = session
            .liveliness()
            .get(format!("reflex/{ROBOT}/alive/echo"))
            .timeout(Duration::from_millis(200))
            .wait()
            .map_err(ctx("the benchmark's bus"))?;
        if r.recv().is_ok() {
            break;
        }
        if Instant::now() > deadline {
            return Err(reflex_agent::error::bail(format!(
                "the echo process did not join the bus on {endpoint} within 20 s"
            )));
        }
    }
    // Let its subscriber's declaration propagate before the first put.
    std::thread::sleep(Duration::from_millis(200));

    // A ~1 KB observation: 200 f32 of state (about 1 KB of MessagePack), and one with a camera.
    let mut small = Observation {
        v: PROTOCOL_VERSION,
        state: (0..200).map(|i| i as f32 * 0.5).collect(),
        ..Default::default()
    };
    let mut image = Observation {
        v: PROTOCOL_VERSION,
        state: vec![0.1; 30],
        images: vec![Image {
            camera: "front".into(),
            width: 128,
            height: 128,
            encoding: "rgb8".into(),
            seq: 0,
            age_ns: 0,
            data: (0..128 * 128 * 3).map(|i| (i % 251) as u8).collect(),
        }],
        ..Default::default()
    };
    // Two ways to wait for the answer: poll the queue (as the control loop does every tick) or
    // sleep on it (a thread that blocks); the difference is one thread wake-up.
    let time = |obs: &mut Observation, iters: usize, spin: bool| -> Result<RoundTrips> {
        let (bytes, l) = measure(&session, obs, (iters / 10).max(50), iters, spin)?;
        Ok(RoundTrips {
            bytes,
            iters: l.len(),
            p50_us: percentile(&l, 50.0),
            p99_us: percentile(&l, 99.0),
            max_us: l.last().copied().unwrap_or(f64::NAN),
        })
    };
    Ok(BusRun {
        obs_1kb_poll: time(&mut small, iters, true)?,
        obs_1kb_block: time(&mut small, iters, false)?,
        obs_image_128_poll: time(&mut image, iters / 5, true)?,
        obs_image_128_block: time(&mut image, iters / 5, false)?,
        transport: endpoint,
    })
}
