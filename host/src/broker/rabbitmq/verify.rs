//! `verify`: does the broker hold the topology a strategy declares?
//!
//! With RabbitMQ's management HTTP API (the only place bindings can be read),
//! every queue, exchange and binding is compared, arguments included. Without
//! it, passive declares find missing queues and exchanges, and the report says
//! that bindings and arguments went unchecked.

use std::collections::BTreeMap;

use lapin::options::{ExchangeDeclareOptions, QueueDeclareOptions};
use lapin::types::FieldTable as AmqpTable;
use lapin::{ConnectionProperties, ExchangeKind as AmqpExchangeKind};
use serde::Serialize;
use serde_json::Value;
use thiserror::Error;

use crate::broker::rabbitmq::link::{create_channel, parting};
use crate::broker::rabbitmq::manage::{Management, ManagementError, vhost_of};
use crate::broker::rabbitmq::nodes::ConnectError;
use crate::broker::rabbitmq::redact;
use crate::command::{AmqpCommand, Command, FieldTable, FieldValue};

#[derive(Debug, Error)]
pub enum VerifyError {
    /// No node of the AMQP URL gave a connection (`url` redacted).
    #[error("cannot verify: RabbitMQ at {url}: {source}")]
    Connect { url: String, source: ConnectError },
    /// The broker refused a channel (`url` redacted).
    #[error("cannot verify: RabbitMQ at {url}: {source}")]
    Channel { url: String, source: lapin::Error },
    #[error("cannot verify: {0}")]
    Management(#[source] ManagementError),
    /// The blocking task that read the management API panicked or was cancelled.
    #[error("cannot verify: {0}")]
    Lost(#[source] tokio::task::JoinError),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Drift {
    pub object: String,
    pub problem: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// How the broker was read.
    pub method: String,
    pub checked: usize,
    /// Commands that could not be checked by this method.
    pub unchecked: usize,
    pub drifts: Vec<Drift>,
}

/// Whether a broker-side JSON argument equals what hourglass declares.
fn same_value(wanted: &FieldValue, actual: &Value) -> bool {
    match (wanted, actual) {
        (FieldValue::Text(w), Value::String(a)) => w == a,
        (FieldValue::Int(w), Value::Number(a)) => a.as_i64() == Some(*w),
        (FieldValue::Bool(w), Value::Bool(a)) => w == a,
        _ => false,
    }
}

fn compare_arguments(wanted: &FieldTable, actual: &Value) -> Vec<String> {
    let empty = serde_json::Map::new();
    let actual = actual.as_object().unwrap_or(&empty);
    let mut problems = Vec::new();
    for (key, value) in wanted {
        match actual.get(key) {
            Some(found) if same_value(value, found) => {}
            Some(found) => problems.push(format!("{key}: wanted {value}, broker has {found}")),
            None => problems.push(format!("{key}: wanted {value}, broker has none")),
        }
    }
    for key in actual.keys().filter(|k| !wanted.contains_key(*k)) {
        problems.push(format!("{key}: broker has {}, not declared by the strategy", actual[key]));
    }
    problems
}

fn verify_with_management(api: &Management, commands: &[Command]) -> Result<Vec<Drift>, ManagementError> {
    let mut drifts = Vec::new();
    let mut drift = |object: String, problem: String| drifts.push(Drift { object, problem });
    for command in commands {
        match command {
            Command::Amqp(AmqpCommand::DeclareQueue { name, durable, arguments }) => match api.object("queues", name)? {
                None => drift(format!("queue {name}"), "missing".into()),
                Some(found) => {
                    if found["durable"].as_bool() != Some(*durable) {
                        drift(format!("queue {name}"), format!("durable: wanted {durable}, broker has {}", found["durable"]));
                    }
                    for problem in compare_arguments(arguments, &found["arguments"]) {
                        drift(format!("queue {name}"), problem);
                    }
                }
            },
            Command::Amqp(AmqpCommand::DeclareExchange { name, kind, arguments, .. }) => match api.object("exchanges", name)? {
                None => drift(format!("exchange {name}"), "missing".into()),
                Some(found) => {
                    if found["type"].as_str() != Some(kind.as_str()) {
                        drift(format!("exchange {name}"), format!("type: wanted {}, broker has {}", kind.as_str(), found["type"]));
                    }
                    for problem in compare_arguments(arguments, &found["arguments"]) {
                        drift(format!("exchange {name}"), problem);
                    }
                }
            },
            Command::Amqp(AmqpCommand::BindQueue { queue, exchange, routing_key, arguments }) => {
                check_binding(
                    api.bindings(exchange, 'q', queue)?,
                    routing_key,
                    arguments,
                    || format!("binding exchange {exchange} -> queue {queue} key {routing_key:?}"),
                    &mut drift,
                );
            }
            Command::Amqp(AmqpCommand::BindExchange { source, destination, routing_key, arguments }) => {
                check_binding(
                    api.bindings(source, 'e', destination)?,
                    routing_key,
                    arguments,
                    || format!("binding exchange {source} -> exchange {destination} key {routing_key:?}"),
                    &mut drift,
                );
            }
            _ => {}
        }
    }
    Ok(drifts)
}

fn check_binding(found: Vec<Value>, routing_key: &str, arguments: &FieldTable, name: impl Fn() -> String, drift: &mut impl FnMut(String, String)) {
    let present = found.iter().any(|b| b["routing_key"].as_str() == Some(routing_key) && compare_arguments(arguments, &b["arguments"]).is_empty());
    if !present {
        drift(name(), "missing".into());
    }
}

async fn verify_with_passive_declares(amqp_url: &str, commands: &[Command]) -> Result<(Vec<Drift>, usize), VerifyError> {
    let unavailable = |source: lapin::Error| VerifyError::Channel { url: redact(amqp_url), source };
    let (connection, _) = crate::broker::rabbitmq::nodes::connect(amqp_url, ConnectionProperties::default(), crate::broker::rabbitmq::link::CONNECT_TIMEOUT)
        .await
        .map_err(|source| VerifyError::Connect { url: redact(amqp_url), source })?;
    let mut channel = create_channel(&connection).await.map_err(unavailable)?;
    let mut drifts = Vec::new();
    let mut unchecked = 0;
    for command in commands {
        let (object, result) = match command {
            Command::Amqp(AmqpCommand::DeclareQueue { name, .. }) => {
                let passive = QueueDeclareOptions { passive: true, ..Default::default() };
                (format!("queue {name}"), channel.queue_declare(name.as_str().into(), passive, AmqpTable::default()).await.map(|_| ()))
            }
            Command::Amqp(AmqpCommand::DeclareExchange { name, .. }) => {
                let passive = ExchangeDeclareOptions { passive: true, ..Default::default() };
                let result = channel.exchange_declare(name.as_str().into(), AmqpExchangeKind::Topic, passive, AmqpTable::default()).await;
                (format!("exchange {name}"), result)
            }
            _ => {
                unchecked += 1;
                continue;
            }
        };
        if let Err(err) = result {
            drifts.push(Drift { object, problem: format!("missing ({err})") });
            // The broker closed the channel with the error.
            channel = create_channel(&connection).await.map_err(unavailable)?;
        }
    }
    parting(&connection, connection.close(200, "verified".into())).await;
    Ok((drifts, unchecked))
}

/// Compares the broker with `commands`, by the management API if it answers,
/// else by passive declares. `management_url` is the configured one;
/// `$HOURGLASS_MANAGEMENT_URL` overrides it (see [`crate::broker::rabbitmq::manage::management_url`]).
pub async fn verify(amqp_url: &str, management_url: Option<&str>, commands: &[Command]) -> Result<Report, VerifyError> {
    let checked = commands.iter().filter(|c| !matches!(c, Command::Amqp(AmqpCommand::Publish { .. }))).count();
    let management_url = crate::broker::rabbitmq::manage::management_url(amqp_url, management_url);
    let mut fallback_reason = "no management URL".to_string();
    if let Some(url) = management_url {
        let api = Management::new(&url, vhost_of(amqp_url)).map_err(VerifyError::Management)?;
        let commands = commands.to_vec();
        let outcome = tokio::task::spawn_blocking(move || {
            // Reachability first, so a closed port means "fall back", not "drift".
            api.get("overview").and_then(|_| verify_with_management(&api, &commands))
        })
        .await
        .map_err(VerifyError::Lost)?;
        match outcome {
            Ok(drifts) => {
                return Ok(Report { method: format!("management API at {}", redact(&url)), checked, unchecked: 0, drifts });
            }
            Err(reason) => fallback_reason = redact(&reason.to_string()),
        }
    }
    let (drifts, unchecked) = verify_with_passive_declares(amqp_url, commands).await?;
    let method = format!("passive declares (management API unavailable: {fallback_reason}); bindings and arguments not checked");
    Ok(Report { method, checked: checked - unchecked, unchecked, drifts })
}

/// For display: drifts grouped by object.
pub fn grouped(report: &Report) -> BTreeMap<String, Vec<String>> {
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for drift in &report.drifts {
        groups.entry(drift.object.clone()).or_default().push(drift.problem.clone());
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_compare_by_value_and_report_extras() {
        let wanted: FieldTable = [("x-message-ttl".to_string(), FieldValue::Int(1000))].into();
        assert!(compare_arguments(&wanted, &serde_json::json!({"x-message-ttl": 1000})).is_empty());
        let problems = compare_arguments(&wanted, &serde_json::json!({"x-message-ttl": 5, "x-expires": 9}));
        assert_eq!(problems, vec!["x-message-ttl: wanted 1000, broker has 5", "x-expires: broker has 9, not declared by the strategy"]);
    }
}
