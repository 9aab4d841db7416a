//! Planner call and load costs. Run: `cargo bench -p hourglass --bench planner
//! [PART…]`, parts `languages`, `plan`, `parallel`, `loading` (all when none is
//! named; `plan` alone suits `valgrind --tool=callgrind`). Method: BENCHMARKS.md.

use std::hint::black_box;
use std::sync::Mutex;
use std::time::Instant;

use binary_levels::{BinaryLevels, Config};
use hourglass::planner::{LoadedPlanner, PlanRequest, PlannerLimits, PlannerRuntime, PlannerSource};
use hourglass_planner_sdk::{PlanRequest as NativeRequest, Planner};

/// Median of `rounds` rounds of `iterations` calls, in nanoseconds per call.
fn measure(rounds: usize, iterations: u32, mut f: impl FnMut()) -> f64 {
    for _ in 0..iterations {
        f(); // warm up
    }
    let mut per_call: Vec<f64> = (0..rounds)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..iterations {
                f();
            }
            start.elapsed().as_nanos() as f64 / f64::from(iterations)
        })
        .collect();
    per_call.sort_by(f64::total_cmp);
    per_call[rounds / 2]
}

fn show(name: &str, ns: f64) {
    if ns >= 1_000_000.0 {
        println!("{name:<52} {:>10.3} ms", ns / 1_000_000.0);
    } else {
        println!("{name:<52} {:>10.0} ns", ns);
    }
}

/// Median of `rounds` rounds in which each of `threads` threads makes
/// `calls` calls of `f(thread)`: calls per second, all threads together.
fn throughput(rounds: usize, threads: usize, calls: u32, f: impl Fn(usize) + Sync) -> f64 {
    let mut rates: Vec<f64> = (0..=rounds)
        .map(|_| {
            let start = Instant::now();
            std::thread::scope(|scope| {
                for thread in 0..threads {
                    let f = &f;
                    scope.spawn(move || (0..calls).for_each(|_| f(thread)));
                }
            });
            (threads as f64 * f64::from(calls)) / start.elapsed().as_secs_f64()
        })
        .collect();
    rates.remove(0); // warm-up round
    rates.sort_by(f64::total_cmp);
    rates[rounds / 2]
}

fn plan_once(planner: &LoadedPlanner) {
    let request = PlanRequest { destination: "orders".into(), delay_ms: 1_925_000, message_id: "m".into(), routing_key: None };
    black_box(planner.plan(black_box(&request)).unwrap());
}

/// The same back-off strategy written in Rust, Python and JavaScript
/// (examples/backoff-planner, python-planner, js-planner): call cost,
/// component size, first compile and a cached load, in one run.
fn languages() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let planners = [
        ("Rust", hourglass_planner_build::test_planner("backoff-planner"), "hourglass_planner_build::test_planner"),
        ("Python", root.join("examples/python-planner/planner.wasm"), "examples/python-planner/build"),
        ("JavaScript", root.join("examples/js-planner/planner.wasm"), "examples/js-planner/build"),
    ];
    // A language runtime needs room to start (Python takes 13–16 MiB) and time to instantiate.
    let limits = PlannerLimits { memory_bytes: 64 << 20, start_timeout: std::time::Duration::from_secs(30), ..PlannerLimits::default() };
    let config = r#"{"base":"1s","cap":"64s"}"#;
    let delays = [1_500u64, 2_500, 30_000, 0];
    println!("\nthe back-off strategy in three languages (plan: median of 11 rounds of 2,000 calls)");
    println!("{:<12} {:>10} {:>12} {:>14} {:>16}", "language", "size KiB", "plan() ns", "compile cold", "cached load");
    for (language, path, build) in planners {
        let Ok(size) = std::fs::metadata(&path).map(|m| m.len()) else {
            println!("{language:<12} skipped: {} is missing ({build})", path.display());
            continue;
        };
        let source = PlannerSource::File(path);
        let cache = std::env::temp_dir().join(format!("hourglass-bench-lang-{}-{language}", std::process::id()));
        let cached = PlannerRuntime::new(limits, Some(cache.clone())).unwrap();
        let started = Instant::now();
        cached.compile(&source).unwrap();
        let compile_cold = started.elapsed().as_nanos() as f64;
        let load_cached = measure(3, 3, || {
            black_box(cached.load(&source, config.into()).unwrap());
        });
        let planner = cached.load(&source, config.into()).unwrap();
        let mut i = 0;
        let call = measure(11, 2_000, || {
            i += 1;
            let request = PlanRequest { destination: "orders".into(), delay_ms: delays[i % delays.len()], message_id: "m".into(), routing_key: None };
            black_box(planner.plan(black_box(&request)).unwrap());
        });
        println!("{language:<12} {:>10} {call:>12.0} {:>11.0} ms {:>13.1} ms", size / 1024, compile_cold / 1e6, load_cached / 1e6);
        let _ = std::fs::remove_dir_all(&cache);
    }
}

fn main() {
    let parts: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let wanted = |part: &str| parts.is_empty() || parts.iter().any(|p| p == part);
    if wanted("languages") {
        languages();
    }
    let runtime = PlannerRuntime::new(PlannerLimits::default(), None).unwrap();
    if wanted("plan") {
        plan_against_native(&runtime);
    }
    if wanted("parallel") {
        parallel(&runtime);
    }
    if wanted("loading") {
        loading();
    }
}

