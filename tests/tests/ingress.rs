//! The AMQP ingress on a real RabbitMQ: valid messages are forwarded and
//! delayed with their body, properties and headers intact; invalid ones land
//! in the invalid-messages queue with the reason; the counts add up. A poison
//! message (one the consumer cannot handle, or that makes it panic) is set
//! aside and never blocks the messages behind it.

use std::sync::Arc;
use std::time::Duration;

use hourglass::broker::rabbitmq::RabbitMqExecutor;
use hourglass::broker::rabbitmq::consume::{Consumer, Handler, MAX_PANICS, long_string};
use hourglass::command::{AmqpCommand, Command};
use hourglass::headers::{DELIVER_AT_HEADER, DESTINATION_HEADER, INVALID_REASON_HEADER, REQUESTED_DELAY_HEADER as DELAY_HEADER, STRATEGY_HEADER};
use hourglass::message::{Outcome, Settled};
use hourglass::service::Service;
use hourglass_e2e::serve::Served;
use hourglass_e2e::vhost::PrivateVhost;
use hourglass_e2e::*;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel};

/// How late a valid message forwarded by the ingress may arrive after its
/// `hourglass-due-at`: one 1 s precision step (the 1,500 ms delays round up to
/// 2 s levels) plus 100 ms. Measured 5–15 ms for 1 s delays and 504–514 ms for
/// 1,500 ms (two tests at a time, 2026-12-02; printed).
const INGRESS_ON_TIME_MS: u64 = 1_000 + 100;

/// Header entries as a test writes them.
type Headers<'a> = Vec<(&'a str, AMQPValue)>;

