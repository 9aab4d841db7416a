//! Starting the service for a config: planners, broker, topology (applied or
//! verified), redelivery set-up, configured destinations, and the background
//! tasks beside the HTTP API (ingress, redelivery, release and parking queue
//! consumers, one pump per pumped queue, the RabbitMQ connection keeper), each under the
//! [`Supervisor`](super::supervise::Supervisor).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::{Background, DEFAULT_SHUTDOWN_TIMEOUT, Service, ServiceError};
use crate::broker::rabbitmq::RabbitMqExecutor;
use crate::broker::rabbitmq::consume::Consumer;
use crate::broker::rabbitmq::{capacity, probe};
use crate::broker::sqs::consume::SqsConsumer;
use crate::broker::sqs::fates_queue::FatesError;
use crate::broker::sqs::pump::Pump;
use crate::broker::sqs::pumped::{Discovery, PumpSettings};
use crate::broker::sqs::release::SqsRelease;
use crate::broker::{Broker, Executor, amqp_url};
use crate::clock::Clock;
use crate::config::{BrokerConfig, Config, TopologyAtStart};
use crate::parked;
use crate::planner::BrokerFamily;
use crate::scheduler::strategies::Strategies;
use crate::scheduler::{PumpedQueue, ScheduleError, Scheduler};
use crate::service::canary::Canary;
use crate::service::cancel::CancelLog;
use crate::service::ingress::Ingress;
use crate::service::redelivery::Redelivery;
use crate::service::release::Release;
use crate::service::sqs_cancel::{SchedulerReplan, SqsCancel};
use crate::service::unpark::Unpark;

const DEFAULT_PUMP_WAIT_SECONDS: i32 = 20;
const DEFAULT_PUMP_DISCOVERY: Duration = Duration::from_secs(60);

impl Service {
    /// Everything `serve` runs for a config: loads the planners, connects to
    /// the broker, applies or verifies the topology, prepares the configured
    /// destinations, starts the ingress (RabbitMQ) and the pumps (SQS).
    pub async fn start(config: Config) -> Result<Arc<Service>, ServiceError> {
        Service::start_with_clock(config, Clock::system()).await
    }

