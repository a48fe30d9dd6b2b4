//! The learner that sees: SAC with SERL's image heads on a frozen encoder's feature maps. The
//! heads learn through the critic alone (the actor reads them detached); the loop's plain-Rust
//! copy, the exported ONNX residual and a checkpoint all carry them.

use crate::alloc_count;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use reflex_learn::sac::replay::Transition;
use reflex_learn::sac::{Mode, Sac, SacConfig, VisionHeads};
use reflex_vision::head::FeatureShape;

/// The feature map of a "camera" that sees a target at `t` in [-1, 1]: channel 0 holds a bump
/// at the target's column (of 6) in every row, channel 1 a fixed pattern, channel 2 noise. Only
/// the map says where the target is.
fn map(t: f32, rng: &mut ChaCha8Rng) -> Vec<f32> {
    let (h, w) = (3, 6);
    let col = (t + 1.0) * 0.5 * (w - 1) as f32;
    let mut out = Vec::with_capacity(3 * h * w);
    for _ in 0..h {
        for x in 0..w {
            out.push((1.0 - (x as f32 - col).abs()).max(0.0));
        }
    }
    for y in 0..h {
        for x in 0..w {
            out.push(((x + y) % 2) as f32);
        }
    }
    out.extend((0..h * w).map(|_| 0.2 * rng.random::<f32>()));
    out
}

fn shape() -> FeatureShape {
    FeatureShape {
        camera: "front".into(),
        channels: 3,
        height: 3,
        width: 6,
    }
}

fn config(vision: bool, seed: u64) -> SacConfig {
    SacConfig {
        mode: Mode::Full,
        hidden: vec![64, 64],
        batch: 64,
        actor_layer_norm: true,
        init_temperature: 0.01,
        seed,
        vision: vision.then(|| VisionHeads {
            encoder_id: "test-encoder".into(),
            features: vec![shape()],
            embeddings: 8,
            width: 32,
            bc_trains_heads: true,
            shift: 0,
        }),
        ..Default::default()
    }
}

/// A one-step task: reward `-|a - t|`, the episode ends after the action. The state is a
/// constant; with `vision` the row carries the map of the target, without it the learner is
/// blind. Returns the learner after `steps` environment steps (one update each) and its mean
/// error on 200 fresh targets with the deterministic action.
fn train_on_targets(vision: bool, seed: u64, steps: usize) -> (Sac, f32) {
    let mut sac = Sac::new(config(vision, seed), 1, 1).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed + 100);
    let row = |t: f32, rng: &mut ChaCha8Rng| -> Vec<f32> {
        let mut r = vec![1.0];
        if vision {
            r.extend(map(t, rng));
        }
        r
    };
    for _ in 0..steps {
        let t = rng.random::<f32>() * 1.6 - 0.8;
        let obs = row(t, &mut rng);
        let a = sac.act(&obs, &[], false).unwrap();
        sac.online.push(&Transition {
            next_obs: obs.clone(),
            obs,
            action: a.clone(),
            reward: -(a[0] - t).abs(),
            terminated: true,
            ..Default::default()
        });
        sac.train_step().unwrap();
    }
    let mut err = 0.0;
    for _ in 0..200 {
        let t = rng.random::<f32>() * 1.6 - 0.8;
        let a = sac.act(&row(t, &mut rng), &[], true).unwrap();
        err += (a[0] - t).abs() / 200.0;
    }
    (sac, err)
}

#[test]
fn a_learner_that_sees_finds_a_target_only_its_camera_shows_and_a_blind_one_cannot() {
    // A blind learner's best is the middle, |t| on average (0.4). Measured after 1500 steps,
    // seeds 1/2/3: seeing 0.022/0.026/0.014, blind 0.409/0.380/0.410.
    for seed in [1, 2] {
        let (_, blind) = train_on_targets(false, seed, 1500);
        let (sac, seeing) = train_on_targets(true, seed, 1500);
        assert!(
            blind > 0.3,
            "seed {seed}: a blind learner hit targets ({blind})"
        );
        assert!(
            seeing < 0.1,
            "seed {seed}: the learner that sees missed its targets by {seeing} on average (blind {blind})"
        );
        assert!(sac.counters.critic_updates > 1000);
    }
}

