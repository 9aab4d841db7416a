//! The broker goes away under load: `kill -9` of its Erlang VM, or a clean
//! stop, then a start on the same data. Always a private node: the shared
//! broker is never touched. The strategy is left at its defaults.
//!
//! The kill runs beside [`BUSY_CLIENTS`] producers sending back to back, so
//! messages fall due while the restarted node is still recovering; the
//! broker parks some of those (their dead-letter finds no route yet) though
//! the destination exists throughout. Nothing may be left parked at the end:
//! the host sends such messages on by itself.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hourglass_e2e::private_node::PrivateNode;

use crate::Report;
use hourglass_e2e::chaos::canary::Canaries;
use hourglass_e2e::chaos::host::Host;
use hourglass_e2e::chaos::setup::Setup;

/// Load before the fault, and after the broker is back.
const LOAD: Duration = Duration::from_secs(5);
/// How long after the last due time a canary may still arrive (reconnects back off up to 5 s).
const GRACE: Duration = Duration::from_secs(40);
/// How much longer to wait for canaries still out after [`GRACE`]: RabbitMQ
/// retries an at-least-once dead-letter its crash interrupted after 180 s.
const DEAD_LETTER_RETRY: Duration = Duration::from_secs(200);
/// HTTP producers sending back to back during the kill (the canaries' two besides).
const BUSY_CLIENTS: usize = 8;

pub async fn kill9() -> Vec<Report> {
    vec![run("broker kill -9 under load (default config)", Fault::Kill).await]
}

pub async fn stop_start() -> Vec<Report> {
    vec![run("broker stop / start under load", Fault::Stop).await]
}

enum Fault {
    Kill,
    Stop,
}

async fn run(name: &str, fault: Fault) -> Report {
    let mut report = Report::new(name);
    report.refusals_allowed = true;
    // At-least-once dead-lettering may repeat a message the broker had not yet settled.
    report.duplicates_allowed = true;
    if let Err(err) = run_fault(&mut report, fault).await {
        report.problems.push(format!("case did not run: {err:#}"));
    }
    report
}

async fn run_fault(report: &mut Report, fault: Fault) -> anyhow::Result<()> {
    let node = Arc::new(tokio::task::spawn_blocking(PrivateNode::start).await??);
    let setup = Setup::new("broker", &node.url(), "").await?;
    let host = Host::start(&setup.config)?;
    let base = Arc::new(Mutex::new(host.base.clone()));
    let busy = if matches!(fault, Fault::Kill) { BUSY_CLIENTS } else { 0 };
    let canaries = Canaries::start_busy("broker", setup.route(&base), busy);
    tokio::time::sleep(LOAD).await;
    let down = node.clone();
    tokio::task::spawn_blocking(move || match fault {
        Fault::Kill => down.kill9(),
        Fault::Stop => down.stop(),
    })
    .await??;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let up = node.clone();
    tokio::task::spawn_blocking(move || up.boot()).await??;
    tokio::time::sleep(LOAD).await;
    let ledger = canaries.finish_with_patience(GRACE, DEAD_LETTER_RETRY).await;
    report.tally = ledger.tally();
    // The destination existed throughout: nothing may wait in parking, nor as an orphan.
    let parking = format!("{}.parked", setup.prefix);
    for queue in [parking.clone(), hourglass::broker::rabbitmq::parked::orphan_queue(&parking)] {
        let left = hourglass_e2e::chaos::canary::depth(&setup.amqp_url, &queue).await?;
        report.check(left == 0, || format!("{left} messages left in {queue} while their destination existed"));
    }
    // What the host took from the parking queue: `outcome=count` for each outcome seen.
    let unparked: Vec<String> = host
        .metric_lines("hourglass_unparked_messages_total{")
        .await
        .iter()
        .filter_map(|line| Some(format!("{}={}", line.split("outcome=\"").nth(1)?.split('"').next()?, line.rsplit(' ').next()?)))
        .collect();
    report.notes.push(format!("unparked: {}", if unparked.is_empty() { "none".to_string() } else { unparked.join(" ") }));
    if report.tally.lost > 0 {
        eprintln!("   host log tail:\n{}", host.log_tail(10));
        let queues = node.ctl(&["list_queues", "--quiet", "name", "messages_ready", "messages_unacknowledged"]).unwrap_or_else(|e| e.to_string());
        eprintln!("   the node's queues (name, ready, unacked):\n{queues}");
        // The node's directory goes with it: its whole log is kept beside the case's config.
        let kept = hourglass_e2e::chaos::scratch("broker-node-log").join("node.log");
        let copied = std::fs::copy(node.log_path(), &kept).map_or_else(|e| format!("not kept: {e}"), |_| format!("kept in {}", kept.display()));
        eprintln!("   the node's log ({copied}), tail:\n{}", node.log_tail());
    }
    drop(host);
    tokio::task::spawn_blocking(move || drop(node)).await?;
    Ok(())
}
