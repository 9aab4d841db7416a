//! Later, never earlier: what a producer puts on a message at ingress cannot
//! make it leave its delay before its due time. `expiration` is never
//! forwarded (a short one would dead-letter the message out of a delay queue
//! early, or drop it), and dead-letter records the client brought (`x-death`,
//! `x-first-death-*`, `x-last-death-*`) are stripped, so they neither travel on
//! nor trip the broker's dead-letter cycle detection. A plain canary rides
//! beside them and must arrive the same way.

use std::time::Duration;

use hourglass::broker::rabbitmq::consume::long_string;
use hourglass::clock::unix_now_ms;
use hourglass::headers::{DESTINATION_HEADER, REQUESTED_DELAY_HEADER};
use hourglass::service::Service;
use hourglass_e2e::serve::Served;
use hourglass_e2e::*;
use lapin::BasicProperties;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldArray, FieldTable, ShortString};

/// How late a message may arrive after its due time and still count as on
/// time. Measured here: 5-6 ms after due (RabbitMQ 3.10, loopback, with two
/// cargo builds loading the 2-core machine), and 130 ms once in the full
/// suite while its Rust planner projects compiled beside it; the window
/// leaves room for that without hiding a missed hop (the shortest level is 1 s).
const ON_TIME_MS: u64 = 250;

/// Header entries as a test writes them.
type Headers<'a> = Vec<(&'a str, AMQPValue)>;

fn table(entries: Vec<(&str, AMQPValue)>) -> FieldTable {
    let mut table = FieldTable::default();
    for (k, v) in entries {
        table.insert(ShortString::from(k), v);
    }
    table
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiration_and_stale_death_records_never_make_a_message_early() {
    let prefix = unique("early");
    let ingress_queue = unique("early-in");
    let invalid_queue = unique("early-invalid");
    let config = config_with(
        &format!("planner = \"binary-levels\"\nprefix = \"{prefix}\""),
        &format!("[service.ingress]\nqueue = \"{ingress_queue}\"\ninvalid_queue = \"{invalid_queue}\""),
    );
    // Deletes what the test declares, also when it fails.
    let cleanup = Cleanup::declared(&topology_of(&config));
    cleanup.ingress(&config);
    let connection = connect().await;
    let mut destination = Destination::declare(&connection, "early-dest").await;
    cleanup.queue(&destination.name);
    let served = Served::start(Service::start(config.clone()).await.expect("service starts")).await;
    until("the ingress consuming (readyz 200)", Duration::from_secs(10), async || served.http.call("GET", "/readyz", None, None).await.0 == 200).await;

    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    let stale_death = AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::FieldTable(table(vec![
        ("queue", long_string("somebody-elses-queue")),
        ("reason", long_string("expired")),
        ("count", AMQPValue::LongLongInt(1)),
        ("exchange", long_string("")),
    ]))]));
    let cases: Vec<(&str, BasicProperties, Headers)> = vec![
        ("canary", BasicProperties::default(), vec![]),
        // Far shorter than the 3 s delay: forwarded, it would expire out of the first delay queue.
        ("short-expiration", BasicProperties::default().with_expiration("200".into()), vec![]),
        (
            "stale-death-records",
            BasicProperties::default(),
            vec![("x-death", stale_death), ("x-first-death-queue", long_string("somebody-elses-queue")), ("x-last-death-reason", long_string("client-made"))],
        ),
    ];
    let delay_ms = 3_000;
    let sent_at = unix_now_ms();
    for (body, properties, extra) in &cases {
        let mut headers = vec![(DESTINATION_HEADER, long_string(&destination.name)), (REQUESTED_DELAY_HEADER, AMQPValue::LongInt(delay_ms))];
        headers.extend(extra.iter().cloned());
        channel
            .basic_publish(
                "".into(),
                ingress_queue.as_str().into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                properties.clone().with_headers(table(headers)),
            )
            .await
            .unwrap()
            .await
            .expect("broker confirmed the ingress publish");
    }

    let received = destination.receive(cases.len(), Duration::from_secs(15)).await;
    for got in &received {
        let body = String::from_utf8_lossy(&got.delivery.data).to_string();
        let Some(AMQPValue::LongLongInt(due_at)) = header(&got.delivery, "hourglass-due-at") else { panic!("{body}: no due-at header") };
        let due_at = *due_at as u64;
        assert!(due_at >= sent_at + delay_ms as u64, "{body}: due {due_at} before sent + delay {}", sent_at + delay_ms as u64);
        assert!(got.at_ms >= due_at, "{body} arrived {} ms early", due_at - got.at_ms);
        assert!(got.at_ms <= due_at + ON_TIME_MS, "{body} arrived {} ms late (window {ON_TIME_MS} ms)", got.at_ms - due_at);
        assert!(got.delivery.properties.expiration().is_none(), "{body}: expiration was forwarded");
        let headers = format!("{:?}", got.delivery.properties.headers());
        assert!(!headers.contains("somebody-elses-queue") && !headers.contains("client-made"), "{body}: the client's death records travelled on: {headers}");
        eprintln!("{body}: {} ms after due", got.at_ms - due_at);
    }
    let mut bodies: Vec<String> = received.iter().map(|r| String::from_utf8_lossy(&r.delivery.data).to_string()).collect();
    bodies.sort();
    assert_eq!(bodies, ["canary", "short-expiration", "stale-death-records"]);
    destination.assert_quiet(Duration::from_millis(500)).await;

    served.stop().await;
    let reader = connection.create_channel().await.unwrap();
    assert_eq!(queue_depth(&reader, &invalid_queue).await, 0, "nothing was set aside");
}