/// 64 rows of `sac`'s buffers, `demo_ratio` of them demonstrations, one-step returns.
fn batch_of(sac: &Sac, demo_ratio: f64) -> reflex_learn::sac::replay::Batch {
    let mut b = Default::default();
    let ns = reflex_learn::sac::replay::NStep {
        n: 1,
        gamma: 0.99,
        bootstrap_truncation: true,
    };
    reflex_learn::sac::replay::sample_mixed(
        &sac.online,
        &sac.demo,
        64,
        demo_ratio,
        &ns,
        &mut ChaCha8Rng::seed_from_u64(1),
        &mut b,
    );
    b
}

#[test]
fn the_heads_learn_from_the_critic_only_and_the_target_heads_follow() {
    let (mut sac, _) = train_on_targets(true, 3, 300);
    let heads = |s: &Sac| s.heads[0].flat().unwrap();
    let targets = |s: &Sac| s.target_heads[0].flat().unwrap();
    let (h0, t0) = (heads(&sac), targets(&sac));
    // The actor's update leaves the heads alone...
    let batch = batch_of(&sac, 0.0);
    sac.actor_update(&batch).unwrap();
    assert_eq!(heads(&sac), h0, "the actor's loss moved the shared heads");
    // ...the critic's moves them, and the target heads move a tau-step towards them.
    sac.critic_update(&batch).unwrap();
    let h1 = heads(&sac);
    assert_ne!(h1, h0, "the critic's loss did not train the heads");
    let t1 = targets(&sac);
    let tau = sac.cfg.tau as f32;
    for ((t1, t0), h1) in t1.iter().zip(&t0).zip(&h1) {
        assert!((t1 - (tau * h1 + (1.0 - tau) * t0)).abs() < 1e-6);
    }
}

#[test]
fn the_persons_corrections_train_the_heads_through_the_actors_cloning_term_only_when_asked() {
    // The actor's Q term never moves the heads; its behaviour-cloning term on demonstration
    // rows does with `bc_trains_heads` (the default), and does not without it (SERL's heads).
    for trains in [true, false] {
        let mut cfg = config(true, 4);
        cfg.bc_weight = 1.0;
        cfg.demo_ratio = 0.5;
        cfg.vision.as_mut().unwrap().bc_trains_heads = trains;
        let mut sac = Sac::new(cfg, 1, 1).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        for k in 0..200 {
            let t = rng.random::<f32>() * 1.6 - 0.8;
            let mut obs = vec![1.0];
            obs.extend(map(t, &mut rng));
            let tr = Transition {
                next_obs: obs.clone(),
                obs,
                action: vec![t],
                reward: 0.0,
                terminated: true,
                intervention: k % 2 == 0,
                ..Default::default()
            };
            if k % 2 == 0 {
                sac.demo.push(&tr);
            } else {
                sac.online.push(&tr);
            }
        }
        let batch = batch_of(&sac, 0.5);
        assert_eq!(batch.demo_rows, 32);
        let h0 = sac.heads[0].flat().unwrap();
        sac.actor_update(&batch).unwrap();
        let moved = sac.heads[0].flat().unwrap() != h0;
        assert_eq!(
            moved, trains,
            "bc_trains_heads = {trains}: the actor's update moved the heads: {moved}"
        );
    }
}

