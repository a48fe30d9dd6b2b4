//! What `reflex calibrate camera|hand-eye` and `reflex sim board-views` run: a folder of board
//! images to a camera file (OpenCV's layout), a folder of images with the arm's poses to the
//! camera's place on the robot, and the simulator's board views with their truth for trying
//! both without a camera.
//!
//! Files in a views folder:
//! - `view_000.png` ... (PNG or JPEG), the board's pictures;
//! - `poses.json` (hand-eye): `{"setup": "eye-in-hand" | "eye-to-hand", "views": [{"image":
//!   "view_000.png", "joints": [rad, ...]} | {"image": ..., "gripper": Pose}]}`: the arm's joint
//!   positions (forward kinematics of its URDF gives the gripper) or the gripper's pose itself;
//! - `truth.json` (simulated views only): the lens and every pose they were rendered with.
//!
//! Every image is accounted for: used (with its RMS and any corners taken out) or skipped, with
//! what kind of problem it had ([`SkipKind`]: the file does not decode, no board in it, the fit
//! threw it out) and why, in the report and, when too few are left, in the error itself.

use reflex_agent::AgentError;
use reflex_agent::error::{Result, bail, ctx};
use reflex_agent::progress::Progress;
use reflex_calibration::board::{Board, Corners, detect, detect_checked, gray_from_rgb};
use reflex_calibration::camera::{CameraFile, CameraModel};
use reflex_calibration::corner_check::RejectedCorner;
use reflex_calibration::hand_eye::{
    Estimate, HandEyeFile, HandEyeView, HeldOut, MotionSpread, Pose, Setup, calibrate_hand_eye,
};
use reflex_calibration::intrinsics::calibrate;
use reflex_runtime::kinematics::Chain;
use reflex_tabletop::model::ARM_URDF;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// What kind of problem kept an image out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SkipKind {
    /// The file does not decode (truncated or not an image): its board was never looked for.
    Decode,
    /// No usable board in it (not found, too little of it, or its corners failed the checks).
    Board,
    /// The board was found, and the calibration threw the view out (far from the others' fit).
    Fit,
}

/// One image and why it was or was not used.
#[derive(Clone, Debug, Serialize)]
pub struct ImageOutcome {
    /// File name in the folder.
    pub image: String,
    /// Reprojection RMS, px, when used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rms_px: Option<f64>,
    /// Why not, when not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    /// What kind of problem, when skipped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skip_kind: Option<SkipKind>,
    /// Corners the detector reported that were not used, with why (ChArUco views).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rejected_corners: Vec<RejectedCorner>,
    /// The gripper's pose in the base frame (hand-eye views).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gripper: Option<Pose>,
}

impl ImageOutcome {
    fn new(image: &str, found: &std::result::Result<FoundView, Skip>) -> Self {
        let (skipped, skip_kind, rejected_corners) = match found {
            Ok(f) => (None, None, f.rejected.clone()),
            Err(s) => (Some(s.reason.clone()), Some(s.kind), Vec::new()),
        };
        ImageOutcome {
            image: image.to_string(),
            rms_px: None,
            skipped,
            skip_kind,
            rejected_corners,
            gripper: None,
        }
    }

    fn skip(&mut self, kind: SkipKind, reason: String) {
        self.skip_kind = Some(kind);
        self.skipped = Some(reason);
    }
}

/// Each image's line: its RMS, or why it was skipped (for errors that end a run).
fn outcome_lines(views: &[ImageOutcome]) -> String {
    views
        .iter()
        .map(|v| match (&v.rms_px, &v.skipped) {
            (_, Some(why)) => format!("\n  {}: skipped: {why}", v.image),
            (Some(rms), None) => format!("\n  {}: used ({rms:.3} px)", v.image),
            (None, None) => format!("\n  {}: usable", v.image),
        })
        .collect()
}

/// What `reflex calibrate camera` found.
#[derive(Clone, Debug, Serialize)]
pub struct CameraCalibrationReport {
    /// The board.
    pub board: String,
    /// Images read.
    pub images: usize,
    /// Images whose board was used.
    pub used: usize,
    /// The camera, in OpenCV's names.
    pub camera: CameraFile,
    /// Reprojection RMS over every corner used, px.
    pub rms_px: f64,
    /// Each image.
    pub views: Vec<ImageOutcome>,
    /// The camera file written.
    pub out: PathBuf,
    /// The detected corners written (for other tools to check against).
    pub corners: Option<PathBuf>,
    /// How far the board's normals leave the plane that fits them best, degrees (near 0: the
    /// board was tilted about one axis only; docs/hardware.md, "Degenerate views").
    pub tilt_spread_deg: f64,
    /// What to look at before trusting the result.
    pub warnings: Vec<String>,
    /// What the live capture kept, when the views came from `--live`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live: Option<LiveCapture>,
}

