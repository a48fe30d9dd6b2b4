//! `reflex bundle`: one tarball that installs reflex on a robot's computer.
//!
//! The bundle holds the binary, the ONNX Runtime library for the same target, the shipped models
//! with their specs, the configs (with the robot / learner / viewer examples of
//! `configs/deploy/`), calibration files, the deployment docs, a systemd unit and an install
//! script, plus `SHA256SUMS` over all of it. The binary and the library are checked to be built
//! for the target named (an x86_64 binary in an aarch64 bundle is refused before anything is
//! written), and the tarball appears under its final name only once it is complete.
//!
//! Layout once installed (by the bundle's `install.sh`, docs/deploy.md):
//! `/opt/reflex/releases/<version>/` with `/opt/reflex/current` and `/opt/reflex/previous`
//! pointing at the release in use and the one before it (rollback), the configuration in
//! `/etc/reflex/`, recordings and checkpoints in `/var/lib/reflex/`.

use crate::{DeployError, Result};
use sha2::{Digest, Sha256};
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// The systemd unit shipped in every bundle (`systemd/reflex.service`).
pub const UNIT: &str = include_str!("bundle/reflex.service");
/// The install script shipped in every bundle (`install.sh`).
pub const INSTALL_SH: &str = include_str!("bundle/install.sh");

/// What goes into a bundle.
#[derive(Clone, Debug)]
pub struct BundleOptions {
    /// The reflex checkout the models, configs and docs come from.
    pub source: PathBuf,
    /// Directory the tarball is written to (created if missing).
    pub out: PathBuf,
    /// Rust target triple the binary and library are built for, e.g. `aarch64-unknown-linux-gnu`.
    pub target: String,
    /// The `reflex` executable built for `target`.
    pub binary: PathBuf,
    /// `libonnxruntime.so*` built for `target` (from the onnxruntime wheel of that platform).
    pub onnxruntime: PathBuf,
    /// Calibration files of the robot (LeRobot JSON), installed to `/etc/reflex/calibration`.
    pub calibration: Option<PathBuf>,
    /// Release name, e.g. `0.1.0-4408b98`.
    pub release: String,
}

/// A bundle written to disk.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Bundle {
    /// The tarball.
    pub path: PathBuf,
    /// Its size.
    pub bytes: u64,
    /// Size of the files inside it before compression.
    pub unpacked_bytes: u64,
    /// Files inside it.
    pub files: usize,
    /// Release name.
    pub release: String,
    /// Target triple.
    pub target: String,
}

/// The target triple of the running binary (what `reflex bundle` packs by default).
pub fn host_target() -> String {
    let arch = std::env::consts::ARCH;
    match std::env::consts::OS {
        "linux" => format!("{arch}-unknown-linux-gnu"),
        "macos" => format!("{arch}-apple-darwin"),
        os => format!("{arch}-unknown-{os}"),
    }
}

/// The release name for a checkout: the crate version, then the commit when `source` is a git
/// checkout (`-dirty` when it has uncommitted changes).
pub fn default_version(source: &Path) -> String {
    let base = env!("CARGO_PKG_VERSION").to_string();
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(source)
            .args(args)
            .stderr(std::process::Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(rev) if !rev.is_empty() => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            format!("{base}-{rev}{}", if dirty { "-dirty" } else { "" })
        }
        _ => base,
    }
}

/// The machine an ELF file is built for (`x86_64`, `aarch64`, ...), from its header.
pub fn elf_arch(path: &Path) -> Result<String> {
    let mut head = Vec::with_capacity(20);
    fs::File::open(path)
        .and_then(|f| f.take(20).read_to_end(&mut head))
        .map_err(|e| DeployError::io(path, e))?;
    if head.len() < 20 || head[..4] != *b"\x7fELF" {
        return Err(DeployError::setup(
            path.display().to_string(),
            "not an ELF file: a bundle holds Linux executables and shared libraries",
        ));
    }
    let machine = if head[5] == 1 {
        u16::from_le_bytes([head[18], head[19]])
    } else {
        u16::from_be_bytes([head[18], head[19]])
    };
    Ok(match machine {
        62 => "x86_64".into(),
        183 => "aarch64".into(),
        40 => "arm".into(),
        243 => "riscv64".into(),
        m => format!("ELF machine {m}"),
    })
}

