//! Where planned commands run: the seam every broker implements.
//!
//! [`Executor`] declares what a plan needs, checks a destination, sends one
//! message through its planned commands and returns once the broker confirmed
//! it. [`Broker`] holds whichever executor `delay.toml` names behind that one
//! trait, so the scheduler and the service never learn which broker it is; the
//! brokers themselves, one folder each, are under `broker/`.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde::Serialize;
use thiserror::Error;

use crate::clock::Clock;
use crate::command::{BrokerFamily, Command, Described, FieldTable};
use crate::message::Properties;

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
    /// A command of another family than this broker's: its strategy is
    /// configured on the wrong broker.
    #[error("broker refused: {what} {name:?} is for {family} brokers and this one runs {this} commands: the strategy is for another broker")]
    OtherFamily { what: &'static str, name: String, family: BrokerFamily, this: BrokerFamily },
}

impl ExecutorError {
    /// Refuses `command`, another family's than `this`.
    pub fn other_family(command: &Command, this: BrokerFamily) -> ExecutorError {
        let Described { what, name, .. } = command.describe();
        ExecutorError::OtherFamily { what, name, family: command.family(), this }
    }
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
        async move {
            let kinds = crate::config::BrokerConfig::kinds_that(|kind| kind.exchanges.then_some(""));
            Err(ExecutorError::Refused(format!("exchange {exchange:?}: this broker has no exchanges; exchange destinations need {kinds}")))
        }
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

    /// Where messages go, for people ("RabbitMQ at amqp://…").
    fn describe(&self) -> String;

    /// The clock the host counts due times on (the broker's, once read): a
    /// broker handed absolute times (NATS schedules) turns delays into them
    /// on it. Others wait out delays on their own clock and ignore it.
    fn count_on(&self, _clock: Arc<Clock>) {}
}

/// Deliveries a broker that keeps them (the in-memory one) keeps per
/// destination; older ones are dropped, so a long-running `serve` does not grow.
pub const KEPT_PER_DESTINATION: usize = 100;

/// A message that reached its destination, on a broker that keeps them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Delivered {
    pub id: String,
    pub destination: String,
    /// Unix ms.
    pub arrived_at_ms: u64,
    /// From `hourglass-due-at`, when the message carries it.
    pub due_at_ms: Option<u64>,
    #[serde(skip)]
    pub body: Vec<u8>,
}

impl Delivered {
    /// Arrival minus due time; negative would be early.
    pub fn late_ms(&self) -> Option<i64> {
        self.due_at_ms.map(|due| self.arrived_at_ms as i64 - due as i64)
    }
}

/// Any broker's executor, as the scheduler and the service hold it.
#[derive(Clone)]
pub struct Broker(Arc<dyn AnyExecutor>);

impl Broker {
    pub fn new<E: Executor + Send + Sync + 'static>(executor: Arc<E>) -> Broker {
        Broker(executor)
    }

    /// The executor inside, when it is an `E`: for a test or a bench that
    /// reaches past the seam to the broker's own client.
    #[cfg(feature = "testing")]
    pub fn downcast<E: Executor + Send + Sync + 'static>(&self) -> Option<Arc<E>> {
        self.0.clone().into_any().downcast::<E>().ok()
    }
}

impl<E: Executor + Send + Sync + 'static> From<Arc<E>> for Broker {
    fn from(executor: Arc<E>) -> Broker {
        Broker::new(executor)
    }
}

/// [`Executor`] with its futures boxed, so one handle holds any broker's.
trait AnyExecutor: Send + Sync {
    fn apply<'a>(&'a self, commands: &'a [Command]) -> BoxFuture<'a, Result<(), ExecutorError>>;
    fn check_destination<'a>(&'a self, destination: &'a str) -> BoxFuture<'a, Result<(), ExecutorError>>;
    fn check_exchange<'a>(&'a self, exchange: &'a str) -> BoxFuture<'a, Result<(), ExecutorError>>;
    fn send<'a>(&'a self, commands: &'a [Command], envelope: &'a Envelope) -> BoxFuture<'a, Result<(), ExecutorError>>;
    fn is_ready(&self) -> BoxFuture<'_, bool>;
    fn reconnects(&self) -> u64;
    fn queue_depth<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Option<u64>>;
    fn mark_pumped<'a>(&'a self, queue: &'a str, strategy: &'a str) -> BoxFuture<'a, Result<(), ExecutorError>>;
    fn delivered(&self, destination: &str) -> Option<Vec<Delivered>>;
    fn outlives_the_process(&self) -> bool;
    fn describe(&self) -> String;
    fn count_on(&self, clock: Arc<Clock>);
    #[cfg(feature = "testing")]
    fn into_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync>;
}

