//! The delayed exchange under bad input and a lost `deliver_to`: messages
//! published the delayed-message plugin's way (`x-delay`) that must be set
//! aside — waiting at the head of the intake before the host starts, and
//! garbage `x-delay`s beside valid traffic — and `deliver_to` deleted while
//! messages wait (they are parked with the reason at the release queue, and
//! `hourglass parked replay` delivers them once it is back). The canaries
//! (HTTP, ingress and the delayed exchange) must all arrive, none early.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hourglass::clock::unix_now_ms;
use hourglass_e2e::unique;
use hourglass_e2e::vhost::PrivateVhost;
use lapin::options::{BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};

use crate::Report;
use hourglass_e2e::chaos::canary::Canaries;
use hourglass_e2e::chaos::host::{Host, binary};
use hourglass_e2e::chaos::setup::Setup;

pub async fn under_faults() -> Vec<Report> {
    let mut report = Report::new("delayed exchange: poison, x-delay garbage, deliver_to deleted");
    if let Err(err) = run(&mut report).await {
        report.problems.push(format!("case did not run: {err:#}"));
    }
    vec![report]
}

/// Publishes to the delayed exchange with one `x-delay` value (or none); whether the broker confirmed it.
async fn publish(channel: &Channel, exchange: &str, body: &str, x_delay: Option<AMQPValue>, more: Vec<(&str, AMQPValue)>) -> bool {
    let mut headers = FieldTable::default();
    if let Some(value) = x_delay {
        headers.insert(ShortString::from("x-delay"), value);
    }
    for (name, value) in more {
        headers.insert(ShortString::from(name), value);
    }
    let properties = BasicProperties::default().with_delivery_mode(2).with_headers(headers);
    match channel.basic_publish(exchange.into(), "garbage".into(), BasicPublishOptions::default(), body.as_bytes(), properties).await {
        Ok(confirm) => confirm.await.is_ok_and(|c| c.is_ack()),
        Err(_) => false,
    }
}

