//! A planner that loops, panics, traps, allocates without bound or reaches for
//! a WASI capability fails that one call with an error naming it (running out
//! of time is told apart); the next call works. The compiled-planner cache
//! loads only intact entries from a directory no one else can write.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use hourglass::planner::{PlanRequest, PlannerError, PlannerLimits, PlannerRuntime, PlannerSource};

fn request(destination: &str) -> PlanRequest {
    PlanRequest { destination: destination.into(), delay_ms: 0, message_id: "m1".into(), routing_key: None }
}

/// The time budget of calls that must fail for another reason (a trap, a
/// panic, the memory limit): wide, so a loaded machine (a debug build beside
/// other tests) can't turn them into timeouts.
const WIDE_BUDGET: Duration = Duration::from_secs(10);
/// The time budget of the endless-loop call: narrow, so the test is quick.
const LOOP_BUDGET: Duration = Duration::from_millis(50);

fn misbehaving(call_timeout: Duration) -> (PlannerRuntime, hourglass::planner::LoadedPlanner) {
    let limits = PlannerLimits { call_timeout, memory_bytes: 8 << 20, ..PlannerLimits::default() };
    let runtime = PlannerRuntime::new(limits, None).unwrap();
    let planner = runtime.load(&PlannerSource::File(common::test_planner("misbehaving")), "{}".into()).unwrap();
    (runtime, planner)
}

fn assert_fails_then_recovers(destination: &str, call_timeout: Duration, expected: &str) -> PlannerError {
    let (_runtime, planner) = misbehaving(call_timeout);
    assert_eq!(planner.instances(), 1, "loading made and kept one instance");
    let err = planner.plan(&request(destination)).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, PlannerError::Trapped { function: "plan", .. } | PlannerError::Timeout { function: "plan", .. }), "{text}");
    assert!(text.contains("misbehaving.wasm"), "the error names the planner: {text}");
    assert!(text.contains(expected), "{text}");
    assert_eq!(planner.instances(), 0, "the failed instance was dropped, not returned to the pool");
    let plan = planner.plan(&request("fine")).expect("the next call works");
    assert_eq!(plan.commands.len(), 1);
    assert_eq!(planner.instances(), 1, "a fresh instance was made and kept");
    err
}

#[test]
fn an_endless_loop_is_stopped_by_the_time_budget_as_a_timeout() {
    let err = assert_fails_then_recovers("loop", LOOP_BUDGET, "ran past its time budget of 50ms");
    assert!(err.is_timeout(), "{err:?}");
    assert!(matches!(&err, PlannerError::Timeout { function: "plan", budget, .. } if *budget == LOOP_BUDGET), "{err:?}");
}

