//! A flow VLA as two graphs (`[graph.prefix]`): the prefix once per chunk, the action expert per
//! integration step against its cached keys and values. Checked against the same network as one
//! graph, through the library and through `reflex bench vla` / `reflex policy bench`.

use crate::common::reflex;
use reflex_bench::vla_bench::write_models;
use reflex_bench::vla_graphs::VlaShape;
use reflex_policies::onnx_policy::{OnnxPolicy, RunOptions};
use reflex_policies::rtc::{RtcConfig, RtcVariant};
use reflex_runtime::msg::Observation;
use reflex_runtime::policy::ChunkPrefix;
use reflex_runtime::robot::Robot;

fn sim() -> reflex_sim::SimEnv {
    let mut cfg = reflex_sim::SimConfig::for_task(reflex_sim::TaskKind::Pick);
    cfg.cameras.enabled = true;
    cfg.cameras.width = 64;
    cfg.cameras.height = 64;
    reflex_sim::SimEnv::new(cfg).unwrap()
}

fn tiny(env: &reflex_sim::SimEnv) -> VlaShape {
    let joints = env.spec().field("joint_pos").unwrap().len();
    VlaShape::tiny(joints, env.spec().action.dim(), 8)
}

fn chunk(p: &mut OnnxPolicy, o: &Observation, noise: &[f32]) -> Vec<f32> {
    let mut out = vec![0.0f32; noise.len()];
    p.set_next_noise_from(noise);
    p.infer_chunk(o, &mut out).unwrap();
    out
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn a_two_graph_vla_samples_the_chunk_its_single_graph_does_and_inpaints_with_the_prefix_frozen() {
    let dir = tempfile::tempdir().unwrap();
    let mut env = sim();
    let v = tiny(&env);
    let (two, one) = write_models(dir.path(), &v, 25, 10).unwrap();
    let obs_a = env.reset(Some(1)).unwrap().clone();
    let obs_b = env.reset(Some(2)).unwrap().clone();
    let opts = RunOptions::default();
    let mut p2 = OnnxPolicy::load(&two, env.spec(), &opts).unwrap();
    let mut p1 = OnnxPolicy::load(&one, env.spec(), &opts).unwrap();
    assert!(p1.last_prefix_time().is_none(), "one graph has no prefix");
    let n = v.chunk_len * v.action_dim;
    let noise: Vec<f32> = (0..n).map(|i| (i as f32 * 0.61).cos()).collect();
    let (a2, a1) = (
        chunk(&mut p2, &obs_a, &noise),
        chunk(&mut p1, &obs_a, &noise),
    );
    assert!(p2.last_prefix_time().is_some());
    assert!(max_diff(&a2, &a1) < 1e-4, "{}", max_diff(&a2, &a1));
    // Another scene (cube, arm) gives another chunk, the same in both: the prefix's outputs
    // are what the expert sees, not a cache left from the first observation.
    let (b2, b1) = (
        chunk(&mut p2, &obs_b, &noise),
        chunk(&mut p1, &obs_b, &noise),
    );
    assert!(max_diff(&b2, &b1) < 1e-4, "{}", max_diff(&b2, &b1));
    assert!(
        max_diff(&a2, &b2) > 1e-3,
        "the observation did not reach the expert"
    );

    // Real-time chunking on the two graphs (no VJP graph: hard inpainting): the frozen rows are
    // the executing chunk's, bit for bit.
    p2.set_rtc(RtcConfig {
        enabled: true,
        ..RtcConfig::default()
    });
    let delay = 7;
    let prefix = ChunkPrefix {
        actions: &a2,
        covered: v.chunk_len - 25,
        delay,
    };
    let mut out = vec![0.0f32; n];
    p2.infer_chunk_with(&obs_b, Some(&prefix), &mut out)
        .unwrap();
    assert_eq!(p2.rtc_variant(), Some(RtcVariant::Hard));
    let d = v.action_dim;
    assert_eq!(
        out[..delay * d]
            .iter()
            .map(|x| x.to_bits())
            .collect::<Vec<_>>(),
        a2[..delay * d]
            .iter()
            .map(|x| x.to_bits())
            .collect::<Vec<_>>()
    );
}

#[test]
fn a_two_graph_vla_whose_prefix_graph_is_missing_or_misnamed_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let env = sim();
    let (two, _) = write_models(dir.path(), &tiny(&env), 25, 10).unwrap();
    let spec = reflex_policies::spec::spec_path(&two);
    let text = std::fs::read_to_string(&spec).unwrap();
    std::fs::write(&spec, text.replace("\"v1\"", "\"values1\"")).unwrap();
    let err = OnnxPolicy::load(&two, env.spec(), &RunOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("input `values1`") && err.contains("vla.onnx"),
        "{err}"
    );
    // An observation input the prefix graph does not take: its file is named.
    std::fs::write(&spec, text.replace("name = \"state\"", "name = \"joints\"")).unwrap();
    let err = OnnxPolicy::load(&two, env.spec(), &RunOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("vla.prefix.onnx") && err.contains("input `joints`"),
        "{err}"
    );
    std::fs::write(&spec, &text).unwrap();
    std::fs::remove_file(dir.path().join("vla.prefix.onnx")).unwrap();
    let err = OnnxPolicy::load(&two, env.spec(), &RunOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("vla.prefix.onnx") && err.contains("does not exist"),
        "{err}"
    );
}

