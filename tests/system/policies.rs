//! Base policies: export parity, spec checks, the VLA input path, a model no reflex code wrote,
//! providers, bad files, and the shipped policies in closed loop.

use crate::common::{python, reflex, repo, run_ok};
use reflex_bench::workloads::NullRobot;
use reflex_imitate::{Denoiser, DenoiserShape};
use reflex_policies::onnx_policy::{LoadError, OnnxPolicy, Provider, RunOptions};
use reflex_policies::spec::{
    DiffusionSpec, GraphIo, InputSpec, Normalize, PolicyKind, PolicySpec, spec_path,
};
use reflex_runtime::msg::Observation;
use reflex_runtime::robot::Robot;
use std::path::{Path, PathBuf};

fn diffusion_spec(obs_dim_fields: Vec<String>, chunk: usize, dim: usize) -> PolicySpec {
    PolicySpec {
        format: "reflex-policy".into(),
        version: 1,
        name: "parity".into(),
        kind: PolicyKind::Diffusion,
        action_dim: dim,
        chunk_len: chunk,
        execute: chunk / 2,
        first_action: 0,
        model_action_dim: None,
        robot_kind: None,
        action_normalize: Normalize::None,
        graph: GraphIo {
            sample_input: Some("noisy_actions".into()),
            time_input: Some("timestep".into()),
            output: "eps".into(),
            ..Default::default()
        },
        inputs: vec![InputSpec::State {
            name: "obs".into(),
            fields: obs_dim_fields,
            history: 1,
            normalize: Normalize::None,
        }],
        diffusion: Some(DiffusionSpec::default()),
        flow_steps: 10,
        provenance: None,
    }
}

fn write(dir: &Path, name: &str, onnx: &[u8], spec: &PolicySpec) -> PathBuf {
    let p = dir.join(format!("{name}.onnx"));
    std::fs::write(&p, onnx).unwrap();
    std::fs::write(spec_path(&p), spec.to_toml()).unwrap();
    p
}

fn denoiser() -> Denoiser {
    Denoiser::new(
        DenoiserShape {
            obs_dim: 8,
            action_dim: 4,
            horizon: 16,
            hidden: 64,
            layers: 3,
            temb: 32,
        },
        3,
    )
    .unwrap()
}

#[test]
fn exported_model_through_onnxruntime_matches_candle_within_1e_5() {
    let dir = tempfile::tempdir().unwrap();
    let net = denoiser();
    let spec = diffusion_spec(vec![], 16, 4);
    let model = write(dir.path(), "parity", &net.to_onnx().unwrap(), &spec);
    let robot = NullRobot::new("r", 8, 0);
    let mut policy = OnnxPolicy::load(&model, robot.spec(), &RunOptions::default()).unwrap();
    let ddim = spec.diffusion.clone().unwrap().ddim();
    for seed in 0..3u64 {
        let obs = Observation {
            state: (0..8)
                .map(|i| ((i as f32 + seed as f32) * 0.37).sin())
                .collect(),
            ..Default::default()
        };
        let noise: Vec<f32> = (0..64)
            .map(|i| (i as f32 * 1.3 + seed as f32).cos() * 1.5)
            .collect();
        let candle = net.sample(&ddim, &obs.state, &[], &noise).unwrap();
        policy.set_next_noise(noise);
        let mut ort = vec![0.0f32; 64];
        policy.infer_chunk(&obs, &mut ort).unwrap();
        let worst = candle
            .iter()
            .zip(&ort)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            worst < 1e-5,
            "seed {seed}: candle and ONNX Runtime differ by {worst}"
        );
    }
}

#[test]
fn an_image_policy_through_onnxruntime_matches_candle_within_1e_4() {
    // A denoiser that reads the state and a 48x32 front camera, fed a 96x40 frame the policy
    // resizes: ONNX Runtime (image input, Conv and spatial-softmax operators) against candle on
    // the same resized pixels.
    use reflex_imitate::image_input_name;
    use reflex_vision::encoder::{MEAN, STD};
    let dir = tempfile::tempdir().unwrap();
    let shape = DenoiserShape {
        obs_dim: 8,
        action_dim: 4,
        horizon: 16,
        hidden: 64,
        layers: 3,
        temb: 32,
    };
    let net = Denoiser::with_cameras(shape, &["front".into()], (48, 32), 5).unwrap();
    let mut spec = diffusion_spec(vec![], 16, 4);
    spec.inputs.push(InputSpec::Image {
        name: image_input_name("front"),
        camera: "front".into(),
        width: 48,
        height: 32,
        mean: MEAN,
        std: STD,
        eps: None,
        history: 1,
    });
    let model = write(dir.path(), "seeing", &net.to_onnx().unwrap(), &spec);
    let mut robot_spec = NullRobot::new("r", 8, 0).spec().clone();
    robot_spec.cameras.push(reflex_runtime::msg::CameraSpec {
        name: "front".into(),
        width: 96,
        height: 40,
        intrinsics: None,
        mount: None,
    });
    let mut policy = OnnxPolicy::load(&model, &robot_spec, &RunOptions::default()).unwrap();
    let ddim = spec.diffusion.clone().unwrap().ddim();
    for seed in 0..3u64 {
        let image = reflex_runtime::msg::Image {
            camera: "front".into(),
            width: 96,
            height: 40,
            encoding: "rgb8".into(),
            data: (0..96 * 40 * 3)
                .map(|i| ((i as u64 * 7 + seed * 31) % 251) as u8)
                .collect(),
            seq: 0,
            age_ns: 0,
        };
        let mut pixels = vec![0.0f32; 3 * 48 * 32];
        reflex_policies::vla::image_to_nchw(&image, 48, 32, &MEAN, &STD, &mut pixels);
        let obs = Observation {
            state: (0..8)
                .map(|i| ((i as f32 + seed as f32) * 0.37).sin())
                .collect(),
            images: vec![image],
            ..Default::default()
        };
        let noise: Vec<f32> = (0..64)
            .map(|i| (i as f32 * 1.3 + seed as f32).cos() * 1.5)
            .collect();
        let candle = net.sample(&ddim, &obs.state, &[&pixels], &noise).unwrap();
        policy.set_next_noise(noise);
        let mut ort = vec![0.0f32; 64];
        policy.infer_chunk(&obs, &mut ort).unwrap();
        let worst = candle
            .iter()
            .zip(&ort)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            worst < 1e-4,
            "seed {seed}: candle and ONNX Runtime differ by {worst}"
        );
    }
}

