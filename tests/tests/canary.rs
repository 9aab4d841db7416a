//! The lateness canary on a real RabbitMQ: `serve` sends a probe through each
//! strategy every period, consumes them from its own queue, and exports the
//! lateness per strategy as a histogram; none arrives early.

use std::time::Duration;

use hourglass::service::Service;
use hourglass_e2e::serve::Served;
use hourglass_e2e::*;

/// How late a probe may be on average. Binary levels and hold queues keep
/// whole milliseconds here (a 1 s probe); the on-time window measured for the
/// levels is 100 ms (tests/tests/early.rs).
const ON_TIME_MS: f64 = 100.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_strategy_gets_a_probe_whose_lateness_is_exported_and_never_early() {
    let (levels, held, canary_queue) = (unique("canary-levels"), unique("canary-held"), unique("canary"));
    let text = config_text(
        &format!("planner = \"binary-levels\"\nprefix = \"{levels}\""),
        &format!(
            "[service.canary]\nqueue = \"{canary_queue}\"\nevery = \"300ms\"\ndelay = \"1s\"\n\n\
             [strategies.held]\nplanner = \"hold-queues\"\nprefix = \"{held}\"\n"
        ),
    );
    let config = hourglass::config::Config::parse(std::path::Path::new("canary.toml"), format!("default_strategy = \"main\"\n{text}")).unwrap();
    // Both strategies' static topology (hold-queues' per-delay queues expire on
    // their own) and the canary's queue, deleted also when the test fails.
    let cleanup = Cleanup::declared(&topologies_of(&config, &["main", "held"]));
    cleanup.queue(&canary_queue);
    let connection = connect().await;
    let served = Served::start(Service::start(config.clone()).await.expect("service starts")).await;
    until("the canary consuming (readyz 200)", Duration::from_secs(10), async || served.http.call("GET", "/readyz", None, None).await.0 == 200).await;
    let channel = connection.create_channel().await.unwrap();
    let passive = lapin::options::QueueDeclareOptions { passive: true, ..Default::default() };
    let queue = channel.queue_declare(canary_queue.as_str().into(), passive, Default::default()).await.expect("the canary queue is declared");
    assert_eq!(queue.consumer_count(), 1, "serve consumes its canary queue");

    for strategy in ["main", "held"] {
        let count = format!("hourglass_delivery_lateness_seconds_count{{strategy=\"{strategy}\"}}");
        until(&format!("three probes through {strategy}"), Duration::from_secs(15), async || served.http.metric(&count).await >= 3.0).await;
        let sum = served.http.metric(&format!("hourglass_delivery_lateness_seconds_sum{{strategy=\"{strategy}\"}}")).await;
        let mean_ms = sum * 1_000.0 / served.http.metric(&count).await;
        eprintln!("{strategy}: probes {mean_ms:.1} ms late on average");
        assert!((0.0..=ON_TIME_MS).contains(&mean_ms), "{strategy}: probes {mean_ms:.1} ms late on average (window {ON_TIME_MS} ms)");
    }
    assert_eq!(served.http.metric("hourglass_delivery_early_total").await, 0.0, "no probe arrived early");

    served.stop().await;
}
