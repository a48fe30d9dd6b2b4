//! Finding and loading ONNX Runtime.
//!
//! reflex links ONNX Runtime dynamically (ort's `load-dynamic`), so one binary runs with the CPU
//! library on a laptop and the CUDA/TensorRT build on a Jetson. The library is looked up in this
//! order, and the first hit wins:
//!
//! 1. `ORT_DYLIB_PATH`, the path of the shared library itself;
//! 2. an installed bundle's own copy: `<prefix>/lib/libonnxruntime.so*` beside `<prefix>/bin/reflex`
//!    (what `reflex bundle` packs and its install script puts in place);
//! 3. the project environment: `.venv/lib/python3*/site-packages/onnxruntime/capi/` in the
//!    current directory or one of its parents, or beside the executable (what `make` installs);
//! 4. an `onnxruntime` package importable by `python3`.
//!
//! If none is found, [`find_onnxruntime`] fails with one message that says how to install it.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The ONNX Runtime release whose C API the `api-31` feature of ort targets; `make` installs the
/// matching `onnxruntime==1.31.1` wheel.
pub const ORT_VERSION: &str = "1.31.1";

/// How the library was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// `ORT_DYLIB_PATH`.
    EnvVar,
    /// `<prefix>/lib/` of an installed bundle, beside `<prefix>/bin/reflex`.
    Bundle,
    /// The project's `.venv`.
    ProjectEnv,
    /// `python3 -c "import onnxruntime"`.
    Python,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::EnvVar => "ORT_DYLIB_PATH",
            Source::Bundle => "the bundle's lib/ beside bin/reflex",
            Source::ProjectEnv => "the project environment (.venv)",
            Source::Python => "the python3 onnxruntime package",
        })
    }
}

/// A located ONNX Runtime shared library.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// Path of `libonnxruntime.so*`.
    pub path: PathBuf,
    /// Where it came from.
    pub source: Source,
}

/// Why ONNX Runtime could not be used.
#[derive(Debug, thiserror::Error)]
pub enum OrtError {
    /// `ORT_DYLIB_PATH` is set to a file that does not exist.
    #[error(
        "ORT_DYLIB_PATH is set to `{0}`, which does not exist; point it at libonnxruntime.so or unset it"
    )]
    BadEnvVar(String),
    /// Nothing found anywhere.
    #[error(
        "ONNX Runtime was not found (looked at ORT_DYLIB_PATH, a bundle's lib/ beside bin/reflex, .venv/lib/python3*/site-packages/onnxruntime \
         in {searched}, and python3's onnxruntime). Install it with one of:\n\
         \x20 - `make test` or `make demo` in the reflex checkout (creates .venv with onnxruntime=={ORT_VERSION});\n\
         \x20 - `python3 -m pip install onnxruntime=={ORT_VERSION}` (CPU);\n\
         \x20 - on a Jetson (JetPack 6), install NVIDIA's onnxruntime-gpu wheel for your JetPack (CUDA and TensorRT \
         providers) and set ORT_DYLIB_PATH to its onnxruntime/capi/libonnxruntime.so.*;\n\
         \x20 - or set ORT_DYLIB_PATH to any libonnxruntime.so of version {ORT_VERSION} or newer."
    )]
    NotFound {
        /// Directories searched for a project environment.
        searched: String,
    },
    /// The library exists but could not be loaded.
    #[error("ONNX Runtime at `{path}` could not be loaded: {message}")]
    Load {
        /// Library path.
        path: String,
        /// Loader message.
        message: String,
    },
}

/// Looks for the library in `<root>/.venv/lib/python3*/site-packages/onnxruntime/capi/`.
fn in_venv(root: &Path) -> Option<PathBuf> {
    let lib = root.join(".venv").join("lib");
    let mut pythons: Vec<PathBuf> = std::fs::read_dir(&lib)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("python3"))
        })
        .collect();
    pythons.sort();
    pythons
        .into_iter()
        .find_map(|py| lib_in_capi(&py.join("site-packages").join("onnxruntime").join("capi")))
}

