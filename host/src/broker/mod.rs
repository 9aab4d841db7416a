//! Brokers: where planned commands run.
//!
//! [`Executor`] is the neutral seam: declare what a plan needs, check a
//! destination, send one message through its planned commands and return once
//! the broker confirmed it. [`memory`] is the embedded in-memory broker;
//! [`rabbitmq`], [`sqs`] and [`nats`] are the real ones, and the only modules
//! that speak their client libraries. Which one `delay.toml` names, and how it is opened,
//! is [`registry`]'s to say, and only it tells the brokers apart.

pub mod cancellations;
pub mod memory;
pub mod nats;
pub mod rabbitmq;
pub mod registry;
pub mod sqs;

use thiserror::Error;

use crate::command::{Command, FieldTable};
use crate::message::Properties;

pub use memory::{Delivered, MemoryExecutor};
pub(crate) use registry::connect_rabbitmq;
pub use registry::{Broker, BrokerConfig, NatsSettings, RabbitMqSettings, SqsSettings, amqp_url, connect, connect_nats, connect_sqs, nats_url};

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
