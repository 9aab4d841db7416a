//! Broker commands as the host sees them: planner output, checked.
//!
//! Planners return the WIT vocabulary; `planner` converts each command into
//! these types and checks it on the way with the checks here (name lengths,
//! SQS limits, TTL ranges), so a faulty planner is reported by name instead of
//! upsetting a broker. This module imports nothing of the crate: every layer may use it.

use std::collections::BTreeMap;

use serde::Serialize;
use thiserror::Error;

/// AMQP names, routing keys and header keys are short strings: at most 255 bytes.
pub(crate) const AMQP_MAX_NAME: usize = 255;
/// RabbitMQ refuses TTLs and expiries above ten years.
pub const AMQP_MAX_TTL_MS: i64 = hourglass_planner_sdk::AMQP_MAX_TTL_MS as i64;
pub const SQS_MAX_QUEUE_NAME: usize = 80;
pub(crate) const SQS_MAX_DELAY_SECONDS: u32 = 900;
pub(crate) const SQS_MAX_MESSAGE_ATTRIBUTES: usize = 10;
/// Message group and deduplication ids.
pub(crate) const SQS_MAX_ID: usize = 128;
/// SQS bills every 64 KiB of a request's payload as one request.
pub(crate) const SQS_BILLED_BYTES: usize = 64 * 1024;
/// JetStream stream names: the server takes longer ones, but a name becomes a
/// directory and part of API subjects, and its own advice is to keep them short.
pub(crate) const NATS_MAX_STREAM_NAME: usize = 255;
/// A subject (and a header name) we send: far below any server's max payload.
pub(crate) const NATS_MAX_SUBJECT: usize = 1_024;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum FieldValue {
    Text(String),
    Int(i64),
    Bool(bool),
}

impl FieldValue {
    pub(crate) fn as_text(&self) -> Option<&str> {
        match self {
            FieldValue::Text(s) => Some(s),
            _ => None,
        }
    }

    pub(crate) fn as_int(&self) -> Option<i64> {
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

/// The broker family a planner writes commands for: each broker executes
/// its own family's commands and refuses the others'.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BrokerFamily {
    Amqp,
    Sqs,
    Nats,
}

impl BrokerFamily {
    pub fn as_str(self) -> &'static str {
        match self {
            BrokerFamily::Amqp => "amqp",
            BrokerFamily::Sqs => "sqs",
            BrokerFamily::Nats => "nats",
        }
    }
}

impl std::fmt::Display for BrokerFamily {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One planned broker command, grouped by family: a broker matches its own
/// family's enum exhaustively and refuses the rest (`ExecutorError::other_family`), so
/// a command added to one family touches that family's broker only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Command {
    Amqp(AmqpCommand),
    Sqs(SqsCommand),
    Nats(NatsCommand),
}

/// Commands of AMQP 0-9-1 brokers (RabbitMQ).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "command", rename_all = "kebab-case")]
pub enum AmqpCommand {
    DeclareExchange {
        name: String,
        kind: ExchangeKind,
        durable: bool,
        arguments: FieldTable,
    },
    DeclareQueue {
        name: String,
        durable: bool,
        arguments: FieldTable,
    },
    BindQueue {
        queue: String,
        exchange: String,
        routing_key: String,
        arguments: FieldTable,
    },
    BindExchange {
        source: String,
        destination: String,
        routing_key: String,
        arguments: FieldTable,
    },
    Publish {
        exchange: String,
        routing_key: String,
        /// More routing keys (RabbitMQ's `BCC` header): routed and dead-lettered on, never seen by a consumer.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        bcc: Vec<String>,
        headers: FieldTable,
        expiration_ms: Option<u64>,
        mandatory: bool,
    },
}

/// Commands of Amazon SQS.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "command", rename_all = "kebab-case")]
pub enum SqsCommand {
    #[serde(rename = "sqs-ensure-queue")]
    EnsureQueue { name: String, attributes: BTreeMap<String, String>, pumped: bool },
    #[serde(rename = "sqs-send")]
    Send { queue: String, delay_seconds: u32, attributes: BTreeMap<String, String>, group_id: Option<String>, dedup_id: Option<String> },
}

