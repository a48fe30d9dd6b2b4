//! The crates keep their layers (docs/architecture.md): every crate depends on exactly the reflex
//! crates the table there names, and the graph there is the one `cargo metadata` gives; a driver
//! author compiles the contracts without Zenoh, Rerun, candle or ONNX Runtime; the control loop
//! has none of them either; the robot's binary carries no benchmark; the binary's command modules
//! never import each other and the binary holds no `unsafe` code; no folder uses a folder drawn
//! after it in docs/architecture.md's folder table.

use crate::common::{repo, run_ok};

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

/// `cargo metadata` of the workspace's own packages.
fn workspace_metadata() -> serde_json::Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args([
            "metadata",
            "--offline",
            "--no-deps",
            "--format-version",
            "1",
        ])
        .arg("--manifest-path")
        .arg(repo().join("Cargo.toml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Each workspace crate and the reflex crates it depends on (normal dependencies, optional ones
/// included), from `cargo metadata`.
fn workspace_graph() -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let v = workspace_metadata();
    let mut graph = std::collections::BTreeMap::new();
    for p in v["packages"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap().to_string();
        let deps = p["dependencies"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["kind"].is_null())
            .filter_map(|d| d["name"].as_str())
            .filter(|n| n.starts_with("reflex"))
            .map(String::from)
            .collect();
        graph.insert(name, deps);
    }
    graph
}

/// docs/architecture.md's crate table, a row's cells each:
/// `| crate | folder | job | deps |` -> `["", crate, folder, job, deps, ""]`.
fn crate_rows(doc: &str) -> Vec<Vec<&str>> {
    doc.lines()
        .map(|line| line.split('|').map(str::trim).collect::<Vec<_>>())
        .filter(|cells| cells.len() == 6 && cells[1].starts_with("reflex"))
        .collect()
}

/// docs/architecture.md's crate table: crate -> the reflex crates it may depend on.
fn documented_graph(
    doc: &str,
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let mut table = std::collections::BTreeMap::new();
    for cells in crate_rows(doc) {
        let deps = cells[4]
            .split(',')
            .map(str::trim)
            .filter(|d| d.starts_with("reflex"))
            .map(String::from)
            .collect();
        table.insert(cells[1].to_string(), deps);
    }
    table
}

/// The graph as docs/architecture.md shows it: crates by layer (a layer depends only on the
/// layers before it), each with its direct reflex dependencies.
fn render_graph(
    graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
) -> String {
    let mut layer: std::collections::BTreeMap<&str, usize> = Default::default();
    while layer.len() < graph.len() {
        let before = layer.len();
        for (name, deps) in graph {
            if layer.contains_key(name.as_str()) {
                continue;
            }
            if deps.iter().all(|d| layer.contains_key(d.as_str())) {
                let l = deps
                    .iter()
                    .map(|d| layer[d.as_str()] + 1)
                    .max()
                    .unwrap_or(0);
                layer.insert(name, l);
            }
        }
        assert!(layer.len() > before, "a dependency cycle among {graph:?}");
    }
    let mut rows: Vec<(usize, &str)> = layer.iter().map(|(n, l)| (*l, *n)).collect();
    rows.sort();
    let width = rows.iter().map(|(_, n)| n.len()).max().unwrap_or(0);
    let mut text = String::from("```\n");
    for (l, name) in rows {
        let deps: Vec<&str> = graph[name].iter().map(String::as_str).collect();
        text += &format!(
            "{l}  {name:width$}  {}\n",
            if deps.is_empty() {
                "-".to_string()
            } else {
                format!("<- {}", deps.join(", "))
            }
        );
    }
    text += "```\n";
    text
}

#[test]
fn every_crate_depends_on_what_the_architecture_table_says_and_the_graph_is_current() {
    let path = repo().join("docs/architecture.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let actual = workspace_graph();
    let documented = documented_graph(&doc);
    assert!(actual.len() >= 12, "{actual:?}");
    for (name, deps) in &actual {
        let Some(allowed) = documented.get(name) else {
            panic!("{name} is not in docs/architecture.md's crate table");
        };
        assert_eq!(
            deps, allowed,
            "{name}: Cargo.toml's reflex dependencies (left) differ from docs/architecture.md's table (right)"
        );
    }
    for name in documented.keys() {
        assert!(
            actual.contains_key(name),
            "{name} is in the table but not in the workspace"
        );
    }
    let (begin, end) = ("<!-- crate graph: begin -->\n", "<!-- crate graph: end -->");
    let a = doc.find(begin).expect("the graph's begin marker") + begin.len();
    let b = doc.find(end).expect("the graph's end marker");
    let want = render_graph(&actual);
    if doc[a..b] != want {
        if std::env::var_os("REFLEX_WRITE_DOCS").is_some() {
            let updated = format!("{}{}{}", &doc[..a], want, &doc[b..]);
            std::fs::write(&path, updated).unwrap();
        } else {
            panic!(
                "docs/architecture.md's crate graph is not the workspace's (REFLEX_WRITE_DOCS=1 rewrites it); it should read:\n{want}"
            );
        }
    }
}

/// docs/architecture.md's folder table: (layer, folder) in the order the table gives them.
fn documented_folders(doc: &str) -> Vec<(usize, String)> {
    let mut rows = vec![];
    for line in doc.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // | layer | folder | what lives there |  -> ["", layer, folder, what, ""]
        if cells.len() != 5 {
            continue;
        }
        if let Ok(layer) = cells[1].parse::<usize>() {
            rows.push((layer, cells[2].to_string()));
        }
    }
    rows
}

/// The folder group a crate's folder (relative to the repository) belongs to: the longest folder
/// of the table that holds it.
fn folder_group<'a>(folders: &'a [(usize, String)], dir: &str) -> &'a (usize, String) {
    folders
        .iter()
        .filter(|(_, f)| f == "." || dir == f || dir.starts_with(&format!("{f}/")))
        .max_by_key(|(_, f)| if f == "." { 0 } else { f.len() })
        .unwrap_or_else(|| panic!("{dir} is in no folder of docs/architecture.md's folder table"))
}

