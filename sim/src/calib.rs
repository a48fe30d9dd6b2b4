//! Calibration views rendered by the simulator's cameras, with their truth: the whole camera
//! calibration chain (detect, calibrate, hand-eye) is checked against known numbers.
//!
//! A rig camera's lens is the renderer's pinhole: `fx = fy = height / (2 tan(fov_y / 2))`, the
//! principal point at the image's centre (`(width - 1) / 2` with OpenCV's pixel centres at
//! integers). The scene renderer has no lens distortion; board views can add one
//! ([`BoardRenderer`] casts each ray through the distortion model) so that recovering it is
//! tested too.
//!
//! The board is drawn by casting 4x4 rays per pixel (anti-aliased edges, as a real lens and
//! sensor blur them), black squares at 8 % and white at 90 % reflectance over a grey
//! background.

use crate::camera::{Mount, RigCamera};
use crate::world::ArmModel;
use nalgebra::{Isometry3, Translation3, UnitQuaternion, Vector3};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use reflex_calibration::board::Board;
use reflex_calibration::camera::CameraModel;
use reflex_calibration::intrinsics::{project_board, visible_corners};
use reflex_runtime::kinematics::{Chain, IkOptions, top_down};

/// Rays cast per pixel along each axis.
const SUPERSAMPLE: usize = 4;

impl RigCamera {
    /// The camera's lens at an image size (a pinhole: the renderer's projection).
    pub fn lens(&self, width: u32, height: u32) -> CameraModel {
        let f = height as f64 / (2.0 * (self.fov_y_rad / 2.0).tan());
        CameraModel::pinhole(
            width,
            height,
            f,
            f,
            (width as f64 - 1.0) / 2.0,
            (height as f64 - 1.0) / 2.0,
        )
    }
}

impl RigCamera {
    /// The camera as the robot spec lists it: its size, its pinhole and its mount (the
    /// simulator knows both exactly).
    pub fn spec(&self, width: u32, height: u32) -> reflex_runtime::msg::CameraSpec {
        let lens = self.lens(width, height);
        let (parent, pose) = match &self.mount {
            Mount::Fixed(p) => ("base".to_string(), *p),
            Mount::Link { link, offset } => (link.clone(), *offset),
        };
        let q = pose.rotation.coords;
        reflex_runtime::msg::CameraSpec {
            name: self.name.clone(),
            width,
            height,
            intrinsics: Some([lens.fx, lens.fy, lens.cx, lens.cy]),
            mount: Some(reflex_runtime::msg::CameraMount {
                parent,
                translation_m: pose.translation.vector.into(),
                rotation_xyzw: [q[0], q[1], q[2], q[3]],
            }),
        }
    }
}

/// Draws a board seen through a lens; the rays are computed once per lens.
pub struct BoardRenderer {
    lens: CameraModel,
    /// Per pixel, `SUPERSAMPLE^2` undistorted normalised ray directions `(x, y)` (z = 1).
    rays: Vec<[f32; 2]>,
}

impl BoardRenderer {
    /// A renderer for `lens` (its size and distortion).
    pub fn new(lens: &CameraModel) -> Self {
        let (w, h) = (lens.width as usize, lens.height as usize);
        let mut rays = Vec::with_capacity(w * h * SUPERSAMPLE * SUPERSAMPLE);
        for v in 0..h {
            for u in 0..w {
                for sv in 0..SUPERSAMPLE {
                    for su in 0..SUPERSAMPLE {
                        // Sub-pixel centres; the pixel (u, v) covers [u - 0.5, u + 0.5].
                        let pu = u as f64 - 0.5 + (su as f64 + 0.5) / SUPERSAMPLE as f64;
                        let pv = v as f64 - 0.5 + (sv as f64 + 0.5) / SUPERSAMPLE as f64;
                        let n = lens.undistort(pu, pv);
                        rays.push([n.x as f32, n.y as f32]);
                    }
                }
            }
        }
        BoardRenderer { lens: *lens, rays }
    }

    /// The lens.
    pub fn lens(&self) -> &CameraModel {
        &self.lens
    }

