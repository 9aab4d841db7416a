//! The `nats-schedule` strategy end to end: delays kept by the NATS server as
//! JetStream message schedules (nats-server 2.12+), on the server
//! `HOURGLASS_TEST_NATS_URL` names (scripts/test runs the NATS tests on the
//! machine's 2.9 and on 2.15 from a Debian root).
//!
//! On 2.12 and later: messages arrive at or after their due time, cancelled
//! ones never, rescheduled ones at their new time; a destination whose stream
//! does not allow schedules, or does not capture the schedule subjects, is
//! refused naming what to add, beside valid traffic that arrives. Before 2.12
//! every schedule is refused naming the version, and nothing is stored (an
//! older server would keep the message as an ordinary one and never send it).
//!
//! Lateness window: the server's schedule timer fires at the due time (no
//! sooner than 250 ms after it was last set), then stores the message in the
//! destination stream, where the test's consumer pulls it. Measured on this
//! machine, 2.15.1, 220 messages of 1-7 s: 1-255 ms late, p99 253 ms (the
//! timer's 250 ms floor when schedules are set close together); the window
//! keeps more than twice that.

use std::collections::HashMap;
use std::time::Duration;

use hourglass::config::Config;
use hourglass_e2e::nats::{Cleanup, NatsDestination, connect, nats_url, unique};
use hourglass_e2e::serve::Served;
use serde_json::json;

const ON_TIME_MS: i64 = 600;

/// A config whose default strategy `native` is `nats-schedule`, cancellable: its text, and what to delete after.
fn schedule_config() -> (String, Cleanup) {
    let (clock, _) = unique("schedule-clock");
    let (bucket, _) = unique("schedule-cancel");
    let text = format!(
        "default_strategy = \"native\"\n[broker]\nkind = \"nats\"\nurl = \"{}\"\nclock_stream = \"{clock}\"\n\
         [strategies.native]\nplanner = \"nats-schedule\"\ncancellable = true\n\
         [service.cancel]\nlog = \"{bucket}\"\n[service.ingress]\nenabled = false\n[service.canary]\nenabled = false\n",
        nats_url()
    );
    (text, Cleanup::on(&nats_url(), &[clock, format!("KV_{bucket}")]))
}

