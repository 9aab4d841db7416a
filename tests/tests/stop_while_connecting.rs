//! A stop that comes while a background task is still connecting, to a
//! broker behind a network that swallows packets (tests/src/blackhole.rs),
//! ends the task at once. Before, the stop was first looked at once the task
//! was attached: a consumer caught mid-connect waited out the connect timeout
//! (10 s per node; with 3 nodes longer than `shutdown_timeout`, after which
//! the service abandons everyone's work in flight).
//!
//! A stop (or a close) that meets the end of its connection, dropped or
//! stalled by the proxy, ends too. Before, the close a consumer, a stream
//! reader or a taker ends with could wait for ever: sent as the connection
//! dropped, lapin could lose it (queued behind its connection task's stop, or
//! left "closing" for good), never running nor refusing it; sent into a
//! stalled connection, it waited for a close-ok that never came (lapin stops
//! its heartbeat check once closing). A consumer's cancel waited on a stalled
//! connection until lapin's missed-heartbeat check (two minutes at
//! RabbitMQ's default 60 s heartbeat).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hourglass::broker::rabbitmq::RabbitMqExecutor;
use hourglass::broker::rabbitmq::consume::{Consumer, Handler};
use hourglass::broker::rabbitmq::link::PARTING_TIMEOUT;
use hourglass::broker::rabbitmq::stream::{self, declare_stream};
use hourglass::broker::rabbitmq::take::Taker;
use hourglass::command::{AmqpCommand, Command};
use hourglass::config::Config;
use hourglass::message::{Delivery, Outcome, Settled};
use hourglass::service::Service;
use hourglass_e2e::blackhole::Blackhole;
use hourglass_e2e::serve::Served;
use hourglass_e2e::*;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable as AmqpTable;
use tokio::sync::{mpsc, watch};

/// How soon a consumer stopped mid-connect must return (the connect timeout is 10 s).
const CONSUMER_STOPS_WITHIN: Duration = Duration::from_secs(1);
/// How soon a service stopped mid-connect must be down (`shutdown_timeout` is 20 s).
const SERVICE_STOPS_WITHIN: Duration = Duration::from_secs(2);
/// How soon a stop or close must end on a connection that dropped or
/// stalled. Each step a consumer stops with (cancel, then close) is given up
/// after [`PARTING_TIMEOUT`] (1 s) if the broker does not answer and the
/// connection has not ended: two such steps, plus a second for a loaded
/// machine. A dropped connection mostly ends them in milliseconds; before, a
/// close never ended and a stalled cancel waited two minutes.
const ENDS_WITHIN_ON_A_DEAD_CONNECTION: Duration = PARTING_TIMEOUT.saturating_mul(2).saturating_add(Duration::from_secs(1));
/// How soon a service stopped on a stalled broker must be down: its consumers
/// stop side by side, each within two [`PARTING_TIMEOUT`]s; a second more for
/// the rest of the shutdown and another for a loaded machine. Its
/// `shutdown_timeout` is 20 s.
const SERVICE_STOPS_WITHIN_ON_A_STALLED_BROKER: Duration = PARTING_TIMEOUT.saturating_mul(2).saturating_add(Duration::from_secs(2));
/// Rounds of the stop racing a dropped connection: on the old code a close
/// hung within the first 60 in each of 14 runs.
const RACE_ROUNDS: u64 = 240;

/// Acks whatever comes; nothing is expected to.
struct Acking {
    queue: String,
}

impl Handler for Acking {
    type Note = ();

    fn queue(&self) -> &str {
        &self.queue
    }

    fn prefetch(&self) -> u16 {
        8
    }

    fn declarations(&self) -> Vec<Command> {
        vec![Command::Amqp(AmqpCommand::DeclareQueue { name: self.queue.clone(), durable: true, arguments: Default::default() })]
    }

    async fn handle(&self, _delivery: &Delivery) -> (Outcome, ()) {
        (Outcome::Ack, ())
    }

    fn poisoned(&self, _delivery: &Delivery, _reason: &str) -> Outcome {
        Outcome::Ack
    }