/// Commands of NATS JetStream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "command", rename_all = "kebab-case")]
pub enum NatsCommand {
    #[serde(rename = "nats-ensure-stream")]
    EnsureStream {
        name: String,
        subjects: Vec<String>,
        /// The host runs a held-stream consumer on it (`handle-held`).
        held: bool,
    },
    #[serde(rename = "nats-publish")]
    Publish { subject: String, headers: BTreeMap<String, String> },
    /// A one-shot JetStream schedule of the message (nats-server 2.12+): the
    /// server publishes it to `target` `after_ms` from now on its clock.
    #[serde(rename = "nats-schedule")]
    Schedule { target: String, after_ms: u64, headers: BTreeMap<String, String> },
}

/// A message a held stream delivered, as its planner sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldMessage {
    pub stream: String,
    pub subject: String,
    pub destination: String,
    pub due_at_ms: u64,
    pub now_ms: u64,
    pub deliveries: u32,
}

/// What a planner decides for a held message: deliver it again later, or send it on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "kebab-case")]
pub enum HeldAction {
    Wait { ms: u64 },
    HandOver { commands: Vec<Command> },
}

/// A message that fell due on a pumped queue, as its planner sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DueMessage {
    pub queue: String,
    pub message_id: String,
    pub attributes: Vec<(String, String)>,
    pub sent_timestamp_ms: u64,
    pub first_receive_timestamp_ms: u64,
    pub receive_count: u32,
    pub host_now_ms: u64,
}

/// What a planner decides for a due message: another cycle, or on to the destination.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "action", content = "commands", rename_all = "kebab-case")]
pub enum DueAction {
    Recycle(Vec<Command>),
    HandOver(Vec<Command>),
}

impl Command {
    /// The family whose planners write this command.
    pub fn family(&self) -> BrokerFamily {
        match self {
            Command::Amqp(_) => BrokerFamily::Amqp,
            Command::Sqs(_) => BrokerFamily::Sqs,
            Command::Nats(_) => BrokerFamily::Nats,
        }
    }

    /// Whether this command sends the message being planned (the others declare).
    pub fn sends_the_message(&self) -> bool {
        match self {
            Command::Amqp(command) => matches!(command, AmqpCommand::Publish { .. }),
            Command::Sqs(command) => matches!(command, SqsCommand::Send { .. }),
            Command::Nats(command) => matches!(command, NatsCommand::Publish { .. } | NatsCommand::Schedule { .. }),
        }
    }

    /// A mandatory publish of the message as it is, to one routing key: how
    /// the host itself forwards, parks and moves messages.
    pub fn forward(exchange: &str, routing_key: &str) -> Command {
        Command::Amqp(AmqpCommand::Publish {
            exchange: exchange.to_string(),
            routing_key: routing_key.to_string(),
            bcc: Vec::new(),
            headers: FieldTable::new(),
            expiration_ms: None,
            mandatory: true,
        })
    }

    /// Destination names this command makes hourglass's own: where a strategy
    /// holds messages is no destination (a message due there would come round again).
    pub fn held_names(&self) -> Vec<&str> {
        match self {
            Command::Amqp(AmqpCommand::DeclareExchange { name, .. } | AmqpCommand::DeclareQueue { name, .. }) => vec![name],
            Command::Amqp(AmqpCommand::BindQueue { .. } | AmqpCommand::BindExchange { .. } | AmqpCommand::Publish { .. }) => Vec::new(),
            Command::Sqs(SqsCommand::EnsureQueue { .. } | SqsCommand::Send { .. }) => Vec::new(),
            Command::Nats(NatsCommand::EnsureStream { subjects, .. }) => subjects.iter().map(String::as_str).collect(),
            Command::Nats(NatsCommand::Publish { .. } | NatsCommand::Schedule { .. }) => Vec::new(),
        }
    }

    /// The queue this command makes for a pump to drain (`sqs-ensure-queue` with `pumped`).
    pub fn pumped_queue(&self) -> Option<&str> {
        match self {
            Command::Sqs(SqsCommand::EnsureQueue { name, pumped: true, .. }) => Some(name),
            _ => None,
        }
    }

