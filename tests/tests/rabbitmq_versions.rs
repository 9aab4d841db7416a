//! The RabbitMQ behaviours hourglass relies on, one test per row of the table
//! in docs/rabbitmq-versions.md, each asserting what the row says for the
//! version of the broker under test (`/api/overview`'s `rabbitmq_version`).
//! `scripts/test --rabbitmq 4.0` and `--rabbitmq 4.3` run them on those
//! versions; the default is the machine's 3.10.
//!
//! Every test declares names of its own (`unique`), deleted by [`Cleanup`].

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use hourglass::broker::rabbitmq::manage::{encode, vhost_of};
use hourglass_e2e::*;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions, BasicRejectOptions, ConfirmSelectOptions,
    ExchangeBindOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};

use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ExchangeKind};
use serde_json::{Value, json};

/// A RabbitMQ release series, `major.minor`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Series(u32, u32);

/// The series of the broker under test, and its full version string.
fn broker_version() -> (Series, String) {
    let overview = management("GET", "/api/overview", None);
    let version = overview["rabbitmq_version"].as_str().expect("/api/overview names rabbitmq_version").to_string();
    let mut parts = version.split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or_else(|_| panic!("RabbitMQ version {version} is not major.minor…")));
    let series = Series(parts.next().unwrap(), parts.next().unwrap());
    eprintln!("RabbitMQ under test: {version}");
    (series, version)
}

const V3_13: Series = Series(3, 13);
const V4_0: Series = Series(4, 0);
const V4_1: Series = Series(4, 1);
const V4_3: Series = Series(4, 3);

const WAIT: Duration = Duration::from_secs(15);

fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

fn int(value: i64) -> AMQPValue {
    AMQPValue::LongLongInt(value)
}

fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
    let mut table = FieldTable::default();
    for (key, value) in entries {
        table.insert(ShortString::from(*key), value.clone());
    }
    table
}

fn array(values: &[&str]) -> AMQPValue {
    AMQPValue::FieldArray(FieldArray::from(values.iter().map(|v| text(v)).collect::<Vec<_>>()))
}

/// A source queue's kind: classic, or quorum with at-least-once dead-lettering
/// (as hourglass declares its quorum levels). The broker dead-letters from
/// each by different code.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Classic,
    QuorumAtLeastOnce,
}

impl Kind {
    fn arguments(self) -> Vec<(&'static str, AMQPValue)> {
        match self {
            Kind::Classic => vec![],
            Kind::QuorumAtLeastOnce => {
                vec![("x-queue-type", text("quorum")), ("x-dead-letter-strategy", text("at-least-once")), ("x-overflow", text("reject-publish"))]
            }
        }
    }
}

async fn confirmed_channel(connection: &Connection) -> Channel {
    let channel = connection.create_channel().await.expect("open a channel");
    channel.confirm_select(ConfirmSelectOptions::default()).await.expect("confirm.select");
    channel
}

async fn declare_queue(channel: &Channel, cleanup: &Cleanup, name: &str, arguments: &[(&str, AMQPValue)]) {
    cleanup.queue(name);
    let options = QueueDeclareOptions { durable: true, ..Default::default() };
    channel.queue_declare(name.into(), options, table(arguments)).await.unwrap_or_else(|e| panic!("declare queue {name}: {e}"));
}

async fn declare_exchange(channel: &Channel, cleanup: &Cleanup, name: &str, kind: ExchangeKind, arguments: &[(&str, AMQPValue)]) {
    cleanup.exchange(name);
    channel
        .exchange_declare(name.into(), kind, ExchangeDeclareOptions::default(), table(arguments))
        .await
        .unwrap_or_else(|e| panic!("declare exchange {name}: {e}"));
}

async fn bind(channel: &Channel, queue: &str, exchange: &str, key: &str) {
    channel
        .queue_bind(queue.into(), exchange.into(), key.into(), QueueBindOptions::default(), FieldTable::default())
        .await
        .unwrap_or_else(|e| panic!("bind {queue} to {exchange}: {e}"));
}

/// Publishes on a confirming channel and waits for the confirm.
async fn publish_with(channel: &Channel, exchange: &str, key: &str, body: &str, properties: BasicProperties) -> Confirmation {
    let options = BasicPublishOptions { mandatory: true, ..Default::default() };
    let confirm =
        channel.basic_publish(exchange.into(), key.into(), options, body.as_bytes(), properties).await.unwrap_or_else(|e| panic!("publish {body}: {e}"));
    confirm.await.unwrap_or_else(|e| panic!("confirm of {body}: {e}"))
}

async fn publish(channel: &Channel, exchange: &str, key: &str, body: &str, headers: &[(&str, AMQPValue)]) {
    let properties = BasicProperties::default().with_headers(table(headers));
    match publish_with(channel, exchange, key, body, properties).await {
        Confirmation::Ack(None) => {}
        other => panic!("publish {body} to {exchange:?} with key {key}: {other:?}"),
    }
}

/// The next message in `queue` (taken with no ack), waiting for it.
async fn get_one(channel: &Channel, queue: &str) -> Delivery {
    get_at_least(channel, queue, 1, WAIT).await.remove(0)
}

fn body(delivery: &Delivery) -> String {
    String::from_utf8_lossy(&delivery.data).into_owned()
}

fn headers(delivery: &Delivery) -> FieldTable {
    delivery.properties.headers().clone().unwrap_or_default()
}

fn as_text(value: &AMQPValue) -> String {
    match value {
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        AMQPValue::ShortString(s) => s.as_str().to_string(),
        other => panic!("not a string: {other:?}"),
    }
}

fn as_int(value: &AMQPValue) -> i64 {
    match value {
        AMQPValue::LongLongInt(v) => *v,
        AMQPValue::LongInt(v) => i64::from(*v),
        AMQPValue::ShortInt(v) => i64::from(*v),
        other => panic!("not an integer: {other:?}"),
    }
}

fn texts(value: &AMQPValue) -> Vec<String> {
    match value {
        AMQPValue::FieldArray(values) => values.as_slice().iter().map(as_text).collect(),
        other => panic!("not an array: {other:?}"),
    }
}

/// One `x-death` entry: queue, reason, count, routing keys.
#[derive(Debug, PartialEq)]
struct Death {
    queue: String,
    reason: String,
    count: i64,
    routing_keys: Vec<String>,
}

