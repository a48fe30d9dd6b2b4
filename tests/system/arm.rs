//! `reflex run` on an SO-101 through its servo bus, the way docs/hardware.md says to try it
//! without an arm: `reflex hw emulate` in one process, `reflex run` with the shipped
//! configs/run/so101-emulated.toml (its port pointed at the emulator) in another.

use crate::common::{ChildGuard, reflex, repo};
use std::io::BufRead;

/// Starts `reflex hw emulate --robot so101-follower` with `extra` arguments, linked at a path in
/// `dir`; returns the process and the link.
fn emulator(dir: &tempfile::TempDir, extra: &[&str]) -> (ChildGuard, std::path::PathBuf) {
    let link = dir.path().join("so101");
    let mut c = reflex();
    c.args([
        "hw",
        "emulate",
        "--robot",
        "so101-follower",
        "--seconds",
        "300",
    ])
    .arg("--link")
    .arg(&link)
    .args(extra)
    .stdout(std::process::Stdio::piped());
    let mut child = ChildGuard(c.spawn().unwrap());
    let mut line = String::new();
    std::io::BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("linked from"), "emulator said {line:?}");
    (child, link)
}

/// The shipped config with its port at `port`, its model found from `dir`, and `[arm]` edits.
fn config(
    dir: &tempfile::TempDir,
    port: &std::path::Path,
    edits: &[(&str, &str)],
) -> std::path::PathBuf {
    let mut text = std::fs::read_to_string(repo().join("configs/run/so101-emulated.toml")).unwrap();
    text = text.replace(
        "port = \"/tmp/reflex-so101\"",
        &format!("port = \"{}\"", port.display()),
    );
    text = text.replace(
        "model = \"../../models/so101-reach.onnx\"",
        &format!(
            "model = \"{}\"",
            repo().join("models/so101-reach.onnx").display()
        ),
    );
    for (from, to) in edits {
        assert!(text.contains(from), "the shipped config has no `{from}`");
        text = text.replace(from, to);
    }
    let p = dir.path().join("so101.toml");
    std::fs::write(&p, text).unwrap();
    p
}

fn run_json(cfg: &std::path::Path, episodes: u64) -> Result<serde_json::Value, String> {
    let out = reflex()
        .args([
            "run",
            "--json",
            "--episodes",
            &episodes.to_string(),
            "--config",
        ])
        .arg(cfg)
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).to_string());
    }
    Ok(serde_json::from_slice(&out.stdout).unwrap())
}

#[test]
fn reflex_run_drives_the_emulated_so101_at_50_hz_with_the_shipped_policy_and_no_missed_read() {
    let dir = tempfile::tempdir().unwrap();
    let (_emu, link) = emulator(&dir, &[]);
    // A faster move to each start pose than a real arm should use keeps the test short.
    let cfg = config(
        &dir,
        &link,
        &[("start_speed_rad_s = 0.5", "start_speed_rad_s = 3.0")],
    );
    let v = run_json(&cfg, 70).unwrap_or_else(|e| panic!("reflex run failed: {e}"));
    let arm = &v["arm"];
    eprintln!(
        "ticks {} missed {} overruns {} lateness p99 {} us, success {}, arm {arm}",
        v["ticks"], v["missed"], v["overruns"], v["lateness_p99_us"], v["success_rate"]
    );
    assert!(v["ticks"].as_u64().unwrap() >= 1000, "{v}");
    assert_eq!(arm["missed_reads"], 0, "{arm}");
    assert_eq!(arm["failed_writes"], 0, "{arm}");
    assert_eq!(v["missed"], 0, "no control tick missed: {v}");
    assert!(arm["reads"].as_u64().unwrap() >= 1000, "{arm}");
    let (p50, p99) = (
        arm["read_p50_us"].as_f64().unwrap(),
        arm["read_p99_us"].as_f64().unwrap(),
    );
    assert!(p50 > 0.0 && p50 <= p99, "{arm}");
    // The policy was trained on the simulated arm only; the emulated servos follow their goals,
    // so it reaches its targets here too.
    assert!(
        v["success_rate"].as_f64().unwrap() >= 0.8,
        "the sim-trained reach policy on the emulated arm: {}",
        v["success_rate"]
    );
}

#[test]
fn corrupt_answers_are_retried_without_a_missed_read() {
    let dir = tempfile::tempdir().unwrap();
    let (_emu, link) = emulator(&dir, &["--corrupt-every", "25"]);
    let cfg = config(
        &dir,
        &link,
        &[("start_speed_rad_s = 0.5", "start_speed_rad_s = 3.0")],
    );
    let v = run_json(&cfg, 4).unwrap_or_else(|e| panic!("reflex run failed: {e}"));
    let arm = &v["arm"];
    assert!(arm["corrupt"].as_u64().unwrap() > 0, "{arm}");
    assert!(arm["retries"].as_u64().unwrap() > 0, "{arm}");
    assert_eq!(
        arm["missed_reads"], 0,
        "the retries absorbed every corrupt answer: {arm}"
    );
    assert_eq!(v["episodes"], 4, "{v}");
}

#[test]
fn a_silent_servo_stops_reflex_run_with_an_error_naming_the_motor_its_id_and_the_port() {
    let dir = tempfile::tempdir().unwrap();
    let (_emu, link) = emulator(&dir, &["--silent", "3"]);
    let cfg = config(&dir, &link, &[]);
    let t0 = std::time::Instant::now();
    let err = run_json(&cfg, 1).expect_err("the run must not start with a servo missing");
    assert!(
        err.contains("elbow_flex")
            && err.contains("id 3")
            && err.contains(&link.display().to_string()),
        "{err}"
    );
    assert!(t0.elapsed().as_secs() < 30, "it failed fast");
}
