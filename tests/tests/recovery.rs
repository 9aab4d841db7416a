//! Broker loss under `serve`: readiness goes false and requests get 503 while
//! RabbitMQ is stopped; the host reconnects by itself when it is back, and
//! every message that got a 202 arrives. This test stops and starts the
//! broker's application, so it lives in its own test binary (cargo runs test
//! binaries one after another).

use std::process::Command;
use std::time::{Duration, Instant};

use hourglass::service::{self, Service};
use hourglass_e2e::*;
use lapin::options::{BasicGetOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use serde_json::json;

fn rabbitmqctl(args: &[&str]) {
    let status = Command::new("rabbitmqctl").args(args).status().expect("rabbitmqctl");
    assert!(status.success(), "rabbitmqctl {args:?} failed");
}

/// Starts the broker's application again however the test ends.
struct RestartOnDrop;

impl Drop for RestartOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("rabbitmqctl").arg("start_app").status();
        let _ = Command::new("rabbitmqctl").args(["await_startup", "--timeout", "60"]).status();
    }
}

async fn until(what: &str, deadline: Duration, mut check: impl AsyncFnMut() -> bool) {
    let end = Instant::now() + deadline;
    while !check().await {
        assert!(Instant::now() < end, "{what} did not happen within {deadline:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn http(method: &'static str, url: String, body: Option<serde_json::Value>) -> u16 {
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let response = match body {
            Some(body) => agent.post(&url).send_json(body),
            None if method == "GET" => agent.get(&url).call(),
            None => unreachable!(),
        };
        response.map(|r| r.status().as_u16()).unwrap_or(0)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_survives_a_broker_restart_and_loses_nothing_it_accepted() {
    let connection = connect().await;
    let prefix = unique("recovery");
    let config = config(&format!("planner = \"binary-levels\"\nprefix = \"{prefix}\""));
    // Durable, so it and its messages survive the restart.
    let destination = unique("recovery-dest");
    let channel = connection.create_channel().await.unwrap();
    channel
        .queue_declare(destination.as_str().into(), QueueDeclareOptions { durable: true, ..Default::default() }, FieldTable::default())
        .await
        .unwrap();
    let service = Service::new(scheduler(&config).await, None);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(service::run(listener, service, async move {
        stopped.await.ok();
    }));
    let message = |body: &str| Some(json!({ "destination": destination, "delay": "2s", "body": body }));

    assert_eq!(http("POST", format!("{base}/v1/messages"), message("before")).await, 202);
    let restart = RestartOnDrop;
    rabbitmqctl(&["stop_app"]);
    until("readiness going false", Duration::from_secs(10), async || http("GET", format!("{base}/readyz"), None).await == 503).await;
    assert_eq!(http("POST", format!("{base}/v1/messages"), message("during")).await, 503, "no 2xx while the broker is down");
    rabbitmqctl(&["start_app"]);
    rabbitmqctl(&["await_startup", "--timeout", "60"]);
    drop(restart);
    until("readiness coming back", Duration::from_secs(20), async || http("GET", format!("{base}/readyz"), None).await == 200).await;
    assert_eq!(http("POST", format!("{base}/v1/messages"), message("after")).await, 202);

    let reader = connect().await.create_channel().await.unwrap();
    let mut bodies = Vec::new();
    until("both accepted messages arriving", Duration::from_secs(20), async || {
        while let Ok(Some(got)) = reader.basic_get(destination.as_str().into(), BasicGetOptions { no_ack: true }).await {
            bodies.push(String::from_utf8_lossy(&got.delivery.data).to_string());
        }
        bodies.len() >= 2
    })
    .await;
    bodies.sort();
    assert_eq!(bodies, vec!["after".to_string(), "before".to_string()], "the 503 message was never published");

    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    let cleanup = connect().await;
    delete_declared(&cleanup, &topology_of(&config)).await;
    cleanup.create_channel().await.unwrap().queue_delete(destination.as_str().into(), QueueDeleteOptions::default()).await.ok();
}
