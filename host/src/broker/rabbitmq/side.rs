//! RabbitMQ's side of the service. Before work: the broker's clock read
//! through the management API. At start: a probe of each mechanism the
//! strategies rely on, then the consumers — ingress, redelivery, each
//! strategy's release queue and parking queues, the canary, on one shared
//! connection (a channel each) — and the
//! cancellation log when a strategy is cancellable; beside them the
//! connection keeper, the clock check and the open-channel gauge.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::future::BoxFuture;

use super::cancel::CancelLog;
use super::consume::Consumer;
use super::link::Slot;
use super::manage::{self, Management};
use super::redelivery::Redelivery;
use super::release::Release;
use super::unpark::Unpark;
use super::{RabbitMqExecutor, capacity, clock_check, parked, probe, verify};
use crate::command::Command;
use crate::config::broker::RabbitMqSettings;
use crate::config::{Config, DeadLetterSetup};
use crate::executor::Broker;
use crate::message::Handler;
use crate::scheduler::Scheduler;
use crate::service::canary::Canary;
use crate::service::ingress::Ingress;
use crate::service::pending::{DepthReading, PerMessageQueues};
use crate::service::side::{BrokerSide, Drift, Opened, QueueConsumer, RedeliveryReport, supervise_canary_probes, supervise_consumer};
use crate::service::{Background, Service, ServiceError};

/// How often queue depths are read unless `service.depth_poll` says: passive declares are free.
const DEPTH_POLL: Duration = Duration::from_secs(5);

struct RabbitMqSide {
    /// Shared with the scheduler: consumers set messages aside through it.
    publisher: Arc<RabbitMqExecutor>,
    amqp: String,
    /// The one connection every consumer of the service takes a channel on.
    consuming: Arc<Slot>,
    management_url: Option<String>,
    /// The management API, when reachable by URL: where the broker's clock is
    /// read and the queues a strategy makes per message are counted.
    management: Option<Arc<Management>>,
    /// Set as the side starts, before the service serves.
    redelivery: OnceLock<Arc<Consumer<Redelivery>>>,
    /// The cancellation log, when a strategy is cancellable.
    cancel: OnceLock<Arc<CancelLog>>,
}

/// Opens RabbitMQ with its side.
pub(in crate::broker) async fn connect(settings: RabbitMqSettings) -> Result<Opened, ServiceError> {
    let publisher = super::connect(&settings).await?;
    let RabbitMqSettings { url: amqp, management_url, .. } = settings;
    let management = manage::management_api(&amqp, management_url.as_deref());
    // Named like the publisher's connections, with a suffix of its own to tell processes apart.
    let instance = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let consuming = Arc::new(Slot::lazy(&amqp, format!("hourglass consume {instance}")));
    let side = RabbitMqSide { publisher: publisher.clone(), amqp, consuming, management_url, management, redelivery: OnceLock::new(), cancel: OnceLock::new() };
    Ok((publisher.into(), Arc::new(side)))
}

