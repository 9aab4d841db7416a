//! Scheduling throughput on a real RabbitMQ: one confirm at a time vs a window
//! of outstanding confirms. Needs RabbitMQ on $HOURGLASS_AMQP_URL (default
//! guest on 127.0.0.1:5672). Run: `cargo bench -p hourglass --bench rabbitmq`.
//! Method: BENCHMARKS.md.

use std::path::Path;
use std::time::Instant;

use hourglass::broker::{Broker, amqp_url};
use hourglass::command::Command;
use hourglass::config::Config;
use hourglass::scheduler::{ScheduleRequest, Scheduler};
use hourglass::strategy::Strategies;
use lapin::options::{ExchangeDeleteOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;

const MESSAGES: usize = 5_000;

#[tokio::main]
async fn main() {
    let url = amqp_url(None, None);
    let run = uuid::Uuid::new_v4().simple().to_string();
    let prefix = format!("bench-{}", &run[..8]);
    let text = format!("[broker]\nkind = \"rabbitmq\"\nurl = \"{url}\"\n[strategies.main]\nplanner = \"binary-levels\"\nprefix = \"{prefix}\"\n");
    let config = Config::parse(Path::new("bench.toml"), text).unwrap();
    let connection = lapin::Connection::connect(&url, lapin::ConnectionProperties::default()).await.expect("RabbitMQ");
    let channel = connection.create_channel().await.unwrap();
    let destination = format!("{prefix}.destination");
    channel.queue_declare(destination.as_str().into(), QueueDeclareOptions::default(), FieldTable::default()).await.unwrap();

    let strategies = Strategies::load(&config).unwrap();
    let broker = Broker::connect(&config.broker).await.unwrap();
    let scheduler = Scheduler::new(&config, strategies, broker);
    scheduler.prepare_destination("main", &destination).await.unwrap();
    let requests = || {
        (0..MESSAGES)
            .map(|i| ScheduleRequest {
                destination: destination.clone(),
                delay_ms: 3_600_000 + i as u64,
                body: vec![b'x'; 100],
                ..Default::default()
            })
            .collect::<Vec<_>>()
    };
    println!("{MESSAGES} persistent 100-byte messages, binary-levels, 1 h delays");
    for window in [1usize, 10, 100, 1_000] {
        let start = Instant::now();
        let results = scheduler.schedule_many(requests(), window).await;
        let elapsed = start.elapsed();
        assert!(results.iter().all(Result::is_ok));
        println!("  window {window:>5}: {:>8.0} msg/s", MESSAGES as f64 / elapsed.as_secs_f64());
    }

    let mut strategies = Strategies::load(&config).unwrap();
    for command in strategies.get_mut("main").unwrap().topology().unwrap() {
        match command {
            Command::DeclareQueue { name, .. } => drop(channel.queue_delete(name.as_str().into(), QueueDeleteOptions::default()).await),
            Command::DeclareExchange { name, .. } => drop(channel.exchange_delete(name.as_str().into(), ExchangeDeleteOptions::default()).await),
            _ => {}
        }
    }
    channel.queue_delete(destination.as_str().into(), QueueDeleteOptions::default()).await.ok();
}