/// plan() of binary-levels through the component and natively, same delays.
fn plan_against_native(runtime: &PlannerRuntime) {
    let delays = [10_000u64, 1_925_000, 86_400_000, 0, 268_435_455_000];

    // plan() through the component, as the host calls it.
    let planner = runtime.load(&PlannerSource::Builtin("binary-levels"), "{}".into()).unwrap();
    let mut i = 0;
    let wasm = measure(21, 20_000, || {
        i += 1;
        let request = PlanRequest { destination: "orders".into(), delay_ms: delays[i % delays.len()], message_id: "m".into(), routing_key: None };
        black_box(planner.plan(black_box(&request)).unwrap());
    });

    // The same planner logic compiled natively.
    let native_planner = BinaryLevels::new(Config::default()).unwrap();
    let mut j = 0;
    let native = measure(21, 20_000, || {
        j += 1;
        let request = NativeRequest { destination: "orders".into(), delay_ms: delays[j % delays.len()], message_id: "m".into(), routing_key: None };
        black_box(native_planner.plan(black_box(&request)).unwrap());
    });

    // The floor of any plan() on this machine: a component call whose plan
    // is empty (tests/planners/misbehaving).
    let nothing = runtime.load(&PlannerSource::File(hourglass_planner_build::test_planner("misbehaving")), "{}".into()).expect("load misbehaving.wasm");
    let request = PlanRequest { destination: "nothing".into(), delay_ms: 0, message_id: "m".into(), routing_key: None };
    let floor = measure(21, 20_000, || {
        black_box(nothing.plan(black_box(&request)).unwrap());
    });

    println!("plan() of binary-levels, 5 delays in rotation");
    show("  through WebAssembly (host call, checks, conversion)", wasm);
    show("  native Rust, same logic", native);
    println!("{:<52} {:>10.1} x", "  ratio", wasm / native);
    show("  for scale: a component plan() that returns nothing", floor);
}

fn parallel(runtime: &PlannerRuntime) {
    // Parallel calls: two strategies (each its own pool), one thread vs two;
    // and the same two threads behind one lock, as every call was before pools.
    let strategies = [
        runtime.load(&PlannerSource::Builtin("binary-levels"), "{}".into()).unwrap(),
        runtime.load(&PlannerSource::Builtin("hold-queues"), "{}".into()).unwrap(),
    ];
    let one_lock = Mutex::new(());
    let calls = 20_000;
    let one_thread = throughput(11, 1, calls, |_| {
        plan_once(&strategies[0]);
        plan_once(&strategies[1]);
    }) * 2.0;
    let two_threads = throughput(11, 2, calls, |thread| plan_once(&strategies[thread]));
    let two_threads_same = throughput(11, 2, calls, |_| plan_once(&strategies[0]));
    let two_threads_locked = throughput(11, 2, calls, |thread| {
        let _lock = one_lock.lock().unwrap();
        plan_once(&strategies[thread]);
    });
    println!("\nplan() of two strategies (binary-levels, hold-queues), calls per second");
    let rate = |name: &str, r: f64| println!("{name:<52} {r:>10.0} /s");
    rate("  one thread, alternating", one_thread);
    rate("  two threads, one strategy each", two_threads);
    rate("  two threads, both on binary-levels (its pool)", two_threads_same);
    rate("  two threads behind one lock (before pools)", two_threads_locked);
    println!("{:<52} {:>10.2} x", "  two threads / one thread", two_threads / one_thread);
}

fn loading() {
    // Loading: compile from scratch vs load the cached compiled component.
    let cache = std::env::temp_dir().join(format!("hourglass-bench-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let cold_runtime = PlannerRuntime::new(PlannerLimits::default(), None).unwrap();
    let cached_runtime = PlannerRuntime::new(PlannerLimits::default(), Some(cache.clone())).unwrap();
    let source = PlannerSource::Builtin("binary-levels");
    cached_runtime.compile(&source).unwrap(); // fill the cache
    let compile_cold = measure(5, 3, || {
        black_box(cold_runtime.compile(&source).unwrap());
    });
    let compile_cached = measure(11, 50, || {
        black_box(cached_runtime.compile(&source).unwrap());
    });
    let load_cold = measure(5, 3, || {
        black_box(cold_runtime.load(&source, "{}".into()).unwrap());
    });
    let load_cached = measure(11, 50, || {
        black_box(cached_runtime.load(&source, "{}".into()).unwrap());
    });
    println!("\nloading binary-levels ({} KiB component)", hourglass::planner::builtin::component("binary-levels").unwrap().len() / 1024);
    show("  compile, cold (cranelift)", compile_cold);
    show("  compile, from the on-disk cache", compile_cached);
    show("  load + instantiate + configure, cold", load_cold);
    show("  load + instantiate + configure, cached", load_cached);
    println!("{:<52} {:>10.1} x", "  cold / cached (load)", load_cold / load_cached);
    let _ = std::fs::remove_dir_all(&cache);
}
