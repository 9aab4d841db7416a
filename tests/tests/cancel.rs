//! Cancel and reschedule on a real RabbitMQ (`cancellable = true`): the
//! cancellation log is a stream every host reads, so a cancel made on one host
//! holds on another, and after every host restarted; a rescheduled message
//! arrives at its new time, never before; the messages around them arrive.

use std::time::Duration;

use hourglass::broker::rabbitmq::parked::{self, Handled};
use hourglass::broker::rabbitmq::take::Taker;
use hourglass::clock::unix_now_ms;
use hourglass::config::Config;
use hourglass::executor::Broker;
use hourglass::scheduler::{ScheduleRequest, Scheduler};
use hourglass::service::Service;
use hourglass_e2e::serve::Served;
use hourglass_e2e::*;
use lapin::options::QueueDeleteOptions;
use serde_json::{Value, json};

/// How late a cancellable message may arrive. Measured here (RabbitMQ 3.10,
/// loopback, 1 ms levels, five runs): messages reach the release queue 18–47 ms
/// after due (the quorum levels' own hops), the claim takes 3–14 ms (a
/// confirmed stream publish, read back), the forward 5–10 ms; end to end
/// 27–72 ms, once 214 ms while three hosts started in one process; on
/// RabbitMQ 4.3 in a full run of its tests, once 254 ms. The test prints each
/// lateness.
const ON_TIME_MS: u64 = 400;

struct Setup {
    config: Config,
    text: String,
    release: String,
    /// Dropped last (made first): deletes the test's queues even when it fails.
    cleanup: Cleanup,
}

fn setup() -> Setup {
    let (levels, log, release) = (unique("cancel-levels"), unique("cancel-log"), unique("release"));
    let text = config_text(
        &format!("planner = \"binary-levels\"\nprefix = \"{levels}\"\nunit = \"1ms\"\ncancellable = true"),
        // Parked messages stay for `parked replay` to be tested on (tests/tests/unpark.rs has the host take them).
        &format!("[service]\nunpark = false\n\n[service.cancel]\nlog = \"{log}\"\nrelease_prefix = \"{release}\"\n"),
    );
    let text = format!("default_strategy = \"main\"\n{text}");
    let config = Config::parse(std::path::Path::new("cancel.toml"), text.clone()).unwrap();
    let release = config.service.cancel.release_queue("main");
    let setup = Setup { release, cleanup: Cleanup::declared(&topology_of(&config)), config, text };
    for queue in [&setup.release, &setup.release_parked(), &log] {
        setup.cleanup.queue(queue);
    }
    setup
}

impl Setup {
    /// Where the release consumer sets aside a message before its claim.
    fn release_parked(&self) -> String {
        format!("{}.parked", self.release)
    }

    /// A consumed destination queue, deleted with the rest.
    async fn destination(&self, connection: &lapin::Connection, stem: &str) -> Destination {
        let destination = Destination::declare(connection, stem).await;
        self.cleanup.queue(&destination.name);
        destination
    }
}

async fn schedule(served: &Served, destination: &str, delay_ms: u64, body: &str) -> (String, u64) {
    let (status, answer) = served.http.schedule(None, json!({ "destination": destination, "delay": delay_ms, "body": body })).await;
    assert_eq!(status, 202, "{answer}");
    (answer["id"].as_str().unwrap().to_string(), answer["due_at"].as_u64().unwrap())
}