    /// [`Service::start`] with due times counted on `clock`: its wall clock is
    /// this host's (a [`crate::clock::ShiftedClock`] plays a host whose clock
    /// is wrong), and readings of the broker's clock go into it.
    pub async fn start_with_clock(config: Config, clock: Arc<Clock>) -> Result<Arc<Service>, ServiceError> {
        let loaded = config.clone();
        let strategies = tokio::task::spawn_blocking(move || Strategies::load(&loaded)).await.map_err(|e| ServiceError::Other(e.to_string()))??;
        check_broker_family(&config.broker, &config, &strategies)?;
        let broker = Broker::connect(&config.broker).await?;
        let topology = config.service.topology.unwrap_or(TopologyAtStart::Apply);
        let mut scheduler = Scheduler::new(&config, strategies, broker);
        scheduler.set_declaring(topology == TopologyAtStart::Apply);
        scheduler.set_clock(clock);
        let scheduler = Arc::new(scheduler);
        // Read before anything can take work: a deliver_at must not be counted on a host clock that is wrong.
        let clock_api = if matches!(scheduler.executor(), Broker::RabbitMq(_)) { super::pending::management_for(&config) } else { None };
        if let Some(api) = &clock_api {
            super::clock_check::first(api, scheduler.clock()).await;
        } else if matches!(scheduler.executor(), Broker::RabbitMq(_)) {
            tracing::warn!(
                "no management API to read the broker's clock from: deliver_at and other due times are counted on this host's clock, which must be right (NTP)"
            );
        }
        check_redelivery_policies(&config, &scheduler)?;
        match topology {
            TopologyAtStart::Apply => scheduler.apply_topology(&config.default_strategy).await?,
            TopologyAtStart::Verify => verify_topology(&config).await?,
            TopologyAtStart::Skip => {}
        }
        if let Broker::Sqs(sqs) = scheduler.executor() {
            scheduler.metrics().watch_sqs(sqs.requests.clone());
        }
        let (pumped_tx, pumped_rx) = mpsc::unbounded_channel();
        scheduler.report_pumped_queues(pumped_tx.clone());
        let (mut ingress, mut redelivery, mut canary, mut cancel, mut per_strategy) = (None, None, None, None, StrategyConsumers::default());
        if let (BrokerConfig::Rabbitmq { url, url_env, management_url, .. }, Broker::RabbitMq(publisher)) = (&config.broker, scheduler.executor()) {
            let amqp = amqp_url(url.as_deref(), url_env.as_deref());
            check_the_brokers_mechanisms(&scheduler, &amqp, management_url.as_deref()).await?;
            if config.service.ingress.enabled {
                let consumer = Consumer::new(&amqp, publisher.clone(), Ingress::new(config.service.ingress.clone(), scheduler.clone()));
                if topology == TopologyAtStart::Apply {
                    consumer.declare().await?;
                }
                ingress = Some(consumer);
            }
            if !config.redelivery.is_empty() {
                redelivery = Some(start_redelivery(&config, &scheduler, publisher, topology, &amqp, management_url.as_deref()).await?);
            }
            let log = config.strategies.values().any(|s| s.cancellable).then(|| CancelLog::new(&amqp, &config.service.cancel, scheduler.clone()));
            per_strategy = strategy_consumers(&config, &scheduler, log.as_ref(), topology, |_| false).await?;
            cancel = log;
            if config.service.canary.enabled {
                let consumer = Consumer::new(&amqp, publisher.clone(), Canary::new(config.service.canary.clone(), scheduler.clone()));
                if topology == TopologyAtStart::Apply {
                    consumer.declare().await?;
                }
                canary = Some(consumer);
            }
        }
        let wait_seconds = config.service.pump_wait.map_or(DEFAULT_PUMP_WAIT_SECONDS, |d| d.ms().div_ceil(1000) as i32);
        let (sqs_cancel, sqs_releases) = sqs_cancellation(&config, &scheduler, topology, wait_seconds).await?;
        let metrics = scheduler.metrics().clone();
        metrics.bound_labels(config.strategies.keys(), config.destinations.keys());
        let service = Arc::new(Service {
            background: Background { ingress, redelivery, cancel, sqs_cancel, ..Background::new(&metrics) },
            metrics,
            scheduler,
            token: config.service.token(),
            source: Some(config.path.clone()),
            topology,
            shutdown_timeout: config.service.shutdown_timeout.map_or(DEFAULT_SHUTDOWN_TIMEOUT, |d| Duration::from_millis(d.ms())),
            reloading: Default::default(),
            limits: super::http_limits(&config.service),
            depth_poll: config.service.depth_poll.map(|d| Duration::from_millis(d.ms())),
            pending: Default::default(),
        });
        watch_the_broker(&service);
        supervise_broker_connections(&service);
        if let Some(api) = clock_api {
            super::clock_check::supervise(&service, api);
        }
        super::pending::spawn_poll(&service);
        if matches!(service.scheduler.executor(), Broker::Memory(_)) {
            let (clocked, stop) = (service.clone(), service.background.stop.subscribe());
            service.background.supervisor.spawn("memory-clock", None, move || {
                let (service, stop) = (clocked.clone(), stop.clone());
                async move {
                    if let Broker::Memory(memory) = service.scheduler.executor() {
                        memory.run_clock(stop).await;
                    }
                    Ok(())
                }
            });
        }
        let pumps = PumpStart { wait_seconds, settings: pump_settings(&config), declaring: topology == TopologyAtStart::Apply };
        let pump_starter = tokio::spawn(start_pumps(service.clone(), pumped_rx, pumps));
        service.spawn(pump_starter);
        if matches!(service.scheduler.executor(), Broker::Sqs(_)) {
            let every = config.service.pump_discovery.map_or(DEFAULT_PUMP_DISCOVERY, |d| Duration::from_millis(d.ms()));
            let discoverer = tokio::spawn(discover_pumped_queues(service.clone(), pumped_tx, every));
            service.spawn(discoverer);
        }
        let background = &service.background;
        if let Some(ingress) = &background.ingress {
            supervise_consumer(background, "ingress", ingress.clone());
        }
        if let Some(redelivery) = &background.redelivery {
            supervise_consumer(background, "redelivery", redelivery.clone());
        }
        if let Some(log) = &background.cancel {
            let (reader, probe, stop) = (log.clone(), log.clone(), background.stop.subscribe());
            background.supervisor.spawn("cancel-log", Some(Box::new(move || probe.is_reading())), move || {
                let read = reader.clone().read(stop.clone());
                async move { Ok(read.await?) }
            });
        }
        per_strategy.supervise(background);
        supervise_sqs_cancellation(&service, sqs_releases);
        if let Some(canary) = canary {
            supervise_consumer(background, "canary", canary);
            supervise_canary_probes(&service, &config);
        }
        if let Broker::Sqs(sqs) = service.scheduler.executor()
            && config.service.sqs_ingress.enabled
        {
            let ingress = Ingress::for_sqs(config.service.sqs_ingress.as_ingress(), service.scheduler.clone());
            let consumer = SqsConsumer::new(sqs.clone(), ingress, pumps.wait_seconds);
            if topology == TopologyAtStart::Apply {
                consumer.declare().await?;
            }
            supervise_consumer(&service.background, "sqs-ingress", consumer);
        }
        if let Broker::Sqs(sqs) = service.scheduler.executor()
            && config.service.canary.enabled
        {
            let consumer = SqsConsumer::new(sqs.clone(), Canary::new(config.service.canary.clone(), service.scheduler.clone()), pumps.wait_seconds);
            if topology == TopologyAtStart::Apply {
                consumer.declare().await?;
            }
            supervise_consumer(&service.background, "canary", consumer);
            supervise_canary_probes(&service, &config);
        }
        service.prepare_configured_destinations(&config).await;
        Ok(service)
    }

