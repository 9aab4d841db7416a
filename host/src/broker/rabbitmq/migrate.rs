//! Moving off RabbitMQ's delayed-message plugin (`hourglass migrate
//! delayed-exchange`): read the plugin's `x-delayed-message` exchange through
//! the management API, plan its `[exchanges."NAME"]` entry and the exchange
//! due messages are delivered through (`deliver_to`, bound like the plugin's
//! exchange is now), and apply that plan. The plugin's exchange is only ever
//! read: deleting it is the user's step, once their producers changed.

use std::collections::BTreeSet;

use serde::Serialize;
use serde_json::{Map, Value};
use thiserror::Error;

use crate::broker::rabbitmq::manage::{Management, ManagementError, encode};
use crate::command::{AMQP_MAX_NAME, AmqpCommand, Command, ExchangeKind, FieldTable, FieldValue};
use crate::executor::{Executor, ExecutorError};

/// The exchange type the plugin registers.
pub(crate) const PLUGIN_TYPE: &str = "x-delayed-message";
/// `deliver_to` when none is given: `<NAME>.due`, a new exchange that only
/// due messages reach, so no other publisher's traffic mixes in.
pub(crate) const DEFAULT_DELIVER_TO_SUFFIX: &str = ".due";

#[derive(Debug, Error)]
pub enum MigrateError {
    /// No endpoint could describe the exchange: each one's failure.
    #[error("cannot read the exchange: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Unavailable(Vec<ManagementError>),
    #[error("cannot read the exchange: {0}")]
    Management(#[from] ManagementError),
    #[error("exchange {name:?} does not exist in vhost {vhost:?}")]
    Missing { name: String, vhost: String },
    #[error("exchange {name:?} is of type {kind}, not {PLUGIN_TYPE}: it is not the plugin's, so there is nothing to migrate")]
    NotPlugin { name: String, kind: String },
    #[error("exchange {name:?} routes with x-delayed-type {found}; hourglass delivers through a direct, topic, fanout or headers exchange")]
    UnsupportedType { name: String, found: String },
    #[error("deliver_to {name:?}: {why}")]
    BadDeliverTo { name: String, why: String },
    #[error("refusing to apply: {0}")]
    Refused(String),
    #[error("declaring {name:?}: {source}")]
    Declare { name: String, source: ExecutorError },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DestinationType {
    Queue,
    Exchange,
}

impl DestinationType {
    pub fn as_str(self) -> &'static str {
        match self {
            DestinationType::Queue => "queue",
            DestinationType::Exchange => "exchange",
        }
    }
}

/// One binding from the plugin's exchange, as the management API lists it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Binding {
    pub destination: String,
    pub destination_type: DestinationType,
    pub routing_key: String,
    pub arguments: Map<String, Value>,
}

/// An exchange bound *into* the plugin's exchange: deleting the plugin's
/// exchange removes this binding, so it is made again once hourglass has
/// declared the name.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Incoming {
    pub source: String,
    pub routing_key: String,
    pub arguments: Map<String, Value>,
    /// The management API call that makes it again.
    pub command: String,
}

/// What one node's management API reported of the plugin's messages.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NodeCount {
    /// The node's name, or the management URL when it could not be told.
    pub node: String,
    pub messages_delayed: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<String>,
}

/// The plugin keeps each delayed message on the node that took its publish,
/// and each node reports only its own, in the exchange object's
/// `messages_delayed` field: so the count is asked of every node.
///
/// Where the field comes from: the plugin's exchange type answers `info/1`
/// with `[{messages_delayed, N}]`, N from its node-local store
/// (rabbitmq-delayed-message-exchange, `rabbit_exchange_type_delayed_message`
/// and `rabbit_delayed_message:messages_delayed/1`, a call to the node's own
/// process); `rabbit_exchange:info/1` appends a type's `info/1` to the
/// exchange's items, and the management API's exchange object
/// (`rabbit_mgmt_wm_exchange`) is `rabbit_exchange:info/1` of the node that
/// answered the request. The management UI shows it as "messages delayed".
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DelayedCount {
    pub nodes: Vec<NodeCount>,
    /// Cluster nodes no given management URL answered for: not counted.
    pub uncounted: Vec<String>,
    /// Why the cluster's nodes could not be listed (then none is known to be complete).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodes_unlisted: Option<String>,
}

