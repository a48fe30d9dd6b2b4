//! Camera intrinsics from views of a planar board: Zhang's closed form for a start, then
//! Levenberg-Marquardt over the focal lengths, principal point, the five distortion coefficients
//! and every view's pose at once, on the reprojection error (Zhang, "A flexible new technique
//! for camera calibration", IEEE TPAMI 22(11), 2000, sections 3.1 and 3.2; zero skew as
//! OpenCV's `calibrateCamera` assumes).
//!
//! Also the board's pose in one view from known intrinsics (PnP for a plane: the homography of
//! the undistorted corners, then the same refinement on six parameters).
//!
//! What is kept out, each with its reason in the result: a corner far from where the fit puts
//! it (over [`CORNER_LIMIT_FLOOR_PX`] and [`CORNER_LIMIT_FACTOR`] times the RMS: on a ChArUco
//! view the corner goes, on a chessboard the view, whose grid is then in doubt), a view far
//! worse than the others (3x the median RMS and over 1 px). Views whose board normals all lie
//! near one plane (the board tilted about one axis only, or not at all) leave the lens
//! undetermined, whatever the RMS says (Sturm and Maybank, "On plane-based camera calibration",
//! CVPR 1999: planes parallel to a common line are a singular set), and are refused under
//! [`MIN_TILT_SPREAD_DEG`] (docs/hardware.md, "Degenerate views").

use crate::board::{Board, Corners, MIN_CHARUCO_CORNERS};
use crate::camera::CameraModel;
use crate::corner_check::RejectedCorner;
use crate::lm;
use zhang::{pose_from_homography, zhang_k};

mod zhang;
use nalgebra::{
    DVector, Isometry3, Matrix3, Point3, Translation3, UnitQuaternion, Vector2, Vector3,
};
use serde::Serialize;
pub use zhang::homography;

/// One view in a calibration's result.
#[derive(Clone, Debug, Serialize)]
pub struct ViewFit {
    /// Index of the view in the input.
    pub index: usize,
    /// Reprojection RMS of its corners, px.
    pub rms_px: f64,
    /// The board's pose in the camera frame, `T_camera_board`.
    pub pose: Isometry3<f64>,
}

/// A calibration's result.
#[derive(Clone, Debug, Serialize)]
pub struct Intrinsics {
    /// The camera.
    pub model: CameraModel,
    /// Reprojection RMS over every corner of the views kept, px (OpenCV's return value).
    pub rms_px: f64,
    /// The views kept.
    pub views: Vec<ViewFit>,
    /// Views left out, with why.
    pub rejected: Vec<(usize, String)>,
    /// Corners left out of views that were kept (ChArUco), with the view's index and why.
    pub rejected_corners: Vec<(usize, RejectedCorner)>,
    /// How far the board's normals in the views kept depart from the plane that fits them best
    /// (RMS, degrees): near 0 when the board was tilted about one axis only.
    pub tilt_spread_deg: f64,
    /// What to look at before trusting the result.
    pub warnings: Vec<String>,
    /// Iterations of the final refinement.
    pub iterations: usize,
}

/// Why no calibration came out.
#[derive(Debug, thiserror::Error)]
pub enum CalibrateError {
    /// Too few views to constrain the camera.
    #[error(
        "{usable} usable views of the board, at least {needed} are needed (15-25 give a good calibration: tilt the board, fill the corners of the image)"
    )]
    TooFewViews {
        /// Views with the whole board.
        usable: usize,
        /// Views needed.
        needed: usize,
    },
    /// The views do not constrain the focal length (all parallel to the image plane, or all
    /// tilted about one axis: [`MIN_TILT_SPREAD_DEG`]).
    #[error(
        "the views do not determine the focal length ({0}); tilt the board by 20-45 degrees about different axes between views"
    )]
    Degenerate(String),
}

/// The fewest views kept.
pub const MIN_VIEWS: usize = 3;

/// A corner is far from the fit beyond this many px ...
pub const CORNER_LIMIT_FLOOR_PX: f64 = 1.0;

/// ... and this many times the overall RMS (a 2D Gaussian residual passes 5 RMS once in
/// 7e10).
pub const CORNER_LIMIT_FACTOR: f64 = 5.0;

/// Under this spread of the board's normals out of one plane (RMS, degrees) the views are
/// refused as tilted about one axis: such views calibrated with an RMS of 0.05 px and a lens 90
/// px wrong at the image's corners. Views tilted about different axes by 20-45 degrees measure
/// 10-25 degrees.
pub const MIN_TILT_SPREAD_DEG: f64 = 3.0;

