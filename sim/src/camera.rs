//! CPU cameras: a rasterizer over the scene's boxes, with a ray caster as its reference.
//!
//! Good enough for a person to see what happened and for a small vision policy: flat-shaded
//! boxes with one directional light, a checkered table for depth cues, and the task's target
//! drawn as a marker. Pinhole model, OpenCV camera frame (x right, y down, z forward).

use crate::task::{PUSH_TOLERANCE_M, TaskKind, TaskLayout};
use crate::world::{Part, Scene, to_iso};
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
    /// Per pixel: 1/z of the nearest face drawn (0: none), and that face's index in `faces`.
    inv_depth: Vec<f32>,
    surface_at: Vec<u16>,
    faces: Vec<Face>,
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
            inv_depth: Vec::new(),
            surface_at: Vec::new(),
            faces: Vec::new(),
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
                    seq: 0,
                    age_ns: 0,
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
    ///
    /// A rasterizer: every box face that faces the camera is clipped at the near plane, projected
    /// and filled into a depth buffer (1/z, interpolated linearly in the image), then one pass
    /// shades each pixel from what it holds. It samples the pixel centres the ray caster
    /// ([`Renderer::render_traced`]) shoots its rays through and shades with the same light, so the
    /// two agree pixel for pixel except where a centre lies on an edge to within rounding.
    pub fn render(
        &mut self,
        scene: &Scene,
        layout: &TaskLayout,
        pose: &Isometry3<f64>,
        fov_y_rad: f64,
        out: &mut Vec<u8>,
    ) {
        let (w, h) = (self.width as usize, self.height as usize);
        out.resize(w * h * 3, 0);
        let cam = CamFrame::new(pose, fov_y_rad, self.width, self.height);
        let scale = cam.scale;
        let view = self.view(scene, layout, &cam);
        let light = Vector3::from(LIGHT).normalize();
        self.rasterize_boxes(scene, &cam, &light);
        // Every colour but the table's is constant over a face (flat shading) or a row (the
        // background), so it is quantised once; the table needs only its paint per pixel.
        // A pixel's ray in the base frame, per unit of camera depth: linear along a row.
        let step_x = cam.rot * Vector3::new(scale / h as f32, 0.0, 0.0);
        for y in 0..h {
            let first = self.rays[y * w];
            let sky = to_rgb8(background(first.y));
            let row_ray = cam.rot * Vector3::new(first.x * scale, first.y * scale, 1.0);
            for x in 0..w {
                let p = y * w + x;
                let rgb = match self.surface_at[p] {
                    NOTHING => sky,
                    s => {
                        let face = &self.faces[s as usize];
                        if face.table {
                            // The point the pixel's ray meets, from its depth.
                            let z = 1.0 / self.inv_depth[p];
                            let ray = row_ray + step_x * x as f32;
                            face.rgb[table_paint(cam.eye + ray * z, view.goal_disc)]
                        } else {
                            face.rgb[0]
                        }
                    }
                };
                out[p * 3..p * 3 + 3].copy_from_slice(&rgb);
            }
        }
        if let Some((m, r)) = view.marker {
            self.draw_marker(&cam, m, r, &light, out);
        }
    }

    /// What a view shows besides the boxes: the reach target's marker, the push goal's disc,
    /// the table.
    fn view(&self, scene: &Scene, layout: &TaskLayout, cam: &CamFrame) -> View {
        View {
            eye: cam.eye,
            marker: match layout.kind {
                TaskKind::Reach | TaskKind::Track => Some((layout.target.cast::<f32>(), 0.012f32)),
                _ => None,
            },
            goal_disc: (layout.kind == TaskKind::Push).then(|| layout.target.cast::<f32>()),
            table: scene
                .colliders
                .iter()
                .find(|c| c.part == Part::Table)
                .map(|c| c.handle),
        }
    }

    /// Fills `inv_depth` and `surface_at` with the nearest box face at every pixel centre.
    fn rasterize_boxes(&mut self, scene: &Scene, cam: &CamFrame, light: &Vector3<f32>) {
        let n = (self.width * self.height) as usize;
        self.inv_depth.clear();
        self.inv_depth.resize(n, 0.0);
        self.surface_at.clear();
        self.surface_at.resize(n, NOTHING);
        self.faces.clear();
        let to_cam = cam.rot.transpose();
        for info in &scene.colliders {
            let c = &scene.world.colliders[info.handle];
            let Some(cuboid) = c.shape().as_cuboid() else {
                // world.rs builds boxes only; a new shape kind needs a mesh here.
                debug_assert!(false, "the rasterizer draws boxes only");
                continue;
            };
            let he = [
                cuboid.half_extents.x,
                cuboid.half_extents.y,
                cuboid.half_extents.z,
            ];
            let pose: Isometry3<f32> = to_iso(c.position()).cast();
            let rot = pose.rotation.to_rotation_matrix().into_inner();
            let centre = pose.translation.vector;
            // Corner i has +half extent on axis k where bit k of i is set.
            let corners: [Vector3<f32>; 8] = std::array::from_fn(|i| {
                let local = Vector3::from_fn(|k, _| if i >> k & 1 == 1 { he[k] } else { -he[k] });
                to_cam * (centre + rot * local - cam.eye)
            });
            for (axis, &half) in he.iter().enumerate() {
                for positive in [false, true] {
                    let normal: Vector3<f32> = if positive {
                        rot.column(axis).into()
                    } else {
                        -rot.column(axis)
                    };
                    let face_centre = centre + normal * half;
                    if normal.dot(&(face_centre - cam.eye)) >= 0.0 {
                        continue; // faces away from the camera
                    }
                    let (b, c2) = ((axis + 1) % 3, (axis + 2) % 3);
                    let base = usize::from(positive) << axis;
                    let quad = [(0, 0), (1, 0), (1, 1), (0, 1)]
                        .map(|(sb, sc)| corners[base | sb << b | sc << c2]);
                    let id = self.faces.len() as u16;
                    let shade = shading(&normal, light);
                    let table = info.part == Part::Table;
                    let paints = if table { TABLE_COLORS } else { [info.color; 3] };
                    self.faces.push(Face {
                        rgb: paints.map(|c| to_rgb8(c.map(|c| c * shade))),
                        table,
                    });
                    self.fill_polygon(&quad, cam, id);
                }
            }
        }
    }

    /// Clips a convex polygon (camera frame) at the near plane, projects it and fills it.
    fn fill_polygon(&mut self, poly: &[Vector3<f32>; 4], cam: &CamFrame, id: u16) {
        // Sutherland-Hodgman against z >= NEAR_M: a quad gains at most one vertex.
        let mut clipped = [Vector3::zeros(); 5];
        let mut k = 0;
        for i in 0..4 {
            let (a, b) = (poly[i], poly[(i + 1) % 4]);
            if a.z >= NEAR_M {
                clipped[k] = a;
                k += 1;
            }
            if (a.z >= NEAR_M) != (b.z >= NEAR_M) {
                let t = (NEAR_M - a.z) / (b.z - a.z);
                clipped[k] = a + (b - a) * t;
                k += 1;
            }
        }
        if k < 3 {
            return;
        }
        let screen = clipped.map(|v| {
            [
                cam.focal_px * v.x / v.z + cam.centre.0,
                cam.focal_px * v.y / v.z + cam.centre.1,
                1.0 / v.z,
            ]
        });
        for i in 1..k - 1 {
            self.fill_triangle([screen[0], screen[i], screen[i + 1]], id);
        }
    }

    /// Fills the pixels whose centres lie in a triangle (image coordinates and 1/z) where it is
    /// nearer than what is there.
    ///
    /// Row by row: each edge's inside test is linear in x, so the three of them bound a span of
    /// pixel centres directly, and 1/z (linear in the image) steps by a constant along it.
    fn fill_triangle(&mut self, t: [[f32; 3]; 3], id: u16) {
        let area =
            (t[1][0] - t[0][0]) * (t[2][1] - t[0][1]) - (t[1][1] - t[0][1]) * (t[2][0] - t[0][0]);
        if area.abs() < 1e-9 {
            return;
        }
        let inv_area = 1.0 / area;
        // Barycentric weight of vertex i: the edge opposite it, (a, b) = (t[i+1], t[i+2]),
        // as w_i(x, y) = ax * x + ay * y + c, normalised so that the inside is w_i >= 0.
        let weight = |i: usize| {
            let (a, b) = (t[(i + 1) % 3], t[(i + 2) % 3]);
            let ax = -(b[1] - a[1]) * inv_area;
            let ay = (b[0] - a[0]) * inv_area;
            (ax, ay, -(ax * a[0] + ay * a[1]))
        };
        let w = [weight(0), weight(1), weight(2)];
        // 1/z = sum_i w_i z_i, itself linear in x and y.
        let zx = w[0].0 * t[0][2] + w[1].0 * t[1][2] + w[2].0 * t[2][2];
        let zy = w[0].1 * t[0][2] + w[1].1 * t[1][2] + w[2].1 * t[2][2];
        let zc = w[0].2 * t[0][2] + w[1].2 * t[1][2] + w[2].2 * t[2][2];
        let (width, height) = (self.width as i32, self.height as i32);
        let lo_y = t.iter().map(|p| p[1]).fold(f32::INFINITY, f32::min);
        let hi_y = t.iter().map(|p| p[1]).fold(f32::NEG_INFINITY, f32::max);
        // Pixel (x, y) has its centre at (x + 0.5, y + 0.5).
        let y0 = ((lo_y - 0.5).ceil() as i32).max(0);
        let y1 = ((hi_y - 0.5).floor() as i32).min(height - 1);
        for y in y0..=y1 {
            let py = y as f32 + 0.5;
            let (mut x_lo, mut x_hi) = (0.0f32, width as f32);
            let mut empty = false;
            for &(ax, ay, c) in &w {
                let rest = ay * py + c;
                if ax > 0.0 {
                    x_lo = x_lo.max(-rest / ax - 0.5);
                } else if ax < 0.0 {
                    x_hi = x_hi.min(-rest / ax - 0.5);
                } else if rest < 0.0 {
                    empty = true;
                }
            }
            if empty {
                continue;
            }
            let x0 = x_lo.ceil().max(0.0) as i32;
            let x1 = (x_hi.floor() as i32).min(width - 1);
            if x1 < x0 {
                continue;
            }
            let row = (y * width) as usize;
            let z_row = zy * py + zc;
            let depth = &mut self.inv_depth[row + x0 as usize..=row + x1 as usize];
            let surf = &mut self.surface_at[row + x0 as usize..=row + x1 as usize];
            for (k, (d, s)) in depth.iter_mut().zip(surf.iter_mut()).enumerate() {
                let inv_z = zx * ((x0 + k as i32) as f32 + 0.5) + z_row;
                if inv_z > *d {
                    *d = inv_z;
                    *s = id;
                }
            }
        }
    }

    /// Draws the reach target's sphere where it is nearer than the boxes (solved per pixel over
    /// its projected extent).
    fn draw_marker(
        &self,
        cam: &CamFrame,
        m: Vector3<f32>,
        r: f32,
        light: &Vector3<f32>,
        out: &mut [u8],
    ) {
        let mc = cam.rot.transpose() * (m - cam.eye);
        let (w, h) = (self.width as usize, self.height as usize);
        let (x0, x1, y0, y1) = if mc.z - r > NEAR_M {
            let rad = cam.focal_px * r / (mc.z - r) + 2.0;
            let (u, v) = (
                cam.focal_px * mc.x / mc.z + cam.centre.0,
                cam.focal_px * mc.y / mc.z + cam.centre.1,
            );
            let clamp = |a: f32, n: usize| (a.max(0.0) as usize).min(n);
            (
                clamp(u - rad, w),
                clamp(u + rad + 1.0, w),
                clamp(v - rad, h),
                clamp(v + rad + 1.0, h),
            )
        } else {
            (0, w, 0, h)
        };
        let mm = mc.norm_squared() - r * r;
        for y in y0..y1 {
            for x in x0..x1 {
                let p = y * w + x;
                let ray = self.rays[p];
                let dc = Vector3::new(ray.x * cam.scale, ray.y * cam.scale, 1.0);
                let (a, b) = (dc.norm_squared(), dc.dot(&mc));
                let disc = b * b - a * mm;
                if b <= 0.0 || disc <= 0.0 {
                    continue;
                }
                let z = (b - disc.sqrt()) / a;
                if self.inv_depth[p] > 0.0 && z >= 1.0 / self.inv_depth[p] {
                    continue;
                }
                let normal = cam.rot * (dc * z - mc).normalize();
                put(out, p, lit([0.2, 0.9, 0.3], &normal, light));
            }
        }
    }

    /// The same view by casting a ray through every pixel centre against the scene's shapes
    /// (parry's ray casts): several times slower than [`Renderer::render`], kept as the
    /// reference the rasterizer is tested against.
    pub fn render_traced(
        &mut self,
        scene: &Scene,
        layout: &TaskLayout,
        pose: &Isometry3<f64>,
        fov_y_rad: f64,
        out: &mut Vec<u8>,
    ) {
        let n = (self.width * self.height) as usize;
        out.resize(n * 3, 0);
        let cam = CamFrame::new(pose, fov_y_rad, self.width, self.height);
        let (rot, scale) = (cam.rot, cam.scale);
        self.bound_shapes(scene);
        let view = self.view(scene, layout, &cam);
        let light = Vector3::from(LIGHT).normalize();
        for (p, ray_cam) in self.rays.iter().enumerate() {
            let mut d = rot * Vector3::new(ray_cam.x * scale, ray_cam.y * scale, 1.0);
            d.normalize_mut();
            let rgb = match self.trace(scene, &view, d) {
                Some((c, normal)) => lit(c, &normal, &light),
                None => background(ray_cam.y),
            };
            put(out, p, rgb);
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

/// A camera's frame for one render: `T_base_camera`'s rotation and eye, the focal length in
/// pixels and the principal point.
struct CamFrame {
    rot: Matrix3<f32>,
    eye: Vector3<f32>,
    /// Image-plane extent per unit of depth, over the image's height: `2 tan(fov_y / 2)`.
    scale: f32,
    focal_px: f32,
    centre: (f32, f32),
}

impl CamFrame {
    fn new(pose: &Isometry3<f64>, fov_y_rad: f64, width: u32, height: u32) -> Self {
        let scale = (2.0 * (fov_y_rad / 2.0).tan()) as f32;
        CamFrame {
            rot: pose.rotation.to_rotation_matrix().matrix().cast(),
            eye: pose.translation.vector.cast(),
            scale,
            focal_px: height as f32 / scale,
            centre: (width as f32 / 2.0, height as f32 / 2.0),
        }
    }
}

/// A box face drawn in the current render.
struct Face {
    /// Its colour lit ([`shading`] of its outward normal) and quantised; for the table, each of
    /// [`TABLE_COLORS`] so lit.
    rgb: [[u8; 3]; 3],
    /// The table's top (or side): painted per pixel by [`table_paint`].
    table: bool,
}

/// `surface_at` of a pixel where no face was drawn.
const NOTHING: u16 = u16::MAX;
/// The near clipping plane, m in front of the camera.
const NEAR_M: f32 = 1e-3;

/// Flat shading: one directional light and an ambient floor.
fn shading(normal: &Vector3<f32>, light: &Vector3<f32>) -> f32 {
    0.35 + 0.65 * normal.dot(light).max(0.0)
}

fn lit(c: [f32; 3], normal: &Vector3<f32>, light: &Vector3<f32>) -> [f32; 3] {
    c.map(|c| c * shading(normal, light))
}

/// The background: a soft vertical gradient (`y` the pixel's normalised image row).
fn background(y: f32) -> [f32; 3] {
    let g = 0.75 - 0.2 * (y + 0.5);
    [g * 0.85, g * 0.9, g]
}

fn to_rgb8(rgb: [f32; 3]) -> [u8; 3] {
    rgb.map(|c| (c.clamp(0.0, 1.0) * 255.0 + 0.5) as u8)
}

fn put(out: &mut [u8], p: usize, rgb: [f32; 3]) {
    out[p * 3..p * 3 + 3].copy_from_slice(&to_rgb8(rgb));
}

/// The table's checkerboard at `pt`, green inside the push goal's disc.
fn table_color(pt: Vector3<f32>, goal_disc: Option<Vector3<f32>>) -> [f32; 3] {
    TABLE_COLORS[table_paint(pt, goal_disc)]
}

/// The table's paints: the checkerboard's two tiles and the push goal's disc.
const TABLE_COLORS: [[f32; 3]; 3] = [[0.62, 0.52, 0.42], [0.55, 0.45, 0.36], [0.3, 0.75, 0.35]];

/// Which of [`TABLE_COLORS`] the table has at `pt`.
fn table_paint(pt: Vector3<f32>, goal_disc: Option<Vector3<f32>>) -> usize {
    if let Some(g) = goal_disc {
        let (dx, dy) = (pt.x - g.x, pt.y - g.y);
        if (dx * dx + dy * dy).sqrt() < PUSH_TOLERANCE_M as f32 {
            return 2;
        }
    }
    // 5 cm tiles; the offset keeps the table's coordinates positive so that truncation floors.
    let tile = |v: f32| (v * 20.0 + 1024.0) as i32;
    ((tile(pt.x) + tile(pt.y)) & 1) as usize
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Expert, SimConfig, SimEnv, TaskKind};
    use reflex_runtime::prelude::Robot;

    /// Pixels whose colours differ by more than two levels in any channel.
    fn differing(a: &[u8], b: &[u8]) -> usize {
        a.chunks(3)
            .zip(b.chunks(3))
            .filter(|(x, y)| x.iter().zip(y.iter()).any(|(p, q)| p.abs_diff(*q) > 2))
            .count()
    }

    #[test]
    fn the_rasterizer_draws_what_the_ray_caster_sees() {
        let rig = CameraRig::default_rig();
        let mut r = Renderer::new(128, 96);
        let (mut fast, mut slow) = (Vec::new(), Vec::new());
        for task in [
            TaskKind::Reach,
            TaskKind::Push,
            TaskKind::Pick,
            TaskKind::Insert,
        ] {
            let mut env = SimEnv::new(SimConfig::for_task(task)).unwrap();
            let mut expert = Expert::new(env.spec(), 0.0, 0).unwrap();
            let mut action = vec![0.0; env.spec().action.dim()];
            let mut obs = env.reset(Some(5)).unwrap().clone();
            let (mut differ, mut total, mut drawn, mut step) = (0, 0, 0, 0);
            // Along an expert's episode: the wrist camera closes in on the object and the
            // fingers, the front camera sees the arm move over the table.
            while !obs.done() {
                if step % 8 == 0 {
                    for cam in &rig.cameras {
                        let pose = rig.pose(cam, env.scene());
                        r.render(env.scene(), env.layout(), &pose, cam.fov_y_rad, &mut fast);
                        r.render_traced(env.scene(), env.layout(), &pose, cam.fov_y_rad, &mut slow);
                        differ += differing(&fast, &slow);
                        total += fast.len() / 3;
                        drawn += r.surface_at.iter().filter(|&&s| s != NOTHING).count();
                    }
                }
                expert.act(&obs, &mut action);
                obs.copy_from(env.step(&action).unwrap());
                step += 1;
            }
            let share = differ as f64 / total as f64;
            eprintln!(
                "{}: {differ} of {total} pixels differ ({:.3}%), {:.0}% drawn",
                task.as_str(),
                100.0 * share,
                100.0 * drawn as f64 / total as f64
            );
            assert!(
                drawn * 2 > total,
                "{}: the boxes cover only {drawn} of {total} pixels",
                task.as_str()
            );
            assert!(
                share < 0.001,
                "{}: {differ} of {total} pixels differ from the ray caster's",
                task.as_str()
            );
        }
    }
}
