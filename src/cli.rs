//! What the subcommands share: logging, Zenoh arguments, progress bars.
// Argument parsers and helpers that only the workstation's commands use (training, the
// simulator, the emulator) are unused in a build without them, such as the robot's.
#![cfg_attr(not(feature = "workstation"), allow(dead_code))]

use clap::Args;
use reflex_bus::BusConfig;
use std::path::PathBuf;

/// Logs go to stderr through `tracing`; `RUST_LOG` selects levels (default `info`). The
/// ChArUco detector warns of every candidate it turns down while trying its settings in turn,
/// which is how reflex uses it: only its errors are shown.
pub fn init_logging() {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(
            "info,zenoh=warn,zenoh_transport=warn,ort=warn,calib_targets_charuco=error,calib_targets_aruco=error,calib_targets_chessboard=error",
        )
    });
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_filter(UnixLinkNoise);
    tracing_subscriber::registry().with(filter).with(fmt).init();
}

/// Zenoh's Unix-socket link (1.10, `unicast.rs`) warns `Can not create a new UnixSocketStream
/// link bound to "PATH"` on every connection that succeeds, because a connecting Unix socket has
/// no path of its own (it names the link with a random id and carries on). A connection that
/// fails says why after the path (`"PATH": No such file or directory ...`) and is kept.
struct UnixLinkNoise;

/// Whether `message` is the Unix-socket link's warning for a connection that succeeded.
fn unix_link_noise(message: &str) -> bool {
    message.starts_with("Can not create a new UnixSocketStream link bound to ")
        && message.ends_with('"')
}

impl<S: tracing::Subscriber> tracing_subscriber::layer::Filter<S> for UnixLinkNoise {
    fn enabled(
        &self,
        _: &tracing::Metadata<'_>,
        _: &tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        true
    }

    fn event_enabled(
        &self,
        event: &tracing::Event<'_>,
        _: &tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        if !event.metadata().target().starts_with("zenoh_link_unixsock") {
            return true;
        }
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    self.0 = format!("{v:?}");
                }
            }
        }
        let mut m = Message(String::new());
        event.record(&mut m);
        !unix_link_noise(&m.0)
    }
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
            mode: Default::default(),
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

/// An error as `reflex` prints it: the message, then each cause it does not already end with.
/// Many of reflex's errors put their cause's text in their own message (so a log line with
/// `{e}` says it all) and also chain it as their source; anyhow's `{:#}` would say it twice.
pub fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let c = cause.to_string();
        if text.is_empty() {
            text = c;
        } else if !text.ends_with(&c) {
            text.push_str(": ");
            text.push_str(&c);
        }
    }
    text
}

/// Prints a JSON value, pretty.
pub fn print_json<T: serde::Serialize + ?Sized>(v: &T) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).expect("JSON of plain values")
    );
}

