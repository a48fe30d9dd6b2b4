//! `reflex policy import lerobot` on checkpoints it must refuse: each refusal names the file or
//! feature at fault and what to do, exits 1, and leaves nothing at `--out`. All of it is decided
//! before the tools environment (torch) is needed, so these run without it; the export itself
//! and its parity with LeRobot are `make parity` (policies/import/parity.py).

use crate::common::reflex;
use std::path::{Path, PathBuf};

/// The files LeRobot 0.6.1 writes for an ACT policy on `pick`'s features (their JSON as
/// `save_pretrained` writes it, the weights and statistics as empty stand-ins: they are not read
/// before the export).
fn act_checkpoint(dir: &Path, camera_key: &str) -> PathBuf {
    let ckpt = dir.join("pretrained_model");
    std::fs::create_dir_all(&ckpt).unwrap();
    let config = serde_json::json!({
        "type": "act",
        "n_obs_steps": 1,
        "input_features": {
            "observation.state": {"type": "STATE", "shape": [32]},
            camera_key: {"type": "VISUAL", "shape": [3, 128, 128]},
        },
        "output_features": {"action": {"type": "ACTION", "shape": [4]}},
        "device": "cpu",
        "chunk_size": 100,
        "n_action_steps": 100,
        "normalization_mapping": {"VISUAL": "MEAN_STD", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"},
        "pretrained_backbone_weights": null,
    });
    std::fs::write(ckpt.join("config.json"), config.to_string()).unwrap();
    std::fs::write(ckpt.join("model.safetensors"), b"").unwrap();
    let pre = serde_json::json!({
        "name": "policy_preprocessor",
        "steps": [
            {"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
            {"registry_name": "to_batch_processor", "config": {}},
            {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": null}},
            {"registry_name": "normalizer_processor", "config": {"eps": 1e-8},
             "state_file": "policy_preprocessor_step_3_normalizer_processor.safetensors"},
        ]
    });
    let post = serde_json::json!({
        "name": "policy_postprocessor",
        "steps": [
            {"registry_name": "unnormalizer_processor", "config": {"eps": 1e-8},
             "state_file": "policy_postprocessor_step_0_unnormalizer_processor.safetensors"},
            {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": null}},
        ]
    });
    std::fs::write(ckpt.join("policy_preprocessor.json"), pre.to_string()).unwrap();
    std::fs::write(ckpt.join("policy_postprocessor.json"), post.to_string()).unwrap();
    for f in [
        "policy_preprocessor_step_3_normalizer_processor.safetensors",
        "policy_postprocessor_step_0_unnormalizer_processor.safetensors",
    ] {
        std::fs::write(ckpt.join(f), b"").unwrap();
    }
    ckpt
}

/// Runs the import of `ckpt` into `<dir>/models/act.onnx` with a tools environment that does not
/// exist (so reaching the export would try to make one: these refusals must come before);
/// returns its stderr after checking the exit status is 1 and `models/` holds nothing.
fn refused(dir: &Path, ckpt: &Path, extra: &[&str]) -> String {
    let models = dir.join("models");
    let out = reflex()
        .args(["policy", "import", "lerobot"])
        .arg(ckpt)
        .arg("--out")
        .arg(models.join("act.onnx"))
        .arg("--tools-env")
        .arg(dir.join("no-tools-env"))
        .args(extra)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    let left: Vec<_> = std::fs::read_dir(&models)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "files left at --out: {left:?}");
    assert!(
        !dir.join("no-tools-env").exists(),
        "a refusal started making the tools environment"
    );
    err
}

const PICK: [&str; 2] = ["--robot-kind", "sim/pick"];

#[test]
fn a_folder_that_is_not_a_lerobot_checkpoint_is_named_with_the_file_it_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let not = dir.path().join("some-folder");
    std::fs::create_dir_all(&not).unwrap();
    std::fs::write(not.join("weights.pt"), b"").unwrap();
    let err = refused(dir.path(), &not, &PICK);
    assert!(
        err.contains(&format!("{}", not.join("config.json").display()))
            && err.contains("not a LeRobot checkpoint")
            && err.contains("pretrained_model"),
        "{err}"
    );
    // A path that is no folder at all.
    let err = refused(dir.path(), &dir.path().join("nowhere"), &PICK);
    assert!(
        err.contains("nowhere") && err.contains("is not a folder"),
        "{err}"
    );
}

#[test]
fn an_unsupported_policy_type_is_refused_by_name_naming_config_json() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = act_checkpoint(dir.path(), "observation.images.front");
    let config = ckpt.join("config.json");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, text.replace("\"act\"", "\"pi0_fast\"")).unwrap();
    let err = refused(dir.path(), &ckpt, &PICK);
    assert!(
        err.contains(&config.display().to_string())
            && err.contains("policy type `pi0_fast` is not supported yet")
            && err.contains("act, diffusion, smolvla, pi0, pi05"),
        "{err}"
    );
}