/// An installed bundle's library: `<prefix>/lib/libonnxruntime.so*` when the executable lives in
/// `<prefix>/bin/`.
fn in_bundle(exe_dir: &Path) -> Option<PathBuf> {
    if exe_dir.file_name()? != "bin" {
        return None;
    }
    lib_in_capi(&exe_dir.parent()?.join("lib"))
}

/// The newest-looking `libonnxruntime.so*` in a directory (a wheel's `capi`, a bundle's `lib`).
fn lib_in_capi(capi: &Path) -> Option<PathBuf> {
    let mut libs: Vec<PathBuf> = std::fs::read_dir(capi)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                n.starts_with("libonnxruntime.so")
                    || n.starts_with("libonnxruntime.") && n.ends_with(".dylib")
            })
        })
        .collect();
    // Prefer the fully versioned name (libonnxruntime.so.1.31.1) over shorter aliases.
    libs.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    libs.into_iter().next()
}

fn python_capi(python: &str) -> Option<PathBuf> {
    let out = std::process::Command::new(python)
        .args([
            "-c",
            "import onnxruntime, os; print(os.path.dirname(onnxruntime.__file__))",
        ])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let dir = String::from_utf8(out.stdout).ok()?;
    lib_in_capi(&Path::new(dir.trim()).join("capi"))
}

