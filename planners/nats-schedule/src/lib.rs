//! NATS schedule: delays kept by the NATS server itself, with JetStream's
//! message schedules (nats-server 2.12 and later).
//!
//! Each delayed message becomes one schedule that the server publishes to the
//! destination when its time comes and then removes: no held stream, no
//! consumer, nothing for a host to do while the message waits. What it needs
//! from the user's stream (the one that captures the destination): message
//! schedules allowed, and the schedule subjects captured too, so the server
//! can keep the schedule beside its target (the host checks both and refuses
//! naming what to add). Cancels remove the schedule.

use hourglass_planner_sdk::*;
use serde::Deserialize;

/// JetStream's `@at` is good for any time; ten years is what the other
/// strategies take as their longest delay.
const DEFAULT_MAX_DELAY_MS: u64 = 3_650 * 86_400_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub max_delay: Option<DurationMs>,
}

#[derive(Debug)]
pub struct NatsSchedule {
    max_delay_ms: u64,
}

impl Planner for NatsSchedule {
    type Config = Config;

    fn info() -> Info {
        Info::new("nats-schedule", env!("CARGO_PKG_VERSION"), BrokerFamily::Nats).key("max_delay", "longest delay accepted", Some("3650d"))
    }

    fn new(config: Config) -> Result<Self, String> {
        Ok(NatsSchedule { max_delay_ms: config.max_delay.map_or(DEFAULT_MAX_DELAY_MS, DurationMs::ms) })
    }

    fn delay_range(&self) -> DelayRange {
        DelayRange::uniform(1, self.max_delay_ms)
    }

    fn plan(&self, request: &PlanRequest) -> Result<Plan, String> {
        if request.delay_ms > self.max_delay_ms {
            return Err(format!("delay {}ms is above max_delay {}ms", request.delay_ms, self.max_delay_ms));
        }
        Ok(Plan { commands: vec![nats_schedule(&request.destination, request.delay_ms, vec![])], delivers_after_ms: request.delay_ms })
    }
}

register_planner!(NatsSchedule);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_delay_is_one_schedule_to_the_destination_and_nothing_is_declared() {
        let planner = NatsSchedule::new(Config { max_delay: None }).unwrap();
        for delay_ms in [0, 1, 5_000, DEFAULT_MAX_DELAY_MS] {
            let request = PlanRequest { destination: "orders.created".into(), delay_ms, message_id: "m".into(), routing_key: None };
            let plan = planner.plan(&request).unwrap();
            assert_eq!(plan.commands, vec![nats_schedule("orders.created", delay_ms, vec![])]);
            assert_eq!(plan.delivers_after_ms, delay_ms);
        }
        assert_eq!(planner.topology().unwrap(), Vec::new());
    }

    #[test]
    fn a_delay_above_max_delay_is_refused() {
        let planner = NatsSchedule::new(Config { max_delay: Some(DurationMs(60_000)) }).unwrap();
        let request = PlanRequest { destination: "orders".into(), delay_ms: 60_001, message_id: "m".into(), routing_key: None };
        assert!(planner.plan(&request).unwrap_err().contains("max_delay"));
    }
}