impl DelayedCount {
    /// Why the plugin's exchange cannot be said to hold nothing; `None` when every node of the cluster reported 0.
    pub(crate) fn not_empty(&self) -> Option<String> {
        let held: Vec<String> = self.nodes.iter().filter_map(|n| n.messages_delayed.filter(|c| *c > 0).map(|c| format!("{c} on {}", n.node))).collect();
        if !held.is_empty() {
            return Some(format!("the plugin still holds delayed messages: {}", held.join(", ")));
        }
        // An error from a node known only by its URL names that URL already.
        let unreadable: Vec<String> = self
            .nodes
            .iter()
            .filter_map(|n| n.unreadable.as_ref().map(|why| if why.starts_with(&n.node) { why.clone() } else { format!("{}: {why}", n.node) }))
            .collect();
        if !unreadable.is_empty() {
            return Some(format!("the plugin's count of delayed messages could not be read ({})", unreadable.join("; ")));
        }
        if let Some(why) = &self.nodes_unlisted {
            return Some(format!("the cluster's nodes could not be listed ({why}), so a node holding delayed messages may not have been asked"));
        }
        if !self.uncounted.is_empty() {
            return Some(format!(
                "node(s) {} were not asked: each node reports only the delayed messages it holds; give every node's management URL, comma-separated, with --management-url",
                self.uncounted.join(", ")
            ));
        }
        None
    }

    /// One line: `0 on rabbit@a, 0 on rabbit@b`.
    pub fn summary(&self) -> String {
        let mut parts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| match n.messages_delayed {
                Some(count) => format!("{count} on {}", n.node),
                None => format!("unknown on {}", n.node),
            })
            .collect();
        parts.extend(self.uncounted.iter().map(|node| format!("not asked on {node}")));
        parts.join(", ")
    }
}

/// The plugin's exchange as the management API describes it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PluginExchange {
    pub name: String,
    pub vhost: String,
    /// Its `x-delayed-type`: how it routes a message once due.
    pub delayed_type: ExchangeKind,
    /// Arguments besides `x-delayed-type` (`alternate-exchange`, say): not carried to `deliver_to`.
    pub other_arguments: Map<String, Value>,
    pub bindings: Vec<Binding>,
    pub incoming: Vec<Incoming>,
    pub messages_delayed: DelayedCount,
}

/// `deliver_to` as the broker has it before the migration, when it exists.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Existing {
    pub kind: String,
    pub durable: bool,
    pub bindings: Vec<Binding>,
}

/// A binding `--apply` leaves to the user, and why.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ByHand {
    pub binding: Binding,
    pub why: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    pub exchange: PluginExchange,
    pub deliver_to: String,
    /// `deliver_to` now, when it exists already.
    pub deliver_to_exists: Option<Existing>,
    /// The `[exchanges."NAME"]` entry for the config.
    pub toml: String,
    /// What `--apply` runs: declare `deliver_to`, then each binding.
    pub commands: Vec<Command>,
    pub by_hand: Vec<ByHand>,
    /// The management API call that deletes the plugin's exchange (the user's step).
    pub delete_command: String,
    /// Things the user should know (arguments not carried over, say).
    pub notes: Vec<String>,
    /// Why `--apply` refuses now; `None` when it would run.
    pub blocked: Option<String>,
}

/// Reads the plugin's exchange `name` (in `api`'s vhost) and plans its move
/// to hourglass, delivering through `deliver_to` (default `<name>.due`).
pub fn plan(api: &Management, name: &str, deliver_to: Option<&str>) -> Result<Plan, MigrateError> {
    let exchange = read(api, name)?;
    let deliver_to = match deliver_to {
        Some(given) => given.to_string(),
        None => format!("{name}{DEFAULT_DELIVER_TO_SUFFIX}"),
    };
    check_deliver_to(name, &deliver_to)?;
    let vhost = encode(api.vhost());
    let existing = match api.get(&format!("exchanges/{vhost}/{}", encode(&deliver_to))).map_err(MigrateError::Management)? {
        None => None,
        Some(found) => {
            let bindings = api.get(&format!("exchanges/{vhost}/{}/bindings/source", encode(&deliver_to)))?;
            Some(Existing {
                kind: found["type"].as_str().unwrap_or("?").to_string(),
                durable: found["durable"].as_bool().unwrap_or(false),
                bindings: bindings.as_ref().and_then(Value::as_array).into_iter().flatten().filter_map(parse_binding).collect(),
            })
        }
    };
    let (base, user) = api.endpoints().into_iter().next().unwrap_or_default();
    Ok(build(exchange, deliver_to, existing, &base, &user))
}

