//! The command line: documented commands work and bad input gets errors that say what to fix.

use crate::common::{reflex, reflex_outside_the_project, repo, run_ok};

fn run(args: &[&str]) -> (bool, String, String) {
    let out = reflex().args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn config_with_unknown_key_names_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("bad.toml");
    std::fs::write(&f, "[sim]\ntask = \"pick\"\ncontrol_hertz = 20\n").unwrap();
    let (ok, _, err) = run(&[
        "sim",
        "expert",
        "--episodes",
        "1",
        "--config",
        f.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(
        err.contains("bad.toml") && err.contains("control_hertz") && err.contains("control_hz"),
        "{err}"
    );
}

#[test]
fn a_missing_config_file_is_named_and_the_systems_reason_said_once() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("absent.toml");
    let (ok, _, err) = run(&["run", "--config", f.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("absent.toml"), "{err}");
    // The reason is in the config error's own message and also its chained source: said once.
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
}

#[test]
fn config_with_wrong_type_or_range_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("c.toml");
    std::fs::write(&f, "[sim]\ntask = \"pick\"\ncontrol_hz = \"fast\"\n").unwrap();
    let (ok, _, err) = run(&[
        "sim",
        "expert",
        "--episodes",
        "1",
        "--config",
        f.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("sim.control_hz"), "{err}");
    std::fs::write(&f, "[sim]\ntask = \"pick\"\n[sim.cameras]\nwidth = 4096\n").unwrap();
    let (ok, _, err) = run(&[
        "sim",
        "expert",
        "--episodes",
        "1",
        "--config",
        f.to_str().unwrap(),
    ]);
    assert!(
        !ok && err.contains("sim.cameras.width") && err.contains("16 ..= 1024"),
        "{err}"
    );
    std::fs::write(&f, "[sim]\ntask = \"stack\"\n").unwrap();
    let (ok, _, err) = run(&[
        "sim",
        "expert",
        "--episodes",
        "1",
        "--config",
        f.to_str().unwrap(),
    ]);
    assert!(
        !ok && err.contains("sim.task") && err.contains("insert"),
        "{err}"
    );
}

#[test]
fn shipped_configs_parse() {
    for entry in std::fs::read_dir(crate::common::repo().join("configs/sim")).unwrap() {
        let p = entry.unwrap().path();
        let (ok, out, err) = run(&[
            "sim",
            "expert",
            "--episodes",
            "2",
            "--json",
            "--config",
            p.to_str().unwrap(),
        ]);
        assert!(ok, "{}: {err}", p.display());
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(v["episodes"], 2);
    }
}

#[test]
fn sim_demos_writes_the_documented_format() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("demos");
    let (ok, stdout, err) = run(&[
        "sim",
        "demos",
        "--task",
        "reach",
        "--episodes",
        "3",
        "--noise",
        "0.1",
        "--seed",
        "5",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(stdout.contains("wrote 3 episodes"), "{stdout}");
    let m = reflex_data::demos::read_manifest(&out).unwrap();
    assert_eq!(m.episodes.len(), 3);
    assert_eq!(m.spec.kind, "sim/reach");
    for e in &m.episodes {
        let ep = reflex_data::demos::read_episode(&out, e).unwrap();
        assert_eq!(ep.observations.len(), ep.actions.len() + 1);
        assert_eq!(ep.rewards.len(), ep.actions.len());
        assert_eq!(ep.observations[0].len(), m.spec.state_dim());
        assert_eq!(ep.seed, e.seed);
    }
    // Same command, same seed: the same episodes, byte for byte.
    let out2 = dir.path().join("demos2");
    let (ok, _, _) = run(&[
        "sim",
        "demos",
        "--task",
        "reach",
        "--episodes",
        "3",
        "--noise",
        "0.1",
        "--seed",
        "5",
        "--out",
        out2.to_str().unwrap(),
    ]);
    assert!(ok);
    for e in &m.episodes {
        assert_eq!(
            std::fs::read(out.join(&e.file)).unwrap(),
            std::fs::read(out2.join(&e.file)).unwrap()
        );
    }
}

#[test]
fn sim_bench_prints_json_with_units_in_the_keys() {
    let (ok, out, err) = run(&["sim", "bench", "--task", "pick", "--steps", "200", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["state_only"]["steps_per_s"].as_f64().unwrap() > 0.0);
    assert!(v["cameras"]["steps_per_s"].as_f64().unwrap() > 0.0);
    assert!(v["state_only"]["wall_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn doctor_finds_onnxruntime_in_the_project_environment() {
    let out = reflex()
        .arg("doctor")
        .current_dir(crate::common::repo())
        .env_remove("ORT_DYLIB_PATH")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("libonnxruntime.so.1.31.1") && stdout.contains("loads: ok"),
        "{stdout}"
    );
    // What this build drives, and the serial ports (none on this machine).
    assert!(
        stdout.contains("leader arm")
            && stdout.contains("gamepad (evdev")
            && stdout.contains("serial port"),
        "{stdout}"
    );
}

#[test]
fn doctor_json_is_the_report_as_data_with_the_same_checks_as_the_text() {
    let run = |json: bool| {
        let mut c = reflex();
        c.arg("doctor").current_dir(crate::common::repo());
        if json {
            c.arg("--json");
        }
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let v: serde_json::Value = serde_json::from_str(&run(true)).unwrap();
    let checks = v["checks"].as_array().unwrap();
    let levels = ["ok", "info", "warning", "problem"];
    for c in checks {
        assert!(c["area"].as_str().is_some_and(|a| !a.is_empty()), "{c}");
        assert!(levels.contains(&c["level"].as_str().unwrap()), "{c}");
    }
    for area in [
        "onnxruntime",
        "serial",
        "cameras",
        "realtime",
        "clock",
        "disk",
        "build",
    ] {
        assert!(
            checks.iter().any(|c| c["area"] == area),
            "no `{area}` check: {v}"
        );
    }
    // The text is the same report, line by line.
    let text = run(false);
    for c in checks {
        let line = c["text"].as_str().unwrap();
        if c["area"] != "disk" {
            assert!(
                text.contains(line),
                "`{line}` not in the text report:\n{text}"
            );
        }
    }
}

#[test]
fn doctor_without_onnxruntime_says_how_to_install_it() {
    let dir = tempfile::tempdir().unwrap();
    // No project environment above a temp dir (the binary in it too), no python3 on PATH, a bad
    // ORT_DYLIB_PATH unset.
    let out = reflex_outside_the_project(dir.path())
        .arg("doctor")
        .env_remove("ORT_DYLIB_PATH")
        .env("PATH", dir.path())
        .output()
        .unwrap();
    let err = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success());
    assert!(
        err.contains("pip install onnxruntime==1.31.1") && err.contains("Jetson"),
        "{err}"
    );
    assert!(err.contains("1 problem"), "{err}");
}

#[test]
fn reflex_run_prints_a_line_per_episode_and_summarises_routine_clipping_instead_of_warning() {
    // On the bus, where the status thread used to warn about every clipped step.
    let dir = tempfile::tempdir().unwrap();
    let mut text =
        std::fs::read_to_string(crate::common::repo().join("configs/run/sim-pick-expert.toml"))
            .unwrap();
    // In real time, so the status thread sees the clipping as it happens.
    text = text.replace("clock = \"sim\"", "clock = \"wall\"");
    text.push_str(&format!(
        "\n[bus]\nenabled = true\nno_multicast = true\nlisten = [\"{}\"]\n",
        crate::common::unix_endpoint(&dir, "bus")
    ));
    let cfg = dir.path().join("run.toml");
    std::fs::write(&cfg, text).unwrap();
    let out = crate::common::reflex()
        .env("RUST_LOG", "info")
        .args(["run", "--episodes", "3", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("episode ")).collect();
    assert_eq!(lines.len(), 3, "{err}");
    assert!(
        lines[2].contains("robot alone") && lines[2].contains("takeovers"),
        "{err}"
    );
    // The expert's steps are clipped now and then: said in the episode's line, not warned.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("step_limit"),
        "the run clipped steps: {stdout}"
    );
    assert!(err.contains("safety: step_limit"), "{err}");
    assert!(!err.contains("WARN"), "{err}");
}

#[test]
fn reflex_teleop_from_a_gamepad_event_stream_takes_over_reflex_run() {
    use crate::common::{child_stderr, spawn, unix_endpoint};
    use reflex_hardware::devices::input_event;
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let ep = unix_endpoint(&dir, "bus");
    // The simulator with no base policy (it holds unless a person drives), in real time, on the
    // bus with the trace on.
    let mut text =
        std::fs::read_to_string(crate::common::repo().join("configs/run/sim-pick-expert.toml"))
            .unwrap();
    text = text
        .replace("kind = \"expert\"", "kind = \"none\"")
        .replace("clock = \"sim\"", "clock = \"wall\"");
    text.push_str(&format!(
        "\n[bus]\nenabled = true\nno_multicast = true\ntrace_hz = 20.0\nlisten = [\"{ep}\"]\n"
    ));
    let cfg = dir.path().join("run.toml");
    std::fs::write(&cfg, text).unwrap();
    let mut run = reflex();
    run.args(["run", "--json", "--episodes", "2", "--config"])
        .arg(&cfg);
    let mut actor = spawn(run, &dir, "actor");
    // A recorded gamepad: evdev records through a FIFO, as /dev/input/eventN delivers them.
    let fifo = dir.path().join("event0");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let mut tele = reflex();
    tele.args([
        "teleop",
        "--device",
        "gamepad",
        "--robot",
        "sim",
        "--no-multicast",
    ])
    .arg("--path")
    .arg(&fifo)
    .args(["--connect", &ep]);
    let _teleop = spawn(tele, &dir, "teleop");
    // Opening the writing end waits for the teleop to open the device.
    let mut pad = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(s) = actor.0.try_wait().unwrap() {
            break s;
        }
        // The right bumper held, the left stick pushed forward, resent as a driver repeats.
        for (ty, code, v) in [(1u16, 0x137u16, 1i32), (3, 1, -32767), (0, 0, 0)] {
            let _ = pad.write_all(&input_event(ty, code, v));
        }
        assert!(
            t0.elapsed().as_secs() < 60,
            "the run did not end: {}",
            child_stderr(&dir, "actor")
        );
        // Paces the gamepad driver resending its records (20 Hz) while polling for the end.
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(status.success(), "{}", child_stderr(&dir, "actor"));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("actor.out")).unwrap())
            .unwrap();
    assert!(v["teleop_steps"].as_u64().unwrap() > 20, "{v}");
    let said = child_stderr(&dir, "teleop");
    assert!(said.contains("you drive"), "{said}");
}

#[test]
fn doctor_checks_what_a_first_boot_needs_and_a_peers_certificates() {
    let dir = tempfile::tempdir().unwrap();
    reflex_bus::secure::init_keys(dir.path(), "arm", &["robot".to_string()], &[], &|_| {
        reflex_bus::secure::valid_for_days(1)
    })
    .unwrap();
    let doctor = || {
        let out = reflex()
            .arg("doctor")
            .args(["--tls-name", "robot", "--tls-dir"])
            .arg(dir.path())
            .current_dir(crate::common::repo())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    let (ok, said) = doctor();
    assert!(ok, "{said}");
    for what in [
        "providers: CPU",
        "cameras:",
        "real-time:",
        "clock source:",
        "disk:",
        "key private: ok",
    ] {
        assert!(said.contains(what), "no `{what}` in {said}");
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        dir.path().join("robot.key"),
        std::fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    let (ok, said) = doctor();
    assert!(!ok && said.contains("chmod 600"), "{said}");
}

#[test]
fn reflex_run_keeps_the_records_directory_within_its_size_limit() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    // An earlier day's recordings: 3 MB in two runs.
    for (run, age_s) in [("run-old", 7200u64), ("run-older", 9000)] {
        let p = runs.join(run).join("episodes/episode_000001.rrd");
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, vec![0u8; 1_500_000]).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(age_s))
            .unwrap();
    }
    let mut text =
        std::fs::read_to_string(crate::common::repo().join("configs/run/sim-pick-expert.toml"))
            .unwrap();
    text = text.replace("[run]", "[run]\nkeep_recordings_gb = 0.002");
    let cfg = dir.path().join("run.toml");
    std::fs::write(&cfg, text).unwrap();
    run_ok(
        reflex()
            .args(["run", "--episodes", "2", "--record"])
            .arg(&runs)
            .arg("--config")
            .arg(&cfg),
    );
    // The oldest run went to make room; the newer earlier run and this run's episodes stay.
    assert!(!runs.join("run-older").exists());
    assert!(runs.join("run-old").exists());
    let others = std::fs::read_dir(&runs)
        .unwrap()
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with("run-old"))
        .count();
    assert_eq!(others, 1, "this run's recordings are kept");
}

/// `reflex bench loop --camera DIR`: the camera's frames reach the loop's observations and the
/// report carries the camera's counters beside the loop's figures (the figures themselves are
/// docs/benchmarks.md's, measured on an idle machine, not asserted here).
#[test]
fn bench_loop_with_a_file_camera_beside_reports_the_camera_and_the_loop() {
    let dir = tempfile::tempdir().unwrap();
    for k in 0..3u8 {
        let rgb = vec![k * 50; 32 * 24 * 3];
        let f = std::fs::File::create(dir.path().join(format!("{k:02}.png"))).unwrap();
        let mut enc = png::Encoder::new(std::io::BufWriter::new(f), 32, 24);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        enc.write_header().unwrap().write_image_data(&rgb).unwrap();
    }
    let v = crate::common::json_output(
        crate::common::reflex()
            .args([
                "bench",
                "loop",
                "--hz",
                "200",
                "--seconds",
                "1",
                "--json",
                "--camera",
            ])
            .arg(dir.path()),
    );
    assert_eq!(v["ticks"], 200, "{v}");
    for key in [
        "lateness_p50_us",
        "lateness_p99_us",
        "missed",
        "step_p99_us",
    ] {
        assert!(v[key].is_number(), "{key} in {v}");
    }
    let cam = &v["camera"];
    assert!(cam["frames"].as_u64().unwrap() > 0, "{cam}");
    assert!(cam["used"].as_u64().unwrap() > 0, "{cam}");
    assert_eq!(cam["errors"], 0, "{cam}");
}

/// `reflex hw cameras` lists this computer's V4L2 cameras (none on the CI machine: it says so
/// and how to do without); `--json` is the same list as data.
#[test]
fn hw_cameras_lists_the_v4l2_devices_or_says_there_are_none() {
    let (ok, out, err) = run(&["hw", "cameras"]);
    assert!(ok, "{err}");
    let v = crate::common::json_output(reflex().args(["hw", "cameras", "--json"]));
    let list = v.as_array().expect("a JSON list");
    if list.is_empty() {
        assert!(
            out.contains("no cameras") && out.contains("files:DIR"),
            "{out}"
        );
    }
    for c in list {
        assert!(c["path"].as_str().unwrap().starts_with("/dev/video"), "{c}");
        assert!(out.contains(c["path"].as_str().unwrap()), "{out}");
    }
}

/// `reflex bench learner --json` the way docs/benchmarks.md and benches/peers/run.sh run it
/// (the real binary, both cores): every configuration reports a rate, the threads in effect, and
/// the Pendulum run its steps, updates and final return. Rates are printed, not judged here.
#[test]
fn reflex_bench_learner_reports_every_configuration_and_the_pendulum_run() {
    let v = crate::common::json_output(reflex().args([
        "bench",
        "learner",
        "--updates",
        "5",
        "--pendulum-steps",
        "300",
        "--threads",
        "2",
        "--json",
    ]));
    assert_eq!(v["threads"], 2, "{v}");
    for (key, hidden, batch, critics) in [
        ("a_64x64_b100_2critics", 64, 100, 2),
        ("b_256x256_b256_2critics", 256, 256, 2),
        ("c_256x256_b256_10critics", 256, 256, 10),
    ] {
        let c = &v[key];
        assert!(c["updates_per_s"].as_f64().unwrap() > 0.0, "{key}: {v}");
        assert_eq!(
            (&c["hidden"], &c["batch"], &c["critics"]),
            (
                &serde_json::json!(hidden),
                &serde_json::json!(batch),
                &serde_json::json!(critics)
            ),
            "{key}: {v}"
        );
    }
    let p = &v["pendulum"];
    assert_eq!(p["steps"], 300, "{v}");
    // One update per step after the 100 warm-up steps.
    assert_eq!(p["updates"], 201, "{v}");
    assert!(p["final_return"].as_f64().unwrap().is_finite(), "{v}");
    assert!(p["wall_s"].as_f64().unwrap() > 0.0, "{v}");
}

/// `reflex bench learner --kernel avx2` as docs/benchmarks.md and benches/peers/run.sh run it to
/// time an AVX2-only machine's path: the report names the path it ran on. A processor without
/// AVX2 and FMA refuses it, naming its own fastest; an unknown name is refused with the choices.
#[test]
fn reflex_bench_learner_runs_on_the_kernel_path_it_is_asked_for() {
    let flags = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let has = |f: &str| {
        flags
            .lines()
            .find(|l| l.starts_with("flags"))
            .is_some_and(|l| l.split_whitespace().any(|x| x == f))
    };
    let args = [
        "bench",
        "learner",
        "--kernel",
        "avx2",
        "--updates",
        "3",
        "--pendulum-steps",
        "0",
        "--json",
    ];
    if cfg!(target_arch = "x86_64") && has("avx2") && has("fma") {
        let v = crate::common::json_output(reflex().args(args));
        assert_eq!(v["kernel"], "avx2+fma", "{v}");
        assert!(
            v["b_256x256_b256_2critics"]["updates_per_s"]
                .as_f64()
                .unwrap()
                > 0.0,
            "{v}"
        );
    } else {
        let (ok, _, err) = run(&args);
        assert!(
            !ok && err.contains("cannot run the avx2+fma kernel path"),
            "{err}"
        );
    }
    let (ok, _, err) = run(&["bench", "learner", "--kernel", "sse", "--updates", "3"]);
    assert!(!ok && err.contains("use avx512, avx2 or portable"), "{err}");
}

/// A preset file through the binary: its scripted expert must keep 95 % over 50 episodes; returns
/// what a short `sim bench` of it reports, and its text.
fn expert_then_bench(cfg: &str) -> (serde_json::Value, String) {
    let (ok, out, err) = run(&[
        "sim",
        "expert",
        "--config",
        cfg,
        "--episodes",
        "50",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["success_rate"].as_f64().unwrap() >= 0.95, "{out}");
    let (ok, out, err) = run(&[
        "sim",
        "bench",
        "--config",
        cfg,
        "--steps",
        "200",
        "--no-cameras",
        "--json",
    ]);
    assert!(ok, "{err}");
    (serde_json::from_str(&out).unwrap(), out)
}

#[test]
fn the_multibody_preset_from_the_docs_keeps_the_expert_and_says_who_integrates_the_arm() {
    // configs/sim/pick-multibody.toml as a user runs it; the same settings as
    // `SimConfig::with_multibody_arm`, which the determinism and expert tests use. Its speed is
    // the bench's business (docs/sim.md), not this test's; what must hold is that it still grasps.
    let repo = crate::common::repo();
    let cfg = repo.join("configs/sim/pick-multibody.toml");
    let cfg = cfg.to_str().unwrap();
    let text = std::fs::read_to_string(cfg).unwrap();
    let parsed: toml::Value = toml::from_str(&text).unwrap();
    let sim: reflex_sim::SimConfig = parsed["sim"].clone().try_into().unwrap();
    let preset = reflex_sim::SimConfig::for_task(reflex_sim::TaskKind::Pick).with_multibody_arm();
    assert_eq!(sim.physics_hz, preset.physics_hz);
    assert_eq!(format!("{:?}", sim.solver), format!("{:?}", preset.solver));
    let (v, out) = expert_then_bench(cfg);
    assert_eq!(v["arm"], "rapier", "{out}");
    assert_eq!(v["substeps"].as_u64(), Some(10), "{out}");
}

#[test]
fn the_default_pick_config_from_the_docs_integrates_the_arm_by_reflex_and_refuses_coarse_steps() {
    // configs/sim/pick.toml spells out every default: the binary must run it as the defaults.
    let repo = crate::common::repo();
    let cfg = repo.join("configs/sim/pick.toml");
    let cfg = cfg.to_str().unwrap();
    let text = std::fs::read_to_string(cfg).unwrap();
    let parsed: toml::Value = toml::from_str(&text).unwrap();
    let sim: reflex_sim::SimConfig = parsed["sim"].clone().try_into().unwrap();
    let default = reflex_sim::SimConfig::for_task(reflex_sim::TaskKind::Pick);
    assert_eq!(sim.physics_hz, default.physics_hz);
    assert_eq!(format!("{:?}", sim.solver), format!("{:?}", default.solver));
    let (v, out) = expert_then_bench(cfg);
    assert_eq!(v["arm"], "reflex", "{out}");
    assert_eq!(v["substeps"].as_u64(), Some(5), "{out}");
    // Too coarse an arm step is refused, naming the key and the floor.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("coarse.toml");
    let arm_substeps = "arm_substeps = 2 ";
    assert!(text.contains(arm_substeps), "{text}");
    std::fs::write(&bad, text.replace(arm_substeps, "arm_substeps = 0 ")).unwrap();
    let (ok, _, err) = run(&["sim", "bench", "--config", bad.to_str().unwrap(), "--json"]);
    assert!(!ok && err.contains("sim.solver.arm_substeps"), "{err}");
    std::fs::write(
        &bad,
        text.replace("physics_hz = 100.0", "physics_hz = 20.0")
            .replace("iterations = 1 ", "iterations = 4 "),
    )
    .unwrap();
    let (ok, _, err) = run(&["sim", "bench", "--config", bad.to_str().unwrap(), "--json"]);
    assert!(
        !ok && err.contains("physics_hz x arm_substeps >= 80"),
        "{err}"
    );
}

#[test]
fn a_learner_setting_out_of_range_is_refused_with_its_file_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("learn.toml");
    let ckpt = dir.path().join("learner.ckpt");
    std::fs::write(
        &f,
        format!(
            "[robot]\nsource = \"sim\"\n\n[sim]\ntask = \"pick\"\n\n[policy]\nkind = \"none\"\n\n\
             [run]\nepisodes = 1\n\n[learner]\ncheckpoint = {ckpt:?}\n\n[learner.sac]\nhidden = [0, 16]\n"
        ),
    )
    .unwrap();
    let (ok, _, err) = run(&["run", "--config", f.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains("learn.toml") && err.contains("learner.sac.hidden") && err.contains("[0, 16]"),
        "{err}"
    );
    // Refused while reading the file: no learner thread started, so none panicked.
    assert!(!err.contains("panicked"), "{err}");
    assert!(!ckpt.exists());
}

#[test]
fn numbers_out_of_range_on_the_command_line_are_refused_by_flag_instead_of_panicking() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        // A negative, NaN or huge wait panicked converting it to a Duration.
        (
            vec!["estop", "--robot", "nope", "--no-multicast", "--wait-s=-1"],
            "--wait-s",
        ),
        (
            vec!["learn", "--config", "x.toml", "--wait-s", "NaN"],
            "--wait-s",
        ),
        (vec!["viz", "--seconds", "NaN"], "--seconds"),
        // Certificates valid for longer than the clock can say panicked.
        (
            vec![
                "keys",
                "init",
                "--robot",
                "r",
                "--peer",
                "robot",
                "--dir",
                keys.to_str().unwrap(),
                "--days",
                "100000000",
            ],
            "--days",
        ),
        // No actors indexed an empty list.
        (vec!["bench", "fleet", "--actors", "0"], "--actors"),
        // 2,000 threads spun for minutes without a word.
        (
            vec![
                "policy",
                "bench",
                "--model",
                "models/pick.onnx",
                "--threads",
                "2000",
            ],
            "--threads",
        ),
        // [bus] trace_hz refuses these; the flag took them.
        (
            vec!["run", "--config", "x.toml", "--trace-hz=-5"],
            "--trace-hz",
        ),
        // Zero episodes printed NaN success rates.
        (vec!["sim", "expert", "--episodes", "0"], "--episodes"),
        // A threshold no probability reaches wrote a classifier its own loader refuses.
        (
            vec![
                "reward",
                "train",
                "--demos",
                "d",
                "--camera",
                "front",
                "--out",
                "r.onnx",
                "--threshold",
                "2",
            ],
            "--threshold",
        ),
        // Up to 4096 was taken and then refused as the config key [sim.cameras] width.
        (
            vec![
                "sim",
                "demos",
                "--cameras",
                "--camera-size",
                "2048x2048",
                "--out",
                "d",
            ],
            "--camera-size",
        ),
    ];
    for (args, flag) in cases {
        let (ok, _, err) = run(&args);
        assert!(!ok, "{args:?} was accepted");
        assert!(
            err.contains(flag) && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }
    assert!(!keys.exists(), "a refused `keys init` left its directory");
}

#[test]
fn a_board_too_big_to_print_is_refused_instead_of_overflowing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("board.png");
    let (ok, _, err) = run(&[
        "calibrate",
        "board",
        "--board",
        "chessboard:9x6:0.25",
        "--dpi",
        "600",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!ok && !err.contains("panicked"), "{err}");
    assert!(err.contains("megapixels") && err.contains("--dpi"), "{err}");
    assert!(!out.exists());
}

#[test]
fn bench_fleet_shorter_than_an_episode_finishes() {
    // The learner takes an episode's steps when it ends: an actor whose steps ended mid-episode
    // was never taken and the bench waited for ever.
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = reflex();
    cmd.args(["bench", "fleet", "--actors", "1", "--steps", "10", "--json"]);
    let mut g = crate::common::spawn(cmd, &dir, "fleet");
    crate::common::wait_exit(&mut g, "fleet", &dir, 300);
}

#[test]
fn bc_train_checks_its_chunk_and_reports_the_loss_of_a_short_run() {
    let dir = tempfile::tempdir().unwrap();
    let demos = dir.path().join("demos");
    run_ok(
        reflex()
            .args(["sim", "demos", "--task", "pick", "--episodes", "2", "--out"])
            .arg(&demos),
    );
    let model = dir.path().join("p.onnx");
    let train = |extra: &[&str]| {
        let mut c = reflex();
        c.args(["bc", "train", "--demos"])
            .arg(&demos)
            .arg("--out")
            .arg(&model)
            .args(["--steps", "5", "--batch", "8"])
            .args(extra);
        c.output().unwrap()
    };
    // More actions run per chunk than it holds: refused before training, nothing written.
    let o = train(&["--horizon", "8", "--execute", "9"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--execute 9"), "{err}");
    assert!(!model.exists());
    // Five steps are fewer than the hundred a reported loss averaged: it said NaN.
    let o = train(&[]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("final loss") && !out.contains("NaN"), "{out}");
}

#[test]
fn a_model_path_that_is_no_file_is_named_as_the_model_not_as_its_spec() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    // Before: "config file `<dir>.policy.toml`: cannot read it".
    for args in [
        vec!["policy", "check", "--model", d],
        vec!["demo", "--model", d, "--episodes", "1", "--runs", d],
    ] {
        let (ok, _, err) = run(&args);
        assert!(!ok);
        assert!(
            err.contains("is not a file") && !err.contains(".policy.toml"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn the_simulated_persons_settings_are_range_checked_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("demo.toml");
    // Each of these ran without a word: a fraction above 1 never comes, NaN never fires.
    for (line, key) in [
        ("late_fraction = 5.0", "human.late_fraction"),
        ("stray_m = nan", "human.stray_m"),
        ("stall_m = -1.0", "human.stall_m"),
    ] {
        std::fs::write(&f, format!("[human]\n{line}\n")).unwrap();
        let (ok, _, err) = run(&["demo", "--episodes", "1", "--config", f.to_str().unwrap()]);
        assert!(
            !ok && err.contains("demo.toml") && err.contains(key),
            "{line}: {err}"
        );
    }
}

#[test]
fn a_demo_config_in_a_run_configs_layout_says_where_the_keys_go() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("demo.toml");
    std::fs::write(&f, "[learner.sac]\nbc_weight = 0.5\n").unwrap();
    let (ok, _, err) = run(&["demo", "--episodes", "1", "--config", f.to_str().unwrap()]);
    assert!(
        !ok && err.contains("[learner.sac]") && err.contains("move them up into [learner]"),
        "{err}"
    );
}

#[test]
fn replay_without_a_screen_points_at_the_summary() {
    let dir = tempfile::tempdir().unwrap();
    let rrd = dir.path().join("episode_000000.rrd");
    std::fs::write(&rrd, b"not opened").unwrap();
    let out = reflex()
        .env_remove("DISPLAY")
        .env_remove("WAYLAND_DISPLAY")
        .arg("replay")
        .arg(&rrd)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    // Installed or not, the viewer cannot show it here: the error says what can.
    assert!(err.contains("reflex replay --summary"), "{err}");
}

#[test]
fn a_malformed_endpoint_or_missing_zenoh_file_is_said_plainly() {
    let dir = tempfile::tempdir().unwrap();
    let absent = dir.path().join("absent.json5");
    // sim-pick-bc.toml has no bus of its own: a Zenoh file given on the command line opens one
    // (it was ignored without a word).
    for (config, flag, value, says) in [
        ("sim-pick-hil.toml", "--listen", "bogus", "PROTOCOL/ADDRESS"),
        (
            "sim-pick-hil.toml",
            "--zenoh-config",
            absent.to_str().unwrap(),
            "absent.json5",
        ),
        (
            "sim-pick-bc.toml",
            "--zenoh-config",
            absent.to_str().unwrap(),
            "absent.json5",
        ),
        // And a trace asked for where no bus is (it was ignored).
        (
            "sim-pick-bc.toml",
            "--trace-hz",
            "10",
            "the trace goes out on the bus",
        ),
    ] {
        let config = format!("configs/run/{config}");
        let out = reflex()
            .current_dir(repo())
            .args(["run", "--config", &config, "--no-multicast", flag, value])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        // Before: a parser's debug dump and two source locations in the crate cache.
        assert!(
            err.contains(says) && !err.contains(".cargo") && !err.contains("Json5Err"),
            "{err}"
        );
    }
}

#[test]
fn keys_refuses_names_that_would_clash_or_hide_and_says_it_is_about_keys() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    let k = keys.to_str().unwrap();
    for (extra, says) in [
        (vec!["--peer", ""], "peer name ``"),
        (vec!["--peer", "ca"], "peer name `ca`"),
        (
            vec!["--peer", "learner", "--peer", "learner"],
            "named twice",
        ),
        (
            vec!["--peer", "learner", "--host", "not a host!!"],
            "host `not a host!!`",
        ),
    ] {
        let mut args = vec!["keys", "init", "--robot", "r", "--dir", k];
        args.extend(extra);
        let (ok, _, err) = run(&args);
        assert!(
            !ok && err.contains(says) && err.contains("keys:"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("Zenoh configuration"), "{err}");
        assert!(!keys.exists(), "{args:?} left {k}");
    }
}

#[test]
fn a_base_policy_given_as_the_residual_is_named_for_what_it_is() {
    let out = reflex()
        .current_dir(repo())
        .args([
            "eval",
            "--config",
            "configs/run/sim-pick-bc.toml",
            "--episodes",
            "1",
        ])
        .args(["--residual", "models/pick.onnx"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    // Before: "unknown field `chunk_len`" from the policy's own spec read as a residual's.
    assert!(
        !out.status.success() && err.contains("is a base policy"),
        "{err}"
    );
}

#[test]
fn a_directory_without_demonstrations_says_how_to_make_them() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("dataset");
    let (ok, _, err) = run(&[
        "dataset",
        "export",
        "--demos",
        dir.path().to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    // Before: "demo file `.../manifest.json`: No such file or directory".
    assert!(
        !ok && err.contains("holds no demonstrations") && err.contains("reflex sim demos"),
        "{err}"
    );
}

#[test]
fn a_checkpoint_path_that_is_a_directory_is_named_as_one() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("learn.toml");
    std::fs::write(
        &f,
        format!(
            "[robot]\nsource = \"sim\"\n\n[sim]\ntask = \"pick\"\n\n[policy]\nkind = \"none\"\n\n\
             [run]\nepisodes = 3\n\n[learner]\ncheckpoint = {:?}\n",
            dir.path()
        ),
    )
    .unwrap();
    let (ok, _, err) = run(&["run", "--no-multicast", "--config", f.to_str().unwrap()]);
    // Before: "cannot be read ... set on_bad_checkpoint = \"fresh\" to move it aside".
    assert!(!ok && err.contains("is a directory: name a file"), "{err}");
}

#[test]
fn policy_execute_in_a_run_config_replaces_the_specs_and_must_fit_the_chunk() {
    // The shipped pick policy predicts 16 actions and its spec executes 8 before the next
    // inference; `[policy] execute = 1` looks again every step: a chunk a tick.
    let dir = tempfile::tempdir().unwrap();
    let model = repo().join("models/pick.onnx");
    let base = std::fs::read_to_string(repo().join("configs/run/sim-pick-bc.toml"))
        .unwrap()
        .replace("../../models/pick.onnx", model.to_str().unwrap());
    let cfg = dir.path().join("run.toml");
    let run_with = |line: &str| {
        let text = base.replace("intra_threads = 1", &format!("intra_threads = 1\n{line}"));
        std::fs::write(&cfg, text).unwrap();
        run(&[
            "run",
            "--episodes",
            "3",
            "--json",
            "--config",
            cfg.to_str().unwrap(),
        ])
    };
    let figures = |out: &str| {
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        (v["chunks"].as_u64().unwrap(), v["ticks"].as_u64().unwrap())
    };
    let (ok, out, err) = run_with("");
    assert!(ok, "{err}");
    let (chunks, ticks) = figures(&out);
    // At most one chunk per 8 steps, and one more per episode for its start.
    assert!(
        chunks * 8 <= ticks + 8 * 3,
        "{chunks} chunks in {ticks} ticks"
    );
    let (ok, out, err) = run_with("execute = 1");
    assert!(ok, "{err}");
    let (chunks, ticks) = figures(&out);
    assert_eq!(chunks, ticks, "execute = 1 infers every step");
    for bad in ["execute = 17", "execute = 0"] {
        let (ok, _, err) = run_with(bad);
        assert!(!ok, "{bad} was accepted");
        assert!(
            err.contains(&format!("[policy] {bad}")) && err.contains("1 ..= 16"),
            "{err}"
        );
    }
}
