//! The bundle a robot is flashed with, the way an integrator uses it: `reflex bundle` (the real
//! binary) makes tarballs from this checkout, the system `tar` unpacks them, and each bundle's
//! own `install.sh` installs, upgrades and rolls back into a temporary system root (its
//! /etc/passwd a copy of this machine's). The installed binary then runs from that root with the
//! bundle's ONNX Runtime, and systemd checks the installed unit. The aarch64 bundle itself is
//! built by `make bundle` (a second dependency tree, not part of `make test`).

use crate::common::{json_output, reflex, repo};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `reflex bundle` of this host build with the given release name; returns the unpacked
/// bundle's directory.
fn bundle(dir: &Path, release: &str) -> PathBuf {
    let out = dir.join("dist");
    let v = json_output(reflex().args([
        "bundle",
        "--json",
        "--release",
        release,
        "--source",
        repo().to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]));
    let tarball = PathBuf::from(v["path"].as_str().unwrap());
    assert!(tarball.is_file(), "{v}");
    assert_eq!(
        std::fs::metadata(&tarball).unwrap().len(),
        v["bytes"].as_u64().unwrap()
    );
    assert!(v["files"].as_u64().unwrap() >= 20, "{v}");
    let unpack = dir.join("unpack");
    std::fs::create_dir_all(&unpack).unwrap();
    let st = Command::new("tar")
        .arg("xzf")
        .arg(&tarball)
        .arg("-C")
        .arg(&unpack)
        .status()
        .unwrap();
    assert!(st.success());
    let name = tarball
        .file_name()
        .unwrap()
        .to_string_lossy()
        .replace(".tar.gz", "");
    let b = unpack.join(name);
    for f in [
        "bin/reflex",
        "install.sh",
        "systemd/reflex.service",
        "configs/deploy/robot.toml",
        "models/so101-reach.onnx",
        "SHA256SUMS",
    ] {
        assert!(b.join(f).is_file(), "{f} missing from the bundle");
    }
    b
}

/// A system root with this machine's users and groups (the installer creates its user there).
fn system_root(dir: &Path) -> PathBuf {
    assert!(
        unsafe { libc::geteuid() } == 0,
        "the install test runs install.sh, which creates a system user (useradd --root): run the \
         tests as root (CI does)"
    );
    let root = dir.join("root");
    std::fs::create_dir_all(root.join("etc")).unwrap();
    for f in ["passwd", "group", "shadow", "gshadow"] {
        let from = Path::new("/etc").join(f);
        if from.exists() {
            std::fs::copy(&from, root.join("etc").join(f)).unwrap();
        }
    }
    // A fresh image may lack the video group: the installer must create it.
    for f in ["group", "gshadow"] {
        let p = root.join("etc").join(f);
        if let Ok(t) = std::fs::read_to_string(&p) {
            let kept: String = t
                .lines()
                .filter(|l| !l.starts_with("video:"))
                .map(|l| format!("{l}\n"))
                .collect();
            std::fs::write(&p, kept).unwrap();
        }
    }
    root
}

fn install(bundle: &Path, root: &Path, extra: &[&str]) -> (bool, String) {
    let out = Command::new(bundle.join("install.sh"))
        .arg("--root")
        .arg(root)
        .args(extra)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn link(root: &Path, name: &str) -> Option<String> {
    std::fs::read_link(root.join("opt/reflex").join(name))
        .ok()
        .map(|p| p.display().to_string())
}

/// Every path under `root` with what it is: a link's target, a file's size and mode and owner.
fn snapshot(root: &Path) -> BTreeMap<String, String> {
    use std::os::unix::fs::MetadataExt;
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let what = if m.file_type().is_symlink() {
                format!("-> {}", std::fs::read_link(&p).unwrap().display())
            } else {
                if m.is_dir() {
                    stack.push(p.clone());
                }
                format!("{} {:o} {}:{}", m.len(), m.mode(), m.uid(), m.gid())
            };
            out.insert(p.strip_prefix(root).unwrap().display().to_string(), what);
        }
    }
    out
}

