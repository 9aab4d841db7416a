//! Clock truth: a host whose clock is wrong delivers nothing early. Each
//! host here runs in this process with a wall clock of its own
//! ([`ShiftedClock`]: the system's, moved; the monotonic clock untouched, as
//! on a real skewed machine), reads the broker's clock from the management
//! API's `Date` header, and counts due times on it. Before this, a host 5 s
//! ahead answered `deliver_at = now + 4 s` with 202 and delivered at once.
//!
//! "Early" is judged by the receiver's clock: this test process's own, the
//! system's. The broker runs on this machine, so that is also the broker's
//! clock (the one its TTLs run on and its `Date` headers read).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use hourglass::broker::rabbitmq::consume::long_string;
use hourglass::clock::{Clock, ShiftedClock, unix_now_ms};
use hourglass::config::Config;
use hourglass::headers::{DELIVER_AT_HEADER, DESTINATION_HEADER, REQUESTED_DELAY_HEADER};
use hourglass::service::Service;
use hourglass_e2e::serve::Served;
use hourglass_e2e::*;
use lapin::BasicProperties;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use serde_json::{Value, json};

/// How late a plain delay may arrive after it was asked for plus its delay:
/// the 1 ms levels' own hops (tests/tests/cancel.rs measured 27-72 ms).
/// Measured here: 15-140 ms, hosts skewed or not, two tests at a time; one
/// CI run beside the whole suite measured 673 ms for a 3 s delay.
const ON_TIME_MS: u64 = 750;
/// How late a `deliver_at` (or a reschedule to a time) may arrive: hourglass
/// counts its delay from the earliest the broker's clock can read by its
/// readings, so it is late by what they cannot tell ([`CLOCK_ERROR_MS`]:
/// up to 2 s at the first reading, as here, where every host is fresh).
/// Measured here: 0.37-1.9 s after the time asked.
const DUE_AT_WINDOW_MS: u64 = CLOCK_ERROR_MS + ON_TIME_MS;
/// How far a plain delay's answered due time may be before its truth (asked
/// plus delay): a host the readings show off reports it from the earliest
/// the broker's clock can read. The message itself is on time (its TTLs run
/// on the broker).
const DELAY_WINDOW_MS: u64 = CLOCK_ERROR_MS + ON_TIME_MS;

/// `main`: binary levels of 1 ms (no whole-second rounding, so the windows
/// above measure the clock, not the levels) with `settings`, `more` after it.
fn config(stem: &str, settings: &str, more: &str) -> (Config, Cleanup) {
    let config = config_with(&format!("planner = \"binary-levels\"\nprefix = \"{}\"\nunit = \"1ms\"\n{settings}", unique(stem)), more);
    let cleanup = Cleanup::declared(&topology_of(&config));
    (config, cleanup)
}

/// A serving host whose wall clock is the system's moved by `shift_ms`.
async fn host(config: &Config, shift_ms: i64) -> (Served, Arc<ShiftedClock>) {
    let wall = ShiftedClock::new(shift_ms);
    let service = Service::start_with_clock(config.clone(), Clock::new(wall.clone())).await.expect("service starts");
    let served = Served::start(service).await;
    until("readyz 200", Duration::from_secs(10), async || served.http.call("GET", "/readyz", None, None).await.0 == 200).await;
    (served, wall)
}

/// The host's `hourglass_clock_offset_seconds` and its error, checked to
/// say its clock is `shift_ms` off (broker minus host: minus the shift).
async fn assert_offset(served: &Served, shift_ms: i64) -> (f64, f64) {
    let offset = served.http.metric("hourglass_clock_offset_seconds").await;
    let error = served.http.metric("hourglass_clock_offset_error_seconds").await;
    let expected = -(shift_ms as f64) / 1_000.0;
    // The middle of the readings may sit off the truth by their error; 50 ms for the round trips and rounding.
    assert!((offset - expected).abs() <= error + 0.05, "offset {offset} s ± {error} s, the host's clock is {shift_ms} ms off");
    assert!(error <= 1.1, "one Date header bounds the offset within about ±1 s; got ±{error} s");
    eprintln!("host {shift_ms:+} ms: hourglass_clock_offset_seconds {offset:.3} ± {error:.3}");
    (offset, error)
}

