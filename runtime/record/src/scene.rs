//! The 3-D view of a recording, drawn from what the robot describes in its spec
//! ([`reflex_contracts::msg::Scene`]): an arm from its URDF posed by forward kinematics, boxes and
//! markers placed by state fields, the tool path. A robot without a scene gets plots only.

use nalgebra::{Isometry3, Translation3, UnitQuaternion};
use reflex_contracts::msg::{CameraSpec, RobotSpec, Scene};
use reflex_runtime::kinematics::Chain;
use reflex_runtime::outbox::Transition;
use std::ops::Range;

/// A box of the arm's collision geometry, in its link's frame.
#[derive(Clone, Debug)]
pub struct LinkShape {
    /// URDF link name.
    pub link: String,
    /// Pose of the box in the link frame.
    pub origin: Isometry3<f64>,
    /// Half extents, m.
    pub half: [f32; 3],
}

/// Box shapes of every link of a URDF.
pub fn link_shapes(robot: &urdf_rs::Robot) -> Vec<LinkShape> {
    let mut out = vec![];
    for l in &robot.links {
        for c in &l.collision {
            if let urdf_rs::Geometry::Box { size } = &c.geometry {
                let o = &c.origin;
                out.push(LinkShape {
                    link: l.name.clone(),
                    origin: Isometry3::from_parts(
                        Translation3::new(o.xyz[0], o.xyz[1], o.xyz[2]),
                        UnitQuaternion::from_euler_angles(o.rpy[0], o.rpy[1], o.rpy[2]),
                    ),
                    half: [
                        size[0] as f32 / 2.0,
                        size[1] as f32 / 2.0,
                        size[2] as f32 / 2.0,
                    ],
                });
            }
        }
    }
    out
}

/// Why a robot's scene cannot be drawn.
#[derive(Debug, thiserror::Error)]
#[error("scene of robot `{robot}`: {message}")]
pub struct SceneError {
    /// The robot.
    pub robot: String,
    /// What is wrong with its description.
    pub message: String,
}

struct ArmModel {
    chain: Chain,
    shapes: Vec<LinkShape>,
    joints: Range<usize>,
    gripper: Option<(usize, f64)>,
}

struct Placed {
    name: String,
    pos: Range<usize>,
    quat: Option<Range<usize>>,
    half: [f32; 3],
    rgb: [u8; 3],
}

/// A scene ready to draw: the URDF parsed, the chain built and every state field resolved once.
pub struct SceneModel {
    arm: Option<ArmModel>,
    objects: Vec<Placed>,
    markers: Vec<(Placed, f32)>,
    path: Option<Range<usize>>,
    static_boxes: Vec<reflex_contracts::msg::StaticBox>,
    cameras: Vec<CameraSpec>,
    /// Where each camera's images go, in the spec's order.
    image_paths: Vec<String>,
    q: Vec<f64>,
    poses: Vec<Isometry3<f64>>,
}

/// Where a camera lives in a recording: `(origin, images)`. A camera whose spec gives both its
/// intrinsics and its mount is a pinhole in the 3-D scene, at `world/cameras/<name>` (fixed in
/// the base frame) or `world/arm/<link>/cameras/<name>` (on a link, moving with it), its images
/// under it (`.../image`) so that 3-D points project into them; any other camera's images are at
/// `camera/<name>`.
pub fn camera_paths(c: &CameraSpec) -> (String, String) {
    match (&c.intrinsics, &c.mount) {
        (Some(_), Some(m)) => {
            let origin = if m.parent == "base" || m.parent == "world" {
                format!("world/cameras/{}", c.name)
            } else {
                format!("world/arm/{}/cameras/{}", m.parent, c.name)
            };
            let image = format!("{origin}/image");
            (origin, image)
        }
        _ => (format!("camera/{}", c.name), format!("camera/{}", c.name)),
    }
}

