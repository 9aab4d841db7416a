//! Delayed redelivery for consumers in any language.
//!
//! A consumer queue named in `[[redelivery]]` dead-letters to the host's
//! redelivery input (a fanout exchange and a queue of the same name), so a
//! consumer only has to reject a message it cannot process. For each such
//! message the host reads which queue it failed on (`x-death`) and which
//! delivery that was (its own `hourglass-attempt` header, else `x-death`'s
//! count), asks the policy's planner for a delay, and schedules the message
//! back to that queue through the strategy: body, properties, routing key and
//! application headers as they were, the broker's death headers removed (so
//! its cycle detection never drops the message) and `hourglass-attempt`
//! raised by one. When the policy gives up (or `max_attempts` is reached) the
//! message goes to the queue's error queue with the attempts made and the last
//! failure. The input message is acked only after that publish is confirmed;
//! while the broker is unavailable it is requeued. Nothing is dropped: a
//! message from a queue that is not configured goes to `<input>.unknown`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use crate::broker::rabbitmq::manage::{Management, ManagementError};
use crate::command::{AmqpCommand, Command, ExchangeKind, FieldValue};
use crate::config::broker::rabbitmq_own_queue;
use crate::config::{Config, DeadLetterSetup, RedeliveryConfig};
use crate::executor::{Broker, ExecutorError};
use crate::headers::{ATTEMPT_HEADER, ATTEMPTS_HEADER, FAILED_QUEUE_HEADER, FAILURE_REASON_HEADER, GAVE_UP_HEADER, is_reserved};
use crate::message::Handler;
use crate::message::{Delivery, HeaderValue, Outcome, Properties, Settled};
use crate::planner::RedeliveryDecision;
use crate::scheduler::{OWN_QUEUE_HINT, ScheduleError, ScheduleRequest, Scheduler};

/// The redelivery input's handler; run it under a [`Consumer`](crate::broker::rabbitmq::consume::Consumer).
pub struct Redelivery {
    input: String,
    prefetch: u16,
    /// Declare the consumer queues with their dead-letter exchange (`dead_letter = "declare"`).
    declaring: bool,
    default_strategy: String,
    queues: BTreeMap<String, RedeliveryConfig>,
    scheduler: Arc<Scheduler<Broker>>,
    stats: Mutex<BTreeMap<String, QueueStats>>,
}

#[derive(Default)]
struct QueueStats {
    redelivered: u64,
    given_up: u64,
    /// Due times (Unix ms) of redeliveries not yet due.
    due: Vec<u64>,
}

pub use crate::service::side::QueueStatus;

/// Where a rejected message came from, as its headers tell.
#[derive(Debug, PartialEq)]
struct Failure {
    queue: String,
    reason: String,
    routing_key: Option<String>,
    /// The delivery that failed: 1 for the first.
    attempt: u32,
}

/// What happens to one message from the input.
#[derive(Debug, PartialEq)]
enum Decision {
    Retry {
        delay_ms: u64,
        next_attempt: u32,
    },
    GiveUp(String),
    /// The policy could not answer in time (a starved CPU, say): ask again later.
    Wait(String),
}

/// What [`Redelivery::handle`] decided, for the counts once it is carried out.
pub enum Handled {
    /// Scheduled back to `queue`, due then.
    Redelivered { queue: String, due_at_ms: u64 },
    /// On `queue`'s error queue.
    GaveUp { queue: String },
    /// No configured queue claims it.
    Unknown,
    /// Back on the input for now.
    Waiting { queue: String },
}

impl Redelivery {
    pub fn new(config: &Config, scheduler: Arc<Scheduler<Broker>>, declaring: bool) -> Arc<Redelivery> {
        Arc::new(Redelivery {
            input: config.service.redelivery_input().to_string(),
            prefetch: config.service.ingress.prefetch,
            declaring,
            default_strategy: config.default_strategy.clone(),
            queues: config.redelivery.iter().map(|r| (r.queue.clone(), r.clone())).collect(),
            scheduler,
            stats: Default::default(),
        })
    }

