//! The closed-form start (Park and Martin) and the measure of how much the arm turned.

use super::HandEyeError;
use nalgebra::{
    DMatrix, DVector, Isometry3, Matrix3, Rotation3, Translation3, UnitQuaternion, Vector3,
};

/// How the arm turned between views: over every pair of views, the RMS of the rotation between
/// them along its main axis and along the best second axis, degrees. Hand-eye needs turns about
/// two different axes (Tsai and Lenz 1989): with one axis, the camera can slide along it
/// unseen.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct MotionSpread {
    /// RMS rotation between views about the axis they share most, degrees.
    pub main_axis_deg: f64,
    /// RMS rotation between views about the best other axis, degrees.
    pub second_axis_deg: f64,
}

/// The rotations between every pair of `h` (`H_j H_i^-1`), as RMS degrees along their two
/// strongest directions.
pub fn motion_spread(h: &[Isometry3<f64>]) -> MotionSpread {
    let mut m = Matrix3::zeros();
    let mut pairs = 0.0f64;
    for i in 0..h.len() {
        for j in i + 1..h.len() {
            let a = (h[j] * h[i].inverse()).rotation.scaled_axis();
            m += a * a.transpose();
            pairs += 1.0;
        }
    }
    let mut l: Vec<f64> = (m / pairs.max(1.0))
        .symmetric_eigen()
        .eigenvalues
        .iter()
        .copied()
        .collect();
    l.sort_by(|a, b| b.total_cmp(a));
    MotionSpread {
        main_axis_deg: l[0].max(0.0).sqrt().to_degrees(),
        second_axis_deg: l[1].max(0.0).sqrt().to_degrees(),
    }
}

/// Park-Martin's closed form of `A X = X B` over all pairs of views, given
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
            "largest rotation between views {:.2} degrees",
            largest.to_degrees(),
        )));
    }
    let inv_sqrt = eig.eigenvectors
        * Matrix3::from_diagonal(&eig.eigenvalues.map(|l| 1.0 / l.sqrt()))
        * eig.eigenvectors.transpose();
    let rx = nearest_rotation(&(inv_sqrt * m.transpose()));
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
        .svd(true, true)
        .solve(&rhs, 1e-12)
        .map_err(|e| HandEyeError::Degenerate(e.to_string()))?;
    Ok(Isometry3::from_parts(
        Translation3::new(t[0], t[1], t[2]),
        UnitQuaternion::from_rotation_matrix(&Rotation3::from_matrix_unchecked(rx)),
    ))
}

/// `Y` from every view (`Y = H_i^-1 X C_i`), averaged.
pub fn board_from_views(
    h: &[Isometry3<f64>],
    c: &[Isometry3<f64>],
    x: &Isometry3<f64>,
) -> Isometry3<f64> {
    average(
        &h.iter()
            .zip(c)
            .map(|(hi, ci)| hi.inverse() * x * ci)
            .collect::<Vec<_>>(),
    )
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
