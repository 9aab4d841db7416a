//! Hold queues: one queue per (delay, destination), declared with each message.
//!
//! The hold queue has no consumer. Its `x-message-ttl` is the delay, and expired
//! messages dead-letter to the delivery exchange (direct, `<prefix>.delivery`),
//! where the destination queue is bound under its own name. Since every message
//! in one hold queue has the same TTL, nothing waits behind a longer-lived head.
//! `x-expires` removes the queue once it has been unused for longer than its
//! TTL, so idle delays cost nothing; redeclaring it with each message keeps it
//! alive while in use. The delivery exchange parks what it cannot route (a
//! destination deleted while its message waited) in `<prefix>.parked`.
//!
//! Hold queues are classic, so they dead-letter at most once: a broker crash can
//! lose messages. Quorum queues would dead-letter at least once, but they do not
//! renew `x-expires` on redeclare and would be deleted with their messages
//! (rabbitmq-server #5894); without `x-expires`, every distinct delay would
//! leave a queue behind for good. Choose binary-levels where a crash must not
//! lose messages.

use hourglass_planner_sdk::*;
use serde::Deserialize;

const MAX_NAME: usize = 255;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Hold queues are named `<prefix>.<delay>ms.<destination>`.
    pub prefix: Option<String>,
    /// How long an unused hold queue outlives its TTL before the broker deletes it.
    pub expires_margin: Option<DurationMs>,
    /// The policy `decide_redelivery` follows, when this strategy delays redeliveries.
    pub redelivery: Option<RedeliveryPolicy>,
}

#[derive(Debug)]
pub struct HoldQueues {
    prefix: String,
    expires_margin_ms: u64,
    redelivery: Option<RedeliveryPolicy>,
}

impl HoldQueues {
    pub fn hold_queue(&self, delay_ms: u64, destination: &str) -> String {
        format!("{}.{delay_ms}ms.{destination}", self.prefix)
    }

    pub fn delivery_exchange(&self) -> String {
        format!("{}.delivery", self.prefix)
    }

    pub fn parking(&self) -> Parking {
        Parking::under(&self.prefix)
    }
}

impl Planner for HoldQueues {
    type Config = Config;

    fn info() -> Info {
        Info::new("hold-queues", env!("CARGO_PKG_VERSION"), BrokerFamily::Amqp)
            .key("prefix", "names: <prefix>.<delay>ms.<destination>, <prefix>.delivery, <prefix>.parked", Some("hourglass.hold"))
            .key("expires_margin", "how long an unused hold queue outlives its TTL", Some("60s"))
    }

    fn new(config: Config) -> Result<Self, String> {
        let prefix = config.prefix.unwrap_or_else(|| "hourglass.hold".to_string());
        if prefix.is_empty() || prefix.len() > 100 {
            return Err(format!("prefix: {prefix:?} must be 1 to 100 bytes"));
        }
        let expires_margin_ms = config.expires_margin.map_or(60_000, DurationMs::ms);
        if expires_margin_ms == 0 {
            return Err("expires_margin: must be above zero, or a queue could vanish with its last message".into());
        }
        if expires_margin_ms >= AMQP_MAX_TTL_MS {
            return Err("expires_margin: must be below 10 years".into());
        }
        let redelivery = checked_policy(config.redelivery, AMQP_MAX_TTL_MS)?;
        Ok(HoldQueues { prefix, expires_margin_ms, redelivery })
    }

    fn delay_range(&self) -> DelayRange {
        DelayRange::uniform(1, AMQP_MAX_TTL_MS - self.expires_margin_ms)
    }

    fn topology(&self) -> Result<Vec<Command>, String> {
        let parking = self.parking();
        // The parking queue holds no TTL and dead-letters nowhere: quorum keeps it safe.
        let mut commands = parking.topology(QueueType::Quorum);
        commands.push(declare_exchange(&self.delivery_exchange(), ExchangeKind::Direct, vec![parking.alternate_exchange()]));
        Ok(commands)
    }

    fn destination_setup(&self, destination: &str) -> Result<Vec<Command>, String> {
        if destination.is_empty() {
            return Err("destination is empty".into());
        }
        Ok(vec![bind_queue(destination, &self.delivery_exchange(), destination)])
    }

    fn decide_redelivery(&self, request: &RedeliveryRequest) -> Result<RedeliveryDecision, String> {
        decide_with(self.redelivery.as_ref(), request)
    }

    fn plan(&self, request: &PlanRequest) -> Result<Plan, String> {
        let destination = &request.destination;
        if destination.is_empty() {
            return Err("destination is empty".into());
        }
        let delay = request.delay_ms;
        if delay == 0 {
            return Ok(Plan { commands: vec![publish("", destination, vec![])], delivers_after_ms: 0 });
        }
        if delay > self.delay_range().max_delay_ms {
            return Err(format!("delay {delay}ms is above the maximum {}ms", self.delay_range().max_delay_ms));
        }
        let queue = self.hold_queue(delay, destination);
        if queue.len() > MAX_NAME {
            return Err(format!("hold queue name {queue:?} is longer than {MAX_NAME} bytes; shorten the destination or prefix"));
        }
        let arguments = vec![
            text("x-queue-type", "classic"),
            int("x-message-ttl", delay as i64),
            text("x-dead-letter-exchange", self.delivery_exchange()),
            text("x-dead-letter-routing-key", destination.as_str()),
            int("x-expires", (delay + self.expires_margin_ms) as i64),
        ];
        Ok(Plan { commands: vec![declare_queue(&queue, arguments), publish("", &queue, vec![])], delivers_after_ms: delay })
    }
}

register_planner!(HoldQueues);

#[cfg(test)]
mod tests {
    use super::*;

    fn planner() -> HoldQueues {
        HoldQueues::new(Config { prefix: None, expires_margin: None, redelivery: None }).unwrap()
    }

    #[test]
    fn declares_a_hold_queue_that_outlives_its_ttl_and_dead_letters_to_the_destination() {
        let plan = planner().plan(&PlanRequest { destination: "orders".into(), delay_ms: 5_000, message_id: "m".into(), routing_key: None }).unwrap();
        let Command::DeclareQueue(queue) = &plan.commands[0] else { panic!("expected declare-queue") };
        assert_eq!(queue.name, "hourglass.hold.5000ms.orders");
        assert!(queue.arguments.contains(&int("x-message-ttl", 5_000)));
        assert!(queue.arguments.contains(&int("x-expires", 65_000)));
        assert!(queue.arguments.contains(&text("x-dead-letter-routing-key", "orders")));
        assert!(queue.arguments.contains(&text("x-dead-letter-exchange", "hourglass.hold.delivery")));
        assert_eq!(plan.commands[1], publish("", "hourglass.hold.5000ms.orders", vec![]));
    }

    #[test]
    fn the_delivery_exchange_binds_destinations_by_name_and_parks_the_rest() {
        let p = planner();
        assert!(p.topology().unwrap().contains(&declare_exchange(
            "hourglass.hold.delivery",
            ExchangeKind::Direct,
            vec![text("alternate-exchange", "hourglass.hold.parking")]
        )));
        assert_eq!(p.destination_setup("orders").unwrap(), vec![bind_queue("orders", "hourglass.hold.delivery", "orders")]);
    }

    #[test]
    fn refuses_names_the_broker_would_refuse() {
        let err = planner().plan(&PlanRequest { destination: "d".repeat(250), delay_ms: 1, message_id: "m".into(), routing_key: None }).unwrap_err();
        assert!(err.contains("longer than 255 bytes"), "{err}");
    }
}
