//! What the subcommands share: logging, Zenoh arguments, progress bars.

use clap::Args;
use reflex_bus::BusConfig;
use std::path::PathBuf;

/// Logs go to stderr through `tracing`; `RUST_LOG` selects levels (default `info`).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("info,zenoh=warn,zenoh_transport=warn,ort=warn")
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}

/// How to join the Zenoh network.
#[derive(Args, Clone, Debug, Default)]
pub struct BusArgs {
    /// Endpoint to listen on (repeatable), e.g. `tcp/127.0.0.1:7447`.
    #[arg(long = "listen", value_name = "ENDPOINT")]
    pub listen: Vec<String>,
    /// Endpoint to connect to (repeatable), e.g. `tcp/192.168.1.20:7447`.
    #[arg(long = "connect", value_name = "ENDPOINT")]
    pub connect: Vec<String>,
    /// Turn off multicast scouting (peers are then found only through --listen/--connect).
    #[arg(long)]
    pub no_multicast: bool,
    /// A Zenoh JSON5 config file to start from.
    #[arg(long, value_name = "FILE")]
    pub zenoh_config: Option<PathBuf>,
    /// TLS with mutual authentication: the directory `reflex keys init` wrote.
    #[arg(long, value_name = "DIR", requires = "tls_name")]
    pub tls_dir: Option<PathBuf>,
    /// This peer's name in --tls-dir (its certificate's common name).
    #[arg(long, value_name = "NAME", requires = "tls_dir")]
    pub tls_name: Option<String>,
}

impl BusArgs {
    /// The bus configuration these arguments describe.
    pub fn config(&self) -> BusConfig {
        BusConfig {
            listen: self.listen.clone(),
            connect: self.connect.clone(),
            multicast_scouting: !self.no_multicast,
            config_file: self.zenoh_config.clone(),
            tls: self
                .tls_dir
                .as_ref()
                .zip(self.tls_name.as_ref())
                .map(|(d, n)| reflex_bus::secure::TlsFiles::in_dir(d, n)),
            access: None,
        }
    }
}

/// Progress bars on stderr (hidden with `--json`).
pub struct Bars {
    bar: indicatif::ProgressBar,
    hidden: bool,
}

impl Bars {
    /// Bars, or nothing when `hidden`.
    pub fn new(hidden: bool) -> Self {
        Bars {
            bar: indicatif::ProgressBar::hidden(),
            hidden,
        }
    }

    /// A spinner (for jobs of unknown length).
    pub fn spinner(hidden: bool) -> Self {
        Bars {
            bar: if hidden {
                indicatif::ProgressBar::hidden()
            } else {
                indicatif::ProgressBar::new_spinner()
            },
            hidden,
        }
    }
}

impl reflex_agent::progress::Progress for Bars {
    fn start(&self, total: u64, what: &str) {
        if self.hidden {
            return;
        }
        self.bar
            .set_draw_target(indicatif::ProgressDrawTarget::stderr());
        self.bar.reset();
        // u64::MAX: no end but the person's (`reflex run --until-stopped`): a count, no bar.
        let template = if total == u64::MAX {
            "{prefix:>12} {pos} ({elapsed}) {msg}"
        } else {
            self.bar.set_length(total);
            "{prefix:>12} [{bar:40}] {pos}/{len} ({elapsed}, eta {eta}) {msg}"
        };
        self.bar.set_style(
            indicatif::ProgressStyle::with_template(template)
                .expect("static template")
                .progress_chars("=> "),
        );
        self.bar.set_prefix(what.to_string());
        self.bar.set_message("");
    }
    fn inc(&self, n: u64) {
        self.bar.inc(n);
    }
    fn message(&self, msg: &str) {
        self.bar.set_message(msg.to_string());
        self.bar.tick();
    }
    fn finish(&self) {
        self.bar.finish_and_clear();
    }
    fn line(&self, msg: &str) {
        if self.hidden || self.bar.is_hidden() {
            // --json (stdout carries the JSON), or stderr is not a terminal: plain lines.
            eprintln!("{msg}");
        } else {
            self.bar.println(msg);
        }
    }
}