#[test]
fn spec_check_catches_each_kind_of_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let onnx = denoiser().to_onnx().unwrap();
    let robot = NullRobot::new("r", 8, 0);
    let good = diffusion_spec(vec![], 16, 4);
    let load = |spec: &PolicySpec, robot_state: usize| -> String {
        let p = write(dir.path(), "m", &onnx, spec);
        let r = NullRobot::new("r", robot_state, 0);
        match OnnxPolicy::load(&p, r.spec(), &RunOptions::default()) {
            Ok(_) => "ok".into(),
            Err(e) => e.to_string(),
        }
    };
    assert_eq!(load(&good, 8), "ok");
    let _ = robot;
    // A spec input the graph does not have (and the graph input it leaves unfed).
    let mut s = good.clone();
    s.inputs = vec![InputSpec::State {
        name: "observation".into(),
        fields: vec![],
        history: 1,
        normalize: Normalize::None,
    }];
    let e = load(&s, 8);
    assert!(
        e.contains("input `observation` named in the spec is not in the graph")
            && e.contains("graph input `obs`"),
        "{e}"
    );
    // The wrong output name.
    let mut s = good.clone();
    s.graph.output = "noise".into();
    let e = load(&s, 8);
    assert!(e.contains("output `noise`") && e.contains("eps"), "{e}");
    // A chunk shape that does not fit the graph.
    let mut s = good.clone();
    s.chunk_len = 8;
    s.execute = 4;
    let e = load(&s, 8);
    assert!(
        e.contains("noisy_actions") && e.contains("[batch, 8, 4]"),
        "{e}"
    );
    // The state the robot gives does not fit the graph's observation input.
    let e = load(&good, 12);
    assert!(
        e.contains("input `obs`") && e.contains("[batch, 12]"),
        "{e}"
    );
    // A state field the robot does not have.
    let mut s = good.clone();
    s.inputs = vec![InputSpec::State {
        name: "obs".into(),
        fields: vec!["joint_pos".into()],
        history: 1,
        normalize: Normalize::None,
    }];
    let e = load(&s, 8);
    assert!(e.contains("joint_pos"), "{e}");
    // The action dimension of the robot.
    let mut s = good.clone();
    s.action_dim = 3;
    let e = load(&s, 8);
    assert!(
        e.contains("[batch, 16, 3]") || e.contains("3 action components"),
        "{e}"
    );
    // An element type mismatch: the spec feeds tokens (int64) where the graph takes float32.
    let mut s = good.clone();
    std::fs::write(dir.path().join("tok.json"), TOKENIZER).unwrap();
    s.inputs = vec![InputSpec::Language {
        name: "obs".into(),
        tokenizer: "tok.json".into(),
        instruction: "pick".into(),
        max_len: 8,
        pad_id: 0,
        mask_input: None,
        state_prompt: None,
    }];
    let e = load(&s, 8);
    assert!(
        e.contains("input `obs`: the graph takes float32, the spec feeds int64"),
        "{e}"
    );
    // Missing sampler input names for a diffusion spec are caught when the spec is read.
    let mut s = good.clone();
    s.graph.sample_input = None;
    let e = load(&s, 8);
    assert!(e.contains("graph.sample_input"), "{e}");
}

#[test]
fn reflex_policy_check_reports_mismatches_and_passes_good_models() {
    let dir = tempfile::tempdir().unwrap();
    let onnx = denoiser().to_onnx().unwrap();
    let p = write(dir.path(), "m", &onnx, &diffusion_spec(vec![], 16, 4));
    let out = run_ok(reflex().args(["policy", "check", "--model"]).arg(&p));
    assert!(String::from_utf8_lossy(&out.stdout).contains("matches its spec"));
    let mut bad = diffusion_spec(vec![], 16, 4);
    bad.graph.time_input = Some("t".into());
    let p = write(dir.path(), "bad", &onnx, &bad);
    let out = reflex()
        .args(["policy", "check", "--model"])
        .arg(&p)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("input `t`") && err.contains("bad.policy.toml"),
        "{err}"
    );
}

const TOKENIZER: &str = r#"{
  "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
  "normalizer": {"type": "Lowercase"}, "pre_tokenizer": {"type": "Whitespace"},
  "post_processor": null, "decoder": null,
  "model": {"type": "WordLevel", "unk_token": "[UNK]",
            "vocab": {"[PAD]": 0, "[UNK]": 1, "pick": 2, "up": 3, "the": 4, "cube": 5, "red": 6, "push": 7}}
}"#;

/// The tiny VLA's spec (tests/system/tiny_vla.rs) up to its image input; the tests add the
/// instruction and the state.
const TINY_VLA_SPEC: &str = r#"format = "reflex-policy"
version = 1
name = "tiny-vla"
kind = "flow"
action_dim = 4
chunk_len = 8
execute = 4
flow_steps = 5

[graph]
sample_input = "x_t"
time_input = "t"
output = "velocity"

[[inputs]]
source = "image"
name = "image"
camera = "front"
width = 32
height = 32
mean = [0.5, 0.5, 0.5]
std = [0.25, 0.25, 0.25]
"#;

