//! `POST /v1/messages` throughput on a real RabbitMQ against the scheduler
//! called directly, in the same run with the same concurrency. Needs RabbitMQ
//! on $HOURGLASS_AMQP_URL (default guest on 127.0.0.1:5672).
//! Run: `cargo bench -p hourglass --bench http`. Method: BENCHMARKS.md.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use hourglass::broker::Broker;
use hourglass::scheduler::{ScheduleRequest, Scheduler};
use hourglass::service::{self, Service};
use support::BenchBroker;

const CLIENTS: usize = 32;
const PER_CLIENT: usize = 250;
const BODY: &str = "a 100-byte body ......................................................................................";

/// Messages per second and latency percentiles over every message of a run.
fn report(mode: &str, elapsed: Duration, mut latencies: Vec<Duration>) {
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    println!(
        "  {mode:<8} {:>7.0} msg/s   p50 {:>6.2} ms   p99 {:>6.2} ms",
        latencies.len() as f64 / elapsed.as_secs_f64(),
        at(0.50).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3
    );
}

async fn direct(scheduler: Arc<Scheduler<Broker>>, destination: &str) {
    let start = Instant::now();
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let (scheduler, destination) = (scheduler.clone(), destination.to_string());
        clients.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(PER_CLIENT);
            for i in 0..PER_CLIENT {
                let request = ScheduleRequest { destination: destination.clone(), delay_ms: 3_600_000 + i as u64, body: BODY.into(), ..Default::default() };
                let sent = Instant::now();
                scheduler.schedule(request).await.expect("scheduled");
                latencies.push(sent.elapsed());
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for client in clients {
        latencies.extend(client.await.unwrap());
    }
    report("direct", start.elapsed(), latencies);
}

fn http(base: &str, destination: &str) {
    let start = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (url, destination) = (format!("{base}/v1/messages"), destination.to_string());
            std::thread::spawn(move || {
                let agent = ureq::Agent::new_with_defaults();
                let mut latencies = Vec::with_capacity(PER_CLIENT);
                for i in 0..PER_CLIENT {
                    let body = serde_json::json!({ "destination": destination, "delay": 3_600_000 + i, "body": BODY });
                    let sent = Instant::now();
                    let response = agent.post(&url).send_json(body).expect("POST");
                    assert_eq!(response.status().as_u16(), 202);
                    latencies.push(sent.elapsed());
                }
                latencies
            })
        })
        .collect();
    let latencies = clients.into_iter().flat_map(|c| c.join().unwrap()).collect();
    report("HTTP", start.elapsed(), latencies);
}

#[tokio::main]
async fn main() {
    let (bench, scheduler) = BenchBroker::start().await;
    let destination = bench.destination.clone();
    let service = Service::new(scheduler, None);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(service::run(listener, service.clone(), std::future::pending()));

    println!("{} persistent 100-byte messages per mode, binary-levels, 1 h delays, {CLIENTS} concurrent clients", CLIENTS * PER_CLIENT);
    for _round in 0..2 {
        direct(service.scheduler().clone(), &destination).await;
        let (base, destination) = (base.clone(), destination.clone());
        tokio::task::spawn_blocking(move || http(&base, &destination)).await.unwrap();
    }

    bench.cleanup().await;
}