fn deaths(delivery: &Delivery) -> Vec<Death> {
    let Some(AMQPValue::FieldArray(entries)) = headers(delivery).inner().get("x-death").cloned() else {
        panic!("no x-death array in {:?}", delivery.properties.headers())
    };
    entries
        .as_slice()
        .iter()
        .map(|entry| {
            let AMQPValue::FieldTable(entry) = entry else { panic!("x-death entry is not a table: {entry:?}") };
            let field = |name: &str| entry.inner().get(name).unwrap_or_else(|| panic!("x-death entry without {name}: {entry:?}")).clone();
            Death {
                queue: as_text(&field("queue")),
                reason: as_text(&field("reason")),
                count: as_int(&field("count")),
                routing_keys: texts(&field("routing-keys")),
            }
        })
        .collect()
}

fn header_string(delivery: &Delivery, name: &str) -> Option<String> {
    headers(delivery).inner().get(name).map(as_text)
}

fn error_text<T: std::fmt::Debug>(result: Result<T, lapin::Error>, what: &str) -> String {
    match result {
        Ok(ok) => panic!("{what} was accepted ({ok:?})"),
        Err(err) => err.to_string(),
    }
}

fn vhost() -> String {
    vhost_of(&amqp_url())
}

fn queue_path(name: &str) -> String {
    format!("/api/queues/{}/{}", encode(&vhost()), encode(name))
}

fn number(value: &Value) -> u64 {
    value.as_u64().unwrap_or(0)
}

// Row: a queue without x-dead-letter-routing-key dead-letters with all the
// message's routing keys, CC and BCC included. Row: BCC keys route, are never
// seen by consumers, and stay out of x-death's routing-keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_lettering_routes_on_cc_and_bcc_keys_and_consumers_never_see_bcc() {
    let (series, _) = broker_version();
    let cleanup = Cleanup::default();
    let connection = connect().await;
    let channel = confirmed_channel(&connection).await;
    for kind in [Kind::Classic, Kind::QuorumAtLeastOnce] {
        let (source, exchange, via_cc, via_bcc) = (unique("ver-bcc-src"), unique("ver-bcc-x"), unique("ver-bcc-cc"), unique("ver-bcc-bcc"));
        let (cc_key, bcc_key) = (unique("cc-key"), unique("bcc-key"));
        declare_exchange(&channel, &cleanup, &exchange, ExchangeKind::Direct, &[]).await;
        for (queue, key) in [(&via_cc, &cc_key), (&via_bcc, &bcc_key)] {
            declare_queue(&channel, &cleanup, queue, &[]).await;
            bind(&channel, queue, &exchange, key).await;
        }
        let mut arguments = kind.arguments();
        arguments.extend([("x-message-ttl", int(50)), ("x-dead-letter-exchange", text(&exchange))]);
        declare_queue(&channel, &cleanup, &source, &arguments).await;
        publish(&channel, "", &source, "keys", &[("CC", array(&[&cc_key])), ("BCC", array(&[&bcc_key]))]).await;

        let through_cc = get_one(&channel, &via_cc).await;
        let through_bcc = get_one(&channel, &via_bcc).await;
        for (name, delivery) in [("CC", &through_cc), ("BCC", &through_bcc)] {
            assert!(
                headers(delivery).inner().get("BCC").is_none(),
                "{kind:?} on {series:?}: the copy routed on the {name} key carries BCC: {:?}",
                delivery.properties.headers()
            );
            let cc = headers(delivery).inner().get("CC").map(texts);
            assert_eq!(cc, Some(vec![cc_key.clone()]), "{kind:?} on {series:?}: the CC header is kept");
            let newest = &deaths(delivery)[0];
            assert_eq!(newest.queue, source);
            assert_eq!(newest.routing_keys, vec![source.clone(), cc_key.clone()], "{kind:?} on {series:?}: x-death routing-keys include CC, not BCC");
        }
    }
}

// Row: an exchange that routes a dead-lettered message nowhere hands it to its alternate exchange.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_exchange_that_routes_nowhere_hands_the_message_to_its_alternate_exchange() {
    let (series, _) = broker_version();
    let cleanup = Cleanup::default();
    let connection = connect().await;
    let channel = confirmed_channel(&connection).await;
    for kind in [Kind::Classic, Kind::QuorumAtLeastOnce] {
        let (source, exchange, alternate, out) = (unique("ver-ae-src"), unique("ver-ae-x"), unique("ver-ae-alt"), unique("ver-ae-out"));
        declare_exchange(&channel, &cleanup, &alternate, ExchangeKind::Fanout, &[]).await;
        declare_exchange(&channel, &cleanup, &exchange, ExchangeKind::Direct, &[("alternate-exchange", text(&alternate))]).await;
        declare_queue(&channel, &cleanup, &out, &[]).await;
        bind(&channel, &out, &alternate, "").await;
        let mut arguments = kind.arguments();
        arguments.extend([("x-message-ttl", int(50)), ("x-dead-letter-exchange", text(&exchange))]);
        declare_queue(&channel, &cleanup, &source, &arguments).await;
        publish(&channel, "", &source, "to the alternate", &[]).await;
        let delivery = get_one(&channel, &out).await;
        assert_eq!((body(&delivery).as_str(), deaths(&delivery)[0].queue.as_str()), ("to the alternate", source.as_str()), "{kind:?} on {series:?}");
    }
}

/// A queue's JSON from the management API once its statistics were emitted
/// after the test's publish (`message_stats.publish`) and `check` holds.
async fn queue_stats_until(queue: &str, what: &str, deadline: Duration, check: impl Fn(&Value) -> bool) -> Value {
    let mut seen = Value::Null;
    until(what, deadline, async || {
        seen = management("GET", &queue_path(queue), None);
        number(&seen["message_stats"]["publish"]) >= 1 && check(&seen)
    })
    .await;
    seen
}

