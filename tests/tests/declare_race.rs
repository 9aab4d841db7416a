//! A declare or publish that meets the end of its connection (dropped by a
//! proxy, tests/src/blackhole.rs) ends at once: it fails, or succeeds on a
//! fresh connection. Before, one that asked lapin for a channel just as the
//! connection dropped (the control channel opens on the first declare, a
//! publish channel on the first publish) waited out CHANNEL_TIMEOUT (10 s):
//! lapin queued the request behind its connection task's stop and never ran
//! nor refused it. About one round in twenty (below) hit it.

use std::time::{Duration, Instant};

use hourglass::broker::rabbitmq::RabbitMqExecutor;
use hourglass::command::{AmqpCommand, Command, FieldTable};
use hourglass::executor::{Envelope, Executor, ExecutorError};
use hourglass_e2e::blackhole::Blackhole;
use hourglass_e2e::*;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable as AmqpTable;

/// How soon a declare or publish must end after its connection drops. Failing
/// takes a few milliseconds once lapin reads the end of the connection, and
/// reconnecting through the proxy about a tenth of a second at most here;
/// two seconds leaves room for a loaded machine and is still well under the
/// 10 s channel timeout the race waited out (and the 30 s DECLARE_TIMEOUT).
const ENDS_WITHIN: Duration = Duration::from_secs(2);
/// Rounds of the race: it hit about one in twenty on the old code.
const ROUNDS: u64 = 150;

fn declare(queue: &str) -> Command {
    Command::Amqp(AmqpCommand::DeclareQueue { name: queue.to_string(), durable: false, arguments: Default::default() })
}

fn envelope(id: &str) -> Envelope {
    Envelope { id: id.into(), body: id.as_bytes().to_vec(), headers: FieldTable::new(), properties: Default::default(), stamp_message_id: true }
}

/// A declare sent on the control connection and left unanswered (the proxy
/// swallows it) fails as soon as the proxy drops the connection, and the next
/// declare succeeds on a fresh one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declare_left_unanswered_fails_as_soon_as_its_connection_drops() {
    let (first, second) = (unique("unanswered-a"), unique("unanswered-b"));
    // Deletes both queues, also when the test fails.
    let _cleanup = Cleanup::declared(&[declare(&first), declare(&second)]);
    let blackhole = Blackhole::start(&amqp_url()).await;
    let executor = std::sync::Arc::new(RabbitMqExecutor::connect(&blackhole.url).await.expect("connect through the blackhole"));
    executor.apply(&[declare(&first)]).await.expect("a declare through the proxy");

    blackhole.stall();
    // Both executor connections (publishing and control) go silent before the declare is sent.
    until("the proxy stalling both connections", Duration::from_secs(5), async || blackhole.stalled() == 2).await;
    let declaring = tokio::spawn({
        let (executor, second) = (executor.clone(), second.clone());
        async move { executor.apply(&[declare(&second)]).await }
    });
    until("the declare reaching the stalled proxy", Duration::from_secs(5), async || blackhole.swallowed() > 0).await;
    assert!(!declaring.is_finished(), "the declare was answered through a stalled proxy");

    let dropped = Instant::now();
    blackhole.reset();
    let result = tokio::time::timeout(ENDS_WITHIN, declaring)
        .await
        .unwrap_or_else(|_| panic!("the declare still waited {ENDS_WITHIN:?} after its connection dropped"))
        .unwrap();
    eprintln!("ended {:?} after the drop: {result:?}", dropped.elapsed());
    assert!(matches!(result, Err(ExecutorError::Unavailable(_))), "{result:?}");

    let again = Instant::now();
    tokio::time::timeout(ENDS_WITHIN, executor.apply(&[declare(&second)]))
        .await
        .unwrap_or_else(|_| panic!("the next declare took longer than {ENDS_WITHIN:?}"))
        .expect("the next declare, on a fresh connection");
    eprintln!("declared again in {:?}", again.elapsed());
    assert!(executor.reconnects() >= 1, "the control connection was opened again");
}

/// A fresh executor's first declare (which opens the control channel) or
/// first publish (which opens a publish channel), asked for a moment after the
/// proxy dropped its connections, at offsets swept from 0 to 1.5 ms: a moment
/// lapin may not have noticed yet. Each ends within [`ENDS_WITHIN`], failing
/// as unavailable or succeeding on a fresh connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declares_and_publishes_racing_a_dropped_connection_end_at_once() {
    let destination = unique("race-destination");
    // Deletes the destination and every queue a round declares, also when the test fails.
    let cleanup = Cleanup::default();
    cleanup.queue(&destination);
    let connection = connect().await;
    let channel = connection.create_channel().await.unwrap();
    channel.queue_declare(destination.as_str().into(), QueueDeclareOptions::default(), AmqpTable::default()).await.unwrap();
    let (mut succeeded, mut failed, mut slowest) = (0, 0, Duration::ZERO);
    for round in 0..ROUNDS {
        let blackhole = Blackhole::start(&amqp_url()).await;
        let executor = RabbitMqExecutor::connect(&blackhole.url).await.expect("connect through the blackhole");
        let queue = unique("race");
        blackhole.reset();
        // Not a wait for anything: the offset at which the request meets the dropped connection.
        let offset = Duration::from_micros(round * 37 % 1_500);
        let spun = Instant::now();
        while spun.elapsed() < offset {
            std::hint::spin_loop();
        }
        let (what, asked) = (if round % 2 == 0 { "declare" } else { "publish" }, Instant::now());
        let request = async {
            if round % 2 == 0 {
                cleanup.queue(&queue);
                executor.apply(&[declare(&queue)]).await
            } else {
                executor.send(&[Command::forward("", &destination)], &envelope(&queue)).await
            }
        };
        let result = tokio::time::timeout(ENDS_WITHIN, request)
            .await
            .unwrap_or_else(|_| panic!("round {round}: a {what} {offset:?} after the drop still waited after {ENDS_WITHIN:?}"));
        slowest = slowest.max(asked.elapsed());
        match result {
            Ok(()) => succeeded += 1,
            Err(ExecutorError::Unavailable(_)) => failed += 1,
            Err(other) => panic!("round {round}: a {what} on a dropped connection is not unavailable: {other}"),
        }
    }
    eprintln!("{ROUNDS} rounds: {succeeded} succeeded on a fresh connection, {failed} failed as unavailable; slowest {slowest:?}");
}
