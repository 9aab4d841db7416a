//! Poison at the head of the ingress queue: messages that once stopped the
//! ingress (a 300-byte `hourglass-destination`; headers that fit the client's
//! frame but not hourglass's forward) wait in the queue before the host
//! starts. They must be set aside with a reason, and the canaries behind them
//! arrive on time while `/readyz` stays 200.

use std::time::{Duration, Instant};

use hourglass::clock::unix_now_ms;
use hourglass_e2e::unique;
use hourglass_e2e::vhost::PrivateVhost;
use lapin::options::{BasicGetOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};

use crate::Report;
use crate::inputs::{publish, text};
use hourglass_e2e::chaos::canary::Canaries;
use hourglass_e2e::chaos::host::Host;
use hourglass_e2e::chaos::setup::Setup;

pub async fn at_the_head() -> Vec<Report> {
    let mut report = Report::new("poison messages at the head of the ingress queue");
    if let Err(err) = run(&mut report).await {
        report.problems.push(format!("case did not run: {err:#}"));
    }
    vec![report]
}

async fn run(report: &mut Report) -> anyhow::Result<()> {
    let vhost = tokio::task::spawn_blocking(|| PrivateVhost::create("faults-poison")).await?;
    let setup = Setup::new("poison", &vhost.url, "").await?;
    let connection = Connection::connect(&vhost.url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    channel.confirm_select(ConfirmSelectOptions::default()).await?;
    // Declared as the host declares it, so the poison is there before the host is.
    let durable = QueueDeclareOptions { durable: true, ..Default::default() };
    let mut quorum = FieldTable::default();
    quorum.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
    channel.queue_declare(setup.ingress.as_str().into(), durable, quorum).await?;
    let part = "v".repeat(40 * 1024);
    let poisons = [
        ("long destination", vec![("hourglass-destination", text(&"d".repeat(300))), ("hourglass-delay", text("1s"))]),
        (
            "headers near frame_max",
            vec![
                ("hourglass-destination", text(&setup.destination)),
                ("hourglass-delay", text("1s")),
                ("a", text(&part)),
                ("b", text(&part)),
                ("c", text(&part)),
            ],
        ),
    ];
    let count = poisons.len();
    for (what, headers) in poisons {
        report
            .check(publish(&channel, &setup.ingress, &unique("poison"), headers, BasicProperties::default()).await, || format!("poison {what} not confirmed"));
    }
    let host = tokio::task::spawn_blocking({
        let config = setup.config.clone();
        move || Host::start(&config)
    })
    .await??;
    let base = std::sync::Arc::new(std::sync::Mutex::new(host.base.clone()));
    let canaries = Canaries::start("poison", setup.route(&base));
    let mut set_aside = 0;
    let end = Instant::now() + Duration::from_secs(15);
    while set_aside < count && Instant::now() < end {
        match channel.basic_get(setup.invalid.as_str().into(), BasicGetOptions { no_ack: true }).await {
            Ok(Some(message)) => {
                set_aside += 1;
                report.check(hourglass_e2e::header_text(&message.delivery, "hourglass-invalid-reason").is_some(), || {
                    "a poison set aside without a reason".into()
                });
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    report.check(set_aside == count, || format!("{set_aside} of {count} poison messages on the invalid queue within 15 s"));
    // The ingress went on past the poison: canaries published to it after the
    // poison was set aside arrived. (An ingress that takes nothing more once it
    // set a message aside sets both poisons aside and fails this: "… not within 15s".)
    let (after, ledger) = (unix_now_ms(), canaries.ledger.clone());
    report.wait_until("three ingress canaries sent after the poison arrived", Duration::from_secs(15), || ledger.since("poison-i", after).1 >= 3).await;
    let url = format!("{}/readyz", host.base);
    let ready = tokio::task::spawn_blocking(move || {
        ureq::get(&url).call().map(|r| r.status().as_u16()).unwrap_or_else(|e| match e {
            ureq::Error::StatusCode(code) => code,
            _ => 0,
        })
    })
    .await?;
    report.check(ready == 200, || format!("/readyz answered {ready} after the poison"));
    let ledger = canaries.finish(Duration::from_secs(10)).await;
    report.tally = ledger.tally();
    // The poison was there before any canary: none of them may be late for it.
    report.judge_lateness(&ledger, &[]);
    drop(host);
    connection.close(200, "done".into()).await.ok();
    tokio::task::spawn_blocking(move || drop(vhost)).await?;
    Ok(())
}
