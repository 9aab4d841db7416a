//! Helpers shared by the host's integration tests.
#![allow(dead_code)]

use hourglass::planner::{LoadedPlanner, PlannerLimits, PlannerRuntime, PlannerSource};

/// A test planner's component (`tests/planners/*`, `examples/backoff-planner`), built on first use.
#[allow(unused_imports)] // Not every test loads one.
pub use hourglass_planner_build::test_planner;

pub fn runtime() -> PlannerRuntime {
    PlannerRuntime::new(PlannerLimits::default(), None).expect("engine")
}

/// A runtime whose call budget (5 s) no busy machine reaches: for tests of
/// what planners answer, not of how fast (a 10,000-case property test on a
/// loaded 2-core machine once saw one call of a debug build pass 100 ms).
pub fn patient_runtime() -> PlannerRuntime {
    PlannerRuntime::new(PlannerLimits { call_timeout: std::time::Duration::from_secs(5), ..PlannerLimits::default() }, None).expect("engine")
}

pub fn builtin(runtime: &PlannerRuntime, name: &str, config: serde_json::Value) -> LoadedPlanner {
    let source = PlannerSource::parse(name, std::path::Path::new("."));
    runtime.load(&source, config.to_string()).unwrap_or_else(|e| panic!("load {name}: {e}"))
}