#[test]
fn a_smolvla_without_an_instruction_or_with_settings_reflex_does_not_reproduce_is_refused() {
    // SmolVLA acts on a language instruction: without --task the import stops before any
    // environment is made, naming config.json and the option; settings the export does not
    // reproduce (LeRobot's empty cameras) are refused by name.
    let dir = tempfile::tempdir().unwrap();
    let ckpt = act_checkpoint(dir.path(), "observation.images.front");
    let config = ckpt.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    v["type"] = "smolvla".into();
    v["chunk_size"] = 50.into();
    v["n_action_steps"] = 50.into();
    std::fs::write(&config, v.to_string()).unwrap();
    let err = refused(dir.path(), &ckpt, &PICK);
    assert!(
        err.contains(&config.display().to_string())
            && err.contains("language instruction")
            && err.contains("--task"),
        "{err}"
    );
    v["empty_cameras"] = 1.into();
    std::fs::write(&config, v.to_string()).unwrap();
    let with_task = [PICK[0], PICK[1], "--task", "pick up the cube"];
    let err = refused(dir.path(), &ckpt, &with_task);
    assert!(
        err.contains(&config.display().to_string()) && err.contains("empty_cameras = 1"),
        "{err}"
    );
}

#[test]
fn a_pi0_without_an_instruction_or_with_settings_reflex_does_not_reproduce_is_refused() {
    // pi0 takes an instruction as SmolVLA does; bfloat16 weights (reflex runs and checks
    // float32) and openpi's relative actions are refused by name, before any environment.
    let dir = tempfile::tempdir().unwrap();
    let ckpt = act_checkpoint(dir.path(), "observation.images.front");
    let config = ckpt.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    v["type"] = "pi0".into();
    v["chunk_size"] = 50.into();
    v["n_action_steps"] = 50.into();
    v["dtype"] = "float32".into();
    std::fs::write(&config, v.to_string()).unwrap();
    let err = refused(dir.path(), &ckpt, &PICK);
    assert!(
        err.contains(&config.display().to_string())
            && err.contains("language instruction")
            && err.contains("--task"),
        "{err}"
    );
    let with_task = [PICK[0], PICK[1], "--task", "pick up the cube"];
    for (key, value, said) in [
        (
            "dtype",
            serde_json::json!("bfloat16"),
            "dtype = \"bfloat16\"",
        ),
        (
            "use_relative_actions",
            serde_json::json!(true),
            "use_relative_actions = true",
        ),
    ] {
        let mut w = v.clone();
        w[key] = value;
        std::fs::write(&config, w.to_string()).unwrap();
        let err = refused(dir.path(), &ckpt, &with_task);
        assert!(
            err.contains(&config.display().to_string())
                && err.contains(said)
                && err.contains("pi0 with n_obs_steps 1"),
            "{err}"
        );
    }
}