/// The corners of every image where the board was found: what `--corners` writes.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CornersFile {
    /// The board, as named on the command line.
    pub board: String,
    /// px.
    pub image_width: u32,
    /// px.
    pub image_height: u32,
    /// Per image, its corners in the board's order, `[u, v]` px with pixel centres at integers.
    pub views: Vec<CornerView>,
}

/// One image's corners.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CornerView {
    /// File name.
    pub image: String,
    /// Each corner's id: `j cols + i` for inner corner `(i, j)` (a chessboard's views hold
    /// every id; OpenCV's ChArUco ids).
    pub ids: Vec<u32>,
    /// `[u, v]`, px, in the order of `ids`.
    pub corners: Vec<[f64; 2]>,
}

impl CornerView {
    fn new(image: String, c: &Corners) -> Self {
        CornerView {
            image,
            ids: c.ids().to_vec(),
            corners: c.pixels().iter().map(|p| [p.x, p.y]).collect(),
        }
    }
}

fn image_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| AgentError::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|x| {
                matches!(
                    x.to_ascii_lowercase().to_str(),
                    Some("png" | "jpg" | "jpeg")
                )
            })
        })
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(bail(format!(
            "`{}` holds no .png, .jpg or .jpeg images of the board",
            dir.display()
        )));
    }
    Ok(files)
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Why an image was skipped before calibrating.
#[derive(Clone, Debug)]
struct Skip {
    kind: SkipKind,
    reason: String,
}

/// The board found in one image.
#[derive(Clone, Debug)]
struct FoundView {
    corners: Corners,
    rejected: Vec<RejectedCorner>,
}

/// Per image of a folder: its name and the board found, or why not.
type Found = Vec<(String, std::result::Result<FoundView, Skip>)>;

/// Whether a JPEG file holds all of itself: its markers walked from the start of image to the
/// end of image, through every scan's entropy-coded data. Decoders fill a truncated file's
/// missing rows with grey and say nothing (the board search then failed and the skip blamed the
/// board's placement); the walk says where the file ends instead.
fn jpeg_complete(bytes: &[u8]) -> std::result::Result<(), String> {
    if bytes.len() < 4 || bytes[0] != 0xFF || bytes[1] != 0xD8 {
        return Err("not a JPEG file (no start-of-image marker)".into());
    }
    let truncated = |at: usize| {
        Err(format!(
            "the file ends at byte {} before its end-of-image marker: it was truncated (copied or written only in part); copy it again or retake the picture",
            at.min(bytes.len())
        ))
    };
    let mut at = 2;
    loop {
        // A marker: 0xFF (fill bytes may repeat it), then its code.
        while at < bytes.len() && bytes[at] == 0xFF {
            at += 1;
        }
        if at >= bytes.len() {
            return truncated(at);
        }
        let code = bytes[at];
        at += 1;
        match code {
            0xD9 => return Ok(()),
            0x01 | 0xD0..=0xD7 => continue,
            _ => {}
        }
        if at + 2 > bytes.len() {
            return truncated(at);
        }
        let len = u16::from_be_bytes([bytes[at], bytes[at + 1]]) as usize;
        at += len;
        if at > bytes.len() {
            return truncated(bytes.len());
        }
        if code == 0xDA {
            // Entropy-coded data runs to the next marker that is not a stuffed 0xFF00 or a
            // restart marker.
            loop {
                if at + 1 >= bytes.len() {
                    return truncated(bytes.len());
                }
                if bytes[at] == 0xFF && !matches!(bytes[at + 1], 0x00 | 0xD0..=0xD7 | 0xFF) {
                    break;
                }
                at += 1;
            }
        } else if bytes.get(at).is_some_and(|b| *b != 0xFF) {
            return Err(format!(
                "byte {at} should start a JPEG marker and does not: the file is damaged"
            ));
        }
    }
}