/// The plugin's exchange, its bindings either way, and each node's count of its delayed messages.
pub fn read(api: &Management, name: &str) -> Result<PluginExchange, MigrateError> {
    let vhost = encode(api.vhost());
    let path = format!("exchanges/{vhost}/{}", encode(name));
    let answers = api.get_each(&path);
    let described = match answers.iter().find_map(|(_, answer)| answer.as_ref().ok()) {
        Some(Some(found)) => found.clone(),
        Some(None) => return Err(MigrateError::Missing { name: name.to_string(), vhost: api.vhost().to_string() }),
        None => {
            return Err(MigrateError::Unavailable(answers.into_iter().filter_map(|(_, answer)| answer.err()).collect()));
        }
    };
    let (delayed_type, other_arguments) = parse_exchange(name, &described)?;
    let listed = |side: &str| -> Result<Vec<Value>, MigrateError> {
        let found = api.get(&format!("{path}/bindings/{side}"))?;
        Ok(found.and_then(|v| v.as_array().cloned()).unwrap_or_default())
    };
    let bindings = listed("source")?.iter().filter_map(parse_binding).collect();
    let (base, user) = api.endpoints().into_iter().next().unwrap_or_default();
    let incoming = listed("destination")?.iter().filter_map(|b| parse_incoming(b, name, api.vhost(), &base, &user)).collect();
    // Which node each endpoint is, so two URLs of one node count once and a node no URL reaches shows.
    let nodes = api.get_each("overview?columns=node");
    let cluster = api.get("nodes?columns=name").map_err(NodesUnlisted::Refused).and_then(|listed| {
        let names: Option<Vec<String>> =
            listed.as_ref().and_then(Value::as_array).map(|all| all.iter().filter_map(|n| n["name"].as_str().map(str::to_string)).collect());
        names.ok_or(NodesUnlisted::NoList)
    });
    let answered = answers
        .into_iter()
        .zip(nodes)
        .map(|((url, exchange), (_, node))| (node.ok().flatten().and_then(|n| n["node"].as_str().map(str::to_string)).unwrap_or(url), exchange))
        .collect();
    Ok(PluginExchange {
        name: name.to_string(),
        vhost: api.vhost().to_string(),
        delayed_type,
        other_arguments,
        bindings,
        incoming,
        messages_delayed: count_delayed(answered, cluster),
    })
}

/// The exchange's `x-delayed-type` and its other arguments; refuses an exchange that is not the plugin's.
fn parse_exchange(name: &str, found: &Value) -> Result<(ExchangeKind, Map<String, Value>), MigrateError> {
    let kind = found["type"].as_str().unwrap_or("?");
    if kind != PLUGIN_TYPE {
        return Err(MigrateError::NotPlugin { name: name.to_string(), kind: kind.to_string() });
    }
    let mut arguments = found["arguments"].as_object().cloned().unwrap_or_default();
    let delayed = arguments.remove("x-delayed-type");
    let delayed_type = match delayed.as_ref().and_then(Value::as_str) {
        Some("direct") => ExchangeKind::Direct,
        Some("topic") => ExchangeKind::Topic,
        Some("fanout") => ExchangeKind::Fanout,
        Some("headers") => ExchangeKind::Headers,
        _ => {
            let found = delayed.map_or_else(|| "(none)".to_string(), |v| v.to_string());
            return Err(MigrateError::UnsupportedType { name: name.to_string(), found });
        }
    };
    Ok((delayed_type, arguments))
}

