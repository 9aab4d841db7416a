//! Broker commands as the host sees them: planner output, checked.
//!
//! Planners return the WIT vocabulary; the host converts each command into
//! these types and validates it on the way (name lengths, SQS limits, duplicate
//! keys), so a faulty planner is reported by name instead of upsetting a broker.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::planner::bindings::hourglass::planner::types as wit;

/// AMQP names, routing keys and header keys are short strings: at most 255 bytes.
pub const AMQP_MAX_NAME: usize = 255;
/// RabbitMQ refuses TTLs and expiries above ten years.
pub const AMQP_MAX_TTL_MS: i64 = hourglass_planner_sdk::AMQP_MAX_TTL_MS as i64;
pub const SQS_MAX_QUEUE_NAME: usize = 80;
pub const SQS_MAX_DELAY_SECONDS: u32 = 900;
pub const SQS_MAX_MESSAGE_ATTRIBUTES: usize = 10;
/// Message group and deduplication ids.
pub const SQS_MAX_ID: usize = 128;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum FieldValue {
    Text(String),
    Int(i64),
    Bool(bool),
}

impl FieldValue {
    pub fn as_text(&self) -> Option<&str> {
        match self {
            FieldValue::Text(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_int(&self) -> Option<i64> {
        match self {
            FieldValue::Int(i) => Some(*i),
            _ => None,
        }
    }
}

impl std::fmt::Display for FieldValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FieldValue::Text(s) => write!(f, "{s:?}"),
            FieldValue::Int(i) => write!(f, "{i}"),
            FieldValue::Bool(b) => write!(f, "{b}"),
        }
    }
}

pub type FieldTable = BTreeMap<String, FieldValue>;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExchangeKind {
    Direct,
    Fanout,
    Topic,
    Headers,
}

impl ExchangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ExchangeKind::Direct => "direct",
            ExchangeKind::Fanout => "fanout",
            ExchangeKind::Topic => "topic",
            ExchangeKind::Headers => "headers",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "command", rename_all = "kebab-case")]
pub enum Command {
    DeclareExchange { name: String, kind: ExchangeKind, durable: bool, arguments: FieldTable },
    DeclareQueue { name: String, durable: bool, arguments: FieldTable },
    BindQueue { queue: String, exchange: String, routing_key: String, arguments: FieldTable },
    BindExchange { source: String, destination: String, routing_key: String, arguments: FieldTable },
    Publish { exchange: String, routing_key: String, headers: FieldTable, expiration_ms: Option<u64>, mandatory: bool },
    SqsEnsureQueue { name: String, attributes: BTreeMap<String, String>, pumped: bool },
    SqsSend {
        queue: String,
        delay_seconds: u32,
        attributes: BTreeMap<String, String>,
        group_id: Option<String>,
        dedup_id: Option<String>,
    },
}

impl Command {
    pub fn is_sqs(&self) -> bool {
        matches!(self, Command::SqsEnsureQueue { .. } | Command::SqsSend { .. })
    }

