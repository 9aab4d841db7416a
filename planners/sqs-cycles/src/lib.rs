//! SQS cycles: delays beyond SQS's 900 s cap by looping through a FIFO queue.
//!
//! A delay up to one cycle is a plain send with `DelaySeconds`. A longer one
//! goes to a FIFO delay queue whose queue-level delay is the cycle: the
//! destination's own (`<destination>-delay.fifo`), or one the strategy's
//! destinations share (`delay_queue`), where a steady trickle to many
//! destinations fills batches that per-destination queues would leave thin. Each time the message becomes visible the
//! host's pump asks [`SqsCycles::handle_due`]: send it around again, or hand it
//! to the destination with the rest of the delay.
//!
//! The due time is absolute on the broker's clock: the first copy's
//! `SentTimestamp` plus the delay. The remainder is computed from it each cycle,
//! so time spent receiving and re-sending never accumulates as lateness.

use hourglass_planner_sdk::*;
use serde::Deserialize;

/// SQS refuses DelaySeconds above this.
pub const SQS_MAX_DELAY_MS: u64 = 900_000;
const SQS_MAX_QUEUE_NAME: usize = 80;
/// The planner's state travels with the message in this one attribute, leaving
/// SQS's ten-attribute budget to the caller.
pub const CYCLE_ATTRIBUTE: &str = "hourglass-cycle";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Queue-level delay of the FIFO delay queue; whole seconds, at most 900s.
    pub cycle: Option<DurationMs>,
    pub delay_queue_suffix: Option<String>,
    /// One delay queue for every destination, instead of one each.
    pub delay_queue: Option<String>,
    pub retention: Option<DurationMs>,
    pub max_delay: Option<DurationMs>,
}

#[derive(Debug)]
pub struct SqsCycles {
    cycle_ms: u64,
    suffix: String,
    shared_queue: Option<String>,
    retention_s: u64,
    max_delay_ms: u64,
}

/// What rides in [`CYCLE_ATTRIBUTE`]: `n=2;first-sent=1700000000000;delay-ms=1925000;to=orders`.
#[derive(Debug, PartialEq)]
pub struct CycleState {
    pub cycle: u32,
    pub first_sent_ms: Option<u64>,
    pub delay_ms: u64,
    pub destination: String,
}

impl CycleState {
    pub fn encode(&self) -> String {
        let first = self.first_sent_ms.map(|t| format!("first-sent={t};")).unwrap_or_default();
        format!("n={};{first}delay-ms={};to={}", self.cycle, self.delay_ms, self.destination)
    }

    pub fn decode(text: &str) -> Result<Self, String> {
        let bad = || format!("{CYCLE_ATTRIBUTE} attribute {text:?} is malformed");
        let (head, destination) = text.split_once(";to=").ok_or_else(bad)?;
        let mut state = CycleState { cycle: 0, first_sent_ms: None, delay_ms: 0, destination: destination.into() };
        let mut saw_delay = false;
        for part in head.split(';') {
            let (key, value) = part.split_once('=').ok_or_else(bad)?;
            match key {
                "n" => state.cycle = value.parse().map_err(|_| bad())?,
                "first-sent" => state.first_sent_ms = Some(value.parse().map_err(|_| bad())?),
                "delay-ms" => {
                    state.delay_ms = value.parse().map_err(|_| bad())?;
                    saw_delay = true;
                }
                _ => return Err(bad()),
            }
        }
        if !saw_delay {
            return Err(bad());
        }
        Ok(state)
    }
}

fn check_queue_name(name: &str) -> Result<(), String> {
    if name.len() > SQS_MAX_QUEUE_NAME {
        return Err(format!("SQS queue name {name:?} is {} characters; SQS allows {SQS_MAX_QUEUE_NAME}", name.len()));
    }
    let stem = name.strip_suffix(".fifo").unwrap_or(name);
    if stem.is_empty() || !stem.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return Err(format!("SQS queue name {name:?} may only hold letters, digits, '-' and '_' (and end in .fifo)"));
    }
    Ok(())
}

impl SqsCycles {
    pub fn delay_queue(&self, destination: &str) -> String {
        match &self.shared_queue {
            Some(shared) => shared.clone(),
            None => format!("{destination}{}", self.suffix),
        }
    }

