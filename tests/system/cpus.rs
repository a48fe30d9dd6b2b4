//! The same results on every processor of the machines reflex runs on: the learner's arithmetic
//! and its allocations must not depend on the vector width or the caches (issue 54: a fresh
//! clone on an AVX2-only EPYC counted 246 allocations per update where this AVX-512 machine
//! counted 224, and `make demo` printed other success rates).
//!
//! The check runs this test binary a second time under qemu's user-mode emulator as an AVX2-only
//! EPYC (`qemu-x86_64 -cpu EPYC-Rome`: AVX2 and FMA, no AVX-512), in the child mode of the same
//! test, and compares what both processors computed. `make test` installs qemu-user when it is
//! missing (tests/other_cpu_setup.sh).

use reflex_learn::sac::{Mode, Sac, SacConfig};
use std::process::Command;

/// The environment variable that turns the test below into the child that reports.
const CHILD: &str = "REFLEX_TEST_OTHER_CPU_CHILD";
/// The emulated processor: an AVX2-only EPYC (Zen 2), the machine the issue was found on.
const OTHER_CPU: &str = "EPYC-Rome";

/// What one processor computed: the kernel path it took, a digest of the learner's parameters
/// after 30 updates at the demo's preset, and the allocations per step of the last 10.
fn report() -> String {
    let cfg = SacConfig {
        warmup_steps: 0,
        ..reflex_agent::presets::learner_preset(Mode::Residual, 3)
    };
    let mut sac = Sac::new(cfg, 3, 1).unwrap();
    crate::learner::fill(&mut sac, 600, 3);
    for _ in 0..20 {
        sac.train_step().unwrap();
    }
    let steps = 10;
    let (_, allocs) = crate::alloc_count::count(|| {
        for _ in 0..steps {
            sac.train_step().unwrap();
        }
    });
    let allocs = allocs as f64 / steps as f64;
    // FNV-1a over the parameters' bits: any difference in any bit shows.
    let digest = sac
        .parameters()
        .unwrap()
        .iter()
        .flat_map(|x| x.to_bits().to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
        });
    format!(
        "path={} digest={digest:016x} allocs_per_step={allocs}",
        reflex_mlp::kernel::Path::detected().name()
    )
}

fn field<'a>(report: &'a str, key: &str) -> &'a str {
    report
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no `{key}` in the report `{report}`"))
}

#[test]
fn an_avx2_only_processor_computes_the_learners_bits_and_allocations_exactly_as_this_one() {
    if std::env::var_os(CHILD).is_some() {
        println!("REPORT {}", report());
        return;
    }
    let here = report();
    let qemu = "qemu-x86_64";
    let out = Command::new(qemu)
        .args(["-cpu", OTHER_CPU])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "cpus::an_avx2_only_processor_computes_the_learners_bits_and_allocations_exactly_as_this_one",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "`{qemu}` could not be started ({e}): this test runs the learner as an AVX2-only \
                 processor under qemu's user-mode emulator. Install it (`apt-get install \
                 qemu-user`; `make test` does so when run as root) and run the test again"
            )
        });
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the test under `{qemu} -cpu {OTHER_CPU}` failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let there = stdout
        .lines()
        // The harness prints the test's name on the same line, before what the test prints.
        .find_map(|l| l.split_once("REPORT ").map(|(_, r)| r))
        .unwrap_or_else(|| panic!("no report from the emulated processor:\n{stdout}"));
    eprintln!("this processor: {here}\n{OTHER_CPU} under qemu: {there}");
    assert_eq!(
        field(there, "path"),
        "avx2+fma",
        "the emulated processor did not take the AVX2 path: the comparison would prove nothing"
    );
    assert_eq!(
        field(&here, "digest"),
        field(there, "digest"),
        "the learner's parameters after 30 updates differ between this processor ({}) and an \
         AVX2-only one: some arithmetic depends on the processor again",
        field(&here, "path")
    );
    assert_eq!(
        field(&here, "allocs_per_step"),
        field(there, "allocs_per_step"),
        "the update allocates differently on another processor"
    );
}
