//! Guided real-time chunking on a flow policy: the VJP graph reflex exports beside a flow model
//! against finite differences of the network, and the sampler the policy picks with and without
//! it (Black, Galliker and Levine 2025, arXiv 2506.07339; `reflex_policies::rtc`).

use reflex_bench::workloads::NullRobot;
use reflex_imitate::{Denoiser, DenoiserShape};
use reflex_policies::onnx_policy::{OnnxPolicy, RunOptions};
use reflex_policies::rtc::{RtcConfig, RtcVariant};
use reflex_policies::spec::{
    GraphIo, InputSpec, Normalize, PolicyKind, PolicySpec, VjpGraph, spec_path, vjp_path_for,
};
use reflex_runtime::msg::Observation;
use reflex_runtime::policy::{ChunkPrefix, Policy};
use reflex_runtime::robot::Robot;
use std::path::{Path, PathBuf};

const T: usize = 8;
const A: usize = 4;
const OBS: usize = 8;

fn flow_net(seed: u64) -> Denoiser {
    Denoiser::new(
        DenoiserShape {
            obs_dim: OBS,
            action_dim: A,
            horizon: T,
            hidden: 32,
            layers: 3,
            temb: 16,
        },
        seed,
    )
    .unwrap()
    .into_flow()
    .unwrap()
}

fn flow_spec(vjp: bool) -> PolicySpec {
    PolicySpec {
        format: "reflex-policy".into(),
        version: 1,
        name: "flow".into(),
        kind: PolicyKind::Flow,
        action_dim: A,
        chunk_len: T,
        execute: T / 2,
        first_action: 0,
        model_action_dim: None,
        robot_kind: None,
        action_normalize: Normalize::None,
        graph: GraphIo {
            sample_input: Some("noisy_actions".into()),
            time_input: Some("timestep".into()),
            output: "velocity".into(),
            vjp: vjp.then(|| VjpGraph {
                file: "flow.vjp.onnx".into(),
                cotangent_input: "cotangent".into(),
                output: "vjp".into(),
            }),
            ..Default::default()
        },
        inputs: vec![InputSpec::State {
            name: "obs".into(),
            fields: vec![],
            history: 1,
            normalize: Normalize::None,
        }],
        diffusion: None,
        flow_steps: 10,
        provenance: None,
    }
}

/// Writes the model, its VJP graph and its spec (naming the VJP graph when `vjp`).
fn write(dir: &Path, net: &Denoiser, vjp: bool) -> PathBuf {
    let p = dir.join("flow.onnx");
    std::fs::write(&p, net.to_onnx().unwrap()).unwrap();
    std::fs::write(vjp_path_for(&p), net.to_onnx_vjp().unwrap()).unwrap();
    std::fs::write(spec_path(&p), flow_spec(vjp).to_toml()).unwrap();
    p
}

fn observation(seed: u64) -> Observation {
    Observation {
        state: (0..OBS)
            .map(|i| ((i as u64 * 7 + seed) as f32 * 0.37).sin() * 0.8)
            .collect(),
        ..Default::default()
    }
}

/// `e . f(x)`, `f` the network's output at `x` (candle).
fn projected(net: &Denoiser, x: &[f32], t: f32, obs: &[f32], e: &[f32]) -> f64 {
    use candle_core::{Device, Tensor};
    let d = Device::Cpu;
    let out = net
        .forward(
            &Tensor::from_slice(x, (1, T, A), &d).unwrap(),
            &Tensor::from_slice(&[t], (1, 1), &d).unwrap(),
            &Tensor::from_slice(obs, (1, OBS), &d).unwrap(),
            &[],
        )
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    out.iter().zip(e).map(|(a, b)| *a as f64 * *b as f64).sum()
}

