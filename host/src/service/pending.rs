//! What waits in each strategy's queues, read from the broker every
//! `service.depth_poll` (by default as often as the broker's side says in
//! its [`DepthReading`]: 5 s on RabbitMQ, 60 s on SQS), never per request: exported as
//! `hourglass_pending_messages{strategy,level}` and
//! `hourglass_parked_messages{strategy}`, and served at `GET /v1/delays` from
//! the last reading. Messages other clients scheduled through a shared preset
//! (NServiceBus, Celery) wait in the same queues and are counted too.
//!
//! The queues the strategies name are read through the executor
//! ([`crate::executor::Executor::queue_depth`]); a broker's [`DepthReading`]
//! adds what only it knows: queues a strategy makes per message (RabbitMQ's
//! hold queues, found through its management API), the queues beside a
//! parking or pumped queue whose messages count as parked (RabbitMQ's
//! orphans, SQS's dead-letter queues).

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use std::collections::BTreeMap;

use futures_util::future::BoxFuture;

use super::Service;
use crate::clock::unix_now_ms;
use crate::executor::{Broker, Executor, ExecutorError};
use crate::scheduler::Scheduler;

/// How the service reads a broker's queue depths.
pub struct DepthReading {
    /// How often, unless `service.depth_poll` says.
    pub every: Duration,
    /// Whether a waiting queue the broker no longer knows was deleted, so its
    /// strategy's topology is declared again.
    pub redeclare_deleted: bool,
    /// The queue beside a parking queue whose messages count as parked too
    /// (where RabbitMQ's unpark consumers move what cannot go on).
    pub orphans_of: Option<fn(&str) -> String>,
    /// The queue beside a pumped queue whose messages count as its strategy's
    /// parked (SQS's dead-letter queue).
    pub dead_letters_of: Option<fn(&str) -> String>,
    /// Finds the queues a strategy makes per message.
    pub per_message: Option<Arc<dyn PerMessageQueues>>,
}

impl DepthReading {
    /// Every `every`, the strategies' queues only.
    pub fn every(every: Duration) -> DepthReading {
        DepthReading { every, redeclare_deleted: false, orphans_of: None, dead_letters_of: None, per_message: None }
    }
}

/// Queues a strategy makes per message, which no config names.
pub trait PerMessageQueues: Send + Sync {
    /// The queues, with their depths, that dead-letter into `exchanges` (the strategy's).
    fn dead_lettering_to(&self, strategy: &str, exchanges: Vec<String>) -> BoxFuture<'_, Vec<QueueDepth>>;
}

/// One queue's depth at the last reading.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QueueDepth {
    pub queue: String,
    /// `None` when the broker could not tell (the queue is missing, or the broker away).
    pub messages: Option<u64>,
    /// The queue's message TTL: a message in it waits at most this long here.
    pub ttl_ms: Option<u64>,
}

/// A strategy's queues, as last read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StrategyDepths {
    pub strategy: String,
    /// Unix ms of the reading.
    pub read_at_ms: u64,
    /// Messages in all of its waiting queues that the broker could count.
    pub waiting: u64,
    /// Messages in its parking queues (their destination was gone).
    pub parked: u64,
    pub queues: Vec<QueueDepth>,
}

