//! The brokers hourglass runs on, and the one place that tells them apart.
//!
//! [`BrokerConfig`] is `[broker]`: each kind and its settings. [`Capabilities`]
//! says what a kind can do, which is all `delay.toml`'s parsing asks when it checks
//! a strategy, a delayed exchange or a redelivery entry. A config also asks
//! here how its broker names and declares hourglass's release queues, and
//! [`connect`] opens its [`Broker`], which hands each [`Executor`] call to the
//! broker's own executor. Every match on the kind in this file is exhaustive,
//! so a new kind is refused by the compiler until each one answers for it.
//!
//! `broker` re-exports what the rest of the host uses. What still matches on the kind elsewhere: the serving side
//! (`service::broker_side`) and the CLI commands that run on one broker only
//! (`verify`, `migrate`, `transfer`, `parked`, `inspect`, `pump`, `cancel`).

use std::sync::Arc;

use hourglass_planner_sdk::DurationMs;
use serde::Deserialize;

use super::memory::{Delivered, MemoryExecutor};
use super::nats::{self, NatsExecutor};
use super::rabbitmq::{self, DEFAULT_URL, RabbitMqExecutor};
use super::sqs::{self, SqsExecutor};
use super::{Envelope, Executor, ExecutorError};
use crate::command::Command;
use crate::environment::environment_text;
use crate::planner::BrokerFamily;

/// The most `broker.publish_channels` may be: well under RabbitMQ's default `channel_max` (2,047).
pub const MAX_PUBLISH_CHANNELS: usize = 1_024;

/// The most `broker.send_batch_window` may be: every first send can wait this long.
pub const MAX_SEND_BATCH_WINDOW_MS: u64 = 1_000;

/// The environment variable that overrides the AMQP URL unless `url_env` names another.
pub(crate) const AMQP_URL_ENV: &str = "HOURGLASS_AMQP_URL";

/// `[broker]`: which broker, and its settings.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum BrokerConfig {
    /// The embedded in-memory broker (the simulator).
    #[default]
    Memory,
    Rabbitmq {
        /// `amqp://` or `amqps://` URL; `url_env` names a variable that overrides it.
        url: Option<String>,
        url_env: Option<String>,
        /// The management HTTP API, for `verify` (default: the AMQP host on port 15672).
        management_url: Option<String>,
        /// Confirm-mode channels for publishes, each carrying a batch of
        /// publishes at a time: 1 to [`MAX_PUBLISH_CHANNELS`] (default 16, the executor's).
        publish_channels: Option<usize>,
    },
    Sqs {
        region: Option<String>,
        endpoint_url: Option<String>,
        /// How long a first send waits for others to the same queue to share
        /// one `SendMessageBatch` (default 2ms; `0ms`: only those already
        /// waiting; at most [`MAX_SEND_BATCH_WINDOW_MS`]).
        send_batch_window: Option<DurationMs>,
    },
    Nats {
        /// `nats://` URL (several, comma-separated, for a cluster); `url_env`
        /// names a variable that overrides it (default `HOURGLASS_NATS_URL`).
        url: Option<String>,
        url_env: Option<String>,
        /// Replicas of the streams hourglass creates: 1 on one server, 3 in a cluster (default 1).
        replicas: Option<usize>,
        /// The stream the server's clock is read through (default `hourglass-clock`; memory, one message).
        clock_stream: Option<String>,
    },
}

/// The most `broker.replicas` may be: JetStream's own limit.
pub const MAX_NATS_REPLICAS: usize = 5;