#[test]
fn the_loop_hook_and_the_exported_residual_carry_the_heads_and_agree_with_the_learner() {
    use reflex_learn::sac::export::{ExportInfo, ResidualModel, write_residual};
    use reflex_learn::sac::hook::{ActionNorm, ResidualMlp, export_actor};
    use reflex_runtime::residual::ResidualHook;
    let (mut sac, _) = train_on_targets(true, 4, 400);
    let norm = ActionNorm::new(&[-2.0], &[2.0], &[]);
    let (mut hook, mut writer) = ResidualMlp::new(&sac, norm.clone(), false, 0).unwrap();
    writer.publish(1, &export_actor(&sac).unwrap());
    assert_eq!(hook.refresh(), 1);
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let rows: Vec<Vec<f32>> = (0..200)
        .map(|_| {
            let mut r = vec![1.0];
            r.extend(map(rng.random::<f32>() * 2.0 - 1.0, &mut rng));
            r
        })
        .collect();
    let base = [0.0f32];
    let mut out = [0.0f32];
    let mut spread = (f32::MAX, f32::MIN);
    for r in &rows {
        hook.residual(r, &base, &mut out);
        let mut a = sac.act(r, &[], true).unwrap();
        norm.to_robot(&mut a);
        assert!(
            (out[0] - a[0]).abs() < 1e-4,
            "hook {} vs learner {}",
            out[0],
            a[0]
        );
        spread = (spread.0.min(out[0]), spread.1.max(out[0]));
    }
    assert!(
        spread.1 - spread.0 > 0.5,
        "the action hardly depends on the picture: {spread:?}"
    );
    // On the loop the heads allocate nothing.
    let (_, allocs) = alloc_count::count(|| {
        for r in &rows {
            hook.residual(r, &base, &mut out);
        }
    });
    assert_eq!(allocs, 0, "the hook with image heads allocated");

    // The exported file: heads inside, one feature input per camera, the learner's numbers.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("seeing.onnx");
    let info = ExportInfo {
        name: "seeing",
        action_low: &[-2.0],
        action_high: &[2.0],
        base_model: None,
        provenance: "test".into(),
    };
    let spec = write_residual(&sac, &info, &file).unwrap();
    assert_eq!(spec.vision, sac.cfg.vision, "the spec names the heads");
    let m = ResidualModel::load(&file).unwrap();
    assert_eq!(m.spec, spec);
    let gap = m.check_with_ort(300, 2).unwrap();
    assert!(gap < 1e-4, "ONNX Runtime and the hook differ by {gap}");
    let mut kept = m.hook();
    for r in &rows {
        let mut b = [0.0f32];
        hook.residual(r, &base, &mut out);
        kept.residual(r, &base, &mut b);
        assert_eq!(out, b, "the kept file's hook and the live one");
    }
    // A spec that names a camera the graph has no head for is refused, naming the weight.
    let sp = reflex_policies::spec::spec_path(&file);
    let text = std::fs::read_to_string(&sp).unwrap();
    std::fs::write(
        &sp,
        text.replace("camera = \"front\"", "camera = \"wrist\""),
    )
    .unwrap();
    let e = ResidualModel::load(&file).unwrap_err().to_string();
    assert!(
        e.contains("seeing.onnx") && e.contains("head.wrist.kernel"),
        "{e}"
    );
}

#[test]
fn a_replay_too_large_for_any_robots_memory_is_refused_naming_the_capacity_that_fits() {
    let mut cfg = config(true, 1);
    cfg.vision.as_mut().unwrap().features[0] = FeatureShape {
        camera: "front".into(),
        channels: 8,
        height: 32,
        width: 32,
    };
    let e = Sac::new(cfg.clone(), 10, 2).err().unwrap().to_string();
    assert!(
        e.contains("capacity = 1000000") && e.contains("set capacity to 243783 or fewer"),
        "{e}"
    );
    cfg.capacity = 100_000;
    assert!(Sac::new(cfg, 10, 2).is_ok());
}

#[test]
fn a_checkpoint_keeps_the_heads_and_resumes_exactly() {
    let (mut sac, _) = train_on_targets(true, 5, 200);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sac.ckpt");
    sac.save(&path).unwrap();
    let mut back = Sac::load(&path).unwrap();
    assert_eq!(back.parameters().unwrap(), sac.parameters().unwrap());
    assert_eq!((back.obs_dim, back.state_dim), (1 + shape().len(), 1));
    for _ in 0..20 {
        sac.train_step().unwrap();
        back.train_step().unwrap();
    }
    assert_eq!(
        back.parameters().unwrap(),
        sac.parameters().unwrap(),
        "a resumed learner that sees diverged from the one that never stopped"
    );
}

