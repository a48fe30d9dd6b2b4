//! Hand-eye's tests: exact and noisy views, both setups, the arm's pose noise, weak motions.

use super::*;
use crate::intrinsics::project_board;
use nalgebra::Vector3;
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

/// How the views are taken: pixel noise (px), the arm's reported pose off by a rotation
/// (degrees per axis) and a translation (mm per axis) in the gripper's frame, and how far the
/// gripper turns about its x and y axes (rad either way; z turns 0.8).
#[derive(Clone, Copy)]
struct Noise {
    px: f64,
    arm_deg: f64,
    arm_mm: f64,
    tilt: f64,
}

const EXACT: Noise = Noise {
    px: 0.0,
    arm_deg: 0.0,
    arm_mm: 0.0,
    tilt: 0.4,
};

fn eye_in_hand_truth() -> (Isometry3<f64>, Isometry3<f64>) {
    let x = Isometry3::from_parts(
        Translation3::new(0.035, 0.0, 0.02),
        UnitQuaternion::from_scaled_axis(Vector3::new(0.3, 0.05, 1.5)),
    );
    // The board on the table in front of the arm, seen from above.
    let y = Isometry3::from_parts(
        Translation3::new(0.15, -0.07, 0.0),
        UnitQuaternion::identity(),
    );
    (x, y)
}