    fn check_destination(&self, destination: &str) -> Result<(), String> {
        check_queue_name(destination)?;
        check_queue_name(&self.delay_queue(destination))
    }

    fn to_delay_queue(&self, message_id: &str, state: &CycleState) -> Command {
        let mut send = sqs_send(&self.delay_queue(&state.destination), 0, vec![sqs_attribute(CYCLE_ATTRIBUTE, state.encode())]);
        if let Command::SqsSend(s) = &mut send {
            // One group per message: FIFO order across messages is not wanted, parallelism is.
            s.group_id = Some(message_id.to_string());
            // Per message and cycle: a retried send of the same cycle is deduplicated, the next cycle is not.
            s.dedup_id = Some(format!("{message_id}-{}", state.cycle));
        }
        send
    }
}

impl Planner for SqsCycles {
    type Config = Config;

    fn info() -> Info {
        Info::new("sqs-cycles", env!("CARGO_PKG_VERSION"), BrokerFamily::Sqs)
            .key("cycle", "queue-level delay of the FIFO delay queue, whole seconds up to 900s", Some("900s"))
            .key("delay_queue_suffix", "delay queue name = destination + suffix", Some("-delay.fifo"))
            .key("delay_queue", "one FIFO delay queue shared by every destination (cheaper for a trickle to many destinations)", None)
            .key("retention", "MessageRetentionPeriod of the delay queue, at least 4 days", Some("4d"))
            .key("max_delay", "longest delay accepted", Some("3650d"))
    }

    fn new(config: Config) -> Result<Self, String> {
        let cycle_ms = config.cycle.map_or(SQS_MAX_DELAY_MS, DurationMs::ms);
        if cycle_ms == 0 || cycle_ms > SQS_MAX_DELAY_MS || !cycle_ms.is_multiple_of(1_000) {
            return Err(format!("cycle: {cycle_ms}ms must be whole seconds between 1s and 900s"));
        }
        if config.delay_queue.is_some() && config.delay_queue_suffix.is_some() {
            return Err("delay_queue and delay_queue_suffix: set one (a shared queue has no per-destination suffix)".into());
        }
        if let Some(shared) = &config.delay_queue {
            if !shared.ends_with(".fifo") {
                return Err(format!("delay_queue: {shared:?} must end in .fifo (the delay queue is FIFO)"));
            }
            check_queue_name(shared).map_err(|e| format!("delay_queue: {e}"))?;
        }
        let suffix = config.delay_queue_suffix.unwrap_or_else(|| "-delay.fifo".to_string());
        if !suffix.ends_with(".fifo") {
            return Err(format!("delay_queue_suffix: {suffix:?} must end in .fifo (the delay queue is FIFO)"));
        }
        let retention_ms = config.retention.map_or(4 * 86_400_000, DurationMs::ms);
        if !(4 * 86_400_000..=14 * 86_400_000).contains(&retention_ms) {
            return Err(format!("retention: {retention_ms}ms must be between 4 and 14 days"));
        }
        let max_delay_ms = config.max_delay.map_or(3_650 * 86_400_000, DurationMs::ms);
        Ok(SqsCycles { cycle_ms, suffix, shared_queue: config.delay_queue, retention_s: retention_ms / 1_000, max_delay_ms })
    }

    fn delay_range(&self) -> DelayRange {
        DelayRange::uniform(1_000, self.max_delay_ms / 1_000 * 1_000)
    }

    fn destination_setup(&self, destination: &str) -> Result<Vec<Command>, String> {
        self.check_destination(destination)?;
        let attributes = vec![
            sqs_attribute("FifoQueue", "true"),
            sqs_attribute("DelaySeconds", (self.cycle_ms / 1_000).to_string()),
            sqs_attribute("MessageRetentionPeriod", self.retention_s.to_string()),
            // High-throughput FIFO: every message is its own group, so
            // throughput scales with them instead of one queue-wide limit.
            sqs_attribute("DeduplicationScope", "messageGroup"),
            sqs_attribute("FifoThroughputLimit", "perMessageGroupId"),
        ];
        Ok(vec![sqs_ensure_queue(&self.delay_queue(destination), attributes, true)])
    }

