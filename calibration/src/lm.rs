//! Levenberg-Marquardt for the small dense least-squares problems of calibration (a few hundred
//! parameters at most), with a forward-difference Jacobian.
//!
//! The damping follows Nielsen's schedule (Madsen, Nielsen and Tingleff, "Methods for non-linear
//! least squares problems", 2004, section 3.2): grow by a factor that doubles on each rejected
//! step, shrink by `max(1/3, 1 - (2 rho - 1)^3)` on an accepted one; the damping is scaled by
//! the diagonal of `J^T J` (Marquardt's form), which makes it independent of each parameter's
//! unit (pixels of focal length next to radians of rotation).

use nalgebra::{DMatrix, DVector};

/// How a minimisation ended.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LmReport {
    /// Iterations run.
    pub iterations: usize,
    /// Sum of squared residuals at the start.
    pub initial_cost: f64,
    /// Sum of squared residuals at the end.
    pub final_cost: f64,
}

/// Minimises `|r(p)|^2` from `p`; `residuals(p, out)` fills `out` (length `m`).
pub fn minimise(
    p: &mut DVector<f64>,
    m: usize,
    max_iterations: usize,
    mut residuals: impl FnMut(&DVector<f64>, &mut DVector<f64>),
) -> LmReport {
    let n = p.len();
    let mut r = DVector::zeros(m);
    residuals(p, &mut r);
    let initial_cost = r.norm_squared();
    let report = |iterations, final_cost| LmReport {
        iterations,
        initial_cost,
        final_cost,
    };
    let mut cost = initial_cost;
    let mut j = DMatrix::zeros(m, n);
    let mut r_step = DVector::zeros(m);
    let mut probe = p.clone();
    let mut mu = -1.0;
    let mut nu = 2.0;
    let mut iterations = 0;
    while iterations < max_iterations {
        iterations += 1;
        // Forward differences, a step per parameter scaled to its size.
        for k in 0..n {
            let h = 1e-7 * p[k].abs().max(1e-2);
            probe[k] = p[k] + h;
            residuals(&probe, &mut r_step);
            probe[k] = p[k];
            for i in 0..m {
                j[(i, k)] = (r_step[i] - r[i]) / h;
            }
        }
        let jtj = j.tr_mul(&j);
        let g = j.tr_mul(&r);
        if g.amax() < 1e-14 {
            break;
        }
        if mu < 0.0 {
            mu = 1e-3 * (0..n).map(|k| jtj[(k, k)]).fold(0.0, f64::max);
        }
        let mut accepted = false;
        while !accepted {
            let mut a = jtj.clone();
            for k in 0..n {
                a[(k, k)] += mu * jtj[(k, k)].max(1e-12);
            }
            let Some(step) = a.cholesky().map(|c| c.solve(&(-&g))) else {
                mu *= nu;
                nu *= 2.0;
                if mu > 1e30 {
                    return report(iterations, cost);
                }
                continue;
            };
            probe.copy_from(p);
            probe += &step;
            residuals(&probe, &mut r_step);
            let new_cost = r_step.norm_squared();
            // Gain ratio: actual reduction over the reduction the linear model predicts.
            let mut damp = step.clone();
            for k in 0..n {
                damp[k] *= mu * jtj[(k, k)].max(1e-12);
            }
            let predicted = step.dot(&(damp - &g));
            let rho = (cost - new_cost) / predicted.max(1e-300);
            if new_cost < cost && rho > 0.0 {
                let converged = (cost - new_cost) <= 1e-15 * cost.max(1e-300)
                    || step.norm() <= 1e-12 * (p.norm() + 1e-12);
                p.copy_from(&probe);
                r.copy_from(&r_step);
                cost = new_cost;
                mu *= (1.0 - (2.0 * rho - 1.0).powi(3)).max(1.0 / 3.0);
                nu = 2.0;
                accepted = true;
                if converged {
                    return report(iterations, cost);
                }
            } else {
                probe.copy_from(p);
                mu *= nu;
                nu *= 2.0;
                if mu > 1e30 {
                    return report(iterations, cost);
                }
            }
        }
    }
    report(iterations, cost)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_minimum_of_rosenbrock() {
        let mut p = DVector::from_vec(vec![-1.2, 1.0]);
        let report = minimise(&mut p, 2, 200, |p, r| {
            r[0] = 10.0 * (p[1] - p[0] * p[0]);
            r[1] = 1.0 - p[0];
        });
        assert!(
            (p[0] - 1.0).abs() < 1e-6 && (p[1] - 1.0).abs() < 1e-6,
            "{p}"
        );
        assert!(report.final_cost < 1e-12 && report.initial_cost > 1.0);
    }
}
