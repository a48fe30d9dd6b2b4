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

#[test]
fn the_heads_learn_from_the_critic_only_and_the_target_heads_follow() {
    let (mut sac, _) = train_on_targets(true, 3, 300);
    let heads = |s: &Sac| s.heads[0].flat().unwrap();
    let targets = |s: &Sac| s.target_heads[0].flat().unwrap();
    let (h0, t0) = (heads(&sac), targets(&sac));
    // The actor's update leaves the heads alone...
    let batch = {
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
            0.0,
            &ns,
            &mut ChaCha8Rng::seed_from_u64(1),
            &mut b,
        );
        b
    };
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
fn the_loop_hook_and_the_exported_residual_carry_the_heads_and_agree_with_the_learner() {
    use reflex_learn::sac::export::{ExportInfo, ResidualModel, write_residual};
    use reflex_learn::sac::hook::{ActionNorm, ResidualMlp, export_actor};
    use reflex_runtime::residual::ResidualHook;
    let (mut sac, _) = train_on_targets(true, 4, 400);
    let norm = ActionNorm::new(&[-2.0], &[2.0], 0.0);
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
