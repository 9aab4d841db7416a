//! The `nsb-v2` and `celery` presets share a broker with NServiceBus's and
//! Celery's delay infrastructure: hourglass declares over theirs without
//! conflict, and messages published either way arrive. The presets use the
//! other clients' fixed names, so each test runs in a private vhost.

use std::time::Duration;

use hourglass::clock::unix_now_ms;
use hourglass::scheduler::ScheduleRequest;
use hourglass_e2e::*;
use lapin::BasicProperties;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};

/// The routing key both NServiceBus and Celery build: 28 bits of whole seconds, then the address.
fn foreign_key(seconds: u64, destination: &str) -> String {
    let bits: Vec<String> = (0..28).rev().map(|b| ((seconds >> b) & 1).to_string()).collect();
    format!("{}.{destination}", bits.join("."))
}

/// Declares one level queue as the other client does, with 32-bit integers as .NET and Python send them.
async fn declare_like_the_other_client(connection: &lapin::Connection, queue: &str, level: u32, next: &str, quorum: bool) {
    let channel = connection.create_channel().await.unwrap();
    let mut args = FieldTable::default();
    args.insert("x-queue-type".into(), AMQPValue::LongString((if quorum { "quorum" } else { "classic" }).into()));
    args.insert("x-overflow".into(), AMQPValue::LongString("reject-publish".into()));
    args.insert("x-message-ttl".into(), AMQPValue::LongInt((1i32 << level) * 1_000));
    args.insert("x-dead-letter-exchange".into(), AMQPValue::LongString(next.into()));
    if quorum {
        args.insert("x-dead-letter-strategy".into(), AMQPValue::LongString("at-least-once".into()));
    }
    channel
        .queue_declare(queue.into(), QueueDeclareOptions { durable: true, ..Default::default() }, args)
        .await
        .unwrap_or_else(|e| panic!("declare {queue} as the other client: {e}"));
}

async fn publish_like_the_other_client(connection: &lapin::Connection, exchange: &str, key: &str, body: &[u8]) {
    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    let options = BasicPublishOptions { mandatory: true, ..Default::default() };
    let confirm = channel.basic_publish(exchange.into(), key.into(), options, body, BasicProperties::default()).await.unwrap();
    let confirmation = confirm.await.unwrap();
    assert!(confirmation.take_message().is_none(), "the other client's publish was returned unroutable");
}

/// How late either client's message may arrive. Both delays are whole
/// seconds on 1 s levels (no rounding): measured 10–26 ms late (nsb-v2 and
/// celery, two tests at a time, 2026-12-02; the test prints them). It was
/// 1,000 ms, which a whole extra 1 s hop passed.
/// On RabbitMQ 4.3, in a full run of its tests, a whole-second path measured up to 103 ms (interop.rs nsb-v2); 250 ms holds on both, and a missed 1 s hop is still 1,000 ms late.
const ON_TIME_MS: u64 = 250;

async fn round_trip(preset: &str, level_name: impl Fn(u32) -> String, quorum: bool) {
    let vhost = vhost::PrivateVhost::create("interop");
    let connection = connect_to(&vhost.url).await;
    // The other client got there first with its own declaration of level 1.
    declare_like_the_other_client(&connection, &level_name(1), 1, &level_name(0), quorum).await;
    let text = config_text_on(&vhost.url, &format!("planner = \"binary-levels\"\npreset = \"{preset}\""), "");
    let config = hourglass::config::Config::parse(std::path::Path::new("interop.toml"), text).expect("test config");
    let mut destination = Destination::declare(&connection, preset).await;
    let scheduler = scheduler(&config).await;

    let scheduled = scheduler
        .schedule(ScheduleRequest { destination: destination.name.clone(), delay_ms: 2_000, body: b"from hourglass".to_vec(), ..Default::default() })
        .await
        .expect("hourglass declares over the other client's topology and schedules");
    let foreign_due = unix_now_ms() + 3_000;
    publish_like_the_other_client(&connection, &level_name(1), &foreign_key(3, &destination.name), b"from the other client").await;

    let received = destination.receive(2, Duration::from_secs(10)).await;
    let ours = received.iter().find(|r| r.delivery.data == b"from hourglass").expect("hourglass's message arrived");
    let theirs = received.iter().find(|r| r.delivery.data == b"from the other client").expect("the other client's message arrived");
    eprintln!("{preset}: ours {} ms late, theirs {} ms late", ours.at_ms as i64 - scheduled.due_at_ms as i64, theirs.at_ms as i64 - foreign_due as i64);
    assert!(ours.at_ms >= scheduled.due_at_ms && ours.at_ms <= scheduled.due_at_ms + ON_TIME_MS, "{preset}: ours arrived outside [due, due + {ON_TIME_MS} ms]");
    assert!(theirs.at_ms >= foreign_due && theirs.at_ms <= foreign_due + ON_TIME_MS, "{preset}: theirs arrived outside [due, due + {ON_TIME_MS} ms]");
    destination.delete().await;
    // Dropping the vhost deletes the presets' fixed-name queues and exchanges.
    drop(vhost);
}

#[tokio::test]
async fn nsb_v2_preset_shares_a_broker_with_nservicebus() {
    round_trip("nsb-v2", |level| format!("nsb.v2.delay-level-{level:02}"), true).await;
}

#[tokio::test]
async fn celery_preset_shares_a_broker_with_celery() {
    // Celery declares quorum levels by default (broker_native_delayed_delivery_queue_type), as hourglass does.
    round_trip("celery", |level| format!("celery_delayed_{level}"), true).await;
}

/// `hourglass inspect` counts what waits in a shared preset's levels, the
/// other client's messages included, per level.
#[tokio::test]
async fn inspect_counts_celery_clients_messages_in_the_shared_levels() {
    let vhost = vhost::PrivateVhost::create("inspect-celery");
    let connection = connect_to(&vhost.url).await;
    let text = config_text_on(&vhost.url, "planner = \"binary-levels\"\npreset = \"celery\"", "");
    let config = hourglass::config::Config::parse(std::path::Path::new("interop.toml"), text.clone()).expect("test config");
    let destination = Destination::declare(&connection, "celery-inspect").await;
    let scheduler = scheduler(&config).await;
    // 100 s waits first at level 6 (64 s); the other client's 60 s, published at the top as kombu does, at level 5 (32 s).
    for _ in 0..2 {
        let request = ScheduleRequest { destination: destination.name.clone(), delay_ms: 100_000, body: b"ours".to_vec(), ..Default::default() };
        scheduler.schedule(request).await.expect("scheduled");
    }
    for _ in 0..3 {
        publish_like_the_other_client(&connection, "celery_delayed_27", &foreign_key(60, &destination.name), b"theirs").await;
    }

    let path = std::env::temp_dir().join(format!("{}.toml", unique("inspect-celery")));
    std::fs::write(&path, &text).unwrap();
    let output = std::process::Command::new(hourglass_binary()).args(["--config", path.to_str().unwrap(), "inspect", "--format", "json"]).output().unwrap();
    std::fs::remove_file(&path).ok();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let strategies: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let main = &strategies[0];
    assert_eq!(main["waiting"].as_u64(), Some(5), "{main}");
    let level = |name: &str| main["queues"].as_array().unwrap().iter().find(|q| q["queue"] == name).and_then(|q| q["messages"].as_u64());
    assert_eq!((level("celery_delayed_6"), level("celery_delayed_5")), (Some(2), Some(3)), "{main}");
    destination.delete().await;
    drop(vhost);
}
