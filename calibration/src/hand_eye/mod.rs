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
//! rotations, then translation by linear least squares). Refinement ([`refine`]): `X` and `Y`
//! fitted to every view with both the camera's error (from its corners) and the arm's pose
//! error (estimated from the views) weighed. The refinement is kept only when it predicts views
//! it did not see better than the closed form does (leave one view out, fit on the others,
//! reproject the left-out view's corners through the arm's pose): otherwise the closed form is
//! the result, and the report says so.
//!
//! Motions about one axis only do not determine `X` (the camera can slide along that axis
//! unseen): the arm's turns between views about a second axis are measured
//! ([`MotionSpread`]), refused under [`MIN_SECOND_AXIS_DEG`] and warned about under
//! [`GOOD_SECOND_AXIS_DEG`] (docs/hardware.md, "Degenerate views").

mod closed_form;
pub mod refine;

pub use closed_form::{MotionSpread, motion_spread, park_martin};

use crate::board::{Board, Corners};
use crate::camera::CameraModel;
use nalgebra::{Isometry3, Matrix6, Quaternion, Translation3, UnitQuaternion};
use refine::{ArmNoise, Observed};
use serde::{Deserialize, Serialize};

/// Under this RMS turn about a second axis between views (degrees) hand-eye is refused: the
/// camera's place along the main axis is then set by noise. Views turned about one axis with
/// 0.1 degree of pose noise measure about 0.15 degree.
pub const MIN_SECOND_AXIS_DEG: f64 = 3.0;

/// Under this RMS turn about a second axis (degrees) the result comes with a warning:
/// docs/hardware.md asks for 15 degrees or more about different axes; the simulator's views
/// measure 9-12 degrees RMS.
pub const GOOD_SECOND_AXIS_DEG: f64 = 6.0;

/// The camera's place is reported as uncertain (a warning) beyond this standard deviation,
/// mm ...
pub const GOOD_CAMERA_SIGMA_MM: f64 = 1.0;

/// ... or this one, degrees.
pub const GOOD_CAMERA_SIGMA_DEG: f64 = 0.2;

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

/// Which estimate the result is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Estimate {
    /// The refinement weighing the camera's and the arm's errors ([`refine`]).
    Refined,
    /// Park-Martin's closed form: the refinement predicted left-out views worse.
    ClosedForm,
}

/// Reprojection RMS of each view's corners through `X`, `Y` and the arm's pose when `X` and `Y`
/// were fitted without that view, px.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct HeldOut {
    /// With the closed form.
    pub closed_form_px: f64,
    /// With the refinement.
    pub refined_px: f64,
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
    /// Which estimate `camera` is.
    pub estimate: Estimate,
    /// How well each estimate predicts views it was not fitted to (`None` under 4 views).
    pub held_out: Option<HeldOut>,
    /// Reprojection RMS over every corner, px, through the arm's poses.
    pub rms_px: f64,
    /// Per view: reprojection RMS, px.
    pub view_rms_px: Vec<f64>,
    /// Per view: how far the board's pose from that view alone lies from the fitted one
    /// (translation, mm; rotation, degrees): the residual people compare with OpenCV's.
    pub view_board_error: Vec<(f64, f64)>,
    /// The corners' noise, from each view's own PnP fit, px.
    pub pixel_noise_px: f64,
    /// The arm's pose noise the views show, per axis, degrees.
    pub arm_noise_deg: f64,
    /// The arm's pose noise the views show, per axis, mm.
    pub arm_noise_mm: f64,
    /// Standard deviation of the camera's place, mm (from the refinement's covariance).
    pub camera_sigma_mm: f64,
    /// Standard deviation of the camera's rotation, degrees.
    pub camera_sigma_deg: f64,
    /// How the arm turned between views.
    pub motion: MotionSpread,
    /// What to look at before trusting the result (weak motions, an uncertain result).
    pub warnings: Vec<String>,
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