#[test]
fn no_folder_uses_a_folder_drawn_after_it_and_the_crate_table_names_each_crates_folder() {
    let doc = std::fs::read_to_string(repo().join("docs/architecture.md")).unwrap();
    let folders = documented_folders(&doc);
    assert!(folders.len() >= 6, "the folder table: {folders:?}");
    for w in folders.windows(2) {
        assert!(
            w[0].0 <= w[1].0,
            "the folder table is in layer order: {w:?}"
        );
    }
    for (_, f) in &folders {
        assert!(
            repo().join(f).is_dir(),
            "{f} (docs/architecture.md) is not a folder"
        );
    }
    // Each crate's folder, relative to the repository, from cargo metadata.
    let root = repo().canonicalize().unwrap();
    let v = workspace_metadata();
    let mut dir_of = std::collections::BTreeMap::new();
    for p in v["packages"].as_array().unwrap() {
        let manifest = std::path::PathBuf::from(p["manifest_path"].as_str().unwrap());
        let dir = manifest.parent().unwrap().canonicalize().unwrap();
        let rel = dir
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .to_string();
        let rel = if rel.is_empty() { ".".to_string() } else { rel };
        dir_of.insert(p["name"].as_str().unwrap().to_string(), rel);
    }
    // The crate table's folder column is where each crate is.
    for cells in crate_rows(&doc) {
        let folder = cells[2].split_whitespace().next().unwrap();
        assert_eq!(
            dir_of.get(cells[1]).map(String::as_str),
            Some(folder),
            "{}: docs/architecture.md's crate table names another folder than Cargo.toml",
            cells[1]
        );
    }
    // A crate uses crates of its own folder group or of groups in earlier layers only.
    let mut checked = 0;
    for (name, deps) in workspace_graph() {
        let (layer, group) = folder_group(&folders, &dir_of[&name]);
        for dep in deps {
            let (dep_layer, dep_group) = folder_group(&folders, &dir_of[&dep]);
            assert!(
                dep_group == group || dep_layer < layer,
                "{name} ({}, layer {layer} in docs/architecture.md's folders) uses {dep} ({}, layer {dep_layer}): a folder only uses folders in layers before its own",
                dir_of[&name],
                dir_of[&dep]
            );
            checked += 1;
        }
    }
    assert!(checked > 40, "dependencies checked: {checked}");
}

