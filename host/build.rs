//! Builds the built-in planners for `wasm32-wasip2` so they can be
//! embedded in the binary (src/planner/builtin.rs) and `cargo run` needs no
//! separate step. Nothing else: the tests build the test planners they load
//! (`hourglass_planner_build::test_planner`).

use std::env;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use hourglass_planner_build::{build, component_file, target_dir_above};

const BUILTINS: [&str; 6] = ["binary-levels", "hold-queues", "fixed-intervals", "sqs-cycles", "nats-hold", "nats-schedule"];

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().unwrap().to_path_buf();
    // The built-ins, the SDK and contract they are built with, and the profile and versions they are built at.
    for watched in ["wit", "planners", "Cargo.lock", "Cargo.toml"] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }

    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    let target_dir = target_dir_above(&out_dir).unwrap_or_else(|| root.join("target"));
    ensure_wasm_target(&out_dir);
    let built = build(&target_dir, &BUILTINS).unwrap_or_else(|err| panic!("{err}"));
    for package in BUILTINS {
        let file = component_file(package);
        fs::copy(built.join(&file), out_dir.join(&file)).expect("copy planner component");
    }
}

/// rustup installs rust-toolchain.toml's targets only with the toolchain; on
/// a machine that already had the toolchain, add the target here so a plain
/// `cargo run` works.
fn ensure_wasm_target(out_dir: &Path) {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string());
    // Where this rustc looks for the target's standard library, whatever its sysroot or toolchain directory.
    let Ok(output) = Command::new(rustc).args(["--print", "target-libdir", "--target", "wasm32-wasip2"]).output() else { return };
    let libdir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    if !output.status.success() || libdir.is_dir() {
        return;
    }
    println!("cargo:warning=adding the wasm32-wasip2 target with rustup (planners are built for it)");
    // Its stdout too goes to stderr: a build script's stdout is instructions to cargo.
    let _ = Command::new("rustup").args(["target", "add", "wasm32-wasip2"]).stdout(Stdio::from(io::stderr())).status();
    if libdir.is_dir() {
        // Cargo repeats a build script's warnings on every build until the
        // script runs again. A watched path that never exists makes the next
        // build run it once more (and rebuild this crate), finding the target.
        println!("cargo:rerun-if-changed={}", out_dir.join("run-again-now-wasm32-wasip2-is-added").display());
    }
}
