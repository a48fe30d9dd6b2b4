//! Calibration boards and finding them in images.
//!
//! Two kinds of board:
//! - A **chessboard** is named as OpenCV's `patternSize` counts it, by its inner corners:
//!   `chessboard:9x6:0.025` has 9 corners along a row and 6 down a column (10 x 7 squares),
//!   25 mm squares. Corner `(i, j)` sits at `(i s, j s, 0)` in the board's frame: x along the
//!   rows, y down the columns, z into the board (away from a camera that sees its printed side).
//!   Only views where the whole board is found are used.
//! - A **ChArUco board** is named as OpenCV's `cv::aruco::CharucoBoard` is made, by its
//!   squares: `charuco:7x5:0.04:0.028:DICT_4X4_50` has 7 squares along a row and 5 down a
//!   column (6 x 4 inner corners), 40 mm squares and 28 mm ArUco markers from OpenCV's
//!   `DICT_4X4_50` (the default when the dictionary is left out). It is OpenCV's layout since
//!   4.6 (not the legacy one): the top-left square is black, the white squares hold markers 0,
//!   1, ... row by row, and inner corner `(c, r)` has id `r (squares_x - 1) + c` and sits at
//!   `((c + 1) s, (r + 1) s, 0)`, the origin at the board's outer top-left corner. The markers
//!   name every corner, so a view of part of the board is used too, and the board's frame is
//!   the same in every view.
//!
//! Chessboard squares are numbered like the corners: square `(a, b)` spans
//! `[a s, (a+1) s] x [b s, (b+1) s]`, for `a` in `-1..cols` and `b` in `-1..rows`, and is black
//! when `a + b` is even. On a board with one odd and one even count (9x6, 7x10) the square
//! before the first corner is black and the one after the last corner is white, which fixes the
//! board's frame in every view; on other boards a half turn is ambiguous, harmless for
//! intrinsics but not for hand-eye.
//!
//! Chessboard corners come from the ChESS detector and the topological grid finder of
//! `calib-targets-chessboard`, refined to sub-pixel by [`refine_corner`]; ChArUco corners and
//! markers from `calib-targets-charuco`, with its own sub-pixel positions.

use crate::corner_check::{RejectedCorner, check_against_neighbours, check_markers};
use calib_targets_charuco::{CharucoBoardSpec, CharucoDetector, CharucoParams, Dictionary};
use calib_targets_chessboard::{
    ChessboardDetector, ChessboardParams, GrayImageView, default_chess_config, detect_corners,
};
use nalgebra::{Point3, Vector2};
use std::collections::HashMap;

/// The ArUco dictionary of a ChArUco board when its name leaves it out (OpenCV's tutorials').
pub const DEFAULT_DICTIONARY: &str = "DICT_4X4_50";

/// The fewest ChArUco corners a view must show to be used (its pose has six unknowns; a few
/// more corners than the homography's four keep a badly placed view out).
pub const MIN_CHARUCO_CORNERS: usize = 8;

/// What is printed on a board besides its squares.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BoardKind {
    /// Black and white squares only.
    Chessboard,
    /// ArUco markers in the white squares (OpenCV's ChArUco layout).
    Charuco {
        /// Side of a marker, black border included, m.
        marker_m: f64,
        /// The markers' dictionary, by OpenCV's name (`DICT_4X4_50`, `DICT_5X5_100`, ...).
        dictionary: &'static str,
    },
}

/// A printed calibration board.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Board {
    /// Chessboard or ChArUco.
    pub kind: BoardKind,
    /// Inner corners along a row (a ChArUco board's squares along a row, less one).
    pub cols: u32,
    /// Inner corners down a column.
    pub rows: u32,
    /// Side of a square, m.
    pub square_m: f64,
}