    /// Converts and validates one planner command. The error says what is wrong;
    /// the caller adds which planner said it.
    pub fn from_planner(command: wit::Command) -> Result<Command, String> {
        let command = match command {
            wit::Command::DeclareExchange(e) => {
                check_name("exchange", &e.name, false)?;
                Command::DeclareExchange {
                    name: e.name,
                    kind: match e.kind {
                        wit::ExchangeKind::Direct => ExchangeKind::Direct,
                        wit::ExchangeKind::Fanout => ExchangeKind::Fanout,
                        wit::ExchangeKind::Topic => ExchangeKind::Topic,
                        wit::ExchangeKind::Headers => ExchangeKind::Headers,
                    },
                    durable: e.durable,
                    arguments: field_table(e.arguments)?,
                }
            }
            wit::Command::DeclareQueue(q) => {
                check_name("queue", &q.name, false)?;
                let arguments = field_table(q.arguments)?;
                check_queue_arguments(&q.name, &arguments)?;
                Command::DeclareQueue { name: q.name, durable: q.durable, arguments }
            }
            wit::Command::BindQueue(b) => {
                check_name("queue", &b.queue, false)?;
                check_name("exchange", &b.exchange, false)?;
                check_name("routing key", &b.routing_key, true)?;
                Command::BindQueue {
                    queue: b.queue,
                    exchange: b.exchange,
                    routing_key: b.routing_key,
                    arguments: field_table(b.arguments)?,
                }
            }
            wit::Command::BindExchange(b) => {
                check_name("exchange", &b.source, false)?;
                check_name("exchange", &b.destination, false)?;
                check_name("routing key", &b.routing_key, true)?;
                Command::BindExchange {
                    source: b.source,
                    destination: b.destination,
                    routing_key: b.routing_key,
                    arguments: field_table(b.arguments)?,
                }
            }
            wit::Command::Publish(p) => {
                // The empty name is the default exchange.
                check_name("exchange", &p.exchange, true)?;
                check_name("routing key", &p.routing_key, true)?;
                if let Some(ms) = p.expiration_ms
                    && ms > AMQP_MAX_TTL_MS as u64
                {
                    return Err(format!("publish expiration {ms}ms is above the broker's 10-year maximum"));
                }
                Command::Publish {
                    exchange: p.exchange,
                    routing_key: p.routing_key,
                    headers: field_table(p.headers)?,
                    expiration_ms: p.expiration_ms,
                    mandatory: p.mandatory,
                }
            }
            wit::Command::SqsEnsureQueue(q) => {
                check_sqs_queue_name(&q.name)?;
                let attributes = sqs_attributes(q.attributes)?;
                if let Some(delay) = attributes.get("DelaySeconds") {
                    let seconds: u32 = delay.parse().map_err(|_| format!("queue {}: DelaySeconds {delay:?} is not a number", q.name))?;
                    if seconds > SQS_MAX_DELAY_SECONDS {
                        return Err(format!("queue {}: DelaySeconds {seconds} is above SQS's {SQS_MAX_DELAY_SECONDS}", q.name));
                    }
                }
                if q.name.ends_with(".fifo") != (attributes.get("FifoQueue").map(String::as_str) == Some("true")) {
                    return Err(format!("queue {}: a name ending in .fifo and FifoQueue = true go together", q.name));
                }
                Command::SqsEnsureQueue { name: q.name, attributes, pumped: q.pumped }
            }
            wit::Command::SqsSend(s) => {
                check_sqs_queue_name(&s.queue)?;
                if s.delay_seconds > SQS_MAX_DELAY_SECONDS {
                    return Err(format!("send to {}: DelaySeconds {} is above SQS's {SQS_MAX_DELAY_SECONDS}", s.queue, s.delay_seconds));
                }
                let fifo = s.queue.ends_with(".fifo");
                if fifo && s.group_id.is_none() {
                    return Err(format!("send to FIFO queue {} needs a message group id", s.queue));
                }
                if fifo && s.delay_seconds != 0 {
                    return Err(format!("send to FIFO queue {}: FIFO queues take only the queue-level delay", s.queue));
                }
                for id in [&s.group_id, &s.dedup_id].into_iter().flatten() {
                    if id.is_empty() || id.len() > SQS_MAX_ID {
                        return Err(format!("send to {}: id {id:?} must be 1 to {SQS_MAX_ID} characters", s.queue));
                    }
                }
                Command::SqsSend {
                    queue: s.queue,
                    delay_seconds: s.delay_seconds,
                    attributes: sqs_attributes(s.attributes)?,
                    group_id: s.group_id,
                    dedup_id: s.dedup_id,
                }
            }
        };
        Ok(command)
    }
}