/// What a kind of broker can do, for the checks that refuse a config asking more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// What keeps cancellations, for people (`cancellable = true`); `None`: nothing can be cancelled.
    pub cancellation_log: Option<&'static str>,
    /// Delayed exchanges (`[exchanges."name"]`) and due times to an exchange.
    pub exchanges: bool,
    /// `[[redelivery]]`: consumers reject messages to a dead-letter exchange.
    pub redelivery: bool,
    /// The commands a strategy's planner must write here; `None`: any (the simulator runs every family).
    pub family: Option<BrokerFamily>,
    /// A cancellable strategy needs this built-in planner (its release step is the broker's own), if any.
    pub cancellable_planner: Option<&'static str>,
    /// A cancellable strategy delivers through a release queue that asks the
    /// cancellation log before forwarding; without one, the broker's own hold
    /// asks it at hand-over (NATS).
    pub release_queue: bool,
}

/// A `[broker]` setting out of its bounds: the key and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct SettingError {
    /// The key under `[broker]`.
    pub key: &'static str,
    pub reason: String,
}

impl BrokerConfig {
    /// Every kind, as `[broker] kind` spells it, with what it can do.
    pub const KINDS: [(&'static str, Capabilities); 4] = [
        ("memory", Capabilities { cancellation_log: None, exchanges: false, redelivery: false, family: None, cancellable_planner: None, release_queue: false }),
        (
            "rabbitmq",
            Capabilities {
                cancellation_log: Some("a stream keeps cancellations"),
                exchanges: true,
                redelivery: true,
                family: Some(BrokerFamily::Amqp),
                cancellable_planner: None,
                release_queue: true,
            },
        ),
        (
            "sqs",
            Capabilities {
                cancellation_log: Some("a FIFO fates queue keeps cancellations"),
                exchanges: false,
                redelivery: false,
                family: Some(BrokerFamily::Sqs),
                // The release step is a standard queue reached with DelaySeconds: only an SQS planner plans to it.
                cancellable_planner: Some(crate::planner::builtin::SQS_CYCLES),
                release_queue: true,
            },
        ),
        (
            "nats",
            Capabilities {
                cancellation_log: Some("a KV bucket keeps cancellations"),
                exchanges: false,
                redelivery: false,
                family: Some(BrokerFamily::Nats),
                // The held stream asks the bucket at hand-over: only the planner that holds there can be cancelled.
                cancellable_planner: Some(crate::planner::builtin::NATS_HOLD),
                release_queue: false,
            },
        ),
    ];

    fn index(&self) -> usize {
        match self {
            BrokerConfig::Memory => 0,
            BrokerConfig::Rabbitmq { .. } => 1,
            BrokerConfig::Sqs { .. } => 2,
            BrokerConfig::Nats { .. } => 3,
        }
    }

    /// The kind as `[broker] kind` spells it.
    pub fn kind(&self) -> &'static str {
        Self::KINDS[self.index()].0
    }

    pub fn capabilities(&self) -> Capabilities {
        Self::KINDS[self.index()].1
    }

    /// `broker.kind = "a" (why) or "b" (why)`: the kinds that have what `has`
    /// picks, with what `why` says of each, for a message refusing a config.
    pub fn kinds_that(has: impl Fn(&Capabilities) -> Option<&'static str>) -> String {
        let kinds: Vec<String> = Self::KINDS
            .iter()
            .filter_map(|(kind, capabilities)| has(capabilities).map(|why| if why.is_empty() { format!("{kind:?}") } else { format!("{kind:?} ({why})") }))
            .collect();
        format!("broker.kind = {}", kinds.join(" or "))
    }