/// Why a board name cannot be used.
#[derive(Debug, thiserror::Error)]
#[error(
    "board `{given}`: {message}; name it as `chessboard:COLSxROWS:SQUARE_M` (inner corners, the square's side in metres, e.g. `chessboard:9x6:0.025`) or `charuco:SQUARES_XxSQUARES_Y:SQUARE_M:MARKER_M[:DICTIONARY]` (squares, as OpenCV's CharucoBoard, e.g. `charuco:7x5:0.04:0.028:DICT_4X4_50`)"
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
        let fields: Vec<&str> = s.split(':').collect();
        let charuco = match fields[0] {
            "chessboard" => false,
            "charuco" => true,
            _ => return Err(bad("unknown board kind")),
        };
        let size = fields.get(1).ok_or_else(|| bad("no size"))?;
        let (c, r) = size
            .split_once('x')
            .ok_or_else(|| bad("size is not COLSxROWS"))?;
        let cols: u32 = c.parse().map_err(|_| bad("columns are not a number"))?;
        let rows: u32 = r.parse().map_err(|_| bad("rows are not a number"))?;
        let metres = |k: usize, what: &str| -> Result<f64, BoardError> {
            let v: f64 = fields
                .get(k)
                .ok_or_else(|| bad(&format!("no {what}")))?
                .parse()
                .map_err(|_| bad(&format!("the {what} is not a number")))?;
            if v > 0.001 && v < 1.0 {
                Ok(v)
            } else {
                Err(bad(&format!(
                    "the {what} is in metres, between 0.001 and 1"
                )))
            }
        };
        let square_m = metres(2, "square size")?;
        if !charuco {
            if fields.len() > 3 {
                return Err(bad("too many fields"));
            }
            if !(3..=40).contains(&cols) || !(3..=40).contains(&rows) {
                return Err(bad("between 3 and 40 inner corners each way"));
            }
            return Ok(Board {
                kind: BoardKind::Chessboard,
                cols,
                rows,
                square_m,
            });
        }
        if fields.len() > 5 {
            return Err(bad("too many fields"));
        }
        if !(3..=41).contains(&cols) || !(3..=41).contains(&rows) {
            return Err(bad("between 3 and 41 squares each way"));
        }
        let marker_m = metres(3, "marker size")?;
        if marker_m >= square_m {
            return Err(bad("the marker must be smaller than the square"));
        }
        let name = fields.get(4).copied().unwrap_or(DEFAULT_DICTIONARY);
        let dict = calib_targets_charuco::resolve_dictionary(name).ok_or_else(|| {
            bad(&format!(
                "unknown dictionary `{name}` (OpenCV's names: DICT_4X4_50, DICT_5X5_100, DICT_6X6_250, ...)"
            ))
        })?;
        let board = Board {
            kind: BoardKind::Charuco {
                marker_m,
                dictionary: dict.name(),
            },
            cols: cols - 1,
            rows: rows - 1,
            square_m,
        };
        let markers = board.marker_count();
        if markers > dict.codes().len() {
            return Err(bad(&format!(
                "{markers} markers, and {} holds only {}",
                dict.name(),
                dict.codes().len()
            )));
        }
        Ok(board)
    }
}

impl std::fmt::Display for Board {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            BoardKind::Chessboard => write!(
                f,
                "chessboard:{}x{}:{}",
                self.cols, self.rows, self.square_m
            ),
            BoardKind::Charuco {
                marker_m,
                dictionary,
            } => write!(
                f,
                "charuco:{}x{}:{}:{}:{}",
                self.cols + 1,
                self.rows + 1,
                self.square_m,
                marker_m,
                dictionary
            ),
        }
    }
}

/// The corners of a board found in one image (or projected): each corner's id (its index in
/// [`Board::object_points`]: `j cols + i` for inner corner `(i, j)`) and its pixel, increasing
/// ids. A chessboard's views hold every corner; a ChArUco view may hold a part.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Corners {
    ids: Vec<u32>,
    pixels: Vec<Vector2<f64>>,
}

impl Corners {
    /// Corners with their ids (sorted here by id).
    ///
    /// # Panics
    /// When `ids` and `pixels` differ in length or an id repeats.
    pub fn new(ids: Vec<u32>, pixels: Vec<Vector2<f64>>) -> Corners {
        assert_eq!(ids.len(), pixels.len(), "one pixel per corner id");
        let mut pairs: Vec<(u32, Vector2<f64>)> = ids.into_iter().zip(pixels).collect();
        pairs.sort_by_key(|p| p.0);
        assert!(
            pairs.windows(2).all(|w| w[0].0 < w[1].0),
            "corner ids repeat"
        );
        let (ids, pixels) = pairs.into_iter().unzip();
        Corners { ids, pixels }
    }

    /// Every corner of a board, in id order.
    pub fn whole(pixels: Vec<Vector2<f64>>) -> Corners {
        Corners {
            ids: (0..pixels.len() as u32).collect(),
            pixels,
        }
    }

    /// The corners' ids, increasing.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// The corners' pixels, in the order of [`Corners::ids`].
    pub fn pixels(&self) -> &[Vector2<f64>] {
        &self.pixels
    }

