//! `hourglass serve`: the long-lived host.
//!
//! * An HTTP API in front of the scheduler. `POST /v1/messages` answers `202`
//!   only after the broker confirmed the message; a bad request gets `400` (or
//!   `401`, `413`, `422`) with a JSON error naming the field, and nothing is
//!   published; a broker that cannot be reached gives `503`.
//! * In the background ([`Service::start`]): the AMQP ingress and the
//!   redelivery input on RabbitMQ, and a pump for every pumped queue a
//!   destination setup declares on SQS.
//! * Reload ([`Service::reload`], `POST /v1/reload`, SIGHUP): re-reads the
//!   config and swaps the planners; a bad config is refused and the old one
//!   keeps serving.
//!
//! `run(listener, service, shutdown)` serves until `shutdown` resolves, then
//! stops taking work and finishes what is in flight, so tests bind port 0.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine;
use serde_json::{Value, json};
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

pub mod ingress;
pub mod redelivery;

pub use crate::metrics::Metrics;

use crate::broker::{Broker, amqp_url};
use crate::command::FieldValue;
use crate::config::{BrokerConfig, Config, TopologyAtStart};
use crate::broker::{Executor, ExecutorError};
use crate::broker::rabbitmq::consume::Consumer;
use crate::service::ingress::Ingress;
use crate::service::redelivery::Redelivery;
use crate::planner::{PlanRequest, PlannerError};
use crate::broker::sqs::pump::Pump;
use crate::scheduler::{PumpedQueue, ScheduleError, ScheduleRequest, Scheduler};
use crate::scheduler::strategies::{Strategies, StrategyError};