/// The command line as a person would retype it: `reflex` followed by the arguments (the
/// executable's own path differs between machines).
pub fn command_line() -> String {
    std::iter::once("reflex".to_string())
        .chain(std::env::args().skip(1))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Prints a JSON value, pretty.
pub fn print_json(v: &serde_json::Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).expect("JSON of plain values")
    );
}

/// `reflex doctor`: what this machine and this build can drive, one line per check, each problem
/// with its fix; fails when something a run needs is missing.
pub fn doctor(
    tls: Option<(&std::path::Path, &str)>,
    config: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let mut problems = 0;
    match reflex_policies::ort_env::find_onnxruntime() {
        Ok(found) => {
            println!(
                "ONNX Runtime: {} (found via {})",
                found.path.display(),
                found.source
            );
            match reflex_policies::ort_env::init(&found) {
                Ok(_) => println!("ONNX Runtime loads: ok"),
                Err(e) => {
                    problems += 1;
                    println!("ONNX Runtime does not load: {e}");
                }
            }
            providers(&found.path);
        }
        Err(e) => {
            problems += 1;
            println!("ONNX Runtime: {e}");
        }
    }
    problems += serial_ports();
    cameras();
    // Real time and disk space are warnings: the loop runs without them, only worse.
    realtime();
    clock_source();
    disk(std::path::Path::new("."));
    if let Some((dir, name)) = tls {
        problems += certificates(dir, name);
    }
    if let Some(path) = config {
        problems += config_checks(path);
    }
    println!(
        "teleop devices in this build: keyboard, leader arm (so101-leader, koch-leader), gamepad (evdev: /dev/input/event*), SpaceMouse (hidraw: /dev/hidraw*)"
    );
    println!(
        "arms in this build: so101 (Feetech STS3215, reach and joints), koch (Dynamixel X series, joints); emulated: reflex hw emulate --robot so101-follower"
    );
    if problems > 0 {
        anyhow::bail!("{problems} problem(s) above");
    }
    Ok(())
}

/// Which execution providers sit beside the ONNX Runtime library (the CPU one is built in).
fn providers(lib: &std::path::Path) {
    let dir = lib.parent().unwrap_or(std::path::Path::new("."));
    let has = |p: &str| {
        dir.join(format!("libonnxruntime_providers_{p}.so"))
            .exists()
    };
    let (cuda, trt) = (has("cuda"), has("tensorrt"));
    println!(
        "ONNX Runtime providers: CPU{}{}{}",
        if cuda { ", CUDA" } else { "" },
        if trt { ", TensorRT" } else { "" },
        if cuda || trt {
            String::new()
        } else {
            " (no CUDA/TensorRT build here: on a Jetson, install the JetPack build of onnxruntime-gpu, docs/deploy.md)".into()
        }
    );
}

/// Video devices (cameras) present.
fn cameras() {
    let mut v: Vec<String> = std::fs::read_dir("/dev")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("video"))
        .map(|n| format!("/dev/{n}"))
        .collect();
    v.sort();
    if v.is_empty() {
        println!("cameras: none (/dev/video*)");
    } else {
        println!("cameras: {}", v.join(", "));
    }
}

/// Whether this user may run the loop with real-time priority and locked memory.
fn realtime() {
    let limit = |r| {
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the struct we own.
        (unsafe { libc::getrlimit(r, &mut l) } == 0).then_some(l.rlim_cur)
    };
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let prio = limit(libc::RLIMIT_RTPRIO).unwrap_or(0);
    let memlock = limit(libc::RLIMIT_MEMLOCK).unwrap_or(0);
    let mb = |v: u64| {
        if v == libc::RLIM_INFINITY {
            "unlimited".to_string()
        } else {
            format!("{} MB", v / (1 << 20))
        }
    };
    if root || prio > 0 {
        println!(
            "real-time: SCHED_FIFO allowed{}; locked memory {}",
            if root {
                " (root)".to_string()
            } else {
                format!(" up to priority {prio}")
            },
            mb(memlock)
        );
    } else {
        println!(
            "real-time: warning: not permitted for this user (RLIMIT_RTPRIO 0): the loop runs with ordinary scheduling; grant it with `LimitRTPRIO=90` and `LimitMEMLOCK=infinity` in the service, or an rtprio line in /etc/security/limits.d/"
        );
    }
}

