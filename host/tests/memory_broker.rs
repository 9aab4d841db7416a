//! `serve` on the embedded memory broker (the default) with an SQS strategy:
//! a delay longer than one cycle waits in the strategy's pumped delay queue,
//! and the memory broker's pump hands it to the planner and on, as SQS's
//! pumps do, so it arrives, at or after its due time.

use std::path::Path;
use std::time::{Duration, Instant};

use hourglass::config::Config;
use hourglass::executor::Executor;
use hourglass::scheduler::ScheduleRequest;
use hourglass::service::Service;

/// Lateness allowed: a cycled message's last leg is sent with SQS's
/// whole-second `DelaySeconds`, the remainder rounded up, so it can be up to
/// a second late by design (as on SQS); measured on a quiet machine: direct
/// 0 ms, cycled 310–390 ms late (three runs).
const ON_TIME_MS: i64 = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delay_longer_than_a_cycle_goes_round_the_pump_and_arrives_on_time() {
    let text = "default_strategy = \"cycles\"\n[planners]\ncache = false\n[strategies.cycles]\nplanner = \"sqs-cycles\"\ncycle = \"1s\"\n";
    let config = Config::parse(Path::new("memory.toml"), text.into()).unwrap();
    let service = Service::start(config).await.expect("serve on the memory broker");
    let scheduler = service.scheduler();
    // One direct send (within a cycle) beside two that cycle.
    let mut due = Vec::new();
    // Whole seconds: SQS (and so the memory broker's SQS) delays by whole seconds, rounding a part up.
    for (body, delay_ms) in [("direct", 1_000), ("two-cycles", 2_000), ("three-cycles", 3_000)] {
        let request = ScheduleRequest { destination: "orders".into(), delay_ms, body: body.as_bytes().to_vec(), ..Default::default() };
        let scheduled = scheduler.schedule(request).await.expect("scheduled");
        due.push((scheduled.id, scheduled.due_at_ms));
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    let delivered = loop {
        let delivered = scheduler.executor().delivered("orders").unwrap();
        if delivered.len() == due.len() || Instant::now() > deadline {
            break delivered;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(delivered.len(), due.len(), "every message arrived: {delivered:?}");
    for (id, due_at_ms) in &due {
        let arrival = delivered.iter().find(|d| &d.id == id).unwrap_or_else(|| panic!("{id} arrived"));
        let late = arrival.arrived_at_ms as i64 - *due_at_ms as i64;
        eprintln!("{id}: {late} ms late");
        assert!(late >= 0, "{id} arrived {} ms early", -late);
        assert!(late <= ON_TIME_MS, "{id} arrived {late} ms late (window {ON_TIME_MS} ms)");
    }
}
