//! Helpers for the end-to-end tests: a real broker, unique names, a consumer
//! that records when each message arrived, and cleanup.
//!
//! A missing broker fails the tests with instructions; it never skips them.

mod amqp;
pub mod blackhole;
pub mod chaos;
mod cleanup;
pub mod cluster;
pub mod nats;
pub mod ports;
pub mod private_node;
pub mod process;
pub mod serve;
pub mod sqs;
pub mod throttle;
pub mod vhost;

pub use amqp::*;
pub use cleanup::Cleanup;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use hourglass::broker;
use hourglass::clock::unix_now_ms;
use hourglass::command::{AmqpCommand, Command};
use hourglass::config::Config;
use hourglass::executor::Broker;
use hourglass::scheduler::Scheduler;
use hourglass::scheduler::strategies::Strategies;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, ExchangeDeleteOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties};
use tokio::sync::mpsc;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The binary a workspace test build (`cargo nextest run --workspace`, `cargo test --workspace`) puts next to this test executable.
pub fn hourglass_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let binary = exe.parent().and_then(Path::parent).unwrap().join("hourglass");
    assert!(
        binary.exists(),
        "{} is missing: build the workspace's tests and binaries together, as `scripts/test` does (`cargo nextest run --workspace`)",
        binary.display()
    );
    binary
}

/// A test planner's component (`tests/planners/*`, `examples/backoff-planner`),
/// e.g. `misbehaving`, built on first use.
pub use hourglass_planner_build::test_planner;

/// How much later a message may arrive when a serving host decides its time
/// on the broker's clock: a `deliver_at`, a reschedule, a parked message sent
/// on at its due time. The host counts from the earliest the broker's clock
/// can read by the management API's `Date` header: up to 2 s before it at
/// the first reading (the header names a whole second, and RabbitMQ renews it
/// once a second), less as more readings come in and are taken in
/// (RELIABILITY.md, "Clocks"). Measured here in tests that decide within
/// seconds of the host's start: 0.4–1.9 s (tests/tests/clock.rs prints it).
pub const CLOCK_ERROR_MS: u64 = 2_000;

pub fn amqp_url() -> String {
    std::env::var("HOURGLASS_TEST_AMQP_URL").unwrap_or_else(|_| hourglass::broker::rabbitmq::DEFAULT_URL.to_string())
}

/// A name no other test run uses.
pub fn unique(stem: &str) -> String {
    format!("e2e-{stem}-{}", &uuid::Uuid::new_v4().simple().to_string()[..10])
}

pub async fn connect() -> Connection {
    connect_to(&amqp_url()).await
}

/// A connection to the test broker at `url` (a private vhost, say).
pub async fn connect_to(url: &str) -> Connection {
    match Connection::connect(url, ConnectionProperties::default()).await {
        Ok(connection) => connection,
        Err(err) => panic!(
            "RabbitMQ is not reachable at {} ({err}). Start it with `rabbitmq-server -detached` \
             (scripts/test does this), or set HOURGLASS_TEST_AMQP_URL.",
            hourglass::broker::rabbitmq::redact(url)
        ),
    }
}

/// A config on the real broker with one strategy, `main`.
pub fn config(strategy_table: &str) -> Config {
    config_with(strategy_table, "")
}

/// The RabbitMQ config text with strategy `main` and more TOML after it.
pub fn config_text(strategy_table: &str, more: &str) -> String {
    config_text_on(&amqp_url(), strategy_table, more)
}

