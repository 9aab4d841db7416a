//! Short constructors for the commands and values planners build most.

/// RabbitMQ refuses `x-message-ttl` and `x-expires` above ten years (in ms).
pub const AMQP_MAX_TTL_MS: u64 = 10 * 365 * 24 * 3_600_000;

use crate::{
    BindExchange, BindQueue, Command, DeclareExchange, DeclareQueue, DelayRange, ExchangeKind, Field, Granularity, Info, Name, NatsEnsureStream, NatsHeader,
    NatsPublish, NatsSchedule, Publish, SqsAttribute, SqsEnsureQueue, SqsSend, Value,
};
use crate::{BrokerFamily, ConfigKey};

impl Info {
    pub fn new(name: &str, version: &str, family: BrokerFamily) -> Self {
        Info { name: name.into(), version: version.into(), family, config_keys: Vec::new() }
    }

    /// Documents one key of the planner's table (shown by `hourglass describe`).
    pub fn key(mut self, name: &str, description: &str, default_value: Option<&str>) -> Self {
        self.config_keys.push(ConfigKey { name: name.into(), description: description.into(), default_value: default_value.map(Into::into) });
        self
    }
}

impl DelayRange {
    /// Every multiple of `resolution_ms` up to `max_delay_ms`.
    pub fn uniform(resolution_ms: u64, max_delay_ms: u64) -> Self {
        DelayRange { granularity: Granularity::Uniform(resolution_ms), max_delay_ms }
    }

    /// Only the given delays.
    pub fn listed(mut delays_ms: Vec<u64>) -> Self {
        delays_ms.sort_unstable();
        delays_ms.dedup();
        let max_delay_ms = delays_ms.last().copied().unwrap_or(0);
        DelayRange { granularity: Granularity::Listed(delays_ms), max_delay_ms }
    }

    /// Exactly one delay.
    pub fn exact(delay_ms: u64) -> Self {
        Self::listed(vec![delay_ms])
    }
}

pub fn text(key: &str, value: impl Into<String>) -> Field {
    Field { key: key.into(), value: Value::Text(value.into()) }
}

pub fn int(key: &str, value: i64) -> Field {
    Field { key: key.into(), value: Value::Int(value) }
}

pub fn boolean(key: &str, value: bool) -> Field {
    Field { key: key.into(), value: Value::Boolean(value) }
}

/// A durable exchange.
pub fn declare_exchange(name: &str, kind: ExchangeKind, arguments: Vec<Field>) -> Command {
    Command::DeclareExchange(DeclareExchange { name: name.into(), kind, durable: true, arguments })
}

/// A durable queue.
pub fn declare_queue(name: &str, arguments: Vec<Field>) -> Command {
    Command::DeclareQueue(DeclareQueue { name: name.into(), durable: true, arguments })
}

pub fn bind_queue(queue: &str, exchange: &str, routing_key: &str) -> Command {
    bind_queue_with(queue, exchange, routing_key, Vec::new())
}

pub fn bind_queue_with(queue: &str, exchange: &str, routing_key: &str, arguments: Vec<Field>) -> Command {
    Command::BindQueue(BindQueue { queue: queue.into(), exchange: exchange.into(), routing_key: routing_key.into(), arguments })
}

pub fn bind_exchange(source: &str, destination: &str, routing_key: &str) -> Command {
    Command::BindExchange(BindExchange { source: source.into(), destination: destination.into(), routing_key: routing_key.into(), arguments: Vec::new() })
}

/// Publishes the planned message with `mandatory` set, so an unroutable message
/// comes back to the host instead of vanishing. The exchange and key are each
/// a [`Key`](crate::Key) registered once, or text: a `String` passed in is
/// moved, not copied.
pub fn publish(exchange: impl Into<Name>, routing_key: impl Into<Name>, headers: Vec<Field>) -> Command {
    publish_bcc(exchange, routing_key, Vec::new(), headers)
}

/// [`publish`] with more routing keys, which the broker routes and
/// dead-letters on and strips before any consumer (RabbitMQ's `BCC`).
pub fn publish_bcc(exchange: impl Into<Name>, routing_key: impl Into<Name>, bcc: Vec<Name>, headers: Vec<Field>) -> Command {
    Command::Publish(Publish { exchange: exchange.into(), routing_key: routing_key.into(), bcc, headers, expiration_ms: None, mandatory: true })
}

pub fn sqs_attribute(name: &str, value: impl Into<String>) -> SqsAttribute {
    SqsAttribute { name: name.into(), value: value.into() }
}

pub fn sqs_ensure_queue(name: &str, attributes: Vec<SqsAttribute>, pumped: bool) -> Command {
    Command::SqsEnsureQueue(SqsEnsureQueue { name: name.into(), attributes, pumped })
}

pub fn sqs_send(queue: &str, delay_seconds: u32, attributes: Vec<SqsAttribute>) -> Command {
    Command::SqsSend(SqsSend { queue: queue.into(), delay_seconds, attributes, group_id: None, dedup_id: None })
}

/// A JetStream stream capturing `subjects`; `held`: the host consumes it and
/// asks [`Planner::handle_held`](crate::Planner::handle_held) about each message.
pub fn nats_ensure_stream(name: &str, subjects: &[&str], held: bool) -> Command {
    Command::NatsEnsureStream(NatsEnsureStream { name: name.into(), subjects: subjects.iter().map(|s| s.to_string()).collect(), held })
}

/// Publishes the message to `subject` (a [`Key`](crate::Key) registered once, or text), acknowledged by JetStream.
pub fn nats_publish(subject: impl Into<Name>, headers: Vec<NatsHeader>) -> Command {
    Command::NatsPublish(NatsPublish { subject: subject.into(), headers })
}

/// Hands the message to the NATS server as a schedule: it publishes the
/// message to `target` after `after_ms` (nats-server 2.12+).
pub fn nats_schedule(target: &str, after_ms: u64, headers: Vec<NatsHeader>) -> Command {
    Command::NatsSchedule(NatsSchedule { target: target.into(), after_ms, headers })
}

pub fn nats_header(name: &str, value: impl Into<String>) -> NatsHeader {
    NatsHeader { name: name.into(), value: value.into() }
}

/// Looks up a string attribute by name.
pub fn attribute<'a>(attributes: &'a [SqsAttribute], name: &str) -> Option<&'a str> {
    attributes.iter().find(|a| a.name == name).map(|a| a.value.as_str())
}

/// Rounds `delay_ms` up to a whole number of `unit_ms`.
pub fn units_rounded_up(delay_ms: u64, unit_ms: u64) -> u64 {
    delay_ms.div_ceil(unit_ms)
}
