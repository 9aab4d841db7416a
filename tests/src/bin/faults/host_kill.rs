//! `kill -9` of the host under HTTP and ingress load, then a new host on the
//! same config. Requests in flight at the kill get no answer (not
//! acknowledged); ingress messages not yet acked go back to the broker and are
//! forwarded by the next host, so a message forwarded but not acked before the
//! kill arrives twice (at-least-once). Nothing acknowledged may be lost.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hourglass::clock::unix_now_ms;
use hourglass_e2e::vhost::PrivateVhost;

use crate::Report;
use hourglass_e2e::chaos::canary::Canaries;
use hourglass_e2e::chaos::host::Host;
use hourglass_e2e::chaos::setup::Setup;

const LOAD: Duration = Duration::from_secs(5);
const GRACE: Duration = Duration::from_secs(20);

pub async fn kill9() -> Vec<Report> {
    let mut report = Report::new("host kill -9 under HTTP and ingress load");
    report.refusals_allowed = true;
    report.duplicates_allowed = true;
    if let Err(err) = run(&mut report).await {
        report.problems.push(format!("case did not run: {err:#}"));
    }
    vec![report]
}

async fn run(report: &mut Report) -> anyhow::Result<()> {
    let vhost = tokio::task::spawn_blocking(|| PrivateVhost::create("faults-host")).await?;
    let setup = Setup::new("hostkill", &vhost.url, "").await?;
    let mut first = Host::start(&setup.config)?;
    let base = Arc::new(Mutex::new(first.base.clone()));
    let canaries = Canaries::start("hostkill", setup.route(&base));
    tokio::time::sleep(LOAD).await;
    let killed_ms = unix_now_ms();
    first.kill9();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let config = setup.config.clone();
    let second = tokio::task::spawn_blocking(move || Host::start(&config)).await??;
    *base.lock().unwrap() = second.base.clone();
    let serving_ms = unix_now_ms();
    tokio::time::sleep(LOAD).await;
    let ledger = canaries.finish(GRACE).await;
    report.tally = ledger.tally();
    // The fault window: from the kill until the new host serves, plus the
    // longest canary delay (3 s): an ingress canary published while no host
    // ran is forwarded when the next one starts and waits its whole delay from
    // then. Canaries due before or after it must be on time.
    report.judge_lateness(&ledger, &[(killed_ms, serving_ms + 3_000)]);
    drop(second);
    tokio::task::spawn_blocking(move || drop(vhost)).await?;
    Ok(())
}
