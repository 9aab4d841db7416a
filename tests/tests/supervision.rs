//! Supervision on a real RabbitMQ: when the ingress consumer loses its
//! connection and cannot get it back, `/readyz` answers 503 naming "ingress";
//! once it can, the consumer is back, `/readyz` is 200, and a message published
//! to the ingress afterwards is delivered. Runs in a private vhost, so revoking
//! the test user's permissions there touches nobody else.

use std::time::{Duration, Instant};

use hourglass::broker::rabbitmq::consume::long_string;
use hourglass::broker::rabbitmq::manage::encode;
use hourglass::config::Config;
use hourglass::headers::{DESTINATION_HEADER, REQUESTED_DELAY_HEADER};
use hourglass::service::Service;
use hourglass_e2e::serve::Served;
use hourglass_e2e::vhost::PrivateVhost;
use hourglass_e2e::*;
use lapin::BasicProperties;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{FieldTable, ShortString};
use serde_json::{Value, json};

fn user() -> String {
    amqp_url().split("://").nth(1).and_then(|rest| rest.split(':').next()).unwrap_or("guest").to_string()
}

/// The name of the connection consuming `queue` in `vhost`, if any.
fn consumer_connection(vhost: &str, queue: &str) -> Option<String> {
    let consumers = management("GET", &format!("/api/consumers/{}", encode(vhost)), None);
    consumers.as_array()?.iter().find(|c| c["queue"]["name"] == queue).and_then(|c| c["channel_details"]["connection_name"].as_str().map(String::from))
}

async fn readyz(served: &Served) -> (u16, Value) {
    let (status, body) = served.http.call("GET", "/readyz", None, None).await;
    (status, serde_json::from_str(&body).unwrap_or(Value::String(body)))
}

fn names_task(readiness: &Value, task: &str) -> bool {
    readiness["down"].as_array().is_some_and(|down| down.iter().any(|d| d["task"] == task))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_names_a_lost_ingress_until_it_is_back_and_ingress_then_forwards() {
    let vhost = PrivateVhost::create("supervision");
    let connection = connect_to(&vhost.url).await;
    let ingress_queue = unique("supervised-in");
    let text = config_text_on(
        &vhost.url,
        &format!("planner = \"binary-levels\"\nprefix = \"{}\"", unique("sup")),
        &format!("[service.ingress]\nqueue = \"{ingress_queue}\"\ninvalid_queue = \"{ingress_queue}.invalid\""),
    );
    let config = Config::parse(std::path::Path::new("e2e.toml"), text).unwrap();
    let mut destination = Destination::declare(&connection, "supervised-dest").await;
    let served = Served::start(Service::start(config).await.expect("service starts")).await;
    until("ready", Duration::from_secs(10), async || readyz(&served).await.0 == 200).await;

    // Take the consumer's connection away, and keep it from coming back.
    // The management API lists consumers with a delay of its own.
    until("the management API listing the ingress consumer", Duration::from_secs(20), async || consumer_connection(&vhost.name, &ingress_queue).is_some())
        .await;
    let consumer = consumer_connection(&vhost.name, &ingress_queue).unwrap();
    let permissions = format!("/api/permissions/{}/{}", encode(&vhost.name), encode(&user()));
    management("DELETE", &permissions, None);
    management("DELETE", &format!("/api/connections/{}", encode(&consumer)), None);
    until("readyz 503 naming the ingress", Duration::from_secs(10), async || {
        let (status, body) = readyz(&served).await;
        status == 503 && names_task(&body, "ingress")
    })
    .await;
    // It stays down, named, while it cannot come back: never a 200 meanwhile.
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(1) {
        let (status, body) = readyz(&served).await;
        assert!(status == 503 && names_task(&body, "ingress"), "{status} {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    management("PUT", &permissions, Some(json!({ "configure": ".*", "write": ".*", "read": ".*" })));
    until("ready again", Duration::from_secs(20), async || readyz(&served).await.0 == 200).await;
    until("a new connection consuming", Duration::from_secs(20), async || consumer_connection(&vhost.name, &ingress_queue).is_some_and(|c| c != consumer))
        .await;

    let channel = connect_to(&vhost.url).await.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    let mut headers = FieldTable::default();
    headers.insert(ShortString::from(DESTINATION_HEADER), long_string(&destination.name));
    headers.insert(ShortString::from(REQUESTED_DELAY_HEADER), long_string("500ms"));
    channel
        .basic_publish("".into(), ingress_queue.as_str().into(), BasicPublishOptions::default(), b"after", BasicProperties::default().with_headers(headers))
        .await
        .unwrap()
        .await
        .unwrap();
    let received = destination.receive(1, Duration::from_secs(10)).await;
    assert_eq!(received[0].delivery.data, b"after");
    served.stop().await;
}
