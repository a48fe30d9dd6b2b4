//! The closed forms under the refinement: a plane's homography (normalised DLT), Zhang's `K`
//! from several, and a view's pose from one.

use super::CalibrateError;
use nalgebra::{
    DMatrix, DVector, Isometry3, Matrix3, Point3, Rotation3, Translation3, UnitQuaternion, Vector2,
};

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
pub(super) fn zhang_k(hs: &[Matrix3<f64>]) -> Result<Matrix3<f64>, CalibrateError> {
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
pub(super) fn pose_from_homography(k: &Matrix3<f64>, h: &Matrix3<f64>) -> Isometry3<f64> {
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
