//! Hold queues: one queue per (delay, destination), declared with each message.
//!
//! Delays round up to a multiple of `granularity` (1 s unless configured), so
//! a spread of delays makes a bounded number of queues per destination, and a
//! message is never delivered before its delay: later, never earlier.
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
    /// Delays round up to a multiple of this (default 1 s): one hold queue per multiple in use.
    pub granularity: Option<DurationMs>,
    /// The policy `decide_redelivery` follows, when this strategy delays redeliveries.
    pub redelivery: Option<RedeliveryPolicy>,
}

#[derive(Debug)]
pub struct HoldQueues {
    prefix: String,
    expires_margin_ms: u64,
    granularity_ms: u64,
    /// The longest delay: below the broker's TTL limit less the margin, a multiple of the granularity.
    max_delay_ms: u64,
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
            .key("granularity", "delays round up to a multiple of this (one hold queue per multiple in use)", Some("1s"))
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
        let granularity_ms = config.granularity.map_or(1_000, DurationMs::ms);
        let longest = AMQP_MAX_TTL_MS - expires_margin_ms;
        if granularity_ms == 0 || granularity_ms > longest {
            return Err(format!("granularity: must be 1ms to {longest}ms (10 years less expires_margin)"));
        }
        let max_delay_ms = longest - longest % granularity_ms;
        let redelivery = checked_policy(config.redelivery, max_delay_ms)?;
        Ok(HoldQueues { prefix, expires_margin_ms, granularity_ms, max_delay_ms, redelivery })
    }

    fn delay_range(&self) -> DelayRange {
        DelayRange::uniform(self.granularity_ms, self.max_delay_ms)
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
        if request.delay_ms == 0 {
            return Ok(Plan { commands: vec![publish("", destination, vec![])], delivers_after_ms: 0 });
        }
        // Up, never down: the message may wait longer than asked, never less.
        let delay = match request.delay_ms.checked_next_multiple_of(self.granularity_ms) {
            Some(delay) if delay <= self.max_delay_ms => delay,
            _ => return Err(format!("delay {}ms is above the maximum {}ms", request.delay_ms, self.max_delay_ms)),
        };
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
        HoldQueues::new(Config { prefix: None, expires_margin: None, granularity: None, redelivery: None }).unwrap()
    }

    fn with_granularity(ms: u64) -> HoldQueues {
        HoldQueues::new(Config { prefix: None, expires_margin: None, granularity: Some(DurationMs(ms)), redelivery: None }).unwrap()
    }

    fn request(delay_ms: u64) -> PlanRequest {
        PlanRequest { destination: "orders".into(), delay_ms, message_id: "m".into(), routing_key: None }
    }

    /// The hold queue a plan declares, and the delay it promises.
    fn hold(planner: &HoldQueues, delay_ms: u64) -> (String, i64, u64) {
        let plan = planner.plan(&request(delay_ms)).unwrap();
        let Command::DeclareQueue(queue) = &plan.commands[0] else { panic!("expected declare-queue for {delay_ms}ms") };
        let ttl = queue
            .arguments
            .iter()
            .find_map(|f| match (f.key.as_str(), &f.value) {
                ("x-message-ttl", Value::Int(ttl)) => Some(*ttl),
                _ => None,
            })
            .unwrap();
        assert_eq!(plan.commands[1], publish("", &queue.name, vec![]));
        (queue.name.clone(), ttl, plan.delivers_after_ms)
    }

    #[test]
    fn delays_up_to_the_granularity_share_one_queue_and_none_is_held_less_than_asked() {
        for granularity in [1_000, 250] {
            let p = with_granularity(granularity);
            let first = hold(&p, 1);
            assert_eq!(first, (format!("hourglass.hold.{granularity}ms.orders"), granularity as i64, granularity));
            for delay in 1..=granularity {
                assert_eq!(hold(&p, delay), first, "{delay}ms with a granularity of {granularity}ms");
            }
            for delay in (1..=20 * granularity).step_by(7) {
                let (_, ttl, promised) = hold(&p, delay);
                assert!(ttl as u64 >= delay && promised == ttl as u64, "{delay}ms held {ttl}ms, promised {promised}ms");
                assert!(promised - delay < granularity && promised % granularity == 0, "{delay}ms rounded to {promised}ms");
            }
        }
    }

    #[test]
    fn exact_multiples_are_unchanged_and_the_default_is_one_second() {
        let p = planner();
        assert_eq!(p.delay_range(), DelayRange::uniform(1_000, AMQP_MAX_TTL_MS - 60_000));
        assert_eq!(hold(&p, 5_000), ("hourglass.hold.5000ms.orders".into(), 5_000, 5_000));
        assert_eq!(hold(&p, 5_001), ("hourglass.hold.6000ms.orders".into(), 6_000, 6_000));
        assert_eq!(hold(&with_granularity(250), 750), ("hourglass.hold.750ms.orders".into(), 750, 750));
    }

    #[test]
    fn a_granularity_of_one_millisecond_keeps_every_delay_exact() {
        let p = with_granularity(1);
        assert_eq!(p.delay_range(), DelayRange::uniform(1, AMQP_MAX_TTL_MS - 60_000));
        for delay in [1, 2, 999, 1_001, 5_000, 1_234_567] {
            assert_eq!(hold(&p, delay), (format!("hourglass.hold.{delay}ms.orders"), delay as i64, delay));
        }
    }

    #[test]
    fn the_maximum_is_a_multiple_of_the_granularity_and_rounding_past_it_is_refused() {
        let p = HoldQueues::new(Config { prefix: None, expires_margin: Some(DurationMs(1)), granularity: Some(DurationMs(7)), redelivery: None }).unwrap();
        let max = p.delay_range().max_delay_ms;
        assert_eq!(max % 7, 0);
        let longest = AMQP_MAX_TTL_MS - 1;
        assert!(max <= longest && longest - max < 7, "{max} is the last multiple of 7 up to {longest}");
        assert_eq!(hold(&p, max).2, max);
        assert!(p.plan(&request(max + 1)).unwrap_err().contains("above the maximum"));
        assert!(p.plan(&request(u64::MAX)).unwrap_err().contains("above the maximum"));
    }

    #[test]
    fn granularity_is_parsed_like_other_durations_and_checked() {
        let parse = |json: &str| serde_json::from_str::<Config>(json).unwrap().granularity.map(DurationMs::ms);
        assert_eq!(parse(r#"{"granularity": "250ms"}"#), Some(250));
        assert_eq!(parse(r#"{"granularity": 250}"#), Some(250));
        assert_eq!(parse(r#"{"granularity": "2s"}"#), Some(2_000));
        let err = HoldQueues::new(Config { prefix: None, expires_margin: None, granularity: Some(DurationMs(0)), redelivery: None }).unwrap_err();
        assert!(err.starts_with("granularity:"), "{err}");
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
