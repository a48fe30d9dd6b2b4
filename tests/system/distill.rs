//! `reflex distill` through the binary: a demo run's refined policy made into a new base.

use crate::common::{reflex, repo};
use reflex_policies::spec::{PolicyKind, PolicySpec};

/// `reflex distill --run RUN --out OUT --json` with a small network and `eval` held-out episodes,
/// and `extra`; its report.
fn distil_small(
    run: &std::path::Path,
    out: &std::path::Path,
    eval: &str,
    extra: &[&str],
) -> serde_json::Value {
    let o = reflex()
        .current_dir(repo())
        .args(["distill", "--run"])
        .arg(run)
        .arg("--out")
        .arg(out)
        .args(["--steps", "30", "--batch", "32", "--hidden", "32"])
        .args(["--eval-episodes", eval, "--json"])
        .args(extra)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn a_demo_runs_refined_policy_is_distilled_into_a_base_of_the_same_shape_and_judged_alone() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let o = reflex()
        .current_dir(repo())
        .args([
            "demo",
            "--episodes",
            "6",
            "--demos",
            "2",
            "--eval-episodes",
            "0",
        ])
        .args(["--json", "--runs"])
        .arg(&runs)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let run = std::path::PathBuf::from(summary["run_dir"].as_str().unwrap());
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("steps/manifest.json")).unwrap()).unwrap();
    let episodes = manifest["episodes"].as_array().unwrap();
    let successes = episodes.iter().filter(|e| e["success"] == true).count();
    assert!(
        successes > 0,
        "the person's demonstrations succeed: {manifest}"
    );
    let out = dir.path().join("pick-distilled.onnx");
    let distil = |extra: &[&str]| distil_small(&run, &out, "3", extra);
    let r = distil(&[]);
    assert_eq!(r["episodes_used"], successes, "{r}");
    // By default the policy's steps before a person took over are left out: in each successful
    // episode, every policy step before the last takeover (a person's step after a policy's).
    let steps = run.join("steps");
    let log = reflex_data::demos::read_manifest(&steps).unwrap();
    let before_takeovers: usize = log
        .episodes
        .iter()
        .filter(|e| e.success)
        .map(|e| {
            let a = reflex_data::demos::read_episode(&steps, e).unwrap().actors;
            let last = (1..a.len()).rev().find(|&t| a[t] == 1 && a[t - 1] == 0);
            last.map_or(0, |t| a[..t].iter().filter(|x| **x == 0).count())
        })
        .sum();
    assert!(
        before_takeovers > 0,
        "the run has a success the person took over: {manifest}"
    );
    assert_eq!(r["steps_skipped_before_takeover"], before_takeovers, "{r}");
    // The training itself had that many fewer samples (one per step; the model's provenance
    // says how many it trained on).
    let samples = || -> usize {
        let p = PolicySpec::load_for(&out).unwrap().provenance.unwrap();
        let head = p.rsplit_once(" samples;").unwrap().0;
        head.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let fewer = samples();
    let all_steps = distil(&["--skip-before-takeover", "0"]);
    assert_eq!(all_steps["steps_skipped_before_takeover"], 0, "{all_steps}");
    assert_eq!(samples() - fewer, before_takeovers);
    assert_eq!(r["episodes_in_run"], episodes.len(), "{r}");
    assert_eq!(r["held_out"]["episodes"], 3, "{r}");
    assert_eq!(r["held_out"]["takeovers"], 0, "{r}");
    assert_eq!(r["seeds_seen_in_distillation"], 0, "held out: {r}");
    assert!(r["person_steps"].as_u64().unwrap() > 0, "{r}");
    // The same architecture as the base, with where it came from.
    let base = PolicySpec::load_for(&repo().join("models/pick.onnx")).unwrap();
    let spec = PolicySpec::load_for(&out).unwrap();
    assert_eq!(spec.kind, PolicyKind::Diffusion);
    assert_eq!(
        (spec.chunk_len, spec.execute, spec.action_dim),
        (base.chunk_len, base.execute, base.action_dim)
    );
    let provenance = spec.provenance.unwrap();
    assert!(
        provenance.contains("reflex distill") && provenance.contains(run.to_str().unwrap()),
        "{provenance}"
    );
    // Every episode, failed ones too.
    let r = distil(&["--all-episodes"]);
    assert_eq!(r["episodes_used"], episodes.len(), "{r}");
    // As a flow policy executing 4 a chunk, the way docs/training.md distils: its VJP graph is
    // written beside it.
    distil(&["--objective", "flow", "--execute", "4"]);
    let flow = PolicySpec::load_for(&out).unwrap();
    assert_eq!(flow.kind, PolicyKind::Flow);
    assert_eq!((flow.chunk_len, flow.execute), (base.chunk_len, 4));
    assert!(reflex_policies::spec::vjp_path_for(&out).is_file());
    assert_eq!(
        flow.graph.vjp.map(|v| v.file),
        Some("pick-distilled.vjp.onnx".to_string())
    );
    // Two candidates judged on a validation stream apart from the held-out one; the kept one's
    // files stay at --out, the others' go.
    let r = distil(&[
        "--objective",
        "flow",
        "--execute",
        "4",
        "--candidates",
        "2",
        "--validation-episodes",
        "2",
    ]);
    let cands = r["candidates"].as_array().unwrap();
    assert_eq!(cands.len(), 2, "{r}");
    assert_eq!(
        (cands[0]["seed"].as_u64(), cands[1]["seed"].as_u64()),
        (Some(0), Some(1))
    );
    let wins: Vec<u64> = cands
        .iter()
        .map(|c| {
            assert_eq!(c["validation"]["episodes"], 2, "{r}");
            assert_eq!(c["validation"]["takeovers"], 0, "{r}");
            c["validation"]["successes"].as_u64().unwrap()
        })
        .collect();
    let kept = if wins[1] > wins[0] { 1 } else { 0 };
    assert_eq!(
        r["seed"], kept,
        "the first candidate with the most successes: {r}"
    );
    assert!(r["validation_seed"].is_u64(), "{r}");
    assert_eq!(r["held_out"]["episodes"], 3, "{r}");
    assert!(
        !out.with_extension("candidate").exists(),
        "the stash is gone"
    );
    assert_eq!(PolicySpec::load_for(&out).unwrap().kind, PolicyKind::Flow);
    // The new base runs as a base: a run config that names it.
    let cfg = dir.path().join("run.toml");
    std::fs::write(
        &cfg,
        format!(
            "[robot]\nsource = \"sim\"\n[sim]\ntask = \"pick\"\n[policy]\nkind = \"onnx\"\nmodel = {:?}\n[run]\nepisodes = 1\nseed = 2\n",
            out.display()
        ),
    )
    .unwrap();
    let o = reflex()
        .args(["run", "--json", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn distilling_a_folder_that_is_not_a_run_says_what_a_run_is() {
    let dir = tempfile::tempdir().unwrap();
    let o = reflex()
        .args(["distill", "--run"])
        .arg(dir.path())
        .arg("--out")
        .arg(dir.path().join("x.onnx"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("refined.toml") && err.contains(dir.path().to_str().unwrap()),
        "{err}"
    );
    assert!(!dir.path().join("x.onnx").exists());
}

#[test]
fn insert_goes_through_round_one_distillation_and_round_two_with_the_gripper_left_to_the_base() {
    // docs/training.md, "The demo on insert": the three commands, small.
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let demo = |extra: &[&str]| {
        let o = reflex()
            .current_dir(repo())
            .args([
                "demo",
                "--task",
                "insert",
                "--episodes",
                "2",
                "--demos",
                "1",
            ])
            .args(["--json", "--runs"])
            .arg(&runs)
            .args(extra)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let r1 = demo(&["--eval-episodes", "0"]);
    assert!(r1["takeover_reasons"]["slipping"].is_u64(), "{r1}");
    let run = std::path::PathBuf::from(r1["run_dir"].as_str().unwrap());
    // The residual leaves insert's gripper alone: its bound there is 0.
    let residual = std::fs::read_to_string(run.join("residual.policy.toml")).unwrap();
    let table: toml::Table = residual.parse().unwrap();
    let scales: Vec<f64> = table["action_scales"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_float().unwrap())
        .collect();
    assert_eq!(scales, [0.5, 0.5, 0.5, 0.0], "{residual}");
    let out = dir.path().join("insert-distilled.onnx");
    let d = distil_small(&run, &out, "2", &["--objective", "flow", "--execute", "4"]);
    assert_eq!(d["held_out"]["episodes"], 2, "{d}");
    assert_eq!(PolicySpec::load_for(&out).unwrap().kind, PolicyKind::Flow);
    // Round 2 on the distilled base, with the shipped next-round settings, keeps the task and
    // names the new base; the residual's provenance names the settings file.
    let next = repo().join("configs/demo/next-round.toml");
    let r2 = demo(&[
        "--model",
        out.to_str().unwrap(),
        "--eval-episodes",
        "2",
        "--config",
        next.to_str().unwrap(),
    ]);
    assert_eq!(r2["held_out"]["episodes"], 2, "{r2}");
    let refined = std::fs::read_to_string(r2["refined_config"].as_str().unwrap()).unwrap();
    assert!(refined.contains("task = \"insert\""), "{refined}");
    assert!(refined.contains("insert-distilled.onnx"), "{refined}");
    let run2 = std::path::PathBuf::from(r2["run_dir"].as_str().unwrap());
    let residual = std::fs::read_to_string(run2.join("residual.policy.toml")).unwrap();
    assert!(
        residual.contains("--task insert")
            && residual.contains("insert-distilled.onnx")
            && residual.contains("next-round.toml"),
        "{residual}"
    );
}