    /// Sets up each configured destination now, so pumps start and mistakes
    /// show in the log at start; a destination that fails is prepared again on
    /// its first message.
    pub(super) async fn prepare_configured_destinations(&self, config: &Config) {
        for destination in config.destinations.keys() {
            let strategy = config.strategy_for(destination).to_string();
            if let Err(err) = self.scheduler.prepare_destination(&strategy, destination).await {
                tracing::warn!(%destination, %strategy, error = %err, "configured destination not ready yet");
            }
        }
    }
}

/// On RabbitMQ: warns about queues that can lose messages in a broker crash,
/// and reports open channels.
fn watch_the_broker(service: &Arc<Service>) {
    let scheduler = &service.scheduler;
    if !matches!(scheduler.executor(), Broker::RabbitMq(_)) {
        return;
    }
    for (strategy, queues) in scheduler.at_most_once_queues() {
        tracing::warn!(
            %strategy,
            ?queues,
            "these classic queues dead-letter at most once: a broker crash can lose messages waiting in them (queue_type = \"quorum\", the default, where the strategy offers it)"
        );
    }
    let weak = Arc::downgrade(scheduler);
    service.metrics.watch_open_channels(Box::new(move || match weak.upgrade().as_deref().map(Scheduler::executor) {
        Some(Broker::RabbitMq(rabbitmq)) => vec![("publishing", rabbitmq.open_channels() as i64)],
        _ => Vec::new(),
    }));
}

