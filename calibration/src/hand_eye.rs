//! Hand-eye calibration: where a camera sits relative to the arm.
//!
//! - Eye in hand (the camera on the gripper): the unknown is `X = T_gripper_camera`; the board
//!   stays put in the base frame (`Y = T_base_board`).
//! - Eye to hand (the camera fixed, the board held by the gripper): `X = T_base_camera`,
//!   `Y = T_gripper_board`.
//!
//! Each view gives the gripper's pose `G_i = T_base_gripper` (forward kinematics of the
//! calibrated arm) and the board's pose `C_i = T_camera_board` (PnP with the intrinsics). With
//! `H_i = G_i^-1` (eye in hand) or `G_i` (eye to hand), every view satisfies
//! `C_i = X^-1 H_i Y`, so pairs of views give `A X = X B` with `A = H_j H_i^-1` and
//! `B = C_j C_i^-1`.
//!
//! Start: Park and Martin, "Robot sensor calibration: solving AX = XB on the Euclidean group",
//! IEEE Trans. Robotics and Automation 10(5), 1994 (rotation from the logarithms of the pairs'
//! rotations, then translation by linear least squares). Refinement: Levenberg-Marquardt over
//! `X` and `Y` on the board corners' reprojection error in every view, which weighs each view by
//! what the camera actually measured.

use crate::board::{Board, Corners};
use crate::camera::CameraModel;
use crate::lm;
use nalgebra::{
    DMatrix, DVector, Isometry3, Matrix3, Quaternion, Rotation3, Translation3, UnitQuaternion,
    Vector3,
};
use serde::{Deserialize, Serialize};

/// Where the camera is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Setup {
    /// On the gripper.
    EyeInHand,
    /// Fixed, looking at the arm.
    EyeToHand,
}

/// One view: the gripper's pose and the board's corners seen in it.
#[derive(Clone, Debug)]
pub struct HandEyeView {
    /// `T_base_gripper`.
    pub gripper: Isometry3<f64>,
    /// The board's corners seen.
    pub corners: Corners,
}

/// The result.
#[derive(Clone, Debug, Serialize)]
pub struct HandEye {
    /// The setup solved.
    pub setup: Setup,
    /// `T_gripper_camera` (eye in hand) or `T_base_camera` (eye to hand).
    pub camera: Isometry3<f64>,
    /// `T_base_board` (eye in hand) or `T_gripper_board` (eye to hand).
    pub board: Isometry3<f64>,
    /// The closed-form start (Park-Martin), before refinement.
    pub closed_form: Isometry3<f64>,
    /// Reprojection RMS over every corner, px.
    pub rms_px: f64,
    /// Per view: reprojection RMS, px.
    pub view_rms_px: Vec<f64>,
    /// Per view: how far the board's pose from that view alone lies from the fitted one
    /// (translation, mm; rotation, degrees): the residual people compare with OpenCV's.
    pub view_board_error: Vec<(f64, f64)>,
}

/// Why no hand-eye result came out.
#[derive(Debug, thiserror::Error)]
pub enum HandEyeError {
    /// Too few views.
    #[error(
        "{0} views with the board and the arm's pose; at least 3 are needed (10-20 give a good result)"
    )]
    TooFewViews(usize),
    /// The arm's motions do not constrain the result.
    #[error(
        "the arm's rotations between views are all about one axis or too small ({0}); rotate the wrist and the base between views, by 15 degrees or more about different axes"
    )]
    Degenerate(String),
    /// A view where the board's pose could not be found.
    #[error("view {0}: the board's pose could not be found from its corners")]
    NoBoardPose(usize),
    /// A board whose frame is ambiguous.
    #[error(
        "board {0} looks the same after a half turn, so its frame can flip between views; use a chessboard with an odd and an even count of inner corners (e.g. 9x6), or a ChArUco board"
    )]
    SymmetricBoard(String),
}

/// A pose in files: translation, m, and rotation as a unit quaternion `[x, y, z, w]` (ROS's
/// order).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pose {
    /// m.
    pub translation_m: [f64; 3],
    /// `[x, y, z, w]`.
    pub rotation_xyzw: [f64; 4],
}

