//! The AMQP ingress on a real RabbitMQ: valid messages are forwarded and
//! delayed with their body, properties and headers intact; invalid ones land
//! in the invalid-messages queue with the reason; the counts add up.

use std::time::Duration;

use hourglass::broker::rabbitmq::consume::long_string;
use hourglass::headers::{DESTINATION_HEADER, INVALID_REASON_HEADER, REQUESTED_DELAY_HEADER as DELAY_HEADER, STRATEGY_HEADER};
use hourglass::service::Service;
use hourglass_e2e::serve::Served;
use hourglass_e2e::*;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel};

async fn publish(channel: &Channel, queue: &str, body: &str, headers: Vec<(&str, AMQPValue)>, properties: BasicProperties) {
    let mut table = FieldTable::default();
    for (k, v) in headers {
        table.insert(ShortString::from(k), v);
    }
    channel
        .basic_publish("".into(), queue.into(), BasicPublishOptions::default(), body.as_bytes(), properties.with_headers(table))
        .await
        .unwrap()
        .await
        .expect("broker confirmed the ingress publish");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingress_forwards_valid_messages_and_sets_invalid_ones_aside_with_the_reason() {
    let connection = connect().await;
    let prefix = unique("ingress");
    let ingress_queue = unique("ingress-in");
    let invalid_queue = unique("ingress-invalid");
    let config = config_with(
        &format!("planner = \"binary-levels\"\nprefix = \"{prefix}\""),
        &format!("[service.ingress]\nqueue = \"{ingress_queue}\"\ninvalid_queue = \"{invalid_queue}\"\nprefetch = 4"),
    );
    let mut destination = Destination::declare(&connection, "ingress-dest").await;
    let served = Served::start(Service::start(config.clone()).await.expect("service starts")).await;
    until("the ingress consuming (readyz 200)", Duration::from_secs(10), async || served.http.call("GET", "/readyz", None, None).await.0 == 200)
        .await;

    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    let dest = destination.name.as_str();
    const VALID: usize = 6;
    for i in 0..VALID {
        let delay = if i % 2 == 0 { long_string("1s") } else { AMQPValue::LongInt(1500) };
        let properties = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_correlation_id(format!("corr-{i}").into())
            .with_message_id(format!("mine-{i}").into());
        let headers = vec![(DESTINATION_HEADER, long_string(dest)), (DELAY_HEADER, delay), ("tenant", long_string("acme")), ("score", AMQPValue::Double(0.25))];
        publish(&channel, &ingress_queue, &format!("valid-{i}"), headers, properties).await;
    }
    let absent = unique("absent");
    let invalid: Vec<(&str, Vec<(&str, AMQPValue)>, &str)> = vec![
        ("no-destination", vec![(DELAY_HEADER, long_string("1s"))], "missing header hourglass-destination"),
        ("bad-delay", vec![(DESTINATION_HEADER, long_string(dest)), (DELAY_HEADER, long_string("soon"))], "hourglass-delay"),
        ("unknown-destination", vec![(DESTINATION_HEADER, long_string(&absent)), (DELAY_HEADER, long_string("1s"))], "does not exist"),
        (
            "unknown-strategy",
            vec![(DESTINATION_HEADER, long_string(dest)), (DELAY_HEADER, long_string("1s")), (STRATEGY_HEADER, long_string("nope"))],
            "unknown strategy",
        ),
    ];
    for (body, headers, _) in &invalid {
        publish(&channel, &ingress_queue, body, headers.clone(), BasicProperties::default()).await;
    }

    let received = destination.receive(VALID, Duration::from_secs(10)).await;
    for got in &received {
        let body = String::from_utf8_lossy(&got.delivery.data).to_string();
        let i: usize = body.strip_prefix("valid-").and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("unexpected body {body}"));
        let props = &got.delivery.properties;
        assert_eq!(props.content_type().as_ref().map(|c| c.as_str()), Some("application/json"));
        assert_eq!(props.correlation_id().as_ref().map(|c| c.to_string()), Some(format!("corr-{i}")));
        assert_eq!(props.message_id().as_ref().map(|c| c.to_string()), Some(format!("mine-{i}")), "the producer's message id is kept");
        assert_eq!(header(&got.delivery, "tenant"), Some(&long_string("acme")));
        assert_eq!(header(&got.delivery, "score"), Some(&AMQPValue::Double(0.25)), "header types survive");
        assert!(header(&got.delivery, DESTINATION_HEADER).is_none() && header(&got.delivery, DELAY_HEADER).is_none());
        let Some(AMQPValue::LongLongInt(due_at)) = header(&got.delivery, "hourglass-due-at") else { panic!("no due-at header") };
        assert!(got.at_ms >= *due_at as u64, "{body} arrived {} ms early", *due_at as u64 - got.at_ms);
    }
    destination.assert_quiet(Duration::from_millis(500)).await;

    let reader = connection.create_channel().await.unwrap();
    let set_aside = get_at_least(&reader, &invalid_queue, invalid.len(), Duration::from_secs(10)).await;
    let shown: Vec<(String, Option<String>)> = set_aside.iter().map(|d| (String::from_utf8_lossy(&d.data).into_owned(), header_text(d, INVALID_REASON_HEADER))).collect();
    assert_eq!(set_aside.len(), invalid.len(), "set aside: {shown:?}");
    for (body, _, reason) in &invalid {
        let got = set_aside.iter().find(|d| d.data == body.as_bytes()).unwrap_or_else(|| panic!("{body} not set aside"));
        let Some(AMQPValue::LongString(why)) = header(got, INVALID_REASON_HEADER) else { panic!("{body}: no reason header") };
        let why = String::from_utf8_lossy(why.as_bytes());
        assert!(why.contains(reason), "{body}: reason {why:?} should mention {reason:?}");
    }
    until("the ingress queue drained and acked", Duration::from_secs(5), async || queue_depth(&reader, &ingress_queue).await == 0).await;

    let forwarded = served.http.metric("hourglass_ingress_messages_total{outcome=\"forwarded\"}").await;
    let set_aside_count = served.http.metric("hourglass_ingress_messages_total{outcome=\"invalid\"}").await;
    assert_eq!((forwarded, set_aside_count), (VALID as f64, invalid.len() as f64), "in = forwarded + invalid");
    assert_eq!(served.http.metric("hourglass_ingress_in_flight ").await, 0.0);
    // Planning comes before anything touches the broker, so the message to the absent destination was planned too.
    assert_eq!(served.http.metric("hourglass_planner_call_seconds_count").await, VALID as f64 + 1.0, "one plan per forwarded message, plus the absent destination's");

    served.stop().await;
    for queue in [&ingress_queue, &invalid_queue] {
        reader.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await.ok();
    }
    delete_declared(&connection, &topology_of(&config)).await;
    destination.delete().await;
}
