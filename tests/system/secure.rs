//! The bus over TLS with mutual authentication and access control by certificate (issue "Flash
//! onto a robot"): certificates from `reflex keys init`, a robot that listens only on TLS, and
//! peers that may each do only what their role allows.

use crate::common::{reflex, run_ok};
use reflex_bus::BusConfig;
use reflex_bus::secure::{Access, TlsFiles, init_keys, valid_for_days};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use zenoh::Wait;

/// Opens `cfg` listening on a TLS port on 127.0.0.1 and returns the session and the endpoint.
/// Zenoh does not report a port it chose itself (that API is unstable), so a port the OS reports
/// free is bound; if another process takes it in between, the bind fails and another port is
/// tried, so two tests never share a listener.
fn open_listening_on_a_fresh_tls_port(mut cfg: BusConfig) -> (zenoh::Session, String) {
    let mut last = String::new();
    for _ in 0..5 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let ep = format!("tls/127.0.0.1:{port}");
        cfg.listen = vec![ep.clone()];
        match cfg.open() {
            Ok(s) => return (s, ep),
            Err(e) => last = e.to_string(),
        }
    }
    panic!("no TLS port could be bound in five tries: {last}");
}

/// The endpoint a child process's Zenoh session listens on (it was given port 0), read from the
/// line Zenoh logs once its listeners are bound (`Zenoh can be reached at: <locator>`; the child
/// runs with [`LOG_BOUND_ENDPOINTS`]). Waits for the line; fails with the child's stderr if the
/// child exits first.
fn bound_endpoint(
    child: &mut crate::common::ChildGuard,
    dir: &tempfile::TempDir,
    name: &str,
    protocol: &str,
) -> String {
    let marker = "Zenoh can be reached at: ";
    let mut found = None;
    crate::common::wait_until(&format!("{name} reporting its bound endpoint"), 60, || {
        let err = crate::common::child_stderr(dir, name);
        found = err.lines().find_map(|l| {
            let at = l.find(marker)?;
            let ep = l[at + marker.len()..].split_whitespace().next()?;
            ep.starts_with(&format!("{protocol}/"))
                .then(|| ep.to_string())
        });
        assert!(
            found.is_some() || child.0.try_wait().unwrap().is_none(),
            "{name} exited before listening:\n{err}"
        );
        found.is_some()
    });
    found.unwrap()
}

/// A log filter for a child: reflex's default, plus the Zenoh line naming its bound endpoints.
const LOG_BOUND_ENDPOINTS: &str =
    "info,zenoh=warn,zenoh_transport=warn,ort=warn,zenoh::net::runtime::orchestrator=info";

fn bus(listen: &[String], connect: &[String], tls: Option<TlsFiles>) -> BusConfig {
    BusConfig {
        listen: listen.to_vec(),
        connect: connect.to_vec(),
        multicast_scouting: false,
        tls,
        ..Default::default()
    }
}

