//! Round trips through the encoder and decoder, and the errors a user meets.

use super::*;

/// `n` frames of a scene a camera could see: smooth shading, a sharp-edged square moving two
/// pixels a frame, flat areas.
fn scene(w: u32, h: u32, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|k| {
            let mut f = vec![0u8; (w * h * 3) as usize];
            for y in 0..h as usize {
                for x in 0..w as usize {
                    let i = (y * w as usize + x) * 3;
                    let inside = (x as isize - 8 - 2 * k as isize).abs() < 6
                        && (y as isize - h as isize / 2).abs() < 6;
                    let (r, g, b) = if inside {
                        (220, 40, 30)
                    } else {
                        (
                            60 + (x * 100 / w as usize) as u8,
                            90 + (y * 80 / h as usize) as u8,
                            120,
                        )
                    };
                    f[i..i + 3].copy_from_slice(&[r, g, b]);
                }
            }
            f
        })
        .collect()
}

fn mean_abs(a: &[u8], b: &[u8]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).abs())
        .sum::<f64>()
        / a.len() as f64
}

#[test]
fn frames_come_back_close_to_what_went_in_at_their_times() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("front.mp4");
    let (w, h, fps) = (64, 48, 20);
    let frames = scene(w, h, 25);
    let refs: Vec<&[u8]> = frames.iter().map(|f| f.as_slice()).collect();
    let s = write_video(&path, w, h, fps, &refs).unwrap();
    assert_eq!(s.frames, 25);
    assert_eq!(s.bytes, std::fs::metadata(&path).unwrap().len());
    let mut r = VideoReader::open(&path).unwrap();
    assert_eq!((r.size(), r.frames()), ((w, h), 25));
    assert!((r.fps() - 20.0).abs() < 1e-9, "{}", r.fps());
    let mut rgb = vec![0; (w * h * 3) as usize];
    for (k, f) in frames.iter().enumerate() {
        let t = r.next_frame(&mut rgb).unwrap().expect("a frame");
        assert_eq!(t, k as f64 / fps as f64);
        let e = mean_abs(&rgb, f);
        assert!(e < 3.0, "frame {k}: mean error {e} levels");
    }
    assert_eq!(r.next_frame(&mut rgb).unwrap(), None);
    // From the start again: the same first picture.
    r.rewind().unwrap();
    let mut again = vec![0; rgb.len()];
    assert_eq!(r.next_frame(&mut again).unwrap(), Some(0.0));
    assert!(mean_abs(&again, &frames[0]) < 3.0);
}

#[test]
fn grey_levels_keep_their_value_through_the_colour_conversion() {
    // Limited-range BT.601 both ways: greys (and the extremes) come back within a level.
    let mut yuv = Yuv420::new(2, 2);
    for level in [0u8, 1, 16, 100, 128, 200, 254, 255] {
        yuv.set_rgb(&[level; 12]);
        let l = 1.164_383 * (yuv.y[0] as f32 - 16.0);
        let back = l.round().clamp(0.0, 255.0) as i32;
        assert!((back - level as i32).abs() <= 1, "{level} -> {back}");
        assert_eq!((yuv.u[0], yuv.v[0]), (128, 128), "{level}");
    }
}

