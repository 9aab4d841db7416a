//! SQS's side of the service: a supervised pump for every pumped queue (those
//! the strategies report and those found tagged on the account), the SQS
//! ingress and canary queues, and, when a strategy is cancellable, the fates
//! queue with this host's reply queue and a release receiver per strategy.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::mpsc;

use super::cancel::{SchedulerReplan, SqsCancel};
use super::consume::SqsConsumer;
use super::dead_letters::dead_letter_queue;
use super::fates_queue::FatesError;
use super::pump::Pump;
use super::pumped::{Discovery, PumpSettings};
use super::release::SqsRelease;
use super::{SqsExecutor, release_queue_declaration};
use crate::config::Config;
use crate::config::broker::SqsSettings;
use crate::executor::Executor;
use crate::message::Handler;
use crate::scheduler::PumpedQueue;
use crate::scheduler::strategies::Strategies;
use crate::service::canary::Canary;
use crate::service::ingress::Ingress;
use crate::service::pending::DepthReading;
use crate::service::side::{BrokerSide, Opened, QueueConsumer, supervise_canary_probes, supervise_consumer};
use crate::service::{Service, ServiceError};

const DEFAULT_PUMP_WAIT_SECONDS: i32 = 20;
const DEFAULT_PUMP_DISCOVERY: Duration = Duration::from_secs(60);
/// How often queue depths are read unless `service.depth_poll` says: two
/// requests per pumped queue per reading are billed.
const DEPTH_POLL: Duration = Duration::from_secs(60);

struct SqsSide {
    sqs: Arc<SqsExecutor>,
    /// The fates queue and this host's reply queue, when a strategy is cancellable.
    cancel: OnceLock<Arc<SqsCancel>>,
}

/// Opens SQS with its side.
pub(in crate::broker) async fn connect(settings: SqsSettings) -> Result<Opened, ServiceError> {
    let sqs = super::connect(&settings).await?;
    Ok((sqs.clone().into(), Arc::new(SqsSide { sqs, cancel: OnceLock::new() })))
}

impl BrokerSide for SqsSide {
    fn start<'a>(&'a self, service: &'a Arc<Service>, config: &'a Config) -> BoxFuture<'a, Result<(), ServiceError>> {
        Box::pin(async move {
            let scheduler = &service.scheduler;
            let declaring = service.scheduler.declaring();
            let wait_seconds = config.service.pump_wait.map_or(DEFAULT_PUMP_WAIT_SECONDS, |d| d.ms().div_ceil(1000) as i32);
            super::metrics::count_requests(&service.metrics, self.sqs.requests.clone());
            // Declared before anything starts.
            let releases = self.cancellation(service, config, declaring, wait_seconds).await?;
            let ingress = match config.service.sqs_ingress.enabled {
                true => {
                    let ingress = Ingress::with_plain_headers(config.service.sqs_ingress.as_ingress(), scheduler.clone());
                    Some(self.consumer(ingress, wait_seconds, declaring).await?)
                }
                false => None,
            };
            let canary = match config.service.canary.enabled {
                true => Some(self.consumer(Canary::new(config.service.canary.clone(), scheduler.clone()), wait_seconds, declaring).await?),
                false => None,
            };

            let (pumped_tx, pumped_rx) = mpsc::unbounded_channel();
            scheduler.report_pumped_queues(pumped_tx.clone());
            let pumps = PumpStart { wait_seconds, settings: PumpSettings::from_config(config), declaring };
            service.spawn(tokio::spawn(start_pumps(service.clone(), self.sqs.clone(), pumped_rx, pumps)));
            let every = config.service.pump_discovery.map_or(DEFAULT_PUMP_DISCOVERY, |d| Duration::from_millis(d.ms()));
            service.spawn(tokio::spawn(discover_pumped_queues(service.clone(), self.sqs.clone(), pumped_tx, every)));
            if let Some(cancel) = self.cancel.get() {
                supervise_cancellation(service, cancel, releases);
            }
            if let Some(ingress) = ingress {
                supervise_consumer(&service.background, "sqs-ingress", ingress);
            }
            if let Some(canary) = canary {
                supervise_consumer(&service.background, "canary", canary);
                supervise_canary_probes(service, config);
            }
            Ok(())
        })
    }

    fn depth_reading(&self, _config: &Config) -> Option<DepthReading> {
        Some(depth_reading())
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {
            if let Some(cancel) = self.cancel.get() {
                cancel.close().await;
            }
        })
    }
}

/// How queue depths are read on SQS: each pumped queue, with its dead-letter queue as parked.
pub fn depth_reading() -> DepthReading {
    DepthReading { dead_letters_of: Some(dead_letter_queue), ..DepthReading::every(DEPTH_POLL) }
}

