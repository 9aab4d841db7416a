//! `hourglass plan`: show the broker commands one delayed message gets, and its route.

use std::process::ExitCode;

use anyhow::Result;
use hourglass::planner::{BrokerFamily, PlanRequest};
use hourglass::render;
use hourglass::sim::cost::{BUSY_COHORT, BUSY_MESSAGE_BYTES, SqsCost};
use hourglass::sim::simulation::Simulation;

use super::{Cli, DelayedMessage, TextOrJson, load, pick, print_json};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub message: DelayedMessage,
    #[arg(long, value_enum, default_value = "table")]
    pub format: TextOrJson,
    /// SQS price per million requests, for the cost of SQS strategies' plans.
    #[arg(long, default_value_t = 0.50)]
    pub price_per_million: f64,
}

pub fn run(cli: &Cli, args: &Args) -> Result<ExitCode> {
    let Args { message, format, price_per_million } = args;
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
    let cost = (info.family == BrokerFamily::Sqs).then(|| SqsCost::of_route(&simulated.hops, *price_per_million));
    match format {
        TextOrJson::Json => print_json(&serde_json::json!({
            "strategy": name,
            "planner": info.name,
            "destination": destination,
            "exchange": message.exchange,
            "routing_key": message.routing_key,
            "delay_ms": delay,
            "delivers_after_ms": plan.delivers_after_ms,
            "commands": plan.commands,
            "sqs": cost,
        }))?,
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
            if let Some(cost) = cost {
                println!(
                    "SQS requests: {} alone (1 send + {} pump visits x 3: receive, send, delete), {:.3} in a busy queue ({} messages of {} bytes due together: ten to a request, re-sent in bundles); ${:.7} to ${:.7} at ${} per million",
                    cost.requests_alone,
                    cost.pump_visits,
                    cost.requests_in_a_busy_queue,
                    BUSY_COHORT,
                    BUSY_MESSAGE_BYTES,
                    cost.cost_usd_in_a_busy_queue,
                    cost.cost_usd_alone,
                    cost.price_per_million_usd
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
