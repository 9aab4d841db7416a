//! `hourglass parked list|replay|drop` on a real RabbitMQ: messages whose
//! destination was deleted while they waited are listed with their
//! destination and reason (and stay), one is replayed to its recreated
//! destination, the other dropped; the valid message beside them arrives.

use std::time::Duration;

use hourglass::scheduler::ScheduleRequest;
use hourglass_e2e::*;
use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};

fn parked_cli(path: &std::path::Path, args: &[&str]) -> std::process::Output {
    let mut all = vec!["--config", path.to_str().unwrap(), "parked"];
    all.extend_from_slice(args);
    std::process::Command::new(hourglass_binary()).args(all).output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_messages_are_listed_replayed_to_their_destination_and_dropped() {
    let connection = connect().await;
    let channel = connection.create_channel().await.unwrap();
    let prefix = unique("parked");
    let text = config_text(&format!("planner = \"binary-levels\"\nprefix = \"{prefix}\"\nlevels = 4"), "");
    let config = hourglass::config::Config::parse(std::path::Path::new("parked.toml"), text.clone()).unwrap();
    let path = std::env::temp_dir().join(format!("{prefix}.toml"));
    std::fs::write(&path, &text).unwrap();
    let parking = format!("{prefix}.parked");
    // Deletes what the test declares, also when it fails.
    let cleanup = Cleanup::declared(&topology_of(&config));

    let gone = unique("parked-gone");
    cleanup.queue(&gone);
    channel.queue_declare(gone.as_str().into(), QueueDeclareOptions::default(), Default::default()).await.unwrap();
    let mut valid = Destination::declare(&connection, "parked-valid").await;
    cleanup.queue(&valid.name);
    let scheduler = scheduler(&config).await;
    let request = |destination: &str, body: &str| ScheduleRequest {
        destination: destination.to_string(),
        delay_ms: 1_000,
        body: body.as_bytes().to_vec(),
        ..Default::default()
    };
    let first = scheduler.schedule(request(&gone, "first")).await.unwrap().id;
    let second = scheduler.schedule(request(&gone, "second")).await.unwrap().id;
    scheduler.schedule(request(&valid.name, "valid")).await.unwrap();
    channel.queue_delete(gone.as_str().into(), QueueDeleteOptions::default()).await.unwrap();

    let arrived = valid.receive(1, Duration::from_secs(5)).await;
    assert_eq!(arrived[0].delivery.data, b"valid", "the valid message beside them arrives");
    until("both messages parked", Duration::from_secs(5), async || queue_depth(&channel, &parking).await == 2).await;

    let listed = parked_cli(&path, &["list", "--format", "json"]);
    assert!(listed.status.success(), "{listed:?}");
    let listed: Vec<serde_json::Value> = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    for message in &listed {
        assert_eq!(message["queue"], parking.as_str());
        assert_eq!(message["destination"], gone.as_str());
        assert!(message["reason"].as_str().unwrap().contains("destination queue was gone"), "{message}");
    }
    // Given back: the broker requeues them as it handles the listing's nacks,
    // which a declare on another connection can overtake by a moment.
    until("listing moves nothing: both back in parking", Duration::from_secs(5), async || queue_depth(&channel, &parking).await == 2).await;

    // The destination is back: replay one message to it.
    let mut replayed_to = Destination::named(&connection, &gone).await;
    let replayed = parked_cli(&path, &["replay", "--id", &first]);
    assert!(replayed.status.success(), "{replayed:?}");
    assert!(String::from_utf8_lossy(&replayed.stdout).contains("replayed 1 messages"), "{replayed:?}");
    let got = replayed_to.receive(1, Duration::from_secs(5)).await;
    assert_eq!(got[0].delivery.data, b"first");
    until("the other given back to parking", Duration::from_secs(5), async || queue_depth(&channel, &parking).await == 1).await;

    let refused = parked_cli(&path, &["drop"]);
    assert!(!refused.status.success() && String::from_utf8_lossy(&refused.stderr).contains("--all"), "{refused:?}");
    let dropped = parked_cli(&path, &["drop", "--id", &second]);
    assert!(String::from_utf8_lossy(&dropped.stdout).contains("dropped 1 messages"), "{dropped:?}");
    assert_eq!(queue_depth(&channel, &parking).await, 0);
    replayed_to.assert_quiet(Duration::from_millis(300)).await;

    std::fs::remove_file(&path).ok();
}
