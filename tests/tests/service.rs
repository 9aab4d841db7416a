//! `hourglass serve`'s HTTP API on a real RabbitMQ: 202 only after the broker
//! confirmed, clear 4xx errors with nothing published, metrics that add up.

use std::time::Duration;

use base64::Engine;
use hourglass::service::Service;
use hourglass_e2e::serve::{Served, assert_prometheus_text, metric_sum};
use hourglass_e2e::*;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_api_schedules_refuses_bad_requests_and_counts() {
    let connection = connect().await;
    let prefix = unique("serve");
    let config = config(&format!("planner = \"binary-levels\"\nprefix = \"{prefix}\""));
    let mut destination = Destination::declare(&connection, "serve").await;
    let served = Served::start(Service::new(scheduler(&config).await, Some("secret".into()))).await;
    let http = &served.http;
    let dest = destination.name.clone();

    let (status, accepted) = http.schedule(Some("secret"), json!({ "destination": dest, "delay": "1s", "body": "hello", "headers": { "tenant": "acme" } })).await;
    assert_eq!(status, 202, "{accepted}");
    assert!(accepted["id"].is_string() && accepted["due_at"].is_u64(), "{accepted}");
    let binary = base64::engine::general_purpose::STANDARD.encode(b"bin\x00ary");
    let (status, second) = http.schedule(Some("secret"), json!({ "destination": dest, "delay": 1500, "body": binary, "encoding": "base64" })).await;
    assert_eq!(status, 202, "{second}");

    let bad_requests = [
        (json!({ "delay": "1s", "body": "x" }), 400, "destination"),
        (json!({ "destination": dest, "delay": -5, "body": "x" }), 400, "delay"),
        (json!({ "destination": dest, "delay": "soon", "body": "x" }), 400, "delay"),
        (json!({ "destination": dest, "delay": "1s", "body": "x", "strategy": "nope" }), 400, "strategy"),
        (json!({ "destination": dest, "delay": "1s", "body": "%%%", "encoding": "base64" }), 400, "body"),
        (json!({ "destination": dest, "delay": "1s", "body": "x".repeat(300_000) }), 413, "body"),
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
    assert!(hello.at_ms >= accepted["due_at"].as_u64().unwrap());
    assert!(received.iter().any(|r| r.delivery.data == b"bin\x00ary"), "base64 body arrived decoded");
    destination.assert_quiet(Duration::from_millis(500)).await;

    let (status, plan) = http.call("GET", &format!("/v1/plan?destination={dest}&delay=10s"), Some("secret"), None).await;
    assert_eq!(status, 200, "{plan}");
    let plan: Value = serde_json::from_str(&plan).unwrap();
    assert_eq!(plan["commands"][0]["exchange"], format!("{prefix}.delay-level-03"));
    let (status, mermaid) = http.call("GET", "/v1/topology?format=mermaid", Some("secret"), None).await;
    assert_eq!(status, 200);
    assert!(mermaid.starts_with("graph TD") && mermaid.contains(&format!("{prefix}.delay-level-27")), "{mermaid}");
    let (status, json_topology) = http.call("GET", "/v1/topology", Some("secret"), None).await;
    assert_eq!(status, 200);
    assert_eq!(serde_json::from_str::<Value>(&json_topology).unwrap()["commands"].as_array().unwrap().len(), 3 + 1 + 28 * 4, "parking (3), delivery, 28 levels");
    assert_eq!(http.call("GET", "/v1/topology?format=svg", Some("secret"), None).await.0, 400);
    assert_eq!(http.call("GET", "/healthz", None, None).await.0, 200);
    assert_eq!(http.call("GET", "/readyz", None, None).await.0, 200);

    let (status, metrics) = http.call("GET", "/metrics", None, None).await;
    assert_eq!(status, 200);
    assert_prometheus_text(&metrics);
    let value = |prefix: &str| metric_sum(&metrics, prefix);
    assert_eq!(value(&format!("hourglass_messages_scheduled_total{{strategy=\"main\",destination=\"{dest}\"}}")), 2.0, "{metrics}");
    assert_eq!(value("hourglass_requests_rejected_total"), 6.0, "every bad request, refused before planning: {metrics}");
    assert_eq!(value("hourglass_messages_failed_total"), 0.0, "{metrics}");
    assert_eq!(value("hourglass_planner_call_seconds_count{strategy=\"main\"}"), 2.0, "one planner call per message: {metrics}");
    assert_eq!(value("hourglass_broker_confirm_seconds_count"), 2.0, "one confirm wait per message: {metrics}");

    served.stop().await;
    delete_declared(&connection, &topology_of(&config)).await;
    destination.delete().await;
}
