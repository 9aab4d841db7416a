//! Canaries: valid messages from other clients, sent all through a case, and
//! the consumer that sees them arrive. Two HTTP clients, one ingress
//! publisher and one delayed-exchange publisher (`x-delay`, the
//! delayed-message plugin's way) send one message each every [`INTERVAL`],
//! with delays of 1, 2 or 3 s and the canary's id as the body; a consumer on the destination records
//! each arrival in the [`Ledger`]. Every client reconnects by itself, so a
//! broker or host that goes away and comes back is just a gap.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use hourglass::broker::rabbitmq::nodes;
use hourglass::clock::unix_now_ms;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Connection, ConnectionProperties, ExchangeKind};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::chaos::ledger::Ledger;

/// Deliveries the destination's consumer holds unacked at once.
const CONSUMER_PREFETCH: u16 = 256;
/// Time between two messages of one client.
pub const INTERVAL: Duration = Duration::from_millis(150);
const RETRY: Duration = Duration::from_millis(300);
/// The longest a step of opening a consumer (or acking) may take before the attempt starts over.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// How often an idle consumer checks that its connection is still there.
const WATCH_EVERY: Duration = Duration::from_secs(2);
/// How often [`Canaries::finish_with`] looks for canaries set aside while it waits.
pub const LOOK_EVERY: Duration = Duration::from_secs(2);

/// Where canaries go in, and where they come out.
#[derive(Clone)]
pub struct Route {
    /// The AMQP URL of the broker (vhost included) the destination and ingress queue live on.
    pub amqp_url: String,
    /// The service's HTTP base; swapped when the host is restarted.
    pub http: Option<Arc<Mutex<String>>>,
    /// The ingress queue, when ingress canaries run.
    pub ingress: Option<String>,
    /// A delayed exchange and its `deliver_to`, when delayed-exchange canaries run.
    pub delayed: Option<(String, String)>,
    pub destination: String,
}

pub struct Canaries {
    pub ledger: Arc<Ledger>,
    stop: Arc<AtomicBool>,
    senders: Vec<JoinHandle<()>>,
    consumers: Vec<JoinHandle<()>>,
    amqp_url: String,
    /// Each client's id prefix (`<tag>-h0-`, …), for [`Canaries::clients`].
    clients: Vec<String>,
}

/// A connection to the first node of `amqp_url` (one URL or a cluster's comma-separated list) that answers.
pub async fn connect(amqp_url: &str) -> anyhow::Result<Connection> {
    let (connection, _) = nodes::connect(amqp_url, ConnectionProperties::default(), Duration::from_secs(10)).await.map_err(anyhow::Error::msg)?;
    Ok(connection)
}

/// Declares the destination so the host finds it at start: a quorum queue,
/// so it outlives the loss of any one node of a cluster.
pub async fn declare_destination(amqp_url: &str, queue: &str) -> anyhow::Result<()> {
    let connection = connect(amqp_url).await?;
    let channel = connection.create_channel().await?;
    let durable = QueueDeclareOptions { durable: true, ..Default::default() };
    let mut arguments = FieldTable::default();
    arguments.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
    channel.queue_declare(queue.into(), durable, arguments).await?;
    connection.close(200, "done".into()).await.ok();
    Ok(())
}

/// How one HTTP client sends: the pause after each answer, and each message's delay.
#[derive(Clone, Copy)]
struct Pace {
    interval: Duration,
    delay_of: fn(u64) -> u64,
}

/// The canaries' pace: one message every [`INTERVAL`], 1–3 s delays.
const CANARY: Pace = Pace { interval: INTERVAL, delay_of };
/// A busy producer's: back to back, 3–6 s delays (spread by a step prime to 3,001).
const BUSY: Pace = Pace { interval: Duration::ZERO, delay_of: |n| 3_000 + (n * 379) % 3_001 };

/// Messages ready in `queue` (0 when there is no such queue).
pub async fn depth(amqp_url: &str, queue: &str) -> anyhow::Result<u32> {
    let connection = connect(amqp_url).await?;
    let channel = connection.create_channel().await?;
    let passive = QueueDeclareOptions { passive: true, ..Default::default() };
    let depth = channel.queue_declare(queue.into(), passive, FieldTable::default()).await.map(|q| q.message_count()).unwrap_or(0);
    connection.close(200, "done".into()).await.ok();
    Ok(depth)
}

impl Canaries {
    /// Starts the consumer and the senders; `tag` prefixes every id.
    pub fn start(tag: &str, route: Route) -> Canaries {
        Canaries::start_busy(tag, route, 0)
    }

