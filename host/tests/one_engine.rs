//! One wasmtime engine per process, however planners are loaded: at start,
//! on reload, for a pump, for `verify`, for a CLI command. Its own test
//! binary, so no other test's loads can move the count.

use hourglass::broker::memory::MemoryExecutor;
use hourglass::config::Config;
use hourglass::planner::{PlanRequest, PlannerLimits, PlannerRuntime, PlannerSource, engines_created};
use hourglass::scheduler::strategies::Strategies;
use hourglass::scheduler::{ScheduleRequest, Scheduler};

fn config(dir: &std::path::Path, levels: u32) -> Config {
    let text = format!(
        "default_strategy = \"seconds\"\n[planners]\ncache_dir = {:?}\n[strategies.seconds]\nplanner = \"binary-levels\"\nlevels = {levels}\n[strategies.sqs]\nplanner = \"sqs-cycles\"\n",
        dir.join("cache").display().to_string()
    );
    Config::parse(&dir.join("delay.toml"), text).unwrap()
}

#[tokio::test]
async fn start_reload_pump_verify_and_cli_loads_share_one_engine() {
    assert_eq!(engines_created(), 0, "nothing loaded yet");
    let dir = tempfile::tempdir().unwrap();

    // Start: the service loads every strategy and schedules on them.
    let first = config(dir.path(), 20);
    let scheduler = Scheduler::new(&first, Strategies::load(&first).unwrap(), MemoryExecutor::default());
    let request = ScheduleRequest { destination: "orders".into(), delay_ms: 3_000, ..Default::default() };
    scheduler.schedule(request.clone()).await.unwrap();

    // Reload: a changed config, loaded and swapped in.
    let second = config(dir.path(), 24);
    let strategies = Strategies::load(&second).unwrap();
    scheduler.reload(second.clone(), strategies, true).await.unwrap();
    scheduler.schedule(request).await.unwrap();

    // A pump's planner, loaded on its own.
    let pump_planner = Strategies::load_one(&second, "sqs").unwrap();
    assert!(!pump_planner.destination_setup("orders").unwrap().is_empty());

    // `verify` (serve's topology = "verify", and on reload) loads the config's strategies again.
    let verify = Strategies::load(&second).unwrap();
    assert!(!verify.get("seconds").unwrap().topology().unwrap().is_empty());

    // A CLI command such as check-planner makes its own runtime.
    let cli = PlannerRuntime::new(PlannerLimits::default(), None).unwrap();
    let planner = cli.load(&PlannerSource::Builtin("hold-queues"), "{}".into()).unwrap();
    planner.plan(&PlanRequest { destination: "d".into(), delay_ms: 1, message_id: "m".into(), routing_key: None }).unwrap();

    assert_eq!(engines_created(), 1, "every load above used the process's one engine");
}