impl From<&Isometry3<f64>> for Pose {
    fn from(p: &Isometry3<f64>) -> Self {
        let q = p.rotation.coords;
        Pose {
            translation_m: p.translation.vector.into(),
            rotation_xyzw: [q[0], q[1], q[2], q[3]],
        }
    }
}

impl Pose {
    /// The isometry; the quaternion is normalised.
    pub fn iso(&self) -> Isometry3<f64> {
        let [x, y, z, w] = self.rotation_xyzw;
        let [tx, ty, tz] = self.translation_m;
        Isometry3::from_parts(
            Translation3::new(tx, ty, tz),
            UnitQuaternion::from_quaternion(Quaternion::new(w, x, y, z)),
        )
    }
}

/// The result file of `reflex calibrate hand-eye`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandEyeFile {
    /// Where the camera is.
    pub setup: Setup,
    /// The frame `camera` is given in.
    pub parent: String,
    /// `T_parent_camera`.
    pub camera: Pose,
    /// Reprojection RMS, px.
    pub rms_px: f64,
}

impl HandEyeFile {
    /// Reads a result file.
    pub fn load(path: &std::path::Path) -> Result<HandEyeFile, crate::camera::CameraFileError> {
        let shown = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|source| crate::camera::CameraFileError::Io {
                path: shown.clone(),
                source,
            })?;
        let f: HandEyeFile =
            serde_json::from_str(&text).map_err(|e| crate::camera::CameraFileError::Format {
                path: shown.clone(),
                message: format!("not a `reflex calibrate hand-eye` result: {e}"),
            })?;
        let norm = f
            .camera
            .rotation_xyzw
            .iter()
            .map(|q| q * q)
            .sum::<f64>()
            .sqrt();
        if f.parent.is_empty()
            || !f.camera.translation_m.iter().all(|v| v.is_finite())
            || !(0.99..=1.01).contains(&norm)
        {
            return Err(crate::camera::CameraFileError::Format {
                path: shown,
                message: "needs a parent frame, a finite translation and a unit quaternion".into(),
            });
        }
        Ok(f)
    }
}

/// Solves hand-eye from views with the camera's intrinsics.
pub fn calibrate_hand_eye(
    setup: Setup,
    model: &CameraModel,
    board: &Board,
    views: &[HandEyeView],
) -> Result<HandEye, HandEyeError> {
    if !board.orientation_is_unique() {
        return Err(HandEyeError::SymmetricBoard(board.to_string()));
    }
    if views.len() < 3 {
        return Err(HandEyeError::TooFewViews(views.len()));
    }
    let boards: Vec<Isometry3<f64>> = views
        .iter()
        .enumerate()
        .map(|(k, v)| {
            crate::intrinsics::board_pose(model, board, &v.corners)
                .map(|(p, _)| p)
                .ok_or(HandEyeError::NoBoardPose(k))
        })
        .collect::<Result<_, _>>()?;
    let h: Vec<Isometry3<f64>> = views
        .iter()
        .map(|v| match setup {
            Setup::EyeInHand => v.gripper.inverse(),
            Setup::EyeToHand => v.gripper,
        })
        .collect();
    let x0 = park_martin(&h, &boards)?;
    // Y from each view (Y = H_i^-1 X C_i), averaged.
    let y0 = average(
        &h.iter()
            .zip(&boards)
            .map(|(hi, ci)| hi.inverse() * x0 * ci)
            .collect::<Vec<_>>(),
    );
    let objects: Vec<Vec<nalgebra::Point3<f64>>> = views
        .iter()
        .map(|v| board.object_points_of(&v.corners))
        .collect();
    let mut starts = Vec::with_capacity(views.len() + 1);
    starts.push(0);
    for o in &objects {
        starts.push(starts.last().unwrap() + 2 * o.len());
    }
    let m = starts[views.len()];
    let mut p = DVector::zeros(12);
    write(&mut p, 0, &x0);
    write(&mut p, 6, &y0);
    let residual = |p: &DVector<f64>, r: &mut DVector<f64>| {
        let (x, y) = (read(p, 0), read(p, 6));
        for (v, (hi, view)) in h.iter().zip(views).enumerate() {
            let c = x.inverse() * hi * y;
            let seen = view.corners.pixels();
            for (k, (o, s)) in objects[v].iter().zip(seen).enumerate() {
                let e = model
                    .project(&(c * o))
                    .map(|px| px - s)
                    .unwrap_or_else(|| nalgebra::Vector2::new(1e6, 1e6));
                r[starts[v] + 2 * k] = e.x;
                r[starts[v] + 2 * k + 1] = e.y;
            }
        }
    };
    lm::minimise(&mut p, m, 200, residual);
    let (x, y) = (read(&p, 0), read(&p, 6));
    let mut r = DVector::zeros(m);
    residual(&p, &mut r);
    let view_rms_px: Vec<f64> = (0..views.len())
        .map(|v| {
            let e = &r.as_slice()[starts[v]..starts[v + 1]];
            (e.iter().map(|e| e * e).sum::<f64>() / (e.len() / 2) as f64).sqrt()
        })
        .collect();
    let rms_px = (r.norm_squared() / (m / 2) as f64).sqrt();
    let view_board_error = h
        .iter()
        .zip(&boards)
        .map(|(hi, ci)| {
            let yi = hi.inverse() * x * ci;
            (
                (yi.translation.vector - y.translation.vector).norm() * 1e3,
                yi.rotation.angle_to(&y.rotation).to_degrees(),
            )
        })
        .collect();
    Ok(HandEye {
        setup,
        camera: x,
        board: y,
        closed_form: x0,
        rms_px,
        view_rms_px,
        view_board_error,
    })
}