/// An image of the folder as RGB, or why it does not decode (naming the file).
fn decode_image(f: &Path) -> std::result::Result<(u32, u32, Vec<u8>), String> {
    let is_jpeg = f
        .extension()
        .is_some_and(|x| matches!(x.to_ascii_lowercase().to_str(), Some("jpg" | "jpeg")));
    if is_jpeg {
        let bytes = std::fs::read(f).map_err(|e| format!("`{}`: {e}", f.display()))?;
        jpeg_complete(&bytes).map_err(|e| format!("`{}` does not decode: {e}", f.display()))?;
    }
    reflex_cameras::file::read_image(f)
        .map_err(|e| format!("`{}` does not decode: {e}", f.display()))
}

/// Finds the board in every image of a folder, and the images' size (all must share it).
fn detect_folder(
    dir: &Path,
    board: &Board,
    progress: &dyn Progress,
) -> Result<(Found, (u32, u32))> {
    let files = image_files(dir)?;
    progress.start(files.len() as u64, "images");
    let mut size = None;
    let mut out = Vec::with_capacity(files.len());
    for f in &files {
        let (w, h, rgb) = match decode_image(f) {
            Ok(image) => image,
            Err(reason) => {
                out.push((
                    file_name(f),
                    Err(Skip {
                        kind: SkipKind::Decode,
                        reason,
                    }),
                ));
                progress.inc(1);
                continue;
            }
        };
        if *size.get_or_insert((w, h)) != (w, h) {
            let (w0, h0) = size.unwrap();
            return Err(bail(format!(
                "`{}` is {w}x{h}, the images before it {w0}x{h0}; calibrate one camera at one size per folder",
                f.display()
            )));
        }
        let found = detect_checked(board, &gray_from_rgb(&rgb), w as usize, h as usize)
            .map(|d| FoundView {
                corners: d.corners,
                rejected: d.rejected,
            })
            .map_err(|e| Skip {
                kind: SkipKind::Board,
                reason: e.to_string(),
            });
        out.push((file_name(f), found));
        progress.inc(1);
    }
    progress.finish();
    let Some(size) = size else {
        return Err(bail(format!(
            "no image in `{}` decodes:{}",
            dir.display(),
            outcome_lines(
                &out.iter()
                    .map(|(name, found)| ImageOutcome::new(name, found))
                    .collect::<Vec<_>>()
            )
        )));
    };
    Ok((out, size))
}

/// Refuses an output path whose folder does not exist before any work is done, naming the
/// folder: the atomic write would otherwise fail on its temporary file's name, after the
/// whole folder of images had been searched.
pub fn check_out_folder(flag: &str, path: &Path) -> Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    match dir {
        Some(d) if !d.is_dir() => Err(bail(format!(
            "{flag} {}: the folder `{}` does not exist; create it (mkdir -p {}) or write elsewhere",
            path.display(),
            d.display(),
            d.display()
        ))),
        _ => Ok(()),
    }
}

pub(crate) fn write_json(path: &Path, value: &impl Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(ctx(path.display().to_string()))?;
    reflex_runtime::fsio::atomic_write(path, text.as_bytes()).map_err(|e| AgentError::io(path, e))
}

/// Writes a camera file: OpenCV's YAML, or JSON when the name ends in `.json`.
pub fn write_camera(path: &Path, model: &CameraModel, rms_px: Option<f64>) -> Result<()> {
    if path.extension().is_some_and(|e| e == "json") {
        write_json(path, &CameraFile::new(model, rms_px))
    } else {
        reflex_runtime::fsio::atomic_write(path, model.to_opencv_yaml(rms_px).as_bytes())
            .map_err(|e| AgentError::io(path, e))
    }
}

/// What `reflex calibrate camera --live` kept.
#[derive(Clone, Debug, Serialize)]
pub struct LiveCapture {
    /// Frames looked at.
    pub frames_seen: u64,
    /// Frames with the whole board.
    pub boards_seen: u64,
    /// Views kept (written to the images folder).
    pub kept: usize,
    /// Boards passed over because a kept view already looked like them.
    pub too_similar: u64,
    /// Boards passed over as blurred (sharpness under 60 % of the kept views' median).
    pub blurred: u64,
    /// Of a 4 x 3 grid over the image, the cells some kept corner fell in.
    pub coverage_cells: usize,
}

