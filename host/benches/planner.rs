//! Planner call and load costs. Run: `cargo bench -p hourglass --bench planner`.
//! Method: BENCHMARKS.md.

use std::hint::black_box;
use std::time::Instant;

use binary_levels::{BinaryLevels, Config};
use hourglass::planner::{PlanRequest, PlannerLimits, PlannerRuntime, PlannerSource};
use hourglass_planner_sdk::{Planner, PlanRequest as NativeRequest};

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

fn main() {
    let delays = [10_000u64, 1_925_000, 86_400_000, 0, 268_435_455_000];

    // plan() through the component, as the host calls it.
    let runtime = PlannerRuntime::new(PlannerLimits::default(), None).unwrap();
    let planner = runtime.load(&PlannerSource::Builtin("binary-levels"), "{}".into()).unwrap();
    let mut i = 0;
    let wasm = measure(21, 20_000, || {
        i += 1;
        let request = PlanRequest {
            destination: "orders".into(),
            delay_ms: delays[i % delays.len()],
            message_id: "m".into(),
            routing_key: None,
        };
        black_box(planner.plan(black_box(&request)).unwrap());
    });

    // The same planner logic compiled natively.
    let native_planner = BinaryLevels::new(Config { preset: Default::default(), levels: None, unit: None, queue_type: None, redelivery: None, prefix: None }).unwrap();
    let mut j = 0;
    let native = measure(21, 20_000, || {
        j += 1;
        let request = NativeRequest {
            destination: "orders".into(),
            delay_ms: delays[j % delays.len()],
            message_id: "m".into(),
            routing_key: None,
        };
        black_box(native_planner.plan(black_box(&request)).unwrap());
    });

    println!("plan() of binary-levels, 5 delays in rotation");
    show("  through WebAssembly (host call, checks, conversion)", wasm);
    show("  native Rust, same logic", native);
    println!("{:<52} {:>10.1} x", "  ratio", wasm / native);

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