/// Largest message body accepted, after base64 decoding.
pub const MAX_BODY_BYTES: usize = 256 * 1024;
const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(20);
const DEFAULT_PUMP_WAIT_SECONDS: i32 = 20;

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

    /// Everything `serve` runs for a config: loads the planners, connects to
    /// the broker, applies or verifies the topology, prepares the configured
    /// destinations, starts the ingress (RabbitMQ) and the pumps (SQS).
    pub async fn start(config: Config) -> Result<Arc<Service>, ServiceError> {
        let loaded = config.clone();
        let strategies = tokio::task::spawn_blocking(move || Strategies::load(&loaded))
            .await
            .map_err(|e| ServiceError::Other(e.to_string()))??;
        let broker = Broker::connect(&config.broker).await?;
        let topology = config.service.topology.unwrap_or(TopologyAtStart::Apply);
        let mut scheduler = Scheduler::new(&config, strategies, broker);
        scheduler.set_declaring(topology == TopologyAtStart::Apply);
        let scheduler = Arc::new(scheduler);
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
        scheduler.report_pumped_queues(pumped_tx);
        let (mut ingress, mut redelivery) = (None, None);
        if let BrokerConfig::Rabbitmq { url, url_env, management_url } = &config.broker {
            let amqp = amqp_url(url.as_deref(), url_env.as_deref());
            if config.service.ingress.enabled {
                let consumer = Consumer::new(&amqp, Ingress::new(config.service.ingress.clone(), scheduler.clone()));
                if topology == TopologyAtStart::Apply {
                    consumer.declare().await?;
                }
                ingress = Some(consumer);
            }
            if !config.redelivery.is_empty() {
                redelivery = Some(start_redelivery(&config, &scheduler, topology, &amqp, management_url.as_deref()).await?);
            }
        }
        let service = Arc::new(Service {
            metrics: scheduler.metrics().clone(),
            scheduler,
            token: config.service.token(),
            source: Some(config.path.clone()),
            topology,
            shutdown_timeout: config.service.shutdown_timeout.map_or(DEFAULT_SHUTDOWN_TIMEOUT, |d| Duration::from_millis(d.ms())),
            reloading: Default::default(),
            background: Background { ingress, redelivery, ..Background::default() },
        });
        let pump_wait = config.service.pump_wait.map_or(DEFAULT_PUMP_WAIT_SECONDS, |d| d.ms().div_ceil(1000) as i32);
        let supervisor = tokio::spawn(supervise_pumps(service.clone(), pumped_rx, pump_wait));
        service.spawn(supervisor);
        if let Some(ingress) = &service.background.ingress {
            service.spawn(tokio::spawn(ingress.clone().run(service.background.stop.subscribe())));
        }
        if let Some(redelivery) = &service.background.redelivery {
            service.spawn(tokio::spawn(redelivery.clone().run(service.background.stop.subscribe())));
        }
        service.prepare_configured_destinations(&config).await;
        Ok(service)
    }

    fn spawn(&self, task: JoinHandle<()>) {
        self.background.tasks.lock().unwrap_or_else(|p| p.into_inner()).push(task);
    }

    pub fn scheduler(&self) -> &Arc<Scheduler<Broker>> {
        &self.scheduler
    }

    /// Sets up each configured destination now, so pumps start and mistakes
    /// show in the log at start; a destination that fails is prepared again on
    /// its first message.
    async fn prepare_configured_destinations(&self, config: &Config) {
        for destination in config.destinations.keys() {
            let strategy = config.strategy_for(destination).to_string();
            if let Err(err) = self.scheduler.prepare_destination(&strategy, destination).await {
                tracing::warn!(%destination, %strategy, error = %err, "configured destination not ready yet");
            }
        }
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
            verify_topology(&config).await?;
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

/// Starts a pump for each pumped queue reported, once per queue.
async fn supervise_pumps(service: Arc<Service>, mut reported: mpsc::UnboundedReceiver<PumpedQueue>, wait_seconds: i32) {
    let mut stop = service.background.stop.subscribe();
    loop {
        let pumped = tokio::select! {
            next = reported.recv() => match next { Some(p) => p, None => return },
            _ = stop.changed() => return,
        };
        if service.background.pumps.lock().unwrap_or_else(|p| p.into_inner()).0.contains(&pumped.queue) {
            continue;
        }
        let Broker::Sqs(sqs) = service.scheduler.executor() else {
            tracing::error!(queue = %pumped.queue, strategy = %pumped.strategy, "a pumped queue needs the SQS broker; not pumping it");
            continue;
        };
        let config = pumped.config.clone();
        let strategy = pumped.strategy.clone();
        let planner = match tokio::task::spawn_blocking(move || Strategies::load_one(&config, &strategy)).await {
            Ok(Ok(planner)) => planner,
            Ok(Err(err)) => {
                tracing::error!(queue = %pumped.queue, error = %err, "cannot load the pump's planner");
                continue;
            }
            Err(err) => {
                tracing::error!(queue = %pumped.queue, error = %err, "pump planner load panicked");
                continue;
            }
        };
        match Pump::new(sqs.clone(), Box::new(planner), &pumped.queue, wait_seconds).await {
            Ok(pump) => {
                tracing::info!(queue = %pumped.queue, strategy = %pumped.strategy, "pumping");
                service.metrics.watch_pump(&pumped.queue, pump.counters.clone());
                let queue = pumped.queue.clone();
                let pump_stop = service.background.stop.subscribe();
                let task = tokio::spawn(async move {
                    if let Err(err) = pump.run(pump_stop).await {
                        tracing::error!(%queue, error = %err, "pump stopped");
                    }
                });
                let mut pumps = service.background.pumps.lock().unwrap_or_else(|p| p.into_inner());
                pumps.0.insert(pumped.queue);
                pumps.1.push(task);
            }
            Err(err) => tracing::error!(queue = %pumped.queue, error = %err, "cannot start a pump"),
        }
    }
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
    topology: TopologyAtStart,
    amqp: &str,
    management_url: Option<&str>,
) -> Result<Arc<Consumer<Redelivery>>, ServiceError> {
    let handler = Redelivery::new(config, scheduler.clone(), topology == TopologyAtStart::Apply);
    let named = |queue: &str, err: &dyn std::fmt::Display| ServiceError::Other(format!("{}: redelivery {queue:?}: {err}", config.path.display()));
    let consumer = Consumer::new(amqp, handler.clone());
    if topology == TopologyAtStart::Apply {
        consumer.declare().await?;
        let with_policy: Vec<String> =
            handler.entries().filter(|e| e.dead_letter == crate::config::DeadLetterSetup::BrokerPolicy).map(|e| e.queue.clone()).collect();
        if !with_policy.is_empty() {
            let management = crate::broker::rabbitmq::manage::management_url(amqp, management_url)
                .ok_or_else(|| named(&with_policy[0], &"dead_letter = \"broker-policy\" needs broker.management_url"))?;
            let api = crate::broker::rabbitmq::manage::Management::new(&management, crate::broker::rabbitmq::manage::vhost_of(amqp)).map_err(|e| named(&with_policy[0], &e))?;
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
async fn verify_topology(config: &Config) -> Result<(), ServiceError> {
    let BrokerConfig::Rabbitmq { url, url_env, management_url } = &config.broker else {
        return Err(ServiceError::Other(format!("{}: service.topology = \"verify\" needs broker.kind = \"rabbitmq\"", config.path.display())));
    };
    let mut strategies = Strategies::load(config)?;
    let planner = strategies.get_mut(&config.default_strategy).map_err(ServiceError::Other)?;
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

/// A JSON error naming what was wrong.
struct ApiError {
    status: StatusCode,
    field: Option<&'static str>,
    message: String,
}

impl ApiError {
    fn bad(field: &'static str, message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::BAD_REQUEST, field: Some(field), message: message.into() }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(json!({ "error": self.message, "field": self.field }))).into_response()
    }
}

fn schedule_error(err: ScheduleError) -> ApiError {
    match err {
        ScheduleError::BadRequest(message) => ApiError::bad("request", message),
        ScheduleError::Invalid(invalid) => ApiError::bad(invalid.field, format!("{}: {}", invalid.field, invalid.reason)),
        ScheduleError::Unplannable(message) => ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, field: None, message },
        ScheduleError::Planner(PlannerError::Refused { message, planner }) => {
            ApiError::bad("delay", format!("planner {planner} refused: {message}"))
        }
        ScheduleError::Planner(other) => ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, field: None, message: other.to_string() },
        ScheduleError::Broker(ExecutorError::Invalid(message)) => ApiError::bad("request", message),
        ScheduleError::Broker(ExecutorError::Unavailable(message)) => {
            ApiError { status: StatusCode::SERVICE_UNAVAILABLE, field: None, message }
        }
        ScheduleError::Broker(other) => ApiError { status: StatusCode::UNPROCESSABLE_ENTITY, field: Some("destination"), message: other.to_string() },
    }
}

fn authorize(service: &Service, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(token) = &service.token else { return Ok(()) };
    let given = headers.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    if given == Some(token.as_str()) {
        Ok(())
    } else {
        Err(ApiError { status: StatusCode::UNAUTHORIZED, field: Some("authorization"), message: "missing or wrong bearer token".into() })
    }
}

fn parse_delay(value: &Value) -> Result<u64, ApiError> {
    match value {
        Value::String(text) => hourglass_planner_sdk::parse_duration_ms(text).map_err(|e| ApiError::bad("delay", e)),
        Value::Number(n) => n.as_u64().ok_or_else(|| ApiError::bad("delay", format!("{n} is not a non-negative whole number of milliseconds"))),
        Value::Null => Err(ApiError::bad("delay", "missing: give \"10s\" or milliseconds")),
        other => Err(ApiError::bad("delay", format!("{other} is neither a duration string nor milliseconds"))),
    }
}

/// Checks and converts the JSON body of `POST /v1/messages`.
fn parse_message(bytes: &[u8]) -> Result<ScheduleRequest, ApiError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| ApiError::bad("request", format!("not JSON: {e}")))?;
    let object = value.as_object().ok_or_else(|| ApiError::bad("request", "expected a JSON object"))?;
    const FIELDS: [&str; 6] = ["destination", "delay", "body", "encoding", "headers", "strategy"];
    if let Some(unknown) = object.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(ApiError::bad("request", format!("unknown field {unknown:?}; known: {}", FIELDS.join(", "))));
    }
    let destination = match object.get("destination") {
        Some(Value::String(d)) if !d.is_empty() => d.clone(),
        Some(_) => return Err(ApiError::bad("destination", "must be a non-empty string")),
        None => return Err(ApiError::bad("destination", "missing")),
    };
    let delay_ms = parse_delay(object.get("delay").unwrap_or(&Value::Null))?;
    let text = match object.get("body") {
        Some(Value::String(b)) => b.as_str(),
        None => "",
        Some(_) => return Err(ApiError::bad("body", "must be a string (text, or base64 with \"encoding\": \"base64\")")),
    };
    let body = match object.get("encoding").and_then(Value::as_str) {
        None | Some("text") => text.as_bytes().to_vec(),
        Some("base64") => base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|e| ApiError::bad("body", format!("not valid base64: {e}")))?,
        Some(other) => return Err(ApiError::bad("encoding", format!("{other:?} is not \"text\" or \"base64\""))),
    };
    if body.len() > MAX_BODY_BYTES {
        return Err(ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            field: Some("body"),
            message: format!("{} bytes; at most {MAX_BODY_BYTES}", body.len()),
        });
    }
    let mut headers = BTreeMap::new();
    match object.get("headers") {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (k, v) in map {
                let v = v.as_str().ok_or_else(|| ApiError::bad("headers", format!("header {k:?} must be a string")))?;
                headers.insert(k.clone(), FieldValue::Text(v.to_string()));
            }
        }
        Some(_) => return Err(ApiError::bad("headers", "must be an object of strings")),
    }
    let strategy = match object.get("strategy") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(ApiError::bad("strategy", "must be a string")),
    };
    Ok(ScheduleRequest { destination, delay_ms, body, headers, strategy, ..Default::default() })
}