/// Where a board sits in a view, for telling new views from ones already kept: its centre and
/// size relative to the image, its two axes' lengths' ratio (tilt) and its rotation. A corner
/// not seen (part of a ChArUco board) is placed by the homography of those seen.
fn pose_signature(c: &Corners, board: &Board, w: u32, h: u32) -> [f64; 5] {
    let object = board.object_points_of(c);
    let plane = reflex_calibration::intrinsics::homography(&object, c.pixels());
    let at = |id: u32| -> nalgebra::Vector2<f64> {
        c.get(id)
            .or_else(|| {
                let o = board.object_point(id);
                let p = plane? * nalgebra::Vector3::new(o.x, o.y, 1.0);
                Some(nalgebra::Vector2::new(p.x / p.z, p.y / p.z))
            })
            .unwrap_or_default()
    };
    let n = c.len() as f64;
    let centre = c.pixels().iter().sum::<nalgebra::Vector2<f64>>() / n;
    let (cols, rows) = (board.cols, board.rows);
    let along = at(cols - 1) - at(0);
    let down = at((rows - 1) * cols) - at(0);
    let size = (along.norm() + down.norm()) / (w as f64 + h as f64);
    let tilt = (along.norm() / cols as f64) / (down.norm() / rows as f64).max(1e-9);
    [
        centre.x / w as f64,
        centre.y / h as f64,
        size,
        tilt.ln(),
        along.y.atan2(along.x),
    ]
}

/// Sharpness: the mean absolute Laplacian over the board's bounding box.
fn sharpness(gray: &[u8], w: usize, h: usize, c: &Corners) -> f64 {
    let (mut x0, mut y0, mut x1, mut y1) = (f64::MAX, f64::MAX, f64::MIN, f64::MIN);
    for p in c.pixels() {
        x0 = x0.min(p.x);
        y0 = y0.min(p.y);
        x1 = x1.max(p.x);
        y1 = y1.max(p.y);
    }
    let (x0, y0) = ((x0 as usize).max(1), (y0 as usize).max(1));
    let (x1, y1) = ((x1 as usize).min(w - 2), (y1 as usize).min(h - 2));
    let at = |x: usize, y: usize| gray[y * w + x] as f64;
    let (mut sum, mut n) = (0.0, 0.0);
    for y in y0..=y1 {
        for x in x0..=x1 {
            sum +=
                (4.0 * at(x, y) - at(x - 1, y) - at(x + 1, y) - at(x, y - 1) - at(x, y + 1)).abs();
            n += 1.0;
        }
    }
    if n > 0.0 { sum / n } else { 0.0 }
}

