//! Delays beyond a cycle on a local SQS-compatible server (moto), with a
//! 2-second cycle so many cycles pass in seconds.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use hourglass::broker::sqs::SqsExecutor;
use hourglass::broker::sqs::pump::{Interrupt, Pump};
use hourglass::command::FieldValue;
use hourglass::config::Config;
use hourglass::scheduler::strategies::Strategies;
use hourglass::scheduler::{ScheduleRequest, Scheduled};
use hourglass_e2e::sqs::*;

const CYCLE_TABLE: &str = "planner = \"sqs-cycles\"\ncycle = \"2s\"";

fn request(destination: &str, delay_ms: u64, i: usize) -> ScheduleRequest {
    ScheduleRequest {
        destination: destination.to_string(),
        delay_ms,
        body: format!("body-{i}").into_bytes(),
        headers: [("tenant".to_string(), FieldValue::Text(format!("t-{i}")))].into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn delays_below_at_and_across_many_cycles_arrive_on_time() {
    let config = sqs_config(CYCLE_TABLE);
    let (scheduler, executor) = sqs_scheduler(&config).await;
    let mut destination = SqsDestination::create(executor.clone(), "cycles").await;
    // 0, 1 s, below one cycle, exactly one cycle, 3.5 cycles, 5.5 cycles.
    let delays = [0u64, 1_000, 1_500, 2_000, 7_000, 11_000];
    let mut sent: HashMap<String, (usize, Scheduled)> = HashMap::new();
    for (i, &delay) in delays.iter().enumerate() {
        let scheduled = scheduler.schedule(request(&destination.name, delay, i)).await.expect("schedule");
        sent.insert(format!("body-{i}"), (i, scheduled));
    }
    // Scheduled one after another, each first send is a batch of its own.
    let first_sends = executor.requests.snapshot();
    let delay_queue = format!("{}-delay.fifo", destination.name);
    let (stop, counters) = spawn_pump(&config, executor.clone(), &delay_queue).await;

    let received = destination.receive(delays.len(), Duration::from_secs(25)).await;
    for message in &received {
        let (i, scheduled) = &sent[&message.body];
        let late = message.at_ms as i64 - scheduled.due_at_ms as i64;
        // The same bound for 0 cycles as for 5: lateness does not grow per cycle.
        assert!(late >= 0, "delay {}ms arrived {}ms early", delays[*i], -late);
        assert!(late <= 2_000, "delay {}ms arrived {late}ms late", delays[*i]);
        assert_eq!(message.attribute("tenant"), Some(format!("t-{i}")), "attributes intact");
        assert_eq!(message.attribute("hourglass-due-at"), Some(scheduled.due_at_ms.to_string()));
    }
    let stats = counters.snapshot();
    assert!(stats.recycled > 4, "the 7 s and 11 s messages cycled: {stats:?}");
    assert_eq!(stats.handed_over, 2, "{stats:?}");
    assert_eq!((first_sends.send_message, first_sends.send_message_batch), (0, delays.len() as u64), "one batch request per first send: {first_sends:?}");
    let requests = executor.requests.snapshot();
    assert_eq!(requests.send_message, 0, "{requests:?}");
    assert!(requests.send_message_batch > first_sends.send_message_batch, "the pump forwards in batches: {requests:?}");
    assert!(requests.delete_message_batch >= 1, "and deletes in batches: {requests:?}");
    stop.send(true).unwrap();
}

#[tokio::test]
async fn invalid_inputs_fail_before_anything_is_sent() {
    let config = sqs_config(CYCLE_TABLE);
    let (scheduler, executor) = sqs_scheduler(&config).await;

    // A valid 76-character destination whose delay queue would need 87 characters.
    let long = format!("e2e-{}", uuid::Uuid::new_v4().simple()).repeat(3)[..76].to_string();
    create_queue(&executor, &long, &[]).await;
    let err = scheduler.schedule(request(&long, 5_000, 0)).await.unwrap_err().to_string();
    assert!(err.contains(&format!("SQS queue name \"{long}-delay.fifo\" is 87 characters; SQS allows 80")), "{err}");

    let mut destination = SqsDestination::create(executor.clone(), "invalid").await;
    let mut big = request(&destination.name, 1_000, 1);
    big.body = vec![b'x'; 300_000];
    let err = scheduler.schedule(big).await.unwrap_err().to_string();
    assert!(err.contains("SQS allows 262144"), "{err}");

    let wrong = SqsDestination::create(executor.clone(), "wrongdelay").await;
    let wrong_delay_queue = format!("{}-delay.fifo", wrong.name);
    create_queue(&executor, &wrong_delay_queue, &[("FifoQueue", "true"), ("DelaySeconds", "5"), ("MessageRetentionPeriod", "345600")]).await;
    let err = scheduler.schedule(request(&wrong.name, 5_000, 2)).await.unwrap_err().to_string();
    assert!(err.contains(&format!("SQS queue \"{wrong_delay_queue}\" cannot be used: DelaySeconds is 5, hourglass needs 2")), "{err}");

    let requests = executor.requests.snapshot();
    assert_eq!((requests.send_message, requests.send_message_batch), (0, 0), "nothing was sent for any invalid input: {requests:?}");
    assert!(destination.drain(Duration::from_millis(1_500)).await.is_empty());
}

/// A message that fits SQS's limit when first sent but would outgrow it on its
/// first visit (the cycle state gains the first send's time) is refused up
/// front, not accepted and parked later; everything accepted arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_would_outgrow_the_size_limit_while_it_cycles_is_refused_up_front() {
    let config = sqs_config(CYCLE_TABLE);
    let (scheduler, executor) = sqs_scheduler(&config).await;
    let mut destination = SqsDestination::create(executor.clone(), "headroom").await;
    // Bodies 16 bytes longer each time toward the limit, each long enough to cycle (5 s on 2 s cycles).
    let mut accepted = 0;
    let refused = loop {
        let mut big = request(&destination.name, 5_000, accepted);
        big.body = vec![b'x'; 262_144 - 320 + 16 * accepted];
        match scheduler.schedule(big).await {
            Ok(_) => accepted += 1,
            Err(err) => break err.to_string(),
        }
    };
    assert!(refused.contains("less 64 for the state it gathers"), "the first refusal is for the cycle state's room: {refused}");
    assert!(accepted >= 2, "bodies further from the limit are accepted: {accepted}");
    let delay_queue = format!("{}-delay.fifo", destination.name);
    let (stop, counters) = spawn_pump(&config, executor.clone(), &delay_queue).await;
    assert_eq!(destination.receive(accepted, Duration::from_secs(20)).await.len(), accepted, "every accepted message arrives");
    let stats = counters.snapshot();
    assert_eq!((stats.parked, stats.failed), (0, 0), "none outgrew the limit on a visit: {stats:?}");
    stop.send(true).unwrap();
}

/// How late a message may arrive after pumps died with it in hand: a
/// redelivered copy's remaining wait is counted on the host's clock and
/// handed over with whole `DelaySeconds`, then a 1 s long poll: measured
/// 1,141–1,166 ms and 1,458–1,515 ms (three messages, two runs, 2026-12-02;
/// printed), within the 2 s the other cycle tests here allow.
const AFTER_CRASH_ON_TIME_MS: i64 = 2_000;

/// Pumps die with the messages in flight, so they reach their destination
/// only if what the dead pumps left behind is picked up: first a pump that
/// received them and died before sending anything (the test receives them as
/// such a pump would, and drops them: they come back after the visibility
/// timeout), then one that died between its send onward and its delete. Before,
/// the only message was handed over by the dying pump itself, so it arrived
/// whatever became of the copy left behind.
#[tokio::test]
async fn a_pump_dying_between_send_and_delete_loses_nothing() {
    const MESSAGES: usize = 3;
    let config = sqs_config(CYCLE_TABLE);
    let (scheduler, executor) = sqs_scheduler(&config).await;
    let mut destination = SqsDestination::create(executor.clone(), "crash").await;
    let delay_queue = format!("{}-delay.fifo", destination.name);
    // A short visibility timeout so the undeleted messages come back quickly.
    create_queue(&executor, &delay_queue, &[("FifoQueue", "true"), ("DelaySeconds", "2"), ("MessageRetentionPeriod", "345600"), ("VisibilityTimeout", "2")])
        .await;
    // 7 s: three 2 s cycles, so each is still cycling when both pumps die.
    let mut sent = HashMap::new();
    for i in 0..MESSAGES {
        let scheduled = scheduler.schedule(request(&destination.name, 7_000, i)).await.unwrap();
        sent.insert(format!("body-{i}"), scheduled);
    }
    // A queue made without the high-throughput FIFO attributes (as by an earlier version) gets them.
    let attributes = queue_attributes(&executor, &delay_queue).await;
    assert_eq!(attributes.get("FifoThroughputLimit").map(String::as_str), Some("perMessageGroupId"), "{attributes:?}");

    // A pump that received every message and died before sending any: received, never deleted.
    let url = executor.url(&delay_queue).await.unwrap().unwrap();
    let mut in_hand = HashSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while in_hand.len() < MESSAGES {
        assert!(std::time::Instant::now() < deadline, "the messages never surfaced on {delay_queue}: {in_hand:?}");
        let output = executor.client().receive_message().queue_url(&url).max_number_of_messages(10).wait_time_seconds(1).send().await.unwrap();
        in_hand.extend(output.messages().iter().filter_map(|m| m.message_id().map(str::to_string)));
    }

    // The next pump dies after sending onward and before deleting.
    let planner = Strategies::load_one(&config, "main").unwrap();
    let mut dying = Pump::new(executor.clone(), Box::new(planner), &delay_queue, 1).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while dying.pump_once(Interrupt::AfterSendBeforeDelete).await.unwrap() == 0 {
        assert!(std::time::Instant::now() < deadline, "the messages never came back after the first pump died");
    }
    drop(dying);
    assert!(destination.drain(Duration::ZERO).await.is_empty(), "nothing had reached the destination when the pumps died");

    let (stop, counters) = spawn_pump(&config, executor.clone(), &delay_queue).await;
    let mut arrived = destination.receive(MESSAGES, Duration::from_secs(20)).await;
    arrived.extend(destination.drain(Duration::from_secs(4)).await);
    let mut firsts = HashMap::new();
    for message in &arrived {
        firsts.entry(message.body.clone()).or_insert(message.at_ms);
    }
    assert_eq!(firsts.len(), MESSAGES, "every message arrived: {:?}", arrived.iter().map(|m| &m.body).collect::<Vec<_>>());
    for (body, at_ms) in &firsts {
        let late = *at_ms as i64 - sent[body].due_at_ms as i64;
        eprintln!("{body}: {late} ms late");
        assert!(late >= 0, "{body} arrived {} ms early", -late);
        assert!(late <= AFTER_CRASH_ON_TIME_MS, "{body} arrived {late} ms late (window {AFTER_CRASH_ON_TIME_MS} ms)");
    }
    // At-least-once: the copy a pump left undeleted after its send may go on as well, once per message.
    let duplicates = arrived.len() - MESSAGES;
    let stats = counters.snapshot();
    println!("duplicates delivered: {duplicates}, pump stats: {stats:?}");
    assert!(duplicates <= MESSAGES, "{duplicates} duplicates of {MESSAGES} messages: at most one each");
    assert!(stats.redelivered >= 1, "the undeleted copies came back and were counted: {stats:?}");
    stop.send(true).unwrap();
}

#[tokio::test]
async fn two_pumps_on_one_delay_queue_deliver_everything() {
    let config = sqs_config(CYCLE_TABLE);
    let (scheduler, executor) = sqs_scheduler(&config).await;
    let mut destination = SqsDestination::create(executor.clone(), "twopumps").await;
    let count = 12;
    for i in 0..count {
        scheduler.schedule(request(&destination.name, 3_000 + (i as u64 % 4) * 1_000, i)).await.unwrap();
    }
    let delay_queue = format!("{}-delay.fifo", destination.name);
    let (stop_a, a) = spawn_pump(&config, executor.clone(), &delay_queue).await;
    let (stop_b, b) = spawn_pump(&config, executor.clone(), &delay_queue).await;
    let received = destination.receive(count, Duration::from_secs(25)).await;
    let bodies: HashSet<String> = received.iter().map(|r| r.body.clone()).collect();
    assert_eq!(bodies.len(), count, "every message delivered");
    let (a, b) = (a.snapshot(), b.snapshot());
    assert!(a.handed_over + b.handed_over >= count as u64, "{a:?} {b:?}");
    stop_a.send(true).unwrap();
    stop_b.send(true).unwrap();
}

#[tokio::test]
async fn examples_sqs_toml_schedules_and_pumps_as_is() {
    use std::process::{Command, Stdio};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    let binary = std::env::current_exe().unwrap().parent().and_then(|p| p.parent()).unwrap().join("hourglass");
    assert!(
        binary.exists(),
        "{} is missing: build the workspace's tests and binaries together, as `scripts/test` does (`cargo nextest run --workspace`)",
        binary.display()
    );
    let config = sqs_config(CYCLE_TABLE);
    let (_scheduler, executor) = sqs_scheduler(&config).await;
    let mut destination = SqsDestination::create(executor, "example").await;

    let output = Command::new(&binary)
        .current_dir(&root)
        .args(["--config", "examples/sqs.toml", "--strategy", "quick", "schedule", "--to", &destination.name, "--delay", "7s", "--body", "hello"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let mut pump = Command::new(&binary)
        .current_dir(&root)
        .args(["--config", "examples/sqs.toml", "--strategy", "quick", "pump", "--to", &destination.name, "--wait-seconds", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let received = destination.receive(1, Duration::from_secs(20)).await;
    assert_eq!(received[0].body, "hello");
    // SIGTERM: the pump finishes its batch and reports its requests.
    Command::new("kill").args(["-TERM", &pump.id().to_string()]).status().unwrap();
    let status = pump.wait().unwrap();
    let mut report = String::new();
    std::io::Read::read_to_string(pump.stdout.as_mut().unwrap(), &mut report).unwrap();
    assert!(status.success(), "pump exit: {status:?} {report}");
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    assert!(report["requests_per_delivered_message"].as_f64().unwrap() > 0.0, "{report}");
    assert_eq!(report["pumps"][0]["handed_over"], 1, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_api_schedules_on_sqs_and_serve_runs_the_pumps_itself() {
    use hourglass::service::Service;
    use hourglass_e2e::serve::Served;
    use serde_json::json;

    // A strategy name of its own: the service pumps every queue tagged with one of its strategies.
    let (config, _) = pumps_config(CYCLE_TABLE, "pump_wait = \"1s\"");
    let (_, executor) = sqs_scheduler(&config).await;
    let mut destination = SqsDestination::create(executor, "serve").await;
    let served = Served::start(Service::start(config).await.expect("service starts on SQS")).await;
    let http = &served.http;

    let (status, accepted) =
        http.schedule(None, json!({ "destination": destination.name, "delay": "5s", "body": "hello sqs", "headers": { "tenant": "acme" } })).await;
    assert_eq!(status, 202, "{accepted}");
    let (status, error) = http.schedule(None, json!({ "destination": destination.name, "delay": "later" })).await;
    assert_eq!((status, error["field"].as_str()), (400, Some("delay")), "{error}");
    assert_eq!(http.call("GET", "/readyz", None, None).await.0, 200, "broker reachable and the pump running");

    let received = destination.receive(1, Duration::from_secs(15)).await;
    let due_at = accepted["due_at"].as_u64().unwrap();
    assert_eq!(received[0].body, "hello sqs");
    assert_eq!(received[0].attribute("tenant").as_deref(), Some("acme"));
    assert!(received[0].at_ms >= due_at, "{} ms early", due_at - received[0].at_ms);
    assert!(received[0].at_ms <= due_at + 3_000, "{} ms late", received[0].at_ms - due_at);
    assert!(destination.drain(Duration::from_millis(500)).await.is_empty(), "the bad request published nothing");

    assert_eq!(http.metric("hourglass_messages_scheduled_total").await, 1.0);
    assert_eq!(http.metric("hourglass_sqs_requests_total{kind=\"SendMessage\"}").await, 0.0, "first sends go in batches");
    let batches = http.metric("hourglass_sqs_requests_total{kind=\"SendMessageBatch\"}").await;
    let cycles = http.metric("hourglass_pump_cycles_total").await;
    assert!(cycles >= 2.0, "5 s on a 2 s cycle: at least one recycle and the hand-over, counted {cycles}");
    assert!(batches >= 1.0 + cycles, "the first send and one per cycle: {batches} batches for {cycles} cycles");
    served.stop().await;
}

#[tokio::test]
async fn content_type_and_custom_properties_survive_a_multi_cycle_delay() {
    use hourglass::broker::sqs::properties::{CONTENT_TYPE_ATTRIBUTE, from_attributes};
    use hourglass::message::{HeaderValue, Properties};

    let config = sqs_config(CYCLE_TABLE);
    let (scheduler, executor) = sqs_scheduler(&config).await;
    let mut destination = SqsDestination::create(executor.clone(), "properties").await;
    let properties = Properties {
        content_type: Some("application/json".into()),
        correlation_id: Some("order-42".into()),
        priority: Some(3),
        headers: [("x-trace".to_string(), HeaderValue::text("abc")), ("x-attempts".to_string(), HeaderValue::I32(2))].into(),
        ..Default::default()
    };
    // 5 s on a 2 s cycle: the typed message goes around twice; a plain one beside it.
    let mut typed = request(&destination.name, 5_000, 0);
    typed.body = b"{\"order\": 42}".to_vec();
    typed.properties = properties.clone();
    scheduler.schedule(typed).await.expect("schedule with properties");
    scheduler.schedule(request(&destination.name, 5_000, 1)).await.expect("schedule plain");
    let delay_queue = format!("{}-delay.fifo", destination.name);
    let (stop, counters) = spawn_pump(&config, executor.clone(), &delay_queue).await;

    let received = destination.receive(2, Duration::from_secs(20)).await;
    let typed = received.iter().find(|r| r.body.contains("order")).expect("the typed message arrived");
    assert_eq!(typed.attribute(CONTENT_TYPE_ATTRIBUTE).as_deref(), Some("application/json"), "content-type is an attribute of its own");
    assert_eq!(from_attributes(&typed.attributes).unwrap(), properties, "every property and typed header as sent");
    assert_eq!(typed.attribute("tenant").as_deref(), Some("t-0"), "the caller's plain headers too");
    let plain = received.iter().find(|r| r.body == "body-1").expect("the plain message arrived");
    assert_eq!(from_attributes(&plain.attributes).unwrap(), Properties::default(), "no properties invented");
    assert!(counters.snapshot().recycled >= 2, "the messages went around at least once: {:?}", counters.snapshot());
    stop.send(true).unwrap();
}

/// A fresh destination and `count` messages scheduled to it at once, whose
/// first sends took at most `most_requests` batch requests; returns them by body.
async fn burst(
    stem: &str,
    count: usize,
    delay_ms: impl Fn(usize) -> u64,
    most_requests: u64,
) -> (Config, Arc<SqsExecutor>, SqsDestination, HashMap<String, Scheduled>) {
    let config = sqs_config(CYCLE_TABLE);
    let (scheduler, executor) = sqs_scheduler(&config).await;
    let destination = SqsDestination::create(executor.clone(), stem).await;
    let requests = (0..count).map(|i| scheduler.schedule(request(&destination.name, delay_ms(i), i)));
    let results = futures_util::future::join_all(requests).await;
    let first_sends = executor.requests.snapshot();
    println!("{count} concurrent first sends: {first_sends:?}");
    assert_eq!(first_sends.send_message, 0, "{first_sends:?}");
    assert!(first_sends.send_message_batch <= most_requests, "{count} first sends in at most {most_requests} requests: {first_sends:?}");
    let sent = results.into_iter().enumerate().map(|(i, result)| (format!("body-{i}"), result.unwrap_or_else(|e| panic!("schedule {i}: {e}")))).collect();
    (config, executor, destination, sent)
}

/// How late a message of a burst may arrive: `DelaySeconds` and hand-overs are
/// whole seconds, then a 1 s long poll. Measured (2026-12-02, two tests at a
/// time, other engineers' builds beside; printed): at most 1,605 and 2,244 ms
/// for 50 direct sends of 1–2 s (2,244 failed a first 2,000 ms window), 1,113
/// and 1,247 ms for 30 first sends of 3–6 s.
const BURST_ON_TIME_MS: u64 = 3_000;

/// Every message arrived once, none before it was due nor later than
/// [`BURST_ON_TIME_MS`] after, with its attributes.
fn assert_all_on_time(received: &[SqsReceived], sent: &HashMap<String, Scheduled>) {
    let bodies: HashSet<&str> = received.iter().map(|r| r.body.as_str()).collect();
    let late: Vec<u64> = received.iter().map(|m| m.at_ms.saturating_sub(sent[&m.body].due_at_ms)).collect();
    eprintln!("burst of {}: latest {} ms late, all {late:?}", received.len(), late.iter().max().unwrap_or(&0));
    assert_eq!((received.len(), bodies.len()), (sent.len(), sent.len()), "each message exactly once");
    for message in received {
        let scheduled = &sent[&message.body];
        assert!(message.at_ms >= scheduled.due_at_ms, "{} arrived {} ms early", message.body, scheduled.due_at_ms - message.at_ms);
        let late = message.at_ms - scheduled.due_at_ms;
        assert!(late <= BURST_ON_TIME_MS, "{} arrived {late} ms late (window {BURST_ON_TIME_MS} ms)", message.body);
        let i = message.body.trim_start_matches("body-");
        assert_eq!(message.attribute("tenant"), Some(format!("t-{i}")), "attributes intact");
    }
}

#[tokio::test]
async fn a_burst_of_direct_sends_to_one_destination_goes_out_in_batches() {
    // 1 to 2 s, below the 2 s cycle: plain sends with DelaySeconds.
    let (_, _, mut destination, sent) = burst("burst", 50, |i| 1_000 + (i as u64 % 2) * 1_000, 10).await;
    let received = destination.receive(50, Duration::from_secs(20)).await;
    assert_all_on_time(&received, &sent);
    assert!(destination.drain(Duration::from_secs(1)).await.is_empty(), "nothing twice");
}

#[tokio::test]
async fn a_burst_of_first_sends_to_a_delay_queue_goes_out_in_batches_and_keeps_fifo_ids() {
    // 3 to 6 s, above the 2 s cycle: first sends to `<destination>-delay.fifo`. Distinct
    // deduplication ids matter here: a batch sharing one would lose messages.
    let (config, executor, mut destination, sent) = burst("fifoburst", 30, |i| 3_000 + (i as u64 % 4) * 1_000, 6).await;
    let delay_queue = format!("{}-delay.fifo", destination.name);
    let (stop, counters) = spawn_pump(&config, executor.clone(), &delay_queue).await;
    let received = destination.receive(30, Duration::from_secs(25)).await;
    assert_all_on_time(&received, &sent);
    assert!(counters.snapshot().handed_over >= 30, "{:?}", counters.snapshot());
    stop.send(true).unwrap();
}

#[tokio::test]
async fn a_destination_deleted_after_it_was_looked_up_is_reported_missing() {
    let config = sqs_config(CYCLE_TABLE);
    let (scheduler, executor) = sqs_scheduler(&config).await;
    let name = unique_queue("deleted");
    let url = create_queue(&executor, &name, &[]).await;
    scheduler.schedule(request(&name, 1_000, 0)).await.expect("the first send, which remembers the queue's URL");
    executor.client().delete_queue().queue_url(&url).send().await.unwrap();
    let err = scheduler.schedule(request(&name, 1_000, 1)).await.unwrap_err().to_string();
    assert!(err.contains(&format!("SQS queue {name:?} does not exist")), "{err}");
}
