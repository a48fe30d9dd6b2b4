//! `reflex calibrate ...`: an arm's joints (guided, written in LeRobot's format), a camera's
//! intrinsics from board images, and a camera's place on the robot (hand-eye).

use crate::cli::{Bars, print_json};
use clap::{Args, Subcommand};
use reflex_calibration::board::Board;
use reflex_tools::calibrate::{
    ArmKinematics, HandEyeFiles, calibrate_camera, calibrate_hand_eye_folder,
};
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Subcommand)]
pub enum CalibrateCommand {
    /// Guided joint calibration: middle pose, then a sweep of every joint; writes the homing
    /// offsets and limits to the servos and LeRobot's calibration file.
    Joints(CalibrateArgs),
    /// A camera's intrinsics and distortion from a folder of board images (OpenCV's YAML,
    /// or JSON when --out ends in .json).
    Camera(CameraArgs),
    /// Where a camera sits on the robot, from board images and the arm's pose for each
    /// (poses.json), with the camera's intrinsics.
    HandEye(HandEyeArgs),
    /// The board as a PNG to print at 100 % scale.
    Board(BoardArgs),
}

#[derive(Args)]
pub struct BoardArgs {
    /// The board: chessboard:COLSxROWS:SQUARE_M (inner corners, square side in metres) or
    /// charuco:SQUARES_XxSQUARES_Y:SQUARE_M:MARKER_M[:DICT_4X4_50] (OpenCV's CharucoBoard).
    #[arg(long, default_value = "chessboard:9x6:0.025")]
    board: Board,
    /// Printer resolution, dots per inch.
    #[arg(long, default_value_t = 300.0)]
    dpi: f64,
    /// The PNG written.
    #[arg(long, default_value = "board.png")]
    out: PathBuf,
}

#[derive(Args)]
pub struct CameraArgs {
    /// Folder of PNG or JPEG images of the board, one camera at one size (with --live: where
    /// the views kept are written).
    #[arg(long)]
    images: PathBuf,
    /// Capture the views now from this camera (/dev/videoN, or files:DIR): views are kept when
    /// the board is seen (a chessboard whole), sharp, and unlike those already kept.
    #[arg(long, value_name = "DEVICE")]
    live: Option<String>,
    /// With --live: views to keep.
    #[arg(long, default_value_t = 20)]
    views: usize,
    /// With --live: the capture size of a V4L2 camera, WIDTHxHEIGHT.
    #[arg(long, default_value = "640x480")]
    size: String,
    /// With --live: mjpeg or yuyv (a V4L2 camera's format).
    #[arg(long, default_value = "mjpeg")]
    format: String,
    /// With --live: frames per second.
    #[arg(long, default_value_t = 30.0, value_parser = crate::cli::hertz)]
    fps: f64,
    /// With --live: give up after this many seconds.
    #[arg(long, default_value_t = 300.0, value_parser = crate::cli::seconds)]
    seconds: f64,
    /// The board: chessboard:COLSxROWS:SQUARE_M (inner corners, square side in metres) or
    /// charuco:SQUARES_XxSQUARES_Y:SQUARE_M:MARKER_M[:DICT_4X4_50] (OpenCV's CharucoBoard).
    #[arg(long)]
    board: Board,
    /// The camera file written.
    #[arg(long, default_value = "camera.yaml")]
    out: PathBuf,
    /// Also write the detected corners (JSON), for checking with other tools.
    #[arg(long)]
    corners: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct HandEyeArgs {
    /// Folder of the board's images.
    #[arg(long)]
    images: PathBuf,
    /// The arm's pose for each image (default: poses.json in the images' folder).
    #[arg(long)]
    poses: Option<PathBuf>,
    /// The camera's intrinsics (reflex calibrate camera's output).
    #[arg(long)]
    camera: PathBuf,
    /// The board.
    #[arg(long)]
    board: Board,
    /// The arm's URDF (default: the SO-101 reflex ships).
    #[arg(long)]
    urdf: Option<PathBuf>,
    /// The URDF's base link.
    #[arg(long, default_value = "base")]
    base: String,
    /// The link the camera (eye in hand) or the board (eye to hand) is fixed to.
    #[arg(long, default_value = "gripper")]
    link: String,
    /// The result written (JSON).
    #[arg(long, default_value = "hand_eye.json")]
    out: PathBuf,
    /// Also write the detected corners (JSON), for checking with other tools.
    #[arg(long)]
    corners: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct CalibrateArgs {
    /// Which arm: so101-follower, so101-leader, koch-follower, koch-leader.
    #[arg(long)]
    robot: String,
    /// Its serial port.
    #[arg(long)]
    port: String,
    /// The arm's id: the file is <calibration dir>/{robots|teleoperators}/<type>/<id>.json, the
    /// layout LeRobot reads ($HF_LEROBOT_CALIBRATION, else $HF_LEROBOT_HOME/calibration, else
    /// ~/.cache/huggingface/lerobot/calibration).
    #[arg(long, default_value = "default")]
    id: String,
    /// Write the file here instead.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

/// Waits for the enter key on another thread, so the caller keeps sampling meanwhile.
fn enter_pressed() -> std::sync::mpsc::Receiver<()> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        let _ = tx.send(());
    });
    rx
}

