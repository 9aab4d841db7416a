//! `verify`: does the broker hold the topology a strategy declares?
//!
//! With RabbitMQ's management HTTP API (the only place bindings can be read),
//! every queue, exchange and binding is compared, arguments included. Without
//! it, passive declares find missing queues and exchanges, and the report says
//! that bindings and arguments went unchecked.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use lapin::options::{ExchangeDeclareOptions, QueueDeclareOptions};
use lapin::types::FieldTable as AmqpTable;
use lapin::uri::AMQPUri;
use lapin::{Connection, ConnectionProperties, ExchangeKind as AmqpExchangeKind};
use serde::Serialize;
use serde_json::Value;
use thiserror::Error;

use crate::command::{Command, FieldTable, FieldValue};
use crate::rabbitmq::redact;

#[derive(Debug, Error)]
pub enum VerifyError {
    #[error("cannot verify: {0}")]
    Unavailable(String),
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

/// The management API's base URL (`http://user:pass@host:15672`) derived from an AMQP URL.
pub fn default_management_url(amqp_url: &str) -> Option<String> {
    let uri: AMQPUri = amqp_url.parse().ok()?;
    let user = &uri.authority.userinfo;
    Some(format!("http://{}:{}@{}:15672", user.username, user.password, uri.authority.host))
}

fn vhost_of(amqp_url: &str) -> String {
    amqp_url.parse::<AMQPUri>().map(|u| u.vhost).unwrap_or_else(|_| "/".into())
}

fn encode(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
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

struct Management {
    agent: ureq::Agent,
    base: String,
    authorization: String,
    vhost: String,
}

impl Management {
    fn new(management_url: &str, vhost: String) -> Result<Self, String> {
        let (scheme, rest) = management_url.split_once("://").ok_or("management URL needs http:// or https://")?;
        let (credentials, host) = rest.rsplit_once('@').unwrap_or(("guest:guest", rest));
        let authorization = format!("Basic {}", BASE64.encode(credentials.as_bytes()));
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(std::time::Duration::from_secs(10)))
            .http_status_as_error(false)
            .build()
            .into();
        Ok(Management { agent, base: format!("{scheme}://{}", host.trim_end_matches('/')), authorization, vhost })
    }

    /// `Ok(None)` for 404.
    fn get(&self, path: &str) -> Result<Option<Value>, String> {
        let url = format!("{}/api/{path}", self.base);
        let mut response = self
            .agent
            .get(&url)
            .header("Authorization", &self.authorization)
            .call()
            .map_err(|e| format!("{url}: {e}"))?;
        match response.status().as_u16() {
            404 => Ok(None),
            200 => response.body_mut().read_json::<Value>().map(Some).map_err(|e| format!("{url}: {e}")),
            code => Err(format!("{url}: HTTP {code}")),
        }
    }

    fn object(&self, kind: &str, name: &str) -> Result<Option<Value>, String> {
        self.get(&format!("{kind}/{}/{}", encode(&self.vhost), encode(name)))
    }

    fn bindings(&self, source: &str, target_kind: char, target: &str) -> Result<Vec<Value>, String> {
        let path = format!("bindings/{}/e/{}/{target_kind}/{}", encode(&self.vhost), encode(source), encode(target));
        Ok(self.get(&path)?.and_then(|v| v.as_array().cloned()).unwrap_or_default())
    }
}

fn verify_with_management(api: &Management, commands: &[Command]) -> Result<Vec<Drift>, String> {
    let mut drifts = Vec::new();
    let mut drift = |object: String, problem: String| drifts.push(Drift { object, problem });
    for command in commands {
        match command {
            Command::DeclareQueue { name, durable, arguments } => match api.object("queues", name)? {
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
            Command::DeclareExchange { name, kind, arguments, .. } => match api.object("exchanges", name)? {
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
            Command::BindQueue { queue, exchange, routing_key, arguments } => {
                check_binding(api.bindings(exchange, 'q', queue)?, routing_key, arguments, || {
                    format!("binding exchange {exchange} -> queue {queue} key {routing_key:?}")
                }, &mut drift);
            }
            Command::BindExchange { source, destination, routing_key, arguments } => {
                check_binding(api.bindings(source, 'e', destination)?, routing_key, arguments, || {
                    format!("binding exchange {source} -> exchange {destination} key {routing_key:?}")
                }, &mut drift);
            }
            _ => {}
        }
    }
    Ok(drifts)
}

fn check_binding(found: Vec<Value>, routing_key: &str, arguments: &FieldTable, name: impl Fn() -> String, drift: &mut impl FnMut(String, String)) {
    let present = found
        .iter()
        .any(|b| b["routing_key"].as_str() == Some(routing_key) && compare_arguments(arguments, &b["arguments"]).is_empty());
    if !present {
        drift(name(), "missing".into());
    }
}

async fn verify_with_passive_declares(amqp_url: &str, commands: &[Command]) -> Result<(Vec<Drift>, usize), VerifyError> {
    let unavailable = |e: lapin::Error| VerifyError::Unavailable(format!("RabbitMQ at {}: {e}", redact(amqp_url)));
    let connection = Connection::connect(amqp_url, ConnectionProperties::default()).await.map_err(unavailable)?;
    let mut channel = connection.create_channel().await.map_err(unavailable)?;
    let mut drifts = Vec::new();
    let mut unchecked = 0;
    for command in commands {
        let (object, result) = match command {
            Command::DeclareQueue { name, .. } => {
                let passive = QueueDeclareOptions { passive: true, ..Default::default() };
                (format!("queue {name}"), channel.queue_declare(name.as_str().into(), passive, AmqpTable::default()).await.map(|_| ()))
            }
            Command::DeclareExchange { name, .. } => {
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
            channel = connection.create_channel().await.map_err(unavailable)?;
        }
    }
    connection.close(200, "verified".into()).await.ok();
    Ok((drifts, unchecked))
}

/// Compares the broker with `commands`, by the management API if it answers,
/// else by passive declares.
pub async fn verify(amqp_url: &str, management_url: Option<&str>, commands: &[Command]) -> Result<Report, VerifyError> {
    let checked = commands.iter().filter(|c| !matches!(c, Command::Publish { .. })).count();
    let management_url = management_url.map(str::to_string).or_else(|| default_management_url(amqp_url));
    let mut fallback_reason = "no management URL".to_string();
    if let Some(url) = management_url {
        let api = Management::new(&url, vhost_of(amqp_url)).map_err(VerifyError::Unavailable)?;
        let commands = commands.to_vec();
        let outcome = tokio::task::spawn_blocking(move || {
            // Reachability first, so a closed port means "fall back", not "drift".
            api.get("overview").and_then(|_| verify_with_management(&api, &commands))
        })
        .await
        .map_err(|e| VerifyError::Unavailable(e.to_string()))?;
        match outcome {
            Ok(drifts) => {
                return Ok(Report { method: format!("management API at {}", redact(&url)), checked, unchecked: 0, drifts });
            }
            Err(reason) => fallback_reason = redact(&reason),
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
    fn the_management_url_follows_the_amqp_url() {
        assert_eq!(
            default_management_url("amqp://guest:guest@127.0.0.1:5672/%2f").as_deref(),
            Some("http://guest:guest@127.0.0.1:15672")
        );
        assert_eq!(vhost_of("amqp://guest:guest@127.0.0.1:5672/%2f"), "/");
        assert_eq!(encode("/"), "%2F");
    }

    #[test]
    fn arguments_compare_by_value_and_report_extras() {
        let wanted: FieldTable = [("x-message-ttl".to_string(), FieldValue::Int(1000))].into();
        assert!(compare_arguments(&wanted, &serde_json::json!({"x-message-ttl": 1000})).is_empty());
        let problems = compare_arguments(&wanted, &serde_json::json!({"x-message-ttl": 5, "x-expires": 9}));
        assert_eq!(problems, vec!["x-message-ttl: wanted 1000, broker has 5", "x-expires: broker has 9, not declared by the strategy"]);
    }
}
