//! Fixed intervals: a TTL queue per configured interval and a return exchange.
//!
//! Each interval has a fanout exchange and a queue whose TTL is that interval;
//! expired messages dead-letter to one headers exchange, the return exchange,
//! which routes on the `hourglass-destination` header back to the destination
//! queue. Dead-lettering keeps the routing key the message was published with,
//! so the original key arrives unchanged; it is also kept in the
//! `hourglass-original-routing-key` header. Delays that are not an interval
//! round up to the next one or are refused, as configured. Redelivery policies
//! use the intervals in order: attempt `n` waits `intervals[n-1]`.
//!
//! Interval queues are quorum queues that dead-letter at least once unless
//! `queue_type = "classic"` is chosen, and the return exchange parks what no
//! destination is bound for in `<prefix>.parked`.

use hourglass_planner_sdk::*;
use serde::Deserialize;

pub const DESTINATION_HEADER: &str = "hourglass-destination";
pub const ORIGINAL_KEY_HEADER: &str = "hourglass-original-routing-key";

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "kebab-case")]
pub enum Rounding {
    /// Use the next interval at or above the delay.
    #[default]
    Up,
    /// Refuse a delay that is not one of the intervals.
    Reject,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub intervals: Vec<DurationMs>,
    #[serde(default)]
    pub rounding: Rounding,
    pub prefix: Option<String>,
    pub queue_type: Option<QueueType>,
    /// Another redelivery policy; by default redelivery n waits the n-th interval.
    pub redelivery: Option<RedeliveryPolicy>,
}

#[derive(Debug)]
pub struct FixedIntervals {
    intervals: Vec<u64>,
    rounding: Rounding,
    prefix: String,
    queue_type: QueueType,
    redelivery: RedeliveryPolicy,
    /// Where `plan` publishes, registered once: each interval's exchange
    /// (beside `intervals`) and the return exchange, for no delay.
    interval_keys: Vec<Key>,
    return_key: Key,
}

fn interval_name(prefix: &str, interval_ms: u64) -> String {
    format!("{prefix}.{interval_ms}ms")
}

fn return_exchange(prefix: &str) -> String {
    format!("{prefix}.return")
}

impl FixedIntervals {
    pub fn interval_name(&self, interval_ms: u64) -> String {
        interval_name(&self.prefix, interval_ms)
    }

    pub fn return_exchange(&self) -> String {
        return_exchange(&self.prefix)
    }

    pub fn parking(&self) -> Parking {
        Parking::under(&self.prefix)
    }

    /// The interval a delay waits, and its index.
    fn choose(&self, delay_ms: u64) -> Result<(usize, u64), String> {
        let next = self.intervals.iter().copied().enumerate().find(|&(_, i)| i >= delay_ms);
        match (self.rounding, next) {
            (_, Some((n, i))) if i == delay_ms => Ok((n, i)),
            (Rounding::Up, Some(chosen)) => Ok(chosen),
            (Rounding::Reject, _) => Err(format!("delay {delay_ms}ms is not one of the intervals {:?} (rounding = \"reject\")", self.intervals)),
            (Rounding::Up, None) => Err(format!("delay {delay_ms}ms is above the longest interval {}ms", self.intervals.last().copied().unwrap_or(0))),
        }
    }
}

impl Planner for FixedIntervals {
    type Config = Config;

    fn info() -> Info {
        Info::new("fixed-intervals", env!("CARGO_PKG_VERSION"), BrokerFamily::Amqp)
            .key("intervals", "the delays offered, e.g. [\"5m\", \"15m\", \"30m\"]", None)
            .key("rounding", "up (next interval) or reject, for delays that are not an interval", Some("up"))
            .key("prefix", "names: <prefix>.<interval>ms, <prefix>.return, <prefix>.parked", Some("hourglass.interval"))
            .key("queue_type", "quorum (dead-letters at least once) or classic (a broker crash can lose messages)", Some("quorum"))
    }

    fn new(config: Config) -> Result<Self, String> {
        let mut intervals: Vec<u64> = config.intervals.iter().map(|d| d.ms()).collect();
        if intervals.is_empty() {
            return Err("intervals: give at least one interval".into());
        }
        if let Some(bad) = intervals.iter().find(|&&i| i == 0 || i > AMQP_MAX_TTL_MS) {
            return Err(format!("intervals: {bad}ms is not between 1ms and 10 years"));
        }
        intervals.sort_unstable();
        intervals.dedup();
        let prefix = config.prefix.unwrap_or_else(|| "hourglass.interval".to_string());
        if prefix.is_empty() || prefix.len() > 200 {
            return Err(format!("prefix: {prefix:?} must be 1 to 200 bytes"));
        }
        let longest = intervals.last().copied().unwrap_or(0);
        let redelivery = checked_policy(config.redelivery, longest)?
            .unwrap_or_else(|| RedeliveryPolicy::Intervals { intervals: intervals.iter().map(|&i| DurationMs(i)).collect() });
        let queue_type = config.queue_type.unwrap_or_default();
        let interval_keys = intervals.iter().map(|&i| Key::register(&interval_name(&prefix, i))).collect();
        let return_key = Key::register(&return_exchange(&prefix));
        Ok(FixedIntervals { intervals, rounding: config.rounding, prefix, queue_type, redelivery, interval_keys, return_key })
    }