    /// [`Canaries::start`] plus `busy` HTTP clients sending back to back with
    /// 3–6 s delays: enough messages fall due each millisecond that a fault
    /// of the broker meets some of them mid-way.
    pub fn start_busy(tag: &str, route: Route, busy: usize) -> Canaries {
        let ledger = Arc::new(Ledger::default());
        let stop = Arc::new(AtomicBool::new(false));
        let consumer = tokio::spawn(consume(route.amqp_url.clone(), route.destination.clone(), ledger.clone()));
        let (mut senders, mut names) = (Vec::new(), Vec::new());
        if let Some(http) = &route.http {
            let clients = (0..2).map(|c| (format!("{tag}-h{c}"), CANARY)).chain((0..busy).map(|c| (format!("{tag}-b{c}"), BUSY)));
            for (id, pace) in clients {
                names.push(id.clone());
                senders.push(tokio::spawn(send_http(id, http.clone(), route.destination.clone(), ledger.clone(), stop.clone(), pace)));
            }
        }
        if let Some(queue) = &route.ingress {
            let id = format!("{tag}-i");
            names.push(id.clone());
            senders.push(tokio::spawn(send_amqp(id, route.clone(), Into::Ingress(queue.clone()), ledger.clone(), stop.clone())));
        }
        if let Some((delayed, orders)) = &route.delayed {
            let id = format!("{tag}-x");
            names.push(id.clone());
            let into = Into::Delayed { exchange: delayed.clone(), deliver_to: orders.clone() };
            senders.push(tokio::spawn(send_amqp(id, route.clone(), into, ledger.clone(), stop.clone())));
        }
        let clients = names.into_iter().map(|name| format!("{name}-")).collect();
        Canaries { ledger, stop, senders, consumers: vec![consumer], amqp_url: route.amqp_url, clients }
    }

    /// The id prefix of each client this module's senders run (`<tag>-h0-`,
    /// `<tag>-i-`, …; not those of [`Canaries::add_sender`]): for a
    /// condition that must hold for every path in, not for the canaries in all.
    /// The HTTP clients' canaries are acknowledged by the host; the ingress and
    /// delayed-exchange ones by the broker's confirm, whatever the host does.
    pub fn clients(&self) -> &[String] {
        &self.clients
    }

    /// One more HTTP client at the canaries' pace, to `destination` through the host at `base`.
    pub fn add_http(&mut self, tag: &str, base: Arc<Mutex<String>>, destination: &str) {
        self.add_http_with_delays(tag, base, destination, delay_of);
    }

    /// [`Canaries::add_http`] with the `n`th message's delay (ms) from `delay_of`.
    pub fn add_http_with_delays(&mut self, tag: &str, base: Arc<Mutex<String>>, destination: &str, delay_of: fn(u64) -> u64) {
        let pace = Pace { interval: INTERVAL, delay_of };
        let sender = send_http(tag.to_string(), base, destination.to_string(), self.ledger.clone(), self.stop.clone(), pace);
        self.clients.push(format!("{tag}-"));
        self.senders.push(tokio::spawn(sender));
    }

    /// Records arrivals on `queue` too (another destination of the canaries).
    pub fn add_consumer(&mut self, queue: &str) {
        self.consumers.push(tokio::spawn(consume(self.amqp_url.clone(), queue.to_string(), self.ledger.clone())));
    }

    /// A consumer of the caller's own (another broker's destination), given the ledger; stopped at the end.
    pub fn add_consumer_with<F>(&mut self, consumer: impl FnOnce(Arc<Ledger>) -> F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.consumers.push(tokio::spawn(consumer(self.ledger.clone())));
    }

    /// A sender of the caller's own: given the ledger and the flag that says stop.
    pub fn add_sender<F>(&mut self, sender: impl FnOnce(Arc<Ledger>, Arc<AtomicBool>) -> F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.senders.push(tokio::spawn(sender(self.ledger.clone(), self.stop.clone())));
    }

    /// Stops sending, then waits until every acknowledged canary arrived or
    /// `grace` passed after the last one was due.
    pub async fn finish(self, grace: Duration) -> Arc<Ledger> {
        self.finish_with_patience(grace, Duration::ZERO).await
    }

    /// [`Canaries::finish`], waiting up to `patience` more when some have
    /// not arrived after `grace`: a broker that crashed may hold a message
    /// it was dead-lettering until its at-least-once retry (about 180 s on
    /// RabbitMQ 3.10) — late, not lost.
    pub async fn finish_with_patience(self, grace: Duration, patience: Duration) -> Arc<Ledger> {
        self.finish_with(grace, patience, || async {}).await
    }

