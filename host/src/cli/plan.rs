//! `hourglass plan`: show the broker commands one delayed message gets, and its route.

use std::process::ExitCode;

use anyhow::{Context, Result};
use hourglass::broker::registry;
use hourglass::planner::PlanRequest;
use hourglass::render;
use hourglass::report::{CostQuestion, StreamQuestion};
use hourglass::sim::simulation::Simulation;

use super::{Cli, DelayedMessage, TextOrJson, duration_arg, load, pick, print_json};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub message: DelayedMessage,
    #[arg(long, value_enum, default_value = "table")]
    pub format: TextOrJson,
    /// SQS price per million requests, for the cost of SQS strategies' plans.
    #[arg(long, default_value_t = 0.50)]
    pub price_per_million: f64,
    #[command(flatten)]
    pub stream: Stream,
}

/// SQS: the cost of a steady stream of messages like this one, not only of a burst.
#[derive(clap::Args)]
pub struct Stream {
    /// Estimate a stream of this many messages a second, arriving one by one.
    #[arg(long, value_name = "MSG/S")]
    pub rate: Option<f64>,
    /// With --rate: how long the stream lasts.
    #[arg(long = "for", value_parser = duration_arg, value_name = "DUR", default_value = "60s")]
    pub lasting_ms: u64,
    /// With --rate: the number of destinations the stream is spread over, each in turn.
    #[arg(long, default_value_t = 1)]
    pub destinations: u64,
    /// With --rate: one SQS request there and back (tens of ms on SQS).
    #[arg(long, value_parser = duration_arg, value_name = "DUR", default_value = "20ms")]
    pub round_trip: u64,
    /// With --rate: bytes of one message, body and attributes (default 1 KiB).
    #[arg(long)]
    pub message_bytes: Option<u64>,
}

impl Args {
    fn cost_question(&self) -> CostQuestion {
        let Stream { rate, lasting_ms, destinations, round_trip, message_bytes } = &self.stream;
        CostQuestion {
            price_per_million: self.price_per_million,
            stream: rate.map(|rate_per_second| StreamQuestion {
                rate_per_second,
                lasting_ms: *lasting_ms,
                destinations: *destinations,
                round_trip_ms: *round_trip,
                message_bytes: *message_bytes,
            }),
        }
    }
}

pub fn run(cli: &Cli, args: &Args) -> Result<ExitCode> {
    let Args { message, format, .. } = args;
    let delay = &message.delay_ms_from_now();
    let (config, mut strategies) = load(cli)?;
    let (name, planner) = pick(cli, &config, &mut strategies, Some(message.target()))?;
    // Due to an exchange, a message ends in its strategy's release queue, whose consumer publishes it there.
    let destination = &match &message.exchange {
        Some(_) => config.release_queue(&name),
        None => message.target().to_string(),
    };
    let request = PlanRequest { destination: destination.clone(), delay_ms: *delay, message_id: "plan-preview".into(), routing_key: None };
    let plan = planner.plan(&request)?;
    let info = planner.info().clone();
    let simulated = Simulation::new(planner, destination)?.run(&[*delay])?.remove(0);
    // A cost read off a route the simulation could not follow to its end would be wrong, not partial.
    if let Some(problem) = &simulated.problem {
        anyhow::bail!("strategy {name}: the simulation could not follow the message to {destination}: {problem}");
    }
    let cost = registry::plan_cost(&config, info.family, planner, &simulated, &args.cost_question()).with_context(|| format!("strategy {name}"))?;
    match format {
        TextOrJson::Json => {
            let mut json = serde_json::json!({
                "strategy": name,
                "planner": info.name,
                "destination": destination,
                "exchange": message.exchange,
                "routing_key": message.routing_key,
                "delay_ms": delay,
                "delivers_after_ms": plan.delivers_after_ms,
                "commands": plan.commands,
            });
            json.as_object_mut().expect("an object").extend(cost.json);
            print_json(&json)?
        }
        TextOrJson::Table => {
            println!(
                "strategy {name} (planner {} {}): to {destination} after {} (asked {})\n",
                info.name,
                info.version,
                render::duration(plan.delivers_after_ms),
                render::duration(*delay)
            );
            print!("{}", render::commands(&plan.commands));
            println!("\nroute on the in-memory broker:");
            print!("{}", render::route(&simulated.hops));
            match (simulated.arrival_ms, simulated.problem) {
                (Some(at), _) if message.exchange.is_some() => {
                    println!("delivered to {destination} after {}, whose consumer publishes it to {}", render::duration(at), message.describe())
                }
                (Some(at), _) => println!("delivered to {destination} after {}", render::duration(at)),
                (None, problem) => println!("NOT delivered: {}", problem.unwrap_or_default()),
            }
            for line in cost.lines {
                println!("{line}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
