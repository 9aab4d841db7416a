//! Supervision on a real RabbitMQ: when the ingress consumer loses its
//! connection and cannot get it back, `/readyz` answers 503 naming "ingress";
//! once it can, the consumer is back, `/readyz` is 200, and a message published
//! to the ingress afterwards is delivered. The consumers share one connection:
//! one whose queue is deleted under it comes back without disturbing the
//! others, that connection closed by the broker comes back once for all of
//! them, and a consumer the broker refuses at every attach does not use up
//! its channel numbers. Runs in a private vhost, so revoking the test user's permissions
//! (or deleting queues) there touches nobody else.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use hourglass::broker::rabbitmq::RabbitMqExecutor;
use hourglass::broker::rabbitmq::consume::{Consumer, Handler, long_string};
use hourglass::broker::rabbitmq::link::Slot;
use hourglass::broker::rabbitmq::manage::encode;
use hourglass::command::{AmqpCommand, Command};
use hourglass::config::Config;
use hourglass::headers::{DESTINATION_HEADER, REQUESTED_DELAY_HEADER};
use hourglass::message::{Outcome, Settled};
use hourglass::service::Service;
use hourglass_e2e::serve::Served;
use hourglass_e2e::vhost::PrivateVhost;
use hourglass_e2e::*;
use lapin::BasicProperties;
use lapin::options::{BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{FieldTable, ShortString};
use serde_json::{Value, json};

fn user() -> String {
    amqp_url().split("://").nth(1).and_then(|rest| rest.split(':').next()).unwrap_or("guest").to_string()
}

/// The name of the connection consuming `queue` in `vhost`, if any.
fn consumer_connection(vhost: &str, queue: &str) -> Option<String> {
    consumer_channel(vhost, queue).map(|(connection, _)| connection)
}

async fn readyz(served: &Served) -> (u16, Value) {
    let (status, body) = served.http.call("GET", "/readyz", None, None).await;
    (status, serde_json::from_str(&body).unwrap_or(Value::String(body)))
}

fn names_task(readiness: &Value, task: &str) -> bool {
    readiness["down"].as_array().is_some_and(|down| down.iter().any(|d| d["task"] == task))
}

/// Publishes `body` to the ingress `queue`, due to `destination` after `delay`, and waits for the confirm.
async fn publish_to_ingress(connection: &lapin::Connection, queue: &str, destination: &str, delay: &str, body: &[u8]) {
    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    let mut headers = FieldTable::default();
    headers.insert(ShortString::from(DESTINATION_HEADER), long_string(destination));
    headers.insert(ShortString::from(REQUESTED_DELAY_HEADER), long_string(delay));
    let properties = BasicProperties::default().with_headers(headers);
    channel.basic_publish("".into(), queue.into(), BasicPublishOptions::default(), body, properties).await.unwrap().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_names_a_lost_ingress_until_it_is_back_and_ingress_then_forwards() {
    let vhost = PrivateVhost::create("supervision");
    let connection = connect_to(&vhost.url).await;
    let ingress_queue = unique("supervised-in");
    let text = config_text_on(
        &vhost.url,
        &format!("planner = \"binary-levels\"\nprefix = \"{}\"", unique("sup")),
        &format!("[service.ingress]\nqueue = \"{ingress_queue}\"\ninvalid_queue = \"{ingress_queue}.invalid\""),
    );
    let config = Config::parse(std::path::Path::new("e2e.toml"), text).unwrap();
    let mut destination = Destination::declare(&connection, "supervised-dest").await;
    let served = Served::start(Service::start(config).await.expect("service starts")).await;
    until("ready", Duration::from_secs(10), async || readyz(&served).await.0 == 200).await;

    // Take the consumer's connection away, and keep it from coming back.
    // The management API lists consumers with a delay of its own.
    until("the management API listing the ingress consumer", Duration::from_secs(20), async || consumer_connection(&vhost.name, &ingress_queue).is_some())
        .await;
    let consumer = consumer_connection(&vhost.name, &ingress_queue).unwrap();
    let permissions = format!("/api/permissions/{}/{}", encode(&vhost.name), encode(&user()));
    management("DELETE", &permissions, None);
    management("DELETE", &format!("/api/connections/{}", encode(&consumer)), None);
    until("readyz 503 naming the ingress", Duration::from_secs(10), async || {
        let (status, body) = readyz(&served).await;
        status == 503 && names_task(&body, "ingress")
    })
    .await;
    // It stays down, named, while it cannot come back: never a 200 meanwhile.
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(1) {
        let (status, body) = readyz(&served).await;
        assert!(status == 503 && names_task(&body, "ingress"), "{status} {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    management("PUT", &permissions, Some(json!({ "configure": ".*", "write": ".*", "read": ".*" })));
    until("ready again", Duration::from_secs(20), async || readyz(&served).await.0 == 200).await;
    until("a new connection consuming", Duration::from_secs(20), async || consumer_connection(&vhost.name, &ingress_queue).is_some_and(|c| c != consumer))
        .await;

    publish_to_ingress(&connect_to(&vhost.url).await, &ingress_queue, &destination.name, "500ms", b"after").await;
    let received = destination.receive(1, Duration::from_secs(10)).await;
    assert_eq!(received[0].delivery.data, b"after");
    served.stop().await;
}

/// The consumer listed on `queue` in `vhost`: its connection's and its channel's names.
fn consumer_channel(vhost: &str, queue: &str) -> Option<(String, String)> {
    let consumers = management("GET", &format!("/api/consumers/{}", encode(vhost)), None);
    consumers.as_array()?.iter().find(|c| c["queue"]["name"] == queue).and_then(|c| {
        let details = &c["channel_details"];
        Some((details["connection_name"].as_str()?.to_string(), details["name"].as_str()?.to_string()))
    })
}

/// The names of the channels open on `connection`.
fn channel_names(connection: &str) -> std::collections::HashSet<String> {
    let channels = management("GET", &format!("/api/connections/{}/channels", encode(connection)), None);
    channels.as_array().map(|all| all.iter().filter_map(|c| c["name"].as_str().map(String::from)).collect()).unwrap_or_default()
}

/// A service in a private vhost with an ingress and one `binary-levels`
/// strategy: three consumers (the ingress, the strategy's release queue and
/// its parking queue), started and ready.
struct ConsumingService {
    vhost: PrivateVhost,
    /// The test's own connection to the vhost.
    connection: lapin::Connection,
    ingress_queue: String,
    parked: String,
    /// The consumed queues: the ingress, the release queue, the parking queue.
    queues: [String; 3],
    destination: Destination,
    served: Served,
}

impl ConsumingService {
    async fn start(stem: &str) -> ConsumingService {
        let vhost = PrivateVhost::create(&format!("{stem}-consume"));
        let connection = connect_to(&vhost.url).await;
        let ingress_queue = unique(&format!("{stem}-in"));
        let prefix = unique(stem);
        let text = config_text_on(
            &vhost.url,
            &format!("planner = \"binary-levels\"\nprefix = \"{prefix}\""),
            &format!("[service.ingress]\nqueue = \"{ingress_queue}\"\ninvalid_queue = \"{ingress_queue}.invalid\""),
        );
        let config = Config::parse(std::path::Path::new("e2e.toml"), text).unwrap();
        let release = config.service.cancel.release_queue("main");
        let parked = format!("{prefix}.parked");
        let destination = Destination::declare(&connection, &format!("{stem}-dest")).await;
        let served = Served::start(Service::start(config).await.expect("service starts")).await;
        until("ready", Duration::from_secs(10), async || readyz(&served).await.0 == 200).await;
        let queues = [ingress_queue.clone(), release, parked.clone()];
        ConsumingService { vhost, connection, ingress_queue, parked, queues, destination, served }
    }
}

/// The service's consumers share one connection, a channel each. A queue
/// deleted under its consumer (the broker cancels that consumer alone) is
/// declared again and consumed on a new channel of the same connection (the
/// old one closed), and the ingress beside it keeps its channel and forwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_share_one_connection_and_one_losing_its_queue_leaves_the_others_be() {
    let ConsumingService { vhost, connection, ingress_queue, parked, queues, mut destination, served } = ConsumingService::start("shared").await;
    let queues = queues.each_ref().map(String::as_str);
    until("the management API listing the three consumers", Duration::from_secs(20), async || {
        queues.iter().all(|queue| consumer_channel(&vhost.name, queue).is_some())
    })
    .await;
    let listed: Vec<(String, String)> = queues.iter().map(|queue| consumer_channel(&vhost.name, queue).unwrap()).collect();
    assert!(listed.iter().all(|(connection, _)| *connection == listed[0].0), "one connection for every consumer: {listed:?}");
    assert_eq!(listed.iter().map(|(_, channel)| channel).collect::<std::collections::HashSet<_>>().len(), 3, "a channel each: {listed:?}");
    let (shared, ingress_channel) = listed[0].clone();

    until("the management API listing the three channels", Duration::from_secs(15), async || channel_names(&shared).len() == 3).await;
    let channels_before = channel_names(&shared);
    management("DELETE", &format!("/api/queues/{}/{}", encode(&vhost.name), encode(&parked)), None);
    // Listed again means declared again (by its consumer, attaching anew); a
    // queue created after the delete cannot count a stale consumer.
    until("the parking queue declared and consumed again", Duration::from_secs(20), async || {
        let queues = management("GET", &format!("/api/queues/{}", encode(&vhost.name)), None);
        queues.as_array().is_some_and(|queues| queues.iter().any(|q| q["name"] == parked.as_str() && q["consumers"] == 1))
    })
    .await;
    assert_eq!(consuming_connections(&vhost.name), std::slice::from_ref(&shared), "still one consuming connection, the same");
    assert_eq!(consumer_channel(&vhost.name, &ingress_queue), Some((shared.clone(), ingress_channel)), "the ingress kept its channel");
    // The channel the broker cancelled the consumer on is closed, not left
    // open beside the new one: three channels, the new one among them (so the
    // listing is not one from before it opened).
    until("three channels on the shared connection, one of them new", Duration::from_secs(15), async || {
        let now = channel_names(&shared);
        now.len() == 3 && now.difference(&channels_before).count() == 1
    })
    .await;

    publish_to_ingress(&connection, &ingress_queue, &destination.name, "200ms", b"beside").await;
    let received = destination.receive(1, Duration::from_secs(10)).await;
    assert_eq!(received[0].delivery.data, b"beside");
    assert_eq!(readyz(&served).await.0, 200);
    served.stop().await;
}

/// The names of the vhost's connections that the service's consumers share.
fn consuming_connections(vhost: &str) -> Vec<String> {
    let connections = management("GET", &format!("/api/vhosts/{}/connections", encode(vhost)), None);
    connections
        .as_array()
        .map(|all| {
            all.iter()
                .filter(|c| c["user_provided_name"].as_str().is_some_and(|name| name.starts_with("hourglass consume")))
                .filter_map(|c| c["name"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The broker closes the connection the consumers share: every consumer
/// (ingress, release queue, parking queue) comes back, all on one new
/// connection, and the ingress forwards again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_consuming_connection_closed_by_the_broker_comes_back_once_for_every_consumer() {
    let ConsumingService { vhost, connection, ingress_queue, queues, mut destination, served, .. } = ConsumingService::start("lost").await;
    let queues = queues.each_ref().map(String::as_str);
    let on_one = |vhost: &str| {
        let listed: Option<Vec<(String, String)>> = queues.iter().map(|queue| consumer_channel(vhost, queue)).collect();
        listed.filter(|listed| listed.iter().all(|(connection, _)| *connection == listed[0].0)).map(|listed| listed[0].0.clone())
    };
    until("the three consumers listed on one connection", Duration::from_secs(20), async || on_one(&vhost.name).is_some()).await;
    let shared = on_one(&vhost.name).unwrap();
    assert_eq!(consuming_connections(&vhost.name), std::slice::from_ref(&shared));

    management("DELETE", &format!("/api/connections/{}", encode(&shared)), None);
    until("the three consumers back, on one new connection", Duration::from_secs(30), async || {
        on_one(&vhost.name).is_some_and(|connection| connection != shared)
    })
    .await;
    let again = on_one(&vhost.name).unwrap();
    until("that connection the only consuming one", Duration::from_secs(10), async || consuming_connections(&vhost.name) == [again.clone()]).await;

    publish_to_ingress(&connection, &ingress_queue, &destination.name, "200ms", b"after the loss").await;
    let received = destination.receive(1, Duration::from_secs(10)).await;
    assert_eq!(received[0].delivery.data, b"after the loss");
    until("ready again", Duration::from_secs(10), async || readyz(&served).await.0 == 200).await;
    served.stop().await;
}

/// A consumer that acks what it is given and counts its attaches (each one declares its queue first).
struct Counting {
    queue: String,
    attaches: std::sync::atomic::AtomicUsize,
    handled: tokio::sync::mpsc::UnboundedSender<Vec<u8>>,
}

impl Counting {
    fn new(stem: &str) -> (Arc<Counting>, tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>) {
        let (handled, received) = tokio::sync::mpsc::unbounded_channel();
        (Arc::new(Counting { queue: unique(stem), attaches: Default::default(), handled }), received)
    }

    fn attaches(&self) -> usize {
        self.attaches.load(Ordering::Relaxed)
    }
}

impl Handler for Counting {
    type Note = Vec<u8>;

    fn queue(&self) -> &str {
        &self.queue
    }

    fn prefetch(&self) -> u16 {
        4
    }

    fn declarations(&self) -> Vec<Command> {
        self.attaches.fetch_add(1, Ordering::Relaxed);
        vec![Command::Amqp(AmqpCommand::DeclareQueue { name: self.queue.clone(), durable: true, arguments: Default::default() })]
    }

    async fn handle(&self, delivery: &hourglass::message::Delivery) -> (Outcome, Vec<u8>) {
        (Outcome::Ack, delivery.body.clone())
    }

    fn poisoned(&self, _delivery: &hourglass::message::Delivery, _reason: &str) -> Outcome {
        Outcome::Requeue
    }

    fn settled(&self, note: Option<Vec<u8>>, _outcome: &Outcome, settled: &Settled) {
        if let (Some(body), Settled::Acked) = (note, settled) {
            let _ = self.handled.send(body);
        }
    }
}

/// RabbitMQ closes the channel of a `basic.consume` it refuses (here: the
/// queue is in exclusive use by another connection), and lapin never opens a
/// channel under that number again. A consumer refused at every attach must
/// not use up the numbers of the connection it shares: one joining later
/// still opens a channel (on it, or on its successor), and the one consuming
/// keeps going. The connection here allows four channels, so a few refusals
/// would use them all up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_refused_at_every_attach_does_not_wear_out_the_connection_it_shares() {
    const CHANNEL_MAX: usize = 4;
    let vhost = PrivateVhost::create("consume-wear");
    let connection = connect_to(&vhost.url).await;
    let publisher = Arc::new(RabbitMqExecutor::connect(&vhost.url).await.expect("RabbitMQ"));
    let shared = Arc::new(Slot::lazy(&format!("{}?channel_max={CHANNEL_MAX}", vhost.url), "hourglass consume wear".into()));
    let (refused, _) = Counting::new("refused");
    let (steady, mut handled) = Counting::new("steady");
    let refused_consumer = Consumer::sharing(shared.clone(), publisher.clone(), refused.clone());
    let steady_consumer = Consumer::sharing(shared.clone(), publisher.clone(), steady.clone());
    refused_consumer.declare().await.expect("declares its queue");
    let channel = connection.create_channel().await.unwrap();
    let exclusive = BasicConsumeOptions { exclusive: true, ..Default::default() };
    let _holding = channel.basic_consume(refused.queue.as_str().into(), "the-test-holds-it".into(), exclusive, FieldTable::default()).await.unwrap();

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let steady_running = tokio::spawn(steady_consumer.clone().run(stopped.clone()));
    let refused_running = tokio::spawn(refused_consumer.clone().run(stopped));
    until("the steady consumer consuming", Duration::from_secs(10), async || steady_consumer.is_consuming()).await;
    // Each refused attach costs a channel number: more than the connection has.
    until("the refused consumer trying more times than the connection has channels", Duration::from_secs(60), async || refused.attaches() > 2 * CHANNEL_MAX)
        .await;
    assert!(!refused_consumer.is_consuming(), "the test's exclusive consumer keeps it out");

    // A consumer joining now (a reload adding a strategy) needs a channel of its own.
    let (late, mut late_handled) = Counting::new("late");
    let late_consumer = Consumer::sharing(shared.clone(), publisher.clone(), late.clone());
    late_consumer.declare().await.expect("declares its queue");
    let late_running = tokio::spawn(late_consumer.clone().run(stop.subscribe()));
    until("the late consumer consuming", Duration::from_secs(20), async || late_consumer.is_consuming()).await;
    let publishing = connection.create_channel().await.unwrap();
    publishing.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    for queue in [&steady.queue, &late.queue] {
        publishing
            .basic_publish("".into(), queue.as_str().into(), BasicPublishOptions::default(), b"still here", BasicProperties::default())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    assert_eq!(receive_within(&mut handled, 1, Duration::from_secs(10), &steady.queue).await, [b"still here".to_vec()]);
    assert_eq!(receive_within(&mut late_handled, 1, Duration::from_secs(10), &late.queue).await, [b"still here".to_vec()]);
    // A replaced connection closes once no consumer holds it: the steady
    // consumer's, the late one's, and the current one are left at most.
    until("at most three consuming connections", Duration::from_secs(20), async || {
        let connections = management("GET", &format!("/api/vhosts/{}/connections", encode(&vhost.name)), None);
        connections.as_array().is_some_and(|all| all.iter().filter(|c| c["user_provided_name"] == "hourglass consume wear").count() <= 3)
    })
    .await;

    stop.send(true).unwrap();
    steady_running.await.unwrap();
    refused_running.await.unwrap();
    late_running.await.unwrap();
}