    fn delay_range(&self) -> DelayRange {
        let mut delays = vec![0];
        delays.extend(&self.intervals);
        DelayRange::listed(delays)
    }

    fn topology(&self) -> Result<Vec<Command>, String> {
        let return_exchange = self.return_exchange();
        let parking = self.parking();
        let mut commands = parking.topology(self.queue_type);
        commands.push(declare_exchange(&return_exchange, ExchangeKind::Headers, vec![parking.alternate_exchange()]));
        for &interval in &self.intervals {
            let name = self.interval_name(interval);
            commands.push(declare_exchange(&name, ExchangeKind::Fanout, vec![]));
            let mut arguments = self.queue_type.dead_letter_arguments();
            arguments.push(int("x-message-ttl", interval as i64));
            arguments.push(text("x-dead-letter-exchange", return_exchange.as_str()));
            commands.push(declare_queue(&name, arguments));
            commands.push(bind_queue(&name, &name, ""));
        }
        Ok(commands)
    }

    fn destination_setup(&self, destination: &str) -> Result<Vec<Command>, String> {
        if destination.is_empty() {
            return Err("destination is empty".into());
        }
        let match_destination = vec![text("x-match", "all"), text(DESTINATION_HEADER, destination)];
        Ok(vec![bind_queue_with(destination, &self.return_exchange(), "", match_destination)])
    }

    fn plan(&self, request: &PlanRequest) -> Result<Plan, String> {
        let destination = request.destination.as_str();
        if destination.is_empty() {
            return Err("destination is empty".into());
        }
        let routing_key = request.routing_key.as_deref().unwrap_or(destination);
        let headers = vec![text(DESTINATION_HEADER, destination), text(ORIGINAL_KEY_HEADER, routing_key)];
        if request.delay_ms == 0 {
            let publish = publish(self.return_key, routing_key, headers);
            return Ok(Plan { commands: vec![publish], delivers_after_ms: 0 });
        }
        let (n, interval) = self.choose(request.delay_ms)?;
        let publish = publish(self.interval_keys[n], routing_key, headers);
        Ok(Plan { commands: vec![publish], delivers_after_ms: interval })
    }

    fn decide_redelivery(&self, request: &RedeliveryRequest) -> Result<RedeliveryDecision, String> {
        // A delay between intervals is delivered at the next one (or refused with rounding = "reject").
        decide_with(Some(&self.redelivery), request)
    }
}

register_planner!(FixedIntervals);

#[cfg(test)]
mod tests {
    use super::*;

    fn planner(rounding: Rounding) -> FixedIntervals {
        FixedIntervals::new(Config {
            intervals: vec![DurationMs(30_000), DurationMs(5_000), DurationMs(15_000)],
            rounding,
            prefix: None,
            queue_type: None,
            redelivery: None,
        })
        .unwrap()
    }

    fn request(delay_ms: u64) -> PlanRequest {
        PlanRequest { destination: "orders".into(), delay_ms, message_id: "m".into(), routing_key: Some("orders.created".into()) }
    }

    #[test]
    fn rounds_up_to_the_next_interval_and_keeps_the_original_key() {
        let plan = planner(Rounding::Up).plan(&request(6_000)).unwrap();
        assert_eq!(plan.delivers_after_ms, 15_000);
        let Command::Publish(p) = &plan.commands[0] else { panic!() };
        assert_eq!(p.exchange, "hourglass.interval.15000ms");
        assert_eq!(p.routing_key, "orders.created");
        assert!(p.headers.contains(&text(ORIGINAL_KEY_HEADER, "orders.created")));
    }

    #[test]
    fn interval_queues_are_quorum_at_least_once_and_the_return_exchange_parks() {
        let topology = planner(Rounding::Up).topology().unwrap();
        let interval = topology
            .iter()
            .find_map(|c| match c {
                Command::DeclareQueue(q) if q.name == "hourglass.interval.5000ms" => Some(q),
                _ => None,
            })
            .unwrap();
        assert!(interval.arguments.contains(&text("x-queue-type", "quorum")));
        assert!(interval.arguments.contains(&text("x-dead-letter-strategy", "at-least-once")));
        assert!(interval.arguments.contains(&text("x-overflow", "reject-publish")));
        assert!(topology.contains(&declare_exchange(
            "hourglass.interval.return",
            ExchangeKind::Headers,
            vec![text("alternate-exchange", "hourglass.interval.parking")]
        )));
        assert!(topology.contains(&bind_queue("hourglass.interval.parked", "hourglass.interval.parking", "")));
    }

    #[test]
    fn reject_policy_refuses_delays_between_intervals() {
        let err = planner(Rounding::Reject).plan(&request(6_000)).unwrap_err();
        assert!(err.contains("not one of the intervals"), "{err}");
        assert!(planner(Rounding::Reject).plan(&request(5_000)).is_ok());
    }

    #[test]
    fn redelivery_walks_the_intervals_then_gives_up() {
        let p = planner(Rounding::Up);
        let ask = |attempt| p.decide_redelivery(&RedeliveryRequest { queue: "q".into(), attempt, seed: 0, reason: None });
        assert_eq!(ask(1), Ok(RedeliveryDecision::RetryAfterMs(5_000)));
        assert_eq!(ask(3), Ok(RedeliveryDecision::RetryAfterMs(30_000)));
        assert!(matches!(ask(4), Ok(RedeliveryDecision::GiveUp(_))));
    }
}