    /// Renders `board` at `T_camera_board` into `out` (RGB8, `width * height * 3`).
    pub fn render(&self, board: &Board, camera_board: &Isometry3<f64>, out: &mut [u8]) {
        let inv = camera_board.inverse();
        let rot = inv.rotation.to_rotation_matrix().into_inner();
        let origin = inv.translation.vector; // the camera's centre in the board's frame
        let per_px = SUPERSAMPLE * SUPERSAMPLE;
        for (p, px) in out.chunks_exact_mut(3).enumerate() {
            let mut sum = 0.0f64;
            for ray in &self.rays[p * per_px..(p + 1) * per_px] {
                let d = rot * Vector3::new(ray[0] as f64, ray[1] as f64, 1.0);
                // Where the ray meets the board's plane z = 0, in front of the camera.
                let s = -origin.z / d.z;
                let paint = if s > 0.0 && s.is_finite() {
                    board.paint(origin.x + s * d.x, origin.y + s * d.y)
                } else {
                    None
                };
                sum += match paint {
                    Some(true) => 0.08,
                    Some(false) => 0.9,
                    None => 0.45,
                };
            }
            let g = (sum / per_px as f64 * 255.0).round() as u8;
            px.fill(g);
        }
    }
}

/// One rendered view and its truth.
pub struct BoardView {
    /// `T_camera_board`.
    pub camera_board: Isometry3<f64>,
    /// The arm's five joint positions, rad (hand-eye views).
    pub joints: Option<[f64; 5]>,
    /// RGB8 pixels.
    pub image: Vec<u8>,
}

/// Whether the whole board, margin included, is inside the image with `border` px to spare.
fn board_in_view(
    lens: &CameraModel,
    board: &Board,
    camera_board: &Isometry3<f64>,
    border: f64,
) -> bool {
    let s = board.square_m;
    let (x0, y0, x1, y1) = board.squares_extent();
    let outline = [
        (x0 - s, y0 - s),
        (x1 + s, y0 - s),
        (x0 - s, y1 + s),
        (x1 + s, y1 + s),
    ];
    let corners_in = project_board(lens, board, camera_board).is_some_and(|c| {
        c.pixels().iter().all(|p| {
            p.x > border
                && p.y > border
                && p.x < lens.width as f64 - border
                && p.y < lens.height as f64 - border
        })
    });
    corners_in
        && outline.iter().all(|&(x, y)| {
            lens.project(&(camera_board * nalgebra::Point3::new(x, y, 0.0)))
                .is_some_and(|p| {
                    p.x > 0.0
                        && p.y > 0.0
                        && p.x < lens.width as f64 - 1.0
                        && p.y < lens.height as f64 - 1.0
                })
        })
}

/// Whether a view is one a person would keep: a chessboard whole in the picture; a ChArUco
/// board with at least half its corners well inside (the rest may be out of the picture, which
/// its markers allow).
fn usable_view(lens: &CameraModel, board: &Board, camera_board: &Isometry3<f64>) -> bool {
    if board.is_charuco() {
        visible_corners(lens, board, camera_board, 8.0).len() * 2 >= board.corners()
    } else {
        board_in_view(lens, board, camera_board, 8.0)
    }
}

/// The middle of the board's squares, in its frame.
fn board_centre(board: &Board) -> Vector3<f64> {
    let (x0, y0, x1, y1) = board.squares_extent();
    Vector3::new((x0 + x1) / 2.0, (y0 + y1) / 2.0, 0.0)
}