fn rfc3339(unix_ms: u64) -> String {
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(unix_ms)).to_string()
}

/// What a message must satisfy on arrival.
struct Expected {
    /// Not before this (Unix ms, the receiver's clock).
    not_before: u64,
    /// Nor after this.
    not_after: u64,
    /// The due time it was answered with, if it went through the HTTP API.
    answered_due_at: Option<u64>,
}

/// `POST /v1/messages` with `timing` (`delay` or `deliver_at`); the answer's due time.
async fn post(served: &Served, destination: &str, body: &str, timing: Value) -> u64 {
    let mut request = json!({ "destination": destination, "body": body });
    request.as_object_mut().unwrap().extend(timing.as_object().unwrap().clone());
    let (status, answer) = served.http.schedule(None, request).await;
    assert_eq!(status, 202, "{answer}");
    answer["due_at"].as_u64().unwrap()
}

/// Schedules, through `served`, one message for `deliver_at = now + at_in_ms`
/// and one with `delay = delay_ms`, each named `<label>-at` and
/// `<label>-delay`, and says what each must satisfy.
async fn post_pair(served: &Served, destination: &str, label: &str, at_in_ms: u64, delay_ms: u64, expected: &mut HashMap<String, Expected>) {
    let at = unix_now_ms() + at_in_ms;
    let due_at = post(served, destination, &format!("{label}-at"), json!({ "deliver_at": rfc3339(at) })).await;
    assert!(due_at >= at, "{label}: answered due_at {due_at} before the deliver_at asked, {at}");
    assert!(due_at - at <= DUE_AT_WINDOW_MS, "{label}: answered due_at {} ms after deliver_at", due_at - at);
    expected.insert(format!("{label}-at"), Expected { not_before: at, not_after: at + DUE_AT_WINDOW_MS, answered_due_at: Some(due_at) });
    let sent = unix_now_ms();
    let due_at = post(served, destination, &format!("{label}-delay"), json!({ "delay": delay_ms })).await;
    let truth = unix_now_ms() + delay_ms;
    // Before this change: off by the host's whole skew.
    assert!(due_at <= truth && truth - due_at <= DELAY_WINDOW_MS, "{label}: answered due_at {due_at} is {} ms off the truth", truth as i64 - due_at as i64);
    expected.insert(format!("{label}-delay"), Expected { not_before: sent + delay_ms, not_after: truth + ON_TIME_MS, answered_due_at: Some(due_at) });
}

