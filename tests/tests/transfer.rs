//! `hourglass transfer` on a real RabbitMQ: 10,000 messages waiting in classic
//! binary levels move to quorum levels while in flight; every one arrives,
//! none before its original due time, none twice; `--dry-run` moves nothing;
//! messages without hourglass's headers stay where they are, counted.
//!
//! Lateness is printed, not bounded: measured here p50 0.5 s, p99 1.0 s after the
//! original due time on a quiet machine (1.1–1.6 s and 3.4–3.6 s beside other
//! tests) — whole-second levels round the time left up, and the quorum levels
//! carry 10,000 messages falling due within ten seconds.

use std::collections::HashMap;
use std::time::Duration;

use hourglass::config::Config;
use hourglass::scheduler::ScheduleRequest;
use hourglass_e2e::*;
use lapin::options::QueueDeclareOptions;

/// How late the latest of the 10,000 transferred messages may arrive: what is
/// left of each delay is planned again on 1 s levels, rounded up to the unit
/// (one precision step), plus the transfer's and the consumer's backlog.
/// Measured (the test takes both slots; other engineers' builds beside,
/// 2026-12-02; printed): p50 580 ms, p99 1,087 ms, max 1,165 ms; and p50
/// 665 ms, p99 1,495 ms, max 1,795 ms (which failed a first 1,500 ms window);
/// on RabbitMQ 4.3 in a CI run, p50 578 ms, p99 1,077 ms, max 2,685 ms (which
/// failed a 2,500 ms window).
const TRANSFER_ON_TIME_MS: i64 = 1_000 + 2_500;
/// How late a message moved from hold queues to binary levels may arrive:
/// one 1 s precision step (the rest of its delay rounds up) plus 500 ms.
/// Measured 27–105 ms, and 1,085 and 1,322 ms for one rounded up a whole step
/// (two tests at a time, builds beside, 2026-12-02; printed; 1,322 failed a
/// first 1,250 ms window).
const HELD_ON_TIME_MS: i64 = 1_000 + 500;

const MESSAGES: usize = 10_000;

/// Messages waiting in the strategy's level queues now.
async fn waiting(connection: &lapin::Connection, config: &Config, strategy: &str) -> u64 {
    let mut strategies = hourglass::scheduler::strategies::Strategies::load(config).unwrap();
    let topology = strategies.get_mut(strategy).unwrap().topology().unwrap();
    let mut total = 0;
    for (queue, _) in hourglass::command::waiting_queues(&topology) {
        let channel = connection.create_channel().await.unwrap();
        let passive = QueueDeclareOptions { passive: true, ..Default::default() };
        total += channel.queue_declare(queue.as_str().into(), passive, Default::default()).await.map(|q| q.message_count() as u64).unwrap_or(0);
    }
    total
}

fn transfer_cli(path: &std::path::Path, extra: &[&str]) -> std::process::Output {
    transfer_between(path, "classic", "quorum", extra)
}