#[test]
fn the_exported_vjp_graph_agrees_with_finite_differences_of_the_velocity() {
    let dir = tempfile::tempdir().unwrap();
    let robot = NullRobot::new("r", OBS, 0);
    for seed in [1u64, 2] {
        let net = flow_net(seed);
        let model = write(dir.path(), &net, true);
        let mut policy = OnnxPolicy::load(&model, robot.spec(), &RunOptions::default()).unwrap();
        assert!(policy.has_vjp());
        let obs = observation(seed);
        let n = T * A;
        let x: Vec<f32> = (0..n).map(|i| ((i * 13 % 17) as f32 / 8.5) - 1.0).collect();
        let e: Vec<f32> = (0..n).map(|i| ((i * 5 % 11) as f32 / 5.5) - 1.0).collect();
        for t in [0.1f32, 0.5, 0.9] {
            let mut vjp = vec![0.0f32; n];
            policy
                .vjp_at(&obs, &x, t, &e, &mut vjp)
                .expect("the model has a VJP graph")
                .unwrap();
            // Central differences of e . f along each coordinate of the noisy chunk.
            let h = 1e-2f32;
            let mut worst = 0.0f64;
            for j in 0..n {
                let (mut up, mut down) = (x.clone(), x.clone());
                up[j] += h;
                down[j] -= h;
                let fd = (projected(&net, &up, t, &obs.state, &e)
                    - projected(&net, &down, t, &obs.state, &e))
                    / (2.0 * h as f64);
                let err = (fd - vjp[j] as f64).abs() / (1.0 + fd.abs());
                worst = worst.max(err);
            }
            assert!(
                worst < 2e-3,
                "seed {seed}, t {t}: VJP against finite differences off by {worst}"
            );
            assert!(vjp.iter().any(|v| v.abs() > 1e-3), "a VJP of zeros");
        }
    }
}

#[test]
fn a_flow_policy_with_a_vjp_graph_is_guided_keeps_the_executed_rows_and_can_be_told_to_inpaint_hard()
 {
    let dir = tempfile::tempdir().unwrap();
    let robot = NullRobot::new("r", OBS, 0);
    let model = write(dir.path(), &flow_net(3), true);
    let opts = RunOptions::default();
    let mut policy = OnnxPolicy::load(&model, robot.spec(), &opts).unwrap();
    let n = T * A;
    let obs = observation(3);
    let executing: Vec<f32> = (0..n).map(|i| (i as f32 * 0.21).cos() * 0.6).collect();
    let noise: Vec<f32> = (0..n)
        .map(|i| ((i * 37 % 23) as f32 / 11.5) - 1.0)
        .collect();
    let (covered, delay) = (6, 2);
    let prefix = ChunkPrefix {
        actions: &executing,
        covered,
        delay,
    };
    let run = |policy: &mut OnnxPolicy, cfg: RtcConfig| {
        policy.set_rtc(cfg);
        policy.set_next_noise(noise.clone());
        let mut out = vec![0.0f32; n];
        policy.infer_with_prefix(&obs, &prefix, &mut out).unwrap();
        (out, policy.rtc_variant())
    };
    let on = RtcConfig {
        enabled: true,
        ..RtcConfig::default()
    };
    let (guided, variant) = run(&mut policy, on.clone());
    assert_eq!(variant, Some(RtcVariant::Guided));
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&guided[..delay * A]),
        bits(&executing[..delay * A]),
        "the frozen rows are what the robot executes"
    );
    let (hard, variant) = run(
        &mut policy,
        RtcConfig {
            guidance: false,
            ..on.clone()
        },
    );
    assert_eq!(variant, Some(RtcVariant::Hard));
    assert_eq!(bits(&hard[..delay * A]), bits(&executing[..delay * A]));
    let (plain, variant) = run(&mut policy, RtcConfig::default());
    assert_eq!(variant, None);
    // Over the soft part of the overlap, guidance pulls the chunk toward the executing one.
    let gap = |x: &[f32]| -> f32 {
        (delay * A..covered * A)
            .map(|j| (x[j] - executing[j]).abs())
            .sum()
    };
    assert!(
        gap(&guided) < gap(&plain),
        "guided {} vs plain {}",
        gap(&guided),
        gap(&plain)
    );
    // Zero guidance weight: plain sampling past the frozen rows, bit for bit.
    let (zero, variant) = run(
        &mut policy,
        RtcConfig {
            max_guidance_weight: 0.0,
            ..on
        },
    );
    assert_eq!(variant, Some(RtcVariant::Guided));
    assert_eq!(bits(&zero[delay * A..]), bits(&plain[delay * A..]));
    // The same model without [graph.vjp] in its spec: hard inpainting.
    std::fs::write(spec_path(&model), flow_spec(false).to_toml()).unwrap();
    let mut unguided = OnnxPolicy::load(&model, robot.spec(), &opts).unwrap();
    assert!(!unguided.has_vjp());
    let (_, variant) = run(
        &mut unguided,
        RtcConfig {
            enabled: true,
            ..RtcConfig::default()
        },
    );
    assert_eq!(variant, Some(RtcVariant::Hard));
}