#[test]
fn a_diffusion_policy_with_a_sampler_or_history_reflex_does_not_reproduce_is_refused_by_its_setting()
 {
    // LeRobot's defaults (n_obs_steps 2, DDPM) import (policies/import/parity.py checks them
    // against LeRobot); a scheduler LeRobot itself does not build, or no observation step, is
    // refused before any environment is made, naming the file and the setting.
    let dir = tempfile::tempdir().unwrap();
    let ckpt = act_checkpoint(dir.path(), "observation.images.front");
    let config = ckpt.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    v["type"] = "diffusion".into();
    v["horizon"] = 16.into();
    v["n_action_steps"] = 8.into();
    v["n_obs_steps"] = 0.into();
    v["noise_scheduler_type"] = "DDPM".into();
    std::fs::write(&config, v.to_string()).unwrap();
    let err = refused(dir.path(), &ckpt, &PICK);
    assert!(
        err.contains(&config.display().to_string())
            && err.contains("n_obs_steps = 0")
            && err.contains("n_obs_steps 1-64"),
        "{err}"
    );
    v["n_obs_steps"] = 2.into();
    v["noise_scheduler_type"] = "DPMSolver".into();
    std::fs::write(&config, v.to_string()).unwrap();
    let err = refused(dir.path(), &ckpt, &PICK);
    assert!(
        err.contains("noise_scheduler_type = \"DPMSolver\"")
            && err.contains("\"DDPM\" or \"DDIM\""),
        "{err}"
    );
}

#[test]
fn a_missing_processor_or_statistics_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = act_checkpoint(dir.path(), "observation.images.front");
    let post = ckpt.join("policy_postprocessor.json");
    std::fs::remove_file(&post).unwrap();
    let err = refused(dir.path(), &ckpt, &PICK);
    assert!(
        err.contains(&post.display().to_string()) && err.contains("missing"),
        "{err}"
    );
    // The statistics a pipeline names.
    let dir = tempfile::tempdir().unwrap();
    let ckpt = act_checkpoint(dir.path(), "observation.images.front");
    let stats = ckpt.join("policy_preprocessor_step_3_normalizer_processor.safetensors");
    std::fs::remove_file(&stats).unwrap();
    let err = refused(dir.path(), &ckpt, &PICK);
    assert!(
        err.contains(&stats.display().to_string()) && err.contains("policy_preprocessor.json"),
        "{err}"
    );
}

#[test]
fn a_feature_the_robot_lacks_is_named_with_the_map_that_fixes_it() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = act_checkpoint(dir.path(), "observation.images.top");
    let err = refused(dir.path(), &ckpt, &PICK);
    assert!(
        err.contains("observation.images.top")
            && err.contains("camera `top`")
            && err.contains("front")
            && err.contains("--map observation.images.top="),
        "{err}"
    );
    // Mapped onto a camera the robot does not have either, or a state field it lacks.
    let err = refused(
        dir.path(),
        &ckpt,
        &[&PICK[..], &["--map", "observation.images.top=side"]].concat(),
    );
    assert!(err.contains("camera `side`"), "{err}");
    let err = refused(
        dir.path(),
        &ckpt,
        &[
            &PICK[..],
            &[
                "--map",
                "observation.images.top=front",
                "--map",
                "observation.state=joint_pos,elbow_torque",
            ],
        ]
        .concat(),
    );
    assert!(
        err.contains("observation.state") && err.contains("`elbow_torque`"),
        "{err}"
    );
    // A state of another size than the robot's, and a map naming no feature of the checkpoint.
    let err = refused(
        dir.path(),
        &ckpt,
        &[
            &PICK[..],
            &[
                "--map",
                "observation.images.top=front",
                "--map",
                "observation.state=joint_pos",
            ],
        ]
        .concat(),
    );
    assert!(
        err.contains("observation.state") && err.contains("hold 6 values"),
        "{err}"
    );
    let err = refused(
        dir.path(),
        &ckpt,
        &[&PICK[..], &["--map", "observation.images.side=front"]].concat(),
    );
    assert!(
        err.contains("no input feature `observation.images.side`"),
        "{err}"
    );
    // A robot whose action has another size: its spec as `reflex sim spec` prints it, less one
    // action component.
    let spec = crate::common::run_ok(reflex().args(["sim", "spec", "--task", "pick", "--cameras"]));
    let mut robot: serde_json::Value = serde_json::from_slice(&spec.stdout).unwrap();
    for k in ["names", "low", "high"] {
        robot["action"][k].as_array_mut().unwrap().pop();
    }
    let robot_file = dir.path().join("robot.json");
    std::fs::write(&robot_file, robot.to_string()).unwrap();
    let err = refused(
        dir.path(),
        &ckpt,
        &[
            "--robot-spec",
            robot_file.to_str().unwrap(),
            "--map",
            "observation.images.top=front",
        ],
    );
    assert!(
        err.contains("`action` has 4 components") && err.contains("takes 3"),
        "{err}"
    );
}