#[test]
fn over_tls_only_certified_peers_get_in_and_each_does_only_what_its_role_allows() {
    let dir = tempfile::tempdir().unwrap();
    let names: Vec<String> = ["robot", "learner", "teleop", "viewer", "expired"]
        .map(String::from)
        .to_vec();
    init_keys(dir.path(), "arm", &names, &[], &|n| {
        if n == "expired" {
            let now = time::OffsetDateTime::now_utc();
            (
                now - time::Duration::days(30),
                now - time::Duration::days(1),
            )
        } else {
            valid_for_days(30)
        }
    })
    .unwrap();
    let mut robot_cfg = bus(&[], &[], Some(TlsFiles::in_dir(dir.path(), "robot")));
    robot_cfg.access = Some((
        "arm".into(),
        Access {
            learners: vec!["learner".into()],
            teleops: vec!["teleop".into()],
            viewers: vec!["viewer".into()],
            // The robot is also the ROS 2 node `/arm` on domain 0 (docs/ros2.md).
            ros2: Some((0, "0/arm".into())),
        },
    ));
    let (robot, ep) = open_listening_on_a_fresh_tls_port(robot_cfg);
    // What reached the robot: (key, sender named in the payload).
    let got: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let (ros_estop, ros_twist) = (
        "0/arm/estop/std_msgs::msg::dds_::Bool_/RIHS01_x",
        "0/arm/servo/twist/geometry_msgs::msg::dds_::TwistStamped_/RIHS01_x",
    );
    let keys = [
        "teleop",
        "learn/weights",
        "events",
        "operator",
        "cmd",
        ros_estop,
        ros_twist,
    ];
    let full = |k: &str| {
        if k.starts_with("0/") {
            k.to_string()
        } else {
            format!("reflex/arm/{k}")
        }
    };
    let _subs: Vec<_> = keys
        .iter()
        .map(|k| {
            let (g, k2) = (got.clone(), k.to_string());
            robot
                .declare_subscriber(full(k))
                .callback(move |s| {
                    let who = String::from_utf8_lossy(&s.payload().to_bytes()).to_string();
                    g.lock().unwrap().push((k2.clone(), who));
                })
                .wait()
                .unwrap()
        })
        .collect();
    let peer = |name: &str| {
        bus(
            &[],
            std::slice::from_ref(&ep),
            Some(TlsFiles::in_dir(dir.path(), name)),
        )
        .open()
        .unwrap()
    };
    let (learner, teleop, viewer, expired) = (
        peer("learner"),
        peer("teleop"),
        peer("viewer"),
        peer("expired"),
    );
    // A peer with the authority's certificate but none of its own: mutual TLS turns it away.
    let mut anon = zenoh::Config::default();
    for (k, v) in [
        ("mode", "\"peer\"".to_string()),
        ("connect/endpoints", format!("[\"{ep}\"]")),
        ("scouting/multicast/enabled", "false".into()),
        (
            "transport/link/tls/root_ca_certificate",
            format!("{:?}", dir.path().join("ca.pem").display().to_string()),
        ),
    ] {
        anon.insert_json5(k, &v).unwrap();
    }
    let anon = zenoh::open(anon).wait().unwrap();
    // The robot's status reaches an authenticated viewer.
    let seen = Arc::new(Mutex::new(0u32));
    let s2 = seen.clone();
    let _watch = viewer
        .declare_subscriber("reflex/arm/status")
        .callback(move |_| *s2.lock().unwrap() += 1)
        .wait()
        .unwrap();
    // Every peer puts on every key, round after round, until everything the rules allow has
    // arrived and the viewer has seen a status (the links are up and the rules in force); then
    // one more round, closed when its teleop message arrives, so the refused peers had as long as
    // the allowed ones to get through.
    let round = || {
        for (s, who) in [
            (&learner, "learner"),
            (&teleop, "teleop"),
            (&viewer, "viewer"),
            (&expired, "expired"),
            (&anon, "anonymous"),
        ] {
            for k in keys {
                s.put(full(k), who).wait().unwrap();
            }
        }
        robot.put("reflex/arm/status", "ok").wait().unwrap();
    };
    let allowed = [
        ("teleop", "teleop"),
        ("learn/weights", "learner"),
        ("events", "learner"),
        ("events", "teleop"),
        ("events", "viewer"),
        ("operator", "teleop"),
        (ros_estop, "learner"),
        (ros_estop, "teleop"),
        (ros_estop, "viewer"),
        (ros_twist, "teleop"),
    ];
    let has = |k: &str, who: &str| got.lock().unwrap().iter().any(|(a, b)| a == k && b == who);
    crate::common::wait_until(
        "every allowed message and a status at the viewer",
        60,
        || {
            round();
            allowed.iter().all(|(k, w)| has(k, w)) && *seen.lock().unwrap() > 0
        },
    );
    let teleops = |g: &Mutex<Vec<(String, String)>>| {
        g.lock()
            .unwrap()
            .iter()
            .filter(|(k, w)| k == "teleop" && w == "teleop")
            .count()
    };
    let before = teleops(&got);
    round();
    crate::common::wait_until("the last round's teleop message", 20, || {
        teleops(&got) > before
    });
    let got = got.lock().unwrap().clone();
    let from = |k: &str| {
        let mut v: Vec<String> = got
            .iter()
            .filter(|(key, _)| key == k)
            .map(|(_, w)| w.clone())
            .collect();
        v.sort();
        v.dedup();
        v
    };
    eprintln!(
        "received: teleop {:?} weights {:?} events {:?} cmd {:?}",
        from("teleop"),
        from("learn/weights"),
        from("events"),
        from("cmd")
    );
    assert_eq!(
        from("teleop"),
        ["teleop"],
        "only the teleop device takes over"
    );
    assert_eq!(
        from("learn/weights"),
        ["learner"],
        "only the learner publishes weights"
    );
    assert_eq!(
        from("events"),
        ["learner", "teleop", "viewer"],
        "every authenticated operator may raise an e-stop; the expired and the anonymous peer are not in"
    );
    assert_eq!(
        from(ros_estop),
        ["learner", "teleop", "viewer"],
        "so may they from ROS 2"
    );
    assert_eq!(
        from(ros_twist),
        ["teleop"],
        "only the teleop device drives the arm with a ROS 2 twist"
    );
    assert_eq!(
        from("operator"),
        ["teleop"],
        "only a teleop peer releases or resumes an e-stop: a viewer can stop the robot, never start it again"
    );
    assert!(
        from("cmd").is_empty(),
        "nobody drives the robot's command key"
    );
    assert!(*seen.lock().unwrap() > 0, "the viewer watches the robot");
}