// Rows: quorum queues dead-letter at least once with at-least-once and
// reject-publish (drop-head falls back to at most once); at-least-once keeps
// a message whose target routes nowhere and retries (every 180 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_least_once_dead_lettering_needs_reject_publish_and_keeps_an_unroutable_message_until_it_routes() {
    let (series, _) = broker_version();
    let cleanup = Cleanup::default();
    let connection = connect().await;
    let channel = confirmed_channel(&connection).await;
    let (exchange, out) = (unique("ver-alo-x"), unique("ver-alo-out"));
    declare_exchange(&channel, &cleanup, &exchange, ExchangeKind::Direct, &[]).await;
    declare_queue(&channel, &cleanup, &out, &[]).await;
    let (kept, dropped) = (unique("ver-alo-reject-publish"), unique("ver-alo-drop-head"));
    for (queue, overflow) in [(&kept, "reject-publish"), (&dropped, "drop-head")] {
        let arguments = [
            ("x-queue-type", text("quorum")),
            ("x-dead-letter-strategy", text("at-least-once")),
            ("x-overflow", text(overflow)),
            ("x-message-ttl", int(50)),
            ("x-dead-letter-exchange", text(&exchange)),
        ];
        declare_queue(&channel, &cleanup, queue, &arguments).await;
        publish(&channel, "", queue, overflow, &[]).await;
    }
    // Statistics are emitted every 5 s.
    let stats = queue_stats_until(&kept, "the reject-publish queue holds its unroutable message for dead-lettering", Duration::from_secs(30), |q| {
        number(&q["messages_dlx"]) == 1
    })
    .await;
    eprintln!("{series:?} reject-publish: messages {} messages_dlx {}", stats["messages"], stats["messages_dlx"]);
    let stats = queue_stats_until(&dropped, "the drop-head queue drops its unroutable message", Duration::from_secs(30), |q| {
        number(&q["messages"]) == 0 && number(&q["messages_dlx"]) == 0
    })
    .await;
    eprintln!("{series:?} drop-head: messages {} messages_dlx {}", stats["messages"], stats["messages_dlx"]);

    // Once the target routes, the kept message arrives at the worker's next retry.
    bind(&channel, &out, &exchange, &kept).await;
    bind(&channel, &out, &exchange, &dropped).await;
    let bound = Instant::now();
    let arrived = get_at_least(&channel, &out, 1, Duration::from_secs(240)).await;
    eprintln!("{series:?}: the kept message arrived {:?} after its target was bound", bound.elapsed());
    assert_eq!(arrived.iter().map(body).collect::<Vec<_>>(), ["reject-publish"], "{series:?}");
    queue_stats_until(&kept, "the reject-publish queue settles its dead-lettered message", Duration::from_secs(30), |q| number(&q["messages_dlx"]) == 0).await;
}

// Row: x-message-ttl on quorum queues; expired messages dead-letter at the head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_queues_expire_messages_at_the_head_only() {
    let (series, _) = broker_version();
    let cleanup = Cleanup::default();
    let connection = connect().await;
    let channel = confirmed_channel(&connection).await;
    let (source, exchange, out) = (unique("ver-ttl-src"), unique("ver-ttl-x"), unique("ver-ttl-out"));
    declare_exchange(&channel, &cleanup, &exchange, ExchangeKind::Fanout, &[]).await;
    declare_queue(&channel, &cleanup, &out, &[]).await;
    bind(&channel, &out, &exchange, "").await;
    let arguments = [("x-queue-type", text("quorum")), ("x-message-ttl", int(1_500)), ("x-dead-letter-exchange", text(&exchange))];
    declare_queue(&channel, &cleanup, &source, &arguments).await;
    let published = Instant::now();
    publish(&channel, "", &source, "head", &[]).await;
    // Due long before the head, but behind it.
    let short = BasicProperties::default().with_expiration("50".into());
    assert!(matches!(publish_with(&channel, "", &source, "behind", short).await, Confirmation::Ack(None)));
    let arrived = get_at_least(&channel, &out, 2, WAIT).await;
    let elapsed = published.elapsed();
    assert_eq!(arrived.iter().map(body).collect::<Vec<_>>(), ["head", "behind"], "{series:?}");
    assert!(elapsed >= Duration::from_millis(1_400), "{series:?}: both arrived {elapsed:?} after the publish, before the queue's TTL");
    assert_eq!((deaths(&arrived[1])[0].reason.as_str()), "expired");
    eprintln!("{series:?}: the message behind the head arrived {elapsed:?} after the publish");
}

