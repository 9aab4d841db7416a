//! `hourglass serve`: the long-lived host.
//!
//! * [`http`]: the API in front of the scheduler. `POST /v1/messages` answers
//!   `202` only after the broker confirmed the message; a bad request gets
//!   `400` (or `401`, `413`, `422`) with a JSON error naming the field, and
//!   nothing is published; a broker that cannot be reached gives `503`.
//! * [`startup`]: what [`Service::start_on`] runs for a config — planners,
//!   broker, topology — and [`side`]: what the broker runs beside the
//!   scheduler ([`side::BrokerSide`], implemented in each broker's folder),
//!   each task run by the [`supervise`] supervisor, which restarts a task that
//!   panicked or failed and tells readiness which task is down.
//! * [`ingress`]: the handler of the ingress queue (any broker's consumer runs
//!   it), [`canary`]: the lateness probes.
//! * [`pending`]: the queue depths read every few seconds, and [`status`]: the page at `/`.
//! * [`cancellations`]: what `DELETE`/`PATCH /v1/messages/{id}` ask, whichever
//!   broker keeps the cancellations.
//! * Reload ([`Service::reload`], `POST /v1/reload`, SIGHUP): re-reads the
//!   config and swaps the planners; a bad config is refused and the old one
//!   keeps serving.
//!
//! `run(listener, service, shutdown)` serves until `shutdown` resolves, then
//! stops taking work and finishes what is in flight, so tests bind port 0.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use thiserror::Error;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub mod canary;
pub mod cancellations;
pub mod connections;
pub mod http;
pub mod ingress;
pub mod pending;
pub mod side;
mod startup;
pub mod status;
pub mod supervise;

pub use crate::metrics::Metrics;
pub use http::{router, run};

use crate::config::{Config, TopologyAtStart};
use crate::executor::{Broker, Executor, ExecutorError};
use crate::scheduler::strategies::{Strategies, StrategyError};
use crate::scheduler::{ScheduleError, Scheduler};
use crate::service::supervise::{Down, Supervisor};