fn parse_binding(found: &Value) -> Option<Binding> {
    let destination_type = match found["destination_type"].as_str()? {
        "queue" => DestinationType::Queue,
        "exchange" => DestinationType::Exchange,
        _ => return None,
    };
    Some(Binding {
        destination: found["destination"].as_str()?.to_string(),
        destination_type,
        routing_key: found["routing_key"].as_str().unwrap_or_default().to_string(),
        arguments: found["arguments"].as_object().cloned().unwrap_or_default(),
    })
}

fn parse_incoming(found: &Value, name: &str, vhost: &str, base: &str, user: &str) -> Option<Incoming> {
    let source = found["source"].as_str()?.to_string();
    // The default exchange's implicit bindings are not the user's and cannot be made.
    if source.is_empty() {
        return None;
    }
    let routing_key = found["routing_key"].as_str().unwrap_or_default().to_string();
    let arguments = found["arguments"].as_object().cloned().unwrap_or_default();
    let body = serde_json::json!({ "routing_key": routing_key, "arguments": arguments });
    let command = format!(
        "curl -u {} -X POST -H 'content-type: application/json' -d {} {base}/api/bindings/{}/e/{}/e/{}",
        shell_quote(user),
        shell_quote(&body.to_string()),
        encode(vhost),
        encode(&source),
        encode(name)
    );
    Some(Incoming { source, routing_key, arguments, command })
}

