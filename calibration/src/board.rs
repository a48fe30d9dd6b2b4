//! Calibration boards and finding them in images.
//!
//! A chessboard is named as OpenCV's `patternSize` counts it, by its inner corners:
//! `chessboard:9x6:0.025` has 9 corners along a row and 6 down a column (10 x 7 squares), 25 mm
//! squares. Corner `(i, j)` sits at `(i s, j s, 0)` in the board's frame: x along the rows, y
//! down the columns, z into the board (away from a camera that sees its printed side).
//!
//! Squares are numbered like the corners: square `(a, b)` spans `[a s, (a+1) s] x [b s, (b+1) s]`,
//! for `a` in `-1..cols` and `b` in `-1..rows`, and is black when `a + b` is even. On a board
//! with one odd and one even count (9x6, 7x10) the square before the first corner is black and
//! the one after the last corner is white, which fixes the board's frame in every view; on
//! other boards a half turn is ambiguous, harmless for intrinsics but not for hand-eye.
//!
//! Corners come from the ChESS detector and the topological grid finder of
//! `calib-targets-chessboard`; reflex keeps only views where the whole board was found and
//! orders them row by row in the frame above.

use calib_targets_chessboard::{
    ChessboardDetector, ChessboardParams, GrayImageView, default_chess_config, detect_corners,
};
use nalgebra::{Point3, Vector2};
use std::collections::HashMap;

/// A printed calibration board.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Board {
    /// Inner corners along a row.
    pub cols: u32,
    /// Inner corners down a column.
    pub rows: u32,
    /// Side of a square, m.
    pub square_m: f64,
}

/// Why a board name cannot be used.
#[derive(Debug, thiserror::Error)]
#[error(
    "board `{given}`: {message}; name it as `chessboard:COLSxROWS:SQUARE_M`, inner corners and the square's side in metres, e.g. `chessboard:9x6:0.025`"
)]
pub struct BoardError {
    /// What was given.
    pub given: String,
    /// What is wrong.
    pub message: String,
}

impl std::str::FromStr for Board {
    type Err = BoardError;

    fn from_str(s: &str) -> Result<Board, BoardError> {
        let bad = |message: &str| BoardError {
            given: s.to_string(),
            message: message.to_string(),
        };
        let mut parts = s.split(':');
        match parts.next() {
            Some("chessboard") => {}
            Some("charuco") => {
                return Err(bad(
                    "ChArUco boards are not supported yet (the detector reflex uses finds chessboards); print a chessboard",
                ));
            }
            _ => return Err(bad("unknown board kind")),
        }
        let size = parts.next().ok_or_else(|| bad("no size"))?;
        let (c, r) = size
            .split_once('x')
            .ok_or_else(|| bad("size is not COLSxROWS"))?;
        let cols: u32 = c.parse().map_err(|_| bad("columns are not a number"))?;
        let rows: u32 = r.parse().map_err(|_| bad("rows are not a number"))?;
        let square_m: f64 = parts
            .next()
            .ok_or_else(|| bad("no square size"))?
            .parse()
            .map_err(|_| bad("square size is not a number"))?;
        if parts.next().is_some() {
            return Err(bad("too many fields"));
        }
        if !(3..=40).contains(&cols) || !(3..=40).contains(&rows) {
            return Err(bad("between 3 and 40 inner corners each way"));
        }
        if !(square_m > 0.001 && square_m < 1.0) {
            return Err(bad("the square's side is in metres, between 0.001 and 1"));
        }
        Ok(Board {
            cols,
            rows,
            square_m,
        })
    }
}

impl std::fmt::Display for Board {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "chessboard:{}x{}:{}",
            self.cols, self.rows, self.square_m
        )
    }
}

impl Board {
    /// Number of inner corners.
    pub fn corners(&self) -> usize {
        (self.cols * self.rows) as usize
    }

    /// Corner positions in the board's frame, row by row.
    pub fn object_points(&self) -> Vec<Point3<f64>> {
        let mut out = Vec::with_capacity(self.corners());
        for j in 0..self.rows {
            for i in 0..self.cols {
                out.push(Point3::new(
                    i as f64 * self.square_m,
                    j as f64 * self.square_m,
                    0.0,
                ));
            }
        }
        out
    }

    /// Whether the board's frame is the same in every view (one odd and one even count).
    pub fn orientation_is_unique(&self) -> bool {
        (self.cols + self.rows) % 2 == 1
    }

    /// The colour of the board at `(x, y)` in its frame, m: `Some(true)` black, `Some(false)`
    /// white (the squares and a white margin of one square around them), `None` off the board.
    pub fn paint(&self, x: f64, y: f64) -> Option<bool> {
        let s = self.square_m;
        let (a, b) = ((x / s).floor() as i64, (y / s).floor() as i64);
        let (cols, rows) = (self.cols as i64, self.rows as i64);
        if a < -2 || b < -2 || a > cols || b > rows {
            return None;
        }
        if a < -1 || b < -1 || a > cols - 1 || b > rows - 1 {
            return Some(false);
        }
        Some((a + b).rem_euclid(2) == 0)
    }
}

