//! `hourglass plan`: show the broker commands one delayed message gets, and its route.

use std::process::ExitCode;

use anyhow::Result;
use hourglass::broker::registry;
use hourglass::config::Config;
use hourglass::planner::{BrokerFamily, LoadedPlanner, PlanRequest};
use hourglass::render;
use hourglass::sim::cost::{BUSY_COHORT, BUSY_MESSAGE_BYTES, SqsCost};
use hourglass::sim::simulation::{SimulatedMessage, Simulation};
use hourglass::sim::traffic::{self, Handling, Requests, Traffic};
use hourglass::sim::{Hop, HopStep};

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
    /// With --rate: bytes of one message, body and attributes.
    #[arg(long, default_value_t = BUSY_MESSAGE_BYTES)]
    pub message_bytes: u64,
}

/// A stream's estimate, as `plan` shows it.
#[derive(serde::Serialize)]
struct StreamCost {
    messages: u64,
    rate_per_second: f64,
    destinations: u64,
    shared_delay_queue: bool,
    send_window_ms: f64,
    linger_ms: f64,
    round_trip_ms: f64,
    requests: Requests,
    requests_per_message_per_cycle: f64,
}

pub fn run(cli: &Cli, args: &Args) -> Result<ExitCode> {
    let Args { message, format, price_per_million, stream } = args;
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
    let cost = (info.family == BrokerFamily::Sqs).then(|| SqsCost::of_route(&simulated.hops, *price_per_million));
    let stream_cost = match stream.rate {
        Some(rate) if info.family == BrokerFamily::Sqs => Some(stream_cost(&config, planner, destination, &simulated, stream, rate)?),
        Some(_) => anyhow::bail!("--rate estimates SQS requests; strategy {name} is not an SQS strategy"),
        None => None,
    };
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
            "sqs_stream": stream_cost,
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
            if let Some(stream) = stream_cost {
                let Requests { send_message_batch, receive_message, empty_receive_message, delete_message_batch } = stream.requests;
                println!(
                    "SQS requests for a stream of {} messages at {}/s to {} destination(s) ({}, send window {} ms, linger {} ms, round trip {} ms): {:.3} per message per cycle (SendMessageBatch {send_message_batch}, ReceiveMessage {receive_message} and {empty_receive_message} that ended empty, DeleteMessageBatch {delete_message_batch})",
                    stream.messages,
                    stream.rate_per_second,
                    stream.destinations,
                    if stream.shared_delay_queue { "one delay queue for all" } else { "a delay queue each" },
                    stream.send_window_ms,
                    stream.linger_ms,
                    stream.round_trip_ms,
                    stream.requests_per_message_per_cycle
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Walks the stream through the host's batcher and pumps ([`traffic`]), with
/// this config's send window and linger, the cycle and visits of the
/// simulated route, and whether the planner puts a second destination's
/// messages in the same delay queue.
fn stream_cost(config: &Config, planner: &mut LoadedPlanner, destination: &str, route: &SimulatedMessage, stream: &Stream, rate: f64) -> Result<StreamCost> {
    anyhow::ensure!(rate > 0.0 && rate.is_finite(), "--rate: must be a positive number of messages a second");
    anyhow::ensure!(stream.destinations > 0, "--destinations: must be at least 1");
    let pump_visits = pumped_queues(&route.hops).count() as u64;
    let cycle_ms = route.hops.iter().find(|h| matches!(h.step, HopStep::Pump { .. })).map_or(0, |h| h.at_ms);
    let other = Simulation::new(planner, &format!("{destination}-another"))?.run(&[route.requested_ms])?.remove(0);
    let shared_delay_queue = pumped_queues(&route.hops).next().is_some() && pumped_queues(&route.hops).next() == pumped_queues(&other.hops).next();
    let (send_window, linger) = registry::gathering(config);
    let (send_window, linger) = (send_window.as_secs_f64() * 1_000.0, linger.as_secs_f64() * 1_000.0);
    let messages = ((rate * stream.lasting_ms as f64 / 1_000.0).round() as u64).max(1);
    let handling = Handling {
        shared_delay_queue,
        send_window_ms: send_window,
        linger_ms: linger,
        round_trip_ms: stream.round_trip as f64,
        notice_ms: 0.0,
        cycle_ms: cycle_ms as f64,
        pump_visits,
    };
    let requests =
        traffic::requests(&Traffic { messages, rate_per_second: rate, destinations: stream.destinations, message_bytes: stream.message_bytes }, &handling);
    Ok(StreamCost {
        messages,
        rate_per_second: rate,
        destinations: stream.destinations,
        shared_delay_queue,
        send_window_ms: send_window,
        linger_ms: linger,
        round_trip_ms: stream.round_trip as f64,
        requests_per_message_per_cycle: requests.per_message_per_cycle(messages, pump_visits),
        requests,
    })
}

/// The queues a pump took the message from, visit by visit.
fn pumped_queues(hops: &[Hop]) -> impl Iterator<Item = &str> {
    hops.iter().filter_map(|h| match &h.step {
        HopStep::Pump { queue, .. } => Some(queue.as_str()),
        _ => None,
    })
}
