//! Brokers: where planned commands run.
//!
//! [`Executor`] is the neutral seam: declare what a plan needs, check a
//! destination, send one message through its planned commands and return once
//! the broker confirmed it. [`memory`] is the embedded in-memory broker;
//! [`rabbitmq`] and [`sqs`] are the real ones, and the only modules that speak
//! their client libraries. [`Broker`] is whichever one `delay.toml` names,
//! opened by [`connect`].

pub mod memory;
pub mod rabbitmq;
pub mod sqs;

use std::sync::Arc;

use thiserror::Error;

use crate::command::{Command, FieldTable};
use crate::config::BrokerConfig;
use crate::message::Properties;

pub use memory::{Delivered, MemoryExecutor};
use rabbitmq::{DEFAULT_URL, RabbitMqExecutor};
use sqs::SqsExecutor;

#[derive(Clone, Debug, Error)]
pub enum ExecutorError {
    #[error("broker refused: {0}")]
    Refused(String),
    /// The message cannot be put on this broker's wire (a name over a limit, say): its sender's mistake.
    #[error("invalid message: {0}")]
    Invalid(String),
    #[error("no route: {0}")]
    Unroutable(String),
    #[error("broker unavailable: {0}")]
    Unavailable(String),
}

/// A message on its way: identity, payload and the headers it carries.
#[derive(Clone, Debug, PartialEq)]
pub struct Envelope {
    pub id: String,
    pub body: Vec<u8>,
    /// The caller's headers plus hourglass's own.
    pub headers: FieldTable,
    /// The producer's properties (content type, correlation id, its typed headers, …), carried untouched.
    pub properties: Properties,
    /// Give a message without a message id this envelope's id (off for redeliveries, which keep properties as they were).
    pub stamp_message_id: bool,
}

/// Sends may run concurrently (`&self`), so a broker with publisher confirms
/// keeps a window of them outstanding instead of waiting for each in turn.
pub trait Executor {
    /// Declares objects (topology, destination setup). Idempotent.
    fn apply(&self, commands: &[Command]) -> impl Future<Output = Result<(), ExecutorError>> + Send;

    /// Fails unless the destination exists to receive messages.
    fn check_destination(&self, destination: &str) -> impl Future<Output = Result<(), ExecutorError>> + Send;

    /// Fails unless `exchange` exists to route messages (a destination by
    /// exchange). Brokers without exchanges refuse it, naming why.
    fn check_exchange(&self, exchange: &str) -> impl Future<Output = Result<(), ExecutorError>> + Send {
        async move { Err(ExecutorError::Refused(format!("exchange {exchange:?}: this broker has no exchanges; exchange destinations need RabbitMQ"))) }
    }

    /// Sends one message through its planned commands; returns once the broker
    /// has confirmed it.
    fn send(&self, commands: &[Command], envelope: &Envelope) -> impl Future<Output = Result<(), ExecutorError>> + Send;

    /// Whether the broker can take messages now.
    fn is_ready(&self) -> impl Future<Output = bool> + Send {
        async { true }
    }

    /// How many times a lost connection was opened again. What was declared
    /// before may be gone (a restarted broker, a deleted queue), so a caller
    /// that remembers its declarations starts over when this changes.
    fn reconnects(&self) -> u64 {
        0
    }

    /// Messages waiting in `queue`, when the broker can tell (for gauges).
    fn queue_depth(&self, _queue: &str) -> impl Future<Output = Option<u64>> + Send {
        async { None }
    }
    /// Marks `queue` as pumped by `strategy` on the broker itself, so any host
    /// finds and pumps it after a restart (brokers with pumped queues only).
    fn mark_pumped(&self, _queue: &str, _strategy: &str) -> impl Future<Output = Result<(), ExecutorError>> + Send {
        async { Ok(()) }
    }

    /// The newest deliveries to `destination`, on a broker that keeps them
    /// (the in-memory one, where a first-time user watches a delay happen);
    /// `None` on brokers whose destinations are consumed by someone else.
    fn delivered(&self, _destination: &str) -> Option<Vec<Delivered>> {
        None
    }

    /// Whether messages waiting on this broker outlive this process. Not on
    /// the in-memory broker: there, warnings about what a broker crash can
    /// lose say nothing.
    fn outlives_the_process(&self) -> bool {
        true
    }
}

