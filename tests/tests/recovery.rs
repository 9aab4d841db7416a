//! Broker loss under `serve`, with HTTP requests and ingress messages flowing:
//! readiness goes false and requests get 503 while RabbitMQ is stopped; the
//! host reconnects by itself when it is back; every message that got a 202 and
//! every ingress message arrives. The broker it stops and starts is a private
//! node of its own (tests/src/private_node.rs), never the shared one.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hourglass::service::Service;
use hourglass_e2e::private_node::PrivateNode;
use hourglass_e2e::serve::Served;
use hourglass_e2e::*;
use lapin::BasicProperties;
use lapin::options::{BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use serde_json::json;

/// The status, and the `Retry-After` header when there is one.
async fn http_answer(method: &'static str, url: String, body: Option<serde_json::Value>) -> (u16, Option<String>) {
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let response = match body {
            Some(body) => agent.post(&url).send_json(body),
            None if method == "GET" => agent.get(&url).call(),
            None => unreachable!(),
        };
        response.map(|r| (r.status().as_u16(), r.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_string))).unwrap_or((0, None))
    })
    .await
    .unwrap()
}

async fn http(method: &'static str, url: String, body: Option<serde_json::Value>) -> u16 {
    http_answer(method, url, body).await.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_survives_a_broker_restart_under_load_and_loses_nothing_it_accepted() {
    let node = tokio::task::spawn_blocking(PrivateNode::start).await.unwrap().expect("a private RabbitMQ node starts");
    let connection = connect_to(&node.url()).await;
    let prefix = unique("recovery");
    let ingress = unique("recovery-in");
    let text = config_text_on(
        &node.url(),
        &format!("planner = \"binary-levels\"\nprefix = \"{prefix}\""),
        &format!("[service.ingress]\nqueue = \"{ingress}\"\ninvalid_queue = \"{ingress}.invalid\"\nprefetch = 8"),
    );
    let config = hourglass::config::Config::parse(std::path::Path::new("recovery.toml"), text).expect("test config");
    // Durable, so it and its messages survive the restart.
    let destination = unique("recovery-dest");
    let channel = connection.create_channel().await.unwrap();
    channel.queue_declare(destination.as_str().into(), QueueDeclareOptions { durable: true, ..Default::default() }, FieldTable::default()).await.unwrap();
    let service = Service::start(config.clone()).await.expect("service starts");
    let served = Served::start(service).await;
    let base = served.http.base.clone();
    until("ready", Duration::from_secs(10), async || http("GET", format!("{base}/readyz"), None).await == 200).await;

    let mut ingress_bodies = publish_ingress(&connection, &ingress, &destination, "ingress-before", 40).await;

    // HTTP load for the whole test: every 2xx must be a 202 and must arrive.
    let accepted = Arc::new(Mutex::new(BTreeSet::new()));
    let (stop_load, load_stopped) = tokio::sync::watch::channel(false);
    let load = {
        let (accepted, base, destination) = (accepted.clone(), base.clone(), destination.clone());
        tokio::spawn(async move {
            let mut refused = 0;
            for i in 0.. {
                if *load_stopped.borrow() {
                    return refused;
                }
                let body = format!("http-{i}");
                let (status, retry_after) =
                    http_answer("POST", format!("{base}/v1/messages"), Some(json!({ "destination": destination, "delay": "2s", "body": body }))).await;
                if status == 503 {
                    assert!(retry_after.is_some_and(|s| s.parse::<u64>().is_ok()), "a 503 says when to retry (Retry-After)");
                }
                match status {
                    202 => {
                        accepted.lock().unwrap().insert(body);
                    }
                    503 => refused += 1,
                    other => panic!("unexpected status {other} for {body}"),
                }
            }
            refused
        })
    };
    until("load before the restart", Duration::from_secs(10), async || accepted.lock().unwrap().len() >= 20).await;

    node.stop().expect("stop the private node");
    until("readiness going false", Duration::from_secs(10), async || http("GET", format!("{base}/readyz"), None).await == 503).await;
    let accepted_while_down = accepted.lock().unwrap().len();
    node.boot().expect("start the private node again on its data");
    until("readiness coming back", Duration::from_secs(30), async || http("GET", format!("{base}/readyz"), None).await == 200).await;
    let after = connect_to(&node.url()).await;
    ingress_bodies.extend(publish_ingress(&after, &ingress, &destination, "ingress-after", 40).await);
    until("load after the restart", Duration::from_secs(20), async || accepted.lock().unwrap().len() >= accepted_while_down + 20).await;
    stop_load.send(true).unwrap();
    let refused = load.await.unwrap();
    assert!(refused > 0, "some requests met the stopped broker and got 503");

    let reader = after.create_channel().await.unwrap();
    let mut expected = accepted.lock().unwrap().clone();
    expected.extend(ingress_bodies);
    let mut arrived = BTreeSet::new();
    until("every accepted message arriving", Duration::from_secs(30), async || {
        while let Ok(Some(got)) = reader.basic_get(destination.as_str().into(), BasicGetOptions { no_ack: true }).await {
            arrived.insert(String::from_utf8_lossy(&got.delivery.data).to_string());
        }
        expected.is_subset(&arrived)
    })
    .await;
    let unexpected: Vec<_> = arrived.difference(&expected).filter(|b| !b.starts_with("http-")).collect();
    assert!(unexpected.is_empty(), "{unexpected:?}");

    served.stop().await;
    // Dropping the node stops it and removes its data: nothing to delete one by one.
    drop(node);
}

/// Persistent ingress messages to `destination`, delayed 2 s; returns their bodies.
async fn publish_ingress(connection: &lapin::Connection, ingress: &str, destination: &str, stem: &str, count: usize) -> BTreeSet<String> {
    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    let mut bodies = BTreeSet::new();
    for i in 0..count {
        let body = format!("{stem}-{i}");
        let mut headers = FieldTable::default();
        headers.insert("hourglass-destination".into(), AMQPValue::LongString(LongString::from(destination)));
        headers.insert("hourglass-delay".into(), AMQPValue::LongString(LongString::from("2s")));
        let properties = BasicProperties::default().with_headers(headers).with_delivery_mode(2);
        channel.basic_publish("".into(), ingress.into(), BasicPublishOptions::default(), body.as_bytes(), properties).await.unwrap().await.unwrap();
        bodies.insert(body);
    }
    bodies
}

/// A node that swallows connections (accepts TCP, never answers AMQP) costs
/// one connect timeout, once: after that it is tried after the live node, so
/// the connections that follow open at once whichever node their turn starts at.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_swallows_connections_is_tried_last_after_it_failed_once() {
    use hourglass::broker::rabbitmq::nodes;
    // Listening with a backlog, never accepting: the TCP handshake completes and nothing follows.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let urls = format!("amqp://guest:guest@{}/%2f,{}", hung.local_addr().unwrap(), amqp_url());
    let timeout = Duration::from_secs(1);
    let mut took = Vec::new();
    for _ in 0..10 {
        let started = std::time::Instant::now();
        let (connection, node) = nodes::connect(&urls, lapin::ConnectionProperties::default(), timeout).await.expect("the live node");
        took.push(started.elapsed());
        assert!(!node.contains(&hung.local_addr().unwrap().to_string()), "{node}");
        connection.close(200, "done".into()).await.ok();
    }
    // Each connection starts one node further on, so without suspicion half
    // of them would wait on the hung node; with it, only the first that met it.
    let waited = took.iter().filter(|t| **t >= timeout / 2).count();
    assert!(waited <= 1, "{waited} connections waited on the hung node: {took:?}");
}
