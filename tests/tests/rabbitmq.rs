//! Delayed delivery on a real RabbitMQ: timing, integrity, and failures that
//! must be loud.

use std::collections::HashMap;
use std::time::Duration;

use hourglass::broker::rabbitmq::RabbitMqExecutor;
use hourglass::command::{AmqpCommand, Command, ExchangeKind, FieldTable, FieldValue};
use hourglass::executor::{Envelope, Executor, ExecutorError};
use hourglass::message::Properties;
use hourglass::scheduler::{ScheduleRequest, Scheduled};
use hourglass_e2e::*;
use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable as AmqpTable};

/// Schedules one message per delay and checks each arrives no earlier than
/// due and within `tolerance_ms` after, with body, headers and properties intact.
async fn assert_delays_on_time(strategy_table: &str, delays_ms: &[u64], tolerance_ms: u64) {
    let config = config(strategy_table);
    // Deletes what the test declares, also when it fails.
    let cleanup = Cleanup::declared(&topology_of(&config));
    let connection = connect().await;
    let mut destination = Destination::declare(&connection, "dest").await;
    cleanup.queue(&destination.name);
    let scheduler = scheduler(&config).await;
    let mut sent: HashMap<String, (usize, Scheduled)> = HashMap::new();
    for (i, &delay_ms) in delays_ms.iter().enumerate() {
        let request = ScheduleRequest {
            destination: destination.name.clone(),
            delay_ms,
            body: format!("body-{i}").into_bytes(),
            headers: [("x-app".to_string(), FieldValue::Text(format!("value-{i}")))].into(),
            properties: Properties { content_type: Some("text/plain".into()), correlation_id: Some(format!("corr-{i}")), ..Default::default() },
            ..Default::default()
        };
        let scheduled = scheduler.schedule(request).await.expect("schedule");
        sent.insert(scheduled.id.clone(), (i, scheduled));
    }
    let longest = delays_ms.iter().max().copied().unwrap_or(0);
    let received = destination.receive(delays_ms.len(), Duration::from_millis(longest + 10_000)).await;
    let lateness: Vec<i64> = received
        .iter()
        .map(|m| m.at_ms as i64 - sent[&m.delivery.properties.message_id().as_ref().expect("message id").to_string()].1.due_at_ms as i64)
        .collect();
    eprintln!("lateness (ms) of delays {delays_ms:?} in arrival order: {lateness:?}; window {tolerance_ms} ms");
    for message in &received {
        let id = message.delivery.properties.message_id().as_ref().expect("message id").to_string();
        let (i, scheduled) = &sent[&id];
        let late = message.at_ms as i64 - scheduled.due_at_ms as i64;
        assert!(late >= 0, "message {i} (delay {}ms) arrived {}ms early", delays_ms[*i], -late);
        assert!(late <= tolerance_ms as i64, "message {i} (delay {}ms) arrived {late}ms late", delays_ms[*i]);
        assert_eq!(message.delivery.data, format!("body-{i}").into_bytes());
        assert_eq!(header_text(&message.delivery, "x-app"), Some(format!("value-{i}")));
        assert_eq!(header_int(&message.delivery, "hourglass-due-at"), Some(scheduled.due_at_ms as i64));
        assert_eq!(header_int(&message.delivery, "hourglass-delay-ms"), Some(delays_ms[*i] as i64));
        assert_eq!(message.delivery.properties.content_type().as_ref().map(|c| c.to_string()), Some("text/plain".into()));
        assert_eq!(message.delivery.properties.correlation_id().as_ref().map(|c| c.to_string()), Some(format!("corr-{i}")));
        assert_eq!(*message.delivery.properties.delivery_mode(), Some(2), "persistent");
        assert!(header(&message.delivery, "BCC").is_none(), "the broker strips BCC keys before a consumer");
    }
    destination.assert_quiet(Duration::from_millis(300)).await;
}

const SECONDS: [u64; 6] = [0, 1_000, 2_000, 3_000, 5_000, 7_000];

/// The window for [`SECONDS`] on strategies of 1 s precision. The delays are
/// whole units, so the precision step adds nothing: what is left is the
/// broker's dead-lettering and the consumer, measured 5–24 ms late (five
/// strategies, two tests at a time, 2026-12-02; the test prints each). The
/// window is wider than early.rs's 100 ms (see below): a message one 1 s hop off is 1,000 ms late.
/// (It was 1,000 ms, which a whole extra hop passed.)
/// On RabbitMQ 4.3, in a full run of its tests, a whole-second path measured up to 103 ms (interop.rs nsb-v2); 250 ms holds on both, and a missed 1 s hop is still 1,000 ms late.
const SECONDS_ON_TIME_MS: u64 = 250;

