#![allow(
    clippy::too_many_lines,
    reason = "a test reads as one scenario; the limit is for library code"
)]
use super::*;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/camera")
        .join(name)
}

fn write_png(path: &Path, w: u32, h: u32, rgb: &[u8]) {
    let f = std::fs::File::create(path).unwrap();
    let mut enc = png::Encoder::new(std::io::BufWriter::new(f), w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.write_header().unwrap().write_image_data(rgb).unwrap();
}

fn png_rgb(path: &Path) -> Vec<u8> {
    let dec = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
    let mut r = dec.read_info().unwrap();
    let mut buf = vec![0; r.output_buffer_size().unwrap()];
    let info = r.next_frame(&mut buf).unwrap();
    buf.truncate(info.buffer_size());
    buf
}

fn config(name: &str, device: String, w: u32, h: u32) -> CameraConfig {
    CameraConfig::new(name, &device, (w, h), 200.0, PixelFormat::Mjpeg)
}

/// Waits (bounded) until `ok`, taking frames as a loop would.
fn wait_for(cap: &mut Capture, epoch: Instant, what: &str, ok: impl Fn(&Capture) -> bool) {
    let t0 = Instant::now();
    loop {
        let _ = cap.latest(epoch.elapsed());
        if ok(cap) {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "never: {what}");
        // Paces the polling, as a 1 kHz loop would take frames.
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn mjpeg_frames_decode_as_libjpeg_decodes_them_with_or_without_their_huffman_tables() {
    let reference = png_rgb(&fixture("frame_decoded_by_pillow.png"));
    for name in ["frame.jpg", "frame_no_dht.jpg"] {
        let jpg = std::fs::read(fixture(name)).unwrap();
        assert_eq!(pixels::jpeg_size(&jpg).unwrap(), (64, 48));
        let mut rgb = vec![0; 64 * 48 * 3];
        pixels::mjpeg_to_rgb(&jpg, 64, 48, &mut rgb, &mut Vec::new()).unwrap();
        // Two correct IDCTs differ by rounding only.
        let worst = rgb
            .iter()
            .zip(&reference)
            .map(|(a, b)| (*a as i32 - *b as i32).abs())
            .max()
            .unwrap();
        assert!(
            worst <= 4,
            "{name}: off by up to {worst} from Pillow's decode"
        );
    }
    let jpg = std::fs::read(fixture("frame.jpg")).unwrap();
    let mut rgb = vec![0; 32 * 24 * 3];
    let e = pixels::mjpeg_to_rgb(&jpg, 32, 24, &mut rgb, &mut Vec::new()).unwrap_err();
    assert!(e.to_string().contains("64x48"), "{e}");
    assert!(
        pixels::mjpeg_to_rgb(
            &jpg[..jpg.len() / 3],
            64,
            48,
            &mut vec![0; 64 * 48 * 3],
            &mut Vec::new()
        )
        .is_err()
    );
}

#[test]
fn the_tables_added_to_a_motion_jpeg_frame_are_the_ones_libjpeg_writes_by_default() {
    // Pillow wrote frame.jpg with libjpeg's default tables (T.81 Annex K); frame_no_dht.jpg is
    // the same file without them: the standard tables added back, it decodes to identical
    // pixels.
    let with = std::fs::read(fixture("frame.jpg")).unwrap();
    let without = std::fs::read(fixture("frame_no_dht.jpg")).unwrap();
    let mut scratch = Vec::new();
    assert_eq!(
        pixels::with_standard_huffman_tables(&with, &mut scratch),
        &with[..],
        "a frame with tables is left alone"
    );
    let fixed = pixels::with_standard_huffman_tables(&without, &mut scratch).to_vec();
    // Pillow writes each table in a segment of its own (4 bytes of marker and length each),
    // reflex all four in one.
    assert_eq!(fixed.len() + 3 * 4, with.len());
    let (mut a, mut b) = (vec![0; 64 * 48 * 3], vec![0; 64 * 48 * 3]);
    pixels::mjpeg_to_rgb(&with, 64, 48, &mut a, &mut Vec::new()).unwrap();
    pixels::mjpeg_to_rgb(&fixed, 64, 48, &mut b, &mut Vec::new()).unwrap();
    assert!(a == b, "identical pixels");
}

#[test]
fn a_folder_of_pngs_plays_as_a_camera_cropped_and_resized_newest_first() {
    let dir = tempfile::tempdir().unwrap();
    // Three 8x6 frames, each a solid colour with a distinct top-left 4x3 quadrant.
    let colours = [[200u8, 0, 0], [0, 200, 0], [0, 0, 200]];
    for (k, c) in colours.iter().enumerate() {
        let rgb: Vec<u8> = (0..6)
            .flat_map(|y| (0..8).flat_map(move |x| if x < 4 && y < 3 { *c } else { [9, 9, 9] }))
            .collect();
        write_png(&dir.path().join(format!("{k:03}.png")), 8, 6, &rgb);
    }
    let mut cfg = config("front", format!("files:{}", dir.path().display()), 8, 6);
    cfg.crop = Some(Roi {
        x: 0,
        y: 0,
        w: 4,
        h: 3,
    });
    cfg.resize = Some([2, 2]);
    cfg.validate("cameras[0]").unwrap();
    assert_eq!(
        cfg.spec(),
        CameraSpec {
            name: "front".into(),
            width: 2,
            height: 2,
            intrinsics: None,
            mount: None,
        }
    );
    let epoch = Instant::now();
    let mut cap = Capture::spawn(&cfg, cfg.open().unwrap(), epoch).unwrap();
    wait_for(&mut cap, epoch, "nine frames", |c| c.stats().frames >= 9);
    let f = cap.latest(epoch.elapsed()).unwrap();
    assert_eq!(
        (f.image.width, f.image.height, f.image.camera.as_str()),
        (2, 2, "front")
    );
    let first = [f.image.data[0], f.image.data[1], f.image.data[2]];
    assert!(colours.contains(&first), "{first:?}");
    assert!(
        f.image.data.chunks(3).all(|p| p == first),
        "the crop is one colour"
    );
    assert!(f.captured <= epoch.elapsed());
    let captured = f.captured;
    // What the arm stamps the observation's image with (its age: now less this).
    assert_eq!(cap.captured(), Some(captured));
    let s = cap.stats();
    assert_eq!(s.errors, 0, "{s:?}");
    assert!(s.used >= 1 && s.used + s.skipped <= s.frames, "{s:?}");
    assert!(!cap.is_stale(epoch.elapsed()));
}

/// A camera that delivers `good` RGB frames, then stops (each further call waits 10 ms and
/// reports nothing new).
struct Stops {
    good: u32,
    sent: u32,
}

impl FrameSource for Stops {
    fn describe(&self) -> String {
        "a camera that stops".into()
    }
    fn format(&self) -> (PixelFormat, u32, u32) {
        (PixelFormat::Rgb8, 2, 2)
    }
    fn next_frame(&mut self, buf: &mut Vec<u8>) -> Result<(), CameraError> {
        if self.sent == self.good {
            std::thread::sleep(Duration::from_millis(10));
            return Err(CameraError::Frame("no frame within 10 ms".into()));
        }
        self.sent += 1;
        buf.clear();
        buf.extend_from_slice(&[self.sent as u8; 12]);
        Ok(())
    }
}

#[test]
fn a_camera_that_stops_goes_stale_after_its_timeout_and_counts_the_failures() {
    let mut cfg = config("wrist", "test".into(), 2, 2);
    cfg.timeout_ms = 50.0;
    let epoch = Instant::now();
    let mut cap = Capture::spawn(&cfg, Box::new(Stops { good: 3, sent: 0 }), epoch).unwrap();
    assert!(cap.is_stale(epoch.elapsed()), "no frame yet: stale");
    wait_for(&mut cap, epoch, "the three frames", |c| {
        c.stats().frames == 3
    });
    let last = cap.latest(epoch.elapsed()).unwrap().captured;
    wait_for(&mut cap, epoch, "a failure", |c| c.stats().errors > 0);
    let now = last + Duration::from_millis(51);
    assert!(cap.is_stale(now));
    assert!(!cap.is_stale(last + Duration::from_millis(49)));
    let s = cap.stats();
    assert_eq!(s.frames, 3);
    assert!(s.last_error.contains("no frame"), "{s:?}");
}

#[test]
fn bad_camera_tables_are_refused_naming_the_key() {
    let ok = config("front", "/dev/video0".into(), 640, 480);
    ok.validate("cameras[0]").unwrap();
    let mut c = ok.clone();
    c.crop = Some(Roi {
        x: 600,
        y: 0,
        w: 100,
        h: 100,
    });
    let e = c.validate("cameras[0]").unwrap_err();
    assert_eq!(e.key, "cameras[0].crop");
    let mut c = ok.clone();
    c.fps = 0.0;
    assert_eq!(c.validate("cameras[0]").unwrap_err().key, "cameras[0].fps");
    let mut c = ok.clone();
    c.name = "front camera".into();
    assert_eq!(c.validate("cameras[0]").unwrap_err().key, "cameras[0].name");
    let e = validate_cameras(&[ok.clone(), ok.clone()], "cameras").unwrap_err();
    assert_eq!(e.key, "cameras[1].name");
    let e = toml::from_str::<CameraConfig>(
        "name = \"a\"\ndevice = \"/dev/video0\"\nwidth = 640\nheight = 480\nfps = 30\nexposure = 3\n",
    )
    .unwrap_err();
    assert!(e.to_string().contains("exposure"), "{e}");
}

#[test]
fn a_file_camera_that_cannot_be_used_says_which_folder_and_why() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config("front", format!("files:{}", dir.path().display()), 8, 6);
    let e = cfg.open().err().unwrap().to_string();
    assert!(
        e.contains(&dir.path().display().to_string()) && e.contains("no .png"),
        "{e}"
    );
    write_png(&dir.path().join("a.png"), 4, 4, &[0; 48]);
    let e = cfg.open().err().unwrap().to_string();
    assert!(e.contains("4x4") && e.contains("width = 8"), "{e}");
    write_png(&dir.path().join("b.png"), 8, 6, &[0; 144]);
    let e = cfg.open().err().unwrap().to_string();
    assert!(e.contains("b.png") && e.contains("share one size"), "{e}");
    let v4l2 = config("front", "/dev/video0".into(), 8, 6);
    let e = v4l2.open().err().unwrap().to_string();
    // No camera on this machine: V4L2 says so, naming the device and where to look.
    assert!(
        e.contains("/dev/video0") && e.contains("reflex hw cameras"),
        "{e}"
    );
}

#[test]
fn jpeg_frames_from_a_folder_go_through_the_mjpeg_decoder() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixture("frame.jpg"), dir.path().join("0001.jpg")).unwrap();
    std::fs::copy(fixture("frame_no_dht.jpg"), dir.path().join("0002.jpg")).unwrap();
    let cfg = config("front", format!("files:{}", dir.path().display()), 64, 48);
    let src = cfg.open().unwrap();
    assert_eq!(src.format(), (PixelFormat::Mjpeg, 64, 48));
    let epoch = Instant::now();
    let mut cap = Capture::spawn(&cfg, src, epoch).unwrap();
    wait_for(&mut cap, epoch, "four frames", |c| c.stats().frames >= 4);
    let reference = png_rgb(&fixture("frame_decoded_by_pillow.png"));
    let f = cap.latest(epoch.elapsed()).unwrap();
    let worst = f
        .image
        .data
        .iter()
        .zip(&reference)
        .map(|(a, b)| (*a as i32 - *b as i32).abs())
        .max()
        .unwrap();
    assert!(worst <= 4, "{worst}");
    assert_eq!(cap.stats().errors, 0);
}