/// Under this spread the result comes with a warning.
pub const GOOD_TILT_SPREAD_DEG: f64 = 8.0;

/// Calibrates from the corners of each view (`views[k]` in [`Board::object_points`]' order).
/// Corners and views far from the fit are dropped (with why) and the rest refined again;
/// views tilted about one axis only are refused.
pub fn calibrate(
    board: &Board,
    width: u32,
    height: u32,
    views: &[Corners],
) -> Result<Intrinsics, CalibrateError> {
    let mut p = Pruning {
        views: views.to_vec(),
        kept: (0..views.len()).collect(),
        rejected: Vec::new(),
        rejected_corners: Vec::new(),
    };
    loop {
        if p.kept.len() < MIN_VIEWS {
            return Err(CalibrateError::TooFewViews {
                usable: p.kept.len(),
                needed: MIN_VIEWS,
            });
        }
        let chosen: Vec<&Corners> = p.kept.iter().map(|&k| &p.views[k]).collect();
        let mut fit = refine(board, width, height, &chosen)?;
        for (v, &k) in fit.views.iter_mut().zip(&p.kept) {
            v.index = k;
        }
        if p.drop_far_corners(board, &fit) || p.drop_worst_view(&fit) {
            continue;
        }
        let spread = tilt_spread_deg(&fit.views);
        if spread < MIN_TILT_SPREAD_DEG {
            return Err(CalibrateError::Degenerate(format!(
                "the board's tilts in the {} views kept are all about one axis: its normals leave their common plane by {spread:.2} degrees RMS, at least {MIN_TILT_SPREAD_DEG} needed",
                fit.views.len()
            )));
        }
        if spread < GOOD_TILT_SPREAD_DEG {
            fit.warnings.push(format!(
                "the board's tilts are nearly all about one axis (its normals leave their common plane by {spread:.1} degrees RMS, under {GOOD_TILT_SPREAD_DEG}): the lens is weakly determined; add views tilted about another axis"
            ));
        }
        fit.tilt_spread_deg = spread;
        fit.rejected = p.rejected;
        fit.rejected_corners = p.rejected_corners;
        return Ok(fit);
    }
}

/// The views a calibration keeps, and what it dropped and why.
struct Pruning {
    views: Vec<Corners>,
    kept: Vec<usize>,
    rejected: Vec<(usize, String)>,
    rejected_corners: Vec<(usize, RejectedCorner)>,
}

impl Pruning {
    /// Drops the corners far from `fit` (a ChArUco view keeps the rest) or the views holding
    /// them; says whether anything was dropped.
    fn drop_far_corners(&mut self, board: &Board, fit: &Intrinsics) -> bool {
        // Corners far from the fit: a mislabelled or misplaced corner that the detection's own
        // check let through moves the camera while its view's RMS stays low (one 7.9 px corner
        // among 44 left its view at 0.975 px, under the view rule below).
        let limit = (CORNER_LIMIT_FACTOR * fit.rms_px).max(CORNER_LIMIT_FLOOR_PX);
        let mut dropped_any = false;
        for v in &fit.views {
            let seen = &self.views[v.index];
            let objects = board.object_points_of(seen);
            let mut r = vec![0.0; 2 * seen.len()];
            view_residuals(&fit.model, &v.pose, &objects, seen.pixels(), &mut r);
            let far: Vec<(u32, Vector2<f64>, f64)> = seen
                .iter()
                .zip(r.chunks_exact(2))
                .map(|((id, px), e)| (id, px, e[0].hypot(e[1])))
                .filter(|f| f.2 > limit)
                .collect();
            if far.is_empty() {
                continue;
            }
            dropped_any = true;
            if board.is_charuco() && seen.len() - far.len() >= MIN_CHARUCO_CORNERS {
                for (id, px, e) in &far {
                    self.rejected_corners.push((
                    v.index,
                    RejectedCorner {
                        id: *id,
                        pixel: [px.x, px.y],
                        reason: format!(
                            "{e:.1} px from where the calibration puts it (limit {limit:.2} px: {CORNER_LIMIT_FACTOR}x the RMS, at least {CORNER_LIMIT_FLOOR_PX} px)"
                        ),
                    },
                ));
                }
                let (ids, pixels) = seen
                    .iter()
                    .filter(|(id, _)| far.iter().all(|f| f.0 != *id))
                    .unzip();
                self.views[v.index] = Corners::new(ids, pixels);
            } else {
                let (id, _, e) = far
                    .iter()
                    .max_by(|a, b| a.2.total_cmp(&b.2))
                    .expect("far is not empty");
                self.rejected.push((
                v.index,
                format!(
                    "corner {id} is {e:.1} px from where the calibration puts it (limit {limit:.2} px): a misdetected board"
                ),
            ));
                self.kept.retain(|&k| k != v.index);
            }
        }
        dropped_any
    }