/// [`config_text`] on another broker URL (a [`vhost::PrivateVhost`]'s, say).
/// Unless `more` configures `[service.ingress]` or `[service.canary]`, they
/// are off: their default queues have fixed names (`hourglass.ingress`,
/// `hourglass-canary`), which a test must never declare or consume on a
/// shared broker.
///
/// On the test broker (any vhost of it) the `[broker]` table names its
/// management API (`management_url`), as a user's config would: the hosts a
/// test starts read the broker's clock and topology there, whichever broker
/// version is under test (`scripts/test --rabbitmq`).
///
/// Every strategy has a release queue on RabbitMQ (`<release_prefix>.<strategy>`):
/// unless `more` configures `[service.cancel]`, the release prefix is
/// `<the strategy's prefix>.release` (a random one without a `prefix` key),
/// so two tests never share one and [`topology_of`] names it for cleanup.
pub fn config_text_on(url: &str, strategy_table: &str, more: &str) -> String {
    let ingress = if more.contains("[service.ingress]") { "" } else { "\n[service.ingress]\nenabled = false\n" };
    let canary = if more.contains("[service.canary]") { "" } else { "\n[service.canary]\nenabled = false\n" };
    let release = if more.contains("[service.cancel]") {
        String::new()
    } else {
        let prefix = strategy_table.lines().find_map(|line| line.strip_prefix("prefix = \"")?.strip_suffix('"').map(str::to_string));
        format!("\n[service.cancel]\nrelease_prefix = \"{}\"\n", prefix.map_or_else(|| unique("release"), |p| format!("{p}.release")))
    };
    let management = if same_broker(url, &amqp_url()) { format!("management_url = \"{}\"\n", management_url()) } else { String::new() };
    format!("[broker]\nkind = \"rabbitmq\"\nurl = \"{url}\"\n{management}\n[strategies.main]\n{strategy_table}\n\n{more}\n{ingress}{canary}{release}")
}

/// Whether two AMQP URLs reach the same broker (host and port; any vhost).
pub(crate) fn same_broker(a: &str, b: &str) -> bool {
    let authority = |url: &str| url.split("://").nth(1).and_then(|rest| rest.split('/').next()).map(|at| at.rsplit('@').next().unwrap_or(at).to_string());
    authority(a) == authority(b)
}

/// Two `binary-levels` strategies for `hourglass transfer`: `classic` (the
/// default; classic levels under `classic_prefix`) and `quorum` (quorum levels
/// under `quorum_prefix`), parsed and written to a temp file named after
/// `file` (with a random suffix) for the binary to read.
pub fn classic_and_quorum_levels(classic_prefix: &str, quorum_prefix: &str, file: &str) -> (Config, PathBuf) {
    let text = format!(
        "default_strategy = \"classic\"\n{}",
        config_text(
            &format!("planner = \"binary-levels\"\nprefix = \"{quorum_prefix}\"\nunit = \"1s\""),
            &format!("[strategies.classic]\nplanner = \"binary-levels\"\nprefix = \"{classic_prefix}\"\nqueue_type = \"classic\"\n"),
        )
        .replace("[strategies.main]", "[strategies.quorum]")
    );
    let config = Config::parse(Path::new("transfer.toml"), text.clone()).expect("transfer config");
    let path = std::env::temp_dir().join(format!("{}.toml", unique(file)));
    std::fs::write(&path, &text).expect("write the transfer config");
    (config, path)
}

/// [`config`] with more TOML after the strategy.
pub fn config_with(strategy_table: &str, more: &str) -> Config {
    Config::parse(Path::new("e2e.toml"), config_text(strategy_table, more)).expect("test config")
}