#[test]
fn vla_inputs_tokens_and_images_reach_the_network() {
    use crate::tiny_vla::{TinyVla, build_tiny_vla};
    use reflex_policies::vla::tokenize;
    let dir = tempfile::tempdir().unwrap();
    let tok = dir.path().join("tokenizer.json");
    std::fs::write(&tok, TOKENIZER).unwrap();
    // Tokenisation against hand-computed ids: lower-cased words, unknown word -> 1, padded with 0.
    let (ids, mask) = tokenize(&tok, "Pick up the RED cube please", 8, 0).unwrap();
    assert_eq!(ids, vec![2, 3, 4, 6, 5, 1, 0, 0]);
    assert_eq!(mask, vec![1, 1, 1, 1, 1, 1, 0, 0]);
    let (ids, _) = tokenize(&tok, "pick up the red cube now and then", 4, 0).unwrap();
    assert_eq!(ids, vec![2, 3, 4, 6], "truncated to max_len");

    // A VLA-shaped flow policy fed from the simulator's front camera, an instruction and state.
    let v = TinyVla {
        image: 32,
        vocab: 8,
        max_len: 8,
        state_dim: 6,
        chunk_len: 8,
        action_dim: 4,
    };
    let onnx = build_tiny_vla(&v, 11);
    let spec_text = format!(
        r#"{TINY_VLA_SPEC}
[[inputs]]
source = "language"
name = "tokens"
tokenizer = "tokenizer.json"
instruction = "{}"
max_len = 8

[[inputs]]
source = "state"
name = "state"
fields = ["joint_pos"]
"#,
        "pick up the red cube"
    );
    let model = dir.path().join("vla.onnx");
    std::fs::write(&model, &onnx).unwrap();
    std::fs::write(spec_path(&model), &spec_text).unwrap();
    let mut cfg = reflex_sim::SimConfig::for_task(reflex_sim::TaskKind::Pick);
    cfg.cameras.enabled = true;
    cfg.cameras.width = 64;
    cfg.cameras.height = 64;
    let mut env = reflex_sim::SimEnv::new(cfg).unwrap();
    let obs_a = env.reset(Some(1)).unwrap().clone();
    let obs_b = env.reset(Some(2)).unwrap().clone();
    let opts = RunOptions::default();
    let mut policy = OnnxPolicy::load(&model, env.spec(), &opts).unwrap();
    let noise: Vec<f32> = (0..32).map(|i| (i as f32 * 0.7).sin()).collect();
    let run = |p: &mut OnnxPolicy, o: &Observation| {
        let mut out = vec![0.0f32; 32];
        p.set_next_noise(noise.clone());
        p.infer_chunk(o, &mut out).unwrap();
        out
    };
    let a1 = run(&mut policy, &obs_a);
    assert!(a1.iter().all(|x| x.is_finite()));
    assert_eq!(
        a1,
        run(&mut policy, &obs_a),
        "same inputs, same noise: same chunk"
    );
    // Another scene (different cube position and arm pose) changes the chunk.
    assert_ne!(a1, run(&mut policy, &obs_b));
    // Only the image changes: the camera input is used.
    let mut obs_img = obs_a.clone();
    for p in obs_img.images[0].data.iter_mut() {
        *p = 255 - *p;
    }
    assert_ne!(
        a1,
        run(&mut policy, &obs_img),
        "the image does not reach the network"
    );
    // Only the instruction changes: the language input is used.
    std::fs::write(
        spec_path(&model),
        spec_text.replace("pick up the red cube", "push the cube"),
    )
    .unwrap();
    let mut other = OnnxPolicy::load(&model, env.spec(), &opts).unwrap();
    assert_ne!(
        a1,
        run(&mut other, &obs_a),
        "the instruction does not reach the network"
    );
}

#[test]
fn a_pi05_prompt_carries_the_state_as_bins_rebuilt_at_every_chunk() {
    // pi0.5 reads the state only as text: the tiny VLA's own state input gets zeros (a
    // constant), the prompt's `[inputs.state_prompt]` writes joint_pos into the instruction.
    // Its chunk must equal the same network's with the prompt LeRobot's
    // Pi05PrepareStateTokenizerProcessorStep writes, typed by hand from numpy's bins.
    use crate::tiny_vla::{TinyVla, build_tiny_vla};
    let dir = tempfile::tempdir().unwrap();
    let vocab = [
        "[PAD]", "[UNK]", "task", ":", "pick", "up", "the", "red", "cube", ",", "state", ";",
        "action", "192", "96", "128", "255", "254", "0", "204",
    ];
    let vocab: Vec<String> = vocab
        .iter()
        .enumerate()
        .map(|(i, w)| format!("\"{w}\": {i}"))
        .collect();
    std::fs::write(
        dir.path().join("tokenizer.json"),
        TOKENIZER.replace(
            r#""vocab": {"[PAD]": 0, "[UNK]": 1, "pick": 2, "up": 3, "the": 4, "cube": 5, "red": 6, "push": 7}"#,
            &format!("\"vocab\": {{{}}}", vocab.join(", ")),
        ),
    )
    .unwrap();
    let v = TinyVla {
        image: 32,
        vocab: 24,
        max_len: 24,
        state_dim: 6,
        chunk_len: 8,
        action_dim: 4,
    };
    let model = dir.path().join("vla.onnx");
    std::fs::write(&model, build_tiny_vla(&v, 12)).unwrap();
    let spec = |language: &str| {
        format!(
            r#"{TINY_VLA_SPEC}
[[inputs]]
source = "constant"
name = "state"
dtype = "float32"
shape = [6]
values = [0, 0, 0, 0, 0, 0]

[[inputs]]
source = "language"
name = "tokens"
tokenizer = "tokenizer.json"
max_len = 24
{language}
"#
        )
    };
    let mut cfg = reflex_sim::SimConfig::for_task(reflex_sim::TaskKind::Pick);
    cfg.cameras.enabled = true;
    cfg.cameras.width = 32;
    cfg.cameras.height = 32;
    let mut env = reflex_sim::SimEnv::new(cfg).unwrap();
    let mut obs = env.reset(Some(1)).unwrap().clone();
    let joints = env.spec().field("joint_pos").unwrap();
    assert_eq!(joints.len(), 6);
    // numpy: digitize([0.5, -0.25, 0.0, 0.9921875, 0.99, -0.999], linspace(-1, 1, 257)[:-1]) - 1
    obs.state[joints.clone()].copy_from_slice(&[0.5, -0.25, 0.0, 0.992_187_5, 0.99, -0.999]);
    let noise: Vec<f32> = (0..32).map(|i| (i as f32 * 0.3).cos()).collect();
    let chunk = |language: &str, o: &Observation| {
        std::fs::write(spec_path(&model), spec(language)).unwrap();
        let mut p = OnnxPolicy::load(&model, env.spec(), &RunOptions::default()).unwrap();
        let mut out = vec![0.0f32; 32];
        p.set_next_noise(noise.clone());
        p.infer_chunk(o, &mut out).unwrap();
        out
    };
    let prompt = "instruction = \" pick_up the red cube\\n\"\n\n[inputs.state_prompt]\nfields = [\"joint_pos\"]\nnormalize = { kind = \"none\" }";
    let by_hand =
        "instruction = \"Task: pick up the red cube, State: 192 96 128 255 254 0;\\nAction: \"";
    let ours = chunk(prompt, &obs);
    assert!(ours.iter().all(|x| x.is_finite()));
    assert_eq!(ours, chunk(by_hand, &obs), "the prompt is not LeRobot's");
    // Another state, through the prompt only (0.6 is bin 204): one loaded policy writes each
    // call's prompt from that call's state.
    let mut moved = obs.clone();
    moved.state[joints.start] = 0.6;
    let moved_by_hand = chunk(&by_hand.replace("State: 192", "State: 204"), &moved);
    assert_ne!(ours, moved_by_hand, "the state does not reach the prompt");
    std::fs::write(spec_path(&model), spec(prompt)).unwrap();
    let mut p = OnnxPolicy::load(&model, env.spec(), &RunOptions::default()).unwrap();
    for (o, want) in [(&moved, &moved_by_hand), (&obs, &ours)] {
        let mut out = vec![0.0f32; 32];
        p.set_next_noise(noise.clone());
        p.infer_chunk(o, &mut out).unwrap();
        assert_eq!(&out, want);
    }
}

