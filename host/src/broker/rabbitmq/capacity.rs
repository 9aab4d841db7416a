//! Capacity: will the broker's nodes hold the quorum queues the strategies
//! declare, read from the management API (`GET /api/overview`, `/api/nodes`,
//! `/api/queues`).
//!
//! RabbitMQ up to 3.13 counts file handles in its file handle cache. Every
//! quorum queue replica reserves some for as long as it lives — its leader
//! 2 plus one per member, a follower 2 (`rabbit_quorum_queue:
//! file_handle_leader_reservation/1`; measured on the 3.10 node here: 30
//! quorum queues took the cache from 4 to 94 handles) — and every AMQP
//! connection must obtain one for its socket during its handshake. The
//! cache's limit is the open-file limit less about 100, and `sockets_total`
//! is 90 % of it less 2. Once reservations, open files and sockets pass the
//! limit, every new connection waits in its handshake until it times out:
//! on the 3.10 node here, at 1,024 open files, about 340 quorum queues did
//! that, until queues were deleted. `fd_used` does not show reservations
//! (it counts the descriptors really open), so the estimate is made here.
//!
//! RabbitMQ 4.0 removed that accounting (rabbitmq-server commit 49bedfc17e);
//! since then `sockets_total` and `sockets_used` read 0 and only real
//! descriptors count: `fd_used` of `fd_total`.
//!
//! RabbitMQ 4.0 also gave quorum queues a default delivery limit of 20: a
//! message returned to one more often than that is dropped (or
//! dead-lettered). hourglass returns messages to the quorum queues it reads:
//! `parked list` gives back each one it lists, and `transfer` what it cannot
//! move. Its consumers hold a message while the broker cannot take the
//! publish it needs and ask again (`consume.rs`), but still return it when
//! their channel or connection is lost or the service stops, when a planner
//! runs out of time, when a handler panics, and when a move aside fails. So
//! on 4.x the report warns about those queues unless a policy or argument
//! sets their `delivery-limit`. hourglass gives messages back with
//! `basic.nack`, which 4.0 counts and 4.3 no longer does (there only lost
//! channels and connections count); tests/tests/rabbitmq_versions.rs
//! `quorum_queues_default_delivery_limit_and_the_returns_it_counts`.

use serde::Serialize;
use serde_json::Value;
use thiserror::Error;

use crate::command::{AmqpCommand, Command, FieldValue, parking_queues};

use super::manage::{Management, ManagementError, management_url, vhost_of};
use super::redact;

/// The share of a limit at which the report warns.
const WARN_PERCENT: u64 = 80;
/// What a leader reserves beyond one handle per member, and what a follower reserves (RabbitMQ 3.x).
const RESERVED_PER_REPLICA: u64 = 2;
/// Members of a new quorum queue: RabbitMQ's default initial group size, at most the cluster's nodes.
const DEFAULT_QUORUM_MEMBERS: u64 = 3;
/// RabbitMQ 4.0's delivery limit for quorum queues without one of their own.
pub(crate) const DEFAULT_DELIVERY_LIMIT_4X: u64 = 20;

#[derive(Debug, Error)]
pub enum CapacityError {
    #[error("capacity not checked: {0}")]
    Unavailable(String),
    #[error("capacity not checked: management API at {url}: {source}")]
    Management { url: String, source: ManagementError },
}