async fn json_call(served: &Served, method: &'static str, path: &str, body: Option<Value>) -> (u16, Value) {
    let (status, text) = served.http.call(method, path, None, body).await;
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

/// Each message arrived at or after its due time, within `window_ms`.
fn assert_on_time(received: &[Received], due: &std::collections::HashMap<String, u64>, window_ms: u64) {
    for message in received {
        let body = String::from_utf8_lossy(&message.delivery.data).to_string();
        let due_at = due[&body];
        let carried = header_int(&message.delivery, "hourglass-due-at").map(|d| d as u64);
        assert!(carried.is_some_and(|c| c >= due_at), "{body}: carries due time {carried:?}, due {due_at}");
        let late = message.at_ms as i64 - due_at as i64;
        eprintln!("{body}: {late} ms late");
        assert!(late >= 0, "{body} arrived {} ms early", -late);
        assert!(late as u64 <= window_ms, "{body} arrived {late} ms late (window {window_ms} ms)");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_on_one_host_holds_on_another_and_after_every_host_restarted() {
    let setup = setup();
    let connection = connect().await;
    let mut destination = setup.destination(&connection, "cancel-dest").await;
    let (first, second) = (Served::start_ready(&setup.config).await, Served::start_ready(&setup.config).await);

    let mut due = std::collections::HashMap::new();
    let mut ids = std::collections::HashMap::new();
    for body in ["before", "victim", "after"] {
        let (id, due_at) = schedule(&first, &destination.name, 5_000, body).await;
        due.insert(body.to_string(), due_at);
        ids.insert(body, id);
    }
    // The scenario: the cancel comes a second into the five-second delay.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (status, answer) = json_call(&second, "DELETE", &format!("/v1/messages/{}", ids["victim"]), None).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("cancelled")), "{answer}");

    // Every host goes away before the messages are due; a fresh one reads the log from the start.
    first.stop().await;
    second.stop().await;
    let third = Served::start_ready(&setup.config).await;

    let received = destination.receive(2, Duration::from_secs(10)).await;
    let mut bodies: Vec<String> = received.iter().map(|r| String::from_utf8_lossy(&r.delivery.data).to_string()).collect();
    bodies.sort();
    assert_eq!(bodies, ["after", "before"]);
    assert_on_time(&received, &due, ON_TIME_MS);
    until("the victim dropped at the release queue", Duration::from_secs(5), async || {
        third.http.metric("hourglass_released_messages_total{strategy=\"main\",outcome=\"cancelled\"}").await >= 1.0
    })
    .await;
    destination.assert_quiet(Duration::from_millis(500)).await;

    let (status, answer) = json_call(&third, "DELETE", &format!("/v1/messages/{}", ids["victim"]), None).await;
    assert_eq!((status, answer["already"].as_bool()), (200, Some(true)), "cancelling twice is the same cancel: {answer}");
    let (status, answer) = json_call(&third, "DELETE", &format!("/v1/messages/{}", ids["before"]), None).await;
    assert_eq!(status, 409, "a delivered message cannot be cancelled: {answer}");
    assert!(answer["error"].as_str().unwrap().contains("already delivered"), "{answer}");
    let (status, _) = json_call(&third, "PATCH", &format!("/v1/messages/{}", ids["victim"]), Some(json!({ "delay": "10s" }))).await;
    assert_eq!(status, 409, "a cancelled message cannot be rescheduled");

    // The command line writes and reads the same log.
    let path = std::env::temp_dir().join(format!("{}.toml", unique("cancel-cli")));
    std::fs::write(&path, &setup.text).unwrap();
    let cli = |id: &str| std::process::Command::new(hourglass_binary()).args(["--config", path.to_str().unwrap(), "cancel", id]).output().unwrap();
    let delivered = cli(&ids["after"]);
    assert_eq!(delivered.status.code(), Some(1), "{delivered:?}");
    assert!(String::from_utf8_lossy(&delivered.stderr).contains("already delivered"), "{delivered:?}");
    let cancelled = cli(&ids["victim"]);
    assert!(cancelled.status.success() && String::from_utf8_lossy(&cancelled.stdout).contains("already cancelled"), "{cancelled:?}");
    std::fs::remove_file(&path).ok();

    third.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rescheduled_message_arrives_at_its_new_time_and_not_before() {
    let setup = setup();
    let connection = connect().await;
    let mut destination = setup.destination(&connection, "reschedule-dest").await;
    let served = Served::start_ready(&setup.config).await;

    let mut due = std::collections::HashMap::new();
    let (_, neighbour_due) = schedule(&served, &destination.name, 2_000, "neighbour").await;
    due.insert("neighbour".to_string(), neighbour_due);
    let (id, _) = schedule(&served, &destination.name, 2_000, "moved").await;
    let (status, answer) = json_call(&served, "PATCH", &format!("/v1/messages/{id}"), Some(json!({ "delay": "4s" }))).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("rescheduled")), "{answer}");
    let new_due = answer["due_at"].as_u64().unwrap();
    assert!(new_due >= unix_now_ms() + 3_000, "the new due time is four seconds out");

    let neighbour = destination.receive(1, Duration::from_secs(5)).await;
    assert_eq!(neighbour[0].delivery.data, b"neighbour", "the neighbour keeps its time; the moved one is not with it");
    assert_on_time(&neighbour, &due, ON_TIME_MS);
    let moved = destination.receive(1, Duration::from_secs(10)).await;
    assert_eq!(moved[0].delivery.data, b"moved");
    // It went round again (levels, release queue, levels, release queue): two
    // passes, so twice the window (measured 26–203 ms late); the second pass
    // is counted from the earliest the broker's clock can read, up to
    // CLOCK_ERROR_MS before it.
    due.insert("moved".to_string(), new_due);
    assert_on_time(&moved, &due, 2 * ON_TIME_MS + CLOCK_ERROR_MS);
    assert_eq!(served.http.metric("hourglass_released_messages_total{strategy=\"main\",outcome=\"rescheduled\"}").await, 1.0);
    let (status, _) = json_call(&served, "PATCH", &format!("/v1/messages/{id}"), Some(json!({ "deliver_at": "2000-01-01T00:00:00Z", "delay": "1s" }))).await;
    assert_eq!(status, 400, "delay and deliver_at together are refused");

    served.stop().await;
}

#[tokio::test]
async fn without_a_cancellable_strategy_cancel_is_a_conflict_naming_the_setting() {
    let config = Config::parse(std::path::Path::new("plain.toml"), "[strategies.main]\nplanner = \"binary-levels\"\n".into()).unwrap();
    let served = Served::start(Service::start(config).await.unwrap()).await;
    let (status, answer) = json_call(&served, "DELETE", "/v1/messages/some-id", None).await;
    assert_eq!(status, 409);
    assert!(answer["error"].as_str().unwrap().contains("cancellable = true"), "{answer}");
    served.stop().await;
}

/// Where each replay test starts: no host runs yet, so nothing claims what
/// the levels deliver (it waits in the release queue) and nothing declares
/// the release queue again once a test deletes it.
struct Replaying {
    setup: Setup,
    /// For reading queue depths.
    channel: lapin::Channel,
    destination: Destination,
    scheduler: Scheduler<Broker>,
}

async fn replaying(destination_stem: &str) -> Replaying {
    let setup = setup();
    let connection = connect().await;
    let channel = connection.create_channel().await.unwrap();
    let destination = setup.destination(&connection, destination_stem).await;
    let scheduler = scheduler(&setup.config).await;
    Replaying { setup, channel, destination, scheduler }
}

/// The strategy's own parking queue (not the release queue's): where its
/// delivery exchange puts what it could not route.
fn own_parking_queue(setup: &Setup, scheduler: &Scheduler<Broker>) -> String {
    let release_parked = setup.release_parked();
    let own = parked::parking_queues(&setup.config, scheduler).into_iter().find(|q| q.queue != release_parked && q.kind == "parked");
    own.expect("the strategy's own parking queue").queue
}

/// `hourglass parked replay` of the parking queue `queue`, on a taker of its
/// own. What it leaves must be given back, ready in the queue again before
/// the taker closes (closing would requeue it anyway and hide a message
/// replay kept).
async fn replay_parking_queue(setup: &Setup, scheduler: &Scheduler<Broker>, queue: &str) -> Handled {
    let parking = parked::parking_queues(&setup.config, scheduler).into_iter().find(|q| q.queue == queue);
    let parking = parking.unwrap_or_else(|| panic!("{queue} is not one of the config's parking queues"));
    let taker = Taker::open(&amqp_url()).await.unwrap();
    let handled = parked::replay(scheduler, &taker, &parking, &setup.config.service.ingress.queue, None).await.unwrap();
    until(&format!("the {} messages replay left given back to {queue}", handled.left), Duration::from_secs(5), async || {
        taker.depth(queue).await.unwrap().unwrap_or(0) >= handled.left as u32
    })
    .await;
    taker.close().await;
    handled
}

/// Messages of a cancellable strategy that its delivery exchange could not
/// route (the release queue was gone when they fell due) wait in the
/// strategy's own parking queue. Replayed after their due time they go
/// through the release queue, so the cancellation log decides: the one
/// cancelled meanwhile is dropped there, never delivered; the other is
/// claimed (a later cancel is answered 409) and delivered. While the release
/// queue is still gone, replay leaves both parked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_of_a_parked_cancellable_message_asks_the_cancellation_log_first() {
    let Replaying { setup, channel, mut destination, scheduler } = replaying("cancel-parked-dest").await;
    let mut ids = std::collections::HashMap::new();
    for body in ["victim", "survivor"] {
        let request = ScheduleRequest { destination: destination.name.clone(), delay_ms: 1_000, body: body.as_bytes().to_vec(), ..Default::default() };
        ids.insert(body, scheduler.schedule(request).await.expect("schedule").id);
    }
    channel.queue_delete(setup.release.as_str().into(), QueueDeleteOptions::default()).await.unwrap();
    let parking = own_parking_queue(&setup, &scheduler);
    until("both messages parked in the strategy's parking queue", Duration::from_secs(10), async || queue_depth(&channel, &parking).await == 2).await;

    // While the release queue is still gone, replay leaves them where they are rather than deliver them unasked.
    let handled = replay_parking_queue(&setup, &scheduler, &parking).await;
    assert_eq!((handled.done, handled.left), (0, 2), "{handled:?}");
    assert!(handled.why_left.as_deref().is_some_and(|why| why.contains("release queue")), "{handled:?}");
    // Given back, they are ready again in the parking queue once the broker has taken the requeues.
    until("both back in the parking queue", Duration::from_secs(5), async || queue_depth(&channel, &parking).await == 2).await;

    let served = Served::start_ready(&setup.config).await;
    let (status, answer) = json_call(&served, "DELETE", &format!("/v1/messages/{}", ids["victim"]), None).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("cancelled")), "{answer}");
    let handled = replay_parking_queue(&setup, &scheduler, &parking).await;
    assert_eq!((handled.done, handled.released, handled.rescheduled, handled.left), (2, 2, 0, 0), "both handed to the release queue: {handled:?}");
    assert_eq!(queue_depth(&channel, &parking).await, 0, "both parked copies are acked once replayed");

    only_the_survivor_arrives(&served, &mut destination, &ids).await;
    assert_eq!(queue_depth(&channel, &setup.release_parked()).await, 0, "nothing parked at the release queue");

    served.stop().await;
}