/// Views of a board from gripper poses above it, kept when the whole board is in the
/// picture; the gripper's pose reported with the arm's noise.
fn views(
    setup: Setup,
    x: &Isometry3<f64>,
    y: &Isometry3<f64>,
    n: usize,
    noise: Noise,
    seed: u64,
) -> Vec<HandEyeView> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let unit = Normal::new(0.0, 1.0).unwrap();
    let mut out = Vec::new();
    while out.len() < n {
        let rot = UnitQuaternion::from_scaled_axis(Vector3::new(
            std::f64::consts::PI + rng.random_range(-noise.tilt..noise.tilt),
            rng.random_range(-noise.tilt..noise.tilt),
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
        let c = x.inverse() * refine::h_of(setup, &g) * y;
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
        for p in corners.pixels_mut() {
            *p += nalgebra::Vector2::new(unit.sample(&mut rng), unit.sample(&mut rng)) * noise.px;
        }
        let mut d = nalgebra::Vector6::zeros();
        for k in 0..6 {
            d[k] = unit.sample(&mut rng)
                * if k < 3 {
                    noise.arm_deg.to_radians()
                } else {
                    noise.arm_mm * 1e-3
                };
        }
        out.push(HandEyeView {
            gripper: g * refine::exp6(&d),
            corners,
        });
    }
    out
}

#[test]
fn eye_in_hand_recovers_the_camera_on_the_gripper() {
    let (x, y) = eye_in_hand_truth();
    for (px, mm, deg) in [(0.0, 1e-3, 1e-4), (0.2, 1.0, 0.1)] {
        let noise = Noise { px, ..EXACT };
        let v = views(Setup::EyeInHand, &x, &y, 15, noise, 11);
        let fit = calibrate_hand_eye(Setup::EyeInHand, &model(), &board(), &v).unwrap();
        let (et, er) = pose_error(&fit.camera, &x);
        assert!(et < mm && er < deg, "noise {px}: {et} mm, {er} deg");
        let (bt, br) = pose_error(&fit.board, &y);
        assert!(bt < 2.0 * mm && br < 2.0 * deg, "board {bt} mm {br} deg");
        assert_eq!(fit.view_rms_px.len(), 15);
        assert!(fit.warnings.is_empty(), "{:?}", fit.warnings);
    }
}

#[test]
fn eye_to_hand_recovers_the_fixed_camera() {
    // A camera 60 cm in front of the arm looking back at it; the board in the gripper.
    let x = Isometry3::translation(0.25, 0.0, 0.0);
    let y = Isometry3::from_parts(
        Translation3::new(-0.1, -0.06, 0.05),
        UnitQuaternion::identity(),
    );
    let v = views(Setup::EyeToHand, &x, &y, 12, EXACT, 3);
    let fit = calibrate_hand_eye(Setup::EyeToHand, &model(), &board(), &v).unwrap();
    let (et, er) = pose_error(&fit.camera, &x);
    assert!(et < 1e-3 && er < 1e-4, "{et} mm {er} deg");
}

/// Per seed (eight), the errors of the result and of the closed form against the truth
/// (mm, degrees), and the result's own standard deviations.
fn noisy_errors(setup: Setup, noise: Noise) -> Vec<[(f64, f64); 3]> {
    let (x, y) = match setup {
        Setup::EyeInHand => eye_in_hand_truth(),
        Setup::EyeToHand => (
            Isometry3::translation(0.25, 0.0, 0.0),
            Isometry3::translation(-0.1, -0.06, 0.05),
        ),
    };
    (0..8u64)
        .map(|seed| {
            let v = views(setup, &x, &y, 15, noise, 100 + seed);
            let fit = calibrate_hand_eye(setup, &model(), &board(), &v).unwrap();
            [
                pose_error(&fit.camera, &x),
                pose_error(&fit.closed_form, &x),
                (fit.camera_sigma_mm, fit.camera_sigma_deg),
            ]
        })
        .collect()
}

#[test]
fn arm_pose_noise_leaves_the_result_no_worse_than_the_closed_form() {
    // The refinement treated the arm's poses as exact: 0.1 degree of pose noise became
    // 2.6 mm and 0.43 degree, 5-14 times the closed form's error. It now weighs the arm's
    // error, and keeps the closed form when that predicts left-out views better. Cases: the
    // issue's 0.1 degree of pose noise, and a calibrated arm's 0.2 mm and 0.03 degree; 0.1 px
    // on the corners, 15 views, eight seeds each.
    let noisy = |arm_deg, arm_mm| Noise {
        px: 0.1,
        arm_deg,
        arm_mm,
        tilt: 0.4,
    };
    for (setup, noise) in [
        (Setup::EyeInHand, noisy(0.1, 0.0)),
        (Setup::EyeInHand, noisy(0.03, 0.2)),
        (Setup::EyeToHand, noisy(0.1, 0.0)),
    ] {
        let e = noisy_errors(setup, noise);
        let rms = |f: fn(&[(f64, f64); 3]) -> f64| {
            (e.iter().map(|v| f(v).powi(2)).sum::<f64>() / e.len() as f64).sqrt()
        };
        let (rt, rr) = (rms(|v| v[0].0), rms(|v| v[0].1));
        let (ct, cr) = (rms(|v| v[1].0), rms(|v| v[1].1));
        eprintln!(
            "{setup:?}, arm {} deg {} mm: result {rt:.3} mm {rr:.4} deg RMS over seeds, closed form {ct:.3} mm {cr:.4} deg",
            noise.arm_deg, noise.arm_mm
        );
        assert!(rt <= ct && rr <= cr, "{setup:?} {e:?}");
        for [(t, r), (c_t, c_r), (st, sr)] in &e {
            // Never the old 5-14x: per seed within the closed form's error or the result's
            // own two standard deviations, and the standard deviation an honest one.
            assert!(*t <= c_t.max(2.0 * st) && *r <= c_r.max(2.0 * sr), "{e:?}");
            assert!(*t <= 3.0 * st && *r <= 3.0 * sr, "{e:?}");
        }
    }
}

#[test]
fn weak_motions_about_a_second_axis_are_refused_or_warned_as_documented() {
    // docs/hardware.md, "Degenerate views": under 3 degrees RMS about a second axis
    // refused, under 6 warned. The gripper's x and y turns within +-0.05 rad (about 2.3
    // degrees RMS between views) and +-0.1 rad (4.7), z turns of +-0.8 rad; 0.1 degree
    // of pose noise.
    let (x, y) = eye_in_hand_truth();
    let narrow = |tilt| Noise {
        px: 0.1,
        arm_deg: 0.1,
        arm_mm: 0.0,
        tilt,
    };
    let v = views(Setup::EyeInHand, &x, &y, 15, narrow(0.05), 5);
    match calibrate_hand_eye(Setup::EyeInHand, &model(), &board(), &v) {
        Err(HandEyeError::Degenerate(why)) => {
            assert!(why.contains("at least 3"), "{why}")
        }
        other => panic!("motions about one axis accepted: {other:?}"),
    }
    let v = views(Setup::EyeInHand, &x, &y, 15, narrow(0.1), 5);
    let fit = calibrate_hand_eye(Setup::EyeInHand, &model(), &board(), &v).unwrap();
    assert!(
        (MIN_SECOND_AXIS_DEG..GOOD_SECOND_AXIS_DEG).contains(&fit.motion.second_axis_deg),
        "{:?}",
        fit.motion
    );
    assert!(
        fit.warnings.iter().any(|w| w.contains("second axis")),
        "{:?}",
        fit.warnings
    );
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
