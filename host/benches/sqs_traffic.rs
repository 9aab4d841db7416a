//! SQS at the traffic users have, each figure beside a plain aws-sdk-sqs
//! client doing the same work at the same time on the same server.
//!
//! Trickle: 20 messages a second for 60 s, as single `POST /v1/messages`
//! requests from 4 clients (open loop: each request leaves on its tick, as a
//! web service's requests do, whatever the previous one's answer time; each
//! client keeps a pool of keep-alive connections), to 10
//! destinations, 105 s delays, 30 s cycles (three pump visits each). The raw
//! client sends the same messages one `SendMessage` each and pumps them with
//! [`sqs_support::raw_pump`]. Both go through counting proxies, so requests
//! are counted as SQS would bill them, by action.
//!
//! Burst: 1,000 messages of 12 s scheduled at once to one destination through
//! 3 s cycles, hourglass and the raw client side by side.
//!
//! Run: `scripts/bench-sqs` (starts moto, runs both SQS benches). Knobs:
//! `BENCH_SHARED_DELAY_QUEUE=0` gives each destination its own delay queue;
//! `BENCH_SEND_WINDOW` (default 500ms) is `broker.send_batch_window`;
//! `BENCH_PUMP_LINGER` (default 2s) is `service.pump_linger`; `BENCH_BURST=0`
//! runs the trickle alone.
//!
//! Beside each count it prints what `hourglass plan --rate` estimates for the
//! same shape ([`hourglass::broker::sqs::traffic`]), at the round trip measured on the
//! server just before.

mod sqs_support;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hourglass::broker::sqs::traffic::{self, Handling, Traffic};
use hourglass::clock::unix_now_ms;
use hourglass::config::Config;
use hourglass::scheduler::ScheduleRequest;
use hourglass::service::{self, Service};
use sqs_support::*;
use tokio::sync::watch;

