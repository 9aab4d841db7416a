//! NATS hold: delays on every JetStream server (2.9 and later), which has no
//! delayed publish before 2.12.
//!
//! A delayed message is published to the strategy's hold subject, captured by
//! its held stream. The host keeps one durable consumer on that stream and
//! asks [`NatsHold::handle_held`] about each delivery: before the due time the
//! answer is to wait (the host declines the delivery with that delay and the
//! server delivers it again), at or after it, a publish to the destination.
//!
//! The due time is absolute (fixed when the message was scheduled), so a
//! delivery that comes early, after a server restart say, only waits again.
//! One wait is at most `max_wait`: a long delay is a few deliveries, and a
//! timer the server loses costs at most that much lateness. A zero delay goes
//! through the held stream too (handed over on its first delivery), so every
//! message passes the one place that asks about cancellations.

use hourglass_planner_sdk::*;
use serde::Deserialize;

const DEFAULT_STREAM: &str = "hourglass-hold";
const DEFAULT_SUBJECT: &str = "hourglass.hold";
const DEFAULT_MAX_WAIT_MS: u64 = 3_600_000;
const DEFAULT_MAX_DELAY_MS: u64 = 3_650 * 86_400_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The held stream.
    pub stream: Option<String>,
    /// The subject messages wait on, which the held stream captures.
    pub subject: Option<String>,
    /// The longest one wait lasts.
    pub max_wait: Option<DurationMs>,
    pub max_delay: Option<DurationMs>,
}

#[derive(Debug)]
pub struct NatsHold {
    stream: String,
    subject: Key,
    subject_text: String,
    max_wait_ms: u64,
    max_delay_ms: u64,
}

fn check_stream_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.contains(|c: char| c.is_whitespace() || matches!(c, '.' | '*' | '>' | '/' | '\\')) {
        return Err(format!("stream {name:?} must be a JetStream stream name: no spaces, '.', '*', '>', '/' or '\\'"));
    }
    Ok(())
}

fn check_subject(subject: &str) -> Result<(), String> {
    let valid =
        !subject.is_empty() && !subject.contains(char::is_whitespace) && subject.split('.').all(|token| !token.is_empty() && !token.contains(['*', '>']));
    if valid { Ok(()) } else { Err(format!("subject {subject:?} must be a NATS subject without wildcards (tokens separated by '.')")) }
}

impl Planner for NatsHold {
    type Config = Config;

    fn info() -> Info {
        Info::new("nats-hold", env!("CARGO_PKG_VERSION"), BrokerFamily::Nats)
            .key("stream", "the held stream, where delayed messages wait (one per strategy)", Some(DEFAULT_STREAM))
            .key("subject", "the subject they wait on, captured by the held stream", Some(DEFAULT_SUBJECT))
            .key("max_wait", "the longest one wait lasts before the message is looked at again", Some("1h"))
            .key("max_delay", "longest delay accepted", Some("3650d"))
    }

    fn new(config: Config) -> Result<Self, String> {
        let stream = config.stream.unwrap_or_else(|| DEFAULT_STREAM.to_string());
        check_stream_name(&stream).map_err(|e| format!("stream: {e}"))?;
        let subject_text = config.subject.unwrap_or_else(|| DEFAULT_SUBJECT.to_string());
        check_subject(&subject_text).map_err(|e| format!("subject: {e}"))?;
        let max_wait_ms = config.max_wait.map_or(DEFAULT_MAX_WAIT_MS, DurationMs::ms);
        if max_wait_ms < 1_000 {
            return Err(format!("max_wait: {max_wait_ms}ms is below 1s; every message would come back more than once a second"));
        }
        let max_delay_ms = config.max_delay.map_or(DEFAULT_MAX_DELAY_MS, DurationMs::ms);
        Ok(NatsHold { stream, subject: Key::register(&subject_text), subject_text, max_wait_ms, max_delay_ms })
    }

    fn delay_range(&self) -> DelayRange {
        DelayRange::uniform(1, self.max_delay_ms)
    }