/// The environment variable that overrides the AMQP URL unless `url_env` names another.
pub(crate) const AMQP_URL_ENV: &str = "HOURGLASS_AMQP_URL";

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

/// The AMQP URL: the environment variable (`url_env`, default
/// `HOURGLASS_AMQP_URL`), else `url`, else guest on localhost.
pub fn amqp_url(url: Option<&str>, url_env: Option<&str>) -> String {
    let variable = url_env.unwrap_or(AMQP_URL_ENV);
    crate::config::environment_text(variable).or_else(|| url.map(str::to_string)).unwrap_or_else(|| DEFAULT_URL.to_string())
}

/// Opens the broker `config` names.
pub async fn connect(config: &BrokerConfig) -> Result<Broker, ExecutorError> {
    match config {
        BrokerConfig::Memory => Ok(Arc::new(MemoryExecutor::default()).into()),
        BrokerConfig::Rabbitmq { url, url_env, publish_channels, .. } => Ok(connect_rabbitmq(url, url_env, *publish_channels).await?.into()),
        BrokerConfig::Sqs { region, endpoint_url, send_batch_window } => Ok(connect_sqs(region, endpoint_url, *send_batch_window).await?.into()),
    }
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
    send_batch_window: Option<hourglass_planner_sdk::DurationMs>,
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
        }
    }
}

impl Executor for Broker {
    async fn is_ready(&self) -> bool {
        match self {
            Broker::Memory(_) | Broker::Sqs(_) => true,
            Broker::RabbitMq(r) => r.is_ready().await,
        }
    }

    fn reconnects(&self) -> u64 {
        match self {
            Broker::Memory(_) | Broker::Sqs(_) => 0,
            Broker::RabbitMq(r) => r.reconnects(),
        }
    }

    async fn queue_depth(&self, queue: &str) -> Option<u64> {
        match self {
            Broker::Memory(_) => None,
            Broker::RabbitMq(r) => r.queue_depth(queue).await,
            Broker::Sqs(s) => s.queue_depth(queue).await,
        }
    }

    async fn mark_pumped(&self, queue: &str, strategy: &str) -> Result<(), ExecutorError> {
        match self {
            Broker::Memory(_) | Broker::RabbitMq(_) => Ok(()),
            Broker::Sqs(s) => s.tag_pumped(queue, strategy).await,
        }
    }

    fn delivered(&self, destination: &str) -> Option<Vec<Delivered>> {
        match self {
            Broker::Memory(m) => m.delivered(destination),
            Broker::RabbitMq(r) => r.delivered(destination),
            Broker::Sqs(s) => s.delivered(destination),
        }
    }

    fn outlives_the_process(&self) -> bool {
        match self {
            Broker::Memory(m) => m.outlives_the_process(),
            Broker::RabbitMq(r) => r.outlives_the_process(),
            Broker::Sqs(s) => s.outlives_the_process(),
        }
    }

    async fn apply(&self, commands: &[Command]) -> Result<(), ExecutorError> {
        match self {
            Broker::Memory(m) => m.apply(commands).await,
            Broker::RabbitMq(r) => r.apply(commands).await,
            Broker::Sqs(s) => s.apply(commands).await,
        }
    }

    async fn check_destination(&self, destination: &str) -> Result<(), ExecutorError> {
        match self {
            Broker::Memory(m) => m.check_destination(destination).await,
            Broker::RabbitMq(r) => r.check_destination(destination).await,
            Broker::Sqs(s) => s.check_destination(destination).await,
        }
    }

    async fn check_exchange(&self, exchange: &str) -> Result<(), ExecutorError> {
        match self {
            Broker::Memory(m) => m.check_exchange(exchange).await,
            Broker::RabbitMq(r) => r.check_exchange(exchange).await,
            Broker::Sqs(s) => s.check_exchange(exchange).await,
        }
    }

    async fn send(&self, commands: &[Command], envelope: &Envelope) -> Result<(), ExecutorError> {
        match self {
            Broker::Memory(m) => m.send(commands, envelope).await,
            Broker::RabbitMq(r) => r.send(commands, envelope).await,
            // Boxed: the SDK's request futures are large, and inline they would size every
            // RabbitMQ publish's future too (each request's is moved whole when spawned).
            Broker::Sqs(s) => Box::pin(s.send(commands, envelope)).await,
        }
    }
}
