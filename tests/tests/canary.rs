//! The lateness canary on a real RabbitMQ: `serve` sends a probe through each
//! strategy every period, consumes them from its own queue, and exports the
//! lateness per strategy as a histogram; none arrives early.

use std::time::Duration;

use hourglass::service::Service;
use hourglass_e2e::serve::Served;
use hourglass_e2e::*;

/// How late the latest probe may be, in seconds: a bucket bound of the
/// lateness histogram (powers of two from 1 ms). Every probe must fall in it,
/// so one late probe cannot hide among the others as it could in a mean.
/// Measured (1 s probes, binary levels and hold queues, 2026-12-02): the
/// latest within the 32, 64 and 128 ms buckets beside another test, and the
/// 256 ms bucket once with a cargo build beside it too. A probe one 1 s hop
/// off would be in the 1,024 ms bucket.
const ON_TIME_BUCKET_S: f64 = 0.256;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_strategy_gets_a_probe_whose_lateness_is_exported_and_never_early() {
    let (levels, held, canary_queue) = (unique("canary-levels"), unique("canary-held"), unique("canary"));
    let text = config_text(
        &format!("planner = \"binary-levels\"\nprefix = \"{levels}\""),
        &format!(
            "[service.canary]\nqueue = \"{canary_queue}\"\nevery = \"300ms\"\ndelay = \"1s\"\n\n\
             [strategies.held]\nplanner = \"hold-queues\"\nprefix = \"{held}\"\n"
        ),
    );
    let config = hourglass::config::Config::parse(std::path::Path::new("canary.toml"), format!("default_strategy = \"main\"\n{text}")).unwrap();
    // Both strategies' static topology (hold-queues' per-delay queues expire on
    // their own) and the canary's queue, deleted also when the test fails.
    let cleanup = Cleanup::declared(&topologies_of(&config, &["main", "held"]));
    cleanup.queue(&canary_queue);
    let connection = connect().await;
    let served = Served::start(Service::start(config.clone()).await.expect("service starts")).await;
    until("the canary consuming (readyz 200)", Duration::from_secs(10), async || served.http.call("GET", "/readyz", None, None).await.0 == 200).await;
    let channel = connection.create_channel().await.unwrap();
    let passive = lapin::options::QueueDeclareOptions { passive: true, ..Default::default() };
    let queue = channel.queue_declare(canary_queue.as_str().into(), passive, Default::default()).await.expect("the canary queue is declared");
    assert_eq!(queue.consumer_count(), 1, "serve consumes its canary queue");

    for strategy in ["main", "held"] {
        let count = format!("hourglass_delivery_lateness_seconds_count{{strategy=\"{strategy}\"}}");
        until(&format!("three probes through {strategy}"), Duration::from_secs(15), async || served.http.metric(&count).await >= 3.0).await;
        let (probes, latest_s) = served.http.histogram_max_bucket("hourglass_delivery_lateness_seconds", &format!("strategy=\"{strategy}\"")).await;
        eprintln!("{strategy}: {probes} probes, the latest at most {:.0} ms late (histogram bucket)", latest_s * 1_000.0);
        assert!(
            probes >= 3 && latest_s <= ON_TIME_BUCKET_S,
            "{strategy}: of {probes} probes the latest was up to {latest_s} s late (window {ON_TIME_BUCKET_S} s)"
        );
    }
    // `early_canary_probes_are_counted_and_logged` shows this count appears once a probe is early.
    assert_eq!(served.http.metric("hourglass_delivery_early_total").await, 0.0, "no probe arrived early");

    served.stop().await;
}

/// A probe that arrives before its due time is counted in
/// `hourglass_delivery_early_total{strategy}` and logged as an error. Two
/// probes shaped like another host's are put straight on the canary queue,
/// due a minute from now: one as probes are sent (`canary-sent` plus
/// `hourglass-delay-ms`), one as older hosts sent them (`hourglass-due-at`
/// only). Without this, `early_total == 0` above would pass even if the canary
/// never counted anything early: the family has no sample until it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_canary_probes_are_counted_and_logged() {
    use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
    use lapin::types::{AMQPValue, FieldTable, ShortString};

    let (prefix, canary_queue) = (unique("canary-early"), unique("canary"));
    // One period an hour: the host's own probes (one per strategy at start) stay out of the way.
    let text = config_text(
        &format!("planner = \"binary-levels\"\nprefix = \"{prefix}\""),
        &format!("[service.canary]\nqueue = \"{canary_queue}\"\nevery = \"1h\"\ndelay = \"1s\"\n"),
    );
    let config = hourglass::config::Config::parse(std::path::Path::new("canary.toml"), text.clone()).unwrap();
    let cleanup = Cleanup::declared(&topology_of(&config));
    cleanup.queue(&canary_queue);
    let path = std::env::temp_dir().join(format!("{}.toml", unique("canary-early")));
    std::fs::write(&path, &text).unwrap();
    let process = hourglass_e2e::process::ServeProcess::start(&path);
    until("the canary consuming (readyz 200)", Duration::from_secs(20), async || process.http.call("GET", "/readyz", None, None).await.0 == 200).await;

    let connection = connect().await;
    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    let due = hourglass::clock::unix_now_ms() as i64 + 60_000;
    let probes: [Vec<(&str, AMQPValue)>; 2] = [
        vec![
            ("canary-clock", AMQPValue::LongString("another-host".into())),
            ("canary-sent", AMQPValue::LongLongInt(due - 1_000)),
            ("hourglass-delay-ms", AMQPValue::LongLongInt(1_000)),
        ],
        vec![("hourglass-due-at", AMQPValue::LongLongInt(due))],
    ];
    for headers in probes {
        let mut table = FieldTable::default();
        for (name, value) in headers {
            table.insert(ShortString::from(name), value);
        }
        let properties = lapin::BasicProperties::default().with_headers(table);
        let confirm = channel.basic_publish("".into(), canary_queue.as_str().into(), BasicPublishOptions::default(), b"main", properties).await.unwrap();
        confirm.await.unwrap();
    }

    let early = "hourglass_delivery_early_total{strategy=\"main\"}";
    until("both early probes counted", Duration::from_secs(10), async || process.http.metric(early).await >= 2.0).await;
    assert_eq!(process.http.metric(early).await, 2.0, "exactly the two early probes counted early");
    let logged = || process.log().iter().filter(|l| l.contains("canary probe arrived EARLY") && l.contains("strategy=main")).count();
    until("both early probes logged", Duration::from_secs(5), async || logged() >= 2).await;
    assert_eq!(logged(), 2, "each early probe logged once: {:#?}", process.log());
    drop(process);
    std::fs::remove_file(&path).ok();
}