/// The kernel's clock source (the loop's timing depends on a cheap, steady one).
fn clock_source() {
    let p = "/sys/devices/system/clocksource/clocksource0/current_clocksource";
    match std::fs::read_to_string(p) {
        Ok(c) => {
            let c = c.trim();
            let note = match c {
                "tsc" | "arch_sys_counter" => "",
                _ => {
                    " (reading it is slower than tsc or arch_sys_counter; timing figures will be worse)"
                }
            };
            println!("clock source: {c}{note}");
        }
        Err(_) => println!("clock source: unknown ({p} not readable)"),
    }
}

/// Free space where recordings go (the working directory).
fn disk(dir: &std::path::Path) {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap_or_default();
    // SAFETY: statvfs writes into the zeroed struct we own.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        println!("disk: cannot read the free space of {}", dir.display());
        return;
    }
    let free_gb = st.f_bavail as f64 * st.f_frsize as f64 / 1e9;
    if free_gb < 5.0 {
        println!(
            "disk: warning: {free_gb:.1} GB free here: recordings of a training day need more (an episode with cameras is tens of MB); free space or record elsewhere (--record DIR)"
        );
    } else {
        println!("disk: {free_gb:.1} GB free for recordings");
    }
}

/// What a robot's config needs on this machine: the policy model and its provider, the arm's
/// port (present, this user may open it) and calibration, the bus certificates, and listening
/// endpoints that are free.
fn config_checks(path: &std::path::Path) -> usize {
    use reflex_policies::onnx_policy::Provider;
    let cfg = match reflex_agent::config::RunConfig::load(path) {
        Ok(c) => c,
        Err(e) => {
            println!("config: {e}");
            return 1;
        }
    };
    let file = path.display();
    println!("config: {file}: ok (robot `{}`)", cfg.robot_name());
    let mut problems = 0;
    let mut problem = |msg: String| {
        problems += 1;
        println!("{msg}");
    };
    if let Some(m) = &cfg.policy.model {
        if m.is_file() {
            println!("policy model: {}: ok", m.display());
        } else {
            problem(format!(
                "policy model: {} not found ([policy] model in {file})",
                m.display()
            ));
        }
    }
    let wants = match &cfg.policy.provider {
        Provider::Cuda { .. } => Some("cuda"),
        Provider::Tensorrt { .. } => Some("tensorrt"),
        _ => None,
    };
    if let Some(p) = wants {
        let lib = reflex_policies::ort_env::find_onnxruntime().ok();
        let has = lib.as_ref().is_some_and(|f| {
            f.path
                .parent()
                .is_some_and(|d| d.join(format!("libonnxruntime_providers_{p}.so")).exists())
        });
        if has {
            println!("policy provider: {p}: the library has it");
        } else {
            problem(format!(
                "policy provider: [policy.provider] kind = \"{p}\" in {file}, but the ONNX Runtime found has no {p} provider: install the CUDA/TensorRT build (docs/deploy.md, Jetson) or set kind = \"cpu\""
            ));
        }
    }
    if let Some(why) = cfg.insecure_arm_bus(&BusConfig::default()) {
        if cfg.bus.insecure {
            println!(
                "bus: INSECURE ([bus] insecure = true in {file}): {why}; `reflex run` warns every minute"
            );
        } else {
            problem(format!("bus: {why} (`reflex run` refuses this config)"));
        }
    }
    if let Some(arm) = &cfg.arm {
        let port = std::path::Path::new(&arm.port);
        let c = std::ffi::CString::new(arm.port.as_bytes()).unwrap_or_default();
        if !port.exists() {
            problem(format!(
                "arm port: {} does not exist ([arm] port in {file}): is the adapter plugged in and powered? ls /dev/serial/by-id/ names it",
                arm.port
            ));
        // SAFETY: access() only reads the path string.
        } else if unsafe { libc::access(c.as_ptr(), libc::R_OK | libc::W_OK) } != 0 {
            problem(format!(
                "arm port: {} exists but this user may not open it: sudo usermod -aG dialout $USER and log in again (the service's user `reflex` is in dialout)",
                arm.port
            ));
        } else {
            println!("arm port: {}: ok", arm.port);
        }
        match &arm.calibration {
            Some(c) if !c.is_file() => problem(format!(
                "arm calibration: {} not found ([arm] calibration in {file}): reflex calibrate joints writes it",
                c.display()
            )),
            Some(c) => println!("arm calibration: {}: ok", c.display()),
            None => println!(
                "arm calibration: none ([arm] calibration): the arm runs on the servos' raw zero, fine for an emulated arm only"
            ),
        }
    }
    let bus = cfg.bus_config(&Default::default());
    if let Some(tls) = &bus.tls {
        match tls.check() {
            Ok(()) => println!(
                "bus certificates: {} and its key, key private: ok",
                tls.cert.display()
            ),
            Err(e) => problem(format!("bus certificates: {e}")),
        }
    }
    for ep in &bus.listen {
        let Some(addr) = ep.strip_prefix("tcp/").or_else(|| ep.strip_prefix("tls/")) else {
            continue;
        };
        match std::net::TcpListener::bind(addr) {
            Ok(_) => println!("bus endpoint: {ep}: free to listen on"),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => problem(format!(
                "bus endpoint: {ep} is in use ([bus] listen in {file}): is reflex already running (systemctl status reflex)?"
            )),
            Err(e) => problem(format!("bus endpoint: {ep} ([bus] listen in {file}): {e}")),
        }
    }
    for ep in &bus.connect {
        println!("bus endpoint: connects to {ep}");
    }
    problems
}

