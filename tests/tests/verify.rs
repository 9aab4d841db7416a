//! `verify` against a real RabbitMQ: clean on a fresh topology, and each drift
//! named after a test breaks something.

use hourglass::broker::rabbitmq::verify::{Report, verify};
use hourglass_e2e::*;
use lapin::options::QueueDeleteOptions;
use lapin::types::FieldTable;

async fn verify_via_management(commands: &[hourglass::command::Command]) -> Report {
    let report = verify(&amqp_url(), Some(&management_url()), commands).await.unwrap();
    assert!(
        report.method.starts_with("management API"),
        "verify's tests need the management API (rabbitmq-plugins enable rabbitmq_management; scripts/test does this): {}",
        report.method
    );
    report
}

#[tokio::test]
async fn verify_passes_on_a_fresh_topology_and_names_each_drift() {
    let prefix = unique("verify");
    let config = config(&format!("planner = \"binary-levels\"\nprefix = \"{prefix}\""));
    // Deletes what the test declares, also when it fails.
    let cleanup = Cleanup::declared(&topology_of(&config));
    let connection = connect().await;
    let destination = Destination::declare(&connection, "verify-dest").await;
    cleanup.queue(&destination.name);
    let scheduler = scheduler(&config).await;
    scheduler.prepare_destination("main", &destination.name).await.unwrap();
    let mut strategies = hourglass::scheduler::strategies::Strategies::load(&config).unwrap();
    let planner = strategies.get_mut("main").unwrap();
    let mut commands = planner.topology().unwrap();
    commands.extend(planner.destination_setup(&destination.name).unwrap());
    cleanup.also_declared(&commands);

    let clean = verify_via_management(&commands).await;
    assert!(clean.drifts.is_empty(), "{:?}", clean.drifts);
    assert_eq!(clean.checked, commands.len());

    let channel = connection.create_channel().await.unwrap();
    let level = format!("{prefix}.direct-level-05");
    channel.queue_delete(level.as_str().into(), QueueDeleteOptions::default()).await.unwrap();
    let delivery = format!("{prefix}.direct-delivery");
    let key = format!("to:{}", destination.name);
    channel.queue_unbind(destination.name.as_str().into(), delivery.as_str().into(), key.as_str().into(), FieldTable::default()).await.unwrap();

    let drifted = verify_via_management(&commands).await;
    let problems: Vec<String> = drifted.drifts.iter().map(|d| format!("{}: {}", d.object, d.problem)).collect();
    assert!(problems.contains(&format!("queue {level}: missing")), "{problems:?}");
    assert!(problems.contains(&format!("binding exchange {delivery} -> queue {} key {key:?}: missing", destination.name)), "{problems:?}");
    // Deleting the queue removed its binding too: that is reported as well.
    let hold = format!("{prefix}.direct-hold-05");
    assert!(problems.iter().any(|p| p.starts_with(&format!("binding exchange {hold} -> queue {level}"))), "{problems:?}");

    // Without the management API, passive declares still find the missing queue.
    let passive = verify(&amqp_url(), Some("http://guest:guest@127.0.0.1:1"), &commands).await.unwrap();
    assert!(passive.method.starts_with("passive declares"), "{}", passive.method);
    assert!(passive.drifts.iter().any(|d| d.object == format!("queue {level}")), "{:?}", passive.drifts);
    assert!(passive.unchecked > 0);
}

#[tokio::test]
async fn serve_with_topology_verify_refuses_to_start_on_drift_and_declares_nothing() {
    use hourglass::service::Service;
    let prefix = unique("serve-verify");
    let strategy = format!("planner = \"binary-levels\"\nprefix = \"{prefix}\"");
    let more =
        format!("[service]\ntopology = \"verify\"\n[service.ingress]\nenabled = false\n\n[destinations.\"{}\"]\nstrategy = \"main\"", "absent-but-listed");
    let config = config_with(&strategy, &more);
    // Deletes what the test declares, also when it fails.
    let cleanup = Cleanup::declared(&topology_of(&config));
    let connection = connect().await;
    let Err(err) = Service::start(config.clone()).await else { panic!("started on a broker without the topology") };
    let err = err.to_string();
    assert!(err.contains("topology drift") && err.contains(&format!("queue {prefix}.direct-level-00: missing")), "{err}");
    // It declared nothing while checking.
    let passive = lapin::options::QueueDeclareOptions { passive: true, ..Default::default() };
    let probe = connection.create_channel().await.unwrap();
    assert!(probe.queue_declare(format!("{prefix}.direct-level-00").as_str().into(), passive, FieldTable::default()).await.is_err());

    // With the topology in place (and the listed destination set up), it starts.
    let destination = Destination::declare(&connection, "serve-verify-dest").await;
    cleanup.queue(&destination.name);
    let config = config_with(&strategy, &more.replace("absent-but-listed", &destination.name));
    scheduler(&config).await.prepare_destination("main", &destination.name).await.unwrap();
    let service = Service::start(config.clone()).await.expect("starts once the topology is there");
    drop(service);
}
