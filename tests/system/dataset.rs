//! Datasets out and in: a LeRobotDataset v3.0 export checked the way LeRobot's loader reads it
//! (tests/system/check_lerobot_dataset.py), and a base policy trained from the export against one
//! trained from reflex's own episode format on the same episodes.

use crate::common::{python, reflex, repo};
use std::path::Path;

/// What the checker says about the dataset at `dir` (it fails the test with its reason).
pub fn check_lerobot(dir: &Path) -> serde_json::Value {
    crate::common::json_output(
        std::process::Command::new(python())
            .arg(repo().join("tests/system/check_lerobot_dataset.py"))
            .arg(dir),
    )
}

/// The checker, comparing every decoded video frame with the episodes at `demos`.
fn check_lerobot_frames(dir: &Path, demos: &Path) -> serde_json::Value {
    crate::common::json_output(
        std::process::Command::new(python())
            .arg(repo().join("tests/system/check_lerobot_dataset.py"))
            .arg(dir)
            .arg("--demos")
            .arg(demos),
    )
}

/// `reflex eval --json` of `model` alone on the pick task, `episodes` held-out episodes, the
/// `[sim]` table given `sim_extra` (e.g. the cameras a policy that sees needs).
fn eval_pick(model: &Path, dir: &Path, sim_extra: &str, episodes: u32) -> serde_json::Value {
    let cfg = dir.join(format!(
        "{}.toml",
        model
            .parent()
            .unwrap()
            .file_name()
            .unwrap()
            .to_string_lossy()
    ));
    std::fs::write(
        &cfg,
        format!(
            "[robot]\nsource = \"sim\"\n[sim]\ntask = \"pick\"\n{sim_extra}[policy]\nkind = \"onnx\"\nmodel = {:?}\n[run]\nseed = 5\n",
            model.display().to_string()
        ),
    )
    .unwrap();
    crate::common::json_output(reflex().current_dir(repo()).args([
        "eval",
        "--config",
        cfg.to_str().unwrap(),
        "--episodes",
        &episodes.to_string(),
        "--json",
    ]))
}

/// Success rate of `model` alone on the pick task, 20 held-out episodes.
fn success_of(model: &Path, dir: &Path) -> f64 {
    let v = eval_pick(model, dir, "", 20);
    assert_eq!(v["takeovers"], 0, "{v}");
    v["success_rate"].as_f64().unwrap()
}