/// Reads every strategy's depths now. A strategy whose topology is not on
/// the broker (not yet declared since the last reconnect) is read only when
/// `declared_only` is false: a missing queue costs a channel error per look.
/// `pumped` (queue → strategy) adds each pumped queue; `reading` says what
/// the broker adds.
pub async fn read(scheduler: &Scheduler<Broker>, declared_only: bool, pumped: &BTreeMap<String, String>, reading: &DepthReading) -> Vec<StrategyDepths> {
    let parking = scheduler.parking_queues();
    let mut all = Vec::new();
    let mut by_strategy: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (queue, strategy) in pumped {
        by_strategy.entry(strategy).or_default().push(queue);
    }
    for (strategy, queues) in by_strategy {
        let mut depths = Vec::with_capacity(queues.len());
        let mut parked = 0;
        for queue in queues {
            let messages = scheduler.executor().queue_depth(queue).await;
            depths.push(QueueDepth { queue: queue.to_string(), messages, ttl_ms: None });
            if let Some(dead_letters_of) = reading.dead_letters_of {
                parked += scheduler.executor().queue_depth(&dead_letters_of(queue)).await.unwrap_or(0);
            }
        }
        let waiting = depths.iter().filter_map(|d| d.messages).sum();
        all.push(StrategyDepths { strategy: strategy.to_string(), read_at_ms: unix_now_ms(), waiting, parked, queues: depths });
    }
    let mut queues_of: BTreeMap<String, Vec<QueueDepth>> = BTreeMap::new();
    for (strategy, queues) in scheduler.waiting_queues() {
        let depths = queues_of.entry(strategy).or_default();
        for (queue, ttl_ms) in queues {
            let messages = scheduler.executor().queue_depth(&queue).await;
            depths.push(QueueDepth { queue, messages, ttl_ms });
        }
    }
    if let Some(finder) = &reading.per_message {
        for (strategy, exchanges) in scheduler.per_message_queue_targets() {
            let found = finder.dead_lettering_to(&strategy, exchanges).await;
            queues_of.entry(strategy).or_default().extend(found);
        }
    }
    for (strategy, depths) in queues_of {
        if declared_only && !scheduler.topology_applied(&strategy).await {
            continue;
        }
        let mut parked = 0;
        for queue in parking.get(&strategy).into_iter().flatten() {
            parked += scheduler.executor().queue_depth(queue).await.unwrap_or(0);
            if let Some(orphans_of) = reading.orphans_of {
                parked += scheduler.executor().queue_depth(&orphans_of(queue)).await.unwrap_or(0);
            }
        }
        let waiting = depths.iter().filter_map(|d| d.messages).sum();
        all.push(StrategyDepths { strategy, read_at_ms: unix_now_ms(), waiting, parked, queues: depths });
    }
    all
}

/// Reads the depths as `reading` says into the metrics and the service's
/// last reading, until the service stops.
pub(super) fn spawn_poll(service: &Arc<Service>, reading: DepthReading) {
    let every = service.depth_poll.unwrap_or(reading.every);
    let (polled, mut stop) = (service.clone(), service.background.stop.subscribe());
    service.spawn(tokio::spawn(async move {
        loop {
            // A reading may wait on a broker that does not answer (a reconnect
            // bounded by CONNECT_TIMEOUT per node); stop cuts it short.
            tokio::select! {
                () = poll_once(&polled, &reading) => {}
                _ = stop.wait_for(|stopping| *stopping) => return,
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stop.wait_for(|stopping| *stopping) => return,
            }
        }
    }));
}

/// Reads the depths once into the metrics and the service's last reading,
/// and declares again the topology of a strategy whose waiting queues are gone.
async fn poll_once(service: &Service, reading: &DepthReading) {
    let pumped = service.background.pumps.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let depths = read(&service.scheduler, true, &pumped, reading).await;
    for strategy in &depths {
        service.metrics.set_parked(&strategy.strategy, strategy.parked);
        for queue in &strategy.queues {
            if let Some(messages) = queue.messages {
                service.metrics.set_pending(&strategy.strategy, &queue.queue, messages);
            }
        }
    }
    if reading.redeclare_deleted {
        redeclare_missing(&service.scheduler, &depths).await;
    }
    *service.pending.lock().unwrap_or_else(|p| p.into_inner()) = depths;
}

/// A waiting queue of a strategy whose topology is on the broker that the
/// broker says no longer exists (someone deleted it): its strategy's topology
/// is declared again at once. Meanwhile nothing goes early: a direct level
/// parks what reaches it without its queue (see binary-levels' hold exchanges).
async fn redeclare_missing(scheduler: &Scheduler<Broker>, depths: &[StrategyDepths]) {
    for strategy in depths {
        let unread = strategy.queues.iter().filter(|q| q.messages.is_none());
        let mut missing = Vec::new();
        for queue in unread {
            // Unreadable is not missing: only the broker's own "not found" counts.
            if let Err(ExecutorError::Refused(_)) = scheduler.executor().check_destination(&queue.queue).await {
                missing.push(queue.queue.as_str());
            }
        }
        if missing.is_empty() {
            continue;
        }
        tracing::error!(strategy = %strategy.strategy, queues = ?missing, "waiting queues of the strategy are gone from the broker; declaring its topology again");
        if let Err(err) = scheduler.apply_topology(&strategy.strategy).await {
            tracing::error!(strategy = %strategy.strategy, error = %err, "could not declare the strategy's topology again");
        }
    }
}