/// After a replay through the release queue of "victim" (cancelled) and
/// "survivor": only the survivor arrives, the victim is dropped at the
/// release queue, and the survivor was claimed before it was delivered.
async fn only_the_survivor_arrives(served: &Served, destination: &mut Destination, ids: &std::collections::HashMap<&str, String>) {
    let received = destination.receive(1, Duration::from_secs(10)).await;
    assert_eq!(String::from_utf8_lossy(&received[0].delivery.data), "survivor", "the cancelled message must never arrive");
    until("the cancelled message dropped at the release queue", Duration::from_secs(10), async || {
        served.http.metric("hourglass_released_messages_total{strategy=\"main\",outcome=\"cancelled\"}").await >= 1.0
    })
    .await;
    destination.assert_quiet(Duration::from_millis(500)).await;
    let (status, answer) = json_call(served, "DELETE", &format!("/v1/messages/{}", ids["survivor"]), None).await;
    assert_eq!(status, 409, "the replayed message was claimed before it was delivered: {answer}");
}

/// Waits for the one message a scheduler (no host running) sent into the
/// release queue and sets it aside in `<release queue>.parked` as the release
/// consumer does before a claim (poisoned, or a reschedule that failed):
/// the message as it came, with its reason and, after a failed reschedule,
/// the due time it was moved to. No claim reaches the cancellation log.
async fn park_unclaimed(setup: &Setup, scheduler: &Scheduler<Broker>, reason: &str, due_at_ms: Option<u64>) {
    use hourglass::command::{Command, FieldTable};
    use hourglass::executor::{Envelope, Executor};
    use hourglass::headers::{DUE_AT_HEADER, PARKED_REASON_HEADER};
    use hourglass::message::HeaderValue;
    let taker = Taker::open(&amqp_url()).await.unwrap();
    let mut taken = Vec::new();
    until("the message in the release queue", Duration::from_secs(10), async || {
        taken = taker.take(&setup.release, 1).await.unwrap();
        !taken.is_empty()
    })
    .await;
    let message = taken.pop().unwrap();
    let mut properties = message.delivery.properties.clone();
    properties.headers.insert(PARKED_REASON_HEADER.to_string(), HeaderValue::text(reason));
    if let Some(due_at_ms) = due_at_ms {
        properties.headers.insert(DUE_AT_HEADER.to_string(), HeaderValue::I64(due_at_ms as i64));
    }
    let envelope = Envelope {
        id: properties.message_id.clone().unwrap_or_default(),
        body: message.delivery.body.clone(),
        headers: FieldTable::new(),
        properties,
        stamp_message_id: false,
    };
    // The release consumer declares it as it starts; no host has started yet.
    let parked = setup.release_parked();
    scheduler.executor().apply(&[hourglass::broker::rabbitmq::release_queue_declaration(&parked)]).await.unwrap();
    scheduler.executor().send(&[Command::forward("", &parked)], &envelope).await.expect("parked");
    taker.ack(message).await.unwrap();
    taker.close().await;
}