#[test]
fn reflex_bench_vla_and_policy_bench_time_each_graph_through_the_binary() {
    // The documented commands, at the tiny size (the measured one takes minutes and 550 MB of
    // graphs): every figure is there and the loop ran with the VLA's chunks.
    let dir = tempfile::tempdir().unwrap();
    let out = reflex()
        .args([
            "bench",
            "vla",
            "--tiny",
            "--seconds",
            "1",
            "--chunks",
            "2",
            "--json",
        ])
        .arg("--dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for k in ["p50_us", "p99_us", "prefix_p50_us", "expert_p50_us"] {
        assert!(
            v["two_graphs"][k].as_f64().is_some_and(|x| x > 0.0),
            "{k}: {v}"
        );
    }
    assert!(v["single_graph"]["p50_us"].as_f64().unwrap() > 0.0);
    assert!(v["max_abs_diff"].as_f64().unwrap() < 1e-4, "{v}");
    assert!(v["with_vla"]["chunks"].as_u64().unwrap() >= 1, "{v}");
    assert_eq!(v["with_vla"]["rtc"], "hard", "{v}");
    assert_eq!(v["without_policy"]["chunks"], 0, "{v}");
    for r in ["with_vla", "without_policy"] {
        for k in ["lateness_p50_us", "lateness_p99_us", "missed"] {
            assert!(v[r][k].is_number(), "{r}.{k}: {v}");
        }
    }
    let out = reflex()
        .args(["policy", "bench", "--iters", "3", "--json", "--model"])
        .arg(dir.path().join("vla.onnx"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["graphs"]["prefix_p50_us"].as_f64().unwrap() > 0.0, "{v}");
    assert!(
        v["graphs"]["expert_step_p50_us"].as_f64().unwrap() > 0.0,
        "{v}"
    );

    // `reflex policy check` reads the prefix graph too, and names it when it does not fit.
    let check = || {
        reflex()
            .args(["policy", "check", "--model"])
            .arg(dir.path().join("vla.onnx"))
            .output()
            .unwrap()
    };
    let out = check();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("vla.prefix.onnx"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let spec = dir.path().join("vla.policy.toml");
    let good = std::fs::read_to_string(&spec).unwrap();
    std::fs::write(&spec, good.replace("name = \"state\"", "name = \"joints\"")).unwrap();
    let out = check();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("prefix graph") && err.contains("`joints`"),
        "{err}"
    );
}
