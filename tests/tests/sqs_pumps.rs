//! Pumps that need no configured destinations, park what cannot go on, and
//! keep a slow batch to themselves — on the local SQS server (moto), with a
//! 2-second cycle. Each test's strategy has a name of its own, so its host
//! finds only the pumped queues its own test made.
//!
//! Lateness window: a hand-over is sent with the remainder rounded up to a
//! whole second, and pumps long-poll for 1 s, so a message arrives up to ~2 s
//! after its due time on this server (measured: p99 1.8 s); the restart adds
//! the gap between the two hosts, so those checks allow 3 s.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_sqs::types::MessageAttributeValue;
use hourglass::broker::sqs::dead_letters::dead_letter_queue;
use hourglass::broker::sqs::pump::{DueError, DueHandler, Pump};
use hourglass::broker::sqs::pumped::{PARKED_REASON_ATTRIBUTE, PumpSettings};
use hourglass::command::{DueAction, DueMessage};
use hourglass::scheduler::ScheduleRequest;
use hourglass::scheduler::strategies::Strategies;
use hourglass::service::Service;
use hourglass_e2e::serve::Served;
use hourglass_e2e::sqs::*;
use hourglass_e2e::until;

const CYCLE_TABLE: &str = "planner = \"sqs-cycles\"\ncycle = \"2s\"";
const QUICK_PUMPS: &str = "pump_wait = \"1s\"\npump_discovery = \"1s\"\npump_visibility = \"3s\"";