impl SceneModel {
    /// Resolves `spec.scene` against the spec's state layout. Fields the spec validation already
    /// checked; the URDF is parsed here.
    pub fn new(spec: &RobotSpec) -> Result<Self, SceneError> {
        let fail = |message: String| SceneError {
            robot: spec.name.clone(),
            message,
        };
        let empty = Scene::default();
        let scene = spec.scene.as_ref().unwrap_or(&empty);
        let field = |name: &str, n: usize| -> Result<Range<usize>, SceneError> {
            match spec.field(name) {
                Some(r) if r.len() >= n => Ok(r.start..r.start + n),
                _ => Err(fail(format!("no state field `{name}` of {n} values"))),
            }
        };
        let arm = match &scene.arm {
            None => None,
            Some(a) => {
                let urdf = urdf_rs::read_from_string(&a.urdf)
                    .map_err(|e| fail(format!("its URDF does not parse: {e}")))?;
                let chain = Chain::from_urdf(&urdf, &spec.name, &a.base_link, &a.tool_link)
                    .map_err(|e| fail(e.to_string()))?;
                let joints = field(&a.joint_field, chain.dof())?;
                let gripper = a
                    .gripper
                    .as_ref()
                    .map(|g| (g.opening_index as usize, g.offset_m as f64));
                Some(ArmModel {
                    shapes: link_shapes(&urdf),
                    chain,
                    joints,
                    gripper,
                })
            }
        };
        let place = |name: &str, pos: &str, quat: Option<&String>, half, rgb| {
            Ok::<_, SceneError>(Placed {
                name: name.to_string(),
                pos: field(pos, 3)?,
                quat: quat.map(|q| field(q, 4)).transpose()?,
                half,
                rgb,
            })
        };
        let objects = scene
            .objects
            .iter()
            .map(|o| {
                place(
                    &o.name,
                    &o.position_field,
                    o.quaternion_field.as_ref(),
                    o.half_extents_m,
                    o.rgb,
                )
            })
            .collect::<Result<_, _>>()?;
        let markers = scene
            .markers
            .iter()
            .map(|m| {
                Ok((
                    place(&m.name, &m.position_field, None, [0.0; 3], m.rgb)?,
                    m.radius_m,
                ))
            })
            .collect::<Result<_, SceneError>>()?;
        let path = scene
            .tool_path_field
            .as_ref()
            .map(|p| field(p, 3))
            .transpose()?;
        let dof = arm.as_ref().map_or(0, |a| a.chain.dof());
        Ok(SceneModel {
            arm,
            objects,
            markers,
            path,
            static_boxes: scene.static_boxes.clone(),
            cameras: spec.cameras.clone(),
            image_paths: spec.cameras.iter().map(|c| camera_paths(c).1).collect(),
            q: Vec::with_capacity(dof),
            poses: vec![Isometry3::identity(); dof],
        })
    }

    /// The tool position of a state, for the path.
    pub fn tool_position(&self, state: &[f32]) -> Option<[f32; 3]> {
        let r = self.path.as_ref()?;
        let p = state.get(r.clone())?;
        Some([p[0], p[1], p[2]])
    }

    /// Where each camera's images go, in the spec's order.
    pub fn image_paths(&self) -> &[String] {
        &self.image_paths
    }

    /// What never moves: the coordinate convention, fixed boxes, the arm's link shapes and the
    /// calibrated cameras (their mounts and pinholes).
    pub fn log_static(&self, rec: &rerun::RecordingStream) {
        let _ = rec.log_static("world", &rerun::ViewCoordinates::RIGHT_HAND_Z_UP());
        for c in &self.cameras {
            let (Some(k), Some(m)) = (&c.intrinsics, &c.mount) else {
                continue;
            };
            let (origin, _) = camera_paths(c);
            let [x, y, z, w] = m.rotation_xyzw.map(|v| v as f32);
            let t = m.translation_m.map(|v| v as f32);
            let _ = rec.log_static(
                origin.clone(),
                &rerun::Transform3D::from_translation(t)
                    .with_quaternion(rerun::Quaternion::from_xyzw([x, y, z, w])),
            );
            // Rerun puts pixel centres at +0.5, OpenCV at integers.
            let _ = rec.log_static(
                origin,
                &rerun::Pinhole::from_focal_length_and_resolution(
                    [k[0] as f32, k[1] as f32],
                    [c.width as f32, c.height as f32],
                )
                .with_principal_point([k[2] as f32 + 0.5, k[3] as f32 + 0.5])
                .with_camera_xyz(rerun::components::ViewCoordinates::RDF)
                .with_image_plane_distance(0.05),
            );
        }
        for b in &self.static_boxes {
            let _ = rec.log_static(
                format!("world/{}", b.name),
                &rerun::Boxes3D::from_centers_and_half_sizes([b.center_m], [b.half_extents_m])
                    .with_colors([rgb(b.rgb)]),
            );
        }
        let Some(arm) = &self.arm else { return };
        for s in &arm.shapes {
            let t = s.origin.translation.vector;
            let q = s.origin.rotation.quaternion();
            let _ = rec.log_static(
                format!("world/arm/{}/shape", s.link),
                &rerun::Boxes3D::from_centers_and_half_sizes(
                    [[t.x as f32, t.y as f32, t.z as f32]],
                    [s.half],
                )
                .with_quaternions([rerun::Quaternion::from_xyzw([
                    q.i as f32, q.j as f32, q.k as f32, q.w as f32,
                ])])
                .with_colors([if s.link.starts_with("finger") {
                    rgb([40, 40, 40])
                } else {
                    rgb([240, 200, 40])
                }]),
            );
        }
    }

