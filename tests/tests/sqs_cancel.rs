//! Cancel and reschedule on SQS through `serve` (a child process, so it can
//! be killed), against the local SQS server: a `cancellable = true`
//! `sqs-cycles` strategy ends each delay in its release queue, the host claims
//! the due message in the fates queue, and the head of the message's group
//! decides (docs/sqs.md, "Cancel and reschedule").
//!
//! Every delay here is longer than the strategy's 2 s cycle, so each message
//! cycles through the release queue's `-delay.fifo` queue under the host's
//! pump and takes its last leg to the release queue with `DelaySeconds`: the
//! leg a cancel could not stop before there was a release step.
//!
//! Each test has queues of its own (a random token in every name: fates,
//! reply, release and destination queues) and deletes them when it ends.
//!
//! Timing, measured on this machine (2 cores, shared) with the local server
//! (moto) and `pump_wait = 1s`, over the last two runs of this file (two
//! tests at once, as `scripts/test` runs them: `.config/nextest.toml`): a message with a delay of
//! 3–10 s arrived 0.13 to 2.36 s after its due time, the rescheduled one 1.31
//! and 2.28 s after its new one (the release queue's `DelaySeconds` is whole seconds;
//! then a receive, the claim, a receive of the fates queue and the forward;
//! the latest were the last of ten due together). Before every group's forward
//! went ahead of the others' tidying, such a last one was up to 6.5 s late on
//! a loaded machine, under the 10 s window then asserted; it is 4 s now
//! ([`ON_TIME_MS`]). A cancelled message is watched for until 12 s past its
//! due time, 5 times the latest arrival.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hourglass::broker::sqs::SqsExecutor;
use hourglass::clock::unix_now_ms;
use hourglass_e2e::process::ServeProcess;
use hourglass_e2e::sqs::*;
use hourglass_e2e::until;
use serde_json::{Value, json};

/// How late a message may arrive. Measured (above) 0.13–2.36 s; again on
/// 2026-12-02, two tests at a time with compilers running beside: 0.33–2.25 s,
/// and 3.10 s for the rescheduled one (each printed). 4 s: the 6.5 s of the
/// regression above fails it, as does anything a whole cycle (2 s) later than
/// the latest measured. (It was 10 s, which that regression passed.) Broken
/// on purpose (2026-12-02): the release receiver waiting 4 s before it claims
/// what it received made "before arrived 5042 ms late (window 4000 ms)".
const ON_TIME_MS: i64 = 4_000;
/// How many of the two hosts' 16 messages may arrive twice: only a claim
/// whose marker stayed out of reach goes again (docs/sqs.md). Measured 0
/// with two tests at a time, and 3 in a full CI run beside the other tests;
/// more than 4 (a quarter) means copies are being repeated, not a claim
/// missed. (There was no bound.) Broken on purpose (2026-12-02): every claim
/// forwarded twice made "16 duplicates of 16 messages (at most 4)".
const MAX_DUPLICATES: usize = 4;
/// How long past its due time a cancelled message is watched for.
const WATCH_PAST_DUE: Duration = Duration::from_secs(12);

/// A test's config, written to a file for `serve`, and its queues deleted at the end.
struct Setup {
    token: String,
    path: PathBuf,
    executor: Arc<SqsExecutor>,
}

impl Setup {
    async fn new() -> Setup {
        let token = format!("sc{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let service = format!(
            "pump_wait = \"1s\"\npump_discovery = \"1s\"\npump_visibility = \"3s\"\n[service.cancel]\nlog = \"e2e-{token}-fates\"\nrelease_prefix = \"e2e-{token}-release\"\nanswer_timeout = \"15s\""
        );
        let (text, _) = pumps_config_text("planner = \"sqs-cycles\"\ncycle = \"2s\"\ncancellable = true", &service);
        let config = hourglass::config::Config::parse(std::path::Path::new("e2e.toml"), text.clone()).expect("test config");
        let path = std::env::temp_dir().join(format!("e2e-sqs-cancel-{token}.toml"));
        std::fs::write(&path, text).unwrap();
        let (_, executor) = sqs_scheduler(&config).await;
        Setup { token, path, executor }
    }

    async fn destination(&self) -> SqsDestination {
        SqsDestination::create(self.executor.clone(), &format!("{}-dest", self.token)).await
    }