/// Why the cluster's nodes could not be listed.
#[derive(Debug, Error)]
enum NodesUnlisted {
    #[error("{0} ({NODES_NEED_A_TAG})")]
    Refused(#[source] ManagementError),
    #[error("GET /api/nodes gave no list ({NODES_NEED_A_TAG})")]
    NoList,
}

const NODES_NEED_A_TAG: &str = "listing nodes needs the monitoring or administrator tag";

/// Each endpoint's answer, by node, against the cluster's node names. The
/// report keeps each failure as text beside the node it is about.
fn count_delayed(answered: Vec<(String, Result<Option<Value>, ManagementError>)>, cluster: Result<Vec<String>, NodesUnlisted>) -> DelayedCount {
    let mut count = DelayedCount::default();
    for (node, answer) in answered {
        let (messages_delayed, unreadable) = match answer {
            Ok(Some(exchange)) => match exchange.get("messages_delayed") {
                Some(value) => match value.as_u64() {
                    Some(n) => (Some(n), None),
                    None => (None, Some(format!("messages_delayed is {value}, not a count"))),
                },
                // Missing with a plugin that does not report a count (see DelayedCount), or not enabled on that node.
                None => (None, Some("the exchange has no messages_delayed field: is the plugin enabled on this node, and recent enough to count?".into())),
            },
            Ok(None) => (None, Some("the exchange was not found from this node".into())),
            Err(why) => (None, Some(why.to_string())),
        };
        // Two URLs of one node: its count once, a number preferred.
        match count.nodes.iter_mut().find(|n| n.node == node) {
            Some(seen) if seen.messages_delayed.is_none() && messages_delayed.is_some() => {
                seen.messages_delayed = messages_delayed;
                seen.unreadable = None;
            }
            Some(_) => {}
            None => count.nodes.push(NodeCount { node, messages_delayed, unreadable }),
        }
    }
    match cluster {
        Ok(names) => {
            let asked: BTreeSet<&str> = count.nodes.iter().map(|n| n.node.as_str()).collect();
            count.uncounted = names.iter().filter(|name| !asked.contains(name.as_str())).cloned().collect();
        }
        Err(why) => count.nodes_unlisted = Some(why.to_string()),
    }
    count
}

fn check_deliver_to(name: &str, deliver_to: &str) -> Result<(), MigrateError> {
    let refuse = |why: &str| Err(MigrateError::BadDeliverTo { name: deliver_to.to_string(), why: why.to_string() });
    if deliver_to.is_empty() || deliver_to == name {
        return refuse("must name another exchange, the one consumers bind their queues to");
    }
    if deliver_to.starts_with("amq.") {
        return refuse("names starting with \"amq.\" are reserved by RabbitMQ");
    }
    if deliver_to.len() > AMQP_MAX_NAME {
        return refuse(&format!("longer than {AMQP_MAX_NAME} bytes; name a shorter one with --deliver-to"));
    }
    Ok(())
}

/// A JSON argument as hourglass can declare it over AMQP: text, whole numbers and booleans.
fn field_value(value: &Value) -> Option<FieldValue> {
    match value {
        Value::String(text) => Some(FieldValue::Text(text.clone())),
        Value::Bool(b) => Some(FieldValue::Bool(*b)),
        Value::Number(n) => n.as_i64().map(FieldValue::Int),
        _ => None,
    }
}

/// A binding argument hourglass cannot declare over AMQP (an array, say).
#[derive(Debug, Error)]
#[error("argument {key} = {value} is neither text, a whole number nor a boolean")]
struct UndeclarableArgument {
    key: String,
    value: Value,
}

fn field_table(arguments: &Map<String, Value>) -> Result<FieldTable, UndeclarableArgument> {
    arguments
        .iter()
        .map(|(key, value)| match field_value(value) {
            Some(field) => Ok((key.clone(), field)),
            None => Err(UndeclarableArgument { key: key.clone(), value: value.clone() }),
        })
        .collect()
}

/// The plan for `exchange`, delivering through `deliver_to` (`existing`
/// when it exists already); `base` and `user` go into the printed
/// management API calls.
pub fn build(exchange: PluginExchange, deliver_to: String, existing: Option<Existing>, base: &str, user: &str) -> Plan {
    let kind = exchange.delayed_type;
    let toml = format!("[exchanges.{}]\ntype = \"{}\"\ndeliver_to = {}\n", toml_string(&exchange.name), kind.as_str(), toml_string(&deliver_to));
    let mut commands = vec![Command::Amqp(AmqpCommand::DeclareExchange { name: deliver_to.clone(), kind, durable: true, arguments: FieldTable::new() })];
    let mut by_hand = Vec::new();
    for binding in &exchange.bindings {
        let arguments = match field_table(&binding.arguments) {
            Ok(arguments) => arguments,
            Err(why) => {
                by_hand.push(ByHand { binding: binding.clone(), why: format!("hourglass cannot declare it over AMQP: {why}") });
                continue;
            }
        };
        let routing_key = binding.routing_key.clone();
        commands.push(match binding.destination_type {
            DestinationType::Queue => {
                Command::Amqp(AmqpCommand::BindQueue { queue: binding.destination.clone(), exchange: deliver_to.clone(), routing_key, arguments })
            }
            DestinationType::Exchange => {
                Command::Amqp(AmqpCommand::BindExchange { source: deliver_to.clone(), destination: binding.destination.clone(), routing_key, arguments })
            }
        });
    }
    let mut notes = Vec::new();
    if !exchange.other_arguments.is_empty() {
        let listed: Vec<String> = exchange.other_arguments.iter().map(|(k, v)| format!("{k}={v}")).collect();
        notes.push(format!(
            "{:?} has arguments besides x-delayed-type ({}); they are not carried to {deliver_to:?}: set them there yourself if they still matter",
            exchange.name,
            listed.join(", ")
        ));
    }
    let mut blocked = exchange.messages_delayed.not_empty();
    if let Some(found) = &existing {
        if found.kind != kind.as_str() || !found.durable {
            blocked.get_or_insert_with(|| {
                format!(
                    "{deliver_to:?} exists as a {} exchange (durable: {}), not a durable {} one; delete it or choose another --deliver-to",
                    found.kind,
                    found.durable,
                    kind.as_str()
                )
            });
        } else {
            // A second run finds the bindings the first made: only the others are news.
            let others = found.bindings.iter().filter(|b| !exchange.bindings.contains(b)).count();
            if others > 0 {
                notes.push(format!(
                    "{deliver_to:?} exists already with {others} binding(s) of its own: the queues they reach get {:?}'s due messages too, and whatever else is published to {deliver_to:?} reaches the queues bound here",
                    exchange.name
                ));
            }
        }
    }
    if exchange.bindings.is_empty() {
        notes.push(format!("{:?} has no bindings: its messages reached no queue, and through {deliver_to:?} they will be parked as unroutable", exchange.name));
    }
    let delete_command = format!("curl -u {} -X DELETE {base}/api/exchanges/{}/{}", shell_quote(user), encode(&exchange.vhost), encode(&exchange.name));
    Plan { exchange, deliver_to, deliver_to_exists: existing, toml, commands, by_hand, delete_command, notes, blocked }
}

/// What `--apply` did.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Applied {
    pub done: Vec<String>,
    pub failed: Vec<String>,
}