/// Receives every expected message and checks it: never before its time, by
/// the receiver's clock, nor before the due time it was answered with or
/// carries; within its window after.
async fn receive_all(destination: &mut Destination, expected: &HashMap<String, Expected>, deadline: Duration) {
    let received = destination.receive(expected.len(), deadline).await;
    for got in &received {
        let body = String::from_utf8_lossy(&got.delivery.data).to_string();
        let want = expected.get(&body).unwrap_or_else(|| panic!("unexpected message {body}"));
        let early = want.not_before as i64 - got.at_ms as i64;
        assert!(early <= 0, "{body} arrived {early} ms early");
        if let Some(due_at) = want.answered_due_at {
            assert!(got.at_ms >= due_at, "{body} arrived {} ms before the due time it was answered with", due_at - got.at_ms);
        }
        let carried = header_int(&got.delivery, "hourglass-due-at").map(|d| d as u64);
        assert!(carried.is_some_and(|due| got.at_ms >= due), "{body} arrived before the hourglass-due-at it carries ({carried:?}, at {})", got.at_ms);
        assert!(got.at_ms <= want.not_after, "{body} arrived {} ms late (window ends at {})", got.at_ms - want.not_before, want.not_after - want.not_before);
        eprintln!("{body}: {} ms after its time", got.at_ms - want.not_before);
    }
    destination.assert_quiet(Duration::from_millis(300)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_5_s_ahead_and_5_s_behind_deliver_nothing_early() {
    let (config, cleanup) = config("clock-skew", "", "");
    let connection = connect().await;
    let mut destination = Destination::declare(&connection, "clock-skew-dest").await;
    cleanup.queue(&destination.name);
    let (ahead, _) = host(&config, 5_000).await;
    let (behind, _) = host(&config, -5_000).await;
    assert_offset(&ahead, 5_000).await;
    assert_offset(&behind, -5_000).await;

    let mut expected = HashMap::new();
    post_pair(&ahead, &destination.name, "ahead", 4_000, 4_000, &mut expected).await;
    post_pair(&behind, &destination.name, "behind", 4_000, 4_000, &mut expected).await;
    // Past by the host ahead, still 2 s away by the truth.
    post_pair(&ahead, &destination.name, "ahead-short", 2_000, 2_000, &mut expected).await;
    receive_all(&mut destination, &expected, Duration::from_secs(15)).await;

    ahead.stop().await;
    behind.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_of_the_host_clock_mid_run_makes_nothing_early() {
    let (config, cleanup) = config("clock-step", "", "");
    let connection = connect().await;
    let mut destination = Destination::declare(&connection, "clock-step-dest").await;
    cleanup.queue(&destination.name);
    let (served, wall) = host(&config, 0).await;
    let (_, error) = assert_offset(&served, 0).await;
    assert!(error > 0.0);

    let mut expected = HashMap::new();
    post_pair(&served, &destination.name, "right", 6_000, 6_000, &mut expected).await;
    // An operator's `date -s`, ten seconds on: the offset shows it at the next scrape, due times do not move.
    wall.set(10_000);
    assert_offset(&served, 10_000).await;
    post_pair(&served, &destination.name, "stepped-ahead", 4_000, 4_000, &mut expected).await;
    // And twenty back.
    wall.set(-10_000);
    assert_offset(&served, -10_000).await;
    post_pair(&served, &destination.name, "stepped-behind", 3_000, 3_000, &mut expected).await;
    receive_all(&mut destination, &expected, Duration::from_secs(15)).await;

    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_3_s_apart_sharing_one_ingress_deliver_nothing_early() {
    let (ingress_queue, invalid_queue) = (unique("clock-in"), unique("clock-invalid"));
    // Prefetch 1: the broker hands the ingress messages to both hosts in turn.
    let (config, cleanup) =
        config("clock-ingress", "", &format!("[service.ingress]\nqueue = \"{ingress_queue}\"\ninvalid_queue = \"{invalid_queue}\"\nprefetch = 1"));
    cleanup.ingress(&config);
    let connection = connect().await;
    let mut destination = Destination::declare(&connection, "clock-ingress-dest").await;
    cleanup.queue(&destination.name);
    // One host right, one 3 s ahead (more than a Date header's error, so the readings always fault it).
    let hosts = [host(&config, 3_000).await.0, host(&config, 0).await.0];
    assert_offset(&hosts[0], 3_000).await;
    assert_offset(&hosts[1], 0).await;

    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    let mut expected = HashMap::new();
    for i in 0..12u64 {
        let (body, timing, not_before, not_after) = if i % 3 == 2 {
            let sent = unix_now_ms();
            (format!("delay-{i}"), AMQPValue::LongInt(3_000), sent + 3_000, sent + 3_000 + ON_TIME_MS)
        } else {
            let at = unix_now_ms() + 3_000 + i * 100;
            (format!("at-{i}"), long_string(&rfc3339(at)), at, at + DUE_AT_WINDOW_MS)
        };
        let name = if body.starts_with("delay") { REQUESTED_DELAY_HEADER } else { DELIVER_AT_HEADER };
        let mut headers = FieldTable::default();
        headers.insert(ShortString::from(DESTINATION_HEADER), long_string(&destination.name));
        headers.insert(ShortString::from(name), timing);
        channel
            .basic_publish(
                "".into(),
                ingress_queue.as_str().into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                BasicProperties::default().with_headers(headers),
            )
            .await
            .unwrap()
            .await
            .expect("broker confirmed the ingress publish");
        expected.insert(body, Expected { not_before, not_after, answered_due_at: None });
    }
    receive_all(&mut destination, &expected, Duration::from_secs(20)).await;
    for (served, shift) in hosts.iter().zip(["+3 s", "right"]) {
        let forwarded = served.http.metric("hourglass_ingress_messages_total{outcome=\"forwarded\"}").await;
        assert!(forwarded >= 1.0, "the host {shift} took none of the ingress messages; the test shows nothing of it");
        eprintln!("host {shift}: {forwarded} ingress messages");
    }
    let reader = connection.create_channel().await.unwrap();
    assert_eq!(queue_depth(&reader, &invalid_queue).await, 0, "nothing was set aside");

    for served in hosts {
        served.stop().await;
    }
}

/// A reschedule is decided by the cancellation log: the release consumer's
/// claim carries its clock, and the claim lets the message go once that
/// clock has reached the new due time. On a host 5 s ahead that let a
/// message rescheduled 4 s on go at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reschedule_on_a_host_5_s_ahead_is_not_released_early() {
    let log = unique("clock-log");
    let (config, cleanup) =
        config("clock-reschedule", "cancellable = true", &format!("[service.cancel]\nlog = \"{log}\"\nrelease_prefix = \"{}\"\n", unique("release")));
    cleanup.queue(&log);
    let connection = connect().await;
    let mut destination = Destination::declare(&connection, "clock-reschedule-dest").await;
    cleanup.queue(&destination.name);
    let (served, _) = host(&config, 5_000).await;
    assert_offset(&served, 5_000).await;

    let mut expected = HashMap::new();
    for (body, new_timing) in [("moved-to-a-time", None), ("moved-by-a-delay", Some(3_000))] {
        let (status, answer) = served.http.schedule(None, json!({ "destination": destination.name, "delay": 500, "body": body })).await;
        assert_eq!(status, 202, "{answer}");
        let id = answer["id"].as_str().unwrap();
        let asked = unix_now_ms();
        // A new delay is counted from the latest the broker's clock can read
        // (so it cannot go before the delay has passed), then held to from the
        // earliest: late by up to twice the readings' error. Measured here: 2.0-2.1 s.
        let (patch, not_before, window) = match new_timing {
            None => (json!({ "deliver_at": rfc3339(asked + 4_000) }), asked + 4_000, DUE_AT_WINDOW_MS),
            Some(delay) => (json!({ "delay": delay }), asked + delay, 2 * CLOCK_ERROR_MS + ON_TIME_MS),
        };
        let (status, text) = served.http.call("PATCH", &format!("/v1/messages/{id}"), None, Some(patch)).await;
        assert_eq!(status, 200, "{text}");
        let answer: Value = serde_json::from_str(&text).unwrap();
        let due_at = answer["due_at"].as_u64().unwrap();
        eprintln!("{body}: rescheduled to {} ms from now", due_at as i64 - asked as i64);
        expected.insert(body.to_string(), Expected { not_before, not_after: not_before + window, answered_due_at: Some(due_at) });
    }
    receive_all(&mut destination, &expected, Duration::from_secs(15)).await;

    served.stop().await;
}

/// On SQS there is no management API: the pumps read SQS's clock from the
/// first-receive stamp of each message they receive (SQS's time during
/// that very call). A host 5 s ahead, once its pump has received one
/// message, counts a `deliver_at` on SQS's clock. Before, the same request
/// went out at once, 4 s early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqs_a_host_5_s_ahead_reads_the_clock_from_its_pump_and_is_not_early() {
    use hourglass_e2e::sqs::{SqsDestination, pumps_config, sqs_scheduler};
    let (config, _) = pumps_config("planner = \"sqs-cycles\"\ncycle = \"2s\"", "pump_wait = \"1s\"");
    let (_, executor) = sqs_scheduler(&config).await;
    let mut destination = SqsDestination::create(executor, "clock-sqs").await;
    let service = Service::start_with_clock(config, Clock::new(ShiftedClock::new(5_000))).await.expect("service starts on SQS");
    let served = Served::start(service).await;
    assert!(served.http.metric("hourglass_clock_offset_seconds").await.is_nan(), "nothing read before a pump received anything");

    // A message that goes round the pumped queue: its first receive is the first reading.
    let post = |delay: u64| json!({ "destination": destination.name, "delay": delay, "body": "warm-up" });
    let (status, answer) = served.http.schedule(None, post(3_000)).await;
    assert_eq!(status, 202, "{answer}");
    until("the pump's first reading of SQS's clock", Duration::from_secs(15), async || !served.http.metric("hourglass_clock_offset_seconds").await.is_nan())
        .await;
    let (offset, error) = assert_offset(&served, 5_000).await;
    assert!(error < 1.1, "a receive stamp is read to the long poll's length (1 s here): ±{error} s around {offset} s");

    let at = unix_now_ms() + 4_000;
    let (status, answer) = served.http.schedule(None, json!({ "destination": destination.name, "deliver_at": rfc3339(at), "body": "at" })).await;
    assert_eq!(status, 202, "{answer}");
    let received = destination.receive(2, Duration::from_secs(20)).await;
    let arrived = received.iter().find(|r| r.body == "at").expect("the deliver_at message");
    let late = arrived.at_ms as i64 - at as i64;
    eprintln!("on SQS, deliver_at: {late} ms after its time");
    assert!(late >= 0, "arrived {} ms early", -late);
    // SQS counts whole seconds (DelaySeconds), and the pump long-polls for 1 s: as tests/tests/sqs.rs allows.
    assert!(late <= 3_000, "arrived {late} ms late");
    served.stop().await;
}

/// Without a management API there is nothing to read the broker's clock
/// from: the host starts all the same (it waits for no answer), says so,
/// and counts due times on its own clock, as before: then its clock must be
/// right, which this one is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_management_api_due_times_count_on_the_host_s_own_clock() {
    let text = config_text(&format!("planner = \"binary-levels\"\nprefix = \"{}\"\nunit = \"1ms\"", unique("clock-unread")), "")
        // Nothing listens on port 1.
        .replacen(&format!("management_url = \"{}\"", management_url()), "management_url = \"http://guest:guest@127.0.0.1:1\"", 1);
    assert!(text.contains("127.0.0.1:1\""), "the config names the dead management API: {text}");
    let config = Config::parse(std::path::Path::new("clock.toml"), text).unwrap();
    let cleanup = Cleanup::declared(&topology_of(&config));
    let connection = connect().await;
    let mut destination = Destination::declare(&connection, "clock-unread-dest").await;
    cleanup.queue(&destination.name);
    let started = std::time::Instant::now();
    let (served, _) = host(&config, 0).await;
    eprintln!("started in {:?} without a management API", started.elapsed());
    assert!(served.http.metric("hourglass_clock_offset_seconds").await.is_nan(), "nothing was read");

    let at = unix_now_ms() + 2_000;
    let due_at = post(&served, &destination.name, "at", json!({ "deliver_at": rfc3339(at) })).await;
    assert!(due_at >= at);
    // On the host's own (right) clock: on time, without the readings' error.
    let expected = HashMap::from([("at".to_string(), Expected { not_before: at, not_after: at + ON_TIME_MS, answered_due_at: Some(due_at) })]);
    receive_all(&mut destination, &expected, Duration::from_secs(10)).await;
    served.stop().await;
}
