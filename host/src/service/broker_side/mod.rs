//! The broker's side of the service: what a broker checks before the service
//! takes work, what it runs beside the scheduler, and how its queues are
//! read, behind [`BrokerSide`]. The rest of `service/` asks the side; it never
//! asks which broker it is.
//!
//! * [`memory`]: the embedded broker's wall clock.
//! * [`rabbitmq`]: the broker's clock read, its mechanisms probed, the ingress,
//!   redelivery, release, unpark and canary consumers, the cancellation log
//!   and the connection keeper.
//! * [`sqs`]: a pump per pumped queue (and finding them), the SQS ingress and
//!   canary, the fates queue with its release receivers.
//! * [`nats`]: a consumer per held stream, asking its strategy's planner.
//!
//! [`connect`] opens the broker a config names together with its side:
//! adding a broker adds a file here and one arm there.

mod memory;
mod nats;
mod rabbitmq;
mod sqs;

use std::sync::Arc;

use futures_util::future::BoxFuture;

use super::pending::DepthReading;
use super::{Background, Service, ServiceError};
use crate::broker::Broker;
use crate::broker::nats::consume::NatsConsumer;
use crate::broker::rabbitmq::consume::Consumer;
use crate::broker::sqs::consume::SqsConsumer;
use crate::config::{BrokerConfig, Config};
use crate::message::Handler;
use crate::scheduler::Scheduler;
use crate::service::canary::Canary;

pub use sqs::pump_settings;

/// One broker's part in a running service.
pub(super) trait BrokerSide: Send + Sync {
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
}

/// Opens the broker `config` names, with its side.
pub(super) async fn connect(config: &Config) -> Result<(Broker, Arc<dyn BrokerSide>), ServiceError> {
    match &config.broker {
        BrokerConfig::Memory => Ok(memory::connect()),
        BrokerConfig::Rabbitmq { url, url_env, publish_channels, management_url } => rabbitmq::connect(url, url_env, *publish_channels, management_url).await,
        BrokerConfig::Sqs { region, endpoint_url, send_batch_window } => sqs::connect(region, endpoint_url, *send_batch_window).await,
        BrokerConfig::Nats { .. } => nats::connect(&config.broker).await,
    }
}

/// A queue consumer of any broker, as the supervisor runs it.
trait QueueConsumer: Send + Sync + 'static {
    /// Attached to its queue (AMQP), reaching it (SQS), pulling from it (NATS).
    fn is_consuming(&self) -> bool;
    fn run(self: Arc<Self>, stop: tokio::sync::watch::Receiver<bool>) -> impl Future<Output = ()> + Send;
}

impl<H: Handler> QueueConsumer for Consumer<H> {
    fn is_consuming(&self) -> bool {
        Consumer::is_consuming(self)
    }
    async fn run(self: Arc<Self>, stop: tokio::sync::watch::Receiver<bool>) {
        Consumer::run(self, stop).await
    }
}

impl<H: Handler> QueueConsumer for SqsConsumer<H> {
    fn is_consuming(&self) -> bool {
        SqsConsumer::is_consuming(self)
    }
    async fn run(self: Arc<Self>, stop: tokio::sync::watch::Receiver<bool>) {
        SqsConsumer::run(&self, stop).await
    }
}

impl<H: Handler> QueueConsumer for NatsConsumer<H> {
    fn is_consuming(&self) -> bool {
        NatsConsumer::is_consuming(self)
    }
    async fn run(self: Arc<Self>, stop: tokio::sync::watch::Receiver<bool>) {
        NatsConsumer::run(&self, stop).await
    }
}

/// Runs a consumer under the supervisor; it is up while it consumes.
fn supervise_consumer(background: &Background, name: &str, consumer: Arc<impl QueueConsumer>) {
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
fn supervise_canary_probes(service: &Arc<Service>, config: &Config) {
    let (scheduler, settings, stop) = (service.scheduler.clone(), config.service.canary.clone(), service.background.stop.subscribe());
    service.background.supervisor.spawn("canary-probes", None, move || {
        let probes = Canary::send_probes(scheduler.clone(), settings.clone(), stop.clone());
        async move {
            probes.await;
            Ok(())
        }
    });
}