/// Declares `deliver_to` and binds to it what is bound to the plugin's
/// exchange. Refuses while the plan is blocked (messages still delayed, say).
/// A binding the broker refuses does not stop the others; [`Applied`] names it.
pub async fn apply(executor: &impl Executor, plan: &Plan) -> Result<Applied, MigrateError> {
    if let Some(why) = &plan.blocked {
        return Err(MigrateError::Refused(why.clone()));
    }
    let mut applied = Applied::default();
    for command in &plan.commands {
        let what = describe(command);
        match executor.apply(std::slice::from_ref(command)).await {
            Ok(()) => applied.done.push(what),
            // Without the exchange no binding can be made.
            Err(err) if matches!(command, Command::Amqp(AmqpCommand::DeclareExchange { .. })) => {
                return Err(MigrateError::Declare { name: plan.deliver_to.clone(), source: err });
            }
            Err(err) => applied.failed.push(format!("{what}: {err}")),
        }
    }
    Ok(applied)
}

pub fn describe(command: &Command) -> String {
    let arguments = |table: &FieldTable| {
        if table.is_empty() { String::new() } else { format!(", arguments {}", table.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", ")) }
    };
    match command {
        Command::Amqp(AmqpCommand::DeclareExchange { name, kind, .. }) => format!("declare exchange {name:?} ({}, durable)", kind.as_str()),
        Command::Amqp(AmqpCommand::BindQueue { queue, exchange, routing_key, arguments: table }) => {
            format!("bind queue {queue:?} to {exchange:?} with key {routing_key:?}{}", arguments(table))
        }
        Command::Amqp(AmqpCommand::BindExchange { source, destination, routing_key, arguments: table }) => {
            format!("bind exchange {destination:?} to {source:?} with key {routing_key:?}{}", arguments(table))
        }
        other => format!("{other:?}"),
    }
}