    /// The corners' pixels, to move them (noise in tests, a refinement).
    pub fn pixels_mut(&mut self) -> &mut [Vector2<f64>] {
        &mut self.pixels
    }

    /// Number of corners.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// No corner.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The pixel of corner `id`, when it is there.
    pub fn get(&self, id: u32) -> Option<Vector2<f64>> {
        self.ids.binary_search(&id).ok().map(|k| self.pixels[k])
    }

    /// `(id, pixel)` pairs.
    pub fn iter(&self) -> impl Iterator<Item = (u32, Vector2<f64>)> + '_ {
        self.ids.iter().copied().zip(self.pixels.iter().copied())
    }
}

impl Board {
    /// Number of inner corners.
    pub fn corners(&self) -> usize {
        (self.cols * self.rows) as usize
    }

    /// Whether this is a ChArUco board.
    pub fn is_charuco(&self) -> bool {
        matches!(self.kind, BoardKind::Charuco { .. })
    }

    /// Where inner corner `(0, 0)` sits, in squares from the board's origin: 0 on a chessboard
    /// (the origin is that corner), 1 on a ChArUco board (the origin is the outer corner).
    fn first_corner(&self) -> f64 {
        if self.is_charuco() { 1.0 } else { 0.0 }
    }

    /// Corner `id` in the board's frame.
    ///
    /// # Panics
    /// When `id` is not a corner of the board.
    pub fn object_point(&self, id: u32) -> Point3<f64> {
        assert!((id as usize) < self.corners(), "corner {id} of {self}");
        let off = self.first_corner();
        let (i, j) = ((id % self.cols) as f64, (id / self.cols) as f64);
        Point3::new((i + off) * self.square_m, (j + off) * self.square_m, 0.0)
    }

    /// Every corner in the board's frame, in id order (row by row).
    pub fn object_points(&self) -> Vec<Point3<f64>> {
        (0..self.corners() as u32)
            .map(|id| self.object_point(id))
            .collect()
    }

    /// The corners of `seen` in the board's frame, in its order.
    pub fn object_points_of(&self, seen: &Corners) -> Vec<Point3<f64>> {
        seen.ids().iter().map(|&id| self.object_point(id)).collect()
    }

    /// Whether the board's frame is the same in every view: a chessboard with one odd and one
    /// even count, or any ChArUco board (its markers name the corners).
    pub fn orientation_is_unique(&self) -> bool {
        self.is_charuco() || (self.cols + self.rows) % 2 == 1
    }

    /// The board's printed extent in its frame, m: `(x0, y0, x1, y1)` of the squares.
    pub fn squares_extent(&self) -> (f64, f64, f64, f64) {
        let s = self.square_m;
        let off = self.first_corner();
        (
            (off - 1.0) * s,
            (off - 1.0) * s,
            (self.cols as f64 + off) * s,
            (self.rows as f64 + off) * s,
        )
    }

    /// Bits along a side of a marker's code, border excluded (`None` on a chessboard): 4 for
    /// `DICT_4X4_50`.
    pub fn marker_bits(&self) -> Option<usize> {
        match self.kind {
            BoardKind::Chessboard => None,
            BoardKind::Charuco { dictionary, .. } => {
                Some(dictionary_named(dictionary).marker_size())
            }
        }
    }

    /// Side of a marker, black border included, m (`None` on a chessboard).
    pub fn marker_m(&self) -> Option<f64> {
        match self.kind {
            BoardKind::Chessboard => None,
            BoardKind::Charuco { marker_m, .. } => Some(marker_m),
        }
    }

    /// Number of ArUco markers (0 on a chessboard): one per white square.
    pub fn marker_count(&self) -> usize {
        if self.is_charuco() {
            let (sx, sy) = (self.cols as usize + 1, self.rows as usize + 1);
            sx * sy / 2
        } else {
            0
        }
    }

