//! The bad-input matrix: each item sent at HTTP and at the ingress beside
//! canary traffic, on one host in a private vhost. At HTTP a bad input must get
//! a 4xx naming the field; at the ingress it must land on the invalid queue
//! with a `hourglass-invalid-reason`. Tricky but valid inputs (a producer's
//! short `expiration`, client-set death headers at the ingress, an integer
//! `hourglass-attempt`) are tracked like canaries: they must arrive, not early.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use hourglass::clock::unix_now_ms;
use hourglass_e2e::unique;
use hourglass_e2e::vhost::PrivateVhost;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use serde_json::{Value, json};

use crate::Report;
use hourglass_e2e::chaos::canary::{self, Canaries};
use hourglass_e2e::chaos::host::Host;
use hourglass_e2e::chaos::ledger::Ledger;
use hourglass_e2e::chaos::setup::Setup;

const GRACE: Duration = Duration::from_secs(10);

/// The host and clients every item of the matrix shares.
pub struct Bench {
    pub setup: Setup,
    pub host: Host,
    pub base: Arc<Mutex<String>>,
    pub channel: Channel,
    /// Invalid-queue arrivals: body → reason.
    pub invalid: Arc<Mutex<HashMap<String, String>>>,
    _connection: Connection,
    pub vhost: PrivateVhost,
    /// The `[[redelivery]]` consumer queue.
    pub work: String,
}

