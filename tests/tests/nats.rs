//! NATS JetStream end to end, on the server `HOURGLASS_TEST_NATS_URL` names
//! (scripts/test runs these on the machine's nats-server 2.9 and on 2.15 from
//! a Debian root): messages scheduled over HTTP wait in a held stream and
//! arrive at their destination stream at or after their due time; a subject
//! no stream captures is refused beside valid traffic; a destination deleted
//! while messages wait leaves them parked with the reason; a private server
//! killed (`kill -9`) and started again while messages wait loses none and
//! delivers none early.
//!
//! Lateness window: a held message is delivered again when the server's
//! negative-acknowledgement delay ends (declines are answered on a 100 ms
//! grid, `broker::nats::hold`), and the host publishes it on and the test's
//! consumer pulls it. Measured on this machine, 200 messages of 1-5 s: 1-13 ms
//! late on 2.9.10 and 2.15.1; 3,000 of 1-60 s over HTTP and the ingress while
//! scheduling goes on: p99 73 ms, max 106 ms (2.9.10). ON_TIME_MS allows
//! 250 ms for a loaded machine running the suite beside it.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use hourglass::service::Service;
use hourglass_e2e::nats::{
    Cleanup, NatsDestination, PrivateNats, connect, delete_held, delete_streams, hold_config, hold_config_on, hold_config_with, nats_url, parked, read_stream,
    unique,
};
use hourglass_e2e::serve::{Served, metric_sum};
use serde_json::json;

const ON_TIME_MS: i64 = 250;
/// The server's down time (2 s), its ack wait (5 s) and a second of slack.
const RESTART_LATE_MS: i64 = 8_000;

/// Schedules `count` messages to `destination` with delays from 1 s to 5 s; returns each body's due time.
async fn schedule_many(served: &Served, destination: &str, count: u64) -> HashMap<String, u64> {
    let mut due = HashMap::new();
    for i in 0..count {
        let body = format!("m-{i}");
        let delay_ms = 1_000 + (i * 397) % 4_000;
        let (status, answer) = served.http.schedule(None, json!({ "destination": destination, "delay": delay_ms, "body": body })).await;
        assert_eq!(status, 202, "schedule {body}: {answer}");
        due.insert(body, answer["due_at"].as_u64().expect("due_at in the answer"));
    }
    due
}