    /// The colour of the board at `(x, y)` in its frame, m: `Some(true)` black, `Some(false)`
    /// white (the squares, the markers, and a white margin of one square around them), `None`
    /// off the board.
    pub fn paint(&self, x: f64, y: f64) -> Option<bool> {
        let s = self.square_m;
        let (a, b) = ((x / s).floor() as i64, (y / s).floor() as i64);
        let (cols, rows) = (self.cols as i64, self.rows as i64);
        match self.kind {
            BoardKind::Chessboard => {
                if a < -2 || b < -2 || a > cols || b > rows {
                    return None;
                }
                if a < -1 || b < -1 || a > cols - 1 || b > rows - 1 {
                    return Some(false);
                }
                Some((a + b).rem_euclid(2) == 0)
            }
            BoardKind::Charuco {
                marker_m,
                dictionary,
            } => {
                // Squares 0..=cols along x and 0..=rows along y.
                if a < -1 || b < -1 || a > cols + 1 || b > rows + 1 {
                    return None;
                }
                if a < 0 || b < 0 || a > cols || b > rows {
                    return Some(false);
                }
                if (a + b) % 2 == 0 {
                    return Some(true);
                }
                // A white square: its marker, centred, black border one bit wide. Markers are
                // numbered over the white squares row by row: an even row holds sx / 2 of them
                // (odd columns), an odd row (sx + 1) / 2 (even columns); either way square `a`
                // is the row's (a / 2)-th.
                let sx = cols + 1;
                let id = (b / 2) * sx + (b % 2) * (sx / 2) + a / 2;
                let inset = (s - marker_m) / 2.0;
                let (mx, my) = (x - a as f64 * s - inset, y - b as f64 * s - inset);
                if mx < 0.0 || my < 0.0 || mx >= marker_m || my >= marker_m {
                    return Some(false);
                }
                let dict = dictionary_named(dictionary);
                let n = dict.marker_size() as i64;
                let cell = marker_m / (n + 2) as f64;
                let (cx, cy) = ((mx / cell) as i64, (my / cell) as i64);
                if cx < 1 || cy < 1 || cx > n || cy > n {
                    return Some(true);
                }
                let bit = (cy - 1) * n + (cx - 1);
                Some(dict.codes()[id as usize] >> bit & 1 == 1)
            }
        }
    }
}

/// The dictionary of a board's name, which parsing the name checked.
fn dictionary_named(name: &str) -> Dictionary {
    calib_targets_charuco::resolve_dictionary(name).expect("a board's dictionary was checked")
}

/// Why a view was not used.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum DetectError {
    /// No board at all.
    #[error("no board found")]
    NotFound,
    /// Too little of a ChArUco board.
    #[error(
        "only {found} ChArUco corners found that fit the board ({rejected} more taken out: not where the board's geometry or its markers put them), at least {needed} on two rows and two columns are needed (bring more of the board into view; if many are taken out, check the board's size, marker size and dictionary in its name)"
    )]
    TooFew {
        /// Corners found that fit the board.
        found: usize,
        /// Corners needed.
        needed: usize,
        /// Corners found that did not fit the board's geometry.
        rejected: usize,
    },
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

/// Finds the board in a grey image: a chessboard's every corner, or the ChArUco corners its
/// markers name (at least [`MIN_CHARUCO_CORNERS`]), refined to sub-pixel. ChArUco corners are
/// checked against their neighbours first ([`detect_checked`] says which were taken out).
pub fn detect(
    board: &Board,
    gray: &[u8],
    width: usize,
    height: usize,
) -> Result<Corners, DetectError> {
    detect_checked(board, gray, width, height).map(|d| d.corners)
}

/// The board found in one image: the corners used and those the checks took out.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Detection {
    /// The corners to use.
    pub corners: Corners,
    /// Corners the detector reported that do not fit the board's geometry (ChArUco only: a
    /// chessboard view is used whole or not at all).
    pub rejected: Vec<RejectedCorner>,
}

/// [`detect`], with the corners the checks took out and why.
pub fn detect_checked(
    board: &Board,
    gray: &[u8],
    width: usize,
    height: usize,
) -> Result<Detection, DetectError> {
    match board.kind {
        BoardKind::Chessboard => {
            detect_chessboard(board, gray, width, height).map(|corners| Detection {
                corners,
                rejected: Vec::new(),
            })
        }
        BoardKind::Charuco {
            marker_m,
            dictionary,
        } => detect_charuco(board, marker_m, dictionary, gray, width, height),
    }
}

