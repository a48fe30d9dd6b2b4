//! Every detected ChArUco corner checked against the board's geometry before it is used.
//!
//! The marker decoder names corners, and a name can be wrong: an independent check with OpenCV
//! 4.14 on boards OpenCV drew found a sharp, whole view where one corner sat 7.9 px from where
//! its id belongs (the view's RMS, 0.975 px, slipped under the 1 px view rule and moved fx by
//! 0.18 %), and a wrong dictionary gave corners 20-33 px from any real one. A corner is only
//! trusted when its neighbours on the board agree on where it is: the homography of the corners
//! around it (within two squares on the board, three when too few are there), fitted without
//! it, must put it within [`CHECK_FLOOR_PX`] (or four times the view's median of the same
//! prediction error, when the view is noisier than that). Locally a lens's distortion is close
//! to a homography, so a distorted view passes; a corner that is where no neighbour puts it is
//! taken out with the distance, the worst first, until every corner left agrees.
//!
//! Then its id: the two markers the board prints beside a corner are looked for in the image
//! where the corners around it put them ([`check_markers`]): the code the board's dictionary
//! gives each of them (and the markers one square further out), bit by bit, must correlate with
//! the image at least [`MARKER_MATCH_MIN`].
//! A corner set the decoder aligned wrongly, or read with the wrong dictionary, is consistent
//! with its neighbours (they are all shifted alike) but not with the markers: with OpenCV's
//! `DICT_5X5_100` board read as `DICT_4X4_100`, sets of 8 corners came through the first check
//! with every id wrong.

use crate::board::{Board, Corners};
use crate::intrinsics::homography;
use nalgebra::{Point3, Vector2, Vector3};
use serde::Serialize;

/// The prediction error every genuine corner of a sharp view stays under, px: on views OpenCV
/// rendered through a lens with k1 = -0.21, the neighbours put real corners within 0.4 px
/// (tests/system/calibration.rs measures it); a label from the wrong square is off by a square.
pub const CHECK_FLOOR_PX: f64 = 1.5;

/// The correlation, over the code bits of the markers around a corner, between the board's
/// paint and the image under which the corner's id is not trusted. Measured on 20 views OpenCV
/// drew of a `DICT_5X5_100` 12x9 board: the right markers correlate 0.97-0.99 sharp, 0.81-0.97
/// blurred by a 1 px Gaussian, 0.63-0.89 by 1.8 px; read as `DICT_4X4_100`, -0.15 to 0.14.
pub const MARKER_MATCH_MIN: f64 = 0.4;

/// Neighbours a corner needs around it, on two rows and two columns at least, to be checked.
const MIN_NEIGHBOURS: usize = 5;

/// A corner the detector reported that a check took out, and why.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RejectedCorner {
    /// The corner's id (`j cols + i`).
    pub id: u32,
    /// Where the detector put it, `[u, v]` px.
    pub pixel: [f64; 2],
    /// Why it was taken out.
    pub reason: String,
}

