//! The e-stop of a served robot (`reflex sim serve`), released and resumed with no actor: each
//! holder of a robot's e-stop (its server, its actor) reports its own state on
//! `reflex/<robot>/stop/<holder>`, and `reflex estop` answers each one there is.

use crate::common::{ChildGuard, child_stderr, reflex, spawn, unix_endpoint, wait_until};
use reflex_bus::BusConfig;
use reflex_contracts::msg::{self, StopStatus};
use std::sync::{Arc, Mutex};
use zenoh::Wait;

/// `reflex estop ACTION --robot arm` on the bus at `ep`: its output, and whether it succeeded.
fn estop(action: &str, ep: &str) -> (bool, String) {
    let out = reflex()
        .args(["estop", action, "--robot", "arm", "--no-multicast"])
        .args(["--as", "the operator", "--wait-s", "20", "--connect", ep])
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

/// The robot server's e-stop as it publishes it on `reflex/arm/stop/robot`.
struct ServerStop {
    latest: Arc<Mutex<Option<StopStatus>>>,
    _sub: zenoh::pubsub::Subscriber<()>,
}

impl ServerStop {
    fn new(session: &zenoh::Session) -> Self {
        let latest = Arc::new(Mutex::new(None));
        let l = latest.clone();
        let sub = session
            .declare_subscriber("reflex/arm/stop/robot")
            .callback(move |s| {
                if let Ok(m) = msg::decode::<StopStatus>("stop", &s.payload().to_bytes()) {
                    *l.lock().unwrap() = Some(m);
                }
            })
            .wait()
            .unwrap();
        ServerStop { latest, _sub: sub }
    }

    fn wait(&self, what: &str, state: &str) -> StopStatus {
        let mut seen = None;
        wait_until(what, 60, || {
            seen = self.latest.lock().unwrap().clone();
            seen.as_ref().is_some_and(|m| m.stop == state)
        });
        seen.unwrap()
    }
}

#[test]
fn a_served_robot_whose_actor_died_while_latched_is_released_and_resumed_remotely_for_a_new_actor()
{
    // The issue: `reflex estop release` waited for a status only an actor publishes, and a new
    // actor's reset was refused because the server's stop was latched: only restarting the
    // server helped.
    let dir = tempfile::tempdir().unwrap();
    let ep = unix_endpoint(&dir, "bus");
    let mut serve = reflex();
    serve.args([
        "sim",
        "serve",
        "--task",
        "reach",
        "--robot",
        "arm",
        "--listen",
        &ep,
        "--no-multicast",
    ]);
    let _server = spawn(serve, &dir, "server");
    let cfg = dir.path().join("actor.toml");
    std::fs::write(
        &cfg,
        format!(
            "[robot]\nsource = \"remote\"\nname = \"arm\"\ntimeout_ms = 20000\n\n\
             [policy]\nkind = \"none\"\n\n[bus]\nenabled = true\nconnect = [\"{ep}\"]\n\
             no_multicast = true\ntrace_hz = 0.0\n\n[run]\nepisodes = 1\nseed = 5\nclock = \"sim\"\n"
        ),
    )
    .unwrap();
    let mut first = reflex();
    first.args(["run", "--until-stopped", "--config"]).arg(&cfg);
    let mut actor: ChildGuard = spawn(first, &dir, "actor");
    let watch = crate::common::StatusWatch::new(&ep, "arm");
    watch.wait("the first actor under way", |m| m.figures.ticks >= 20);
    let session = BusConfig::hermetic(vec![], vec![ep.clone()])
        .open()
        .unwrap();
    let server_stop = ServerStop::new(&session);
    server_stop.wait("the server's own stop report", "running");

    let (ok, said) = estop("raise", &ep);
    assert!(ok && said.contains("latched"), "{said}");
    // Both holders confirm. The command repeats its raise until they do, and each repeat names
    // the one act: one press, one e-stop at each holder.
    assert!(
        said.contains("robot: e-stop 1,") && said.contains("actor: e-stop 1,"),
        "both holders confirm: {said}\nactor stderr:\n{}",
        child_stderr(&dir, "actor")
    );
    // The actor dies while latched.
    actor.0.kill().unwrap();
    actor.0.wait().unwrap();
    wait_until("the dead actor's liveliness token gone", 60, || {
        session
            .liveliness()
            .get("reflex/arm/alive/actor")
            .timeout(std::time::Duration::from_millis(300))
            .wait()
            .unwrap()
            .recv()
            .is_err()
    });
    let latched = server_stop.wait("the server latched", "latched");
    assert!(
        latched.estops == 1 && latched.stop_by == "the operator",
        "{latched:?}"
    );

    // A new actor cannot start an episode while the server's stop is latched, and says why.
    let refused = reflex()
        .args(["run", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success()
            && err.contains("latched")
            && err.contains("reflex estop release"),
        "{err}"
    );

    // Resume before release: refused, the stop stays latched (a release is its own act).
    let (ok, said) = estop("resume", &ep);
    assert!(!ok && said.contains("needs it paused"), "{said}");
    // Release with no actor: the server alone answers, and nothing moves yet.
    let (ok, said) = estop("release", &ep);
    assert!(ok && said.contains("paused"), "{said}");
    assert!(
        said.contains("robot: e-stop ") && !said.contains("actor:"),
        "{said}"
    );
    server_stop.wait("the server paused", "paused");
    let (ok, said) = estop("resume", &ep);
    assert!(ok && said.contains("running"), "{said}");
    server_stop.wait("the server running", "running");

    // A new actor runs an episode on the same server.
    let out = reflex()
        .args(["run", "--json", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\nserver stderr:\n{}",
        String::from_utf8_lossy(&out.stderr),
        child_stderr(&dir, "server")
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["episodes"], 1, "{v}");
    assert_eq!(v["episodes_detail"][0]["estop"], false, "{v}");
}
