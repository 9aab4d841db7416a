//! `hourglass verify` on RabbitMQ: the picked strategy's topology (and each
//! `--to` destination's setup) compared with the broker, a probe through each
//! mechanism the configured strategies rely on, and their quorum queues
//! weighed against the nodes' file handle limits.

use std::fmt::Write as _;

use serde::Serialize;

use super::capacity::{self, CapacityReport};
use super::probe::{self, Outcome, ProbeResult};
use super::release_queue_declaration;
use super::verify::{self, Report};
use crate::command::Command;
use crate::config::Config;
use crate::config::broker::RabbitMqSettings;
use crate::render;
use crate::report::{CommandError, Verdict};
use crate::scheduler::strategies::Strategies;

#[derive(Serialize)]
struct Verified {
    #[serde(flatten)]
    topology: Report,
    probes: Vec<ProbeResult>,
    capacity: Option<CapacityReport>,
    /// Why there is no capacity report.
    #[serde(skip_serializing_if = "Option::is_none")]
    capacity_unchecked: Option<String>,
}

/// Verifies `strategy` with `destinations` on the RabbitMQ `settings` name;
/// probes unless `probes` is false.
pub async fn verify_command(
    settings: &RabbitMqSettings,
    config: &Config,
    strategies: &mut Strategies,
    strategy: &str,
    destinations: &[String],
    probes: bool,
) -> Result<Verdict, CommandError> {
    let RabbitMqSettings { url: amqp, management_url, .. } = settings;
    // Probes and capacity concern every configured strategy, and the release queue a serving host declares for each.
    let mut everything: Vec<Command> = Vec::new();
    for name in strategies.names().map(str::to_string).collect::<Vec<_>>() {
        everything.extend(strategies.get(&name)?.declarations()?);
        everything.push(release_queue_declaration(&config.service.cancel.release_queue(&name)));
    }
    let planner = strategies.get_mut(strategy)?;
    let mut commands = planner.topology()?;
    for destination in destinations {
        commands.extend(planner.destination_setup(destination)?);
    }
    let mechanisms = probe::mechanisms_used(&everything);
    let topology = verify::verify(amqp, management_url.as_deref(), &commands).await.map_err(|e| CommandError::failed("comparing the topology", e))?;
    let probes_run = match probes {
        true => probe::probe(amqp, &mechanisms).await.map_err(|e| CommandError::failed("probing the broker", e))?,
        false => Vec::new(),
    };
    let (capacity, capacity_unchecked) = match capacity::check_capacity(amqp, management_url.as_deref(), &everything).await {
        Ok(report) => (Some(report), None),
        Err(err) => (None, Some(err.to_string())),
    };
    let passed = topology.drifts.is_empty() && probes_run.iter().all(ProbeResult::passed);
    let mut table = format!("strategy {strategy}: checked {} objects and bindings via {}\n", topology.checked, topology.method);
    if topology.drifts.is_empty() {
        table.push_str("no drift\n");
    } else {
        let rows: Vec<Vec<String>> =
            verify::grouped(&topology).into_iter().flat_map(|(object, problems)| problems.into_iter().map(move |p| vec![object.clone(), p])).collect();
        table.push_str(&render::table(&["OBJECT", "DRIFT"], &rows));
    }
    write_probes(&mut table, !probes, &mechanisms, &probes_run);
    write_capacity(&mut table, capacity.as_ref(), capacity_unchecked.as_deref());
    let json = serde_json::to_value(Verified { topology, probes: probes_run, capacity, capacity_unchecked })
        .map_err(|e| CommandError::failed("writing the report", e))?;
    Ok(Verdict { passed, table, json })
}

fn write_probes(out: &mut String, skipped: bool, mechanisms: &[probe::Mechanism], probes: &[ProbeResult]) {
    if skipped {
        out.push_str("probes skipped (--no-probes)\n");
        return;
    }
    if mechanisms.is_empty() {
        out.push_str("probes: the strategies use none of the mechanisms probed (BCC through dead-lettering, alternate exchanges, at-least-once)\n");
        return;
    }
    let rows: Vec<Vec<String>> = probes
        .iter()
        .map(|p| {
            let outcome = match p.outcome {
                Outcome::Passed => "passed",
                Outcome::Failed => "FAILED",
                Outcome::NotRun => "not run",
            };
            vec![p.mechanism.to_string(), outcome.into(), format!("{} ms", p.elapsed_ms), p.detail.clone()]
        })
        .collect();
    out.push_str(&render::table(&["MECHANISM", "PROBE", "TOOK", "DETAIL"], &rows));
    for refusal in probes.iter().filter_map(ProbeResult::refusal) {
        let _ = writeln!(out, "error: {refusal}");
    }
    if probes.iter().any(|p| p.outcome == Outcome::NotRun) {
        out.push_str("error: a probe could not run, so the mechanism is unproven on this broker (see DETAIL; --no-probes skips them)\n");
    }
}

fn write_capacity(out: &mut String, report: Option<&CapacityReport>, unchecked: Option<&str>) {
    let Some(report) = report else {
        let _ = writeln!(out, "{}", unchecked.unwrap_or("capacity not checked"));
        return;
    };
    for node in &report.nodes {
        let fds = match (node.fd_used, node.fd_total) {
            (Some(used), Some(total)) => format!("{used} of {total} file descriptors open"),
            _ => "file descriptors not reported".to_string(),
        };
        let handles = match (node.projected, node.handle_limit, node.reserved) {
            (Some(projected), Some(limit), Some(reserved)) => format!(
                "; file handle cache: {reserved} of {limit} handles reserved by quorum replicas, {projected} with the open sockets and the {} quorum \
                 queues the strategies add",
                report.new_quorum_queues.len()
            ),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "capacity: node {} ({}): {fds}, {} quorum queue replicas{handles}",
            node.node,
            report.version.as_deref().map_or_else(|| "RabbitMQ".to_string(), |v| format!("RabbitMQ {v}")),
            node.quorum_replicas
        );
    }
    for warning in &report.warnings {
        let _ = writeln!(out, "warning: {warning}");
    }
}
