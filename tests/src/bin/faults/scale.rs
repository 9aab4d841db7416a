//! Scaling out (docs/operating.md, "Scaling out"): hosts keep no state
//! of their own, so more of them share the work, and a cluster's node can die.
//!
//! * Two hosts consume one ingress queue while 10,000 messages go in; one is
//!   `kill -9`ed half-way. Every message arrives; the only duplicates are the
//!   killed host's unacknowledged deliveries, so at most its prefetch.
//! * A three-node cluster (`scripts/cluster`) with the default quorum levels:
//!   one node is `kill -9`ed under canary traffic and booted again. Every
//!   acknowledged canary arrives, none early; lateness p99 is reported for
//!   canaries sent before, during and after the loss; the host is ready again
//!   within seconds, and `/readyz` says 503 once every node is gone.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hourglass::clock::unix_now_ms;
use hourglass_e2e::cluster::Cluster;
use hourglass_e2e::vhost::PrivateVhost;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};

use crate::Report;
use hourglass_e2e::chaos::canary::{self, Canaries};
use hourglass_e2e::chaos::host::Host;
use hourglass_e2e::chaos::ledger::Ledger;
use hourglass_e2e::chaos::setup::{INGRESS_PREFETCH, Setup};

const MESSAGES: usize = 10_000;
/// Messages published between two waits for their confirms: 2,000 a second,
/// under what one host forwards, so the kill lands with the ingress busy.
const BATCH: usize = 20;
const BATCH_EVERY: Duration = Duration::from_millis(10);
/// How long after the last due time a message may still arrive.
const GRACE: Duration = Duration::from_secs(40);
/// Canary traffic before the node loss, during it and after the node is back.
const PHASE: Duration = Duration::from_secs(5);
/// A host that lost a node serves again within this long.
const RECOVERY_LIMIT: Duration = Duration::from_secs(10);

pub async fn two_hosts_one_killed() -> Vec<Report> {
    let mut report = Report::new("two hosts share 10,000 ingress messages, one kill -9");
    // The killed host's unacknowledged deliveries go back and are forwarded again.
    report.duplicates_allowed = true;
    if let Err(err) = two_hosts(&mut report).await {
        report.problems.push(format!("case did not run: {err:#}"));
    }
    vec![report]
}

async fn two_hosts(report: &mut Report) -> anyhow::Result<()> {
    let vhost = tokio::task::spawn_blocking(|| PrivateVhost::create("faults-scale")).await?;
    let setup = Setup::new("scale", &vhost.url, "").await?;
    let ledger = Arc::new(Ledger::default());
    let consumer = tokio::spawn(canary::consume(setup.amqp_url.clone(), setup.destination.clone(), ledger.clone()));
    let (first, second) = (setup.config.clone(), setup.config.clone());
    let (killed, survivor) = tokio::join!(tokio::task::spawn_blocking(move || Host::start(&first)), tokio::task::spawn_blocking(move || Host::start(&second)));
    let (mut killed, survivor) = (killed??, survivor??);

    let connection = canary::connect(&setup.amqp_url).await?;
    let channel = connection.create_channel().await?;
    channel.confirm_select(ConfirmSelectOptions::default()).await?;
    let mut forwarded_by_killed = 0;
    let mut tick = tokio::time::interval(BATCH_EVERY);
    for batch in 0..MESSAGES / BATCH {
        tick.tick().await;
        if batch * BATCH == MESSAGES / 2 {
            forwarded_by_killed = forwarded(&killed).await;
            killed.kill9();
        }
        let mut confirms = Vec::with_capacity(BATCH);
        for n in batch * BATCH..(batch + 1) * BATCH {
            let id = format!("scale-{n}");
            let delay = 1000 * (1 + n as u64 % 3);
            let properties = canary::ingress_properties(&setup.destination, delay);
            ledger.sent(&id, unix_now_ms() + delay);
            let options = BasicPublishOptions { mandatory: true, ..Default::default() };
            confirms.push((id.clone(), channel.basic_publish("".into(), setup.ingress.as_str().into(), options, id.as_bytes(), properties).await?));
        }
        for (id, confirm) in confirms {
            let confirmation = confirm.await?;
            if confirmation.is_ack() && confirmation.take_message().is_none() {
                ledger.acknowledged(&id, None);
            }
        }
    }
    connection.close(200, "done".into()).await.ok();
    wait_for_arrivals(&ledger).await;
    let forwarded_by_survivor = forwarded(&survivor).await;
    consumer.abort();
    report.tally = ledger.tally();
    let prefetch = usize::from(INGRESS_PREFETCH);
    report.check(forwarded_by_killed > 0 && forwarded_by_survivor > 0, || {
        format!("the hosts did not share the ingress: {forwarded_by_killed} forwarded by the killed one before its kill, {forwarded_by_survivor} by the other")
    });
    let duplicated = report.tally.duplicated;
    report.check(duplicated <= prefetch, || format!("{duplicated} duplicates, more than the prefetch ({prefetch})"));
    report.notes.push(format!("forwarded {forwarded_by_killed} + {forwarded_by_survivor}, duplicates ≤ prefetch {prefetch}"));
    drop(survivor);
    tokio::task::spawn_blocking(move || drop(vhost)).await?;
    Ok(())
}