impl<E: Executor + Send + Sync + 'static> AnyExecutor for E {
    fn apply<'a>(&'a self, commands: &'a [Command]) -> BoxFuture<'a, Result<(), ExecutorError>> {
        Box::pin(Executor::apply(self, commands))
    }
    fn check_destination<'a>(&'a self, destination: &'a str) -> BoxFuture<'a, Result<(), ExecutorError>> {
        Box::pin(Executor::check_destination(self, destination))
    }
    fn check_exchange<'a>(&'a self, exchange: &'a str) -> BoxFuture<'a, Result<(), ExecutorError>> {
        Box::pin(Executor::check_exchange(self, exchange))
    }
    fn send<'a>(&'a self, commands: &'a [Command], envelope: &'a Envelope) -> BoxFuture<'a, Result<(), ExecutorError>> {
        Box::pin(Executor::send(self, commands, envelope))
    }
    fn is_ready(&self) -> BoxFuture<'_, bool> {
        Box::pin(Executor::is_ready(self))
    }
    fn reconnects(&self) -> u64 {
        Executor::reconnects(self)
    }
    fn queue_depth<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Option<u64>> {
        Box::pin(Executor::queue_depth(self, queue))
    }
    fn mark_pumped<'a>(&'a self, queue: &'a str, strategy: &'a str) -> BoxFuture<'a, Result<(), ExecutorError>> {
        Box::pin(Executor::mark_pumped(self, queue, strategy))
    }
    fn delivered(&self, destination: &str) -> Option<Vec<Delivered>> {
        Executor::delivered(self, destination)
    }
    fn outlives_the_process(&self) -> bool {
        Executor::outlives_the_process(self)
    }
    fn count_on(&self, clock: Arc<Clock>) {
        Executor::count_on(self, clock)
    }
    fn describe(&self) -> String {
        Executor::describe(self)
    }
    #[cfg(feature = "testing")]
    fn into_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync> {
        self
    }
}

impl Executor for Broker {
    async fn apply(&self, commands: &[Command]) -> Result<(), ExecutorError> {
        self.0.apply(commands).await
    }
    async fn check_destination(&self, destination: &str) -> Result<(), ExecutorError> {
        self.0.check_destination(destination).await
    }
    async fn check_exchange(&self, exchange: &str) -> Result<(), ExecutorError> {
        self.0.check_exchange(exchange).await
    }
    async fn send(&self, commands: &[Command], envelope: &Envelope) -> Result<(), ExecutorError> {
        self.0.send(commands, envelope).await
    }
    async fn is_ready(&self) -> bool {
        self.0.is_ready().await
    }
    fn reconnects(&self) -> u64 {
        self.0.reconnects()
    }
    async fn queue_depth(&self, queue: &str) -> Option<u64> {
        self.0.queue_depth(queue).await
    }
    async fn mark_pumped(&self, queue: &str, strategy: &str) -> Result<(), ExecutorError> {
        self.0.mark_pumped(queue, strategy).await
    }
    fn delivered(&self, destination: &str) -> Option<Vec<Delivered>> {
        self.0.delivered(destination)
    }
    fn outlives_the_process(&self) -> bool {
        self.0.outlives_the_process()
    }
    fn describe(&self) -> String {
        self.0.describe()
    }
    fn count_on(&self, clock: Arc<Clock>) {
        self.0.count_on(clock)
    }
}

/// Executors for the core's own unit tests, which test the scheduler and the
/// service apart from any broker.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// Takes every command and message and keeps none of them.
    #[derive(Default)]
    pub(crate) struct Accepting;

    impl Executor for Accepting {
        async fn apply(&self, _commands: &[Command]) -> Result<(), ExecutorError> {
            Ok(())
        }
        async fn check_destination(&self, _destination: &str) -> Result<(), ExecutorError> {
            Ok(())
        }
        async fn send(&self, _commands: &[Command], _envelope: &Envelope) -> Result<(), ExecutorError> {
            Ok(())
        }
        fn describe(&self) -> String {
            "a test broker that takes everything".into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_family_s_command_is_refused_naming_both_families() {
        let refused = ExecutorError::other_family(&Command::forward("orders", "created"), BrokerFamily::Nats);
        assert_eq!(
            refused.to_string(),
            "broker refused: publish \"orders\" is for amqp brokers and this one runs nats commands: the strategy is for another broker"
        );
    }
}