// Row: x-expires deletes an unused queue; a quorum queue's lease is not renewed by redeclaring.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_expires_deletes_an_unused_queue_and_redeclaring_renews_only_a_classic_one() {
    let (series, _) = broker_version();
    let cleanup = Cleanup::default();
    let connection = connect().await;
    let channel = connection.create_channel().await.unwrap();
    let (unused, classic, quorum) = (unique("ver-exp-unused"), unique("ver-exp-classic"), unique("ver-exp-quorum"));
    declare_queue(&channel, &cleanup, &unused, &[("x-expires", int(1_000))]).await;
    let declared = Instant::now();
    until("the unused classic queue expires", WAIT, async || management_get_or_none(&queue_path(&unused)).is_none()).await;
    eprintln!("{series:?}: the unused queue went {:?} after its declaration (x-expires 1 s)", declared.elapsed());

    let lease = Duration::from_millis(2_000);
    let classic_arguments = [("x-expires", int(2_000))];
    let quorum_arguments = [("x-expires", int(2_000)), ("x-queue-type", text("quorum"))];
    declare_queue(&channel, &cleanup, &classic, &classic_arguments).await;
    declare_queue(&channel, &cleanup, &quorum, &quorum_arguments).await;
    let declared = Instant::now();
    let mut quorum_gone = None;
    // Redeclare both every 250 ms: the classic queue lives on for three leases
    // and more, the quorum queue goes (its expiry is checked on the queue's
    // tick, seconds apart, so later than the lease itself).
    let deadline = Duration::from_secs(20);
    while (quorum_gone.is_none() || declared.elapsed() < lease * 3) && declared.elapsed() < deadline {
        assert!(management_get_or_none(&queue_path(&classic)).is_some(), "{series:?}: the classic queue expired although redeclared every 250 ms");
        if quorum_gone.is_none() {
            if management_get_or_none(&queue_path(&quorum)).is_none() {
                quorum_gone = Some(declared.elapsed());
            } else {
                channel
                    .queue_declare(quorum.as_str().into(), QueueDeclareOptions { durable: true, ..Default::default() }, table(&quorum_arguments))
                    .await
                    .unwrap();
            }
        }
        channel.queue_declare(classic.as_str().into(), QueueDeclareOptions { durable: true, ..Default::default() }, table(&classic_arguments)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let gone = quorum_gone.unwrap_or_else(|| panic!("{series:?}: the quorum queue redeclared every 250 ms lived {deadline:?}, ten leases"));
    eprintln!("{series:?}: the quorum queue redeclared every 250 ms went {gone:?} after its declaration (x-expires 2 s)");
}

// Row: a message that cycles back to a queue it expired from, with no
// rejection in the cycle, is dropped; since 4.0 an x-death a client publishes is not read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_cycle_is_dropped_and_a_published_x_death_counts_only_before_4_0() {
    let (series, _) = broker_version();
    let cleanup = Cleanup::default();
    let connection = connect().await;
    let channel = confirmed_channel(&connection).await;

    // first → second → (first, observed): back in `first`, the copy is dropped.
    let (first, second, observed) = (unique("ver-cyc-first"), unique("ver-cyc-second"), unique("ver-cyc-observed"));
    let (to_second, back) = (unique("ver-cyc-to-second"), unique("ver-cyc-back"));
    declare_exchange(&channel, &cleanup, &to_second, ExchangeKind::Fanout, &[]).await;
    declare_exchange(&channel, &cleanup, &back, ExchangeKind::Fanout, &[]).await;
    declare_queue(&channel, &cleanup, &first, &[("x-message-ttl", int(50)), ("x-dead-letter-exchange", text(&to_second))]).await;
    declare_queue(&channel, &cleanup, &second, &[("x-message-ttl", int(50)), ("x-dead-letter-exchange", text(&back))]).await;
    declare_queue(&channel, &cleanup, &observed, &[]).await;
    bind(&channel, &second, &to_second, "").await;
    bind(&channel, &first, &back, "").await;
    bind(&channel, &observed, &back, "").await;
    publish(&channel, "", &first, "cycling", &[]).await;
    assert_eq!(body(&get_one(&channel, &observed).await), "cycling");
    // Had the copy gone on into `first`, it would be ahead of this one there and reach `observed` first.
    publish(&channel, "", &first, "after", &[]).await;
    let next = get_one(&channel, &observed).await;
    assert_eq!(body(&next), "after", "{series:?}: the copy that cycled back into {first} was not dropped");

    // A client's message carrying an x-death that names the queue it will dead-letter to.
    let (waiting, exchange, target) = (unique("ver-cyc-waiting"), unique("ver-cyc-x"), unique("ver-cyc-target"));
    declare_exchange(&channel, &cleanup, &exchange, ExchangeKind::Fanout, &[]).await;
    declare_queue(&channel, &cleanup, &waiting, &[("x-message-ttl", int(50)), ("x-dead-letter-exchange", text(&exchange))]).await;
    declare_queue(&channel, &cleanup, &target, &[]).await;
    bind(&channel, &target, &exchange, "").await;
    let forged = AMQPValue::FieldTable(table(&[
        ("count", int(1)),
        ("reason", text("expired")),
        ("queue", text(&target)),
        ("exchange", text("")),
        ("routing-keys", array(&[&target])),
        ("time", AMQPValue::Timestamp(hourglass::clock::unix_now_ms() / 1_000)),
    ]));
    publish(&channel, "", &waiting, "with x-death", &[("x-death", AMQPValue::FieldArray(FieldArray::from(vec![forged])))]).await;
    publish(&channel, "", &waiting, "without", &[]).await;
    // "without" is behind the other in `waiting`: once it arrived, the other came first or never.
    let mut arrived = Vec::new();
    let end = Instant::now() + WAIT;
    while !arrived.iter().any(|b| b == "without") {
        match channel.basic_get(target.as_str().into(), BasicGetOptions { no_ack: true }).await.unwrap() {
            Some(message) => arrived.push(body(&message.delivery)),
            None if Instant::now() < end => tokio::time::sleep(Duration::from_millis(100)).await,
            None => panic!(
                "{series:?}: {arrived:?} reached {target} within {WAIT:?}; {} left in {waiting}",
                queue_depth(&connection.create_channel().await.unwrap(), &waiting).await
            ),
        }
    }
    let expected: &[&str] = if series >= V4_0 { &["with x-death", "without"] } else { &["without"] };
    assert_eq!(arrived, expected, "{series:?}: a published x-death naming the target should {}be read", if series >= V4_0 { "not " } else { "" });
}

// Row: x-death lists the newest death first, one entry per queue and reason
// with a count; x-first-death-*; x-last-death-* since 3.13.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_death_lists_the_newest_death_first_and_counts_each_queue_and_reason() {
    let (series, _) = broker_version();
    let cleanup = Cleanup::default();
    let connection = connect().await;
    let channel = confirmed_channel(&connection).await;
    let (a, b, out, to_b, to_out) = (unique("ver-xd-a"), unique("ver-xd-b"), unique("ver-xd-out"), unique("ver-xd-to-b"), unique("ver-xd-to-out"));
    declare_exchange(&channel, &cleanup, &to_b, ExchangeKind::Fanout, &[]).await;
    declare_exchange(&channel, &cleanup, &to_out, ExchangeKind::Fanout, &[]).await;
    declare_queue(&channel, &cleanup, &a, &[("x-message-ttl", int(50)), ("x-dead-letter-exchange", text(&to_b))]).await;
    declare_queue(&channel, &cleanup, &b, &[("x-message-ttl", int(50)), ("x-dead-letter-exchange", text(&to_out))]).await;
    declare_queue(&channel, &cleanup, &out, &[]).await;
    bind(&channel, &b, &to_b, "").await;
    bind(&channel, &out, &to_out, "").await;
    publish(&channel, "", &a, "twice expired", &[]).await;
    let delivery = get_one(&channel, &out).await;
    let seen: Vec<(String, String, i64)> = deaths(&delivery).into_iter().map(|d| (d.queue, d.reason, d.count)).collect();
    assert_eq!(seen, [(b.clone(), "expired".into(), 1), (a.clone(), "expired".into(), 1)], "{series:?}: newest first");
    assert_eq!((header_string(&delivery, "x-first-death-queue"), header_string(&delivery, "x-first-death-reason")), (Some(a.clone()), Some("expired".into())));
    let last = (header_string(&delivery, "x-last-death-queue"), header_string(&delivery, "x-last-death-reason"));
    if series >= V3_13 {
        assert_eq!(last, (Some(b.clone()), Some("expired".into())), "{series:?}: x-last-death-* name the newest death");
    } else {
        assert_eq!(last, (None, None), "{series:?}: no x-last-death-* headers before 3.13");
    }

    // Rejected twice from the same queue: one entry, count 2.
    let (rejecting, loop_back) = (unique("ver-xd-rejecting"), unique("ver-xd-loop"));
    declare_exchange(&channel, &cleanup, &loop_back, ExchangeKind::Fanout, &[]).await;
    declare_queue(&channel, &cleanup, &rejecting, &[("x-dead-letter-exchange", text(&loop_back))]).await;
    bind(&channel, &rejecting, &loop_back, "").await;
    publish(&channel, "", &rejecting, "rejected", &[]).await;
    for _ in 0..2 {
        let delivery = get_one_unacked(&channel, &rejecting).await;
        delivery.acker.reject(BasicRejectOptions { requeue: false }).await.unwrap();
    }
    let delivery = get_one(&channel, &rejecting).await;
    let seen: Vec<(String, String, i64)> = deaths(&delivery).into_iter().map(|d| (d.queue, d.reason, d.count)).collect();
    assert_eq!(seen, [(rejecting.clone(), "rejected".into(), 2)], "{series:?}: a client's rejections count in one entry");
}

