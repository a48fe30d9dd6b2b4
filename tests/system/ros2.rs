//! reflex inside ROS 2: a `reflex run` robot seen, driven and stopped by a ROS 2 node written
//! from rmw_zenoh's design document and PyPI `rosbags` alone (`ros2_peer.py`), over the run's
//! own Zenoh endpoint.

use crate::common::{StatusWatch, python, reflex, repo, spawn, unix_endpoint};

#[test]
fn a_ros_2_node_sees_the_robot_drives_it_with_a_twist_and_latches_its_e_stop() {
    let dir = tempfile::tempdir().unwrap();
    let ep = unix_endpoint(&dir, "bus");
    let cfg = dir.path().join("ros2.toml");
    // No policy: the arm holds until the twist drives it. Wall clock: twists arrive in real time.
    std::fs::write(
        &cfg,
        format!(
            r#"[robot]
source = "sim"
name = "so101"

[sim]
task = "pick"

[sim.cameras]
enabled = true
width = 32
height = 24

[policy]
kind = "none"

[bus]
enabled = true
listen = ["{ep}"]
no_multicast = true
trace_hz = 0.0

[ros2]
enabled = true
namespace = "/lab/so101"
domain = 3

[run]
episodes = 1000
clock = "wall"
"#
        ),
    )
    .unwrap();
    let mut run = reflex();
    run.args(["run", "--config"]).arg(&cfg);
    let mut actor = spawn(run, &dir, "run");
    let status = StatusWatch::new(&ep, "so101");
    let out = std::process::Command::new(python())
        .arg(repo().join("tests/system/ros2_peer.py"))
        .args([
            "--connect",
            &ep,
            "--domain",
            "3",
            "--namespace",
            "/lab/so101",
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
        "NN /lab/so101/reflex",
        "MP /lab/so101/joint_states",
        "MP /tf",
        "MP /diagnostics",
        "MP /lab/so101/front/image_raw",
        "MP /lab/so101/wrist/camera_info",
        "MS /lab/so101/estop",
        "MS /lab/so101/servo/twist",
    ] {
        assert!(graph.contains(&want), "{want} missing from {graph:?}");
    }
    // TF: the arm's chain from its base to the tool, and both cameras on it.
    let tf = v["tf_frames"].as_object().unwrap();
    assert_eq!(tf["shoulder"], "base");
    assert_eq!(tf["tcp"], "gripper");
    assert!(tf.contains_key("front_optical_frame") && tf.contains_key("wrist_optical_frame"));
    assert_eq!(v["images"]["front"][0], 32);
    assert_eq!(v["images"]["front"][1], 24);
    assert_eq!(v["images"]["front"][2], "front_optical_frame");
    assert_eq!(v["twist"], "taken and released");
    assert_eq!(v["estop"][0], 2, "{v}");
    // reflex's own status agrees: latched by ROS 2, the attachment-less e-stop rejected.
    let s = status.wait("the e-stop latched by ros2", |m| m.stop == "latched");
    assert_eq!(s.stop_by, "ros2");
    let rejected: Vec<_> = s
        .rejected
        .iter()
        .filter(|(k, _)| k.starts_with("3/lab/so101/estop/std_msgs::msg::dds_::Bool_/RIHS01_"))
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
