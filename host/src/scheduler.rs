//! Scheduling: one delayed message from request to confirmed broker publish.
//!
//! The first message of a strategy declares its topology; the first message to
//! a destination checks the destination exists and applies its setup. Both are
//! remembered, so later messages cost one plan and one publish.

use std::collections::{BTreeMap, HashSet};
use std::time::{SystemTime, UNIX_EPOCH};

use thiserror::Error;

use crate::command::{FieldTable, FieldValue};
use crate::config::Config;
use crate::executor::{DELAY_HEADER, DUE_AT_HEADER, Envelope, Executor, ExecutorError};
use crate::planner::{PlanRequest, PlannerError};
use crate::strategy::Strategies;

#[derive(Debug, Error)]
pub enum ScheduleError {
    #[error("{0}")]
    BadRequest(String),
    #[error(transparent)]
    Planner(#[from] PlannerError),
    #[error(transparent)]
    Broker(#[from] ExecutorError),
}

/// A message to deliver later.
#[derive(Clone, Debug, Default)]
pub struct ScheduleRequest {
    pub destination: String,
    pub delay_ms: u64,
    pub body: Vec<u8>,
    pub headers: FieldTable,
    pub properties: lapin::BasicProperties,
    /// Overrides the destination's strategy.
    pub strategy: Option<String>,
}

/// What the broker confirmed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scheduled {
    pub id: String,
    pub strategy: String,
    /// Unix ms at which the message is due: publish time plus the requested delay.
    pub due_at_ms: u64,
    /// The delay the strategy gives, after its rounding.
    pub delivers_after_ms: u64,
}

pub fn unix_now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

pub struct Scheduler<E> {
    executor: E,
    strategies: Strategies,
    destination_strategies: BTreeMap<String, String>,
    topology_applied: HashSet<String>,
    destinations_ready: HashSet<(String, String)>,
}

impl<E: Executor> Scheduler<E> {
    pub fn new(config: &Config, strategies: Strategies, executor: E) -> Self {
        let destination_strategies = config
            .destinations
            .iter()
            .filter_map(|(name, d)| d.strategy.clone().map(|s| (name.clone(), s)))
            .collect();
        Scheduler {
            executor,
            strategies,
            destination_strategies,
            topology_applied: HashSet::new(),
            destinations_ready: HashSet::new(),
        }
    }

    pub fn executor(&self) -> &E {
        &self.executor
    }

    /// A strategy's static topology, without applying it.
    pub fn topology_of(&mut self, strategy: &str) -> Result<Vec<crate::command::Command>, ScheduleError> {
        Ok(self.strategies.get_mut(strategy).map_err(ScheduleError::BadRequest)?.topology()?)
    }

    pub fn default_strategy(&self) -> &str {
        self.strategies.default_name()
    }

    pub fn strategy_names(&self) -> impl Iterator<Item = &str> {
        self.strategies.names()
    }

    /// The plan a message would get, without sending anything.
    pub fn plan_only(&mut self, strategy: &str, request: &PlanRequest) -> Result<crate::planner::Plan, ScheduleError> {
        Ok(self.strategies.get_mut(strategy).map_err(ScheduleError::BadRequest)?.plan(request)?)
    }

    pub fn strategy_for(&self, destination: &str) -> String {
        self.destination_strategies.get(destination).cloned().unwrap_or_else(|| self.strategies.default_name().to_string())
    }

    /// Declares a strategy's static topology (idempotent on the broker).
    pub async fn apply_topology(&mut self, strategy: &str) -> Result<(), ScheduleError> {
        let commands = self.strategies.get_mut(strategy).map_err(ScheduleError::BadRequest)?.topology()?;
        self.executor.apply(&commands).await?;
        self.topology_applied.insert(strategy.to_string());
        Ok(())
    }

    /// Checks the destination exists and applies its setup for `strategy`.
    pub async fn prepare_destination(&mut self, strategy: &str, destination: &str) -> Result<(), ScheduleError> {
        if !self.topology_applied.contains(strategy) {
            self.apply_topology(strategy).await?;
        }
        self.executor.check_destination(destination).await?;
        let setup = self.strategies.get_mut(strategy).map_err(ScheduleError::BadRequest)?.destination_setup(destination)?;
        self.executor.apply(&setup).await?;
        self.destinations_ready.insert((strategy.to_string(), destination.to_string()));
        Ok(())
    }

    pub async fn schedule(&mut self, request: ScheduleRequest) -> Result<Scheduled, ScheduleError> {
        let (scheduled, commands, envelope) = self.plan(request).await?;
        self.executor.send(&commands, &envelope).await?;
        Ok(scheduled)
    }

    /// Schedules many messages with up to `window` publishes awaiting their
    /// confirms at once. Results come back in request order; a failed message
    /// never hides behind a successful one.
    pub async fn schedule_many(&mut self, requests: Vec<ScheduleRequest>, window: usize) -> Vec<Result<Scheduled, ScheduleError>> {
        use futures_util::StreamExt;
        let mut planned = Vec::with_capacity(requests.len());
        for request in requests {
            planned.push(self.plan(request).await);
        }
        let executor = &self.executor;
        futures_util::stream::iter(planned)
            .map(|planned| async move {
                let (scheduled, commands, envelope) = planned?;
                executor.send(&commands, &envelope).await?;
                Ok(scheduled)
            })
            .buffered(window.max(1))
            .collect()
            .await
    }

    /// Everything up to the publish: preparation on first use, the plan, the envelope.
    async fn plan(&mut self, request: ScheduleRequest) -> Result<(Scheduled, Vec<crate::command::Command>, Envelope), ScheduleError> {
        if request.destination.is_empty() {
            return Err(ScheduleError::BadRequest("destination is empty".into()));
        }
        if let Some(reserved) = request.headers.keys().find(|k| k.starts_with("hourglass-")) {
            return Err(ScheduleError::BadRequest(format!("header {reserved:?} is reserved: hourglass-* headers are set by hourglass")));
        }
        let strategy = request.strategy.clone().unwrap_or_else(|| self.strategy_for(&request.destination));
        let key = (strategy.clone(), request.destination.clone());
        if !self.destinations_ready.contains(&key) {
            self.prepare_destination(&strategy, &request.destination).await?;
        }
        let id = uuid::Uuid::new_v4().to_string();
        let planner = self.strategies.get_mut(&strategy).map_err(ScheduleError::BadRequest)?;
        let plan = planner.plan(&PlanRequest {
            destination: request.destination.clone(),
            delay_ms: request.delay_ms,
            message_id: id.clone(),
            routing_key: None,
        })?;
        let due_at_ms = unix_now_ms() + request.delay_ms;
        let mut headers = request.headers;
        headers.insert(DELAY_HEADER.into(), FieldValue::Int(request.delay_ms as i64));
        headers.insert(DUE_AT_HEADER.into(), FieldValue::Int(due_at_ms as i64));
        let envelope = Envelope { id: id.clone(), body: request.body, headers, properties: request.properties };
        let scheduled = Scheduled { id, strategy, due_at_ms, delivers_after_ms: plan.delivers_after_ms };
        Ok((scheduled, plan.commands, envelope))
    }
}
