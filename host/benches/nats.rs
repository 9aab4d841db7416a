//! A burst on NATS JetStream: how late do delayed messages arrive through
//! hourglass, beside a raw async-nats relay doing the same job the way users
//! write it before 2.12 (a held stream, a durable consumer that declines each
//! message with the time left until it is due, then publishes it on)? Needs a
//! NATS server with JetStream on $HOURGLASS_NATS_URL (default 127.0.0.1:4222).
//!
//! Run: `cargo bench -p hourglass --bench nats [MESSAGES]` (default 3,000).
//! Each round sends the burst both ways, alternating which goes first
//! (`BENCH_ROUNDS`, default 2): published at once to the ingress subject
//! (hourglass) or to the relay's held subject (raw), delays spread over
//! 1–10 s, each message's due time in its body; lateness is measured at a
//! consumer of the destination stream. Method: BENCHMARKS.md ("NATS").

mod support;

use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, pull};
use async_nats::jetstream::{self, AckKind, stream};
use futures_util::StreamExt;
use hourglass::config::Config;
use support::{Served, now_ms, percentile, run_id};

const DELAYS_MS: std::ops::Range<u64> = 1_000..10_000;

fn url() -> String {
    std::env::var("HOURGLASS_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_string())
}

async fn create_stream(js: &jetstream::Context, name: &str, subject: &str, work_queue: bool) -> stream::Stream {
    let retention = if work_queue { stream::RetentionPolicy::WorkQueue } else { stream::RetentionPolicy::Limits };
    js.create_stream(stream::Config { name: name.into(), subjects: vec![subject.into()], retention, ..Default::default() }).await.expect("create stream")
}

/// Lateness in ms of the first `count` messages on `stream`, sorted: arrival minus the due time in
/// the body (from the producer's send) and, where it has one, minus `hourglass-due-at` (from
/// hourglass's forward, which leaves out the wait in the ingress).
async fn lateness(js: &jetstream::Context, stream: &str, count: usize) -> (Vec<i64>, Vec<i64>) {
    let consumer = js
        .get_stream(stream)
        .await
        .unwrap()
        .create_consumer(pull::Config { ack_policy: AckPolicy::None, ..Default::default() })
        .await
        .expect("destination consumer");
    let mut messages = consumer.messages().await.unwrap();
    let (mut late, mut from_forward) = (Vec::with_capacity(count), Vec::new());
    while late.len() < count {
        let Some(Ok(message)) = tokio::time::timeout(Duration::from_secs(60), messages.next()).await.expect("the burst stalled") else { continue };
        let now = now_ms() as i64;
        let due: u64 = std::str::from_utf8(&message.payload).unwrap().parse().unwrap();
        late.push(now - due as i64);
        if let Some(stamped) = message.headers.as_ref().and_then(|h| h.get("hourglass-due-at")).and_then(|v| v.as_str().parse::<i64>().ok()) {
            from_forward.push(now - stamped);
        }
    }
    late.sort_unstable();
    from_forward.sort_unstable();
    (late, from_forward)
}

fn delay_of(i: usize, count: usize) -> u64 {
    DELAYS_MS.start + (i as u64 * (DELAYS_MS.end - DELAYS_MS.start)) / count as u64
}

/// The raw relay: declines each message until due with the time left, then publishes it on and acks.
async fn raw_relay(js: jetstream::Context, held: String, destination: String) {
    let consumer = js
        .get_stream(&held)
        .await
        .unwrap()
        .get_or_create_consumer(
            "relay",
            pull::Config { durable_name: Some("relay".into()), ack_policy: AckPolicy::Explicit, max_ack_pending: -1, ..Default::default() },
        )
        .await
        .unwrap();
    let mut messages = consumer.messages().await.unwrap();
    while let Some(Ok(message)) = messages.next().await {
        let due: u64 = std::str::from_utf8(&message.payload).unwrap().parse().unwrap();
        let now = now_ms();
        if now < due {
            message.ack_with(AckKind::Nak(Some(Duration::from_millis(due - now)))).await.ok();
        } else {
            js.publish(destination.clone(), message.payload.clone()).await.unwrap().await.unwrap();
            message.ack().await.ok();
        }
    }
}

async fn run_raw(js: &jetstream::Context, count: usize) -> (Vec<i64>, Vec<i64>) {
    let run = run_id();
    let (held, destination) = (format!("bench-raw-{run}-held"), format!("bench-raw-{run}-dest"));
    create_stream(js, &held, &format!("bench.raw.{run}.held"), true).await;
    create_stream(js, &destination, &format!("bench.raw.{run}.dest"), false).await;
    let relay = tokio::spawn(raw_relay(js.clone(), held.clone(), format!("bench.raw.{run}.dest")));
    let collecting = tokio::spawn({
        let (js, destination) = (js.clone(), destination.clone());
        async move { lateness(&js, &destination, count).await }
    });
    for i in 0..count {
        let due = now_ms() + delay_of(i, count);
        js.publish(format!("bench.raw.{run}.held"), due.to_string().into()).await.unwrap().await.unwrap();
    }
    let late = collecting.await.unwrap();
    relay.abort();
    for name in [held, destination] {
        js.delete_stream(name).await.ok();
    }
    late
}

async fn run_hourglass(js: &jetstream::Context, count: usize) -> (Vec<i64>, Vec<i64>) {
    let run = run_id();
    let (destination, ingress) = (format!("bench-hg-{run}-dest"), format!("bench.hg.{run}.in"));
    create_stream(js, &destination, &format!("bench.hg.{run}.dest"), false).await;
    let text = format!(
        "[broker]\nkind = \"nats\"\nurl = \"{}\"\nclock_stream = \"bench-hg-{run}-clock\"\n[strategies.hold]\nplanner = \"nats-hold\"\nstream = \"bench-hg-{run}-held\"\nsubject = \"bench.hg.{run}.held\"\n\
         [service.ingress]\nqueue = \"{ingress}\"\ninvalid_queue = \"{ingress}.invalid\"\n[service.canary]\nenabled = false\n",
        url()
    );
    let served = Served::start(Config::parse(std::path::Path::new("bench-nats.toml"), text).unwrap()).await;
    let collecting = tokio::spawn({
        let (js, destination) = (js.clone(), destination.clone());
        async move { lateness(&js, &destination, count).await }
    });
    for i in 0..count {
        let delay = delay_of(i, count);
        let due = now_ms() + delay;
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("hourglass-destination", format!("bench.hg.{run}.dest").as_str());
        headers.insert("hourglass-delay", format!("{delay}ms").as_str());
        js.publish_with_headers(ingress.clone(), headers, due.to_string().into()).await.unwrap().await.unwrap();
    }
    let late = collecting.await.unwrap();
    served.stop().await;
    for name in [
        destination,
        format!("bench-hg-{run}-held"),
        format!("bench-hg-{run}-held-parked"),
        format!("bench-hg-{run}-clock"),
        ingress.replace('.', "-"),
        format!("{}-invalid", ingress.replace('.', "-")),
    ] {
        js.delete_stream(name).await.ok();
    }
    late
}

fn describe(late: &[i64]) -> String {
    format!("min {} / p50 {} / p99 {} / max {} ms", late[0], percentile(late, 0.5), percentile(late, 0.99), late[late.len() - 1])
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let count: usize = std::env::args().skip(1).find(|a| !a.starts_with('-')).map_or(3_000, |a| a.parse().expect("MESSAGES: a number"));
    let rounds: usize = std::env::var("BENCH_ROUNDS").ok().map_or(2, |r| r.parse().expect("BENCH_ROUNDS: a number"));
    let client = async_nats::connect(url()).await.expect("NATS on $HOURGLASS_NATS_URL");
    let js = jetstream::new(client);
    println!("{count} messages, delays {}–{} s, {rounds} rounds", DELAYS_MS.start / 1_000, DELAYS_MS.end / 1_000);
    for round in 0..rounds {
        let ((raw, _), (hourglass, forwarded)) = if round % 2 == 0 {
            let raw = run_raw(&js, count).await;
            (raw, run_hourglass(&js, count).await)
        } else {
            let hourglass = run_hourglass(&js, count).await;
            (run_raw(&js, count).await, hourglass)
        };
        let ratio = percentile(&hourglass, 0.99) as f64 / percentile(&raw, 0.99).max(1) as f64;
        println!(
            "round {} ({} first): raw relay {}; hourglass {} (from its forward: {}); p99 ratio {ratio:.2}×; early: raw {}, hourglass {}",
            round + 1,
            if round % 2 == 0 { "raw" } else { "hourglass" },
            describe(&raw),
            describe(&hourglass),
            describe(&forwarded),
            raw.iter().filter(|l| **l < 0).count(),
            hourglass.iter().filter(|l| **l < 0).count()
        );
    }
}