/// One node's file descriptors and quorum queue replicas.
#[derive(Clone, Debug, Serialize)]
pub struct NodeCapacity {
    pub node: String,
    pub fd_total: Option<u64>,
    pub fd_used: Option<u64>,
    pub sockets_total: Option<u64>,
    pub sockets_used: Option<u64>,
    /// Quorum queue replicas on the node now (in every vhost the user sees).
    pub quorum_replicas: u64,
    /// RabbitMQ 3.x: the file handle cache's limit, derived from `sockets_total`.
    pub handle_limit: Option<u64>,
    /// RabbitMQ 3.x: handles the node's quorum replicas reserve now.
    pub reserved: Option<u64>,
    /// RabbitMQ 3.x: reserved handles and sockets once the new quorum queues
    /// exist, if each is led from this node (the most it can cost).
    pub projected: Option<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct CapacityReport {
    /// The broker's version, from `/api/overview`.
    pub version: Option<String>,
    /// Quorum queues the declarations add: those not on the broker yet.
    pub new_quorum_queues: Vec<String>,
    pub nodes: Vec<NodeCapacity>,
    /// Each one names its numbers and what to raise.
    pub warnings: Vec<String>,
}

/// Reads the nodes and queues through `api` and weighs `declarations` (the
/// strategies' topologies and sample plans, and any other queues the caller
/// will declare) against them.
pub fn check(api: &Management, declarations: &[Command]) -> Result<CapacityReport, ManagementError> {
    let overview = api.get("overview")?.unwrap_or_default();
    let version = overview["rabbitmq_version"].as_str().map(str::to_string);
    let nodes = api.get("nodes")?.unwrap_or_default();
    let queues = api.get("queues?columns=name,vhost,type,leader,members,arguments,effective_policy_definition")?.unwrap_or_default();
    let queues = queues.as_array().cloned().unwrap_or_default();
    Ok(weigh(version, nodes.as_array().map(Vec::as_slice).unwrap_or_default(), &queues, api.vhost(), declarations))
}

/// [`check`] with the management API of `amqp_url`'s broker (`management_url`
/// as `verify` picks it), off the async runtime.
pub async fn check_capacity(amqp_url: &str, management_url_setting: Option<&str>, declarations: &[Command]) -> Result<CapacityReport, CapacityError> {
    let url = management_url(amqp_url, management_url_setting).ok_or_else(|| CapacityError::Unavailable("no management URL".into()))?;
    let api = Management::new(&url, vhost_of(amqp_url)).map_err(|e| CapacityError::Unavailable(e.to_string()))?;
    let declarations = declarations.to_vec();
    tokio::task::spawn_blocking(move || check(&api, &declarations))
        .await
        .map_err(|e| CapacityError::Unavailable(e.to_string()))?
        .map_err(|source| CapacityError::Management { url: redact(&url), source })
}

fn is_quorum(arguments: &crate::command::FieldTable) -> bool {
    arguments.get("x-queue-type").and_then(FieldValue::as_text) == Some("quorum")
}

/// The report from what the API answered; no I/O, so it can be tested.
fn weigh(version: Option<String>, nodes: &[Value], queues: &[Value], vhost: &str, declarations: &[Command]) -> CapacityReport {
    let exists = |name: &str| queues.iter().any(|q| q["vhost"].as_str() == Some(vhost) && q["name"].as_str() == Some(name));
    let mut declared_quorum: Vec<&str> = declarations
        .iter()
        .filter_map(|c| match c {
            Command::Amqp(AmqpCommand::DeclareQueue { name, arguments, .. }) if is_quorum(arguments) => Some(name.as_str()),
            _ => None,
        })
        .collect();
    declared_quorum.sort_unstable();
    declared_quorum.dedup();
    let new_quorum_queues: Vec<String> = declared_quorum.iter().filter(|name| !exists(name)).map(|name| name.to_string()).collect();
    let running = nodes.iter().filter(|n| n["running"].as_bool() != Some(false)).count().max(1) as u64;
    let new_members = DEFAULT_QUORUM_MEMBERS.min(running);

    let mut warnings = Vec::new();
    let version_text = version.as_deref().map_or_else(|| "RabbitMQ".to_string(), |v| format!("RabbitMQ {v}"));
    let mut report_nodes = Vec::new();
    for node in nodes.iter().filter(|n| n["running"].as_bool() != Some(false)) {
        let name = node["name"].as_str().unwrap_or("?").to_string();
        let number = |key: &str| node[key].as_u64();
        let (fd_total, fd_used, sockets_total, sockets_used) = (number("fd_total"), number("fd_used"), number("sockets_total"), number("sockets_used"));
        let mut replicas = 0;
        let mut reserved = 0;
        for queue in queues.iter().filter(|q| q["type"].as_str() == Some("quorum")) {
            let members: Vec<&str> = queue["members"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
            if members.contains(&name.as_str()) {
                replicas += 1;
                reserved += RESERVED_PER_REPLICA + if queue["leader"].as_str() == Some(name.as_str()) { members.len() as u64 } else { 0 };
            }
        }
        // The file handle cache (RabbitMQ 3.x) reports a socket limit; 4.x reports 0.
        let handle_limit = sockets_total.filter(|&s| s > 0).map(|s| ((s + 2) * 10).div_ceil(9));
        let projected = handle_limit.map(|_| reserved + sockets_used.unwrap_or(0) + new_quorum_queues.len() as u64 * (RESERVED_PER_REPLICA + new_members));
        if let (Some(limit), Some(projected)) = (handle_limit, projected)
            && projected * 100 >= limit * WARN_PERCENT
        {
            warnings.push(format!(
                "node {name} ({version_text}): its file handle cache allows {limit} handles (open-file limit {}); {replicas} quorum queue replicas \
                 reserve {reserved} and {} sockets are open; the {} quorum queues the strategies add would reserve up to {} more: {projected} of {limit} \
                 ({}%). Past the limit every new AMQP connection waits in its handshake until it times out. Raise the node's open-file limit \
                 (ulimit -n, or LimitNOFILE= in its systemd unit) and restart it, or declare fewer quorum queues",
                fd_total.map_or("unknown".into(), |n| n.to_string()),
                sockets_used.unwrap_or(0),
                new_quorum_queues.len(),
                new_quorum_queues.len() as u64 * (RESERVED_PER_REPLICA + new_members),
                projected * 100 / limit
            ));
        }
        if let (Some(total), Some(used)) = (fd_total, fd_used)
            && total > 0
            && used * 100 >= total * WARN_PERCENT
        {
            warnings.push(format!(
                "node {name} ({version_text}): {used} of its {total} file descriptors are open ({}%); a node out of descriptors refuses connections \
                 and cannot open queue files. Raise its open-file limit (ulimit -n, or LimitNOFILE= in its systemd unit) and restart it",
                used * 100 / total
            ));
        }
        report_nodes.push(NodeCapacity {
            node: name,
            fd_total,
            fd_used,
            sockets_total,
            sockets_used,
            quorum_replicas: replicas,
            handle_limit,
            reserved: handle_limit.map(|_| reserved),
            projected,
        });
    }
    if let Some(warning) = delivery_limit_warning(version.as_deref(), queues, vhost, declarations) {
        warnings.push(warning);
    }
    CapacityReport { version, new_quorum_queues, nodes: report_nodes, warnings }
}

/// The major version of a RabbitMQ version string (`"4.0.1"`, `"4.2.0-rc.1"`).
fn major(version: &str) -> Option<u32> {
    version.split('.').next()?.parse().ok()
}

/// On RabbitMQ 4.x: the quorum queues among `declarations` that hourglass
/// reads from (every one without a message TTL: parking, release and the
/// service's own queues) and that have no delivery limit of their own.
fn delivery_limit_warning(version: Option<&str>, queues: &[Value], vhost: &str, declarations: &[Command]) -> Option<String> {
    if version.and_then(major).is_none_or(|major| major < 4) {
        return None;
    }
    let parking = parking_queues(declarations);
    let has_limit = |name: &str| {
        queues.iter().any(|q| {
            q["vhost"].as_str() == Some(vhost)
                && q["name"].as_str() == Some(name)
                && (!q["arguments"]["x-delivery-limit"].is_null() || !q["effective_policy_definition"]["delivery-limit"].is_null())
        })
    };
    let mut read: Vec<&str> = declarations
        .iter()
        .filter_map(|c| match c {
            Command::Amqp(AmqpCommand::DeclareQueue { name, arguments, .. }) if is_quorum(arguments) && !arguments.contains_key("x-message-ttl") => {
                Some(name.as_str())
            }
            _ => None,
        })
        .filter(|name| !has_limit(name))
        .collect();
    read.sort_unstable();
    read.dedup();
    if read.is_empty() {
        return None;
    }
    let parked = if read.iter().any(|q| parking.iter().any(|p| p == q)) { " (each `hourglass parked list` returns what it lists)" } else { "" };
    Some(format!(
        "RabbitMQ {}: quorum queues drop (or dead-letter) a message returned to them more than {DEFAULT_DELIVERY_LIMIT_4X} times unless a policy or \
         argument sets delivery-limit. hourglass returns messages to {}{parked}; its consumers hold a message while the broker cannot take a publish, \
         but return it when their connection is lost or the service stops. \
         Set a policy for them, e.g. rabbitmqctl set_policy hourglass-delivery-limit '<pattern matching them>' '{{\"delivery-limit\": -1}}' \
         --apply-to quorum_queues (merge it into any policy that already applies to them: only one policy applies to a queue)",
        version.unwrap_or_default(),
        read.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn quorum(name: &str) -> Command {
        Command::Amqp(AmqpCommand::DeclareQueue {
            name: name.into(),
            durable: true,
            arguments: [("x-queue-type".to_string(), FieldValue::Text("quorum".into()))].into(),
        })
    }

    fn level(name: &str) -> Command {
        let arguments = [("x-queue-type".to_string(), FieldValue::Text("quorum".into())), ("x-message-ttl".to_string(), FieldValue::Int(1_000))];
        Command::Amqp(AmqpCommand::DeclareQueue { name: name.into(), durable: true, arguments: arguments.into() })
    }

    fn node_3_10() -> Value {
        // As the 3.10 node here answers: sockets_total is 90 % of the cache's 927 less 2.
        json!({"name": "rabbit@a", "running": true, "fd_total": 1024, "fd_used": 39, "sockets_total": 832, "sockets_used": 2})
    }

    fn existing_quorum(name: &str, count: usize) -> Vec<Value> {
        (0..count).map(|i| json!({"name": format!("{name}-{i}"), "vhost": "/", "type": "quorum", "leader": "rabbit@a", "members": ["rabbit@a"]})).collect()
    }

    #[test]
    fn on_3_x_each_quorum_queue_reserves_handles_and_the_report_warns_near_the_limit() {
        let declarations: Vec<Command> = (0..29).map(|i| level(&format!("new-{i}"))).collect();
        let quiet = weigh(Some("3.10.8".into()), &[node_3_10()], &existing_quorum("old", 10), "/", &declarations);
        let node = &quiet.nodes[0];
        assert_eq!((node.handle_limit, node.reserved, node.quorum_replicas), (Some(927), Some(30), 10));
        assert_eq!(node.projected, Some(30 + 2 + 29 * 3));
        assert_eq!(quiet.new_quorum_queues.len(), 29);
        assert!(quiet.warnings.is_empty(), "{:?}", quiet.warnings);

        let crowded = weigh(Some("3.10.8".into()), &[node_3_10()], &existing_quorum("old", 230), "/", &declarations);
        let warning = &crowded.warnings[0];
        assert!(warning.contains("allows 927 handles (open-file limit 1024)") && warning.contains("230 quorum queue replicas reserve 690"), "{warning}");
        assert!(warning.contains("779 of 927") && warning.contains("ulimit -n") && warning.contains("LimitNOFILE"), "{warning}");
    }

    #[test]
    fn queues_already_there_cost_nothing_more_and_followers_reserve_two() {
        let mut queues = existing_quorum("old", 1);
        queues.push(json!({"name": "follower", "vhost": "/", "type": "quorum", "leader": "rabbit@b", "members": ["rabbit@a", "rabbit@b", "rabbit@c"]}));
        let report = weigh(None, &[node_3_10()], &queues, "/", &[level("old-0")]);
        assert!(report.new_quorum_queues.is_empty());
        assert_eq!(report.nodes[0].reserved, Some(3 + 2));
    }

    #[test]
    fn on_4_x_only_open_descriptors_count() {
        let node = json!({"name": "rabbit@a", "running": true, "fd_total": 1024, "fd_used": 900, "sockets_total": 0, "sockets_used": 0});
        let report = weigh(Some("4.1.0".into()), &[node], &existing_quorum("old", 400), "/", &[]);
        assert_eq!((report.nodes[0].handle_limit, report.nodes[0].projected), (None, None));
        assert_eq!(report.warnings.len(), 1, "{:?}", report.warnings);
        assert!(report.warnings[0].contains("900 of its 1024 file descriptors are open (87%)"), "{}", report.warnings[0]);
    }

    #[test]
    fn on_4_x_quorum_queues_hourglass_reads_need_a_delivery_limit() {
        let declarations = [level("levels-00"), quorum("p.parked"), quorum("p.release.main")];
        assert!(weigh(Some("3.13.7".into()), &[], &[], "/", &declarations).warnings.is_empty(), "3.x has no default delivery limit");
        let limited = json!({"name": "p.release.main", "vhost": "/", "type": "quorum", "effective_policy_definition": {"delivery-limit": -1}});
        let report = weigh(Some("4.0.1".into()), &[], &[limited], "/", &declarations);
        let warning = &report.warnings[0];
        assert!(warning.starts_with("RabbitMQ 4.0.1: quorum queues drop") && warning.contains("to p.parked") && !warning.contains("levels-00"), "{warning}");
        assert!(!warning.contains("p.release.main"), "a queue with a delivery limit is left out: {warning}");
    }
}
