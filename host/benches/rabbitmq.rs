//! Scheduling throughput on a real RabbitMQ: one confirm at a time vs a window
//! of outstanding confirms. Needs RabbitMQ on $HOURGLASS_AMQP_URL (default
//! guest on 127.0.0.1:5672). Run: `cargo bench -p hourglass --bench rabbitmq`.
//! Method: BENCHMARKS.md.

mod support;

use std::time::Instant;

use hourglass::scheduler::ScheduleRequest;
use support::BenchBroker;

const MESSAGES: usize = 5_000;

#[tokio::main]
async fn main() {
    let (bench, scheduler) = BenchBroker::start().await;
    let destination = bench.destination.clone();
    let requests = || {
        (0..MESSAGES)
            .map(|i| ScheduleRequest { destination: destination.clone(), delay_ms: 3_600_000 + i as u64, body: vec![b'x'; 100], ..Default::default() })
            .collect::<Vec<_>>()
    };
    println!("{MESSAGES} persistent 100-byte messages, binary-levels, 1 h delays");
    for window in [1usize, 10, 100, 1_000] {
        let start = Instant::now();
        let results = scheduler.schedule_many(requests(), window).await;
        let elapsed = start.elapsed();
        assert!(results.iter().all(Result::is_ok));
        println!("  window {window:>5}: {:>8.0} msg/s", MESSAGES as f64 / elapsed.as_secs_f64());
    }

    bench.cleanup().await;
}
