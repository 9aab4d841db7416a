//! Helpers shared by the host's integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

use hourglass::planner::{LoadedPlanner, PlannerLimits, PlannerRuntime, PlannerSource};

/// A planner component built by `host/build.rs` (examples and test planners).
pub fn wasm(name: &str) -> PathBuf {
    PathBuf::from(env!("HOURGLASS_PLANNER_WASM_DIR")).join(format!("{}.wasm", name.replace('-', "_")))
}

pub fn runtime() -> PlannerRuntime {
    PlannerRuntime::new(PlannerLimits::default(), None).expect("engine")
}

pub fn builtin(runtime: &PlannerRuntime, name: &str, config: serde_json::Value) -> LoadedPlanner {
    let source = PlannerSource::parse(name, std::path::Path::new("."));
    runtime.load(&source, config.to_string()).unwrap_or_else(|e| panic!("load {name}: {e}"))
}