    /// The arm, objects, markers and tool path in the state a step was chosen from. A state too
    /// short for the scene (it was validated against the spec upstream) draws nothing.
    pub fn log_step(&mut self, rec: &rerun::RecordingStream, t: &Transition, path: &[[f32; 3]]) {
        self.log_arm(rec, &t.obs);
        for o in &self.objects {
            let Some(p) = t.obs.get(o.pos.clone()) else {
                continue;
            };
            let mut b = rerun::Boxes3D::from_centers_and_half_sizes([[p[0], p[1], p[2]]], [o.half])
                .with_colors([rgb(o.rgb)]);
            if let Some(q) = o.quat.as_ref().and_then(|r| t.obs.get(r.clone())) {
                b = b.with_quaternions([rerun::Quaternion::from_xyzw([q[0], q[1], q[2], q[3]])]);
            }
            let _ = rec.log(format!("world/{}", o.name), &b);
        }
        for (m, radius) in &self.markers {
            let Some(p) = t.obs.get(m.pos.clone()) else {
                continue;
            };
            let _ = rec.log(
                format!("world/{}", m.name),
                &rerun::Points3D::new([[p[0], p[1], p[2]]])
                    .with_radii([*radius])
                    .with_colors([rgb(m.rgb)]),
            );
        }
        if !path.is_empty() && path.len() % 5 == 1 {
            let _ = rec.log(
                "world/ee_path",
                &rerun::LineStrips3D::new([path.to_vec()]).with_colors([rgb([60, 120, 230])]),
            );
        }
    }

    fn log_arm(&mut self, rec: &rerun::RecordingStream, state: &[f32]) {
        let Some(arm) = &self.arm else { return };
        let Some(q) = state.get(arm.joints.clone()) else {
            return;
        };
        self.q.clear();
        self.q.extend(q.iter().map(|v| *v as f64));
        arm.chain.link_poses(&self.q, &mut self.poses);
        for (j, p) in arm.chain.joints().iter().zip(self.poses.iter()) {
            let _ = rec.log(format!("world/arm/{}", j.child_link), &pose_transform(p));
        }
        // Fingers: the tool frame shifted by half the opening each way.
        if let (Some((i, offset)), Some(g)) = (arm.gripper, self.poses.last()) {
            let half = state.get(i).copied().unwrap_or(0.0) as f64 / 2.0;
            for (name, s) in [("finger_left", 1.0), ("finger_right", -1.0)] {
                let f = g * Isometry3::translation(0.0, s * half, offset);
                let _ = rec.log(format!("world/arm/{name}"), &pose_transform(&f));
            }
        }
    }
}

fn rgb(c: [u8; 3]) -> rerun::Color {
    rerun::Color::from_rgb(c[0], c[1], c[2])
}

fn pose_transform(p: &Isometry3<f64>) -> rerun::Transform3D {
    let t = p.translation.vector;
    let q = p.rotation.quaternion();
    rerun::Transform3D::from_translation([t.x as f32, t.y as f32, t.z as f32]).with_quaternion(
        rerun::Quaternion::from_xyzw([q.i as f32, q.j as f32, q.k as f32, q.w as f32]),
    )
}
