//! `reflex bundle`: the tarball that installs reflex on a robot (docs/deploy.md).

use crate::cli::print_json;
use clap::Args;
use reflex_deploy::bundle::{BundleOptions, default_version, host_target, make};
use std::path::PathBuf;

#[derive(Args)]
pub struct BundleArgs {
    /// Rust target triple of the robot's computer (default: this machine's); `make bundle`
    /// cross-builds for aarch64-unknown-linux-gnu (Jetson Orin, Raspberry Pi 5).
    #[arg(long)]
    target: Option<String>,
    /// The reflex executable built for --target (default: this one).
    #[arg(long, value_name = "FILE")]
    binary: Option<PathBuf>,
    /// libonnxruntime.so* for --target, from the onnxruntime wheel of that platform (default:
    /// the library this reflex uses; required for another target).
    #[arg(long, value_name = "FILE")]
    onnxruntime: Option<PathBuf>,
    /// The robot's calibration files (.json), installed to /etc/reflex/calibration.
    #[arg(long, value_name = "DIR")]
    calibration: Option<PathBuf>,
    /// The reflex checkout the models, configs and docs come from.
    #[arg(long, default_value = ".", value_name = "DIR")]
    source: PathBuf,
    /// Where the tarball goes.
    #[arg(long, default_value = "dist", value_name = "DIR")]
    out: PathBuf,
    /// Release name (default: the crate version and the checkout's commit).
    #[arg(long, value_name = "NAME")]
    release: Option<String>,
    /// Print a JSON summary.
    #[arg(long)]
    json: bool,
}

pub fn run(a: BundleArgs) -> anyhow::Result<()> {
    let host = host_target();
    let target = a.target.unwrap_or_else(|| host.clone());
    let binary = match a.binary {
        Some(b) => b,
        None if target == host => std::env::current_exe()?,
        None => anyhow::bail!(
            "--target {target} needs --binary: the reflex executable built for it (make bundle builds it)"
        ),
    };
    let onnxruntime = match a.onnxruntime {
        Some(p) => p,
        None if target == host => reflex_policies::ort_env::find_onnxruntime()?.path,
        None => anyhow::bail!(
            "--target {target} needs --onnxruntime: libonnxruntime.so.* from the onnxruntime=={} wheel for that platform (make bundle downloads it)",
            reflex_policies::ort_env::ORT_VERSION
        ),
    };
    let o = BundleOptions {
        release: a.release.unwrap_or_else(|| default_version(&a.source)),
        source: a.source,
        out: a.out,
        target,
        binary,
        onnxruntime,
        calibration: a.calibration,
    };
    let b = make(&o)?;
    if a.json {
        print_json(&b);
    } else {
        let name = b.path.file_name().unwrap_or_default().to_string_lossy();
        let dir = name.trim_end_matches(".tar.gz");
        println!(
            "wrote {}: {:.1} MB ({:.1} MB unpacked, {} files), release {} for {}",
            b.path.display(),
            b.bytes as f64 / 1e6,
            b.unpacked_bytes as f64 / 1e6,
            b.files,
            b.release,
            b.target
        );
        println!("on the robot: tar xzf {name} && sudo ./{dir}/install.sh   (docs/deploy.md)");
    }
    Ok(())
}
