//! `reflex doctor`: what this machine and this build can drive, one check per line, each
//! problem with its fix.
//!
//! The probes read the machine through a [`Machine`]: its `/dev` and `/sys` trees, its serial
//! ports and the directory recordings go to. [`Machine::this`] is the computer reflex runs on;
//! tests point the same probes at a fake tree in a temporary directory.

use reflex_agent::config::RunConfig;
use reflex_bus::BusConfig;
use reflex_policies::onnx_policy::Provider;
use std::path::{Path, PathBuf};

/// How a check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// Present and usable.
    Ok,
    /// For information: nothing to do.
    Info,
    /// The robot runs, only worse (no real-time priority, little disk, a slow clock).
    Warning,
    /// A run needs this and it is missing or wrong: the line says what to do.
    Problem,
}

/// One line of the report.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Check {
    /// What was checked: `onnxruntime`, `serial`, `cameras`, `realtime`, `clock`, `disk`,
    /// `certificates`, `config`, `model`, `provider`, `bus`, `arm`, `build`.
    pub area: &'static str,
    /// How it came out.
    pub level: Level,
    /// The line a person reads, with the fix when there is one.
    pub text: String,
}

/// Everything `reflex doctor` found.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct DoctorReport {
    /// The checks, in the order they ran.
    pub checks: Vec<Check>,
}

impl DoctorReport {
    /// Checks that would stop a run.
    pub fn problems(&self) -> usize {
        self.checks
            .iter()
            .filter(|c| c.level == Level::Problem)
            .count()
    }

    fn push(&mut self, area: &'static str, level: Level, text: impl Into<String>) {
        self.checks.push(Check {
            area,
            level,
            text: text.into(),
        });
    }
}

/// A serial port as the probes see it.
#[derive(Clone, Debug)]
pub struct SerialPort {
    /// Device file, e.g. `/dev/ttyACM0`.
    pub path: PathBuf,
    /// USB vendor and product ids; `None` for a port that is not a USB adapter.
    pub usb: Option<(u16, u16)>,
    /// The adapter's product string, when it reports one.
    pub product: Option<String>,
}

/// The machine the probes read.
#[derive(Clone, Debug)]
pub struct Machine {
    /// Its device tree (`/dev`).
    pub dev: PathBuf,
    /// Its sysfs (`/sys`).
    pub sys: PathBuf,
    /// Where recordings go (their free space is checked).
    pub records: PathBuf,
    /// Its serial ports; `Err` when they cannot be listed.
    pub ports: Result<Vec<SerialPort>, String>,
}

impl Machine {
    /// This computer: `/dev`, `/sys`, the working directory, and the serial ports the
    /// `serialport` crate lists from sysfs (no libudev).
    pub fn this() -> Self {
        let ports = serialport::available_ports()
            .map(|ports| {
                ports
                    .into_iter()
                    .map(|p| {
                        let (usb, product) = match p.port_type {
                            serialport::SerialPortType::UsbPort(u) => {
                                (Some((u.vid, u.pid)), u.product)
                            }
                            _ => (None, None),
                        };
                        SerialPort {
                            path: p.port_name.into(),
                            usb,
                            product,
                        }
                    })
                    .collect()
            })
            .map_err(|e| e.to_string());
        Machine {
            dev: "/dev".into(),
            sys: "/sys".into(),
            records: ".".into(),
            ports,
        }
    }
}

/// What to check besides the machine.
#[derive(Clone, Debug, Default)]
pub struct DoctorOptions {
    /// A peer's bus certificates: the directory `reflex keys init` wrote and the peer's name.
    pub tls: Option<(PathBuf, String)>,
    /// A robot config whose needs are checked here (model, provider, arm port, calibration,
    /// certificates, endpoints).
    pub config: Option<PathBuf>,
}

/// Checks this computer.
pub fn run(o: &DoctorOptions) -> DoctorReport {
    check(&Machine::this(), o)
}