fn detect_charuco(
    board: &Board,
    marker_m: f64,
    dictionary: &str,
    gray: &[u8],
    width: usize,
    height: usize,
) -> Result<Detection, DetectError> {
    // Markers' bits are a few pixels wide at webcam sizes; the detector's grid stage finds
    // far more of a board in the image at twice its size (on the simulator's 640x480 views
    // of a 9x7 board, 18-24 of 48 corners at 1x against 47-48 at 2x). Large images are
    // detected as they are.
    let up;
    let (view, scale) = if width * height <= UPSCALE_MAX_PIXELS {
        up = upscale2(gray, width, height);
        let view = GrayImageView {
            width: 2 * width,
            height: 2 * height,
            data: &up,
        };
        (view, 2.0)
    } else {
        let view = GrayImageView {
            width,
            height,
            data: gray,
        };
        (view, 1.0)
    };
    // calib-targets counts rows (squares down) before columns.
    let spec = CharucoBoardSpec::new(
        board.rows + 1,
        board.cols + 1,
        board.square_m as f32,
        (marker_m / board.square_m) as f32,
        dictionary_named(dictionary),
    );
    // The detector's three suggested settings in turn, until one finds the board.
    let found = CharucoParams::sweep_for_board(&spec)
        .into_iter()
        .find_map(|params| {
            CharucoDetector::new(params)
                .expect("a board whose name parsed makes a detector")
                .detect(&view)
                .ok()
        })
        .ok_or(DetectError::NotFound)?;
    // The detector's own sub-pixel positions are kept: on the 2x image they sit closer to the
    // truth than [`refine_corner`], whose window the markers crowd (simulated views: mean
    // 0.078 px and worst 0.21 px from the truth, against 0.084 and 0.30 refined).
    let mut ids = Vec::with_capacity(found.corners.len());
    let mut pixels = Vec::with_capacity(found.corners.len());
    for c in &found.corners {
        if (c.id as usize) < board.corners() && !ids.contains(&c.id) {
            ids.push(c.id);
            pixels.push(Vector2::new(
                (c.position.x as f64 + 0.5) / scale - 0.5,
                (c.position.y as f64 + 0.5) / scale - 0.5,
            ));
        }
    }
    let (corners, mut rejected) = check_against_neighbours(board, &Corners::new(ids, pixels));
    let (corners, unmarked) = check_markers(board, gray, width, height, &corners);
    rejected.extend(unmarked);
    rejected.sort_by_key(|r| r.id);
    let distinct = |f: fn(u32, u32) -> u32| {
        let mut v: Vec<u32> = corners.ids().iter().map(|&id| f(id, board.cols)).collect();
        v.sort_unstable();
        v.dedup();
        v.len()
    };
    if corners.len() < MIN_CHARUCO_CORNERS
        || distinct(|id, cols| id % cols) < 2
        || distinct(|id, cols| id / cols) < 2
    {
        return Err(DetectError::TooFew {
            found: corners.len(),
            needed: MIN_CHARUCO_CORNERS,
            rejected: rejected.len(),
        });
    }
    Ok(Detection { corners, rejected })
}

/// Images up to this many pixels (1280 x 960) are searched for ChArUco boards at twice their
/// size.
const UPSCALE_MAX_PIXELS: usize = 1280 * 960;

/// The image at twice its size, bilinear, pixel centres kept: pixel `(u, v)` of the result is
/// at `((u + 0.5) / 2 - 0.5, (v + 0.5) / 2 - 0.5)` of the original.
fn upscale2(gray: &[u8], width: usize, height: usize) -> Vec<u8> {
    let mut out = vec![0u8; 4 * width * height];
    let at = |x: isize, y: isize| -> f32 {
        let x = x.clamp(0, width as isize - 1) as usize;
        let y = y.clamp(0, height as isize - 1) as usize;
        gray[y * width + x] as f32
    };
    for v in 0..2 * height {
        for u in 0..2 * width {
            // Source position and its four neighbours (weights 0.25 / 0.75).
            let (sx, sy) = (u as isize / 2, v as isize / 2);
            let nx = if u % 2 == 0 { sx - 1 } else { sx + 1 };
            let ny = if v % 2 == 0 { sy - 1 } else { sy + 1 };
            let val = 0.5625 * at(sx, sy)
                + 0.1875 * at(nx, sy)
                + 0.1875 * at(sx, ny)
                + 0.0625 * at(nx, ny);
            out[v * 2 * width + u] = val.round() as u8;
        }
    }
    out
}

