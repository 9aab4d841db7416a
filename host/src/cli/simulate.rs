//! `hourglass simulate`: run messages through the strategy on the in-memory broker and show their routes.

use std::process::ExitCode;

use anyhow::Result;
use hourglass::render;
use hourglass::sim::simulation::Simulation;

use super::{Cli, TextOrJson, duration_arg, load, pick, print_json};

#[derive(clap::Args)]
pub struct Args {
    #[arg(long = "to", value_name = "DEST")]
    pub destination: String,
    #[arg(long = "delay", value_parser = duration_arg, value_name = "DUR", required = true)]
    pub delays: Vec<u64>,
    #[arg(long, value_enum, default_value = "table")]
    pub format: TextOrJson,
}

pub fn run(cli: &Cli, args: &Args) -> Result<ExitCode> {
    let Args { destination, delays, format } = args;
    let (config, mut strategies) = load(cli)?;
    let (_, planner) = pick(cli, &config, &mut strategies, Some(destination))?;
    let results = Simulation::new(planner, destination)?.run(delays)?;
    match format {
        TextOrJson::Json => print_json(&results)?,
        TextOrJson::Table => print!("{}", render::simulated(&results)),
    }
    Ok(if results.iter().all(|r| r.arrival_ms.is_some()) { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