/// The encoder thread beside the loop with the real frozen encoder on the simulator's frames:
/// the newest frame's maps arrive named by their step, equal to encoding that frame directly, and
/// the loop's side (offer, take the newest) allocates nothing once warm.
#[test]
fn the_encoder_thread_gives_the_loop_the_newest_frames_maps_without_allocating() {
    use rand::SeedableRng;
    use reflex_contracts::robot::Robot;
    use reflex_policies::features::{FeatureEncoder, encoder_spec_path};
    use reflex_runtime::features::FeatureFeed;
    use reflex_vision::encoder::{ImageEncoder, frozen_encoder};
    let dir = tempfile::tempdir().unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let encoders: Vec<ImageEncoder> = ["front", "wrist"]
        .iter()
        .map(|c| ImageEncoder::new(c, 32, 32, &mut rng, &candle_core::Device::Cpu).unwrap())
        .collect();
    let (bytes, spec) = frozen_encoder(&encoders, "feed", None).unwrap();
    let path = dir.path().join("feed.encoder.onnx");
    std::fs::write(&path, bytes).unwrap();
    std::fs::write(encoder_spec_path(&path), spec.to_toml()).unwrap();
    let mut direct = FeatureEncoder::load(&path, &Default::default()).unwrap();
    let threaded = FeatureEncoder::load(&path, &Default::default()).unwrap();
    let mut cfg = reflex_sim::config::SimConfig::for_task(reflex_sim::task::TaskKind::Pick);
    cfg.cameras.enabled = true;
    cfg.cameras.width = 32;
    cfg.cameras.height = 32;
    let mut env = reflex_sim::env::SimEnv::new(cfg).unwrap();
    let template = env.reset(Some(3)).unwrap().images.clone();
    let mut feed = FeatureFeed::start(Box::new(threaded), &template).unwrap();
    let mut hold = vec![0.0; env.spec().action.dim()];
    env.hold_action(&mut hold);
    let mut step_once = |feed: &mut FeatureFeed, step: u64| {
        env.command(&hold).unwrap();
        let obs = env.observe().unwrap().clone();
        feed.offer(step, &obs.images);
        obs
    };
    let mut last = None;
    for step in 1..=5 {
        last = Some(step_once(&mut feed, step));
    }
    let wait = |feed: &mut FeatureFeed, step: u64| -> Vec<f32> {
        let t0 = std::time::Instant::now();
        loop {
            if let Some((s, v)) = feed.latest()
                && s == step
            {
                return v.to_vec();
            }
            assert!(t0.elapsed().as_secs() < 30, "no maps of step {step}");
            std::thread::yield_now();
        }
    };
    let got = wait(&mut feed, 5);
    let mut want = vec![0.0; direct.features_len()];
    direct.encode(&last.unwrap().images, &mut want).unwrap();
    assert_eq!(
        got, want,
        "the thread's maps and a direct encoding of the same frame"
    );
    // The loop's side allocates nothing: offering the same frame again and taking the newest.
    let frame = env.observe().unwrap().images.clone();
    let (_, allocs) = alloc_count::count(|| {
        for step in 6..=105u64 {
            feed.offer(step, &frame);
            let _ = feed.latest();
        }
    });
    assert_eq!(allocs, 0, "offer/latest allocated on the loop's thread");
    wait(&mut feed, 105);
    let c = feed.counts();
    assert_eq!((c.offered, c.errors), (105, 0), "{c:?}");
}