    fn plan(&self, request: &PlanRequest) -> Result<Plan, String> {
        self.check_destination(&request.destination)?;
        let delay_ms = request.delay_ms;
        if delay_ms > self.max_delay_ms {
            return Err(format!("delay {delay_ms}ms is above max_delay {}ms", self.max_delay_ms));
        }
        let delivers_after_ms = delay_ms.div_ceil(1_000) * 1_000;
        let command = if delay_ms <= self.cycle_ms {
            sqs_send(&request.destination, (delivers_after_ms / 1_000) as u32, vec![])
        } else {
            let state = CycleState { cycle: 0, first_sent_ms: None, delay_ms, destination: request.destination.clone() };
            self.to_delay_queue(&request.message_id, &state)
        };
        Ok(Plan { commands: vec![command], delivers_after_ms })
    }

    fn handle_due(&self, message: &DueMessage) -> Result<DueAction, String> {
        let encoded = attribute(&message.attributes, CYCLE_ATTRIBUTE)
            .ok_or_else(|| format!("message {} on {} has no {CYCLE_ATTRIBUTE} attribute", message.message_id, message.queue))?;
        let mut state = CycleState::decode(encoded)?;
        let first_sent = *state.first_sent_ms.get_or_insert(message.sent_timestamp_ms);
        let due = first_sent + state.delay_ms;
        // The broker's receive stamp is exact for a first receive; a redelivered
        // copy keeps the old stamp, so fall back to the host clock then.
        let now = if message.receive_count <= 1 { message.first_receive_timestamp_ms } else { message.host_now_ms };
        let remaining = due.saturating_sub(now);
        // No message accepted here waits longer than max_delay: more means its
        // state was damaged (a first send in the future), and it would cycle forever.
        if remaining > self.max_delay_ms {
            return Err(format!(
                "message {} on {}: {remaining}ms still to wait, above max_delay {}ms; its {CYCLE_ATTRIBUTE} {encoded:?} is not one this planner wrote",
                message.message_id, message.queue, self.max_delay_ms
            ));
        }
        if remaining > self.cycle_ms {
            state.cycle += 1;
            return Ok(DueAction::Recycle(vec![self.to_delay_queue(&message.message_id, &state)]));
        }
        let delay_seconds = remaining.div_ceil(1_000) as u32;
        Ok(DueAction::HandOver(vec![sqs_send(&state.destination, delay_seconds, vec![])]))
    }
}

register_planner!(SqsCycles);

#[cfg(test)]
mod tests {
    use super::*;

    fn planner() -> SqsCycles {
        SqsCycles::new(Config { cycle: None, delay_queue_suffix: None, delay_queue: None, retention: None, max_delay: None }).unwrap()
    }

    #[test]
    fn a_shared_delay_queue_serves_every_destination_and_the_state_names_each() {
        let shared =
            SqsCycles::new(Config { cycle: None, delay_queue_suffix: None, delay_queue: Some("all-delay.fifo".into()), retention: None, max_delay: None })
                .unwrap();
        let req = |destination: &str| PlanRequest { destination: destination.into(), delay_ms: 1_925_000, message_id: "m1".into(), routing_key: None };
        for destination in ["orders", "invoices"] {
            let Command::SqsSend(send) = &shared.plan(&req(destination)).unwrap().commands[0] else { panic!() };
            assert_eq!(send.queue, "all-delay.fifo");
            assert_eq!(CycleState::decode(&send.attributes[0].value).unwrap().destination, destination);
            let setup = shared.destination_setup(destination).unwrap();
            let [Command::SqsEnsureQueue(queue)] = setup.as_slice() else { panic!() };
            assert_eq!(queue.name, "all-delay.fifo");
        }
        let refused = |delay_queue: &str, suffix: Option<&str>| {
            SqsCycles::new(Config {
                cycle: None,
                delay_queue_suffix: suffix.map(str::to_string),
                delay_queue: Some(delay_queue.into()),
                retention: None,
                max_delay: None,
            })
            .unwrap_err()
        };
        assert!(refused("all-delay", None).contains("must end in .fifo"));
        assert!(refused("all-delay.fifo", Some("-d.fifo")).contains("set one"));
        assert!(refused(&format!("{}.fifo", "q".repeat(80)), None).contains("SQS allows 80"));
    }