async fn post_message(State(service): State<Arc<Service>>, headers: HeaderMap, bytes: Bytes) -> Response {
    if let Err(err) = authorize(&service, &headers) {
        return err.into_response();
    }
    let request = match parse_message(&bytes) {
        Ok(request) => request,
        Err(err) => {
            service.metrics.rejected(err.field.unwrap_or("request"));
            return err.into_response();
        }
    };
    let destination = request.destination.clone();
    let scheduler = &service.scheduler;
    if let Some(strategy) = &request.strategy
        && !scheduler.strategy_names().contains(strategy)
    {
        service.metrics.rejected("strategy");
        return ApiError::bad("strategy", format!("unknown strategy {strategy:?}")).into_response();
    }
    let strategy = request.strategy.clone().unwrap_or_else(|| scheduler.strategy_for(&destination));
    let started = Instant::now();
    let result = scheduler.schedule(request).await;
    service.metrics.observe_schedule(started.elapsed());
    match result {
        Ok(scheduled) => {
            service.metrics.scheduled(&scheduled.strategy, &destination);
            let body = json!({ "id": scheduled.id, "due_at": scheduled.due_at_ms, "strategy": scheduled.strategy });
            (StatusCode::ACCEPTED, axum::Json(body)).into_response()
        }
        Err(err) => {
            service.metrics.failed(&strategy, &destination);
            schedule_error(err).into_response()
        }
    }
}

