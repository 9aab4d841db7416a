//! Seeing what is in flight on a real RabbitMQ: `GET /v1/delays`,
//! `hourglass_pending_messages{strategy,level}` and `hourglass inspect` count
//! the messages waiting in a strategy's level queues.

use std::time::Duration;

use hourglass::service::Service;
use hourglass_e2e::serve::{Served, metric_sum};
use hourglass_e2e::*;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_messages_are_counted_per_level_by_the_api_the_metrics_and_the_cli() {
    let prefix = unique("inspect");
    let strategy_table = format!("planner = \"binary-levels\"\nprefix = \"{prefix}\"");
    let config = config(&strategy_table);
    // Deletes what the test declares, also when it fails.
    let cleanup = Cleanup::declared(&topology_of(&config));
    let connection = connect().await;
    let destination = Destination::declare(&connection, "inspect").await;
    cleanup.queue(&destination.name);
    let served = Served::start(Service::start(config.clone()).await.expect("service starts")).await;
    const WAITING: u64 = 5;
    for n in 0..WAITING {
        let (status, answer) = served.http.schedule(None, json!({ "destination": destination.name, "delay": format!("{}s", 60 + n), "body": "later" })).await;
        assert_eq!(status, 202, "{answer}");
    }

    let waiting = async || {
        let (_, text) = served.http.call("GET", "/v1/delays?strategy=main", None, None).await;
        let delays: Value = serde_json::from_str(&text).unwrap();
        delays["strategies"][0]["waiting"].as_u64()
    };
    until("the API counting the five messages", Duration::from_secs(15), async || waiting().await == Some(WAITING)).await;
    let (_, text) = served.http.call("GET", "/v1/delays", None, None).await;
    let delays: Value = serde_json::from_str(&text).unwrap();
    let main = &delays["strategies"][0];
    assert_eq!(main["strategy"], "main");
    let holding: Vec<&Value> = main["queues"].as_array().unwrap().iter().filter(|q| q["messages"].as_u64().unwrap_or(0) > 0).collect();
    assert!(holding.iter().all(|q| q["queue"].as_str().unwrap().starts_with(&prefix) && q["ttl_ms"].as_u64().is_some()), "{holding:?}");
    let (_, metrics) = served.http.call("GET", "/metrics", None, None).await;
    assert_eq!(metric_sum(&metrics, "hourglass_pending_messages{strategy=\"main\""), WAITING as f64, "{metrics}");
    let (status, _) = served.http.call("GET", "/v1/delays?strategy=nope", None, None).await;
    assert_eq!(status, 400, "an unknown strategy is named");

    let path = std::env::temp_dir().join(format!("{prefix}.toml"));
    std::fs::write(&path, config_text(&strategy_table, "")).unwrap();
    let output = std::process::Command::new(hourglass_binary()).args(["--config", path.to_str().unwrap(), "inspect", "--format", "json"]).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let inspected: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(inspected[0]["waiting"], WAITING, "{inspected}");
    assert_eq!(inspected[0]["parked"], 0, "{inspected}");
    std::fs::remove_file(&path).ok();

    served.stop().await;
}

/// hold-queues makes a queue per delay on first use: the depth reading finds
/// them through the management API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_queues_made_per_message_are_counted_through_the_management_api() {
    let prefix = unique("inspect-hold");
    let config = config(&format!("planner = \"hold-queues\"\nprefix = \"{prefix}\""));
    let cleanup = Cleanup::declared(&topology_of(&config));
    let connection = connect().await;
    let destination = Destination::declare(&connection, "inspect-hold").await;
    cleanup.queue(&destination.name);
    // The queues the two delays make (they would expire on their own, a minute on).
    for delay_ms in [60_000, 61_000] {
        cleanup.queue(&format!("{prefix}.{delay_ms}ms.{}", destination.name));
    }
    let served = Served::start(Service::start(config.clone()).await.expect("service starts")).await;
    for delay in ["60s", "60s", "61s"] {
        let (status, answer) = served.http.schedule(None, json!({ "destination": destination.name, "delay": delay, "body": "later" })).await;
        assert_eq!(status, 202, "{answer}");
    }
    let holding = async || -> Vec<(String, u64)> {
        let (_, text) = served.http.call("GET", "/v1/delays?strategy=main", None, None).await;
        let delays: Value = serde_json::from_str(&text).unwrap();
        let queues = delays["strategies"][0]["queues"].as_array().cloned().unwrap_or_default();
        queues.iter().filter_map(|q| Some((q["queue"].as_str()?.to_string(), q["messages"].as_u64()?))).filter(|(_, n)| *n > 0).collect()
    };
    until("both hold queues counted", Duration::from_secs(15), async || holding().await.len() == 2).await;
    let mut counted = holding().await;
    counted.sort();
    assert_eq!(counted, [(format!("{prefix}.60000ms.{}", destination.name), 2), (format!("{prefix}.61000ms.{}", destination.name), 1)]);

    served.stop().await;
}
