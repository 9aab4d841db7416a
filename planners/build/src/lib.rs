//! Builds this workspace's planner crates for `wasm32-wasip2`, in a cargo of
//! their own: `host/build.rs` the five built-ins it embeds, and the tests,
//! benches and fault suite each test planner they load (`tests/planners/*`,
//! `examples/backoff-planner`), so `cargo run` builds no test planner.
//!
//! Every build goes to one target directory, `<target>/wasm-planners`: not
//! `<target>` itself, whose lock the outer cargo holds for its whole build,
//! but one directory for all of them, so the planners' dependencies are built
//! once and rebuilds are incremental. Cargo's lock on it makes test processes
//! that ask at the same time build one after the other.

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Mutex, PoisonError};

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("cannot run {cargo} to build planners for wasm32-wasip2: {source}")]
    Spawn { cargo: String, source: io::Error },
    #[error(
        "building {packages} for wasm32-wasip2 failed ({status}; cargo's output is above). \
         If the target is missing: rustup target add wasm32-wasip2"
    )]
    Failed { packages: String, status: ExitStatus },
}

/// Where a build into `target_dir` puts the components:
/// `<target_dir>/wasm-planners/wasm32-wasip2/planner`.
pub fn components_dir(target_dir: &Path) -> PathBuf {
    target_dir.join("wasm-planners").join("wasm32-wasip2").join("planner")
}

/// The file cargo names `package`'s component: `off_by_one.wasm` for `off-by-one`.
pub fn component_file(package: &str) -> String {
    format!("{}.wasm", package.replace('-', "_"))
}

/// The cargo target directory `path` is in: the nearest one above it holding
/// the `CACHEDIR.TAG` cargo writes at a target directory's root (the profile
/// and target-triple directories below it have none).
pub fn target_dir_above(path: &Path) -> Option<PathBuf> {
    path.ancestors().find(|dir| dir.join("CACHEDIR.TAG").is_file()).map(Path::to_path_buf)
}

/// Builds `packages`, members of this workspace, with the `planner` profile
/// into `<target_dir>/wasm-planners`; returns [`components_dir`]. Cargo's
/// output goes to stderr, as the caller's own would.
pub fn build(target_dir: &Path, packages: &[&str]) -> Result<PathBuf, BuildError> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let mut command = Command::new(&cargo);
    command.current_dir(&workspace).args(["build", "--profile", "planner", "--target", "wasm32-wasip2", "--target-dir"]).arg(target_dir.join("wasm-planners"));
    for package in packages {
        command.args(["-p", package]);
    }
    // Flags and places meant for the outer build must not leak into this one.
    for var in ["CARGO_ENCODED_RUSTFLAGS", "RUSTFLAGS", "CARGO_BUILD_RUSTFLAGS", "CARGO_TARGET_DIR", "CARGO_BUILD_TARGET", "RUSTC_WORKSPACE_WRAPPER"] {
        command.env_remove(var);
    }
    // A build script's stdout is instructions to cargo.
    command.stdout(Stdio::from(io::stderr()));
    let status = command.status().map_err(|source| BuildError::Spawn { cargo, source })?;
    if !status.success() {
        return Err(BuildError::Failed { packages: packages.join(", "), status });
    }
    Ok(components_dir(target_dir))
}

/// For tests, benches and the fault suite: builds the planner `package` into
/// the target directory this executable was built in, once per process, and
/// returns its component's path. Panics when it cannot: a test needs it.
pub fn test_planner(package: &str) -> PathBuf {
    static BUILT: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    let exe = std::env::current_exe().expect("the path of this executable");
    let target_dir = target_dir_above(&exe).unwrap_or_else(|| panic!("{} is in no cargo target directory (none above it has CACHEDIR.TAG)", exe.display()));
    // Held while building: a second thread asking for the same planner waits for it.
    let mut built = BUILT.lock().unwrap_or_else(PoisonError::into_inner);
    if !built.contains(package) {
        build(&target_dir, &[package]).unwrap_or_else(|err| panic!("{err}"));
        built.insert(package.to_string());
    }
    components_dir(&target_dir).join(component_file(package))
}
