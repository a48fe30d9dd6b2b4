//! Joint calibration files in LeRobot's format: one written the way LeRobot writes it (Python's
//! `json.dump(..., indent=4)`, which `draccus.dump` calls) reads in reflex and comes back out byte
//! for byte; one reflex writes loads in Python as the same object.

use crate::common::python;
use reflex_calibration::{Calibration, MotorCalibration};

/// An SO-101 follower's calibration as LeRobot lays it out (motor order, a negative offset, the
/// full-turn wrist roll).
const LEROBOT_STYLE: &str = r#"
import json, sys
cal = {
    "shoulder_pan": {"id": 1, "drive_mode": 0, "homing_offset": -1510, "range_min": 776, "range_max": 3238},
    "shoulder_lift": {"id": 2, "drive_mode": 0, "homing_offset": 1340, "range_min": 817, "range_max": 3204},
    "elbow_flex": {"id": 3, "drive_mode": 0, "homing_offset": 1012, "range_min": 897, "range_max": 3113},
    "wrist_flex": {"id": 4, "drive_mode": 0, "homing_offset": -1091, "range_min": 871, "range_max": 3227},
    "wrist_roll": {"id": 5, "drive_mode": 0, "homing_offset": 0, "range_min": 0, "range_max": 4095},
    "gripper": {"id": 6, "drive_mode": 0, "homing_offset": 1297, "range_min": 2036, "range_max": 3470},
}
with open(sys.argv[1], "w") as f:
    json.dump(cal, f, indent=4)
"#;

#[test]
fn a_lerobot_calibration_file_reads_in_reflex_and_writes_back_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let theirs = dir.path().join("robots/so101_follower/my_arm.json");
    std::fs::create_dir_all(theirs.parent().unwrap()).unwrap();
    let out = std::process::Command::new(python())
        .args(["-c", LEROBOT_STYLE])
        .arg(&theirs)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let c = Calibration::read(&theirs, 4096).unwrap();
    let names: Vec<&str> = c.motors.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "shoulder_pan",
            "shoulder_lift",
            "elbow_flex",
            "wrist_flex",
            "wrist_roll",
            "gripper"
        ]
    );
    assert_eq!(
        c.motor("shoulder_pan"),
        Some(&MotorCalibration {
            id: 1,
            drive_mode: 0,
            homing_offset: -1510,
            range_min: 776,
            range_max: 3238
        })
    );
    let ours = dir.path().join("ours.json");
    c.write(&ours).unwrap();
    assert_eq!(
        std::fs::read(&ours).unwrap(),
        std::fs::read(&theirs).unwrap(),
        "reflex writes LeRobot's bytes"
    );
    // And Python reads reflex's file as the same object, in the same order.
    let check = "import json,sys; a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2])); \
                 assert list(a.items())==list(b.items()), (a, b); print('same')";
    let out = std::process::Command::new(python())
        .args(["-c", check])
        .arg(&ours)
        .arg(&theirs)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