    /// What the command does, to what, and the rest, for a table row.
    pub fn describe(&self) -> Described {
        let text = |pairs: &mut dyn Iterator<Item = (&String, String)>| pairs.map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ");
        let fields = |table: &FieldTable| text(&mut table.iter().map(|(k, v)| (k, v.to_string())));
        let plain = |map: &BTreeMap<String, String>| text(&mut map.iter().map(|(k, v)| (k, v.clone())));
        let quoted = |map: &BTreeMap<String, String>| text(&mut map.iter().map(|(k, v)| (k, format!("{v:?}"))));
        let described = |what, name: &String, details: String| Described { what, name: name.clone(), details: details.trim().to_string() };
        match self {
            Command::Amqp(AmqpCommand::DeclareExchange { name, kind, durable, arguments }) => {
                described("declare exchange", name, format!("{}{} {}", kind.as_str(), if *durable { " durable" } else { "" }, fields(arguments)))
            }
            Command::Amqp(AmqpCommand::DeclareQueue { name, arguments, .. }) => described("declare queue", name, fields(arguments)),
            Command::Amqp(AmqpCommand::BindQueue { queue, exchange, routing_key, arguments }) => {
                described("bind queue", queue, format!("from exchange {exchange} key {routing_key:?} {}", fields(arguments)))
            }
            Command::Amqp(AmqpCommand::BindExchange { source, destination, routing_key, .. }) => {
                described("bind exchange", destination, format!("from exchange {source} key {routing_key:?}"))
            }
            Command::Amqp(AmqpCommand::Publish { exchange, routing_key, bcc, headers, expiration_ms, mandatory }) => {
                let mut details = format!("key {routing_key}");
                if !bcc.is_empty() {
                    details += &format!(" bcc {}", bcc.join(","));
                }
                if !headers.is_empty() {
                    details += &format!(" headers {}", fields(headers));
                }
                if let Some(ms) = expiration_ms {
                    details += &format!(" expiration {}", humantime::format_duration(std::time::Duration::from_millis(*ms)));
                }
                if *mandatory {
                    details += " mandatory";
                }
                described("publish", &if exchange.is_empty() { "(default)".to_string() } else { exchange.clone() }, details)
            }
            Command::Sqs(SqsCommand::EnsureQueue { name, attributes, pumped }) => {
                described("ensure sqs queue", name, format!("{}{}", plain(attributes), if *pumped { " (pumped)" } else { "" }))
            }
            Command::Sqs(SqsCommand::Send { queue, delay_seconds, attributes, group_id, dedup_id }) => {
                let mut details = format!("DelaySeconds {delay_seconds} {}", plain(attributes));
                if let Some(group) = group_id {
                    details += &format!(" group {group}");
                }
                if let Some(dedup) = dedup_id {
                    details += &format!(" dedup {dedup}");
                }
                described("sqs send", queue, details)
            }
            Command::Nats(NatsCommand::EnsureStream { name, subjects, held }) => {
                described("ensure nats stream", name, format!("subjects {}{}", subjects.join(","), if *held { " (held)" } else { "" }))
            }
            Command::Nats(NatsCommand::Publish { subject, headers }) => {
                described("nats publish", subject, if headers.is_empty() { String::new() } else { format!("headers {}", quoted(headers)) })
            }
            Command::Nats(NatsCommand::Schedule { target, after_ms, headers }) => {
                let headers = if headers.is_empty() { String::new() } else { format!("headers {}", quoted(headers)) };
                described("nats schedule", target, format!("after {} {headers}", humantime::format_duration(std::time::Duration::from_millis(*after_ms))))
            }
        }
    }

    /// The broker object this command declares, for diagrams: what kind, its name, a label.
    pub fn declared_object(&self) -> Option<DeclaredObject> {
        let object = |kind, name: &String, label| Some(DeclaredObject { kind, name: name.clone(), label });
        match self {
            Command::Amqp(AmqpCommand::DeclareExchange { name, kind, .. }) => {
                object(ObjectKind::Exchange, name, format!("exchange {name} ({})", kind.as_str()))
            }
            Command::Amqp(AmqpCommand::DeclareQueue { name, .. }) => object(ObjectKind::Queue, name, format!("queue {name}")),
            Command::Amqp(AmqpCommand::BindQueue { .. } | AmqpCommand::BindExchange { .. } | AmqpCommand::Publish { .. }) => None,
            Command::Sqs(SqsCommand::EnsureQueue { name, pumped, .. }) => {
                object(ObjectKind::Queue, name, format!("sqs queue {name}{}", if *pumped { " (pumped)" } else { "" }))
            }
            Command::Sqs(SqsCommand::Send { .. }) => None,
            Command::Nats(NatsCommand::EnsureStream { name, held, .. }) => {
                object(ObjectKind::Stream, name, format!("nats stream {name}{}", if *held { " (held)" } else { "" }))
            }
            Command::Nats(NatsCommand::Publish { .. } | NatsCommand::Schedule { .. }) => None,
        }
    }
}