/// Starting an instance has a budget of its own, wider than a call's (a
/// loaded machine must not fail a load), and a planner that loops while
/// being configured is still stopped by it.
#[test]
fn a_planner_that_loops_while_configured_is_stopped_by_the_start_budget() {
    let limits = PlannerLimits { call_timeout: Duration::from_millis(20), start_timeout: Duration::from_millis(300), memory_bytes: 8 << 20 };
    let runtime = PlannerRuntime::new(limits, None).unwrap();
    // Built before the clock starts: a build would count towards the budget it checks.
    let source = PlannerSource::File(common::test_planner("misbehaving"));
    let started = std::time::Instant::now();
    let err = runtime.load(&source, r#"{"configure": "loop"}"#.into()).unwrap_err();
    let took = started.elapsed();
    assert!(matches!(&err, PlannerError::Timeout { function: "configure", budget, .. } if *budget == Duration::from_millis(300)), "{err:?}");
    assert!(err.to_string().contains("misbehaving.wasm"), "{err}");
    assert!(took >= Duration::from_millis(300), "stopped by the start budget, not the call budget: {took:?}");
    runtime.load(&source, "{}".into()).expect("a well-configured load still works");
}

#[test]
fn traps_panics_and_memory_exhaustion_are_not_timeouts() {
    for destination in ["trap", "panic", "allocate", "wasi"] {
        let (_runtime, planner) = misbehaving(WIDE_BUDGET);
        let err = planner.plan(&request(destination)).unwrap_err();
        assert!(!err.is_timeout() && matches!(err, PlannerError::Trapped { .. }), "{destination}: {err:?}");
    }
}

#[test]
fn a_panic_fails_the_call_with_the_panic_message() {
    assert_fails_then_recovers("panic", WIDE_BUDGET, "panicked: asked to panic for m1");
}

#[test]
fn a_trap_fails_the_call() {
    assert_fails_then_recovers("trap", WIDE_BUDGET, "trapped");
}

#[test]
fn unbounded_allocation_hits_the_memory_limit() {
    assert_fails_then_recovers("allocate", WIDE_BUDGET, "ran out of its memory limit of 8 MiB");
}

#[test]
fn wasi_capabilities_are_not_there() {
    assert_fails_then_recovers("wasi", WIDE_BUDGET, "trapped");
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

/// A component of some other world (here the smallest: an empty one) fits
/// no contract version the host knows, and the error says which it tried.
#[test]
fn a_component_fitting_no_contract_version_is_refused_naming_each() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other-world.wasm");
    // Magic, then the component model's version 0x0d and layer 1: a valid component exporting nothing.
    std::fs::write(&path, b"\0asm\x0d\0\x01\0").unwrap();
    let err = common::runtime().load(&PlannerSource::File(path), "{}".into()).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, PlannerError::WrongContract { .. }), "{text}");
    assert!(text.contains("other-world.wasm") && ["0.3.0", "0.2.0", "0.1.0"].iter().all(|v| text.contains(&format!("as {v}:"))), "{text}");
}

#[test]
fn a_missing_file_is_named_in_the_error() {
    let err = common::runtime().load(&PlannerSource::File("/nonexistent/planner.wasm".into()), "{}".into()).unwrap_err().to_string();
    assert!(err.contains("/nonexistent/planner.wasm") && err.contains("cannot read"), "{err}");
}

/// The one cache entry in `dir`, and its inode (a rewrite renames a new file over it).
fn only_entry(dir: &Path) -> (PathBuf, u64) {
    let files: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "one compiled component cached: {files:?}");
    let inode = std::fs::metadata(&files[0]).unwrap().ino();
    (files[0].clone(), inode)
}

fn plans(planner: &hourglass::planner::LoadedPlanner) -> bool {
    planner.plan(&PlanRequest { destination: "d".into(), delay_ms: 5, message_id: "m".into(), routing_key: None }).is_ok()
}

#[test]
fn compiled_planners_are_cached_and_a_cache_hit_is_loaded_not_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = PlannerRuntime::new(PlannerLimits::default(), Some(dir.path().to_path_buf())).unwrap();
    let source = PlannerSource::Builtin("hold-queues");
    runtime.load(&source, "{}".into()).unwrap();
    let (entry, inode) = only_entry(dir.path());
    assert_eq!(std::fs::metadata(&entry).unwrap().mode() & 0o777, 0o600, "entries are the user's alone");
    let planner = runtime.load(&source, "{}".into()).unwrap();
    assert!(plans(&planner));
    assert_eq!(only_entry(dir.path()), (entry, inode), "loaded from the cache: the entry was not written again");
}

#[test]
fn a_corrupt_cache_file_is_recompiled() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = PlannerRuntime::new(PlannerLimits::default(), Some(dir.path().to_path_buf())).unwrap();
    let source = PlannerSource::Builtin("hold-queues");
    runtime.load(&source, "{}".into()).unwrap();
    let (entry, _) = only_entry(dir.path());
    std::fs::write(&entry, b"garbage").unwrap();
    let planner = runtime.load(&source, "{}".into()).expect("a corrupt cache entry is recompiled");
    assert!(plans(&planner));
    assert_ne!(std::fs::read(&entry).unwrap(), b"garbage", "and rewritten");
}