/// Why the release consumer sets a message aside unclaimed after a handler panicked on it repeatedly.
const POISONED: &str = "hourglass failed on this message 3 times (it panicked: test); set aside so the messages behind it go on";

/// A message the release consumer set aside before claiming it (here: given
/// up on as poisoned) was never claimed, so a cancel of its id is answered
/// 200. Replaying `<release queue>.parked` must not undo that cancel: the
/// message goes through the release queue, where the claim finds the cancel
/// and drops it. The uncancelled message beside it is claimed and delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_of_a_message_parked_at_the_release_queue_before_its_claim_honours_a_cancel() {
    let Replaying { setup, channel, mut destination, scheduler } = replaying("cancel-release-parked-dest").await;
    let release_parked = setup.release_parked();
    let mut ids = std::collections::HashMap::new();
    for body in ["victim", "survivor"] {
        let request = ScheduleRequest { destination: destination.name.clone(), delay_ms: 200, body: body.as_bytes().to_vec(), ..Default::default() };
        ids.insert(body, scheduler.schedule(request).await.expect("schedule").id);
        park_unclaimed(&setup, &scheduler, POISONED, None).await;
    }
    assert_eq!(queue_depth(&channel, &release_parked).await, 2);

    let served = Served::start_ready(&setup.config).await;
    let (status, answer) = json_call(&served, "DELETE", &format!("/v1/messages/{}", ids["victim"]), None).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("cancelled")), "never claimed, so the cancel holds: {answer}");

    let handled = replay_parking_queue(&setup, &scheduler, &release_parked).await;

    only_the_survivor_arrives(&served, &mut destination, &ids).await;
    assert_eq!((handled.done, handled.released, handled.left), (2, 2, 0), "both handed to the release queue: {handled:?}");
    assert_eq!(queue_depth(&channel, &release_parked).await, 0, "nothing left parked, nothing parked again");

    served.stop().await;
}