/// Park-Martin's closed form of `A X = X B` over all pairs of consecutive views, given
/// `C_i = X^-1 H_i Y`.
pub fn park_martin(
    h: &[Isometry3<f64>],
    c: &[Isometry3<f64>],
) -> Result<Isometry3<f64>, HandEyeError> {
    let pairs: Vec<(Isometry3<f64>, Isometry3<f64>)> = (0..h.len())
        .flat_map(|i| (i + 1..h.len()).map(move |j| (i, j)))
        .map(|(i, j)| (h[j] * h[i].inverse(), c[j] * c[i].inverse()))
        .collect();
    // Rotation: R_X = (M^T M)^(-1/2) M^T with M = sum beta alpha^T (alpha = log R_A,
    // beta = log R_B).
    let mut m = Matrix3::zeros();
    let mut largest = 0.0f64;
    for (a, b) in &pairs {
        let alpha = a.rotation.scaled_axis();
        let beta = b.rotation.scaled_axis();
        largest = largest.max(alpha.norm());
        m += beta * alpha.transpose();
    }
    let mtm = m.transpose() * m;
    let eig = mtm.symmetric_eigen();
    let smallest = eig.eigenvalues.min();
    if smallest <= 1e-10 * eig.eigenvalues.max() || largest < 1e-3 {
        return Err(HandEyeError::Degenerate(format!(
            "largest rotation between views {:.2} degrees, eigenvalues {:?}",
            largest.to_degrees(),
            eig.eigenvalues.as_slice()
        )));
    }
    let inv_sqrt = eig.eigenvectors
        * Matrix3::from_diagonal(&eig.eigenvalues.map(|l| 1.0 / l.sqrt()))
        * eig.eigenvectors.transpose();
    let rx = inv_sqrt * m.transpose();
    let rx = nearest_rotation(&rx);
    // Translation: (R_A - I) t_X = R_X t_B - t_A, stacked.
    let mut lhs = DMatrix::zeros(3 * pairs.len(), 3);
    let mut rhs = DVector::zeros(3 * pairs.len());
    for (k, (a, b)) in pairs.iter().enumerate() {
        let ra = a.rotation.to_rotation_matrix().into_inner() - Matrix3::identity();
        let v = rx * b.translation.vector - a.translation.vector;
        for i in 0..3 {
            for j in 0..3 {
                lhs[(3 * k + i, j)] = ra[(i, j)];
            }
            rhs[3 * k + i] = v[i];
        }
    }
    let t = lhs
        .clone()
        .svd(true, true)
        .solve(&rhs, 1e-12)
        .map_err(|e| HandEyeError::Degenerate(e.to_string()))?;
    Ok(Isometry3::from_parts(
        Translation3::new(t[0], t[1], t[2]),
        UnitQuaternion::from_rotation_matrix(&Rotation3::from_matrix_unchecked(rx)),
    ))
}