/// The bus certificates of peer `name` in `dir`: present, key private.
fn certificates(dir: &std::path::Path, name: &str) -> usize {
    match reflex_bus::secure::TlsFiles::in_dir(dir, name).check() {
        Ok(()) => {
            println!(
                "bus certificates: {}/{name}.pem and .key, key private: ok",
                dir.display()
            );
            0
        }
        Err(e) => {
            println!("bus certificates: {e}");
            1
        }
    }
}

/// Lists serial ports (from sysfs: no libudev needed) and whether this user may open them.
fn serial_ports() -> usize {
    let ports = match serialport::available_ports() {
        Ok(p) => p,
        Err(e) => {
            println!("serial ports: cannot list them: {e}");
            return 0;
        }
    };
    let usb: Vec<_> = ports
        .iter()
        .filter(|p| matches!(p.port_type, serialport::SerialPortType::UsbPort(_)))
        .collect();
    if usb.is_empty() {
        println!(
            "serial ports: no USB serial adapter (an arm's bus adapter shows up as /dev/ttyACM* or /dev/ttyUSB*; without an arm, try reflex hw emulate)"
        );
        return 0;
    }
    let mut problems = 0;
    for p in usb {
        let serialport::SerialPortType::UsbPort(u) = &p.port_type else {
            continue;
        };
        let path = std::ffi::CString::new(p.port_name.clone()).unwrap_or_default();
        // SAFETY: access() only reads the path string.
        let ok = unsafe { libc::access(path.as_ptr(), libc::R_OK | libc::W_OK) } == 0;
        let what = format!(
            "{} (USB {:04x}:{:04x}{})",
            p.port_name,
            u.vid,
            u.pid,
            u.product
                .as_deref()
                .map(|s| format!(", {s}"))
                .unwrap_or_default()
        );
        if ok {
            println!("serial port {what}: can open");
        } else {
            problems += 1;
            println!(
                "serial port {what}: this user cannot open it: sudo usermod -aG dialout $USER, then log in again (or the udev rule in docs/hardware.md)"
            );
        }
    }
    problems
}

