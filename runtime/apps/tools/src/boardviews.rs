//! What `reflex sim board-views` runs: calibration boards rendered by the simulator's cameras,
//! with their truth (workstation builds: feature `sim`).

use crate::calibrate::{PoseView, PosesFile, write_json};
use reflex_agent::AgentError;
use reflex_agent::error::{Result, bail};
use reflex_agent::progress::Progress;
use reflex_calibration::board::Board;
use reflex_calibration::camera::{CameraFile, CameraModel};
use reflex_calibration::hand_eye::{Pose, Setup};
use reflex_sim::calib::{board_on_table, hand_eye_views, intrinsics_views};
use reflex_sim::camera::CameraRig;
use reflex_sim::world::ArmModel;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// What `reflex sim board-views` renders.
#[derive(Clone, Debug)]
pub struct BoardViewsOptions {
    /// A camera of the simulator's rig (`front`, `wrist`).
    pub camera: String,
    /// Image width, px.
    pub width: u32,
    /// Image height, px.
    pub height: u32,
    /// The board.
    pub board: Board,
    /// Views.
    pub views: usize,
    /// Seed of the poses.
    pub seed: u64,
    /// Lens distortion added to the camera's pinhole, `[k1, k2, p1, p2, k3]`.
    pub distortion: [f64; 5],
    /// Views for hand-eye (the wrist camera over a board on the table, `poses.json` written)
    /// instead of intrinsics.
    pub hand_eye: bool,
    /// Folder written.
    pub out: PathBuf,
}

/// `truth.json` of simulated views.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TruthFile {
    /// The rig camera.
    pub camera_name: String,
    /// Its lens, as rendered.
    pub camera: CameraFile,
    /// The board.
    pub board: String,
    /// `T_gripper_camera` (hand-eye views).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gripper_camera: Option<Pose>,
    /// `T_base_board` (hand-eye views).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_board: Option<Pose>,
    /// Per image, `T_camera_board`.
    pub views: Vec<TruthView>,
}

/// One rendered view's truth.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TruthView {
    /// File name.
    pub image: String,
    /// `T_camera_board`.
    pub camera_board: Pose,
}

/// `reflex sim board-views`: renders the views and writes them with `truth.json` (and
/// `poses.json` for hand-eye); returns the truth.
pub fn board_views(o: &BoardViewsOptions, progress: &dyn Progress) -> Result<TruthFile> {
    let rig = CameraRig::default_rig();
    let cam = rig
        .cameras
        .iter()
        .find(|c| c.name == o.camera)
        .ok_or_else(|| {
            bail(format!(
                "--camera {}: the simulator's cameras are {}",
                o.camera,
                rig.cameras
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
    let lens = CameraModel {
        dist: o.distortion,
        ..cam.lens(o.width, o.height)
    };
    std::fs::create_dir_all(&o.out).map_err(|e| AgentError::io(&o.out, e))?;
    progress.start(o.views as u64, "views");
    let (views, gripper_camera, base_board) = if o.hand_eye {
        let base_board = board_on_table(0.2, -0.04);
        let (views, x) = hand_eye_views(
            &ArmModel::so101(),
            cam,
            &lens,
            &o.board,
            &base_board,
            o.views,
            o.seed,
        )
        .map_err(|e| bail(format!("--camera {}: {e}", o.camera)))?;
        (views, Some(Pose::from(&x)), Some(Pose::from(&base_board)))
    } else {
        (
            intrinsics_views(&lens, &o.board, o.views, o.seed),
            None,
            None,
        )
    };
    let mut truth = Vec::with_capacity(views.len());
    let mut poses = Vec::new();
    for (k, v) in views.iter().enumerate() {
        let name = format!("view_{k:03}.png");
        reflex_data::plot::write_png(&o.out.join(&name), o.width, o.height, &v.image)?;
        truth.push(TruthView {
            image: name.clone(),
            camera_board: Pose::from(&v.camera_board),
        });
        if let Some(q) = v.joints {
            poses.push(PoseView {
                image: name,
                joints: Some(q.to_vec()),
                gripper: None,
            });
        }
        progress.inc(1);
    }
    progress.finish();
    let file = TruthFile {
        camera_name: o.camera.clone(),
        camera: CameraFile::new(&lens, None),
        board: o.board.to_string(),
        gripper_camera,
        base_board,
        views: truth,
    };
    write_json(&o.out.join("truth.json"), &file)?;
    if o.hand_eye {
        write_json(
            &o.out.join("poses.json"),
            &PosesFile {
                setup: Setup::EyeInHand,
                views: poses,
            },
        )?;
    }
    Ok(file)
}
