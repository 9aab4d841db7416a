//! Reading what arrived: headers of a delivery, queue depths, draining a
//! queue, and the broker's management API.

use std::time::Duration;

use lapin::Channel;
use lapin::message::Delivery;
use lapin::options::{BasicGetOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};

pub fn header<'d>(delivery: &'d Delivery, name: &str) -> Option<&'d AMQPValue> {
    delivery.properties.headers().as_ref()?.inner().get(name)
}

/// A whole-number header (hourglass writes 64-bit; pika and others may write 32-bit).
pub fn header_int(delivery: &Delivery, name: &str) -> Option<i64> {
    match header(delivery, name)? {
        AMQPValue::LongLongInt(v) => Some(*v),
        AMQPValue::LongInt(v) => Some(i64::from(*v)),
        _ => None,
    }
}

pub fn header_text(delivery: &Delivery, name: &str) -> Option<String> {
    match header(delivery, name)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        _ => None,
    }
}

/// Messages ready in `queue`.
pub async fn queue_depth(channel: &Channel, queue: &str) -> u32 {
    let passive = QueueDeclareOptions { passive: true, ..Default::default() };
    channel.queue_declare(queue.into(), passive, FieldTable::default()).await.unwrap().message_count()
}

/// Consumers attached to `queue` now, as the broker counts them (0 if the queue is gone).
pub async fn consumer_count(connection: &lapin::Connection, queue: &str) -> u32 {
    let channel = connection.create_channel().await.unwrap();
    let passive = QueueDeclareOptions { passive: true, ..Default::default() };
    channel.queue_declare(queue.into(), passive, FieldTable::default()).await.map(|q| q.consumer_count()).unwrap_or(0)
}

/// Takes messages off `queue` (no ack needed) until at least `want` came, failing after `deadline`.
pub async fn get_at_least(channel: &Channel, queue: &str, want: usize, deadline: Duration) -> Vec<Delivery> {
    let mut got = Vec::new();
    crate::until(&format!("{want} messages in {queue}"), deadline, async || {
        while let Ok(Some(message)) = channel.basic_get(queue.into(), BasicGetOptions { no_ack: true }).await {
            got.push(message.delivery);
        }
        got.len() >= want
    })
    .await;
    got
}

/// The management API of the test broker (`HOURGLASS_TEST_MANAGEMENT_URL`, default guest on 127.0.0.1:15672).
pub fn management_url() -> String {
    std::env::var("HOURGLASS_TEST_MANAGEMENT_URL").unwrap_or_else(|_| "http://guest:guest@127.0.0.1:15672".into())
}

/// An agent, the URL of `path` on the management API, and its basic-auth
/// header. An HTTP error status is an `Err`; no request waits more than 10 s
/// (they are made from `Drop` too, where nothing else would end a hang).
pub(crate) fn management_request(path: &str) -> (ureq::Agent, String, String) {
    use base64::Engine;
    let base = management_url();
    let (scheme, rest) = base.split_once("://").expect("the management URL has a scheme");
    let (credentials, host) = rest.rsplit_once('@').unwrap_or(("guest:guest", rest));
    let authorization = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(credentials));
    let config = ureq::Agent::config_builder().http_status_as_error(true).timeout_global(Some(Duration::from_secs(10))).build();
    (ureq::Agent::new_with_config(config), format!("{scheme}://{}{path}", host.trim_end_matches('/')), authorization)
}

/// `method` on `path` of the management API, with a JSON body for a PUT;
/// the answer's JSON (Null when empty). An error status panics, naming the call.
pub fn management(method: &str, path: &str, body: Option<serde_json::Value>) -> serde_json::Value {
    let (agent, url, authorization) = management_request(path);
    let response = match (method, body) {
        ("GET", _) => agent.get(&url).header("Authorization", &authorization).call(),
        ("DELETE", _) => agent.delete(&url).header("Authorization", &authorization).call(),
        ("PUT", Some(body)) => agent.put(&url).header("Authorization", &authorization).send_json(body),
        ("PUT", None) => agent.put(&url).header("Authorization", &authorization).send_empty(),
        _ => unreachable!("{method}"),
    };
    let text = response.unwrap_or_else(|e| panic!("management API {method} {path}: {e}")).body_mut().read_to_string().unwrap_or_default();
    if text.is_empty() { serde_json::Value::Null } else { serde_json::from_str(&text).unwrap() }
}

/// `GET path` on the management API: its JSON, or None when the answer is
/// 404 (a queue that does not exist, say). Any other error status panics.
pub fn management_get_or_none(path: &str) -> Option<serde_json::Value> {
    let (agent, url, authorization) = management_request(path);
    match agent.get(&url).header("Authorization", &authorization).call() {
        Ok(mut response) => Some(serde_json::from_str(&response.body_mut().read_to_string().unwrap_or_default()).unwrap_or(serde_json::Value::Null)),
        Err(ureq::Error::StatusCode(404)) => None,
        Err(err) => panic!("management API GET {path}: {err}"),
    }
}