#[test]
fn an_out_that_is_not_an_onnx_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = act_checkpoint(dir.path(), "observation.images.front");
    let out = reflex()
        .args(["policy", "import", "lerobot"])
        .arg(&ckpt)
        .arg("--out")
        .arg(dir.path().join("models/act.policy"))
        .args(PICK)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--out") && err.contains("NAME.onnx"), "{err}");
    assert!(!dir.path().join("models").exists());
}

/// parity.py compares LeRobot's chunks with what `reflex policy infer` prints for the same
/// observations: its output must be the chunk the policy computes, the same for the same noise.
#[test]
fn policy_infer_prints_one_chunk_per_observation_the_same_for_the_same_noise() {
    let dir = tempfile::tempdir().unwrap();
    let model = crate::common::repo().join("models/pick.onnx");
    let obs =
        |noise: f32| serde_json::json!({"state": vec![0.01f32; 32], "noise": vec![noise; 16 * 4]});
    let file = dir.path().join("obs.json");
    std::fs::write(
        &file,
        serde_json::json!({"observations": [obs(0.5), obs(-0.5), obs(0.5)]}).to_string(),
    )
    .unwrap();
    let v = crate::common::json_output(
        reflex()
            .args(["policy", "infer", "--model"])
            .arg(&model)
            .arg("--observations")
            .arg(&file)
            .args(["--warmup", "0", "--repeat", "2"]),
    );
    let chunks = v["chunks"].as_array().unwrap();
    assert_eq!(chunks.len(), 3);
    assert_eq!(chunks[0].as_array().unwrap().len(), 16);
    assert_eq!(chunks[0][0].as_array().unwrap().len(), 4);
    assert_eq!(chunks[0], chunks[2], "the same observation and noise");
    assert_ne!(chunks[0], chunks[1], "other noise, another chunk");
    assert!(v["chunk_us"][0].as_f64().unwrap() > 0.0);
    // A state of the wrong size is named by its place in the file.
    std::fs::write(
        &file,
        serde_json::json!({"observations": [{"state": [0.0, 1.0]}]}).to_string(),
    )
    .unwrap();
    let out = reflex()
        .args(["policy", "infer", "--model"])
        .arg(&model)
        .arg("--observations")
        .arg(&file)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("observation 0") && err.contains("state has 2 values"),
        "{err}"
    );
    // `past` observations are checked like the one inferred on, and must be as many as the
    // policy reads (none for this one).
    let infer_err = |body: serde_json::Value| {
        std::fs::write(&file, body.to_string()).unwrap();
        let out = reflex()
            .args(["policy", "infer", "--model"])
            .arg(&model)
            .arg("--observations")
            .arg(&file)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let good = vec![0.01f32; 32];
    let err = infer_err(serde_json::json!({"observations": [
        {"state": good, "past": [{"state": [0.0]}]}]}));
    assert!(err.contains("past state has 1 values"), "{err}");
    let err = infer_err(serde_json::json!({"observations": [
        {"state": good, "past": [{"state": good}]}]}));
    assert!(
        err.contains("`past` holds 1 observations; the policy reads 0"),
        "{err}"
    );
}
