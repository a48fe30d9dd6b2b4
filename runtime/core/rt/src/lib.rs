//! reflex-rt: real-time hygiene for the control-loop thread: SCHED_FIFO priority, CPU pinning and locked
//! memory. Each is optional; when the OS does not permit it the loop still runs, with a warning.

#![allow(unsafe_code)] // SCHED_FIFO and mallopt through libc

use serde::Deserialize;

/// `[loop.rt]` in a config.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RtConfig {
    /// SCHED_FIFO priority 1-99 for the loop thread (needs CAP_SYS_NICE or an rtprio limit).
    #[serde(default)]
    pub fifo_priority: Option<i32>,
    /// Pin the loop thread to this CPU.
    #[serde(default)]
    pub cpu: Option<usize>,
    /// Lock all current and future memory (no page faults in the loop; needs CAP_IPC_LOCK or a
    /// memlock limit).
    #[serde(default)]
    pub mlockall: bool,
}

/// The outcome of one setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RtReport {
    /// What was asked.
    pub setting: String,
    /// `true` when it took effect.
    pub ok: bool,
    /// What happened, in words.
    pub detail: String,
}

fn errno() -> String {
    std::io::Error::last_os_error().to_string()
}

/// Applies the settings to the calling thread; logs each outcome (a warning when refused).
pub fn apply(cfg: &RtConfig) -> Vec<RtReport> {
    let mut out = Vec::new();
    #[cfg(target_os = "linux")]
    {
        if let Some(p) = cfg.fifo_priority {
            // libc, not rustix: rustix leaves sched_setscheduler out on purpose (glibc's
            // wrapper and the raw system call differ in what they set for threads).
            let param = libc::sched_param { sched_priority: p };
            // SAFETY: sets the scheduling policy of the calling thread (pid 0) with a valid struct.
            let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
            out.push(RtReport {
                setting: format!("SCHED_FIFO priority {p}"),
                ok: r == 0,
                detail: if r == 0 {
                    "set".into()
                } else {
                    format!(
                        "refused ({}); give the process CAP_SYS_NICE or an rtprio limit",
                        errno()
                    )
                },
            });
        }
        if let Some(cpu) = cfg.cpu {
            let r = if cpu < rustix::thread::CpuSet::MAX_CPU {
                let mut set = rustix::thread::CpuSet::new();
                set.set(cpu);
                rustix::thread::sched_setaffinity(None, &set).map_err(|e| e.to_string())
            } else {
                Err(format!(
                    "the kernel's CPU set holds CPUs 0-{}",
                    rustix::thread::CpuSet::MAX_CPU - 1
                ))
            };
            out.push(RtReport {
                setting: format!("pin to CPU {cpu}"),
                ok: r.is_ok(),
                detail: match r {
                    Ok(()) => "pinned".into(),
                    Err(e) => format!("refused ({e})"),
                },
            });
        }
        if cfg.mlockall {
            use rustix::mm::MlockAllFlags;
            let r = rustix::mm::mlockall(MlockAllFlags::CURRENT | MlockAllFlags::FUTURE);
            out.push(RtReport {
                setting: "mlockall".into(),
                ok: r.is_ok(),
                detail: match r {
                    Ok(()) => "memory locked".into(),
                    Err(e) => {
                        format!("refused ({e}); raise the memlock limit or add CAP_IPC_LOCK")
                    }
                },
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        if cfg.fifo_priority.is_some() || cfg.cpu.is_some() || cfg.mlockall {
            out.push(RtReport {
                setting: "real-time settings".into(),
                ok: false,
                detail: "only implemented on Linux".into(),
            });
        }
    }
    for r in &out {
        if r.ok {
            tracing::info!("real-time: {}: {}", r.setting, r.detail);
        } else {
            tracing::warn!("real-time: {}: {}", r.setting, r.detail);
        }
    }
    out
}

/// What [`prepare_process`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessSetup {
    /// Freed memory is kept in the process (glibc's mmap and trim thresholds raised).
    pub kept_freed_memory: bool,
    /// `RAYON_NUM_THREADS` was set to 1 (false: the person set it, or other threads already ran).
    pub pinned_candle_threads: bool,
}

/// Process-wide set-up for a reflex program, to be called first thing in `main`:
///
/// - glibc returns large freed blocks (> 128 KiB) to the OS and maps fresh zeroed pages for the
///   next one; candle allocates a new buffer per tensor operation, so the learner spent a quarter
///   of its time in page faults and page clearing. Raising the thresholds keeps freed memory in
///   the process.
/// - candle's CPU kernels take their thread count from `RAYON_NUM_THREADS` whenever they run. Its
///   elementwise kernels gain nothing from a second thread at the learner's sizes, and its idle
///   workers spin beside the learner's own (whose matrix products take their threads from
///   `[learner] threads`), so it is set to one unless the person set it. Changing the environment
///   while another thread may read it is undefined behaviour, so this is done only when the
///   process has exactly one thread (counted in `/proc/self/task`), and skipped otherwise.
pub fn prepare_process() -> ProcessSetup {
    #[cfg(target_os = "linux")]
    // SAFETY: mallopt only changes allocator thresholds and takes glibc's own locks.
    let kept_freed_memory = unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30) == 1
    };
    #[cfg(not(target_os = "linux"))]
    let kept_freed_memory = false;
    let mut pinned_candle_threads = false;
    if std::env::var_os("RAYON_NUM_THREADS").is_none() && only_thread() {
        // SAFETY: this is the process's only thread (checked just above), so no other thread can
        // read the environment while it changes, and this thread starts none in between.
        unsafe { std::env::set_var("RAYON_NUM_THREADS", "1") };
        pinned_candle_threads = true;
    }
    ProcessSetup {
        kept_freed_memory,
        pinned_candle_threads,
    }
}

/// Whether the calling thread is the process's only one (Linux: the entries of
/// `/proc/self/task`; elsewhere unknown, so false).
fn only_thread() -> bool {
    std::fs::read_dir("/proc/self/task").is_ok_and(|d| d.count() == 1)
}