#[test]
fn no_crate_is_over_five_thousand_lines() {
    // A crate a newcomer can read: one job, and at most ~5,000 lines of Rust under its src/.
    let v = workspace_metadata();
    let mut sizes = vec![];
    for p in v["packages"].as_array().unwrap() {
        let manifest = std::path::PathBuf::from(p["manifest_path"].as_str().unwrap());
        let mut lines = 0;
        let mut stack = vec![manifest.parent().unwrap().join("src")];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).unwrap() {
                let path = e.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|x| x == "rs") {
                    lines += std::fs::read_to_string(&path).unwrap().lines().count();
                }
            }
        }
        sizes.push((p["name"].as_str().unwrap().to_string(), lines));
    }
    assert!(
        sizes.len() >= 12 && sizes.iter().all(|(_, n)| *n > 100),
        "{sizes:?}"
    );
    for (name, n) in &sizes {
        assert!(
            *n <= 5000,
            "{name} has {n} lines: split it by job ({sizes:?})"
        );
    }
}

#[test]
fn the_robots_binary_carries_no_simulator_trainer_dataset_writer_benchmark_or_test_double() {
    // What `make bundle` builds: no default features, no dev-dependencies.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let tree = |extra: &[&str]| {
        let out = run_ok(
            std::process::Command::new(&cargo)
                .args([
                    "tree",
                    "--offline",
                    "-e",
                    "normal,features",
                    "--prefix",
                    "none",
                    "-p",
                    "reflex",
                ])
                .args(extra)
                .arg("--manifest-path")
                .arg(repo().join("Cargo.toml")),
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let robot = tree(&["--no-default-features"]);
    for needed in [
        "reflex-agent",
        "reflex-learn",
        "reflex-policies",
        "reflex-record",
        "reflex-hardware",
        "reflex-tabletop",
        "zenoh",
        "ort",
    ] {
        assert!(
            robot.lines().any(|l| l.starts_with(&format!("{needed} "))),
            "the robot's binary lacks {needed}:\n{robot}"
        );
    }
    // No simulator (rapier), no imitation trainer, no dataset writer (parquet, arrow), no video
    // encoder (OpenH264), no LeRobot importer, no emulated servos, no benchmark.
    for never in [
        "rapier3d",
        "reflex-sim ",
        "reflex-demo",
        "reflex-imitate",
        "reflex-import",
        "parquet",
        "openh264",
        "reflex-video",
        "reflex-bench",
        "reflex-hardware feature \"emulate\"",
        "testkit",
        "fixtures",
    ] {
        assert!(
            !robot.contains(never),
            "the robot's binary has {never}:\n{robot}"
        );
    }
    // A development build asks for the benchmarks (the `bench` feature, on by default), and
    // still no test double.
    let dev = tree(&[]);
    for all in [
        "reflex-bench",
        "rapier3d",
        "reflex-imitate",
        "parquet",
        "openh264",
    ] {
        assert!(
            dev.contains(all),
            "the workstation build lacks {all}:\n{dev}"
        );
    }
    for never in ["testkit", "fixtures"] {
        assert!(!dev.contains(never), "the binary has {never}:\n{dev}");
    }
}

#[test]
fn the_binary_declares_no_unsafe_code_and_calls_no_libc() {
    let mut n = 0;
    let mut stack = vec![repo().join("src")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap();
            for (i, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                assert!(
                    !code.contains("unsafe") && !code.contains("libc::"),
                    "{}:{}: the binary is parsing, dispatch and printing: `{}` belongs in a library",
                    p.display(),
                    i + 1,
                    line.trim()
                );
            }
            n += 1;
        }
    }
    assert!(n >= 8, "source files found: {n}");
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
    // unsafe). One function may set RAYON_NUM_THREADS: `reflex_runtime::rt::prepare_process`,
    // which the binary calls first and which checks that the process has one thread.
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
    let allowed = repo().join("runtime/core/rt/src/lib.rs");
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        if f == allowed {
            let at = text
                .find("env::set_var")
                .expect("prepare_process sets the environment");
            let guard = text[..at]
                .rfind("only_thread()")
                .expect("a thread-count guard");
            assert!(at - guard < 400, "the guard is right before the change");
            assert_eq!(text.matches("env::set_var").count(), 1);
            continue;
        }
        assert!(
            !text.contains("env::set_var") && !text.contains("env::remove_var"),
            "{} changes the environment",
            f.display()
        );
    }
}
