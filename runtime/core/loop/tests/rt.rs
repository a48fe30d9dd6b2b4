//! The loop thread's real-time settings, read back from the kernel (Linux only).
#![cfg(target_os = "linux")]

use reflex_runtime::rt::{RtConfig, apply};

/// The CPUs the calling thread may run on, as the kernel reports them
/// (`/proc/thread-self/status`, `Cpus_allowed_list`: "0-3,6").
fn allowed_cpus() -> Vec<usize> {
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim();
    let mut cpus = vec![];
    for part in list.split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        cpus.extend(a.parse::<usize>().unwrap()..=b.parse::<usize>().unwrap());
    }
    cpus
}

#[test]
fn pinning_leaves_the_thread_one_cpu_and_a_cpu_past_the_kernels_set_is_refused() {
    std::thread::spawn(|| {
        let cpu = *allowed_cpus().last().unwrap();
        let report = apply(&RtConfig {
            cpu: Some(cpu),
            ..Default::default()
        });
        assert_eq!(report.len(), 1);
        assert!(report[0].ok, "{report:?}");
        assert_eq!(allowed_cpus(), vec![cpu]);
        let report = apply(&RtConfig {
            cpu: Some(1 << 20),
            ..Default::default()
        });
        assert!(!report[0].ok, "{report:?}");
        assert!(report[0].detail.contains("CPU set"), "{report:?}");
        assert_eq!(allowed_cpus(), vec![cpu], "a refused pin changes nothing");
    })
    .join()
    .unwrap();
}

#[test]
fn a_wall_clock_sets_its_threads_timer_slack_to_one_nanosecond() {
    std::thread::spawn(|| {
        let read = || {
            let tid = rustix::thread::gettid().as_raw_nonzero();
            std::fs::read_to_string(format!("/proc/self/task/{tid}/timerslack_ns"))
                .ok()
                .map(|s| s.trim().parse::<u64>().unwrap())
        };
        let _clock = reflex_runtime::clock::WallClock::new(std::time::Duration::from_micros(50));
        // The kernel's own file where it is readable (it needs ptrace rights over the
        // thread); the prctl read-back otherwise.
        let slack = read().unwrap_or_else(|| rustix::thread::current_timer_slack().unwrap());
        assert_eq!(slack, 1);
    })
    .join()
    .unwrap();
}