/// `reflex calibrate camera --live`: takes frames from `camera` and keeps, as PNG files in
/// `images`, up to `want` views where the whole board is seen, sharp, and unlike the views
/// already kept; the person moving the board sees how many are kept and which parts of the image
/// are covered. Ends when `want` views are kept, when the camera has delivered nothing for a
/// second (a file camera played out), or after `seconds`.
pub fn capture_live(
    camera: &reflex_cameras::CameraConfig,
    board: &Board,
    images: &Path,
    want: usize,
    seconds: f64,
    progress: &dyn Progress,
) -> Result<LiveCapture> {
    let epoch = std::time::Instant::now();
    let source = camera
        .open()
        .map_err(ctx(format!("--live {}", camera.device)))?;
    let mut cap = reflex_cameras::Capture::spawn(camera, source, epoch)
        .map_err(ctx(format!("--live {}", camera.device)))?;
    std::fs::create_dir_all(images).map_err(|e| AgentError::io(images, e))?;
    let (w, h) = (camera.width, camera.height);
    let mut out = LiveCapture {
        frames_seen: 0,
        boards_seen: 0,
        kept: 0,
        too_similar: 0,
        blurred: 0,
        coverage_cells: 0,
    };
    let mut kept: Vec<[f64; 5]> = Vec::new();
    let mut sharp: Vec<f64> = Vec::new();
    let mut cells = [[false; 4]; 3];
    progress.start(want as u64, "views");
    let mut last_frame = std::time::Instant::now();
    while out.kept < want && epoch.elapsed().as_secs_f64() < seconds {
        let Some(f) = cap.newer(epoch.elapsed()) else {
            if last_frame.elapsed() > std::time::Duration::from_secs(2) && cap.stats().errors > 0 {
                break;
            }
            // Paces the wait for the camera's next frame.
            std::thread::sleep(std::time::Duration::from_millis(5));
            continue;
        };
        last_frame = std::time::Instant::now();
        out.frames_seen += 1;
        let rgb = f.image.data.clone();
        let gray = gray_from_rgb(&rgb);
        let Ok(corners) = detect(board, &gray, w as usize, h as usize) else {
            continue;
        };
        out.boards_seen += 1;
        let s = sharpness(&gray, w as usize, h as usize, &corners);
        if !sharp.is_empty() {
            let mut sorted = sharp.clone();
            sorted.sort_by(f64::total_cmp);
            if s < 0.6 * sorted[sorted.len() / 2] {
                out.blurred += 1;
                continue;
            }
        }
        let sig = pose_signature(&corners, board, w, h);
        let novel = kept.iter().all(|k| {
            let d: f64 = k
                .iter()
                .zip(&sig)
                .enumerate()
                .map(|(i, (a, b))| {
                    // Centre and size in image fractions; tilt in log ratio; rotation in rad.
                    let scale = [1.0, 1.0, 1.0, 2.0, 0.5][i];
                    ((a - b) * scale).powi(2)
                })
                .sum::<f64>()
                .sqrt();
            d > 0.08
        });
        if !novel {
            out.too_similar += 1;
            continue;
        }
        let name = images.join(format!("live_{:03}.png", out.kept));
        reflex_data::plot::write_png(&name, w, h, &rgb)?;
        kept.push(sig);
        sharp.push(s);
        out.kept += 1;
        for c in corners.pixels() {
            let (cx, cy) = (
                (c.x / w as f64 * 4.0) as usize,
                (c.y / h as f64 * 3.0) as usize,
            );
            cells[cy.min(2)][cx.min(3)] = true;
        }
        out.coverage_cells = cells.iter().flatten().filter(|c| **c).count();
        let grid: Vec<String> = cells
            .iter()
            .map(|r| r.iter().map(|c| if *c { '#' } else { '.' }).collect())
            .collect();
        progress.inc(1);
        progress.message(&format!(
            "kept {}/{want}; image covered [{}]: move the board where there are dots, tilt it",
            out.kept,
            grid.join("|")
        ));
    }
    progress.finish();
    Ok(out)
}

/// `reflex calibrate camera`: the intrinsics from a folder of board images, written to `out`;
/// the detected corners to `corners` when given.
pub fn calibrate_camera(
    images: &Path,
    board: &Board,
    out: &Path,
    corners: Option<&Path>,
    progress: &dyn Progress,
) -> Result<CameraCalibrationReport> {
    check_out_folder("--out", out)?;
    if let Some(c) = corners {
        check_out_folder("--corners", c)?;
    }
    let (found, (w, h)) = detect_folder(images, board, progress)?;
    let usable: Vec<(usize, &FoundView)> = found
        .iter()
        .enumerate()
        .filter_map(|(k, (_, c))| c.as_ref().ok().map(|c| (k, c)))
        .collect();
    let mut views: Vec<Corners> = usable.iter().map(|(_, c)| c.corners.clone()).collect();
    let mut outcomes: Vec<ImageOutcome> = found
        .iter()
        .map(|(name, c)| ImageOutcome::new(name, c))
        .collect();
    progress.message("refining the camera over every view");
    let fit = calibrate(board, w, h, &views).map_err(|e| {
        bail(format!(
            "`{}`: {e}; each image:{}",
            images.display(),
            outcome_lines(&outcomes)
        ))
    })?;
    for v in &fit.views {
        outcomes[usable[v.index].0].rms_px = Some(v.rms_px);
    }
    for (k, why) in &fit.rejected {
        outcomes[usable[*k].0].skip(SkipKind::Fit, why.clone());
        outcomes[usable[*k].0].rms_px = None;
    }
    for (k, corner) in &fit.rejected_corners {
        outcomes[usable[*k].0].rejected_corners.push(corner.clone());
        let (ids, pixels) = views[*k].iter().filter(|(id, _)| *id != corner.id).unzip();
        views[*k] = Corners::new(ids, pixels);
    }
    write_camera(out, &fit.model, Some(fit.rms_px))?;
    if let Some(path) = corners {
        let file = CornersFile {
            board: board.to_string(),
            image_width: w,
            image_height: h,
            views: fit
                .views
                .iter()
                .map(|v| CornerView::new(found[usable[v.index].0].0.clone(), &views[v.index]))
                .collect(),
        };
        write_json(path, &file)?;
    }
    Ok(CameraCalibrationReport {
        board: board.to_string(),
        images: found.len(),
        used: fit.views.len(),
        camera: CameraFile::new(&fit.model, Some(fit.rms_px)),
        rms_px: fit.rms_px,
        views: outcomes,
        out: out.to_path_buf(),
        corners: corners.map(Path::to_path_buf),
        tilt_spread_deg: fit.tilt_spread_deg,
        warnings: fit.warnings,
        live: None,
    })
}

