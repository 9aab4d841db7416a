//! `hourglass pump`: run the cycle pumps of a pump-driven strategy (sqs-cycles) until interrupted.

use std::process::ExitCode;

use anyhow::{Result, bail};
use hourglass::broker;
use hourglass::broker::sqs::pump::Pump;
use hourglass::command::Command;
use hourglass::config::Config;
use hourglass::config::broker::SqsSettings;
use hourglass::executor::Broker;
use hourglass::scheduler::Scheduler;
use hourglass::scheduler::strategies::Strategies;

use super::serve::shutdown_signal;
use super::{Cli, load, tokio_runtime};

#[derive(clap::Args)]
pub struct Args {
    /// Destinations to pump for (default: the configured destinations using the strategy).
    #[arg(long = "to", value_name = "DEST")]
    pub destinations: Vec<String>,
    /// Long-poll wait of each receive, 1 to 20 seconds.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(i32).range(1..=20))]
    pub wait_seconds: i32,
}

pub fn run(cli: &Cli, args: &Args) -> Result<ExitCode> {
    let Args { destinations, wait_seconds } = args;
    let (config, strategies) = load(cli)?;
    let strategy = cli.strategy.clone().unwrap_or_else(|| config.default_strategy.clone());
    let destinations: Vec<String> = if destinations.is_empty() {
        config.destinations.keys().filter(|d| config.strategy_for(d) == strategy).cloned().collect()
    } else {
        destinations.clone()
    };
    if destinations.is_empty() {
        bail!("no destinations to pump for: give --to DEST or list them under [destinations] with strategy = {strategy:?}");
    }
    tokio_runtime()?.block_on(run_pumps(&config, strategies, &strategy, &destinations, *wait_seconds))?;
    Ok(ExitCode::SUCCESS)
}

async fn run_pumps(config: &Config, strategies: Strategies, strategy: &str, destinations: &[String], wait_seconds: i32) -> Result<()> {
    let Some(SqsSettings { region, endpoint_url, send_batch_window }) = config.broker.sqs() else {
        bail!("{}: pump needs broker.kind = \"sqs\"", config.path.display());
    };
    let executor = broker::sqs::connect(&SqsSettings { region, endpoint_url, send_batch_window }).await?;
    let scheduler: Scheduler<Broker> = Scheduler::new(config, strategies, executor.clone().into());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    let mut counters = Vec::new();
    let settings = hourglass::broker::sqs::pumped::PumpSettings::from_config(config);
    for destination in destinations {
        scheduler.prepare_destination(strategy, destination).await?;
        let planner = Strategies::load_one(config, strategy)?;
        let pumped: Vec<String> = planner
            .destination_setup(destination)?
            .into_iter()
            .filter_map(|c| match c {
                Command::SqsEnsureQueue { name, pumped: true, .. } => Some(name),
                _ => None,
            })
            .collect();
        for queue in pumped {
            let prepared = executor.prepare_pumped(&queue, &settings, true).await?;
            let pump =
                Pump::new(executor.clone(), Box::new(Strategies::load_one(config, strategy)?), &queue, wait_seconds).await?.prepared(&prepared, &settings);
            eprintln!("pumping {queue}");
            counters.push(pump.counters.clone());
            tasks.push(tokio::spawn(pump.run(stopped.clone())));
        }
    }
    if tasks.is_empty() {
        bail!("strategy {strategy} has no pumped queues: it is not pump-driven");
    }
    shutdown_signal().await;
    eprintln!("stopping: finishing the batches in hand");
    stop.send(true).ok();
    for task in tasks {
        task.await??;
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
    println!(
        "{}",
        serde_json::to_string_pretty(&serde_json::json!({
            "pumps": counters.iter().map(|c| c.snapshot()).collect::<Vec<_>>(),
            "requests": requests,
            "requests_per_delivered_message": requests.message_requests() as f64 / handed_over.max(1) as f64,
            "requests_per_cycle": requests.message_requests() as f64 / visits.max(1) as f64,
        }))?
    );
    Ok(())
}