/// The corners of `found` whose neighbours agree with them, and those taken out.
pub fn check_against_neighbours(board: &Board, found: &Corners) -> (Corners, Vec<RejectedCorner>) {
    let cols = board.cols as i32;
    let grid = |id: u32| (id as i32 % cols, id as i32 / cols);
    let all: Vec<(u32, Vector2<f64>)> = found.iter().collect();
    let mut kept = vec![true; all.len()];
    let mut rejected = Vec::new();
    // Prediction error of each kept corner (None: too few neighbours to say).
    let predict = |k: usize, kept: &[bool]| -> Option<f64> {
        let (ci, ri) = grid(all[k].0);
        for radius in [2, 3] {
            let near: Vec<usize> = (0..all.len())
                .filter(|&j| j != k && kept[j])
                .filter(|&j| {
                    let (c, r) = grid(all[j].0);
                    (c - ci).abs() <= radius && (r - ri).abs() <= radius
                })
                .collect();
            let distinct = |f: fn((i32, i32)) -> i32| {
                let mut v: Vec<i32> = near.iter().map(|&j| f(grid(all[j].0))).collect();
                v.sort_unstable();
                v.dedup();
                v.len()
            };
            if near.len() < MIN_NEIGHBOURS || distinct(|g| g.0) < 2 || distinct(|g| g.1) < 2 {
                continue;
            }
            let object: Vec<Point3<f64>> =
                near.iter().map(|&j| board.object_point(all[j].0)).collect();
            let seen: Vec<Vector2<f64>> = near.iter().map(|&j| all[j].1).collect();
            let h = homography(&object, &seen)?;
            let o = board.object_point(all[k].0);
            let p = h * Vector3::new(o.x, o.y, 1.0);
            if p.z.abs() < 1e-12 {
                return None;
            }
            return Some((Vector2::new(p.x / p.z, p.y / p.z) - all[k].1).norm());
        }
        None
    };
    let mut errors: Vec<Option<f64>> = (0..all.len()).map(|k| predict(k, &kept)).collect();
    loop {
        let mut measured: Vec<f64> = (0..all.len())
            .filter(|&k| kept[k])
            .filter_map(|k| errors[k])
            .collect();
        if measured.is_empty() {
            break;
        }
        measured.sort_by(f64::total_cmp);
        let limit = CHECK_FLOOR_PX.max(4.0 * measured[measured.len() / 2]);
        let worst = (0..all.len())
            .filter(|&k| kept[k])
            .filter_map(|k| errors[k].map(|e| (k, e)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .expect("measured is not empty");
        if worst.1 <= limit {
            break;
        }
        let k = worst.0;
        kept[k] = false;
        rejected.push(RejectedCorner {
            id: all[k].0,
            pixel: [all[k].1.x, all[k].1.y],
            reason: format!(
                "{:.1} px from where its neighbours on the board put it (limit {limit:.1} px): a corner given another corner's id, or no corner at all",
                worst.1
            ),
        });
        // Only corners whose neighbourhood held it can change.
        let (ck, rk) = grid(all[k].0);
        for j in 0..all.len() {
            let (c, r) = grid(all[j].0);
            if kept[j] && (c - ck).abs() <= 3 && (r - rk).abs() <= 3 {
                errors[j] = predict(j, &kept);
            }
        }
    }
    // What could not be checked is not used: a corner with no neighbours around it on the board
    // is the detector's guess more often than a corner (the wrong dictionary's were).
    for k in 0..all.len() {
        if kept[k] && errors[k].is_none() {
            kept[k] = false;
            rejected.push(RejectedCorner {
                id: all[k].0,
                pixel: [all[k].1.x, all[k].1.y],
                reason: format!(
                    "fewer than {MIN_NEIGHBOURS} corners around it on the board (two rows and two columns) to check it against"
                ),
            });
        }
    }
    let (ids, pixels) = (0..all.len()).filter(|&k| kept[k]).map(|k| all[k]).unzip();
    rejected.sort_by_key(|r| r.id);
    (Corners::new(ids, pixels), rejected)
}

/// The corners of `found` whose two markers the image shows where the board puts them, and
/// those taken out (each marker's code bits sampled through the homography of the corners
/// within two squares of the corner, itself included, 3x3 samples a bit).
pub fn check_markers(
    board: &Board,
    gray: &[u8],
    width: usize,
    height: usize,
    found: &Corners,
) -> (Corners, Vec<RejectedCorner>) {
    let (Some(bits), Some(marker_m)) = (board.marker_bits(), board.marker_m()) else {
        return (found.clone(), Vec::new());
    };
    let cols = board.cols as i32;
    let s = board.square_m;
    let grid = |id: u32| (id as i32 % cols, id as i32 / cols);
    let sample = |u: f64, v: f64| -> Option<f64> {
        if u < 0.0 || v < 0.0 || u > (width - 1) as f64 || v > (height - 1) as f64 {
            return None;
        }
        let (x0, y0) = (u.floor() as usize, v.floor() as usize);
        let (x1, y1) = ((x0 + 1).min(width - 1), (y0 + 1).min(height - 1));
        let (a, b) = (u - x0 as f64, v - y0 as f64);
        let at = |x: usize, y: usize| gray[y * width + x] as f64;
        Some(
            at(x0, y0) * (1.0 - a) * (1.0 - b)
                + at(x1, y0) * a * (1.0 - b)
                + at(x0, y1) * (1.0 - a) * b
                + at(x1, y1) * a * b,
        )
    };
    let mut kept = (Vec::new(), Vec::new());
    let mut rejected = Vec::new();
    for (id, px) in found.iter() {
        let (ci, ri) = grid(id);
        let near: Vec<(u32, Vector2<f64>)> = found
            .iter()
            .filter(|(j, _)| {
                let (c, r) = grid(*j);
                (c - ci).abs() <= 2 && (r - ri).abs() <= 2
            })
            .collect();
        let object: Vec<Point3<f64>> = near.iter().map(|(j, _)| board.object_point(*j)).collect();
        let seen: Vec<Vector2<f64>> = near.iter().map(|(_, p)| *p).collect();
        // Predicted paint (1 black) and the image's darkness at each code bit.
        let mut pairs: Vec<(f64, f64)> = Vec::new();
        if let Some(h) = homography(&object, &seen) {
            // Corner (c, r) sits where squares (c..=c+1, r..=r+1) meet. The markers of the
            // squares one further out are read too: eight markers' bits instead of two make a
            // wrong alignment's chance correlation small (a standard deviation near 0.07).
            let squares = (ci - 1..=ci + 2).flat_map(|a| (ri - 1..=ri + 2).map(move |b| (a, b)));
            for (a, b) in squares {
                if (a + b) % 2 == 0 || a < 0 || b < 0 || a > cols || b > board.rows as i32 {
                    continue;
                }
                let inset = (s - marker_m) / 2.0;
                let cell = marker_m / (bits + 2) as f64;
                for by in 1..=bits {
                    for bx in 1..=bits {
                        let x = a as f64 * s + inset + (bx as f64 + 0.5) * cell;
                        let y = b as f64 * s + inset + (by as f64 + 0.5) * cell;
                        let Some(black) = board.paint(x, y) else {
                            continue;
                        };
                        let mut sum = 0.0;
                        let mut n = 0.0;
                        for dy in [-0.25, 0.0, 0.25] {
                            for dx in [-0.25, 0.0, 0.25] {
                                let p = h * Vector3::new(x + dx * cell, y + dy * cell, 1.0);
                                if let Some(g) = sample(p.x / p.z, p.y / p.z) {
                                    sum += g;
                                    n += 1.0;
                                }
                            }
                        }
                        if n == 9.0 {
                            pairs.push((if black { 1.0 } else { 0.0 }, -sum / n));
                        }
                    }
                }
            }
        }
        let score = correlation(&pairs);
        match score {
            Some(c) if c >= MARKER_MATCH_MIN => {
                kept.0.push(id);
                kept.1.push(px);
            }
            _ => rejected.push(RejectedCorner {
                id,
                pixel: [px.x, px.y],
                reason: match score {
                    Some(c) => format!(
                        "the image does not show its markers' codes where the board puts them (correlation {c:.2}, at least {MARKER_MATCH_MIN} needed): a wrong id, or the wrong dictionary in the board's name"
                    ),
                    None => "its markers are not in the image to confirm its id".to_string(),
                },
            }),
        }
    }
    (Corners::new(kept.0, kept.1), rejected)
}

/// Pearson correlation of pairs, `None` under 8 pairs or with no spread.
fn correlation(pairs: &[(f64, f64)]) -> Option<f64> {
    if pairs.len() < 8 {
        return None;
    }
    let n = pairs.len() as f64;
    let (ma, mb) = (
        pairs.iter().map(|p| p.0).sum::<f64>() / n,
        pairs.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let (mut sab, mut saa, mut sbb) = (0.0, 0.0, 0.0);
    for (a, b) in pairs {
        sab += (a - ma) * (b - mb);
        saa += (a - ma) * (a - ma);
        sbb += (b - mb) * (b - mb);
    }
    (saa > 0.0 && sbb > 1e-9).then(|| sab / (saa * sbb).sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::camera::CameraModel;
    use crate::intrinsics::visible_corners;
    use nalgebra::{Isometry3, Translation3, UnitQuaternion};
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;
    use rand_distr::{Distribution, Normal};

    fn lens() -> CameraModel {
        CameraModel {
            dist: [-0.21, 0.09, 0.0008, -0.0005, -0.02],
            ..CameraModel::pinhole(640, 480, 610.0, 608.0, 322.5, 236.8)
        }
    }

    /// A 12x9 board (88 corners) filling a strongly distorted view, tilted, with 0.1 px noise.
    fn view(seed: u64) -> (Board, Corners) {
        let b: Board = "charuco:12x9:0.02:0.015:DICT_5X5_100".parse().unwrap();
        let pose = Isometry3::from_parts(
            Translation3::new(-0.11, -0.085, 0.33),
            UnitQuaternion::from_scaled_axis(Vector3::new(0.35, -0.3, 0.1)),
        );
        let mut c = visible_corners(&lens(), &b, &pose, 5.0);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let n = Normal::new(0.0, 0.1).unwrap();
        for p in c.pixels_mut() {
            *p += Vector2::new(n.sample(&mut rng), n.sample(&mut rng));
        }
        (b, c)
    }

    #[test]
    fn a_distorted_noisy_view_keeps_every_corner() {
        let (b, c) = view(1);
        assert!(c.len() > 60, "{} corners in view", c.len());
        let (kept, rejected) = check_against_neighbours(&b, &c);
        assert!(rejected.is_empty(), "{rejected:?}");
        assert_eq!(kept, c);
    }

    #[test]
    fn a_corner_8_px_from_its_place_is_rejected_with_the_distance() {
        // The case: one corner labelled 7.9 px from where it is, in a sharp whole view.
        let (b, mut c) = view(2);
        let k = c.ids().iter().position(|&id| id == 40).unwrap();
        c.pixels_mut()[k] += Vector2::new(6.0, -5.1);
        let (kept, rejected) = check_against_neighbours(&b, &c);
        assert_eq!(rejected.len(), 1, "{rejected:?}");
        assert_eq!(rejected[0].id, 40);
        assert!(rejected[0].reason.contains("px from where"), "{rejected:?}");
        assert_eq!(kept.len(), c.len() - 1);
        assert!(kept.get(40).is_none());
    }

    #[test]
    fn two_corners_with_swapped_ids_are_both_rejected() {
        let (b, mut c) = view(3);
        let (a, d) = (
            c.ids().iter().position(|&id| id == 25).unwrap(),
            c.ids().iter().position(|&id| id == 26).unwrap(),
        );
        c.pixels_mut().swap(a, d);
        let (_, rejected) = check_against_neighbours(&b, &c);
        let ids: Vec<u32> = rejected.iter().map(|r| r.id).collect();
        assert_eq!(ids, [25, 26], "{rejected:?}");
    }

    #[test]
    fn a_lone_cluster_of_corners_cannot_be_checked_and_is_not_used() {
        let (b, c) = view(4);
        let few: Vec<(u32, Vector2<f64>)> =
            c.iter().filter(|(id, _)| [0, 1, 11].contains(id)).collect();
        let (ids, px) = few.into_iter().unzip();
        let (kept, rejected) = check_against_neighbours(&b, &Corners::new(ids, px));
        assert!(kept.is_empty());
        assert_eq!(rejected.len(), 3);
        assert!(rejected[0].reason.contains("fewer than"), "{rejected:?}");
    }
}
