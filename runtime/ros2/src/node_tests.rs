//! The node on a real Zenoh session, hermetic: each session listens or connects on a Unix
//! socket of the test's own (no ports, no scouting). Times are the loop's, synthetic: nothing
//! here depends on how fast the machine is.

use super::*;
use reflex_contracts::msg::{ActionKind, CameraSpec, Image};
use reflex_runtime::outbox::{Frames, Held};
use std::path::PathBuf;

/// A Unix socket path for one test, removed when dropped.
struct Sock(PathBuf);

impl Sock {
    fn new(name: &str) -> Self {
        let p =
            std::env::temp_dir().join(format!("reflex-ros2-{}-{name}.sock", std::process::id()));
        let _ = std::fs::remove_file(&p);
        Sock(p)
    }

    fn endpoint(&self) -> String {
        format!("unixsock-stream/{}", self.0.display())
    }
}

impl Drop for Sock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn session(listen: &[String], connect: &[String]) -> zenoh::Session {
    reflex_bus::BusConfig::hermetic(listen.to_vec(), connect.to_vec())
        .open()
        .expect("a hermetic Zenoh session")
}

/// A two-joint arm at 20 Hz with one 4x2 camera, and no action ROS 2 could drive.
fn arm() -> RobotSpec {
    let mut s = RobotSpec::new("arm", "test/arm", 20.0)
        .with_state("joint_pos", 2, "rad")
        .with_action(ActionKind::Box, &["a", "b"], -1.0, 1.0);
    s.joints = vec!["a".into(), "b".into()];
    s.cameras = vec![CameraSpec {
        name: "front".into(),
        width: 4,
        height: 2,
        intrinsics: None,
        mount: None,
    }];
    s
}

/// An image whose first 8 bytes say which tick it is from.
fn image(k: u64) -> Image {
    let mut data = vec![0u8; 4 * 2 * 3];
    data[..8].copy_from_slice(&k.to_le_bytes());
    Image {
        camera: "front".into(),
        width: 4,
        height: 2,
        encoding: "rgb8".into(),
        data,
        seq: k + 1,
        age_ns: 0,
    }
}