/// Polls `check` every 100 ms until it holds, failing the test after `deadline`.
pub async fn until(what: &str, deadline: Duration, mut check: impl AsyncFnMut() -> bool) {
    let end = Instant::now() + deadline;
    while !check().await {
        assert!(Instant::now() < end, "{what} did not happen within {deadline:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn scheduler(config: &Config) -> Scheduler<Broker> {
    let strategies = Strategies::load(config).expect("strategies load");
    let broker = broker::connect(&config.broker).await.expect("connect to RabbitMQ");
    Scheduler::new(config, strategies, broker)
}

/// One received message and when it arrived (Unix ms).
pub struct Received {
    pub delivery: lapin::message::Delivery,
    pub at_ms: u64,
}

/// A destination queue with a consumer in its own task, so receive times are
/// not delayed by the test's own work.
pub struct Destination {
    pub name: String,
    channel: Channel,
    received: mpsc::UnboundedReceiver<Received>,
}

impl Destination {
    pub async fn declare(connection: &Connection, stem: &str) -> Destination {
        Destination::named(connection, &unique(stem)).await
    }

    /// A destination of this exact name (declared if missing), consumed.
    pub async fn named(connection: &Connection, name: &str) -> Destination {
        let channel = connection.create_channel().await.unwrap();
        let name = name.to_string();
        channel.queue_declare(name.as_str().into(), QueueDeclareOptions::default(), FieldTable::default()).await.unwrap();
        let mut consumer = channel.basic_consume(name.as_str().into(), "e2e".into(), BasicConsumeOptions::default(), FieldTable::default()).await.unwrap();
        let (sender, received) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(Ok(delivery)) = consumer.next().await {
                let at_ms = unix_now_ms();
                delivery.acker.ack(BasicAckOptions::default()).await.ok();
                if sender.send(Received { delivery, at_ms }).is_err() {
                    break;
                }
            }
        });
        Destination { name, channel, received }
    }

    /// Waits for `count` messages, failing after `deadline`.
    pub async fn receive(&mut self, count: usize, deadline: Duration) -> Vec<Received> {
        receive_within(&mut self.received, count, deadline, &self.name).await
    }

    /// The next message, as soon as it arrives.
    pub async fn next(&mut self) -> Option<Received> {
        self.received.recv().await
    }

    /// Nothing more arrives within `quiet`.
    pub async fn assert_quiet(&mut self, quiet: Duration) {
        if let Ok(Some(extra)) = tokio::time::timeout(quiet, self.received.recv()).await {
            panic!("unexpected message on {}: {:?}", self.name, extra.delivery.properties.message_id());
        }
    }

    pub async fn delete(self) {
        self.channel.queue_delete(self.name.as_str().into(), QueueDeleteOptions::default()).await.ok();
    }
}

/// Takes `count` items from a consumer's channel, failing the test after `deadline`.
pub async fn receive_within<T>(received: &mut mpsc::UnboundedReceiver<T>, count: usize, deadline: Duration, queue: &str) -> Vec<T> {
    let until = Instant::now() + deadline;
    let mut out = Vec::new();
    while out.len() < count {
        match tokio::time::timeout(until.saturating_duration_since(Instant::now()), received.recv()).await {
            Ok(Some(item)) => out.push(item),
            _ => panic!("{} of {count} messages reached {queue} within {deadline:?}", out.len()),
        }
    }
    out
}

/// Deletes every queue and exchange the commands declare.
pub async fn delete_declared(connection: &Connection, commands: &[Command]) {
    let channel = connection.create_channel().await.unwrap();
    for command in commands {
        match command {
            Command::Amqp(AmqpCommand::DeclareQueue { name, .. }) => {
                channel.queue_delete(name.as_str().into(), QueueDeleteOptions::default()).await.ok();
            }
            Command::Amqp(AmqpCommand::DeclareExchange { name, .. }) => {
                channel.exchange_delete(name.as_str().into(), ExchangeDeleteOptions::default()).await.ok();
            }
            _ => {}
        }
    }
}

/// The static topology a config's `main` strategy declares.
pub fn topology_of(config: &Config) -> Vec<Command> {
    topologies_of(config, &["main"])
}

/// The static topology the config's strategies `names` declare, one after
/// another, each followed by its release queue and that queue's `.parked`
/// (a serving host declares them for every strategy).
pub fn topologies_of(config: &Config, names: &[&str]) -> Vec<Command> {
    let mut strategies = Strategies::load(config).unwrap();
    let mut commands = Vec::new();
    for name in names {
        commands.extend(strategies.get_mut(name).unwrap().topology().unwrap());
        let release = config.service.cancel.release_queue(name);
        commands.push(hourglass::broker::rabbitmq::release_queue_declaration(&format!("{release}.parked")));
        commands.push(hourglass::broker::rabbitmq::release_queue_declaration(&release));
    }
    commands
}
