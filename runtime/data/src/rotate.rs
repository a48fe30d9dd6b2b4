//! Keeps a records directory within a size and an age, so a long training day on a robot cannot
//! fill its disk: the oldest files go first, the run being recorded is never touched.
//!
//! `[run] keep_recordings_gb` and `keep_recordings_days` turn it on for `reflex run --record DIR`:
//! a thread of its own prunes DIR once at start and then every minute (deleting files is disk
//! work the control loop must never wait for). The learner's checkpoint needs no rotation: it is
//! one file, replaced atomically at each save.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

/// How much a records directory may hold.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Limits {
    /// Total size, bytes.
    pub max_bytes: Option<u64>,
    /// Age of a file (since it was last written).
    pub max_age: Option<Duration>,
}

impl Limits {
    /// `true` when there is nothing to enforce.
    pub fn is_none(&self) -> bool {
        self.max_bytes.is_none() && self.max_age.is_none()
    }
}

/// What one pass deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    /// Files deleted.
    pub files: u64,
    /// Bytes freed.
    pub bytes: u64,
}

fn walk(dir: &Path, keep: Option<&Path>, out: &mut Vec<(SystemTime, u64, PathBuf)>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if keep.is_some_and(|k| p.starts_with(k)) {
            continue;
        }
        let Ok(m) = e.metadata() else { continue };
        if m.is_dir() {
            walk(&p, keep, out);
        } else if m.is_file() {
            out.push((m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len(), p));
        }
    }
}

/// Removes the empty directories under `dir` (not `dir` itself).
fn remove_empty(dir: &Path, keep: Option<&Path>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if keep.is_some_and(|k| p.starts_with(k)) {
            continue;
        }
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            remove_empty(&p, keep);
            let _ = std::fs::remove_dir(&p); // fails, as it should, when not empty
        }
    }
}

/// One pass over `root`: deletes every file older than `limits.max_age`, then the oldest files
/// until the rest fit `limits.max_bytes`; files under `keep` (the run being recorded) count
/// toward the size but are never deleted. Empty directories left behind are removed.
pub fn prune(root: &Path, keep: Option<&Path>, limits: &Limits) -> Pruned {
    let mut files = vec![];
    walk(root, keep, &mut files);
    let mut kept_bytes = 0u64;
    if let Some(k) = keep {
        let mut mine = vec![];
        walk(k, None, &mut mine);
        kept_bytes = mine.iter().map(|f| f.1).sum();
    }
    files.sort_by_key(|f| f.0);
    let now = SystemTime::now();
    let mut total: u64 = kept_bytes + files.iter().map(|f| f.1).sum::<u64>();
    let mut done = Pruned::default();
    for (t, len, p) in &files {
        let too_old = limits
            .max_age
            .is_some_and(|a| now.duration_since(*t).is_ok_and(|age| age > a));
        let too_big = limits.max_bytes.is_some_and(|m| total > m);
        if !(too_old || too_big) {
            continue;
        }
        if std::fs::remove_file(p).is_ok() {
            total -= len;
            done.files += 1;
            done.bytes += len;
        }
    }
    remove_empty(root, keep);
    done
}

/// A thread that prunes a records directory at start and then every `every`; stops when
/// dropped.
pub struct Janitor {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Files deleted so far.
    pub files: Arc<AtomicU64>,
}

impl Janitor {
    /// Starts pruning `root` (keeping `keep`) to `limits`.
    pub fn start(root: PathBuf, keep: PathBuf, limits: Limits, every: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let files = Arc::new(AtomicU64::new(0));
        let (s, f) = (stop.clone(), files.clone());
        let thread = std::thread::Builder::new()
            .name("records-janitor".into())
            .spawn(move || {
                let mut next = std::time::Instant::now();
                while !s.load(Ordering::Relaxed) {
                    if std::time::Instant::now() >= next {
                        let p = prune(&root, Some(&keep), &limits);
                        if p.files > 0 {
                            tracing::info!(
                                "records: deleted the {} oldest files ({:.1} MB) under {} to stay within the limits",
                                p.files,
                                p.bytes as f64 / 1e6,
                                root.display()
                            );
                            f.fetch_add(p.files, Ordering::Relaxed);
                        }
                        next += every;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
            .ok();
        Janitor {
            stop,
            thread,
            files,
        }
    }
}

impl Drop for Janitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(p: &Path, len: usize, age_s: u64) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, vec![0u8; len]).unwrap();
        let t = SystemTime::now() - Duration::from_secs(age_s);
        std::fs::File::options()
            .write(true)
            .open(p)
            .unwrap()
            .set_modified(t)
            .unwrap();
    }

    #[test]
    fn the_oldest_files_go_first_and_the_current_run_is_never_touched() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        file(&r.join("run-a/episodes/e1.rrd"), 1000, 400);
        file(&r.join("run-a/episodes/e2.rrd"), 1000, 300);
        file(&r.join("run-b/episodes/e1.rrd"), 1000, 200);
        file(&r.join("run-c/episodes/e1.rrd"), 1000, 500); // the current run: oldest, kept
        let keep = r.join("run-c");
        let p = prune(
            r,
            Some(&keep),
            &Limits {
                max_bytes: Some(2500),
                max_age: None,
            },
        );
        assert_eq!(
            p,
            Pruned {
                files: 2,
                bytes: 2000
            }
        );
        assert!(!r.join("run-a").exists(), "emptied and removed");
        assert!(r.join("run-b/episodes/e1.rrd").exists());
        assert!(r.join("run-c/episodes/e1.rrd").exists());
    }

    #[test]
    fn files_older_than_the_age_limit_go_whatever_the_size() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        file(&r.join("old/a"), 10, 3 * 86400);
        file(&r.join("new/b"), 10, 10);
        let p = prune(
            r,
            None,
            &Limits {
                max_bytes: None,
                max_age: Some(Duration::from_secs(86400)),
            },
        );
        assert_eq!(p.files, 1);
        assert!(!r.join("old").exists() && r.join("new/b").exists());
    }
}