fn user_ids(root: &Path, name: &str) -> Option<(u32, u32)> {
    std::fs::read_to_string(root.join("etc/passwd"))
        .unwrap()
        .lines()
        .find(|l| l.starts_with(&format!("{name}:")))
        .map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f[2].parse().unwrap(), f[3].parse().unwrap())
        })
}

fn group_members(root: &Path, group: &str) -> Vec<String> {
    std::fs::read_to_string(root.join("etc/group"))
        .unwrap()
        .lines()
        .find(|l| l.starts_with(&format!("{group}:")))
        .map(|l| {
            l.rsplit(':')
                .next()
                .unwrap()
                .split(',')
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn bundle_installs_upgrades_rolls_back_and_runs_from_its_root() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let v1 = bundle(&dir.path().join("b1"), "1.0.0");
    let v2 = bundle(&dir.path().join("b2"), "1.1.0");
    let root = system_root(dir.path());

    // First install.
    let (ok, out) = install(&v1, &root, &[]);
    assert!(ok, "{out}");
    assert_eq!(link(&root, "current").as_deref(), Some("releases/1.0.0"));
    assert_eq!(link(&root, "previous"), None);
    let (uid, gid) = user_ids(&root, "reflex").expect("the service user was created");
    for g in ["dialout", "video"] {
        assert!(
            group_members(&root, g).contains(&"reflex".to_string()),
            "reflex is not in {g}: {out}"
        );
    }
    let etc = root.join("etc/reflex");
    assert_eq!(
        std::fs::read(etc.join("robot.toml")).unwrap(),
        std::fs::read(repo().join("configs/deploy/robot.toml")).unwrap()
    );
    let data = std::fs::metadata(root.join("var/lib/reflex/recordings")).unwrap();
    assert_eq!((data.uid(), data.gid()), (uid, gid));
    let keys = std::fs::metadata(etc.join("keys")).unwrap();
    assert_eq!(keys.mode() & 0o777, 0o750, "keys readable by others");
    let unit = root.join("etc/systemd/system/reflex.service");
    assert!(unit.is_file());
    assert_eq!(
        std::fs::read_link(root.join("etc/systemd/system/multi-user.target.wants/reflex.service"))
            .unwrap(),
        Path::new("/etc/systemd/system/reflex.service")
    );

    // The installed binary finds the bundle's own ONNX Runtime (no .venv, no ORT_DYLIB_PATH) and
    // runs the shipped policy on the simulator from the installed configs.
    let bin = root.join("opt/reflex/current/bin/reflex");
    let doctor = Command::new(&bin)
        .arg("doctor")
        .current_dir(&root)
        .env_remove("ORT_DYLIB_PATH")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        text.contains("opt/reflex/releases/1.0.0/lib/libonnxruntime.so.1.31.1")
            && text.contains("found via the bundle's lib/")
            && text.contains("ONNX Runtime loads: ok"),
        "{text}"
    );
    // The first-boot check of the installed robot config names what is still missing here: the
    // arm's serial adapter, its calibration, the robot's certificates.
    let first_boot = Command::new(&bin)
        .arg("doctor")
        .arg("--config")
        .arg(etc.join("robot.toml"))
        .current_dir(&root)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&first_boot.stdout);
    assert!(!first_boot.status.success(), "{text}");
    for want in [
        "policy model: /opt/reflex/current/models/so101-reach.onnx not found",
        "arm port: /dev/ttyACM0 does not exist",
        "arm calibration: /etc/reflex/calibration/so101_follower.json not found",
        "bus certificates:",
        "bus endpoint: tls/0.0.0.0:7447",
    ] {
        assert!(
            text.contains(want),
            "doctor --config lacks `{want}`:\n{text}"
        );
    }
    let run = json_output(
        Command::new(&bin)
            .args(["run", "--json", "--episodes", "3", "--config"])
            .arg(root.join("opt/reflex/current/configs/run/sim-pick-bc.toml"))
            .current_dir(&root)
            .env_remove("ORT_DYLIB_PATH")
            .env("RUST_LOG", "warn"),
    );
    assert_eq!(run["episodes"], 3, "{run}");

    // The robot's config is the person's from now on: an upgrade keeps it.
    let mine = format!(
        "{}\n# port changed on this robot\n",
        std::fs::read_to_string(etc.join("robot.toml")).unwrap()
    );
    std::fs::write(etc.join("robot.toml"), &mine).unwrap();

    // Upgrade.
    let (ok, out) = install(&v2, &root, &[]);
    assert!(ok, "{out}");
    assert_eq!(link(&root, "current").as_deref(), Some("releases/1.1.0"));
    assert_eq!(link(&root, "previous").as_deref(), Some("releases/1.0.0"));
    assert_eq!(
        std::fs::read_to_string(etc.join("robot.toml")).unwrap(),
        mine
    );
    assert!(etc.join("robot.toml.example").is_file(), "{out}");
    assert_eq!(user_ids(&root, "reflex"), Some((uid, gid)));

    // Idempotent: the same bundle again changes nothing.
    let before = snapshot(&root);
    let (ok, out) = install(&v2, &root, &[]);
    assert!(ok, "{out}");
    assert!(out.contains("already"), "{out}");
    assert_eq!(
        snapshot(&root),
        before,
        "a second install changed the system: {out}"
    );

    // Rollback, and rollback of the rollback.
    let (ok, out) = install(&v2, &root, &["--rollback"]);
    assert!(ok, "{out}");
    assert_eq!(link(&root, "current").as_deref(), Some("releases/1.0.0"));
    assert_eq!(link(&root, "previous").as_deref(), Some("releases/1.1.0"));
    let version = Command::new(root.join("opt/reflex/current/bin/reflex"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(version.status.success());
    let installed = root.join("opt/reflex/current");
    let (ok, out) = install(&installed, &root, &["--rollback"]);
    assert!(ok, "{out}");
    assert_eq!(link(&root, "current").as_deref(), Some("releases/1.1.0"));

    // A damaged bundle is refused and the installed system is left as it was.
    let v3 = bundle(&dir.path().join("b3"), "1.2.0");
    let model = v3.join("models/pick.onnx");
    let mut bytes = std::fs::read(&model).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&model, &bytes).unwrap();
    let before = snapshot(&root);
    let (ok, out) = install(&v3, &root, &[]);
    assert!(
        !ok && out.contains("SHA256SUMS") && out.contains("damaged"),
        "{out}"
    );
    assert_eq!(snapshot(&root), before);

    // A third release keeps two: the one before the current goes.
    bytes[mid] ^= 0xff;
    std::fs::write(&model, &bytes).unwrap();
    let (ok, out) = install(&v3, &root, &[]);
    assert!(ok, "{out}");
    assert_eq!(link(&root, "current").as_deref(), Some("releases/1.2.0"));
    assert_eq!(link(&root, "previous").as_deref(), Some("releases/1.1.0"));
    assert!(!root.join("opt/reflex/releases/1.0.0").exists(), "{out}");

    // systemd's own check of the installed unit, inside the root (the executable it names must
    // exist there). The root needs systemd's targets to resolve WantedBy and After.
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok()
    {
        let units = Path::new("/lib/systemd/system");
        assert!(
            units.is_dir(),
            "systemd-analyze without {}",
            units.display()
        );
        std::fs::create_dir_all(root.join("usr/lib/systemd")).unwrap();
        let st = Command::new("cp")
            .arg("-a")
            .arg(units)
            .arg(root.join("usr/lib/systemd/"))
            .status()
            .unwrap();
        assert!(st.success());
        let v = Command::new("systemd-analyze")
            .arg("verify")
            .arg(format!("--root={}", root.display()))
            .arg("reflex.service")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&v.stderr);
        assert!(
            v.status.success() && err.trim().is_empty(),
            "systemd-analyze verify: {err}"
        );
    } else {
        eprintln!("systemd-analyze is not installed here: the unit was not verified by systemd");
    }
}

