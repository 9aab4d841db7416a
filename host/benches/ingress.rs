//! Draining a preloaded ingress queue: hourglass against a raw lapin relay at
//! the same prefetch, in one run, the relay publishing once into a plain queue
//! and once where hourglass's first hop goes (its first level exchange, with
//! the plan's BCC keys), for binary levels with topic and with direct routing.
//! Needs RabbitMQ on $HOURGLASS_AMQP_URL (default guest on 127.0.0.1:5672).
//! Run: `cargo bench -p hourglass --bench ingress [PREFETCH…]`; `BENCH_LEVELS`
//! (classic or quorum) and `BENCH_ROUTING` (topic or direct) pick one of each.
//! Method: BENCHMARKS.md ("Ingress drain").

mod support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use hourglass::config::Config;
use hourglass::config::broker::amqp_url;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties};
use support::{CpuClock, declare_queue, ingress_config_text, publish_to_ingress};

/// Messages preloaded for each run.
const MESSAGES: usize = 20_000;
/// Rounds of each baseline and hourglass; medians are reported.
const ROUNDS: usize = 5;

/// Publishes `MESSAGES` persistent 100-byte messages to `queue` with ingress
/// headers for `destination` (1 h delays, so nothing is delivered during the run).
async fn preload(channel: &Channel, queue: &str, destination: &str) {
    let mut confirms = Vec::with_capacity(MESSAGES);
    for i in 0..MESSAGES {
        confirms.push(publish_to_ingress(channel, queue, destination, 3_600_000 + (i % 3_000) as u64, &[b'x'; 100]).await);
        if confirms.len() == 1_000 {
            for confirm in confirms.drain(..) {
                confirm.await.expect("confirm");
            }
        }
    }
    for confirm in confirms {
        confirm.await.expect("confirm");
    }
}

/// A drain: messages per second, and CPU per message (µs) of this process and of the broker.
#[derive(Clone, Copy)]
struct Drain {
    rate: f64,
    own_cpu_us: f64,
    broker_cpu_us: f64,
    /// Context switches of the bench process per message.
    switches: f64,
}