    fn topology(&self) -> Result<Vec<Command>, String> {
        Ok(vec![nats_ensure_stream(&self.stream, &[&self.subject_text], true)])
    }

    fn plan(&self, request: &PlanRequest) -> Result<Plan, String> {
        if request.delay_ms > self.max_delay_ms {
            return Err(format!("delay {}ms is above max_delay {}ms", request.delay_ms, self.max_delay_ms));
        }
        Ok(Plan { commands: vec![nats_publish(self.subject, vec![])], delivers_after_ms: request.delay_ms })
    }

    fn handle_held(&self, message: &HeldMessage) -> Result<HeldAction, String> {
        if message.now_ms >= message.due_at_ms {
            return Ok(HeldAction::HandOver(vec![nats_publish(message.destination.as_str(), vec![])]));
        }
        Ok(HeldAction::Wait((message.due_at_ms - message.now_ms).min(self.max_wait_ms)))
    }
}

register_planner!(NatsHold);

#[cfg(test)]
mod tests {
    use super::*;

    fn planner(max_wait: Option<u64>) -> NatsHold {
        NatsHold::new(Config { stream: None, subject: None, max_wait: max_wait.map(DurationMs), max_delay: None }).unwrap()
    }

    fn held(due_at_ms: u64, now_ms: u64) -> HeldMessage {
        HeldMessage { stream: DEFAULT_STREAM.into(), subject: DEFAULT_SUBJECT.into(), destination: "orders.created".into(), due_at_ms, now_ms, deliveries: 1 }
    }

    #[test]
    fn a_message_waits_until_due_never_longer_than_max_wait_then_goes_to_its_destination() {
        let p = planner(Some(60_000));
        assert_eq!(p.handle_held(&held(10_000, 4_000)).unwrap(), HeldAction::Wait(6_000));
        assert_eq!(p.handle_held(&held(1_000_000, 4_000)).unwrap(), HeldAction::Wait(60_000));
        let HeldAction::HandOver(commands) = p.handle_held(&held(10_000, 10_000)).unwrap() else { panic!("due: handed over") };
        let [Command::NatsPublish(publish)] = commands.as_slice() else { panic!("one publish: {commands:?}") };
        assert_eq!(publish.subject, "orders.created");
    }

    #[test]
    fn every_delay_goes_to_the_hold_subject_none_included() {
        let p = planner(None);
        let request = |delay_ms| PlanRequest { destination: "orders.created".into(), delay_ms, message_id: "m".into(), routing_key: None };
        let plan = p.plan(&request(5_000)).unwrap();
        let [Command::NatsPublish(publish)] = plan.commands.as_slice() else { panic!("one publish") };
        assert_eq!(publish.subject, DEFAULT_SUBJECT);
        assert_eq!(plan.delivers_after_ms, 5_000);
        let plan = p.plan(&request(0)).unwrap();
        let [Command::NatsPublish(publish)] = plan.commands.as_slice() else { panic!("one publish") };
        assert_eq!(publish.subject, DEFAULT_SUBJECT);
        assert_eq!(p.topology().unwrap(), vec![nats_ensure_stream(DEFAULT_STREAM, &[DEFAULT_SUBJECT], true)]);
    }

    #[test]
    fn names_and_waits_out_of_bounds_are_refused_naming_the_key() {
        let config = |stream: &str, subject: &str| Config { stream: Some(stream.into()), subject: Some(subject.into()), max_wait: None, max_delay: None };
        assert!(NatsHold::new(config("a.b", "x")).unwrap_err().starts_with("stream:"));
        assert!(NatsHold::new(config("a", "x.*")).unwrap_err().starts_with("subject:"));
        assert!(NatsHold::new(config("a", "x..y")).unwrap_err().starts_with("subject:"));
        let short = Config { stream: None, subject: None, max_wait: Some(DurationMs(10)), max_delay: None };
        assert!(NatsHold::new(short).unwrap_err().starts_with("max_wait:"));
    }
}