/// `text` as a TOML basic string, which also serves as a key (the `toml`
/// crate may write a multi-line string, which a key cannot be).
fn toml_string(text: &str) -> String {
    let mut out = String::from('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `text` as one POSIX shell word.
fn shell_quote(text: &str) -> String {
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:/%@=,+".contains(&b)) {
        return text.to_string();
    }
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn exchange(bindings: Vec<Binding>, counts: &[(&str, Option<u64>)]) -> PluginExchange {
        PluginExchange {
            name: "orders.delayed".into(),
            vhost: "/".into(),
            delayed_type: ExchangeKind::Topic,
            other_arguments: Map::new(),
            bindings,
            incoming: Vec::new(),
            messages_delayed: DelayedCount {
                nodes: counts.iter().map(|(node, n)| NodeCount { node: node.to_string(), messages_delayed: *n, unreadable: None }).collect(),
                ..Default::default()
            },
        }
    }

    fn binding(destination: &str, destination_type: DestinationType, key: &str, arguments: Value) -> Binding {
        Binding { destination: destination.into(), destination_type, routing_key: key.into(), arguments: arguments.as_object().unwrap().clone() }
    }

    #[test]
    fn only_a_plugin_exchange_with_a_known_delayed_type_is_migrated() {
        let found = json!({"type": "x-delayed-message", "arguments": {"x-delayed-type": "headers", "alternate-exchange": "ae"}});
        let (kind, others) = parse_exchange("d", &found).unwrap();
        assert_eq!(kind, ExchangeKind::Headers);
        assert_eq!(Value::Object(others), json!({"alternate-exchange": "ae"}));
        let err = parse_exchange("d", &json!({"type": "fanout", "arguments": {}})).unwrap_err();
        assert!(err.to_string().contains("is of type fanout, not x-delayed-message"), "{err}");
        let err = parse_exchange("d", &json!({"type": "x-delayed-message", "arguments": {"x-delayed-type": "x-consistent-hash"}})).unwrap_err();
        assert!(err.to_string().contains("x-delayed-type \"x-consistent-hash\""), "{err}");
        assert!(matches!(parse_exchange("d", &json!({"type": "x-delayed-message", "arguments": {}})), Err(MigrateError::UnsupportedType { .. })));
    }

    #[test]
    fn every_node_of_the_cluster_must_report_none_delayed() {
        let exchange = |n: Value| Ok(Some(json!({"type": "x-delayed-message", "messages_delayed": n})));
        let both = || Ok(vec!["rabbit@a".to_string(), "rabbit@b".to_string()]);
        let empty = count_delayed(vec![("rabbit@a".into(), exchange(json!(0))), ("rabbit@b".into(), exchange(json!(0)))], both());
        assert_eq!(empty.not_empty(), None);
        assert_eq!(empty.summary(), "0 on rabbit@a, 0 on rabbit@b");

        let held = count_delayed(vec![("rabbit@a".into(), exchange(json!(0))), ("rabbit@b".into(), exchange(json!(3)))], both());
        assert_eq!(held.not_empty().unwrap(), "the plugin still holds delayed messages: 3 on rabbit@b");

        let one = count_delayed(vec![("rabbit@a".into(), exchange(json!(0)))], both());
        assert_eq!(one.uncounted, vec!["rabbit@b"]);
        assert!(one.not_empty().unwrap().contains("rabbit@b were not asked"), "{:?}", one.not_empty());

        let no_field = count_delayed(vec![("rabbit@a".into(), Ok(Some(json!({"type": "x-delayed-message"}))))], Ok(vec!["rabbit@a".into()]));
        assert!(no_field.not_empty().unwrap().contains("no messages_delayed field"), "{:?}", no_field.not_empty());

        let refused = ManagementError::Status { url: "http://a:15672/api/nodes".into(), status: 401 };
        let unlisted = count_delayed(vec![("rabbit@a".into(), exchange(json!(0)))], Err(NodesUnlisted::Refused(refused)));
        let why = unlisted.not_empty().unwrap();
        assert!(why.contains("could not be listed (http://a:15672/api/nodes: HTTP 401 (listing nodes needs the monitoring"), "{why}");

        // Two URLs reaching one node count it once; one that answers with an error does not hide the other's number.
        let refused = ManagementError::Status { url: "http://a:15672/api/exchanges".into(), status: 503 };
        let twice = count_delayed(vec![("rabbit@a".into(), Err(refused)), ("rabbit@a".into(), exchange(json!(0)))], Ok(vec!["rabbit@a".into()]));
        assert_eq!(twice.nodes.len(), 1);
        assert_eq!(twice.not_empty(), None);
    }

    #[test]
    fn the_plan_declares_deliver_to_and_copies_each_binding() {
        let bindings = vec![
            binding("orders-eu", DestinationType::Queue, "order.eu.*", json!({})),
            binding("audit", DestinationType::Exchange, "#", json!({"x-match": "all", "n": 5, "on": true})),
            binding("odd", DestinationType::Queue, "k", json!({"ratio": 0.5})),
        ];
        let plan = build(exchange(bindings, &[("rabbit@a", Some(0))]), "orders".into(), None, "http://h:15672", "guest");
        assert_eq!(plan.toml, "[exchanges.\"orders.delayed\"]\ntype = \"topic\"\ndeliver_to = \"orders\"\n");
        assert_eq!(plan.commands.len(), 3);
        assert_eq!(
            plan.commands[0],
            Command::Amqp(AmqpCommand::DeclareExchange { name: "orders".into(), kind: ExchangeKind::Topic, durable: true, arguments: FieldTable::new() })
        );
        assert_eq!(
            plan.commands[1],
            Command::Amqp(AmqpCommand::BindQueue {
                queue: "orders-eu".into(),
                exchange: "orders".into(),
                routing_key: "order.eu.*".into(),
                arguments: FieldTable::new()
            })
        );
        let Command::Amqp(AmqpCommand::BindExchange { source, destination, arguments, .. }) = &plan.commands[2] else { panic!("{:?}", plan.commands[2]) };
        assert_eq!((source.as_str(), destination.as_str()), ("orders", "audit"));
        assert_eq!(arguments["n"], FieldValue::Int(5));
        assert_eq!(arguments["on"], FieldValue::Bool(true));
        assert_eq!(plan.by_hand.len(), 1);
        assert!(plan.by_hand[0].why.contains("ratio = 0.5"), "{}", plan.by_hand[0].why);
        assert_eq!(plan.blocked, None);
        assert_eq!(plan.delete_command, "curl -u guest -X DELETE http://h:15672/api/exchanges/%2F/orders.delayed");
    }

    #[test]
    fn names_are_quoted_for_toml_and_the_shell() {
        let mut odd = exchange(Vec::new(), &[("rabbit@a", Some(0))]);
        odd.name = "it's \"odd\"\\\t".into();
        let plan = build(odd, "due".into(), None, "http://h:15672", "o'brien");
        assert!(plan.toml.starts_with("[exchanges.\"it's \\\"odd\\\"\\\\\\u0009\"]\n"), "{}", plan.toml);
        let parsed: toml::Table = plan.toml.parse().unwrap();
        assert_eq!(parsed["exchanges"]["it's \"odd\"\\\t"]["deliver_to"].as_str(), Some("due"));
        assert!(plan.delete_command.starts_with("curl -u 'o'\\''brien' "), "{}", plan.delete_command);
    }

    #[test]
    fn deliver_to_must_be_a_new_or_matching_exchange() {
        assert!(check_deliver_to("d", "d").is_err());
        assert!(check_deliver_to("d", "").is_err());
        assert!(check_deliver_to("d", "amq.topic").is_err());
        assert!(check_deliver_to("d", &"x".repeat(256)).is_err());
        assert!(check_deliver_to("d", "d.due").is_ok());
        let fanout = Existing { kind: "fanout".into(), durable: true, bindings: Vec::new() };
        let plan = build(exchange(Vec::new(), &[("rabbit@a", Some(0))]), "due".into(), Some(fanout), "http://h", "u");
        assert!(plan.blocked.as_deref().unwrap().contains("exists as a fanout exchange"), "{:?}", plan.blocked);
        // Bound as the plugin's exchange is (a second run), plus one of its own.
        let ours = binding("q", DestinationType::Queue, "k", json!({}));
        let theirs = binding("elsewhere", DestinationType::Queue, "k", json!({}));
        let shared = Existing { kind: "topic".into(), durable: true, bindings: vec![ours.clone(), theirs] };
        let plan = build(exchange(vec![ours.clone()], &[("rabbit@a", Some(0))]), "due".into(), Some(shared), "http://h", "u");
        assert_eq!(plan.blocked, None);
        assert!(plan.notes.iter().any(|n| n.contains("with 1 binding(s) of its own")), "{:?}", plan.notes);
        let again = Existing { kind: "topic".into(), durable: true, bindings: vec![ours.clone()] };
        let plan = build(exchange(vec![ours], &[("rabbit@a", Some(0))]), "due".into(), Some(again), "http://h", "u");
        assert!(plan.notes.is_empty(), "{:?}", plan.notes);
    }

    #[tokio::test]
    async fn apply_refuses_while_messages_are_delayed_and_otherwise_declares_and_binds() {
        let memory = crate::broker::memory::MemoryExecutor::default();
        memory.apply(&[Command::Amqp(AmqpCommand::DeclareQueue { name: "orders-eu".into(), durable: true, arguments: FieldTable::new() })]).await.unwrap();
        let bindings =
            vec![binding("orders-eu", DestinationType::Queue, "order.eu.*", json!({})), binding("gone", DestinationType::Queue, "order.us.*", json!({}))];
        let held = build(exchange(bindings.clone(), &[("rabbit@a", Some(2))]), "due".into(), None, "http://h", "u");
        let err = apply(&memory, &held).await.unwrap_err();
        assert_eq!(err.to_string(), "refusing to apply: the plugin still holds delayed messages: 2 on rabbit@a");
        let ready = build(exchange(bindings, &[("rabbit@a", Some(0))]), "due".into(), None, "http://h", "u");
        let applied = apply(&memory, &ready).await.unwrap();
        assert_eq!(applied.done, vec!["declare exchange \"due\" (topic, durable)", "bind queue \"orders-eu\" to \"due\" with key \"order.eu.*\""]);
        // A queue that is gone does not stop the others, and is named.
        assert_eq!(applied.failed.len(), 1);
        assert!(applied.failed[0].starts_with("bind queue \"gone\""), "{:?}", applied.failed);
    }
}
