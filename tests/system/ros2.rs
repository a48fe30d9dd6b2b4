//! reflex inside ROS 2: a `reflex run` robot seen, driven and stopped by a ROS 2 node written
//! from rmw_zenoh's design document and PyPI `rosbags` alone (`ros2_peer.py`), over the run's
//! own Zenoh endpoint; and the loop's held ticks, which keep the robot in ROS 2 while it is
//! stopped.

use crate::alloc_count;
use crate::common::{StatusWatch, python, reflex, repo, spawn, unix_endpoint};
use reflex_contracts::msg::{ActionKind, Image, Observation, RobotSpec};
use reflex_contracts::robot::{Robot, RobotError};
use reflex_runtime::clock::SimClock;
use reflex_runtime::control::{ControlLoop, LoopConfig};
use reflex_runtime::outbox::{frames, held, outbox};
use std::time::Duration;

/// The actor's warnings about the e-stop: the raise, and anything the loop's holds add.
fn estop_warnings(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.contains("WARN"))
        .filter(|l| {
            let l = l.to_lowercase();
            (l.contains("estop") || l.contains("e-stop") || l.contains("emergency"))
                // The attachment-less e-stop's rejection is about the message, not the stop.
                && !l.contains("rejected a message")
        })
        .collect()
}

#[test]
fn a_ros_2_node_sees_the_robot_drives_it_with_a_twist_and_latches_its_e_stop() {
    let dir = tempfile::tempdir().unwrap();
    let ep = unix_endpoint(&dir, "bus");
    // The config docs/ros2.md shows (its router connection fails here, as nothing runs ROS 2),
    // listening on a socket of the test's own for the ROS 2 peer.
    let cfg = repo().join("configs/run/sim-pick-ros2.toml");
    let mut run = reflex();
    run.args(["run", "--listen", &ep, "--config"])
        .arg(&cfg)
        .env_remove("ROS_DOMAIN_ID");
    let mut actor = spawn(run, &dir, "run");
    let status = StatusWatch::new(&ep, "so101");
    let out = std::process::Command::new(python())
        .arg(repo().join("tests/system/ros2_peer.py"))
        .args([
            "--connect",
            &ep,
            "--domain",
            "0",
            "--namespace",
            "/so101",
            "--robot",
            "so101",
            "--joints",
            "shoulder_pan,shoulder_lift,elbow_flex,wrist_flex,wrist_roll,gripper",
            "--cameras",
            "front,wrist",
            "--base-frame",
            "base",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the ROS 2 peer failed: {}\nreflex run: {}",
        String::from_utf8_lossy(&out.stderr),
        crate::common::child_stderr(&dir, "run")
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // The graph as `ros2 node list` / `ros2 topic list` would build it.
    let graph: Vec<&str> = v["graph"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    for want in [
        "NN /so101/reflex",
        "MP /so101/joint_states",
        "MP /tf",
        "MP /diagnostics",
        "MP /so101/robot_description",
        "MP /so101/front/image_raw",
        "MP /so101/wrist/camera_info",
        "MS /so101/estop",
        "MS /so101/servo/twist",
    ] {
        assert!(graph.contains(&want), "{want} missing from {graph:?}");
    }
    // TF: the arm's chain from its base to the tool, and both cameras on it.
    let tf = v["tf_frames"].as_object().unwrap();
    assert_eq!(tf["shoulder"], "base");
    assert_eq!(tf["tcp"], "gripper");
    assert_eq!(
        tf["finger_left"], "gripper",
        "the URDF's joints outside the chain too"
    );
    assert_eq!(v["urdf_links"], 9);
    assert!(tf.contains_key("front_optical_frame") && tf.contains_key("wrist_optical_frame"));
    assert_eq!(v["images"]["front"][0], 64);
    assert_eq!(v["images"]["front"][1], 64);
    assert_eq!(v["images"]["front"][2], "front_optical_frame");
    assert_eq!(v["twist"], "taken and released");
    assert_eq!(v["estop"][0], 2, "{v}");
    // Latched, the robot stayed in ROS 2: joint states, TF and images kept coming, and the
    // diagnostics said it was stopped (the peer checks; here what it counted).
    assert_eq!(v["estop_repeats"], 2, "{v}");
    let h = &v["held"];
    for (topic, at_least) in [
        ("/so101/joint_states", 5),
        ("/tf", 5),
        ("/so101/front/image_raw", 2),
        ("/so101/wrist/image_raw", 2),
        ("/so101/wrist/camera_info", 2),
    ] {
        assert!(h[topic].as_u64().unwrap() >= at_least, "{topic}: {h}");
    }
    assert!(
        v["held_diagnostics"][0]
            .as_str()
            .unwrap()
            .starts_with("stopped (e-stop latched)"),
        "{v}"
    );
    // One warning for the latch, though it was held for seconds (it used to warn five times a
    // second) and ROS 2 repeated its `true` twice.
    let err = crate::common::child_stderr(&dir, "run");
    let warned = estop_warnings(&err);
    assert_eq!(warned.len(), 1, "{warned:#?}");
    assert!(warned[0].contains("EMERGENCY STOP"), "{warned:#?}");
    // reflex's own status agrees: latched by ROS 2, the attachment-less e-stop rejected.
    let s = status.wait("the e-stop latched by ros2", |m| m.stop == "latched");
    assert_eq!(s.stop_by, "ros2");
    let rejected: Vec<_> = s
        .rejected
        .iter()
        .filter(|(k, _)| k.starts_with("0/so101/estop/std_msgs::msg::dds_::Bool_/RIHS01_"))
        .collect();
    assert_eq!(rejected.len(), 1, "{:?}", s.rejected);
    assert_eq!(rejected[0].1, 1);
    unsafe { libc::kill(actor.0.id() as i32, libc::SIGTERM) };
    let code = actor.0.wait().unwrap();
    assert!(
        code.success(),
        "{code:?}: {}",
        crate::common::child_stderr(&dir, "run")
    );
}

#[test]
fn a_ros_2_name_or_rate_ros_2_would_refuse_is_an_error_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::read_to_string(repo().join("configs/run/sim-pick-ros2.toml")).unwrap();
    for (line, key, why) in [
        (
            "namespace = \"so101\"",
            "ros2.namespace",
            "must start with `/`",
        ),
        (
            "namespace = \"/so-101\"",
            "ros2.namespace",
            "letters, digits",
        ),
        ("node = \"re flex\"", "ros2.node", "letters, digits"),
        (
            "twist_timeout_s = 30.0",
            "ros2.twist_timeout_s",
            "0.01 ..= 5",
        ),
    ] {
        let f = dir.path().join("bad.toml");
        let text = base.replace("namespace = \"/so101\"", line);
        assert_ne!(text, base);
        std::fs::write(&f, text).unwrap();
        let out = reflex()
            .args(["run", "--episodes", "1", "--config"])
            .arg(&f)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success()
                && err.contains("bad.toml")
                && err.contains(key)
                && err.contains(why),
            "{line}: {err}"
        );
    }
}

/// A two-joint arm with one camera whose pixels say which observation they are from; it
/// answers every command (lockstep), so the loop observes it on held ticks too.
struct CameraArm {
    spec: RobotSpec,
    obs: Observation,
}

impl CameraArm {
    fn new() -> Self {
        let mut spec = RobotSpec::new("arm", "test/camera-arm", 20.0)
            .with_state("joint_pos", 2, "rad")
            .with_action(ActionKind::Box, &["a", "b"], -1.0, 1.0);
        spec.joints = vec!["a".into(), "b".into()];
        let obs = Observation {
            v: 1,
            state: vec![0.0; 2],
            images: vec![Image {
                camera: "front".into(),
                width: 4,
                height: 2,
                encoding: "rgb8".into(),
                data: vec![0; 24],
                seq: 0,
                age_ns: 0,
            }],
            ..Default::default()
        };
        CameraArm { spec, obs }
    }
}

impl Robot for CameraArm {
    fn spec(&self) -> &RobotSpec {
        &self.spec
    }

    fn reset(&mut self, _seed: Option<u64>) -> Result<&Observation, RobotError> {
        self.obs.episode += 1;
        self.obs.step = 0;
        Ok(&self.obs)
    }

    fn command(&mut self, action: &[f32]) -> Result<(), RobotError> {
        self.obs.seq += 1;
        self.obs.step += 1;
        self.obs.state.copy_from_slice(action);
        let img = &mut self.obs.images[0];
        img.seq = self.obs.seq;
        img.data[..8].copy_from_slice(&self.obs.seq.to_le_bytes());
        Ok(())
    }

    fn observe(&mut self) -> Result<&Observation, RobotError> {
        Ok(&self.obs)
    }

    fn hold_action(&self, out: &mut [f32]) {
        out.copy_from_slice(&self.obs.state);
    }
}

/// Which observation of [`CameraArm`] an image is from.
fn frame_number(images: &[Image]) -> u64 {
    u64::from_le_bytes(images[0].data[..8].try_into().unwrap())
}

#[test]
fn a_latched_loop_hands_its_held_robot_to_ros_2_and_allocates_nothing() {
    // The issue: while the e-stop was latched the loop sent no steps, so ROS 2's joint states,
    // TF and images stopped. Held ticks now go to their own pool (never the outbox: they are no
    // steps), state every tick here, images with the frames' cadence (every 2nd tick).
    let (otx, orx) = outbox(64, 2, 2);
    let (ftx, frx) = frames(4);
    let (htx, hrx) = held(8, 2);
    let mut lp = ControlLoop::builder(CameraArm::new(), SimClock::new())
        .config(LoopConfig::at(20.0))
        .outbox(otx)
        .frames(ftx, 2)
        .held(htx, 1)
        .build()
        .unwrap();
    let stop = lp.stop_switch().clone();
    lp.run_ticks(10).unwrap();
    while let Some(t) = orx.try_recv() {
        orx.recycle(t);
    }
    while let Some(f) = frx.try_recv() {
        frx.recycle(f);
    }
    assert!(hrx.try_recv().is_none(), "held ticks while running");
    stop.raise("test");
    // Warm-up: the held buffers reach their working sizes (their images on first use).
    let drain = |lp: &mut ControlLoop<CameraArm, SimClock>, n: u64| {
        let mut got = Vec::new();
        for _ in 0..n {
            lp.step().unwrap();
            while let Some(h) = hrx.try_recv() {
                // Pixels only where this tick's images were copied (a buffer's images are
                // another tick's, or none yet, otherwise).
                let px = h.fresh_images.then(|| frame_number(&h.images));
                got.push((h.t, h.fresh_images, px, h.state.len()));
                hrx.recycle(h);
            }
        }
        got
    };
    let warm = drain(&mut lp, 40);
    assert_eq!(warm.len(), 40, "a held tick every tick: {warm:?}");
    // The step the e-stop ended went out as usual; from here on, nothing but held ticks.
    while let Some(t) = orx.try_recv() {
        orx.recycle(t);
    }
    while let Some(f) = frx.try_recv() {
        frx.recycle(f);
    }
    // Steady state: the loop thread allocates nothing on held ticks (draining here is the
    // test's; it runs after each tick, outside the count).
    let mut allocs = 0;
    let mut got = Vec::new();
    for _ in 0..100 {
        let (_, a) = alloc_count::count(|| lp.step().unwrap());
        allocs += a;
        while let Some(h) = hrx.try_recv() {
            let px = h.fresh_images.then(|| frame_number(&h.images));
            got.push((h.t, h.fresh_images, px, h.state.len()));
            hrx.recycle(h);
        }
    }
    assert_eq!(allocs, 0, "{allocs} allocations in 100 held ticks");
    assert_eq!(got.len(), 100, "one held observation per tick");
    assert!(orx.try_recv().is_none(), "a held tick went to the outbox");
    assert!(frx.try_recv().is_none(), "a held tick went to the frames");
    let fresh: Vec<_> = got.iter().filter(|g| g.1).collect();
    assert_eq!(fresh.len(), 50, "images every 2nd held tick");
    // Each carries the images of its own tick (the arm numbers its frames), the whole state,
    // and the loop's time, one control period apart.
    for w in fresh.windows(2) {
        assert_eq!(w[1].2.unwrap(), w[0].2.unwrap() + 2, "{w:?}");
        assert_eq!(w[1].0 - w[0].0, Duration::from_millis(100), "{w:?}");
    }
    assert!(got.iter().all(|g| g.3 == 2));
    assert_eq!(lp.stats().stopped_ticks, 140);
}