pub fn calibrate(cmd: CalibrateCommand) -> anyhow::Result<()> {
    use reflex_hardware::arm::ArmKind;
    use reflex_hardware::calibrate::{Calibrator, full_turn_motors};
    let a = match cmd {
        CalibrateCommand::Joints(a) => a,
        CalibrateCommand::Camera(a) => return camera(a),
        CalibrateCommand::HandEye(a) => return hand_eye(a),
        CalibrateCommand::Board(a) => {
            let (w, h) = reflex_tools::calibrate::write_board_png(&a.board, a.dpi, &a.out)?;
            println!(
                "wrote {} ({w}x{h} px: {:.1} x {:.1} cm at {} dpi); print it at 100 % scale, then measure a square: give that size in --board",
                a.out.display(),
                w as f64 / a.dpi * 2.54,
                h as f64 / a.dpi * 2.54,
                a.dpi
            );
            return Ok(());
        }
    };
    let kind = ArmKind::parse(&a.robot).ok_or_else(|| {
        anyhow::anyhow!(
            "--robot {}: reflex knows {}",
            a.robot,
            ArmKind::ALL.map(|k| k.name()).join(", ")
        )
    })?;
    let (dev, ty) = kind.calibration_type();
    let path = a.out.clone().unwrap_or_else(|| {
        let dir = reflex_calibration::calibration_dir(&|k| std::env::var(k).ok());
        reflex_calibration::calibration_path(&dir, dev, ty, &a.id)
    });
    let mut cal = Calibrator::open(kind, &a.port)?;
    println!(
        "calibrating the {} on {} (torque off: the joints move freely)",
        kind.name(),
        a.port
    );
    println!("1. Move every joint to the middle of its range, then press enter.");
    std::io::stdout().flush()?;
    enter_pressed().recv()?;
    let offsets = cal.set_middle()?.to_vec();
    println!("   homing offsets: {offsets:?}");
    println!(
        "2. Move every joint except {} through its whole range, then press enter.",
        full_turn_motors(kind).join(" and ")
    );
    std::io::stdout().flush()?;
    let done = enter_pressed();
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let mut shown = Instant::now();
    loop {
        cal.sample()?;
        if done.try_recv().is_ok() {
            break;
        }
        if tty && shown.elapsed() > Duration::from_millis(200) {
            shown = Instant::now();
            let line: Vec<String> = cal
                .ranges()
                .iter()
                .filter(|r| !r.3)
                .map(|(n, lo, hi, _)| format!("{n} {lo}..{hi}"))
                .collect();
            print!("\r   {}   ", line.join("  "));
            std::io::stdout().flush()?;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if tty {
        println!();
    }
    let c = cal.finish()?;
    c.write(&path)?;
    for (name, m) in &c.motors {
        println!(
            "   {name:<14} id {} offset {:>5} range {:>4}..{:<4}",
            m.id, m.homing_offset, m.range_min, m.range_max
        );
    }
    println!("wrote {}", path.display());
    Ok(())
}

fn camera(a: CameraArgs) -> anyhow::Result<()> {
    let live = match &a.live {
        None => None,
        Some(device) => {
            let (w, h) = a
                .size
                .split_once('x')
                .and_then(|(w, h)| Some((w.parse::<u32>().ok()?, h.parse::<u32>().ok()?)))
                .ok_or_else(|| anyhow::anyhow!("--size {}: WIDTHxHEIGHT, e.g. 640x480", a.size))?;
            let format = match a.format.as_str() {
                "mjpeg" => reflex_cameras::PixelFormat::Mjpeg,
                "yuyv" => reflex_cameras::PixelFormat::Yuyv,
                other => anyhow::bail!("--format {other}: mjpeg or yuyv"),
            };
            let cfg = reflex_tools::calibrate::live_camera(device, (w, h), format, a.fps)?;
            let got = reflex_tools::calibrate::capture_live(
                &cfg,
                &a.board,
                &a.images,
                a.views,
                a.seconds,
                &Bars::new(a.json),
            )?;
            if !a.json {
                println!(
                    "kept {} views of {} boards seen in {} frames ({} too like a kept one, {} blurred); {} of 12 image cells covered",
                    got.kept,
                    got.boards_seen,
                    got.frames_seen,
                    got.too_similar,
                    got.blurred,
                    got.coverage_cells
                );
            }
            Some(got)
        }
    };
    let mut r = calibrate_camera(
        &a.images,
        &a.board,
        &a.out,
        a.corners.as_deref(),
        &Bars::new(a.json),
    )?;
    r.live = live;
    if a.json {
        print_json(&r);
        return Ok(());
    }
    print_views(&r.views);
    let k = &r.camera.camera_matrix;
    let d = &r.camera.distortion_coefficients;
    println!(
        "{} of {} images used; reprojection RMS {:.3} px",
        r.used, r.images, r.rms_px
    );
    println!(
        "fx {:.2} fy {:.2} cx {:.2} cy {:.2} px; k1 {:.4} k2 {:.4} p1 {:.5} p2 {:.5} k3 {:.4}",
        k[0][0], k[1][1], k[0][2], k[1][2], d[0], d[1], d[2], d[3], d[4]
    );
    print_warnings(&r.warnings);
    println!("wrote {}", r.out.display());
    Ok(())
}

fn hand_eye(a: HandEyeArgs) -> anyhow::Result<()> {
    let arm = ArmKinematics {
        urdf: a.urdf.clone(),
        base: a.base.clone(),
        link: a.link.clone(),
    };
    let files = HandEyeFiles {
        images: a.images.clone(),
        poses: a.poses.clone(),
        camera: a.camera.clone(),
        out: a.out.clone(),
        corners: a.corners.clone(),
    };
    let r = calibrate_hand_eye_folder(&files, &a.board, &arm, &Bars::new(a.json))?;
    if a.json {
        print_json(&r);
        return Ok(());
    }
    print_views(&r.views);
    let t = r.camera.translation_m;
    let q = r.camera.rotation_xyzw;
    println!(
        "camera in `{}`: translation [{:.4}, {:.4}, {:.4}] m, rotation xyzw [{:.5}, {:.5}, {:.5}, {:.5}]",
        r.parent, t[0], t[1], t[2], q[0], q[1], q[2], q[3]
    );
    println!(
        "reprojection RMS {:.3} px; views agree on the board within {:.2} mm and {:.3} degrees",
        r.rms_px, r.worst_view_mm, r.worst_view_deg
    );
    println!(
        "camera's place known to {:.2} mm and {:.3} degrees (1 sigma; {:?}); the arm's poses scatter by {:.3} degrees and {:.2} mm",
        r.camera_sigma_mm, r.camera_sigma_deg, r.estimate, r.arm_noise_deg, r.arm_noise_mm
    );
    print_warnings(&r.warnings);
    println!("wrote {}", r.out.display());
    Ok(())
}

/// Each image: its reprojection RMS and the corners left out, or why it was skipped.
fn print_views(views: &[reflex_tools::calibrate::ImageOutcome]) {
    for v in views {
        match (&v.rms_px, &v.skipped) {
            (_, Some(why)) => println!("  {:<20} skipped: {why}", v.image),
            (Some(rms), None) => println!("  {:<20} {rms:.3} px", v.image),
            _ => {}
        }
        for c in &v.rejected_corners {
            println!("  {:<20}   corner {} left out: {}", "", c.id, c.reason);
        }
    }
}

fn print_warnings(warnings: &[String]) {
    for w in warnings {
        println!("warning: {w}");
    }
}