#[test]
fn a_key_readable_by_others_and_plain_endpoints_beside_tls_are_refused_with_the_fix() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    init_keys(dir.path(), "arm", &["robot".to_string()], &[], &|_| {
        valid_for_days(1)
    })
    .unwrap();
    let key = dir.path().join("robot.key");
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = bus(
        &["tls/127.0.0.1:0".into()],
        &[],
        Some(TlsFiles::in_dir(dir.path(), "robot")),
    )
    .open()
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("chmod 600") && e.contains("robot.key"), "{e}");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let e = bus(
        &["tls/127.0.0.1:0".into(), "tcp/127.0.0.1:0".into()],
        &[],
        Some(TlsFiles::in_dir(dir.path(), "robot")),
    )
    .open()
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("not TLS"), "{e}");
    // Keys are made once per robot: a second init does not overwrite them.
    let out = reflex()
        .args(["keys", "init", "--robot", "arm", "--peer", "robot", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("exists"));
}

/// `reflex run` on the simulator behind TLS and access rules, and `reflex teleop` from a recorded
/// gamepad with the certificate `name`: how many steps the person drove.
fn teleop_steps_with_certificate(name: &str) -> u64 {
    use crate::common::{child_stderr, spawn};
    use reflex_hardware::devices::input_event;
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    run_ok(
        reflex()
            .args([
                "keys", "init", "--robot", "sim", "--peer", "robot", "--peer", "teleop",
            ])
            .args(["--peer", "viewer", "--dir"])
            .arg(&keys),
    );
    let mut text =
        std::fs::read_to_string(crate::common::repo().join("configs/run/sim-pick-expert.toml"))
            .unwrap();
    text = text
        .replace("kind = \"expert\"", "kind = \"none\"")
        .replace("clock = \"sim\"", "clock = \"wall\"");
    text.push_str(
        "\n[bus]\nenabled = true\nno_multicast = true\nlisten = [\"tls/127.0.0.1:0\"]\ntls = { dir = \"keys\", name = \"robot\" }\n\n[bus.access]\nteleops = [\"teleop\"]\nviewers = [\"viewer\"]\n",
    );
    let cfg = dir.path().join("run.toml");
    std::fs::write(&cfg, text).unwrap();
    let mut run = reflex();
    run.args(["run", "--json", "--episodes", "1", "--config"])
        .arg(&cfg);
    run.env("RUST_LOG", LOG_BOUND_ENDPOINTS);
    let mut actor = spawn(run, &dir, "actor");
    let ep = bound_endpoint(&mut actor, &dir, "actor", "tls");
    let fifo = dir.path().join("event0");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let mut tele = reflex();
    tele.args([
        "teleop",
        "--device",
        "gamepad",
        "--robot",
        "sim",
        "--no-multicast",
    ])
    .arg("--path")
    .arg(&fifo)
    .args(["--connect", &ep, "--tls-name", name, "--tls-dir"])
    .arg(&keys);
    let _teleop = spawn(tele, &dir, "teleop");
    let mut pad = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(s) = actor.0.try_wait().unwrap() {
            break s;
        }
        for (ty, code, v) in [(1u16, 0x137u16, 1i32), (3, 1, -32767), (0, 0, 0)] {
            let _ = pad.write_all(&input_event(ty, code, v));
        }
        assert!(
            t0.elapsed().as_secs() < 60,
            "the run did not end: {}",
            child_stderr(&dir, "actor")
        );
        // Paces the gamepad driver resending its records (20 Hz) while polling for the end.
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{}", child_stderr(&dir, "actor"));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("actor.out")).unwrap())
            .unwrap();
    v["teleop_steps"].as_u64().unwrap()
}