fn nearest_rotation(m: &Matrix3<f64>) -> Matrix3<f64> {
    let svd = m.svd(true, true);
    let (u, vt) = (svd.u.expect("u"), svd.v_t.expect("v_t"));
    let mut d = Matrix3::identity();
    d[(2, 2)] = (u * vt).determinant().signum();
    u * d * vt
}

/// Mean of poses: translations averaged, rotations by the normalised sum of sign-aligned
/// quaternions (close poses only).
fn average(poses: &[Isometry3<f64>]) -> Isometry3<f64> {
    let t = poses
        .iter()
        .map(|p| p.translation.vector)
        .sum::<Vector3<f64>>()
        / poses.len() as f64;
    let q0 = poses[0].rotation.coords;
    let q = poses
        .iter()
        .map(|p| {
            let c = p.rotation.coords;
            if c.dot(&q0) < 0.0 { -c } else { c }
        })
        .sum::<nalgebra::Vector4<f64>>();
    Isometry3::from_parts(
        Translation3::from(t),
        UnitQuaternion::from_quaternion(nalgebra::Quaternion::from(q)),
    )
}

fn write(p: &mut DVector<f64>, at: usize, pose: &Isometry3<f64>) {
    let r = pose.rotation.scaled_axis();
    for k in 0..3 {
        p[at + k] = r[k];
        p[at + 3 + k] = pose.translation.vector[k];
    }
}

fn read(p: &DVector<f64>, at: usize) -> Isometry3<f64> {
    Isometry3::from_parts(
        Translation3::new(p[at + 3], p[at + 4], p[at + 5]),
        UnitQuaternion::from_scaled_axis(Vector3::new(p[at], p[at + 1], p[at + 2])),
    )
}