    fn settled(&self, _note: Option<()>, _outcome: &Outcome, _settled: &Settled) {}
}

/// Runs `consumer` until the blackhole holds one of its connects, then stops
/// it and asserts it returned within [`CONSUMER_STOPS_WITHIN`].
async fn stop_while_held(consumer: Arc<Consumer<Acking>>, blackhole: &Blackhole, held: usize) {
    let (stop, stopped) = watch::channel(false);
    let running = tokio::spawn(consumer.clone().run(stopped));
    until("the consumer connecting into the blackhole", Duration::from_secs(10), async || blackhole.held() >= held).await;
    assert!(!consumer.is_consuming());
    let asked = Instant::now();
    stop.send(true).unwrap();
    tokio::time::timeout(CONSUMER_STOPS_WITHIN, running)
        .await
        .unwrap_or_else(|_| panic!("the consumer still ran {CONSUMER_STOPS_WITHIN:?} after the stop (mid-connect)"))
        .expect("the consumer ends cleanly");
    eprintln!("stopped {:?} after the stop", asked.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_stopped_while_its_connection_opens_returns_at_once() {
    let handler = Arc::new(Acking { queue: unique("connecting-in") });
    // Deletes the handler's queue, also when the test fails.
    let _cleanup = Cleanup::declared(&handler.declarations());
    let blackhole = Blackhole::start(&amqp_url()).await;
    blackhole.cut();
    // Declares go straight to the broker: only the consumer's own connection meets the blackhole.
    let publisher = Arc::new(RabbitMqExecutor::connect(&amqp_url()).await.expect("RabbitMQ"));
    let consumer = Consumer::new(&blackhole.url, publisher, handler.clone());
    stop_while_held(consumer, &blackhole, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_stopped_while_its_declares_reconnect_returns_at_once() {
    let handler = Arc::new(Acking { queue: unique("declaring-in") });
    let _cleanup = Cleanup::declared(&handler.declarations());
    let blackhole = Blackhole::start(&amqp_url()).await;
    // Its declares go through the executor's control connection, lost in the cut: declaring reconnects it.
    let publisher = Arc::new(RabbitMqExecutor::connect(&blackhole.url).await.expect("connect through the blackhole"));
    blackhole.cut();
    // Once the executor has seen its connections end, a declare reconnects (and meets the
    // blackhole) rather than going out on a connection in the middle of dying.
    until("the executor sees the cut", Duration::from_secs(5), async || !publisher.is_ready().await).await;
    let consumer = Consumer::new(&amqp_url(), publisher, handler.clone());
    stop_while_held(consumer, &blackhole, 1).await;
}

/// A service that reaches its broker through `blackhole`: a cancellable
/// strategy (so a release consumer and the cancel-log reader), the ingress
/// and the canary, every name beginning with `stem`, each named to `cleanup`
/// before the service starts. Ready when returned.
async fn service_through(blackhole: &Blackhole, stem: &str, cleanup: &Cleanup) -> Served {
    let (levels, log, release) = (unique(&format!("{stem}-levels")), unique(&format!("{stem}-log")), unique(&format!("{stem}-release")));
    let (ingress, canary) = (unique(&format!("{stem}-in")), unique(&format!("{stem}-canary")));
    let text = config_text_on(
        &blackhole.url,
        &format!("planner = \"binary-levels\"\nprefix = \"{levels}\"\ncancellable = true"),
        &format!(
            "[service.cancel]\nlog = \"{log}\"\nrelease_prefix = \"{release}\"\n\n\
             [service.ingress]\nqueue = \"{ingress}\"\ninvalid_queue = \"{ingress}.invalid\"\n\n\
             [service.canary]\nqueue = \"{canary}\"\nevery = \"300ms\"\ndelay = \"1s\"\n"
        ),
    );
    let config = Config::parse(Path::new(&format!("{stem}.toml")), format!("default_strategy = \"main\"\n{text}")).expect("test config");
    cleanup.also_declared(&topology_of(&config));
    let release_queue = config.service.cancel.release_queue("main");
    cleanup.ingress(&config);
    for queue in [&canary, &release_queue, &format!("{release_queue}.parked"), &log] {
        cleanup.queue(queue);
    }
    let served = Served::start(Service::start(config).await.expect("service starts")).await;
    // Ready means every consumer and the reader attached, too.
    until("ready", Duration::from_secs(15), async || served.service.is_ready().await).await;
    served
}

/// A whole service cut off from its broker: the executor's keeper reconnects
/// its two connections (it always stopped at once), while the consumers
/// (the first of them reconnecting the connection they share, the others
/// waiting on it) and the cancel-log reader connect on their own. Stopped
/// then, it is down long before `shutdown_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_cut_off_from_its_broker_stops_long_before_its_shutdown_timeout() {
    // Deletes what the service declares, also when the test fails.
    let cleanup = Cleanup::default();
    let blackhole = Blackhole::start(&amqp_url()).await;
    let served = service_through(&blackhole, "cut", &cleanup).await;

    blackhole.cut();
    // The keeper holds at most two (one per executor connection): a third is a task's own connect.
    until("a task connecting on its own into the blackhole", Duration::from_secs(5), async || blackhole.held() >= 3).await;
    let asked = Instant::now();
    tokio::time::timeout(SERVICE_STOPS_WITHIN, served.stop())
        .await
        .unwrap_or_else(|_| panic!("the service still ran {SERVICE_STOPS_WITHIN:?} after the stop (tasks mid-connect)"));
    eprintln!("stopped {:?} after the stop", asked.elapsed());
}

/// A whole service whose broker went silent with every connection open (the
/// executor's two, the one its consumers share — the ingress, the canary,
/// the release consumer and the parking queue's consumer, a channel each —
/// and the cancel-log reader's): no cancel nor close is answered. Stopped then, it is
/// down within [`SERVICE_STOPS_WITHIN_ON_A_STALLED_BROKER`]. Before, the
/// reader's close never ended and the stop waited out `shutdown_timeout`
/// (20 s), abandoning everyone's work in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_whose_broker_stalls_stops_long_before_its_shutdown_timeout() {
    let cleanup = Cleanup::default();
    let blackhole = Blackhole::start(&amqp_url()).await;
    let served = service_through(&blackhole, "stalled", &cleanup).await;

    blackhole.stall();
    until("the proxy stalling the service's four connections", Duration::from_secs(5), async || blackhole.stalled() == 4).await;
    let asked = Instant::now();
    tokio::time::timeout(SERVICE_STOPS_WITHIN_ON_A_STALLED_BROKER, served.stop())
        .await
        .unwrap_or_else(|_| panic!("the service still ran {SERVICE_STOPS_WITHIN_ON_A_STALLED_BROKER:?} after the stop (stalled broker)"));
    eprintln!("stopped {:?} after the stop", asked.elapsed());
    drop(blackhole);
}

/// What a round of [`stops_and_closes_racing_a_dropped_connection_end_at_once`] ends.
#[derive(Clone, Copy, Debug)]
enum Ending {
    /// A consumer's stop: cancel, finish what is in hand, close.
    Consumer,
    /// A stream reader's stop (the cancellation log's): close.
    Reader,
    /// `hourglass transfer`'s taker: close.
    Taker,
}

/// A consumer, a stream reader or a taker, attached through the proxy,
/// stopped (closed) a moment after the proxy dropped its connection, at
/// offsets swept from 0 to 3 ms: before lapin has noticed the drop, so the
/// close goes out on a connection it still calls connected. Every round ends
/// within [`ENDS_WITHIN_ON_A_DEAD_CONNECTION`]. Before, a reader's or a
/// taker's close that met the drop never returned, in about one round in
/// twenty (a consumer's cancel goes first and fails with the connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stops_and_closes_racing_a_dropped_connection_end_at_once() {
    let (queue, log) = (unique("stop-race"), unique("stop-race-log"));
    let handler = Arc::new(Acking { queue: queue.clone() });
    // Deletes the handler's queue and the stream, also when the test fails.
    let cleanup = Cleanup::declared(&handler.declarations());
    cleanup.queue(&log);
    // Declares go straight to the broker: only the connections that end meet the proxy.
    let publisher = Arc::new(RabbitMqExecutor::connect(&amqp_url()).await.expect("RabbitMQ"));
    hourglass::executor::Executor::apply(publisher.as_ref(), &[declare_stream(&log, "1h")]).await.expect("declare the stream");
    let mut slowest = Duration::ZERO;
    for round in 0..RACE_ROUNDS {
        let ending = [Ending::Consumer, Ending::Reader, Ending::Taker][round as usize % 3];
        let blackhole = Blackhole::start(&amqp_url()).await;
        let (stop, stopped) = watch::channel(false);
        let ended: tokio::task::JoinHandle<()> = match ending {
            Ending::Consumer => {
                let consumer = Consumer::new(&blackhole.url, publisher.clone(), handler.clone());
                let running = tokio::spawn(consumer.clone().run(stopped));
                until("the consumer attached through the proxy", Duration::from_secs(10), async || consumer.is_consuming()).await;
                running
            }
            Ending::Reader => {
                let attached = Arc::new(AtomicBool::new(false));
                let (entries, received) = mpsc::channel(16);
                let reading = tokio::spawn({
                    let (url, log, attached) = (blackhole.url.clone(), log.clone(), attached.clone());
                    // Ok, or unavailable when it saw the drop before the stop: either way it ends.
                    async move {
                        let _received = received;
                        stream::read(&url, &log, 0, entries, stopped, &attached).await.ok();
                    }
                });
                until("the reader attached through the proxy", Duration::from_secs(10), async || attached.load(Ordering::Relaxed)).await;
                reading
            }
            Ending::Taker => {
                let taker = Taker::open(&blackhole.url).await.expect("a taker through the proxy");
                let mut stopped = stopped;
                tokio::spawn(async move {
                    stopped.wait_for(|stopping| *stopping).await.ok();
                    taker.close().await;
                })
            }
        };
        blackhole.reset();
        // Not a wait for anything: the offset at which the stop meets the dropped connection.
        let offset = Duration::from_micros(round * 97 % 3_000);
        let spun = Instant::now();
        while spun.elapsed() < offset {
            std::hint::spin_loop();
        }
        let asked = Instant::now();
        // A reader that saw the drop first has ended already (unavailable), and with it its receiver.
        stop.send_replace(true);
        tokio::time::timeout(ENDS_WITHIN_ON_A_DEAD_CONNECTION, ended)
            .await
            .unwrap_or_else(|_| {
                panic!("round {round}: {ending:?} stopped {offset:?} after its connection dropped still ran after {ENDS_WITHIN_ON_A_DEAD_CONNECTION:?}")
            })
            .expect("it ends cleanly");
        let took = asked.elapsed();
        slowest = slowest.max(took);
        if took >= PARTING_TIMEOUT {
            eprintln!("round {round}: {ending:?} stopped {offset:?} after the drop ended at the parting timeout, {took:?}");
        }
    }
    eprintln!("{RACE_ROUNDS} rounds; slowest stop {slowest:?}");
}

/// A consumer stopped while the proxy swallows everything on its connection:
/// neither the cancel nor the close is ever answered, and it still returns
/// within [`ENDS_WITHIN_ON_A_DEAD_CONNECTION`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_stopped_on_a_stalled_connection_returns_within_the_bound() {
    let handler = Arc::new(Acking { queue: unique("stop-stalled") });
    let _cleanup = Cleanup::declared(&handler.declarations());
    let publisher = Arc::new(RabbitMqExecutor::connect(&amqp_url()).await.expect("RabbitMQ"));
    let blackhole = Blackhole::start(&amqp_url()).await;
    let consumer = Consumer::new(&blackhole.url, publisher, handler.clone());
    let (stop, stopped) = watch::channel(false);
    let running = tokio::spawn(consumer.clone().run(stopped));
    until("the consumer attached through the proxy", Duration::from_secs(10), async || consumer.is_consuming()).await;
    blackhole.stall();
    until("the proxy stalling the consumer's connection", Duration::from_secs(5), async || blackhole.stalled() == 1).await;
    let asked = Instant::now();
    stop.send(true).unwrap();
    tokio::time::timeout(ENDS_WITHIN_ON_A_DEAD_CONNECTION, running)
        .await
        .unwrap_or_else(|_| panic!("the consumer still ran {ENDS_WITHIN_ON_A_DEAD_CONNECTION:?} after the stop (stalled connection)"))
        .expect("the consumer ends cleanly");
    eprintln!("stopped {:?} after the stop; {} bytes swallowed", asked.elapsed(), blackhole.swallowed());
    assert!(blackhole.swallowed() > 0, "the stop sent nothing into the stalled connection");
}