    /// [`Canaries::finish_with_patience`], calling `look` every
    /// [`LOOK_EVERY`] while some are still out (say, to find those set
    /// aside, so the wait is only for canaries that may still come).
    pub async fn finish_with<F>(self, grace: Duration, patience: Duration, mut look: impl FnMut() -> F) -> Arc<Ledger>
    where
        F: std::future::Future<Output = ()>,
    {
        self.stop.store(true, Ordering::SeqCst);
        for sender in self.senders {
            let _ = sender.await;
        }
        let ledger = self.ledger;
        let mut looked = Instant::now();
        let mut wait_until = async |deadline_ms: u64| {
            while !ledger.complete() && unix_now_ms() < deadline_ms {
                if looked.elapsed() >= LOOK_EVERY {
                    look().await;
                    looked = Instant::now();
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        let deadline_ms = ledger.last_due_ms() + grace.as_millis() as u64;
        wait_until(deadline_ms).await;
        if !ledger.complete() && !patience.is_zero() {
            eprintln!("   {} canaries still out {grace:?} after the last due time; waiting up to {patience:?} more", ledger.tally().lost);
            wait_until(deadline_ms + patience.as_millis() as u64).await;
        }
        // A moment more, so a duplicate right behind its first copy is counted.
        tokio::time::sleep(Duration::from_millis(500)).await;
        for consumer in self.consumers {
            consumer.abort();
        }
        ledger
    }
}

fn delay_of(n: u64) -> u64 {
    1000 * (1 + n % 3)
}

async fn send_http(tag: String, base: Arc<Mutex<String>>, destination: String, ledger: Arc<Ledger>, stop: Arc<AtomicBool>, pace: Pace) {
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(15))).build().into();
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        let id = format!("{tag}-{n}");
        let delay = (pace.delay_of)(n);
        n += 1;
        let url = format!("{}/v1/messages", base.lock().unwrap());
        ledger.sent(&id, unix_now_ms() + delay);
        let body = json!({ "destination": destination, "delay": delay, "body": id });
        let agent = agent.clone();
        let answer = tokio::task::spawn_blocking(move || {
            let mut response = agent.post(&url).send_json(body).ok()?;
            let status = response.status().as_u16();
            let json: Value = response.body_mut().read_json().unwrap_or(Value::Null);
            Some((status, json))
        })
        .await
        .ok()
        .flatten();
        if let Some((status, json)) = answer
            && (200..300).contains(&status)
        {
            ledger.acknowledged(&id, json.get("due_at").and_then(Value::as_u64));
        }
        tokio::time::sleep(pace.interval).await;
    }
}

/// Where an AMQP canary goes in.
enum Into {
    /// The ingress queue, with hourglass's headers.
    Ingress(String),
    /// A delayed exchange, with `x-delay` and the routing key `canary`; the
    /// destination is bound to its `deliver_to` with that key (declared here
    /// as the host declares it, so either may come first).
    Delayed { exchange: String, deliver_to: String },
}

async fn send_amqp(tag: String, route: Route, into: Into, ledger: Arc<Ledger>, stop: Arc<AtomicBool>) {
    let mut n = 0;
    'connect: while !stop.load(Ordering::SeqCst) {
        let Ok(connection) = connect(&route.amqp_url).await else {
            tokio::time::sleep(RETRY).await;
            continue;
        };
        // Bounded, as in `consume`: a broker that went away meanwhile can leave these unanswered for good.
        let opened = tokio::time::timeout(OPEN_TIMEOUT, async {
            let channel = connection.create_channel().await?;
            channel.confirm_select(ConfirmSelectOptions::default()).await?;
            Ok::<_, lapin::Error>(channel)
        })
        .await;
        let Ok(Ok(channel)) = opened else {
            tokio::time::sleep(RETRY).await;
            continue;
        };
        if let Into::Delayed { exchange, deliver_to } = &into {
            let durable = ExchangeDeclareOptions { durable: true, ..Default::default() };
            let bound = async {
                channel.exchange_declare(exchange.as_str().into(), ExchangeKind::Fanout, durable, FieldTable::default()).await?;
                channel.exchange_declare(deliver_to.as_str().into(), ExchangeKind::Topic, durable, FieldTable::default()).await?;
                let bind = QueueBindOptions::default();
                channel.queue_bind(route.destination.as_str().into(), deliver_to.as_str().into(), "canary".into(), bind, FieldTable::default()).await
            };
            if !matches!(tokio::time::timeout(OPEN_TIMEOUT, bound).await, Ok(Ok(_))) {
                tokio::time::sleep(RETRY).await;
                continue;
            }
        }
        while !stop.load(Ordering::SeqCst) {
            let id = format!("{tag}-{n}");
            let delay = delay_of(n);
            n += 1;
            ledger.sent(&id, unix_now_ms() + delay);
            let (exchange, routing_key, properties) = match &into {
                Into::Ingress(queue) => ("", queue.as_str(), ingress_properties(&route.destination, delay)),
                Into::Delayed { exchange, .. } => (exchange.as_str(), "canary", delayed_properties(delay)),
            };
            // Mandatory: a publish the broker cannot route is not acknowledged.
            let options = BasicPublishOptions { mandatory: true, ..Default::default() };
            let confirmed = match channel.basic_publish(exchange.into(), routing_key.into(), options, id.as_bytes(), properties).await {
                Ok(confirm) => tokio::time::timeout(Duration::from_secs(15), confirm).await,
                Err(_) => {
                    tokio::time::sleep(RETRY).await;
                    continue 'connect;
                }
            };
            match confirmed {
                Ok(Ok(confirmation)) => {
                    if confirmation.is_ack() && confirmation.take_message().is_none() {
                        ledger.acknowledged(&id, None);
                    }
                }
                _ => {
                    tokio::time::sleep(RETRY).await;
                    continue 'connect;
                }
            }
            tokio::time::sleep(INTERVAL).await;
        }
        connection.close(200, "done".into()).await.ok();
    }
}

