//! Planner output into host commands: the WIT vocabulary converted and checked.

use std::collections::BTreeMap;

use super::bindings::hourglass::planner::types as wit;
use crate::command::{
    AMQP_MAX_TTL_MS, AmqpCommand, Command, ExchangeKind, FieldTable, FieldValue, InvalidCommand, NatsCommand, SQS_MAX_DELAY_SECONDS, SQS_MAX_ID, SqsCommand,
    check_name, check_nats_stream_name, check_nats_subject, check_queue_arguments, check_sqs_queue_name, nats_headers,
};

/// More than a 32-level strategy needs (one key per bit, and the destination's),
/// few enough that the header stays far below any frame size.
const MAX_BCC_KEYS: usize = 40;

/// Converts and validates one planner command; `names` are the strings the
/// planner registered, which `name.registered` indexes. The error says what
/// is wrong; the caller adds which planner said it.
pub(crate) fn command_from_planner(command: wit::Command, names: &[String]) -> Result<Command, InvalidCommand> {
    let command = match command {
        wit::Command::DeclareExchange(e) => {
            check_name("exchange", &e.name, false)?;
            Command::Amqp(AmqpCommand::DeclareExchange {
                name: e.name,
                kind: match e.kind {
                    wit::ExchangeKind::Direct => ExchangeKind::Direct,
                    wit::ExchangeKind::Fanout => ExchangeKind::Fanout,
                    wit::ExchangeKind::Topic => ExchangeKind::Topic,
                    wit::ExchangeKind::Headers => ExchangeKind::Headers,
                },
                durable: e.durable,
                arguments: field_table(e.arguments)?,
            })
        }
        wit::Command::DeclareQueue(q) => {
            check_name("queue", &q.name, false)?;
            let arguments = field_table(q.arguments)?;
            check_queue_arguments(&q.name, &arguments)?;
            Command::Amqp(AmqpCommand::DeclareQueue { name: q.name, durable: q.durable, arguments })
        }
        wit::Command::BindQueue(b) => {
            check_name("queue", &b.queue, false)?;
            check_name("exchange", &b.exchange, false)?;
            check_name("routing key", &b.routing_key, true)?;
            Command::Amqp(AmqpCommand::BindQueue { queue: b.queue, exchange: b.exchange, routing_key: b.routing_key, arguments: field_table(b.arguments)? })
        }
        wit::Command::BindExchange(b) => {
            check_name("exchange", &b.source, false)?;
            check_name("exchange", &b.destination, false)?;
            check_name("routing key", &b.routing_key, true)?;
            Command::Amqp(AmqpCommand::BindExchange {
                source: b.source,
                destination: b.destination,
                routing_key: b.routing_key,
                arguments: field_table(b.arguments)?,
            })
        }
        wit::Command::Publish(p) => {
            if p.bcc.len() > MAX_BCC_KEYS {
                return Err(InvalidCommand::TooManyBccKeys { count: p.bcc.len(), max: MAX_BCC_KEYS });
            }
            // The empty name is the default exchange.
            let exchange = resolve("exchange", p.exchange, names)?;
            let routing_key = resolve("routing key", p.routing_key, names)?;
            let bcc = p.bcc.into_iter().map(|key| resolve("bcc routing key", key, names)).collect::<Result<Vec<_>, _>>()?;
            if let Some(ms) = p.expiration_ms
                && ms > AMQP_MAX_TTL_MS as u64
            {
                return Err(InvalidCommand::ExpirationTooLong(ms));
            }
            Command::Amqp(AmqpCommand::Publish {
                exchange,
                routing_key,
                bcc,
                headers: field_table(p.headers)?,
                expiration_ms: p.expiration_ms,
                mandatory: p.mandatory,
            })
        }
        wit::Command::SqsEnsureQueue(q) => {
            check_sqs_queue_name(&q.name)?;
            let attributes = sqs_attributes(q.attributes)?;
            if let Some(delay) = attributes.get("DelaySeconds") {
                let seconds: u32 = delay.parse().map_err(|_| InvalidCommand::QueueDelayNotANumber { queue: q.name.clone(), value: delay.clone() })?;
                if seconds > SQS_MAX_DELAY_SECONDS {
                    return Err(InvalidCommand::QueueDelayTooLong { queue: q.name, seconds });
                }
            }
            if q.name.ends_with(".fifo") != (attributes.get("FifoQueue").map(String::as_str) == Some("true")) {
                return Err(InvalidCommand::FifoNameMismatch(q.name));
            }
            Command::Sqs(SqsCommand::EnsureQueue { name: q.name, attributes, pumped: q.pumped })
        }
        wit::Command::SqsSend(s) => {
            check_sqs_queue_name(&s.queue)?;
            if s.delay_seconds > SQS_MAX_DELAY_SECONDS {
                return Err(InvalidCommand::SendDelayTooLong { queue: s.queue, seconds: s.delay_seconds });
            }
            let fifo = s.queue.ends_with(".fifo");
            if fifo && s.group_id.is_none() {
                return Err(InvalidCommand::FifoSendWithoutGroup(s.queue));
            }
            if fifo && s.delay_seconds != 0 {
                return Err(InvalidCommand::FifoSendWithDelay(s.queue));
            }
            for id in [&s.group_id, &s.dedup_id].into_iter().flatten() {
                if id.is_empty() || id.len() > SQS_MAX_ID {
                    return Err(InvalidCommand::SqsIdLength { queue: s.queue.clone(), id: id.clone() });
                }
            }
            Command::Sqs(SqsCommand::Send {
                queue: s.queue,
                delay_seconds: s.delay_seconds,
                attributes: sqs_attributes(s.attributes)?,
                group_id: s.group_id,
                dedup_id: s.dedup_id,
            })
        }
        wit::Command::NatsEnsureStream(stream) => {
            check_nats_stream_name(&stream.name)?;
            if stream.subjects.is_empty() {
                return Err(InvalidCommand::NatsStreamWithoutSubjects(stream.name));
            }
            for subject in &stream.subjects {
                check_nats_subject("stream subject", subject, true)?;
            }
            Command::Nats(NatsCommand::EnsureStream { name: stream.name, subjects: stream.subjects, held: stream.held })
        }
        wit::Command::NatsPublish(publish) => {
            let subject = name_text("subject", publish.subject, names)?;
            check_nats_subject("publish subject", &subject, false)?;
            let headers = nats_headers(publish.headers.into_iter().map(|h| (h.name, h.value)))?;
            Command::Nats(NatsCommand::Publish { subject, headers })
        }
        wit::Command::NatsSchedule(schedule) => {
            check_nats_subject("schedule target", &schedule.target, false)?;
            let headers = nats_headers(schedule.headers.into_iter().map(|h| (h.name, h.value)))?;
            if let Some(name) = headers.keys().find(|name| name.to_ascii_lowercase().starts_with("nats-schedule")) {
                return Err(InvalidCommand::NatsScheduleHeader(name.clone()));
            }
            Command::Nats(NatsCommand::Schedule { target: schedule.target, after_ms: schedule.after_ms, headers })
        }
    };
    Ok(command)
}