async fn publish(channel: &Channel, queue: &str, body: &str, headers: Vec<(&str, AMQPValue)>, properties: BasicProperties) {
    let mut table = FieldTable::default();
    for (k, v) in headers {
        table.insert(ShortString::from(k), v);
    }
    channel
        .basic_publish("".into(), queue.into(), BasicPublishOptions::default(), body.as_bytes(), properties.with_headers(table))
        .await
        .unwrap()
        .await
        .expect("broker confirmed the ingress publish");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingress_forwards_valid_messages_and_sets_invalid_ones_aside_with_the_reason() {
    let prefix = unique("ingress");
    let ingress_queue = unique("ingress-in");
    let invalid_queue = unique("ingress-invalid");
    let config = config_with(
        &format!("planner = \"binary-levels\"\nprefix = \"{prefix}\""),
        &format!("[service.ingress]\nqueue = \"{ingress_queue}\"\ninvalid_queue = \"{invalid_queue}\"\nprefetch = 4"),
    );
    // Deletes what the test declares, also when it fails.
    let cleanup = Cleanup::declared(&topology_of(&config));
    cleanup.ingress(&config);
    let connection = connect().await;
    let mut destination = Destination::declare(&connection, "ingress-dest").await;
    cleanup.queue(&destination.name);
    let served = Served::start(Service::start(config.clone()).await.expect("service starts")).await;
    until("the ingress consuming (readyz 200)", Duration::from_secs(10), async || served.http.call("GET", "/readyz", None, None).await.0 == 200).await;

    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    let dest = destination.name.as_str();
    const VALID: usize = 6;
    for i in 0..VALID {
        let delay = if i % 2 == 0 { long_string("1s") } else { AMQPValue::LongInt(1500) };
        let properties = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_correlation_id(format!("corr-{i}").into())
            .with_message_id(format!("mine-{i}").into());
        let headers = vec![(DESTINATION_HEADER, long_string(dest)), (DELAY_HEADER, delay), ("tenant", long_string("acme")), ("score", AMQPValue::Double(0.25))];
        publish(&channel, &ingress_queue, &format!("valid-{i}"), headers, properties).await;
    }
    let absent = unique("absent");
    let invalid: Vec<(&str, Headers, &str)> = vec![
        ("no-destination", vec![(DELAY_HEADER, long_string("1s"))], "missing header hourglass-destination"),
        ("bad-delay", vec![(DESTINATION_HEADER, long_string(dest)), (DELAY_HEADER, long_string("soon"))], "hourglass-delay"),
        ("unknown-destination", vec![(DESTINATION_HEADER, long_string(&absent)), (DELAY_HEADER, long_string("1s"))], "does not exist"),
        (
            "unknown-strategy",
            vec![(DESTINATION_HEADER, long_string(dest)), (DELAY_HEADER, long_string("1s")), (STRATEGY_HEADER, long_string("nope"))],
            "unknown strategy",
        ),
        // The broker copies to CC's queues on the way in (none exist here) and keeps the header; moving the message
        // aside with it would be refused, so the move drops it.
        (
            "routing-copy",
            vec![(DESTINATION_HEADER, long_string(dest)), (DELAY_HEADER, long_string("1s")), ("CC", AMQPValue::FieldArray(vec![long_string(&absent)].into()))],
            "would copy the message",
        ),
    ];
    for (body, headers, _) in &invalid {
        publish(&channel, &ingress_queue, body, headers.clone(), BasicProperties::default()).await;
    }

    let received = destination.receive(VALID, Duration::from_secs(10)).await;
    for got in &received {
        let body = String::from_utf8_lossy(&got.delivery.data).to_string();
        let i: usize = body.strip_prefix("valid-").and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("unexpected body {body}"));
        let props = &got.delivery.properties;
        assert_eq!(props.content_type().as_ref().map(|c| c.as_str()), Some("application/json"));
        assert_eq!(props.correlation_id().as_ref().map(|c| c.to_string()), Some(format!("corr-{i}")));
        assert_eq!(props.message_id().as_ref().map(|c| c.to_string()), Some(format!("mine-{i}")), "the producer's message id is kept");
        assert_eq!(header(&got.delivery, "tenant"), Some(&long_string("acme")));
        assert_eq!(header(&got.delivery, "score"), Some(&AMQPValue::Double(0.25)), "header types survive");
        assert!(header(&got.delivery, DESTINATION_HEADER).is_none() && header(&got.delivery, DELAY_HEADER).is_none());
        let Some(AMQPValue::LongLongInt(due_at)) = header(&got.delivery, "hourglass-due-at") else { panic!("no due-at header") };
        assert!(got.at_ms >= *due_at as u64, "{body} arrived {} ms early", *due_at as u64 - got.at_ms);
        let late = got.at_ms - *due_at as u64;
        eprintln!("{body}: {late} ms late (window {INGRESS_ON_TIME_MS} ms)");
        assert!(late <= INGRESS_ON_TIME_MS, "{body} arrived {late} ms late (window {INGRESS_ON_TIME_MS} ms)");
    }
    destination.assert_quiet(Duration::from_millis(500)).await;

    let reader = connection.create_channel().await.unwrap();
    let set_aside = get_at_least(&reader, &invalid_queue, invalid.len(), Duration::from_secs(10)).await;
    let shown: Vec<(String, Option<String>)> =
        set_aside.iter().map(|d| (String::from_utf8_lossy(&d.data).into_owned(), header_text(d, INVALID_REASON_HEADER))).collect();
    assert_eq!(set_aside.len(), invalid.len(), "set aside: {shown:?}");
    for (body, _, reason) in &invalid {
        let got = set_aside.iter().find(|d| d.data == body.as_bytes()).unwrap_or_else(|| panic!("{body} not set aside"));
        let Some(AMQPValue::LongString(why)) = header(got, INVALID_REASON_HEADER) else { panic!("{body}: no reason header") };
        let why = String::from_utf8_lossy(why.as_bytes());
        assert!(why.contains(reason), "{body}: reason {why:?} should mention {reason:?}");
    }
    until("the ingress queue drained and acked", Duration::from_secs(5), async || queue_depth(&reader, &ingress_queue).await == 0).await;

    let forwarded = served.http.metric("hourglass_ingress_messages_total{outcome=\"forwarded\"}").await;
    let set_aside_count = served.http.metric("hourglass_ingress_messages_total{outcome=\"invalid\"}").await;
    assert_eq!((forwarded, set_aside_count), (VALID as f64, invalid.len() as f64), "in = forwarded + invalid");
    assert_eq!(served.http.metric("hourglass_ingress_in_flight ").await, 0.0);
    // Planning comes before anything touches the broker, so the message to the absent destination was planned too.
    assert_eq!(
        served.http.metric("hourglass_planner_call_seconds_count").await,
        VALID as f64 + 1.0,
        "one plan per forwarded message, plus the absent destination's"
    );

    served.stop().await;
}

/// How late a message given a due time may arrive: binary levels count
/// whole seconds, so up to 1 s by design, plus the 100 ms on-time window
/// measured for the levels (tests/tests/early.rs), plus the host's reading
/// of the broker's clock, which it counts the delay against
/// ([`CLOCK_ERROR_MS`]).
const DUE_TIME_WINDOW_MS: u64 = 1_100 + CLOCK_ERROR_MS;

fn rfc3339(unix_ms: u64) -> String {
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(unix_ms)).to_string()
}