/// Through the release queue, a message whose destination is still gone
/// would only be parked again while replay counted it as released. So replay
/// leaves it where it is and says which destination is missing, from the
/// strategy's own parking queue (its release queue was gone when it fell
/// due) and from `<release queue>.parked` alike; the messages beside them,
/// whose destination exists, are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_leaves_a_cancellable_message_parked_while_its_destination_is_gone() {
    use lapin::options::QueueDeclareOptions;
    let Replaying { setup, channel, destination: mut live, scheduler } = replaying("cancel-live-dest").await;
    let gone = unique("cancel-gone-dest");
    setup.cleanup.queue(&gone);
    channel.queue_declare(gone.as_str().into(), QueueDeclareOptions::default(), Default::default()).await.unwrap();
    let release_parked = setup.release_parked();
    let request = |destination: &str, delay_ms: u64, body: &str| ScheduleRequest {
        destination: destination.to_string(),
        delay_ms,
        body: body.as_bytes().to_vec(),
        ..Default::default()
    };
    // Two set aside at the release queue, unclaimed.
    for (destination, body) in [(&gone, "stranded-at-release"), (&live.name, "beside-at-release")] {
        scheduler.schedule(request(destination, 200, body)).await.expect("schedule");
        park_unclaimed(&setup, &scheduler, POISONED, None).await;
    }
    // Two parked by the strategy itself: its release queue was gone when they fell due.
    for (destination, body) in [(&gone, "stranded-in-levels"), (&live.name, "beside-in-levels")] {
        scheduler.schedule(request(destination, 1_000, body)).await.expect("schedule");
    }
    channel.queue_delete(setup.release.as_str().into(), QueueDeleteOptions::default()).await.unwrap();
    let own = own_parking_queue(&setup, &scheduler);
    until("both parked in the strategy's parking queue", Duration::from_secs(10), async || queue_depth(&channel, &own).await == 2).await;
    channel.queue_delete(gone.as_str().into(), QueueDeleteOptions::default()).await.unwrap();

    // A serving host declares the release queue again; only the destination is missing now.
    let served = Served::start_ready(&setup.config).await;
    for parking in [&own, &release_parked] {
        let handled = replay_parking_queue(&setup, &scheduler, parking).await;
        assert_eq!((handled.done, handled.left), (1, 1), "{parking}: {handled:?}");
        let missing = |why: &str| why.contains(&format!("destination queue {gone:?} does not exist"));
        assert!(handled.why_left.as_deref().is_some_and(missing), "{parking}: names the missing destination: {handled:?}");
    }

    let received = live.receive(2, Duration::from_secs(10)).await;
    let mut bodies: Vec<String> = received.iter().map(|r| String::from_utf8_lossy(&r.delivery.data).to_string()).collect();
    bodies.sort();
    assert_eq!(bodies, ["beside-at-release", "beside-in-levels"]);
    for parking in [&own, &release_parked] {
        until(&format!("the stranded message back in {parking}, and only it"), Duration::from_secs(5), async || queue_depth(&channel, parking).await == 1)
            .await;
    }
    live.assert_quiet(Duration::from_millis(300)).await;
    assert_eq!(queue_depth(&channel, &own).await, 1);
    assert_eq!(queue_depth(&channel, &release_parked).await, 1, "the stranded message was not parked again");

    served.stop().await;
}