    /// `serve`, once `/readyz` says every task runs (the fates queue's, the replies', the release receiver's).
    async fn serve(&self) -> ServeProcess {
        let host = ServeProcess::start(&self.path);
        until("readyz 200", Duration::from_secs(30), async || host.http.call("GET", "/readyz", None, None).await.0 == 200).await;
        host
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        std::fs::remove_file(&self.path).ok();
        let (executor, prefix) = (self.executor.clone(), format!("e2e-{}", self.token));
        // Its own thread: the test's runtime may be shutting down.
        std::thread::spawn(move || {
            tokio::runtime::Runtime::new().unwrap().block_on(async {
                let Ok(listed) = executor.client().list_queues().queue_name_prefix(&prefix).send().await else { return };
                for url in listed.queue_urls() {
                    executor.client().delete_queue().queue_url(url).send().await.ok();
                }
            })
        })
        .join()
        .ok();
    }
}

async fn schedule(host: &ServeProcess, destination: &str, delay_ms: u64, body: &str) -> (String, u64) {
    let (status, answer) = host.http.schedule(None, json!({ "destination": destination, "delay": delay_ms, "body": body })).await;
    assert_eq!(status, 202, "{answer}");
    (answer["id"].as_str().unwrap().to_string(), answer["due_at"].as_u64().unwrap())
}

