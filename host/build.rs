//! Builds the planner components for `wasm32-wasip2` so the built-in ones can be
//! embedded in the binary and `cargo run` needs no separate step.
//!
//! The nested cargo uses its own target directory (next to ours) because the
//! outer cargo holds the lock on this one for the whole build.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// (package, embedded in the binary as a built-in)
const PLANNERS: &[(&str, bool)] = &[
    ("binary-levels", true),
    ("hold-queues", true),
    ("fixed-intervals", true),
    ("sqs-cycles", true),
    ("backoff-planner", false),
    ("off-by-one", false),
    ("misbehaving", false),
    ("contract-0-1", false),
];

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().unwrap().to_path_buf();
    for watched in ["wit", "planners", "examples/backoff-planner", "tests/planners", "Cargo.lock", "Cargo.toml"] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }

    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    // OUT_DIR is <target>/<profile>/build/<pkg-hash>/out.
    let target_dir = out_dir.ancestors().nth(4).map(Path::to_path_buf).unwrap_or_else(|| root.join("target"));
    let wasm_target_dir = target_dir.join("wasm-planners");

    ensure_wasm_target();
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let mut build = Command::new(cargo);
    build.current_dir(&root).args(["build", "--profile", "planner", "--target", "wasm32-wasip2", "--target-dir"]).arg(&wasm_target_dir);
    for (package, _) in PLANNERS {
        build.args(["-p", package]);
    }
    // Flags meant for the host build must not leak into the wasm build.
    for var in ["CARGO_ENCODED_RUSTFLAGS", "RUSTFLAGS", "CARGO_BUILD_RUSTFLAGS", "CARGO_TARGET_DIR", "CARGO_BUILD_TARGET", "RUSTC_WORKSPACE_WRAPPER"] {
        build.env_remove(var);
    }
    let status = build.status().expect("run cargo to build the planner components");
    if !status.success() {
        panic!(
            "building the planners for wasm32-wasip2 failed (see above). \
             If the target is missing: rustup target add wasm32-wasip2"
        );
    }

    let built = wasm_target_dir.join("wasm32-wasip2").join("planner");
    for (package, builtin) in PLANNERS {
        let file = format!("{}.wasm", package.replace('-', "_"));
        if *builtin {
            fs::copy(built.join(&file), out_dir.join(&file)).expect("copy planner component");
        }
    }
    println!("cargo:rustc-env=HOURGLASS_PLANNER_WASM_DIR={}", built.display());
}

/// rustup installs rust-toolchain.toml's targets only with the toolchain; on
/// a machine that already had the toolchain, add the target here so a plain
/// `cargo run` works.
fn ensure_wasm_target() {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string());
    let Ok(output) = Command::new(rustc).args(["--print", "sysroot"]).output() else { return };
    let sysroot = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    if sysroot.join("lib/rustlib/wasm32-wasip2").exists() {
        return;
    }
    println!("cargo:warning=adding the wasm32-wasip2 target with rustup (planners are built for it)");
    let _ = Command::new("rustup").args(["target", "add", "wasm32-wasip2"]).status();
}