#[test]
fn through_the_binaries_a_teleop_certificate_takes_over_and_a_viewer_certificate_cannot() {
    let teleop = teleop_steps_with_certificate("teleop");
    let viewer = teleop_steps_with_certificate("viewer");
    eprintln!("teleop steps: with the teleop certificate {teleop}, with the viewer's {viewer}");
    assert!(teleop > 20, "the teleop device drove: {teleop}");
    assert_eq!(viewer, 0, "the viewer's commands never reached the robot");
}

#[test]
fn reflex_bench_bus_tls_times_tls_beside_plain_tcp_in_one_run() {
    let v = crate::common::json_output(
        reflex().args(["bench", "bus", "--tls", "--iters", "100", "--json"]),
    );
    for (link, prefix) in [("tcp", "tcp/"), ("tls", "tls/")] {
        assert!(
            v[link]["transport"].as_str().unwrap().starts_with(prefix),
            "{v}"
        );
        let p50 = v[link]["obs_1kb_block"]["p50_us"].as_f64().unwrap();
        assert!(
            p50 > 0.0 && p50 <= v[link]["obs_1kb_block"]["p99_us"].as_f64().unwrap(),
            "{v}"
        );
    }
}

#[test]
fn the_learner_over_tls_trains_on_the_actors_steps_and_its_weights_reach_the_actor() {
    use crate::common::{child_stderr, spawn};
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    init_keys(
        &keys,
        "sim",
        &["robot".to_string(), "learner".to_string()],
        &[],
        &|_| valid_for_days(1),
    )
    .unwrap();
    let text = format!(
        r#"[robot]
source = "sim"

[sim]
task = "pick"
control_hz = 50.0

[policy]
kind = "onnx"
model = "{model}"

[run]
episodes = 4
seed = 3
clock = "wall"

[learner]
in_process = false
checkpoint = "{ckpt}"
checkpoint_every_s = 0.5

[learner.link]
drain_s = 60.0

[bus]
enabled = true
no_multicast = true
tls = {{ dir = "keys", name = "robot" }}

[bus.access]
learners = ["learner"]
"#,
        model = crate::common::repo().join("models/pick.onnx").display(),
        ckpt = dir.path().join("learner/sac.ckpt").display()
    );
    let cfg = dir.path().join("hil.toml");
    std::fs::write(&cfg, text).unwrap();
    // The learner listens on a port the OS chooses; the actor connects to the one it reports.
    // As a fleet's learner on a workstation runs: a Zenoh router the robot connects to
    // (docs/deploy.md), so the robot's access rules see the router's certificate.
    let mut l = reflex();
    l.args([
        "learn",
        "--json",
        "--exit-when-actor-leaves",
        "--no-multicast",
        "--router",
        "--wait-s",
        "60",
    ])
    .args([
        "--listen",
        "tls/127.0.0.1:0",
        "--tls-name",
        "learner",
        "--tls-dir",
    ])
    .arg(&keys)
    .arg("--config")
    .arg(&cfg)
    .env("RUST_LOG", LOG_BOUND_ENDPOINTS);
    let mut learner = spawn(l, &dir, "learner");
    let ep = bound_endpoint(&mut learner, &dir, "learner", "tls");
    let mut a = reflex();
    a.args(["run", "--json", "--connect", &ep, "--config"])
        .arg(&cfg);
    let mut actor = spawn(a, &dir, "actor");
    for (g, name) in [(&mut actor, "actor"), (&mut learner, "learner")] {
        let t0 = std::time::Instant::now();
        loop {
            if let Some(s) = g.0.try_wait().unwrap() {
                assert!(s.success(), "{name}: {}", child_stderr(&dir, name));
                break;
            }
            assert!(
                t0.elapsed().as_secs() < 150,
                "{name} did not end: {}",
                child_stderr(&dir, name)
            );
            // Paces the polling.
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let av: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("actor.out")).unwrap())
            .unwrap();
    let link = &av["learner_link"];
    eprintln!("actor link over TLS: {link}");
    assert!(link["steps"].as_u64().unwrap() > 100, "{link}");
    assert_eq!(link["lost"], 0, "{link}");
    assert!(
        link["swaps"].as_u64().unwrap() > 0,
        "the learner's weights reached the actor: {link}"
    );
}

