//! The registry: the one place that opens the broker `delay.toml` names.
//!
//! [`connect`] opens a broker's executor (for the CLI's one-shot commands),
//! [`Service::start`] a broker's executor together with its side (what it
//! runs beside the scheduler). Every match on the kind here is exhaustive, so
//! a new kind is refused by the compiler until it answers for each; what a
//! kind is and can do is `[broker]`'s, in [`crate::config::broker`].

use std::sync::Arc;

use futures_util::future::BoxFuture;

use super::memory::MemoryExecutor;
use super::{memory, nats, rabbitmq, sqs};
use crate::clock::Clock;
use crate::config::broker::BrokerSettings;
use crate::config::{BrokerConfig, Config};
use crate::executor::{Broker, ExecutorError};
use crate::report::{CommandError, Verdict};
use crate::scheduler::strategies::Strategies;
use crate::service::cancellations::Asking;
use crate::service::pending::DepthReading;
use crate::service::side::Opened;
use crate::service::{Service, ServiceError};

/// Opens the broker `config` names.
pub async fn connect(config: &BrokerConfig) -> Result<Broker, ExecutorError> {
    Ok(match config.settings() {
        BrokerSettings::Memory => Arc::new(MemoryExecutor::default()).into(),
        BrokerSettings::RabbitMq(settings) => rabbitmq::connect(&settings).await?.into(),
        BrokerSettings::Sqs(settings) => sqs::connect(&settings).await?.into(),
        BrokerSettings::Nats(settings) => nats::connect(&settings).await?.into(),
    })
}

/// Opens the broker `config` names, with its side.
fn connect_with_side(config: &Config) -> BoxFuture<'_, Result<Opened, ServiceError>> {
    Box::pin(async move {
        match config.broker.settings() {
            BrokerSettings::Memory => Ok(memory::side::connect()),
            BrokerSettings::RabbitMq(settings) => rabbitmq::side::connect(settings).await,
            BrokerSettings::Sqs(settings) => sqs::side::connect(settings).await,
            BrokerSettings::Nats(settings) => nats::side::connect(settings).await,
        }
    })
}

impl Service {
    /// Loads planners, connects to the broker `config` names, applies or
    /// verifies the topology and starts what the broker runs beside the scheduler.
    pub async fn start(config: Config) -> Result<Arc<Service>, ServiceError> {
        Service::start_with_clock(config, Clock::system()).await
    }

    /// [`Service::start`] with due times counted on `clock`: its wall clock is
    /// swapped for the broker's once read.
    pub async fn start_with_clock(config: Config, clock: Arc<Clock>) -> Result<Arc<Service>, ServiceError> {
        Service::start_on(config, clock, connect_with_side).await
    }
}

/// `hourglass verify`: `strategy`'s topology with each of `destinations`,
/// and what the configured broker can check besides (its mechanisms probed
/// unless `probes` is false).
pub async fn verify(config: &Config, strategies: &mut Strategies, strategy: &str, destinations: &[String], probes: bool) -> Result<Verdict, CommandError> {
    match config.broker.settings() {
        BrokerSettings::RabbitMq(settings) => rabbitmq::check::verify_command(&settings, config, strategies, strategy, destinations, probes).await,
        BrokerSettings::Nats(settings) => nats::verify::verify_command(&settings, strategies, destinations, probes).await,
        BrokerSettings::Memory | BrokerSettings::Sqs(_) => {
            Err(CommandError::Unsupported { command: "verify", kinds: BrokerConfig::kinds_that(|kind| kind.verify_topology.then_some("")) })
        }
    }
}

/// How a one-shot command (`hourglass inspect`) reads the strategies' queue
/// depths; `None` where only a running service can (SQS's pumped queues are
/// found as messages come) or nothing outlives the process (memory).
pub fn depth_reading(config: &Config) -> Option<DepthReading> {
    match config.broker.settings() {
        BrokerSettings::RabbitMq(_) => Some(rabbitmq::side::depth_reading(config, rabbitmq::manage::management_for(config))),
        BrokerSettings::Nats(_) => Some(nats::side::depth_reading()),
        BrokerSettings::Memory | BrokerSettings::Sqs(_) => None,
    }
}

/// The configured broker's cancellations, opened for one command
/// (`hourglass cancel`, `reschedule`).
pub async fn open_cancellations(config: &Config, strategies: Strategies) -> Result<Asking, CommandError> {
    match config.broker.settings() {
        BrokerSettings::RabbitMq(settings) => rabbitmq::cancel::open_for_command(&settings, config, strategies).await,
        BrokerSettings::Sqs(settings) => sqs::cancel::open_for_command(&settings, config).await,
        BrokerSettings::Nats(settings) => nats::cancel::open_for_command(&settings, config).await,
        BrokerSettings::Memory => Err(CommandError::Unsupported { command: "cancellation", kinds: BrokerConfig::kinds_that(|kind| kind.cancellation_log) }),
    }
}

/// One reading of the broker's clock into `clock`, for a command run once
/// (`schedule --at`, …), where the broker's clock can be read without a
/// service (RabbitMQ's management API); elsewhere due times count on this host's.
pub async fn read_clock_once(config: &Config, clock: &Arc<Clock>) {
    match config.broker.settings() {
        BrokerSettings::RabbitMq(_) => rabbitmq::clock_check::read_for(config, clock).await,
        BrokerSettings::Memory | BrokerSettings::Sqs(_) | BrokerSettings::Nats(_) => {}
    }
}