/// The drain between the first and the last of `MESSAGES` counted by `done`.
async fn rate(done: &AtomicUsize) -> Drain {
    let deadline = Instant::now() + Duration::from_secs(300);
    while done.load(Ordering::Relaxed) == 0 {
        assert!(Instant::now() < deadline, "nothing was processed");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let (first, start, cpu) = (done.load(Ordering::Relaxed), Instant::now(), CpuClock::now());
    while done.load(Ordering::Relaxed) < MESSAGES {
        assert!(Instant::now() < deadline, "only {} of {MESSAGES} processed", done.load(Ordering::Relaxed));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let now = CpuClock::now();
    let (own_cpu_us, broker_cpu_us) = now.per_message_since(&cpu, MESSAGES - first);
    let switches = now.switches_per_message_since(&cpu, MESSAGES - first);
    Drain { rate: (MESSAGES - first) as f64 / start.elapsed().as_secs_f64(), own_cpu_us, broker_cpu_us, switches }
}

/// The baseline: consume with `prefetch`, publish each to `target` with a
/// confirm (persistent, mandatory), ack once confirmed; `prefetch` in flight.
async fn raw_relay(url: &str, source: &str, (exchange, target): (&str, &str), prefetch: u16, headers: Option<FieldTable>) -> Drain {
    let connection = Connection::connect(url, ConnectionProperties::default()).await.expect("RabbitMQ");
    let consuming = connection.create_channel().await.unwrap();
    let publishing = connection.create_channel().await.unwrap();
    publishing.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    consuming.basic_qos(prefetch, BasicQosOptions::default()).await.unwrap();
    let consumer = consuming.basic_consume(source.into(), "bench-raw".into(), BasicConsumeOptions::default(), FieldTable::default()).await.unwrap();
    let done = Arc::new(AtomicUsize::new(0));
    let counted = done.clone();
    let (exchange, target): (Arc<str>, Arc<str>) = (exchange.into(), target.into());
    let headers = Arc::new(headers);
    let relay = tokio::spawn(consumer.for_each_concurrent(prefetch as usize, move |delivery| {
        let (publishing, counted, exchange, target, headers) = (publishing.clone(), counted.clone(), exchange.clone(), target.clone(), headers.clone());
        async move {
            let delivery = delivery.expect("delivery");
            let options = BasicPublishOptions { mandatory: true, ..Default::default() };
            let mut properties = delivery.properties.clone().with_delivery_mode(2);
            if let Some(headers) = &*headers {
                properties = properties.with_headers(headers.clone());
            }
            let confirm = publishing.basic_publish((&*exchange).into(), (&*target).into(), options, &delivery.data, properties).await.expect("publish");
            assert!(confirm.await.expect("confirm").is_ack());
            delivery.acker.ack(BasicAckOptions::default()).await.expect("ack");
            counted.fetch_add(1, Ordering::Relaxed);
        }
    }));
    let rate = rate(&done).await;
    relay.abort();
    // Bounded: a close racing the aborted relay's last publishes can wait on a
    // lapin promise that never settles ("invalid channel state: Closing"),
    // which stalled two runs here for good.
    tokio::time::timeout(Duration::from_secs(5), connection.close(200, "done".into())).await.ok();
    rate
}

/// hourglass's ingress on `source`, binary levels of `queue_type` and `routing`, with `prefetch`.
async fn hourglass_ingress(url: &str, source: &str, prefix: &str, (queue_type, routing): (&str, &str), prefetch: u16) -> (Drain, Config) {
    // `BENCH_PUBLISH_CHANNELS=N` sweeps the channel count; unset, the default applies.
    let channels = std::env::var("BENCH_PUBLISH_CHANNELS").map(|n| format!("publish_channels = {n}\n")).unwrap_or_default();
    // `BENCH_BITS=N` gives binary-levels N levels instead of its default 28.
    let bits = std::env::var("BENCH_BITS").map(|n| format!("levels = {n}\n")).unwrap_or_default();
    // The ingress table comes last, so its prefetch is appended.
    let strategy = format!("queue_type = \"{queue_type}\"\nrouting = \"{routing}\"\n{bits}");
    let text = ingress_config_text(url, prefix, source, &strategy, &channels) + &format!("prefetch = {prefetch}\n");
    let config = Config::parse(Path::new("bench.toml"), text).expect("bench config");
    // `BENCH_HOSTS=N` runs N services (hosts) on the one ingress queue, as competing consumers.
    let hosts: usize = std::env::var("BENCH_HOSTS").ok().and_then(|n| n.parse().ok()).unwrap_or(1);
    let mut all = Vec::with_capacity(hosts);
    for _ in 0..hosts {
        all.push(support::Served::start(config.clone()).await);
    }
    let services: Vec<_> = all.iter().map(|served| served.service.clone()).collect();
    let done = Arc::new(AtomicUsize::new(0));
    let counter = {
        let (services, done) = (services.clone(), done.clone());
        tokio::spawn(async move {
            loop {
                let forwarded: f64 = services
                    .iter()
                    .map(|service| {
                        service
                            .metrics
                            .encode()
                            .lines()
                            .find(|l| l.starts_with("hourglass_ingress_messages_total") && l.contains("forwarded"))
                            .and_then(|l| l.rsplit(' ').next())
                            .and_then(|v| v.parse::<f64>().ok())
                            .unwrap_or(0.0)
                    })
                    .sum();
                done.store(forwarded as usize, Ordering::Relaxed);
                // Encoding every metric is not free: often enough to time a drain of seconds.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let rate = rate(&done).await;
    counter.abort();
    phase("hourglass drained; stopping it");
    if std::env::var("BENCH_DEBUG").is_ok() {
        for line in services[0].metrics.encode().lines().filter(|l| (l.contains("_sum") || l.contains("_count")) && l.contains("seconds")) {
            eprintln!("{line}");
        }
    }
    for served in all {
        served.stop().await;
    }
    (rate, config)
}

/// `BENCH_DEBUG`: where the run stands, on stderr (with `BENCH_LOG`, the host's log beside it).
fn phase(what: &str) {
    if std::env::var("BENCH_DEBUG").is_ok() {
        eprintln!("{} {what}", support::now_ms());
    }
}

/// The `BCC` header carrying a plan's extra routing keys, as hourglass sends it.
fn bcc_header(keys: &[String]) -> Option<FieldTable> {
    use lapin::types::{AMQPValue, FieldArray, ShortString};
    if keys.is_empty() {
        return None;
    }
    let mut headers = FieldTable::default();
    let keys: Vec<AMQPValue> = keys.iter().map(|key| AMQPValue::LongString(key.as_str().into())).collect();
    headers.insert(ShortString::from("BCC"), AMQPValue::FieldArray(FieldArray::from(keys)));
    Some(headers)
}

/// A table cell: rate (CPU µs per message, bench process / broker; context switches per message).
fn cell(d: Drain) -> String {
    format!("{:.0} ({:.0} / {:.0}; {:.1} cs)", d.rate, d.own_cpu_us, d.broker_cpu_us, d.switches)
}

/// The baseline: preloads a queue, relays it into a queue of `queue_type`, deletes both.
async fn relay_into_queue(url: &str, channel: &lapin::Channel, prefix: &str, destination: &str, queue_type: &str, prefetch: u16) -> Drain {
    let (source, target) = (format!("{prefix}.raw-in"), format!("{prefix}.raw-out"));
    declare_queue(channel, &source, false).await;
    declare_queue(channel, &target, queue_type == "quorum").await;
    preload(channel, &source, destination).await;
    let drain = raw_relay(url, &source, ("", &target), prefetch, None).await;
    for queue in [&source, &target] {
        channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await.ok();
    }
    drain
}

/// The median over rounds of `ours / baseline`, each taken within its round.
fn median_ratio(ours: &[Drain], baseline: &[Drain]) -> f64 {
    let mut ratios: Vec<f64> = ours.iter().zip(baseline).map(|(ours, base)| ours.rate / base.rate).collect();
    ratios.sort_by(f64::total_cmp);
    ratios[ratios.len() / 2]
}

/// The median round by rate.
fn median(mut drains: Vec<Drain>) -> Drain {
    drains.sort_by(|a, b| a.rate.total_cmp(&b.rate));
    drains[drains.len() / 2]
}

#[tokio::main]
async fn main() {
    let url = amqp_url(None, None);
    let connection = Connection::connect(&url, ConnectionProperties::default()).await.expect("RabbitMQ");
    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    // `BENCH_PROFILE=1` leaves the baselines out, so a profiler sees hourglass alone.
    let profiling = std::env::var("BENCH_PROFILE").is_ok();
    let prefetches: Vec<u16> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let prefetches = if prefetches.is_empty() { vec![64, 1_000] } else { prefetches };
    println!(
        "{MESSAGES} persistent 100-byte messages preloaded; binary-levels, 1 h delays; {ROUNDS} rounds, the relay into a queue before hourglass in even rounds and after it in odd ones"
    );
    println!(
        "cells: the median round's msg/s, CPU per message in µs (bench process / broker) and the bench process's context switches per message; ratios: the median of each round's own ratio"
    );
    println!("| levels | routing | prefetch | raw relay → queue | raw relay → first level | hourglass | ratio to → queue | ratio to → level |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for (queue_type, routing) in support::level_variants(["classic", "quorum"]) {
        for &prefetch in &prefetches {
            let (mut raw, mut into_levels, mut ours) = (Vec::new(), Vec::new(), Vec::new());
            for round in 0..ROUNDS {
                let prefix = format!("bench-ingress-{}", support::run_id());
                let destination = format!("{prefix}.destination");
                declare_queue(&channel, &destination, false).await;
                // Odd rounds run the relay into a queue after hourglass, so a broker that
                // speeds up or slows down over the run favours neither.
                let relay_first = round % 2 == 0;
                phase(&format!("round {round}: {queue_type} prefetch {prefetch}"));
                if relay_first && !profiling {
                    raw.push(relay_into_queue(&url, &channel, &prefix, &destination, queue_type, prefetch).await);
                }

                let source = format!("{prefix}.in");
                declare_queue(&channel, &source, false).await;
                preload(&channel, &source, &destination).await;
                phase("hourglass");
                let (rate, config) = hourglass_ingress(&url, &source, &prefix, (queue_type, routing), prefetch).await;
                ours.push(rate);
                // The same relay again, publishing where hourglass's first hop goes (its
                // topology is still declared): what the levels cost the broker.
                let mut strategies = hourglass::scheduler::strategies::Strategies::load(&config).unwrap();
                let request =
                    hourglass::planner::PlanRequest { destination: destination.clone(), delay_ms: 3_600_000, message_id: "bench".into(), routing_key: None };
                let plan = strategies.get_mut("main").unwrap().plan(&request).unwrap();
                let Some(hourglass::command::Command::Amqp(hourglass::command::AmqpCommand::Publish { exchange, routing_key, bcc, .. })) =
                    plan.commands.first()
                else {
                    panic!("a publish first")
                };
                let again = format!("{source}.again");
                phase("relay into the first level");
                if !profiling {
                    declare_queue(&channel, &again, false).await;
                    preload(&channel, &again, &destination).await;
                    into_levels.push(raw_relay(&url, &again, (exchange, routing_key), prefetch, bcc_header(bcc)).await);
                    channel.queue_delete(again.as_str().into(), QueueDeleteOptions::default()).await.ok();
                }
                if !relay_first && !profiling {
                    raw.push(relay_into_queue(&url, &channel, &prefix, &destination, queue_type, prefetch).await);
                }
                phase("clean-up");
                // A fresh channel: a refused delete closes the channel it was sent on.
                let cleanup = connection.create_channel().await.unwrap();
                for queue in [source.clone(), format!("{source}.invalid"), destination] {
                    if let Err(err) = cleanup.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await {
                        eprintln!("could not delete {queue}: {err}");
                    }
                }
                support::delete_topology(&connection.create_channel().await.unwrap(), &config).await;
            }
            if raw.is_empty() {
                let ours = median(ours);
                println!("| {queue_type} | {routing} | {prefetch} | — | — | {} | — | — |", cell(ours));
                continue;
            }
            // Each ratio within its round, then the median: the broker's pace moves between rounds.
            let to_queue = median_ratio(&ours, &raw);
            let to_level = median_ratio(&ours, &into_levels);
            let (raw, into_levels, ours) = (median(raw), median(into_levels), median(ours));
            println!(
                "| {queue_type} | {routing} | {prefetch} | {} | {} | {} | {:.0} % | {:.0} % |",
                cell(raw),
                cell(into_levels),
                cell(ours),
                100.0 * to_queue,
                100.0 * to_level,
            );
        }
    }
    connection.close(200, "done".into()).await.ok();
}