#[test]
fn keys_add_signs_a_new_operator_the_robot_accepts_and_a_stranger_authority_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    let run = |args: &[&str]| {
        let out = reflex().args(args).output().unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let k = keys.to_str().unwrap();
    let (ok, out) = run(&[
        "keys", "init", "--robot", "arm", "--dir", k, "--peer", "robot",
    ]);
    assert!(ok, "{out}");
    let (ok, out) = run(&["keys", "add", "--dir", k, "--peer", "alice"]);
    assert!(ok, "{out}");
    let (ok, out) = run(&["keys", "add", "--dir", k, "--peer", "alice"]);
    assert!(
        !ok && out.contains("alice.pem") && out.contains("exists"),
        "{out}"
    );
    // A certificate named `alice` from another authority.
    let other = dir.path().join("other");
    let (ok, out) = run(&[
        "keys",
        "init",
        "--robot",
        "arm",
        "--dir",
        other.to_str().unwrap(),
        "--peer",
        "alice",
    ]);
    assert!(ok, "{out}");

    let mut robot_cfg = bus(&[], &[], Some(TlsFiles::in_dir(&keys, "robot")));
    robot_cfg.access = Some((
        "arm".into(),
        Access {
            learners: vec![],
            teleops: vec!["alice".into()],
            viewers: vec![],
            ros2: None,
        },
    ));
    let (robot, ep) = open_listening_on_a_fresh_tls_port(robot_cfg);
    let got: Arc<Mutex<Vec<String>>> = Arc::default();
    let g = got.clone();
    let _sub = robot
        .declare_subscriber("reflex/arm/teleop")
        .callback(move |s| {
            g.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&s.payload().to_bytes()).to_string())
        })
        .wait()
        .unwrap();
    let alice = bus(
        &[],
        std::slice::from_ref(&ep),
        Some(TlsFiles::in_dir(&keys, "alice")),
    )
    .open()
    .unwrap();
    // The stranger trusts the robot's authority (so only its own certificate is wrong).
    let mut stranger = TlsFiles::in_dir(&other, "alice");
    stranger.ca = keys.join("ca.pem");
    let stranger = bus(&[], std::slice::from_ref(&ep), Some(stranger))
        .open()
        .unwrap();
    // Both put until the added operator's messages arrive, then one more round, closed when its
    // message arrives: the stranger had as long to get through.
    let round = || {
        alice.put("reflex/arm/teleop", "added").wait().unwrap();
        stranger
            .put("reflex/arm/teleop", "stranger")
            .wait()
            .unwrap();
    };
    let added = || got.lock().unwrap().iter().filter(|w| *w == "added").count();
    crate::common::wait_until("the added operator's message", 60, || {
        round();
        added() > 0
    });
    let before = added();
    round();
    crate::common::wait_until("the last round's message", 20, || added() > before);
    let mut from = got.lock().unwrap().clone();
    from.sort();
    from.dedup();
    assert_eq!(
        from,
        ["added"],
        "the added operator takes over; the stranger is not let in"
    );

    // The authority's key must stay private.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(keys.join("ca.key"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let (ok, out) = run(&["keys", "add", "--dir", k, "--peer", "bob"]);
    assert!(
        !ok && out.contains("ca.key") && out.contains("chmod 600"),
        "{out}"
    );
}