#[test]
fn a_tampered_cache_file_is_not_loaded_and_the_planner_is_compiled_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = PlannerRuntime::new(PlannerLimits::default(), Some(dir.path().to_path_buf())).unwrap();
    let source = PlannerSource::Builtin("hold-queues");
    runtime.load(&source, "{}".into()).unwrap();
    let (entry, inode) = only_entry(dir.path());
    let original = std::fs::read(&entry).unwrap();
    // One byte of the compiled code changed in place (same file, same length,
    // same header): wasmtime alone would load it and run the changed code.
    let mut tampered = original.clone();
    let middle = tampered.len() / 2;
    tampered[middle] ^= 0x01;
    std::fs::write(&entry, &tampered).unwrap();
    assert_eq!(std::fs::metadata(&entry).unwrap().ino(), inode);

    let planner = runtime.load(&source, "{}".into()).expect("the planner loads, compiled afresh");
    assert!(plans(&planner));
    let (rewritten, new_inode) = only_entry(dir.path());
    assert_ne!(new_inode, inode, "the tampered entry was replaced by a fresh compile");
    assert_eq!(std::fs::read(&rewritten).unwrap(), original, "with exactly what compiling produces");
}

#[test]
fn a_cache_directory_others_can_write_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    for (mode, problem) in
        [(0o777, "writable by group and others (mode 0777)"), (0o770, "writable by group (mode 0770)"), (0o1707, "writable by others (mode 1707)")]
    {
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(mode)).unwrap();
        let err = PlannerRuntime::new(PlannerLimits::default(), Some(dir.path().to_path_buf())).err().expect("refused");
        let text = err.to_string();
        assert!(matches!(err, PlannerError::CacheDir { .. }), "{text}");
        assert!(text.contains(&dir.path().display().to_string()) && text.contains(problem), "{text}");
    }
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    PlannerRuntime::new(PlannerLimits::default(), Some(dir.path().to_path_buf())).expect("readable by others is fine");
}

#[test]
fn a_cache_directory_hourglass_creates_is_private() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("new/cache");
    let runtime = PlannerRuntime::new(PlannerLimits::default(), Some(dir.clone())).unwrap();
    assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
    runtime.load(&PlannerSource::Builtin("hold-queues"), "{}".into()).unwrap();
    only_entry(&dir);
}

#[test]
fn a_file_where_the_cache_directory_should_be_is_refused() {
    let parent = tempfile::tempdir().unwrap();
    let path = parent.path().join("cache");
    std::fs::write(&path, b"").unwrap();
    let err = PlannerRuntime::new(PlannerLimits::default(), Some(path.clone())).err().expect("refused").to_string();
    assert!(err.contains(&path.display().to_string()), "{err}");
}

#[test]
fn a_pool_never_holds_more_instances_than_its_bound() {
    let runtime = common::runtime().with_instances(2);
    let planner = runtime.load(&PlannerSource::Builtin("hold-queues"), "{}".into()).unwrap();
    assert_eq!(planner.max_instances(), 2);
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for _ in 0..200 {
                    assert!(plans(&planner));
                }
            });
        }
    });
    let instances = planner.instances();
    assert!((1..=2).contains(&instances), "{instances} instances");
}

