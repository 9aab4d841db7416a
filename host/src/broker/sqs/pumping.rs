//! `hourglass pump`: a pump-driven strategy's pumps run by one process,
//! outside a service, until told to stop; what they did is reported.

use super::pump::Pump;
use super::pumped::PumpSettings;
use crate::command::{Command, SqsCommand};
use crate::config::Config;
use crate::config::broker::SqsSettings;
use crate::executor::Broker;
use crate::report::{CommandError, Verdict};
use crate::scheduler::Scheduler;
use crate::scheduler::strategies::Strategies;

/// Runs the pumps of `strategy`'s pumped queues for each of `destinations`
/// (telling `started` of each queue) until `until` resolves, then lets them
/// finish the batches in hand.
#[allow(clippy::too_many_arguments)]
pub async fn pump_command(
    settings: &SqsSettings,
    config: &Config,
    strategies: Strategies,
    strategy: &str,
    destinations: &[String],
    wait_seconds: i32,
    started: &mut dyn FnMut(&str),
    until: impl Future<Output = ()>,
) -> Result<Verdict, CommandError> {
    let executor = super::connect(settings).await?;
    let scheduler: Scheduler<Broker> = Scheduler::new(config, strategies, executor.clone().into());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    let mut counters = Vec::new();
    let pump_settings = PumpSettings::from_config(config);
    for destination in destinations {
        scheduler.prepare_destination(strategy, destination).await?;
        let planner = Strategies::load_one(config, strategy)?;
        let pumped: Vec<String> = planner
            .destination_setup(destination)?
            .into_iter()
            .filter_map(|c| match c {
                Command::Sqs(SqsCommand::EnsureQueue { name, pumped: true, .. }) => Some(name),
                _ => None,
            })
            .collect();
        for queue in pumped {
            let planner = Box::new(Strategies::load_one(config, strategy)?);
            let (pump, _) = Pump::open(executor.clone(), planner, &queue, wait_seconds, &pump_settings, true).await?;
            started(&queue);
            counters.push(pump.counters.clone());
            tasks.push(tokio::spawn(pump.run(stopped.clone())));
        }
    }
    if tasks.is_empty() {
        return Err(CommandError::Argument { argument: "strategy", reason: format!("strategy {strategy} has no pumped queues: it is not pump-driven") });
    }
    until.await;
    stop.send(true).ok();
    for task in tasks {
        task.await.map_err(|e| CommandError::failed("a pump", e))??;
    }
    let handed_over: u64 = counters.iter().map(|c| c.snapshot().handed_over).sum();
    let visits: u64 = counters
        .iter()
        .map(|c| {
            let s = c.snapshot();
            s.recycled + s.handed_over
        })
        .sum();
    let requests = executor.requests.snapshot();
    let json = serde_json::json!({
        "pumps": counters.iter().map(|c| c.snapshot()).collect::<Vec<_>>(),
        "requests": requests,
        "requests_per_delivered_message": requests.message_requests() as f64 / handed_over.max(1) as f64,
        "requests_per_cycle": requests.message_requests() as f64 / visits.max(1) as f64,
    });
    let table = serde_json::to_string_pretty(&json).map_err(|e| CommandError::failed("writing the report", e))? + "\n";
    Ok(Verdict { passed: true, table, json })
}
