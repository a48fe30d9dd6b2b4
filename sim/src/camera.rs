//! CPU cameras: a ray caster over the scene's collision shapes.
//!
//! Good enough for a person to see what happened and for a small vision policy: flat-shaded
//! boxes with one directional light, a checkered table for depth cues, and the task's target
//! drawn as a marker. Pinhole model, OpenCV camera frame (x right, y down, z forward).

use crate::task::{PUSH_TOLERANCE_M, TaskKind, TaskLayout};
use crate::world::{Part, Scene};
use nalgebra::{Isometry3, Matrix3, Point3, Rotation3, Translation3, UnitQuaternion, Vector3};
use rapier3d::prelude::*;
use reflex_runtime::msg::Image;

/// Where a camera is mounted.
#[derive(Clone, Debug)]
pub enum Mount {
    /// Fixed in the base frame: `T_base_camera`.
    Fixed(Isometry3<f64>),
    /// On a link: `T_link_camera`.
    Link {
        /// URDF link name.
        link: String,
        /// Camera pose in the link frame.
        offset: Isometry3<f64>,
    },
}

/// One camera of the rig.
#[derive(Clone, Debug)]
pub struct RigCamera {
    /// Name, e.g. `front`.
    pub name: String,
    /// Mount.
    pub mount: Mount,
    /// Vertical field of view, rad.
    pub fov_y_rad: f64,
}

/// The cameras of the simulated robot.
#[derive(Clone, Debug)]
pub struct CameraRig {
    /// Cameras, in the order their images are published.
    pub cameras: Vec<RigCamera>,
}

/// Camera pose looking from `eye` at `target` with world up +z (OpenCV axes).
pub fn look_at(eye: Vector3<f64>, target: Vector3<f64>) -> Isometry3<f64> {
    let f = (target - eye).normalize();
    let r = f.cross(&Vector3::z()).normalize();
    let d = f.cross(&r);
    let rot = Rotation3::from_matrix_unchecked(Matrix3::from_columns(&[r, d, f]));
    Isometry3::from_parts(
        Translation3::from(eye),
        UnitQuaternion::from_rotation_matrix(&rot),
    )
}

impl CameraRig {
    /// A front camera facing the arm over the table, and a wrist camera on the gripper looking
    /// between the fingers.
    pub fn default_rig() -> Self {
        // Wrist: 3.5 cm off the tool axis on the gripper's x side, looking along the tool axis and
        // tilted 0.3 rad towards it. Camera x = gripper y, camera y = -gripper x, z = gripper z.
        let base = Matrix3::from_columns(&[Vector3::y(), -Vector3::x(), Vector3::z()]);
        let wrist_rot =
            UnitQuaternion::from_rotation_matrix(&Rotation3::from_matrix_unchecked(base))
                * UnitQuaternion::from_axis_angle(&Vector3::x_axis(), 0.3);
        CameraRig {
            cameras: vec![
                RigCamera {
                    name: "front".into(),
                    mount: Mount::Fixed(look_at(
                        Vector3::new(0.55, 0.0, 0.32),
                        Vector3::new(0.2, 0.0, 0.03),
                    )),
                    fov_y_rad: 50f64.to_radians(),
                },
                RigCamera {
                    name: "wrist".into(),
                    mount: Mount::Link {
                        link: "gripper".into(),
                        offset: Isometry3::from_parts(
                            Translation3::new(0.035, 0.0, 0.02),
                            wrist_rot,
                        ),
                    },
                    fov_y_rad: 75f64.to_radians(),
                },
            ],
        }
    }

    /// World pose of a camera in the current scene.
    pub fn pose(&self, cam: &RigCamera, scene: &Scene) -> Isometry3<f64> {
        match &cam.mount {
            Mount::Fixed(p) => *p,
            Mount::Link { link, offset } => {
                scene.link_pose(link).unwrap_or_else(Isometry3::identity) * offset
            }
        }
    }
}