fn transfer_between(path: &std::path::Path, from: &str, to: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["--config", path.to_str().unwrap(), "transfer", "--from", from, "--to", to];
    args.extend_from_slice(extra);
    std::process::Command::new(hourglass_binary()).args(args).output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_messages_in_flight_move_from_classic_to_quorum_levels_none_early_none_lost() {
    let (classic, quorum) = (unique("transfer-classic"), unique("transfer-quorum"));
    let (config, path) = classic_and_quorum_levels(&classic, &quorum, "transfer");
    // Deletes what the test declares, also when it fails.
    let cleanup = Cleanup::declared(&topologies_of(&config, &["classic", "quorum"]));
    let connection = connect().await;
    let mut destination = Destination::declare(&connection, "transfer-dest").await;
    cleanup.queue(&destination.name);

    // 45 to 55 s out, spread by the millisecond: still waiting when the transfer
    // ends. Scheduling and moving 10,000 took up to 24 s beside the full suite in
    // CI; with 20 s the first ones came due mid-transfer and went out through the
    // classic levels instead (on time, but not moved).
    let scheduler = scheduler(&config).await;
    let requests: Vec<ScheduleRequest> = (0..MESSAGES)
        .map(|i| ScheduleRequest {
            destination: destination.name.clone(),
            delay_ms: 45_000 + (i as u64 * 997) % 10_000,
            body: format!("m-{i}").into_bytes(),
            ..Default::default()
        })
        .collect();
    let mut due: HashMap<String, u64> = HashMap::new();
    for (i, result) in scheduler.schedule_many(requests, 256).await.into_iter().enumerate() {
        due.insert(format!("m-{i}"), result.expect("scheduled").due_at_ms);
    }
    assert_eq!(waiting(&connection, &config, "classic").await, MESSAGES as u64);

    let dry = transfer_cli(&path, &["--dry-run", "--format", "json"]);
    assert!(dry.status.success(), "{dry:?}");
    let report: serde_json::Value = serde_json::from_slice(&dry.stdout).unwrap();
    let found: u64 = report["queues"].as_array().unwrap().iter().map(|q| q["found"].as_u64().unwrap()).sum();
    assert_eq!((found, report["moved"].as_u64()), (MESSAGES as u64, Some(0)), "{report}");
    assert_eq!(waiting(&connection, &config, "classic").await, MESSAGES as u64, "--dry-run changed nothing");
    assert_eq!(waiting(&connection, &config, "quorum").await, 0);

    let moved = transfer_cli(&path, &[]);
    let printed = String::from_utf8_lossy(&moved.stdout);
    assert!(moved.status.success(), "{moved:?}");
    assert!(printed.contains(&format!("moved {MESSAGES} messages from classic to quorum")), "{printed}");
    assert_eq!(waiting(&connection, &config, "classic").await, 0, "the classic levels are empty");

    let received = destination.receive(MESSAGES, Duration::from_secs(75)).await;
    let mut seen = std::collections::HashSet::new();
    let mut lateness = Vec::with_capacity(MESSAGES);
    for message in &received {
        let body = String::from_utf8_lossy(&message.delivery.data).to_string();
        assert!(seen.insert(body.clone()), "{body} arrived twice");
        let late = message.at_ms as i64 - due[&body] as i64;
        assert!(late >= 0, "{body} arrived {} ms before its original due time", -late);
        lateness.push(late);
    }
    lateness.sort();
    let at = |q: f64| lateness[((lateness.len() - 1) as f64 * q) as usize];
    eprintln!("all {MESSAGES} arrived; late p50 {} ms, p99 {} ms, max {} ms", at(0.5), at(0.99), at(1.0));
    assert!(at(1.0) <= TRANSFER_ON_TIME_MS, "the latest arrived {} ms late (window {TRANSFER_ON_TIME_MS} ms)", at(1.0));
    destination.assert_quiet(Duration::from_millis(500)).await;

    std::fs::remove_file(&path).ok();
}

/// Messages another client put in a level (no `hourglass-due-at`) sit among
/// hourglass's own: they stay where they are and are counted, held unacked
/// across the batches so the takes move past them, and every other message
/// moves; a transfer that left any exits 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_without_hourglass_headers_stay_in_place_while_the_rest_move() {
    const OURS: usize = 300;
    const FOREIGN: usize = 20;
    let (classic, quorum) = (unique("transfer-stay-classic"), unique("transfer-stay-quorum"));
    let (config, path) = classic_and_quorum_levels(&classic, &quorum, "transfer-stay");
    // Deletes what the test declares, also when it fails.
    let cleanup = Cleanup::declared(&topologies_of(&config, &["classic", "quorum"]));
    let connection = connect().await;
    let destination = Destination::declare(&connection, "transfer-stay").await;
    cleanup.queue(&destination.name);
    let scheduler = scheduler(&config).await;

    // 600 to 690 s out: every one waits in level 9 (512 s) first; the foreign
    // ones go in the middle (after the first half declared the levels).
    let request = |i: usize| ScheduleRequest {
        destination: destination.name.clone(),
        delay_ms: 600_000 + i as u64 * 300,
        body: format!("m-{i}").into_bytes(),
        ..Default::default()
    };
    let first_half = scheduler.schedule_many((0..OURS / 2).map(request).collect(), 64).await;
    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(Default::default()).await.unwrap();
    let level = format!("{classic}.direct-level-09");
    let mandatory = lapin::options::BasicPublishOptions { mandatory: true, ..Default::default() };
    for i in 0..FOREIGN {
        let body = format!("foreign-{i}");
        let confirm = channel.basic_publish("".into(), level.as_str().into(), mandatory, body.as_bytes(), Default::default()).await.unwrap();
        let confirm = confirm.await.unwrap();
        assert!(confirm.is_ack() && confirm.take_message().is_none(), "foreign-{i} reached {level}");
    }
    let second_half = scheduler.schedule_many((OURS / 2..OURS).map(request).collect(), 64).await;
    assert!(first_half.iter().chain(&second_half).all(Result::is_ok), "scheduled");
    assert_eq!(queue_depth(&channel, &level).await as usize, OURS + FOREIGN);

    let moved = transfer_cli(&path, &["--batch", "64", "--format", "json"]);
    assert_eq!(moved.status.code(), Some(1), "a transfer that left messages exits 1: {moved:?}");
    let report: serde_json::Value = serde_json::from_slice(&moved.stdout).unwrap();
    assert_eq!((report["moved"].as_u64(), report["left"].as_u64()), (Some(OURS as u64), Some(FOREIGN as u64)), "{report}");
    let row = report["queues"].as_array().unwrap().iter().find(|q| q["queue"] == level.as_str()).expect("level 9's row");
    assert_eq!(row["left"]["no hourglass-due-at header"].as_u64(), Some(FOREIGN as u64), "{row}");
    // Given back as the transfer closed; the broker may still be putting them back.
    until("the foreign messages are back in their queue", Duration::from_secs(10), async || queue_depth(&channel, &level).await as usize == FOREIGN).await;
    assert_eq!(waiting(&connection, &config, "quorum").await, OURS as u64, "hourglass's own wait in the quorum levels");

    std::fs::remove_file(&path).ok();
}

