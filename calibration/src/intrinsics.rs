//! Camera intrinsics from views of a planar board: Zhang's closed form for a start, then
//! Levenberg-Marquardt over the focal lengths, principal point, the five distortion coefficients
//! and every view's pose at once, on the reprojection error (Zhang, "A flexible new technique
//! for camera calibration", IEEE TPAMI 22(11), 2000, sections 3.1 and 3.2; zero skew as
//! OpenCV's `calibrateCamera` assumes).
//!
//! Also the board's pose in one view from known intrinsics (PnP for a plane: the homography of
//! the undistorted corners, then the same refinement on six parameters).

use crate::board::{Board, Corners};
use crate::camera::CameraModel;
use crate::lm;
use nalgebra::{
    DMatrix, DVector, Isometry3, Matrix3, Point3, Rotation3, Translation3, UnitQuaternion, Vector2,
    Vector3,
};
use serde::Serialize;

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
    /// tilted about one axis).
    #[error(
        "the views do not determine the focal length ({0}); tilt the board by 20-45 degrees about different axes between views"
    )]
    Degenerate(String),
}

/// The fewest views kept.
pub const MIN_VIEWS: usize = 3;

/// Calibrates from the corners of each view (`views[k]` in [`Board::object_points`]' order);
/// views whose RMS is far above the others' are dropped and the rest refined again.
pub fn calibrate(
    board: &Board,
    width: u32,
    height: u32,
    views: &[Corners],
) -> Result<Intrinsics, CalibrateError> {
    let mut kept: Vec<usize> = (0..views.len()).collect();
    let mut rejected = Vec::new();
    loop {
        if kept.len() < MIN_VIEWS {
            return Err(CalibrateError::TooFewViews {
                usable: kept.len(),
                needed: MIN_VIEWS,
            });
        }
        let chosen: Vec<&Corners> = kept.iter().map(|&k| &views[k]).collect();
        let mut fit = refine(board, width, height, &chosen)?;
        for (v, &k) in fit.views.iter_mut().zip(&kept) {
            v.index = k;
        }
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
        if worst.rms_px > limit && kept.len() > MIN_VIEWS {
            rejected.push((
                worst.index,
                format!(
                    "reprojection RMS {:.2} px, over {:.2} px (3x the median)",
                    worst.rms_px, limit
                ),
            ));
            kept.retain(|&k| k != worst.index);
            continue;
        }
        fit.rejected = rejected;
        return Ok(fit);
    }
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

/// The homography from the board's plane (x, y) to pixels, by the normalised direct linear
/// transform (Hartley and Zisserman, "Multiple View Geometry", 2nd ed., algorithm 4.2).
pub fn homography(object: &[Point3<f64>], seen: &[Vector2<f64>]) -> Option<Matrix3<f64>> {
    let n = object.len().min(seen.len());
    if n < 4 {
        return None;
    }
    let src: Vec<Vector2<f64>> = object.iter().map(|p| Vector2::new(p.x, p.y)).collect();
    let (ts, src_n) = normalise(&src[..n]);
    let (td, dst_n) = normalise(&seen[..n]);
    let mut a = DMatrix::zeros(2 * n, 9);
    for k in 0..n {
        let (x, y) = (src_n[k].x, src_n[k].y);
        let (u, v) = (dst_n[k].x, dst_n[k].y);
        let row = [-x, -y, -1.0, 0.0, 0.0, 0.0, u * x, u * y, u];
        let row2 = [0.0, 0.0, 0.0, -x, -y, -1.0, v * x, v * y, v];
        for c in 0..9 {
            a[(2 * k, c)] = row[c];
            a[(2 * k + 1, c)] = row2[c];
        }
    }
    let h = smallest_singular_vector(&a)?;
    let hn = Matrix3::from_row_slice(h.as_slice());
    let h = td.try_inverse()? * hn * ts;
    (h[(2, 2)].abs() > 1e-300).then(|| h / h[(2, 2)])
}

fn smallest_singular_vector(a: &DMatrix<f64>) -> Option<DVector<f64>> {
    let svd = a.clone().svd(false, true);
    let vt = svd.v_t?;
    let (k, _) = svd
        .singular_values
        .iter()
        .enumerate()
        .min_by(|a, b| a.1.total_cmp(b.1))?;
    Some(vt.row(k).transpose())
}

/// Hartley's normalisation: centroid at the origin, mean distance sqrt(2).
fn normalise(pts: &[Vector2<f64>]) -> (Matrix3<f64>, Vec<Vector2<f64>>) {
    let c = pts.iter().sum::<Vector2<f64>>() / pts.len() as f64;
    let d = pts.iter().map(|p| (p - c).norm()).sum::<f64>() / pts.len() as f64;
    let s = std::f64::consts::SQRT_2 / d.max(1e-12);
    let t = Matrix3::new(s, 0.0, -s * c.x, 0.0, s, -s * c.y, 0.0, 0.0, 1.0);
    (t, pts.iter().map(|p| (p - c) * s).collect())
}

/// Zhang's closed form for `K` from the views' homographies, with zero skew.
fn zhang_k(hs: &[Matrix3<f64>]) -> Result<Matrix3<f64>, CalibrateError> {
    let v = |h: &Matrix3<f64>, i: usize, j: usize| -> [f64; 6] {
        let (hi, hj) = (h.column(i), h.column(j));
        [
            hi[0] * hj[0],
            hi[0] * hj[1] + hi[1] * hj[0],
            hi[1] * hj[1],
            hi[2] * hj[0] + hi[0] * hj[2],
            hi[2] * hj[1] + hi[1] * hj[2],
            hi[2] * hj[2],
        ]
    };
    let mut a = DMatrix::zeros(2 * hs.len() + 1, 6);
    for (k, h) in hs.iter().enumerate() {
        // Scale each homography so that the constraints weigh views alike.
        let h = h / h.column(0).norm().max(1e-300);
        let v12 = v(&h, 0, 1);
        let v11 = v(&h, 0, 0);
        let v22 = v(&h, 1, 1);
        for c in 0..6 {
            a[(2 * k, c)] = v12[c];
            a[(2 * k + 1, c)] = v11[c] - v22[c];
        }
    }
    // Zero skew: B12 = 0, weighted like the other rows.
    a[(2 * hs.len(), 1)] = 1.0;
    // One null direction is the answer; a second (the next singular value near zero) means the
    // views leave the camera undetermined.
    let mut sv: Vec<f64> = a
        .clone()
        .svd(false, false)
        .singular_values
        .iter()
        .copied()
        .collect();
    sv.sort_by(|x, y| y.total_cmp(x));
    if sv[4] < 1e-9 * sv[0] {
        return Err(CalibrateError::Degenerate(format!(
            "{} views, all alike up to a shift",
            hs.len()
        )));
    }
    let mut b = smallest_singular_vector(&a).ok_or_else(|| {
        CalibrateError::Degenerate("no solution for the image of the conic".into())
    })?;
    if b[0] < 0.0 {
        b = -b;
    }
    let (b11, b12, b22, b13, b23, b33) = (b[0], b[1], b[2], b[3], b[4], b[5]);
    let den = b11 * b22 - b12 * b12;
    let v0 = (b12 * b13 - b11 * b23) / den;
    let lambda = b33 - (b13 * b13 + v0 * (b12 * b13 - b11 * b23)) / b11;
    let alpha = (lambda / b11).sqrt();
    let beta = (lambda * b11 / den).sqrt();
    let u0 = -b13 * alpha * alpha / lambda;
    if !(alpha.is_finite() && beta.is_finite() && u0.is_finite() && v0.is_finite()) {
        return Err(CalibrateError::Degenerate(format!(
            "the closed form gave fx {alpha}, fy {beta}"
        )));
    }
    Ok(Matrix3::new(alpha, 0.0, u0, 0.0, beta, v0, 0.0, 0.0, 1.0))
}

/// `T_camera_board` from a homography and `K` (Zhang, section 3.1), the rotation made orthonormal.
fn pose_from_homography(k: &Matrix3<f64>, h: &Matrix3<f64>) -> Isometry3<f64> {
    let kinv = k.try_inverse().unwrap_or_else(Matrix3::identity);
    let mut h1 = kinv * h.column(0);
    let mut h2 = kinv * h.column(1);
    let mut h3 = kinv * h.column(2);
    let s = 1.0 / h1.norm().max(1e-300);
    if h3.z * s < 0.0 {
        h1 = -h1;
        h2 = -h2;
        h3 = -h3;
    }
    let r1 = h1 * s;
    let r2 = h2 * s;
    let r3 = r1.cross(&r2);
    let m = Matrix3::from_columns(&[r1, r2, r3]);
    let svd = m.svd(true, true);
    let (u, vt) = (svd.u.expect("u"), svd.v_t.expect("v_t"));
    let mut r = u * vt;
    if r.determinant() < 0.0 {
        r = -r;
    }
    Isometry3::from_parts(
        Translation3::from(h3 * s),
        UnitQuaternion::from_rotation_matrix(&Rotation3::from_matrix_unchecked(r)),
    )
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
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use rand_distr::{Distribution, Normal};

    fn truth() -> CameraModel {
        CameraModel {
            dist: [-0.18, 0.06, 0.0009, -0.0006, -0.01],
            ..CameraModel::pinhole(640, 480, 530.0, 527.0, 318.2, 243.9)
        }
    }

    /// A pose looking at the board from 0.3-0.6 m, tilted up to ~40 degrees, whole board inside
    /// the image.
    pub(crate) fn random_view(
        rng: &mut ChaCha8Rng,
        model: &CameraModel,
        board: &Board,
    ) -> Isometry3<f64> {
        loop {
            let centre = Vector3::new(board.cols as f64 - 1.0, board.rows as f64 - 1.0, 0.0)
                * board.square_m
                / 2.0;
            let tilt = Vector3::new(
                rng.random_range(-0.7..0.7),
                rng.random_range(-0.7..0.7),
                rng.random_range(-0.5..0.5),
            );
            let rot = UnitQuaternion::from_scaled_axis(tilt);
            let t = Vector3::new(
                rng.random_range(-0.08..0.08),
                rng.random_range(-0.06..0.06),
                rng.random_range(0.3..0.6),
            );
            // Board centre at t, rotated about its centre.
            let pose = Isometry3::from_parts(Translation3::from(t - rot * centre), rot);
            if let Some(c) = project_board(model, board, &pose) {
                let inside = c.pixels().iter().all(|p| {
                    p.x > 20.0
                        && p.y > 20.0
                        && p.x < model.width as f64 - 20.0
                        && p.y < model.height as f64 - 20.0
                });
                if inside {
                    return pose;
                }
            }
        }
    }

    fn noisy_views(seed: u64, n: usize, sigma: f64) -> Vec<Corners> {
        let (m, b) = (truth(), "chessboard:9x6:0.025".parse::<Board>().unwrap());
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let noise = Normal::new(0.0, sigma.max(1e-300)).unwrap();
        (0..n)
            .map(|_| {
                let pose = random_view(&mut rng, &m, &b);
                let mut c = project_board(&m, &b, &pose).unwrap();
                if sigma > 0.0 {
                    for p in c.pixels_mut() {
                        *p += Vector2::new(noise.sample(&mut rng), noise.sample(&mut rng));
                    }
                }
                c
            })
            .collect()
    }

    #[test]
    fn charuco_views_of_part_of_the_board_give_back_the_camera() {
        // A large ChArUco board seen from close by: no view holds every corner, each holds a
        // different part, and the corners' ids place them on the board.
        let b: Board = "charuco:14x10:0.03:0.022:DICT_5X5_100".parse().unwrap();
        let m = truth();
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut views = Vec::new();
        while views.len() < 12 {
            let tilt = Vector3::new(
                rng.random_range(-0.6..0.6),
                rng.random_range(-0.6..0.6),
                rng.random_range(-0.5..0.5),
            );
            let rot = UnitQuaternion::from_scaled_axis(tilt);
            // Some point of the board in front of the camera, 0.25-0.4 m away.
            let on_board = Vector3::new(
                rng.random_range(0.05..0.37),
                rng.random_range(0.05..0.25),
                0.0,
            );
            let t = Vector3::new(0.0, 0.0, rng.random_range(0.25..0.4));
            let pose = Isometry3::from_parts(Translation3::from(t - rot * on_board), rot);
            let seen = visible_corners(&m, &b, &pose, 10.0);
            if seen.len() >= 20 && seen.len() < b.corners() {
                views.push(seen);
            }
        }
        let fit = calibrate(&b, 640, 480, &views).unwrap();
        assert!(fit.rms_px < 1e-6, "rms {}", fit.rms_px);
        let t = truth();
        for (got, want) in [(fit.model.fx, t.fx), (fit.model.cy, t.cy)] {
            assert!((got - want).abs() < 1e-6 * want, "{got} vs {want}");
        }
        // And each view's pose alone, from the recovered camera.
        let (pose, rms) = board_pose(&fit.model, &b, &views[3]).unwrap();
        assert!(rms < 1e-6);
        assert!((pose.translation.vector - fit.views[3].pose.translation.vector).norm() < 1e-7);
    }

    #[test]
    fn exact_corners_give_back_the_camera() {
        let b: Board = "chessboard:9x6:0.025".parse().unwrap();
        let fit = calibrate(&b, 640, 480, &noisy_views(1, 12, 0.0)).unwrap();
        let (m, t) = (fit.model, truth());
        assert!(fit.rms_px < 1e-6, "rms {}", fit.rms_px);
        for (got, want) in [(m.fx, t.fx), (m.fy, t.fy), (m.cx, t.cx), (m.cy, t.cy)] {
            assert!((got - want).abs() < 1e-6 * want, "{got} vs {want}");
        }
        for (got, want) in m.dist.iter().zip(t.dist) {
            assert!((got - want).abs() < 1e-6, "{:?} vs {:?}", m.dist, t.dist);
        }
        assert!(fit.rejected.is_empty());
    }

    #[test]
    fn with_pixel_noise_the_error_falls_as_views_are_added() {
        let b: Board = "chessboard:9x6:0.025".parse().unwrap();
        let t = truth();
        // Mean relative focal error over eight seeds, at 5, 10 and 30 views of 0.3 px noise.
        let err = |n: usize| -> f64 {
            (0..8u64)
                .map(|seed| {
                    let fit = calibrate(&b, 640, 480, &noisy_views(100 + seed, n, 0.3)).unwrap();
                    ((fit.model.fx - t.fx) / t.fx).abs() + ((fit.model.fy - t.fy) / t.fy).abs()
                })
                .sum::<f64>()
                / 16.0
        };
        let (e5, e10, e30) = (err(5), err(10), err(30));
        assert!(e30 < e10 && e10 < e5, "{e5} {e10} {e30}");
        assert!(e30 < 0.002, "30 noisy views within 0.2%: {e30}");
    }

    #[test]
    fn a_misdetected_view_is_rejected_and_named() {
        let b: Board = "chessboard:9x6:0.025".parse().unwrap();
        let mut views = noisy_views(7, 10, 0.1);
        // Two corners of view 4 swapped: the detector labelled them wrong.
        views[4].pixels_mut().swap(10, 30);
        let fit = calibrate(&b, 640, 480, &views).unwrap();
        assert_eq!(fit.rejected.len(), 1, "{:?}", fit.rejected);
        assert_eq!(fit.rejected[0].0, 4);
        assert!(((fit.model.fx - truth().fx) / truth().fx).abs() < 0.002);
    }

    #[test]
    fn too_few_or_flat_views_are_refused_with_what_to_do() {
        let b: Board = "chessboard:9x6:0.025".parse().unwrap();
        let e = calibrate(&b, 640, 480, &noisy_views(3, 2, 0.0)).unwrap_err();
        assert!(e.to_string().contains("at least 3"), "{e}");
        // Fronto-parallel views at different distances: no focal length.
        let m = truth();
        let flat: Vec<Corners> = (0..5)
            .map(|k| {
                let pose = Isometry3::translation(-0.1, -0.06, 0.3 + 0.05 * k as f64);
                project_board(
                    &CameraModel {
                        dist: [0.0; 5],
                        ..m
                    },
                    &b,
                    &pose,
                )
                .unwrap()
            })
            .collect();
        match calibrate(&b, 640, 480, &flat) {
            Err(CalibrateError::Degenerate(why)) => assert!(why.contains("alike"), "{why}"),
            other => panic!("fronto-parallel views calibrated: {other:?}"),
        }
    }

    #[test]
    fn the_board_pose_comes_back_from_known_intrinsics() {
        let (m, b) = (truth(), "chessboard:9x6:0.025".parse::<Board>().unwrap());
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for _ in 0..5 {
            let pose = random_view(&mut rng, &m, &b);
            let seen = project_board(&m, &b, &pose).unwrap();
            let (got, rms) = board_pose(&m, &b, &seen).unwrap();
            assert!(rms < 1e-6);
            assert!((got.translation.vector - pose.translation.vector).norm() < 1e-7);
            assert!(got.rotation.angle_to(&pose.rotation) < 1e-7);
        }
    }
}