/// Renders RGB images of a fixed size.
pub struct Renderer {
    width: u32,
    height: u32,
    /// Unnormalised ray directions per pixel in the camera frame for a unit focal length.
    rays: Vec<Vector3<f32>>,
    spheres: Vec<(Vector3<f32>, f32, usize)>,
}

const LIGHT: [f32; 3] = [0.27, 0.18, 0.95];

impl Renderer {
    /// A renderer for `width` x `height` images.
    pub fn new(width: u32, height: u32) -> Self {
        let mut rays = Vec::with_capacity((width * height) as usize);
        for v in 0..height {
            for u in 0..width {
                // Normalised image coordinates with the principal point at the centre.
                let x = (u as f32 + 0.5) / height as f32 - 0.5 * width as f32 / height as f32;
                let y = (v as f32 + 0.5) / height as f32 - 0.5;
                rays.push(Vector3::new(x, y, 1.0));
            }
        }
        Renderer {
            width,
            height,
            rays,
            spheres: Vec::new(),
        }
    }

    /// Renders every camera of `rig` into `images` (reusing its buffers).
    pub fn render_all(
        &mut self,
        scene: &Scene,
        layout: &TaskLayout,
        rig: &CameraRig,
        images: &mut Vec<Image>,
    ) {
        images.truncate(rig.cameras.len());
        for (i, cam) in rig.cameras.iter().enumerate() {
            if images.len() <= i {
                images.push(Image {
                    camera: String::new(),
                    width: 0,
                    height: 0,
                    encoding: "rgb8".into(),
                    data: Vec::new(),
                });
            }
            let img = &mut images[i];
            if img.camera != cam.name {
                img.camera.clone_from(&cam.name);
            }
            img.width = self.width;
            img.height = self.height;
            let pose = rig.pose(cam, scene);
            self.render(scene, layout, &pose, cam.fov_y_rad, &mut img.data);
        }
    }

    /// Renders one view from `pose` (`T_base_camera`, OpenCV axes) into `out` (rgb8).
    pub fn render(
        &mut self,
        scene: &Scene,
        layout: &TaskLayout,
        pose: &Isometry3<f64>,
        fov_y_rad: f64,
        out: &mut Vec<u8>,
    ) {
        let n = (self.width * self.height) as usize;
        out.resize(n * 3, 0);
        let scale = (2.0 * (fov_y_rad / 2.0).tan()) as f32;
        let rot: Matrix3<f32> = pose.rotation.to_rotation_matrix().matrix().cast();
        self.bound_shapes(scene);
        let view = View {
            eye: pose.translation.vector.cast(),
            marker: match layout.kind {
                TaskKind::Reach => Some((layout.target.cast::<f32>(), 0.012f32)),
                _ => None,
            },
            goal_disc: (layout.kind == TaskKind::Push).then(|| layout.target.cast::<f32>()),
            table: scene
                .colliders
                .iter()
                .find(|c| c.part == Part::Table)
                .map(|c| c.handle),
        };
        let light = Vector3::from(LIGHT).normalize();
        for (p, ray_cam) in self.rays.iter().enumerate() {
            let mut d = rot * Vector3::new(ray_cam.x * scale, ray_cam.y * scale, 1.0);
            d.normalize_mut();
            let rgb = match self.trace(scene, &view, d) {
                Some((c, normal)) => {
                    let shade = 0.35 + 0.65 * normal.dot(&light).max(0.0);
                    [c[0] * shade, c[1] * shade, c[2] * shade]
                }
                None => {
                    // Background: a soft vertical gradient.
                    let g = 0.75 - 0.2 * (ray_cam.y + 0.5);
                    [g * 0.85, g * 0.9, g]
                }
            };
            let o = &mut out[p * 3..p * 3 + 3];
            for k in 0..3 {
                o[k] = (rgb[k].clamp(0.0, 1.0) * 255.0 + 0.5) as u8;
            }
        }
    }