/// Writes a frozen encoder for the simulator's two cameras at 32x32 (random weights: what
/// matters here is that maps flow, are checked and are learned from) as `dir/<name>.encoder.onnx`
/// with its spec.
fn write_encoder(dir: &std::path::Path, name: &str, seed: u64) -> std::path::PathBuf {
    use reflex_policies::features::encoder_spec_path;
    use reflex_vision::encoder::{ImageEncoder, frozen_encoder};
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let encoders: Vec<ImageEncoder> = ["front", "wrist"]
        .iter()
        .map(|c| ImageEncoder::new(c, 32, 32, &mut rng, &candle_core::Device::Cpu).unwrap())
        .collect();
    let (bytes, spec) = frozen_encoder(&encoders, name, None).unwrap();
    let path = dir.join(format!("{name}.encoder.onnx"));
    std::fs::write(&path, bytes).unwrap();
    std::fs::write(encoder_spec_path(&path), spec.to_toml()).unwrap();
    path
}

/// A run config on `pick` with both cameras at 32x32 and the shipped state policy as the base;
/// `tail` adds the rest (clock, learner, residual).
fn seeing_config(dir: &std::path::Path, name: &str, tail: &str) -> std::path::PathBuf {
    let model = crate::common::repo().join("models/pick.onnx");
    let text = format!(
        r#"[robot]
source = "sim"

[sim]
task = "pick"
control_hz = 50.0

[sim.cameras]
enabled = true
width = 32
height = 32

[policy]
kind = "onnx"
model = {model:?}
{tail}"#
    );
    let p = dir.join(format!("{name}.toml"));
    std::fs::write(&p, text).unwrap();
    p
}