const TRICKLE_RATE: u64 = 20;
const TRICKLE_CLIENTS: u64 = 4;
/// 60 s; `BENCH_TRICKLE_SECONDS` shortens it for a quick look.
fn trickle_seconds() -> u64 {
    std::env::var("BENCH_TRICKLE_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(60)
}
const TRICKLE_DESTINATIONS: usize = 10;
const TRICKLE_DELAY_MS: u64 = 105_000;
const TRICKLE_CYCLE_SECONDS: u64 = 30;
const TRICKLE_VISITS: u64 = 3;
const BURST_MESSAGES: usize = 1_000;
const BURST_DELAY_MS: u64 = 12_000;
const BURST_CYCLE_SECONDS: u64 = 3;
/// Visits at 3, 6 and 9 s; the last hands over with 3 s to go.
const BURST_VISITS: u64 = 3;
/// Body and attributes of one bench message, for the estimate's bundle sizes.
const MESSAGE_BYTES: u64 = 300;

fn main() {
    // The host's warnings (a pump that lags, a send retried) belong in the bench's output.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let upstream = endpoint();
    tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(run(&upstream));
}

async fn run(upstream: &str) {
    let run = run_id();
    let shared = std::env::var("BENCH_SHARED_DELAY_QUEUE").map_or(true, |v| v != "0");
    let window = std::env::var("BENCH_SEND_WINDOW").unwrap_or_else(|_| "500ms".into());
    // docs/sqs.md's recipe for a trickle: a shared delay queue, a 500 ms send window, a 2 s linger.
    let pump_linger = std::env::var("BENCH_PUMP_LINGER").unwrap_or_else(|_| "2s".into());
    let linger = format!("pump_linger = \"{pump_linger}\"\n");
    let milliseconds = |text: &str| hourglass_planner_sdk::parse_duration_ms(text).expect("a duration like 500ms") as f64;
    let handling = |cycle_seconds: u64, visits: u64, round_trip_ms: f64| Handling {
        shared_delay_queue: shared,
        send_window_ms: milliseconds(&window),
        linger_ms: milliseconds(&pump_linger),
        round_trip_ms,
        // moto's long poll looks again each second unless a send wakes it.
        notice_ms: 1_000.0,
        cycle_ms: (cycle_seconds * 1_000) as f64,
        pump_visits: visits,
    };
    let (hourglass_proxy, raw_proxy) = (CountingProxy::start(upstream).await, CountingProxy::start(upstream).await);
    let direct = client(upstream);
    let raw = client(&raw_proxy.endpoint);

    let (trickle, burst) = (format!("bench-{run}-trickle"), format!("bench-{run}-burst"));
    // idle_timeout: on the local server a first send can wait a minute for its
    // confirm (see BENCHMARKS.md), longer than the default would keep a silent connection.
    let shared_queue = |name: &str| if shared { format!("delay_queue = \"{name}-delay.fifo\"\n") } else { String::new() };
    let text = format!(
        "default_strategy = \"{trickle}\"\n[broker]\nkind = \"sqs\"\nendpoint_url = \"{}\"\nsend_batch_window = \"{window}\"\n[service]\nidle_timeout = \"300s\"\n{linger}\
         [service.sqs_ingress]\nenabled = false\n[service.canary]\nenabled = false\n\
         [strategies.{trickle}]\nplanner = \"sqs-cycles\"\ncycle = \"{TRICKLE_CYCLE_SECONDS}s\"\n{}\
         [strategies.{burst}]\nplanner = \"sqs-cycles\"\ncycle = \"{BURST_CYCLE_SECONDS}s\"\n{}",
        hourglass_proxy.endpoint,
        shared_queue(&trickle),
        shared_queue(&burst),
    );
    let config = Config::parse(Path::new("bench-sqs-traffic.toml"), text).unwrap();
    let service = Service::start(config).await.expect("serve on the local SQS server");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(service::run(listener, service.clone(), std::future::pending()));
    let (stop, stopped) = watch::channel(false);
    let mut queues = Vec::new();

    // Trickle.
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    for d in 0..TRICKLE_DESTINATIONS {
        ours.push(create_destination(&direct, &format!("bench-{run}-t{d}")).await);
        theirs.push(create_destination(&direct, &format!("bench-{run}-raw-t{d}")).await);
    }
    let raw_delay_queue = create_raw_delay_queue(&direct, &format!("bench-{run}-raw-trickle-delay.fifo"), Duration::from_secs(TRICKLE_CYCLE_SECONDS)).await;
    tokio::spawn(raw_pump(raw.clone(), raw_delay_queue.clone(), Duration::from_secs(TRICKLE_CYCLE_SECONDS), stopped.clone()));
    let mut our_arrivals = consume_all(&direct, &ours);
    let mut their_arrivals = consume_all(&direct, &theirs);
    let their_urls: Vec<String> = futures_util::future::join_all(theirs.iter().map(|q| url_of(&direct, q))).await;
    let round_trip_ms = round_trip(&direct, &their_urls[0]).await;
    let (before_ours, before_theirs) = (hourglass_proxy.snapshot(), raw_proxy.snapshot());
    println!(
        "## Trickle: {TRICKLE_RATE} msg/s for {} s from {TRICKLE_CLIENTS} clients, {TRICKLE_DESTINATIONS} destinations, {} s delays, {TRICKLE_CYCLE_SECONDS} s cycles ({}; send_batch_window {window}, pump_linger {pump_linger})\n",
        trickle_seconds(),
        TRICKLE_DELAY_MS / 1_000,
        if shared { "one delay queue for the strategy" } else { "a delay queue per destination" }
    );
    let (our_due, their_due) = tokio::join!(trickle_http(address, &trickle, &ours), trickle_raw(&raw, &raw_delay_queue, &their_urls, &run));
    let patience = Duration::from_secs(120);
    let (our_late, their_late) = tokio::join!(collect(&mut our_arrivals, &our_due, patience), collect(&mut their_arrivals, &their_due, patience));
    // The pumps' last deletes go out right after their hand-overs arrive.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (spent_ours, spent_theirs) = (since(&hourglass_proxy.snapshot(), &before_ours), since(&raw_proxy.snapshot(), &before_theirs));
    report(&spent_ours, &spent_theirs, (our_due.len(), their_due.len()), TRICKLE_VISITS, &our_late, &their_late);
    let accepted = Traffic {
        messages: our_due.len() as u64,
        rate_per_second: TRICKLE_RATE as f64,
        destinations: TRICKLE_DESTINATIONS as u64,
        message_bytes: MESSAGE_BYTES,
    };
    print_estimate(&accepted, &handling(TRICKLE_CYCLE_SECONDS, TRICKLE_VISITS, round_trip_ms), round_trip_ms);
    let mut answers = std::mem::take(&mut *ANSWER_MS.lock().unwrap());
    answers.sort_unstable();
    println!(
        "POST answered after: p50 {} ms, p99 {} ms, max {} ms; {} answered 503 (SQS did not confirm within 30 s: not counted as accepted)",
        percentile(&answers, 0.5),
        percentile(&answers, 0.99),
        answers.last().copied().unwrap_or(0),
        REFUSED.load(std::sync::atomic::Ordering::Relaxed)
    );
    pump_counts(&service, &trickle);
    queues.extend(ours.iter().cloned().chain(theirs.iter().cloned()));
    queues.push(format!("bench-{run}-raw-trickle-delay.fifo"));

    if std::env::var("BENCH_BURST").is_ok_and(|v| v == "0") {
        stop.send(true).ok();
        let delay_queues = [trickle.clone()]
            .into_iter()
            .chain(queues.iter().cloned())
            .flat_map(|q| [format!("{q}-delay.fifo"), format!("{q}-delay-dlq.fifo")])
            .collect::<Vec<_>>();
        delete_queues(&direct, queues.into_iter().chain(delay_queues)).await;
        return;
    }

    // Burst.
    let ours = create_destination(&direct, &format!("bench-{run}-b")).await;
    let theirs = create_destination(&direct, &format!("bench-{run}-raw-b")).await;
    let their_url = url_of(&direct, &theirs).await;
    let raw_delay_queue = create_raw_delay_queue(&direct, &format!("bench-{run}-raw-burst-delay.fifo"), Duration::from_secs(BURST_CYCLE_SECONDS)).await;
    tokio::spawn(raw_pump(raw.clone(), raw_delay_queue.clone(), Duration::from_secs(BURST_CYCLE_SECONDS), stopped.clone()));
    // The destination's set-up (delay queue, pump) is not part of the burst.
    service.scheduler().prepare_destination(&burst, &ours).await.expect("prepare the burst's destination");
    let mut our_arrivals = consume_all(&direct, std::slice::from_ref(&ours));
    let mut their_arrivals = consume_all(&direct, std::slice::from_ref(&theirs));
    let (before_ours, before_theirs) = (hourglass_proxy.snapshot(), raw_proxy.snapshot());
    println!("\n## Burst: {BURST_MESSAGES} messages of {} s at once to one destination, {BURST_CYCLE_SECONDS} s cycles\n", BURST_DELAY_MS / 1_000);
    let (our_due, their_due) = tokio::join!(burst_hourglass(&service, &burst, &ours), burst_raw(&raw, &raw_delay_queue, &their_url, &run));
    let patience = Duration::from_secs(60);
    let (our_late, their_late) = tokio::join!(collect(&mut our_arrivals, &our_due, patience), collect(&mut their_arrivals, &their_due, patience));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (spent_ours, spent_theirs) = (since(&hourglass_proxy.snapshot(), &before_ours), since(&raw_proxy.snapshot(), &before_theirs));
    report(&spent_ours, &spent_theirs, (our_due.len(), their_due.len()), BURST_VISITS, &our_late, &their_late);
    let accepted = Traffic { messages: our_due.len() as u64, rate_per_second: f64::INFINITY, destinations: 1, message_bytes: MESSAGE_BYTES };
    print_estimate(&accepted, &handling(BURST_CYCLE_SECONDS, BURST_VISITS, round_trip_ms), round_trip_ms);
    pump_counts(&service, &burst);
    queues.extend([ours, theirs, format!("bench-{run}-raw-burst-delay.fifo")]);

    stop.send(true).ok();
    // The strategies' delay queues: shared, or (BENCH_SHARED_DELAY_QUEUE=0) one per destination.
    let delay_queue_stems: Vec<String> = [trickle.clone(), burst.clone()].into_iter().chain(queues.iter().cloned()).collect();
    let delay_queues = delay_queue_stems.iter().flat_map(|q| [format!("{q}-delay.fifo"), format!("{q}-delay-dlq.fifo")]).collect::<Vec<_>>();
    delete_queues(&direct, queues.into_iter().chain(delay_queues)).await;
}

/// Requests by action side by side, per message per cycle (each side's
/// accepted messages), and lateness with its ratio to the raw client's.
fn report(ours: &Counts, theirs: &Counts, (our_messages, their_messages): (usize, usize), visits: u64, our_late: &[i64], their_late: &[i64]) {
    println!("| action | hourglass | raw client |\n|---|---:|---:|");
    let actions: std::collections::BTreeSet<&String> = ours.keys().chain(theirs.keys()).collect();
    for action in actions {
        println!("| {action} | {} | {} |", ours.get(action).copied().unwrap_or(0), theirs.get(action).copied().unwrap_or(0));
    }
    let per = |counts: &Counts, messages: usize| message_requests(counts) as f64 / (messages.max(1) as u64 * visits) as f64;
    println!(
        "\nrequests that move messages, per message per cycle (first sends included; set-up apart: {} and {}): hourglass {:.3}, raw client {:.3}",
        setup_requests(ours),
        setup_requests(theirs),
        per(ours, our_messages),
        per(theirs, their_messages)
    );
    println!("hourglass: arrived {} of {our_messages}; {}", our_late.len(), summary(our_late));
    println!("raw client: arrived {} of {their_messages}; {}", their_late.len(), summary(their_late));
    let ratio = |q| percentile(our_late, q) as f64 / percentile(their_late, q).max(1) as f64;
    println!("lateness, hourglass / raw client: p50 {:.2}×, p99 {:.2}×", ratio(0.5), ratio(0.99));
}

/// What `hourglass plan --rate` estimates for the accepted messages.
fn print_estimate(accepted: &Traffic, handling: &Handling, round_trip_ms: f64) {
    let estimate = traffic::requests(accepted, handling);
    println!(
        "hourglass plan's estimate at a {round_trip_ms:.0} ms round trip: {:.3} per message per cycle ({estimate:?})",
        estimate.per_message_per_cycle(accepted.messages, handling.pump_visits)
    );
}

/// The median time of an empty receive that does not wait, before the run.
async fn round_trip(client: &aws_sdk_sqs::Client, url: &str) -> f64 {
    let mut times = Vec::new();
    for _ in 0..11 {
        let started = std::time::Instant::now();
        client.receive_message().queue_url(url).wait_time_seconds(0).send().await.ok();
        times.push(started.elapsed().as_secs_f64() * 1_000.0);
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// `TRICKLE_CLIENTS` clients, each sending its share of `TRICKLE_RATE` a
/// second for `trickle_seconds()`, each message on a task of its own (open
/// loop: a slow answer does not hold the next send back). `send(c, n)` sends
/// client `c`'s `n`-th message and gives its body and due time, or `None` when
/// it was not accepted; the due times by body.
async fn open_loop<F, Fut>(send: F) -> HashMap<String, u64>
where
    F: Fn(u64, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Option<(String, u64)>> + Send + 'static,
{
    let every = Duration::from_micros(1_000_000 * TRICKLE_CLIENTS / TRICKLE_RATE);
    let per_client = TRICKLE_RATE * trickle_seconds() / TRICKLE_CLIENTS;
    let send = Arc::new(send);
    let clients = (0..TRICKLE_CLIENTS).map(|c| {
        let send = send.clone();
        tokio::spawn(async move {
            // Clients start spread over one interval, so together they tick evenly.
            tokio::time::sleep(every * c as u32 / TRICKLE_CLIENTS as u32).await;
            let mut ticks = tokio::time::interval(every);
            let mut sends = Vec::new();
            for n in 0..per_client {
                ticks.tick().await;
                sends.push(tokio::spawn(send(c, n)));
            }
            let mut due = Vec::new();
            for sent in sends {
                due.extend(sent.await.unwrap());
            }
            due
        })
    });
    let mut due = HashMap::new();
    for client in futures_util::future::join_all(clients).await {
        due.extend(client.unwrap());
    }
    due
}

/// hourglass's trickle: one `POST` per message, each client on its pool of keep-alive connections.
async fn trickle_http(address: std::net::SocketAddr, strategy: &str, destinations: &[String]) -> HashMap<String, u64> {
    let pools: Vec<Pool> = (0..TRICKLE_CLIENTS).map(|_| Pool::default()).collect();
    let (strategy, destinations) = (strategy.to_string(), destinations.to_vec());
    open_loop(move |c, n| {
        let body = format!("h-{c}-{n}");
        let destination = destinations[((n + c) as usize) % destinations.len()].clone();
        let json = serde_json::json!({ "destination": destination, "delay": TRICKLE_DELAY_MS, "body": body, "strategy": strategy });
        let pool = pools[c as usize].clone();
        async move { post(&pool, address, json).await.map(|due_at| (body, due_at)) }
    })
    .await
}

/// How long each `POST` took to be answered (the broker's confirm included), in ms.
static ANSWER_MS: std::sync::Mutex<Vec<i64>> = std::sync::Mutex::new(Vec::new());

/// A client's idle keep-alive connections: a request takes one or opens a new
/// one, and gives it back after its answer, as an HTTP client library's pool does.
type Pool = Arc<std::sync::Mutex<Vec<hyper::client::conn::http1::SendRequest<http_body_util::Full<axum::body::Bytes>>>>>;

/// POSTs answered 503 (SQS did not confirm in time): not accepted, so not expected to arrive.
static REFUSED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// One `POST /v1/messages` on an idle connection of `pool` or a new one; the
/// answer's `due_at`, or `None` when it was 503 (counted in [`REFUSED`]).
async fn post(pool: &Pool, address: std::net::SocketAddr, json: serde_json::Value) -> Option<u64> {
    let started = std::time::Instant::now();
    let idle = pool.lock().unwrap().pop();
    let mut sender = match idle {
        Some(sender) if sender.is_ready() => sender,
        _ => {
            let stream = tokio::net::TcpStream::connect(address).await.expect("connect");
            let (sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.expect("handshake");
            tokio::spawn(connection);
            sender
        }
    };
    let request = hyper::Request::post("/v1/messages")
        .header("host", address.to_string())
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(axum::body::Bytes::from(json.to_string())))
        .unwrap();
    let response = match sender.send_request(request).await {
        Ok(response) => response,
        Err(err) => panic!("POST {json} at {} ms: {err:?}", unix_now_ms()),
    };
    let status = response.status();
    let body = http_body_util::BodyExt::collect(response.into_body()).await.expect("answer").to_bytes();
    if status == hyper::StatusCode::SERVICE_UNAVAILABLE {
        REFUSED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        pool.lock().unwrap().push(sender);
        return None;
    }
    assert!(status.is_success(), "POST answered {status}: {}", String::from_utf8_lossy(&body));
    pool.lock().unwrap().push(sender);
    ANSWER_MS.lock().unwrap().push(started.elapsed().as_millis() as i64);
    Some(serde_json::from_slice::<serde_json::Value>(&body).unwrap()["due_at"].as_u64().expect("due_at"))
}

/// The raw client's trickle: the same rate and clients, one `SendMessage` each into its delay queue.
async fn trickle_raw(client: &aws_sdk_sqs::Client, delay_queue: &str, destinations: &[String], run: &str) -> HashMap<String, u64> {
    let (client, delay_queue, destinations, run) = (client.clone(), delay_queue.to_string(), destinations.to_vec(), run.to_string());
    open_loop(move |c, n| {
        let body = format!("r-{run}-{c}-{n}");
        let destination = destinations[((n + c) as usize) % destinations.len()].clone();
        let (client, delay_queue) = (client.clone(), delay_queue.clone());
        async move {
            let due = unix_now_ms() + TRICKLE_DELAY_MS;
            let entry = raw_cycle_entry(&body, &body, due, &destination, 0);
            client
                .send_message()
                .queue_url(&delay_queue)
                .message_body(&body)
                .message_group_id(entry.message_group_id().unwrap_or_default())
                .message_deduplication_id(entry.message_deduplication_id().unwrap_or_default())
                .set_message_attributes(entry.message_attributes().cloned())
                .send()
                .await
                .expect("raw SendMessage");
            Some((body, due))
        }
    })
    .await
}

/// The burst through hourglass's scheduler, all at once; due times by body.
async fn burst_hourglass(service: &Arc<Service>, strategy: &str, destination: &str) -> HashMap<String, u64> {
    let sends = (0..BURST_MESSAGES).map(|n| {
        let body = format!("hb-{n}");
        let request = ScheduleRequest {
            destination: destination.to_string(),
            delay_ms: BURST_DELAY_MS,
            body: body.clone().into_bytes(),
            strategy: Some(strategy.to_string()),
            ..Default::default()
        };
        // Not confirmed in time (503 over HTTP): not accepted, so not expected.
        async move { service.scheduler().schedule(request).await.ok().map(|scheduled| (body, scheduled.due_at_ms)) }
    });
    futures_util::future::join_all(sends).await.into_iter().flatten().collect()
}

/// The raw client's burst: the same messages in batches of ten, all at once.
async fn burst_raw(client: &aws_sdk_sqs::Client, delay_queue: &str, destination: &str, run: &str) -> HashMap<String, u64> {
    let due = unix_now_ms() + BURST_DELAY_MS;
    let bodies: Vec<String> = (0..BURST_MESSAGES).map(|n| format!("rb-{run}-{n}")).collect();
    let entries = bodies.iter().map(|body| raw_cycle_entry(body, body, due, destination, 0)).collect();
    raw_send(client, delay_queue, entries).await;
    bodies.into_iter().map(|body| (body, due)).collect()
}

/// The pump's own counts for the queues of `strategy` (visits, bundles, redeliveries, empty polls), as `/metrics` has them.
fn pump_counts(service: &Service, strategy: &str) {
    let text = service.metrics.encode();
    let counts: Vec<&str> = text.lines().filter(|l| l.starts_with("hourglass_pump") && l.contains(strategy)).collect();
    println!("pump counts:\n  {}", counts.join("\n  "));
}
