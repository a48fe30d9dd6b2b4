//! reflex inside ROS 2: a `reflex run` robot seen, driven and stopped by a ROS 2 node written
//! from rmw_zenoh's design document and PyPI `rosbags` alone (`ros2_peer.py`), over the run's
//! own Zenoh endpoint.

use crate::common::{StatusWatch, python, reflex, repo, spawn, unix_endpoint};

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