/// The pixel noise assumed at least, px: noise-free renders would otherwise make the camera's
/// poses look exact to the weights.
const MIN_PIXEL_NOISE_PX: f64 = 0.01;

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
    let h: Vec<Isometry3<f64>> = views
        .iter()
        .map(|v| refine::h_of(setup, &v.gripper))
        .collect();
    let motion = turned_enough(&h)?;
    let objects: Vec<Vec<nalgebra::Point3<f64>>> = views
        .iter()
        .map(|v| board.object_points_of(&v.corners))
        .collect();
    let project = |k: usize, c: &Isometry3<f64>| -> Vec<nalgebra::Vector2<f64>> {
        objects[k]
            .iter()
            .map(|o| {
                model
                    .project(&(c * o))
                    .unwrap_or_else(|| nalgebra::Vector2::new(1e6, 1e6))
            })
            .collect()
    };
    let ObservedViews {
        boards,
        observed,
        pixel_noise_px,
    } = observe_views(model, board, views, &project)?;

    let x0 = park_martin(&h, &boards)?;
    let y0 = closed_form::board_from_views(&h, &boards, &x0);
    // Twice: the arm's noise estimated at the closed form, the fit, the noise again at the fit.
    let (fit, noise, weights) = refine_twice(setup, &observed, &x0, &y0);

    // Leave one view out: fit both estimates on the others, reproject the one left out.
    let view_ss = |k: usize, x: &Isometry3<f64>, y: &Isometry3<f64>| -> f64 {
        let c = x.inverse() * h[k] * y;
        project(k, &c)
            .iter()
            .zip(views[k].corners.pixels())
            .map(|(p, s)| (p - s).norm_squared())
            .sum()
    };
    let corners_total: usize = views.iter().map(|v| v.corners.len()).sum();
    let held_out = (views.len() >= 4).then(|| {
        leave_one_out(
            setup,
            &h,
            &boards,
            &observed,
            &weights,
            corners_total,
            &view_ss,
        )
    });
    let estimate = match held_out {
        Some(ho) if ho.refined_px > ho.closed_form_px => Estimate::ClosedForm,
        _ => Estimate::Refined,
    };
    let (x, y) = match estimate {
        Estimate::Refined => (fit.x, fit.y),
        Estimate::ClosedForm => (x0, y0),
    };
    let (sigma_m, sigma_rad) = refine::camera_sigma(&fit).unwrap_or((f64::NAN, f64::NAN));

    let view_rms_px: Vec<f64> = (0..views.len())
        .map(|k| (view_ss(k, &x, &y) / views[k].corners.len() as f64).sqrt())
        .collect();
    let rms_px =
        ((0..views.len()).map(|k| view_ss(k, &x, &y)).sum::<f64>() / corners_total as f64).sqrt();
    let view_board_error = h
        .iter()
        .zip(&boards)
        .map(|(hi, ci)| {
            let yi = hi.inverse() * x * ci;
            pose_error(&yi, &y)
        })
        .collect();
    let (sigma_mm, sigma_deg) = (sigma_m * 1e3, sigma_rad.to_degrees());
    let warnings = fit_warnings(&motion, sigma_mm, sigma_deg, estimate);
    Ok(HandEye {
        setup,
        camera: x,
        board: y,
        closed_form: x0,
        estimate,
        held_out,
        rms_px,
        view_rms_px,
        view_board_error,
        pixel_noise_px,
        arm_noise_deg: noise.rotation_rad.to_degrees(),
        arm_noise_mm: noise.translation_m * 1e3,
        camera_sigma_mm: sigma_mm,
        camera_sigma_deg: sigma_deg,
        motion,
        warnings,
    })
}

/// How the arm turned between the views; refused when about one axis only.
fn turned_enough(h: &[Isometry3<f64>]) -> Result<MotionSpread, HandEyeError> {
    let motion = motion_spread(h);
    if motion.second_axis_deg < MIN_SECOND_AXIS_DEG {
        return Err(HandEyeError::Degenerate(format!(
            "{:.2} degrees RMS about the main axis, {:.2} about any other (at least {MIN_SECOND_AXIS_DEG} needed)",
            motion.main_axis_deg, motion.second_axis_deg
        )));
    }
    Ok(motion)
}

/// A view's squared pixel error for a camera pose and a board pose.
type ViewError<'a> = dyn Fn(usize, &Isometry3<f64>, &Isometry3<f64>) -> f64 + 'a;

/// Where view `k`'s board corners land for a camera pose.
type Projector<'a> = dyn Fn(usize, &Isometry3<f64>) -> Vec<nalgebra::Vector2<f64>> + 'a;

/// The board's pose in each view, the views as the refinement takes them, and the pixel noise
/// their corners show.
struct ObservedViews {
    boards: Vec<Isometry3<f64>>,
    observed: Vec<Observed>,
    pixel_noise_px: f64,
}

/// Each view's board pose and what its corners say about it (the pose's covariance at the
/// pixel noise the corners show).
fn observe_views(
    model: &CameraModel,
    board: &Board,
    views: &[HandEyeView],
    project: &Projector<'_>,
) -> Result<ObservedViews, HandEyeError> {
    let mut boards = Vec::with_capacity(views.len());
    let mut information = Vec::with_capacity(views.len());
    let (mut ss, mut dof) = (0.0, 0.0);
    for (k, v) in views.iter().enumerate() {
        let (pose, rms) = crate::intrinsics::board_pose(model, board, &v.corners)
            .ok_or(HandEyeError::NoBoardPose(k))?;
        ss += rms * rms * v.corners.len() as f64;
        dof += (2 * v.corners.len()).saturating_sub(6) as f64;
        information.push(refine::pose_information(|c| project(k, c), &pose));
        boards.push(pose);
    }
    let pixel_noise_px = (ss / dof.max(1.0)).sqrt().max(MIN_PIXEL_NOISE_PX);
    let observed: Vec<Observed> = views
        .iter()
        .zip(&boards)
        .zip(&information)
        .map(|((v, c), info)| Observed {
            gripper: v.gripper,
            board: *c,
            board_cov: info
                .try_inverse()
                .map(|i| i * pixel_noise_px.powi(2))
                .unwrap_or_else(|| Matrix6::identity() * 1e6),
        })
        .collect();
    Ok(ObservedViews {
        boards,
        observed,
        pixel_noise_px,
    })
}

