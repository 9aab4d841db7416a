//! The passive check of a destination on a real RabbitMQ says what the broker
//! meant: a queue that exists but is exclusive to another connection, or
//! whose home node is down, is never reported as "does not exist" — the
//! first is named as exclusive, the second is "try again" (503), not the
//! sender's mistake (422). `transfer` never reads such a queue as empty.

use std::time::Duration;

use hourglass::broker::rabbitmq::take::Taker;
use hourglass::config::Config;
use hourglass::executor::ExecutorError;
use hourglass::scheduler::{ScheduleError, ScheduleRequest};
use hourglass::service::Service;
use hourglass_e2e::cluster::Cluster;
use hourglass_e2e::serve::Served;
use hourglass_e2e::*;
use lapin::options::QueueDeclareOptions;
use serde_json::json;

/// `queue`, declared exclusive on a connection of its own: it goes when that connection closes.
async fn exclusive_queue(queue: &str) -> lapin::Connection {
    let owner = connect().await;
    let channel = owner.create_channel().await.unwrap();
    let options = QueueDeclareOptions { exclusive: true, ..Default::default() };
    channel.queue_declare(queue.into(), options, Default::default()).await.expect("declare the exclusive queue");
    owner
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_exclusive_to_another_connection_is_named_as_such_not_missing() {
    let queue = unique("exclusive-dest");
    let config = config(&format!("planner = \"binary-levels\"\nprefix = \"{}\"", unique("exclusive")));
    // Deletes what the test declares, also when it fails (the exclusive queue goes with its connection).
    let _cleanup = Cleanup::declared(&topology_of(&config));
    let owner = exclusive_queue(&queue).await;
    let scheduler = scheduler(&config).await;

    let request = ScheduleRequest { destination: queue.clone(), delay_ms: 1_000, ..Default::default() };
    match scheduler.schedule(request).await {
        Err(ScheduleError::Broker(ExecutorError::Refused(why))) => {
            assert!(why.contains("exclusive") && why.contains(&queue), "{why}");
            assert!(!why.contains("does not exist"), "an existing queue reported missing: {why}");
        }
        other => panic!("expected a refusal naming exclusivity, got {other:?}"),
    }

    // Transfer's depth read: an error, never "no such queue".
    let taker = Taker::open(&amqp_url()).await.unwrap();
    let depth = taker.depth(&queue).await;
    assert!(matches!(&depth, Err(ExecutorError::Refused(why)) if why.contains("exclusive")), "{depth:?}");
    assert!(matches!(taker.depth(&unique("no-such-queue")).await, Ok(None)), "a plain missing queue is still None");
    taker.close().await;

    owner.close(200, "done".into()).await.ok();
}

/// One of the source strategy's waiting queues cannot be read (here it is
/// exclusive to another connection): the transfer reports it with the reason
/// and exits 1, so nobody deletes the old topology thinking it empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfer_counts_a_queue_it_cannot_read_as_left_not_empty() {
    let (classic, quorum) = (unique("unread-classic"), unique("unread-quorum"));
    let (config, path) = classic_and_quorum_levels(&classic, &quorum, "transfer-unread");
    // Both strategies' topology, deleted also when the test fails.
    let _cleanup = Cleanup::declared(&topologies_of(&config, &["classic", "quorum"]));
    let source = topologies_of(&config, &["classic"]);
    let (locked, _) = hourglass::command::waiting_queues(&source).into_iter().next().expect("a waiting queue");
    let owner = exclusive_queue(&locked).await;

    let args = ["--config", path.to_str().unwrap(), "transfer", "--from", "classic", "--to", "quorum", "--format", "json"];
    let output = std::process::Command::new(hourglass_binary()).args(args).output().unwrap();
    assert!(!output.status.success(), "a queue it could not read must fail the transfer: {output:?}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}: {output:?}"));
    assert_eq!(report["unreadable"].as_u64(), Some(1), "{report}");
    let row = report["queues"].as_array().unwrap().iter().find(|q| q["queue"] == locked.as_str()).expect("the locked queue is listed");
    assert!(row["unreadable"].as_str().is_some_and(|why| why.contains("exclusive")), "{row}");

    owner.close(200, "done".into()).await.ok();
    std::fs::remove_file(&path).ok();
}