#[tokio::test]
async fn binary_levels_classic_delivers_on_time() {
    let prefix = unique("bl");
    let table = format!("planner = \"binary-levels\"\nprefix = \"{prefix}\"\nqueue_type = \"classic\"");
    assert_delays_on_time(&table, &SECONDS, SECONDS_ON_TIME_MS).await;
}

#[tokio::test]
async fn binary_levels_quorum_by_default_delivers_on_time() {
    let prefix = unique("blq");
    let table = format!("planner = \"binary-levels\"\nprefix = \"{prefix}\"");
    assert_delays_on_time(&table, &SECONDS, SECONDS_ON_TIME_MS).await;
}

/// Both routings (direct, the default, and topic, the levels of earlier
/// versions) on both queue types, at millisecond units: a message waits only
/// in the levels of its set bits. 1,023 and 2,047 ms pass through 10 and 11
/// levels, a dead-lettering each: measured alone 11–23 ms late, beside the
/// full suite once 222 ms; the window is 250 ms (the millisecond test below,
/// with at most 6 levels, keeps 100).
#[tokio::test]
async fn binary_levels_deliver_on_time_with_either_routing_on_quorum_and_classic_levels() {
    for routing in ["direct", "topic"] {
        for queue_type in ["quorum", "classic"] {
            let prefix = unique("blr");
            let table = format!("planner = \"binary-levels\"\nprefix = \"{prefix}\"\nunit = \"1ms\"\nrouting = \"{routing}\"\nqueue_type = \"{queue_type}\"");
            assert_delays_on_time(&table, &[0, 250, 1_023, 1_300, 2_047], 250).await;
        }
    }
}

/// Seconds levels with `precision = "125ms"`: the part of a delay below the
/// unit waits in sub-levels first, so a 1.3 s delay arrives after 1.375 s, not
/// 2 s. The window is the 125 ms step plus the millisecond test's 100 ms; the
/// unit's rounding alone would put 300 ms and 1,300 ms 700 ms late.
#[tokio::test]
async fn binary_levels_with_sub_second_precision_deliver_to_the_step_on_quorum_and_classic_levels() {
    for queue_type in ["quorum", "classic"] {
        let prefix = unique("blp");
        let table = format!("planner = \"binary-levels\"\nprefix = \"{prefix}\"\nprecision = \"125ms\"\nqueue_type = \"{queue_type}\"");
        assert_delays_on_time(&table, &[0, 300, 1_000, 1_300, 2_060, 3_900], 125 + 100).await;
    }
}

#[tokio::test]
async fn binary_levels_with_topic_routing_in_seconds_deliver_on_time() {
    let prefix = unique("blts");
    let table = format!("planner = \"binary-levels\"\nprefix = \"{prefix}\"\nrouting = \"topic\"");
    assert_delays_on_time(&table, &SECONDS, SECONDS_ON_TIME_MS).await;
}

#[tokio::test]
async fn hold_queues_deliver_on_time() {
    let prefix = unique("hold");
    let table = format!("planner = \"hold-queues\"\nprefix = \"{prefix}\"\nexpires_margin = \"5s\"");
    assert_delays_on_time(&table, &SECONDS, SECONDS_ON_TIME_MS).await;
}

#[tokio::test]
async fn fixed_intervals_deliver_on_time() {
    let prefix = unique("fi");
    let table = format!("planner = \"fixed-intervals\"\nprefix = \"{prefix}\"\nintervals = [\"1s\", \"2s\", \"3s\", \"5s\", \"7s\"]");
    assert_delays_on_time(&table, &SECONDS, SECONDS_ON_TIME_MS).await;
}

#[tokio::test]
async fn binary_levels_in_milliseconds_is_sub_second_precise() {
    let prefix = unique("ms");
    let table = format!("planner = \"binary-levels\"\nprefix = \"{prefix}\"\nunit = \"1ms\"");
    assert_delays_on_time(&table, &[250, 1_300], 100).await;
}