/// A stream reader (the cancellation log's) stopped while its connection is
/// stalled: the close it ends with is never answered, and it still returns
/// within [`ENDS_WITHIN_ON_A_DEAD_CONNECTION`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_reader_stopped_on_a_stalled_connection_returns_within_the_bound() {
    let log = unique("stop-stalled-log");
    let declare = declare_stream(&log, "1h");
    // Deletes the stream, also when the test fails.
    let _cleanup = Cleanup::declared(std::slice::from_ref(&declare));
    let publisher = RabbitMqExecutor::connect(&amqp_url()).await.expect("RabbitMQ");
    hourglass::executor::Executor::apply(&publisher, &[declare]).await.expect("declare the stream");
    let blackhole = Blackhole::start(&amqp_url()).await;
    let (entries, _received) = mpsc::channel(16);
    let (stop, stopped) = watch::channel(false);
    let attached = Arc::new(AtomicBool::new(false));
    let reading = tokio::spawn({
        let (url, log, attached) = (blackhole.url.clone(), log.clone(), attached.clone());
        async move { stream::read(&url, &log, 0, entries, stopped, &attached).await }
    });
    until("the reader attached through the proxy", Duration::from_secs(10), async || attached.load(Ordering::Relaxed)).await;
    blackhole.stall();
    until("the proxy stalling the reader's connection", Duration::from_secs(5), async || blackhole.stalled() == 1).await;
    let asked = Instant::now();
    stop.send(true).unwrap();
    let result = tokio::time::timeout(ENDS_WITHIN_ON_A_DEAD_CONNECTION, reading)
        .await
        .unwrap_or_else(|_| panic!("the reader still ran {ENDS_WITHIN_ON_A_DEAD_CONNECTION:?} after the stop (stalled connection)"))
        .unwrap();
    eprintln!("stopped {:?} after the stop: {result:?}", asked.elapsed());
    assert!(result.is_ok(), "a stopped reader ends Ok: {result:?}");
}

