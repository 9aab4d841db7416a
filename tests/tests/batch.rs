//! `POST /v1/messages:batch` on RabbitMQ: a thousand messages in one request,
//! ten of them bad. Each bad item is refused alone, naming its field (a
//! missing queue answered by the broker too); the 990 others are scheduled,
//! each answer in its item's place, and arrive once, none early.

use std::collections::HashMap;
use std::time::Duration;

use hourglass_e2e::serve::Served;
use hourglass_e2e::*;
use serde_json::{Value, json};

/// How late a message may arrive after its due time and still count as on
/// time. Measured here: of 990 messages due within 2 s of each other the
/// latest arrived 30 to 53 ms late (RabbitMQ 3.10, loopback); the window
/// leaves room for a loaded machine without hiding a missed hop (the shortest
/// level is 1 s).
const ON_TIME_MS: i64 = 500;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_a_thousand_with_ten_bad_items_schedules_the_rest_and_names_each_bad_field() {
    let prefix = unique("batch");
    let config = config(&format!("planner = \"binary-levels\"\nprefix = \"{prefix}\""));
    let cleanup = Cleanup::declared(&topology_of(&config));
    let connection = connect().await;
    let mut destination = Destination::declare(&connection, "batch-dest").await;
    cleanup.queue(&destination.name);
    let missing = unique("batch-missing");
    let served = Served::start_ready(&config).await;

    let to = destination.name.clone();
    let bad: Vec<(Value, u64, &str)> = vec![
        (json!({ "delay": "1s" }), 400, "destination"),
        (json!({ "destination": to, "delay": "soon" }), 400, "delay"),
        (json!({ "destination": to, "delay": "1s", "colour": "red" }), 400, "request"),
        (json!({ "destination": to, "delay": "1s", "body": "%%%", "encoding": "base64" }), 400, "body"),
        (json!({ "destination": to, "delay": "1s", "encoding": "rot13" }), 400, "encoding"),
        (json!({ "destination": to, "delay": "1s", "headers": { "a": 1 } }), 400, "headers"),
        (json!({ "destination": to, "delay": "1s", "strategy": "nope" }), 400, "strategy"),
        (json!({ "destination": to, "delay": "1s", "deliver_at": "2026-11-23T18:00:00Z" }), 400, "deliver_at"),
        (json!({ "destination": to, "routing_key": "k", "delay": "1s" }), 400, "routing_key"),
        // Well formed, refused by the broker: no such queue.
        (json!({ "destination": missing, "delay": "1s" }), 422, "destination"),
    ];
    // A bad item every hundred; the valid ones carry their place as their body, due 1 to 3 s from now.
    let mut messages = Vec::new();
    let mut expected_bad = HashMap::new();
    for place in 0..1_000 {
        if place % 100 == 50 {
            let (item, status, field) = &bad[place / 100];
            expected_bad.insert(place, (*status, *field));
            messages.push(item.clone());
        } else {
            messages.push(json!({ "destination": to, "delay": 1_000 + (place as u64 % 3) * 1_000, "body": place.to_string() }));
        }
    }
    let sent = std::time::Instant::now();
    let (status, answer) = served.http.call("POST", "/v1/messages:batch", None, Some(json!({ "messages": messages }))).await;
    let answered_ms = sent.elapsed().as_millis();
    assert_eq!(status, 200, "{}", &answer[..answer.len().min(2_000)]);
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!((answer["scheduled"].as_u64(), answer["failed"].as_u64()), (Some(990), Some(10)));
    let results = answer["results"].as_array().unwrap();
    assert_eq!(results.len(), 1_000);
    // Each valid item's id and due time, by its place.
    let mut due: HashMap<String, (usize, i64)> = HashMap::new();
    for (place, result) in results.iter().enumerate() {
        match expected_bad.get(&place) {
            Some((status, field)) => {
                assert_eq!((result["status"].as_u64(), result["field"].as_str()), (Some(*status), Some(*field)), "item {place}: {result}");
            }
            None => {
                assert_eq!(result["status"], 202, "item {place}: {result}");
                let id = result["id"].as_str().unwrap().to_string();
                due.insert(id, (place, result["due_at"].as_i64().unwrap()));
            }
        }
    }

    let received = destination.receive(990, Duration::from_secs(30)).await;
    let mut latest = i64::MIN;
    let mut seen = HashMap::new();
    for message in &received {
        let id = message.delivery.properties.message_id().as_ref().map(|id| id.to_string()).expect("a message id");
        let body = String::from_utf8_lossy(&message.delivery.data).into_owned();
        let (place, due_at) = due.get(&id).unwrap_or_else(|| panic!("message {id} ({body}) was not answered 202"));
        assert_eq!(body, place.to_string(), "the answer in place {place} names the message scheduled from it");
        let late = message.at_ms as i64 - due_at;
        assert!(late >= 0, "message {place} arrived {}ms early", -late);
        latest = latest.max(late);
        assert!(seen.insert(id, place).is_none(), "message {place} arrived twice");
    }
    assert!(latest <= ON_TIME_MS, "the latest arrived {latest}ms after its due time (window {ON_TIME_MS}ms)");
    destination.assert_quiet(Duration::from_secs(1)).await;
    eprintln!("batch answered in {answered_ms}ms; 990 of 990 arrived, none early, the latest {latest}ms after its due time");
    served.stop().await;
    destination.delete().await;
}