#[tokio::test]
async fn scheduling_to_a_missing_destination_fails_clearly() {
    let prefix = unique("missing");
    let config = config(&format!("planner = \"binary-levels\"\nprefix = \"{prefix}\""));
    let _cleanup = Cleanup::declared(&topology_of(&config));
    let scheduler = scheduler(&config).await;
    let destination = unique("no-such-queue");
    let request = ScheduleRequest { destination: destination.clone(), delay_ms: 1_000, ..Default::default() };
    let err = scheduler.schedule(request).await.unwrap_err().to_string();
    assert!(err.contains(&format!("destination queue \"{destination}\" does not exist")), "{err}");
}

#[tokio::test]
async fn an_unroutable_publish_comes_back_as_an_error() {
    let exchange = unique("dead-end");
    let declare =
        Command::Amqp(AmqpCommand::DeclareExchange { name: exchange.clone(), kind: ExchangeKind::Topic, durable: true, arguments: FieldTable::new() });
    let _cleanup = Cleanup::declared(std::slice::from_ref(&declare));
    let executor = RabbitMqExecutor::connect(&amqp_url()).await.unwrap();
    executor.apply(std::slice::from_ref(&declare)).await.unwrap();
    let publish = Command::forward(&exchange, "nobody.listens");
    let envelope = Envelope { id: "m1".into(), body: b"x".to_vec(), headers: FieldTable::new(), properties: Properties::default(), stamp_message_id: true };
    let err = executor.send(&[publish], &envelope).await.unwrap_err();
    assert!(matches!(err, ExecutorError::Unroutable(_)), "{err}");
    assert!(err.to_string().contains("NO_ROUTE"), "{err}");
}

#[tokio::test]
async fn an_existing_queue_with_other_arguments_is_named_with_the_difference() {
    let prefix = unique("clash");
    let config = config(&format!("planner = \"binary-levels\"\nprefix = \"{prefix}\""));
    let _cleanup = Cleanup::declared(&topology_of(&config));
    let connection = connect().await;
    let clashing = format!("{prefix}.direct-level-00");
    let channel = connection.create_channel().await.unwrap();
    let mut arguments = AmqpTable::default();
    arguments.insert("x-message-ttl".into(), AMQPValue::LongLongInt(5));
    channel.queue_declare(clashing.as_str().into(), QueueDeclareOptions { durable: true, ..Default::default() }, arguments).await.unwrap();

    let scheduler = scheduler(&config).await;
    let err = scheduler.apply_topology("main").await.unwrap_err().to_string();
    assert!(err.contains(&format!("queue \"{clashing}\"")), "{err}");
    assert!(err.contains("x-message-ttl=1000"), "names what hourglass wanted: {err}");
    assert!(err.contains("PRECONDITION_FAILED") && err.contains("x-message-ttl"), "and what the broker said: {err}");
}

#[tokio::test]
async fn applying_the_topology_twice_is_harmless() {
    let prefix = unique("twice");
    let config = config(&format!("planner = \"fixed-intervals\"\nprefix = \"{prefix}\"\nintervals = [\"1s\"]"));
    let _cleanup = Cleanup::declared(&topology_of(&config));
    let scheduler = scheduler(&config).await;
    scheduler.apply_topology("main").await.unwrap();
    scheduler.apply_topology("main").await.expect("a second apply changes nothing");
}

#[tokio::test]
async fn many_messages_with_a_window_of_confirms_all_arrive() {
    let prefix = unique("window");
    let config = config(&format!("planner = \"binary-levels\"\nprefix = \"{prefix}\""));
    let cleanup = Cleanup::declared(&topology_of(&config));
    let connection = connect().await;
    let mut destination = Destination::declare(&connection, "window").await;
    cleanup.queue(&destination.name);
    let scheduler = scheduler(&config).await;
    let requests: Vec<ScheduleRequest> = (0..500)
        .map(|i| ScheduleRequest {
            destination: destination.name.clone(),
            delay_ms: if i % 2 == 0 { 1_000 } else { 2_000 },
            body: format!("{i}").into_bytes(),
            ..Default::default()
        })
        .collect();
    let results = scheduler.schedule_many(requests, 100).await;
    let ids: Vec<String> = results.into_iter().map(|r| r.expect("every publish confirmed").id).collect();
    let received = destination.receive(500, Duration::from_secs(15)).await;
    let mut got: Vec<String> = received.iter().map(|r| r.delivery.properties.message_id().as_ref().unwrap().to_string()).collect();
    let mut want = ids.clone();
    got.sort();
    want.sort();
    assert_eq!(got, want, "every confirmed message arrived exactly once");
    destination.assert_quiet(Duration::from_millis(300)).await;
}