#[test]
fn a_model_built_by_the_onnx_package_runs_in_reflex_like_in_onnxruntime_python() {
    model_built_in_python(None);
}

#[test]
fn a_constant_input_reaches_the_graph_and_policy_check_suggests_it() {
    // A graph input the robot does not feed (here a gain), given the same value at every call.
    let dir = model_built_in_python(Some(0.5));
    let spec = dir.path().join("py.policy.toml");
    let text = std::fs::read_to_string(&spec).unwrap();
    let cut = text.find("\n[[inputs]]\nsource = \"constant\"").unwrap();
    std::fs::write(&spec, &text[..cut]).unwrap();
    let out = reflex()
        .args(["policy", "check", "--model"])
        .arg(dir.path().join("py.onnx"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("graph input `gain`")
            && err.contains(
                "source = \"constant\", name = \"gain\", dtype = \"float32\", shape = [1]"
            ),
        "{err}"
    );
}

/// Builds the chunk policy of tests/system/make_onnx_model.py (with a constant `gain` input when
/// given), runs it in reflex and checks the chunk against onnxruntime's Python API.
fn model_built_in_python(gain: Option<f64>) -> tempfile::TempDir {
    model_built_in_python_with(gain, &[])
}

/// As [`model_built_in_python`], with the script's flags (`--external`).
fn model_built_in_python_with(gain: Option<f64>, flags: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let state: Vec<f32> = vec![0.25, -1.5, 0.75, 2.0, -0.125];
    let mut cmd = std::process::Command::new(python());
    cmd.arg(repo().join("tests/system/make_onnx_model.py"))
        .args(flags)
        .arg(dir.path())
        .arg(serde_json::to_string(&state).unwrap());
    if let Some(g) = gain {
        cmd.arg(g.to_string());
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let py: Vec<f32> = serde_json::from_slice::<Vec<f64>>(&out.stdout)
        .unwrap()
        .into_iter()
        .map(|x| x as f32)
        .collect();
    let mut robot = NullRobot::new("r", 5, 0);
    // NullRobot's action space has 4 components; this policy has 3: a robot spec of its own.
    let mut spec = robot.spec().clone();
    spec.action.names.truncate(3);
    spec.action.low.truncate(3);
    spec.action.high.truncate(3);
    let _ = robot.reset(None);
    let mut policy =
        OnnxPolicy::load(&dir.path().join("py.onnx"), &spec, &RunOptions::default()).unwrap();
    let obs = Observation {
        state: state.clone(),
        ..Default::default()
    };
    let mut got = vec![0.0f32; 12];
    policy.infer_chunk(&obs, &mut got).unwrap();
    assert_eq!(got, py, "reflex and onnxruntime (Python) disagree");
    assert!(got.iter().any(|x| x.abs() > 0.05), "a chunk far from zero");
    dir
}

#[test]
fn a_model_whose_weights_are_in_an_external_data_file_runs_is_checked_and_needs_that_file() {
    // The ONNX library's own external data (what torch.onnx.export writes for a large model):
    // reflex runs it as onnxruntime does, `policy check` reads the weights from the data file,
    // and without that file the load names it.
    let dir = model_built_in_python_with(None, &["--external"]);
    let model = dir.path().join("py.onnx");
    let data = dir.path().join("py.onnx.data");
    assert!(data.is_file());
    let check = |m: &Path| {
        reflex()
            .args(["policy", "check", "--model"])
            .arg(m)
            .output()
            .unwrap()
    };
    let o = check(&model);
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && said.contains("py.onnx.data"),
        "{said}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // A NaN weight in the data file is seen.
    let nan = tempfile::tempdir().unwrap();
    let mut cmd = std::process::Command::new(python());
    let out = cmd
        .arg(repo().join("tests/system/make_onnx_model.py"))
        .args(["--external", "--nan"])
        .arg(nan.path())
        .arg("[0.25, -1.5, 0.75, 2.0, -0.125]")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let o = check(&nan.path().join("py.onnx"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("NaN") && err.contains("\"w\""),
        "{err}"
    );
    // Without its data file the model does not load, and the error names the file.
    std::fs::remove_file(&data).unwrap();
    let robot = NullRobot::new("r", 5, 0);
    let mut spec = robot.spec().clone();
    spec.action.names.truncate(3);
    spec.action.low.truncate(3);
    spec.action.high.truncate(3);
    let err = match OnnxPolicy::load(&model, &spec, &RunOptions::default()) {
        Ok(_) => panic!("loaded without its weights"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("py.onnx.data") && err.contains("copy that file with the model"),
        "{err}"
    );
}

#[test]
fn an_unavailable_provider_is_an_error_that_names_it_never_a_fallback() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "m",
        &denoiser().to_onnx().unwrap(),
        &diffusion_spec(vec![], 16, 4),
    );
    let robot = NullRobot::new("r", 8, 0);
    for provider in [
        Provider::Cuda { device_id: 0 },
        Provider::Tensorrt {
            device_id: 0,
            fp16: true,
            engine_cache_dir: None,
        },
    ] {
        let name = provider.name();
        let opts = RunOptions {
            provider,
            ..Default::default()
        };
        match OnnxPolicy::load(&p, robot.spec(), &opts) {
            Err(LoadError::Provider { provider, .. }) => assert_eq!(provider, name),
            Err(e) => panic!("{name}: wrong error: {e}"),
            Ok(_) => panic!("{name}: loaded on a machine without that provider: a silent fallback"),
        }
    }
    assert_eq!(Provider::parse("tensorrt").unwrap().name(), "tensorrt");
    assert!(
        Provider::parse("tpu")
            .unwrap_err()
            .to_string()
            .contains("cpu, cuda, tensorrt")
    );
}

#[test]
fn missing_corrupt_or_specless_models_fail_at_load_with_the_file_named() {
    let dir = tempfile::tempdir().unwrap();
    let robot = NullRobot::new("r", 8, 0);
    let e = OnnxPolicy::load(
        &dir.path().join("nope.onnx"),
        robot.spec(),
        &RunOptions::default(),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("nope.onnx") && e.contains("does not exist"),
        "{e}"
    );
    let corrupt = write(
        dir.path(),
        "corrupt",
        b"\x08\x01not a model at all",
        &diffusion_spec(vec![], 16, 4),
    );
    let e = OnnxPolicy::load(&corrupt, robot.spec(), &RunOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("corrupt.onnx") && e.contains("could not be loaded"),
        "{e}"
    );
    let specless = dir.path().join("specless.onnx");
    std::fs::write(&specless, denoiser().to_onnx().unwrap()).unwrap();
    let e = OnnxPolicy::load(&specless, robot.spec(), &RunOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("specless.policy.toml"), "{e}");
}

/// Runs a shipped policy through `reflex run` for 500 seeded episodes: over 100 the rate of the
/// same policy swings by 25 points from one run seed to the next (18-43 % for `pick.onnx`,
/// docs/bring-your-own-policy.md), over 500 by a few.
fn shipped_success(config: &str) -> f64 {
    let v = crate::common::json_output(
        reflex()
            .args(["run", "--config"])
            .arg(repo().join(config))
            .args(["--episodes", "500", "--json"]),
    );
    v["success_rate"].as_f64().unwrap()
}

#[test]
fn shipped_base_policies_succeed_in_their_documented_range() {
    // docs/bring-your-own-policy.md ("The shipped base policies") states the measured rates; the
    // base must leave the learner work to do.
    for (config, lo, hi) in [
        ("configs/run/sim-pick-bc.toml", 0.25, 0.65),
        ("configs/run/sim-insert-bc.toml", 0.25, 0.65),
    ] {
        let rate = shipped_success(config);
        assert!(
            (lo..=hi).contains(&rate),
            "{config}: success {rate} outside {lo}..{hi}"
        );
    }
}

#[test]
fn a_steered_policy_runs_the_base_from_the_noise_its_actor_chose() {
    use reflex_learn::sac::steer::SteeredPolicy;
    use reflex_learn::sac::{Mode, Sac, SacConfig};
    use reflex_runtime::policy::Policy;
    let mut env =
        reflex_sim::SimEnv::new(reflex_sim::SimConfig::for_task(reflex_sim::TaskKind::Pick))
            .unwrap();
    let spec = env.spec().clone();
    let model = repo().join("models/pick.onnx");
    let opts = RunOptions::default();
    let base = OnnxPolicy::load(&model, &spec, &opts).unwrap();
    let n = base.noise_len();
    assert_eq!(n, base.spec().chunk_len * base.spec().action_dim);
    let cfg = SacConfig {
        mode: Mode::Noise,
        hidden: vec![32, 32],
        noise_bound: 1.5,
        seed: 3,
        ..Default::default()
    };
    let sac = Sac::new(cfg.clone(), spec.state_dim(), n).unwrap();
    let (mut steered, _writer, tap) = SteeredPolicy::new(base, &sac, true, 1).unwrap();
    let mut plain = OnnxPolicy::load(&model, &spec, &opts).unwrap();
    let chunk = n;
    for seed in 0..3 {
        let obs = env.reset(Some(seed)).unwrap().clone();
        let mut a = vec![0.0f32; chunk];
        steered.infer(&obs, &mut a).unwrap();
        let w = tap.try_recv().expect("one noise record per chunk");
        assert!(tap.try_recv().is_none());
        assert!(w.iter().all(|v| v.abs() <= 1.5), "noise beyond its bound");
        assert_eq!(w, steered.last_noise());
        // The plain base from the same noise gives the same chunk, bit for bit.
        let mut b = vec![0.0f32; chunk];
        plain.set_next_noise(w.clone());
        plain.infer_chunk(&obs, &mut b).unwrap();
        assert_eq!(a, b);
        tap.recycle(w);
    }
    assert_eq!(tap.dropped(), 0);
    // A learner in another mode is refused, naming the mode.
    let res = Sac::new(
        SacConfig {
            mode: Mode::Residual,
            ..cfg
        },
        spec.state_dim(),
        n,
    )
    .unwrap();
    let base = OnnxPolicy::load(&model, &spec, &opts).unwrap();
    let err = SteeredPolicy::new(base, &res, true, 1)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("noise"), "{err}");
}

/// Builds the LeRobot-shaped UNet in Python (tests/system/lerobot_unet.py) and returns its
/// directory and what onnxruntime's Python API computed: the noise and the sample after every
/// DDIM step.
fn lerobot_unet(state: &[f32]) -> (tempfile::TempDir, Vec<f32>, Vec<Vec<f32>>) {
    let (dir, noise, steps, _) = lerobot_unet_sampled(state, false);
    (dir, noise, steps)
}

/// The LeRobot-shaped UNet of tests/system/lerobot_unet.py, sampled there with DDIM or DDPM:
/// the model's folder, the initial noise, the sample after each step, DDPM's per-step noise.
#[allow(clippy::type_complexity)]
fn lerobot_unet_sampled(
    state: &[f32],
    ddpm: bool,
) -> (tempfile::TempDir, Vec<f32>, Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let dir = tempfile::tempdir().unwrap();
    let out = run_ok(
        std::process::Command::new(python())
            .arg(repo().join("tests/system/lerobot_unet.py"))
            .arg(dir.path())
            .arg(serde_json::to_string(state).unwrap())
            .arg("3")
            .args(ddpm.then_some("ddpm")),
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let floats = |x: &serde_json::Value| -> Vec<f32> {
        x.as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_f64().unwrap() as f32)
            .collect()
    };
    let steps = v["steps"].as_array().unwrap().iter().map(floats).collect();
    let step_noise = v["step_noise"]
        .as_array()
        .unwrap()
        .iter()
        .map(floats)
        .collect();
    (dir, floats(&v["noise"]), steps, step_noise)
}

/// A robot with `state_dim` state values and 2 actions (the UNet's).
fn two_action_robot(state_dim: usize) -> reflex_runtime::msg::RobotSpec {
    let mut spec = NullRobot::new("r", state_dim, 0).spec().clone();
    spec.action.names.truncate(2);
    spec.action.low.truncate(2);
    spec.action.high.truncate(2);
    spec
}

#[test]
fn a_lerobot_shaped_diffusion_unet_agrees_with_onnxruntime_python_at_every_ddim_step() {
    // int64 timestep [B] with its sinusoidal embedding in the graph, Conv1d / GroupNorm / Mish
    // residual blocks with FiLM, the stacked state as global conditioning.
    let state = [0.5f32, -1.0, 1.5, 0.25];
    let (dir, noise, want) = lerobot_unet(&state);
    let spec = two_action_robot(4);
    let mut policy =
        OnnxPolicy::load(&dir.path().join("unet.onnx"), &spec, &RunOptions::default()).unwrap();
    policy.set_trace(true);
    policy.set_next_noise(noise);
    let obs = Observation {
        state: state.to_vec(),
        ..Default::default()
    };
    let mut chunk = vec![0.0f32; 16];
    policy.infer_chunk(&obs, &mut chunk).unwrap();
    let got = policy.take_trace();
    assert_eq!(got.len(), 10, "one sample per DDIM step");
    let mut largest = 0.0f32;
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        let gap = g
            .iter()
            .zip(w)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            gap < 1e-5,
            "DDIM step {}: reflex and onnxruntime (Python) differ by {gap}",
            k + 1
        );
        largest = largest.max(gap);
    }
    eprintln!("largest difference over the 10 DDIM steps: {largest:e}");
    assert_eq!(
        chunk, got[9],
        "the chunk is the last step (no action normalisation)"
    );
    assert!(
        chunk.iter().any(|x| x.abs() > 0.1),
        "a chunk far from zero: the network does something"
    );
}