/// A publish's exchange or key as a string, checked: a registered one is
/// copied from the planner's list (its only cost per call), a text one moved.
fn resolve(what: &'static str, name: wit::Name, names: &[String]) -> Result<String, InvalidCommand> {
    let name = name_text(what, name, names)?;
    check_name(what, &name, true)?;
    Ok(name)
}

fn name_text(what: &'static str, name: wit::Name, names: &[String]) -> Result<String, InvalidCommand> {
    match name {
        wit::Name::Registered(index) => names.get(index as usize).cloned().ok_or(InvalidCommand::UnregisteredName { what, index, registered: names.len() }),
        wit::Name::Text(text) => Ok(text),
    }
}

fn field_table(fields: Vec<wit::Field>) -> Result<FieldTable, InvalidCommand> {
    let mut table = FieldTable::new();
    for field in fields {
        check_name("header or argument key", &field.key, false)?;
        let value = match field.value {
            wit::Value::Text(s) => FieldValue::Text(s),
            wit::Value::Int(i) => FieldValue::Int(i),
            wit::Value::Boolean(b) => FieldValue::Bool(b),
        };
        if table.insert(field.key.clone(), value).is_some() {
            return Err(InvalidCommand::KeyTwice(field.key));
        }
    }
    Ok(table)
}

fn sqs_attributes(attributes: Vec<wit::SqsAttribute>) -> Result<BTreeMap<String, String>, InvalidCommand> {
    let mut map = BTreeMap::new();
    for attribute in attributes {
        if attribute.name.is_empty() || attribute.name.len() > 256 {
            return Err(InvalidCommand::SqsAttributeNameLength(attribute.name));
        }
        if map.insert(attribute.name.clone(), attribute.value).is_some() {
            return Err(InvalidCommand::SqsAttributeTwice(attribute.name));
        }
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command of a planner that registered no names.
    fn without_names(command: wit::Command) -> Result<Command, InvalidCommand> {
        command_from_planner(command, &[])
    }

    fn send(queue: &str, delay_seconds: u32, group: Option<&str>) -> wit::Command {
        wit::Command::SqsSend(wit::SqsSend { queue: queue.into(), delay_seconds, attributes: vec![], group_id: group.map(Into::into), dedup_id: None })
    }

    #[test]
    fn sqs_limits_are_enforced() {
        assert!(without_names(send("q", 900, None)).is_ok());
        assert!(without_names(send("q", 901, None)).unwrap_err().to_string().contains("above SQS's 900"));
        assert!(without_names(send("q.fifo", 0, None)).unwrap_err().to_string().contains("group id"));
        assert!(without_names(send(&"q".repeat(81), 0, None)).unwrap_err().to_string().contains("1 to 80"));
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
        assert!(without_names(queue("q", 5)).is_ok());
        assert!(without_names(queue("q", -1)).unwrap_err().to_string().contains("x-message-ttl = -1"));
        assert!(without_names(queue(&"q".repeat(256), 5)).unwrap_err().to_string().contains("AMQP allows 255"));
    }

    #[test]
    fn registered_names_resolve_and_an_index_past_them_is_named() {
        let names = vec!["levels".to_string(), "bit:0".to_string()];
        let publish = |exchange: wit::Name, bcc: Vec<wit::Name>| {
            wit::Command::Publish(wit::Publish { exchange, routing_key: wit::Name::Registered(1), bcc, headers: vec![], expiration_ms: None, mandatory: true })
        };
        let command = command_from_planner(publish(wit::Name::Registered(0), vec![wit::Name::Text("to:orders".into())]), &names).unwrap();
        let Command::Amqp(AmqpCommand::Publish { exchange, routing_key, bcc, .. }) = command else { panic!("a publish") };
        assert_eq!((exchange.as_str(), routing_key.as_str(), bcc), ("levels", "bit:0", vec!["to:orders".to_string()]));
        let err = command_from_planner(publish(wit::Name::Text(String::new()), vec![wit::Name::Registered(2)]), &names).unwrap_err();
        assert_eq!(err.to_string(), "bcc routing key names registered name 2, but the planner registered 2 (indices from 0)");
        assert!(command_from_planner(publish(wit::Name::Text("x".repeat(256)), vec![]), &names).unwrap_err().to_string().contains("AMQP allows 255"));
    }
}