#[test]
fn the_camera_table_in_docs_hardware_md_loads_and_validates() {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/hardware.md"),
    )
    .unwrap();
    let at = doc
        .find("## Cameras on the arm")
        .expect("the cameras section");
    let block = doc[at..].split("```toml\n").nth(1).unwrap();
    let block = &block[..block.find("```").unwrap()];
    #[derive(serde::Deserialize)]
    struct Arm {
        cameras: Vec<CameraConfig>,
    }
    #[derive(serde::Deserialize)]
    struct Doc {
        arm: Arm,
    }
    let d: Doc = toml::from_str(block).unwrap_or_else(|e| panic!("{e}\n{block}"));
    validate_cameras(&d.arm.cameras, "arm.cameras").unwrap();
    assert_eq!(d.arm.cameras[0].output_size(), (128, 128));
}

#[test]
fn a_watched_folder_plays_its_frames_once_then_new_ones_and_goes_stale_without_them() {
    let dir = tempfile::tempdir().unwrap();
    let frame = |k: u8| -> Vec<u8> { vec![k * 40; 4 * 2 * 3] };
    for k in 0..2u8 {
        write_png(&dir.path().join(format!("{k:03}.png")), 4, 2, &frame(k));
    }
    let mut cfg = config("front", format!("files:{}", dir.path().display()), 4, 2);
    cfg.repeat = false;
    cfg.timeout_ms = 50.0;
    let epoch = Instant::now();
    let mut cap = Capture::spawn(&cfg, cfg.open().unwrap(), epoch).unwrap();
    wait_for(&mut cap, epoch, "both frames", |c| c.stats().frames == 2);
    // Played once: it stops, and after a second without a new file it says so.
    wait_for(&mut cap, epoch, "the watch's complaint", |c| {
        c.stats().errors > 0
    });
    assert_eq!(cap.stats().frames, 2);
    assert!(
        cap.stats().last_error.contains("no new image"),
        "{:?}",
        cap.stats()
    );
    assert!(cap.is_stale(epoch.elapsed()));
    // A frame written under another name and renamed in is played.
    let tmp = dir.path().join("002.png.tmp");
    write_png(&tmp, 4, 2, &frame(5));
    std::fs::rename(&tmp, dir.path().join("002.png")).unwrap();
    wait_for(&mut cap, epoch, "the new frame", |c| c.stats().frames == 3);
    let f = cap.latest(epoch.elapsed()).unwrap();
    assert_eq!(f.image.data[0], 200);
}