/// The next message in `queue`, taken for a later ack, nack or reject.
async fn get_one_unacked(channel: &Channel, queue: &str) -> Delivery {
    let mut got = None;
    until(&format!("a message in {queue}"), WAIT, async || {
        got = channel.basic_get(queue.into(), BasicGetOptions { no_ack: false }).await.unwrap_or_else(|e| panic!("basic.get on {queue}: {e}"));
        got.is_some()
    })
    .await;
    got.unwrap().delivery
}

/// How a message goes back to its queue.
#[derive(Clone, Copy, Debug)]
enum Return {
    NackRequeue,
    RejectRequeue,
    ChannelClosed,
}

/// Takes the message from `queue` and returns it, again and again, up to
/// `most` deliveries: the deliveries seen before the broker dead-lettered it
/// (to `dead`) instead of delivering it again, or None if it never did; and
/// the last `x-delivery-count` header seen.
async fn deliveries_until_dead_lettered(connection: &Connection, queue: &str, dead: &str, how: Return, most: u32) -> (Option<u32>, Option<i64>) {
    let reader = connection.create_channel().await.unwrap();
    let mut last_count = None;
    for delivered in 0..most {
        let channel = match how {
            Return::ChannelClosed => connection.create_channel().await.unwrap(),
            _ => reader.clone(),
        };
        let mut got = None;
        until(&format!("the message back in {queue} or dead-lettered to {dead} ({how:?}, {delivered} deliveries)"), WAIT, async || {
            if let Some(message) = channel.basic_get(queue.into(), BasicGetOptions { no_ack: false }).await.unwrap() {
                got = Some(Some(message.delivery));
            } else if reader.basic_get(dead.into(), BasicGetOptions { no_ack: true }).await.unwrap().is_some() {
                got = Some(None);
            }
            got.is_some()
        })
        .await;
        let Some(delivery) = got.unwrap() else { return (Some(delivered), last_count) };
        last_count = headers(&delivery).inner().get("x-delivery-count").map(as_int);
        match how {
            Return::NackRequeue => assert!(delivery.acker.nack(BasicNackOptions { requeue: true, ..Default::default() }).await.unwrap()),
            Return::RejectRequeue => assert!(delivery.acker.reject(BasicRejectOptions { requeue: true }).await.unwrap()),
            Return::ChannelClosed => channel.close(200, "returning the message".into()).await.unwrap(),
        }
    }
    (None, last_count)
}

// Row: quorum queues have no delivery limit unless one is set (3.x); 20 by default since 4.0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_queues_default_delivery_limit_and_the_returns_it_counts() {
    let (series, _) = broker_version();
    let cleanup = Cleanup::default();
    let connection = connect().await;
    let channel = confirmed_channel(&connection).await;
    const MOST: u32 = 30;
    let mut seen = Vec::new();
    for how in [Return::NackRequeue, Return::RejectRequeue, Return::ChannelClosed] {
        let (queue, exchange, dead) = (unique("ver-dl-q"), unique("ver-dl-x"), unique("ver-dl-dead"));
        declare_exchange(&channel, &cleanup, &exchange, ExchangeKind::Fanout, &[]).await;
        declare_queue(&channel, &cleanup, &dead, &[]).await;
        bind(&channel, &dead, &exchange, "").await;
        declare_queue(&channel, &cleanup, &queue, &[("x-queue-type", text("quorum")), ("x-dead-letter-exchange", text(&exchange))]).await;
        publish(&channel, "", &queue, "returned", &[]).await;
        let (limit, last_count) = deliveries_until_dead_lettered(&connection, &queue, &dead, how, MOST).await;
        eprintln!("{series:?} {how:?}: dead-lettered after {limit:?} deliveries (of at most {MOST}); last x-delivery-count {last_count:?}");
        seen.push((how, limit));
    }
    // Twenty returns counted, and the 21st delivery's return dead-letters the message.
    let expected: Vec<Option<u32>> = if series >= V4_3 {
        vec![None, Some(21), Some(21)]
    } else if series >= V4_0 {
        vec![Some(21), Some(21), Some(21)]
    } else {
        vec![None, None, None]
    };
    assert_eq!(
        seen.iter().map(|(_, limit)| *limit).collect::<Vec<_>>(),
        expected,
        "{series:?}: deliveries before the default limit dead-letters, per return {seen:?}"
    );
}

// Row: passive declare of a missing queue or exchange: NOT_FOUND - no queue 'q' in vhost 'v'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passive_declare_of_a_missing_queue_or_exchange_is_not_found_in_these_words() {
    let (series, _) = broker_version();
    let connection = connect().await;
    let (queue, exchange) = (unique("ver-missing-q"), unique("ver-missing-x"));
    let channel = connection.create_channel().await.unwrap();
    let passive = QueueDeclareOptions { passive: true, ..Default::default() };
    let said = error_text(channel.queue_declare(queue.as_str().into(), passive, FieldTable::default()).await, "a passive declare of a missing queue");
    assert!(said.contains(&format!("NOT_FOUND - no queue '{queue}' in vhost '{}'", vhost())), "{series:?}: {said}");
    let channel = connection.create_channel().await.unwrap();
    let passive = ExchangeDeclareOptions { passive: true, ..Default::default() };
    let said = error_text(
        channel.exchange_declare(exchange.as_str().into(), ExchangeKind::Direct, passive, FieldTable::default()).await,
        "a passive declare of a missing exchange",
    );
    assert!(said.contains(&format!("NOT_FOUND - no exchange '{exchange}' in vhost '{}'", vhost())), "{series:?}: {said}");
}