    fn due(attributes: Vec<SqsAttribute>, sent: u64, received: u64) -> DueMessage {
        DueMessage {
            queue: "orders-delay.fifo".into(),
            message_id: "m1".into(),
            attributes,
            sent_timestamp_ms: sent,
            first_receive_timestamp_ms: received,
            receive_count: 1,
            host_now_ms: received,
        }
    }

    #[test]
    fn short_delays_are_direct_sends_long_ones_go_to_the_delay_queue() {
        let p = planner();
        let req = |delay_ms| PlanRequest { destination: "orders".into(), delay_ms, message_id: "m1".into(), routing_key: None };
        assert_eq!(p.plan(&req(845_000)).unwrap().commands, vec![sqs_send("orders", 845, vec![])]);
        let Command::SqsSend(send) = &p.plan(&req(1_925_000)).unwrap().commands[0] else { panic!() };
        assert_eq!(send.queue, "orders-delay.fifo");
        assert_eq!(send.dedup_id.as_deref(), Some("m1-0"));
    }

    #[test]
    fn remainder_comes_from_the_first_send_so_lateness_does_not_accumulate() {
        let p = planner();
        let state = CycleState { cycle: 0, first_sent_ms: None, delay_ms: 1_925_000, destination: "orders".into() };
        // First visibility arrives 3 s late: the next cycle still targets the absolute due time.
        let first = p.handle_due(&due(vec![sqs_attribute(CYCLE_ATTRIBUTE, state.encode())], 1_000, 904_000)).unwrap();
        let DueAction::Recycle(commands) = first else { panic!("expected a recycle") };
        let Command::SqsSend(send) = &commands[0] else { panic!() };
        let carried = CycleState::decode(&send.attributes[0].value).unwrap();
        assert_eq!(carried.first_sent_ms, Some(1_000));
        assert_eq!(carried.cycle, 1);
        let second = p.handle_due(&due(send.attributes.clone(), 904_100, 1_806_000)).unwrap();
        // due = 1_000 + 1_925_000 = 1_926_000; now 1_806_000 -> 120 s left.
        assert_eq!(second, DueAction::HandOver(vec![sqs_send("orders", 120, vec![])]));
    }

    #[test]
    fn a_state_that_would_wait_past_max_delay_is_refused_not_cycled_forever() {
        let p = planner();
        // First sent 10^15 ms from now: corrupt, not something plan() ever wrote.
        let state = CycleState { cycle: 35, first_sent_ms: Some(1_000_000_000_000_000), delay_ms: 1_925_000, destination: "orders".into() };
        let err = p.handle_due(&due(vec![sqs_attribute(CYCLE_ATTRIBUTE, state.encode())], 1_000, 904_000)).unwrap_err();
        assert!(err.contains("above max_delay"), "{err}");
    }

    #[test]
    fn delay_queues_are_high_throughput_fifo_queues() {
        let setup = planner().destination_setup("orders").unwrap();
        let [Command::SqsEnsureQueue(queue)] = setup.as_slice() else { panic!("one delay queue: {setup:?}") };
        assert!(queue.pumped);
        for (name, value) in [("FifoQueue", "true"), ("DeduplicationScope", "messageGroup"), ("FifoThroughputLimit", "perMessageGroupId")] {
            assert!(queue.attributes.contains(&sqs_attribute(name, value)), "{name} = {value} missing: {:?}", queue.attributes);
        }
    }

    #[test]
    fn queue_names_over_eighty_characters_are_refused_up_front() {
        let err = planner().destination_setup(&"q".repeat(70)).unwrap_err();
        assert!(err.contains("SQS allows 80"), "{err}");
    }

    #[test]
    fn cycle_state_round_trips_destinations_with_separators() {
        let state = CycleState { cycle: 7, first_sent_ms: Some(5), delay_ms: 9, destination: "a_b-c".into() };
        assert_eq!(CycleState::decode(&state.encode()).unwrap(), state);
        assert!(CycleState::decode("n=1;to=x").is_err());
    }
}
