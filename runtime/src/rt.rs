//! Real-time hygiene for the control-loop thread: SCHED_FIFO priority, CPU pinning and locked
//! memory. Each is optional; when the OS does not permit it the loop still runs, with a warning.

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
            // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET and sched_setaffinity only
            // touch that set and the calling thread.
            let r = unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
            };
            out.push(RtReport {
                setting: format!("pin to CPU {cpu}"),
                ok: r == 0,
                detail: if r == 0 {
                    "pinned".into()
                } else {
                    format!("refused ({})", errno())
                },
            });
        }
        if cfg.mlockall {
            // SAFETY: mlockall takes flags only.
            let r = unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) };
            out.push(RtReport {
                setting: "mlockall".into(),
                ok: r == 0,
                detail: if r == 0 {
                    "memory locked".into()
                } else {
                    format!(
                        "refused ({}); raise the memlock limit or add CAP_IPC_LOCK",
                        errno()
                    )
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