/// A command for people: what it does, to what, and the rest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Described {
    pub what: &'static str,
    pub name: String,
    pub details: String,
}

/// What a command declares, for diagrams.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeclaredObject {
    pub kind: ObjectKind,
    pub name: String,
    pub label: String,
}

/// Exchanges route; queues and streams hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ObjectKind {
    Exchange,
    Queue,
    Stream,
}

/// Where a held stream (`nats-ensure-stream` with `held`) parks what can never
/// go on: the stream `<name>-parked`, capturing `hourglass.parked.<name>`.
pub fn held_parked_stream(held: &str) -> (String, String) {
    (format!("{held}-parked"), format!("hourglass.parked.{held}"))
}

/// The parking queues among `commands`: queues bound to the exchange that
/// ends a chain of `alternate-exchange`s (where a message whose destination
/// vanished ends up), and each held stream's parked stream. An alternate that
/// has an alternate of its own is a hop on the way, as direct binary levels are.
pub fn parking_queues(commands: &[Command]) -> Vec<String> {
    let exchanges: Vec<(&str, Option<&str>)> = commands
        .iter()
        .filter_map(|command| match command {
            Command::Amqp(AmqpCommand::DeclareExchange { name, arguments, .. }) => {
                Some((name.as_str(), arguments.get("alternate-exchange").and_then(FieldValue::as_text)))
            }
            _ => None,
        })
        .collect();
    let alternates: Vec<&str> = exchanges
        .iter()
        .filter_map(|(_, alternate)| *alternate)
        .filter(|alternate| !exchanges.iter().any(|(name, own)| name == alternate && own.is_some()))
        .collect();
    let mut queues: Vec<String> = commands
        .iter()
        .filter_map(|command| match command {
            Command::Amqp(AmqpCommand::BindQueue { queue, exchange, .. }) if alternates.contains(&exchange.as_str()) => Some(queue.clone()),
            _ => None,
        })
        .collect();
    queues.extend(commands.iter().filter_map(|command| match command {
        Command::Nats(NatsCommand::EnsureStream { name, held: true, .. }) => Some(held_parked_stream(name).0),
        _ => None,
    }));
    queues.sort();
    queues.dedup();
    queues
}

/// The queues among `commands` where delayed messages wait, with their
/// message TTL when they have one: every declared queue but the parking
/// ones, and every held stream.
pub fn waiting_queues(commands: &[Command]) -> Vec<(String, Option<u64>)> {
    let parking = parking_queues(commands);
    let mut queues: Vec<(String, Option<u64>)> = commands
        .iter()
        .filter_map(|command| match command {
            Command::Amqp(AmqpCommand::DeclareQueue { name, arguments, .. }) if !parking.contains(name) => {
                let ttl = match arguments.get("x-message-ttl") {
                    Some(FieldValue::Int(ms)) => u64::try_from(*ms).ok(),
                    _ => None,
                };
                Some((name.clone(), ttl))
            }
            // A held stream: its messages wait there, each for its own time.
            Command::Nats(NatsCommand::EnsureStream { name, held: true, .. }) => Some((name.clone(), None)),
            _ => None,
        })
        .collect();
    queues.sort();
    queues.dedup();
    queues
}

/// The exchanges that queues declared per message (in `declarations` but
/// not in the strategy's `topology`: hold-queues) dead-letter into: a broker
/// listing finds those queues by it.
pub fn per_message_queue_targets(topology: &[Command], declarations: &[Command]) -> Vec<String> {
    let declared = |name: &str| topology.iter().any(|c| matches!(c, Command::Amqp(AmqpCommand::DeclareQueue { name: n, .. }) if n == name));
    let mut targets: Vec<String> = declarations
        .iter()
        .filter_map(|c| match c {
            Command::Amqp(AmqpCommand::DeclareQueue { name, arguments, .. }) if !declared(name) => {
                arguments.get("x-dead-letter-exchange").and_then(FieldValue::as_text).map(str::to_string)
            }
            _ => None,
        })
        .collect();
    targets.sort();
    targets.dedup();
    targets
}

