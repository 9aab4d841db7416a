//! `hourglass pump`: run the cycle pumps of a pump-driven strategy (sqs-cycles) until interrupted.

use std::process::ExitCode;

use anyhow::{Result, bail};
use hourglass::broker::registry;

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
    let interrupted = async {
        shutdown_signal().await;
        eprintln!("stopping: finishing the batches in hand");
    };
    let mut started = |queue: &str| eprintln!("pumping {queue}");
    let verdict = tokio_runtime()?.block_on(registry::pump(&config, strategies, &strategy, &destinations, *wait_seconds, &mut started, interrupted))?;
    print!("{}", verdict.table);
    Ok(ExitCode::SUCCESS)
}
