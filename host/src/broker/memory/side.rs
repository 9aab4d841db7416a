//! The embedded in-memory broker's side: its wall clock, which moves
//! messages along as they fall due, and its pump: a message due on a pumped
//! queue (an SQS strategy's delay queue) goes to its strategy's planner and
//! on, as on SQS. It has no queues to read.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::mpsc;

use super::MemoryExecutor;
use crate::command::DueAction;
use crate::config::Config;
use crate::planner::LoadedPlanner;
use crate::scheduler::PumpedQueue;
use crate::scheduler::strategies::Strategies;
use crate::service::pending::DepthReading;
use crate::service::side::{BrokerSide, Opened};
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
    fn start<'a>(&'a self, service: &'a Arc<Service>, _config: &'a Config) -> BoxFuture<'a, Result<(), ServiceError>> {
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
        service.spawn(tokio::spawn(pump(self.executor.clone(), pumped, service.background.stop.subscribe())));
        Box::pin(async { Ok(()) })
    }

    fn depth_reading(&self, _config: &Config) -> Option<DepthReading> {
        None
    }
}

/// Hands each message due on a pumped queue to its strategy's planner and
/// carries out the answer, until the service stops. A message whose queue no
/// strategy has reported yet waits for the next round.
async fn pump(executor: Arc<MemoryExecutor>, mut reported: mpsc::UnboundedReceiver<PumpedQueue>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut strategy_of: HashMap<String, PumpedQueue> = HashMap::new();
    let mut planners: HashMap<String, LoadedPlanner> = HashMap::new();
    let mut waiting = Vec::new();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(PUMP_EVERY) => {}
            _ = stop.wait_for(|stopping| *stopping) => return,
        }
        while let Ok(pumped) = reported.try_recv() {
            strategy_of.insert(pumped.queue.clone(), pumped);
        }
        waiting.extend(executor.take_due());
        for (question, due) in std::mem::take(&mut waiting) {
            let Some(pumped) = strategy_of.get(&question.queue) else {
                waiting.push((question, due));
                continue;
            };
            if !planners.contains_key(&pumped.strategy) {
                // Loading may compile the component: off the async workers, as SQS's pumps load theirs.
                let (config, strategy) = (pumped.config.clone(), pumped.strategy.clone());
                match tokio::task::spawn_blocking(move || Strategies::load_one(&config, &strategy))
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| r.map_err(|e| e.to_string()))
                {
                    Ok(planner) => planners.insert(pumped.strategy.clone(), planner),
                    Err(err) => {
                        tracing::error!(queue = %question.queue, strategy = %pumped.strategy, error = %err, "loading the pump's planner failed; trying again");
                        waiting.push((question, due));
                        continue;
                    }
                };
            }
            let answer = planners[&pumped.strategy].handle_due(&question);
            let carried = match answer {
                Ok(DueAction::Recycle(commands) | DueAction::HandOver(commands)) => executor.carry_out(&commands, due).map_err(|e| e.to_string()),
                Err(err) => Err(err.to_string()),
            };
            if let Err(err) = carried {
                // The memory broker has no dead-letter queue to park it in: the log is where it shows.
                tracing::error!(queue = %question.queue, id = %question.message_id, error = %err, "a due message could not go on; it is dropped from the memory broker");
            }
        }
    }
}