async fn get_plan(State(service): State<Arc<Service>>, headers: HeaderMap, Query(query): Query<BTreeMap<String, String>>) -> Response {
    if let Err(err) = authorize(&service, &headers) {
        return err.into_response();
    }
    let Some(destination) = query.get("destination").filter(|d| !d.is_empty()) else {
        return ApiError::bad("destination", "missing").into_response();
    };
    let delay_ms = match parse_delay(&query.get("delay").map_or(Value::Null, |d| Value::String(d.clone()))) {
        Ok(ms) => ms,
        Err(err) => return err.into_response(),
    };
    let scheduler = &service.scheduler;
    let strategy = query.get("strategy").cloned().unwrap_or_else(|| scheduler.strategy_for(destination));
    let request = PlanRequest { destination: destination.clone(), delay_ms, message_id: "plan-preview".into(), routing_key: None };
    match scheduler.plan_only(&strategy, &request) {
        Ok(plan) => axum::Json(json!({ "strategy": strategy, "delivers_after_ms": plan.delivers_after_ms, "commands": plan.commands })).into_response(),
        Err(err) => schedule_error(err).into_response(),
    }
}

async fn get_topology(State(service): State<Arc<Service>>, headers: HeaderMap, Query(query): Query<BTreeMap<String, String>>) -> Response {
    if let Err(err) = authorize(&service, &headers) {
        return err.into_response();
    }
    let strategy = query.get("strategy").cloned().unwrap_or_else(|| service.scheduler.default_strategy());
    let commands = match service.scheduler.topology_of(&strategy) {
        Ok(commands) => commands,
        Err(err) => return schedule_error(err).into_response(),
    };
    match query.get("format").map(String::as_str).unwrap_or("json") {
        "json" => axum::Json(json!({ "strategy": strategy, "commands": commands })).into_response(),
        "mermaid" => crate::render::mermaid(&commands).into_response(),
        "dot" => crate::render::dot(&commands).into_response(),
        other => ApiError::bad("format", format!("{other:?} is not json, mermaid or dot")).into_response(),
    }
}

