//! `POST /v1/messages` throughput on a real RabbitMQ against the scheduler
//! called directly, in the same run with the same concurrency. Needs RabbitMQ
//! on $HOURGLASS_AMQP_URL (default guest on 127.0.0.1:5672).
//! Run: `cargo bench -p hourglass --bench http`. Method: BENCHMARKS.md.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use hourglass::executor::Broker;
use hourglass::scheduler::{ScheduleRequest, Scheduler};
use hourglass::service::{self, Service};
use support::{BenchBroker, CpuClock};

const CLIENTS: usize = 32;
/// Messages each client sends per mode and round; `BENCH_PER_CLIENT` overrides.
const PER_CLIENT: usize = 250;

fn per_client() -> usize {
    std::env::var("BENCH_PER_CLIENT").ok().and_then(|v| v.parse().ok()).unwrap_or(PER_CLIENT)
}
/// Rounds of both modes; the median ratio is reported.
const ROUNDS: usize = 5;
const BODY: &str = "a 100-byte body ......................................................................................";

/// Messages per second, latency percentiles over every message of a run, and
/// CPU per message of the bench process (server, clients and scheduler
/// together) and of the broker.
fn report(mode: &str, elapsed: Duration, cpu: &CpuClock, mut latencies: Vec<Duration>) -> f64 {
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    let rate = latencies.len() as f64 / elapsed.as_secs_f64();
    let now = CpuClock::now();
    let (own_us, broker_us) = now.per_message_since(cpu, latencies.len());
    let switches = now.switches_per_message_since(cpu, latencies.len());
    println!(
        "  {mode:<8} {rate:>7.0} msg/s   p50 {:>6.2} ms   p99 {:>6.2} ms   CPU/msg {own_us:>5.1} µs bench, {broker_us:>5.1} µs broker   {switches:.1} switches/msg",
        at(0.50).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3
    );
    rate
}

/// Runs `CLIENTS` clients at once, each made by `client` and returning its
/// latencies, and reports the mode's rate over all of them.
async fn measure<F>(mode: &str, client: impl Fn() -> F) -> f64
where
    F: Future<Output = Vec<Duration>> + Send + 'static,
{
    let cpu = CpuClock::now();
    let start = Instant::now();
    let clients: Vec<_> = (0..CLIENTS).map(|_| tokio::spawn(client())).collect();
    let mut latencies = Vec::with_capacity(CLIENTS * per_client());
    for client in clients {
        latencies.extend(client.await.unwrap());
    }
    report(mode, start.elapsed(), &cpu, latencies)
}

/// `CLIENTS` tasks calling `Scheduler::schedule`, one message at a time each.
async fn direct(scheduler: Arc<Scheduler<Broker>>, destination: &str) -> f64 {
    measure("direct", || {
        let (scheduler, destination) = (scheduler.clone(), destination.to_string());
        async move {
            let mut latencies = Vec::with_capacity(per_client());
            for i in 0..per_client() {
                let request = ScheduleRequest { destination: destination.clone(), delay_ms: 3_600_000 + i as u64, body: BODY.into(), ..Default::default() };
                let sent = Instant::now();
                scheduler.schedule(request).await.expect("scheduled");
                latencies.push(sent.elapsed());
            }
            latencies
        }
    })
    .await
}

/// `CLIENTS` tasks, each on its own keep-alive HTTP/1.1 connection (hyper),
/// sending `POST /v1/messages` one at a time and checking for `202`.
async fn http(address: std::net::SocketAddr, destination: &str) -> f64 {
    measure("HTTP", || {
        let destination = destination.to_string();
        async move {
            let stream = tokio::net::TcpStream::connect(address).await.expect("connect");
            stream.set_nodelay(true).unwrap();
            let (mut sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.expect("handshake");
            tokio::spawn(connection);
            let mut latencies = Vec::with_capacity(per_client());
            for i in 0..per_client() {
                let body = serde_json::json!({ "destination": destination, "delay": 3_600_000 + i, "body": BODY }).to_string();
                let request = hyper::Request::post("/v1/messages")
                    .header("host", address.to_string())
                    .header("content-type", "application/json")
                    .body(http_body_util::Full::new(axum::body::Bytes::from(body)))
                    .unwrap();
                let sent = Instant::now();
                let response = sender.send_request(request).await.expect("POST");
                assert_eq!(response.status().as_u16(), 202);
                http_body_util::BodyExt::collect(response.into_body()).await.expect("response body");
                latencies.push(sent.elapsed());
            }
            latencies
        }
    })
    .await
}

#[tokio::main]
async fn main() {
    let (bench, scheduler) = BenchBroker::start().await;
    let destination = bench.destination.clone();
    let service = Service::new(scheduler, None);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(service::run(listener, service.clone(), std::future::pending()));

    println!("{} persistent 100-byte messages per mode, binary-levels, 1 h delays, {CLIENTS} concurrent clients", CLIENTS * per_client());
    // Rounds alternate which mode goes first, so a broker that slows as its queues fill favours neither.
    let mut ratios = Vec::new();
    for round in 0..ROUNDS {
        let (direct_rate, http_rate) = if round % 2 == 0 {
            let direct_rate = direct(service.scheduler().clone(), &destination).await;
            (direct_rate, http(address, &destination).await)
        } else {
            let http_rate = http(address, &destination).await;
            (direct(service.scheduler().clone(), &destination).await, http_rate)
        };
        println!("  round {}: HTTP at {:.0} % of direct", round + 1, 100.0 * http_rate / direct_rate);
        ratios.push(http_rate / direct_rate);
    }
    ratios.sort_by(f64::total_cmp);
    println!("median HTTP / direct over {ROUNDS} rounds: {:.0} %", 100.0 * ratios[ROUNDS / 2]);

    bench.cleanup().await;
}