impl BrokerSide for RabbitMqSide {
    fn before_work<'a>(&'a self, scheduler: &'a Scheduler<Broker>) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            match &self.management {
                Some(api) => clock_check::first(api, scheduler.clock()).await,
                None => tracing::warn!(
                    "no management API to read the broker's clock from: deliver_at and other due times are counted on this host's clock, which must be right (NTP)"
                ),
            }
        })
    }

    fn start<'a>(&'a self, service: &'a Arc<Service>, config: &'a Config) -> BoxFuture<'a, Result<(), ServiceError>> {
        Box::pin(async move {
            let scheduler = &service.scheduler;
            let declaring = service.scheduler.declaring();
            check_the_brokers_mechanisms(scheduler, &self.amqp, self.management_url.as_deref()).await?;
            // Before any consumer takes a message: the first ones then find their channels open.
            self.publisher.warm_publish_channels().await;
            // Every consumer declares its queues before any starts.
            let ingress = match config.service.ingress.enabled {
                true => Some(self.consumer(Ingress::new(config.service.ingress.clone(), scheduler.clone()), declaring).await?),
                false => None,
            };
            if !config.redelivery.is_empty() {
                let redelivery = self.start_redelivery(config, scheduler, declaring).await?;
                let _ = self.redelivery.set(redelivery);
            }
            if config.strategies.values().any(|s| s.cancellable) {
                let log = CancelLog::new(&self.amqp, &config.service.cancel, scheduler.clone());
                let _ = service.background.cancellations.set(log.clone());
                let _ = self.cancel.set(log);
            }
            let per_strategy = self.strategy_consumers(config, scheduler, self.cancel.get(), declaring, |_| false).await?;
            let canary = match config.service.canary.enabled {
                true => Some(self.consumer(Canary::new(config.service.canary.clone(), scheduler.clone()), declaring).await?),
                false => None,
            };

            self.watch(service);
            self.keep_connected(service);
            if let Some(api) = &self.management {
                clock_check::supervise(service, api.clone());
            }
            let background = &service.background;
            if let Some(ingress) = ingress {
                supervise_consumer(background, "ingress", ingress);
            }
            if let Some(redelivery) = self.redelivery.get() {
                supervise_consumer(background, "redelivery", redelivery.clone());
            }
            if let Some(log) = self.cancel.get() {
                let (reader, probe, stop) = (log.clone(), log.clone(), background.stop.subscribe());
                background.supervisor.spawn("cancel-log", Some(Box::new(move || probe.is_reading())), move || {
                    let read = reader.clone().read(stop.clone());
                    async move { Ok(read.await?) }
                });
            }
            per_strategy.supervise(background);
            if let Some(canary) = canary {
                supervise_consumer(background, "canary", canary);
                supervise_canary_probes(service, config);
            }
            Ok(())
        })
    }

    /// A strategy the reload added gets its release and parking-queue
    /// consumers, as at start. They declare their queues as they attach (not
    /// here): the new config is in effect, so the reload must not fail after this.
    fn start_added<'a>(&'a self, service: &'a Service, config: &'a Config) -> BoxFuture<'a, Result<(), ServiceError>> {
        Box::pin(async move {
            let running = |name: &str| service.background.supervisor.has(name);
            let added = self.strategy_consumers(config, &service.scheduler, self.cancel.get(), false, running).await?;
            added.supervise(&service.background);
            Ok(())
        })
    }

    fn depth_reading(&self, config: &Config) -> Option<DepthReading> {
        Some(depth_reading(config, self.management.clone()))
    }

    fn topology_drifts<'a>(&'a self, commands: &'a [Command]) -> BoxFuture<'a, Result<Option<Vec<Drift>>, ServiceError>> {
        Box::pin(async move {
            let report = verify::verify(&self.amqp, self.management_url.as_deref(), commands).await.map_err(|e| ServiceError::Verify(Box::new(e)))?;
            Ok(Some(verify::grouped(&report).into_iter().collect()))
        })
    }

    fn redelivery(&self) -> Option<RedeliveryReport> {
        let handler = self.redelivery.get()?.handler().clone();
        Some(RedeliveryReport { input: handler.input().to_string(), queues: handler.status() })
    }

    /// Redelivery keeps running with the queues it started with: their strategies must stay.
    fn check_reload(&self, config: &Config) -> Result<(), ServiceError> {
        let Some(redelivery) = self.redelivery.get() else { return Ok(()) };
        let handler = redelivery.handler();
        for entry in handler.entries() {
            for strategy in [handler.strategy_of(entry), handler.policy_of(entry)] {
                if !config.strategies.contains_key(&strategy) {
                    return Err(ServiceError::refused(
                        config,
                        format!("strategy {strategy:?} is used by the running redelivery of queue {:?}; keep it, or restart to change redelivery", entry.queue),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// How queue depths are read on RabbitMQ: the strategies' queues by passive
/// declares, the queues a strategy makes per message through `management`,
/// each parking queue's orphans as parked when the service unparks.
pub fn depth_reading(config: &Config, management: Option<Arc<Management>>) -> DepthReading {
    DepthReading {
        every: DEPTH_POLL,
        // Only a strategy's static waiting queues can read as unknown here:
        // per-message queues come counted from the management API.
        redeclare_deleted: true,
        orphans_of: config.service.unpark.unwrap_or(true).then_some(parked::orphan_queue as fn(&str) -> String),
        dead_letters_of: None,
        per_message: management.map(|api| Arc::new(api) as Arc<dyn PerMessageQueues>),
    }
}

impl<H: Handler> QueueConsumer for Consumer<H> {
    fn is_consuming(&self) -> bool {
        Consumer::is_consuming(self)
    }
    async fn run(self: Arc<Self>, stop: tokio::sync::watch::Receiver<bool>) {
        Consumer::run(self, stop).await
    }
}

impl RabbitMqSide {
    /// A consumer of this broker for `handler`, its queues declared when `declaring`.
    async fn consumer<H: Handler>(&self, handler: Arc<H>, declaring: bool) -> Result<Arc<Consumer<H>>, ServiceError> {
        let consumer = Consumer::sharing(self.consuming.clone(), self.publisher.clone(), handler);
        if declaring {
            consumer.declare().await?;
        }
        Ok(consumer)
    }

    /// Warns about queues that can lose messages in a broker crash, and reports open channels.
    fn watch(&self, service: &Arc<Service>) {
        for (strategy, queues) in service.scheduler.at_most_once_queues() {
            tracing::warn!(
                %strategy,
                ?queues,
                "these classic queues dead-letter at most once: a broker crash can lose messages waiting in them (queue_type = \"quorum\", the default, where the strategy offers it)"
            );
        }
        let publisher = Arc::downgrade(&self.publisher);
        super::metrics::watch_open_channels(&service.metrics, move || match publisher.upgrade() {
            Some(publisher) => vec![("publishing", publisher.open_channels() as i64)],
            None => Vec::new(),
        });
        // Listed at /metrics from the start, as the core's families are, not from the first unpark.
        service.metrics.broker_counters(&super::metrics::UNPARKED);
    }

    /// `broker-connections` reconnects the publisher's connections, which
    /// readiness only reads, so an idle host comes back by itself.
    fn keep_connected(&self, service: &Arc<Service>) {
        let (publisher, stop) = (self.publisher.clone(), service.background.stop.subscribe());
        service.background.supervisor.spawn("broker-connections", None, move || {
            let (publisher, stop) = (publisher.clone(), stop.clone());
            async move {
                publisher.keep_connected(stop).await;
                Ok(())
            }
        });
    }

    /// Each strategy's release consumer and parking-queue consumers, by the
    /// name each runs under, leaving out those `running` already (at start
    /// none; at a reload those of the strategies it kept). Every strategy has
    /// a release queue: a cancellable one ends all its delays there, any other
    /// those of messages due to an exchange.
    async fn strategy_consumers(
        &self,
        config: &Config,
        scheduler: &Arc<Scheduler<Broker>>,
        log: Option<&Arc<CancelLog>>,
        declaring: bool,
        running: impl Fn(&str) -> bool,
    ) -> Result<StrategyConsumers, ServiceError> {
        let mut consumers = StrategyConsumers::default();
        for strategy in config.strategies.values() {
            let name = format!("release:{}", strategy.name);
            if running(&name) {
                continue;
            }
            let queue = config.service.cancel.release_queue(&strategy.name);
            let log = log.cloned().filter(|_| strategy.cancellable);
            let release = Release::new(&strategy.name, queue, config.service.ingress.prefetch, log, scheduler.clone());
            consumers.releases.push((name, self.consumer(release, declaring).await?));
        }
        if config.service.unpark.unwrap_or(true) {
            for parking in parked::strategy_parking_queues(config, scheduler) {
                let name = format!("unpark:{}", parking.queue);
                if running(&name) {
                    continue;
                }
                let unpark = Unpark::new(parking, config.service.ingress.prefetch, scheduler.clone());
                consumers.unparks.push((name, self.consumer(unpark, declaring).await?));
            }
        }
        Ok(consumers)
    }

    /// Sets up redelivery: declares the input, the error queues and the
    /// consumer queues' dead-lettering (or sets broker policies), and prepares
    /// each queue as a destination of its strategy.
    async fn start_redelivery(&self, config: &Config, scheduler: &Arc<Scheduler<Broker>>, declaring: bool) -> Result<Arc<Consumer<Redelivery>>, ServiceError> {
        let handler = Redelivery::new(config, scheduler.clone(), declaring);
        let named = |queue: &str, err: &dyn std::fmt::Display| ServiceError::refused(config, format!("redelivery {queue:?}: {err}"));
        let consumer = self.consumer(handler.clone(), declaring).await?;
        let with_policy: Vec<String> = handler.entries().filter(|e| e.dead_letter == DeadLetterSetup::BrokerPolicy).map(|e| e.queue.clone()).collect();
        if declaring && !with_policy.is_empty() {
            let management = manage::management_url(&self.amqp, self.management_url.as_deref())
                .ok_or_else(|| named(&with_policy[0], &"dead_letter = \"broker-policy\" needs broker.management_url"))?;
            let api = Management::new(&management, manage::vhost_of(&self.amqp)).map_err(|e| named(&with_policy[0], &e))?;
            let handler = handler.clone();
            tokio::task::spawn_blocking(move || {
                for queue in &with_policy {
                    handler.apply_broker_policy(&api, queue).map_err(|e| (queue.clone(), format!("setting the broker policy: {e}")))?;
                }
                Ok(())
            })
            .await?
            .map_err(|(queue, e)| named(&queue, &e))?;
        }
        for entry in handler.entries() {
            let strategy = handler.strategy_of(entry);
            if let Err(err) = scheduler.prepare_destination(&strategy, &entry.queue).await {
                tracing::warn!(queue = %entry.queue, %strategy, error = %err, "redelivery queue not ready yet; prepared again on its first rejection");
            }
        }
        tracing::info!(input = %handler.input(), queues = handler.entries().count(), "redelivery set up");
        Ok(consumer)
    }
}

/// Release consumers and parking-queue consumers, each by the name it runs under.
#[derive(Default)]
struct StrategyConsumers {
    releases: Vec<(String, Arc<Consumer<Release>>)>,
    unparks: Vec<(String, Arc<Consumer<Unpark>>)>,
}

impl StrategyConsumers {
    /// Runs each under the service's supervisor.
    fn supervise(self, background: &Background) {
        for (name, consumer) in self.releases {
            supervise_consumer(background, &name, consumer);
        }
        for (name, consumer) in self.unparks {
            supervise_consumer(background, &name, consumer);
        }
    }
}

/// Once at start: a probe through each broker mechanism the strategies rely
/// on (BCC through dead-lettering, alternate exchanges, at-least-once
/// dead-lettering), refusing to start when one does not behave rather than
/// deliver wrong; and the nodes' file handles against the quorum queues the
/// strategies add, warned about. Only RabbitMQ 3.10 runs where hourglass is
/// tested, so the user's broker proves what it relies on.
async fn check_the_brokers_mechanisms(scheduler: &Scheduler<Broker>, amqp: &str, management_url: Option<&str>) -> Result<(), ServiceError> {
    let declarations = scheduler.all_declarations();
    let mechanisms = probe::mechanisms_used(&declarations);
    match probe::probe(amqp, &mechanisms).await {
        Ok(results) => {
            for result in &results {
                match (result.refusal(), result.outcome) {
                    (Some(refusal), _) => return Err(ServiceError::BrokerMechanism(refusal)),
                    (None, probe::Outcome::NotRun) => tracing::warn!(mechanism = ?result.mechanism, detail = %result.detail, "a broker probe could not run"),
                    (None, _) => tracing::debug!(mechanism = ?result.mechanism, elapsed_ms = result.elapsed_ms, "broker probe passed"),
                }
            }
        }
        Err(err) => tracing::warn!(error = %err, "the broker's mechanisms were not probed"),
    }
    match capacity::check_capacity(amqp, management_url, &declarations).await {
        Ok(report) => {
            for warning in &report.warnings {
                tracing::warn!("{warning}");
            }
        }
        Err(err) => tracing::info!(error = %err, "the broker's capacity was not checked"),
    }
    Ok(())
}