async fn get_redelivery(State(service): State<Arc<Service>>, headers: HeaderMap) -> Response {
    if let Err(err) = authorize(&service, &headers) {
        return err.into_response();
    }
    let input = service.background.redelivery.as_ref().map(|r| r.handler().input().to_string());
    axum::Json(json!({ "input": input, "queues": service.redelivery_status() })).into_response()
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(service): State<Arc<Service>>) -> Response {
    if service.is_ready().await {
        (StatusCode::OK, "ready").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready").into_response()
    }
}

async fn post_reload(State(service): State<Arc<Service>>, headers: HeaderMap) -> Response {
    if let Err(err) = authorize(&service, &headers) {
        return err.into_response();
    }
    match service.reload().await {
        Ok(reloaded) => axum::Json(reloaded).into_response(),
        Err(err) => ApiError { status: StatusCode::UNPROCESSABLE_ENTITY, field: Some("config"), message: err.to_string() }.into_response(),
    }
}

async fn get_metrics(State(service): State<Arc<Service>>) -> Response {
    ([("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")], service.metrics.encode()).into_response()
}

pub fn router(service: Arc<Service>) -> Router {
    Router::new()
        .route("/v1/messages", post(post_message))
        .route("/v1/plan", get(get_plan))
        .route("/v1/topology", get(get_topology))
        .route("/v1/reload", post(post_reload))
        .route("/v1/redelivery", get(get_redelivery))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(get_metrics))
        // Base64 makes a 256 KiB body about 350 KiB of JSON.
        .layer(axum::extract::DefaultBodyLimit::max(2 * MAX_BODY_BYTES))
        .with_state(service)
}

/// Serves until `shutdown` resolves; then stops accepting, stops the ingress
/// and the pumps, and waits (at most the shutdown timeout) for requests,
/// confirms and acks in flight.
pub async fn run(listener: TcpListener, service: Arc<Service>, shutdown: impl Future<Output = ()> + Send + 'static) -> std::io::Result<()> {
    let (signalled, mut signal) = watch::channel(false);
    let server = axum::serve(listener, router(service.clone())).with_graceful_shutdown(async move {
        shutdown.await;
        let _ = signalled.send(true);
    });
    let server = tokio::spawn(async move { server.await });
    tokio::pin!(server);
    tokio::select! {
        finished = &mut server => return finished.map_err(std::io::Error::other)?,
        _ = signal.wait_for(|s| *s) => {}
    }
    tracing::info!(timeout = ?service.shutdown_timeout, "shutting down: finishing work in flight");
    let drained = async {
        let (served, ()) = tokio::join!(&mut server, service.stop_background());
        served.map_err(std::io::Error::other)?
    };
    match tokio::time::timeout(service.shutdown_timeout, drained).await {
        Ok(result) => result,
        Err(_) => {
            // Unacked ingress messages go back to their queue; clients without a 202 retry.
            tracing::warn!(timeout = ?service.shutdown_timeout, "shutdown timeout: leaving work unfinished");
            Ok(())
        }
    }
}