fn check_arch(path: &Path, what: &str, target: &str) -> Result<()> {
    let want = target.split('-').next().unwrap_or(target);
    let have = elf_arch(path)?;
    if have != want {
        return Err(DeployError::setup(
            path.display().to_string(),
            format!(
                "{what} is built for {have}, but the bundle's target is {target}: build it for \
                 {target} (make bundle does: cargo zigbuild --release --target {target}) or pass \
                 --target {have}-unknown-linux-gnu"
            ),
        ));
    }
    Ok(())
}

fn copy_file(from: &Path, to: &Path) -> Result<u64> {
    if let Some(d) = to.parent() {
        fs::create_dir_all(d).map_err(|e| DeployError::io(d, e))?;
    }
    fs::copy(from, to).map_err(|e| DeployError::io(from, e))
}

/// Copies the files of `from` (recursively) into `to`; `keep` chooses files by name.
fn copy_tree(from: &Path, to: &Path, keep: &dyn Fn(&Path) -> bool) -> Result<usize> {
    let mut n = 0;
    let mut entries: Vec<_> = fs::read_dir(from)
        .map_err(|e| DeployError::io(from, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for p in entries {
        let name = p.file_name().map(PathBuf::from).unwrap_or_default();
        if p.is_dir() {
            n += copy_tree(&p, &to.join(&name), keep)?;
        } else if keep(&p) {
            copy_file(&p, &to.join(&name))?;
            n += 1;
        }
    }
    Ok(n)
}

fn write_file(path: &Path, text: &str, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(d) = path.parent() {
        fs::create_dir_all(d).map_err(|e| DeployError::io(d, e))?;
    }
    fs::write(path, text).map_err(|e| DeployError::io(path, e))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|e| DeployError::io(path, e))
}

/// Every file under `root`, relative, sorted.
fn files_under(root: &Path) -> Result<Vec<PathBuf>> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
        for e in fs::read_dir(dir).map_err(|e| DeployError::io(dir, e))? {
            let p = e.map_err(|e| DeployError::io(dir, e))?.path();
            if p.is_dir() {
                walk(root, &p, out)?;
            } else {
                out.push(p.strip_prefix(root).unwrap_or(&p).to_path_buf());
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(root, root, &mut out)?;
    out.sort();
    Ok(out)
}

fn sha256_hex(path: &Path) -> Result<String> {
    let mut f = fs::File::open(path).map_err(|e| DeployError::io(path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf).map_err(|e| DeployError::io(path, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Fills `stage` with the bundle's files; returns how many.
fn stage_files(o: &BundleOptions, stage: &Path) -> Result<usize> {
    let lib_name = check_sources(o)?;
    stage_runtime(o, stage, &lib_name)?;
    stage_checkout(o, stage)?;
    write_file(&stage.join("systemd/reflex.service"), UNIT, 0o644)?;
    write_file(&stage.join("install.sh"), INSTALL_SH, 0o755)?;
    write_file(
        &stage.join("VERSION"),
        &format!(
            "version = \"{}\"\ntarget = \"{}\"\nreflex = \"{}\"\nonnxruntime = \"{lib_name}\"\n",
            o.release,
            o.target,
            env!("CARGO_PKG_VERSION")
        ),
        0o644,
    )?;
    // Checksums last, over everything else: install.sh refuses a bundle that does not match.
    let files = files_under(stage)?;
    let mut sums = String::new();
    for f in &files {
        sums.push_str(&format!(
            "{}  {}\n",
            sha256_hex(&stage.join(f))?,
            f.display()
        ));
    }
    write_file(&stage.join("SHA256SUMS"), &sums, 0o644)?;
    Ok(files.len() + 1)
}

/// The checkout's folders and the files for the target are there and right; returns the ONNX
/// Runtime library's file name.
fn check_sources(o: &BundleOptions) -> Result<String> {
    let src = &o.source;
    for dir in ["models", "configs"] {
        if !src.join(dir).is_dir() {
            return Err(DeployError::setup(
                src.join(dir).display().to_string(),
                "not found: run `reflex bundle` in the reflex checkout, or pass --source CHECKOUT",
            ));
        }
    }
    if !src.join("configs/deploy/robot.toml").is_file() {
        return Err(DeployError::setup(
            src.join("configs/deploy/robot.toml").display().to_string(),
            "not found: the bundle installs it as /etc/reflex/robot.toml (it is in the reflex checkout)",
        ));
    }
    let lib_name = o
        .onnxruntime
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    if !lib_name.starts_with("libonnxruntime.so") {
        return Err(DeployError::setup(
            o.onnxruntime.display().to_string(),
            "--onnxruntime must be the library itself (onnxruntime/capi/libonnxruntime.so.* in the \
             onnxruntime wheel for the target)",
        ));
    }
    check_arch(&o.binary, "the reflex binary", &o.target)?;
    check_arch(&o.onnxruntime, "the ONNX Runtime library", &o.target)?;
    Ok(lib_name)
}

/// The binary (executable) and ONNX Runtime with the providers' shared part.
fn stage_runtime(o: &BundleOptions, stage: &Path, lib_name: &str) -> Result<()> {
    copy_file(&o.binary, &stage.join("bin/reflex"))?;
    {
        use std::os::unix::fs::PermissionsExt;
        let bin = stage.join("bin/reflex");
        fs::set_permissions(&bin, fs::Permissions::from_mode(0o755))
            .map_err(|e| DeployError::io(&bin, e))?;
    }
    copy_file(&o.onnxruntime, &stage.join("lib").join(lib_name))?;
    // The providers' shared part: the CUDA and TensorRT providers of a GPU build load it.
    if let Some(shared) = o
        .onnxruntime
        .parent()
        .map(|d| d.join("libonnxruntime_providers_shared.so"))
        .filter(|p| p.is_file())
    {
        check_arch(&shared, "libonnxruntime_providers_shared.so", &o.target)?;
        copy_file(
            &shared,
            &stage.join("lib/libonnxruntime_providers_shared.so"),
        )?;
    }
    Ok(())
}

/// From the checkout: the models, the configs, the deployment docs, and the calibration files.
fn stage_checkout(o: &BundleOptions, stage: &Path) -> Result<()> {
    let src = &o.source;
    let model_files = |p: &Path| {
        let n = p.to_string_lossy();
        n.ends_with(".onnx") || n.ends_with(".policy.toml") || n.ends_with(".residual.json")
    };
    if copy_tree(&src.join("models"), &stage.join("models"), &model_files)? == 0 {
        return Err(DeployError::setup(
            src.join("models").display().to_string(),
            "holds no .onnx models: a bundle ships the base policies",
        ));
    }
    copy_tree(&src.join("configs"), &stage.join("configs"), &|p| {
        p.extension().is_some_and(|e| e == "toml")
    })?;
    for doc in ["deploy.md", "hardware.md"] {
        let p = src.join("docs").join(doc);
        if p.is_file() {
            copy_file(&p, &stage.join("docs").join(doc))?;
        }
    }
    fs::create_dir_all(stage.join("calibration")).map_err(|e| DeployError::io(stage, e))?;
    if let Some(c) = &o.calibration {
        let n = copy_tree(c, &stage.join("calibration"), &|p| {
            p.extension().is_some_and(|e| e == "json")
        })?;
        if n == 0 {
            return Err(DeployError::setup(
                c.display().to_string(),
                "--calibration holds no .json calibration files (`reflex calibrate joints` writes them)",
            ));
        }
    }
    Ok(())
}

/// Builds the bundle: `<out>/reflex-<version>-<target>.tar.gz`, unpacking to a directory of the
/// same name.
pub fn make(o: &BundleOptions) -> Result<Bundle> {
    if o.release.is_empty() || o.release.contains(['/', ' ', '"']) {
        return Err(DeployError::setup(
            "--release",
            format!(
                "`{}` cannot name a release directory: use letters, digits, dots and dashes",
                o.release
            ),
        ));
    }
    let name = format!("reflex-{}-{}", o.release, o.target);
    fs::create_dir_all(&o.out).map_err(|e| DeployError::io(&o.out, e))?;
    let stage_root = o.out.join(format!(".{name}.stage"));
    let _ = fs::remove_dir_all(&stage_root);
    let stage = stage_root.join(&name);
    let staged = stage_files(o, &stage);
    let result = staged.and_then(|files| {
        let unpacked_bytes = files_under(&stage)?
            .iter()
            .filter_map(|f| fs::metadata(stage.join(f)).ok())
            .map(|m| m.len())
            .sum();
        let path = o.out.join(format!("{name}.tar.gz"));
        let tmp = o.out.join(format!(".{name}.tar.gz.tmp"));
        let write = || -> std::io::Result<()> {
            let file = fs::File::create(&tmp)?;
            let gz = flate2::write::GzEncoder::new(file, flate2::Compression::default());
            let mut tar = tar::Builder::new(gz);
            tar.follow_symlinks(false);
            tar.append_dir_all(&name, &stage)?;
            let mut file = tar.into_inner()?.finish()?;
            file.flush()?;
            file.sync_all()
        };
        write().map_err(|e| DeployError::io(&tmp, e))?;
        fs::rename(&tmp, &path).map_err(|e| DeployError::io(&path, e))?;
        let bytes = fs::metadata(&path)
            .map_err(|e| DeployError::io(&path, e))?
            .len();
        Ok(Bundle {
            path,
            bytes,
            unpacked_bytes,
            files,
            release: o.release.clone(),
            target: o.target.clone(),
        })
    });
    let _ = fs::remove_dir_all(&stage_root);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elf(machine: u16) -> Vec<u8> {
        let mut h = vec![0u8; 64];
        h[..4].copy_from_slice(b"\x7fELF");
        h[4] = 2;
        h[5] = 1;
        h[18..20].copy_from_slice(&machine.to_le_bytes());
        h
    }

    #[test]
    fn elf_machines_are_read_from_the_header() {
        let d = tempfile::tempdir().unwrap();
        for (m, want) in [(62, "x86_64"), (183, "aarch64")] {
            let p = d.path().join(want);
            fs::write(&p, elf(m)).unwrap();
            assert_eq!(elf_arch(&p).unwrap(), want);
        }
        let p = d.path().join("script");
        fs::write(&p, "#!/bin/sh\necho hi\n").unwrap();
        assert!(elf_arch(&p).unwrap_err().to_string().contains("not an ELF"));
    }

    #[test]
    fn a_binary_for_another_machine_is_refused_before_anything_is_written() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        fs::create_dir_all(src.join("models")).unwrap();
        fs::create_dir_all(src.join("configs/deploy")).unwrap();
        fs::write(src.join("models/m.onnx"), b"x").unwrap();
        fs::write(src.join("configs/deploy/robot.toml"), b"").unwrap();
        let bin = d.path().join("reflex");
        fs::write(&bin, elf(62)).unwrap();
        let lib = d.path().join("libonnxruntime.so.1.31.1");
        fs::write(&lib, elf(183)).unwrap();
        let o = BundleOptions {
            source: src,
            out: d.path().join("dist"),
            target: "aarch64-unknown-linux-gnu".into(),
            binary: bin.clone(),
            onnxruntime: lib,
            calibration: None,
            release: "1.0".into(),
        };
        let e = make(&o).unwrap_err().to_string();
        assert!(
            e.contains("x86_64") && e.contains("aarch64-unknown-linux-gnu") && e.contains("reflex"),
            "{e}"
        );
        let left: Vec<_> = fs::read_dir(d.path().join("dist")).unwrap().collect();
        assert!(left.is_empty(), "nothing may be left behind: {left:?}");
    }

    #[test]
    fn the_unit_runs_the_installed_release_as_its_own_user() {
        for want in [
            "ExecStart=/opt/reflex/current/bin/reflex run --config /etc/reflex/robot.toml --until-stopped",
            "User=reflex",
            "SupplementaryGroups=dialout video",
            "Restart=on-failure",
            "AmbientCapabilities=CAP_SYS_NICE CAP_IPC_LOCK",
            "LimitMEMLOCK=infinity",
            "LimitRTPRIO=",
        ] {
            assert!(UNIT.contains(want), "unit lacks `{want}`");
        }
    }
}