fn check_name(what: &str, name: &str, empty_ok: bool) -> Result<(), String> {
    if name.is_empty() && !empty_ok {
        return Err(format!("{what} name is empty"));
    }
    if name.len() > AMQP_MAX_NAME {
        return Err(format!("{what} {name:?} is {} bytes; AMQP allows {AMQP_MAX_NAME}", name.len()));
    }
    Ok(())
}

fn check_sqs_queue_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > SQS_MAX_QUEUE_NAME {
        return Err(format!("SQS queue name {name:?} must be 1 to {SQS_MAX_QUEUE_NAME} characters"));
    }
    let stem = name.strip_suffix(".fifo").unwrap_or(name);
    if !stem.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return Err(format!("SQS queue name {name:?} may hold only letters, digits, '-', '_' and a .fifo suffix"));
    }
    Ok(())
}

fn check_queue_arguments(queue: &str, arguments: &FieldTable) -> Result<(), String> {
    for key in ["x-message-ttl", "x-expires"] {
        if let Some(value) = arguments.get(key) {
            let ms = value.as_int().ok_or_else(|| format!("queue {queue}: {key} must be an integer, got {value}"))?;
            let min = if key == "x-expires" { 1 } else { 0 };
            if !(min..=AMQP_MAX_TTL_MS).contains(&ms) {
                return Err(format!("queue {queue}: {key} = {ms} is outside {min}..={AMQP_MAX_TTL_MS} ms"));
            }
        }
    }
    Ok(())
}

fn field_table(fields: Vec<wit::Field>) -> Result<FieldTable, String> {
    let mut table = FieldTable::new();
    for field in fields {
        check_name("header or argument key", &field.key, false)?;
        let value = match field.value {
            wit::Value::Text(s) => FieldValue::Text(s),
            wit::Value::Int(i) => FieldValue::Int(i),
            wit::Value::Boolean(b) => FieldValue::Bool(b),
        };
        if table.insert(field.key.clone(), value).is_some() {
            return Err(format!("key {:?} is given twice", field.key));
        }
    }
    Ok(table)
}

fn sqs_attributes(attributes: Vec<wit::SqsAttribute>) -> Result<BTreeMap<String, String>, String> {
    let mut map = BTreeMap::new();
    for attribute in attributes {
        if attribute.name.is_empty() || attribute.name.len() > 256 {
            return Err(format!("SQS attribute name {:?} must be 1 to 256 characters", attribute.name));
        }
        if map.insert(attribute.name.clone(), attribute.value).is_some() {
            return Err(format!("SQS attribute {:?} is given twice", attribute.name));
        }
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(queue: &str, delay_seconds: u32, group: Option<&str>) -> wit::Command {
        wit::Command::SqsSend(wit::SqsSend {
            queue: queue.into(),
            delay_seconds,
            attributes: vec![],
            group_id: group.map(Into::into),
            dedup_id: None,
        })
    }

    #[test]
    fn sqs_limits_are_enforced() {
        assert!(Command::from_planner(send("q", 900, None)).is_ok());
        assert!(Command::from_planner(send("q", 901, None)).unwrap_err().contains("above SQS's 900"));
        assert!(Command::from_planner(send("q.fifo", 0, None)).unwrap_err().contains("group id"));
        assert!(Command::from_planner(send(&"q".repeat(81), 0, None)).unwrap_err().contains("1 to 80"));
    }

    #[test]
    fn amqp_names_and_ttls_are_enforced() {
        let queue = |name: &str, ttl: i64| {
            wit::Command::DeclareQueue(wit::DeclareQueue {
                name: name.into(),
                durable: true,
                arguments: vec![wit::Field { key: "x-message-ttl".into(), value: wit::Value::Int(ttl) }],
            })
        };
        assert!(Command::from_planner(queue("q", 5)).is_ok());
        assert!(Command::from_planner(queue("q", -1)).unwrap_err().contains("x-message-ttl = -1"));
        assert!(Command::from_planner(queue(&"q".repeat(256), 5)).unwrap_err().contains("AMQP allows 255"));
    }
}
