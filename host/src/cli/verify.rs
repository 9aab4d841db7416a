//! `hourglass verify`: compare the broker with the strategy's topology (and
//! each --to destination's setup), probe the broker mechanisms the
//! configured strategies rely on, and weigh their quorum queues against the
//! nodes' file handle limits. On NATS: the server's version and JetStream,
//! a probe of a declined message, every strategy's streams and each --to
//! destination's stream (`broker::nats::verify`).

use std::process::ExitCode;

use anyhow::{Result, bail};
use hourglass::broker::RabbitMqSettings;
use hourglass::broker::nats::verify as nats_verify;
use hourglass::broker::rabbitmq::capacity::{self, CapacityReport};
use hourglass::broker::rabbitmq::probe::{self, Outcome, ProbeResult};
use hourglass::broker::rabbitmq::release_queue_declaration;
use hourglass::broker::rabbitmq::verify::{self, Report};
use hourglass::command::Command;
use hourglass::render;
use serde::Serialize;

use super::{Cli, TextOrJson, load, pick, print_json, tokio_runtime};

#[derive(clap::Args)]
pub struct Args {
    #[arg(long = "to", value_name = "DEST")]
    pub destinations: Vec<String>,
    /// Skip the probes (one message through each broker mechanism the strategies use).
    #[arg(long)]
    pub no_probes: bool,
    #[arg(long, value_enum, default_value = "table")]
    pub format: TextOrJson,
}

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

pub fn run(cli: &Cli, args: &Args) -> Result<ExitCode> {
    let Args { destinations, no_probes, format } = args;
    let (config, mut strategies) = load(cli)?;
    if config.broker.nats().is_some() {
        return run_on_nats(&config, &mut strategies, args);
    }
    let Some(RabbitMqSettings { url: amqp, management_url, .. }) = config.broker.rabbitmq() else {
        bail!("{}: verify needs broker.kind = \"rabbitmq\" or \"nats\"", config.path.display());
    };
    // Probes and capacity concern every configured strategy, and the release queue a serving host declares for each.
    let mut everything: Vec<Command> = Vec::new();
    for strategy in strategies.names().map(str::to_string).collect::<Vec<_>>() {
        everything.extend(strategies.get(&strategy).map_err(anyhow::Error::msg)?.declarations()?);
        everything.push(release_queue_declaration(&config.service.cancel.release_queue(&strategy)));
    }
    let (name, planner) = pick(cli, &config, &mut strategies, None)?;
    let mut commands = planner.topology()?;
    for destination in destinations {
        commands.extend(planner.destination_setup(destination)?);
    }
    let mechanisms = probe::mechanisms_used(&everything);
    let runtime = tokio_runtime()?;
    let (topology, probes, capacity) = runtime.block_on(async {
        let topology = verify::verify(&amqp, management_url.as_deref(), &commands).await?;
        let probes = if *no_probes { Vec::new() } else { probe::probe(&amqp, &mechanisms).await? };
        let capacity = capacity::check_capacity(&amqp, management_url.as_deref(), &everything).await;
        anyhow::Ok((topology, probes, capacity))
    })?;
    let (capacity, capacity_unchecked) = match capacity {
        Ok(report) => (Some(report), None),
        Err(err) => (None, Some(err.to_string())),
    };
    let ok = topology.drifts.is_empty() && probes.iter().all(ProbeResult::passed);
    match format {
        TextOrJson::Json => print_json(&Verified { topology, probes, capacity, capacity_unchecked })?,
        TextOrJson::Table => {
            println!("strategy {name}: checked {} objects and bindings via {}", topology.checked, topology.method);
            if topology.drifts.is_empty() {
                println!("no drift");
            } else {
                let rows: Vec<Vec<String>> =
                    verify::grouped(&topology).into_iter().flat_map(|(object, problems)| problems.into_iter().map(move |p| vec![object.clone(), p])).collect();
                print!("{}", render::table(&["OBJECT", "DRIFT"], &rows));
            }
            print_probes(*no_probes, &mechanisms, &probes);
            print_capacity(capacity.as_ref(), capacity_unchecked.as_deref());
        }
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// On NATS: every strategy's streams, the destinations asked about, and a probe of the held streams' mechanism.
fn run_on_nats(config: &hourglass::config::Config, strategies: &mut hourglass::scheduler::strategies::Strategies, args: &Args) -> Result<ExitCode> {
    let mut everything: Vec<Command> = Vec::new();
    for strategy in strategies.names().map(str::to_string).collect::<Vec<_>>() {
        everything.extend(strategies.get(&strategy).map_err(anyhow::Error::msg)?.topology()?);
    }
    let report = tokio_runtime()?.block_on(async {
        let nats = hourglass::broker::connect_nats(&config.broker).await?;
        anyhow::Ok(nats_verify::verify(&nats, &everything, &args.destinations, !args.no_probes).await)
    })?;
    match args.format {
        TextOrJson::Json => print_json(&report)?,
        TextOrJson::Table => {
            println!("nats-server {}", report.server_version);
            let rows: Vec<Vec<String>> =
                report.checks.iter().map(|c| vec![c.name.clone(), if c.passed { "passed".into() } else { "FAILED".into() }, c.detail.clone()]).collect();
            print!("{}", render::table(&["CHECK", "RESULT", "DETAIL"], &rows));
        }
    }
    Ok(if report.passed() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn print_probes(skipped: bool, mechanisms: &[probe::Mechanism], probes: &[ProbeResult]) {
    if skipped {
        println!("probes skipped (--no-probes)");
        return;
    }
    if mechanisms.is_empty() {
        println!("probes: the strategies use none of the mechanisms probed (BCC through dead-lettering, alternate exchanges, at-least-once)");
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
    print!("{}", render::table(&["MECHANISM", "PROBE", "TOOK", "DETAIL"], &rows));
    for refusal in probes.iter().filter_map(ProbeResult::refusal) {
        println!("error: {refusal}");
    }
    if probes.iter().any(|p| p.outcome == Outcome::NotRun) {
        println!("error: a probe could not run, so the mechanism is unproven on this broker (see DETAIL; --no-probes skips them)");
    }
}

fn print_capacity(report: Option<&CapacityReport>, unchecked: Option<&str>) {
    let Some(report) = report else {
        println!("{}", unchecked.unwrap_or("capacity not checked"));
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
        println!(
            "capacity: node {} ({}): {fds}, {} quorum queue replicas{handles}",
            node.node,
            report.version.as_deref().map_or_else(|| "RabbitMQ".to_string(), |v| format!("RabbitMQ {v}")),
            node.quorum_replicas
        );
    }
    for warning in &report.warnings {
        println!("warning: {warning}");
    }
}
