//! Helpers shared by the system tests.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The `reflex` binary built for this test run.
pub fn reflex() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_reflex"));
    c.env("RUST_LOG", "warn");
    c
}

/// The binary linked (or copied) into `dir` and run from there with `dir` as its working
/// directory: nothing above either is the project, so what it finds (ONNX Runtime, the Rerun
/// viewer) comes only from the environment the test gives it. Built inside a checkout (`make
/// test` without `CARGO_TARGET_DIR` builds into `target/` under it), the binary would find the
/// checkout's `.venv` by walking up from its own directory.
pub fn reflex_outside_the_project(dir: &Path) -> Command {
    let exe = dir.join("reflex");
    if !exe.exists() {
        let built = env!("CARGO_BIN_EXE_reflex");
        std::fs::hard_link(built, &exe)
            .or_else(|_| std::fs::copy(built, &exe).map(|_| ()))
            .unwrap();
    }
    let mut c = Command::new(exe);
    c.current_dir(dir).env("RUST_LOG", "warn");
    c
}

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The project's Python (`make venv` creates it); tests that need Python peers fail with a clear
/// message when it is missing instead of skipping.
pub fn python() -> PathBuf {
    let p = repo().join(".venv/bin/python");
    assert!(
        p.exists(),
        "{} is missing: run `make venv` (make test does it) to install the Python test peers",
        p.display()
    );
    p
}

/// A unix-socket endpoint in a fresh temporary directory: loopback-only, no port to collide on.
pub fn unix_endpoint(dir: &tempfile::TempDir, name: &str) -> String {
    format!(
        "unixsock-stream/{}",
        dir.path().join(format!("{name}.sock")).display()
    )
}

/// `[arm]` keys for servos emulated by a thread of the test's own process: the tests check
/// protocols and safety, not bus timing, so one exchange may take 250 ms (a real bus's 20 ms was
/// missed three times in a row with a busy thread per core).
pub const EMULATED_BUS: &str = "timeout_ms = 250.0";

/// A child process killed when dropped, so a failing test never leaves it behind.
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Spawns a command with its output captured to files in `dir` (for failure messages).
pub fn spawn(mut cmd: Command, dir: &tempfile::TempDir, name: &str) -> ChildGuard {
    let out = std::fs::File::create(dir.path().join(format!("{name}.out"))).unwrap();
    let err = std::fs::File::create(dir.path().join(format!("{name}.err"))).unwrap();
    ChildGuard(
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawn child process"),
    )
}

/// The stderr a spawned child wrote so far.
pub fn child_stderr(dir: &tempfile::TempDir, name: &str) -> String {
    std::fs::read_to_string(dir.path().join(format!("{name}.err"))).unwrap_or_default()
}

/// Runs a command to its end and asserts it succeeded (showing its stderr if not).
pub fn run_ok(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs a `reflex ... --json` command, asserts it succeeded (showing its stderr if not) and
/// returns the JSON it printed.
pub fn json_output(cmd: &mut Command) -> serde_json::Value {
    serde_json::from_slice(&run_ok(cmd).stdout).unwrap()
}

/// Waits (bounded) for child `what` to exit, and asserts it succeeded (showing its stderr if not).
pub fn wait_exit(g: &mut ChildGuard, what: &str, dir: &tempfile::TempDir, secs: u64) {
    let t0 = std::time::Instant::now();
    loop {
        if let Some(s) = g.0.try_wait().unwrap() {
            assert!(s.success(), "{what} failed: {}", child_stderr(dir, what));
            return;
        }
        assert!(
            t0.elapsed().as_secs() < secs,
            "{what} did not finish: {}",
            child_stderr(dir, what)
        );
        // Paces the polling of the child's exit.
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Episodes a `reflex run --record RUNS` has finished: a summary is written beside each
/// recording as its episode ends.
pub fn episodes_finished(runs: &std::path::Path) -> usize {
    std::fs::read_dir(runs)
        .into_iter()
        .flatten()
        .flat_map(|run| std::fs::read_dir(run.unwrap().path().join("episodes")))
        .flatten()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            let name = name.to_string_lossy();
            name.starts_with("episode_") && name.ends_with(".json")
        })
        .count()
}

/// Waits (bounded, so a broken run fails instead of hanging) until `ok`.
pub fn wait_until(what: &str, secs: u64, mut ok: impl FnMut() -> bool) {
    let t0 = std::time::Instant::now();
    while !ok() {
        assert!(t0.elapsed().as_secs() < secs, "never happened: {what}");
        // Paces the polling.
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Waits until `session` knows of a subscriber on `key` (its declaration has reached this
/// session): from then on a message put here on `key` is delivered. Bounded at 20 s.
pub fn wait_for_subscriber(session: &zenoh::Session, key: &str) {
    use zenoh::Wait;
    let probe = session.declare_publisher(key.to_string()).wait().unwrap();
    wait_until(&format!("a subscriber on {key}"), 20, || matching(&probe));
}

/// Whether Zenoh knows of a subscriber matching `p`'s key expression.
pub fn matching(p: &zenoh::pubsub::Publisher<'_>) -> bool {
    use zenoh::Wait;
    p.matching_status().wait().is_ok_and(|m| m.matching())
}

/// The newest status of a robot seen on the bus at `ep`.
pub struct StatusWatch {
    latest: std::sync::Arc<std::sync::Mutex<Option<reflex_contracts::msg::StatusMsg>>>,
    _sub: zenoh::pubsub::Subscriber<()>,
    _session: zenoh::Session,
}

impl StatusWatch {
    pub fn new(ep: &str, robot: &str) -> Self {
        use zenoh::Wait;
        let session = reflex_bus::BusConfig::hermetic(vec![], vec![ep.to_string()])
            .open()
            .unwrap();
        let latest = std::sync::Arc::new(std::sync::Mutex::new(None));
        let l = latest.clone();
        let sub = session
            .declare_subscriber(format!("reflex/{robot}/status"))
            .callback(move |s| {
                if let Ok(m) = reflex_contracts::msg::decode::<reflex_contracts::msg::StatusMsg>(
                    "status",
                    &s.payload().to_bytes(),
                ) {
                    *l.lock().unwrap() = Some(m);
                }
            })
            .wait()
            .unwrap();
        StatusWatch {
            latest,
            _sub: sub,
            _session: session,
        }
    }

    pub fn get(&self) -> Option<reflex_contracts::msg::StatusMsg> {
        self.latest.lock().unwrap().clone()
    }

    /// Waits for a status that satisfies `ok`; returns it.
    pub fn wait(
        &self,
        what: &str,
        ok: impl Fn(&reflex_contracts::msg::StatusMsg) -> bool,
    ) -> reflex_contracts::msg::StatusMsg {
        let mut found = None;
        wait_until(what, 120, || {
            found = self.get().filter(|m| ok(m));
            found.is_some()
        });
        found.unwrap()
    }
}