impl<H: Handler> QueueConsumer for SqsConsumer<H> {
    fn is_consuming(&self) -> bool {
        SqsConsumer::is_consuming(self)
    }
    async fn run(self: Arc<Self>, stop: tokio::sync::watch::Receiver<bool>) {
        SqsConsumer::run(&self, stop).await
    }
}

impl SqsSide {
    /// A receiver of this broker for `handler`, its queue created when `declaring`.
    async fn consumer<H: Handler>(&self, handler: Arc<H>, wait_seconds: i32, declaring: bool) -> Result<Arc<SqsConsumer<H>>, ServiceError> {
        let consumer = SqsConsumer::new(self.sqs.clone(), handler, wait_seconds);
        if declaring {
            consumer.declare().await?;
        }
        Ok(consumer)
    }

    /// With a cancellable strategy: opens the fates queue with this host's
    /// reply queue (kept by the service) and returns a release receiver for
    /// each cancellable strategy.
    async fn cancellation(&self, service: &Service, config: &Config, declaring: bool, wait_seconds: i32) -> Result<Vec<Arc<SqsRelease>>, ServiceError> {
        let cancellable: Vec<&str> = config.strategies.values().filter(|s| s.cancellable).map(|s| s.name.as_str()).collect();
        if cancellable.is_empty() {
            return Ok(Vec::new());
        }
        // A cancel must outlive every claim that can come behind it, and SQS keeps a message 14 days at most.
        const SQS_RETENTION_MS: u64 = 14 * 24 * 3_600_000;
        if config.service.cancel.retention_ms() >= SQS_RETENTION_MS {
            return Err(ServiceError::refused(
                config,
                format!(
                    "service.cancel.retention must be below 14 days on SQS (the fates queue keeps a cancel no longer), got {} ms",
                    config.service.cancel.retention_ms()
                ),
            ));
        }
        let cancel = SqsCancel::open(self.sqs.clone(), &config.service.cancel, service.scheduler.clock().clone(), declaring).await.map_err(|e| match e {
            FatesError::Broker(e) => ServiceError::Broker(e),
            other => ServiceError::refused(config, format!("the SQS fates queue: {other}")),
        })?;
        let mut releases = Vec::new();
        for strategy in cancellable {
            let queue = config.release_queue(strategy);
            if declaring {
                self.sqs.apply(&[release_queue_declaration(&queue)]).await?;
            }
            releases.push(SqsRelease::new(self.sqs.clone(), strategy, &queue, cancel.fates().clone(), wait_seconds));
        }
        let _ = service.background.cancellations.set(cancel.clone());
        let _ = self.cancel.set(cancel);
        Ok(releases)
    }
}

/// Runs the SQS fates queue's deciding, this host's reply listener and the
/// release receivers under the supervisor: each is up while it reaches its queue.
fn supervise_cancellation(service: &Arc<Service>, cancel: &Arc<SqsCancel>, releases: Vec<Arc<SqsRelease>>) {
    let background = &service.background;
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

/// Starts a supervised pump (`pump:<queue>`) for each pumped queue reported, once per queue.
async fn start_pumps(service: Arc<Service>, sqs: Arc<SqsExecutor>, mut reported: mpsc::UnboundedReceiver<PumpedQueue>, start: PumpStart) {
    let mut stop = service.background.stop.subscribe();
    loop {
        let pumped = tokio::select! {
            next = reported.recv() => match next { Some(p) => p, None => return },
            _ = stop.changed() => return,
        };
        if service.background.pumps.lock().unwrap_or_else(|p| p.into_inner()).insert(pumped.queue.clone(), pumped.strategy.clone()).is_some() {
            continue;
        }
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
                let (pump, prepared) = Pump::open(sqs, Box::new(planner), &pumped.queue, start.wait_seconds, &start.settings, start.declaring)
                    .await
                    .map_err(|e| format!("starting the pump: {e}"))?;
                let pump = pump.clocked(clock);
                tracing::info!(queue = %pumped.queue, strategy = %pumped.strategy, dead_letters = ?prepared.dead_letters, "pumping");
                super::metrics::count_pump(&metrics, &pumped.queue, pump.counters.clone());
                pump.run(stop).await.map_err(|e| format!("pump stopped: {e}").into())
            }
        });
    }
}

/// Lists the account's queues now and every `every`, and reports each queue
/// tagged as pumped, so messages still cycling toward a destination no longer
/// configured (or only ever scheduled through the API) are pumped after a restart.
async fn discover_pumped_queues(service: Arc<Service>, sqs: Arc<SqsExecutor>, report: mpsc::UnboundedSender<PumpedQueue>, every: Duration) {
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