#[test]
fn an_exported_lerobot_dataset_loads_as_lerobot_reads_it_and_trains_the_same_policy() {
    let dir = tempfile::tempdir().unwrap();
    let (demos, ds) = (dir.path().join("demos"), dir.path().join("ds"));
    crate::common::run_ok(
        reflex()
            .current_dir(repo())
            .args([
                "sim",
                "demos",
                "--task",
                "pick",
                "--episodes",
                "12",
                "--noise",
                "0.2",
            ])
            .args(["--seed", "1", "--out"])
            .arg(&demos),
    );
    let e = crate::common::json_output(
        reflex()
            .args([
                "dataset", "export", "--format", "lerobot", "--json", "--demos",
            ])
            .arg(&demos)
            .arg("--out")
            .arg(&ds),
    );
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(demos.join("manifest.json")).unwrap()).unwrap();
    let steps: u64 = manifest["episodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["steps"].as_u64().unwrap())
        .sum();
    assert_eq!(e["episodes"], 12, "{e}");
    assert_eq!(e["frames"], steps, "{e}");
    let c = check_lerobot(&ds);
    assert_eq!(c["frames"], steps, "{c}");
    assert_eq!(c["robot_type"], "sim/pick", "{c}");
    assert_eq!(c["task"], "sim/pick", "{c}");
    // An integer, as LeRobot writes it (its writer hands it to PyAV, which refuses a float).
    assert!(c["fps"].is_u64() && c["fps"] == 20, "{c}");
    // Exporting into a directory that holds something is refused (nothing is overwritten).
    let again = reflex()
        .args(["dataset", "export", "--demos"])
        .arg(&demos)
        .arg("--out")
        .arg(&ds)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(
        !again.status.success() && err.contains("not empty"),
        "{err}"
    );
    // The same episodes through both readers: the same samples, the same network bit for bit,
    // and so the same success.
    let (a, b) = (
        dir.path().join("a/pick.onnx"),
        dir.path().join("b/pick.onnx"),
    );
    for (flag, src, model) in [("--demos", &demos, &a), ("--dataset", &ds, &b)] {
        let out = reflex()
            .current_dir(repo())
            .args(["bc", "train", flag])
            .arg(src)
            .arg("--out")
            .arg(model)
            .args(["--steps", "300", "--seed", "1"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{flag}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(
        std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(),
        "the policy trained from the LeRobot export differs from the one trained from reflex's format"
    );
    let (sa, sb) = (success_of(&a, dir.path()), success_of(&b, dir.path()));
    eprintln!(
        "success alone, 20 episodes: from reflex's format {sa}, from the LeRobot export {sb}"
    );
    assert!(sb >= sa, "{sb} < {sa}");
    // A feature the dataset does not have is named, with the ones it has.
    let out = reflex()
        .args(["bc", "train", "--dataset"])
        .arg(&ds)
        .args(["--state-key", "observation.joints", "--out"])
        .arg(dir.path().join("c/pick.onnx"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("observation.joints")
            && err.contains("observation.state"),
        "{err}"
    );
}

/// `reflex bc train --dataset DS --camera front --json` (a short run) writing `model`; its
/// report names what it wrote.
fn train_seeing(ds: &Path, model: &Path) {
    let out = crate::common::run_ok(
        reflex()
            .current_dir(repo())
            .args(["bc", "train", "--dataset"])
            .arg(ds)
            .args([
                "--camera", "front", "--steps", "30", "--batch", "16", "--seed", "1", "--json",
            ])
            .arg("--out")
            .arg(model),
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["model"].as_str(), model.to_str(), "{r}");
    assert!(
        r["encoder"]
            .as_str()
            .is_some_and(|e| std::path::Path::new(e).exists()),
        "{r}"
    );
    assert!(r["final_loss"].as_f64().is_some_and(f64::is_finite), "{r}");
}

/// Copies a directory tree.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

#[test]
fn camera_frames_export_as_video_lerobot_decodes_and_policies_that_see_train_from_h264_and_av1() {
    let dir = tempfile::tempdir().unwrap();
    let (demos, ds) = (dir.path().join("demos"), dir.path().join("ds"));
    crate::common::run_ok(
        reflex()
            .args(["sim", "demos", "--task", "pick", "--episodes", "6"])
            .args(["--cameras", "--camera-size", "64x48", "--noise", "0.2"])
            .args(["--seed", "1", "--out"])
            .arg(&demos),
    );
    let e = crate::common::json_output(
        reflex()
            .args(["dataset", "export", "--json", "--demos"])
            .arg(&demos)
            .arg("--out")
            .arg(&ds),
    );
    assert_eq!(e["video_files"], 2, "{e}");
    let features = e["features"].to_string();
    assert!(
        features.contains("observation.images.front")
            && features.contains("observation.images.wrist"),
        "{e}"
    );
    // Decoded by PyAV as LeRobot's pyav backend does: every row's frame found within 1e-4 s of
    // from_timestamp + timestamp, and close to the frame reflex recorded.
    let c = check_lerobot_frames(&ds, &demos);
    for key in ["observation.images.front", "observation.images.wrist"] {
        let v = &c["videos"][key];
        assert_eq!(v["frames"], e["frames"], "{c}");
        assert_eq!(v["codec"], "h264", "{c}");
        assert_eq!(v["shape"], serde_json::json!([48, 64, 3]), "{c}");
        let diff = v["worst_mean_abs_diff"].as_f64().unwrap();
        eprintln!("{key}: worst frame's mean difference from the recording {diff:.2} levels");
        // Measured 5.2 (front) and 4.1 (wrist) levels at OpenH264's quantiser 26 on 64x48 frames.
        assert!(diff < 8.0, "{key}: {diff} levels: {c}");
    }
    // A policy that sees, trained from the dataset's video (reflex decodes it itself), runs on
    // the simulator's cameras.
    let model = dir.path().join("seeing/pick.onnx");
    train_seeing(&ds, &model);
    let spec = std::fs::read_to_string(model.with_extension("policy.toml")).unwrap();
    assert!(
        spec.contains("source = \"image\"")
            && spec.contains("camera = \"front\"")
            && spec.contains("LeRobot dataset"),
        "{spec}"
    );
    let v = eval_pick(
        &model,
        dir.path(),
        "[sim.cameras]\nenabled = true\nwidth = 64\nheight = 48\n",
        2,
    );
    assert_eq!(v["episodes"], 2, "{v}");
    // The same dataset as LeRobot writes it by default, its videos AV1 (libsvtav1): LeRobot's
    // reading of it still holds, and reflex decodes it itself to train the same kind of policy.
    let av1 = dir.path().join("ds-av1");
    copy_dir(&ds, &av1);
    let r = crate::common::json_output(
        std::process::Command::new(python())
            .arg(repo().join("tests/system/reencode_av1.py"))
            .arg(&av1),
    );
    assert_eq!(r["files"], 2, "{r}");
    let c = check_lerobot_frames(&av1, &demos);
    for key in ["observation.images.front", "observation.images.wrist"] {
        let v = &c["videos"][key];
        assert_eq!(
            (&v["frames"], &v["codec"]),
            (&e["frames"], &"av1".into()),
            "{c}"
        );
        let diff = v["worst_mean_abs_diff"].as_f64().unwrap();
        eprintln!(
            "{key} as AV1: worst frame's mean difference from the recording {diff:.2} levels"
        );
        assert!(diff < 10.0, "{key}: {diff} levels: {c}");
    }
    let av1_model = dir.path().join("seeing-av1/pick.onnx");
    train_seeing(&av1, &av1_model);
    assert!(av1_model.is_file());
    // A camera the dataset has no video of is named with the ones it has.
    let out = reflex()
        .args(["bc", "train", "--dataset"])
        .arg(&ds)
        .args(["--camera", "side", "--steps", "1", "--out"])
        .arg(dir.path().join("x.onnx"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("`side`") && err.contains("observation.images.front"),
        "{err}"
    );
}