#[test]
fn a_calibrated_camera_publishes_the_pinhole_of_its_cropped_scaled_undistorted_frames() {
    use reflex_calibration::camera::{CameraModel, UndistortMap};
    use reflex_calibration::hand_eye::{HandEyeFile, Pose, Setup};
    let dir = tempfile::tempdir().unwrap();
    // A lens with barrel distortion at 64x48, written as `reflex calibrate camera` writes it.
    let lens = CameraModel {
        dist: [-0.3, 0.1, 0.0, 0.0, 0.0],
        ..CameraModel::pinhole(64, 48, 40.0, 40.0, 31.5, 23.5)
    };
    let yaml = dir.path().join("front.yaml");
    std::fs::write(&yaml, lens.to_opencv_yaml(Some(0.2))).unwrap();
    let he = dir.path().join("front_hand_eye.json");
    let mount = Pose {
        translation_m: [0.5, 0.0, 0.3],
        rotation_xyzw: [0.0, 0.0, 0.0, 1.0],
    };
    std::fs::write(
        &he,
        serde_json::to_string(&HandEyeFile {
            setup: Setup::EyeToHand,
            parent: "base".into(),
            camera: mount,
            rms_px: 0.1,
        })
        .unwrap(),
    )
    .unwrap();
    // The frames: a grid of bright dots where the distorted lens sees points on a plane.
    let frames = dir.path().join("frames");
    std::fs::create_dir(&frames).unwrap();
    let mut rgb = vec![0u8; 64 * 48 * 3];
    let p = nalgebra::Point3::new(0.25, -0.15, 1.0);
    let px = lens.project(&p).unwrap();
    for dv in -1i32..=1 {
        for du in -1i32..=1 {
            let (u, v) = (
                (px.x.round() as i32 + du) as usize,
                (px.y.round() as i32 + dv) as usize,
            );
            rgb[(v * 64 + u) * 3..(v * 64 + u) * 3 + 3].fill(255);
        }
    }
    write_png(&frames.join("000.png"), 64, 48, &rgb);
    let mut cfg = config("front", format!("files:{}", frames.display()), 64, 48);
    cfg.intrinsics = Some(yaml);
    cfg.hand_eye = Some(he);
    cfg.undistort = true;
    cfg.crop = Some(Roi {
        x: 8,
        y: 0,
        w: 48,
        h: 48,
    });
    cfg.resize = Some([24, 24]);
    cfg.validate("cameras[0]").unwrap();
    let cal = cfg.load_calibration().unwrap();
    let spec = cfg.spec_calibrated(&cal);
    let k = spec.intrinsics.unwrap();
    // fx halves with the resize; cx moves by the crop's 8 px, then scales about pixel edges.
    assert!(
        (k[0] - 20.0).abs() < 1e-9 && (k[1] - 20.0).abs() < 1e-9,
        "{k:?}"
    );
    assert!(
        (k[2] - ((31.5 - 8.0 + 0.5) * 0.5 - 0.5)).abs() < 1e-9,
        "{k:?}"
    );
    assert!((k[3] - ((23.5 + 0.5) * 0.5 - 0.5)).abs() < 1e-9, "{k:?}");
    assert_eq!(spec.mount.as_ref().unwrap().parent, "base");
    // The published pinhole puts the point where the undistorted, cropped, scaled frame shows it.
    let epoch = Instant::now();
    let mut cap = Capture::spawn(&cfg, cfg.open().unwrap(), epoch).unwrap();
    wait_for(&mut cap, epoch, "a frame", |c| c.stats().frames >= 1);
    let f = cap.latest(epoch.elapsed()).unwrap();
    let (mut su, mut sv, mut sw) = (0.0, 0.0, 0.0);
    for v in 0..24 {
        for u in 0..24 {
            let w = f.image.data[(v * 24 + u) * 3] as f64;
            su += w * u as f64;
            sv += w * v as f64;
            sw += w;
        }
    }
    let (eu, ev) = (k[0] * p.x / p.z + k[2], k[1] * p.y / p.z + k[3]);
    assert!(sw > 0.0);
    let (cu, cv) = (su / sw, sv / sw);
    assert!(
        (cu - eu).abs() < 0.75 && (cv - ev).abs() < 0.75,
        "seen ({cu}, {cv}), pinhole says ({eu}, {ev})"
    );
    // Without undistortion the same point sits where the distortion put it: off the pinhole.
    let straight = UndistortMap::new(
        &lens,
        &CameraModel {
            dist: [0.0; 5],
            ..lens
        },
    );
    assert_eq!(straight.size(), (64, 48));
    // Bad files name the file; undistort without a lens is refused naming the key.
    let mut bad = cfg.clone();
    bad.intrinsics = Some(dir.path().join("missing.yaml"));
    let e = bad.load_calibration().unwrap_err().to_string();
    assert!(e.contains("missing.yaml"), "{e}");
    let mut bad = cfg.clone();
    bad.intrinsics = None;
    let e = bad.validate("cameras[0]").unwrap_err();
    assert_eq!(e.key, "cameras[0].undistort", "{e:?}");
}