#[test]
fn a_bad_planner_config_is_refused_with_the_planners_reason() {
    let err = common::runtime().load(&PlannerSource::Builtin("binary-levels"), r#"{"levls": 3}"#.into()).unwrap_err().to_string();
    assert!(err.contains("binary-levels rejected its configuration: levls: unknown field `levls`"), "{err}");
}

/// A plan without a publish would drop the message while the client hears
/// "scheduled": it is an error naming the strategy, and nothing is sent.
#[tokio::test]
async fn a_plan_that_publishes_nothing_is_an_error_not_a_schedule() {
    use hourglass::broker::memory::MemoryExecutor;
    use hourglass::config::Config;
    use hourglass::executor::Executor;
    use hourglass::scheduler::strategies::Strategies;
    use hourglass::scheduler::{ScheduleError, ScheduleRequest, Scheduler};

    let text = format!("[planners]\ncache = false\n[strategies.odd]\nplanner = {:?}\n", common::test_planner("misbehaving").display().to_string());
    let config = Config::parse(Path::new("delay.toml"), text).unwrap();
    let broker = MemoryExecutor::default();
    let scheduler = Scheduler::new(&config, Strategies::load(&config).unwrap(), broker);
    let err = scheduler.schedule(ScheduleRequest { destination: "nothing".into(), ..Default::default() }).await.unwrap_err();
    assert!(matches!(err, ScheduleError::Unplannable(_)), "{err}");
    assert!(err.to_string().contains("odd"), "names the strategy: {err}");
    assert_eq!(scheduler.executor().delivered("nothing"), Some(Vec::new()));
    scheduler.schedule(ScheduleRequest { destination: "fine".into(), ..Default::default() }).await.expect("an ordinary plan still schedules");
}

/// The contract is versioned: a planner built against 0.1.0 (before `publish`
/// had `bcc`) still loads, plans, and answers in today's commands.
#[test]
fn a_planner_built_against_contract_0_1_still_loads_and_plans() {
    let runtime = common::runtime();
    let planner = runtime.load(&PlannerSource::File(common::test_planner("contract-0-1")), "{}".into()).expect("a 0.1.0 planner loads");
    assert_eq!(planner.info().name, "contract-0-1");
    let plan = planner.plan(&PlanRequest { delay_ms: 1_500, ..request("orders") }).unwrap();
    assert_eq!(plan.delivers_after_ms, 2_000);
    assert_eq!(plan.commands, vec![hourglass::command::Command::forward("", "orders.wait")]);
    let setup = planner.destination_setup("orders").unwrap();
    assert!(
        matches!(&setup[..], [hourglass::command::Command::Amqp(hourglass::command::AmqpCommand::DeclareQueue { name, .. })] if name == "orders.wait"),
        "{setup:?}"
    );
}

/// A planner built against 0.2.0 (every name a string) still loads, plans
/// with its `bcc` keys kept, and answers in today's commands.
#[test]
fn a_planner_built_against_contract_0_2_still_loads_and_plans_with_bcc() {
    use hourglass::command::{AmqpCommand, Command};
    let runtime = common::runtime();
    let planner = runtime.load(&PlannerSource::File(common::test_planner("contract-0-2")), "{}".into()).expect("a 0.2.0 planner loads");
    assert_eq!(planner.info().name, "contract-0-2");
    let plan = planner.plan(&PlanRequest { delay_ms: 1_500, ..request("orders") }).unwrap();
    assert_eq!(plan.delivers_after_ms, 2_000);
    let [Command::Amqp(AmqpCommand::Publish { exchange, routing_key, bcc, .. })] = &plan.commands[..] else { panic!("one publish: {:?}", plan.commands) };
    assert_eq!((exchange.as_str(), routing_key.as_str(), bcc.as_slice()), ("", "orders.wait", ["copy:m1".to_string()].as_slice()));
    let setup = planner.destination_setup("orders").unwrap();
    assert!(matches!(&setup[..], [Command::Amqp(AmqpCommand::DeclareQueue { name, .. })] if name == "orders.wait"), "{setup:?}");
    let err = runtime.load(&PlannerSource::File(common::test_planner("contract-0-2")), r#"{"panic": true}"#.into()).unwrap_err();
    assert!(err.to_string().contains("asked to panic while configured"), "{err}");
}

/// A planner built against 0.3.0 (registered names, no NATS family) still
/// loads and plans with its registered exchange resolved; asked about a held
/// message it fails that call naming why, as a planner of another family would.
#[test]
fn a_planner_built_against_contract_0_3_still_loads_and_plans_with_registered_names() {
    use hourglass::command::{AmqpCommand, Command, HeldMessage};
    let runtime = common::runtime();
    let planner = runtime.load(&PlannerSource::File(common::test_planner("contract-0-3")), "{}".into()).expect("a 0.3.0 planner loads");
    assert_eq!(planner.info().name, "contract-0-3");
    let plan = planner.plan(&PlanRequest { delay_ms: 1_500, ..request("orders") }).unwrap();
    assert_eq!(plan.delivers_after_ms, 2_000);
    let [Command::Amqp(AmqpCommand::Publish { exchange, routing_key, .. })] = &plan.commands[..] else { panic!("one publish: {:?}", plan.commands) };
    assert_eq!((exchange.as_str(), routing_key.as_str()), ("contract-0-3.wait", "orders"));
    let held = HeldMessage { stream: "s".into(), subject: "s".into(), destination: "orders".into(), due_at_ms: 1, now_ms: 2, deliveries: 1 };
    let err = planner.handle_held(&held).unwrap_err();
    assert!(err.to_string().contains("before 0.4.0"), "{err}");
}

/// A planner built against 0.4.0 (NATS holds, no native schedules) still
/// loads, declares its held stream, plans a publish to its registered hold
/// subject, and waits or hands over a held message as it did.
#[test]
fn a_planner_built_against_contract_0_4_still_holds_and_hands_over_on_nats() {
    use hourglass::command::{Command, HeldAction, HeldMessage, NatsCommand};
    let runtime = common::runtime();
    let planner = runtime.load(&PlannerSource::File(common::test_planner("contract-0-4")), "{}".into()).expect("a 0.4.0 planner loads");
    assert_eq!(planner.info().name, "contract-0-4");
    let topology = planner.topology().unwrap();
    assert!(matches!(&topology[..], [Command::Nats(NatsCommand::EnsureStream { name, held: true, .. })] if name == "contract-0-4-hold"), "{topology:?}");
    let plan = planner.plan(&PlanRequest { delay_ms: 1_500, ..request("orders") }).unwrap();
    assert_eq!(plan.delivers_after_ms, 2_000);
    let [Command::Nats(NatsCommand::Publish { subject, .. })] = &plan.commands[..] else { panic!("one publish: {:?}", plan.commands) };
    assert_eq!(subject, "contract-0-4.hold");
    let held = HeldMessage {
        stream: "contract-0-4-hold".into(),
        subject: "contract-0-4.hold".into(),
        destination: "orders".into(),
        due_at_ms: 5_000,
        now_ms: 4_200,
        deliveries: 1,
    };
    assert_eq!(planner.handle_held(&held).unwrap(), HeldAction::Wait { ms: 800 });
    let action = planner.handle_held(&HeldMessage { now_ms: 5_000, ..held }).unwrap();
    assert!(
        matches!(&action, HeldAction::HandOver { commands } if matches!(&commands[..], [Command::Nats(NatsCommand::Publish { subject, .. })] if subject == "orders")),
        "{action:?}"
    );
}

/// A publish naming a registered name past the planner's list fails that
/// call with an error naming the planner and the index; the next call works.
#[test]
fn an_unregistered_name_fails_the_call_naming_planner_and_index() {
    let (_runtime, planner) = misbehaving(WIDE_BUDGET);
    let err = planner.plan(&request("unregistered")).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, PlannerError::InvalidCommand { function: "plan", .. }), "{text}");
    assert!(text.contains("misbehaving.wasm") && text.contains("registered name 4000000000"), "{text}");
    assert_eq!(planner.plan(&request("fine")).unwrap().commands, vec![hourglass::command::Command::forward("", "fine")]);
}

/// A 0.1.0 planner's panic is named by its message, as a newer one's is.
#[test]
fn a_contract_0_1_planner_that_panics_is_named_with_its_message() {
    let runtime = common::runtime();
    let err = runtime.load(&PlannerSource::File(common::test_planner("contract-0-1")), r#"{"panic": true}"#.into()).unwrap_err();
    assert!(matches!(&err, PlannerError::Trapped { function: "configure", .. }), "{err:?}");
    assert!(err.to_string().contains("asked to panic while configured"), "{err}");
}