    pub fn input(&self) -> &str {
        &self.input
    }

    fn unknown_queue(&self) -> String {
        format!("{}.unknown", self.input)
    }

    pub(crate) fn strategy_of(&self, entry: &RedeliveryConfig) -> String {
        entry.strategy_or(&self.default_strategy).to_string()
    }

    pub(crate) fn policy_of(&self, entry: &RedeliveryConfig) -> String {
        entry.policy_or(&self.default_strategy).to_string()
    }

    pub fn entries(&self) -> impl Iterator<Item = &RedeliveryConfig> {
        self.queues.values()
    }

    /// Per queue: waiting, redelivered, given up.
    pub fn status(&self) -> Vec<QueueStatus> {
        let now = self.scheduler.clock().now_ms();
        let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        self.queues
            .values()
            .map(|entry| {
                let counts = stats.entry(entry.queue.clone()).or_default();
                counts.due.retain(|&due| due > now);
                QueueStatus {
                    queue: entry.queue.clone(),
                    strategy: self.strategy_of(entry),
                    policy: self.policy_of(entry),
                    error_queue: entry.error_queue(),
                    max_attempts: entry.max_attempts,
                    waiting: counts.due.len() as u64,
                    redelivered: counts.redelivered,
                    given_up: counts.given_up,
                }
            })
            .collect()
    }

    fn count(&self, queue: &str, due_at_ms: Option<u64>) {
        let now = self.scheduler.clock().now_ms();
        let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        let counts = stats.entry(queue.to_string()).or_default();
        match due_at_ms {
            Some(due) => {
                counts.redelivered += 1;
                counts.due.retain(|&d| d > now);
                counts.due.push(due);
            }
            None => counts.given_up += 1,
        }
    }

    /// Asks the policy; `max_attempts` overrides it.
    fn decide(&self, entry: &RedeliveryConfig, failure: &Failure, seed: u64) -> Decision {
        if let Some(max) = entry.max_attempts
            && failure.attempt >= max
        {
            return Decision::GiveUp(format!("max_attempts {max} reached"));
        }
        let policy = self.policy_of(entry);
        decision(&policy, failure.attempt, self.scheduler.decide_redelivery(&policy, &entry.queue, failure.attempt, seed, Some(&failure.reason)))
    }

    /// Schedules the message back to its queue; its due time, or why not.
    async fn redeliver(&self, delivery: &Delivery, entry: &RedeliveryConfig, failure: &Failure, delay_ms: u64, next_attempt: u32) -> Result<u64, Unscheduled> {
        let request = ScheduleRequest {
            destination: entry.queue.clone(),
            delay_ms,
            deliver_at_ms: None,
            exchange: None,
            body: delivery.body.clone(),
            headers: Default::default(),
            properties: for_redelivery(&delivery.properties, next_attempt),
            strategy: Some(self.strategy_of(entry)),
            routing_key: failure.routing_key.clone(),
            as_is: true,
            id: None,
        };
        match self.scheduler.schedule(request).await {
            Ok(scheduled) => Ok(scheduled.due_at_ms),
            Err(ScheduleError::Broker(ExecutorError::Unavailable(why))) => {
                tracing::warn!(queue = %entry.queue, %why, "broker unavailable; holding the rejected message to try again");
                Err(Unscheduled::BrokerAway)
            }
            Err(ScheduleError::Planner(err)) if err.is_timeout() => {
                tracing::warn!(queue = %entry.queue, error = %err, "the planner ran out of time; requeueing the rejected message");
                Err(Unscheduled::PlannerTimedOut)
            }
            Err(err) => Err(Unscheduled::Failed(format!("could not schedule the redelivery: {err}"))),
        }
    }