/// The mean colour of a frame.
fn mean_colour(rgb: &[u8]) -> [f64; 3] {
    let mut m = [0.0; 3];
    for px in rgb.chunks_exact(3) {
        for c in 0..3 {
            m[c] += px[c] as f64;
        }
    }
    m.map(|v| v / (rgb.len() / 3) as f64)
}

fn near(a: [f64; 3], b: [u8; 3]) -> bool {
    (0..3).all(|c| (a[c] - b[c] as f64).abs() < 4.0)
}

#[test]
#[cfg(feature = "video")]
fn an_h264_video_plays_as_a_camera_round_and_round_or_once_then_goes_stale() {
    let dir = tempfile::tempdir().unwrap();
    let colours = [
        [200u8, 40, 40],
        [40, 200, 40],
        [40, 40, 200],
        [120, 120, 120],
    ];
    let frames: Vec<Vec<u8>> = colours.iter().map(|c| c.repeat(32 * 24)).collect();
    let refs: Vec<&[u8]> = frames.iter().map(|f| f.as_slice()).collect();
    let path = dir.path().join("clip.mp4");
    reflex_video::write_video(&path, 32, 24, 20, &refs).unwrap();
    let mut cfg = config("front", format!("files:{}", path.display()), 32, 24);
    let epoch = Instant::now();
    let mut cap = Capture::spawn(&cfg, cfg.open().unwrap(), epoch).unwrap();
    // Round and round: more frames than the file holds, every one of its colours.
    wait_for(&mut cap, epoch, "ten frames", |c| c.stats().frames >= 10);
    let f = cap.latest(epoch.elapsed()).unwrap();
    let m = mean_colour(&f.image.data);
    assert!(colours.iter().any(|c| near(m, *c)), "{m:?}");
    assert_eq!(cap.stats().errors, 0, "{:?}", cap.stats());
    drop(cap);
    // Once: its four frames, then it says it has played out and the camera goes stale.
    cfg.repeat = false;
    cfg.timeout_ms = 50.0;
    let mut cap = Capture::spawn(&cfg, cfg.open().unwrap(), epoch).unwrap();
    wait_for(&mut cap, epoch, "played out", |c| {
        c.stats().errors >= 1 && c.is_stale(epoch.elapsed())
    });
    assert_eq!(cap.stats().frames, 4, "{:?}", cap.stats());
    // A size other than the config's is refused, naming both.
    let small = config("front", format!("files:{}", path.display()), 64, 48);
    let e = small.open().err().unwrap().to_string();
    assert!(e.contains("32x24") && e.contains("width = 64"), "{e}");
    // A file of another kind is named with the kinds there are.
    let txt = dir.path().join("notes.txt");
    std::fs::write(&txt, "x").unwrap();
    let e = config("front", format!("files:{}", txt.display()), 32, 24)
        .open()
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("notes.txt") && e.contains(".mp4") && e.contains(".msgpack"),
        "{e}"
    );
}