    /// Drops the view far worse than the median; says whether one was dropped.
    fn drop_worst_view(&mut self, fit: &Intrinsics) -> bool {
        // A view far worse than the median is a misdetection or a blurred frame: OpenCV users
        // drop those by hand; here the rule is 3x the median and at least 1 px.
        let mut rms: Vec<f64> = fit.views.iter().map(|v| v.rms_px).collect();
        rms.sort_by(f64::total_cmp);
        let limit = (3.0 * rms[rms.len() / 2]).max(1.0);
        let worst = fit
            .views
            .iter()
            .max_by(|a, b| a.rms_px.total_cmp(&b.rms_px))
            .expect("views are not empty");
        if worst.rms_px > limit && self.kept.len() > MIN_VIEWS {
            self.rejected.push((
                worst.index,
                format!(
                    "reprojection RMS {:.2} px, over {:.2} px (3x the median)",
                    worst.rms_px, limit
                ),
            ));
            self.kept.retain(|&k| k != worst.index);
            return true;
        }
        false
    }
}

/// The RMS angle (degrees) by which the board's normals in `views` leave the plane through the
/// origin that fits them best: the square root of the smallest eigenvalue of their mean outer
/// product is the RMS sine of that angle.
pub fn tilt_spread_deg(views: &[ViewFit]) -> f64 {
    let mut s = Matrix3::zeros();
    for v in views {
        let n = v.pose.rotation * Vector3::z();
        s += n * n.transpose();
    }
    let smallest = (s / views.len().max(1) as f64)
        .symmetric_eigen()
        .eigenvalues
        .min();
    smallest.clamp(0.0, 1.0).sqrt().asin().to_degrees()
}

fn refine(
    board: &Board,
    width: u32,
    height: u32,
    views: &[&Corners],
) -> Result<Intrinsics, CalibrateError> {
    let objects: Vec<Vec<Point3<f64>>> = views.iter().map(|c| board.object_points_of(c)).collect();
    let homographies: Vec<Matrix3<f64>> = views
        .iter()
        .zip(&objects)
        .map(|(c, o)| homography(o, c.pixels()))
        .collect::<Option<_>>()
        .ok_or_else(|| CalibrateError::Degenerate("a view's homography is singular".into()))?;
    let k = zhang_k(&homographies)?;
    let model0 = CameraModel::pinhole(width, height, k[(0, 0)], k[(1, 1)], k[(0, 2)], k[(1, 2)]);
    let n_views = views.len();
    let mut p = DVector::zeros(9 + 6 * n_views);
    p[0] = model0.fx;
    p[1] = model0.fy;
    p[2] = model0.cx;
    p[3] = model0.cy;
    for (v, h) in homographies.iter().enumerate() {
        let pose = pose_from_homography(&k, h);
        write_pose(&mut p, 9 + 6 * v, &pose);
    }
    // Each view's residuals start where the views before it end (ChArUco views differ in size).
    let mut starts = Vec::with_capacity(n_views + 1);
    starts.push(0);
    for o in &objects {
        starts.push(starts.last().unwrap() + 2 * o.len());
    }
    let m = starts[n_views];
    let residuals = |p: &DVector<f64>, r: &mut DVector<f64>| {
        let model = model_of(p, width, height);
        for (v, c) in views.iter().enumerate() {
            let pose = read_pose(p, 9 + 6 * v);
            view_residuals(
                &model,
                &pose,
                &objects[v],
                c.pixels(),
                &mut r.as_mut_slice()[starts[v]..starts[v + 1]],
            );
        }
    };
    let report = lm::minimise(&mut p, m, 200, residuals);
    let model = model_of(&p, width, height);
    let mut fits = Vec::with_capacity(n_views);
    let mut total = 0.0;
    for (v, c) in views.iter().enumerate() {
        let pose = read_pose(&p, 9 + 6 * v);
        let mut r = vec![0.0; 2 * c.len()];
        view_residuals(&model, &pose, &objects[v], c.pixels(), &mut r);
        let ss: f64 = r.iter().map(|x| x * x).sum();
        total += ss;
        fits.push(ViewFit {
            index: v,
            rms_px: (ss / c.len() as f64).sqrt(),
            pose,
        });
    }
    if !(model.fx > 0.0 && model.fy > 0.0 && total.is_finite()) {
        return Err(CalibrateError::Degenerate(format!(
            "the refinement ended at fx {:.1}, fy {:.1}",
            model.fx, model.fy
        )));
    }
    Ok(Intrinsics {
        model,
        rms_px: (total / (m / 2) as f64).sqrt(),
        views: fits,
        rejected: Vec::new(),
        rejected_corners: Vec::new(),
        tilt_spread_deg: f64::NAN,
        warnings: Vec::new(),
        iterations: report.iterations,
    })
}

