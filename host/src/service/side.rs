//! A broker's part in the service, behind [`BrokerSide`]: what it checks
//! before the service takes work (its clock), what it runs beside the
//! scheduler (consumers, pumps, held streams) and how its queues are read.
//! Each broker implements it in its own folder (`broker/<kind>/side.rs`); the
//! rest of `service/` asks the side and never which broker it is. The tools a
//! side runs its work with are here: [`supervise_consumer`] for any
//! [`QueueConsumer`], [`supervise_canary_probes`].

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde::Serialize;

use super::pending::DepthReading;
use super::{Background, Service, ServiceError};
use crate::command::{Command, NatsCommand};
use crate::config::Config;
use crate::executor::Broker;
use crate::scheduler::Scheduler;
use crate::service::canary::Canary;

/// A broker's executor, opened, with its side.
pub type Opened = (Broker, Arc<dyn BrokerSide>);

/// How a service opens its broker with its side: the broker registry's (`broker/registry.rs`).
pub type Connect = for<'a> fn(&'a Config) -> BoxFuture<'a, Result<Opened, ServiceError>>;

/// A broker object the topology check found wrong, and what is wrong with it.
pub type Drift = (String, Vec<String>);

/// One broker's part in a running service.
pub trait BrokerSide: Send + Sync {
    /// Before the service takes work or declares anything: what due times
    /// must not be counted without (the broker's clock).
    fn before_work<'a>(&'a self, _scheduler: &'a Scheduler<Broker>) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    /// Declares (when the service applies the topology) and starts, under the
    /// service's supervisor, what this broker runs beside the scheduler.
    fn start<'a>(&'a self, service: &'a Arc<Service>, config: &'a Config) -> BoxFuture<'a, Result<(), ServiceError>>;

    /// After a reload to `config`: starts what the strategies it added need.
    fn start_added<'a>(&'a self, _service: &'a Service, _config: &'a Config) -> BoxFuture<'a, Result<(), ServiceError>> {
        Box::pin(async { Ok(()) })
    }

    /// How the service reads this broker's queue depths; `None`: it has none to read.
    fn depth_reading(&self, config: &Config) -> Option<DepthReading>;

    /// What `commands` declare and the broker lacks or has otherwise
    /// (`service.topology = "verify"`); `None`: this broker cannot tell.
    fn topology_drifts<'a>(&'a self, _commands: &'a [Command]) -> BoxFuture<'a, Result<Option<Vec<Drift>>, ServiceError>> {
        Box::pin(async { Ok(None) })
    }

    /// `[[redelivery]]` as it runs, on a broker that runs it.
    fn redelivery(&self) -> Option<RedeliveryReport> {
        None
    }

    /// Refuses a reload to `config` that what runs cannot follow, saying why.
    fn check_reload(&self, _config: &Config) -> Result<(), ServiceError> {
        Ok(())
    }

    /// After the service's tasks stopped: closes what the side still holds open.
    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// The redelivery consumer as it runs: its input queue and each consumer queue's counts.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RedeliveryReport {
    pub input: String,
    pub queues: Vec<QueueStatus>,
}

/// One consumer queue's redelivery, for `GET /v1/redelivery` and `hourglass redelivery status`.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct QueueStatus {
    pub queue: String,
    pub strategy: String,
    pub policy: String,
    pub error_queue: String,
    pub max_attempts: Option<u32>,
    /// Redeliveries scheduled and not yet due.
    pub waiting: u64,
    /// Messages scheduled back to the queue since the service started.
    pub redelivered: u64,
    /// Messages sent to the error queue since the service started.
    pub given_up: u64,
}

/// A queue consumer of any broker, as the supervisor runs it.
pub(crate) trait QueueConsumer: Send + Sync + 'static {
    /// Attached to its queue (AMQP), reaching it (SQS), pulling from it (NATS).
    fn is_consuming(&self) -> bool;
    fn run(self: Arc<Self>, stop: tokio::sync::watch::Receiver<bool>) -> impl Future<Output = ()> + Send;
}

/// Runs a consumer under the supervisor; it is up while it consumes.
pub(crate) fn supervise_consumer(background: &Background, name: &str, consumer: Arc<impl QueueConsumer>) {
    let stop = background.stop.subscribe();
    let probe = consumer.clone();
    background.supervisor.spawn(name, Some(Box::new(move || probe.is_consuming())), move || {
        let (consumer, stop) = (consumer.clone(), stop.clone());
        async move {
            consumer.run(stop).await;
            Ok(())
        }
    });
}

/// The canary's probes, sent every `service.canary.every` while the service runs.
pub(crate) fn supervise_canary_probes(service: &Arc<Service>, config: &Config) {
    let (scheduler, settings, stop) = (service.scheduler.clone(), config.service.canary.clone(), service.background.stop.subscribe());
    service.background.supervisor.spawn("canary-probes", None, move || {
        let probes = Canary::send_probes(scheduler.clone(), settings.clone(), stop.clone());
        async move {
            probes.await;
            Ok(())
        }
    });
}

/// Each held stream the strategies declare, with the one strategy it belongs to.
pub(crate) fn held_streams(service: &Service, config: &Config) -> Result<BTreeMap<String, String>, ServiceError> {
    let mut held: BTreeMap<String, String> = BTreeMap::new();
    for strategy in config.strategies.keys() {
        let topology = service.scheduler.topology_of(strategy).map_err(|e| ServiceError::refused(config, format!("strategy {strategy}: {e}")))?;
        for command in topology {
            let Command::Nats(NatsCommand::EnsureStream { name, held: true, .. }) = command else { continue };
            if let Some(other) = held.insert(name.clone(), strategy.clone())
                && other != *strategy
            {
                return Err(ServiceError::refused(
                    config,
                    format!(
                        "strategies {other} and {strategy} both hold messages in stream {name}; give one of them a stream of its own (its planner's `stream` key)"
                    ),
                ));
            }
        }
    }
    Ok(held)
}
