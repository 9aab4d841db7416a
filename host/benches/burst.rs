//! A burst through the AMQP ingress: how late do messages arrive, measured
//! from the moment the producer sent each one? Needs RabbitMQ on
//! $HOURGLASS_AMQP_URL (default guest on 127.0.0.1:5672).
//! Run: `cargo bench -p hourglass --bench burst [MESSAGES]`; `BENCH_LEVELS` (quorum or classic) and
//! `BENCH_ROUTING` (topic or direct) pick one of each. Every variant runs twice: published to the
//! ingress queue with hourglass's headers, and published to a delayed exchange with `x-delay` (the
//! delayed-message plugin's way), fanned out through its `deliver_to`; `BENCH_PATH` (queue or
//! exchange) picks one. Method: BENCHMARKS.md ("Ingress burst").

mod support;

use hourglass::config::Config;
use hourglass::config::broker::amqp_url;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueBindOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use support::{Served, collect_lateness, declare_queue, ingress_config_text, now_ms, percentile, publish_to_ingress_through};

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

/// `BENCH_CONFIG=<file>` (e.g. `examples/rabbitmq.toml`): that config as a
/// deployment would run it, its names made this run's own (ingress and
/// invalid queues, every strategy's `prefix`, the release queues, the canary's
/// queue) so nothing of anyone else's on the broker is touched. Strategies
/// with an interop `preset` are left out: NServiceBus's and Celery's names
/// are fixed. `BENCH_STRATEGY` names the strategy the burst goes through
/// (its `hourglass-strategy` header; the config's default when unset).
fn example_config(file: &str, url: &str, run: &str, ingress: &str) -> Config {
    let text = std::fs::read_to_string(file).unwrap_or_else(|err| panic!("{file}: {err}"));
    let mut table: toml::Table = text.parse().unwrap_or_else(|err| panic!("{file}: {err}"));
    let section = |table: &mut toml::Table, key: &str| -> toml::Table {
        match table.remove(key) {
            Some(toml::Value::Table(inner)) => inner,
            _ => toml::Table::new(),
        }
    };
    let mut broker = section(&mut table, "broker");
    broker.remove("url_env");
    broker.insert("url".into(), url.into());
    table.insert("broker".into(), broker.into());
    let mut service = section(&mut table, "service");
    let mut ingress_table = section(&mut service, "ingress");
    ingress_table.insert("queue".into(), ingress.into());
    ingress_table.insert("invalid_queue".into(), format!("{ingress}.invalid").into());
    service.insert("ingress".into(), ingress_table.into());
    let mut canary = section(&mut service, "canary");
    canary.insert("queue".into(), format!("bench-burst-{run}.canary").into());
    service.insert("canary".into(), canary.into());
    let mut cancel = section(&mut service, "cancel");
    cancel.insert("release_prefix".into(), format!("bench-burst-{run}.release").into());
    service.insert("cancel".into(), cancel.into());
    table.insert("service".into(), service.into());
    let mut strategies = section(&mut table, "strategies");
    strategies.retain(|_, strategy| strategy.get("preset").is_none());
    for (name, strategy) in strategies.iter_mut() {
        if let Some(strategy) = strategy.as_table_mut() {
            strategy.insert("prefix".into(), format!("bench-burst-{run}-{name}").into());
        }
    }
    table.insert("strategies".into(), strategies.into());
    Config::parse(std::path::Path::new(file), table.to_string()).expect("the example config, renamed")
}