/// Checks `machine`.
pub fn check(machine: &Machine, o: &DoctorOptions) -> DoctorReport {
    let mut r = DoctorReport::default();
    onnxruntime(&mut r);
    serial_ports(&mut r, machine);
    cameras(&mut r, &machine.dev);
    // Real time, the clock and disk space are warnings: the loop runs without them, only worse.
    realtime(&mut r);
    clock_source(&mut r, &machine.sys);
    disk(&mut r, &machine.records);
    if let Some((dir, name)) = &o.tls {
        certificates(&mut r, dir, name);
    }
    if let Some(path) = &o.config {
        config_checks(&mut r, path);
    }
    r.push(
        "build",
        Level::Info,
        "teleop devices in this build: keyboard, leader arm (so101-leader, koch-leader), gamepad (evdev: /dev/input/event*), SpaceMouse (hidraw: /dev/hidraw*)",
    );
    r.push(
        "build",
        Level::Info,
        "arms in this build: so101 (Feetech STS3215, reach and joints), koch (Dynamixel X series, joints); emulated: reflex hw emulate --robot so101-follower",
    );
    r
}

fn onnxruntime(r: &mut DoctorReport) {
    match reflex_policies::ort_env::find_onnxruntime() {
        Ok(found) => {
            r.push(
                "onnxruntime",
                Level::Ok,
                format!(
                    "ONNX Runtime: {} (found via {})",
                    found.path.display(),
                    found.source
                ),
            );
            match reflex_policies::ort_env::init(&found) {
                Ok(_) => r.push("onnxruntime", Level::Ok, "ONNX Runtime loads: ok"),
                Err(e) => r.push(
                    "onnxruntime",
                    Level::Problem,
                    format!("ONNX Runtime does not load: {e}"),
                ),
            }
            providers(r, &found.path);
        }
        Err(e) => r.push("onnxruntime", Level::Problem, format!("ONNX Runtime: {e}")),
    }
}

/// The execution providers beside the ONNX Runtime library `lib` (the CPU one is built in).
fn provider_libs(lib: &Path) -> (bool, bool) {
    let dir = lib.parent().unwrap_or(Path::new("."));
    let has = |p: &str| {
        dir.join(format!("libonnxruntime_providers_{p}.so"))
            .exists()
    };
    (has("cuda"), has("tensorrt"))
}

fn providers(r: &mut DoctorReport, lib: &Path) {
    let (cuda, trt) = provider_libs(lib);
    r.push(
        "onnxruntime",
        Level::Info,
        format!(
            "ONNX Runtime providers: CPU{}{}{}",
            if cuda { ", CUDA" } else { "" },
            if trt { ", TensorRT" } else { "" },
            if cuda || trt {
                String::new()
            } else {
                " (no CUDA/TensorRT build here: on a Jetson, install the JetPack build of onnxruntime-gpu, docs/deploy.md)".into()
            }
        ),
    );
}

/// Whether this user may read and write `path` (the kernel's answer, without opening it: opening
/// a serial port can reset the board behind it).
fn may_open(path: &Path) -> bool {
    rustix::fs::access(
        path,
        rustix::fs::Access::READ_OK | rustix::fs::Access::WRITE_OK,
    )
    .is_ok()
}

/// USB serial ports and whether this user may open them.
fn serial_ports(r: &mut DoctorReport, m: &Machine) {
    let ports = match &m.ports {
        Ok(p) => p,
        Err(e) => {
            r.push(
                "serial",
                Level::Warning,
                format!("serial ports: cannot list them: {e}"),
            );
            return;
        }
    };
    let usb: Vec<_> = ports.iter().filter(|p| p.usb.is_some()).collect();
    if usb.is_empty() {
        r.push(
            "serial",
            Level::Info,
            "serial ports: no USB serial adapter (an arm's bus adapter shows up as /dev/ttyACM* or /dev/ttyUSB*; without an arm, try reflex hw emulate)",
        );
        return;
    }
    for p in usb {
        let (vid, pid) = p.usb.unwrap_or_default();
        let what = format!(
            "{} (USB {vid:04x}:{pid:04x}{})",
            p.path.display(),
            p.product
                .as_deref()
                .map(|s| format!(", {s}"))
                .unwrap_or_default()
        );
        if may_open(&p.path) {
            r.push("serial", Level::Ok, format!("serial port {what}: can open"));
        } else {
            r.push(
                "serial",
                Level::Problem,
                format!(
                    "serial port {what}: this user cannot open it: sudo usermod -aG dialout $USER, then log in again (or the udev rule in docs/hardware.md)"
                ),
            );
        }
    }
}

