//! `reflex demo` runs end to end and leaves its run directory behind. (It does not yet show the
//! promised lift on `pick`; docs/training.md states the measured figures. This test pins what
//! works: the pipeline, the files, the JSON.)

use crate::common::{reflex, repo};

#[test]
fn demo_runs_end_to_end_and_writes_its_summary_and_curve() {
    let dir = tempfile::tempdir().unwrap();
    let out = reflex()
        .current_dir(repo())
        .args(["demo", "--episodes", "6", "--json", "--runs"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["episodes"], 6);
    // One update per environment step from the 256th step on (the warm-up).
    let (steps, updates) = (
        v["env_steps"].as_u64().unwrap(),
        v["updates"].as_u64().unwrap(),
    );
    assert_eq!(updates, steps.saturating_sub(255), "{v}");
    let run = std::path::PathBuf::from(v["run_dir"].as_str().unwrap());
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["episodes"].as_array().unwrap().len(), 6);
    let png = std::fs::read(run.join("learning_curve.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    // Recordings: one per episode, and the learning curves.
    assert!(run.join("learning.rrd").is_file());
    let rrd = std::fs::read_dir(run.join("episodes"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "rrd")
        })
        .count();
    assert_eq!(rrd, 6);
}

#[test]
fn a_partial_learner_table_keeps_the_demos_other_settings() {
    let dir = tempfile::tempdir().unwrap();
    // Only the update-to-data ratio changes; the warm-up (256) stays the demo's, not SAC's own.
    let cfg = dir.path().join("demo.toml");
    std::fs::write(&cfg, "[learner]\nutd = 2\n").unwrap();
    let out = reflex()
        .current_dir(repo())
        .args(["demo", "--episodes", "4", "--json", "--no-record", "--runs"])
        .arg(dir.path())
        .arg("--config")
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (steps, updates) = (
        v["env_steps"].as_u64().unwrap(),
        v["updates"].as_u64().unwrap(),
    );
    assert_eq!(updates, 2 * steps.saturating_sub(255), "{v}");
    // An unknown key is refused, naming it.
    std::fs::write(&cfg, "[learner]\nutd_ratio = 2\n").unwrap();
    let out = reflex()
        .current_dir(repo())
        .args(["demo", "--episodes", "1", "--no-record", "--runs"])
        .arg(dir.path())
        .arg("--config")
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("utd_ratio"), "{err}");
}
