//! What `hourglass plan` adds for an SQS strategy: the requests its route
//! costs, alone and in a busy queue ([`cost`](super::cost)), and with
//! `--rate` what a steady stream of such messages costs
//! ([`traffic`](super::traffic)) with this config's send window and linger.

use std::time::Duration;

use serde::Serialize;

use super::cost::{BUSY_COHORT, BUSY_MESSAGE_BYTES, SqsCost};
use super::traffic::{self, Handling, Requests, Traffic};
use crate::planner::LoadedPlanner;
use crate::report::{CommandError, CostQuestion, PlanCost, StreamQuestion};
use crate::sim::simulation::{SimulatedMessage, Simulation};
use crate::sim::{Hop, HopStep};

/// A stream's estimate, as `plan` shows it.
#[derive(Serialize)]
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

/// How long the host gathers first sends into one request, and a pump
/// lingers for more messages before it sends, as configured (zero where
/// nothing is gathered: another broker runs the strategy's simulation).
#[derive(Clone, Copy, Debug, Default)]
pub struct Gathering {
    pub send_window: Duration,
    pub linger: Duration,
}

/// The cost of `route`, the simulated route of one message of `planner`'s:
/// JSON fields `sqs` (and `sqs_stream` with a rate) and a line of the table each.
pub fn plan_cost(gathering: Gathering, planner: &mut LoadedPlanner, route: &SimulatedMessage, question: &CostQuestion) -> Result<PlanCost, CommandError> {
    let alone = SqsCost::of_route(&route.hops, question.price_per_million);
    let mut cost = PlanCost::default();
    cost.lines.push(format!(
        "SQS requests: {} alone (1 send + {} pump visits x 3: receive, send, delete), {:.3} in a busy queue ({} messages of {} bytes due together: ten to a request, re-sent in bundles); ${:.7} to ${:.7} at ${} per million",
        alone.requests_alone,
        alone.pump_visits,
        alone.requests_in_a_busy_queue,
        BUSY_COHORT,
        BUSY_MESSAGE_BYTES,
        alone.cost_usd_in_a_busy_queue,
        alone.cost_usd_alone,
        alone.price_per_million_usd
    ));
    cost.json.insert("sqs".into(), to_json(&alone)?);
    if let Some(stream) = &question.stream {
        let estimate = stream_cost(gathering, planner, route, stream)?;
        let Requests { send_message_batch, receive_message, empty_receive_message, delete_message_batch } = estimate.requests;
        cost.lines.push(format!(
            "SQS requests for a stream of {} messages at {}/s to {} destination(s) ({}, send window {} ms, linger {} ms, round trip {} ms): {:.3} per message per cycle (SendMessageBatch {send_message_batch}, ReceiveMessage {receive_message} and {empty_receive_message} that ended empty, DeleteMessageBatch {delete_message_batch})",
            estimate.messages,
            estimate.rate_per_second,
            estimate.destinations,
            if estimate.shared_delay_queue { "one delay queue for all" } else { "a delay queue each" },
            estimate.send_window_ms,
            estimate.linger_ms,
            estimate.round_trip_ms,
            estimate.requests_per_message_per_cycle
        ));
        cost.json.insert("sqs_stream".into(), to_json(&estimate)?);
    }
    Ok(cost)
}

fn to_json(value: &impl Serialize) -> Result<serde_json::Value, CommandError> {
    serde_json::to_value(value).map_err(|e| CommandError::failed("the estimate as JSON", e))
}

/// Walks the stream through the host's batcher and pumps ([`traffic`]), with
/// this config's send window and linger, the cycle and visits of the
/// simulated route, and whether the planner puts a second destination's
/// messages in the same delay queue.
fn stream_cost(gathering: Gathering, planner: &mut LoadedPlanner, route: &SimulatedMessage, stream: &StreamQuestion) -> Result<StreamCost, CommandError> {
    let rate = stream.rate_per_second;
    if !(rate > 0.0 && rate.is_finite()) {
        return Err(CommandError::Argument { argument: "--rate", reason: "--rate: must be a positive number of messages a second".into() });
    }
    if stream.destinations == 0 {
        return Err(CommandError::Argument { argument: "--destinations", reason: "--destinations: must be at least 1".into() });
    }
    let pump_visits = pumped_queues(&route.hops).count() as u64;
    let cycle_ms = route.hops.iter().find(|h| matches!(h.step, HopStep::Pump { .. })).map_or(0, |h| h.at_ms);
    let second = |e| CommandError::failed("simulating a message to a second destination", e);
    let other = Simulation::new(planner, &format!("{}-another", route.destination)).map_err(second)?.run(&[route.requested_ms]).map_err(second)?.remove(0);
    let shared_delay_queue = pumped_queues(&route.hops).next().is_some() && pumped_queues(&route.hops).next() == pumped_queues(&other.hops).next();
    let (send_window_ms, linger_ms) = (gathering.send_window.as_secs_f64() * 1_000.0, gathering.linger.as_secs_f64() * 1_000.0);
    let messages = ((rate * stream.lasting_ms as f64 / 1_000.0).round() as u64).max(1);
    let message_bytes = stream.message_bytes.unwrap_or(BUSY_MESSAGE_BYTES);
    let handling = Handling {
        shared_delay_queue,
        send_window_ms,
        linger_ms,
        round_trip_ms: stream.round_trip_ms as f64,
        notice_ms: 0.0,
        cycle_ms: cycle_ms as f64,
        pump_visits,
    };
    let requests = traffic::requests(&Traffic { messages, rate_per_second: rate, destinations: stream.destinations, message_bytes }, &handling);
    Ok(StreamCost {
        messages,
        rate_per_second: rate,
        destinations: stream.destinations,
        shared_delay_queue,
        send_window_ms,
        linger_ms,
        round_trip_ms: stream.round_trip_ms as f64,
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
