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
use crate::command::BrokerFamily;
use crate::config::broker::BrokerSettings;
use crate::config::{BrokerConfig, Config};
use crate::executor::{Broker, ExecutorError};
use crate::metrics::BrokerMetric;
use crate::planner::LoadedPlanner;
use crate::report::{CommandError, CostQuestion, DelayedExchangeMove, Migration, ParkedAction, PlanCost, Progress, Transfer, Verdict};
use crate::scheduler::strategies::Strategies;
use crate::service::cancellations::OpenCancellations;
use crate::service::pending::DepthReading;
use crate::service::side::Opened;
use crate::service::{Service, ServiceError};
use crate::sim::simulation::SimulatedMessage;

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
    /// this host's (a [`crate::clock::ShiftedClock`] plays a host whose clock
    /// is wrong), and readings of the broker's clock go into it.
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
        BrokerSettings::Memory | BrokerSettings::Sqs(_) => Err(CommandError::Unsupported { command: "verify", kinds: BrokerConfig::topology_verifiers() }),
    }
}

/// How a one-shot command (`hourglass inspect`) reads the strategies' queue
/// depths. Not on SQS, whose pumped queues only a running service finds as
/// messages come, nor on the memory broker, where nothing outlives the process.
pub fn depth_reading(config: &Config) -> Result<DepthReading, CommandError> {
    let readable = BrokerConfig::kinds_that(|kind| kind.depths_at_rest.then_some(""));
    match config.broker.settings() {
        BrokerSettings::RabbitMq(settings) => Ok(rabbitmq::side::depth_reading(config, rabbitmq::manage::management_for(&settings))),
        BrokerSettings::Nats(_) => Ok(nats::side::depth_reading()),
        BrokerSettings::Sqs(_) => Err(CommandError::Unsupported {
            command: "inspect",
            kinds: format!("{readable}; on SQS, GET /v1/delays of a running serve lists the pumped queues it reads"),
        }),
        BrokerSettings::Memory => Err(CommandError::Unsupported { command: "inspect", kinds: readable }),
    }
}

/// The configured broker's cancellations, opened for one command
/// (`hourglass cancel`, `reschedule`).
pub async fn open_cancellations(config: &Config, strategies: Strategies) -> Result<OpenCancellations, CommandError> {
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
        BrokerSettings::RabbitMq(settings) => rabbitmq::clock_check::read_for(&settings, clock).await,
        BrokerSettings::Memory | BrokerSettings::Sqs(_) | BrokerSettings::Nats(_) => {}
    }
}

/// `hourglass parked`: `action` on the messages this config's strategies set aside.
pub async fn parked(config: &Config, strategies: Strategies, action: &ParkedAction) -> Result<Verdict, CommandError> {
    match config.broker.settings() {
        BrokerSettings::RabbitMq(settings) => rabbitmq::parked::parked_command(&settings, config, strategies, action).await,
        BrokerSettings::Memory | BrokerSettings::Sqs(_) | BrokerSettings::Nats(_) => Err(only_on("parked", "rabbitmq")),
    }
}

/// `hourglass transfer`: what waits in one strategy's queues moved to another's.
pub async fn transfer(config: &Config, strategies: Strategies, request: &Transfer, progress: &mut dyn Progress) -> Result<Verdict, CommandError> {
    match config.broker.settings() {
        BrokerSettings::RabbitMq(settings) => rabbitmq::transfer::transfer_command(&settings, config, strategies, request, progress).await,
        BrokerSettings::Memory | BrokerSettings::Sqs(_) | BrokerSettings::Nats(_) => Err(only_on("transfer", "rabbitmq")),
    }
}

/// `hourglass migrate delayed-exchange`: moving an exchange of RabbitMQ's delayed-message plugin.
pub async fn migrate_delayed_exchange(config: &Config, request: &DelayedExchangeMove) -> Result<Migration, CommandError> {
    match config.broker.settings() {
        BrokerSettings::RabbitMq(settings) => rabbitmq::migration::migrate_command(&settings, config, request).await,
        BrokerSettings::Memory | BrokerSettings::Sqs(_) | BrokerSettings::Nats(_) => Err(only_on("migrate delayed-exchange", "rabbitmq")),
    }
}

/// `hourglass pump`: the pumps of `strategy`'s queues for `destinations`
/// (each queue told to `started`), until `until` resolves.
#[allow(clippy::too_many_arguments)]
pub async fn pump(
    config: &Config,
    strategies: Strategies,
    strategy: &str,
    destinations: &[String],
    wait_seconds: i32,
    started: &mut dyn FnMut(&str),
    until: impl Future<Output = ()>,
) -> Result<Verdict, CommandError> {
    match config.broker.settings() {
        BrokerSettings::Sqs(settings) => sqs::pumping::pump_command(&settings, config, strategies, strategy, destinations, wait_seconds, started, until).await,
        BrokerSettings::Memory | BrokerSettings::RabbitMq(_) | BrokerSettings::Nats(_) => Err(only_on("pump", "sqs")),
    }
}

/// `command` runs on one kind of broker only.
fn only_on(command: &'static str, kind: &str) -> CommandError {
    CommandError::Unsupported { command, kinds: format!("broker.kind = {kind:?}") }
}

/// What `hourglass plan` shows of a strategy's cost beyond its route, by the
/// family it plans for: SQS bills by request; on the others a message's cost
/// is not counted in requests.
pub fn plan_cost(
    config: &Config,
    family: BrokerFamily,
    planner: &mut LoadedPlanner,
    route: &SimulatedMessage,
    question: &CostQuestion,
) -> Result<PlanCost, CommandError> {
    match family {
        BrokerFamily::Sqs => sqs::estimate::plan_cost(gathering(config), planner, route, question),
        BrokerFamily::Amqp | BrokerFamily::Nats => match question.stream {
            Some(_) => Err(CommandError::Argument { argument: "--rate", reason: "--rate estimates SQS requests, and this is not an SQS strategy".into() }),
            None => Ok(PlanCost::default()),
        },
    }
}

/// How long the configured host gathers first sends into one request, and a
/// pump lingers for more messages before it sends: what a stream of messages
/// is walked through (zero where nothing is gathered).
fn gathering(config: &Config) -> sqs::estimate::Gathering {
    match config.broker.settings() {
        BrokerSettings::Sqs(settings) => sqs::estimate::Gathering {
            send_window: sqs::batcher::window(settings.send_batch_window),
            linger: sqs::pumped::PumpSettings::from_config(config).linger,
        },
        BrokerSettings::Memory | BrokerSettings::RabbitMq(_) | BrokerSettings::Nats(_) => Default::default(),
    }
}

/// Log directives for the brokers' client libraries, after the host's own
/// level: lapin logs every connection it loses at error level, which the
/// host already reports once with what it does about it.
pub const CLIENT_LOG_DIRECTIVES: &str = "lapin=off";

/// Every family a broker may add to `/metrics`, whichever is configured: each
/// registers its own when its side starts.
pub fn metric_families() -> Vec<BrokerMetric> {
    [rabbitmq::metrics::METRICS, sqs::metrics::METRICS, nats::metrics::METRICS].concat()
}