/// `poses.json`: the arm's pose for each image.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PosesFile {
    /// Where the camera is.
    pub setup: Setup,
    /// One per image.
    pub views: Vec<PoseView>,
}

/// The arm's pose when an image was taken.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoseView {
    /// File name in the folder.
    pub image: String,
    /// Joint positions, rad, in the URDF chain's order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub joints: Option<Vec<f64>>,
    /// Or the gripper's pose in the base frame.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gripper: Option<Pose>,
}

/// Where the arm's kinematics come from for hand-eye.
#[derive(Clone, Debug)]
pub struct ArmKinematics {
    /// A URDF file; `None`: the SO-101 reflex ships.
    pub urdf: Option<PathBuf>,
    /// The chain's base link.
    pub base: String,
    /// The link the camera (eye in hand) or the board (eye to hand) is fixed to.
    pub link: String,
}

/// What `reflex calibrate hand-eye` found.
#[derive(Clone, Debug, Serialize)]
pub struct HandEyeReport {
    /// The setup solved.
    pub setup: Setup,
    /// The frame the camera's pose is in: the link (eye in hand) or the base (eye to hand).
    pub parent: String,
    /// `T_parent_camera`.
    pub camera: Pose,
    /// Park-Martin's closed form, before refinement.
    pub closed_form: Pose,
    /// The board: `T_base_board` (eye in hand) or `T_link_board` (eye to hand).
    pub board: Pose,
    /// Reprojection RMS over every corner, px.
    pub rms_px: f64,
    /// Largest distance between a view's own board pose and the fitted one, mm.
    pub worst_view_mm: f64,
    /// Largest angle between them, degrees.
    pub worst_view_deg: f64,
    /// Which estimate `camera` is: the refinement, or the closed form when that predicted
    /// left-out views better.
    pub estimate: Estimate,
    /// Reprojection RMS of each view through an estimate fitted without it, px.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_out: Option<HeldOut>,
    /// The corners' noise, px.
    pub pixel_noise_px: f64,
    /// The arm's pose noise the views show, per axis, degrees.
    pub arm_noise_deg: f64,
    /// The arm's pose noise the views show, per axis, mm.
    pub arm_noise_mm: f64,
    /// Standard deviation of the camera's place, mm.
    pub camera_sigma_mm: f64,
    /// Standard deviation of the camera's rotation, degrees.
    pub camera_sigma_deg: f64,
    /// How the arm turned between views.
    pub motion: MotionSpread,
    /// What to look at before trusting the result.
    pub warnings: Vec<String>,
    /// Each image.
    pub views: Vec<ImageOutcome>,
    /// The result written.
    pub out: PathBuf,
}

/// Where `reflex calibrate hand-eye` reads and writes.
#[derive(Clone, Debug)]
pub struct HandEyeFiles {
    /// Folder of the board's images.
    pub images: PathBuf,
    /// The arm's poses (`poses.json` in the folder when `None`).
    pub poses: Option<PathBuf>,
    /// The camera's intrinsics.
    pub camera: PathBuf,
    /// The result written.
    pub out: PathBuf,
    /// The detected corners written, when given.
    pub corners: Option<PathBuf>,
}