/// A due time instead of a delay, through the ingress (RFC 3339 with an
/// offset, and Unix ms) and through HTTP: each arrives at or after it, never
/// before; a time already past goes out at once; a bad one beside them is set
/// aside naming the header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_due_time_instead_of_a_delay_is_kept_through_the_ingress_and_http() {
    let prefix = unique("deliver-at");
    let ingress_queue = unique("deliver-at-in");
    let invalid_queue = unique("deliver-at-invalid");
    let config = config_with(
        &format!("planner = \"binary-levels\"\nprefix = \"{prefix}\""),
        &format!("[service.ingress]\nqueue = \"{ingress_queue}\"\ninvalid_queue = \"{invalid_queue}\""),
    );
    // Deletes what the test declares, also when it fails.
    let cleanup = Cleanup::declared(&topology_of(&config));
    cleanup.ingress(&config);
    let connection = connect().await;
    let mut destination = Destination::declare(&connection, "deliver-at-dest").await;
    cleanup.queue(&destination.name);
    let dest = destination.name.clone();
    let served = Served::start(Service::start(config.clone()).await.expect("service starts")).await;
    until("the ingress consuming (readyz 200)", Duration::from_secs(10), async || served.http.call("GET", "/readyz", None, None).await.0 == 200).await;
    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();

    let now = hourglass::clock::unix_now_ms();
    let mut wanted: Vec<(&str, u64)> = Vec::new();
    // 19:00 at +01:00 is 18:00 UTC: written an hour on, with the offset.
    let with_offset = rfc3339(now + 1_500 + 3_600_000).replace('Z', "+01:00");
    publish(
        &channel,
        &ingress_queue,
        "ingress-offset",
        vec![(DESTINATION_HEADER, long_string(&dest)), (DELIVER_AT_HEADER, long_string(&with_offset))],
        BasicProperties::default(),
    )
    .await;
    wanted.push(("ingress-offset", now + 1_500));
    let unix_ms = now + 2_300;
    publish(
        &channel,
        &ingress_queue,
        "ingress-unix-ms",
        vec![(DESTINATION_HEADER, long_string(&dest)), (DELIVER_AT_HEADER, AMQPValue::LongLongInt(unix_ms as i64))],
        BasicProperties::default(),
    )
    .await;
    wanted.push(("ingress-unix-ms", unix_ms));
    publish(
        &channel,
        &ingress_queue,
        "ingress-past",
        vec![(DESTINATION_HEADER, long_string(&dest)), (DELIVER_AT_HEADER, long_string(&rfc3339(now - 60_000)))],
        BasicProperties::default(),
    )
    .await;
    wanted.push(("ingress-past", now));
    publish(
        &channel,
        &ingress_queue,
        "ingress-bad",
        vec![(DESTINATION_HEADER, long_string(&dest)), (DELIVER_AT_HEADER, long_string("at noon"))],
        BasicProperties::default(),
    )
    .await;
    let at = now + 1_800;
    let (status, answer) = served.http.schedule(None, serde_json::json!({ "destination": dest, "deliver_at": rfc3339(at), "body": "http" })).await;
    assert_eq!(status, 202, "{answer}");
    assert!(answer["due_at"].as_u64().is_some_and(|due| due >= at), "due_at is never before deliver_at: {answer}");
    wanted.push(("http", at));

    let received = destination.receive(wanted.len(), Duration::from_secs(10)).await;
    for got in &received {
        let body = String::from_utf8_lossy(&got.delivery.data).to_string();
        let (_, due) = wanted.iter().find(|(name, _)| *name == body).unwrap_or_else(|| panic!("unexpected {body}"));
        assert!(got.at_ms >= *due, "{body} arrived {} ms before its due time", due - got.at_ms);
        assert!(got.at_ms <= due + DUE_TIME_WINDOW_MS, "{body} arrived {} ms after its due time (window {DUE_TIME_WINDOW_MS} ms)", got.at_ms - due);
    }
    destination.assert_quiet(Duration::from_millis(300)).await;
    let (status, _) = served.http.call("GET", &format!("/v1/delivered?destination={dest}"), None, None).await;
    assert_eq!(status, 404, "RabbitMQ keeps no deliveries for hourglass to show");
    let reader = connection.create_channel().await.unwrap();
    let set_aside = get_at_least(&reader, &invalid_queue, 1, Duration::from_secs(10)).await;
    assert_eq!(set_aside.len(), 1);
    let reason = header_text(&set_aside[0], INVALID_REASON_HEADER).unwrap_or_default();
    assert!(reason.contains("hourglass-deliver-at") && reason.contains("RFC 3339"), "{reason}");

    served.stop().await;
}