/// The fit twice: the arm's noise estimated at the closed form `x0`, `y0`, the views whitened
/// by it and the fit; then the noise again at that fit. Returns the fit, the noise and the
/// weights of the second round.
fn refine_twice(
    setup: Setup,
    observed: &[Observed],
    x0: &Isometry3<f64>,
    y0: &Isometry3<f64>,
) -> (refine::Fit, ArmNoise, Vec<Matrix6<f64>>) {
    let all: Vec<&Observed> = observed.iter().collect();
    let (mut x, mut y) = (*x0, *y0);
    let mut noise = ArmNoise {
        rotation_rad: 0.0,
        translation_m: 0.0,
    };
    let mut weights = Vec::new();
    let mut fit = None;
    for _ in 0..2 {
        noise = refine::estimate_arm_noise(setup, &x, &y, observed);
        weights = refine::whitening(setup, &x, &y, observed, noise);
        let w: Vec<&Matrix6<f64>> = weights.iter().collect();
        let f = refine::solve(setup, &all, &w, x0, y0);
        (x, y) = (f.x, f.y);
        fit = Some(f);
    }
    (fit.expect("the loop ran"), noise, weights)
}

/// Leave one view out: both estimates fitted on the other views, each judged by how it
/// reprojects the one left out (`view_ss`: a view's squared pixel error for a camera and board
/// pose), over all `corners_total` corners.
fn leave_one_out(
    setup: Setup,
    h: &[Isometry3<f64>],
    boards: &[Isometry3<f64>],
    observed: &[Observed],
    weights: &[Matrix6<f64>],
    corners_total: usize,
    view_ss: &ViewError<'_>,
) -> HeldOut {
    let (mut cf, mut rf) = (0.0, 0.0);
    for k in 0..h.len() {
        let others: Vec<usize> = (0..h.len()).filter(|&j| j != k).collect();
        let hk: Vec<Isometry3<f64>> = others.iter().map(|&j| h[j]).collect();
        let ck: Vec<Isometry3<f64>> = others.iter().map(|&j| boards[j]).collect();
        // A subset whose motions alone are degenerate says nothing about either estimate.
        let Ok(xk) = park_martin(&hk, &ck) else {
            continue;
        };
        let yk = closed_form::board_from_views(&hk, &ck, &xk);
        let ok: Vec<&Observed> = others.iter().map(|&j| &observed[j]).collect();
        let wk: Vec<&Matrix6<f64>> = others.iter().map(|&j| &weights[j]).collect();
        let f = refine::solve(setup, &ok, &wk, &xk, &yk);
        cf += view_ss(k, &xk, &yk);
        rf += view_ss(k, &f.x, &f.y);
    }
    HeldOut {
        closed_form_px: (cf / corners_total as f64).sqrt(),
        refined_px: (rf / corners_total as f64).sqrt(),
    }
}

/// What the person should know about the fit: a weak second axis of motion, an uncertain
/// camera place, a closed form that beat the refinement.
fn fit_warnings(
    motion: &MotionSpread,
    sigma_mm: f64,
    sigma_deg: f64,
    estimate: Estimate,
) -> Vec<String> {
    let mut warnings = Vec::new();
    if motion.second_axis_deg < GOOD_SECOND_AXIS_DEG {
        warnings.push(format!(
            "the arm turned by {:.1} degrees RMS about a second axis between views (under {GOOD_SECOND_AXIS_DEG}): turn the wrist and the base by 15 degrees or more about different axes",
            motion.second_axis_deg
        ));
    }
    if !(sigma_mm <= GOOD_CAMERA_SIGMA_MM && sigma_deg <= GOOD_CAMERA_SIGMA_DEG) {
        warnings.push(format!(
            "the camera's place is uncertain by {sigma_mm:.2} mm and {sigma_deg:.3} degrees (1 sigma; good is under {GOOD_CAMERA_SIGMA_MM} mm and {GOOD_CAMERA_SIGMA_DEG} degrees): more views, larger turns, or joint readings taken when the arm was still"
        ));
    }
    if estimate == Estimate::ClosedForm {
        warnings.push(
            "the refinement predicted left-out views worse than the closed form, so the closed form is the result: the arm's poses and the pictures disagree more than their noise explains (were the joints read while the arm moved?)"
                .to_string(),
        );
    }
    warnings
}

/// Translation (mm) and rotation (degrees) between two poses.
pub fn pose_error(a: &Isometry3<f64>, b: &Isometry3<f64>) -> (f64, f64) {
    (
        (a.translation.vector - b.translation.vector).norm() * 1e3,
        a.rotation.angle_to(&b.rotation).to_degrees(),
    )
}

#[cfg(test)]
mod tests;
