//! The embedded in-memory broker's side: its wall clock, which moves
//! messages along as they fall due, and its pump: a message due on a pumped
//! queue (an SQS strategy's delay queue) goes to its strategy's planner and
//! on, as on SQS, and a held stream's delivery (a NATS strategy's) to its
//! strategy's planner, which declines it until due, as on NATS. It has no
//! queues to read.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::mpsc;

use super::MemoryExecutor;
use crate::command::{DueAction, HeldAction};
use crate::config::Config;
use crate::planner::LoadedPlanner;
use crate::scheduler::PumpedQueue;
use crate::scheduler::strategies::Strategies;
use crate::service::pending::DepthReading;
use crate::service::side::{BrokerSide, Opened, held_streams};
use crate::service::{Service, ServiceError};

/// How often the pump looks for messages due on pumped queues.
const PUMP_EVERY: Duration = Duration::from_millis(50);

struct MemorySide {
    executor: Arc<MemoryExecutor>,
}

/// The in-memory broker with its wall clock.
pub(in crate::broker) fn connect() -> Opened {
    let executor = Arc::new(MemoryExecutor::default());
    (executor.clone().into(), Arc::new(MemorySide { executor }))
}

impl BrokerSide for MemorySide {
    fn start<'a>(&'a self, service: &'a Arc<Service>, config: &'a Config) -> BoxFuture<'a, Result<(), ServiceError>> {
        let (executor, stop) = (self.executor.clone(), service.background.stop.subscribe());
        service.background.supervisor.spawn("memory-clock", None, move || {
            let (executor, stop) = (executor.clone(), stop.clone());
            async move {
                executor.run_clock(stop).await;
                Ok(())
            }
        });
        let (reported, pumped) = mpsc::unbounded_channel();
        service.scheduler.report_pumped_queues(reported);
        let held = match held_streams(service, config) {
            Ok(held) => held,
            Err(err) => return Box::pin(async { Err(err) }),
        };
        let mut answering = Answering { executor: self.executor.clone(), service: Arc::downgrade(service), held, planners: HashMap::new() };
        Box::pin(async move {
            // The held streams' planners before the service takes work, as a NATS host loads them before it consumes.
            let config = service.scheduler.config();
            for strategy in answering.held.values().cloned().collect::<Vec<_>>() {
                if let Err(err) = answering.planner(&config, &strategy).await {
                    tracing::error!(%strategy, error = %err, "loading the held stream's planner failed; trying again at its first delivery");
                }
            }
            service.spawn(tokio::spawn(pump(answering, pumped, service.background.stop.subscribe())));
            Ok(())
        })
    }

    fn depth_reading(&self, _config: &Config) -> Option<DepthReading> {
        None
    }
}

/// What answers the messages that surface on the memory broker: the
/// strategies' planners, loaded on first use.
struct Answering {
    executor: Arc<MemoryExecutor>,
    /// To find the held streams of strategies a reload added.
    service: Weak<Service>,
    /// Each held stream with the strategy it belongs to.
    held: BTreeMap<String, String>,
    planners: HashMap<String, LoadedPlanner>,
}

impl Answering {
    /// `strategy`'s planner under `config`, loaded off the async workers the
    /// first time (loading may compile the component), as SQS's pumps load theirs.
    async fn planner(&mut self, config: &Arc<Config>, strategy: &str) -> Result<&LoadedPlanner, String> {
        if !self.planners.contains_key(strategy) {
            let (config, name) = (config.clone(), strategy.to_string());
            let planner = tokio::task::spawn_blocking(move || Strategies::load_one(&config, &name))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| e.to_string()))?;
            self.planners.insert(strategy.to_string(), planner);
        }
        Ok(&self.planners[strategy])
    }

    /// The strategy holding messages in `stream`, looked up again among the
    /// service's strategies when a reload may have added it.
    fn holder(&mut self, stream: &str) -> Option<(String, Arc<Config>)> {
        let service = self.service.upgrade()?;
        let config = service.scheduler.config();
        if !self.held.contains_key(stream)
            && let Ok(held) = held_streams(&service, &config)
        {
            self.held = held;
        }
        Some((self.held.get(stream)?.clone(), config))
    }
}

/// Hands each message due on a pumped queue, and each held stream's
/// delivery, to its strategy's planner and carries out the answer, until the
/// service stops. A message whose queue or stream no strategy has yet waits
/// for the next round.
async fn pump(mut answering: Answering, mut reported: mpsc::UnboundedReceiver<PumpedQueue>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut strategy_of: HashMap<String, PumpedQueue> = HashMap::new();
    let (mut waiting, mut waiting_held) = (Vec::new(), Vec::new());
    loop {
        tokio::select! {
            _ = tokio::time::sleep(PUMP_EVERY) => {}
            _ = stop.wait_for(|stopping| *stopping) => return,
        }
        while let Ok(pumped) = reported.try_recv() {
            strategy_of.insert(pumped.queue.clone(), pumped);
        }
        let executor = answering.executor.clone();
        waiting.extend(executor.take_due());
        for (question, due) in std::mem::take(&mut waiting) {
            let Some(pumped) = strategy_of.get(&question.queue) else {
                waiting.push((question, due));
                continue;
            };
            let planner = match answering.planner(&pumped.config, &pumped.strategy).await {
                Ok(planner) => planner,
                Err(err) => {
                    tracing::error!(queue = %question.queue, strategy = %pumped.strategy, error = %err, "loading the pump's planner failed; trying again");
                    waiting.push((question, due));
                    continue;
                }
            };
            let carried = match planner.handle_due(&question) {
                Ok(DueAction::Recycle(commands) | DueAction::HandOver(commands)) => executor.carry_out(&commands, &due.message).map_err(|e| e.to_string()),
                Err(err) => Err(err.to_string()),
            };
            if let Err(err) = carried {
                // The memory broker has no dead-letter queue to park it in: the log is where it shows.
                tracing::error!(queue = %question.queue, id = %question.message_id, error = %err, "a due message could not go on; it is dropped from the memory broker");
            }
        }
        waiting_held.extend(executor.take_held());
        for (question, held) in std::mem::take(&mut waiting_held) {
            let question = match question {
                Ok(question) => question,
                Err(err) => {
                    tracing::error!(stream = %held.stream, id = %held.message.id, error = %err, "a held message could not go on; it is dropped from the memory broker");
                    executor.drop_message(&held.message);
                    continue;
                }
            };
            let Some((strategy, config)) = answering.holder(&question.stream) else {
                waiting_held.push((Ok(question), held));
                continue;
            };
            let planner = match answering.planner(&config, &strategy).await {
                Ok(planner) => planner,
                Err(err) => {
                    tracing::error!(stream = %question.stream, %strategy, error = %err, "loading the held stream's planner failed; trying again");
                    waiting_held.push((Ok(question), held));
                    continue;
                }
            };
            let carried = match planner.handle_held(&question) {
                // As NATS's host: a decline's delay is at least 1 ms.
                Ok(HeldAction::Wait { ms }) => {
                    executor.redeliver(held, ms.max(1));
                    Ok(())
                }
                Ok(HeldAction::HandOver { commands }) => executor.carry_out(&commands, &held.message).map_err(|e| e.to_string()),
                Err(err) => {
                    executor.drop_message(&held.message);
                    Err(err.to_string())
                }
            };
            if let Err(err) = carried {
                tracing::error!(stream = %question.stream, error = %err, "a held message could not go on; it is dropped from the memory broker");
            }
        }
    }
}