/// An arm on the command line.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum ArmArg {
    /// SO-100/SO-101 follower: Feetech STS3215, ids 1-6.
    So101Follower,
    /// SO-100/SO-101 leader: Feetech STS3215, ids 1-6.
    So101Leader,
    /// Koch follower: Dynamixel X series (emulated as XL330-M288), ids 1-6.
    KochFollower,
    /// Koch leader: Dynamixel XL330, ids 1-6.
    KochLeader,
}

impl ArmArg {
    /// The arm in reflex-hardware.
    pub fn kind(self) -> reflex_hardware::arm::ArmKind {
        use reflex_hardware::arm::ArmKind;
        match self {
            ArmArg::So101Follower => ArmKind::So101Follower,
            ArmArg::So101Leader => ArmKind::So101Leader,
            ArmArg::KochFollower => ArmKind::KochFollower,
            ArmArg::KochLeader => ArmKind::KochLeader,
        }
    }
}

/// `reflex bench bus-servo` and `reflex hw bench`.
#[derive(clap::Args)]
pub struct ServoBenchArgs {
    /// Which arm's servos.
    #[arg(long, value_enum, default_value = "so101-follower")]
    pub robot: ArmArg,
    /// Transactions of each kind.
    #[arg(long, default_value_t = 2000)]
    pub iters: usize,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs and prints the servo bus bench.
pub fn servo_bench(a: &ServoBenchArgs) -> anyhow::Result<()> {
    let kind = a.robot.kind();
    let (out, port) = reflex_agent::bench::servo_bench::run(kind, a.iters)?;
    if a.json {
        print_json(&out);
    } else {
        let f = |k: &str| out[k].as_f64().unwrap_or(f64::NAN);
        println!(
            "{} over {port}: sync read of 6 positions p50 {:.0} us / p99 {:.0} us; sync write of 6 goals p50 {:.0} us / p99 {:.0} us; {} retries",
            kind.name(),
            f("read_p50_us"),
            f("read_p99_us"),
            f("write_p50_us"),
            f("write_p99_us"),
            out["retries"]
        );
    }
    Ok(())
}

static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static STOP_NOW: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static SIGNALS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

extern "C" fn on_signal(_: libc::c_int) {
    use std::sync::atomic::Ordering::Relaxed;
    // First: finish the work in hand. Second: stop at the next control tick (the robot is
    // still left as `[robot] on_exit` says). Third: quit the process at once (a robot call that
    // never returns would otherwise keep it). write(2) and _exit(2) are async-signal-safe.
    let msg: &[u8] = match SIGNALS.fetch_add(1, Relaxed) {
        0 => {
            STOP.store(true, Relaxed);
            b"reflex: stopping when the work in hand is done (signal again to stop now)\n"
        }
        1 => {
            STOP_NOW.store(true, Relaxed);
            b"reflex: stopping now (signal again to quit at once, leaving the robot as it is)\n"
        }
        // SAFETY: _exit is on the async-signal-safe list.
        _ => unsafe { libc::_exit(130) },
    };
    // SAFETY: as above; the buffer is static.
    unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
}

/// A flag set by SIGINT or SIGTERM, for commands that end cleanly when asked (the emulator
/// removes its link; `reflex run` finishes its episode); a second signal sets
/// [`stop_now_flag`], a third quits at once.
pub fn stop_on_signals() -> &'static std::sync::atomic::AtomicBool {
    // SAFETY: the handler only stores to atomics, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    &STOP
}

/// Set by a second SIGINT or SIGTERM (after [`stop_on_signals`]): stop at once, cleanly.
pub fn stop_now_flag() -> &'static std::sync::atomic::AtomicBool {
    &STOP_NOW
}