#[test]
fn a_lerobot_shaped_unet_sampled_with_ddpm_agrees_with_numpy_at_every_step_given_its_noise() {
    // LeRobot's default sampler: diffusers' DDPMScheduler (fixed_small variance) written in
    // numpy by the peer script, which also draws the noise of each step; reflex gets the same
    // noise after the initial sample and must land on the same sample at every step. The spec
    // executes from row 1 (first_action, LeRobot's n_obs_steps - 1).
    let state = [0.5f32, -1.0, 1.5, 0.25];
    let (dir, noise, want, step_noise) = lerobot_unet_sampled(&state, true);
    assert_eq!(
        step_noise.len(),
        9,
        "noise at every step but the last (t = 0)"
    );
    let spec = two_action_robot(4);
    let model = dir.path().join("unet.onnx");
    let mut policy = OnnxPolicy::load(&model, &spec, &RunOptions::default()).unwrap();
    use reflex_runtime::policy::Policy;
    assert_eq!(policy.chunk_spec().len, 7, "8 rows from row 1");
    assert!(policy.rtc_unsupported().unwrap().contains("DDPM"));
    let obs = Observation {
        state: state.to_vec(),
        ..Default::default()
    };
    // The initial noise alone is refused with both lengths named; a wrong length too.
    assert_eq!(policy.step_noise_len(), 9 * 16);
    policy.set_next_noise(vec![0.0; 17]);
    let err = policy.infer_chunk(&obs, &mut [0.0; 14]).unwrap_err();
    assert!(err.to_string().contains("16 (or 160"), "{err}");
    let all: Vec<f32> = noise
        .iter()
        .chain(step_noise.iter().flatten())
        .copied()
        .collect();
    policy.set_trace(true);
    policy.set_next_noise(all.clone());
    let mut chunk = vec![0.0f32; 14];
    policy.infer_chunk(&obs, &mut chunk).unwrap();
    let got = policy.take_trace();
    assert_eq!(got.len(), 10, "one sample per DDPM step");
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        let gap = g
            .iter()
            .zip(w)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            gap < 1e-5,
            "DDPM step {}: reflex and numpy differ by {gap}",
            k + 1
        );
    }
    assert_eq!(chunk, got[9][2..], "the chunk from row 1 on");
    // Other step noise, another chunk: the injected noise is what was used.
    let mut other = all.clone();
    other[16..].iter_mut().for_each(|z| *z = -*z);
    policy.set_next_noise(other);
    let mut chunk2 = vec![0.0f32; 14];
    policy.infer_chunk(&obs, &mut chunk2).unwrap();
    assert!(chunk2 != chunk, "the step noise changed nothing");
}

