//! `hourglass serve`: the long-lived host.
//!
//! * [`http`]: the API in front of the scheduler. `POST /v1/messages` answers
//!   `202` only after the broker confirmed the message; a bad request gets
//!   `400` (or `401`, `413`, `422`) with a JSON error naming the field, and
//!   nothing is published; a broker that cannot be reached gives `503`.
//! * [`startup`]: what [`Service::start`] runs for a config — planners,
//!   broker, topology, and the background tasks: the AMQP [`ingress`] and
//!   [`redelivery`] consumers on RabbitMQ, a pump for every pumped queue on SQS.
//! * Reload ([`Service::reload`], `POST /v1/reload`, SIGHUP): re-reads the
//!   config and swaps the planners; a bad config is refused and the old one
//!   keeps serving.
//!
//! `run(listener, service, shutdown)` serves until `shutdown` resolves, then
//! stops taking work and finishes what is in flight, so tests bind port 0.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub mod http;
pub mod ingress;
pub mod redelivery;
mod startup;

pub use crate::metrics::Metrics;
pub use http::{MAX_BODY_BYTES, router, run};

use crate::broker::rabbitmq::consume::Consumer;
use crate::broker::{Broker, Executor, ExecutorError};
use crate::config::{Config, TopologyAtStart};
use crate::scheduler::strategies::{Strategies, StrategyError};
use crate::scheduler::{ScheduleError, Scheduler};
use crate::service::ingress::Ingress;
use crate::service::redelivery::Redelivery;

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
    #[error("{0}")]
    Other(String),
}

/// The tasks that run beside the HTTP API, and how to stop them.
struct Background {
    stop: watch::Sender<bool>,
    tasks: std::sync::Mutex<Vec<JoinHandle<()>>>,
    ingress: Option<Arc<Consumer<Ingress>>>,
    redelivery: Option<Arc<Consumer<Redelivery>>>,
    /// Pumped queues with a pump, and the pump tasks (for readiness).
    pumps: std::sync::Mutex<(HashSet<String>, Vec<JoinHandle<()>>)>,
}

impl Default for Background {
    fn default() -> Self {
        Background { stop: watch::channel(false).0, tasks: Default::default(), ingress: None, redelivery: None, pumps: Default::default() }
    }
}

pub struct Service {
    scheduler: Arc<Scheduler<Broker>>,
    token: Option<String>,
    pub metrics: Arc<Metrics>,
    /// The config file `reload` re-reads; `None` when built from parts.
    source: Option<PathBuf>,
    topology: TopologyAtStart,
    shutdown_timeout: Duration,
    reloading: tokio::sync::Mutex<()>,
    background: Background,
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
        Arc::new(Service {
            metrics: scheduler.metrics().clone(),
            scheduler,
            token,
            source: None,
            topology: TopologyAtStart::Apply,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            reloading: Default::default(),
            background: Background::default(),
        })
    }

    fn spawn(&self, task: JoinHandle<()>) {
        self.background.tasks.lock().unwrap_or_else(|p| p.into_inner()).push(task);
    }

    pub fn scheduler(&self) -> &Arc<Scheduler<Broker>> {
        &self.scheduler
    }

    /// Per redelivery queue: waiting, redelivered, given up.
    pub fn redelivery_status(&self) -> Vec<crate::service::redelivery::QueueStatus> {
        self.background.redelivery.as_ref().map(|r| r.handler().status()).unwrap_or_default()
    }

    /// Broker connected, ingress and redelivery consuming, every pump running.
    pub async fn is_ready(&self) -> bool {
        let ingress_ready = self.background.ingress.as_ref().is_none_or(|i| i.is_consuming())
            && self.background.redelivery.as_ref().is_none_or(|r| r.is_consuming());
        let pumps_ready = self.background.pumps.lock().unwrap_or_else(|p| p.into_inner()).1.iter().all(|t| !t.is_finished());
        ingress_ready && pumps_ready && self.scheduler.executor().is_ready().await
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
            return Err(ServiceError::Other("this service was not started from a config file".into()));
        };
        let _one_at_a_time = self.reloading.lock().await;
        let (config, strategies) = tokio::task::spawn_blocking(move || -> Result<_, ServiceError> {
            let config = Config::load(&path)?;
            let strategies = Strategies::load(&config)?;
            Ok((config, strategies))
        })
        .await
        .map_err(|e| ServiceError::Other(e.to_string()))??;
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
        // Redelivery keeps running with the queues it started with: their strategies must stay.
        if let Some(redelivery) = &self.background.redelivery {
            let handler = redelivery.handler();
            for entry in handler.entries() {
                for strategy in [handler.strategy_of(entry), handler.policy_of(entry)] {
                    if !config.strategies.contains_key(&strategy) {
                        return Err(ServiceError::Other(format!(
                            "{}: strategy {strategy:?} is used by the running redelivery of queue {:?}; keep it, or restart to change redelivery",
                            config.path.display(),
                            entry.queue
                        )));
                    }
                }
            }
        }
        if self.topology == TopologyAtStart::Verify {
            startup::verify_topology(&config).await?;
        }
        let reloaded = Reloaded {
            strategies: config.strategies.keys().cloned().collect(),
            default_strategy: config.default_strategy.clone(),
            needs_restart,
        };
        let apply_default = self.topology == TopologyAtStart::Apply;
        self.scheduler.reload(config.clone(), strategies, apply_default).await?;
        self.prepare_configured_destinations(&config).await;
        Ok(reloaded)
    }

    /// Stops the background tasks and waits for them to finish their work in hand.
    async fn stop_background(&self) {
        let _ = self.background.stop.send(true);
        let tasks = std::mem::take(&mut *self.background.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        let pumps = std::mem::take(&mut self.background.pumps.lock().unwrap_or_else(|p| p.into_inner()).1);
        for task in tasks.into_iter().chain(pumps) {
            let _ = task.await;
        }
    }
}