/// Translation (mm) and rotation (degrees) between two poses.
pub fn pose_error(a: &Isometry3<f64>, b: &Isometry3<f64>) -> (f64, f64) {
    (
        (a.translation.vector - b.translation.vector).norm() * 1e3,
        a.rotation.angle_to(&b.rotation).to_degrees(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intrinsics::project_board;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use rand_distr::{Distribution, Normal};

    fn model() -> CameraModel {
        CameraModel {
            dist: [-0.1, 0.02, 0.0, 0.0, 0.0],
            ..CameraModel::pinhole(640, 480, 500.0, 500.0, 320.0, 240.0)
        }
    }

    fn board() -> Board {
        "chessboard:9x6:0.025".parse().unwrap()
    }

    /// Views of a board on the table from a camera on the gripper: gripper poses above the board
    /// turned up to ~25 degrees about every axis, kept when the whole board is in the picture.
    fn views(
        setup: Setup,
        x: &Isometry3<f64>,
        y: &Isometry3<f64>,
        n: usize,
        sigma: f64,
        seed: u64,
    ) -> Vec<HandEyeView> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let noise = Normal::new(0.0, sigma.max(1e-300)).unwrap();
        let mut out = Vec::new();
        while out.len() < n {
            let rot = UnitQuaternion::from_scaled_axis(Vector3::new(
                std::f64::consts::PI + rng.random_range(-0.4..0.4),
                rng.random_range(-0.4..0.4),
                rng.random_range(-0.8..0.8),
            ));
            let g = Isometry3::from_parts(
                Translation3::new(
                    rng.random_range(0.15..0.3),
                    rng.random_range(-0.1..0.1),
                    rng.random_range(0.25..0.4),
                ),
                rot,
            );
            let h = match setup {
                Setup::EyeInHand => g.inverse(),
                Setup::EyeToHand => g,
            };
            let c = x.inverse() * h * y;
            let Some(mut corners) = project_board(&model(), &board(), &c) else {
                continue;
            };
            if !corners
                .pixels()
                .iter()
                .all(|p| p.x > 10.0 && p.y > 10.0 && p.x < 630.0 && p.y < 470.0)
            {
                continue;
            }
            if sigma > 0.0 {
                for p in corners.pixels_mut() {
                    *p += nalgebra::Vector2::new(noise.sample(&mut rng), noise.sample(&mut rng));
                }
            }
            out.push(HandEyeView {
                gripper: g,
                corners,
            });
        }
        out
    }

    #[test]
    fn eye_in_hand_recovers_the_camera_on_the_gripper() {
        let x = Isometry3::from_parts(
            Translation3::new(0.035, 0.0, 0.02),
            UnitQuaternion::from_scaled_axis(Vector3::new(0.3, 0.05, 1.5)),
        );
        // The board on the table in front of the arm, seen from above.
        let y = Isometry3::from_parts(
            Translation3::new(0.15, -0.07, 0.0),
            UnitQuaternion::identity(),
        );
        for (sigma, mm, deg) in [(0.0, 1e-3, 1e-4), (0.2, 1.0, 0.1)] {
            let v = views(Setup::EyeInHand, &x, &y, 15, sigma, 11);
            let fit = calibrate_hand_eye(Setup::EyeInHand, &model(), &board(), &v).unwrap();
            let (et, er) = pose_error(&fit.camera, &x);
            assert!(et < mm && er < deg, "noise {sigma}: {et} mm, {er} deg");
            let (bt, br) = pose_error(&fit.board, &y);
            assert!(bt < 2.0 * mm && br < 2.0 * deg, "board {bt} mm {br} deg");
            assert_eq!(fit.view_rms_px.len(), 15);
        }
    }

    #[test]
    fn eye_to_hand_recovers_the_fixed_camera() {
        // A camera 60 cm in front of the arm looking back at it; the board in the gripper.
        let x = Isometry3::from_parts(
            Translation3::new(0.25, 0.0, 0.0),
            UnitQuaternion::from_scaled_axis(Vector3::new(0.0, 0.0, 0.0)),
        );
        let y = Isometry3::from_parts(
            Translation3::new(-0.1, -0.06, 0.05),
            UnitQuaternion::identity(),
        );
        let v = views(Setup::EyeToHand, &x, &y, 12, 0.0, 3);
        let fit = calibrate_hand_eye(Setup::EyeToHand, &model(), &board(), &v).unwrap();
        let (et, er) = pose_error(&fit.camera, &x);
        assert!(et < 1e-3 && er < 1e-4, "{et} mm {er} deg");
    }

    #[test]
    fn motions_about_one_axis_are_refused_and_symmetric_boards_too() {
        let x = Isometry3::translation(0.03, 0.0, 0.02);
        let y = Isometry3::translation(0.15, -0.07, 0.0);
        // Gripper turning about its own z only.
        let v: Vec<HandEyeView> = (0..5)
            .map(|k| {
                let g = Isometry3::from_parts(
                    Translation3::new(0.2, 0.0, 0.35),
                    UnitQuaternion::from_scaled_axis(Vector3::new(std::f64::consts::PI, 0.0, 0.0))
                        * UnitQuaternion::from_scaled_axis(Vector3::new(0.0, 0.0, 0.1 * k as f64)),
                );
                let c = x.inverse() * g.inverse() * y;
                HandEyeView {
                    gripper: g,
                    corners: project_board(&model(), &board(), &c).unwrap(),
                }
            })
            .collect();
        let e = calibrate_hand_eye(Setup::EyeInHand, &model(), &board(), &v).unwrap_err();
        assert!(matches!(e, HandEyeError::Degenerate(_)), "{e}");
        let square: Board = "chessboard:8x6:0.025".parse().unwrap();
        let e = calibrate_hand_eye(Setup::EyeInHand, &model(), &square, &v).unwrap_err();
        assert!(e.to_string().contains("half turn"), "{e}");
    }
}
