//! A million delayed messages pending: the host's memory stays flat (the
//! broker holds them), and messages sent with that many pending still arrive
//! on time. Runs the release `hourglass serve` as a child process and measures
//! its RSS. Needs RabbitMQ on $HOURGLASS_AMQP_URL (default guest on
//! 127.0.0.1:5672) with the management API on 15672.
//! Run: `cargo bench -p hourglass --bench pending [MESSAGES]`. Method: BENCHMARKS.md ("A million pending").

mod support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hourglass::broker::amqp_url;
use hourglass::config::Config;
use lapin::options::{ConfirmSelectOptions, QueueDeleteOptions};
use lapin::{Connection, ConnectionProperties};
use support::{collect_lateness, declare_queue, ingress_config_text, now_ms, percentile, publish_to_ingress};

/// Messages sent with the million pending, spread over this many seconds.
const SAMPLES: usize = 100;
const SAMPLE_SPREAD: Duration = Duration::from_secs(20);

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    kib / 1024.0
}

/// The broker node's memory use, from the management API.
fn broker_mib() -> f64 {
    let auth = format!("Basic {}", base64::Engine::encode(&base64::engine::general_purpose::STANDARD, "guest:guest"));
    let nodes: serde_json::Value = ureq::get("http://127.0.0.1:15672/api/nodes")
        .header("Authorization", &auth)
        .call()
        .ok()
        .and_then(|mut r| r.body_mut().read_json().ok())
        .unwrap_or_default();
    nodes[0]["mem_used"].as_f64().unwrap_or(0.0) / 1024.0 / 1024.0
}

fn forwarded(base: &str) -> u64 {
    let text = ureq::get(&format!("{base}/metrics")).call().ok().and_then(|mut r| r.body_mut().read_to_string().ok()).unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with("hourglass_ingress_messages_total") && l.contains("forwarded"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0) as u64
}

#[tokio::main]
async fn main() {
    let url = amqp_url(None, None);
    let messages: u64 = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(1_000_000);
    let connection = Connection::connect(&url, ConnectionProperties::default()).await.expect("RabbitMQ");
    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    let run = support::run_id();
    // Not under the strategy's prefix (`bench-pending-{run}.`), whose own queues (`.parked`, …) it declares itself.
    let (ingress, far, sampled) = (format!("bench-pending-{run}-in"), format!("bench-pending-{run}-far"), format!("bench-pending-{run}-sampled"));
    for queue in [&ingress, &far, &sampled] {
        declare_queue(&channel, queue, false).await;
    }
    let text = ingress_config_text(&url, &format!("bench-pending-{run}"), &ingress, "", "");
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("delay.toml");
    std::fs::write(&config_path, &text).unwrap();
    let config = Config::parse(Path::new("bench.toml"), text).expect("bench config");

    let mut host = Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .args(["--config", config_path.to_str().unwrap(), "serve", "--listen", "127.0.0.1:0"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("hourglass serve starts");
    let pid = host.id();
    let mut stderr = BufReader::new(host.stderr.take().unwrap());
    let base = loop {
        let mut line = String::new();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "hourglass serve ended before it served");
        eprint!("serve: {line}");
        if let Some(rest) = line.split("serving on ").nth(1) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    // Keep reading its log so the pipe never fills.
    std::thread::spawn(move || for _ in stderr.lines() {});
    let started_rss = rss_mib(pid);
    println!("{messages} messages to pending (delays 1–3 h, binary-levels, default quorum levels) through the ingress of `hourglass serve` (pid {pid})");
    println!("host RSS at start: {started_rss:.1} MiB; broker memory {:.0} MiB", broker_mib());
    println!("| pending | host RSS MiB | broker MiB | s since start |");
    println!("|---:|---:|---:|---:|");

    // Phase 1: a million delayed messages, published in windows of 1,000 confirms while the host drains them.
    let start = Instant::now();
    let producer = {
        let (channel, ingress, far) = (channel.clone(), ingress.clone(), far.clone());
        tokio::spawn(async move {
            let mut confirms = Vec::with_capacity(1_000);
            for i in 0..messages {
                confirms.push(publish_to_ingress(&channel, &ingress, &far, 3_600_000 + (i * 7_919) % 7_200_000, &[b'x'; 100]).await);
                if confirms.len() == 1_000 {
                    for confirm in confirms.drain(..) {
                        confirm.await.expect("confirm");
                    }
                }
            }
            for confirm in confirms {
                confirm.await.expect("confirm");
            }
        })
    };
    let (mut next_report, mut peak) = (0, started_rss);
    loop {
        let done = forwarded(&base);
        peak = peak.max(rss_mib(pid));
        if done >= next_report {
            println!("| {done} | {:.1} | {:.0} | {:.0} |", rss_mib(pid), broker_mib(), start.elapsed().as_secs_f64());
            next_report += messages / 5;
        }
        if done >= messages {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(1_800), "only {done} of {messages} forwarded in 30 min");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    producer.await.unwrap();
    let loaded_in = start.elapsed();

    // Phase 2: with them pending, messages of 5–15 s delays, one every 200 ms; lateness from each send.
    let arrivals = collect_lateness(connection.create_channel().await.unwrap(), &sampled, SAMPLES);
    for i in 0..SAMPLES as u64 {
        let delay = 5_000 + (i * 997) % 10_000;
        let due = (now_ms() + delay).to_string();
        publish_to_ingress(&channel, &ingress, &sampled, delay, due.as_bytes()).await.await.expect("confirm");
        peak = peak.max(rss_mib(pid));
        tokio::time::sleep(SAMPLE_SPREAD / SAMPLES as u32).await;
    }
    let lateness = arrivals.await.unwrap().from_send;
    println!(
        "\nloaded in {:.0} s ({:.0} msg/s through the ingress); host RSS now {:.1} MiB, peak {peak:.1} MiB; broker {:.0} MiB",
        loaded_in.as_secs_f64(),
        messages as f64 / loaded_in.as_secs_f64(),
        rss_mib(pid),
        broker_mib()
    );
    println!(
        "{} of {SAMPLES} sampled messages arrived with {messages} pending; early: {}; lateness p50 {} ms, p99 {} ms, max {} ms",
        lateness.len(),
        lateness.iter().filter(|&&ms| ms < 0).count(),
        percentile(&lateness, 0.5),
        percentile(&lateness, 0.99),
        lateness.last().unwrap()
    );

    Command::new("kill").args(["-TERM", &pid.to_string()]).status().expect("kill");
    host.wait().unwrap();
    for queue in [ingress.clone(), format!("{ingress}.invalid"), far, sampled] {
        channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await.ok();
    }
    support::delete_topology(&connection.create_channel().await.unwrap(), &config).await;
}