/// How late each message arrived (ms; negative: early), by body.
fn lateness(received: &[hourglass_e2e::nats::NatsReceived], due: &HashMap<String, u64>) -> Vec<(String, i64)> {
    received.iter().map(|r| (r.body.clone(), r.at_ms as i64 - due[&r.body] as i64)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_over_http_wait_in_the_held_stream_and_arrive_on_time() {
    let (config, held) = hold_config("http", "max_wait = \"2s\"");
    let _held = Cleanup::held(&held);
    let mut destination = NatsDestination::create("http-dest").await;
    let served = Served::start_ready(&config).await;

    let due = schedule_many(&served, &destination.subject, 200).await;
    let received = destination.receive(200, Duration::from_secs(30)).await;
    let late = lateness(&received, &due);
    let worst = late.iter().max_by_key(|(_, l)| *l).cloned().unwrap();
    let earliest = late.iter().min_by_key(|(_, l)| *l).cloned().unwrap();
    println!("200 messages of 1-5 s: lateness from {} ms to {} ms", earliest.1, worst.1);
    assert!(earliest.1 >= 0, "{} arrived {} ms early", earliest.0, -earliest.1);
    assert!(worst.1 <= ON_TIME_MS, "{} arrived {} ms late (window {ON_TIME_MS} ms)", worst.0, worst.1);
    let first = &received[0];
    assert_eq!(first.header("hourglass-target"), Some(destination.subject.as_str()), "the destination travels with it");
    assert!(first.header("hourglass-due-at").is_some(), "its due time travels with it");
    assert!(destination.drain(Duration::from_millis(500)).await.is_empty(), "no duplicates");

    served.stop().await;
    destination.delete().await;
    delete_held(&held).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_no_stream_captures_is_refused_and_valid_traffic_beside_it_arrives() {
    let (config, held) = hold_config("refused", "");
    let _held = Cleanup::held(&held);
    let mut destination = NatsDestination::create("refused-dest").await;
    let served = Served::start_ready(&config).await;

    let nowhere = format!("{}.nowhere", destination.subject);
    let mut due = HashMap::new();
    for i in 0..20 {
        let (status, answer) = served.http.schedule(None, json!({ "destination": nowhere, "delay": "1s", "body": "lost?" })).await;
        assert_eq!(status, 422, "a subject no stream captures: {answer}");
        assert!(answer.to_string().contains("destination"), "the answer names the field: {answer}");
        let body = format!("valid-{i}");
        let (status, answer) = served.http.schedule(None, json!({ "destination": destination.subject, "delay": "1s", "body": body })).await;
        assert_eq!(status, 202, "{answer}");
        due.insert(body, answer["due_at"].as_u64().unwrap());
    }
    let (status, answer) = served.http.schedule(None, json!({ "destination": "orders.*", "delay": "1s", "body": "x" })).await;
    assert_eq!(status, 422, "a wildcard is no destination: {answer}");
    let held_subject = config.strategies["hold"].table["subject"].as_str().unwrap().to_string();
    let (status, answer) = served.http.schedule(None, json!({ "destination": held_subject, "delay": "1s", "body": "round and round" })).await;
    assert_eq!(status, 400, "the held stream's own subject is no destination (it would come round for ever): {answer}");
    assert!(answer.to_string().contains("destination"), "{answer}");
    let received = destination.receive(20, Duration::from_secs(15)).await;
    for (body, late) in lateness(&received, &due) {
        assert!((0..=ON_TIME_MS).contains(&late), "{body} arrived {late} ms from its due time");
    }

    served.stop().await;
    destination.delete().await;
    delete_held(&held).await;
}

/// A batch over HTTP on NATS: each bad item refused in its place naming its
/// field (a subject no stream captures, the held stream's own subject, a
/// wildcard, a bad delay), the others scheduled and on time, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_with_bad_items_schedules_the_rest_and_names_each_bad_field_on_nats() {
    let (config, held) = hold_config("batch", "");
    let _held = Cleanup::held(&held);
    let mut destination = NatsDestination::create("batch-dest").await;
    let served = Served::start_ready(&config).await;

    let held_subject = config.strategies["hold"].table["subject"].as_str().unwrap().to_string();
    let bad = [
        (json!({ "destination": format!("{}.nowhere", destination.subject), "delay": "1s" }), 422, "destination"),
        (json!({ "destination": held_subject, "delay": "1s" }), 400, "destination"),
        (json!({ "destination": "orders.*", "delay": "1s" }), 422, "destination"),
        (json!({ "destination": destination.subject, "delay": "soon" }), 400, "delay"),
    ];
    let mut messages = Vec::new();
    for place in 0..200 {
        match bad.get(place / 50).filter(|_| place % 50 == 25) {
            Some((item, _, _)) => messages.push(item.clone()),
            None => messages.push(json!({ "destination": destination.subject, "delay": 1_000 + (place * 397) % 4_000, "body": format!("m-{place}") })),
        }
    }
    let (status, answer) = served.http.call("POST", "/v1/messages:batch", None, Some(json!({ "messages": messages }))).await;
    assert_eq!(status, 200, "{answer}");
    let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!((answer["scheduled"].as_u64(), answer["failed"].as_u64()), (Some(196), Some(4)), "{answer}");
    let mut due = HashMap::new();
    for (place, result) in answer["results"].as_array().unwrap().iter().enumerate() {
        match bad.get(place / 50).filter(|_| place % 50 == 25) {
            Some((_, status, field)) => {
                assert_eq!((result["status"].as_u64(), result["field"].as_str()), (Some(*status), Some(*field)), "item {place}: {result}")
            }
            None => {
                assert_eq!(result["status"], 202, "item {place}: {result}");
                due.insert(format!("m-{place}"), result["due_at"].as_u64().unwrap());
            }
        }
    }
    let received = destination.receive(196, Duration::from_secs(30)).await;
    for (body, late) in lateness(&received, &due) {
        assert!((0..=ON_TIME_MS).contains(&late), "{body} arrived {late} ms from its due time (window {ON_TIME_MS} ms)");
    }
    assert!(destination.drain(Duration::from_millis(500)).await.is_empty(), "no duplicates");

    served.stop().await;
    destination.delete().await;
    delete_held(&held).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_deleted_while_messages_wait_leaves_them_parked_with_the_reason() {
    let (config, held) = hold_config_with(&nats_url(), "parking", "", "[service]\ndepth_poll = \"200ms\"\n");
    let _held = Cleanup::held(&held);
    let destination = NatsDestination::create("parking-dest").await;
    let served = Served::start_ready(&config).await;

    for i in 0..5 {
        let (status, answer) = served.http.schedule(None, json!({ "destination": destination.subject, "delay": "2s", "body": format!("p-{i}") })).await;
        assert_eq!(status, 202, "{answer}");
    }
    destination.delete().await;
    let mut found = Vec::new();
    hourglass_e2e::until("five messages parked", Duration::from_secs(15), async || {
        found = parked(&held).await;
        found.len() >= 5
    })
    .await;
    for message in &found {
        let reason = message.header("hourglass-parked-reason").unwrap_or_default();
        assert!(reason.contains("no stream captures"), "the reason names what is missing: {reason:?}");
    }
    // GET /v1/delays and the gauges count them, from the held stream's parked stream.
    let mut delays = serde_json::Value::Null;
    hourglass_e2e::until("GET /v1/delays counts the five parked", Duration::from_secs(5), async || {
        let (_, body) = served.http.call("GET", "/v1/delays", None, None).await;
        delays = serde_json::from_str(&body).unwrap_or_default();
        delays["strategies"].as_array().into_iter().flatten().any(|s| s["strategy"] == "hold" && s["parked"] == 5 && s["waiting"] == 0)
    })
    .await;
    assert_eq!(served.http.metric("hourglass_parked_messages{strategy=\"hold\"}").await, 5.0, "{delays}");

    served.stop().await;
    delete_held(&held).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_starts_later_delivers_what_another_held() {
    let (config, held) = hold_config("takeover", "max_wait = \"1s\"");
    let _held = Cleanup::held(&held);
    let mut destination = NatsDestination::create("takeover-dest").await;
    let first = Served::start(Service::start(config.clone()).await.expect("first host starts")).await;
    let due = schedule_many(&first, &destination.subject, 30).await;
    first.stop().await;

    let second = Served::start_ready(&config).await;
    let received = destination.receive(30, Duration::from_secs(20)).await;
    for (body, late) in lateness(&received, &due) {
        assert!(late >= 0, "{body} arrived {} ms early", -late);
    }
    second.stop().await;
    destination.delete().await;
    delete_held(&held).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_while_messages_wait_loses_none_and_delivers_none_early() {
    let mut server = PrivateNats::start().await;
    let (config, _) = hold_config_on(&server.url(), "restart", "max_wait = \"2s\"");
    let mut destination = NatsDestination::create_on(&server.url(), "restart-dest").await;
    let served = Served::start_ready(&config).await;
    let due = schedule_many(&served, &destination.subject, 300).await;

    server.kill9();
    // The fault: the server stays down while messages fall due (1-5 s delays, scheduled within about a second).
    tokio::time::sleep(Duration::from_secs(2)).await;
    server.run().await;

    let received = destination.receive(300, Duration::from_secs(60)).await;
    let late = lateness(&received, &due);
    let earliest = late.iter().min_by_key(|(_, l)| *l).cloned().unwrap();
    let worst = late.iter().max_by_key(|(_, l)| *l).cloned().unwrap();
    println!("300 messages across a kill -9: lateness from {} ms to {} ms", earliest.1, worst.1);
    assert!(earliest.1 >= 0, "{} arrived {} ms early", earliest.0, -earliest.1);
    // Down 2 s, then a declined delivery whose delay the server forgot comes back after the
    // consumer's ack wait (5 s): measured up to 1.5 s late on 2.9 and 2.15 (27 s with a 30 s ack wait).
    assert!(worst.1 <= RESTART_LATE_MS, "{} arrived {} ms late across the restart (bound {RESTART_LATE_MS} ms)", worst.0, worst.1);
    // The test's own consumer may be handed one again whose ack the kill lost (the same stream
    // sequence); a body stored under two sequences was published twice.
    let mut sequences: HashMap<String, HashSet<Option<u64>>> = HashMap::new();
    for arrival in received.iter().chain(&destination.drain(Duration::from_secs(2)).await) {
        sequences.entry(arrival.body.clone()).or_default().insert(arrival.stream_sequence);
    }
    let missing: Vec<&String> = due.keys().filter(|body| !sequences.contains_key(*body)).collect();
    assert!(missing.is_empty(), "{} of 300 never arrived: {missing:?}", missing.len());
    let twice: Vec<(&String, &HashSet<Option<u64>>)> = sequences.iter().filter(|(_, stored)| stored.len() > 1).collect();
    assert!(twice.is_empty(), "stored twice (the destination stream drops a repeated Nats-Msg-Id): {twice:?}");
    served.stop().await;
}

/// An ingress of the test's own: its subject, its invalid subject, and the config TOML naming them.
fn ingress_of_its_own(stem: &str) -> (String, String, String) {
    let (_, subject) = unique(stem);
    let (input, invalid) = (format!("{subject}.in"), format!("{subject}.invalid"));
    let toml = format!("[service.ingress]\nqueue = \"{input}\"\ninvalid_queue = \"{invalid}\"\n");
    (input, invalid, toml)
}

async fn publish_to_ingress(jetstream: &async_nats::jetstream::Context, ingress: &str, headers: &[(&str, &str)], body: &str) {
    let mut map = async_nats::HeaderMap::new();
    for (name, value) in headers {
        map.insert(*name, *value);
    }
    jetstream.publish_with_headers(ingress.to_string(), map, body.to_string().into()).await.expect("publish").await.expect("the ingress stream acks");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ingress_subject_schedules_what_it_can_and_sets_aside_the_rest_with_the_reason() {
    let (input, invalid, toml) = ingress_of_its_own("ingress");
    let _ingress = Cleanup::subjects(&[&input, &invalid]);
    let (config, held) = hold_config_with(&nats_url(), "ingress", "", &toml);
    let _held = Cleanup::held(&held);
    let mut destination = NatsDestination::create("ingress-dest").await;
    let served = Served::start_ready(&config).await;
    let jetstream = connect().await;

    let target = destination.subject.clone();
    let nowhere = format!("{target}.nowhere");
    let bad: [(&[(&str, &str)], &str); 3] = [
        (&[("hourglass-delay", "1s")], "hourglass-destination"),
        (&[("hourglass-destination", target.as_str()), ("hourglass-delay", "soon")], "hourglass-delay"),
        (&[("hourglass-destination", nowhere.as_str()), ("hourglass-delay", "1s")], "no stream captures"),
    ];
    let started = hourglass::clock::unix_now_ms();
    for i in 0..20 {
        let (headers, _) = bad[i % bad.len()];
        publish_to_ingress(&jetstream, &input, headers, &format!("bad-{i}")).await;
        // Half with a delay, half with a due time in whole Unix milliseconds (text, as NATS headers are).
        let at = (hourglass::clock::unix_now_ms() + 1_500).to_string();
        let timing = if i % 2 == 0 { ("hourglass-delay", "1500ms") } else { ("hourglass-deliver-at", at.as_str()) };
        let valid = [("hourglass-destination", target.as_str()), timing, ("tenant", "acme")];
        publish_to_ingress(&jetstream, &input, &valid, &format!("good-{i}")).await;
    }
    let received = destination.receive(20, Duration::from_secs(15)).await;
    for message in &received {
        let due: u64 = message.header("hourglass-due-at").expect("due time").parse().unwrap();
        let late = message.at_ms as i64 - due as i64;
        assert!((0..=ON_TIME_MS).contains(&late), "{} arrived {late} ms from its due time", message.body);
        assert!(due >= started + 1_500, "{} was due {due}, before its delay from the publish", message.body);
        assert_eq!(message.header("tenant"), Some("acme"), "the producer's headers travel on");
    }
    let mut set_aside = Vec::new();
    hourglass_e2e::until("20 invalid messages set aside", Duration::from_secs(10), async || {
        set_aside = read_stream(&invalid.replace('.', "-")).await;
        set_aside.len() >= 20
    })
    .await;
    for message in &set_aside {
        let i: usize = message.body.trim_start_matches("bad-").parse().unwrap();
        let reason = message.header("hourglass-invalid-reason").unwrap_or_default();
        assert!(reason.contains(bad[i % bad.len()].1), "{}: the reason {reason:?} names {:?}", message.body, bad[i % bad.len()].1);
    }

    served.stop().await;
    destination.delete().await;
    delete_held(&held).await;
    delete_streams(&[input.replace('.', "-"), invalid.replace('.', "-")]).await;
}

/// The acceptance load: 3,000 messages, half over HTTP and half
/// through the ingress subject, with delays spread over 1-60 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_thousand_messages_over_http_and_ingress_with_1_to_60_s_delays_all_arrive_none_early() {
    let (input, invalid, toml) = ingress_of_its_own("load");
    let _ingress = Cleanup::subjects(&[&input, &invalid]);
    let (config, held) = hold_config_with(&nats_url(), "load", "max_wait = \"10s\"", &toml);
    let _held = Cleanup::held(&held);
    let mut destination = NatsDestination::create("load-dest").await;
    let served = Served::start_ready(&config).await;
    let jetstream = connect().await;
    let target = destination.subject.clone();

    let mut due = HashMap::new();
    for i in 0..1_500u64 {
        let body = format!("http-{i}");
        let delay_ms = 1_000 + (i * 7_919) % 59_000;
        let (status, answer) = served.http.schedule(None, json!({ "destination": target, "delay": delay_ms, "body": body })).await;
        assert_eq!(status, 202, "{body}: {answer}");
        due.insert(body, answer["due_at"].as_u64().unwrap());
    }
    for i in 0..1_500u64 {
        let delay = format!("{}ms", 1_000 + (i * 7_907) % 59_000);
        publish_to_ingress(&jetstream, &input, &[("hourglass-destination", target.as_str()), ("hourglass-delay", delay.as_str())], &format!("in-{i}")).await;
    }
    let received = destination.receive(3_000, Duration::from_secs(120)).await;
    let mut late: Vec<i64> = received
        .iter()
        .map(|r| {
            let due = due.get(&r.body).copied().unwrap_or_else(|| r.header("hourglass-due-at").expect("due time").parse().unwrap());
            r.at_ms as i64 - due as i64
        })
        .collect();
    late.sort_unstable();
    let (p50, p99, max) = (late[late.len() / 2], late[late.len() * 99 / 100], late[late.len() - 1]);
    println!("3,000 messages of 1-60 s: lateness min {} ms, p50 {p50} ms, p99 {p99} ms, max {max} ms", late[0]);
    assert!(late[0] >= 0, "a message arrived {} ms early", -late[0]);
    assert!(max <= ON_TIME_MS, "the latest arrived {max} ms late (window {ON_TIME_MS} ms)");
    assert!(destination.drain(Duration::from_millis(500)).await.is_empty(), "no duplicates");

    served.stop().await;
    destination.delete().await;
    delete_held(&held).await;
    delete_streams(&[input.replace('.', "-"), invalid.replace('.', "-")]).await;
}

/// Cancel 20 of 40 messages in flight, move 5 later and ask to cancel 5 already delivered:
/// none cancelled arrives, the moved ones arrive at their new time, the delivered ones answer 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_messages_never_arrive_and_rescheduled_ones_arrive_at_their_new_time_on_nats() {
    let (_, bucket) = unique("cancel");
    // The log's name as a KV bucket ('.' as '-'), kept in stream KV_<bucket>.
    let _bucket = Cleanup::on(&nats_url(), &[format!("KV_{}", bucket.replace('.', "-"))]);
    let (config, held) = hold_config_with(&nats_url(), "cancel", "cancellable = true", &format!("[service.cancel]\nlog = \"{bucket}\"\n"));
    let _held = Cleanup::held(&held);
    let mut destination = NatsDestination::create("cancel-dest").await;
    let served = Served::start_ready(&config).await;
    let target = destination.subject.clone();

    let mut ids = Vec::new();
    for i in 0..45u64 {
        // Five due at once, delivered before they are asked about; forty due in 3-4 s.
        let delay = if i < 5 { 0 } else { 3_000 + i * 25 };
        let (status, answer) = served.http.schedule(None, json!({ "destination": target, "delay": delay, "body": format!("c-{i}") })).await;
        assert_eq!(status, 202, "{answer}");
        ids.push((answer["id"].as_str().unwrap().to_string(), answer["due_at"].as_u64().unwrap()));
    }
    let delivered = destination.receive(5, Duration::from_secs(5)).await;
    assert!(delivered.iter().all(|m| m.body.starts_with("c-") && m.body[2..].parse::<u64>().unwrap() < 5), "only the undelayed five came first");
    for (id, _) in &ids[..5] {
        let (status, body) = served.http.call("DELETE", &format!("/v1/messages/{id}"), None, None).await;
        assert_eq!(status, 409, "a delivered message cannot be cancelled: {body}");
    }
    let mut moved_due = HashMap::new();
    for (i, (id, _)) in ids.iter().enumerate().skip(5) {
        if i % 2 == 1 {
            let (status, body) = served.http.call("DELETE", &format!("/v1/messages/{id}"), None, None).await;
            assert_eq!(status, 200, "cancel c-{i}: {body}");
        } else if i % 10 == 0 {
            let (status, body) = served.http.call("PATCH", &format!("/v1/messages/{id}"), None, Some(json!({ "delay": "6s" }))).await;
            assert_eq!(status, 200, "reschedule c-{i}: {body}");
            let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
            moved_due.insert(format!("c-{i}"), answer["due_at"].as_u64().unwrap());
        }
    }
    let kept = (5..45).filter(|i: &usize| i.is_multiple_of(2)).count();
    let arrived = destination.receive(kept, Duration::from_secs(20)).await;
    for message in &arrived {
        let i: usize = message.body[2..].parse().unwrap();
        assert!(i.is_multiple_of(2), "{} was cancelled, and arrived", message.body);
        let due = moved_due.get(&message.body).copied().unwrap_or(ids[i].1);
        let late = message.at_ms as i64 - due as i64;
        assert!((0..=ON_TIME_MS).contains(&late), "{} arrived {late} ms from its due time (moved: {})", message.body, moved_due.contains_key(&message.body));
    }
    assert!(destination.drain(Duration::from_secs(2)).await.is_empty(), "nothing cancelled arrives later");
    let (status, body) = served.http.call("DELETE", &format!("/v1/messages/{}", ids[5].0), None, None).await;
    assert_eq!(status, 200, "cancelling twice answers as the first time: {body}");
    let (status, metrics) = served.http.call("GET", "/metrics", None, None).await;
    assert_eq!(status, 200);
    let counted = |outcome: &str| metric_sum(&metrics, &format!("hourglass_held_deliveries_total{{queue=\"{held}\",outcome=\"{outcome}\"}}"));
    assert_eq!(counted("cancelled"), 20.0, "every cancelled message dropped at hand-over is counted:\n{metrics}");
    assert_eq!(counted("handed_over"), kept as f64 + 5.0, "every delivered one is counted");

    served.stop().await;
    destination.delete().await;
    delete_held(&held).await;
}

/// `hourglass verify` on NATS: passes once `serve` made the strategy's streams and the destination has one,
/// fails naming a destination no stream captures and a held stream that is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_proves_the_server_s_mechanism_and_names_what_is_missing_on_nats() {
    let (held, subject) = unique("verify-hold");
    let _held = Cleanup::held(&held);
    let text = format!(
        "[broker]\nkind = \"nats\"\nurl = \"{}\"\nclock_stream = \"{held}-clock\"\n[strategies.hold]\nplanner = \"nats-hold\"\nstream = \"{held}\"\nsubject = \"{subject}\"\n\
         [service.ingress]\nenabled = false\n[service.canary]\nenabled = false\n",
        nats_url()
    );
    let file = std::env::temp_dir().join(format!("{held}.toml"));
    std::fs::write(&file, &text).unwrap();
    let config = hourglass::config::Config::load(&file).unwrap();
    let destination = NatsDestination::create("verify-dest").await;
    let verify = |to: &str| {
        let output = std::process::Command::new(hourglass_e2e::hourglass_binary()).args(["--config"]).arg(&file).args(["verify", "--to", to]).output().unwrap();
        (output.status.success(), String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr))
    };
    let (passed, before) = verify(&destination.subject);
    assert!(!passed, "the held stream is missing before `serve` made it:\n{before}");
    assert!(before.contains(&format!("stream {held}")) && before.contains("missing"), "{before}");
    assert!(before.contains("probe: a declined message comes back after its delay  passed"), "the probe passes:\n{before}");

    let served = Served::start_ready(&config).await;
    let (passed, after) = verify(&destination.subject);
    assert!(passed, "{after}");
    let (passed, nowhere) = verify(&format!("{}.nowhere", destination.subject));
    assert!(!passed && nowhere.contains("no stream captures"), "{nowhere}");

    served.stop().await;
    destination.delete().await;
    delete_held(&held).await;
    std::fs::remove_file(&file).ok();
}

/// `service.topology = "verify"` on NATS refuses to start while a strategy's held stream is missing,
/// naming it, and starts once a host that applies the topology made it; `hourglass inspect` then
/// counts what waits in the held stream, as `GET /v1/delays` does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_verifies_the_held_streams_and_inspect_counts_what_waits_in_them_on_nats() {
    let (held, subject) = unique("inspect-hold");
    let _held = Cleanup::held(&held);
    let text = |topology: &str| {
        format!(
            "[broker]\nkind = \"nats\"\nurl = \"{}\"\nclock_stream = \"{held}-clock\"\n[strategies.hold]\nplanner = \"nats-hold\"\nstream = \"{held}\"\nsubject = \"{subject}\"\n\
             [service]\ntopology = \"{topology}\"\n[service.ingress]\nenabled = false\n[service.canary]\nenabled = false\n",
            nats_url()
        )
    };
    let file = std::env::temp_dir().join(format!("{held}.toml"));
    std::fs::write(&file, text("apply")).unwrap();
    let applying = hourglass::config::Config::load(&file).unwrap();
    let verifying = hourglass::config::Config::parse(&file, text("verify")).unwrap();

    let refused = match Service::start(verifying.clone()).await {
        Ok(_) => panic!("a verifying host started without the held stream"),
        Err(err) => err.to_string(),
    };
    assert!(refused.contains("topology drift") && refused.contains(&format!("stream {held}")), "{refused}");

    let destination = NatsDestination::create("inspect-dest").await;
    let served = Served::start_ready(&applying).await;
    for i in 0..3 {
        let (status, answer) = served.http.schedule(None, json!({ "destination": destination.subject, "delay": "1h", "body": format!("w-{i}") })).await;
        assert_eq!(status, 202, "{answer}");
    }
    let verified = Service::start(verifying).await.expect("a verifying host starts once the held stream is there");
    Served::start(verified).await.stop().await;

    let output =
        std::process::Command::new(hourglass_e2e::hourglass_binary()).args(["--config"]).arg(&file).args(["inspect", "--format", "json"]).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let depths: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let strategy = &depths[0];
    assert_eq!(strategy["waiting"], 3, "the three scheduled messages wait in the held stream:\n{stdout}");
    assert_eq!(strategy["parked"], 0, "{stdout}");
    assert!(strategy["queues"].as_array().unwrap().iter().any(|q| q["queue"] == held.as_str()), "the held stream is read:\n{stdout}");

    served.stop().await;
    destination.delete().await;
    delete_held(&held).await;
    std::fs::remove_file(&file).ok();
}

/// The canary probes every strategy through its held stream, a second strategy's held stream
/// included (made at start, so `/readyz` is 200 at once), and measures each probe on arrival.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_canary_probes_every_strategy_and_a_second_held_stream_is_ready_at_start_on_nats() {
    let (other, other_subject) = unique("canary-other");
    let (_, canary) = unique("canary");
    let (_other, _canary) = (Cleanup::held(&other), Cleanup::subjects(&[&canary]));
    let more = format!(
        "[strategies.other]\nplanner = \"nats-hold\"\nstream = \"{other}\"\nsubject = \"{other_subject}\"\n\n\
         [service.canary]\nqueue = \"{canary}\"\nevery = \"1s\"\ndelay = \"1s\"\n"
    );
    let (config, held) = hold_config_with(&nats_url(), "canary", "", &more);
    let _held = Cleanup::held(&held);
    let served = Served::start_ready(&config).await;
    for strategy in ["hold", "other"] {
        let label = format!("strategy=\"{strategy}\"");
        hourglass_e2e::until(&format!("a canary probe of {strategy} measured"), Duration::from_secs(15), async || {
            served.http.histogram_max_bucket("hourglass_delivery_lateness_seconds", &label).await.0 >= 2
        })
        .await;
        let (_, worst) = served.http.histogram_max_bucket("hourglass_delivery_lateness_seconds", &label).await;
        assert!(worst <= 0.25, "{strategy}'s probes were up to {worst} s late");
    }
    assert_eq!(served.http.metric("hourglass_delivery_early_total").await, 0.0, "no probe early");

    served.stop().await;
    delete_held(&held).await;
    delete_held(&other).await;
    delete_streams(&[canary.replace('.', "-")]).await;
}

/// Hosts whose clocks are 5 s ahead and 5 s behind the server's read the
/// server's clock (a stamp JetStream gives a stored message), so neither hands
/// a message over early or late: every message arrives within the window of
/// its due time on the server's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_with_clocks_5_s_off_hand_over_on_the_server_s_clock_on_nats() {
    use hourglass::clock::{Clock, ShiftedClock};
    let (config, held) = hold_config("clock", "max_wait = \"2s\"");
    let _held = Cleanup::held(&held);
    let mut destination = NatsDestination::create("clock-dest").await;
    for shift_ms in [5_000i64, -5_000] {
        let service = hourglass::service::Service::start_with_clock(config.clone(), Clock::new(ShiftedClock::new(shift_ms))).await.expect("service starts");
        let served = Served::start(service).await;
        let due = schedule_many(&served, &destination.subject, 30).await;
        let received = destination.receive(30, Duration::from_secs(20)).await;
        for (body, late) in lateness(&received, &due) {
            // `due` is the host's stamp, on the server's clock once read: the test's own clock is the server's here.
            assert!((0..=ON_TIME_MS).contains(&late), "host {shift_ms:+} ms: {body} arrived {late} ms from its due time");
        }
        served.stop().await;
    }
    destination.delete().await;
}