/// The lookup with its inputs made explicit (for tests): the value of `ORT_DYLIB_PATH`, the
/// executable's directory, the roots that may hold a `.venv`, and the Python interpreter to ask.
pub fn find_with(
    env_var: Option<&str>,
    exe_dir: Option<&Path>,
    roots: &[PathBuf],
    python: Option<&str>,
) -> Result<Found, OrtError> {
    if let Some(p) = env_var.filter(|p| !p.is_empty()) {
        let path = PathBuf::from(p);
        return if path.exists() {
            Ok(Found {
                path,
                source: Source::EnvVar,
            })
        } else {
            Err(OrtError::BadEnvVar(p.into()))
        };
    }
    if let Some(path) = exe_dir.and_then(in_bundle) {
        return Ok(Found {
            path,
            source: Source::Bundle,
        });
    }
    for root in roots {
        if let Some(path) = in_venv(root) {
            return Ok(Found {
                path,
                source: Source::ProjectEnv,
            });
        }
    }
    if let Some(path) = python.and_then(python_capi) {
        return Ok(Found {
            path,
            source: Source::Python,
        });
    }
    Err(OrtError::NotFound {
        searched: roots
            .iter()
            .map(|r| r.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// Directories that may hold the project environment: the current directory and its parents,
/// then the executable's directory and its parents.
pub fn default_roots() -> Vec<PathBuf> {
    let mut roots = Vec::new();
    let mut push_ancestors = |p: &Path| {
        for a in p.ancestors() {
            if !roots.iter().any(|r: &PathBuf| r == a) {
                roots.push(a.to_path_buf());
            }
        }
    };
    if let Ok(cwd) = std::env::current_dir() {
        push_ancestors(&cwd);
    }
    if let Ok(exe) = std::env::current_exe()
        && let Some(dir) = exe.parent()
    {
        push_ancestors(dir);
    }
    roots
}

/// Finds ONNX Runtime with the real environment.
pub fn find_onnxruntime() -> Result<Found, OrtError> {
    let var = std::env::var("ORT_DYLIB_PATH").ok();
    let exe = std::env::current_exe().ok();
    let exe_dir = exe.as_deref().and_then(Path::parent);
    find_with(var.as_deref(), exe_dir, &default_roots(), Some("python3"))
}

static ENV: OnceLock<ort::environment::Environment> = OnceLock::new();

/// Loads the library and creates the process-wide ONNX Runtime environment (once).
pub fn init(found: &Found) -> Result<&'static ort::environment::Environment, OrtError> {
    if let Some(e) = ENV.get() {
        return Ok(e);
    }
    let load = |e: &dyn fmt::Display| OrtError::Load {
        path: found.path.display().to_string(),
        message: e.to_string(),
    };
    let builder = ort::init_from(&found.path).map_err(|e| load(&e))?;
    let env = builder.with_name("reflex").build().map_err(|e| load(&e))?;
    Ok(ENV.get_or_init(|| env))
}

/// Finds and loads ONNX Runtime: the one call a command that runs models makes at start-up. A
/// library this process already loaded ([`init`] with one a command found itself, such as the
/// LeRobot importer's tools environment) is kept.
pub fn ensure() -> Result<&'static ort::environment::Environment, OrtError> {
    if let Some(e) = ENV.get() {
        return Ok(e);
    }
    let found = find_onnxruntime()?;
    tracing::info!(
        "ONNX Runtime: {} (via {})",
        found.path.display(),
        found.source
    );
    init(&found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_venv(root: &Path, py: &str, lib: &str) -> PathBuf {
        let capi = root
            .join(".venv/lib")
            .join(py)
            .join("site-packages/onnxruntime/capi");
        std::fs::create_dir_all(&capi).unwrap();
        let p = capi.join(lib);
        std::fs::write(&p, b"").unwrap();
        p
    }

    #[test]
    fn env_var_wins_over_everything() {
        let d = tempfile::tempdir().unwrap();
        fake_venv(d.path(), "python3.11", "libonnxruntime.so.1.31.1");
        let lib = d.path().join("custom.so");
        std::fs::write(&lib, b"").unwrap();
        let f = find_with(Some(lib.to_str().unwrap()), None, &[d.path().into()], None).unwrap();
        assert_eq!(
            f,
            Found {
                path: lib,
                source: Source::EnvVar
            }
        );
    }

    #[test]
    fn env_var_to_a_missing_file_is_an_error_not_a_fallback() {
        let d = tempfile::tempdir().unwrap();
        fake_venv(d.path(), "python3.11", "libonnxruntime.so.1.31.1");
        let e = find_with(
            Some("/nope/libonnxruntime.so"),
            None,
            &[d.path().into()],
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("/nope/libonnxruntime.so") && e.contains("ORT_DYLIB_PATH"),
            "{e}"
        );
    }

    #[test]
    fn project_venv_is_found_and_versioned_name_preferred() {
        let d = tempfile::tempdir().unwrap();
        fake_venv(d.path(), "python3.11", "libonnxruntime.so");
        let versioned = fake_venv(d.path(), "python3.11", "libonnxruntime.so.1.31.1");
        let f = find_with(
            None,
            Some(Path::new("/nonexistent/bin")),
            &[PathBuf::from("/nonexistent"), d.path().into()],
            None,
        )
        .unwrap();
        assert_eq!(
            f,
            Found {
                path: versioned,
                source: Source::ProjectEnv
            }
        );
    }

    #[test]
    fn nothing_found_says_how_to_install_including_jetson() {
        let d = tempfile::tempdir().unwrap();
        let e = find_with(None, None, &[d.path().into()], Some("/nonexistent/python3"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("pip install onnxruntime==1.31.1"), "{e}");
        assert!(e.contains("Jetson") && e.contains("ORT_DYLIB_PATH"), "{e}");
        assert!(e.contains(&d.path().display().to_string()), "{e}");
    }

    #[test]
    fn a_bundles_own_library_comes_before_the_project_environment() {
        let d = tempfile::tempdir().unwrap();
        fake_venv(d.path(), "python3.11", "libonnxruntime.so.1.31.1");
        let prefix = d.path().join("opt/reflex/current");
        std::fs::create_dir_all(prefix.join("bin")).unwrap();
        std::fs::create_dir_all(prefix.join("lib")).unwrap();
        let lib = prefix.join("lib/libonnxruntime.so.1.31.1");
        std::fs::write(&lib, b"").unwrap();
        std::fs::write(prefix.join("lib/libonnxruntime_providers_shared.so"), b"").unwrap();
        let f = find_with(None, Some(&prefix.join("bin")), &[d.path().into()], None).unwrap();
        assert_eq!(
            f,
            Found {
                path: lib,
                source: Source::Bundle
            }
        );
        // An executable outside a `bin/` (cargo's target/release) never looks in a sibling lib/.
        let f = find_with(None, Some(&prefix.join("lib")), &[d.path().into()], None).unwrap();
        assert_eq!(f.source, Source::ProjectEnv);
    }
}