/// Declares `queue` as hourglass does (durable, quorum) and publishes into it before any consumer runs.
async fn fill(channel: &Channel, queue: &str, messages: Vec<(&str, Headers<'_>, BasicProperties)>) {
    let durable = QueueDeclareOptions { durable: true, ..Default::default() };
    let mut quorum = FieldTable::default();
    quorum.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
    channel.queue_declare(queue.into(), durable, quorum).await.unwrap();
    for (body, headers, properties) in messages {
        publish(channel, queue, body, headers, properties).await;
    }
}

fn valid(dest: &str) -> Vec<(&'static str, AMQPValue)> {
    vec![(DESTINATION_HEADER, long_string(dest)), (DELAY_HEADER, long_string("1s"))]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_at_the_head_of_the_ingress_queue_is_set_aside_and_the_valid_ones_behind_it_arrive() {
    let ingress_queue = unique("poison-in");
    let invalid_queue = unique("poison-invalid");
    // Prefetch 1: nothing behind the head moves until the head is dealt with.
    let config = config_with(
        &format!("planner = \"binary-levels\"\nprefix = \"{}\"", unique("poison")),
        &format!("[service.ingress]\nqueue = \"{ingress_queue}\"\ninvalid_queue = \"{invalid_queue}\"\nprefetch = 1"),
    );
    // Deletes what the test declares, also when it fails.
    let cleanup = Cleanup::declared(&topology_of(&config));
    cleanup.ingress(&config);
    let connection = connect().await;
    let mut destination = Destination::declare(&connection, "poison-dest").await;
    cleanup.queue(&destination.name);
    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    // A destination AMQP cannot carry (over 255 bytes) used to panic the consumer, again after every restart.
    let too_long = "d".repeat(300);
    let mut messages = vec![("poison", valid(&too_long), BasicProperties::default())];
    for body in ["behind-0", "behind-1", "behind-2"] {
        messages.push((body, valid(&destination.name), BasicProperties::default()));
    }
    fill(&channel, &ingress_queue, messages).await;
    let served = Served::start(Service::start(config.clone()).await.expect("service starts")).await;

    let received = destination.receive(3, Duration::from_secs(15)).await;
    let mut bodies: Vec<String> = received.iter().map(|r| String::from_utf8_lossy(&r.delivery.data).into_owned()).collect();
    bodies.sort();
    assert_eq!(bodies, ["behind-0", "behind-1", "behind-2"], "the valid messages behind the poison one arrive");
    let set_aside = get_at_least(&channel, &invalid_queue, 1, Duration::from_secs(10)).await;
    assert_eq!(set_aside[0].data, b"poison");
    let why = header_text(&set_aside[0], INVALID_REASON_HEADER).unwrap_or_default();
    assert!(why.contains("hourglass-destination") && why.contains("300 bytes"), "the reason names the header: {why:?}");
    assert_eq!(header_text(&set_aside[0], DESTINATION_HEADER).map(|d| d.len()), Some(300), "set aside as it came");
    until("the ingress queue drained", Duration::from_secs(5), async || queue_depth(&channel, &ingress_queue).await == 0).await;

    served.stop().await;
}

/// A handler that panics on the body "poison" and acks the rest.
struct Panicking {
    queue: String,
    aside: String,
    handled: tokio::sync::mpsc::UnboundedSender<String>,
    panics: std::sync::atomic::AtomicU32,
}

impl Handler for Panicking {
    type Note = String;

    fn queue(&self) -> &str {
        &self.queue
    }

    fn prefetch(&self) -> u16 {
        1
    }

    fn declarations(&self) -> Vec<Command> {
        [&self.queue, &self.aside]
            .into_iter()
            .map(|q| Command::Amqp(AmqpCommand::DeclareQueue { name: q.clone(), durable: true, arguments: Default::default() }))
            .collect()
    }

    async fn handle(&self, delivery: &hourglass::message::Delivery) -> (Outcome, String) {
        let body = String::from_utf8_lossy(&delivery.body).into_owned();
        if body == "poison" {
            panic!("cannot digest {body}");
        }
        (Outcome::Ack, body)
    }

    fn poisoned(&self, _delivery: &hourglass::message::Delivery, reason: &str) -> Outcome {
        Outcome::move_to(&self.aside, INVALID_REASON_HEADER, reason)
    }

    fn settled(&self, note: Option<String>, _outcome: &Outcome, settled: &Settled) {
        match note {
            Some(body) if *settled == Settled::Acked => {
                let _ = self.handled.send(body);
            }
            Some(_) => {}
            None => {
                self.panics.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_panicking_on_a_message_requeues_it_then_sets_it_aside_and_goes_on() {
    let (handled, mut handled_rx) = tokio::sync::mpsc::unbounded_channel();
    let handler = Arc::new(Panicking { queue: unique("panics-in"), aside: unique("panics-aside"), handled, panics: Default::default() });
    // Deletes the handler's queues, also when the test fails.
    let _cleanup = Cleanup::declared(&handler.declarations());
    let connection = connect().await;
    let publisher = Arc::new(RabbitMqExecutor::connect(&amqp_url()).await.expect("RabbitMQ"));
    let consumer = Consumer::new(&amqp_url(), publisher, handler.clone());
    consumer.declare().await.expect("declares its queues");
    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    for body in ["poison", "after-0", "after-1"] {
        publish(&channel, &handler.queue, body, vec![], BasicProperties::default().with_message_id(body.into())).await;
    }
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let running = tokio::spawn(consumer.clone().run(stopped));

    let after = receive_within(&mut handled_rx, 2, Duration::from_secs(15), &handler.queue).await;
    assert_eq!(after, ["after-0", "after-1"], "the messages behind the poison one are handled");
    let aside = get_at_least(&channel, &handler.aside, 1, Duration::from_secs(10)).await;
    assert_eq!(aside[0].data, b"poison");
    let why = header_text(&aside[0], INVALID_REASON_HEADER).unwrap_or_default();
    assert!(why.contains(&format!("{MAX_PANICS} times")) && why.contains("cannot digest poison"), "{why:?}");
    assert_eq!(handler.panics.load(std::sync::atomic::Ordering::Relaxed), MAX_PANICS, "requeued until the last panic, then set aside");
    assert!(consumer.is_consuming(), "the consumer survived its handler");
    until("the queue drained", Duration::from_secs(5), async || queue_depth(&channel, &handler.queue).await == 0).await;

    stop.send(true).unwrap();
    running.await.unwrap();
}

/// A handler that holds the body "slow" until told what to do with it, and acks the rest at once.
struct Gated {
    queue: String,
    /// Every settled delivery: body, whether it was a redelivery, and how it settled.
    settled: tokio::sync::mpsc::UnboundedSender<(String, bool, Settled)>,
    /// The outcome for "slow", once given.
    gate: tokio::sync::watch::Receiver<Option<Outcome>>,
}

impl Handler for Gated {
    type Note = (String, bool);

    fn queue(&self) -> &str {
        &self.queue
    }

    fn prefetch(&self) -> u16 {
        64
    }

    fn declarations(&self) -> Vec<Command> {
        vec![Command::Amqp(AmqpCommand::DeclareQueue { name: self.queue.clone(), durable: true, arguments: Default::default() })]
    }

    async fn handle(&self, delivery: &hourglass::message::Delivery) -> (Outcome, (String, bool)) {
        let body = String::from_utf8_lossy(&delivery.body).into_owned();
        let outcome = match (body.as_str(), delivery.redelivered) {
            ("slow", false) => {
                let mut gate = self.gate.clone();
                gate.wait_for(Option::is_some).await.expect("the test holds the gate").clone().expect("given")
            }
            _ => Outcome::Ack,
        };
        (outcome, (body, delivery.redelivered))
    }

    fn poisoned(&self, _delivery: &hourglass::message::Delivery, _reason: &str) -> Outcome {
        Outcome::Requeue
    }

    fn settled(&self, note: Option<(String, bool)>, _outcome: &Outcome, settled: &Settled) {
        if let Some((body, redelivered)) = note {
            let _ = self.settled.send((body, redelivered, settled.clone()));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_of_the_messages_behind_a_slow_one_never_cover_it() {
    // The consumer acks many finished deliveries with one multiple ack. Were
    // the slow message covered by the acks of those behind it, its requeue
    // below would name an unknown delivery tag: the broker would close the
    // channel and the message, acked unhandled, would never come back.
    let (settled, mut settled_rx) = tokio::sync::mpsc::unbounded_channel();
    let (open_gate, gate) = tokio::sync::watch::channel(None);
    let handler = Arc::new(Gated { queue: unique("acks-in"), settled, gate });
    // Deletes the handler's queue, also when the test fails.
    let _cleanup = Cleanup::declared(&handler.declarations());
    let publisher = Arc::new(RabbitMqExecutor::connect(&amqp_url()).await.expect("RabbitMQ"));
    let consumer = Consumer::new(&amqp_url(), publisher, handler.clone());
    consumer.declare().await.expect("declares its queue");
    let connection = connect().await;
    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    publish(&channel, &handler.queue, "slow", vec![], BasicProperties::default()).await;
    let behind: Vec<String> = (0..40).map(|i| format!("fast-{i}")).collect();
    for body in &behind {
        publish(&channel, &handler.queue, body, vec![], BasicProperties::default()).await;
    }
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let running = tokio::spawn(consumer.clone().run(stopped));

    // The ones behind are acked while the slow one is still in hand (acked alone after a short wait).
    let first = receive_within(&mut settled_rx, behind.len(), Duration::from_secs(15), &handler.queue).await;
    let mut bodies: Vec<&str> = first.iter().map(|(body, _, _)| body.as_str()).collect();
    bodies.sort_by_key(|body| body.trim_start_matches("fast-").parse::<u32>().unwrap_or(u32::MAX));
    assert_eq!(bodies, behind.iter().map(String::as_str).collect::<Vec<_>>(), "all behind the slow one, each once");
    assert!(first.iter().all(|(_, redelivered, how)| !redelivered && *how == Settled::Acked), "{first:?}");

    open_gate.send(Some(Outcome::Requeue)).unwrap();
    let again = receive_within(&mut settled_rx, 2, Duration::from_secs(15), &handler.queue).await;
    assert_eq!(again[0], ("slow".to_string(), false, Settled::Requeued), "requeued, on a channel still open");
    assert_eq!(again[1], ("slow".to_string(), true, Settled::Acked), "the broker gave it back: it was never acked by the others");
    until("the queue drained", Duration::from_secs(5), async || queue_depth(&channel, &handler.queue).await == 0).await;
    assert!(consumer.is_consuming(), "the consumer kept its channel");
    if let Ok(Some(extra)) = tokio::time::timeout(Duration::from_millis(500), settled_rx.recv()).await {
        panic!("nothing else is delivered again: {extra:?}");
    }

    stop.send(true).unwrap();
    running.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_the_broker_refuses_reopens_the_publish_channel_and_the_message_is_still_set_aside() {
    // RabbitMQ closes a channel that publishes a user-id other than its own
    // user's: a message a producer sent under its own user does exactly that
    // when hourglass forwards it or moves it aside.
    let user = unique("producer");
    // Deletes the user, and later what the test declares, also when it fails.
    let cleanup = Cleanup::default();
    cleanup.user(&user);
    management("PUT", &format!("/api/users/{user}"), Some(serde_json::json!({ "password": "secret", "tags": "" })));
    management("PUT", &format!("/api/permissions/%2F/{user}"), Some(serde_json::json!({ "configure": ".*", "write": ".*", "read": ".*" })));
    let base = amqp_url();
    let (scheme, rest) = base.split_once("://").unwrap();
    let producer = connect_to(&format!("{scheme}://{user}:secret@{}", rest.rsplit_once('@').map_or(rest, |(_, host)| host))).await;

    let ingress_queue = unique("userid-in");
    let invalid_queue = unique("userid-invalid");
    let config = config_with(
        &format!("planner = \"binary-levels\"\nprefix = \"{}\"", unique("userid")),
        &format!("[service.ingress]\nqueue = \"{ingress_queue}\"\ninvalid_queue = \"{invalid_queue}\"\nprefetch = 1"),
    );
    cleanup.also_declared(&topology_of(&config));
    cleanup.ingress(&config);
    let connection = connect().await;
    let mut destination = Destination::declare(&connection, "userid-dest").await;
    cleanup.queue(&destination.name);
    let served = Served::start(Service::start(config.clone()).await.expect("service starts")).await;
    until("the ingress consuming", Duration::from_secs(10), async || served.http.call("GET", "/readyz", None, None).await.0 == 200).await;

    let theirs = producer.create_channel().await.unwrap();
    theirs.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    let signed = BasicProperties::default().with_user_id(user.as_str().into());
    // Invalid, signed: its move is refused once (closing the publish channel), then made without the user-id.
    publish(&theirs, &ingress_queue, "signed-invalid", vec![(DELAY_HEADER, long_string("1s"))], signed.clone()).await;
    // Valid, signed: the broker refuses its forward, so it is set aside the same way.
    publish(&theirs, &ingress_queue, "signed-valid", valid(&destination.name), signed).await;
    let ours = connection.create_channel().await.unwrap();
    ours.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    publish(&ours, &ingress_queue, "plain-invalid", vec![(DELAY_HEADER, long_string("1s"))], BasicProperties::default()).await;
    publish(&ours, &ingress_queue, "plain-valid", valid(&destination.name), BasicProperties::default()).await;

    let arrived = destination.receive(1, Duration::from_secs(10)).await;
    assert_eq!(arrived[0].delivery.data, b"plain-valid");
    let set_aside = get_at_least(&ours, &invalid_queue, 3, Duration::from_secs(15)).await;
    let reason = |body: &str| {
        let got = set_aside.iter().find(|d| d.data == body.as_bytes()).unwrap_or_else(|| panic!("{body} not set aside"));
        assert!(got.properties.user_id().is_none(), "{body}: moved without the refused user-id");
        header_text(got, INVALID_REASON_HEADER).unwrap_or_default()
    };
    assert!(reason("signed-invalid").contains("missing header hourglass-destination"));
    assert!(reason("signed-valid").contains("user_id"), "the broker's refusal is the reason: {}", reason("signed-valid"));
    assert!(reason("plain-invalid").contains("missing header hourglass-destination"), "later moves go through");
    assert_eq!(set_aside.len(), 3);
    destination.assert_quiet(Duration::from_millis(500)).await;
    until("the ingress queue drained", Duration::from_secs(5), async || queue_depth(&ours, &ingress_queue).await == 0).await;

    served.stop().await;
    drop(producer);
}

/// A planner that loops, panics or traps on one message fails that message
/// alone: it is set aside with a reason naming the planner (a loop after one
/// requeue, in case the first time out was a starved CPU), while valid
/// messages sent between them arrive on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planner_that_loops_panics_or_traps_on_a_message_sets_that_one_aside_and_the_others_arrive() {
    // The misbehaving planner misbehaves for the destinations named "loop", "panic" and "trap": fixed names, so a vhost of our own.
    let vhost = tokio::task::spawn_blocking(|| PrivateVhost::create("ingress-planner")).await.unwrap();
    let connection = connect_to(&vhost.url).await;
    let (ingress_queue, invalid_queue) = (unique("planner-in"), unique("planner-invalid"));
    let text = config_text_on(
        &vhost.url,
        &format!("planner = \"binary-levels\"\nprefix = \"{}\"", unique("planner")),
        &format!(
            "[planners]\ncall_timeout = \"50ms\"\n\n[strategies.odd]\nplanner = {:?}\n\n\
             [service.ingress]\nqueue = \"{ingress_queue}\"\ninvalid_queue = \"{invalid_queue}\"\nprefetch = 4",
            test_planner("misbehaving").display().to_string()
        ),
    );
    let config = hourglass::config::Config::parse(std::path::Path::new("e2e.toml"), format!("default_strategy = \"main\"\n{text}")).expect("test config");
    let mut destination = Destination::declare(&connection, "planner-dest").await;
    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    for name in ["loop", "panic", "trap"] {
        channel.queue_declare(name.into(), QueueDeclareOptions::default(), FieldTable::default()).await.unwrap();
    }
    let served = Served::start(Service::start(config.clone()).await.expect("service starts")).await;
    until("the ingress consuming (readyz 200)", Duration::from_secs(10), async || served.http.call("GET", "/readyz", None, None).await.0 == 200).await;

    let mut sent_at = std::collections::HashMap::new();
    for (i, bad) in ["loop", "panic", "trap"].into_iter().enumerate() {
        let headers = vec![(DESTINATION_HEADER, long_string(bad)), (DELAY_HEADER, long_string("0ms")), (STRATEGY_HEADER, long_string("odd"))];
        publish(&channel, &ingress_queue, bad, headers, BasicProperties::default()).await;
        let body = format!("valid-{i}");
        sent_at.insert(body.clone(), hourglass::clock::unix_now_ms());
        publish(&channel, &ingress_queue, &body, valid(&destination.name), BasicProperties::default()).await;
    }

    for received in destination.receive(3, Duration::from_secs(15)).await {
        let body = String::from_utf8_lossy(&received.delivery.data).into_owned();
        assert!(received.at_ms >= sent_at[&body] + 1000, "{body} arrived {} ms after it was sent, before its 1 s delay", received.at_ms - sent_at[&body]);
    }
    let set_aside = get_at_least(&channel, &invalid_queue, 3, Duration::from_secs(15)).await;
    let reasons: std::collections::HashMap<String, String> =
        set_aside.iter().map(|d| (String::from_utf8_lossy(&d.data).into_owned(), header_text(d, INVALID_REASON_HEADER).unwrap_or_default())).collect();
    for (bad, want) in [("loop", "again after a requeue"), ("panic", "panicked"), ("trap", "misbehaving")] {
        let reason = reasons.get(bad).unwrap_or_else(|| panic!("{bad} was not set aside: {reasons:?}"));
        assert!(reason.contains("misbehaving") && reason.contains(want), "the reason for {bad} names the planner and says {want:?}: {reason}");
    }
    until("the ingress queue drained", Duration::from_secs(5), async || queue_depth(&channel, &ingress_queue).await == 0).await;
    assert_eq!(served.http.call("GET", "/readyz", None, None).await.0, 200, "the ingress still runs");

    served.stop().await;
    connection.close(200, "done".into()).await.ok();
    tokio::task::spawn_blocking(move || drop(vhost)).await.unwrap();
}

/// hourglass's own queues are quorum by default (they outlive a cluster node).
/// A deployment whose ingress queue was declared classic before is not
/// changed behind its back: the service refuses to start, naming the setting
/// that keeps it, and with `service.queue_type = "classic"` the queue is consumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingress_queue_declared_classic_before_refuses_the_start_with_the_setting_that_keeps_it() {
    let ingress_queue = unique("classic-in");
    let invalid_queue = unique("classic-invalid");
    let prefix = unique("classic");
    let service = |queue_type: &str| {
        config_with(
            &format!("planner = \"binary-levels\"\nprefix = \"{prefix}\""),
            &format!("{queue_type}\n[service.ingress]\nqueue = \"{ingress_queue}\"\ninvalid_queue = \"{invalid_queue}\""),
        )
    };
    // Deletes what the test declares, also when it fails.
    let cleanup = Cleanup::declared(&topology_of(&service("")));
    cleanup.ingress(&service(""));
    let connection = connect().await;
    let mut destination = Destination::declare(&connection, "classic-dest").await;
    cleanup.queue(&destination.name);
    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    let durable = QueueDeclareOptions { durable: true, ..Default::default() };
    channel.queue_declare(ingress_queue.as_str().into(), durable, FieldTable::default()).await.unwrap();

    let refused = Service::start(service("")).await.err().expect("a classic ingress queue refused at start").to_string();
    assert!(refused.contains("x-queue-type") && refused.contains(r#"service.queue_type = "classic""#), "{refused}");

    let served = Served::start(Service::start(service("[service]\nqueue_type = \"classic\"")).await.expect("service starts")).await;
    until("the classic ingress consuming (readyz 200)", Duration::from_secs(10), async || served.http.call("GET", "/readyz", None, None).await.0 == 200).await;
    publish(&channel, &ingress_queue, "kept", valid(&destination.name), BasicProperties::default()).await;
    let received = destination.receive(1, Duration::from_secs(10)).await;
    assert_eq!(received[0].delivery.data, b"kept");
    served.stop().await;
}

/// A handler that answers [`Outcome::Retry`] (the broker cannot take what it
/// needs) until told the broker is back, then acks; it records every call.
struct WaitingOutAnOutage {
    queue: String,
    back: tokio::sync::watch::Receiver<bool>,
    /// Every call: whether the broker had delivered the message before.
    calls: std::sync::Mutex<Vec<bool>>,
    settled: tokio::sync::mpsc::UnboundedSender<Settled>,
}

/// Returns a quorum queue allows before it drops a message (RabbitMQ 4 sets 20 on every quorum queue).
const DELIVERY_LIMIT: i64 = 2;

impl Handler for WaitingOutAnOutage {
    type Note = ();

    fn queue(&self) -> &str {
        &self.queue
    }

    fn prefetch(&self) -> u16 {
        4
    }

    fn declarations(&self) -> Vec<Command> {
        let arguments = [
            ("x-queue-type".to_string(), hourglass::command::FieldValue::Text("quorum".into())),
            ("x-delivery-limit".to_string(), hourglass::command::FieldValue::Int(DELIVERY_LIMIT)),
        ];
        vec![Command::Amqp(AmqpCommand::DeclareQueue { name: self.queue.clone(), durable: true, arguments: arguments.into_iter().collect() })]
    }

    async fn handle(&self, delivery: &hourglass::message::Delivery) -> (Outcome, ()) {
        self.calls.lock().unwrap().push(delivery.redelivered);
        (if *self.back.borrow() { Outcome::Ack } else { Outcome::Retry }, ())
    }

    fn poisoned(&self, _delivery: &hourglass::message::Delivery, _reason: &str) -> Outcome {
        Outcome::Requeue
    }

    fn settled(&self, _note: Option<()>, _outcome: &Outcome, settled: &Settled) {
        let _ = self.settled.send(settled.clone());
    }
}

/// A message the broker cannot take on yet is held and asked about again,
/// never returned to its queue: on a quorum queue with a delivery limit (20
/// on every quorum queue from RabbitMQ 4.0) returning it every pause would
/// drop it after a few seconds of outage. Here the limit is 2 and the outage
/// lasts well past three pauses; the message is acked once the broker is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_waiting_out_an_outage_is_held_not_returned_so_a_delivery_limit_never_drops_it() {
    let (back_tx, back) = tokio::sync::watch::channel(false);
    let (settled, mut settled_rx) = tokio::sync::mpsc::unbounded_channel();
    let handler = Arc::new(WaitingOutAnOutage { queue: unique("outage-in"), back, calls: Default::default(), settled });
    let _cleanup = Cleanup::declared(&handler.declarations());
    let connection = connect().await;
    let publisher = Arc::new(RabbitMqExecutor::connect(&amqp_url()).await.expect("RabbitMQ"));
    let consumer = Consumer::new(&amqp_url(), publisher, handler.clone());
    consumer.declare().await.expect("declares its queue");
    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    publish(&channel, &handler.queue, "waits", vec![], BasicProperties::default().with_message_id("waits".into())).await;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let running = tokio::spawn(consumer.clone().run(stopped));

    // Pauses of 0.5, 1 and 2 s: four calls take 3.5 s, past the two returns the queue allows.
    until("asked four times", Duration::from_secs(10), async || handler.calls.lock().unwrap().len() >= 4).await;
    back_tx.send(true).unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(10), settled_rx.recv()).await.expect("settled within 10 s once back");
    assert_eq!(outcome, Some(Settled::Acked), "held through the outage, then acked");
    let calls = handler.calls.lock().unwrap().clone();
    assert!(calls.iter().all(|redelivered| !redelivered), "never returned to the queue meanwhile: {calls:?}");
    until("the queue drained", Duration::from_secs(5), async || queue_depth(&channel, &handler.queue).await == 0).await;

    stop.send(true).unwrap();
    running.await.unwrap();
}