/// The board's corners found in one image, in [`Board::object_points`]' order, px.
pub type Corners = Vec<Vector2<f64>>;

/// Why a view was not used.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum DetectError {
    /// No board at all.
    #[error("no chessboard found")]
    NotFound,
    /// Part of the board.
    #[error("only {found} of the board's {expected} corners found (keep the whole board in view)")]
    Partial {
        /// Corners found.
        found: usize,
        /// Corners on the board.
        expected: usize,
    },
    /// A grid of another size.
    #[error("a {cols}x{rows} grid found where the board has {expected_cols}x{expected_rows}")]
    WrongSize {
        /// Found along the detector's first axis.
        cols: u32,
        /// Found along the second.
        rows: u32,
        /// The board's.
        expected_cols: u32,
        /// The board's.
        expected_rows: u32,
    },
}

/// Converts an RGB8 image to 8-bit grey (ITU-R BT.601 luma).
pub fn gray_from_rgb(rgb: &[u8]) -> Vec<u8> {
    rgb.chunks_exact(3)
        .map(|p| ((p[0] as u32 * 299 + p[1] as u32 * 587 + p[2] as u32 * 114 + 500) / 1000) as u8)
        .collect()
}

/// Finds the whole board in a grey image and returns its corners in the board's order.
pub fn detect(
    board: &Board,
    gray: &[u8],
    width: usize,
    height: usize,
) -> Result<Corners, DetectError> {
    let view = GrayImageView {
        width,
        height,
        data: gray,
    };
    let chess = detect_corners(&view, &default_chess_config());
    let detector = ChessboardDetector::new(ChessboardParams::default())
        .expect("the detector's default parameters are valid");
    let found = detector.detect(&chess).ok_or(DetectError::NotFound)?;
    let expected = board.corners();
    if found.corners.len() < expected {
        return Err(DetectError::Partial {
            found: found.corners.len(),
            expected,
        });
    }
    let mut at: HashMap<(i32, i32), Vector2<f64>> = HashMap::new();
    let (mut max_u, mut max_v) = (0, 0);
    for c in &found.corners {
        at.insert(
            (c.grid.u, c.grid.v),
            Vector2::new(c.position.x as f64, c.position.y as f64),
        );
        max_u = max_u.max(c.grid.u);
        max_v = max_v.max(c.grid.v);
    }
    let (du, dv) = (max_u as u32 + 1, max_v as u32 + 1);
    if at.len() != expected
        || (du, dv) != (board.cols, board.rows) && (du, dv) != (board.rows, board.cols)
    {
        return Err(DetectError::WrongSize {
            cols: du,
            rows: dv,
            expected_cols: board.cols,
            expected_rows: board.rows,
        });
    }
    // The eight ways the board's (i, j) can map onto the detector's (u, v); keep those that fit
    // the grid's extent and see the board's printed side (x, y, z right-handed with z away from
    // the camera: the image turns clockwise from x to y).
    let (c, r) = (board.cols as i32, board.rows as i32);
    let mut best: Option<(f64, Corners)> = None;
    for t in 0..8 {
        let map = |i: i32, j: i32| -> (i32, i32) {
            let (a, b) = if t & 4 != 0 { (j, i) } else { (i, j) };
            let (w, h) = if t & 4 != 0 { (r, c) } else { (c, r) };
            let a = if t & 1 != 0 { w - 1 - a } else { a };
            let b = if t & 2 != 0 { h - 1 - b } else { b };
            (a, b)
        };
        let ordered: Option<Corners> = (0..r)
            .flat_map(|j| (0..c).map(move |i| (i, j)))
            .map(|(i, j)| at.get(&map(i, j)).copied())
            .collect();
        let Some(ordered) = ordered else { continue };
        let idx = |i: i32, j: i32| (j * c + i) as usize;
        let dx = ordered[idx(1, 0)] - ordered[idx(0, 0)];
        let dy = ordered[idx(0, 1)] - ordered[idx(0, 0)];
        if dx.x * dy.y - dx.y * dy.x <= 0.0 {
            continue;
        }
        // Of the two half-turns left, the one whose square before the first corner is dark and
        // whose square after the last corner is light.
        let sample = |i: f64, j: f64| -> f64 {
            // Bilinear position from the nearest cell's corners, then a 3x3 mean.
            let (i0, j0) = (
                i.floor().clamp(0.0, c as f64 - 2.0),
                j.floor().clamp(0.0, r as f64 - 2.0),
            );
            let (a, b) = (i - i0, j - j0);
            let (i0, j0) = (i0 as i32, j0 as i32);
            let p = ordered[idx(i0, j0)] * (1.0 - a) * (1.0 - b)
                + ordered[idx(i0 + 1, j0)] * a * (1.0 - b)
                + ordered[idx(i0, j0 + 1)] * (1.0 - a) * b
                + ordered[idx(i0 + 1, j0 + 1)] * a * b;
            let mut sum = 0.0;
            let mut n = 0.0;
            for dv in -1..=1 {
                for du in -1..=1 {
                    let (u, v) = (p.x.round() as i64 + du, p.y.round() as i64 + dv);
                    if u >= 0 && v >= 0 && (u as usize) < width && (v as usize) < height {
                        sum += gray[v as usize * width + u as usize] as f64;
                        n += 1.0;
                    }
                }
            }
            if n > 0.0 { sum / n } else { 128.0 }
        };
        let score = sample(-0.5, -0.5) - sample(c as f64 - 0.5, r as f64 - 0.5);
        if best.as_ref().is_none_or(|(s, _)| score < *s) {
            best = Some((score, ordered));
        }
    }
    let (_, mut ordered) = best.ok_or(DetectError::NotFound)?;
    // Half the smallest spacing between neighbouring corners bounds the refinement's window, so
    // that it never reaches the next corner.
    let spacing = (0..ordered.len())
        .filter(|k| (k + 1) % board.cols as usize != 0)
        .map(|k| (ordered[k + 1] - ordered[k]).norm())
        .fold(f64::INFINITY, f64::min);
    let half = ((spacing * 0.4).floor() as i64).clamp(2, 7);
    for c in ordered.iter_mut() {
        *c = refine_corner(gray, width, height, *c, half);
    }
    Ok(ordered)
}