pub async fn cluster_node_killed() -> Vec<Report> {
    let mut report = Report::new("3-node cluster, quorum levels, one node kill -9");
    report.refusals_allowed = true;
    // At-least-once dead-lettering may repeat a message the lost node had not settled.
    report.duplicates_allowed = true;
    if let Err(err) = cluster(&mut report).await {
        report.problems.push(format!("case did not run: {err:#}"));
    }
    vec![report]
}

async fn cluster(report: &mut Report) -> anyhow::Result<()> {
    let cluster = Arc::new(tokio::task::spawn_blocking(Cluster::start).await??);
    let setup = Setup::new("cluster", &cluster.urls(), "").await?;
    let host = Host::start(&setup.config)?;
    let base = Arc::new(Mutex::new(host.base.clone()));
    let canaries = Canaries::start("cluster", setup.route(&base));
    tokio::time::sleep(PHASE).await;

    let killed_at = unix_now_ms();
    let down = cluster.clone();
    tokio::task::spawn_blocking(move || down.nodes[0].kill9()).await??;
    let recovered = serving_again(&host.base, &setup.destination).await;
    report.check(recovered.is_some_and(|took| took <= RECOVERY_LIMIT), || format!("not serving again within {RECOVERY_LIMIT:?} of the node's kill"));
    // Connections spread over the nodes, so the killed one held some of the host's.
    let failed_over = host.logged("reconnected to RabbitMQ") || host.logged("consumer lost; reconnecting");
    report.check(failed_over, || "the host lost no connection with the killed node: nothing failed over".into());
    tokio::time::sleep(PHASE).await;
    let up = cluster.clone();
    tokio::task::spawn_blocking(move || up.nodes[0].boot()).await??;
    let back_at = unix_now_ms();
    tokio::time::sleep(PHASE).await;

    let ledger = canaries.finish(GRACE).await;
    report.tally = ledger.tally();
    let mut phases = Vec::new();
    for (phase, from, to) in [("before", 0, killed_at), ("during", killed_at, back_at), ("after", back_at, u64::MAX)] {
        let (p99, count) = ledger.lateness_p99(from, to);
        report.check(count > 0, || format!("no canary acknowledged {phase} the node loss"));
        phases.push(format!("{phase} {} ms", p99.map_or("-".into(), |ms| ms.to_string())));
    }
    report.notes.push(format!("lateness p99 {}", phases.join(" / ")));
    if let Some(took) = recovered {
        report.notes.push(format!("serving again {:.1} s after the kill", took.as_secs_f64()));
    }

    // Every node gone: readiness must say so.
    let all = cluster.clone();
    tokio::task::spawn_blocking(move || all.nodes.iter().try_for_each(|node| node.kill9())).await??;
    let unready = until_status(&host.base, 503, RECOVERY_LIMIT).await;
    report.check(unready.is_some(), || format!("/readyz still 200 {RECOVERY_LIMIT:?} after every node died"));
    if let Some(took) = unready {
        report.notes.push(format!("/readyz 503 {:.1} s after the last node died", took.as_secs_f64()));
    }
    if report.tally.lost > 0 {
        eprintln!("   host log tail:\n{}", host.log_tail(15));
    }
    drop(host);
    tokio::task::spawn_blocking(move || drop(cluster)).await?;
    Ok(())
}

/// Waits until every acknowledged message arrived, or [`GRACE`] after the last due time.
async fn wait_for_arrivals(ledger: &Ledger) {
    let deadline_ms = ledger.last_due_ms() + GRACE.as_millis() as u64;
    while !ledger.complete() && unix_now_ms() < deadline_ms {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A moment more, so a duplicate right behind its first copy is counted.
    tokio::time::sleep(Duration::from_millis(500)).await;
}

/// `hourglass_ingress_messages_total{outcome="forwarded"}` of a host.
async fn forwarded(host: &Host) -> u64 {
    let url = format!("{}/metrics", host.base);
    let text = tokio::task::spawn_blocking(move || ureq::get(&url).call().ok()?.body_mut().read_to_string().ok()).await.ok().flatten().unwrap_or_default();
    text.lines()
        .find(|line| line.starts_with("hourglass_ingress_messages_total{outcome=\"forwarded\"}"))
        .and_then(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .map_or(0, |count| count as u64)
}

/// How long until `/readyz` is 200 and a new message is accepted (2xx), polling; `None` past [`RECOVERY_LIMIT`].
async fn serving_again(base: &str, destination: &str) -> Option<Duration> {
    let started = Instant::now();
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(5))).build().into();
    while started.elapsed() <= RECOVERY_LIMIT {
        let (agent, base, destination) = (agent.clone(), base.to_string(), destination.to_string());
        let serving = tokio::task::spawn_blocking(move || {
            let ready = agent.get(&format!("{base}/readyz")).call().is_ok_and(|r| r.status() == 200);
            let body = serde_json::json!({ "destination": destination, "delay": 1000, "body": "recovery probe" });
            ready && agent.post(&format!("{base}/v1/messages")).send_json(body).is_ok_and(|r| r.status().is_success())
        })
        .await
        .unwrap_or(false);
        if serving {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// How long until `/readyz` answers `status`, polling; `None` past `limit`.
async fn until_status(base: &str, status: u16, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(5))).build().into();
    while started.elapsed() <= limit {
        let (agent, url) = (agent.clone(), format!("{base}/readyz"));
        let answered = tokio::task::spawn_blocking(move || agent.get(&url).call().map(|r| r.status().as_u16()).ok()).await.ok().flatten();
        if answered == Some(status) {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}