    /// Settings out of their bounds, naming the key.
    pub fn check(&self) -> Result<(), SettingError> {
        match self {
            BrokerConfig::Memory => Ok(()),
            BrokerConfig::Rabbitmq { publish_channels, .. } => match publish_channels {
                Some(channels) if !(1..=MAX_PUBLISH_CHANNELS).contains(channels) => {
                    Err(SettingError { key: "publish_channels", reason: format!("{channels} is not between 1 and {MAX_PUBLISH_CHANNELS}") })
                }
                _ => Ok(()),
            },
            BrokerConfig::Sqs { send_batch_window, .. } => match send_batch_window {
                Some(window) if window.ms() > MAX_SEND_BATCH_WINDOW_MS => Err(SettingError {
                    key: "send_batch_window",
                    reason: format!("{} ms is above {MAX_SEND_BATCH_WINDOW_MS} ms; every first send may wait this long", window.ms()),
                }),
                _ => Ok(()),
            },
            BrokerConfig::Nats { replicas, .. } => match replicas {
                Some(replicas) if !(1..=MAX_NATS_REPLICAS).contains(replicas) => {
                    Err(SettingError { key: "replicas", reason: format!("{replicas} is not between 1 and {MAX_NATS_REPLICAS}") })
                }
                _ => Ok(()),
            },
        }
    }

    /// A release queue named `name` (`<release_prefix>.<strategy>`) as this broker takes names.
    pub fn release_queue_name(&self, name: String) -> String {
        match self {
            BrokerConfig::Memory | BrokerConfig::Rabbitmq { .. } => name,
            BrokerConfig::Sqs { .. } => sqs::safe_name(&name),
            BrokerConfig::Nats { .. } => nats::release_subject(&name),
        }
    }

    /// The declaration of the release queue `name` (or of its `.parked` queue)
    /// on this broker; the simulator takes RabbitMQ's.
    pub fn release_queue_declaration(&self, name: &str) -> Command {
        match self {
            BrokerConfig::Memory | BrokerConfig::Rabbitmq { .. } => rabbitmq::release_queue_declaration(name),
            BrokerConfig::Sqs { .. } => sqs::release_queue_declaration(name),
            BrokerConfig::Nats { .. } => nats::release_stream_declaration(name),
        }
    }

    /// How long a first send waits for others to share one batch, where sends are batched.
    pub fn send_batch_window(&self) -> Option<DurationMs> {
        match self {
            BrokerConfig::Memory | BrokerConfig::Rabbitmq { .. } | BrokerConfig::Nats { .. } => None,
            BrokerConfig::Sqs { send_batch_window, .. } => *send_batch_window,
        }
    }
}

/// A RabbitMQ broker's settings as the work that runs only there takes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RabbitMqSettings {
    /// The AMQP URL, the environment's override taken ([`amqp_url`]).
    pub url: String,
    /// `broker.management_url`, as configured.
    pub management_url: Option<String>,
    pub publish_channels: Option<usize>,
}

/// An SQS broker's settings as the work that runs only there takes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqsSettings {
    pub region: Option<String>,
    pub endpoint_url: Option<String>,
    pub send_batch_window: Option<DurationMs>,
}

impl BrokerConfig {
    /// The settings, when this is RabbitMQ: for what runs on RabbitMQ only (`verify`, `transfer`, …).
    pub fn rabbitmq(&self) -> Option<RabbitMqSettings> {
        match self {
            BrokerConfig::Rabbitmq { url, url_env, management_url, publish_channels } => Some(RabbitMqSettings {
                url: amqp_url(url.as_deref(), url_env.as_deref()),
                management_url: management_url.clone(),
                publish_channels: *publish_channels,
            }),
            BrokerConfig::Memory | BrokerConfig::Sqs { .. } | BrokerConfig::Nats { .. } => None,
        }
    }

    /// The settings, when this is SQS: for what runs on SQS only (`pump`, the fates queue).
    pub fn sqs(&self) -> Option<SqsSettings> {
        match self {
            BrokerConfig::Sqs { region, endpoint_url, send_batch_window } => {
                Some(SqsSettings { region: region.clone(), endpoint_url: endpoint_url.clone(), send_batch_window: *send_batch_window })
            }
            BrokerConfig::Memory | BrokerConfig::Rabbitmq { .. } | BrokerConfig::Nats { .. } => None,
        }
    }

