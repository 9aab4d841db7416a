//! SQS cycles on the local SQS server: what a message costs in requests, and
//! whether lateness drifts with the number of cycles.
//!
//! Run with a local SQS server named by `AWS_ENDPOINT_URL_SQS` (scripts/bench-sqs
//! starts moto and runs this). `hourglass serve` runs in-process with its
//! pumps; a consumer of its own drains the destinations and times arrivals.
//!
//! Phase 1 (cost): 1,000 messages of 105 s on 30 s cycles (three pump visits
//! each: two re-sends and the hand-over) to ten destinations,
//! scheduled 100 at a time; every request the host made, by action, per
//! message, per planned cycle and per pump visit counted.
//! Phase 2 (drift): 50 messages of 2 s (no cycle) and 50 of 51 s (five
//! cycles) scheduled together; lateness from the due time of each group.
//!
//! moto slows with queue depth, so lateness here is an upper bound of the
//! mechanism's; the request counts do not depend on the server's speed.

mod sqs_support;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hourglass::broker::sqs::SqsExecutor;
use hourglass::broker::sqs::metrics::RequestSnapshot;
use hourglass::config::Config;
use hourglass::scheduler::ScheduleRequest;
use hourglass::service::Service;
use sqs_support::{collect, consume, consume_all, create_destination, delete_queues, endpoint, percentile, run_id, summary};

/// Cost phase: cycles long enough that the pumps' lag on moto (seconds when
/// 100 messages fall due at once) never costs a message one of its visits.
const COST_CYCLE_SECONDS: u64 = 30;
/// Drift phase.
const CYCLE_SECONDS: u64 = 10;
const COST_MESSAGES: usize = 1_000;
const COST_DELAY_MS: u64 = 105_000;
const COST_DESTINATIONS: usize = 10;
const DRIFT_MESSAGES: usize = 50;

fn main() {
    let endpoint = endpoint();
    tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(run(&endpoint));
}