/// The queues among `commands` that dead-letter at most once: declared with a
/// dead-letter exchange but not as quorum queues with `x-dead-letter-strategy =
/// at-least-once` and `x-overflow = reject-publish` (without which the broker
/// falls back to at most once). A broker crash can lose messages waiting in
/// them; the names are for the startup warning. Pass a strategy's topology, and
/// for strategies that declare queues per message (hold-queues) a sample plan.
pub fn at_most_once_dead_lettering(commands: &[Command]) -> Vec<String> {
    let is = |arguments: &FieldTable, key: &str, value: &str| arguments.get(key).and_then(FieldValue::as_text) == Some(value);
    let mut queues: Vec<String> = commands
        .iter()
        .filter_map(|command| match command {
            Command::Amqp(AmqpCommand::DeclareQueue { name, arguments, .. }) if arguments.contains_key("x-dead-letter-exchange") => {
                let at_least_once = is(arguments, "x-queue-type", "quorum")
                    && is(arguments, "x-dead-letter-strategy", "at-least-once")
                    && is(arguments, "x-overflow", "reject-publish");
                (!at_least_once).then(|| name.clone())
            }
            _ => None,
        })
        .collect();
    queues.dedup();
    queues
}

/// What is wrong with a command a planner returned. The caller adds which
/// planner said it (`PlannerError::InvalidCommand`).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum InvalidCommand {
    #[error("{what} name is empty")]
    EmptyName { what: &'static str },
    #[error("{what} {name:?} is {} bytes; AMQP allows {AMQP_MAX_NAME}", name.len())]
    NameTooLong { what: &'static str, name: String },
    #[error("queue {queue}: {key} must be an integer, got {value}")]
    ArgumentNotInteger { queue: String, key: &'static str, value: FieldValue },
    #[error("queue {queue}: {key} = {ms} is outside {min}..={AMQP_MAX_TTL_MS} ms")]
    ArgumentOutOfRange { queue: String, key: &'static str, ms: i64, min: i64 },
    #[error("key {0:?} is given twice")]
    KeyTwice(String),
    #[error("publish carries {count} bcc routing keys; at most {max}")]
    TooManyBccKeys { count: usize, max: usize },
    #[error("{what} names registered name {index}, but the planner registered {registered} (indices from 0)")]
    UnregisteredName { what: &'static str, index: u32, registered: usize },
    #[error("publish expiration {0}ms is above the broker's 10-year maximum")]
    ExpirationTooLong(u64),
    #[error("SQS queue name {0:?} must be 1 to {SQS_MAX_QUEUE_NAME} characters")]
    SqsQueueNameLength(String),
    #[error("SQS queue name {0:?} may hold only letters, digits, '-', '_' and a .fifo suffix")]
    SqsQueueNameCharacters(String),
    #[error("SQS attribute name {0:?} must be 1 to 256 characters")]
    SqsAttributeNameLength(String),
    #[error("SQS attribute {0:?} is given twice")]
    SqsAttributeTwice(String),
    #[error("queue {queue}: DelaySeconds {value:?} is not a number")]
    QueueDelayNotANumber { queue: String, value: String },
    #[error("queue {queue}: DelaySeconds {seconds} is above SQS's {SQS_MAX_DELAY_SECONDS}")]
    QueueDelayTooLong { queue: String, seconds: u32 },
    #[error("queue {0}: a name ending in .fifo and FifoQueue = true go together")]
    FifoNameMismatch(String),
    #[error("send to {queue}: DelaySeconds {seconds} is above SQS's {SQS_MAX_DELAY_SECONDS}")]
    SendDelayTooLong { queue: String, seconds: u32 },
    #[error("send to FIFO queue {0} needs a message group id")]
    FifoSendWithoutGroup(String),
    #[error("send to FIFO queue {0}: FIFO queues take only the queue-level delay")]
    FifoSendWithDelay(String),
    #[error("send to {queue}: id {id:?} must be 1 to {SQS_MAX_ID} characters")]
    SqsIdLength { queue: String, id: String },
    #[error("stream name {0:?} must be 1 to {NATS_MAX_STREAM_NAME} characters without spaces, '.', '*', '>', '/' or '\\'")]
    NatsStreamName(String),
    #[error("stream {0} captures no subject")]
    NatsStreamWithoutSubjects(String),
    #[error("{what} {subject:?} is not a NATS subject: {why}")]
    NatsSubject { what: &'static str, subject: String, why: &'static str },
    #[error("NATS header name {0:?} must be 1 to {NATS_MAX_SUBJECT} printable ASCII characters without ':'")]
    NatsHeaderName(String),
    #[error("NATS header {0:?}: a value cannot hold a line break")]
    NatsHeaderValue(String),
    #[error("NATS header {0:?} is given twice")]
    NatsHeaderTwice(String),
    #[error("NATS header {0:?}: the host writes a schedule's Nats-Schedule headers itself")]
    NatsScheduleHeader(String),
}

pub(crate) fn check_name(what: &'static str, name: &str, empty_ok: bool) -> Result<(), InvalidCommand> {
    if name.is_empty() && !empty_ok {
        return Err(InvalidCommand::EmptyName { what });
    }
    if name.len() > AMQP_MAX_NAME {
        return Err(InvalidCommand::NameTooLong { what, name: name.to_string() });
    }
    Ok(())
}

pub(crate) fn check_sqs_queue_name(name: &str) -> Result<(), InvalidCommand> {
    if name.is_empty() || name.len() > SQS_MAX_QUEUE_NAME {
        return Err(InvalidCommand::SqsQueueNameLength(name.to_string()));
    }
    let stem = name.strip_suffix(".fifo").unwrap_or(name);
    if !stem.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return Err(InvalidCommand::SqsQueueNameCharacters(name.to_string()));
    }
    Ok(())
}

/// A JetStream stream name: the server refuses these characters in one.
pub(crate) fn check_nats_stream_name(name: &str) -> Result<(), InvalidCommand> {
    let refused = |c: char| c.is_whitespace() || c.is_control() || matches!(c, '.' | '*' | '>' | '/' | '\\');
    if name.is_empty() || name.len() > NATS_MAX_STREAM_NAME || name.contains(refused) {
        return Err(InvalidCommand::NatsStreamName(name.to_string()));
    }
    Ok(())
}

/// A NATS subject: dot-separated tokens, none empty, no spaces; `*` and `>`
/// are whole tokens, `>` only the last, and only where `wildcards` (a
/// stream's subjects, not a publish's).
pub(crate) fn check_nats_subject(what: &'static str, subject: &str, wildcards: bool) -> Result<(), InvalidCommand> {
    let invalid = |why| Err(InvalidCommand::NatsSubject { what, subject: subject.to_string(), why });
    if subject.is_empty() || subject.len() > NATS_MAX_SUBJECT {
        return invalid("it must be 1 to 1,024 bytes");
    }
    if subject.contains(|c: char| c.is_whitespace() || c.is_control()) {
        return invalid("it holds a space or a control character");
    }
    let tokens: Vec<&str> = subject.split('.').collect();
    for (i, token) in tokens.iter().enumerate() {
        match *token {
            "" => return invalid("a token between dots is empty"),
            "*" | ">" if !wildcards => return invalid("a message is published to one subject, without wildcards"),
            ">" if i + 1 != tokens.len() => return invalid("'>' may only be the last token"),
            "*" | ">" => {}
            other if other.contains(['*', '>']) => return invalid("'*' and '>' must be whole tokens"),
            _ => {}
        }
    }
    Ok(())
}

pub(crate) fn check_nats_header_name(name: &str) -> Result<(), InvalidCommand> {
    if name.is_empty() || name.len() > NATS_MAX_SUBJECT || name.contains(|c: char| c == ':' || !c.is_ascii_graphic()) {
        return Err(InvalidCommand::NatsHeaderName(name.to_string()));
    }
    Ok(())
}

/// A planner's NATS headers, checked: each name valid and given once, no value with a line break.
pub(crate) fn nats_headers(headers: impl IntoIterator<Item = (String, String)>) -> Result<BTreeMap<String, String>, InvalidCommand> {
    let mut checked = BTreeMap::new();
    for (name, value) in headers {
        check_nats_header_name(&name)?;
        if value.contains(['\r', '\n']) {
            return Err(InvalidCommand::NatsHeaderValue(name));
        }
        if checked.contains_key(&name) {
            return Err(InvalidCommand::NatsHeaderTwice(name));
        }
        checked.insert(name, value);
    }
    Ok(checked)
}

pub(crate) fn check_queue_arguments(queue: &str, arguments: &FieldTable) -> Result<(), InvalidCommand> {
    for key in ["x-message-ttl", "x-expires"] {
        if let Some(value) = arguments.get(key) {
            let ms = value.as_int().ok_or_else(|| InvalidCommand::ArgumentNotInteger { queue: queue.to_string(), key, value: value.clone() })?;
            let min = if key == "x-expires" { 1 } else { 0 };
            if !(min..=AMQP_MAX_TTL_MS).contains(&ms) {
                return Err(InvalidCommand::ArgumentOutOfRange { queue: queue.to_string(), key, ms, min });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(name: &str, arguments: &[(&str, &str)]) -> Command {
        let arguments = arguments.iter().map(|(k, v)| (k.to_string(), FieldValue::Text(v.to_string()))).collect();
        Command::Amqp(AmqpCommand::DeclareQueue { name: name.into(), durable: true, arguments })
    }

    #[test]
    fn only_quorum_at_least_once_with_reject_publish_dead_letters_safely() {
        let dlx = ("x-dead-letter-exchange", "next");
        let commands = [
            queue("safe", &[dlx, ("x-queue-type", "quorum"), ("x-dead-letter-strategy", "at-least-once"), ("x-overflow", "reject-publish")]),
            queue("classic", &[dlx, ("x-queue-type", "classic")]),
            queue("untyped", &[dlx]),
            // The broker quietly falls back to at most once with drop-head.
            queue("drop-head", &[dlx, ("x-queue-type", "quorum"), ("x-dead-letter-strategy", "at-least-once")]),
            queue("no-dead-letters", &[("x-queue-type", "classic")]),
        ];
        assert_eq!(at_most_once_dead_lettering(&commands), vec!["classic", "untyped", "drop-head"]);
    }

    #[test]
    fn nats_subjects_take_wildcards_only_as_whole_tokens_and_only_in_streams() {
        for good in ["orders", "orders.created", "a.b.c"] {
            assert_eq!(check_nats_subject("subject", good, false), Ok(()), "{good}");
        }
        for good in ["orders.*", "orders.>", "*.created", ">"] {
            assert_eq!(check_nats_subject("subject", good, true), Ok(()), "{good}");
            assert!(check_nats_subject("subject", good, false).is_err(), "{good} published");
        }
        for bad in ["", "orders..created", ".orders", "orders.", "orders.>.x", "ord*ers", "or ders", "orders.a>"] {
            assert!(check_nats_subject("subject", bad, true).is_err(), "{bad:?}");
        }
        assert!(check_nats_stream_name("HOURGLASS_HOLD").is_ok());
        for bad in ["", "a.b", "a b", "a*", "a>", "a/b"] {
            assert!(check_nats_stream_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn parking_queues_are_those_bound_to_an_alternate_exchange() {
        let text = |k: &str, v: &str| -> FieldTable { [(k.to_string(), FieldValue::Text(v.into()))].into() };
        let exchange = |name: &str, arguments: FieldTable| {
            Command::Amqp(AmqpCommand::DeclareExchange { name: name.into(), kind: ExchangeKind::Direct, durable: true, arguments })
        };
        let bind = |queue: &str, exchange: &str| {
            Command::Amqp(AmqpCommand::BindQueue { queue: queue.into(), exchange: exchange.into(), routing_key: String::new(), arguments: FieldTable::new() })
        };
        let commands = [
            exchange("p.parking", FieldTable::new()),
            exchange("p.delivery", text("alternate-exchange", "p.parking")),
            bind("p.parked", "p.parking"),
            bind("p.level-01", "p.delivery"),
            // Direct levels pass what is not theirs to the next lower level: a hop, not parking.
            exchange("p.level-00", text("alternate-exchange", "p.delivery")),
            bind("p.level-00", "p.level-00"),
        ];
        assert_eq!(parking_queues(&commands), vec!["p.parked"]);
        assert!(parking_queues(&commands[2..4]).is_empty(), "without an alternate exchange nothing is parking");
    }
}