#[test]
#[cfg(feature = "video")]
fn lerobots_av1_video_plays_as_a_camera() {
    // A video as LeRobot writes its datasets' by default (FFmpeg's libsvtav1; reflex-video's
    // fixture): its ten frames, once, then stale.
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../video/fixtures/scene_svtav1.mp4");
    let mut cfg = config("front", format!("files:{}", path.display()), 64, 48);
    cfg.repeat = false;
    cfg.timeout_ms = 50.0;
    let epoch = Instant::now();
    let mut cap = Capture::spawn(&cfg, cfg.open().unwrap(), epoch).unwrap();
    wait_for(&mut cap, epoch, "played out", |c| {
        c.stats().errors >= 1 && c.is_stale(epoch.elapsed())
    });
    assert_eq!(cap.stats().frames, 10, "{:?}", cap.stats());
}

#[test]
fn a_recorded_episodes_camera_frames_play_as_a_camera() {
    // An episode file as reflex writes it (MessagePack, named fields; fields a camera does not
    // need are skipped).
    #[derive(serde::Serialize)]
    struct Stream {
        camera: &'static str,
        width: u32,
        height: u32,
        encoding: &'static str,
        frames: Vec<serde_bytes::ByteBuf>,
    }
    #[derive(serde::Serialize)]
    struct Ep {
        observations: Vec<Vec<f32>>,
        cameras: Vec<Stream>,
    }
    let stream = |camera, c: [u8; 3]| Stream {
        camera,
        width: 8,
        height: 6,
        encoding: "rgb8",
        frames: (0..3u8)
            .map(|k| serde_bytes::ByteBuf::from(c.map(|v| v + 10 * k).repeat(48)))
            .collect(),
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("episode_000000.msgpack");
    let ep = Ep {
        observations: vec![vec![0.0]; 3],
        cameras: vec![stream("front", [100, 0, 0]), stream("wrist", [0, 100, 0])],
    };
    std::fs::write(&path, rmp_serde::to_vec_named(&ep).unwrap()).unwrap();
    // The camera of the config's name, or another one after `#`.
    for (name, device, first) in [
        ("front", format!("files:{}", path.display()), 100u8),
        ("side", format!("files:{}#wrist", path.display()), 0),
    ] {
        let cfg = config(name, device, 8, 6);
        let mut src = cfg.open().unwrap();
        let mut buf = vec![];
        src.next_frame(&mut buf).unwrap();
        assert_eq!((buf.len(), buf[0]), (144, first), "{name}");
        src.next_frame(&mut buf).unwrap();
        assert_eq!(buf[0], first + 10, "{name}");
    }
    let e = config("top", format!("files:{}", path.display()), 8, 6)
        .open()
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("`top`") && e.contains("front") && e.contains("#NAME"),
        "{e}"
    );
}