// Row: the default exchange routes to the queue of that name; it takes no bindings and has no alternate exchange.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_exchange_routes_by_queue_name_takes_no_bindings_and_has_no_alternate() {
    let (series, _) = broker_version();
    let cleanup = Cleanup::default();
    let connection = connect().await;
    let channel = confirmed_channel(&connection).await;
    let queue = unique("ver-default");
    declare_queue(&channel, &cleanup, &queue, &[]).await;
    publish(&channel, "", &queue, "by name", &[]).await;
    assert_eq!(body(&get_one(&channel, &queue).await), "by name");
    match publish_with(&channel, "", &unique("ver-default-missing"), "nowhere", BasicProperties::default()).await {
        Confirmation::Ack(Some(returned)) => assert_eq!(returned.reply_code, 312, "{series:?}"),
        other => panic!("{series:?}: an unroutable publish through the default exchange: {other:?}"),
    }
    let default = management("GET", &format!("/api/exchanges/{}/amq.default", encode(&vhost())), None);
    assert!(default["arguments"].as_object().is_some_and(|a| a.get("alternate-exchange").is_none()), "{series:?}: {default}");
    let said = error_text(
        channel.queue_bind(queue.as_str().into(), "".into(), "other".into(), QueueBindOptions::default(), FieldTable::default()).await,
        "a binding on the default exchange",
    );
    assert!(said.contains("ACCESS_REFUSED") && said.contains("default exchange"), "{series:?}: {said}");
}

// Row: exchange-to-exchange bindings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exchange_to_exchange_bindings_route() {
    let (series, _) = broker_version();
    let cleanup = Cleanup::default();
    let connection = connect().await;
    let channel = confirmed_channel(&connection).await;
    let (source, destination, queue) = (unique("ver-e2e-src"), unique("ver-e2e-dst"), unique("ver-e2e-q"));
    declare_exchange(&channel, &cleanup, &source, ExchangeKind::Direct, &[]).await;
    declare_exchange(&channel, &cleanup, &destination, ExchangeKind::Fanout, &[]).await;
    declare_queue(&channel, &cleanup, &queue, &[]).await;
    bind(&channel, &queue, &destination, "").await;
    channel
        .exchange_bind(destination.as_str().into(), source.as_str().into(), "hop".into(), ExchangeBindOptions::default(), FieldTable::default())
        .await
        .unwrap();
    publish(&channel, &source, "hop", "through two exchanges", &[]).await;
    assert_eq!(body(&get_one(&channel, &queue).await), "through two exchanges");
    let unmatched = publish_with(&channel, &source, "other", "unmatched", BasicProperties::default()).await;
    assert!(matches!(unmatched, Confirmation::Ack(Some(_))), "{series:?}: a key the binding does not match: {unmatched:?}");
}

// Row: publisher confirms; a mandatory unroutable publish is returned before its confirm's ack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unroutable_mandatory_publish_is_returned_before_its_ack() {
    let (series, _) = broker_version();
    let cleanup = Cleanup::default();
    let connection = connect().await;
    let channel = confirmed_channel(&connection).await;
    let exchange = unique("ver-mandatory");
    declare_exchange(&channel, &cleanup, &exchange, ExchangeKind::Direct, &[]).await;
    // lapin attaches a basic.return to the ack that follows it; one that came after the ack would be lost to it.
    match publish_with(&channel, &exchange, "nobody", "unroutable", BasicProperties::default()).await {
        Confirmation::Ack(Some(returned)) => {
            assert_eq!((returned.reply_code, returned.reply_text.as_str()), (312, "NO_ROUTE"), "{series:?}");
            assert_eq!(String::from_utf8_lossy(&returned.delivery.data), "unroutable");
        }
        other => panic!("{series:?}: {other:?}"),
    }
}

// Row: declarations are visible everywhere once confirmed (Mnesia; Khepri since 3.13, the only store in 4.3).
// What one node shows: the metadata store it runs on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metadata_store_is_khepri_only_on_4_3() {
    let (series, _) = broker_version();
    let flags = management("GET", "/api/feature-flags", None);
    let khepri = flags
        .as_array()
        .expect("feature flags are a list")
        .iter()
        .find(|f| f["name"] == "khepri_db")
        .map(|f| f["state"].as_str().unwrap_or_default().to_string());
    eprintln!("{series:?}: khepri_db {khepri:?}");
    let expected = if series >= V4_3 {
        Some("enabled")
    } else if series >= V3_13 {
        Some("disabled")
    } else {
        None
    };
    assert_eq!(khepri.as_deref(), expected, "{series:?}: the khepri_db feature flag");
}

// Row: channel_max 2,047, frame_max 131,072, max message size (16 MiB since 4.0), client frame_max ≥ 8,192 since 4.1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negotiated_limits_and_the_largest_message() {
    let (series, _) = broker_version();
    let cleanup = Cleanup::default();
    let connection = connect().await;
    let configuration = connection.configuration();
    assert_eq!((configuration.channel_max(), configuration.frame_max()), (2_047, 131_072), "{series:?}: channel_max and frame_max as tuned");

    let channel = confirmed_channel(&connection).await;
    let queue = unique("ver-size");
    declare_queue(&channel, &cleanup, &queue, &[]).await;
    let over_16_mib = vec![b'x'; 16 * 1024 * 1024 + 1];
    let options = BasicPublishOptions::default();
    let published = match channel.basic_publish("".into(), queue.as_str().into(), options, &over_16_mib, BasicProperties::default()).await {
        Ok(confirm) => confirm.await,
        Err(err) => Err(err),
    };
    if series >= V4_0 {
        let said = error_text(published, "a message of 16 MiB + 1 byte");
        assert!(said.contains("larger than configured max size"), "{series:?}: {said}");
    } else {
        assert!(matches!(published, Ok(Confirmation::Ack(None))), "{series:?}: a message of 16 MiB + 1 byte: {published:?}");
    }

    let small_frames = format!("{}{}frame_max=4096", amqp_url(), if amqp_url().contains('?') { '&' } else { '?' });
    let connected = lapin::Connection::connect(&small_frames, lapin::ConnectionProperties::default()).await;
    eprintln!("{series:?}: a client asking frame_max 4096: {:?}", connected.as_ref().map(|c| c.configuration().frame_max()));
    assert_eq!(connected.is_ok(), series < V4_1, "{series:?}: a client asking frame_max 4096: {:?}", connected.as_ref().err());
}