#[test]
fn a_spec_naming_a_missing_vjp_graph_is_refused_with_the_file_and_the_way_out() {
    let dir = tempfile::tempdir().unwrap();
    let robot = NullRobot::new("r", OBS, 0);
    let model = write(dir.path(), &flow_net(4), true);
    std::fs::remove_file(vjp_path_for(&model)).unwrap();
    let err = match OnnxPolicy::load(&model, robot.spec(), &RunOptions::default()) {
        Ok(_) => panic!("loaded without its VJP graph"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("flow.vjp.onnx") && err.contains("--objective flow"),
        "{err}"
    );
}

#[test]
fn a_flow_policy_trained_by_reflex_runs_guided_rtc_in_the_bench_and_in_reflex_run() {
    // The way a user goes: demonstrations, `reflex bc train --objective flow` (the model, its
    // VJP graph and the spec naming it), `reflex bench rtc` on it (guided RTC among the modes),
    // and `reflex run` with `[policy.rtc]`, which says which sampler it uses.
    use crate::common::{reflex, repo};
    let dir = tempfile::tempdir().unwrap();
    let demos = dir.path().join("demos");
    let model = dir.path().join("pick-flow.onnx");
    let run = |args: &[&str]| {
        let o = reflex().current_dir(repo()).args(args).output().unwrap();
        assert!(
            o.status.success(),
            "reflex {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        o
    };
    run(&[
        "sim",
        "demos",
        "--task",
        "pick",
        "--episodes",
        "3",
        "--out",
        demos.to_str().unwrap(),
    ]);
    let o = run(&[
        "bc",
        "train",
        "--demos",
        demos.to_str().unwrap(),
        "--objective",
        "flow",
        "--steps",
        "50",
        "--batch",
        "32",
        "--hidden",
        "64",
        "--out",
        model.to_str().unwrap(),
    ]);
    let said = String::from_utf8_lossy(&o.stdout);
    let vjp = vjp_path_for(&model);
    assert!(
        vjp.is_file() && said.contains("pick-flow.vjp.onnx"),
        "{said}"
    );
    let spec = PolicySpec::load_for(&model).unwrap();
    assert_eq!(spec.kind, PolicyKind::Flow);
    assert_eq!(
        spec.graph.vjp.as_ref().map(|v| v.file.as_str()),
        Some("pick-flow.vjp.onnx")
    );
    let o = run(&[
        "bench",
        "rtc",
        "--model",
        model.to_str().unwrap(),
        "--delays",
        "0,2",
        "--episodes",
        "2",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let cells = v["cells"].as_array().unwrap();
    assert_eq!(
        cells.len(),
        10,
        "five modes (waiting among them) at two delays: {v}"
    );
    assert_eq!(
        v["rtc"]["max_guidance_weight"], 5.0,
        "the paper's clip by default: {v}"
    );
    // The RTC settings docs/benchmarks.md compares, taken and reported; a schedule that does
    // not exist is refused with the ones that do.
    let o = run(&[
        "bench",
        "rtc",
        "--model",
        model.to_str().unwrap(),
        "--delays",
        "1",
        "--episodes",
        "1",
        "--max-guidance-weight",
        "1",
        "--prefix-attention-schedule",
        "linear",
        "--json",
    ]);
    let w: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(w["rtc"]["max_guidance_weight"], 1.0, "{w}");
    assert_eq!(w["rtc"]["prefix_attention_schedule"], "linear", "{w}");
    let bad = reflex()
        .current_dir(repo())
        .args(["bench", "rtc", "--model"])
        .arg(&model)
        .args(["--prefix-attention-schedule", "steep", "--episodes", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && err.contains("exp, linear, ones, zeros"),
        "{err}"
    );
    // Nothing is frozen at delay 0: hard inpainting is plain sampling, bit for bit.
    let cell = |mode: &str, d: u64| {
        cells
            .iter()
            .find(|c| c["mode"] == mode && c["delay_ticks"] == d)
            .unwrap_or_else(|| panic!("no {mode} at {d}: {v}"))
            .clone()
    };
    for key in ["success_rate", "jerk_mean", "boundary_jump_mean"] {
        assert_eq!(cell("rtc_hard", 0)[key], cell("naive", 0)[key], "{key}");
    }
    for d in [0u64, 2] {
        let guided = cells
            .iter()
            .find(|c| c["mode"] == "rtc_guided" && c["delay_ticks"] == d)
            .unwrap_or_else(|| panic!("no rtc_guided at {d}: {v}"));
        assert!(guided["success_rate"].is_number() && guided["jerk_mean"].is_number());
        assert_eq!(guided["holds_no_chunk"], 2 * d, "{guided}");
    }
    // Its chunk time with guided RTC beside plain sampling, in one run.
    let o = run(&[
        "policy",
        "bench",
        "--model",
        model.to_str().unwrap(),
        "--rtc",
        "guided",
        "--iters",
        "5",
        "--json",
    ]);
    let b: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(b["rtc"]["variant"], "guided", "{b}");
    assert!(b["rtc"]["p50_us"].as_f64().unwrap() > 0.0 && b["p50_us"].as_f64().unwrap() > 0.0);
    let cfg = dir.path().join("run.toml");
    std::fs::write(
        &cfg,
        format!(
            "[robot]\nsource = \"sim\"\n[sim]\ntask = \"pick\"\n[policy]\nkind = \"onnx\"\nmodel = {:?}\n\
             [policy.rtc]\nenabled = true\n[run]\nepisodes = 1\nseed = 3\n",
            model.display()
        ),
    )
    .unwrap();
    let o = reflex()
        .env("RUST_LOG", "info")
        .args(["run", "--json", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("guided by the velocity's VJP graph"), "{err}");
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(summary["episodes"], 1, "{summary}");
    // The residual learner on a base sampled with guided RTC: the demo trains, judges it alone
    // with RTC on, and the kept refined.toml runs it the same way.
    let runs = dir.path().join("runs");
    let o = run(&[
        "demo",
        "--model",
        model.to_str().unwrap(),
        "--rtc",
        "guided",
        "--episodes",
        "3",
        "--demos",
        "1",
        "--eval-episodes",
        "2",
        "--no-record",
        "--json",
        "--runs",
        runs.to_str().unwrap(),
    ]);
    let d: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(d["held_out"]["episodes"], 2, "{d}");
    let refined =
        std::fs::read_to_string(std::path::Path::new(d["refined_config"].as_str().unwrap()))
            .unwrap();
    assert!(
        refined.contains("[policy.rtc]") && refined.contains("guidance = true"),
        "{refined}"
    );
    // A base without a VJP graph cannot be guided, and the demo says so.
    let o = reflex()
        .current_dir(repo())
        .args(["demo", "--rtc", "guided", "--episodes", "1", "--runs"])
        .arg(&runs)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("no VJP graph") && err.contains("--rtc hard"),
        "{err}"
    );
}