/// `reflex calibrate hand-eye`: the camera's place from board images, the arm's poses and the
/// camera's intrinsics.
pub fn calibrate_hand_eye_folder(
    files: &HandEyeFiles,
    board: &Board,
    arm: &ArmKinematics,
    progress: &dyn Progress,
) -> Result<HandEyeReport> {
    let (images, camera, out) = (
        files.images.as_path(),
        files.camera.as_path(),
        files.out.as_path(),
    );
    check_out_folder("--out", out)?;
    if let Some(c) = &files.corners {
        check_out_folder("--corners", c)?;
    }
    let poses = files.poses.as_deref();
    let model = CameraModel::load(camera).map_err(ctx(camera.display().to_string()))?;
    let poses_path = poses
        .map(Path::to_path_buf)
        .unwrap_or_else(|| images.join("poses.json"));
    let shown = poses_path.display().to_string();
    let text = std::fs::read_to_string(&poses_path).map_err(|e| AgentError::io(&poses_path, e))?;
    let poses: PosesFile = serde_json::from_str(&text).map_err(ctx(shown.clone()))?;
    let chain = arm_chain(arm)?;
    let (found, (w, h)) = detect_folder(images, board, progress)?;
    if (w, h) != (model.width, model.height) {
        return Err(bail(format!(
            "the images in `{}` are {w}x{h}, the camera in `{}` was calibrated at {}x{}",
            images.display(),
            camera.display(),
            model.width,
            model.height
        )));
    }
    let mut views = Vec::new();
    let mut used = Vec::new();
    let mut outcomes = Vec::new();
    for (k, pv) in poses.views.iter().enumerate() {
        let gripper = gripper_pose(pv, k, &chain, arm, &shown)?;
        let Some((_, corners)) = found.iter().find(|(name, _)| *name == pv.image) else {
            return Err(bail(format!(
                "`{shown}`: views[{k}] names `{}`, which is not an image in `{}`",
                pv.image,
                images.display()
            )));
        };
        let mut outcome = ImageOutcome::new(&pv.image, corners);
        outcome.gripper = Some(Pose::from(&gripper));
        if let Ok(c) = corners {
            views.push(HandEyeView {
                gripper,
                corners: c.corners.clone(),
            });
            used.push(outcomes.len());
        }
        outcomes.push(outcome);
    }
    if let Some(path) = &files.corners {
        write_used_corners(path, board, (w, h), &outcomes, &views)?;
    }
    progress.message("solving AX = XB, then refining on the corners");
    let fit = calibrate_hand_eye(poses.setup, &model, board, &views).map_err(|e| {
        bail(format!(
            "`{}`: {e}; each image named in `{shown}`:{}",
            images.display(),
            outcome_lines(&outcomes)
        ))
    })?;
    for (i, rms) in used.iter().zip(&fit.view_rms_px) {
        outcomes[*i].rms_px = Some(*rms);
    }
    let parent = match poses.setup {
        Setup::EyeInHand => arm.link.clone(),
        Setup::EyeToHand => arm.base.clone(),
    };
    write_json(
        out,
        &HandEyeFile {
            setup: poses.setup,
            parent: parent.clone(),
            camera: Pose::from(&fit.camera),
            rms_px: fit.rms_px,
        },
    )?;
    Ok(HandEyeReport {
        setup: poses.setup,
        parent,
        camera: Pose::from(&fit.camera),
        closed_form: Pose::from(&fit.closed_form),
        board: Pose::from(&fit.board),
        rms_px: fit.rms_px,
        worst_view_mm: fit.view_board_error.iter().map(|e| e.0).fold(0.0, f64::max),
        worst_view_deg: fit.view_board_error.iter().map(|e| e.1).fold(0.0, f64::max),
        estimate: fit.estimate,
        held_out: fit.held_out,
        pixel_noise_px: fit.pixel_noise_px,
        arm_noise_deg: fit.arm_noise_deg,
        arm_noise_mm: fit.arm_noise_mm,
        camera_sigma_mm: fit.camera_sigma_mm,
        camera_sigma_deg: fit.camera_sigma_deg,
        motion: fit.motion,
        warnings: fit.warnings,
        views: outcomes,
        out: out.to_path_buf(),
    })
}

/// The chain from the arm's base to the link that holds the camera or the board.
fn arm_chain(arm: &ArmKinematics) -> Result<Chain> {
    Ok(match &arm.urdf {
        Some(p) => Chain::from_urdf_file(p, &arm.base, &arm.link)?,
        None => Chain::from_urdf_str(ARM_URDF, "the shipped SO-101 URDF", &arm.base, &arm.link)?,
    })
}