/// A persistent message for a delayed exchange: due after `delay_ms`, as the plugin's producers set it.
pub fn delayed_properties(delay_ms: u64) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert(ShortString::from("x-delay"), AMQPValue::LongLongInt(delay_ms as i64));
    BasicProperties::default().with_delivery_mode(2).with_headers(headers)
}

/// A persistent ingress message's properties: to `destination` after `delay_ms`.
pub fn ingress_properties(destination: &str, delay_ms: u64) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert(ShortString::from("hourglass-destination"), AMQPValue::LongString(LongString::from(destination)));
    headers.insert(ShortString::from("hourglass-delay"), AMQPValue::LongString(LongString::from(format!("{delay_ms}ms"))));
    BasicProperties::default().with_delivery_mode(2).with_headers(headers)
}

/// Consumes the destination, reconnecting forever, and records every arrival.
///
/// Every step is bounded: a broker stopped or killed while this client was
/// opening a channel or consuming has left lapin futures that never resolve,
/// and a consumer stuck there stops counting arrivals for the rest of a run
/// (the soak once saw its destination fill with tens of thousands of messages
/// and no consumer). So opening is under a timeout, and while consuming, a
/// connection no longer connected ends the attempt.
pub async fn consume(amqp_url: String, queue: String, ledger: Arc<Ledger>) {
    loop {
        let started = Instant::now();
        if let Ok(connection) = connect(&amqp_url).await {
            let opened = tokio::time::timeout(OPEN_TIMEOUT, async {
                let channel = connection.create_channel().await?;
                channel.basic_qos(CONSUMER_PREFETCH, BasicQosOptions::default()).await?;
                let consumer =
                    channel.basic_consume(queue.as_str().into(), "faults-canary".into(), BasicConsumeOptions::default(), FieldTable::default()).await?;
                Ok::<_, lapin::Error>((channel, consumer))
            })
            .await;
            if let Ok(Ok((_channel, mut consumer))) = opened {
                // Acked once recorded, within a bounded window: with auto-ack the broker counts a message
                // delivered as it writes it, so a broker killed with deliveries in its socket buffers (an
                // unbounded auto-ack consumer gets hundreds) lost them for this consumer, not for hourglass.
                // Unacked, they are delivered again after the restart (a duplicate at most).
                loop {
                    let next = tokio::time::timeout(WATCH_EVERY, consumer.next()).await;
                    let delivery = match next {
                        Ok(Some(Ok(delivery))) => delivery,
                        Ok(_) => break,
                        // Nothing for a while: fine while connected, the end of this attempt if not.
                        Err(_) if connection.status().connected() => continue,
                        Err(_) => break,
                    };
                    ledger.arrived(&String::from_utf8_lossy(&delivery.data));
                    let acked = tokio::time::timeout(OPEN_TIMEOUT, delivery.acker.ack(BasicAckOptions::default())).await;
                    if !matches!(acked, Ok(Ok(_))) {
                        break;
                    }
                }
            }
            // Closed in the background: a close the broker never answers must not hold this loop.
            tokio::spawn(async move { tokio::time::timeout(OPEN_TIMEOUT, connection.close(200, "done".into())).await.ok() });
        }
        if started.elapsed() < RETRY {
            tokio::time::sleep(RETRY).await;
        }
    }
}