    /// Bounding spheres of every shape but the table: they reject most ray/shape pairs cheaply.
    fn bound_shapes(&mut self, scene: &Scene) {
        self.spheres.clear();
        for (i, info) in scene.colliders.iter().enumerate() {
            if info.part == Part::Table {
                continue;
            }
            let c = &scene.world.colliders[info.handle];
            let bs = c.shape().compute_bounding_sphere(c.position());
            let ctr = bs.center();
            self.spheres
                .push((Vector3::new(ctr.x, ctr.y, ctr.z), bs.radius(), i));
        }
    }

    /// The colour and surface normal the ray from the eye along `d` meets first, if any.
    fn trace(&self, scene: &Scene, v: &View, d: Vector3<f32>) -> Option<([f32; 3], Vector3<f32>)> {
        let eye = v.eye;
        let ray = Ray::new(Vector::new(eye.x, eye.y, eye.z), Vector::new(d.x, d.y, d.z));
        let mut best_t = 5.0f32;
        let mut hit_color = None;
        for &(ctr, rad, i) in &self.spheres {
            // Ray/sphere rejection: distance from the centre to the ray line.
            let oc = ctr - eye;
            let along = oc.dot(&d);
            if along + rad < 0.0 || oc.norm_squared() - along * along > rad * rad {
                continue;
            }
            let info = &scene.colliders[i];
            let c = &scene.world.colliders[info.handle];
            if let Some(hit) = c
                .shape()
                .cast_ray_and_get_normal(c.position(), &ray, best_t, true)
            {
                best_t = hit.time_of_impact;
                let normal = Vector3::new(hit.normal.x, hit.normal.y, hit.normal.z);
                hit_color = Some((info.color, normal));
            }
        }
        if let Some(th) = v.table {
            let c = &scene.world.colliders[th];
            if let Some(hit) = c
                .shape()
                .cast_ray_and_get_normal(c.position(), &ray, best_t, true)
            {
                best_t = hit.time_of_impact;
                let normal = Vector3::new(hit.normal.x, hit.normal.y, hit.normal.z);
                hit_color = Some((table_color(eye + d * best_t, v.goal_disc), normal));
            }
        }
        if let Some((m, r)) = v.marker {
            let oc = m - eye;
            let along = oc.dot(&d);
            let dist2 = oc.norm_squared() - along * along;
            if along > 0.0 && dist2 < r * r {
                let t = along - (r * r - dist2).sqrt();
                if t < best_t {
                    hit_color = Some(([0.2, 0.9, 0.3], (eye + d * t - m).normalize()));
                }
            }
        }
        hit_color
    }
}

/// What a view needs besides the rays: the eye, the reach target's marker, the push goal's disc,
/// the table.
struct View {
    eye: Vector3<f32>,
    marker: Option<(Vector3<f32>, f32)>,
    goal_disc: Option<Vector3<f32>>,
    table: Option<ColliderHandle>,
}

/// The table's checkerboard at `pt`, green inside the push goal's disc.
fn table_color(pt: Vector3<f32>, goal_disc: Option<Vector3<f32>>) -> [f32; 3] {
    let checker = ((pt.x / 0.05).floor() as i32 + (pt.y / 0.05).floor() as i32) & 1 == 0;
    let col = if checker {
        [0.62, 0.52, 0.42]
    } else {
        [0.55, 0.45, 0.36]
    };
    match goal_disc {
        Some(g) if (Vector3::new(pt.x - g.x, pt.y - g.y, 0.0)).norm() < PUSH_TOLERANCE_M as f32 => {
            [0.3, 0.75, 0.35]
        }
        _ => col,
    }
}

/// Projects a base-frame point into a camera's image (pixel coordinates), for tests and overlays.
pub fn project(
    pose: &Isometry3<f64>,
    fov_y_rad: f64,
    width: u32,
    height: u32,
    p: &Vector3<f64>,
) -> Option<(f64, f64)> {
    let pc = pose.inverse() * Point3::from(*p);
    if pc.z <= 0.0 {
        return None;
    }
    let f = height as f64 / (2.0 * (fov_y_rad / 2.0).tan());
    Some((
        f * pc.x / pc.z + width as f64 / 2.0,
        f * pc.y / pc.z + height as f64 / 2.0,
    ))
}
