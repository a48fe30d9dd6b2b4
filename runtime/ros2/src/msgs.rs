//! The ROS 2 messages reflex speaks, written and read as classic CDR ([`super::cdr`]) field by
//! field in the order of their Jazzy definitions (common_interfaces, tf2_msgs), with each type's
//! name and RIHS01 hash (REP-2011 type description hash; a ROS 2 publisher and subscriber meet
//! on rmw_zenoh only when the hashes are equal). The hashes are those of the Jazzy, Kilted and
//! Lyrical definitions; the system test recomputes them with PyPI `rosbags`.

use super::cdr::{CdrError, Reader, Writer};

/// A ROS 2 message type as rmw_zenoh names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RosType {
    /// `package/msg/Name`.
    pub name: &'static str,
    /// `RIHS01_` and the SHA-256 of the type description, 64 lowercase hex digits.
    pub hash: &'static str,
}

impl RosType {
    /// The DDS-style name rmw_zenoh puts in key expressions: `package::msg::dds_::Name_`.
    pub fn dds_name(&self) -> String {
        let mut parts = self.name.split('/');
        let (pkg, kind, name) = (
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
        );
        format!("{pkg}::{kind}::dds_::{name}_")
    }
}

/// `std_msgs/msg/String` (the robot's URDF on `robot_description`).
pub const STRING: RosType = RosType {
    name: "std_msgs/msg/String",
    hash: "RIHS01_df668c740482bbd48fb39d76a70dfd4bd59db1288021743503259e948f6b1a18",
};
/// `sensor_msgs/msg/JointState`.
pub const JOINT_STATE: RosType = RosType {
    name: "sensor_msgs/msg/JointState",
    hash: "RIHS01_a13ee3a330e346c9d87b5aa18d24e11690752bd33a0350f11c5882bc9179260e",
};
/// `tf2_msgs/msg/TFMessage`.
pub const TF_MESSAGE: RosType = RosType {
    name: "tf2_msgs/msg/TFMessage",
    hash: "RIHS01_e369d0f05a23ae52508854b66f6aa0437f3449d652e8cbf22d5abe85d020f087",
};
/// `sensor_msgs/msg/Image`.
pub const IMAGE: RosType = RosType {
    name: "sensor_msgs/msg/Image",
    hash: "RIHS01_d31d41a9a4c4bc8eae9be757b0beed306564f7526c88ea6a4588fb9582527d47",
};
/// `sensor_msgs/msg/CameraInfo`.
pub const CAMERA_INFO: RosType = RosType {
    name: "sensor_msgs/msg/CameraInfo",
    hash: "RIHS01_b3dfd68ff46c9d56c80fd3bd4ed22c7a4ddce8c8348f2f59c299e73118e7e275",
};
/// `diagnostic_msgs/msg/DiagnosticArray`.
pub const DIAGNOSTIC_ARRAY: RosType = RosType {
    name: "diagnostic_msgs/msg/DiagnosticArray",
    hash: "RIHS01_5a8a36efb05fb25070fa0fb3810290c0e6cd4862b54a8fb975a1ee8dc55a333e",
};
/// `std_msgs/msg/Bool`.
pub const BOOL: RosType = RosType {
    name: "std_msgs/msg/Bool",
    hash: "RIHS01_feb91e995ff9ebd09c0cb3d2aed18b11077585839fb5db80193b62d74528f6c9",
};
/// `geometry_msgs/msg/TwistStamped`.
pub const TWIST_STAMPED: RosType = RosType {
    name: "geometry_msgs/msg/TwistStamped",
    hash: "RIHS01_5f0fcd4f81d5d06ad9b4c4c63e3ea51b82d6ae4d0558f1d475229b1121db6f64",
};

/// Every type reflex publishes or subscribes to.
pub const ALL: [RosType; 8] = [
    STRING,
    JOINT_STATE,
    TF_MESSAGE,
    IMAGE,
    CAMERA_INFO,
    DIAGNOSTIC_ARRAY,
    BOOL,
    TWIST_STAMPED,
];

/// Longest `frame_id` or name accepted from another node.
const MAX_NAME: usize = 256;

/// `builtin_interfaces/msg/Time`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Time {
    /// Seconds.
    pub sec: i32,
    /// Nanoseconds within the second.
    pub nanosec: u32,
}

impl Time {
    /// From nanoseconds since the Unix epoch.
    pub fn from_unix_ns(ns: i64) -> Self {
        Time {
            sec: ns.div_euclid(1_000_000_000) as i32,
            nanosec: ns.rem_euclid(1_000_000_000) as u32,
        }
    }

    /// The system clock now (ROS 2's default time source).
    pub fn now() -> Self {
        Self::from_unix_ns(unix_ns())
    }
}

/// Nanoseconds since the Unix epoch by the system clock.
pub fn unix_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

