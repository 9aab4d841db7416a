//! The example RabbitMQ config works as is, through the `hourglass` binary.

use std::process::Command;
use std::time::Duration;

use hourglass_e2e::*;

#[tokio::test]
async fn examples_rabbitmq_toml_schedules_and_verifies_as_is() {
    let connection = connect().await;
    let mut destination = Destination::declare(&connection, "example").await;
    let run = |args: &[&str]| {
        Command::new(hourglass_binary())
            .current_dir(repo_root())
            .args(["--config", "examples/rabbitmq.toml"])
            .args(args)
            .env("HOURGLASS_AMQP_URL", amqp_url())
            .output()
            .unwrap()
    };
    for _ in 0..2 {
        let applied = run(&["topology", "--apply", "--to", &destination.name]);
        assert!(applied.status.success(), "topology --apply is idempotent: {}", String::from_utf8_lossy(&applied.stderr));
        assert!(String::from_utf8_lossy(&applied.stdout).contains("applied the topology of strategy seconds on RabbitMQ"));
    }
    let output = run(&["schedule", "--to", &destination.name, "--delay", "1s", "--body", "hello", "--header", "tenant=acme", "--format", "json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let scheduled: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let received = destination.receive(1, Duration::from_secs(5)).await;
    assert_eq!(received[0].delivery.data, b"hello");
    assert_eq!(
        received[0].delivery.properties.message_id().as_ref().map(|m| m.to_string()),
        scheduled["id"].as_str().map(str::to_string)
    );
    assert!(received[0].at_ms >= scheduled["due_at_ms"].as_u64().unwrap());

    let verified = run(&["verify", "--to", &destination.name]);
    assert!(verified.status.success(), "{}{}", String::from_utf8_lossy(&verified.stdout), String::from_utf8_lossy(&verified.stderr));
    assert!(String::from_utf8_lossy(&verified.stdout).contains("no drift"));

    let missing = run(&["schedule", "--to", &unique("absent"), "--delay", "1s", "--body", "x"]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("does not exist"), "{}", String::from_utf8_lossy(&missing.stderr));

    let config = hourglass::config::Config::load(&repo_root().join("examples/rabbitmq.toml")).unwrap();
    let mut strategies = hourglass::strategy::Strategies::load(&config).unwrap();
    let topology = strategies.get_mut("seconds").unwrap().topology().unwrap();
    delete_declared(&connection, &topology).await;
    destination.delete().await;
}
