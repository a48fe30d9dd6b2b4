//! The crates keep their layers (docs/architecture.md): a driver author compiles the contracts
//! without Zenoh, Rerun, candle or ONNX Runtime; the control loop has none of them either; the
//! binary's command modules never import each other.

use crate::common::repo;

/// The crates `package` depends on (normal dependencies, the whole tree), from `cargo tree`.
fn dependency_tree(package: &str) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args([
            "tree",
            "--offline",
            "-e",
            "normal",
            "--prefix",
            "none",
            "-p",
            package,
        ])
        .arg("--manifest-path")
        .arg(repo().join("Cargo.toml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect()
}

#[test]
fn the_contracts_and_the_loop_depend_on_no_transport_recorder_or_learning_framework() {
    let forbidden = [
        "zenoh",
        "rerun",
        "candle-core",
        "candle-nn",
        "ort",
        "rapier3d",
        "tokenizers",
        "tokio",
    ];
    for package in ["reflex-contracts", "reflex-runtime"] {
        let tree = dependency_tree(package);
        assert!(tree.len() > 3, "{package}: {tree:?}");
        for f in forbidden {
            assert!(
                !tree.iter().any(|c| c == f),
                "{package} depends on {f}: {tree:?}"
            );
        }
    }
    // The contracts are serde and its formats only.
    let contracts = dependency_tree("reflex-contracts");
    for f in ["nalgebra", "crossbeam", "urdf-rs"] {
        assert!(
            !contracts.iter().any(|c| c == f),
            "reflex-contracts depends on {f}"
        );
    }
}

#[test]
fn the_binarys_command_modules_never_import_each_other() {
    let dir = repo().join("src/cmd");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.file_name().is_some_and(|f| f == "mod.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(
            !text.contains("crate::cmd::") && !text.contains("super::"),
            "{} imports another command module",
            p.display()
        );
        n += 1;
    }
    assert!(n >= 5, "command modules found: {n}");
}

#[test]
fn no_library_code_changes_the_process_environment() {
    // `std::env::set_var` while other threads run is undefined behaviour (Rust 2024 makes it
    // unsafe). Only the binary sets RAYON_NUM_THREADS, once, before any thread exists.
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut files = vec![];
    for d in ["runtime", "policies", "sim", "hardware", "calibration"] {
        walk(&repo().join(d), &mut files);
    }
    assert!(files.len() > 20, "{} files", files.len());
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        assert!(
            !text.contains("env::set_var") && !text.contains("env::remove_var"),
            "{} changes the environment",
            f.display()
        );
    }
}