fn header(w: &mut Writer, stamp: Time, frame_id: &str) {
    w.i32(stamp.sec).u32(stamp.nanosec).string(frame_id);
}

fn read_header(r: &mut Reader) -> Result<(Time, String), CdrError> {
    let sec = r.i32("header.stamp.sec")?;
    let nanosec = r.u32("header.stamp.nanosec")?;
    let frame = r.string("header.frame_id", MAX_NAME)?;
    Ok((Time { sec, nanosec }, frame))
}

/// `sensor_msgs/msg/JointState`: `header, name[], position[], velocity[], effort[]`.
#[derive(Clone, Copy, Debug)]
pub struct JointState<'a> {
    /// Stamp of the header.
    pub stamp: Time,
    /// Frame of the header (empty for joint states).
    pub frame_id: &'a str,
    /// Joint names.
    pub name: &'a [String],
    /// Positions (rad or m).
    pub position: &'a [f32],
    /// Velocities; empty when unknown.
    pub velocity: &'a [f32],
}

impl JointState<'_> {
    /// Writes the message (efforts are not measured: an empty sequence, as the message allows).
    pub fn write(&self, w: &mut Writer) {
        header(w.start(), self.stamp, self.frame_id);
        w.len(self.name.len());
        for n in self.name {
            w.string(n);
        }
        w.f64_seq(self.position.iter().map(|&v| v as f64));
        w.f64_seq(self.velocity.iter().map(|&v| v as f64));
        w.len(0);
    }
}

/// One `geometry_msgs/msg/TransformStamped`: the pose of `child` in `parent`.
#[derive(Clone, Debug, PartialEq)]
pub struct Transform {
    /// `header.frame_id`.
    pub parent: String,
    /// `child_frame_id`.
    pub child: String,
    /// Translation, m.
    pub translation: [f64; 3],
    /// Rotation, unit quaternion `[x, y, z, w]`.
    pub rotation_xyzw: [f64; 4],
}

/// Writes a `tf2_msgs/msg/TFMessage` of `transforms`, all stamped `stamp`.
pub fn write_tf(w: &mut Writer, stamp: Time, transforms: &[Transform]) {
    w.start().len(transforms.len());
    for t in transforms {
        header(w, stamp, &t.parent);
        w.string(&t.child);
        w.f64_array(&t.translation).f64_array(&t.rotation_xyzw);
    }
}

/// Writes a `sensor_msgs/msg/Image` of `rgb8` pixels (`height, width, encoding, is_bigendian,
/// step, data`).
pub fn write_image(
    w: &mut Writer,
    stamp: Time,
    frame_id: &str,
    img: &reflex_contracts::msg::Image,
) {
    header(w.start(), stamp, frame_id);
    w.u32(img.height).u32(img.width).string(&img.encoding).u8(0);
    let channels = img.data.len() / (img.width as usize * img.height as usize).max(1);
    w.u32(img.width * channels as u32).bytes_seq(&img.data);
}

/// Writes a `sensor_msgs/msg/CameraInfo` for an undistorted pinhole `[fx, fy, cx, cy]` (zeros:
/// an uncalibrated camera, as ROS 2 spells it): `plumb_bob` with no distortion, `k`, identity
/// `r`, `p = [k | 0]`, no binning, the whole image as region of interest.
pub fn write_camera_info(
    w: &mut Writer,
    stamp: Time,
    frame_id: &str,
    (width, height): (u32, u32),
    pinhole: Option<[f64; 4]>,
) {
    header(w.start(), stamp, frame_id);
    w.u32(height).u32(width).string("plumb_bob");
    w.f64_seq([0.0; 5].into_iter());
    let [fx, fy, cx, cy] = pinhole.unwrap_or_default();
    w.f64_array(&[fx, 0.0, cx, 0.0, fy, cy, 0.0, 0.0, 1.0]);
    w.f64_array(&[1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]);
    w.f64_array(&[fx, 0.0, cx, 0.0, 0.0, fy, cy, 0.0, 0.0, 0.0, 1.0, 0.0]);
    w.u32(0).u32(0);
    // roi: x_offset, y_offset, height, width, do_rectify.
    w.u32(0).u32(0).u32(0).u32(0).bool(false);
}

/// `diagnostic_msgs/msg/DiagnosticStatus` levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Level {
    /// Everything is fine.
    Ok = 0,
    /// Something to look at.
    Warn = 1,
    /// Not working (an e-stop latched).
    Error = 2,
    /// No fresh information.
    Stale = 3,
}

/// One `diagnostic_msgs/msg/DiagnosticStatus`.
#[derive(Clone, Debug, PartialEq)]
pub struct DiagnosticStatus {
    /// Level.
    pub level: Level,
    /// What it is about, e.g. `reflex: so101 control loop`.
    pub name: String,
    /// One line for a person.
    pub message: String,
    /// The hardware, e.g. the robot's name.
    pub hardware_id: String,
    /// Key-value pairs.
    pub values: Vec<(String, String)>,
}

