//! The service counts what its strategies parked: a message whose destination
//! queue was deleted while it waited shows in `hourglass_parked_messages`,
//! while a canary beside it arrives.

use std::time::Duration;

use hourglass::service::Service;
use hourglass_e2e::serve::Served;
use hourglass_e2e::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_message_shows_in_the_parked_messages_gauge() {
    let prefix = unique("parked-metric");
    let config = config_with(&format!("planner = \"binary-levels\"\nprefix = \"{prefix}\"\nlevels = 4"), "[service.ingress]\nenabled = false");
    // Deletes what the test declares, also when it fails.
    let cleanup = Cleanup::declared(&topology_of(&config));
    let connection = connect().await;
    let mut canary = Destination::declare(&connection, "parked-canary").await;
    cleanup.queue(&canary.name);
    let doomed = Destination::declare(&connection, "parked-doomed").await;
    cleanup.queue(&doomed.name);
    let doomed_name = doomed.name.clone();
    let served = Served::start(Service::start(config.clone()).await.expect("service starts")).await;
    let gauge = "hourglass_parked_messages{strategy=\"main\"}";

    for destination in [&doomed_name, &canary.name] {
        let (status, answer) = served.http.schedule(None, json!({ "destination": destination, "delay": "2s", "body": "x" })).await;
        assert_eq!(status, 202, "{answer}");
    }
    doomed.delete().await;
    canary.receive(1, Duration::from_secs(10)).await;
    until("the parked message counted", Duration::from_secs(20), async || served.http.metric(gauge).await == 1.0).await;

    served.stop().await;
}
