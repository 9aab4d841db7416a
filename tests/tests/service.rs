//! `hourglass serve`'s HTTP API on a real RabbitMQ: 202 only after the broker
//! confirmed, refusals with nothing published, metrics that add up, and a
//! reload that would put an SQS strategy on RabbitMQ refused. The refusals
//! decided before any broker (every field, 413, the token, connection limits)
//! are tested on the memory broker in host/tests/http.rs.

use std::time::Duration;

use base64::Engine;
use hourglass::service::Service;
use hourglass_e2e::serve::{Served, assert_prometheus_text, metric_sum};
use hourglass_e2e::*;
use serde_json::{Value, json};

/// How late a message scheduled over HTTP may arrive (1 s on 1 s levels: no
/// rounding): measured 18 ms (two tests at a time, 2026-12-02; printed).
/// On RabbitMQ 4.3, in a full run of its tests, a whole-second path measured up to 103 ms (interop.rs nsb-v2); 250 ms holds on both, and a missed 1 s hop is still 1,000 ms late.
const HTTP_ON_TIME_MS: i64 = 250;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_api_schedules_refuses_bad_requests_and_counts() {
    let prefix = unique("serve");
    let config = config(&format!("planner = \"binary-levels\"\nprefix = \"{prefix}\""));
    // Deletes what the test declares, also when it fails.
    let cleanup = Cleanup::declared(&topology_of(&config));
    let connection = connect().await;
    let mut destination = Destination::declare(&connection, "serve").await;
    cleanup.queue(&destination.name);
    let served = Served::start(Service::new(scheduler(&config).await, Some("secret".into()))).await;
    let http = &served.http;
    let dest = destination.name.clone();

    let (status, accepted) =
        http.schedule(Some("secret"), json!({ "destination": dest, "delay": "1s", "body": "hello", "headers": { "tenant": "acme" } })).await;
    assert_eq!(status, 202, "{accepted}");
    assert!(accepted["id"].is_string() && accepted["due_at"].is_u64(), "{accepted}");
    let binary = base64::engine::general_purpose::STANDARD.encode(b"bin\x00ary");
    let (status, second) = http.schedule(Some("secret"), json!({ "destination": dest, "delay": 1500, "body": binary, "encoding": "base64" })).await;
    assert_eq!(status, 202, "{second}");

    let absent = unique("absent");
    let bad_requests = [
        (json!({ "destination": dest, "delay": "soon", "body": "x" }), 400, "delay"),
        (json!({ "destination": dest, "delay": "1s", "body": "x".repeat(300_000) }), 413, "body"),
        // Only the broker knows: no such queue.
        (json!({ "destination": absent, "delay": "1s", "body": "x" }), 422, "destination"),
    ];
    for (body, want_status, field) in bad_requests {
        let (status, error) = http.schedule(Some("secret"), body).await;
        assert_eq!(status, want_status, "{error}");
        assert_eq!(error["field"], field, "{error}");
        assert!(error["error"].as_str().is_some_and(|e| !e.is_empty()), "{error}");
    }
    let (status, _) = http.call("POST", "/v1/messages", Some("wrong"), Some(json!({ "destination": dest, "delay": "1s" }))).await;
    assert_eq!(status, 401);

    let received = destination.receive(2, Duration::from_secs(6)).await;
    let hello = received.iter().find(|r| r.delivery.data == b"hello").expect("text body arrived");
    let late = hello.at_ms as i64 - accepted["due_at"].as_i64().unwrap();
    eprintln!("hello: {late} ms late (window {HTTP_ON_TIME_MS} ms)");
    assert!((0..=HTTP_ON_TIME_MS).contains(&late), "hello arrived {late} ms from its due time (window {HTTP_ON_TIME_MS} ms)");
    assert!(received.iter().any(|r| r.delivery.data == b"bin\x00ary"), "base64 body arrived decoded");
    destination.assert_quiet(Duration::from_millis(500)).await;

    let (status, plan) = http.call("GET", &format!("/v1/plan?destination={dest}&delay=10s"), Some("secret"), None).await;
    assert_eq!(status, 200, "{plan}");
    let plan: Value = serde_json::from_str(&plan).unwrap();
    assert_eq!(plan["commands"][0]["exchange"], format!("{prefix}.direct-level-03"));
    let (status, mermaid) = http.call("GET", "/v1/topology?format=mermaid", Some("secret"), None).await;
    assert_eq!(status, 200);
    assert!(mermaid.starts_with("graph TD") && mermaid.contains(&format!("{prefix}.direct-level-27")), "{mermaid}");
    let (status, json_topology) = http.call("GET", "/v1/topology", Some("secret"), None).await;
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&json_topology).unwrap()["commands"].as_array().unwrap().len(),
        3 + 1 + 28 * 5,
        "parking (3), delivery, 28 levels of two exchanges, a queue and two bindings"
    );
    assert_eq!(http.call("GET", "/v1/topology?format=svg", Some("secret"), None).await.0, 400);
    assert_eq!(http.call("GET", "/healthz", None, None).await.0, 200);
    assert_eq!(http.call("GET", "/readyz", None, None).await.0, 200);

    assert_eq!(http.call("GET", "/metrics", None, None).await.0, 401, "metrics are behind the token");
    let (status, metrics) = http.call("GET", "/metrics", Some("secret"), None).await;
    assert_eq!(status, 200);
    assert_prometheus_text(&metrics);
    let value = |prefix: &str| metric_sum(&metrics, prefix);
    // The destination is not in the config: counted, under a bounded label.
    assert_eq!(value("hourglass_messages_scheduled_total{strategy=\"main\",destination=\"other\"}"), 2.0, "{metrics}");
    assert!(!metrics.contains(&dest) && !metrics.contains(&absent), "no client-chosen names as labels: {metrics}");
    assert_eq!(value("hourglass_requests_rejected_total"), 2.0, "the bad delay and the 413, refused before planning: {metrics}");
    assert_eq!(value("hourglass_messages_failed_total"), 1.0, "the absent destination: {metrics}");
    assert_eq!(value("hourglass_planner_call_seconds_count{strategy=\"main\"}"), 3.0, "one planner call per planned message: {metrics}");
    assert_eq!(value("hourglass_broker_confirm_seconds_count"), 2.0, "one confirm wait per message: {metrics}");

    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_puts_an_sqs_strategy_on_rabbitmq_is_refused_naming_it() {
    let prefix = unique("family");
    let strategy = format!("planner = \"binary-levels\"\nprefix = \"{prefix}\"");
    let path = std::env::temp_dir().join(format!("{}.toml", unique("family")));
    std::fs::write(&path, config_text(&strategy, "[service.ingress]\nenabled = false")).unwrap();
    let config = hourglass::config::Config::load(&path).unwrap();
    let cleanup = Cleanup::declared(&topology_of(&config));
    let connection = connect().await;
    let mut destination = Destination::declare(&connection, "family").await;
    cleanup.queue(&destination.name);
    let served = Served::start(Service::start(config.clone()).await.expect("service starts")).await;

    let more = "[service.ingress]\nenabled = false\n\n[strategies.cycles]\nplanner = \"sqs-cycles\"\ncycle = \"900s\"";
    std::fs::write(&path, format!("default_strategy = \"main\"\n{}", config_text(&strategy, more))).unwrap();
    let (status, answer) = served.http.call("POST", "/v1/reload", None, None).await;
    assert_eq!(status, 422, "{answer}");
    assert!(answer.contains("strategy \\\"cycles\\\"") && answer.contains("sqs-cycles"), "{answer}");
    assert_eq!(served.http.metric("hourglass_reloads_total{outcome=\"refused\"}").await, 1.0);

    // The running config keeps serving.
    let (status, accepted) = served.http.schedule(None, json!({ "destination": destination.name, "delay": "500ms", "body": "still" })).await;
    assert_eq!(status, 202, "{accepted}");
    let received = destination.receive(1, Duration::from_secs(10)).await;
    assert_eq!(received[0].delivery.data, b"still");

    served.stop().await;
    std::fs::remove_file(&path).ok();
}