/// Waits for `what` for up to 20 s (an event, not a time: the loop ends as soon as it holds).
fn wait_for(what: &str, ok: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !ok() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "never happened: {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A reproducible jitter in `[-amp, amp]` ms.
fn jitter_ms(seed: &mut u64, amp: f64) -> f64 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((*seed >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * amp
}

#[test]
fn images_go_out_at_image_hz_on_the_loops_clock_from_steps_and_from_held_ticks() {
    // The issue: `image_hz = 10` gave 7.7 Hz from a 20 Hz robot (frames 50 ms +- jitter apart
    // through a `t - last < period` gate), and no images at all while the e-stop held it.
    let sock = Sock::new("images");
    let s = session(&[sock.endpoint()], &[]);
    let spec = arm();
    let keys = Keys::new("arm").unwrap();
    let (_node, mut topics) = start(
        &s,
        &Ros2Config::for_robot("arm"),
        &spec,
        &keys,
        StopSwitch::new(),
    )
    .unwrap();
    let counters = topics.counters();
    // What a subscriber receives: the tick each image came from, read from its pixels (the
    // last 24 bytes of a `sensor_msgs/Image` are its data).
    let got = Arc::new(Mutex::new(Vec::<u64>::new()));
    let g = got.clone();
    let _sub = s
        .declare_subscriber(wire::data_key(0, "/arm/front/image_raw", &msgs::IMAGE))
        .callback(move |x| {
            let b = x.payload().to_bytes();
            let k = u64::from_le_bytes(b[b.len() - 24..b.len() - 16].try_into().unwrap());
            g.lock().unwrap().push(k);
        })
        .wait()
        .unwrap();
    // 20 s of steps at 20 Hz with 4 ms of jitter, then 10 s held by the e-stop.
    let mut seed = 3;
    let t_ms: Vec<f64> = (0..600)
        .map(|k| 1000.0 + 50.0 * k as f64 + jitter_ms(&mut seed, 4.0))
        .collect();
    let at = |k: usize| Duration::from_secs_f64(t_ms[k] / 1e3);
    for k in 0..400 {
        topics.offer_frames(&Frames {
            episode: 1,
            step: k as u32,
            t: at(k),
            images: vec![image(k as u64)],
        });
    }
    for k in 400..600 {
        topics.offer_held(&Held {
            t: at(k),
            state: vec![0.1, -0.2],
            images: vec![image(k as u64)],
            fresh_images: true,
        });
    }
    let sent = counters.images.load(Ordering::Relaxed) as usize;
    wait_for("every image published reaches the subscriber", || {
        got.lock().unwrap().len() >= sent
    });
    let got = got.lock().unwrap().clone();
    let from_steps = got.iter().filter(|k| **k < 400).count();
    let held = got.len() - from_steps;
    assert_eq!(
        (from_steps, held),
        (200, 100),
        "20 s of steps and 10 s held at 10 Hz"
    );
    assert_eq!(counters.held_images.load(Ordering::Relaxed), 100);
    assert_eq!(
        counters.held_states.load(Ordering::Relaxed),
        200,
        "joint states of every held tick (20 Hz under a 50 Hz cap)"
    );
    // Measured in the loop's time: any 10 images in a row span 0.9 s to within one control
    // period (50 ms), across the stop too, and so do all 300.
    let ts: Vec<f64> = got.iter().map(|&k| t_ms[k as usize]).collect();
    for w in ts.windows(10).chain([&ts[..]]) {
        let span = w[w.len() - 1] - w[0];
        let want = 100.0 * (w.len() - 1) as f64;
        assert!(
            (span - want).abs() <= 50.0,
            "{} images span {span:.1} ms, not {want} ms",
            w.len()
        );
    }
    // A held tick that carries no new images sends none, however due.
    let before = counters.images.load(Ordering::Relaxed);
    topics.offer_held(&Held {
        t: Duration::from_secs(100),
        state: vec![0.1, -0.2],
        images: vec![image(0)],
        fresh_images: false,
    });
    assert_eq!(counters.images.load(Ordering::Relaxed), before);
}

#[test]
fn a_ros_2_e_stop_repeated_while_latched_is_counted_not_warned_again() {
    // An e-stop node may publish `true` over and over: the first latches and is warned; the
    // rest find it latched, still raise (a release answering an older raise must fail), and
    // are counted.
    let sock = Sock::new("estop");
    let robot = session(&[sock.endpoint()], &[]);
    let peer = session(&[], &[sock.endpoint()]);
    let stop = StopSwitch::new();
    let (node, _topics) = start(
        &robot,
        &Ros2Config::for_robot("arm"),
        &arm(),
        &Keys::new("arm").unwrap(),
        stop.clone(),
    )
    .unwrap();
    let key = wire::data_key(0, "/arm/estop", &msgs::BOOL);
    let p = peer.declare_publisher(key.clone()).wait().unwrap();
    wait_for("the peer sees reflex's e-stop subscription", || {
        p.matching_status().wait().is_ok_and(|m| m.matching())
    });
    let mut w = cdr::Writer::new();
    msgs::write_bool(&mut w, true);
    for seq in 1..=5 {
        let att = wire::Attachment {
            seq,
            source_ns: msgs::unix_ns(),
            gid: [7; 16],
        };
        p.put(w.bytes()).attachment(att.encode()).wait().unwrap();
    }
    let c = &node.counters;
    wait_for("five e-stops taken", || {
        c.estops.load(Ordering::Relaxed) == 5
    });
    assert_eq!(
        c.estop_repeats.load(Ordering::Relaxed),
        4,
        "the first latched (warned), four found it latched (counted)"
    );
    assert_eq!(stop.state(), StopState::Latched);
    assert_eq!(stop.raises(), 5, "every `true` still raises");
    assert!(node.rejects.iter().all(|r| r.count() == 0));
}