/// The gripper's pose of view `k` in the poses file `shown`: from its joints through the chain,
/// or given as a pose.
fn gripper_pose(
    pv: &PoseView,
    k: usize,
    chain: &Chain,
    arm: &ArmKinematics,
    shown: &str,
) -> Result<nalgebra::Isometry3<f64>> {
    Ok(match (&pv.joints, &pv.gripper) {
        (Some(q), None) if q.len() == chain.dof() => chain.fk(q),
        (Some(q), None) => {
            return Err(bail(format!(
                "`{shown}`: views[{k}] has {} joints, the chain {} -> {} has {}",
                q.len(),
                arm.base,
                arm.link,
                chain.dof()
            )));
        }
        (None, Some(p)) => p.iso(),
        _ => {
            return Err(bail(format!(
                "`{shown}`: views[{k}] needs either `joints` or `gripper`"
            )));
        }
    })
}

/// The corners of the views the calibration used, in OpenCV's layout (`--corners`).
fn write_used_corners(
    path: &Path,
    board: &Board,
    (w, h): (u32, u32),
    outcomes: &[ImageOutcome],
    views: &[HandEyeView],
) -> Result<()> {
    let used_views = outcomes.iter().filter(|o| o.skipped.is_none());
    let file = CornersFile {
        board: board.to_string(),
        image_width: w,
        image_height: h,
        views: used_views
            .zip(views)
            .map(|(o, v)| CornerView::new(o.image.clone(), &v.corners))
            .collect(),
    };
    write_json(path, &file)
}

/// The largest board image `write_board_png` makes.
const MAX_BOARD_PIXELS: f64 = 100e6;

/// `reflex calibrate board`: the board as a PNG to print at `dpi` (100 % scale, no "fit to
/// page"): the squares (and a ChArUco board's markers) and a white margin of half a square around
/// them (a 9x6 chessboard of 25 mm squares is 27.5 x 20 cm: A4 or US letter in landscape).
/// Returns the image's size in pixels.
pub fn write_board_png(board: &Board, dpi: f64, out: &Path) -> Result<(u32, u32)> {
    check_out_folder("--out", out)?;
    if !(50.0..=2400.0).contains(&dpi) {
        return Err(bail(format!(
            "--dpi {dpi}: between 50 and 2400 dots per inch"
        )));
    }
    let px_per_m = dpi / 0.0254;
    let s = board.square_m;
    let (x0, y0, x1, y1) = board.squares_extent();
    let (x0, y0) = (x0 - 0.5 * s, y0 - 0.5 * s);
    let (wm, hm) = (x1 - x0 + 0.5 * s, y1 - y0 + 0.5 * s);
    let (wf, hf) = ((wm * px_per_m).round(), (hm * px_per_m).round());
    // 100 megapixels (300 MB of RGB) is a 1.1 m square board at 240 dpi: beyond any printer's page.
    if wf * hf > MAX_BOARD_PIXELS {
        return Err(bail(format!(
            "the board is {wf} x {hf} px at {dpi} dpi ({:.0} x {:.0} cm), above {} megapixels: lower --dpi or the square size",
            wm * 100.0,
            hm * 100.0,
            MAX_BOARD_PIXELS / 1e6
        )));
    }
    let (w, h) = (wf as u32, hf as u32);
    let mut rgb = vec![255u8; w as usize * h as usize * 3];
    for v in 0..h {
        for u in 0..w {
            let x = x0 + (u as f64 + 0.5) / px_per_m;
            let y = y0 + (v as f64 + 0.5) / px_per_m;
            if board.paint(x, y) == Some(true) {
                let p = (v as usize * w as usize + u as usize) * 3;
                rgb[p..p + 3].fill(0);
            }
        }
    }
    reflex_data::plot::write_png(out, w, h, &rgb)?;
    Ok((w, h))
}

/// The camera a live calibration captures from: a V4L2 device at `size` and `format`, or a
/// folder of images (`files:DIR`, played once, its size and kind read from the files).
pub fn live_camera(
    device: &str,
    size: (u32, u32),
    format: reflex_cameras::PixelFormat,
    fps: f64,
) -> Result<reflex_cameras::CameraConfig> {
    let (format, (width, height)) = match device.strip_prefix(reflex_cameras::FILES_PREFIX) {
        Some(dir) => {
            let probe = reflex_cameras::FileCamera::open(Path::new(dir), fps, false)
                .map_err(ctx(format!("--live {device}")))?;
            let (f, w, h) = reflex_cameras::FrameSource::format(&probe);
            (f, (w, h))
        }
        None => (format, size),
    };
    Ok(reflex_cameras::CameraConfig {
        repeat: false,
        ..reflex_cameras::CameraConfig::new("calibration", device, (width, height), fps, format)
    })
}