/// Sub-pixel refinement of one saddle corner: the point `q` where every image gradient in the
/// window is orthogonal to the vector from `q` to its pixel, solved by least squares and iterated
/// (the principle of OpenCV's `cornerSubPix`, Forstner and Gulch 1987), with Gaussian weights.
pub fn refine_corner(
    gray: &[u8],
    width: usize,
    height: usize,
    start: Vector2<f64>,
    half: i64,
) -> Vector2<f64> {
    let at = |u: i64, v: i64| gray[v as usize * width + u as usize] as f64;
    let sigma2 = (half as f64 * 0.6).powi(2);
    let mut q = start;
    for _ in 0..40 {
        let (cu, cv) = (q.x.round() as i64, q.y.round() as i64);
        if cu - half < 1
            || cv - half < 1
            || cu + half + 1 >= width as i64
            || cv + half + 1 >= height as i64
        {
            return q;
        }
        let mut a = nalgebra::Matrix2::zeros();
        let mut b = Vector2::zeros();
        for v in cv - half..=cv + half {
            for u in cu - half..=cu + half {
                let g = Vector2::new(
                    (at(u + 1, v) - at(u - 1, v)) / 2.0,
                    (at(u, v + 1) - at(u, v - 1)) / 2.0,
                );
                let p = Vector2::new(u as f64, v as f64);
                let w = (-(p - q).norm_squared() / (2.0 * sigma2)).exp();
                let gg = g * g.transpose() * w;
                a += gg;
                b += gg * p;
            }
        }
        let Some(inv) = a.try_inverse() else { return q };
        let next = inv * b;
        if (next - start).norm() > half as f64 {
            // Ran off the corner: keep the detector's position.
            return start;
        }
        let moved = (next - q).norm();
        q = next;
        if moved < 1e-3 {
            break;
        }
    }
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn board_names_parse_and_bad_ones_say_how_to_write_them() {
        let b: Board = "chessboard:9x6:0.025".parse().unwrap();
        assert_eq!((b.cols, b.rows, b.square_m), (9, 6, 0.025));
        assert_eq!(b.to_string().parse::<Board>().unwrap(), b);
        assert!(b.orientation_is_unique());
        for bad in [
            "chessboard:9x6",
            "chessboard:9:0.025",
            "checker:9x6:0.025",
            "chessboard:9x6:25",
            "chessboard:2x6:0.02",
        ] {
            let e = bad.parse::<Board>().unwrap_err().to_string();
            assert!(e.contains(bad) && e.contains("chessboard:9x6:0.025"), "{e}");
        }
        assert!(
            "charuco:5x7:0.03"
                .parse::<Board>()
                .unwrap_err()
                .to_string()
                .contains("ChArUco")
        );
    }

    #[test]
    fn the_paint_has_a_dark_first_square_and_a_light_last_one() {
        let b: Board = "chessboard:9x6:0.025".parse().unwrap();
        assert_eq!(b.paint(-0.01, -0.01), Some(true));
        assert_eq!(b.paint(8.5 * 0.025, 5.5 * 0.025), Some(false));
        assert_eq!(b.paint(0.01, 0.01), Some(true));
        assert_eq!(b.paint(0.035, 0.01), Some(false));
        assert_eq!(b.paint(-0.04, 0.0), Some(false), "margin");
        assert_eq!(b.paint(-0.06, 0.0), None);
    }
}
