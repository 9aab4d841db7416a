//! `hourglass topology`: show the strategy's static topology (and a destination's setup with --to); with --apply, declare it on the configured broker.

use std::process::ExitCode;

use anyhow::Result;
use hourglass::broker;
use hourglass::command::Command;
use hourglass::executor::Executor;
use hourglass::render;
use hourglass::scheduler::Scheduler;

use super::progress::Progress;
use super::{Cli, TopologyFormat, load, pick, print_json, tokio_runtime};

#[derive(clap::Args)]
pub struct Args {
    #[arg(long = "to", value_name = "DEST")]
    pub destinations: Vec<String>,
    #[arg(long, value_enum, default_value = "table")]
    pub format: TopologyFormat,
    /// Declare the topology (and each --to destination's setup) on the broker. Idempotent.
    #[arg(long)]
    pub apply: bool,
}

pub fn run(cli: &Cli, args: &Args) -> Result<ExitCode> {
    let Args { destinations, format, apply } = args;
    if *apply {
        let (config, strategies) = load(cli)?;
        let strategy = cli.strategy.clone().unwrap_or_else(|| config.default_strategy.clone());
        tokio_runtime()?.block_on(async {
            let broker = broker::connect(&config.broker).await?;
            let place = broker.describe();
            let scheduler = Scheduler::new(&config, strategies, broker);
            scheduler.apply_topology(&strategy).await?;
            if scheduler.executor().outlives_the_process()
                && let Some(queues) = scheduler.at_most_once_queues().remove(&strategy)
            {
                eprintln!(
                    "warning: strategy {strategy} uses classic queues that dead-letter at most once; a broker crash can lose messages waiting in them: {}",
                    queues.join(", ")
                );
            }
            // One destination that fails does not stop the others; the summary names it.
            let mut progress = Progress::new(destinations.len() as u64);
            let mut failed = Vec::new();
            for destination in destinations {
                match scheduler.prepare_destination(&strategy, destination).await {
                    Ok(_) => progress.step(destination, "prepared"),
                    Err(err) => {
                        progress.step(destination, "FAILED");
                        failed.push(format!("{destination}: {err}"));
                    }
                }
            }
            let took = progress.finish();
            println!("applied the topology of strategy {strategy} on {place}");
            if !destinations.is_empty() {
                println!(
                    "prepared {} of {} destinations in {}",
                    destinations.len() - failed.len(),
                    destinations.len(),
                    render::duration(took.as_millis() as u64)
                );
            }
            for failure in &failed {
                eprintln!("error: {failure}");
            }
            Ok::<_, anyhow::Error>(if failed.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        })
    } else {
        let (config, mut strategies) = load(cli)?;
        let (_, planner) = pick(cli, &config, &mut strategies, None)?;
        let mut commands: Vec<Command> = planner.topology()?;
        for destination in destinations {
            commands.extend(planner.destination_setup(destination)?);
        }
        match format {
            TopologyFormat::Table => print!("{}", render::commands(&commands)),
            TopologyFormat::Json => print_json(&commands)?,
            TopologyFormat::Mermaid => print!("{}", render::mermaid(&commands)),
            TopologyFormat::Dot => print!("{}", render::dot(&commands)),
        }
        Ok(ExitCode::SUCCESS)
    }
}
