//! A stop that comes while a background task is still connecting, to a
//! broker behind a network that swallows packets (tests/src/blackhole.rs),
//! ends the task at once. Before, the stop was first looked at once the task
//! was attached: a consumer caught mid-connect waited out the connect timeout
//! (10 s per node; with 3 nodes longer than `shutdown_timeout`, after which
//! the service abandons everyone's work in flight).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hourglass::broker::rabbitmq::RabbitMqExecutor;
use hourglass::broker::rabbitmq::consume::{Consumer, Handler};
use hourglass::command::Command;
use hourglass::config::Config;
use hourglass::message::{Delivery, Outcome, Settled};
use hourglass::service::Service;
use hourglass_e2e::blackhole::Blackhole;
use hourglass_e2e::serve::Served;
use hourglass_e2e::*;
use lapin::options::QueueDeleteOptions;
use tokio::sync::watch;

/// How soon a consumer stopped mid-connect must return (the connect timeout is 10 s).
const CONSUMER_STOPS_WITHIN: Duration = Duration::from_secs(1);
/// How soon a service stopped mid-connect must be down (`shutdown_timeout` is 20 s).
const SERVICE_STOPS_WITHIN: Duration = Duration::from_secs(2);

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
        vec![Command::DeclareQueue { name: self.queue.clone(), durable: true, arguments: Default::default() }]
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

async fn delete_queue(queue: &str) {
    let channel = connect().await.create_channel().await.unwrap();
    channel.queue_delete(queue.into(), QueueDeleteOptions::default()).await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_stopped_while_its_connection_opens_returns_at_once() {
    let blackhole = Blackhole::start(&amqp_url()).await;
    blackhole.cut();
    let handler = Arc::new(Acking { queue: unique("connecting-in") });
    // Declares go straight to the broker: only the consumer's own connection meets the blackhole.
    let publisher = Arc::new(RabbitMqExecutor::connect(&amqp_url()).await.expect("RabbitMQ"));
    let consumer = Consumer::new(&blackhole.url, publisher, handler.clone());
    stop_while_held(consumer, &blackhole, 1).await;
    delete_queue(&handler.queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_stopped_while_its_declares_reconnect_returns_at_once() {
    let blackhole = Blackhole::start(&amqp_url()).await;
    let handler = Arc::new(Acking { queue: unique("declaring-in") });
    // Its declares go through the executor's control connection, lost in the cut: declaring reconnects it.
    let publisher = Arc::new(RabbitMqExecutor::connect(&blackhole.url).await.expect("connect through the blackhole"));
    blackhole.cut();
    // Once the executor has seen its connections end, a declare reconnects (and meets the
    // blackhole) rather than going out on a connection in the middle of dying.
    until("the executor sees the cut", Duration::from_secs(5), async || !publisher.is_ready().await).await;
    let consumer = Consumer::new(&amqp_url(), publisher, handler.clone());
    stop_while_held(consumer, &blackhole, 1).await;
    delete_queue(&handler.queue).await;
}

/// A whole service cut off from its broker: the executor's keeper reconnects
/// its two connections (it always stopped at once), while the ingress, the
/// canary, the release consumer and the cancel-log reader connect on their
/// own. Stopped then, it is down long before `shutdown_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_cut_off_from_its_broker_stops_long_before_its_shutdown_timeout() {
    let blackhole = Blackhole::start(&amqp_url()).await;
    let (levels, log, release) = (unique("cut-levels"), unique("cut-log"), unique("cut-release"));
    let (ingress, canary) = (unique("cut-in"), unique("cut-canary"));
    let text = config_text_on(
        &blackhole.url,
        &format!("planner = \"binary-levels\"\nprefix = \"{levels}\"\ncancellable = true"),
        &format!(
            "[service.cancel]\nlog = \"{log}\"\nrelease_prefix = \"{release}\"\n\n\
             [service.ingress]\nqueue = \"{ingress}\"\ninvalid_queue = \"{ingress}.invalid\"\n\n\
             [service.canary]\nqueue = \"{canary}\"\nevery = \"300ms\"\ndelay = \"1s\"\n"
        ),
    );
    let config = Config::parse(Path::new("cut.toml"), format!("default_strategy = \"main\"\n{text}")).expect("test config");
    let served = Served::start(Service::start(config.clone()).await.expect("service starts")).await;
    until("ready", Duration::from_secs(15), async || served.service.is_ready().await).await;

    blackhole.cut();
    // The keeper holds at most two (one per executor connection): a third is a task's own connect.
    until("a task connecting on its own into the blackhole", Duration::from_secs(5), async || blackhole.held() >= 3).await;
    let asked = Instant::now();
    tokio::time::timeout(SERVICE_STOPS_WITHIN, served.stop())
        .await
        .unwrap_or_else(|_| panic!("the service still ran {SERVICE_STOPS_WITHIN:?} after the stop (tasks mid-connect)"));
    eprintln!("stopped {:?} after the stop", asked.elapsed());

    let connection = connect().await;
    delete_declared(&connection, &topology_of(&config)).await;
    let channel = connection.create_channel().await.unwrap();
    let release_queue = config.service.cancel.release_queue("main");
    for queue in [ingress.clone(), format!("{ingress}.invalid"), canary, release_queue.clone(), format!("{release_queue}.parked"), log] {
        channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await.ok();
    }
}