/// The learner that sees through the real binary, the way a user runs it: `reflex run` with
/// `[learner.vision]` encodes every frame with the frozen encoder and sends the maps with each
/// step; an in-process learner (simulated time, the encoder inline) and then a `reflex learn` in
/// another process (wall time, the encoder on its own thread) take every step, refuse none, and
/// keep a residual with the heads; `reflex run` with that kept residual finds its encoder and
/// runs; a config naming another encoder is refused against the checkpoint.
#[test]
fn reflex_run_with_learner_vision_sends_maps_a_learner_in_another_process_takes_and_keeps() {
    use crate::common::{child_stderr, json_output, reflex, spawn, unix_endpoint};
    let dir = tempfile::tempdir().unwrap();
    write_encoder(dir.path(), "cams", 5);
    let ckpt = dir.path().join("learner/sac.ckpt");
    let learner = format!(
        "[learner]\ncheckpoint = {:?}\ncheckpoint_every_s = 0.2\n\n[learner.vision]\nencoder = \"cams.encoder.onnx\"\n\n[learner.sac]\ncapacity = 20000\nbatch = 32\n",
        ckpt.display().to_string()
    );
    // 1. Simulated time, learner in process: the maps of each frame itself.
    let cfg = seeing_config(
        dir.path(),
        "sim",
        &format!("\n[run]\nepisodes = 3\nseed = 3\nclock = \"sim\"\n\n{learner}"),
    );
    let v = json_output(reflex().args(["run", "--json", "--config"]).arg(&cfg));
    let l = &v["learner"];
    let sent = v["learner_link"]["steps"].as_u64().unwrap();
    eprintln!("in process: features {} learner {l}", v["features"]);
    assert!(sent > 100, "{v}");
    assert_eq!(l["received"].as_u64(), Some(sent), "{l}");
    assert_eq!(l["rejected_steps"], 0, "{l}");
    assert!(l["updates"].as_u64().unwrap() > 0, "{l}");
    let f = &v["features"];
    assert!(
        f["encoder"]
            .as_str()
            .unwrap()
            .starts_with("cams.encoder.onnx#"),
        "{f}"
    );
    assert_eq!(f["loop"]["stale"], 0, "inline maps are never stale: {f}");
    assert_eq!(f["loop"]["errors"], 0, "{f}");
    let residual = reflex_learn::sac::export::ResidualModel::load(
        &reflex_agent::learner::residual_path(&ckpt),
    )
    .unwrap();
    let vision = residual
        .spec
        .vision
        .as_ref()
        .expect("the kept residual has heads");
    assert_eq!(vision.features.len(), 2);
    // 2. Wall time, the learner in its own process, resuming from that checkpoint.
    let cfg = seeing_config(
        dir.path(),
        "wall",
        &format!(
            "\n[run]\nepisodes = 2\nseed = 4\nclock = \"wall\"\n\n{}\n[learner.link]\ndrain_s = 60.0\n",
            learner.replace("[learner]\n", "[learner]\nin_process = false\n")
        ),
    );
    let ep = unix_endpoint(&dir, "see");
    let mut lrn = reflex();
    lrn.args([
        "learn",
        "--json",
        "--exit-when-actor-leaves",
        "--no-multicast",
        "--wait-s",
        "60",
        "--listen",
        &ep,
        "--config",
    ])
    .arg(&cfg);
    let mut lrn = spawn(lrn, &dir, "learner");
    let v = json_output(
        reflex()
            .args([
                "run",
                "--json",
                "--no-multicast",
                "--connect",
                &ep,
                "--config",
            ])
            .arg(&cfg),
    );
    let status = lrn.0.wait().unwrap();
    assert!(status.success(), "{}", child_stderr(&dir, "learner"));
    let lv: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("learner.out")).unwrap())
            .unwrap();
    let sent = v["learner_link"]["steps"].as_u64().unwrap();
    eprintln!("separate: features {} learner {lv}", v["features"]);
    assert!(lv["resumed_at"].as_u64().unwrap() > 100, "{lv}");
    // A new actor: its own stream, counted from its first step beside the earlier actor's
    // position from the checkpoint, into the buffer the learner resumed.
    let fresh: Vec<&serde_json::Value> = lv["actors"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["resumed_at"] == 0)
        .collect();
    assert_eq!(fresh.len(), 1, "{lv}");
    assert_eq!(fresh[0]["received"].as_u64(), Some(sent), "{lv}");
    assert_eq!(
        lv["received"].as_u64().unwrap(),
        lv["resumed_at"].as_u64().unwrap() + sent,
        "{lv}"
    );
    assert_eq!(
        lv["online_buffer"].as_u64().unwrap(),
        lv["resumed_at"].as_u64().unwrap() + sent,
        "{lv}"
    );
    assert_eq!(lv["rejected_steps"], 0, "{lv}");
    let t = &v["features"]["thread"];
    assert!(t["encoded"].as_u64().unwrap() > 0, "{t}");
    assert_eq!(t["errors"], 0, "{t}");
    // 3. The kept residual runs with no learner; its encoder is found beside the config's files.
    let kept = reflex_agent::learner::residual_path(&ckpt);
    let cfg = seeing_config(
        dir.path(),
        "kept",
        &format!(
            "\n[policy.residual]\nmodel = {:?}\nencoder = \"cams.encoder.onnx\"\n\n[run]\nepisodes = 2\nseed = 9\nclock = \"sim\"\n",
            kept.display().to_string()
        ),
    );
    let v = json_output(reflex().args(["run", "--json", "--config"]).arg(&cfg));
    assert_eq!(v["episodes"], 2, "{v}");
    assert_eq!(v["features"]["loop"]["stale"], 0, "{v}");
    // Without `encoder`, the file named in the residual's spec is looked for beside it.
    for f in ["cams.encoder.onnx", "cams.encoder.toml"] {
        std::fs::copy(dir.path().join(f), kept.parent().unwrap().join(f)).unwrap();
    }
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("encoder = \"cams.encoder.onnx\"\n", "");
    std::fs::write(&cfg, text).unwrap();
    let v = json_output(reflex().args(["run", "--json", "--config"]).arg(&cfg));
    assert_eq!(v["episodes"], 2, "{v}");
    assert!(
        v["features"]["encoder"]
            .as_str()
            .unwrap()
            .starts_with("cams.encoder.onnx#"),
        "{v}"
    );
    // 4. Another encoder against that checkpoint: refused, naming both.
    write_encoder(dir.path(), "other", 6);
    let cfg = seeing_config(
        dir.path(),
        "other",
        &format!("\n[run]\nepisodes = 1\nclock = \"sim\"\n\n{learner}")
            .replace("cams.encoder.onnx", "other.encoder.onnx"),
    );
    let o = reflex()
        .args(["run", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("sac.ckpt")
            && err.contains("cams.encoder.onnx#")
            && err.contains("other.encoder.onnx#"),
        "{err}"
    );
}