    /// The message as it came on the queue's error queue, with the attempts and reasons.
    fn give_up(&self, entry: &RedeliveryConfig, failure: &Failure, why: &str) -> (Outcome, Handled) {
        let headers = [
            (ATTEMPTS_HEADER, HeaderValue::I64(failure.attempt as i64)),
            (FAILURE_REASON_HEADER, HeaderValue::text(&failure.reason)),
            (GAVE_UP_HEADER, HeaderValue::text(why)),
            (FAILED_QUEUE_HEADER, HeaderValue::text(&failure.queue)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        tracing::info!(queue = %failure.queue, attempts = failure.attempt, %why, "giving up redelivering");
        let outcome = Outcome::MoveTo { queue: entry.error_queue(), headers, reason: why.to_string() };
        (outcome, Handled::GaveUp { queue: failure.queue.clone() })
    }

    /// A message no configured queue claims: kept aside with the reason.
    fn set_aside(&self, why: &str) -> Outcome {
        Outcome::move_to(&self.unknown_queue(), GAVE_UP_HEADER, why)
    }

    /// Sets the broker policy that gives an existing queue its dead-letter exchange.
    pub(crate) fn apply_broker_policy(&self, management: &Management, queue: &str) -> Result<(), ManagementError> {
        let policy = serde_json::json!({
            "pattern": format!("^{}$", regex_escape(queue)),
            "definition": { "dead-letter-exchange": self.input },
            "apply-to": "queues",
            "priority": 10,
        });
        management.put_policy(&policy_name(queue), &policy)
    }
}

/// The policy's answer for `attempt`: a planner that ran out of time is asked
/// again later (the CPU may just have been starved); any other failure gives up.
fn decision(policy: &str, attempt: u32, answer: Result<RedeliveryDecision, ScheduleError>) -> Decision {
    match answer {
        Ok(RedeliveryDecision::RetryAfterMs(delay_ms)) => Decision::Retry { delay_ms, next_attempt: attempt + 1 },
        Ok(RedeliveryDecision::GiveUp(why)) => Decision::GiveUp(format!("policy {policy}: {why}")),
        Err(ScheduleError::Planner(err)) if err.is_timeout() => Decision::Wait(format!("policy {policy}: {err}")),
        Err(err) => Decision::GiveUp(format!("policy {policy} failed: {err}")),
    }
}

/// The broker policy hourglass sets for a queue.
pub fn policy_name(queue: &str) -> String {
    format!("hourglass-redelivery-{queue}")
}

fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Why a message in the redelivery input is not a failure hourglass redelivers:
/// it is set aside with this as its reason.
#[derive(Debug, thiserror::Error)]
enum NotRedeliverable {
    #[error("no x-death header: not dead-lettered by the broker")]
    NotDeadLettered,
    /// `seen`: the queues its x-death entries name.
    #[error("x-death names no queue configured for redelivery (it names: {})", .seen.join(", "))]
    UnknownQueue { seen: Vec<String> },
}

/// Reads the failure from the death headers: the most recent `x-death` entry
/// for a queue `is_known` claims (the broker puts the most recent first).
fn read_failure(properties: &Properties, is_known: impl Fn(&str) -> bool) -> Result<Failure, NotRedeliverable> {
    let headers = &properties.headers;
    let Some(HeaderValue::Array(deaths)) = headers.get("x-death") else {
        return Err(NotRedeliverable::NotDeadLettered);
    };
    let entries = deaths.iter().filter_map(|d| match d {
        HeaderValue::Table(t) => Some(t),
        _ => None,
    });
    let mut seen = Vec::new();
    for entry in entries {
        let Some(queue) = entry.get("queue").and_then(HeaderValue::as_text) else { continue };
        if !is_known(&queue) {
            seen.push(queue);
            continue;
        }
        let reason = entry.get("reason").and_then(HeaderValue::as_text).unwrap_or_else(|| "unknown".into());
        let routing_key = match entry.get("routing-keys") {
            Some(HeaderValue::Array(keys)) => keys.first().and_then(HeaderValue::as_text),
            _ => None,
        };
        let from_header = headers.get(ATTEMPT_HEADER).and_then(HeaderValue::as_whole_number);
        let from_count = entry.get("count").and_then(HeaderValue::as_whole_number);
        let attempt = from_header.or(from_count).unwrap_or(1).clamp(1, u32::MAX as i128) as u32;
        return Ok(Failure { queue, reason, routing_key, attempt });
    }
    Err(NotRedeliverable::UnknownQueue { seen })
}

/// The properties for the next attempt: as they were, minus the broker's
/// death records and hourglass's own headers, plus the attempt number. (The
/// neutral properties never carry an expiration, which would cut the delay short.)
fn for_redelivery(properties: &Properties, next_attempt: u32) -> Properties {
    let mut next = properties.clone();
    next.headers.retain(|key, _| !(key == "x-death" || key.starts_with("x-first-death-") || key.starts_with("x-last-death-") || is_reserved(key)));
    next.headers.insert(ATTEMPT_HEADER.into(), HeaderValue::I64(next_attempt as i64));
    next
}

/// The jitter seed: the same for every attempt of one message, different between messages.
fn seed_of(properties: &Properties, body: &[u8]) -> u64 {
    let digest = match &properties.message_id {
        Some(id) => Sha256::digest(id.as_bytes()),
        None => Sha256::digest(body),
    };
    u64::from_le_bytes(digest[..8].try_into().expect("a SHA-256 digest has 32 bytes"))
}

impl Handler for Redelivery {
    type Note = Handled;

    fn queue(&self) -> &str {
        &self.input
    }

    fn prefetch(&self) -> u16 {
        self.prefetch
    }

    /// The input (fanout exchange and queue), the unknown and error queues,
    /// and — with `dead_letter = "declare"` — the consumer queues with their
    /// dead-letter exchange.
    fn declarations(&self) -> Vec<Command> {
        let queue_type = self.scheduler.config().service.queue_type;
        let durable_queue = |name: String| rabbitmq_own_queue(&name, queue_type);
        let mut commands = vec![Command::Amqp(AmqpCommand::DeclareExchange {
            name: self.input.clone(),
            kind: ExchangeKind::Fanout,
            durable: true,
            arguments: Default::default(),
        })];
        commands.push(durable_queue(self.input.clone()));
        commands.push(durable_queue(self.unknown_queue()));
        commands.extend(self.queues.values().map(|entry| durable_queue(entry.error_queue())));
        commands.push(Command::Amqp(AmqpCommand::BindQueue {
            queue: self.input.clone(),
            exchange: self.input.clone(),
            routing_key: String::new(),
            arguments: Default::default(),
        }));
        if self.declaring {
            for entry in self.queues.values().filter(|e| e.dead_letter == DeadLetterSetup::Declare) {
                let arguments = [("x-dead-letter-exchange".to_string(), FieldValue::Text(self.input.clone()))].into();
                commands.push(Command::Amqp(AmqpCommand::DeclareQueue { name: entry.queue.clone(), durable: true, arguments }));
            }
        }
        commands
    }

    fn declaration_hint(&self) -> Option<String> {
        Some(format!("a consumer queue declared with other arguments needs dead_letter = \"broker-policy\"; {OWN_QUEUE_HINT}"))
    }

    async fn handle(&self, delivery: &Delivery) -> (Outcome, Handled) {
        let failure = match read_failure(&delivery.properties, |q| self.queues.contains_key(q)) {
            Ok(failure) => failure,
            Err(why) => {
                tracing::warn!(queue = %self.unknown_queue(), %why, "setting aside a message in the redelivery input");
                return (self.set_aside(&why.to_string()), Handled::Unknown);
            }
        };
        let entry = &self.queues[&failure.queue];
        let seed = seed_of(&delivery.properties, &delivery.body);
        let waiting = || (Outcome::Requeue, Handled::Waiting { queue: failure.queue.clone() });
        match self.decide(entry, &failure, seed) {
            Decision::GiveUp(why) => self.give_up(entry, &failure, &why),
            Decision::Wait(why) => {
                tracing::warn!(queue = %failure.queue, %why, "the policy ran out of time; requeueing the rejected message");
                waiting()
            }
            Decision::Retry { delay_ms, next_attempt } => match self.redeliver(delivery, entry, &failure, delay_ms, next_attempt).await {
                Ok(due_at_ms) => {
                    tracing::debug!(queue = %failure.queue, attempt = next_attempt, delay_ms, "redelivery scheduled");
                    (Outcome::Ack, Handled::Redelivered { queue: failure.queue.clone(), due_at_ms })
                }
                Err(Unscheduled::BrokerAway) => (Outcome::Retry, Handled::Waiting { queue: failure.queue.clone() }),
                Err(Unscheduled::PlannerTimedOut) => waiting(),
                Err(Unscheduled::Failed(why)) => self.give_up(entry, &failure, &why),
            },
        }
    }

    /// Set aside with the unknown messages: the failing queue may not even be readable from it.
    fn poisoned(&self, _delivery: &Delivery, reason: &str) -> Outcome {
        self.set_aside(reason)
    }

    fn settled(&self, note: Option<Handled>, outcome: &Outcome, settled: &Settled) {
        let done = !matches!(settled, Settled::Requeued | Settled::MoveFailed(_));
        let (queue, label) = match note {
            Some(Handled::Redelivered { queue, due_at_ms }) => {
                if done {
                    self.count(&queue, Some(due_at_ms));
                }
                (queue, settled.label("redelivered"))
            }
            Some(Handled::GaveUp { queue }) => {
                if done {
                    self.count(&queue, None);
                }
                (queue, settled.label("given_up"))
            }
            Some(Handled::Unknown) => (String::new(), settled.label("unknown")),
            Some(Handled::Waiting { queue }) => (queue, settled.label("requeued")),
            // The handler panicked: set aside with the unknown messages once it did so too often.
            None => (String::new(), if matches!(outcome, Outcome::MoveTo { .. }) { settled.label("unknown") } else { settled.label("requeued") }),
        };
        self.scheduler.metrics().redelivery(&queue, &label);
    }
}

/// Why a redelivery was not scheduled.
enum Unscheduled {
    /// The broker cannot take it now: the message is held and tried again.
    BrokerAway,
    /// The planner ran out of time: back on its queue (another host may have the time).
    PlannerTimedOut,
    /// Anything else: the message is given up on with this reason.
    Failed(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> HeaderValue {
        HeaderValue::text(s)
    }

    fn death(queue: &str, reason: &str, count: i64, key: &str) -> HeaderValue {
        HeaderValue::Table(
            [
                ("queue", text(queue)),
                ("reason", text(reason)),
                ("count", HeaderValue::I64(count)),
                ("exchange", text("")),
                ("routing-keys", HeaderValue::Array(vec![text(key)])),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        )
    }

    fn dead_lettered(deaths: Vec<HeaderValue>, extra: &[(&str, HeaderValue)]) -> Properties {
        let mut headers: crate::message::Headers = [("x-death", HeaderValue::Array(deaths)), ("x-first-death-queue", text("orders")), ("tenant", text("acme"))]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        for (k, v) in extra {
            headers.insert(k.to_string(), v.clone());
        }
        Properties { headers, content_type: Some("application/json".into()), correlation_id: Some("c-1".into()), ..Default::default() }
    }

    #[test]
    fn the_most_recent_death_on_a_configured_queue_names_the_failure() {
        // After a fixed-intervals trip, the delay queue's expiry sits behind the consumer's rejection.
        let properties = dead_lettered(vec![death("orders", "rejected", 1, "order.created"), death("delay.1s", "expired", 1, "order.created")], &[]);
        let failure = read_failure(&properties, |q| q == "orders").unwrap();
        assert_eq!(failure, Failure { queue: "orders".into(), reason: "rejected".into(), routing_key: Some("order.created".into()), attempt: 1 });
    }

    #[test]
    fn the_attempt_header_wins_over_the_death_count() {
        let properties = dead_lettered(vec![death("orders", "rejected", 7, "k")], &[(ATTEMPT_HEADER, HeaderValue::I64(3))]);
        assert_eq!(read_failure(&properties, |q| q == "orders").unwrap().attempt, 3);
        let properties = dead_lettered(vec![death("orders", "rejected", 7, "k")], &[]);
        assert_eq!(read_failure(&properties, |q| q == "orders").unwrap().attempt, 7);
    }

    #[test]
    fn an_attempt_header_of_any_integer_type_counts() {
        for value in [HeaderValue::I8(3), HeaderValue::U8(3), HeaderValue::I16(3), HeaderValue::U16(3), HeaderValue::I32(3), HeaderValue::U32(3)] {
            let properties = dead_lettered(vec![death("orders", "rejected", 7, "k")], &[(ATTEMPT_HEADER, value.clone())]);
            assert_eq!(read_failure(&properties, |q| q == "orders").unwrap().attempt, 3, "{value:?}");
        }
    }

    #[test]
    fn a_policy_out_of_time_waits_and_a_failing_one_gives_up() {
        use crate::planner::PlannerError;
        let timeout = PlannerError::Timeout { planner: "p".into(), function: "decide-redelivery", budget: std::time::Duration::from_millis(100) };
        assert!(matches!(decision("p", 2, Err(ScheduleError::Planner(timeout))), Decision::Wait(_)));
        let trap = PlannerError::Trapped { planner: "p".into(), function: "decide-redelivery", reason: "unreachable".into() };
        assert!(matches!(decision("p", 2, Err(ScheduleError::Planner(trap))), Decision::GiveUp(why) if why.contains("unreachable")));
        assert_eq!(decision("p", 2, Ok(RedeliveryDecision::RetryAfterMs(5))), Decision::Retry { delay_ms: 5, next_attempt: 3 });
    }

    #[test]
    fn a_message_from_an_unconfigured_queue_is_not_claimed() {
        let properties = dead_lettered(vec![death("other", "rejected", 1, "k")], &[]);
        let err = read_failure(&properties, |q| q == "orders").unwrap_err().to_string();
        assert!(err.contains("other"), "{err}");
        assert!(read_failure(&Properties::default(), |_| true).unwrap_err().to_string().contains("no x-death"));
    }

    #[test]
    fn redelivered_properties_lose_death_records_and_keep_the_rest() {
        let properties = dead_lettered(
            vec![death("orders", "rejected", 1, "k")],
            &[(ATTEMPT_HEADER, HeaderValue::I64(1)), ("hourglass-due-at", HeaderValue::I64(5)), ("x-last-death-queue", text("orders"))],
        );
        let next = for_redelivery(&properties, 2);
        let keys: Vec<&str> = next.headers.keys().map(String::as_str).collect();
        assert_eq!(keys, vec![ATTEMPT_HEADER, "tenant"]);
        assert_eq!(next.headers.get(ATTEMPT_HEADER), Some(&HeaderValue::I64(2)));
        assert_eq!(next.content_type, properties.content_type);
        assert_eq!(next.correlation_id, properties.correlation_id);
    }

    #[test]
    fn the_seed_is_stable_per_message_and_differs_between_messages() {
        let with_id = |id: &str| Properties { message_id: Some(id.into()), ..Default::default() };
        assert_eq!(seed_of(&with_id("a"), b"x"), seed_of(&with_id("a"), b"y"));
        assert_ne!(seed_of(&with_id("a"), b"x"), seed_of(&with_id("b"), b"x"));
        assert_ne!(seed_of(&Properties::default(), b"x"), seed_of(&Properties::default(), b"y"));
    }

    #[test]
    fn policies_match_exactly_the_queue_named() {
        assert_eq!(regex_escape("orders.v2(eu)"), "orders\\.v2\\(eu\\)");
        assert_eq!(policy_name("orders"), "hourglass-redelivery-orders");
    }
}