/// `hourglass transfer`'s taker closed while its connection is stalled: the
/// close is never answered, and it still returns within [`ENDS_WITHIN_ON_A_DEAD_CONNECTION`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taker_closed_on_a_stalled_connection_returns_within_the_bound() {
    let queue = unique("close-stalled-take");
    let cleanup = Cleanup::default();
    cleanup.queue(&queue);
    let channel = connect().await.create_channel().await.unwrap();
    channel.queue_declare(queue.as_str().into(), QueueDeclareOptions::default(), AmqpTable::default()).await.unwrap();
    let blackhole = Blackhole::start(&amqp_url()).await;
    let taker = Taker::open(&blackhole.url).await.expect("a taker through the proxy");
    assert_eq!(taker.depth(&queue).await.expect("the depth through the proxy"), Some(0));
    blackhole.stall();
    until("the proxy stalling the taker's connection", Duration::from_secs(5), async || blackhole.stalled() == 1).await;
    let asked = Instant::now();
    tokio::time::timeout(ENDS_WITHIN_ON_A_DEAD_CONNECTION, taker.close())
        .await
        .unwrap_or_else(|_| panic!("the taker's close still waited {ENDS_WITHIN_ON_A_DEAD_CONNECTION:?} (stalled connection)"));
    eprintln!("closed {:?} after asking", asked.elapsed());
}