async fn call(host: &ServeProcess, method: &'static str, path: &str, body: Option<Value>) -> (u16, Value) {
    let (status, text) = host.http.call(method, path, None, body).await;
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

/// The answer to a request that may wait behind a head being held (a second
/// cancel, a cancel of a delivered message): `503` until the head is next
/// received (5 s after it was last seen, then 10 s, 20 s, …), and asking again
/// is safe; so asked again until it is answered, for at most a minute. In a
/// task of its own, so a test waits for several at once.
fn answered(host: &ServeProcess, method: &'static str, path: String, body: Option<Value>) -> tokio::task::JoinHandle<(u16, Value)> {
    let http = host.http.clone();
    tokio::spawn(async move {
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            let (status, text) = http.call(method, &path, None, body.clone()).await;
            if status != 503 || Instant::now() > end {
                return (status, serde_json::from_str(&text).unwrap_or(Value::String(text)));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

/// Each arrival at or after its due time and within [`ON_TIME_MS`]; returns the bodies.
fn assert_on_time(received: &[SqsReceived], due: &HashMap<String, u64>) -> Vec<String> {
    let mut bodies = Vec::new();
    for message in received {
        let late = message.at_ms as i64 - due[&message.body] as i64;
        eprintln!("{}: {late} ms late", message.body);
        assert!(late >= 0, "{} arrived {} ms early", message.body, -late);
        assert!(late <= ON_TIME_MS, "{} arrived {late} ms late (window {ON_TIME_MS} ms)", message.body);
        bodies.push(message.body.clone());
    }
    bodies.sort();
    bodies
}

/// Whatever reaches the destination until `until_ms` (Unix ms).
async fn watch_until(destination: &mut SqsDestination, until_ms: u64) -> Vec<String> {
    let left = Duration::from_millis(until_ms.saturating_sub(unix_now_ms()));
    destination.drain_for(left).await.into_iter().map(|m| m.body).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_answered_200_never_arrives_and_the_messages_beside_it_arrive_on_time() {
    let setup = Setup::new().await;
    let mut destination = setup.destination().await;
    let host = setup.serve().await;
    let mut due = HashMap::new();
    let mut ids = HashMap::new();
    for body in ["before", "victim", "after", "by-cli"] {
        let (id, due_at) = schedule(&host, &destination.name, 8_000, body).await;
        due.insert(body.to_string(), due_at);
        ids.insert(body, id);
    }
    let (status, answer) = call(&host, "DELETE", &format!("/v1/messages/{}", ids["victim"]), None).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("cancelled")), "{answer}");
    // Behind the cancel, now held at the head: answered when it is next received.
    let again = answered(&host, "DELETE", format!("/v1/messages/{}", ids["victim"]), None);
    let moved = answered(&host, "PATCH", format!("/v1/messages/{}", ids["victim"]), Some(json!({ "delay": "10s" })));
    // The command line asks the same fates queue, and the serving host answers it.
    let (path, id) = (setup.path.clone(), ids["by-cli"].clone());
    let cli = tokio::task::spawn_blocking(move || {
        std::process::Command::new(hourglass_e2e::hourglass_binary()).args(["--config", path.to_str().unwrap(), "cancel", &id]).output().unwrap()
    })
    .await
    .unwrap();
    assert!(cli.status.success() && String::from_utf8_lossy(&cli.stdout).contains("cancelled"), "{cli:?}");
    let (status, answer) = again.await.unwrap();
    assert_eq!((status, answer["already"].as_bool()), (200, Some(true)), "cancelling twice is the same cancel: {answer}");
    let (status, answer) = moved.await.unwrap();
    assert_eq!(status, 409, "a cancelled message cannot be rescheduled: {answer}");

    let received = destination.receive(2, Duration::from_secs(30)).await;
    assert_eq!(assert_on_time(&received, &due), ["after", "before"]);
    let delivered = answered(&host, "DELETE", format!("/v1/messages/{}", ids["before"]), None);
    let late = watch_until(&mut destination, due["victim"].max(due["by-cli"]) + WATCH_PAST_DUE.as_millis() as u64).await;
    assert!(late.is_empty(), "nothing else arrives, the cancelled messages least of all: {late:?}");
    let (status, answer) = delivered.await.unwrap();
    assert_eq!(status, 409, "a delivered message cannot be cancelled: {answer}");
    assert!(answer["error"].as_str().unwrap().contains("already delivered"), "{answer}");

    // A host that stops (and the command line) leaves no reply queue behind.
    let replies = format!("e2e-{}-fates-replies", setup.token);
    let listed = setup.executor.client().list_queues().queue_name_prefix(&replies).send().await.unwrap();
    assert_eq!(listed.queue_urls().len(), 1, "the serving host's own: {:?}", listed.queue_urls());
    let mut host = host;
    host.signal("TERM");
    assert!(host.wait(Duration::from_secs(30)).success());
    let listed = setup.executor.client().list_queues().queue_name_prefix(&replies).send().await.unwrap();
    assert!(listed.queue_urls().is_empty(), "{:?}", listed.queue_urls());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_holds_after_the_host_is_killed_and_another_starts_before_the_message_is_due() {
    let setup = Setup::new().await;
    let mut destination = setup.destination().await;
    let first = setup.serve().await;
    let mut due = HashMap::new();
    let mut ids = HashMap::new();
    for body in ["victim", "control"] {
        let (id, due_at) = schedule(&first, &destination.name, 8_000, body).await;
        due.insert(body.to_string(), due_at);
        ids.insert(body, id);
    }
    let (status, answer) = call(&first, "DELETE", &format!("/v1/messages/{}", ids["victim"]), None).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("cancelled")), "{answer}");
    first.signal("KILL");
    drop(first);
    assert!(unix_now_ms() < due["victim"], "the host was killed before the message was due");

    let _second = setup.serve().await;
    let received = destination.receive(1, Duration::from_secs(40)).await;
    assert_eq!(assert_on_time(&received, &due), ["control"]);
    let late = watch_until(&mut destination, due["victim"] + WATCH_PAST_DUE.as_millis() as u64).await;
    assert!(late.is_empty(), "the cancelled message never arrives: {late:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_after_the_claim_is_409_and_the_message_arrives_exactly_once() {
    let setup = Setup::new().await;
    let mut destination = setup.destination().await;
    let host = setup.serve().await;
    let (id, due_at) = schedule(&host, &destination.name, 3_000, "claimed").await;
    let received = destination.receive(1, Duration::from_secs(30)).await;
    assert_on_time(&received, &HashMap::from([("claimed".to_string(), due_at)]));
    let cancel = answered(&host, "DELETE", format!("/v1/messages/{id}"), None);
    let reschedule = answered(&host, "PATCH", format!("/v1/messages/{id}"), Some(json!({ "delay": "30s" })));
    let again = destination.drain_for(WATCH_PAST_DUE).await;
    let (status, answer) = cancel.await.unwrap();
    assert_eq!(status, 409, "{answer}");
    let (status, answer) = reschedule.await.unwrap();
    assert_eq!(status, 409, "{answer}");
    assert!(again.is_empty(), "exactly one arrival: {:?}", again.iter().map(|m| &m.body).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reschedule_later_arrives_at_the_new_time_and_not_before() {
    let setup = Setup::new().await;
    let mut destination = setup.destination().await;
    let host = setup.serve().await;
    let (moved, first_due) = schedule(&host, &destination.name, 4_000, "moved").await;
    let (_, control_due) = schedule(&host, &destination.name, 4_000, "control").await;
    let (status, answer) = call(&host, "PATCH", &format!("/v1/messages/{moved}"), Some(json!({ "delay": "10s" }))).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("rescheduled")), "{answer}");
    let new_due = answer["due_at"].as_u64().unwrap();
    assert!(new_due >= first_due + 5_000, "{new_due} vs {first_due}");

    let received = destination.receive(1, Duration::from_secs(30)).await;
    assert_eq!(assert_on_time(&received, &HashMap::from([("control".to_string(), control_due)])), ["control"]);
    let received = destination.receive(1, Duration::from_secs(40)).await;
    assert_eq!(assert_on_time(&received, &HashMap::from([("moved".to_string(), new_due)])), ["moved"], "at its new time, never before");
    let again = destination.drain_for(Duration::from_secs(5)).await;
    assert!(again.is_empty(), "once: {:?}", again.iter().map(|m| &m.body).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_bad_cancels_beside_valid_traffic_harms_no_one() {
    let setup = Setup::new().await;
    let mut destination = setup.destination().await;
    let host = setup.serve().await;
    let mut due = HashMap::new();
    for i in 0..10 {
        let body = format!("valid-{i}");
        let (_, due_at) = schedule(&host, &destination.name, 6_000, &body).await;
        due.insert(body, due_at);
    }
    let started = Instant::now();
    let long = "x".repeat(300);
    let mut bad = Vec::new();
    for i in 0..60 {
        let http = host.http.clone();
        let long = long.clone();
        bad.push(tokio::spawn(async move {
            match i % 3 {
                0 => (http.call("DELETE", &format!("/v1/messages/{long}"), None, None).await, "id"),
                1 => (http.call("PATCH", "/v1/messages/some-id", None, Some(json!({ "delay": "soon" }))).await, "delay"),
                _ => (http.call("PATCH", "/v1/messages/some-id", None, Some(json!({ "delay": "1s", "when": 3 }))).await, "request"),
            }
        }));
    }
    for request in bad {
        let ((status, text), field) = request.await.unwrap();
        assert_eq!(status, 400, "{text}");
        let answer: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(answer["field"].as_str(), Some(field), "the answer names the field: {answer}");
    }
    eprintln!("60 bad requests answered in {:?}", started.elapsed());
    // Ids nobody scheduled are cancelled all the same (nothing can arrive for them), and cost only their own group.
    for i in 0..5 {
        let (status, answer) = call(&host, "DELETE", &format!("/v1/messages/never-scheduled-{}-{i}", setup.token), None).await;
        assert_eq!((status, answer["status"].as_str()), (200, Some("cancelled")), "{answer}");
    }
    let received = destination.receive(10, Duration::from_secs(30)).await;
    // Ten valid messages beside five held cancels of ids never scheduled, in
    // the others' window (10 s). Measured 2026-11-28: 0.85-1.22 s late alone
    // (three runs), 0.96-1.20 s beside sqs_fates, the rest of this file and
    // sqs_pumps, two tests each (three runs): the local server looks for newly
    // visible messages once a second. While moto's long poll of a FIFO queue
    // with a group in flight re-scanned the queue for its whole wait, starving
    // the server's other requests (scripts/moto_server.py says how it waits
    // now), they were 1.05-1.17 s late alone, 1.69-6.72 s beside those tests
    // (four runs) and 5.3-10.5 s under the full suite in one run of three.
    assert_eq!(assert_on_time(&received, &due).len(), 10, "every valid message arrived on time");
    let again = destination.drain_for(Duration::from_secs(3)).await;
    assert!(again.is_empty(), "nothing else: {:?}", again.iter().map(|m| &m.body).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_deliver_every_message_on_time_and_no_cancelled_one() {
    let setup = Setup::new().await;
    let mut destination = setup.destination().await;
    let (first, second) = (setup.serve().await, setup.serve().await);
    let mut due = HashMap::new();
    let mut cancelled = Vec::new();
    for i in 0..20 {
        let host = if i % 2 == 0 { &first } else { &second };
        let body = format!("m-{i}");
        let (id, due_at) = schedule(host, &destination.name, 6_000, &body).await;
        if i % 5 == 0 {
            // Asked of the other host than the one that scheduled it.
            let other = if i % 2 == 0 { &second } else { &first };
            let (status, answer) = call(other, "DELETE", &format!("/v1/messages/{id}"), None).await;
            assert_eq!((status, answer["status"].as_str()), (200, Some("cancelled")), "{answer}");
            cancelled.push(body);
        } else {
            due.insert(body, due_at);
        }
    }
    // Until the last is due and a watch past it: every copy of every message that arrives.
    let last_due = *due.values().max().unwrap();
    let arrived = destination.drain_for(Duration::from_millis(last_due + WATCH_PAST_DUE.as_millis() as u64 - unix_now_ms())).await;
    let (copies, landed): (Vec<_>, Vec<_>) = arrived.into_iter().partition(|m| due.contains_key(&m.body));
    assert!(landed.is_empty(), "cancelled messages arrived: {:?}", landed.iter().map(|m| &m.body).collect::<Vec<_>>());
    // The first copy of each is on time. A claim whose marker stayed out of
    // reach goes again on its third receive (docs/sqs.md), so a duplicate
    // comes after the holds, later by design: it must never be early, and it
    // is counted, not refused.
    let mut copies = copies;
    copies.sort_by_key(|m| m.at_ms);
    let mut seen = HashSet::new();
    let (firsts, duplicates): (Vec<_>, Vec<_>) = copies.into_iter().partition(|m| seen.insert(m.body.clone()));
    let bodies = assert_on_time(&firsts, &due);
    assert_eq!(bodies.len(), due.len(), "every message not cancelled arrived");
    for duplicate in &duplicates {
        let late = duplicate.at_ms as i64 - due[&duplicate.body] as i64;
        eprintln!("{}: a duplicate, {late} ms late", duplicate.body);
        assert!(late >= 0, "a duplicate of {} arrived {} ms early", duplicate.body, -late);
    }
    println!("two hosts: {} messages, {} cancelled, {} duplicates", due.len(), cancelled.len(), duplicates.len());
    assert!(duplicates.len() <= MAX_DUPLICATES, "{} duplicates of {} messages (at most {MAX_DUPLICATES})", duplicates.len(), due.len());
}

/// A message whose claim would not fit SQS's limits (ten attributes, 256 KiB)
/// is refused when it is scheduled, saying why, while the largest accepted,
/// by attributes and by size, arrives. (Accepted, it would be claimed in vain
/// on every try and never arrive.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_whose_claim_would_not_fit_is_refused_when_scheduled_and_the_largest_accepted_arrives() {
    let setup = Setup::new().await;
    let mut destination = setup.destination().await;
    let host = setup.serve().await;
    let mut due = HashMap::new();
    let post = |body: String, headers: usize| {
        let headers: serde_json::Map<String, Value> = (0..headers).map(|h| (format!("h{h}"), json!("v"))).collect();
        json!({ "destination": destination.name, "delay": 3_000, "body": body, "headers": headers })
    };
    // By attributes: one header more at a time, until the first refused.
    let mut refused_at = None;
    for headers in 0..=10 {
        let body = format!("headers-{headers}");
        let (status, answer) = host.http.schedule(None, post(body.clone(), headers)).await;
        if status == 202 {
            due.insert(body, answer["due_at"].as_u64().unwrap());
            continue;
        }
        assert_eq!(status, 422, "{answer}");
        assert!(answer["error"].as_str().unwrap_or_default().contains("free for its claim"), "{answer}");
        refused_at = Some(headers);
        break;
    }
    assert!(refused_at.is_some_and(|n| n > 0), "some headers are accepted and ten are not: {refused_at:?}");
    // By size: the largest body accepted, found by halving.
    let sized = |length: usize| {
        let tag = format!("size-{length}-");
        format!("{tag}{}", "x".repeat(length - tag.len()))
    };
    let (mut accepted, mut refused) = (200_000, 262_144);
    let (status, answer) = host.http.schedule(None, post(sized(accepted), 0)).await;
    assert_eq!(status, 202, "{answer}");
    due.insert(sized(accepted), answer["due_at"].as_u64().unwrap());
    while refused - accepted > 1 {
        let length = (accepted + refused) / 2;
        let (status, answer) = host.http.schedule(None, post(sized(length), 0)).await;
        if status == 202 {
            due.insert(sized(length), answer["due_at"].as_u64().unwrap());
            accepted = length;
        } else {
            assert_eq!(status, 422, "{answer}");
            let reason = answer["error"].as_str().unwrap_or_default();
            assert!(reason.contains("SQS allows 262144, less 192"), "the room kept for the cycles and the claim: {answer}");
            refused = length;
        }
    }
    eprintln!("{} headers refused; {accepted} bytes of body accepted, {refused} refused", refused_at.unwrap());
    let received = destination.receive(due.len(), Duration::from_secs(60)).await;
    let arrived = assert_on_time(&received, &due);
    let mut expected: Vec<String> = due.keys().cloned().collect();
    expected.sort();
    assert_eq!(arrived, expected, "every accepted message arrived, the largest ones too");
}