/// A free-running robot with one 8x4 camera whose picture changes with every command (its red
/// channel holds the step), around the bench's null robot.
struct CameraRobot {
    inner: reflex_bench::workloads::NullRobot,
    spec: reflex_contracts::msg::RobotSpec,
    obs: reflex_contracts::msg::Observation,
}

impl CameraRobot {
    fn new() -> Self {
        let inner = reflex_bench::workloads::NullRobot::new("seeing", 6, 0);
        let mut spec = reflex_contracts::robot::Robot::spec(&inner).clone();
        spec.cameras.push(reflex_contracts::msg::CameraSpec {
            name: "front".into(),
            width: 8,
            height: 4,
            intrinsics: None,
            mount: None,
        });
        let obs = reflex_contracts::msg::Observation {
            state: vec![0.0; 6],
            images: vec![reflex_contracts::msg::Image {
                camera: "front".into(),
                width: 8,
                height: 4,
                encoding: "rgb8".into(),
                data: vec![0; 8 * 4 * 3],
                seq: 0,
                age_ns: 0,
            }],
            ..Default::default()
        };
        CameraRobot { inner, spec, obs }
    }
}

impl reflex_contracts::robot::Robot for CameraRobot {
    fn spec(&self) -> &reflex_contracts::msg::RobotSpec {
        &self.spec
    }
    fn reset(
        &mut self,
        seed: Option<u64>,
    ) -> Result<&reflex_contracts::msg::Observation, reflex_contracts::robot::RobotError> {
        self.inner.reset(seed)?;
        reflex_contracts::robot::Robot::observe(self)
    }
    fn command(&mut self, action: &[f32]) -> Result<(), reflex_contracts::robot::RobotError> {
        self.inner.command(action)
    }
    fn observe(
        &mut self,
    ) -> Result<&reflex_contracts::msg::Observation, reflex_contracts::robot::RobotError> {
        let o = self.inner.observe()?;
        // Copies without allocating: the state and the picture only.
        self.obs.state.copy_from_slice(&o.state);
        (self.obs.episode, self.obs.step, self.obs.seq) = (o.episode, o.step, o.seq);
        self.obs.truncated = o.truncated;
        let step = o.step as u8;
        let img = &mut self.obs.images[0];
        img.data.iter_mut().step_by(3).for_each(|v| *v = step);
        img.seq = self.obs.seq;
        Ok(&self.obs)
    }
    fn hold_action(&self, out: &mut [f32]) {
        self.inner.hold_action(out)
    }
}

/// The mean of the red channel: the step the picture was taken at.
struct StepOfPicture;

impl reflex_runtime::features::FrameEncoder for StepOfPicture {
    fn features_len(&self) -> usize {
        2
    }
    fn encode(
        &mut self,
        images: &[reflex_contracts::msg::Image],
        out: &mut [f32],
    ) -> Result<(), String> {
        let d = &images[0].data;
        out[0] = d[0] as f32;
        out[1] = 1.0;
        Ok(())
    }
}