/// Video devices (cameras): whether this user may open each, and on this machine's /dev what
/// each offers (card, formats reflex decodes, sizes).
fn cameras(r: &mut DoctorReport, dev: &Path) {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dev)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("video"))
        .map(|e| dev.join(e.file_name()))
        .collect();
    v.sort();
    if v.is_empty() {
        r.push(
            "cameras",
            Level::Info,
            format!(
                "cameras: none ({}/video*); without a camera, a folder of images is one (device = \"files:DIR\")",
                dev.display()
            ),
        );
        return;
    }
    let found = if dev == Path::new("/dev") {
        reflex_cameras::v4l2::list_cameras()
    } else {
        Vec::new()
    };
    for p in v {
        if !may_open(&p) {
            r.push(
                "cameras",
                Level::Problem,
                format!(
                    "camera {}: this user cannot open it: sudo usermod -aG video $USER, then log in again",
                    p.display()
                ),
            );
            continue;
        }
        let shown = p.display().to_string();
        let what = match found.iter().find(|c| c.path == shown) {
            Some(c) if c.captures => {
                let formats: Vec<String> = c
                    .formats
                    .iter()
                    .filter_map(|f| {
                        let best = f.sizes.iter().max_by_key(|s| s.width * s.height)?;
                        Some(format!(
                            "{} up to {}x{}",
                            f.reflex_format.as_deref().unwrap_or(&f.fourcc),
                            best.width,
                            best.height
                        ))
                    })
                    .collect();
                format!("{} ({}): {}", c.card, c.bus_info, formats.join(", "))
            }
            Some(c) => format!(
                "{} ({}): not a video capture node (cameras also expose metadata nodes)",
                c.card,
                c.error.as_deref().unwrap_or(&c.driver)
            ),
            None => "can open".to_string(),
        };
        r.push("cameras", Level::Ok, format!("camera {shown}: {what}"));
    }
}

/// Whether this user may run the loop with real-time priority and locked memory.
fn realtime(r: &mut DoctorReport) {
    use rustix::process::{Resource, getrlimit};
    let root = rustix::process::geteuid().is_root();
    let prio = getrlimit(Resource::Rtprio).current.unwrap_or(u64::MAX);
    let memlock = getrlimit(Resource::Memlock).current;
    let mb = match memlock {
        None => "unlimited".to_string(),
        Some(v) => format!("{} MB", v / (1 << 20)),
    };
    if root || prio > 0 {
        r.push(
            "realtime",
            Level::Ok,
            format!(
                "real-time: SCHED_FIFO allowed{}; locked memory {mb}",
                if root {
                    " (root)".to_string()
                } else if prio == u64::MAX {
                    " at any priority".to_string()
                } else {
                    format!(" up to priority {prio}")
                }
            ),
        );
    } else {
        r.push(
            "realtime",
            Level::Warning,
            "real-time: warning: not permitted for this user (RLIMIT_RTPRIO 0): the loop runs with ordinary scheduling; grant it with `LimitRTPRIO=90` and `LimitMEMLOCK=infinity` in the service, or an rtprio line in /etc/security/limits.d/",
        );
    }
}

/// The kernel's clock source (the loop's timing depends on a cheap, steady one).
fn clock_source(r: &mut DoctorReport, sys: &Path) {
    let p = sys.join("devices/system/clocksource/clocksource0/current_clocksource");
    match std::fs::read_to_string(&p) {
        Ok(c) => {
            let c = c.trim();
            let (level, note) = match c {
                "tsc" | "arch_sys_counter" => (Level::Ok, ""),
                _ => (
                    Level::Warning,
                    " (reading it is slower than tsc or arch_sys_counter; timing figures will be worse)",
                ),
            };
            r.push("clock", level, format!("clock source: {c}{note}"));
        }
        Err(_) => r.push(
            "clock",
            Level::Warning,
            format!("clock source: unknown ({} not readable)", p.display()),
        ),
    }
}

/// Free space where recordings go.
fn disk(r: &mut DoctorReport, dir: &Path) {
    let st = match rustix::fs::statvfs(dir) {
        Ok(st) => st,
        Err(e) => {
            r.push(
                "disk",
                Level::Warning,
                format!("disk: cannot read the free space of {}: {e}", dir.display()),
            );
            return;
        }
    };
    let free_gb = st.f_bavail as f64 * st.f_frsize as f64 / 1e9;
    if free_gb < 5.0 {
        r.push(
            "disk",
            Level::Warning,
            format!(
                "disk: warning: {free_gb:.1} GB free here: recordings of a training day need more (an episode with cameras is tens of MB); free space or record elsewhere (--record DIR)"
            ),
        );
    } else {
        r.push(
            "disk",
            Level::Ok,
            format!("disk: {free_gb:.1} GB free for recordings"),
        );
    }
}