#[test]
fn jetson_install_uses_the_cuda_build_or_says_how_to_get_it() {
    let dir = tempfile::tempdir().unwrap();
    let b = bundle(&dir.path().join("b"), "2.0.0");

    // A Jetson without the GPU build: installs on the CPU library and says what to install.
    let root = system_root(&dir.path().join("r1"));
    std::fs::write(
        root.join("etc/nv_tegra_release"),
        "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64\n",
    )
    .unwrap();
    let no_python = dir.path().join("no-onnxruntime-python");
    std::fs::write(&no_python, "#!/bin/sh\nexit 1\n").unwrap();
    chmod_x(&no_python);
    let out = Command::new(b.join("install.sh"))
        .arg("--root")
        .arg(&root)
        .env("REFLEX_PYTHON", &no_python)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("R36") && text.contains("nvidia-jetpack") && text.contains("onnxruntime-gpu"),
        "{text}"
    );
    assert!(!root.join("etc/reflex/reflex.env").exists());

    // With JetPack's onnxruntime-gpu: the service is pointed at it.
    let root = system_root(&dir.path().join("r2"));
    std::fs::write(root.join("etc/nv_tegra_release"), "# R36 (release)\n").unwrap();
    let capi = dir.path().join("site-packages/onnxruntime/capi");
    std::fs::create_dir_all(&capi).unwrap();
    for f in [
        "libonnxruntime.so.1.31.1",
        "libonnxruntime_providers_cuda.so",
        "libonnxruntime_providers_tensorrt.so",
        "libonnxruntime_providers_shared.so",
    ] {
        std::fs::write(capi.join(f), b"").unwrap();
    }
    let python = dir.path().join("python-with-onnxruntime-gpu");
    std::fs::write(&python, format!("#!/bin/sh\necho {}\n", capi.display())).unwrap();
    chmod_x(&python);
    let out = Command::new(b.join("install.sh"))
        .arg("--root")
        .arg(&root)
        .env("REFLEX_PYTHON", &python)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("CUDA and TensorRT"), "{text}");
    let env = std::fs::read_to_string(root.join("etc/reflex/reflex.env")).unwrap();
    assert_eq!(
        env.trim(),
        format!(
            "ORT_DYLIB_PATH={}",
            capi.join("libonnxruntime.so.1.31.1").display()
        )
    );
}