/// The loop with an encoder thread and a residual that reads state and maps: steady state
/// allocates nothing on the loop thread; every transition carries the maps the residual read,
/// a step's next maps are the following step's maps (the actor's view is one consistent
/// sequence), and the maps are never from a later picture than the state.
#[test]
fn a_loop_that_sees_passes_maps_to_residual_and_outbox_without_allocating() {
    use reflex_runtime::clock::SimClock;
    use reflex_runtime::control::{ControlLoop, LoopConfig, PolicyDriver};
    use reflex_runtime::features::{FeatureDriver, FeatureFeed, LoopFeatures};
    use reflex_runtime::outbox::outbox_with_features;
    use reflex_runtime::residual::LinearResidual;
    use std::time::Duration;
    let robot = CameraRobot::new();
    let template = robot.obs.images.clone();
    let feed = FeatureFeed::start(Box::new(StepOfPicture), &template).unwrap();
    let features = LoopFeatures::new(
        FeatureDriver::Thread {
            feed,
            max_age_frames: 1_000,
        },
        6,
    );
    // out = tanh(map[1] * 0.5): non-zero only when the residual read a row with maps.
    let (residual, mut weights) = LinearResidual::new(8, 4, 1.0);
    let mut w = vec![0.0; residual.len()];
    w[7] = 0.5;
    weights.publish(1, &w);
    let (tx, rx) = outbox_with_features(256, 6, 4, 2);
    let clock = SimClock::new();
    let mut lp = ControlLoop::builder(robot, clock.clone())
        .config(LoopConfig::at(100.0))
        .policy(PolicyDriver::inline(Box::new(
            reflex_bench::workloads::SweepPolicy::new(4, 2),
        )))
        .residual(Box::new(residual), false)
        .features(features)
        .outbox(tx)
        .build()
        .unwrap();
    let mut steps = Vec::new();
    let run =
        |lp: &mut ControlLoop<CameraRobot, SimClock>, n: usize, keep: bool, steps: &mut Vec<_>| {
            let encoded = |lp: &ControlLoop<CameraRobot, SimClock>| {
                lp.features().unwrap().counts().1.unwrap().encoded
            };
            for _ in 0..n {
                let before = encoded(lp);
                lp.step().unwrap();
                if keep {
                    // Waits for the encoder to take this step's frame (as a real period would
                    // leave it time to), so the next step reads fresh maps.
                    let t0 = std::time::Instant::now();
                    while encoded(lp) == before {
                        assert!(t0.elapsed().as_secs() < 20, "the encoder took no frame");
                        std::thread::yield_now();
                    }
                } else {
                    // Unpaced: the encoder keeps up as it can (skips are counted, never waited for).
                    std::thread::yield_now();
                }
                while let Some(t) = rx.try_recv() {
                    if keep {
                        steps.push((
                            t.episode,
                            t.step,
                            t.features.clone(),
                            t.next_features.clone(),
                            t.residual[0],
                        ));
                    }
                    rx.recycle(t);
                }
                clock.advance(Duration::from_millis(10));
            }
        };
    run(&mut lp, 500, true, &mut steps);
    let (counts, feed) = lp.features().unwrap().counts();
    assert!(feed.unwrap().encoded >= 500, "{feed:?}");
    assert!(
        counts.stale <= 1,
        "only the first step lacks maps: {counts:?}"
    );
    let (_, allocs) = alloc_count::count(|| run(&mut lp, 3_000, false, &mut Vec::new()));
    assert_eq!(
        allocs, 0,
        "the loop thread allocated {allocs} times in 3,000 steps"
    );
    // Maps flowed into the rows the residual read and into the transitions.
    let with_maps = steps.iter().filter(|s| s.2[1] == 1.0).count();
    assert!(
        with_maps + 1 >= steps.len() && steps.len() >= 499,
        "{with_maps} of {} steps had maps",
        steps.len()
    );
    for s in steps.iter().filter(|s| s.2[1] == 1.0) {
        assert!(
            (s.4 - 0.5f32.tanh()).abs() < 1e-6,
            "residual {} with maps",
            s.4
        );
        assert!(
            s.2[0] as u32 <= s.1,
            "maps of step {} in step {}",
            s.2[0],
            s.1
        );
    }
    for pair in steps.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if a.0 == b.0 && b.1 == a.1 + 1 {
            assert_eq!(
                a.3, b.2,
                "next maps of step {} are not step {}'s maps",
                a.1, b.1
            );
        }
    }
}
