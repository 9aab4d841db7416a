//! A planner that loops, panics, traps, allocates without bound or reaches for
//! a WASI capability fails that one call with an error naming it; the next
//! call works.

mod common;

use std::time::Duration;

use hourglass::planner::{PlanRequest, PlannerError, PlannerLimits, PlannerRuntime, PlannerSource};

fn request(destination: &str) -> PlanRequest {
    PlanRequest { destination: destination.into(), delay_ms: 0, message_id: "m1".into(), routing_key: None }
}

fn misbehaving() -> (PlannerRuntime, hourglass::planner::LoadedPlanner) {
    let limits = PlannerLimits { call_timeout: Duration::from_millis(50), memory_bytes: 8 << 20 };
    let runtime = PlannerRuntime::new(limits, None).unwrap();
    let planner = runtime.load(&PlannerSource::File(common::wasm("misbehaving")), "{}".into()).unwrap();
    (runtime, planner)
}

fn assert_fails_then_recovers(destination: &str, expected: &str) {
    let (_runtime, mut planner) = misbehaving();
    let err = planner.plan(&request(destination)).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, PlannerError::Trapped { function: "plan", .. }), "{text}");
    assert!(text.contains("misbehaving.wasm"), "the error names the planner: {text}");
    assert!(text.contains(expected), "{text}");
    let plan = planner.plan(&request("fine")).expect("the next call works");
    assert_eq!(plan.commands.len(), 1);
}

#[test]
fn an_endless_loop_is_stopped_by_the_time_budget() {
    assert_fails_then_recovers("loop", "ran past its time budget of 50ms");
}

#[test]
fn a_panic_fails_the_call_with_the_panic_message() {
    assert_fails_then_recovers("panic", "panicked: asked to panic for m1");
}

#[test]
fn a_trap_fails_the_call() {
    assert_fails_then_recovers("trap", "trapped");
}

#[test]
fn unbounded_allocation_hits_the_memory_limit() {
    assert_fails_then_recovers("allocate", "ran out of its memory limit of 8388608 bytes");
}

#[test]
fn wasi_capabilities_are_not_there() {
    assert_fails_then_recovers("wasi", "trapped");
}

#[test]
fn a_file_that_is_not_wasm_is_named_in_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("planner.wasm");
    std::fs::write(&path, b"definitely not wasm").unwrap();
    let err = common::runtime().load(&PlannerSource::File(path.clone()), "{}".into()).unwrap_err().to_string();
    assert!(err.contains(&path.display().to_string()) && err.contains("magic bytes"), "{err}");
}

#[test]
fn a_core_module_is_not_a_component() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("core.wasm");
    // The smallest valid core module: magic and version 1.
    std::fs::write(&path, b"\0asm\x01\0\0\0").unwrap();
    let err = common::runtime().load(&PlannerSource::File(path), "{}".into()).unwrap_err().to_string();
    assert!(err.contains("is not a WebAssembly component"), "{err}");
}

#[test]
fn a_missing_file_is_named_in_the_error() {
    let err = common::runtime()
        .load(&PlannerSource::File("/nonexistent/planner.wasm".into()), "{}".into())
        .unwrap_err()
        .to_string();
    assert!(err.contains("/nonexistent/planner.wasm") && err.contains("cannot read"), "{err}");
}

#[test]
fn compiled_planners_are_cached_and_a_corrupt_cache_file_is_recompiled() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = PlannerRuntime::new(PlannerLimits::default(), Some(dir.path().to_path_buf())).unwrap();
    let source = PlannerSource::Builtin("hold-queues");
    runtime.load(&source, "{}".into()).unwrap();
    let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "one compiled component cached");
    runtime.load(&source, "{}".into()).unwrap();
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "loaded from cache, not written again");
    std::fs::write(&files[0], b"garbage").unwrap();
    let mut planner = runtime.load(&source, "{}".into()).expect("a corrupt cache entry is recompiled");
    assert!(planner.plan(&PlanRequest { destination: "d".into(), delay_ms: 5, message_id: "m".into(), routing_key: None }).is_ok());
    assert_ne!(std::fs::read(&files[0]).unwrap(), b"garbage", "and rewritten");
}

#[test]
fn a_bad_planner_config_is_refused_with_the_planners_reason() {
    let err = common::runtime()
        .load(&PlannerSource::Builtin("binary-levels"), r#"{"levls": 3}"#.into())
        .unwrap_err()
        .to_string();
    assert!(err.contains("binary-levels rejected its configuration: levls: unknown field `levls`"), "{err}");
}
