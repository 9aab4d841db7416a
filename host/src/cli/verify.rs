//! `hourglass verify`: compare the broker with the strategy's topology (and
//! each --to destination's setup), and check what the configured broker
//! relies on: on RabbitMQ a probe through each mechanism the strategies use
//! and their quorum queues against the nodes' file handle limits; on NATS the
//! server's version, JetStream, a declined message's return and every
//! strategy's streams. The broker renders its own report.

use std::process::ExitCode;

use anyhow::Result;
use hourglass::broker::registry;

use super::{Cli, TextOrJson, load, print_json, tokio_runtime};

#[derive(clap::Args)]
pub struct Args {
    #[arg(long = "to", value_name = "DEST")]
    pub destinations: Vec<String>,
    /// Skip the probes (one message through each broker mechanism the strategies use).
    #[arg(long)]
    pub no_probes: bool,
    #[arg(long, value_enum, default_value = "table")]
    pub format: TextOrJson,
}

pub fn run(cli: &Cli, args: &Args) -> Result<ExitCode> {
    let Args { destinations, no_probes, format } = args;
    let (config, mut strategies) = load(cli)?;
    let strategy = cli.strategy.clone().unwrap_or_else(|| config.default_strategy.clone());
    let verdict = tokio_runtime()?.block_on(registry::verify(&config, &mut strategies, &strategy, destinations, !no_probes))?;
    match format {
        TextOrJson::Json => print_json(&verdict.json)?,
        TextOrJson::Table => print!("{}", verdict.table),
    }
    Ok(if verdict.passed { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
