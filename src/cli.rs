//! Pieces shared by the subcommands: logging, Zenoh arguments, progress bars, percentiles.

use anyhow::Context;
use clap::Args;
use reflex_runtime::bus::BusConfig;
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
}

impl BusArgs {
    /// The bus configuration these arguments describe.
    pub fn config(&self) -> BusConfig {
        BusConfig {
            listen: self.listen.clone(),
            connect: self.connect.clone(),
            multicast_scouting: !self.no_multicast,
            config_file: self.zenoh_config.clone(),
        }
    }
}

/// A progress bar on stderr, hidden when stderr is not a terminal.
pub fn progress(len: u64, what: &str) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(len);
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg:>12} [{bar:40}] {pos}/{len} ({elapsed}, eta {eta})",
        )
        .expect("static template")
        .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

/// Percentile of already sorted values (nearest rank).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `reflex doctor`: reports where ONNX Runtime was found.
pub fn doctor() -> anyhow::Result<()> {
    let found = reflex_policies::ort_env::find_onnxruntime().context("ONNX Runtime")?;
    println!(
        "ONNX Runtime: {} (found via {})",
        found.path.display(),
        found.source
    );
    reflex_policies::ort_env::init(&found).context("loading ONNX Runtime")?;
    println!("ONNX Runtime loads: ok");
    Ok(())
}

/// The command line as a person would retype it: `reflex` followed by the arguments (the
/// executable's own path differs between machines).
pub fn command_line() -> String {
    std::iter::once("reflex".to_string())
        .chain(std::env::args().skip(1))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&[3.0], 99.0), 3.0);
    }
}
