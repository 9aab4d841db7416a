//! NATS JetStream's side of the service: a supervised consumer for every held
//! stream the strategies declare (`hold:<stream>`), each asking its strategy's
//! planner about the messages it delivers, and the ingress and canary
//! subjects (`[service.ingress]`, `[service.canary]`), each captured by a
//! stream of its own. A held stream belongs to one strategy: two strategies
//! naming the same one are refused at start, since its consumer could ask
//! only one of them. When a strategy is cancellable, the KV bucket of
//! cancellations (`broker::nats::cancel`), which its held stream asks at every
//! hand-over and the HTTP API and `hourglass cancel` write to. Before work
//! and every 10 s after (`clock-check`), the server's clock is read
//! (`broker::nats::clock`), so due times count on it.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use super::NatsExecutor;
use super::cancel::NatsCancel;
use super::clock;
use super::consume::NatsConsumer;
use super::hold::HeldStream;
use crate::command::Command;
use crate::config::Config;
use crate::config::broker::NatsSettings;
use crate::executor::Broker;
use crate::message::Handler;
use crate::scheduler::Scheduler;
use crate::scheduler::strategies::Strategies;
use crate::service::canary::Canary;
use crate::service::ingress::Ingress;
use crate::service::pending::DepthReading;
use crate::service::side::{BrokerSide, Drift, Opened, QueueConsumer, held_streams, supervise_canary_probes, supervise_consumer};
use crate::service::{Service, ServiceError};

/// How often stream depths are read unless `service.depth_poll` says: one request per stream.
const DEPTH_POLL: Duration = Duration::from_secs(5);

struct NatsSide {
    nats: Arc<NatsExecutor>,
    /// The stream the server's clock is read through (`broker.clock_stream`).
    clock_stream: String,
    /// The KV bucket of cancellations, opened at start when a strategy is cancellable.
    cancellations: std::sync::OnceLock<Arc<NatsCancel>>,
    /// The held streams this host consumes, so a reload starts only the new ones.
    holding: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

/// Opens the NATS server with its side.
pub(in crate::broker) async fn connect(settings: NatsSettings) -> Result<Opened, ServiceError> {
    let nats = super::connect(&settings).await?;
    let clock_stream = settings.clock_stream;
    let side = NatsSide { nats: nats.clone(), clock_stream, cancellations: Default::default(), holding: Default::default() };
    Ok((nats.into(), Arc::new(side)))
}

/// How often the server's clock is read once the service runs.
const CLOCK_EVERY: Duration = Duration::from_secs(10);
/// How long the start waits for the first reading of the server's clock.
const CLOCK_FIRST_WITHIN: Duration = Duration::from_secs(2);
const CLOCK_SOURCE: &str = "the stamp of a message JetStream stored";

impl BrokerSide for NatsSide {
    fn before_work<'a>(&'a self, scheduler: &'a Scheduler<Broker>) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            match tokio::time::timeout(CLOCK_FIRST_WITHIN, clock::read(&self.nats, &self.clock_stream)).await {
                Ok(Ok(reading)) => {
                    scheduler.clock().record(reading, CLOCK_SOURCE);
                    if let Some(offset) = scheduler.clock().offset() {
                        tracing::info!(offset_ms = offset.offset_ms, error_ms = offset.error_ms, "read the server's clock (offset = server minus host)");
                    }
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "could not read the server's clock; due times count on this host's clock until a reading succeeds"),
                Err(_) => {
                    tracing::warn!("the server's clock gave no reading within {CLOCK_FIRST_WITHIN:?}; due times count on this host's clock until one does")
                }
            }
        })
    }

    fn start<'a>(&'a self, service: &'a Arc<Service>, config: &'a Config) -> BoxFuture<'a, Result<(), ServiceError>> {
        Box::pin(async move {
            let declaring = service.scheduler.declaring();
            if config.service.ingress.enabled {
                let ingress = Ingress::with_plain_headers(config.service.ingress.clone(), service.scheduler.clone());
                supervise_consumer(&service.background, "nats-ingress", self.consumer(ingress, declaring).await?);
            }
            if config.service.canary.enabled {
                let canary = Canary::new(config.service.canary.clone(), service.scheduler.clone());
                supervise_consumer(&service.background, "canary", self.consumer(canary, declaring).await?);
                supervise_canary_probes(service, config);
            }
            if config.strategies.values().any(|s| s.cancellable) {
                let bucket = config.broker.cancellation_store(&config.service.cancel);
                let cancellations = Arc::new(NatsCancel::open(&self.nats, &bucket, config.service.cancel.retention_ms(), declaring).await?);
                self.nats.keep_fates_in(cancellations.clone());
                let _ = service.background.cancellations.set(cancellations.clone());
                let _ = self.cancellations.set(cancellations);
            }
            self.read_the_clock(service);
            self.hold_every_stream(service, config).await
        })
    }

    fn start_added<'a>(&'a self, service: &'a Service, config: &'a Config) -> BoxFuture<'a, Result<(), ServiceError>> {
        Box::pin(async move { self.hold_every_stream(service, config).await })
    }

    fn depth_reading(&self, _config: &Config) -> Option<DepthReading> {
        Some(depth_reading())
    }

    /// Each stream the commands ensure, checked as `hourglass verify` checks it;
    /// a server whose JetStream does not answer now is unavailable, not drifted.
    fn topology_drifts<'a>(&'a self, commands: &'a [Command]) -> BoxFuture<'a, Result<Option<Vec<Drift>>, ServiceError>> {
        Box::pin(async move {
            let report = super::verify::streams(&self.nats, commands).await.map_err(ServiceError::Broker)?;
            Ok(Some(report.into_iter().filter(|check| !check.passed).map(|check| (check.name, vec![check.detail])).collect()))
        })
    }
}