    /// The settings, when this is NATS: for what runs on NATS only (its held streams).
    pub fn nats(&self) -> Option<NatsSettings> {
        match self {
            BrokerConfig::Nats { url, url_env, replicas, clock_stream } => Some(NatsSettings {
                url: nats_url(url.as_deref(), url_env.as_deref()),
                replicas: replicas.unwrap_or(1),
                clock_stream: clock_stream.clone().unwrap_or_else(|| "hourglass-clock".to_string()),
            }),
            BrokerConfig::Memory | BrokerConfig::Rabbitmq { .. } | BrokerConfig::Sqs { .. } => None,
        }
    }
}

/// A NATS server's settings as the work that runs only there takes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NatsSettings {
    /// The URL, the environment's override taken.
    pub url: String,
    pub replicas: usize,
    /// `broker.clock_stream`.
    pub clock_stream: String,
}

/// The NATS URL: the environment variable (`url_env`, default
/// `HOURGLASS_NATS_URL`), else `url`, else the local server.
pub fn nats_url(url: Option<&str>, url_env: Option<&str>) -> String {
    let variable = url_env.unwrap_or(nats::URL_ENV);
    environment_text(variable).or_else(|| url.map(str::to_string)).unwrap_or_else(|| nats::DEFAULT_URL.to_string())
}

/// The AMQP URL: the environment variable (`url_env`, default
/// `HOURGLASS_AMQP_URL`), else `url`, else guest on localhost.
pub fn amqp_url(url: Option<&str>, url_env: Option<&str>) -> String {
    let variable = url_env.unwrap_or(AMQP_URL_ENV);
    environment_text(variable).or_else(|| url.map(str::to_string)).unwrap_or_else(|| DEFAULT_URL.to_string())
}

/// Any configured broker, as one executor.
// One per process, never moved around: boxing the large variant buys nothing.
#[allow(clippy::large_enum_variant)]
pub enum Broker {
    /// Shared with the wall clock the service runs for it.
    Memory(Arc<MemoryExecutor>),
    /// Shared with the service's consumers, which set messages aside through it.
    RabbitMq(Arc<RabbitMqExecutor>),
    /// Shared with the service's pumps, receivers and fates queue.
    Sqs(Arc<SqsExecutor>),
    /// Shared with the service's held-stream consumers.
    Nats(Arc<NatsExecutor>),
}

impl From<Arc<NatsExecutor>> for Broker {
    fn from(executor: Arc<NatsExecutor>) -> Broker {
        Broker::Nats(executor)
    }
}

impl From<Arc<MemoryExecutor>> for Broker {
    fn from(executor: Arc<MemoryExecutor>) -> Broker {
        Broker::Memory(executor)
    }
}

impl From<Arc<RabbitMqExecutor>> for Broker {
    fn from(executor: Arc<RabbitMqExecutor>) -> Broker {
        Broker::RabbitMq(executor)
    }
}

impl From<Arc<SqsExecutor>> for Broker {
    fn from(executor: Arc<SqsExecutor>) -> Broker {
        Broker::Sqs(executor)
    }
}

/// Opens the broker `config` names.
pub async fn connect(config: &BrokerConfig) -> Result<Broker, ExecutorError> {
    match config {
        BrokerConfig::Memory => Ok(Arc::new(MemoryExecutor::default()).into()),
        BrokerConfig::Rabbitmq { url, url_env, publish_channels, .. } => Ok(connect_rabbitmq(url, url_env, *publish_channels).await?.into()),
        BrokerConfig::Sqs { region, endpoint_url, send_batch_window } => Ok(connect_sqs(region, endpoint_url, *send_batch_window).await?.into()),
        BrokerConfig::Nats { .. } => Ok(connect_nats(config).await?.into()),
    }
}

/// Opens the NATS server a `broker.kind = "nats"` config names (`None` for another kind).
pub async fn connect_nats(config: &BrokerConfig) -> Result<Arc<NatsExecutor>, ExecutorError> {
    let settings = config.nats().ok_or_else(|| ExecutorError::Refused(format!("broker.kind = {:?} is not NATS", config.kind())))?;
    Ok(Arc::new(NatsExecutor::connect(&settings.url, settings.replicas).await?))
}