async fn burst(connection: &Connection, url: &str, (queue_type, routing): (&str, &str), path: Path, messages: usize) {
    let run = support::run_id();
    let (ingress, destination) = (format!("bench-burst-{run}.in"), format!("bench-burst-{run}.destination"));
    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    let example = std::env::var("BENCH_CONFIG").ok();
    // With an example config the host declares its ingress queue as that config says.
    let own = if example.is_some() { vec![&destination] } else { vec![&ingress, &destination] };
    for queue in own {
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
    let config = match &example {
        Some(file) => {
            let mut config = example_config(file, url, &run, &ingress);
            if let Some(n) = std::env::var("BENCH_PREFETCH").ok().and_then(|n| n.parse().ok()) {
                config.service.ingress.prefetch = n;
            }
            config
        }
        None => {
            let text = ingress_config_text(url, &format!("bench-burst-{run}"), &ingress, &strategy, "") + &prefetch + &exchanges;
            Config::parse(std::path::Path::new("bench.toml"), text).expect("bench config")
        }
    };
    let strategy = std::env::var("BENCH_STRATEGY").ok();
    let served = Served::start(config.clone()).await;
    // The consumers' side of a delayed exchange: their queue bound to `deliver_to`, which the host declared.
    if example.is_none() {
        channel.queue_bind(destination.as_str().into(), orders.as_str().into(), "#".into(), QueueBindOptions::default(), FieldTable::default()).await.unwrap();
    }
    // Each body is its due time (the send time plus the delay): lateness is measured from the producer's send.
    let arrivals = collect_lateness(connection.create_channel().await.unwrap(), &destination, messages);

    let started = now_ms();
    let mut confirms = Vec::with_capacity(messages);
    for i in 0..messages {
        let delay = DELAYS_MS.start + (i as u64 * 7_919) % (DELAYS_MS.end - DELAYS_MS.start);
        let due = (now_ms() + delay).to_string();
        confirms.push(match path {
            Path::Queue => publish_to_ingress_through(&channel, &ingress, &destination, strategy.as_deref(), delay, due.as_bytes()).await,
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

/// The baseline of a burst: the same burst published to a queue of the
/// ingress's type and relayed by a plain lapin client at the same prefetch
/// (consume, publish persistent and mandatory with a confirm into a queue of
/// `target_type`, ack once confirmed), with no delay: how late the broker
/// itself lets a burst through that path. Lateness from the send; p50, p99.
async fn relay_burst(connection: &Connection, url: &str, (ingress_type, target_type): (&str, &str), prefetch: u16, messages: usize) -> (i64, i64, u64) {
    use futures_util::StreamExt;
    use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
    let run = support::run_id();
    let (source, target) = (format!("bench-burst-{run}.relay-in"), format!("bench-burst-{run}.relay-out"));
    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    declare_queue(&channel, &source, ingress_type == "quorum").await;
    declare_queue(&channel, &target, target_type == "quorum").await;
    let arrivals = collect_lateness(connection.create_channel().await.unwrap(), &target, messages);
    let relay_connection = Connection::connect(url, ConnectionProperties::default()).await.expect("RabbitMQ");
    let consuming = relay_connection.create_channel().await.unwrap();
    let publishing = relay_connection.create_channel().await.unwrap();
    publishing.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    consuming.basic_qos(prefetch, BasicQosOptions::default()).await.unwrap();
    let consumer = consuming.basic_consume(source.as_str().into(), "bench-relay".into(), BasicConsumeOptions::default(), FieldTable::default()).await.unwrap();
    let target_name: std::sync::Arc<str> = target.as_str().into();
    let relay = tokio::spawn(consumer.for_each_concurrent(prefetch as usize, move |delivery| {
        let (publishing, target) = (publishing.clone(), target_name.clone());
        async move {
            let Ok(delivery) = delivery else { return };
            let options = BasicPublishOptions { mandatory: true, ..Default::default() };
            let properties = delivery.properties.clone().with_delivery_mode(2);
            let confirm = publishing.basic_publish("".into(), (&*target).into(), options, &delivery.data, properties).await.expect("publish");
            assert!(confirm.await.expect("confirm").is_ack());
            delivery.acker.ack(BasicAckOptions::default()).await.expect("ack");
        }
    }));
    let started = now_ms();
    let mut confirms = Vec::with_capacity(messages);
    for _ in 0..messages {
        // No delay: the body is the send time, so lateness is the time from the send.
        let sent = now_ms().to_string();
        let properties = BasicProperties::default().with_delivery_mode(2);
        confirms.push(channel.basic_publish("".into(), source.as_str().into(), BasicPublishOptions::default(), sent.as_bytes(), properties).await.unwrap());
    }
    for confirm in confirms {
        confirm.await.expect("confirm");
    }
    let sent_in = now_ms() - started;
    let lateness = arrivals.await.unwrap().from_send;
    assert_eq!(lateness.len(), messages, "the relay lost messages");
    relay.abort();
    tokio::time::timeout(std::time::Duration::from_secs(5), relay_connection.close(200, "done".into())).await.ok();
    for queue in [&source, &target] {
        channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await.ok();
    }
    (percentile(&lateness, 0.5), percentile(&lateness, 0.99), sent_in)
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
    if let Ok(file) = std::env::var("BENCH_CONFIG") {
        // The config decides levels and routing; its strategies have no delayed exchange.
        // `BENCH_ROUNDS` pairs (default 3), the relay first in even rounds and after hourglass in odd ones.
        let rounds: usize = std::env::var("BENCH_ROUNDS").ok().and_then(|n| n.parse().ok()).unwrap_or(3);
        let config = example_config(&file, &url, "probe", "probe");
        let prefetch = std::env::var("BENCH_PREFETCH").ok().and_then(|n| n.parse().ok()).unwrap_or(config.service.ingress.prefetch);
        let ingress_type = format!("{:?}", config.service.queue_type).to_lowercase();
        let relay = async || {
            let (p50, p99, sent_in) = relay_burst(&connection, &url, (&ingress_type, "quorum"), prefetch, messages).await;
            println!(
                "| raw relay → {ingress_type} queue → quorum queue, prefetch {prefetch} | | | {messages} | {sent_in} ms | {messages} | 0 | {p50} ms | {p99} ms | | | |"
            );
        };
        for round in 0..rounds {
            if round % 2 == 0 {
                relay().await;
            }
            burst(&connection, &url, (&file, "as configured"), Path::Queue, messages).await;
            if round % 2 == 1 {
                relay().await;
            }
        }
        return;
    }
    for variant in support::level_variants(["quorum", "classic"]) {
        for path in &paths {
            burst(&connection, &url, variant, *path, messages).await;
        }
    }
}