fn chmod_x(p: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn run_until_stopped_ends_after_its_episode_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("rec");
    let mut c = reflex();
    c.args(["run", "--json", "--until-stopped", "--config"])
        .arg(repo().join("configs/run/sim-pick-bc.toml"))
        .arg("--record")
        .arg(&rec);
    let mut child = crate::common::spawn(c, &dir, "run");
    // Wait for recorded episodes, then stop it as systemd does.
    let episodes = |rec: &Path| -> usize {
        std::fs::read_dir(rec)
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|run| {
                std::fs::read_dir(run.path().join("episodes"))
                    .into_iter()
                    .flatten()
            })
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "rrd"))
            .count()
    };
    let t0 = std::time::Instant::now();
    while episodes(&rec) < 2 {
        assert!(
            t0.elapsed().as_secs() < 120,
            "no episodes recorded: {}",
            crate::common::child_stderr(&dir, "run")
        );
        assert!(
            child.0.try_wait().unwrap().is_none(),
            "exited early: {}",
            crate::common::child_stderr(&dir, "run")
        );
        // Paces the polling.
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) };
    let status = child.0.wait().unwrap();
    assert!(
        status.success(),
        "{status}: {}",
        crate::common::child_stderr(&dir, "run")
    );
    let out = std::fs::read_to_string(dir.path().join("run.out")).unwrap();
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let n = v["episodes"].as_u64().unwrap() as usize;
    assert!(n >= 2, "{v}");
    // Every episode the summary counts was finished and recorded.
    assert_eq!(episodes(&rec), n, "{v}");
}

#[test]
fn deploy_example_configs_load() {
    for name in ["robot", "learner", "viewer"] {
        let p = repo().join(format!("configs/deploy/{name}.toml"));
        let cfg = reflex_agent::config::RunConfig::load(&p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert_eq!(cfg.robot_name(), "so101", "{name}");
        let tls = cfg.bus_config(&Default::default()).tls;
        assert!(tls.is_some(), "{name}: the deployed bus runs over TLS");
    }
}
