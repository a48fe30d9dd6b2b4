//! Helpers shared by the system tests.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// The `reflex` binary built for this test run.
pub fn reflex() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_reflex"));
    c.env("RUST_LOG", "warn");
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

/// A TCP port on 127.0.0.1 that the OS reported free a moment ago.
pub fn free_tcp_endpoint() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("tcp/127.0.0.1:{}", l.local_addr().unwrap().port())
}

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

/// Runs a `reflex ... --json` command, asserts it succeeded (showing its stderr if not) and
/// returns the JSON it printed.
pub fn json_output(cmd: &mut Command) -> serde_json::Value {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}