#[test]
fn a_policy_with_history_reads_past_steps_oldest_first_and_executes_from_its_first_action() {
    // A hand-made graph that shows what it was fed: its chunk is the stacked state (two steps of
    // 8 values, as 4 rows of 4) plus, in every row, the mean pixel of each camera frame it got
    // (past, current, past, current). The spec stacks 2 steps of state and of images and drops
    // row 0 (first_action = 1).
    use reflex_policies::onnx_write::{Dim, Elem, Graph, batch};
    let dir = tempfile::tempdir().unwrap();
    let mut g = Graph::new();
    let obs = g.input("obs", Elem::F32, vec![batch(), Dim::Fixed(16)]);
    let img = g.input(
        "img",
        Elem::F32,
        vec![
            batch(),
            Dim::Fixed(2),
            Dim::Fixed(3),
            Dim::Fixed(2),
            Dim::Fixed(2),
        ],
    );
    let rows = g.reshape(&obs, &[-1, 4, 4]);
    let flat = g.reshape(&img, &[-1, 2, 12]);
    let w = g.constant("mean", &[12, 1], &[1.0 / 12.0; 12]);
    let means = g.op("MatMul", &[&flat, &w], vec![]);
    let means = g.reshape(&means, &[-1, 2]);
    let four = g.concat(&[&means, &means], 1);
    let four = g.reshape(&four, &[-1, 1, 4]);
    let act = g.op("Add", &[&rows, &four], vec![]);
    g.output(
        &act,
        "act",
        Elem::F32,
        vec![batch(), Dim::Fixed(4), Dim::Fixed(4)],
    );
    let mut spec = PolicySpec::chunk("history", (4, 4, 2), "obs", "act");
    spec.first_action = 1;
    spec.inputs = vec![
        InputSpec::State {
            name: "obs".into(),
            fields: vec![],
            history: 2,
            normalize: Normalize::None,
        },
        InputSpec::Image {
            name: "img".into(),
            camera: "front".into(),
            width: 2,
            height: 2,
            mean: [0.0; 3],
            std: [1.0; 3],
            eps: None,
            history: 2,
        },
    ];
    let model = write(dir.path(), "history", &g.to_bytes("history", "test"), &spec);
    let mut robot = NullRobot::new("r", 8, 0).spec().clone();
    robot.cameras.push(reflex_runtime::msg::CameraSpec {
        name: "front".into(),
        width: 2,
        height: 2,
        intrinsics: None,
        mount: None,
    });
    let mut policy = OnnxPolicy::load(&model, &robot, &RunOptions::default()).unwrap();
    use reflex_runtime::policy::Policy;
    assert_eq!(policy.past_steps(), 1);
    assert_eq!(policy.chunk_spec().len, 3);
    let frame = |k: f32, grey: u8| Observation {
        state: (0..8).map(|i| k * 10.0 + i as f32).collect(),
        images: vec![reflex_runtime::msg::Image {
            camera: "front".into(),
            width: 2,
            height: 2,
            encoding: "rgb8".into(),
            data: vec![grey; 12],
            seq: 0,
            age_ns: 0,
        }],
        ..Default::default()
    };
    let (past, now) = (frame(1.0, 51), frame(2.0, 204));
    let (mp, mn) = (51.0 / 255.0, 204.0 / 255.0);
    let add = [mp, mn, mp, mn];
    let mut chunk = vec![0.0f32; 12];
    policy.observe_past(std::slice::from_ref(&past));
    policy.infer(&now, &mut chunk).unwrap();
    // Rows 1-3 of [past 0-3, past 4-7, now 0-3, now 4-7].
    let want: Vec<f32> = [14.0, 20.0, 24.0]
        .iter()
        .flat_map(|r0| (0..4).map(move |c| r0 + c as f32 + add[c]))
        .collect();
    for (g, w) in chunk.iter().zip(&want) {
        assert!((g - w).abs() < 1e-5, "got {chunk:?}, want {want:?}");
    }
    // Without the past handed over (an episode's first step), the observation fills the history.
    policy.infer(&now, &mut chunk).unwrap();
    let add = [mn; 4];
    let want: Vec<f32> = [24.0, 20.0, 24.0]
        .iter()
        .flat_map(|r0| (0..4).map(move |c| r0 + c as f32 + add[c]))
        .collect();
    for (g, w) in chunk.iter().zip(&want) {
        assert!((g - w).abs() < 1e-5, "got {chunk:?}, want {want:?}");
    }
}