/// What a poison is, its `x-delay`, and its other headers.
type Poison<'a> = (&'a str, Option<AMQPValue>, Vec<(&'a str, AMQPValue)>);

fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

async fn run(report: &mut Report) -> anyhow::Result<()> {
    let vhost = tokio::task::spawn_blocking(|| PrivateVhost::create("faults-delayed")).await?;
    let setup = Setup::new("delayed", &vhost.url, "").await?;
    let connection = Connection::connect(&vhost.url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    channel.confirm_select(ConfirmSelectOptions::default()).await?;
    // Declared as the host declares them, so the poison waits at the intake's head before the host is there.
    let durable = QueueDeclareOptions { durable: true, ..Default::default() };
    let mut quorum = FieldTable::default();
    quorum.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
    channel.queue_declare(setup.ingress.as_str().into(), durable, quorum).await?;
    let durable_exchange = ExchangeDeclareOptions { durable: true, ..Default::default() };
    channel.exchange_declare(setup.delayed.as_str().into(), ExchangeKind::Fanout, durable_exchange, FieldTable::default()).await?;
    channel.queue_bind(setup.ingress.as_str().into(), setup.delayed.as_str().into(), "".into(), QueueBindOptions::default(), FieldTable::default()).await?;
    let part = "v".repeat(40 * 1024);
    let poisons: Vec<Poison> = vec![
        ("x-delay past every strategy's maximum", Some(AMQPValue::LongLongInt(i64::MAX)), vec![]),
        ("headers near frame_max", Some(AMQPValue::LongInt(1_000)), vec![("a", text(&part)), ("b", text(&part)), ("c", text(&part))]),
        ("a hourglass header", Some(AMQPValue::LongInt(1_000)), vec![("hourglass-target", text("elsewhere"))]),
    ];
    let mut markers = Vec::new();
    for (what, x_delay, more) in poisons {
        let marker = unique("poison");
        report.check(publish(&channel, &setup.delayed, &marker, x_delay, more).await, || format!("poison {what} not confirmed"));
        markers.push(marker);
    }

    let host = tokio::task::spawn_blocking({
        let config = setup.config.clone();
        move || Host::start(&config)
    })
    .await??;
    let base = Arc::new(Mutex::new(host.base.clone()));
    let canaries = Canaries::start("delayed", setup.route(&base));

    // Garbage beside valid traffic, for a few seconds.
    let garbage = [text("soon"), text("1.5e3"), AMQPValue::Boolean(true), AMQPValue::Double(2.5)];
    for round in 0..3 {
        for (n, value) in garbage.iter().enumerate() {
            let marker = unique(&format!("garbage-{round}-{n}"));
            report.check(publish(&channel, &setup.delayed, &marker, Some(value.clone()), vec![]).await, || format!("garbage {value:?} not confirmed"));
            markers.push(marker);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // `deliver_to` deleted while canaries wait: they are parked at the release queue.
    let deleted_ms = unix_now_ms();
    channel.exchange_delete(setup.orders.as_str().into(), Default::default()).await?;
    let release_parked = format!("{}.parked", setup.release_queue());
    // Until delayed-exchange canaries due meanwhile are parked there: three, from
    // at least 450 ms of releases (one canary each 150 ms). (A release that acks
    // and drops instead of parking fails it: "0 canaries parked at … expected 3".)
    let end = Instant::now() + Duration::from_secs(10);
    let mut parked = 0;
    while parked < 3 && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(100)).await;
        parked = hourglass_e2e::chaos::canary::depth(&setup.amqp_url, &release_parked).await?;
    }
    report.check(parked >= 3, || format!("{parked} canaries parked at {release_parked} within 10 s of deliver_to's deletion; expected 3"));
    report.notes.push(format!("{parked} parked while deliver_to was gone"));
    // Back, as an operator would put it back; then the parked ones are replayed.
    channel.exchange_declare(setup.orders.as_str().into(), ExchangeKind::Topic, durable_exchange, FieldTable::default()).await?;
    let bind = QueueBindOptions::default();
    channel.queue_bind(setup.destination.as_str().into(), setup.orders.as_str().into(), "canary".into(), bind, FieldTable::default()).await?;
    let (config, queue) = (setup.config.clone(), release_parked.clone());
    let replay = tokio::task::spawn_blocking(move || {
        std::process::Command::new(binary())
            .arg("--config")
            .arg(config)
            .args(["parked", "replay", "--queue", &queue])
            .env("HOURGLASS_CACHE_DIR", hourglass_e2e::chaos::scratch("delayed-cache"))
            .output()
    })
    .await??;
    report.check(replay.status.success(), || format!("parked replay failed: {}", String::from_utf8_lossy(&replay.stderr)));
    let replayed_ms = unix_now_ms();

    // Every poison and every garbage message set aside, each with a reason.
    let mut reasons = std::collections::HashMap::new();
    let end = Instant::now() + Duration::from_secs(15);
    while reasons.len() < markers.len() && Instant::now() < end {
        match channel.basic_get(setup.invalid.as_str().into(), BasicGetOptions { no_ack: true }).await {
            Ok(Some(message)) => {
                let reason = hourglass_e2e::header_text(&message.delivery, "hourglass-invalid-reason").unwrap_or_default();
                reasons.insert(String::from_utf8_lossy(&message.delivery.data).to_string(), reason);
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    for marker in &markers {
        match reasons.get(marker) {
            Some(reason) if !reason.is_empty() => {}
            Some(_) => report.problems.push(format!("{marker} set aside without a reason")),
            None => report.problems.push(format!("{marker} not on the invalid queue within 15 s")),
        }
    }
    let ledger = canaries.finish(Duration::from_secs(20)).await;
    report.tally = ledger.tally();
    // The fault window: from deliver_to's deletion until the parked canaries were replayed.
    report.judge_lateness(&ledger, &[(deleted_ms, replayed_ms)]);
    drop(host);
    connection.close(200, "done".into()).await.ok();
    tokio::task::spawn_blocking(move || drop(vhost)).await?;
    Ok(())
}