const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Debug, Error)]
pub enum ServiceError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Strategy(#[from] StrategyError),
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    #[error(transparent)]
    Broker(#[from] ExecutorError),
    #[error("{path}: topology drift on the broker (service.topology = \"verify\"): {drifts}")]
    Drift { path: String, drifts: String },
    /// A probe sent through a mechanism the strategies rely on came out wrong.
    #[error("the broker does not behave as the configured strategies need: {0}")]
    BrokerMechanism(String),
    /// The broker's topology could not be read to verify it (the broker's own error is the source).
    #[error("verifying the topology: {0}")]
    Verify(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A blocking step of start-up or reload (loading planners) panicked or was cancelled.
    #[error("a start-up task was lost: {0}")]
    TaskLost(#[from] tokio::task::JoinError),
    /// A config this service cannot run with, or a reload it cannot carry out: the file, and why (naming the key).
    #[error("{}: {reason}", path.display())]
    Refused { path: std::path::PathBuf, reason: String },
    /// A reload asked of a service started from a config in memory.
    #[error("this service was not started from a config file")]
    NotFromFile,
}

impl ServiceError {
    /// `config` cannot be run (or reloaded to) for `reason`.
    pub(crate) fn refused(config: &Config, reason: impl Into<String>) -> ServiceError {
        ServiceError::Refused { path: config.path.clone(), reason: reason.into() }
    }
}

impl ServiceError {
    /// The broker could not be reached (or refused for now): asking again later may succeed.
    pub(crate) fn broker_unavailable(&self) -> bool {
        matches!(self, ServiceError::Broker(ExecutorError::Unavailable(_)) | ServiceError::Schedule(ScheduleError::Broker(ExecutorError::Unavailable(_))))
    }
}

/// The tasks that run beside the HTTP API, and how to stop them: what a
/// broker's side starts its work under.
pub(crate) struct Background {
    pub(crate) stop: watch::Sender<bool>,
    /// Ingress, redelivery and pumps: restarted when they fail.
    pub(crate) supervisor: Supervisor,
    /// Unsupervised helpers (the pump starter), awaited at shutdown.
    tasks: std::sync::Mutex<Vec<JoinHandle<()>>>,
    /// Whatever keeps cancellations on this broker, when a strategy is
    /// cancellable; set by the broker's side as it starts, before the service serves.
    pub(crate) cancellations: OnceLock<Arc<dyn cancellations::Cancellations>>,
    /// Pumped queues with a pump, and the strategy each belongs to.
    pub(crate) pumps: std::sync::Mutex<BTreeMap<String, String>>,
}

impl Background {
    fn new(metrics: &Arc<Metrics>) -> Self {
        let stop = watch::channel(false).0;
        Background {
            supervisor: Supervisor::new(metrics.clone(), stop.subscribe()),
            stop,
            tasks: Default::default(),
            cancellations: OnceLock::new(),
            pumps: Default::default(),
        }
    }
}

/// What `/readyz` reports.
#[derive(Debug, serde::Serialize)]
pub struct Readiness {
    pub ready: bool,
    /// Whether the broker connections are up (and publishing not blocked).
    pub broker: bool,
    /// Every background task that should run and does not, and why.
    pub down: Vec<Down>,
}

pub struct Service {
    pub(crate) scheduler: Arc<Scheduler<Broker>>,
    /// What the broker runs beside the scheduler; `None` when built from parts.
    side: Option<Arc<dyn side::BrokerSide>>,
    token: Option<String>,
    pub metrics: Arc<Metrics>,
    /// The config file `reload` re-reads; `None` when built from parts.
    source: Option<PathBuf>,
    topology: TopologyAtStart,
    shutdown_timeout: Duration,
    reloading: tokio::sync::Mutex<()>,
    pub(crate) background: Background,
    /// Connection limits of the HTTP API.
    limits: connections::Limits,
    /// How often queue depths are read (`service.depth_poll`); else [`pending`]'s defaults.
    depth_poll: Option<Duration>,
    /// The last reading of every strategy's queue depths ([`pending`]).
    pending: std::sync::Mutex<Vec<pending::StrategyDepths>>,
    /// Batches being read or scheduled now (`POST /v1/messages:batch`).
    pub(crate) batches: http::BatchSlots,
}

/// The HTTP connection limits a config asks for.
fn http_limits(service: &crate::config::ServiceConfig) -> connections::Limits {
    use connections::Limits;
    let ms = |d: hourglass_planner_sdk::DurationMs| Duration::from_millis(d.ms());
    Limits {
        max_connections: service.max_connections.map_or(Limits::DEFAULT_MAX_CONNECTIONS, |n| n as usize),
        header_read_timeout: service.header_read_timeout.map_or(Limits::DEFAULT_HEADER_READ_TIMEOUT, ms),
        idle_timeout: service.idle_timeout.map_or(Limits::DEFAULT_IDLE_TIMEOUT, ms),
    }
}

/// What a reload changed.
#[derive(Debug, serde::Serialize)]
pub struct Reloaded {
    pub strategies: Vec<String>,
    pub default_strategy: String,
    /// Settings read only at start (broker, listen address, ingress, token): changed but not applied.
    pub needs_restart: Vec<&'static str>,
}

impl Service {
    /// An HTTP API over a ready scheduler, with nothing in the background and no reload.
    pub fn new(scheduler: Scheduler<Broker>, token: Option<String>) -> Arc<Service> {
        let scheduler = Arc::new(scheduler);
        let metrics = scheduler.metrics().clone();
        let config = scheduler.config();
        metrics.bound_labels(config.strategies.keys(), config.destinations.keys());
        Arc::new(Service {
            background: Background::new(&metrics),
            side: None,
            metrics,
            scheduler,
            token,
            source: None,
            topology: TopologyAtStart::Apply,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            reloading: Default::default(),
            limits: http_limits(&config.service),
            depth_poll: None,
            pending: Default::default(),
            batches: Default::default(),
        })
    }

    /// Every strategy's queue depths as last read (every `service.depth_poll`).
    pub fn pending(&self) -> Vec<pending::StrategyDepths> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn spawn(&self, task: JoinHandle<()>) {
        self.background.tasks.lock().unwrap_or_else(|p| p.into_inner()).push(task);
    }

    /// Whatever decides cancels and reschedules here, when a strategy has `cancellable = true`.
    pub fn cancellations(&self) -> Option<&dyn cancellations::Cancellations> {
        self.background.cancellations.get().map(|keeper| keeper.as_ref())
    }

    pub fn scheduler(&self) -> &Arc<Scheduler<Broker>> {
        &self.scheduler
    }

    /// `[[redelivery]]` as it runs: its input queue and, per queue, waiting, redelivered, given up.
    pub fn redelivery(&self) -> Option<side::RedeliveryReport> {
        self.side.as_ref().and_then(|side| side.redelivery())
    }

    /// Broker connected and every background task that should run running:
    /// ingress and redelivery consuming, every pump pumping. Reads state and
    /// never connects, so a probe with a short timeout always gets its answer.
    pub async fn readiness(&self) -> Readiness {
        let down = self.background.supervisor.down();
        let broker = self.scheduler.executor().is_ready().await;
        Readiness { ready: broker && down.is_empty(), broker, down }
    }

    pub async fn is_ready(&self) -> bool {
        self.readiness().await.ready
    }

    /// Re-reads the config file and swaps the strategies. On any error the
    /// running config stays and the error says why.
    pub async fn reload(&self) -> Result<Reloaded, ServiceError> {
        let result = self.reload_inner().await;
        match &result {
            Ok(reloaded) => {
                self.metrics.reload("applied");
                tracing::info!(strategies = ?reloaded.strategies, default = %reloaded.default_strategy, "config reloaded");
            }
            Err(err) => {
                self.metrics.reload("refused");
                tracing::error!(error = %err, "config reload refused; the running config stays");
            }
        }
        result
    }

    async fn reload_inner(&self) -> Result<Reloaded, ServiceError> {
        let Some(path) = self.source.clone() else {
            return Err(ServiceError::NotFromFile);
        };
        let _one_at_a_time = self.reloading.lock().await;
        let (config, strategies) = tokio::task::spawn_blocking(move || -> Result<_, ServiceError> {
            let config = Config::load(&path)?;
            let strategies = Strategies::load(&config)?;
            Ok((config, strategies))
        })
        .await??;
        let old = self.scheduler.config();
        let mut needs_restart = Vec::new();
        if config.broker != old.broker {
            needs_restart.push("broker");
        }
        if config.service != old.service {
            needs_restart.push("service");
        }
        if config.redelivery != old.redelivery {
            needs_restart.push("redelivery");
        }
        let cancellable = |c: &Config| c.strategies.values().filter(|s| s.cancellable).map(|s| s.name.clone()).collect::<Vec<_>>();
        if cancellable(&config) != cancellable(&old) {
            // Each cancellable strategy has a release consumer, started with the service.
            return Err(ServiceError::refused(
                &config,
                format!("the cancellable strategies changed ({:?} → {:?}); restart to change them", cancellable(&old), cancellable(&config)),
            ));
        }
        if let Some(side) = &self.side {
            side.check_reload(&config)?;
        }
        if let (TopologyAtStart::Verify, Some(side)) = (self.topology, &self.side) {
            startup::verify_topology(side.as_ref(), &config).await?;
        }
        // The broker is the running one: a changed broker needs a restart.
        startup::check_broker_family(&old.broker, &config, &strategies)?;
        let reloaded = Reloaded { strategies: config.strategies.keys().cloned().collect(), default_strategy: config.default_strategy.clone(), needs_restart };
        let apply_default = self.topology == TopologyAtStart::Apply;
        self.scheduler.reload(config.clone(), strategies, apply_default).await?;
        if let Some(side) = &self.side {
            side.start_added(self, &config).await?;
        }
        self.metrics.bound_labels(config.strategies.keys(), config.destinations.keys());
        self.prepare_configured_destinations(&config).await;
        Ok(reloaded)
    }

    pub fn limits(&self) -> connections::Limits {
        self.limits
    }

    /// Stops the background tasks and waits for them to finish their work in hand.
    async fn stop_background(&self) {
        let _ = self.background.stop.send(true);
        let tasks = std::mem::take(&mut *self.background.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        for task in tasks {
            let _ = task.await;
        }
        self.background.supervisor.join().await;
        if let Some(side) = &self.side {
            side.close().await;
        }
    }
}