/// A reschedule the release consumer could not carry out sets the message
/// aside with the due time it was moved to. Replay sends it round the
/// strategy again for that time (it arrives then, not before), while a due
/// message beside it goes through the release queue at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_of_a_message_parked_at_the_release_queue_with_a_later_due_time_reschedules_it_for_then() {
    let Replaying { setup, channel, mut destination, scheduler } = replaying("cancel-later-dest").await;
    let release_parked = setup.release_parked();
    let request = |body: &str| ScheduleRequest { destination: destination.name.clone(), delay_ms: 200, body: body.as_bytes().to_vec(), ..Default::default() };
    scheduler.schedule(request("due")).await.expect("schedule");
    park_unclaimed(&setup, &scheduler, POISONED, None).await;
    let later = scheduler.schedule(request("later")).await.expect("schedule").id;
    // Whole seconds, so the RFC 3339 time the PATCH sends is exactly this due time.
    let moved_to = (unix_now_ms() / 1_000 + 6) * 1_000;
    park_unclaimed(&setup, &scheduler, &format!("rescheduling to {moved_to} failed: broker refused: test"), Some(moved_to)).await;

    // The log holds the reschedule the release consumer was carrying out.
    let served = Served::start_ready(&setup.config).await;
    let deliver_at = humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_millis(moved_to)).to_string();
    let (status, answer) = json_call(&served, "PATCH", &format!("/v1/messages/{later}"), Some(json!({ "deliver_at": deliver_at }))).await;
    assert_eq!((status, answer["due_at"].as_u64()), (200, Some(moved_to)), "{answer}");

    let handled = replay_parking_queue(&setup, &scheduler, &release_parked).await;
    assert!(unix_now_ms() < moved_to, "replayed before the new due time, or the test shows nothing");
    assert_eq!((handled.done, handled.rescheduled, handled.released, handled.left), (2, 1, 1, 0), "{handled:?}");
    assert_eq!(queue_depth(&channel, &release_parked).await, 0, "both parked copies are acked once replayed");

    let due = destination.receive(1, Duration::from_secs(5)).await;
    assert_eq!(due[0].delivery.data, b"due", "the due message goes on at once; the later one is not with it");
    let arrived = destination.receive(1, Duration::from_secs(15)).await;
    assert_eq!(arrived[0].delivery.data, b"later");
    let due = std::collections::HashMap::from([("later".to_string(), moved_to)]);
    // The serving host's claim holds it until the earliest the broker's clock can read is past its time.
    assert_on_time(&arrived, &due, ON_TIME_MS + CLOCK_ERROR_MS);
    destination.assert_quiet(Duration::from_millis(300)).await;
    assert_eq!(queue_depth(&channel, &release_parked).await, 0, "nothing parked again");

    served.stop().await;
}