/// The bus certificates of peer `name` in `dir`: present, key private.
fn certificates(r: &mut DoctorReport, dir: &Path, name: &str) {
    match reflex_bus::secure::TlsFiles::in_dir(dir, name).check() {
        Ok(()) => r.push(
            "certificates",
            Level::Ok,
            format!(
                "bus certificates: {}/{name}.pem and .key, key private: ok",
                dir.display()
            ),
        ),
        Err(e) => r.push(
            "certificates",
            Level::Problem,
            format!("bus certificates: {e}"),
        ),
    }
}

/// What a robot's config needs on this machine: the policy model and its provider, the arm's
/// port (present, this user may open it) and calibration, the bus certificates, and listening
/// endpoints that are free.
fn config_checks(r: &mut DoctorReport, path: &Path) {
    let cfg = match RunConfig::load(path) {
        Ok(c) => c,
        Err(e) => {
            r.push("config", Level::Problem, format!("config: {e}"));
            return;
        }
    };
    let file = path.display().to_string();
    r.push(
        "config",
        Level::Ok,
        format!("config: {file}: ok (robot `{}`)", cfg.robot_name()),
    );
    policy_checks(r, &cfg, &file);
    arm_checks(r, &cfg, &file);
    bus_checks(r, &cfg, &file);
}

/// The policy's model file, and the provider it asks for in the ONNX Runtime found.
fn policy_checks(r: &mut DoctorReport, cfg: &RunConfig, file: &str) {
    if let Some(m) = &cfg.policy.model {
        if m.is_file() {
            r.push(
                "model",
                Level::Ok,
                format!("policy model: {}: ok", m.display()),
            );
        } else {
            r.push(
                "model",
                Level::Problem,
                format!(
                    "policy model: {} not found ([policy] model in {file})",
                    m.display()
                ),
            );
        }
    }
    let wants = match &cfg.policy.provider {
        Provider::Cuda { .. } => Some("cuda"),
        Provider::Tensorrt { .. } => Some("tensorrt"),
        _ => None,
    };
    if let Some(p) = wants {
        let has = reflex_policies::ort_env::find_onnxruntime()
            .ok()
            .is_some_and(|f| {
                let (cuda, trt) = provider_libs(&f.path);
                if p == "cuda" { cuda } else { trt }
            });
        if has {
            r.push(
                "provider",
                Level::Ok,
                format!("policy provider: {p}: the library has it"),
            );
        } else {
            r.push(
                "provider",
                Level::Problem,
                format!(
                    "policy provider: [policy.provider] kind = \"{p}\" in {file}, but the ONNX Runtime found has no {p} provider: install the CUDA/TensorRT build (docs/deploy.md, Jetson) or set kind = \"cpu\""
                ),
            );
        }
    }
}

/// The arm's serial port and calibration file.
fn arm_checks(r: &mut DoctorReport, cfg: &RunConfig, file: &str) {
    if let Some(arm) = &cfg.arm {
        let port = Path::new(&arm.port);
        if !port.exists() {
            r.push(
                "arm",
                Level::Problem,
                format!(
                    "arm port: {} does not exist ([arm] port in {file}): is the adapter plugged in and powered? ls /dev/serial/by-id/ names it",
                    arm.port
                ),
            );
        } else if !may_open(port) {
            r.push(
                "arm",
                Level::Problem,
                format!(
                    "arm port: {} exists but this user may not open it: sudo usermod -aG dialout $USER and log in again (the service's user `reflex` is in dialout)",
                    arm.port
                ),
            );
        } else {
            r.push("arm", Level::Ok, format!("arm port: {}: ok", arm.port));
        }
        match &arm.calibration {
            Some(c) if !c.is_file() => r.push(
                "arm",
                Level::Problem,
                format!(
                    "arm calibration: {} not found ([arm] calibration in {file}): reflex calibrate joints writes it",
                    c.display()
                ),
            ),
            Some(c) => r.push(
                "arm",
                Level::Ok,
                format!("arm calibration: {}: ok", c.display()),
            ),
            None => r.push(
                "arm",
                Level::Info,
                "arm calibration: none ([arm] calibration): the arm runs on the servos' raw zero, fine for an emulated arm only",
            ),
        }
    }
}