/// Writes a `diagnostic_msgs/msg/DiagnosticArray`.
pub fn write_diagnostics(w: &mut Writer, stamp: Time, status: &[DiagnosticStatus]) {
    header(w.start(), stamp, "");
    w.len(status.len());
    for s in status {
        w.u8(s.level as u8)
            .string(&s.name)
            .string(&s.message)
            .string(&s.hardware_id)
            .len(s.values.len());
        for (k, v) in &s.values {
            w.string(k).string(v);
        }
    }
}

/// Reads a `std_msgs/msg/Bool`.
pub fn read_bool(payload: &[u8]) -> Result<bool, CdrError> {
    Reader::new(payload)?.bool("data")
}

/// Writes a `std_msgs/msg/Bool`.
pub fn write_bool(w: &mut Writer, v: bool) {
    w.start().bool(v);
}

/// A `geometry_msgs/msg/TwistStamped`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TwistStamped {
    /// Stamp of the header.
    pub stamp: Time,
    /// Frame the velocities are in.
    pub frame_id: String,
    /// Linear velocity, m/s.
    pub linear: [f64; 3],
    /// Angular velocity, rad/s.
    pub angular: [f64; 3],
}

impl TwistStamped {
    /// Reads one; refuses non-finite velocities.
    pub fn read(payload: &[u8]) -> Result<Self, CdrError> {
        let mut r = Reader::new(payload)?;
        let (stamp, frame_id) = read_header(&mut r)?;
        let mut v = [0.0; 6];
        for (i, x) in v.iter_mut().enumerate() {
            *x = r.f64(if i < 3 {
                "twist.linear"
            } else {
                "twist.angular"
            })?;
            if !x.is_finite() {
                return Err(CdrError::Value {
                    what: "twist",
                    why: format!("non-finite velocity {x}"),
                });
            }
        }
        Ok(TwistStamped {
            stamp,
            frame_id,
            linear: [v[0], v[1], v[2]],
            angular: [v[3], v[4], v[5]],
        })
    }

    /// Writes it (for tests and tools that drive a robot).
    pub fn write(&self, w: &mut Writer) {
        header(w.start(), self.stamp, &self.frame_id);
        w.f64_array(&self.linear).f64_array(&self.angular);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_joint_state_has_the_bytes_rosbags_writes() {
        // rosbags 0.11.9, Stores.ROS2_JAZZY: stamp 1 s 2 ns, frame "base", name ["j1"],
        // position [1.5], empty velocity and effort.
        let want: Vec<u8> = [
            &[0u8, 1, 0, 0][..],
            &[1, 0, 0, 0, 2, 0, 0, 0],
            &[5, 0, 0, 0, b'b', b'a', b's', b'e', 0, 0, 0, 0],
            &[1, 0, 0, 0, 3, 0, 0, 0, b'j', b'1', 0, 0],
            &[1, 0, 0, 0, 0, 0, 0, 0],
            &1.5f64.to_le_bytes(),
            &[0, 0, 0, 0, 0, 0, 0, 0],
        ]
        .concat();
        let mut w = Writer::new();
        JointState {
            stamp: Time { sec: 1, nanosec: 2 },
            frame_id: "base",
            name: &["j1".to_string()],
            position: &[1.5],
            velocity: &[],
        }
        .write(&mut w);
        assert_eq!(w.bytes(), want);
    }

    #[test]
    fn a_twist_reads_back_and_refuses_nan() {
        let t = TwistStamped {
            stamp: Time::from_unix_ns(-1),
            frame_id: "base_link".into(),
            linear: [0.1, -0.2, 0.3],
            angular: [0.0, 0.0, 0.5],
        };
        assert_eq!(
            t.stamp,
            Time {
                sec: -1,
                nanosec: 999_999_999
            }
        );
        let mut w = Writer::new();
        t.write(&mut w);
        assert_eq!(TwistStamped::read(w.bytes()).unwrap(), t);
        let mut bad = t.clone();
        bad.linear[1] = f64::NAN;
        bad.write(&mut w);
        assert!(TwistStamped::read(w.bytes()).is_err());
        assert!(TwistStamped::read(&w.bytes()[..20]).is_err());
    }

    #[test]
    fn dds_names_follow_rmw_zenoh() {
        assert_eq!(
            JOINT_STATE.dds_name(),
            "sensor_msgs::msg::dds_::JointState_"
        );
        assert_eq!(TF_MESSAGE.dds_name(), "tf2_msgs::msg::dds_::TFMessage_");
        for t in ALL {
            assert!(t.hash.starts_with("RIHS01_") && t.hash.len() == 71, "{t:?}");
        }
    }
}
