//! Joint calibration files in LeRobot's format, so people bring the calibration they already have
//! (docs/hardware.md): a JSON object from motor name to `{id, drive_mode, homing_offset,
//! range_min, range_max}`, in the arm's motor order, written by LeRobot with
//! `draccus.dump(calibration, f, indent=4)` (Python's `json.dump` layout: four-space indent, no
//! trailing newline), under `$HF_LEROBOT_CALIBRATION/{robots|teleoperators}/<type>/<id>.json`.
//!
//! [`Calibration::to_json`] writes that layout byte for byte, motor order kept, so a file goes
//! back and forth between reflex and LeRobot unchanged.
//!
//! Cameras: the lens model and its files ([`camera`]), boards and their detection ([`board`]),
//! detected corners checked against the board's geometry ([`corner_check`]),
//! intrinsics ([`intrinsics`]) and hand-eye ([`hand_eye`]), on nalgebra with a small
//! Levenberg-Marquardt ([`lm`]).

pub mod board;
pub mod camera;
pub mod corner_check;
pub mod hand_eye;
pub mod intrinsics;
pub mod lm;

use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use std::path::{Path, PathBuf};

/// One motor's calibration (LeRobot's `MotorCalibration`, fields in its order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MotorCalibration {
    /// Servo id on the bus.
    pub id: i64,
    /// 0, or 1 when the motor's direction is inverted.
    pub drive_mode: i64,
    /// Offset written to the servo's homing register, steps.
    pub homing_offset: i64,
    /// Lowest position of the joint's range, steps.
    pub range_min: i64,
    /// Highest position, steps.
    pub range_max: i64,
}

/// An arm's calibration: motors by name, in the file's order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Calibration {
    /// (motor name, calibration), in order.
    pub motors: Vec<(String, MotorCalibration)>,
}

/// Why a calibration file cannot be used; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum CalibrationError {
    /// Reading or writing failed.
    #[error("calibration file `{path}`: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// Not a calibration in LeRobot's format.
    #[error("calibration file `{path}` is not a LeRobot calibration: {message}")]
    Format {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// Values that no arm has.
    #[error(
        "calibration file `{path}`: motor `{motor}`: {message}; calibrate again (reflex calibrate joints, or lerobot-calibrate)"
    )]
    Invalid {
        /// The file.
        path: String,
        /// The motor.
        motor: String,
        /// What is wrong.
        message: String,
    },
}

impl<'de> Deserialize<'de> for Calibration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Ordered;
        impl<'de> Visitor<'de> for Ordered {
            type Value = Calibration;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object from motor name to {id, drive_mode, homing_offset, range_min, range_max}")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Calibration, A::Error> {
                let mut motors = vec![];
                while let Some((name, c)) = m.next_entry::<String, MotorCalibration>()? {
                    motors.push((name, c));
                }
                Ok(Calibration { motors })
            }
        }
        d.deserialize_map(Ordered)
    }
}

impl Calibration {
    /// The motor called `name`.
    pub fn motor(&self, name: &str) -> Option<&MotorCalibration> {
        self.motors.iter().find(|(n, _)| n == name).map(|(_, c)| c)
    }