/// Hold queues are made per message: transfer finds them through the
/// management API and empties them into binary levels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_in_hold_queues_move_to_binary_levels() {
    const HELD: usize = 100;
    let (held, levels) = (unique("transfer-hold"), unique("transfer-levels"));
    let text = format!(
        "default_strategy = \"held\"\n{}",
        config_text(
            &format!("planner = \"binary-levels\"\nprefix = \"{levels}\"\nunit = \"1ms\""),
            &format!("[strategies.held]\nplanner = \"hold-queues\"\nprefix = \"{held}\"\n"),
        )
        .replace("[strategies.main]", "[strategies.levels]")
    );
    let config = Config::parse(std::path::Path::new("transfer.toml"), text.clone()).unwrap();
    let path = std::env::temp_dir().join(format!("{}.toml", unique("transfer-held")));
    std::fs::write(&path, &text).unwrap();
    // Deletes what the test declares, also when it fails.
    let cleanup = Cleanup::declared(&topologies_of(&config, &["held", "levels"]));
    let connection = connect().await;
    let mut destination = Destination::declare(&connection, "transfer-held").await;
    cleanup.queue(&destination.name);
    // The hold queues the five delays below make.
    for delay_ms in (15_000..20_000).step_by(1_000) {
        cleanup.queue(&format!("{held}.{delay_ms}ms.{}", destination.name));
    }

    let scheduler = scheduler(&config).await;
    let mut due: HashMap<String, u64> = HashMap::new();
    for i in 0..HELD {
        let request = ScheduleRequest {
            destination: destination.name.clone(),
            delay_ms: 15_000 + (i as u64 % 5) * 1_000,
            body: format!("h-{i}").into_bytes(),
            ..Default::default()
        };
        due.insert(format!("h-{i}"), scheduler.schedule(request).await.expect("scheduled").due_at_ms);
    }

    let moved = transfer_between(&path, "held", "levels", &["--format", "json"]);
    assert!(moved.status.success(), "{moved:?}");
    let report: serde_json::Value = serde_json::from_slice(&moved.stdout).unwrap();
    assert_eq!(report["moved"].as_u64(), Some(HELD as u64), "{report}");
    let queues: Vec<&str> = report["queues"].as_array().unwrap().iter().map(|q| q["queue"].as_str().unwrap()).collect();
    assert_eq!(queues.len(), 5, "one hold queue per whole-second delay: {queues:?}");
    assert!(queues.iter().all(|q| q.starts_with(&held)), "{queues:?}");

    let received = destination.receive(HELD, Duration::from_secs(30)).await;
    for message in &received {
        let body = String::from_utf8_lossy(&message.delivery.data).to_string();
        let late = message.at_ms as i64 - due[&body] as i64;
        assert!(late >= 0, "{body} arrived {} ms before its original due time", -late);
        eprintln!("{body}: {late} ms late (window {HELD_ON_TIME_MS} ms)");
        assert!(late <= HELD_ON_TIME_MS, "{body} arrived {late} ms late (window {HELD_ON_TIME_MS} ms)");
    }
    destination.assert_quiet(Duration::from_millis(300)).await;

    std::fs::remove_file(&path).ok();
}