/// A classic destination queue whose home node is stopped still exists:
/// RabbitMQ answers its passive declare with a 404 that says so ("home node
/// … is down or inaccessible" on 3.x; "process is stopped by supervisor" on
/// 4.3, where the queue's record outlives its process). The sender is told to try again (503), not that the queue
/// does not exist (422). Messages for a queue on a live node, scheduled
/// before, between and after those requests, are accepted and delivered
/// meanwhile. On a three-node cluster of the test's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_whose_home_node_is_down_is_503_not_422() {
    let cluster = tokio::task::spawn_blocking(Cluster::start).await.unwrap().expect("a private three-node cluster starts");
    let (entry, home) = (&cluster.nodes[0], &cluster.nodes[1]);
    let queue = unique("home-down");
    {
        // Declared through its home node: a classic queue lives where it was declared.
        let connection = connect_to(&home.url()).await;
        let channel = connection.create_channel().await.unwrap();
        let options = QueueDeclareOptions { durable: true, ..Default::default() };
        channel.queue_declare(queue.as_str().into(), options, Default::default()).await.expect("declare on the home node");
        connection.close(200, "done".into()).await.ok();
    }
    let config = Config::parse(
        std::path::Path::new("e2e.toml"),
        config_text_on(&entry.url(), &format!("planner = \"binary-levels\"\nprefix = \"{}\"", unique("home-down")), ""),
    )
    .unwrap();
    tokio::task::block_in_place(|| home.stop()).expect("stop the queue's home node");
    // Asked only once the entry node knows its peer is gone: a destination
    // found once is not checked again, so an early 202 would end the test.
    let entry_connection = connect_to(&entry.url()).await;
    until("the entry node sees the home node down", Duration::from_secs(30), async || {
        let channel = entry_connection.create_channel().await.unwrap();
        let passive = QueueDeclareOptions { passive: true, ..Default::default() };
        channel
            .queue_declare(queue.as_str().into(), passive, Default::default())
            .await
            .is_err_and(|e| ["home node", "stopped by supervisor"].iter().any(|wording| e.to_string().contains(wording)))
    })
    .await;
    // Valid traffic beside the fault: a queue on the entry node, which stays up.
    let mut live = Destination::declare(&entry_connection, "home-up").await;
    let served = Served::start(Service::new(scheduler(&config).await, None)).await;
    let mut scheduled = Vec::new();
    let mut schedule_valid = async |label: &str| {
        let (status, answer) = served.http.schedule(None, json!({ "destination": live.name, "delay": "1s", "body": label })).await;
        assert_eq!(status, 202, "a message for a queue on a live node, {label}: {answer}");
        scheduled.push(answer["id"].as_str().expect("an id").to_string());
    };
    schedule_valid("before").await;
    let body = json!({ "destination": queue, "delay": "1s", "body": "x" });
    let (status, answer) = served.http.schedule(None, body.clone()).await;
    assert_eq!(status, 503, "a queue whose home node is down is not the sender's mistake: {answer}");
    let error = answer["error"].as_str().unwrap_or_default();
    assert!(!error.contains("does not exist") && error.contains("cannot answer for it now"), "{answer}");
    schedule_valid("between").await;
    // Not remembered as missing: the next request asks the broker again, and is answered the same.
    let (again, answer) = served.http.schedule(None, body).await;
    assert_eq!(again, 503, "{answer}");
    schedule_valid("after").await;
    // Delivered while the home node is still down: one second's delay, through the levels on the live nodes.
    let mut delivered: Vec<String> = live
        .receive(scheduled.len(), Duration::from_secs(30))
        .await
        .iter()
        .map(|received| received.delivery.properties.message_id().as_ref().expect("a message id").to_string())
        .collect();
    delivered.sort();
    scheduled.sort();
    assert_eq!(delivered, scheduled, "every message for the live queue arrived, once");
    served.stop().await;
    entry_connection.close(200, "done".into()).await.ok();
    drop(cluster);
}