impl Bench {
    pub async fn start(stem: &str) -> anyhow::Result<Bench> {
        let vhost = tokio::task::spawn_blocking(move || PrivateVhost::create("faults-inputs")).await?;
        // Blocking: the first use builds it.
        let nothing = tokio::task::spawn_blocking(|| hourglass_e2e::test_planner("misbehaving")).await?;
        let work = unique("work");
        let more = format!(
            "[service]\nredelivery_input = \"{}\"\n\n\
             [strategies.nothing]\nplanner = \"{}\"\n\n\
             [strategies.retry]\nplanner = \"binary-levels\"\nprefix = \"{}\"\nredelivery = {{ policy = \"intervals\", intervals = [\"1s\", \"2s\"] }}\n\n\
             [[redelivery]]\nqueue = \"{work}\"\nstrategy = \"retry\"\nmax_attempts = 3\n",
            unique("redelivery"),
            nothing.display(),
            unique("retry")
        );
        let setup = Setup::new(stem, &vhost.url, &more).await?;
        // The misbehaving planner plans nothing for destination "nothing", which must exist.
        canary::declare_destination(&vhost.url, "nothing").await?;
        let host = Host::start(&setup.config)?;
        let base = Arc::new(Mutex::new(host.base.clone()));
        let connection = Connection::connect(&vhost.url, ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        channel.confirm_select(ConfirmSelectOptions::default()).await?;
        let invalid = Arc::new(Mutex::new(HashMap::new()));
        let watcher = connection.create_channel().await?;
        let mut consumer = watcher
            .basic_consume(
                setup.invalid.as_str().into(),
                "faults-invalid".into(),
                BasicConsumeOptions { no_ack: true, ..Default::default() },
                FieldTable::default(),
            )
            .await?;
        let seen = invalid.clone();
        tokio::spawn(async move {
            let _watcher = watcher;
            while let Some(Ok(delivery)) = consumer.next().await {
                let body: String = String::from_utf8_lossy(&delivery.data).chars().take(80).collect();
                let reason = hourglass_e2e::header_text(&delivery, "hourglass-invalid-reason").unwrap_or_default();
                seen.lock().unwrap().insert(body, reason);
            }
        });
        Ok(Bench { setup, host, base, channel, invalid, _connection: connection, vhost, work })
    }

    /// `POST /v1/messages` with a JSON body; `(status, answer)`, status 0 if no answer.
    pub async fn post(&self, body: Value) -> (u16, Value) {
        self.post_bytes(serde_json::to_vec(&body).unwrap()).await
    }

    pub async fn post_bytes(&self, body: Vec<u8>) -> (u16, Value) {
        let url = format!("{}/v1/messages", self.base.lock().unwrap());
        tokio::task::spawn_blocking(move || {
            let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(30))).build().into();
            match agent.post(&url).header("content-type", "application/json").send(&body[..]) {
                Ok(mut response) => {
                    let status = response.status().as_u16();
                    let text = response.body_mut().read_to_string().unwrap_or_default();
                    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
                }
                Err(_) => (0, Value::Null),
            }
        })
        .await
        .unwrap_or((0, Value::Null))
    }

    /// Publishes to the ingress queue (confirmed); the body is the marker.
    pub async fn ingress(&self, body: &str, headers: Vec<(&str, AMQPValue)>, properties: BasicProperties) -> bool {
        publish(&self.channel, &self.setup.ingress, body, headers, properties).await
    }

    /// The reason the ingress gave for `marker`, waiting up to 15 s.
    pub async fn invalid_reason(&self, marker: &str) -> Option<String> {
        let end = Instant::now() + Duration::from_secs(15);
        while Instant::now() < end {
            if let Some(reason) = self.invalid.lock().unwrap().get(marker) {
                return Some(reason.clone());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    }

    /// An HTTP answer must be `want` (or any 4xx when `want` is 0) with `field` named.
    pub async fn expect_http(&self, report: &mut Report, what: &str, body: Value, want: u16, field: &str) {
        let answer = self.post(body).await;
        check_answer(report, what, answer, want, field);
    }

    /// An ingress message must be set aside with a reason.
    pub async fn expect_invalid(&self, report: &mut Report, what: &str, marker: &str, headers: Vec<(&str, AMQPValue)>, properties: BasicProperties) {
        if !self.ingress(marker, headers, properties).await {
            report.problems.push(format!("ingress {what}: publish not confirmed"));
            return;
        }
        match self.invalid_reason(marker).await {
            Some(reason) if !reason.is_empty() => {}
            Some(_) => report.problems.push(format!("ingress {what}: invalid without a reason")),
            None => report.problems.push(format!("ingress {what}: not on the invalid queue within 15 s")),
        }
    }
}

pub fn check_answer(report: &mut Report, what: &str, (status, answer): (u16, Value), want: u16, field: &str) {
    let status_ok = if want == 0 { (400..500).contains(&status) } else { status == want };
    let named = answer.get("field").and_then(Value::as_str) == Some(field);
    report.check(status_ok && named, || {
        format!("HTTP {what}: {status} {} (want {} naming {field})", short(&answer), if want == 0 { "4xx".into() } else { want.to_string() })
    });
}

fn short(value: &Value) -> String {
    let text = value.to_string();
    text.chars().take(100).collect::<String>().replace('|', "/")
}

pub async fn publish(channel: &Channel, queue: &str, body: &str, headers: Vec<(&str, AMQPValue)>, properties: BasicProperties) -> bool {
    let mut table = FieldTable::default();
    for (k, v) in headers {
        table.insert(ShortString::from(k), v);
    }
    let options = BasicPublishOptions { mandatory: true, ..Default::default() };
    match channel.basic_publish("".into(), queue.into(), options, body.as_bytes(), properties.with_delivery_mode(2).with_headers(table)).await {
        Ok(confirm) => match tokio::time::timeout(Duration::from_secs(10), confirm).await {
            Ok(Ok(confirmation)) => confirmation.is_ack() && confirmation.take_message().is_none(),
            _ => false,
        },
        Err(_) => false,
    }
}

pub fn text(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

/// Runs one item beside canaries and returns its report.
async fn item<F>(bench: &Bench, name: &str, body: F) -> Report
where
    F: AsyncFnOnce(&Bench, &mut Report, &Ledger),
{
    let mut report = Report::new(&format!("bad input: {name}"));
    let tag = unique("c");
    let canaries = Canaries::start(&tag, bench.setup.route(&bench.base));
    let ledger = canaries.ledger.clone();
    // One of each client, not a count in all: the broker confirms the ingress
    // and delayed-exchange canaries whatever the host does, and those alone
    // made three within half a second while the host answered every HTTP
    // request 503.
    let clients = canaries.clients().to_vec();
    let names = clients.iter().map(|c| c.trim_start_matches(&tag).trim_matches('-')).collect::<Vec<_>>().join(", ");
    // Canaries already in flight when the bad input comes: acknowledged, not yet arrived.
    let what = format!("a canary of each client ({names}) in flight before the bad input");
    report.wait_until(&what, Duration::from_secs(10), || clients.iter().all(|c| ledger.in_flight_of(c) >= 1)).await;
    body(bench, &mut report, &ledger).await;
    // And canaries after it: sent once it was done, and acknowledged.
    let after = unix_now_ms();
    let what = format!("a canary of each client ({names}) acknowledged after the bad input");
    report.wait_until(&what, Duration::from_secs(10), || clients.iter().all(|c| ledger.since(c, after).0 >= 1)).await;
    let ledger = canaries.finish(GRACE).await;
    report.tally = ledger.tally();
    // No fault window: a bad input beside them must not make any canary late.
    report.judge_lateness(&ledger, &[]);
    report
}

/// Sends a tricky but valid message through the ingress and tracks it like a canary.
async fn tracked_ingress(
    bench: &Bench,
    ledger: &Ledger,
    report: &mut Report,
    what: &str,
    delay_ms: u64,
    mut headers: Vec<(&str, AMQPValue)>,
    properties: BasicProperties,
) {
    let id = unique(what);
    headers.push(("hourglass-destination", text(&bench.setup.destination)));
    headers.push(("hourglass-delay", text(&format!("{delay_ms}ms"))));
    ledger.sent(&id, unix_now_ms() + delay_ms);
    if bench.ingress(&id, headers, properties).await {
        ledger.acknowledged(&id, None);
    } else {
        report.problems.push(format!("ingress {what}: publish not confirmed"));
    }
}

/// Sends a tricky but valid message through HTTP and tracks it like a canary.
async fn tracked_http(bench: &Bench, ledger: &Ledger, report: &mut Report, what: &str, delay_ms: u64, headers: Value) {
    let id = unique(what);
    ledger.sent(&id, unix_now_ms() + delay_ms);
    let (status, answer) = bench.post(json!({ "destination": bench.setup.destination, "delay": delay_ms, "body": id, "headers": headers })).await;
    if status == 202 {
        ledger.acknowledged(&id, answer.get("due_at").and_then(Value::as_u64));
    } else {
        report.problems.push(format!("HTTP {what}: {status} {}", short(&answer)));
    }
}

pub async fn matrix() -> Vec<Report> {
    let bench = match Bench::start("inputs").await {
        Ok(bench) => bench,
        Err(err) => {
            let mut report = Report::new("bad input matrix");
            report.problems.push(format!("case did not run: {err:#}"));
            return vec![report];
        }
    };
    let destination = bench.setup.destination.clone();
    let long = "d".repeat(300);
    let mut reports = Vec::new();

    reports.push(
        item(&bench, "destination > 255 bytes", async |b, r, _| {
            b.expect_http(r, "long destination", json!({ "destination": long, "delay": 1000, "body": "x" }), 400, "destination").await;
            b.expect_invalid(
                r,
                "long destination",
                &unique("bad-long"),
                vec![("hourglass-destination", text(&long)), ("hourglass-delay", text("1s"))],
                BasicProperties::default(),
            )
            .await;
        })
        .await,
    );
    reports.push(
        item(&bench, "header name > 255 bytes", async |b, r, _| {
            let headers = json!({ "h".repeat(300): "v" });
            b.expect_http(r, "long header name", json!({ "destination": destination, "delay": 1000, "body": "x", "headers": headers }), 400, "headers").await;
            // AMQP itself cannot carry a header name over 255 bytes: nothing to send at the ingress.
        })
        .await,
    );
    reports.push(
        item(&bench, "missing destination queue", async |b, r, _| {
            let missing = unique("missing");
            b.expect_http(r, "missing destination", json!({ "destination": missing, "delay": 1000, "body": "x" }), 422, "destination").await;
            b.expect_invalid(
                r,
                "missing destination",
                &unique("bad-missing"),
                vec![("hourglass-destination", text(&missing)), ("hourglass-delay", text("1s"))],
                BasicProperties::default(),
            )
            .await;
        })
        .await,
    );
    reports.push(
        item(&bench, "CC / BCC headers", async |b, r, l| {
            for name in ["CC", "BCC"] {
                b.expect_http(r, name, json!({ "destination": destination, "delay": 1000, "body": "x", "headers": { name: destination } }), 400, "headers")
                    .await;
            }
            // The broker routes a CC copy at publish time and keeps the header: the
            // ingress must set the message aside, not forward it with the header on.
            let copies = AMQPValue::FieldArray(FieldArray::from(vec![text(&destination)]));
            let headers = vec![("hourglass-destination", text(&destination)), ("hourglass-delay", text("1s")), ("CC", copies)];
            b.expect_invalid(r, "CC", &unique("bad-CC"), headers, BasicProperties::default()).await;
            // The broker removes BCC before delivering: the ingress receives an
            // ordinary message, which must be delayed and delivered like any other.
            // (BCC names a queue that does not exist, so the publish routes no copy.)
            let nowhere = AMQPValue::FieldArray(FieldArray::from(vec![text(&unique("bcc-nowhere"))]));
            tracked_ingress(b, l, r, "bcc", 2000, vec![("BCC", nowhere)], BasicProperties::default()).await;
        })
        .await,
    );
    reports.push(
        item(&bench, "400 KB header", async |b, r, _| {
            let big = "v".repeat(400 * 1024);
            b.expect_http(r, "400 KB header", json!({ "destination": destination, "delay": 1000, "body": "x", "headers": { "big": big } }), 0, "headers").await;
            // A client cannot publish it: RabbitMQ's frame_max (131,072) bounds a header frame.
        })
        .await,
    );
    reports.push(
        item(&bench, "~131 KB total headers", async |b, r, _| {
            let part = "v".repeat(44 * 1024);
            let headers = json!({ "a": part, "b": part, "c": part });
            b.expect_http(r, "131 KB of headers", json!({ "destination": destination, "delay": 1000, "body": "x", "headers": headers }), 0, "headers").await;
            // At the ingress, just under frame_max from the client: hourglass's own headers would push it over.
            let part = "v".repeat(40 * 1024);
            let headers = vec![
                ("hourglass-destination", text(&destination)),
                ("hourglass-delay", text("1s")),
                ("a", text(&part)),
                ("b", text(&part)),
                ("c", text(&part)),
            ];
            b.expect_invalid(r, "~120 KB of headers", &unique("bad-big"), headers, BasicProperties::default()).await;
        })
        .await,
    );
    reports.push(
        item(&bench, "expiration shorter than the delay", async |b, r, l| {
            tracked_ingress(b, l, r, "expiring", 3000, vec![], BasicProperties::default().with_expiration(ShortString::from("200"))).await;
            tracked_http(b, l, r, "expiration-header", 3000, json!({ "expiration": "200" })).await;
        })
        .await,
    );
    reports.push(
        item(&bench, "client-set x-death / x-first-death-*", async |b, r, l| {
            for name in ["x-death", "x-first-death-queue", "x-first-death-reason"] {
                b.expect_http(r, name, json!({ "destination": destination, "delay": 1000, "body": "x", "headers": { name: "expired" } }), 400, "headers").await;
            }
            let mut death = FieldTable::default();
            death.insert(ShortString::from("queue"), text(&destination));
            death.insert(ShortString::from("reason"), text("expired"));
            death.insert(ShortString::from("count"), AMQPValue::LongLongInt(1));
            let deaths = AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::FieldTable(death)]));
            let headers = vec![("x-death", deaths), ("x-first-death-queue", text(&destination)), ("x-first-death-reason", text("expired"))];
            tracked_ingress(b, l, r, "deathly", 2000, headers, BasicProperties::default()).await;
        })
        .await,
    );
    reports.push(redelivery_attempt(&bench).await);
    reports.push(
        item(&bench, "JSON 413", async |b, r, _| {
            let body = "b".repeat(300 * 1024);
            b.expect_http(r, "300 KB body", json!({ "destination": destination, "delay": 1000, "body": body }), 413, "body").await;
            let huge = serde_json::to_vec(&json!({ "destination": destination, "delay": 1000, "body": "b".repeat(3 * 1024 * 1024) })).unwrap();
            let answer = b.post_bytes(huge).await;
            check_answer(r, "3 MB request", answer, 413, "body");
        })
        .await,
    );
    let own = own_names(&bench).await;
    reports.push(
        item(&bench, "hourglass's own queues / exchanges as destination", async |b, r, _| {
            for name in &own {
                b.expect_http(r, &format!("destination {name}"), json!({ "destination": name, "delay": 1000, "body": "x" }), 400, "destination").await;
                let headers = vec![("hourglass-destination", text(name)), ("hourglass-delay", text("1s"))];
                b.expect_invalid(r, &format!("destination {name}"), &unique("bad-own"), headers, BasicProperties::default()).await;
            }
        })
        .await,
    );
    reports.push(
        item(&bench, "plan with zero publishes", async |b, r, _| {
            let (status, answer) = b.post(json!({ "destination": "nothing", "delay": 0, "body": "x", "strategy": "nothing" })).await;
            r.check(!(200..300).contains(&status) && status != 0, || format!("HTTP zero publishes: {status} {}", short(&answer)));
            let headers = vec![("hourglass-destination", text("nothing")), ("hourglass-delay", text("0ms")), ("hourglass-strategy", text("nothing"))];
            b.expect_invalid(r, "zero publishes", &unique("bad-nothing"), headers, BasicProperties::default()).await;
        })
        .await,
    );
    drop(bench.host);
    let vhost = bench.vhost;
    let _ = tokio::task::spawn_blocking(move || drop(vhost)).await;
    reports
}