/// How stream depths are read on NATS: each held and parked stream's messages.
pub fn depth_reading() -> DepthReading {
    DepthReading::every(DEPTH_POLL)
}

impl<H: Handler> QueueConsumer for NatsConsumer<H> {
    fn is_consuming(&self) -> bool {
        NatsConsumer::is_consuming(self)
    }
    async fn run(self: Arc<Self>, stop: tokio::sync::watch::Receiver<bool>) {
        NatsConsumer::run(&self, stop).await
    }
}

impl NatsSide {
    /// Reads the server's clock every [`CLOCK_EVERY`] under the supervisor (`clock-check`).
    fn read_the_clock(&self, service: &Service) {
        let (nats, stream, clock, stop) =
            (self.nats.clone(), self.clock_stream.clone(), service.scheduler.clock().clone(), service.background.stop.subscribe());
        service.background.supervisor.spawn("clock-check", None, move || {
            let (nats, stream, clock, mut stop) = (nats.clone(), stream.clone(), clock.clone(), stop.clone());
            async move {
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep(CLOCK_EVERY) => {}
                        _ = stop.wait_for(|stopped| *stopped) => return Ok(()),
                    }
                    match clock::read(&nats, &stream).await {
                        Ok(reading) => clock.record(reading, CLOCK_SOURCE),
                        Err(e) => tracing::warn!(error = %e, "could not read the server's clock; the last readings stand"),
                    }
                }
            }
        });
    }

    /// A consumer of this server for `handler`, its subjects' streams created when `declaring`.
    async fn consumer<H: Handler>(&self, handler: Arc<H>, declaring: bool) -> Result<Arc<NatsConsumer<H>>, ServiceError> {
        let consumer = NatsConsumer::new(self.nats.clone(), handler);
        if declaring {
            consumer.declare().await?;
        }
        Ok(consumer)
    }

    /// Starts a consumer for each held stream not consumed yet, its strategy's
    /// topology applied first (the service applies only the default strategy's at start).
    async fn hold_every_stream(&self, service: &Service, config: &Config) -> Result<(), ServiceError> {
        for (stream, strategy) in held_streams(service, config)? {
            if self.holding.lock().unwrap_or_else(|p| p.into_inner()).contains(&stream) {
                continue;
            }
            service.scheduler.apply_topology(&strategy).await?;
            if self.holding.lock().unwrap_or_else(|p| p.into_inner()).insert(stream.clone()) {
                self.hold(service, config, &stream, &strategy);
            }
        }
        Ok(())
    }

    /// Runs the held stream's consumer under the supervisor, up while it pulls.
    fn hold(&self, service: &Service, config: &Config, stream: &str, strategy: &str) {
        let (nats, clock, stop, metrics) = (self.nats.clone(), service.scheduler.clock().clone(), service.background.stop.subscribe(), service.metrics.clone());
        let cancellations = config.strategies.get(strategy).filter(|s| s.cancellable).and_then(|_| self.cancellations.get().cloned());
        let (config, strategy, stream) = (Arc::new(config.clone()), strategy.to_string(), stream.to_string());
        let probe_slot: Arc<std::sync::Mutex<Option<Arc<HeldStream>>>> = Arc::default();
        let probe = probe_slot.clone();
        service.background.supervisor.spawn(
            format!("hold:{stream}"),
            Some(Box::new(move || probe.lock().unwrap_or_else(|p| p.into_inner()).as_ref().is_some_and(|held| held.is_consuming()))),
            move || {
                let (nats, clock, stop, config, strategy, stream, slot, cancellations, metrics) = (
                    nats.clone(),
                    clock.clone(),
                    stop.clone(),
                    config.clone(),
                    strategy.clone(),
                    stream.clone(),
                    probe_slot.clone(),
                    cancellations.clone(),
                    metrics.clone(),
                );
                async move {
                    // Loading may compile the component: off the async workers, as SQS's pumps load theirs.
                    let planner = tokio::task::spawn_blocking(move || Strategies::load_one(&config, &strategy))
                        .await
                        .map_err(|e| format!("loading the held stream's planner: {e}"))?
                        .map_err(|e| format!("loading the held stream's planner: {e}"))?;
                    let held = HeldStream::new(nats, Arc::new(planner), &stream, clock);
                    let held = Arc::new(match cancellations {
                        Some(cancellations) => held.cancellable(cancellations),
                        None => held,
                    });
                    super::metrics::count_hold(&metrics, held.stream(), held.counters.clone());
                    *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(held.clone());
                    held.run(stop).await.map_err(|e| format!("held stream stopped: {e}").into())
                }
            },
        );
    }
}