/// Opens the RabbitMQ a `broker.kind = "rabbitmq"` config names.
pub(crate) async fn connect_rabbitmq(
    url: &Option<String>,
    url_env: &Option<String>,
    publish_channels: Option<usize>,
) -> Result<Arc<RabbitMqExecutor>, ExecutorError> {
    let url = amqp_url(url.as_deref(), url_env.as_deref());
    Ok(Arc::new(RabbitMqExecutor::connect_with(&url, publish_channels.unwrap_or(rabbitmq::DEFAULT_PUBLISH_CHANNELS)).await?))
}

/// Opens the SQS a `broker.kind = "sqs"` config names.
pub async fn connect_sqs(
    region: &Option<String>,
    endpoint_url: &Option<String>,
    send_batch_window: Option<DurationMs>,
) -> Result<Arc<SqsExecutor>, ExecutorError> {
    Ok(Arc::new(SqsExecutor::connect(region.as_deref(), endpoint_url.as_deref(), sqs::batcher::window(send_batch_window)).await?))
}

impl Broker {
    /// Where messages go, for people.
    pub fn describe(&self) -> String {
        match self {
            Broker::Memory(_) => "the in-memory broker".into(),
            Broker::RabbitMq(r) => format!("RabbitMQ at {}", r.url()),
            Broker::Sqs(_) => "SQS".into(),
            Broker::Nats(n) => format!("NATS JetStream at {}", n.url()),
        }
    }
}

/// `$call` on the executor inside a [`Broker`], whichever it is.
macro_rules! each_executor {
    ($broker:expr, $executor:ident => $call:expr) => {
        match $broker {
            Broker::Memory($executor) => $call,
            Broker::RabbitMq($executor) => $call,
            Broker::Sqs($executor) => $call,
            Broker::Nats($executor) => $call,
        }
    };
}

impl Executor for Broker {
    async fn is_ready(&self) -> bool {
        each_executor!(self, executor => executor.is_ready().await)
    }

    fn reconnects(&self) -> u64 {
        each_executor!(self, executor => executor.reconnects())
    }

    async fn queue_depth(&self, queue: &str) -> Option<u64> {
        each_executor!(self, executor => executor.queue_depth(queue).await)
    }

    async fn mark_pumped(&self, queue: &str, strategy: &str) -> Result<(), ExecutorError> {
        each_executor!(self, executor => executor.mark_pumped(queue, strategy).await)
    }

    fn delivered(&self, destination: &str) -> Option<Vec<Delivered>> {
        each_executor!(self, executor => executor.delivered(destination))
    }

    fn outlives_the_process(&self) -> bool {
        each_executor!(self, executor => executor.outlives_the_process())
    }

    async fn apply(&self, commands: &[Command]) -> Result<(), ExecutorError> {
        each_executor!(self, executor => executor.apply(commands).await)
    }

    async fn check_destination(&self, destination: &str) -> Result<(), ExecutorError> {
        each_executor!(self, executor => executor.check_destination(destination).await)
    }

    async fn check_exchange(&self, exchange: &str) -> Result<(), ExecutorError> {
        each_executor!(self, executor => executor.check_exchange(exchange).await)
    }

    async fn send(&self, commands: &[Command], envelope: &Envelope) -> Result<(), ExecutorError> {
        match self {
            Broker::Memory(m) => m.send(commands, envelope).await,
            Broker::RabbitMq(r) => r.send(commands, envelope).await,
            // Boxed: the SDK's request futures are large, and inline they would size every
            // RabbitMQ publish's future too (each request's is moved whole when spawned).
            Broker::Sqs(s) => Box::pin(s.send(commands, envelope)).await,
            Broker::Nats(n) => n.send(commands, envelope).await,
        }
    }
}