fn model_of(p: &DVector<f64>, width: u32, height: u32) -> CameraModel {
    CameraModel {
        width,
        height,
        fx: p[0],
        fy: p[1],
        cx: p[2],
        cy: p[3],
        dist: [p[4], p[5], p[6], p[7], p[8]],
    }
}

fn write_pose(p: &mut DVector<f64>, at: usize, pose: &Isometry3<f64>) {
    let r = pose.rotation.scaled_axis();
    let t = pose.translation.vector;
    for k in 0..3 {
        p[at + k] = r[k];
        p[at + 3 + k] = t[k];
    }
}

fn read_pose(p: &DVector<f64>, at: usize) -> Isometry3<f64> {
    Isometry3::from_parts(
        Translation3::new(p[at + 3], p[at + 4], p[at + 5]),
        UnitQuaternion::from_scaled_axis(Vector3::new(p[at], p[at + 1], p[at + 2])),
    )
}

/// Predicted minus observed pixel of each corner (`2 * object.len()` values; a corner behind
/// the camera counts 1e6 px so that the solver backs away).
fn view_residuals(
    model: &CameraModel,
    pose: &Isometry3<f64>,
    object: &[Point3<f64>],
    seen: &[Vector2<f64>],
    out: &mut [f64],
) {
    for (k, (o, s)) in object.iter().zip(seen).enumerate() {
        let e = match model.project(&(pose * o)) {
            Some(px) => px - s,
            None => Vector2::new(1e6, 1e6),
        };
        out[2 * k] = e.x;
        out[2 * k + 1] = e.y;
    }
}

/// The board's pose in one view, `T_camera_board`, from known intrinsics, with the view's
/// reprojection RMS, px.
pub fn board_pose(
    model: &CameraModel,
    board: &Board,
    seen: &Corners,
) -> Option<(Isometry3<f64>, f64)> {
    let object = board.object_points_of(seen);
    let normalised: Vec<Vector2<f64>> = seen
        .pixels()
        .iter()
        .map(|c| model.undistort(c.x, c.y))
        .collect();
    let h = homography(&object, &normalised)?;
    let start = pose_from_homography(&Matrix3::identity(), &h);
    let mut p = DVector::zeros(6);
    write_pose(&mut p, 0, &start);
    let m = 2 * object.len();
    lm::minimise(&mut p, m, 100, |p, r| {
        view_residuals(
            model,
            &read_pose(p, 0),
            &object,
            seen.pixels(),
            r.as_mut_slice(),
        )
    });
    let pose = read_pose(&p, 0);
    let mut r = vec![0.0; m];
    view_residuals(model, &pose, &object, seen.pixels(), &mut r);
    let rms = (r.iter().map(|x| x * x).sum::<f64>() / object.len() as f64).sqrt();
    Some((pose, rms))
}

/// Projects every corner of the board through a pose and a camera (for synthetic views and
/// checks); `None` when one falls behind the camera.
pub fn project_board(model: &CameraModel, board: &Board, pose: &Isometry3<f64>) -> Option<Corners> {
    board
        .object_points()
        .iter()
        .map(|o| model.project(&(pose * o)))
        .collect::<Option<Vec<_>>>()
        .map(Corners::whole)
}

/// The corners of the board a camera sees through a pose: those in front of it and at least
/// `margin_px` inside the image.
pub fn visible_corners(
    model: &CameraModel,
    board: &Board,
    pose: &Isometry3<f64>,
    margin_px: f64,
) -> Corners {
    let (w, h) = (model.width as f64, model.height as f64);
    let (ids, pixels) = board
        .object_points()
        .iter()
        .enumerate()
        .filter_map(|(id, o)| {
            let p = model.project(&(pose * o))?;
            let inside = p.x >= margin_px - 0.5
                && p.y >= margin_px - 0.5
                && p.x <= w - 0.5 - margin_px
                && p.y <= h - 0.5 - margin_px;
            inside.then_some((id as u32, p))
        })
        .unzip();
    Corners::new(ids, pixels)
}

#[cfg(test)]
mod tests;