/// `reflex doctor`: prints the report line by line (or as JSON); fails when something a run
/// needs is missing.
pub fn doctor(o: &reflex_deploy::doctor::DoctorOptions, json: bool) -> anyhow::Result<()> {
    let report = reflex_deploy::doctor::run(o);
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for c in &report.checks {
            println!("{}", c.text);
        }
    }
    let problems = report.problems();
    if problems > 0 {
        anyhow::bail!("{problems} problem(s) above");
    }
    Ok(())
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
#[cfg(feature = "bench")]
#[derive(clap::Args)]
pub struct ServoBenchArgs {
    /// Which arm's servos.
    #[arg(long, value_enum, default_value = "so101-follower")]
    pub robot: ArmArg,
    /// Transactions of each kind.
    #[arg(long, default_value_t = 2000, value_parser = count)]
    pub iters: usize,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs and prints the servo bus bench.
#[cfg(feature = "bench")]
pub fn servo_bench(a: &ServoBenchArgs) -> anyhow::Result<()> {
    let kind = a.robot.kind();
    let (out, port) = reflex_bench::servo_bench::run(kind, a.iters)?;
    if a.json {
        print_json(&out);
    } else {
        println!(
            "{} over {port}: sync read of 6 positions p50 {:.0} us / p99 {:.0} us; sync write of 6 goals p50 {:.0} us / p99 {:.0} us; {} retries",
            kind.name(),
            out.read_p50_us,
            out.read_p99_us,
            out.write_p50_us,
            out.write_p99_us,
            out.retries
        );
    }
    Ok(())
}

/// A number within `lo ..= hi` (NaN and infinities refused). clap's own ranges cover integers
/// only; a negative or NaN duration used to panic deep inside a command, and an episode count of
/// 0 printed NaN figures.
fn within<T>(s: &str, lo: T, hi: T, unit: &str) -> Result<T, String>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display,
{
    match s.trim().parse::<T>() {
        Ok(v) if v >= lo && v <= hi => Ok(v),
        Ok(_) => Err(format!("`{s}`: allowed {lo} ..= {hi}{unit}")),
        Err(_) => Err(format!("`{s}` is not a number")),
    }
}

/// Seconds: 0 to a year.
pub fn seconds(s: &str) -> Result<f64, String> {
    within(s, 0.0, 365.0 * 86_400.0, " s")
}

/// A rate above 0, at most 100 kHz.
pub fn hertz(s: &str) -> Result<f64, String> {
    within(s, 1e-3, 100_000.0, " Hz")
}

/// The rate of the trace `reflex viz` draws, as `[bus] trace_hz` (0: none).
pub fn trace_hz(s: &str) -> Result<f64, String> {
    within(s, 0.0, 1000.0, " Hz")
}

/// A fraction or probability.
pub fn fraction(s: &str) -> Result<f64, String> {
    within(s, 0.0, 1.0, "")
}

/// A probability threshold.
pub fn threshold(s: &str) -> Result<f32, String> {
    within(s, 0.0, 1.0, "")
}

/// An optimiser's learning rate.
pub fn learning_rate(s: &str) -> Result<f64, String> {
    within(s, 1e-9, 1.0, "")
}

/// A count of at least one (episodes, steps, iterations, layer widths).
pub fn count(s: &str) -> Result<usize, String> {
    within(s, 1, 1 << 40, "")
}

/// The same, for 64-bit counts.
pub fn count64(s: &str) -> Result<u64, String> {
    within(s, 1, 1 << 40, "")
}

/// Threads of one pool, as `[policy] intra_threads`.
pub fn threads(s: &str) -> Result<usize, String> {
    within(s, 1, 256, "")
}

/// Actors of one fleet bench point.
pub fn actors(s: &str) -> Result<usize, String> {
    within(s, 1, 256, " actors")
}

/// Days a certificate is valid: a day to a century.
pub fn days(s: &str) -> Result<i64, String> {
    within(s, 1, 36_525, " days")
}

/// `WIDTHxHEIGHT` in pixels, each 16 to 4096.
pub fn parse_size(s: &str) -> Result<(u32, u32), String> {
    size_within(s, 4096)
}

/// The simulator's camera size: each side 16 to 1024, as `[sim.cameras]` allows.
pub fn sim_camera_size(s: &str) -> Result<(u32, u32), String> {
    size_within(s, 1024)
}

fn size_within(s: &str, max: u32) -> Result<(u32, u32), String> {
    let (w, h) = s
        .split_once('x')
        .ok_or_else(|| format!("`{s}` is not WIDTHxHEIGHT (e.g. 640x480)"))?;
    match (w.parse::<u32>(), h.parse::<u32>()) {
        (Ok(w), Ok(h)) if (16..=max).contains(&w) && (16..=max).contains(&h) => Ok((w, h)),
        _ => Err(format!("`{s}`: width and height between 16 and {max} px")),
    }
}

#[cfg(test)]
mod tests {
    use super::{error_text, unix_link_noise};

    #[test]
    fn only_the_unix_link_warning_of_a_good_connection_is_dropped() {
        assert!(unix_link_noise(
            "Can not create a new UnixSocketStream link bound to \"/tmp/s/soak.sock\""
        ));
        assert!(!unix_link_noise(
            "Can not create a new UnixSocketStream link bound to \"/tmp/nope.sock\": No such file or directory (os error 2) at unicast.rs:249."
        ));
        assert!(!unix_link_noise("something else \"quoted\""));
    }

    #[derive(Debug, thiserror::Error)]
    #[error("file `x.toml`: {source}")]
    struct Quoting {
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("file `x.toml`")]
    struct Chaining {
        source: std::io::Error,
    }

    fn missing() -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::NotFound, "no such file")
    }

    #[test]
    fn a_cause_is_said_once_whether_quoted_or_chained() {
        let quoted = anyhow::Error::from(Quoting { source: missing() });
        assert_eq!(error_text(&quoted), "file `x.toml`: no such file");
        let chained = anyhow::Error::from(Chaining { source: missing() });
        assert_eq!(error_text(&chained), "file `x.toml`: no such file");
        // Context added on top keeps every level that says something new.
        let ctx = anyhow::Error::from(Quoting { source: missing() }).context("loading the run");
        assert_eq!(
            error_text(&ctx),
            "loading the run: file `x.toml`: no such file"
        );
    }
}

#[cfg(feature = "train")]
/// `reflex bc train --objective`.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum ObjectiveArg {
    /// Diffusion Policy's: predict the noise.
    Diffusion,
    /// Flow matching: predict the velocity from noise to the chunk.
    Flow,
}

#[cfg(feature = "train")]
impl From<ObjectiveArg> for reflex_imitate::Objective {
    fn from(o: ObjectiveArg) -> Self {
        match o {
            ObjectiveArg::Diffusion => reflex_imitate::Objective::Diffusion,
            ObjectiveArg::Flow => reflex_imitate::Objective::Flow,
        }
    }
}