/// The ingress and invalid queues, the redelivery input and a level queue of the default strategy.
async fn own_names(bench: &Bench) -> Vec<String> {
    let mut names = vec![bench.setup.ingress.clone(), bench.setup.invalid.clone()];
    let text = std::fs::read_to_string(&bench.setup.config).unwrap_or_default();
    if let Some(input) = text.lines().find_map(|l| l.strip_prefix("redelivery_input = \"")) {
        names.push(input.trim_end_matches('"').to_string());
    }
    let url = format!("{}/v1/topology", bench.base.lock().unwrap());
    let topology: Value = tokio::task::spawn_blocking(move || ureq::get(&url).call().ok().and_then(|mut r| r.body_mut().read_json().ok()))
        .await
        .ok()
        .flatten()
        .unwrap_or(Value::Null);
    let queue =
        topology["commands"].as_array().into_iter().flatten().find_map(|c| c.get("declare-queue").or(c.get("DeclareQueue")).and_then(|q| q["name"].as_str()));
    names.extend(queue.map(String::from));
    names
}

/// Rejected messages come back after the policy's interval, whatever integer
/// type their `hourglass-attempt` header has (pika writes 32-bit, others 8- or 16-bit).
async fn redelivery_attempt(bench: &Bench) -> Report {
    let mut report = Report::new("bad input: integer hourglass-attempt at redelivery");
    let work = bench.work.clone();
    let ledger = Arc::new(Ledger::default());
    let canaries = Canaries::start(&unique("c"), bench.setup.route(&bench.base));
    let Ok(connection) = Connection::connect(&bench.setup.amqp_url, ConnectionProperties::default()).await else {
        report.problems.push("no connection".into());
        return report;
    };
    let channel = connection.create_channel().await.unwrap();
    let passive = QueueDeclareOptions { passive: true, ..Default::default() };
    if channel.queue_declare(work.as_str().into(), passive, FieldTable::default()).await.is_err() {
        report.problems.push(format!("the redelivery queue {work:?} was not declared"));
        return report;
    }
    let consumer_channel = connection.create_channel().await.unwrap();
    let mut consumer =
        consumer_channel.basic_consume(work.as_str().into(), "faults-work".into(), BasicConsumeOptions::default(), FieldTable::default()).await.unwrap();
    let seen = ledger.clone();
    // First delivery of each message: reject (it dead-letters to hourglass); the next: ack, arrived.
    let worker = tokio::spawn(async move {
        let mut rejected = std::collections::HashSet::new();
        while let Some(Ok(delivery)) = consumer.next().await {
            let id = String::from_utf8_lossy(&delivery.data).into_owned();
            if rejected.insert(id.clone()) {
                // Redelivery after the first interval (1 s) at the earliest.
                seen.sent(&id, unix_now_ms() + 1000);
                seen.acknowledged(&id, None);
                let _ = delivery.acker.nack(BasicNackOptions { requeue: false, ..Default::default() }).await;
            } else {
                seen.arrived(&id);
                let _ = delivery.acker.ack(BasicAckOptions::default()).await;
            }
        }
    });
    let publisher = connection.create_channel().await.unwrap();
    publisher.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    let attempts = vec![
        ("none", None),
        ("i8", Some(AMQPValue::ShortShortInt(1))),
        ("i16", Some(AMQPValue::ShortInt(1))),
        ("i32", Some(AMQPValue::LongInt(1))),
        ("u32", Some(AMQPValue::LongUInt(1))),
        ("i64", Some(AMQPValue::LongLongInt(1))),
    ];
    let count = attempts.len();
    for (kind, value) in attempts {
        let id = unique(&format!("attempt-{kind}"));
        let headers = value.map(|v| vec![("hourglass-attempt", v)]).unwrap_or_default();
        report.check(publish(&publisher, &work, &id, headers, BasicProperties::default()).await, || format!("publish to {work} ({kind}) not confirmed"));
    }
    let end = Instant::now() + Duration::from_secs(20);
    while Instant::now() < end && !(ledger.tally().acknowledged == count && ledger.complete()) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    worker.abort();
    let redelivered = ledger.tally();
    report.check(redelivered.acknowledged == count && redelivered.lost == 0, || {
        format!("{} of {} rejected messages came back within 20 s", redelivered.arrived, count)
    });
    report.check(redelivered.early == 0, || format!("{} redelivered before the interval", redelivered.early));
    let mut tally = canaries.finish(GRACE).await.tally();
    tally.early += redelivered.early;
    report.tally = tally;
    connection.close(200, "done".into()).await.ok();
    report
}