#[test]
fn reflex_policy_check_says_which_spec_lines_fit_a_lerobot_timestep() {
    let (dir, _, _) = lerobot_unet(&[0.0; 4]);
    let spec_file = dir.path().join("unet.policy.toml");
    let text = std::fs::read_to_string(&spec_file).unwrap();
    // The spec as reflex's own exports write it: float32 [B, 1].
    std::fs::write(
        &spec_file,
        text.replace("time_dtype = \"int64\"\n", "")
            .replace("time_shape = \"batch\"\n", ""),
    )
    .unwrap();
    let out = reflex()
        .args(["policy", "check", "--model"])
        .arg(dir.path().join("unet.onnx"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("the graph takes int64, the spec feeds float32")
            && err.contains("time_dtype = \"int64\"")
            && err.contains("time_shape = \"batch\""),
        "{err}"
    );
    // With the suggested lines the check passes.
    std::fs::write(&spec_file, &text).unwrap();
    run_ok(
        reflex()
            .args(["policy", "check", "--model"])
            .arg(dir.path().join("unet.onnx")),
    );
}

#[test]
fn policy_check_finds_weights_a_diverged_training_left_nan() {
    // Before: "matches its spec and robot kind sim/pick: ok", and every action `reflex run`
    // then asked for was NaN (blocked by safety at every step).
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("pick.onnx");
    std::fs::copy(
        repo().join("models/pick.policy.toml"),
        dir.path().join("pick.policy.toml"),
    )
    .unwrap();
    let script = "import onnx, numpy, sys\n\
                  m = onnx.load(sys.argv[1])\n\
                  t = next(t for t in m.graph.initializer if t.data_type == 1 and len(t.dims) == 2)\n\
                  a = onnx.numpy_helper.to_array(t).copy()\n\
                  a.flat[0] = numpy.nan\n\
                  t.CopyFrom(onnx.numpy_helper.from_array(a, t.name))\n\
                  onnx.save(m, sys.argv[2])\n\
                  print(t.name)\n";
    let out = std::process::Command::new(python())
        .args(["-c", script])
        .arg(repo().join("models/pick.onnx"))
        .arg(&bad)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let name = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let o = reflex()
        .current_dir(repo())
        .args(["policy", "check", "--model"])
        .arg(&bad)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "a NaN model passed: {err}");
    assert!(err.contains(&name) && err.contains("NaN"), "{err}");
    // The shipped model itself passes.
    run_ok(
        reflex()
            .current_dir(repo())
            .args(["policy", "check", "--model", "models/pick.onnx"]),
    );
}

