//! `hourglass plan`: show the broker commands one delayed message gets, and its route.

use std::process::ExitCode;

use anyhow::Result;
use hourglass::planner::{BrokerFamily, PlanRequest};
use hourglass::render;
use hourglass::sim::simulation::Simulation;
use hourglass::sim::{Hop, HopStep};

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
    let Args { message: DelayedMessage { destination, delay }, format, price_per_million } = args;
    let (config, mut strategies) = load(cli)?;
    let (name, planner) = pick(cli, &config, &mut strategies, Some(destination))?;
    let request = PlanRequest { destination: destination.clone(), delay_ms: *delay, message_id: "plan-preview".into(), routing_key: None };
    let plan = planner.plan(&request)?;
    let info = planner.info().clone();
    let simulated = Simulation::new(planner, destination)?.run(&[*delay])?.remove(0);
    let cost = (info.family == BrokerFamily::Sqs).then(|| sqs_cost(&simulated.hops, *price_per_million));
    match format {
        TextOrJson::Json => print_json(&serde_json::json!({
            "strategy": name,
            "planner": info.name,
            "destination": destination,
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
                (Some(at), _) => println!("delivered to {destination} after {}", render::duration(at)),
                (None, problem) => println!("NOT delivered: {}", problem.unwrap_or_default()),
            }
            if let Some(cost) = cost {
                println!(
                    "SQS requests: {} (1 send + {} pump visits x 3: receive, send, delete); ${:.7} at ${} per million",
                    cost.requests, cost.pump_visits, cost.cost_usd, cost.price_per_million_usd
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(serde::Serialize)]
struct SqsCost {
    pump_visits: u64,
    requests: u64,
    price_per_million_usd: f64,
    cost_usd: f64,
}

/// The SQS bill of one message: its first send, then a receive, a send and a
/// delete each time it surfaces on a pumped queue.
fn sqs_cost(hops: &[Hop], price_per_million: f64) -> SqsCost {
    let pump_visits = hops.iter().filter(|h| matches!(h.step, HopStep::Pump { .. })).count() as u64;
    let requests = 1 + 3 * pump_visits;
    SqsCost { pump_visits, requests, price_per_million_usd: price_per_million, cost_usd: requests as f64 * price_per_million / 1e6 }
}