/// Views of a board held in front of a camera at `n` seeded poses: the board's centre 1.2-2.5
/// board-widths away (a ChArUco board also closer, down to 0.8), turned up to 40 degrees about
/// its axes and 30 about the view axis, the whole chessboard inside the picture, or at least
/// half of a ChArUco board's corners (the views a person takes for intrinsics).
pub fn intrinsics_views(lens: &CameraModel, board: &Board, n: usize, seed: u64) -> Vec<BoardView> {
    let renderer = BoardRenderer::new(lens);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let centre = board_centre(board);
    let width_m = (board.cols + 1) as f64 * board.square_m;
    let nearest = if board.is_charuco() { 0.6 } else { 0.9 };
    // Distance at which the board spans about 60 % of the image's width.
    let near = lens.fx * width_m / (0.6 * lens.width as f64);
    let mut views = Vec::with_capacity(n);
    while views.len() < n {
        let rot = UnitQuaternion::from_scaled_axis(Vector3::new(
            rng.random_range(-0.7..0.7),
            rng.random_range(-0.7..0.7),
            rng.random_range(-0.5..0.5),
        ));
        let z = near * rng.random_range(nearest..2.0);
        let t = Vector3::new(
            rng.random_range(-0.38..0.38) * z * lens.width as f64 / lens.fx,
            rng.random_range(-0.38..0.38) * z * lens.height as f64 / lens.fy,
            z,
        );
        let pose = Isometry3::from_parts(Translation3::from(t - rot * centre), rot);
        if !usable_view(lens, board, &pose) {
            continue;
        }
        let mut image = vec![0u8; (lens.width * lens.height * 3) as usize];
        renderer.render(board, &pose, &mut image);
        views.push(BoardView {
            camera_board: pose,
            joints: None,
            image,
        });
    }
    views
}

/// The wrist camera's hand-eye views: a board lying printed side up on the table at
/// `base_board`, the arm above it at `n` seeded joint positions (top-down IK over the board,
/// then every arm joint turned by up to 0.3 rad), kept when the wrist camera sees the whole
/// chessboard (half a ChArUco board). Returns the views and `T_gripper_camera`, the truth.
pub fn hand_eye_views(
    arm: &ArmModel,
    camera: &RigCamera,
    lens: &CameraModel,
    board: &Board,
    base_board: &Isometry3<f64>,
    n: usize,
    seed: u64,
) -> Result<(Vec<BoardView>, Isometry3<f64>), String> {
    let Mount::Link { link, offset } = &camera.mount else {
        return Err(format!(
            "camera `{}` is not on a link of the arm",
            camera.name
        ));
    };
    let to_link =
        Chain::from_urdf(&arm.urdf, "so101.urdf", "base", link).map_err(|e| e.to_string())?;
    let renderer = BoardRenderer::new(lens);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let centre = base_board * nalgebra::Point3::from(board_centre(board));
    let mut views = Vec::with_capacity(n);
    let mut tries = 0;
    while views.len() < n {
        tries += 1;
        if tries > 200 * n {
            return Err(format!(
                "only {} of {n} poses of the arm let camera `{}` see the whole board",
                views.len(),
                camera.name
            ));
        }
        let above = Vector3::new(
            centre.x + rng.random_range(-0.04..0.04),
            centre.y + rng.random_range(-0.04..0.04),
            rng.random_range(0.16..0.24),
        );
        let target = Isometry3::from_parts(
            Translation3::from(above),
            top_down(rng.random_range(-1.0..1.0)),
        );
        let seed_q = [0.0, -0.9, 0.9, 1.2, 0.0];
        let sol = arm.ik_chain.ik(&target, &seed_q, &IkOptions::default());
        let mut q = [sol.q[0], sol.q[1], sol.q[2], sol.q[3], sol.q[4]];
        for (k, qk) in q.iter_mut().enumerate() {
            *qk = (*qk + rng.random_range(-0.3..0.3)).clamp(arm.limits[k].0, arm.limits[k].1);
        }
        let base_camera = to_link.fk(&q) * offset;
        let camera_board = base_camera.inverse() * base_board;
        if !usable_view(lens, board, &camera_board) {
            continue;
        }
        let mut image = vec![0u8; (lens.width * lens.height * 3) as usize];
        renderer.render(board, &camera_board, &mut image);
        views.push(BoardView {
            camera_board,
            joints: Some(q),
            image,
        });
    }
    Ok((views, *offset))
}