// Row: streams read over AMQP 0-9-1 with x-stream-offset, a per-consumer prefetch and acks as credit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_is_read_from_an_offset_with_a_prefetch_and_acks() {
    let (series, _) = broker_version();
    let cleanup = Cleanup::default();
    let connection = connect().await;
    let channel = confirmed_channel(&connection).await;
    let stream = unique("ver-stream");
    declare_queue(&channel, &cleanup, &stream, &[("x-queue-type", text("stream")), ("x-max-age", text("1h"))]).await;
    for body in ["s0", "s1", "s2", "s3"] {
        publish(&channel, "", &stream, body, &[]).await;
    }
    let reader = connection.create_channel().await.unwrap();
    reader.basic_qos(2, BasicQosOptions::default()).await.unwrap();
    let mut consumer =
        reader.basic_consume(stream.as_str().into(), "ver".into(), BasicConsumeOptions::default(), table(&[("x-stream-offset", int(1))])).await.unwrap();
    let mut read = Vec::new();
    while read.len() < 3 {
        let delivery =
            tokio::time::timeout(WAIT, consumer.next()).await.unwrap_or_else(|_| panic!("{series:?}: only {read:?} read from the stream")).unwrap().unwrap();
        read.push((body(&delivery), headers(&delivery).inner().get("x-stream-offset").map(as_int)));
        delivery.acker.ack(BasicAckOptions::default()).await.unwrap();
    }
    assert_eq!(read, [("s1".into(), Some(1)), ("s2".into(), Some(2)), ("s3".into(), Some(3))], "{series:?}");
}

// Row: per-consumer QoS; global QoS (listed as denied by default on 4.3, yet answered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_consumer_qos_is_taken_and_global_qos_is_still_answered() {
    let (series, _) = broker_version();
    let connection = connect().await;
    let channel = connection.create_channel().await.unwrap();
    channel.basic_qos(10, BasicQosOptions { global: false }).await.unwrap_or_else(|e| panic!("{series:?}: per-consumer QoS: {e}"));
    let global = channel.basic_qos(10, BasicQosOptions { global: true }).await;
    let phase = deprecation_phase("global_qos");
    eprintln!("{series:?}: global QoS: {global:?}; deprecation phase {phase:?}");
    // 4.3 lists global_qos as denied by default, yet answers basic.qos with global = true and keeps the channel open.
    assert!(global.is_ok(), "{series:?}: global QoS: {global:?}");
    channel
        .queue_declare("".into(), QueueDeclareOptions { exclusive: true, ..Default::default() }, FieldTable::default())
        .await
        .unwrap_or_else(|e| panic!("{series:?}: the channel after a global basic.qos: {e}"));
    assert_eq!(phase.as_deref(), expected_phase(series, "denied_by_default"), "{series:?}: global_qos");
}

/// A deprecated feature's phase as `/api/deprecated-features` lists it (4.x; None before or when unlisted).
fn deprecation_phase(feature: &str) -> Option<String> {
    let features = management_get_or_none("/api/deprecated-features")?;
    features.as_array()?.iter().find(|f| f["name"] == feature).and_then(|f| f["deprecation_phase"].as_str()).map(str::to_string)
}

/// What `/api/deprecated-features` says of a feature: nothing before 4.0, `permitted_by_default` on 4.0, `on_4_3` from 4.3.
fn expected_phase(series: Series, on_4_3: &'static str) -> Option<&'static str> {
    if series >= V4_3 {
        Some(on_4_3)
    } else if series >= V4_0 {
        Some("permitted_by_default")
    } else {
        None
    }
}

// Row: durable queues; exclusive transient queues; transient non-exclusive queues (deprecated, still permitted by default on 4.3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_exclusive_and_transient_shared_queues_are_all_taken() {
    let (series, _) = broker_version();
    let cleanup = Cleanup::default();
    let connection = connect().await;
    let channel = connection.create_channel().await.unwrap();
    declare_queue(&channel, &cleanup, &unique("ver-durable"), &[]).await;
    let exclusive = QueueDeclareOptions { exclusive: true, ..Default::default() };
    channel
        .queue_declare(unique("ver-exclusive").as_str().into(), exclusive, FieldTable::default())
        .await
        .unwrap_or_else(|e| panic!("{series:?}: an exclusive transient queue: {e}"));
    let transient = unique("ver-transient");
    cleanup.queue(&transient);
    let declared = channel.queue_declare(transient.as_str().into(), QueueDeclareOptions::default(), FieldTable::default()).await;
    let phase = deprecation_phase("transient_nonexcl_queues");
    eprintln!("{series:?}: a transient non-exclusive queue: {declared:?}; deprecation phase {phase:?}");
    assert!(declared.is_ok(), "{series:?}: a transient non-exclusive queue: {declared:?}");
    assert_eq!(phase.as_deref(), expected_phase(series, "permitted_by_default"), "{series:?}: transient_nonexcl_queues");
}

// Row: x-queue-version = 1 (classic queues v1) refused by 4.3; x-queue-mode still taken (and ignored).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_queue_version_1_is_refused_on_4_3_and_x_queue_mode_is_not() {
    let (series, _) = broker_version();
    let cleanup = Cleanup::default();
    let connection = connect().await;
    for (argument, value, refused_on_4_3) in [("x-queue-mode", text("lazy"), false), ("x-queue-version", int(1), true)] {
        let channel = connection.create_channel().await.unwrap();
        let queue = unique("ver-cqv1");
        cleanup.queue(&queue);
        let options = QueueDeclareOptions { durable: true, ..Default::default() };
        let declared = channel.queue_declare(queue.as_str().into(), options, table(&[(argument, value)])).await;
        eprintln!("{series:?}: {argument}: {declared:?}");
        if refused_on_4_3 && series >= V4_3 {
            let said = error_text(declared, argument);
            assert!(said.contains("PRECONDITION_FAILED") && said.contains("unsupported queue version"), "{series:?}: {said}");
        } else {
            assert!(declared.is_ok(), "{series:?}: a queue declared with {argument}: {declared:?}");
        }
    }
}