fn detect_chessboard(
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
    let mut best: Option<(f64, Vec<Vector2<f64>>)> = None;
    for t in 0..8 {
        let map = |i: i32, j: i32| -> (i32, i32) {
            let (a, b) = if t & 4 != 0 { (j, i) } else { (i, j) };
            let (w, h) = if t & 4 != 0 { (r, c) } else { (c, r) };
            let a = if t & 1 != 0 { w - 1 - a } else { a };
            let b = if t & 2 != 0 { h - 1 - b } else { b };
            (a, b)
        };
        let ordered: Option<Vec<Vector2<f64>>> = (0..r)
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
    Ok(Corners::whole(ordered))
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
        let c: Board = "charuco:7x5:0.04:0.028".parse().unwrap();
        assert_eq!((c.cols, c.rows), (6, 4), "inner corners");
        assert_eq!(c.to_string(), "charuco:7x5:0.04:0.028:DICT_4X4_50");
        assert_eq!(c.to_string().parse::<Board>().unwrap(), c);
        assert!(c.orientation_is_unique());
        assert_eq!(c.marker_count(), 17);
        for (bad, why) in [
            ("charuco:7x5:0.04", "no marker size"),
            ("charuco:7x5:0.04:0.05", "smaller than the square"),
            ("charuco:7x5:0.04:0.028:DICT_9X9_1", "unknown dictionary"),
            ("charuco:12x12:0.02:0.015:DICT_4X4_50", "72 markers"),
            ("charuco:2x5:0.04:0.028", "between 3 and 41"),
        ] {
            let e = bad.parse::<Board>().unwrap_err().to_string();
            assert!(
                e.contains(why) && e.contains("charuco:7x5:0.04:0.028"),
                "{e}"
            );
        }
    }

    #[test]
    fn charuco_corners_sit_where_opencv_puts_them() {
        // OpenCV >= 4.6, CharucoBoard((7, 5), 0.04, 0.028): getChessboardCorners()[0] is
        // (0.04, 0.04, 0), id 7 starts the second row.
        let c: Board = "charuco:7x5:0.04:0.028".parse().unwrap();
        assert_eq!(c.object_point(0), Point3::new(0.04, 0.04, 0.0));
        assert_eq!(c.object_point(7), Point3::new(0.08, 0.08, 0.0));
        assert_eq!(c.squares_extent(), (0.0, 0.0, 0.28, 0.2));
        let b: Board = "chessboard:9x6:0.025".parse().unwrap();
        assert_eq!(b.object_point(10), Point3::new(0.025, 0.025, 0.0));
    }

    #[test]
    fn charuco_markers_are_painted_in_opencvs_layout() {
        let c: Board = "charuco:5x7:0.04:0.028".parse().unwrap();
        let s = 0.04;
        // Square (0, 0) black, (1, 0) white with marker 0, the margin white, beyond nothing.
        assert_eq!(c.paint(0.5 * s, 0.5 * s), Some(true));
        assert_eq!(
            c.paint(1.0 * s + 0.002, 0.5 * s),
            Some(false),
            "around the marker"
        );
        assert_eq!(c.paint(-0.5 * s, 0.5 * s), Some(false));
        assert_eq!(c.paint(-1.5 * s, 0.5 * s), None);
        // Marker k's bits, as calib-targets (and OpenCV's generateImageMarker) have them:
        // DICT_4X4_50's marker 0 reads .#.. / #.#. / ##.. / ##.# with a black border.
        let bits = |square: (f64, f64)| -> Vec<bool> {
            let cell = 0.028 / 6.0;
            let inset = (s - 0.028) / 2.0;
            (0..36)
                .map(|k| {
                    let (cx, cy) = ((k % 6) as f64, (k / 6) as f64);
                    c.paint(
                        square.0 * s + inset + (cx + 0.5) * cell,
                        square.1 * s + inset + (cy + 0.5) * cell,
                    )
                    .unwrap()
                })
                .collect()
        };
        let marker0 = bits((1.0, 0.0));
        let expect = "######\
                      #.#..#\
                      ##.#.#\
                      ###..#\
                      ###.##\
                      ######";
        let want: Vec<bool> = expect
            .chars()
            .filter(|c| !c.is_whitespace())
            .map(|c| c == '#')
            .collect();
        assert_eq!(marker0, want);
        // Marker 2 is the first white square of the second row, (0, 1); marker 16 the last
        // white square of the board, (3, 6).
        let dict = dictionary_named("DICT_4X4_50");
        for (id, square) in [(2usize, (0.0, 1.0)), (16, (3.0, 6.0))] {
            let got = bits(square);
            for k in 0..16 {
                let (x, y) = (k % 4 + 1, k / 4 + 1);
                assert_eq!(
                    got[y * 6 + x],
                    dict.codes()[id] >> k & 1 == 1,
                    "marker {id} bit {k}"
                );
            }
        }
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