#[test]
fn bad_sizes_frames_and_files_are_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("odd.mp4");
    let e = VideoWriter::create(&path, 63, 48, 20, 2)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("odd.mp4") && e.contains("even"), "{e}");
    let e = VideoWriter::create(&path, 64, 48, 0, 2)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("frames a second"), "{e}");
    let mut w = VideoWriter::create(&path, 64, 48, 20, 2).unwrap();
    let e = w.push(&[0; 10]).unwrap_err().to_string();
    assert!(e.contains("frame 0 holds 10 bytes"), "{e}");
    // Nothing finished, nothing under either name.
    w.push(&vec![7; 64 * 48 * 3]).unwrap();
    drop(w);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    let e = VideoWriter::create(&path, 64, 48, 20, 2)
        .unwrap()
        .finish()
        .unwrap_err()
        .to_string();
    assert!(e.contains("no frames"), "{e}");
    // Not a video at all.
    let junk = dir.path().join("junk.mp4");
    std::fs::write(&junk, b"not a video").unwrap();
    let e = VideoReader::open(&junk).unwrap_err().to_string();
    assert!(e.contains("junk.mp4") && e.contains("MP4"), "{e}");
    let e = VideoReader::open(&dir.path().join("missing.mp4"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing.mp4"), "{e}");
}

#[test]
fn a_cut_off_sample_is_an_error_not_a_panic() {
    let mut out = vec![];
    assert!(to_annex_b(&[0, 0, 0, 9, 1, 2], 4, &mut out).is_err());
    assert!(to_annex_b(&[0, 0], 4, &mut out).is_err());
    out.clear();
    to_annex_b(&[0, 0, 0, 2, 0x65, 7, 0, 0, 0, 1, 0x41], 4, &mut out).unwrap();
    assert_eq!(out, [0, 0, 0, 1, 0x65, 7, 0, 0, 0, 1, 0x41]);
}

/// Videos as LeRobot's encoders write them (fixtures/make_fixtures.py, FFmpeg's encoders:
/// libsvtav1, LeRobot's default, and libaom-av1; libx264, LeRobot's `vcodec="h264"`, whose
/// B-frames arrive out of presentation order; `yuv420p`, crf 30): ten frames of
/// `scene(64, 48, 10)` at 20 fps come back in order at their times, close to the pictures
/// encoded, and again after a rewind.
#[test]
fn lerobots_av1_and_h264_videos_decode_to_their_frames_at_their_times() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let frames = scene(64, 48, 10);
    for (name, codec) in [
        ("scene_svtav1.mp4", "av1"),
        ("scene_aom.mp4", "av1"),
        ("scene_x264.mp4", "h264"),
        ("scene_x264_bframes.mp4", "h264"),
    ] {
        let mut r = VideoReader::open(&fixtures.join(name)).unwrap();
        assert_eq!((r.codec(), r.size(), r.frames()), (codec, (64, 48), 10));
        assert!((r.fps() - 20.0).abs() < 1e-9, "{name}: {}", r.fps());
        let mut rgb = vec![0; 64 * 48 * 3];
        let mut worst: f64 = 0.0;
        for (k, f) in frames.iter().enumerate() {
            let t = r.next_frame(&mut rgb).unwrap().expect("a frame");
            assert!(
                (t - k as f64 / 20.0).abs() < 1e-9,
                "{name}: frame {k} at {t}"
            );
            worst = worst.max(mean_abs(&rgb, f));
        }
        // crf 30 on a 64x48 picture: a few levels of mean error, against about 120 levels
        // between the scene and a black frame.
        assert!(
            worst < 6.0,
            "{name}: worst frame's mean error {worst} levels"
        );
        assert_eq!(r.next_frame(&mut rgb).unwrap(), None, "{name}");
        r.rewind().unwrap();
        assert_eq!(r.next_frame(&mut rgb).unwrap(), Some(0.0));
        assert!(mean_abs(&rgb, &frames[0]) < 6.0);
        eprintln!("{name}: worst frame {worst:.2} levels of mean error");
    }
}

#[test]
fn a_cut_off_av1_file_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let whole =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/scene_svtav1.mp4"))
            .unwrap();
    let cut = dir.path().join("cut.mp4");
    // The header (at the end of FFmpeg's files: moov after mdat) kept, part of the frames lost.
    let mut bytes = whole.clone();
    bytes.drain(100..400);
    std::fs::write(&cut, &bytes).unwrap();
    let outcome = VideoReader::open(&cut).and_then(|mut r| {
        let mut rgb = vec![0; 64 * 48 * 3];
        while r.next_frame(&mut rgb)?.is_some() {}
        Ok(())
    });
    let e = outcome.unwrap_err().to_string();
    assert!(e.contains("cut.mp4"), "{e}");
}