#[test]
fn with_real_time_chunking_the_shipped_diffusion_policy_keeps_what_the_robot_executes() {
    // models/pick.onnx is a diffusion policy. Given the chunk the robot executes meanwhile,
    // real-time chunking returns its first `delay` rows exactly (robot units, bit for bit),
    // stays closer to it over the rest of the overlap than plain sampling from the same noise,
    // and without a prefix or with it off is plain sampling, bit for bit.
    use reflex_policies::rtc::{RtcConfig, RtcVariant};
    use reflex_runtime::policy::{ChunkPrefix, Policy};
    let mut env =
        reflex_sim::SimEnv::new(reflex_sim::SimConfig::for_task(reflex_sim::TaskKind::Pick))
            .unwrap();
    let spec = env.spec().clone();
    let model = repo().join("models/pick.onnx");
    let opts = RunOptions::default();
    let mut rtc = OnnxPolicy::load(&model, &spec, &opts).unwrap();
    let mut plain = OnnxPolicy::load(&model, &spec, &opts).unwrap();
    assert!(!rtc.wants_prefix(), "off by default");
    rtc.set_rtc(RtcConfig {
        enabled: true,
        ..RtcConfig::default()
    });
    assert!(rtc.wants_prefix());
    let (len, dim) = (rtc.spec().chunk_len, rtc.spec().action_dim);
    let n = len * dim;
    let obs = env.reset(Some(4)).unwrap().clone();
    // What the robot executes: the policy's own chunk from another observation and noise,
    // covering 6 rows of the new chunk, 3 of them before it arrives.
    let other = env.reset(Some(9)).unwrap().clone();
    let mut executing = vec![0.0f32; n];
    plain.set_next_noise(vec![0.3; n]);
    plain.infer_chunk(&other, &mut executing).unwrap();
    let (covered, delay) = (6.min(len), 3.min(len));
    let noise: Vec<f32> = (0..n)
        .map(|i| ((i * 37 % 23) as f32 / 11.5) - 1.0)
        .collect();
    let prefix = ChunkPrefix {
        actions: &executing,
        covered,
        delay,
    };
    let mut a = vec![0.0f32; n];
    rtc.set_next_noise(noise.clone());
    rtc.infer_with_prefix(&obs, &prefix, &mut a).unwrap();
    assert_eq!(
        rtc.rtc_variant(),
        Some(RtcVariant::Hard),
        "no VJP graph: hard"
    );
    assert_eq!(
        a[..delay * dim]
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>(),
        executing[..delay * dim]
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>(),
        "the frozen rows are what the robot executes"
    );
    let mut b = vec![0.0f32; n];
    plain.set_next_noise(noise.clone());
    plain.infer_chunk(&obs, &mut b).unwrap();
    let gap = |x: &[f32], rows: std::ops::Range<usize>| -> f32 {
        rows.flat_map(|r| (0..dim).map(move |c| r * dim + c))
            .map(|j| (x[j] - executing[j]).abs())
            .sum()
    };
    // The action at the boundary: the first row the new chunk executes.
    assert!(
        gap(&a, delay..delay + 1) < gap(&b, delay..delay + 1),
        "boundary jump with RTC {} vs plain {}",
        gap(&a, delay..delay + 1),
        gap(&b, delay..delay + 1)
    );
    // No prefix: plain sampling, bit for bit.
    let mut c = vec![0.0f32; n];
    rtc.set_next_noise(noise.clone());
    rtc.infer(&obs, &mut c).unwrap();
    assert_eq!(rtc.rtc_variant(), None);
    assert_eq!(c, b);
    // Off: the prefix is ignored.
    rtc.set_rtc(RtcConfig::default());
    rtc.set_next_noise(noise);
    rtc.infer_with_prefix(&obs, &prefix, &mut c).unwrap();
    assert_eq!(c, b);
}

#[test]
fn a_flow_policy_wider_than_the_robot_samples_every_component_and_hands_the_robot_its_own() {
    // SmolVLA and pi0 pad actions to 32 and integrate all of them; the padding is state of the
    // integration, so sampling only the robot's components would give other actions. A hand-made
    // velocity v = x M + obs W couples the two padded components into the robot's four.
    use reflex_policies::onnx_write::{Dim, Elem, Graph, batch};
    let (t_rows, width, adim, sdim) = (3usize, 6usize, 4usize, 8usize);
    let m: Vec<f32> = (0..width * width)
        .map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.1)
        .collect();
    let w: Vec<f32> = (0..sdim * width)
        .map(|i| (i as f32 * 0.37).sin() * 0.2)
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let mut g = Graph::new();
    let x = g.input(
        "x_t",
        Elem::F32,
        vec![batch(), Dim::Fixed(t_rows as i64), Dim::Fixed(width as i64)],
    );
    let _t = g.input("t", Elem::F32, vec![batch(), Dim::Fixed(1)]);
    let obs = g.input("obs", Elem::F32, vec![batch(), Dim::Fixed(sdim as i64)]);
    let mc = g.constant("m", &[width as i64, width as i64], &m);
    let wc = g.constant("w", &[sdim as i64, width as i64], &w);
    let xm = g.op("MatMul", &[&x, &mc], vec![]);
    let ow = g.op("MatMul", &[&obs, &wc], vec![]);
    let ow = g.reshape(&ow, &[-1, 1, width as i64]);
    let v = g.op("Add", &[&xm, &ow], vec![]);
    g.output(
        &v,
        "v",
        Elem::F32,
        vec![batch(), Dim::Fixed(t_rows as i64), Dim::Fixed(width as i64)],
    );
    let mut spec = PolicySpec::chunk("wide", (adim, t_rows, t_rows), "obs", "v");
    spec.kind = PolicyKind::Flow;
    spec.flow_steps = 5;
    spec.model_action_dim = Some(width);
    spec.graph.sample_input = Some("x_t".into());
    spec.graph.time_input = Some("t".into());
    let model = write(dir.path(), "wide", &g.to_bytes("wide", "test"), &spec);
    let robot = NullRobot::new("r", sdim, 0).spec().clone();
    let mut policy = OnnxPolicy::load(&model, &robot, &RunOptions::default()).unwrap();
    assert_eq!(
        policy.noise_len(),
        t_rows * width,
        "noise covers the padding"
    );
    let why = policy.rtc_unsupported().expect("RTC is refused");
    assert!(why.contains("model_action_dim"), "{why}");

    let noise: Vec<f32> = (0..t_rows * width)
        .map(|i| (i as f32 * 0.91).cos())
        .collect();
    let obs = Observation {
        state: (0..sdim).map(|i| i as f32 * 0.1 - 0.3).collect(),
        ..Default::default()
    };
    // Euler by hand over all six components.
    let integrate = |wd: usize| {
        let mut x: Vec<f64> = (0..t_rows)
            .flat_map(|r| (0..wd).map(move |c| (r, c)))
            .map(|(r, c)| f64::from(noise[r * width + c]))
            .collect();
        let c: Vec<f64> = (0..wd)
            .map(|j| {
                (0..sdim)
                    .map(|k| f64::from(obs.state[k] * w[k * width + j]))
                    .sum()
            })
            .collect();
        for _ in 0..5 {
            let v: Vec<f64> = (0..t_rows * wd)
                .map(|i| {
                    let (r, j) = (i / wd, i % wd);
                    (0..wd)
                        .map(|k| x[r * wd + k] * f64::from(m[k * width + j]))
                        .sum::<f64>()
                        + c[j]
                })
                .collect();
            for (xi, vi) in x.iter_mut().zip(&v) {
                *xi += 0.2 * vi;
            }
        }
        (0..t_rows)
            .flat_map(|r| (0..adim).map(move |j| (r, j)))
            .map(|(r, j)| x[r * wd + j] as f32)
            .collect::<Vec<f32>>()
    };
    let want = integrate(width);
    let mut got = vec![0.0f32; t_rows * adim];
    policy.set_next_noise(noise.clone());
    policy.infer_chunk(&obs, &mut got).unwrap();
    let diff = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(
        diff < 1e-4,
        "robot's part of the 6-wide integration: {diff}"
    );
    // Integrating only the robot's four components would have been visibly wrong.
    let narrow = integrate(adim);
    let off = narrow
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(off > 1e-2, "the padding must matter in this test: {off}");
}