/// On RabbitMQ: `broker-connections` reconnects the executor's connections,
/// which readiness only reads, so an idle host comes back by itself.
fn supervise_broker_connections(service: &Arc<Service>) {
    let Broker::RabbitMq(rabbitmq) = service.scheduler.executor() else { return };
    let (rabbitmq, stop) = (rabbitmq.clone(), service.background.stop.subscribe());
    service.background.supervisor.spawn("broker-connections", None, move || {
        let (rabbitmq, stop) = (rabbitmq.clone(), stop.clone());
        async move {
            rabbitmq.keep_connected(stop).await;
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

/// A queue consumer of either broker, as the supervisor runs it.
trait QueueConsumer: Send + Sync + 'static {
    /// Attached to its queue (AMQP) or reaching it (SQS).
    fn is_consuming(&self) -> bool;
    fn run(self: Arc<Self>, stop: tokio::sync::watch::Receiver<bool>) -> impl Future<Output = ()> + Send;
}

impl<H: crate::message::Handler> QueueConsumer for Consumer<H> {
    fn is_consuming(&self) -> bool {
        Consumer::is_consuming(self)
    }
    async fn run(self: Arc<Self>, stop: tokio::sync::watch::Receiver<bool>) {
        Consumer::run(self, stop).await
    }
}

impl<H: crate::message::Handler> QueueConsumer for SqsConsumer<H> {
    fn is_consuming(&self) -> bool {
        SqsConsumer::is_consuming(self)
    }
    async fn run(self: Arc<Self>, stop: tokio::sync::watch::Receiver<bool>) {
        SqsConsumer::run(&self, stop).await
    }
}

/// Runs a consumer under the supervisor; it is up while it consumes.
/// Each RabbitMQ strategy's release consumer and parking-queue consumers,
/// by the name each runs under, leaving out those `running` already (at
/// start none; at a reload those of the strategies it kept). Every strategy
/// has a release queue: a cancellable one ends all its delays there, any
/// other those of messages due to an exchange.
pub(super) async fn strategy_consumers(
    config: &Config,
    scheduler: &Arc<Scheduler<Broker>>,
    log: Option<&Arc<CancelLog>>,
    topology: TopologyAtStart,
    running: impl Fn(&str) -> bool,
) -> Result<StrategyConsumers, ServiceError> {
    let (BrokerConfig::Rabbitmq { url, url_env, .. }, Broker::RabbitMq(publisher)) = (&config.broker, scheduler.executor()) else {
        return Ok(Default::default());
    };
    let amqp = amqp_url(url.as_deref(), url_env.as_deref());
    let mut consumers = StrategyConsumers::default();
    for strategy in config.strategies.values() {
        let name = format!("release:{}", strategy.name);
        if running(&name) {
            continue;
        }
        let queue = config.service.cancel.release_queue(&strategy.name);
        let log = log.cloned().filter(|_| strategy.cancellable);
        let release = Release::new(&strategy.name, queue, config.service.ingress.prefetch, log, scheduler.clone());
        let consumer = Consumer::new(&amqp, publisher.clone(), release);
        if topology == TopologyAtStart::Apply {
            consumer.declare().await?;
        }
        consumers.releases.push((name, consumer));
    }
    if config.service.unpark.unwrap_or(true) {
        for parking in parked::strategy_parking_queues(config, scheduler) {
            let name = format!("unpark:{}", parking.queue);
            if running(&name) {
                continue;
            }
            let consumer = Consumer::new(&amqp, publisher.clone(), Unpark::new(parking, config.service.ingress.prefetch, scheduler.clone()));
            if topology == TopologyAtStart::Apply {
                consumer.declare().await?;
            }
            consumers.unparks.push((name, consumer));
        }
    }
    Ok(consumers)
}

/// Release consumers and parking-queue consumers, each by the name it runs under.
#[derive(Default)]
pub(super) struct StrategyConsumers {
    releases: Vec<(String, Arc<Consumer<Release>>)>,
    unparks: Vec<(String, Arc<Consumer<Unpark>>)>,
}

impl StrategyConsumers {
    /// Runs each under the service's supervisor.
    pub(super) fn supervise(self, background: &Background) {
        for (name, consumer) in self.releases {
            supervise_consumer(background, &name, consumer);
        }
        for (name, consumer) in self.unparks {
            supervise_consumer(background, &name, consumer);
        }
    }
}

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

/// On SQS with a cancellable strategy: the fates queue with this host's reply
/// queue, and a release receiver for each cancellable strategy.
async fn sqs_cancellation(
    config: &Config,
    scheduler: &Arc<Scheduler<Broker>>,
    topology: TopologyAtStart,
    wait_seconds: i32,
) -> Result<(Option<Arc<SqsCancel>>, Vec<Arc<SqsRelease>>), ServiceError> {
    let Broker::Sqs(sqs) = scheduler.executor() else { return Ok((None, Vec::new())) };
    let cancellable: Vec<&str> = config.strategies.values().filter(|s| s.cancellable).map(|s| s.name.as_str()).collect();
    if cancellable.is_empty() {
        return Ok((None, Vec::new()));
    }
    // A cancel must outlive every claim that can come behind it, and SQS keeps a message 14 days at most.
    const SQS_RETENTION_MS: u64 = 14 * 24 * 3_600_000;
    if config.service.cancel.retention_ms() >= SQS_RETENTION_MS {
        return Err(ServiceError::Other(format!(
            "{}: service.cancel.retention must be below 14 days on SQS (the fates queue keeps a cancel no longer), got {} ms",
            config.path.display(),
            config.service.cancel.retention_ms()
        )));
    }
    let declaring = topology == TopologyAtStart::Apply;
    let cancel = SqsCancel::open(sqs.clone(), &config.service.cancel, scheduler.clock().clone(), declaring).await.map_err(|e| match e {
        FatesError::Broker(e) => ServiceError::Broker(e),
        other => ServiceError::Other(format!("{}: the SQS fates queue: {other}", config.path.display())),
    })?;
    let mut releases = Vec::new();
    for strategy in cancellable {
        let queue = config.release_queue(strategy);
        if declaring {
            scheduler.executor().apply(&[crate::scheduler::sqs_release_queue_declaration(&queue)]).await?;
        }
        releases.push(SqsRelease::new(sqs.clone(), strategy, &queue, cancel.fates().clone(), wait_seconds));
    }
    Ok((Some(cancel), releases))
}

/// Runs the SQS fates queue's deciding, this host's reply listener and the
/// release receivers under the supervisor: each is up while it reaches its queue.
fn supervise_sqs_cancellation(service: &Arc<Service>, releases: Vec<Arc<SqsRelease>>) {
    let background = &service.background;
    let Some(cancel) = &background.sqs_cancel else { return };
    let (decider, probe, stop, scheduler) = (cancel.clone(), cancel.clone(), background.stop.subscribe(), service.scheduler.clone());
    background.supervisor.spawn("sqs-fates", Some(Box::new(move || probe.is_deciding())), move || {
        let (decider, stop, replan) = (decider.clone(), stop.clone(), SchedulerReplan(scheduler.clone()));
        async move {
            decider.decide(&replan, stop).await;
            Ok(())
        }
    });
    let (listener, probe, stop) = (cancel.clone(), cancel.clone(), background.stop.subscribe());
    background.supervisor.spawn("sqs-replies", Some(Box::new(move || probe.is_listening())), move || {
        let (listener, stop) = (listener.clone(), stop.clone());
        async move {
            listener.listen(stop).await;
            Ok(())
        }
    });
    for release in releases {
        let (probe, stop) = (release.clone(), background.stop.subscribe());
        background.supervisor.spawn(format!("release:{}", release.queue()), Some(Box::new(move || probe.is_receiving())), move || {
            let (release, stop) = (release.clone(), stop.clone());
            async move {
                release.run(stop).await;
                Ok(())
            }
        });
    }
}

/// How `serve` starts each pump.
#[derive(Clone, Copy)]
struct PumpStart {
    wait_seconds: i32,
    settings: PumpSettings,
    /// Whether the host may create each queue's dead-letter queue and set its attributes.
    declaring: bool,
}

/// The pump settings `[service]` asks for.
pub fn pump_settings(config: &Config) -> PumpSettings {
    let defaults = PumpSettings::default();
    PumpSettings {
        visibility: config.service.pump_visibility.map_or(defaults.visibility, |d| Duration::from_secs(d.ms().div_ceil(1000))),
        max_receives: config.service.pump_max_receives.unwrap_or(defaults.max_receives),
        linger: config.service.pump_linger.map_or(defaults.linger, |d| Duration::from_millis(d.ms())),
    }
}

/// Starts a supervised pump (`pump:<queue>`) for each pumped queue reported, once per queue.
async fn start_pumps(service: Arc<Service>, mut reported: mpsc::UnboundedReceiver<PumpedQueue>, start: PumpStart) {
    let mut stop = service.background.stop.subscribe();
    loop {
        let pumped = tokio::select! {
            next = reported.recv() => match next { Some(p) => p, None => return },
            _ = stop.changed() => return,
        };
        if service.background.pumps.lock().unwrap_or_else(|p| p.into_inner()).insert(pumped.queue.clone(), pumped.strategy.clone()).is_some() {
            continue;
        }
        let Broker::Sqs(sqs) = service.scheduler.executor() else {
            tracing::error!(queue = %pumped.queue, strategy = %pumped.strategy, "a pumped queue needs the SQS broker; not pumping it");
            continue;
        };
        let (sqs, metrics, pump_stop, clock) = (sqs.clone(), service.metrics.clone(), service.background.stop.subscribe(), service.scheduler.clock().clone());
        let pumped = Arc::new(pumped);
        service.background.supervisor.spawn(format!("pump:{}", pumped.queue), None, move || {
            let (sqs, metrics, stop, pumped, clock) = (sqs.clone(), metrics.clone(), pump_stop.clone(), pumped.clone(), clock.clone());
            async move {
                let (config, strategy) = (pumped.config.clone(), pumped.strategy.clone());
                let planner = tokio::task::spawn_blocking(move || Strategies::load_one(&config, &strategy))
                    .await
                    .map_err(|e| format!("loading the pump's planner: {e}"))?
                    .map_err(|e| format!("loading the pump's planner: {e}"))?;
                let prepared =
                    sqs.prepare_pumped(&pumped.queue, &start.settings, start.declaring).await.map_err(|e| format!("preparing the pumped queue: {e}"))?;
                let pump = Pump::new(sqs, Box::new(planner), &pumped.queue, start.wait_seconds)
                    .await
                    .map_err(|e| format!("starting the pump: {e}"))?
                    .prepared(&prepared, &start.settings)
                    .clocked(clock);
                tracing::info!(queue = %pumped.queue, strategy = %pumped.strategy, dead_letters = ?prepared.dead_letters, "pumping");
                metrics.watch_pump(&pumped.queue, pump.counters.clone());
                pump.run(stop).await.map_err(|e| format!("pump stopped: {e}").into())
            }
        });
    }
}

/// Lists the account's queues now and every `every`, and reports each queue
/// tagged as pumped, so messages still cycling toward a destination no longer
/// configured (or only ever scheduled through the API) are pumped after a restart.
async fn discover_pumped_queues(service: Arc<Service>, report: mpsc::UnboundedSender<PumpedQueue>, every: Duration) {
    let Broker::Sqs(sqs) = service.scheduler.executor() else { return };
    let mut stop = service.background.stop.subscribe();
    let mut discovery = Discovery::default();
    loop {
        match sqs.discover_pumped(&mut discovery).await {
            Ok(found) => {
                let config = service.scheduler.config();
                for (queue, strategy) in found {
                    if !config.strategies.contains_key(&strategy) {
                        tracing::error!(%queue, %strategy, "a pumped queue names a strategy this config lacks; its messages wait until a host with that strategy pumps it");
                        continue;
                    }
                    tracing::info!(%queue, %strategy, "found a pumped queue");
                    let _ = report.send(PumpedQueue { strategy, queue, config: config.clone() });
                }
            }
            Err(err) => tracing::warn!(error = %err, "listing the pumped queues failed; trying again later"),
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Every strategy's planner writes commands for one broker family: an SQS
/// strategy on RabbitMQ (or the reverse) is refused, naming the strategy.
/// The memory broker simulates both.
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

pub(super) fn check_broker_family(broker: &BrokerConfig, config: &Config, strategies: &Strategies) -> Result<(), ServiceError> {
    let (wanted, broker) = match broker {
        BrokerConfig::Memory => return Ok(()),
        BrokerConfig::Rabbitmq { .. } => (BrokerFamily::Amqp, "rabbitmq"),
        BrokerConfig::Sqs { .. } => (BrokerFamily::Sqs, "sqs"),
    };
    for name in strategies.names() {
        let info = strategies.get(name).map_err(ScheduleError::from)?.info();
        if info.family != wanted {
            return Err(ServiceError::Other(format!(
                "{}: strategy {name:?}: planner {} writes {:?} commands, but broker.kind = \"{broker}\"; use a {:?} planner or another broker",
                config.path.display(),
                info.name,
                info.family,
                wanted
            )));
        }
    }
    Ok(())
}

/// A policy that cannot answer the first redelivery is a config mistake:
/// refused before anything is declared, not at the first rejection.
fn check_redelivery_policies(config: &Config, scheduler: &Scheduler<Broker>) -> Result<(), ServiceError> {
    for entry in &config.redelivery {
        scheduler
            .decide_redelivery(entry.policy_or(&config.default_strategy), &entry.queue, 1, 0, None)
            .map_err(|e| ServiceError::Other(format!("{}: redelivery {:?}: {e}", config.path.display(), entry.queue)))?;
    }
    Ok(())
}

/// Sets up redelivery: declares the input, the
/// error queues and the consumer queues' dead-lettering (or sets broker
/// policies), and prepares each queue as a destination of its strategy.
async fn start_redelivery(
    config: &Config,
    scheduler: &Arc<Scheduler<Broker>>,
    publisher: &Arc<RabbitMqExecutor>,
    topology: TopologyAtStart,
    amqp: &str,
    management_url: Option<&str>,
) -> Result<Arc<Consumer<Redelivery>>, ServiceError> {
    let handler = Redelivery::new(config, scheduler.clone(), topology == TopologyAtStart::Apply);
    let named = |queue: &str, err: &dyn std::fmt::Display| ServiceError::Other(format!("{}: redelivery {queue:?}: {err}", config.path.display()));
    let consumer = Consumer::new(amqp, publisher.clone(), handler.clone());
    if topology == TopologyAtStart::Apply {
        consumer.declare().await?;
        let with_policy: Vec<String> =
            handler.entries().filter(|e| e.dead_letter == crate::config::DeadLetterSetup::BrokerPolicy).map(|e| e.queue.clone()).collect();
        if !with_policy.is_empty() {
            let management = crate::broker::rabbitmq::manage::management_url(amqp, management_url)
                .ok_or_else(|| named(&with_policy[0], &"dead_letter = \"broker-policy\" needs broker.management_url"))?;
            let api = crate::broker::rabbitmq::manage::Management::new(&management, crate::broker::rabbitmq::manage::vhost_of(amqp))
                .map_err(|e| named(&with_policy[0], &e))?;
            let handler = handler.clone();
            tokio::task::spawn_blocking(move || {
                for queue in &with_policy {
                    handler.apply_broker_policy(&api, queue).map_err(|e| (queue.clone(), format!("setting the broker policy: {e}")))?;
                }
                Ok(())
            })
            .await
            .map_err(|e| ServiceError::Other(e.to_string()))?
            .map_err(|(queue, e)| named(&queue, &e))?;
        }
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

/// Checks the default strategy's topology and the configured destinations'
/// setup on RabbitMQ through the management API (or passive declares).
pub(super) async fn verify_topology(config: &Config) -> Result<(), ServiceError> {
    let BrokerConfig::Rabbitmq { url, url_env, management_url, .. } = &config.broker else {
        return Err(ServiceError::Other(format!("{}: service.topology = \"verify\" needs broker.kind = \"rabbitmq\"", config.path.display())));
    };
    let mut strategies = Strategies::load(config)?;
    let planner = strategies.get_mut(&config.default_strategy).map_err(ScheduleError::from)?;
    let mut commands = planner.topology().map_err(ScheduleError::from)?;
    for destination in config.destinations.keys().filter(|d| config.strategy_for(d) == config.default_strategy) {
        commands.extend(planner.destination_setup(destination).map_err(ScheduleError::from)?);
    }
    let amqp = amqp_url(url.as_deref(), url_env.as_deref());
    let report = crate::broker::rabbitmq::verify::verify(&amqp, management_url.as_deref(), &commands).await.map_err(|e| ServiceError::Other(e.to_string()))?;
    if report.drifts.is_empty() {
        return Ok(());
    }
    let drifts = crate::broker::rabbitmq::verify::grouped(&report)
        .into_iter()
        .map(|(object, problems)| format!("{object}: {}", problems.join("; ")))
        .collect::<Vec<_>>()
        .join(" | ");
    Err(ServiceError::Drift { path: config.path.display().to_string(), drifts })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Refused before any broker is contacted: nothing listens on these addresses.
    #[tokio::test]
    async fn a_strategy_for_the_other_broker_family_is_refused_at_start_naming_it() {
        let cases = [
            ("kind = \"rabbitmq\"\nurl = \"amqp://guest:guest@127.0.0.1:1/%2f\"", "planner = \"sqs-cycles\"", "sqs-cycles"),
            ("kind = \"sqs\"\nregion = \"us-east-1\"\nendpoint_url = \"http://127.0.0.1:1\"", "planner = \"binary-levels\"", "binary-levels"),
        ];
        for (broker, planner, name) in cases {
            let text = format!(
                "default_strategy = \"fine\"\n[broker]\n{broker}\n[strategies.mismatched]\n{planner}\n[strategies.fine]\n{}\n",
                if name == "sqs-cycles" { "planner = \"binary-levels\"" } else { "planner = \"sqs-cycles\"" }
            );
            let config = Config::parse(std::path::Path::new("family.toml"), text).unwrap();
            let err = match Service::start(config).await {
                Ok(_) => panic!("{name} on the wrong broker started"),
                Err(err) => err.to_string(),
            };
            assert!(err.contains("strategy \"mismatched\"") && err.contains(name), "{err}");
        }
    }
}