fn request(destination: &str, delay_ms: u64, body: &str) -> ScheduleRequest {
    ScheduleRequest { destination: destination.to_string(), delay_ms, body: body.as_bytes().to_vec(), ..Default::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_no_destinations_configured_pumps_every_cycling_queue() {
    let (config, _) = pumps_config(CYCLE_TABLE, QUICK_PUMPS);
    assert!(config.destinations.is_empty(), "nothing tells the hosts where messages go");
    let (_, executor) = sqs_scheduler(&config).await;
    let mut destinations = Vec::new();
    for stem in ["restart-a", "restart-b", "restart-c"] {
        destinations.push(SqsDestination::create(executor.clone(), stem).await);
    }

    // The first host accepts 9 messages of 7-9 s (several 2 s cycles) and stops before any is due.
    let first = Served::start(Service::start(config.clone()).await.expect("first host starts")).await;
    let mut due_at = HashMap::new();
    for (d, destination) in destinations.iter().enumerate() {
        for i in 0..3u64 {
            let body = format!("{d}-{i}");
            let scheduled = first.service.scheduler().schedule(request(&destination.name, 7_000 + i * 1_000, &body)).await.expect("schedule");
            due_at.insert(body, scheduled.due_at_ms);
        }
    }
    first.stop().await;

    // The second host was never asked to schedule anything: it must find the queues itself.
    let second = Served::start(Service::start(config).await.expect("second host starts")).await;
    for destination in &mut destinations {
        for message in destination.receive(3, Duration::from_secs(25)).await {
            let due = due_at[&message.body] as i64;
            let late = message.at_ms as i64 - due;
            assert!(late >= 0, "{} arrived {} ms early", message.body, -late);
            assert!(late <= 3_000, "{} arrived {late} ms late", message.body);
        }
        assert!(destination.drain(Duration::from_millis(300)).await.is_empty(), "no duplicates after a clean stop");
    }
    second.stop().await;
}

/// `GET /v1/delays` on SQS: each pumped queue's messages (visible, in flight
/// and delayed) by SQS's approximate counts, and its dead-letter queue's as parked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_messages_cycling_in_a_pumped_queue_are_counted() {
    let (config, strategy) = pumps_config(CYCLE_TABLE, &format!("{QUICK_PUMPS}\ndepth_poll = \"500ms\""));
    let (_, executor) = sqs_scheduler(&config).await;
    let destination = SqsDestination::create(executor.clone(), "counted").await;
    let served = Served::start(Service::start(config.clone()).await.expect("serve starts")).await;
    const CYCLING: u64 = 4;
    for i in 0..CYCLING {
        served.service.scheduler().schedule(request(&destination.name, 30_000, &format!("m{i}"))).await.expect("schedule");
    }
    let counted = async || {
        let (_, text) = served.http.call("GET", "/v1/delays", None, None).await;
        let delays: serde_json::Value = serde_json::from_str(&text).unwrap();
        delays["strategies"].as_array().and_then(|all| all.iter().find(|s| s["strategy"] == strategy.as_str()).cloned())
    };
    until("the pumped queue counted", Duration::from_secs(20), async || counted().await.is_some_and(|s| s["waiting"] == CYCLING)).await;
    let mine = counted().await.unwrap();
    assert_eq!(mine["parked"], 0, "{mine}");
    assert!(mine["queues"][0]["queue"].as_str().unwrap().starts_with(&destination.name), "the destination's delay queue: {mine}");
    served.stop().await;
}

/// The canary on SQS: a probe through the strategy every period to a standard
/// queue of its own, consumed and timed; none early. The window is the one
/// the SQS tests use (tests/tests/sqs.rs): whole seconds and moto's long poll.
/// The latest an SQS canary probe may be, in seconds: the lateness
/// histogram's bucket (powers of two from 1 ms) at or above the ~2 s this
/// server allows (module comment). Measured (2026-12-02): the latest of
/// the 1 s probes within the 1,024 ms bucket, and within the 2,048 ms one on
/// a run whose SQS bursts were up to 2.24 s late (tests/tests/sqs.rs): the
/// bucket above that.
const SQS_CANARY_BUCKET_S: f64 = 4.096;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_canary_times_probes_through_sqs_and_none_is_early() {
    let canary = unique_queue("canary");
    let service = format!("{QUICK_PUMPS}\n\n[service.canary]\nqueue = \"{canary}\"\nevery = \"500ms\"\ndelay = \"1s\"");
    let (config, strategy) = pumps_config(CYCLE_TABLE, &service);
    let (_, executor) = sqs_scheduler(&config).await;
    let served = Served::start(Service::start(config).await.expect("serve starts")).await;
    let count = format!("hourglass_delivery_lateness_seconds_count{{strategy=\"{strategy}\"}}");
    until("three probes timed", Duration::from_secs(30), async || served.http.metric(&count).await >= 3.0).await;
    // The latest probe, not a mean: every probe must fall in the histogram's
    // bucket at or above the window.
    let (probes, latest_s) = served.http.histogram_max_bucket("hourglass_delivery_lateness_seconds", &format!("strategy=\"{strategy}\"")).await;
    eprintln!("SQS canary: {probes} probes, the latest at most {:.0} ms late (histogram bucket)", latest_s * 1_000.0);
    assert!(probes >= 3 && latest_s <= SQS_CANARY_BUCKET_S, "of {probes} probes the latest was up to {latest_s} s late (window {SQS_CANARY_BUCKET_S} s)");
    assert_eq!(served.http.metric("hourglass_delivery_early_total").await, 0.0, "no probe arrived early");
    served.stop().await;
    if let Some(url) = executor.url(&canary).await.unwrap() {
        executor.client().delete_queue().queue_url(url).send().await.ok();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_is_parked_with_its_reason_while_the_valid_messages_beside_it_arrive() {
    let (config, _) = pumps_config(CYCLE_TABLE, QUICK_PUMPS);
    let (_, executor) = sqs_scheduler(&config).await;
    let mut valid = SqsDestination::create(executor.clone(), "poison-valid").await;
    // A destination deleted while its message waits (no consumer: it will not exist).
    let doomed = unique_queue("poison-gone");
    create_queue(&executor, &doomed, &[]).await;
    let served = Served::start(Service::start(config).await.expect("service starts")).await;
    let scheduler = served.service.scheduler();

    let mut due_at = HashMap::new();
    for i in 0..6u64 {
        let body = format!("valid-{i}");
        due_at.insert(body.clone(), scheduler.schedule(request(&valid.name, 5_000 + i * 300, &body)).await.expect("schedule").due_at_ms);
    }
    scheduler.schedule(request(&doomed, 5_000, "orphan")).await.expect("schedule to the doomed destination");
    // Poison beside the valid ones: a cycle state no planner can read, sent by someone else.
    let delay_queue = format!("{}-delay.fifo", valid.name);
    let unreadable = MessageAttributeValue::builder().data_type("String").string_value("garbage").build().unwrap();
    executor
        .client()
        .send_message()
        .queue_url(executor.url(&delay_queue).await.unwrap().unwrap())
        .message_body("poison")
        .message_attributes("hourglass-cycle", unreadable)
        .message_group_id("poison")
        .message_deduplication_id("poison-1")
        .send()
        .await
        .unwrap();
    let doomed_url = executor.url(&doomed).await.unwrap().unwrap();
    executor.client().delete_queue().queue_url(doomed_url).send().await.unwrap();

    for message in valid.receive(6, Duration::from_secs(20)).await {
        let late = message.at_ms as i64 - due_at[&message.body] as i64;
        assert!((0..=2_000).contains(&late), "{} arrived {late} ms from its due time", message.body);
    }
    let parked_reason = async |queue: &str, body: &str| -> String {
        let dead_letters = dead_letter_queue(&format!("{queue}-delay.fifo"));
        let mut reason = None;
        until(&format!("{body} parked in {dead_letters}"), Duration::from_secs(20), async || {
            for message in take_messages(&executor, &dead_letters).await {
                assert_eq!(message.body(), Some(body), "only the poison is parked");
                reason = message.message_attributes().and_then(|a| a.get(PARKED_REASON_ATTRIBUTE)).and_then(|v| v.string_value()).map(str::to_string);
                assert!(reason.is_some(), "parked without a reason: {message:?}");
            }
            reason.is_some()
        })
        .await;
        reason.unwrap()
    };
    let unreadable = parked_reason(&valid.name, "poison").await;
    assert!(unreadable.contains("malformed"), "{unreadable}");
    let gone = parked_reason(&doomed, "orphan").await;
    assert!(gone.contains("does not exist") && gone.contains(&doomed), "{gone}");
    assert_eq!(served.http.metric("hourglass_pump_parked_total").await, 2.0, "both counted, nothing else");
    assert!(valid.drain(Duration::from_millis(500)).await.is_empty(), "the poison never reached the destination");

    // What the host set on the pumped queue: its redrive policy and visibility timeout.
    let attributes = queue_attributes(&executor, &delay_queue).await;
    assert_eq!(attributes.get("VisibilityTimeout").map(String::as_str), Some("3"), "{attributes:?}");
    assert_eq!(attributes.get("FifoThroughputLimit").map(String::as_str), Some("perMessageGroupId"), "high-throughput FIFO: {attributes:?}");
    assert_eq!(attributes.get("DeduplicationScope").map(String::as_str), Some("messageGroup"), "{attributes:?}");
    let policy: serde_json::Value = serde_json::from_str(&attributes["RedrivePolicy"]).unwrap();
    assert_eq!(policy["maxReceiveCount"].as_u64(), Some(10), "{policy}");
    assert!(policy["deadLetterTargetArn"].as_str().unwrap().ends_with(&dead_letter_queue(&delay_queue)), "{policy}");
    served.stop().await;
}

/// Bundles: what goes around again travels several to one SQS message. A
/// message in a bundle that cannot go on is parked alone, with its reason, and
/// its bundle-mates arrive; a bundle that cannot be opened is parked whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_message_in_a_bundle_is_parked_alone_and_its_bundle_mates_arrive() {
    use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
    use hourglass::broker::sqs::bundle::{BUNDLE_ATTRIBUTE, Candidate, pack};

    let (config, _) = pumps_config(CYCLE_TABLE, QUICK_PUMPS);
    let (_, executor) = sqs_scheduler(&config).await;
    let mut valid = SqsDestination::create(executor.clone(), "bundle-valid").await;
    let served = Served::start(Service::start(config).await.expect("service starts")).await;
    let scheduler = served.service.scheduler();
    let mut due_at = HashMap::new();
    // Scheduled together, 7 s on 2 s cycles: they go around twice, in bundles.
    for i in 0..6u64 {
        let body = format!("scheduled-{i}");
        due_at.insert(body.clone(), scheduler.schedule(request(&valid.name, 7_000, &body)).await.expect("schedule").due_at_ms);
    }
    // A bundle as a pump makes it, of two messages due in 3 s and one whose cycle state no planner reads.
    let delay_queue = format!("{}-delay.fifo", valid.name);
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let member = |key: usize, body: &str, state: &str| {
        let state = MessageAttributeValue::builder().data_type("String").string_value(state).build().unwrap();
        let entry = SendMessageBatchRequestEntry::builder().id("x").message_body(body).message_attributes("hourglass-cycle", state).build().unwrap();
        Candidate { key, id: format!("hand-{key}"), entry, size: body.len() }
    };
    let state = format!("n=1;first-sent={now_ms};delay-ms=3000;to={}", valid.name);
    for body in ["bundled-a", "bundled-b"] {
        due_at.insert(body.to_string(), now_ms + 3_000);
    }
    let packed = pack(&delay_queue, vec![member(0, "bundled-a", &state), member(1, "poison-in-a-bundle", "garbage"), member(2, "bundled-b", &state)]);
    assert_eq!(packed.len(), 1, "one bundle of three");
    let bundle = &packed[0].entry;
    let url = executor.url(&delay_queue).await.unwrap().unwrap();
    let send = |body: &str, attributes, group: &str| {
        executor
            .client()
            .send_message()
            .queue_url(&url)
            .message_body(body)
            .set_message_attributes(attributes)
            .message_group_id(group)
            .message_deduplication_id(group)
            .send()
    };
    send(bundle.message_body(), bundle.message_attributes().cloned(), bundle.message_group_id().unwrap()).await.unwrap();
    let count = MessageAttributeValue::builder().data_type("Number").string_value("2").build().unwrap();
    send("broken-bundle", Some([(BUNDLE_ATTRIBUTE.to_string(), count)].into()), "broken").await.unwrap();

    for message in valid.receive(8, Duration::from_secs(20)).await {
        let late = message.at_ms as i64 - due_at[&message.body] as i64;
        assert!((0..=2_000).contains(&late), "{} arrived {late} ms from its due time", message.body);
    }
    let dead_letters = dead_letter_queue(&delay_queue);
    let mut reasons = HashMap::new();
    until("both parked with their reasons", Duration::from_secs(20), async || {
        for message in take_messages(&executor, &dead_letters).await {
            let reason = message.message_attributes().and_then(|a| a.get(PARKED_REASON_ATTRIBUTE)).and_then(|v| v.string_value()).unwrap_or_default();
            reasons.insert(message.body().unwrap_or_default().to_string(), reason.to_string());
        }
        reasons.len() >= 2
    })
    .await;
    assert!(reasons["poison-in-a-bundle"].contains("malformed"), "parked alone, as it was sent: {reasons:?}");
    assert!(reasons["broken-bundle"].contains("not a bundle"), "{reasons:?}");
    assert_eq!(reasons.len(), 2, "nothing else parked: {reasons:?}");
    assert_eq!(served.http.metric("hourglass_pump_parked_total").await, 2.0);
    assert!(served.http.metric("hourglass_pump_bundled_total").await >= 6.0, "the scheduled ones went around in bundles");
    assert!(valid.drain(Duration::from_millis(500)).await.is_empty(), "nothing twice, no poison at the destination");
    served.stop().await;
}

/// A planner that thinks for a while about every message.
struct Slow(Box<dyn DueHandler>, Duration);

impl DueHandler for Slow {
    fn label(&self) -> &str {
        self.0.label()
    }

    fn handle_due(&mut self, message: &DueMessage) -> Result<DueAction, DueError> {
        std::thread::sleep(self.1);
        self.0.handle_due(message)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_batch_that_outlasts_the_visibility_timeout_is_not_received_twice() {
    let (config, strategy) = pumps_config(CYCLE_TABLE, QUICK_PUMPS);
    let (scheduler, executor) = sqs_scheduler(&config).await;
    let mut destination = SqsDestination::create(executor.clone(), "slowbatch").await;
    for i in 0..3 {
        scheduler.schedule(request(&destination.name, 2_500, &format!("slow-{i}"))).await.expect("schedule");
    }
    let delay_queue = format!("{}-delay.fifo", destination.name);
    // Visibility 2 s; the slow pump needs 1.5 s per message, 4.5 s for a batch of three.
    let settings = PumpSettings { visibility: Duration::from_secs(2), ..PumpSettings::default() };
    let prepared = executor.prepare_pumped(&delay_queue, &settings, true).await.expect("prepare");
    let planner = Box::new(Slow(Box::new(Strategies::load_one(&config, &strategy).unwrap()), Duration::from_millis(1_500)));
    let slow = Pump::new(executor.clone(), planner, &delay_queue, 1).await.unwrap().prepared(&prepared, &settings);
    let slow_counters = slow.counters.clone();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let slow_task = tokio::spawn(slow.run(stopped.clone()));
    // It has the batch in hand before the fast pump starts competing for it.
    until("the slow pump received the batch", Duration::from_secs(15), async || slow_counters.snapshot().received > 0).await;
    let fast = Pump::new(executor.clone(), Box::new(Strategies::load_one(&config, &strategy).unwrap()), &delay_queue, 1).await.unwrap();
    let fast_counters = fast.counters.clone();
    let fast_task = tokio::spawn(fast.run(stopped));

    let received = destination.receive(3, Duration::from_secs(20)).await;
    let mut bodies: Vec<&str> = received.iter().map(|r| r.body.as_str()).collect();
    bodies.sort();
    assert_eq!(bodies, ["slow-0", "slow-1", "slow-2"]);
    assert!(destination.drain(Duration::from_secs(3)).await.is_empty(), "a message was forwarded twice");
    let (slow_stats, fast_stats) = (slow_counters.snapshot(), fast_counters.snapshot());
    assert_eq!(slow_stats.redelivered + fast_stats.redelivered, 0, "no message was received twice: {slow_stats:?} {fast_stats:?}");
    assert!(executor.requests.snapshot().change_message_visibility_batch >= 1, "the batch's visibility was extended");
    stop.send(true).unwrap();
    slow_task.await.unwrap().unwrap();
    fast_task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_killed_mid_cycle_loses_nothing_and_the_next_one_finishes_the_cycles() {
    use hourglass_e2e::process::ServeProcess;
    use serde_json::json;

    let (text, _) = pumps_config_text(CYCLE_TABLE, QUICK_PUMPS);
    let config = hourglass::config::Config::parse(std::path::Path::new("e2e.toml"), text.clone()).unwrap();
    let path = std::env::temp_dir().join(format!("e2e-sqs-kill-{}.toml", uuid::Uuid::new_v4().simple()));
    std::fs::write(&path, text).unwrap();
    let (_, executor) = sqs_scheduler(&config).await;
    let mut destinations = Vec::new();
    for stem in ["kill-a", "kill-b", "kill-c"] {
        destinations.push(SqsDestination::create(executor.clone(), stem).await);
    }

    let first = ServeProcess::start(&path);
    let mut due_at = HashMap::new();
    for (d, destination) in destinations.iter().enumerate() {
        for i in 0..10u64 {
            let body = format!("{d}-{i}");
            let delay = format!("{}ms", 4_000 + i * 500);
            let (status, accepted) = first.http.schedule(None, json!({ "destination": destination.name, "delay": delay, "body": body })).await;
            assert_eq!(status, 202, "{accepted}");
            due_at.insert(body, accepted["due_at"].as_u64().unwrap());
        }
    }
    // Mid-cycle: some messages went around once, most are still cycling.
    until("the first host's pumps cycled some messages", Duration::from_secs(15), async || first.http.metric("hourglass_pump_cycles_total").await >= 3.0).await;
    first.signal("KILL");
    drop(first);

    let second = ServeProcess::start(&path);
    let mut duplicates = 0;
    for destination in &mut destinations {
        let mut seen = std::collections::HashSet::new();
        for message in destination.receive(10, Duration::from_secs(30)).await.into_iter().chain(destination.drain(Duration::from_secs(2)).await) {
            let late = message.at_ms as i64 - due_at[&message.body] as i64;
            // A batch the killed pump held comes back after the 3 s visibility timeout.
            assert!((0..=6_000).contains(&late), "{} arrived {late} ms from its due time", message.body);
            if !seen.insert(message.body.clone()) {
                duplicates += 1;
            }
        }
        assert_eq!(seen.len(), 10, "every accepted message to {} arrived", destination.name);
    }
    println!("kill -9 mid-cycle: 30 accepted, 30 arrived, {duplicates} duplicates");
    assert!(duplicates <= 30, "duplicates are bounded by what the killed pumps held: {duplicates}");
    drop(second);
    std::fs::remove_file(path).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqs_ingress_queue_forwards_valid_messages_on_time_and_parks_invalid_ones_with_the_reason() {
    let (ingress, invalid) = (unique_queue("ingress"), unique_queue("ingress-invalid"));
    let service = format!("{QUICK_PUMPS}\n\n[service.sqs_ingress]\nqueue = \"{ingress}\"\ninvalid_queue = \"{invalid}\"");
    let (config, _) = pumps_config(CYCLE_TABLE, &service);
    let (_, executor) = sqs_scheduler(&config).await;
    let mut destination = SqsDestination::create(executor.clone(), "ingress-to").await;
    let served = Served::start(Service::start(config).await.expect("service starts with the SQS ingress")).await;
    let ingress_url = executor.url(&ingress).await.unwrap().expect("the service created the ingress queue");

    let text = |value: &str| MessageAttributeValue::builder().data_type("String").string_value(value).build().unwrap();
    let number = |value: u64| MessageAttributeValue::builder().data_type("Number").string_value(value.to_string()).build().unwrap();
    let send = async |body: &str, attributes: Vec<(&str, MessageAttributeValue)>| -> u64 {
        let mut request = executor.client().send_message().queue_url(&ingress_url).message_body(body);
        for (name, value) in attributes {
            request = request.message_attributes(name, value);
        }
        let sent_at = hourglass::clock::unix_now_ms();
        request.send().await.unwrap();
        sent_at
    };
    // Valid: below one cycle, across one and across two (2 s cycles); the delay as text or as milliseconds.
    let mut sent = HashMap::new();
    for (i, delay) in [(0, 1_500u64), (1, 3_000), (2, 5_000), (3, 1_000), (4, 4_500)] {
        let delay_attribute = if i % 2 == 0 { text(&format!("{delay}ms")) } else { number(delay) };
        let body = format!("valid-{i}");
        let at = send(&body, vec![("hourglass-destination", text(&destination.name)), ("hourglass-delay", delay_attribute), ("tenant", text("acme"))]).await;
        sent.insert(body, (at, delay));
    }
    // Invalid beside them, each for its own reason.
    send("no-delay", vec![("hourglass-destination", text(&destination.name))]).await;
    send("bad-delay", vec![("hourglass-destination", text(&destination.name)), ("hourglass-delay", text("soon"))]).await;
    send("nowhere", vec![("hourglass-destination", text(&unique_queue("missing"))), ("hourglass-delay", text("1s"))]).await;

    for message in destination.receive(5, Duration::from_secs(20)).await {
        let (sent_at, delay) = sent[&message.body];
        let due_at: u64 = message.attribute("hourglass-due-at").expect("due time stamped").parse().unwrap();
        assert!(due_at >= sent_at + delay, "{}: due {due_at} before its send {sent_at} + {delay} ms", message.body);
        let late = message.at_ms as i64 - due_at as i64;
        assert!((0..=2_000).contains(&late), "{} arrived {late} ms from its due time", message.body);
        // Forwarding adds the ingress's long poll (1 s) at most, on top of the delivery window.
        assert!(message.at_ms <= sent_at + delay + 3_000, "{} arrived {} ms after send + delay", message.body, message.at_ms - sent_at - delay);
        assert_eq!(message.attribute("tenant").as_deref(), Some("acme"), "the producer's attributes stay plain attributes");
        assert_eq!(message.attribute("hourglass-destination"), None, "control attributes are not forwarded");
    }
    let mut reasons = HashMap::new();
    until("the three invalid messages set aside", Duration::from_secs(15), async || {
        for message in take_messages(&executor, &invalid).await {
            let reason = message.message_attributes().and_then(|a| a.get("hourglass-invalid-reason")).and_then(|v| v.string_value()).unwrap_or_default();
            reasons.insert(message.body().unwrap_or_default().to_string(), reason.to_string());
        }
        reasons.len() == 3
    })
    .await;
    assert!(reasons["no-delay"].contains("hourglass-delay"), "{reasons:?}");
    assert!(reasons["bad-delay"].contains("hourglass-delay"), "{reasons:?}");
    assert!(reasons["nowhere"].contains("does not exist"), "{reasons:?}");
    assert!(destination.drain(Duration::from_millis(500)).await.is_empty(), "nothing invalid reached the destination");
    until("the ingress queue empty: every message deleted after its forward", Duration::from_secs(10), async || {
        let attributes = queue_attributes(&executor, &ingress).await;
        attributes["ApproximateNumberOfMessages"] == "0" && attributes["ApproximateNumberOfMessagesNotVisible"] == "0"
    })
    .await;
    assert_eq!(served.http.metric("hourglass_ingress_messages_total{outcome=\"forwarded\"}").await, 5.0);
    assert_eq!(served.http.metric("hourglass_ingress_messages_total{outcome=\"invalid\"}").await, 3.0);
    assert_eq!(served.http.call("GET", "/readyz", None, None).await.0, 200, "the ingress consumer counts as running");
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plans_cost_estimate_is_what_the_pump_spends_on_a_busy_queue() {
    use hourglass::broker::sqs::cost::{SqsCost, cohort_requests};
    use hourglass::planner::PlanRequest;
    use hourglass::sim::simulation::Simulation;

    let (config, strategy) = pumps_config(CYCLE_TABLE, QUICK_PUMPS);
    let (scheduler, executor) = sqs_scheduler(&config).await;
    let mut destination = SqsDestination::create(executor.clone(), "cost").await;
    let (count, delay_ms) = (30u64, 7_000);
    // The estimate `hourglass plan` prints, from the simulated route of one message.
    let mut planner = Strategies::load_one(&config, &strategy).unwrap();
    planner.plan(&PlanRequest { destination: destination.name.clone(), delay_ms, message_id: "estimate".into(), routing_key: None }).unwrap();
    let route = Simulation::new(&mut planner, &destination.name).unwrap().run(&[delay_ms]).unwrap().remove(0);
    let estimate = SqsCost::of_route(&route.hops, 0.5);
    assert_eq!(estimate.pump_visits, 3, "7 s on 2 s cycles: two re-sends and the hand-over");

    let before = executor.requests.snapshot();
    let sends = (0..count).map(|i| scheduler.schedule(request(&destination.name, delay_ms, &format!("cost-{i}"))));
    futures_util::future::join_all(sends).await.into_iter().for_each(|r| drop(r.expect("schedule")));
    let delay_queue = format!("{}-delay.fifo", destination.name);
    let (stop, counters) = spawn_pump(&config, executor.clone(), &delay_queue).await;
    destination.receive(count as usize, Duration::from_secs(25)).await;
    until("the pump's last deletes", Duration::from_secs(5), async || counters.snapshot().handed_over == count).await;
    stop.send(true).unwrap();
    let spent = executor.requests.snapshot().since(&before);
    let stats = counters.snapshot();
    // Empty long polls are the idle pump's cost, not the messages'.
    let moving = spent.message_requests() - stats.empty_polls;
    let visits = stats.recycled + stats.handed_over;
    assert!(visits <= estimate.pump_visits * count, "never more visits than planned: {visits}");
    assert!(stats.bundled > 0, "what went around again went in bundles: {stats:?}");
    // The model `hourglass plan` uses for a busy queue, for these thirty small messages.
    // Bodies of a few bytes: all thirty fit one bundle.
    let modelled = cohort_requests(count, estimate.pump_visits, 100) as f64;
    println!(
        "estimate {:.3} per message in a busy queue ({} alone); {visits} visits made, {} in bundles: modelled {modelled} requests, spent {moving}",
        estimate.requests_in_a_busy_queue, estimate.requests_alone, stats.bundled
    );
    // A receive that brings fewer than ten (moto releasing messages slowly) costs
    // more; a pump that lags hands some over a visit early and costs less.
    assert!(moving as f64 >= modelled * 0.8, "spent {moving}, far below the model's {modelled}");
    assert!(moving as f64 <= modelled * 1.5, "spent {moving}, far above the model's {modelled}");
    // Without bundles the same visits cost a tenth of a receive, a send and a delete each.
    let unbundled = (count + 3 * visits) as f64 / 10.0;
    assert!((moving as f64) < unbundled, "bundles spent {moving}, no fewer than the {unbundled} of ten to a request");
}
