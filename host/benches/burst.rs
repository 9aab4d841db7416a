//! A burst through the AMQP ingress: how late do messages arrive, measured
//! from the moment the producer sent each one? Needs RabbitMQ on
//! $HOURGLASS_AMQP_URL (default guest on 127.0.0.1:5672).
//! Run: `cargo bench -p hourglass --bench burst [MESSAGES]`; `BENCH_LEVELS` (quorum or classic) and
//! `BENCH_ROUTING` (topic or direct) pick one of each. Every variant runs twice: published to the
//! ingress queue with hourglass's headers, and published to a delayed exchange with `x-delay` (the
//! delayed-message plugin's way), fanned out through its `deliver_to`; `BENCH_PATH` (queue or
//! exchange) picks one. Method: BENCHMARKS.md ("Ingress burst").

mod support;

use hourglass::broker::amqp_url;
use hourglass::config::Config;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueBindOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use support::{Served, collect_lateness, declare_queue, ingress_config_text, now_ms, percentile, publish_to_ingress};

/// Delays are spread over 1–3 s, as in the issue that asked for this figure.
const DELAYS_MS: std::ops::Range<u64> = 1_000..3_000;

/// How the producer hands hourglass the burst.
#[derive(Clone, Copy, PartialEq)]
enum Path {
    /// To the ingress queue with `hourglass-destination` and `hourglass-delay`.
    Queue,
    /// To a delayed exchange with `x-delay`; the destination is bound to its `deliver_to`.
    Exchange,
}

async fn burst(connection: &Connection, url: &str, (queue_type, routing): (&str, &str), path: Path, messages: usize) {
    let run = support::run_id();
    let (ingress, destination) = (format!("bench-burst-{run}.in"), format!("bench-burst-{run}.destination"));
    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    for queue in [&ingress, &destination] {
        declare_queue(&channel, queue, false).await;
    }
    // `BENCH_PREFETCH=N` sets the ingress's prefetch (the ingress table comes last, so it is appended).
    let prefetch = std::env::var("BENCH_PREFETCH").map(|n| format!("prefetch = {n}\n")).unwrap_or_default();
    // `BENCH_UNIT=100ms` sets binary-levels' unit (default 1 s: a delay rounds up to whole seconds).
    let unit = std::env::var("BENCH_UNIT").map(|u| format!("unit = \"{u}\"\n")).unwrap_or_default();
    // `BENCH_PRECISION=125ms` adds binary-levels' sub-levels below the unit (direct routing).
    let precision = std::env::var("BENCH_PRECISION").map(|p| format!("precision = \"{p}\"\n")).unwrap_or_default();
    let strategy = format!("queue_type = \"{queue_type}\"\nrouting = \"{routing}\"\n{unit}{precision}");
    let (delayed, orders) = (format!("bench-burst-{run}.delayed"), format!("bench-burst-{run}.orders"));
    let exchanges = format!("\n[exchanges.\"{delayed}\"]\ntype = \"topic\"\ndeliver_to = \"{orders}\"\n");
    let text = ingress_config_text(url, &format!("bench-burst-{run}"), &ingress, &strategy, "") + &prefetch + &exchanges;
    let config = Config::parse(std::path::Path::new("bench.toml"), text).expect("bench config");
    let served = Served::start(config.clone()).await;
    // The consumers' side of a delayed exchange: their queue bound to `deliver_to`, which the host declared.
    channel.queue_bind(destination.as_str().into(), orders.as_str().into(), "#".into(), QueueBindOptions::default(), FieldTable::default()).await.unwrap();
    // Each body is its due time (the send time plus the delay): lateness is measured from the producer's send.
    let arrivals = collect_lateness(connection.create_channel().await.unwrap(), &destination, messages);

    let started = now_ms();
    let mut confirms = Vec::with_capacity(messages);
    for i in 0..messages {
        let delay = DELAYS_MS.start + (i as u64 * 7_919) % (DELAYS_MS.end - DELAYS_MS.start);
        let due = (now_ms() + delay).to_string();
        confirms.push(match path {
            Path::Queue => publish_to_ingress(&channel, &ingress, &destination, delay, due.as_bytes()).await,
            Path::Exchange => {
                let headers = FieldTable::from(std::collections::BTreeMap::from([(ShortString::from("x-delay"), AMQPValue::LongLongInt(delay as i64))]));
                let properties = BasicProperties::default().with_delivery_mode(2).with_headers(headers);
                channel
                    .basic_publish(delayed.as_str().into(), "order.created".into(), BasicPublishOptions::default(), due.as_bytes(), properties)
                    .await
                    .unwrap()
            }
        });
    }
    for confirm in confirms {
        confirm.await.expect("confirm");
    }
    let sent_in = now_ms() - started;
    let support::Lateness { from_send: lateness, from_forward } = arrivals.await.unwrap();
    let arrived = lateness.len();
    let early = lateness.iter().filter(|&&ms| ms < 0).count();
    let via = if path == Path::Queue { "ingress queue" } else { "delayed exchange" };
    println!(
        "| {via} | {queue_type} | {routing} | {messages} | {sent_in} ms | {arrived} | {early} | {} ms | {} ms | {} ms | {} ms | {} ms |",
        percentile(&lateness, 0.5),
        percentile(&lateness, 0.99),
        lateness.last().unwrap(),
        percentile(&from_forward, 0.5),
        percentile(&from_forward, 0.99),
    );

    served.stop().await;
    for queue in [ingress.clone(), format!("{ingress}.invalid"), destination] {
        channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await.ok();
    }
    support::delete_topology(&connection.create_channel().await.unwrap(), &config).await;
}

#[tokio::main]
async fn main() {
    let url = amqp_url(None, None);
    let connection = Connection::connect(&url, ConnectionProperties::default()).await.expect("RabbitMQ");
    let messages = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(10_000);
    println!("{messages} messages published to the ingress as fast as one confirm-mode channel goes; delays 1–3 s; binary-levels");
    // The last two columns leave out the wait in the ingress: lateness from the due time hourglass stamped when it forwarded.
    println!("| published to | levels | routing | messages | producer sent all in | arrived | early | lateness p50 | p99 | max | from forward p50 | p99 |");
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let only = std::env::var("BENCH_PATH").ok();
    let paths = [("queue", Path::Queue), ("exchange", Path::Exchange)].into_iter().filter(|(name, _)| only.as_deref().is_none_or(|o| o == *name));
    let paths: Vec<Path> = paths.map(|(_, path)| path).collect();
    for variant in support::level_variants(["quorum", "classic"]) {
        for path in &paths {
            burst(&connection, &url, variant, *path, messages).await;
        }
    }
}