async fn server_knows_schedules() -> bool {
    let version = connect().await.client().server_info().version;
    hourglass::broker::nats::schedule::major_minor(&version).is_some_and(|found| found >= hourglass::broker::nats::schedule::FIRST_VERSION)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_arrive_on_time_cancels_remove_them_and_bad_streams_are_named_on_nats() {
    let (text, _cleanup) = schedule_config();
    let config = Config::parse(std::path::Path::new("e2e-nats-schedule.toml"), text).expect("test config");
    let mut destination = NatsDestination::create_for_schedules("schedule-dest", true).await;
    let served = Served::start_ready(&config).await;

    if !server_knows_schedules().await {
        for i in 0..5 {
            let (status, answer) = served.http.schedule(None, json!({ "destination": destination.subject, "delay": "1s", "body": format!("s-{i}") })).await;
            assert_eq!(status, 422, "a server without schedules refuses: {answer}");
            assert!(answer.to_string().contains("2.12"), "the answer names the version schedules need: {answer}");
        }
        assert!(destination.drain(Duration::from_secs(2)).await.is_empty(), "nothing arrives");
        let mut stream = connect().await.get_stream(&destination.stream).await.unwrap();
        assert_eq!(stream.info().await.unwrap().state.messages, 0, "nothing was stored as an ordinary message either");
        served.stop().await;
        destination.delete().await;
        return;
    }

    let plain = NatsDestination::create("schedule-plain").await;
    let uncaptured = NatsDestination::create_for_schedules("schedule-uncaptured", false).await;
    let mut due = HashMap::new();
    let mut ids = Vec::new();
    for i in 0..200u64 {
        let body = format!("s-{i}");
        let delay_ms = 1_000 + (i * 397) % 4_000;
        let (status, answer) = served.http.schedule(None, json!({ "destination": destination.subject, "delay": delay_ms, "body": body })).await;
        assert_eq!(status, 202, "schedule {body}: {answer}");
        due.insert(body, answer["due_at"].as_u64().unwrap());
        ids.push(answer["id"].as_str().unwrap().to_string());
        if i % 20 == 0 {
            // Bad input beside the valid traffic: each refused naming what the stream lacks.
            let (status, answer) = served.http.schedule(None, json!({ "destination": plain.subject, "delay": "1s", "body": "no schedules" })).await;
            assert_eq!(status, 422, "{answer}");
            assert!(answer.to_string().contains("allow_msg_schedules"), "names the stream option: {answer}");
            let (status, answer) = served.http.schedule(None, json!({ "destination": uncaptured.subject, "delay": "1s", "body": "not beside" })).await;
            assert_eq!(status, 422, "{answer}");
            assert!(answer.to_string().contains(&format!("hourglass.schedules.*.{}", uncaptured.subject)), "names the subject to add: {answer}");
            let (status, answer) =
                served.http.schedule(None, json!({ "id": "two.tokens", "destination": destination.subject, "delay": "1s", "body": "dotted" })).await;
            assert_eq!(status, 400, "an id that cannot name a subject: {answer}");
        }
    }
    // Cancel twenty and move four of forty more, due in 4-5 s, while they wait.
    let mut cancelled = Vec::new();
    for i in 0..40u64 {
        let body = format!("late-{i}");
        let (status, answer) = served.http.schedule(None, json!({ "destination": destination.subject, "delay": 4_000 + i * 25, "body": body })).await;
        assert_eq!(status, 202, "{answer}");
        let id = answer["id"].as_str().unwrap().to_string();
        if i % 2 == 1 {
            let (status, answer) = served.http.call("DELETE", &format!("/v1/messages/{id}"), None, None).await;
            assert_eq!(status, 200, "cancel {body}: {answer}");
            cancelled.push(body);
        } else if i % 10 == 0 {
            let (status, answer) = served.http.call("PATCH", &format!("/v1/messages/{id}"), None, Some(json!({ "delay": "7s" }))).await;
            assert_eq!(status, 200, "reschedule {body}: {answer}");
            let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
            due.insert(body, answer["due_at"].as_u64().unwrap());
        } else {
            due.insert(body, answer["due_at"].as_u64().unwrap());
        }
    }

    let received = destination.receive(due.len(), Duration::from_secs(30)).await;
    let unexpected: Vec<&String> = received.iter().map(|r| &r.body).filter(|body| !due.contains_key(*body)).collect();
    assert!(unexpected.is_empty(), "only messages left waiting arrive (cancelled or unknown arrived: {unexpected:?})");
    let mut late: Vec<(String, i64)> = received.iter().map(|r| (r.body.clone(), r.at_ms as i64 - due[&r.body] as i64)).collect();
    late.sort_by_key(|(_, l)| *l);
    let (earliest, worst) = (late[0].clone(), late[late.len() - 1].clone());
    println!("{} scheduled messages: lateness from {} ms to {} ms, p99 {} ms", late.len(), earliest.1, worst.1, late[late.len() * 99 / 100].1);
    assert!(earliest.1 >= 0, "{} arrived {} ms early", earliest.0, -earliest.1);
    assert!(worst.1 <= ON_TIME_MS, "{} arrived {} ms late (window {ON_TIME_MS} ms)", worst.0, worst.1);
    assert!(received.iter().all(|r| r.header("hourglass-target") == Some(destination.subject.as_str())), "hourglass's headers travel with it");
    let after = destination.drain(Duration::from_secs(3)).await;
    assert!(after.is_empty(), "nothing cancelled and no duplicate arrives: {:?}", after.iter().map(|r| &r.body).collect::<Vec<_>>());
    assert!(received.iter().all(|r| !cancelled.contains(&r.body)), "a cancelled message arrived");
    let (status, answer) = served.http.call("DELETE", &format!("/v1/messages/{}", ids[0]), None, None).await;
    assert_eq!(status, 409, "a delivered message cannot be cancelled: {answer}");
    // The server removed each schedule as it fired, and the cancels removed theirs: the stream holds what arrived.
    let mut stream = connect().await.get_stream(&destination.stream).await.unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, received.len() as u64, "no schedule is left behind");

    served.stop().await;
    destination.delete().await;
    plain.delete().await;
    uncaptured.delete().await;
}

/// `hourglass verify --to` on a config with `nats-schedule`: passes for a
/// destination whose stream keeps schedules beside it, fails naming what a
/// plain stream lacks (on a server before 2.12: that schedules are missing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_names_what_a_destination_stream_lacks_for_schedules_on_nats() {
    let (text, _cleanup) = schedule_config();
    let file = std::env::temp_dir().join(format!("{}.toml", unique("schedule-verify").0));
    std::fs::write(&file, text).unwrap();
    let ready = NatsDestination::create_for_schedules("verify-ready", true).await;
    let plain = NatsDestination::create("verify-plain").await;
    let verify = |to: &str| {
        let output = std::process::Command::new(hourglass_e2e::hourglass_binary())
            .args(["--config"])
            .arg(&file)
            .args(["verify", "--no-probes", "--to", to])
            .output()
            .unwrap();
        (output.status.success(), String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr))
    };
    let (passed, ready_report) = verify(&ready.subject);
    let (plain_passed, plain_report) = verify(&plain.subject);
    if server_knows_schedules().await {
        assert!(passed, "{ready_report}");
        assert!(ready_report.contains("allows schedules"), "{ready_report}");
        assert!(!plain_passed && plain_report.contains("allow_msg_schedules"), "{plain_report}");
    } else {
        assert!(!passed && ready_report.contains("no message schedules"), "{ready_report}");
        assert!(!plain_passed, "{plain_report}");
    }
    ready.delete().await;
    plain.delete().await;
    std::fs::remove_file(&file).ok();
}
