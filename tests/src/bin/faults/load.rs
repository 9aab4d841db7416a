//! Many bad or idle clients at once: 10,000 failing requests in a row (HTTP
//! and ingress, each naming a destination that does not exist), and 2,000
//! idle connections held open on a host limited to 1,024 descriptors. The
//! canaries beside them must all be acknowledged and arrive.

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hourglass_e2e::unique;
use lapin::BasicProperties;
use lapin::options::BasicPublishOptions;
use lapin::types::{FieldTable, ShortString};
use serde_json::json;

use crate::Report;
use crate::inputs::{Bench, text};
use hourglass_e2e::chaos::canary::Canaries;

const FAILING: usize = 10_000;

pub async fn failing_in_a_row() -> Vec<Report> {
    let bench = match Bench::start("failing").await {
        Ok(bench) => bench,
        Err(err) => {
            let mut report = Report::new("10,000 failing requests in a row");
            report.problems.push(format!("case did not run: {err:#}"));
            return vec![report];
        }
    };
    let reports = vec![failing_http(&bench).await, failing_ingress(&bench).await];
    drop(bench.host);
    let vhost = bench.vhost;
    let _ = tokio::task::spawn_blocking(move || drop(vhost)).await;
    reports
}

async fn failing_http(bench: &Bench) -> Report {
    let mut report = Report::new("10,000 failing HTTP requests in a row (missing destination)");
    let canaries = Canaries::start(&unique("c"), bench.setup.route(&bench.base));
    let url = format!("{}/v1/messages", bench.base.lock().unwrap());
    let missing = unique("missing");
    let next = Arc::new(AtomicUsize::new(0));
    let wrong = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for _ in 0..4 {
        let (url, missing, next, wrong) = (url.clone(), missing.clone(), next.clone(), wrong.clone());
        clients.push(tokio::task::spawn_blocking(move || {
            let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(30))).build().into();
            let mut first_wrong = None;
            while next.fetch_add(1, Ordering::SeqCst) < FAILING {
                let status =
                    agent.post(&url).send_json(json!({ "destination": missing, "delay": 1000, "body": "x" })).map(|r| r.status().as_u16()).unwrap_or(0);
                if status != 422 {
                    wrong.fetch_add(1, Ordering::SeqCst);
                    first_wrong.get_or_insert(status);
                }
            }
            first_wrong
        }));
    }
    let mut first_wrong = None;
    for client in clients {
        if let Ok(Some(status)) = client.await {
            first_wrong.get_or_insert(status);
        }
    }
    let wrong = wrong.load(Ordering::SeqCst);
    report.check(wrong == 0, || format!("{wrong} of {FAILING} answered other than 422 (first: {})", first_wrong.unwrap_or(0)));
    report.tally = canaries.finish(Duration::from_secs(15)).await.tally();
    report
}

async fn failing_ingress(bench: &Bench) -> Report {
    let mut report = Report::new("10,000 failing ingress messages in a row (missing destination)");
    let canaries = Canaries::start(&unique("c"), bench.setup.route(&bench.base));
    let missing = unique("missing");
    let stem = unique("fail");
    let mut confirms = Vec::with_capacity(FAILING);
    for n in 0..FAILING {
        let mut headers = FieldTable::default();
        headers.insert(ShortString::from("hourglass-destination"), text(&missing));
        headers.insert(ShortString::from("hourglass-delay"), text("1s"));
        let body = format!("{stem}-{n}");
        let properties = BasicProperties::default().with_delivery_mode(2).with_headers(headers);
        match bench.channel.basic_publish("".into(), bench.setup.ingress.as_str().into(), BasicPublishOptions::default(), body.as_bytes(), properties).await {
            Ok(confirm) => confirms.push(confirm),
            Err(err) => {
                report.problems.push(format!("publish {n} failed: {err}"));
                break;
            }
        }
    }
    let mut confirmed = 0;
    for confirm in confirms {
        confirmed += usize::from(matches!(confirm.await, Ok(c) if c.is_ack()));
    }
    report.check(confirmed == FAILING, || format!("{confirmed} of {FAILING} ingress publishes confirmed"));
    let end = Instant::now() + Duration::from_secs(120);
    let set_aside = || bench.invalid.lock().unwrap().keys().filter(|k| k.starts_with(&stem)).count();
    while set_aside() < confirmed && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let set_aside = set_aside();
    report.check(set_aside == confirmed, || format!("{set_aside} of {confirmed} on the invalid queue within 120 s"));
    // Canaries queued behind 10,000 refusals are late by the time those take.
    report.tally = canaries.finish(Duration::from_secs(60)).await.tally();
    report
}

pub async fn idle_connections() -> Vec<Report> {
    let mut report = Report::new("2,000 idle connection attempts (host limited to 1,024 descriptors)");
    let bench = match Bench::start("idle").await {
        Ok(bench) => bench,
        Err(err) => {
            report.problems.push(format!("case did not run: {err:#}"));
            return vec![report];
        }
    };
    let address: SocketAddr = format!("127.0.0.1:{}", bench.host.port()).parse().unwrap();
    let idle = tokio::task::spawn_blocking(move || {
        // A host that stops accepting leaves connects hanging: stop at the first that does not connect.
        (0..2000).map_while(|_| TcpStream::connect_timeout(&address, Duration::from_secs(2)).ok()).collect::<Vec<_>>()
    })
    .await
    .unwrap_or_default();
    // Beyond `service.max_connections` (512) connections wait in the kernel's
    // backlog and then are not accepted at all: the limit is the point. What
    // must hold is that the API keeps answering everyone else.
    eprintln!("   {} idle connections open (accepted or in the backlog)", idle.len());
    report.check(idle.len() >= 512, || format!("only {} idle connections could be opened; the case needs at least max_connections (512)", idle.len()));
    let canaries = Canaries::start(&unique("c"), bench.setup.route(&bench.base));
    tokio::time::sleep(Duration::from_secs(8)).await;
    let ready = bench.post(json!({ "destination": bench.setup.destination, "delay": 1000, "body": "probe" })).await.0;
    report.check(ready == 202, || format!("a request with 2,000 idle connections open got {ready}"));
    report.tally = canaries.finish(Duration::from_secs(15)).await.tally();
    drop(idle);
    drop(bench.host);
    let vhost = bench.vhost;
    let _ = tokio::task::spawn_blocking(move || drop(vhost)).await;
    vec![report]
}