// Row: the file handle cache (3.x) counted sockets against a limit; 4.0 removed it and sockets_* read 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nodes_report_sockets_only_before_4_0() {
    let (series, _) = broker_version();
    let nodes = management("GET", "/api/nodes", None);
    for node in nodes.as_array().expect("nodes are a list") {
        let (fd_total, sockets_total) = (number(&node["fd_total"]), number(&node["sockets_total"]));
        eprintln!(
            "{series:?} {}: fd_total {fd_total} fd_used {} sockets_total {sockets_total} sockets_used {}",
            node["name"], node["fd_used"], node["sockets_used"]
        );
        assert!(fd_total > 0, "{series:?}: {node}");
        if series >= V4_0 {
            assert_eq!(sockets_total, 0, "{series:?}: {node}");
        } else {
            // 90 % of the cache's limit (the open-file limit less about 100) less 2.
            assert!(sockets_total > 0 && sockets_total < fd_total, "{series:?}: {node}");
        }
    }
}

// Row: the management API's calls and fields hourglass reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_management_api_answers_what_hourglass_reads() {
    let (series, version) = broker_version();
    let cleanup = Cleanup::default();
    let connection = connect().await;
    let channel = confirmed_channel(&connection).await;
    let (queue, exchange, downstream, policy) = (unique("ver-api-q"), unique("ver-api-x"), unique("ver-api-down"), unique("ver-api-policy"));
    let vhost = encode(&vhost());
    declare_exchange(&channel, &cleanup, &exchange, ExchangeKind::Direct, &[("alternate-exchange", text(&downstream))]).await;
    declare_exchange(&channel, &cleanup, &downstream, ExchangeKind::Fanout, &[]).await;
    declare_queue(&channel, &cleanup, &queue, &[("x-queue-type", text("quorum"))]).await;
    bind(&channel, &queue, &exchange, "key").await;
    channel
        .exchange_bind(downstream.as_str().into(), exchange.as_str().into(), "onward".into(), ExchangeBindOptions::default(), FieldTable::default())
        .await
        .unwrap();

    assert_eq!(management("GET", "/api/overview", None)["rabbitmq_version"], version);
    let q = management("GET", &queue_path(&queue), None);
    assert_eq!((q["durable"].as_bool(), q["arguments"]["x-queue-type"].as_str()), (Some(true), Some("quorum")), "{series:?}: {q}");
    let x = management("GET", &format!("/api/exchanges/{vhost}/{}", encode(&exchange)), None);
    assert_eq!((x["type"].as_str(), x["arguments"]["alternate-exchange"].as_str()), (Some("direct"), Some(downstream.as_str())), "{series:?}: {x}");
    let to_queue = management("GET", &format!("/api/bindings/{vhost}/e/{}/q/{}", encode(&exchange), encode(&queue)), None);
    assert_eq!(to_queue[0]["routing_key"], "key", "{series:?}: {to_queue}");
    assert!(to_queue[0]["arguments"].is_object(), "{series:?}: {to_queue}");
    let to_exchange = management("GET", &format!("/api/bindings/{vhost}/e/{}/e/{}", encode(&exchange), encode(&downstream)), None);
    assert_eq!(to_exchange[0]["routing_key"], "onward", "{series:?}: {to_exchange}");
    let listed = management("GET", &format!("/api/queues/{vhost}?columns=name,messages,arguments"), None);
    assert!(listed.as_array().unwrap().iter().any(|q| q["name"] == queue.as_str() && q["arguments"].is_object()), "{series:?}: {queue} not listed");
    let mut quorum = Value::Null;
    until("the quorum queue listed with its leader and members", WAIT, async || {
        let all = management("GET", "/api/queues?columns=name,vhost,type,leader,members,arguments", None);
        quorum = all.as_array().unwrap().iter().find(|q| q["name"] == queue.as_str()).cloned().unwrap_or(Value::Null);
        quorum["leader"].is_string()
    })
    .await;
    assert!(quorum["type"] == "quorum" && quorum["members"].as_array().is_some_and(|m| !m.is_empty()), "{series:?}: {quorum}");
    let nodes = management("GET", "/api/nodes", None);
    for field in ["fd_total", "fd_used", "sockets_total", "sockets_used"] {
        assert!(nodes[0][field].is_u64(), "{series:?}: /api/nodes without {field}: {}", nodes[0]);
    }
    cleanup.policy(&policy);
    let definition = json!({"pattern": format!("^{queue}$"), "definition": {"delivery-limit": 5}, "apply-to": "queues", "priority": 0});
    management("PUT", &format!("/api/policies/{vhost}/{}", encode(&policy)), Some(definition));
    until("the policy applied to the queue", WAIT, async || management("GET", &queue_path(&queue), None)["effective_policy_definition"]["delivery-limit"] == 5)
        .await;
    management("DELETE", &format!("/api/policies/{vhost}/{}", encode(&policy)), None);
    until("the policy's removal applied to the queue", WAIT, async || {
        management("GET", &queue_path(&queue), None)["effective_policy_definition"]["delivery-limit"].is_null()
    })
    .await;
}

// Row: queue and exchange arguments overrule policies for the same key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exchange_argument_overrules_a_policy_for_the_same_key() {
    let (series, _) = broker_version();
    let cleanup = Cleanup::default();
    let connection = connect().await;
    let channel = confirmed_channel(&connection).await;
    let (exchange, by_argument, by_policy, policy) = (unique("ver-pol-x"), unique("ver-pol-arg"), unique("ver-pol-pol"), unique("ver-pol-policy"));
    let vhost = encode(&vhost());
    for alternate in [&by_argument, &by_policy] {
        declare_exchange(&channel, &cleanup, alternate, ExchangeKind::Fanout, &[]).await;
        declare_queue(&channel, &cleanup, alternate, &[]).await;
        bind(&channel, alternate, alternate, "").await;
    }
    declare_exchange(&channel, &cleanup, &exchange, ExchangeKind::Direct, &[("alternate-exchange", text(&by_argument))]).await;
    cleanup.policy(&policy);
    let definition = json!({"pattern": format!("^{exchange}$"), "definition": {"alternate-exchange": by_policy}, "apply-to": "exchanges", "priority": 0});
    management("PUT", &format!("/api/policies/{vhost}/{}", encode(&policy)), Some(definition));
    let exchange_path = format!("/api/exchanges/{vhost}/{}", encode(&exchange));
    until("the policy applied to the exchange", WAIT, async || management("GET", &exchange_path, None)["policy"] == policy.as_str()).await;
    publish(&channel, &exchange, "unbound", "which alternate", &[]).await;
    assert_eq!(body(&get_one(&channel, &by_argument).await), "which alternate", "{series:?}");
    assert_eq!(queue_depth(&channel, &by_policy).await, 0, "{series:?}: the policy's alternate exchange took the message");
}
