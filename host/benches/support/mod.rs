//! What the RabbitMQ benches share: a `binary-levels` strategy and a
//! destination under names unique to the run, a scheduler ready to send to
//! it, and cleanup of everything declared.

use std::path::Path;

use hourglass::broker::{Broker, amqp_url};
use hourglass::command::Command;
use hourglass::config::Config;
use hourglass::scheduler::Scheduler;
use hourglass::scheduler::strategies::Strategies;
use lapin::options::{ExchangeDeleteOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;

pub struct BenchBroker {
    /// Kept open for the channel's sake.
    _connection: lapin::Connection,
    config: Config,
    channel: lapin::Channel,
    pub destination: String,
}

impl BenchBroker {
    /// Declares the destination; the scheduler (strategy `main`) has prepared it.
    pub async fn start() -> (BenchBroker, Scheduler<Broker>) {
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
        (BenchBroker { _connection: connection, config, channel, destination }, scheduler)
    }

    /// Deletes the strategy's topology and the destination.
    pub async fn cleanup(self) {
        delete_topology(&self.channel, &self.config).await;
        self.channel.queue_delete(self.destination.as_str().into(), QueueDeleteOptions::default()).await.ok();
    }
}

/// Deletes the queues and exchanges of strategy `main`'s static topology.
pub async fn delete_topology(channel: &lapin::Channel, config: &Config) {
    let mut strategies = Strategies::load(config).unwrap();
    for command in strategies.get_mut("main").unwrap().topology().unwrap() {
        match command {
            Command::DeclareQueue { name, .. } => drop(channel.queue_delete(name.as_str().into(), QueueDeleteOptions::default()).await),
            Command::DeclareExchange { name, .. } => drop(channel.exchange_delete(name.as_str().into(), ExchangeDeleteOptions::default()).await),
            _ => {}
        }
    }
}