async fn run(endpoint: &str) {
    let run = run_id();
    let (cost, drift) = (format!("bench-{run}-cost"), format!("bench-{run}-drift"));
    // `BENCH_PUMP_LINGER=0ms` compares the pump without its linger.
    let linger = std::env::var("BENCH_PUMP_LINGER").map(|l| format!("pump_linger = \"{l}\"\n")).unwrap_or_default();
    let text = format!(
        "default_strategy = \"{drift}\"\n[broker]\nkind = \"sqs\"\nendpoint_url = \"{endpoint}\"\n[service]\n{linger}\
         [service.sqs_ingress]\nenabled = false\n[service.canary]\nenabled = false\n\
         [strategies.{cost}]\nplanner = \"sqs-cycles\"\ncycle = \"{COST_CYCLE_SECONDS}s\"\n\
         [strategies.{drift}]\nplanner = \"sqs-cycles\"\ncycle = \"{CYCLE_SECONDS}s\"\n"
    );
    let config = Config::parse(Path::new("bench-sqs.toml"), text).unwrap();
    let service = Service::start(config).await.expect("serve on the local SQS server");
    let sqs = service.scheduler().executor().downcast::<SqsExecutor>().expect("an SQS broker");
    let client = sqs.client().clone();
    let requests = sqs.requests.clone();

    // Phase 1: cost.
    let before = requests.snapshot();
    let visits_before = pump_visits(&service);
    let empty_before = metric_sum(&service, "hourglass_pump_empty_polls_total");
    let mut due = HashMap::new();
    let mut cost_destinations = Vec::new();
    for d in 0..COST_DESTINATIONS {
        cost_destinations.push(create_destination(&client, &format!("bench-{run}-cost{d}")).await);
    }
    let mut all = consume_all(&client, &cost_destinations);
    let scheduled = futures_util::future::join_all(
        cost_destinations.iter().map(|destination| schedule(&service, Some(&cost), destination, COST_MESSAGES / COST_DESTINATIONS, COST_DELAY_MS)),
    )
    .await;
    scheduled.into_iter().for_each(|group| due.extend(group));
    let lateness = collect(&mut all, &due, Duration::from_secs(180)).await;
    // The pump's last deletes go out right after its hand-overs arrive.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let spent = requests.snapshot().since(&before);
    let visits = pump_visits(&service) - visits_before;
    let empty_polls = metric_sum(&service, "hourglass_pump_empty_polls_total") - empty_before;
    let cycles = 3;
    let moving = spent.message_requests();
    println!(
        "## SQS cost: {COST_MESSAGES} messages of {} s on {COST_CYCLE_SECONDS} s cycles ({cycles} pump visits each when on time), {COST_DESTINATIONS} destinations\n",
        COST_DELAY_MS / 1_000
    );
    println!("| action | requests | per message |\n|---|---:|---:|");
    for (action, count) in [
        ("SendMessageBatch (first sends, re-sends, hand-overs)", spent.send_message_batch),
        ("SendMessage", spent.send_message),
        ("ReceiveMessage (including empty long polls)", spent.receive_message),
        ("DeleteMessageBatch", spent.delete_message_batch),
        ("ChangeMessageVisibilityBatch", spent.change_message_visibility_batch),
        ("setup (GetQueueUrl, CreateQueue, attributes, tags, listing)", setup(&spent)),
    ] {
        println!("| {action} | {count} | {:.3} |", count as f64 / COST_MESSAGES as f64);
    }
    println!(
        "\nmessage requests per message per cycle (first sends counted): {:.3}  (target ≤ 0.35); per pump visit counted ({visits} visits): {:.3}",
        moving as f64 / (COST_MESSAGES * cycles) as f64,
        moving as f64 / visits.max(1) as f64
    );
    println!(
        "of the receives, {empty_polls} long polls came back empty (idle pumps); without them, per pump visit: {:.3}",
        (moving - empty_polls) as f64 / visits.max(1) as f64
    );
    println!("arrived {} of {COST_MESSAGES}; {}\n", lateness.len(), summary(&lateness));

    // Phase 2: drift, both groups in one run.
    let direct = create_destination(&client, &format!("bench-{run}-direct")).await;
    let cycled = create_destination(&client, &format!("bench-{run}-cycled")).await;
    let (direct_arrivals, cycled_arrivals) = (consume(client.clone(), direct.clone()), consume(client.clone(), cycled.clone()));
    let (direct_due, cycled_due) = tokio::join!(
        schedule(&service, None, &direct, DRIFT_MESSAGES, 2_000),
        schedule(&service, None, &cycled, DRIFT_MESSAGES, 5 * CYCLE_SECONDS * 1_000 + 1_000)
    );
    let (mut direct_arrivals, mut cycled_arrivals) = (direct_arrivals, cycled_arrivals);
    let (direct_late, cycled_late) =
        tokio::join!(collect(&mut direct_arrivals, &direct_due, Duration::from_secs(60)), collect(&mut cycled_arrivals, &cycled_due, Duration::from_secs(90)));
    println!("## Lateness after 0 and after 5 cycles, same run ({DRIFT_MESSAGES} messages each)\n");
    println!("| group | arrived | early | p50 ms | p99 ms | max ms |\n|---|---:|---:|---:|---:|---:|");
    for (group, late) in [("2 s, no cycle (DelaySeconds)", &direct_late), ("51 s, five 10 s cycles", &cycled_late)] {
        println!(
            "| {group} | {} | {} | {} | {} | {} |",
            late.len(),
            late.iter().filter(|l| **l < 0).count(),
            percentile(late, 0.5),
            percentile(late, 0.99),
            late.last().copied().unwrap_or_default()
        );
    }
    println!(
        "\ndrift (p50 after five cycles − p50 after none): {} ms; p99: {} ms  (target ≤ 1,000 ms)",
        percentile(&cycled_late, 0.5) - percentile(&direct_late, 0.5),
        percentile(&cycled_late, 0.99) - percentile(&direct_late, 0.99)
    );
    let queues = cost_destinations.into_iter().chain([direct, cycled]);
    delete_queues(&client, queues.flat_map(|queue| [format!("{queue}-delay.fifo"), format!("{queue}-delay-dlq.fifo"), queue])).await;
}

/// Schedules `count` messages of `delay_ms` to `destination`, 100 at a time; their due times by body.
async fn schedule(service: &Arc<Service>, strategy: Option<&str>, destination: &str, count: usize, delay_ms: u64) -> HashMap<String, u64> {
    let mut due = HashMap::new();
    for chunk in (0..count).collect::<Vec<_>>().chunks(100) {
        let sends = chunk.iter().map(|i| {
            let body = format!("{destination}-{i}");
            let request = ScheduleRequest {
                destination: destination.to_string(),
                delay_ms,
                body: body.clone().into_bytes(),
                strategy: strategy.map(str::to_string),
                ..Default::default()
            };
            async move { (body, service.scheduler().schedule(request).await.expect("schedule").due_at_ms) }
        });
        due.extend(futures_util::future::join_all(sends).await);
    }
    due
}

/// Pump visits so far (re-sends and hand-overs), as `/metrics` counts them.
fn pump_visits(service: &Service) -> u64 {
    metric_sum(service, "hourglass_pump_cycles_total")
}

fn metric_sum(service: &Service, family: &str) -> u64 {
    let text = service.metrics.encode();
    text.lines().filter(|l| l.starts_with(family)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum::<f64>() as u64
}

fn setup(s: &RequestSnapshot) -> u64 {
    s.get_queue_url + s.create_queue + s.get_queue_attributes + s.list_queues + s.list_queue_tags + s.tag_queue + s.set_queue_attributes
}