/// The bus: TLS for an arm, its certificates, the endpoints to listen on and connect to.
fn bus_checks(r: &mut DoctorReport, cfg: &RunConfig, file: &str) {
    if let Some(why) = cfg.insecure_arm_bus(&BusConfig::default()) {
        if cfg.bus.insecure {
            r.push(
                "bus",
                Level::Warning,
                format!(
                    "bus: INSECURE ([bus] insecure = true in {file}): {why}; `reflex run` warns every minute"
                ),
            );
        } else {
            r.push(
                "bus",
                Level::Problem,
                format!("bus: {why} (`reflex run` refuses this config)"),
            );
        }
    }
    let bus = cfg.bus_config(&Default::default());
    if let Some(tls) = &bus.tls {
        match tls.check() {
            Ok(()) => r.push(
                "certificates",
                Level::Ok,
                format!(
                    "bus certificates: {} and its key, key private: ok",
                    tls.cert.display()
                ),
            ),
            Err(e) => r.push(
                "certificates",
                Level::Problem,
                format!("bus certificates: {e}"),
            ),
        }
    }
    for ep in &bus.listen {
        let Some(addr) = ep.strip_prefix("tcp/").or_else(|| ep.strip_prefix("tls/")) else {
            continue;
        };
        match std::net::TcpListener::bind(addr) {
            Ok(_) => r.push(
                "bus",
                Level::Ok,
                format!("bus endpoint: {ep}: free to listen on"),
            ),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => r.push(
                "bus",
                Level::Problem,
                format!(
                    "bus endpoint: {ep} is in use ([bus] listen in {file}): is reflex already running (systemctl status reflex)?"
                ),
            ),
            Err(e) => r.push(
                "bus",
                Level::Problem,
                format!("bus endpoint: {ep} ([bus] listen in {file}): {e}"),
            ),
        }
    }
    for ep in &bus.connect {
        r.push(
            "bus",
            Level::Info,
            format!("bus endpoint: connects to {ep}"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A machine in a temporary directory: `dev/`, `sys/` with a clock source, no serial ports.
    fn fake(clock: &str) -> (tempfile::TempDir, Machine) {
        let root = tempfile::tempdir().unwrap();
        let dev = root.path().join("dev");
        let sys = root.path().join("sys");
        let clk = sys.join("devices/system/clocksource/clocksource0");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::create_dir_all(&clk).unwrap();
        std::fs::write(clk.join("current_clocksource"), format!("{clock}\n")).unwrap();
        let m = Machine {
            dev,
            sys,
            records: root.path().to_path_buf(),
            ports: Ok(vec![]),
        };
        (root, m)
    }

    fn lines(r: &DoctorReport, area: &str) -> Vec<(Level, String)> {
        r.checks
            .iter()
            .filter(|c| c.area == area)
            .map(|c| (c.level, c.text.clone()))
            .collect()
    }

    #[test]
    fn cameras_are_listed_from_the_device_tree_in_order() {
        let (_root, m) = fake("tsc");
        let r = check(&m, &DoctorOptions::default());
        assert!(lines(&r, "cameras")[0].1.starts_with("cameras: none"));
        for n in ["video2", "video0", "ttyS0"] {
            std::fs::write(m.dev.join(n), b"").unwrap();
        }
        let r = check(&m, &DoctorOptions::default());
        let said = lines(&r, "cameras");
        let (v0, v2) = (m.dev.join("video0"), m.dev.join("video2"));
        assert_eq!(said.len(), 2, "{said:?}");
        assert_eq!(
            said[0],
            (Level::Ok, format!("camera {}: can open", v0.display()))
        );
        assert_eq!(said[1].1, format!("camera {}: can open", v2.display()));
        // One this user may not open is a problem with what to do (root may open anything).
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&v2, std::fs::Permissions::from_mode(0o000)).unwrap();
        if !rustix::process::geteuid().is_root() {
            let r = check(&m, &DoctorOptions::default());
            let said = lines(&r, "cameras");
            assert_eq!(said[1].0, Level::Problem, "{said:?}");
            assert!(said[1].1.contains("usermod -aG video"), "{said:?}");
        }
    }

    #[test]
    fn a_slow_or_unreadable_clock_source_is_a_warning_and_tsc_is_fine() {
        let (_root, m) = fake("tsc");
        let r = check(&m, &DoctorOptions::default());
        assert_eq!(
            lines(&r, "clock"),
            vec![(Level::Ok, "clock source: tsc".to_string())]
        );
        let (_root, m) = fake("hpet");
        let c = &lines(&check(&m, &DoctorOptions::default()), "clock")[0];
        assert!(
            c.0 == Level::Warning && c.1.contains("slower than tsc"),
            "{c:?}"
        );
        let (root, mut m) = fake("tsc");
        m.sys = root.path().join("nowhere");
        let c = &lines(&check(&m, &DoctorOptions::default()), "clock")[0];
        assert!(
            c.0 == Level::Warning && c.1.contains("not readable"),
            "{c:?}"
        );
    }

    #[test]
    fn usb_serial_adapters_are_reported_and_other_ports_are_not() {
        let (root, mut m) = fake("tsc");
        let acm = root.path().join("ttyACM0");
        std::fs::write(&acm, b"").unwrap();
        m.ports = Ok(vec![
            SerialPort {
                path: acm.clone(),
                usb: Some((0x1a86, 0x55d3)),
                product: Some("USB Single Serial".into()),
            },
            SerialPort {
                path: "/dev/ttyS0".into(),
                usb: None,
                product: None,
            },
        ]);
        let r = check(&m, &DoctorOptions::default());
        let s = lines(&r, "serial");
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!(
            s[0],
            (
                Level::Ok,
                format!(
                    "serial port {} (USB 1a86:55d3, USB Single Serial): can open",
                    acm.display()
                )
            )
        );
        m.ports = Ok(vec![]);
        let s = lines(&check(&m, &DoctorOptions::default()), "serial");
        assert!(s[0].1.contains("no USB serial adapter"), "{s:?}");
        m.ports = Err("permission denied".into());
        let s = lines(&check(&m, &DoctorOptions::default()), "serial");
        assert!(
            s[0].1.contains("cannot list them: permission denied"),
            "{s:?}"
        );
    }

    #[test]
    fn a_robot_config_names_the_missing_model_port_and_calibration() {
        let (root, m) = fake("tsc");
        let cfg = root.path().join("robot.toml");
        let port = root.path().join("ttyACM7");
        std::fs::write(
            &cfg,
            format!(
                r#"
[robot]
source = "so101"
name = "arm"

[arm]
port = "{}"
calibration = "{}"

[policy]
kind = "onnx"
model = "{}"

[bus]
enabled = true
insecure = true
"#,
                port.display(),
                root.path().join("cal.json").display(),
                root.path().join("model.onnx").display()
            ),
        )
        .unwrap();
        let o = DoctorOptions {
            tls: None,
            config: Some(cfg.clone()),
        };
        let r = check(&m, &o);
        let problems: Vec<String> = r
            .checks
            .iter()
            .filter(|c| c.level == Level::Problem && c.area != "onnxruntime")
            .map(|c| c.text.clone())
            .collect();
        assert!(
            problems.iter().any(|p| p.contains("model.onnx not found")),
            "{problems:?}"
        );
        assert!(
            problems
                .iter()
                .any(|p| p.contains("ttyACM7 does not exist")),
            "{problems:?}"
        );
        assert!(
            problems.iter().any(|p| p.contains("cal.json not found")),
            "{problems:?}"
        );
        // The port appears, the calibration is written, the model exported: those lines pass.
        std::fs::write(&port, b"").unwrap();
        std::fs::write(root.path().join("cal.json"), b"{}").unwrap();
        std::fs::write(root.path().join("model.onnx"), b"").unwrap();
        let r = check(&m, &o);
        let arm = lines(&r, "arm");
        assert!(arm.iter().all(|(l, _)| *l == Level::Ok), "{arm:?}");
        assert!(lines(&r, "model")[0].0 == Level::Ok);
        // An insecure arm bus is said out loud but allowed, as `reflex run` allows it.
        let bus = lines(&r, "bus");
        assert!(
            bus.iter()
                .any(|(l, t)| *l == Level::Warning && t.contains("INSECURE")),
            "{bus:?}"
        );
        // A config that does not parse is one problem naming the file.
        std::fs::write(&cfg, "[robot]\nsource = \"moon\"\n").unwrap();
        let c = &lines(&check(&m, &o), "config")[0];
        assert!(c.0 == Level::Problem && c.1.contains("robot.toml"), "{c:?}");
    }
}