/// `T_base_board` of a board lying printed side up on the table in front of the arm: its x along
/// the base's x, its z (into the board) pointing down.
pub fn board_on_table(x: f64, y: f64) -> Isometry3<f64> {
    Isometry3::from_parts(
        Translation3::new(x, y, 0.0),
        UnitQuaternion::from_scaled_axis(Vector3::new(std::f64::consts::PI, 0.0, 0.0)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::camera::CameraRig;
    use reflex_calibration::board::{detect, gray_from_rgb};

    #[test]
    fn the_detector_finds_rendered_corners_where_the_lens_projects_them() {
        let rig = CameraRig::default_rig();
        let lens = CameraModel {
            dist: [-0.15, 0.04, 0.0, 0.0, 0.0],
            ..rig.cameras[0].lens(640, 480)
        };
        let board: Board = "chessboard:9x6:0.025".parse().unwrap();
        let (mut worst, mut sum, mut n): (f64, f64, f64) = (0.0, 0.0, 0.0);
        for view in intrinsics_views(&lens, &board, 4, 9) {
            let found = detect(&board, &gray_from_rgb(&view.image), 640, 480).expect("board found");
            let truth = project_board(&lens, &board, &view.camera_board).unwrap();
            assert_eq!(found.ids(), truth.ids());
            for (f, t) in found.pixels().iter().zip(truth.pixels()) {
                worst = worst.max((f - t).norm());
                sum += (f - t).norm();
                n += 1.0;
            }
        }
        eprintln!("corner error: mean {:.3} px, worst {worst:.3} px", sum / n);
        // The detector's sub-pixel corners on anti-aliased edges.
        assert!(
            worst < 0.25 && sum / n < 0.08,
            "corners {:.3} px from the truth on average, {worst:.3} px at worst",
            sum / n
        );
    }

    #[test]
    fn charuco_corners_are_found_by_id_where_the_lens_projects_them_in_part_views_too() {
        // The markers are drawn as OpenCV draws them: every corner found carries the id whose
        // board point projects there, whole board in view or not.
        let rig = CameraRig::default_rig();
        let lens = CameraModel {
            dist: [-0.15, 0.04, 0.0, 0.0, 0.0],
            ..rig.cameras[0].lens(640, 480)
        };
        let board: Board = "charuco:9x7:0.03:0.022".parse().unwrap();
        let (mut worst, mut sum, mut n): (f64, f64, f64) = (0.0, 0.0, 0.0);
        let mut partial = 0;
        for view in intrinsics_views(&lens, &board, 8, 4) {
            let found = detect(&board, &gray_from_rgb(&view.image), 640, 480).expect("board found");
            let truth = visible_corners(&lens, &board, &view.camera_board, 0.0);
            partial += usize::from(truth.len() < board.corners());
            assert!(
                found.len() * 10 >= truth.len() * 8,
                "{} of {}",
                found.len(),
                truth.len()
            );
            for (id, f) in found.iter() {
                let t = truth
                    .get(id)
                    .unwrap_or_else(|| panic!("corner {id} found, not in view"));
                worst = worst.max((f - t).norm());
                sum += (f - t).norm();
                n += 1.0;
            }
        }
        eprintln!(
            "ChArUco corner error: mean {:.3} px, worst {worst:.3} px, {partial} of 8 views partial",
            sum / n
        );
        assert!(partial >= 2, "some views show part of the board: {partial}");
        assert!(
            worst < 0.25 && sum / n < 0.08,
            "corners {:.3} px from the truth on average, {worst:.3} px at worst",
            sum / n
        );
    }

    #[test]
    fn the_wrist_camera_sees_the_board_from_every_hand_eye_pose() {
        let rig = CameraRig::default_rig();
        let wrist = &rig.cameras[1];
        let lens = wrist.lens(640, 480);
        let board: Board = "chessboard:9x6:0.015".parse().unwrap();
        let (views, x) = hand_eye_views(
            &ArmModel::so101(),
            wrist,
            &lens,
            &board,
            &board_on_table(0.2, -0.04),
            3,
            1,
        )
        .unwrap();
        assert_eq!(views.len(), 3);
        assert_eq!(x.translation.vector, Vector3::new(0.035, 0.0, 0.02));
        for v in &views {
            assert!(detect(&board, &gray_from_rgb(&v.image), 640, 480).is_ok());
        }
    }
}