    /// Parses the text of a calibration file (`path` names it in errors) and checks it: names and
    /// ids unique, ids 0..=252, ranges inside `0..resolution` and not empty, drive mode 0 or 1.
    pub fn parse(text: &str, path: &Path, resolution: i64) -> Result<Self, CalibrationError> {
        let c: Calibration = serde_json::from_str(text).map_err(|e| CalibrationError::Format {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        let bad = |motor: &str, message: String| CalibrationError::Invalid {
            path: path.display().to_string(),
            motor: motor.into(),
            message,
        };
        for (k, (name, m)) in c.motors.iter().enumerate() {
            if c.motors[..k].iter().any(|(n, o)| n == name || o.id == m.id) {
                return Err(bad(name, format!("name or id {} appears twice", m.id)));
            }
            if !(0..=252).contains(&m.id) {
                return Err(bad(name, format!("id {} is not a servo id (0-252)", m.id)));
            }
            if !(0..=1).contains(&m.drive_mode) {
                return Err(bad(name, format!("drive_mode {} (0 or 1)", m.drive_mode)));
            }
            if !(0 <= m.range_min && m.range_min < m.range_max && m.range_max < resolution) {
                return Err(bad(
                    name,
                    format!(
                        "range {}..{} is not inside 0..{resolution} or is empty",
                        m.range_min, m.range_max
                    ),
                ));
            }
        }
        Ok(c)
    }

    /// Reads and checks `path` for servos of `resolution` steps per turn (4096 for the STS3215
    /// and the X series).
    pub fn read(path: &Path, resolution: i64) -> Result<Self, CalibrationError> {
        let text = std::fs::read_to_string(path).map_err(|source| CalibrationError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text, path, resolution)
    }

    /// The file's text as LeRobot writes it (Python `json.dump(..., indent=4)`).
    pub fn to_json(&self) -> String {
        let mut s = String::from("{");
        for (k, (name, m)) in self.motors.iter().enumerate() {
            s.push_str(if k == 0 { "\n" } else { ",\n" });
            s.push_str(&format!(
                "    {}: {{\n        \"id\": {},\n        \"drive_mode\": {},\n        \"homing_offset\": {},\n        \"range_min\": {},\n        \"range_max\": {}\n    }}",
                serde_json::to_string(name).expect("a string serialises"),
                m.id, m.drive_mode, m.homing_offset, m.range_min, m.range_max
            ));
        }
        s.push_str(if self.motors.is_empty() { "}" } else { "\n}" });
        s
    }

    /// Writes the file atomically (a temporary file beside it, then a rename), creating its
    /// directory.
    pub fn write(&self, path: &Path) -> Result<(), CalibrationError> {
        let io = |source| CalibrationError::Io {
            path: path.display().to_string(),
            source,
        };
        if let Some(d) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(d).map_err(io)?;
        }
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, self.to_json()).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }
}

/// Which kind of device a calibration belongs to (LeRobot's two directories).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// A robot (a follower arm): `robots/`.
    Robot,
    /// A teleoperator (a leader arm): `teleoperators/`.
    Teleoperator,
}

/// LeRobot's calibration directory: `$HF_LEROBOT_CALIBRATION`, else `$HF_LEROBOT_HOME/calibration`,
/// else `$HF_HOME/lerobot/calibration`, else `~/.cache/huggingface/lerobot/calibration`.
pub fn calibration_dir(env: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    if let Some(d) = env("HF_LEROBOT_CALIBRATION") {
        return PathBuf::from(d);
    }
    if let Some(d) = env("HF_LEROBOT_HOME") {
        return PathBuf::from(d).join("calibration");
    }
    let hf_home = env("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env("HOME").unwrap_or_default()).join(".cache/huggingface")
    });
    hf_home.join("lerobot/calibration")
}

/// The file of device `id` of type `device_type` (e.g. `so101_follower`, `my_arm`).
pub fn calibration_path(dir: &Path, kind: DeviceKind, device_type: &str, id: &str) -> PathBuf {
    let sub = match kind {
        DeviceKind::Robot => "robots",
        DeviceKind::Teleoperator => "teleoperators",
    };
    dir.join(sub).join(device_type).join(format!("{id}.json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directory_follows_lerobots_environment_variables() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            calibration_dir(&env(&[("HOME", "/home/a")])),
            PathBuf::from("/home/a/.cache/huggingface/lerobot/calibration")
        );
        assert_eq!(
            calibration_dir(&env(&[("HOME", "/h"), ("HF_HOME", "/hf")])),
            PathBuf::from("/hf/lerobot/calibration")
        );
        assert_eq!(
            calibration_dir(&env(&[
                ("HF_LEROBOT_CALIBRATION", "/c"),
                ("HF_HOME", "/hf")
            ])),
            PathBuf::from("/c")
        );
        assert_eq!(
            calibration_path(
                Path::new("/c"),
                DeviceKind::Teleoperator,
                "so101_leader",
                "left"
            ),
            PathBuf::from("/c/teleoperators/so101_leader/left.json")
        );
    }

    #[test]
    fn bad_files_name_the_motor_and_what_is_wrong() {
        let p = Path::new("arm.json");
        let one = |body: &str| format!("{{\"gripper\": {body}}}");
        let ok = r#"{"id": 6, "drive_mode": 0, "homing_offset": 1297, "range_min": 2036, "range_max": 3470}"#;
        assert!(Calibration::parse(&one(ok), p, 4096).is_ok());
        let e = Calibration::parse(&one(&ok.replace("3470", "4096")), p, 4096).unwrap_err();
        assert!(
            e.to_string().contains("gripper") && e.to_string().contains("2036..4096"),
            "{e}"
        );
        let e =
            Calibration::parse(&one(&ok.replace("\"id\": 6", "\"idx\": 6")), p, 4096).unwrap_err();
        assert!(e.to_string().contains("arm.json"), "{e}");
    }
}
