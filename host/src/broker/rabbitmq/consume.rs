//! A queue consumer that survives the broker and its own handler: the shared
//! loop under the AMQP ingress and the redelivery input.
//!
//! It declares what its handler needs (as [`Command`]s), opens a channel on
//! its connection, sets prefetch, and hands each delivery, converted to a neutral
//! [`Delivery`], to the handler with at most `prefetch` in flight. The
//! handler answers with an [`Outcome`] and the consumer carries it out: ack
//! (many finished deliveries in one, see [`super::acks`]), requeue, retry
//! (hold the message and ask the handler again, backing off, so an outage is
//! waited out without returning it to a queue that counts returns), or move
//! the message aside (a confirmed publish, then the ack; a requeue if the
//! publish fails). Declares and moves go through the
//! [`RabbitMqExecutor`] it is given, the service's own: its channels are
//! leased per publish, so a channel the broker closes fails only that move,
//! and no consumer pays for a publishing connection of its own (each
//! connection has its own buffers, its reader thread, and a place in the
//! broker's connection limit). For the same reason the service's consumers
//! share one connection, a channel each
//! ([`Consumer::sharing`]): a channel the broker closes ends only its
//! consumer, which opens another; a lost connection ends them all, and the
//! first to try again reconnects while the others wait for it. Every channel
//! the broker closes (a refused consume at attach too) costs the connection
//! its number, so a consumer refused over and over wears the shared
//! connection out and it is replaced, rather than leaving no number for the others.
//!
//! A handler that panics does not stop the consumer: the message is requeued,
//! and once the handler panicked [`MAX_PANICS`] times on the same message it
//! is moved aside with the reason (to where [`Handler::poisoned`] says), so it
//! never blocks the messages behind it.
//!
//! After a lost connection or channel it attaches again with backoff; unacked
//! messages are the broker's to deliver again. On stop it cancels the
//! consumer, lets the handler finish the deliveries in hand, then closes its
//! channel (the connection closes with its last user); a stop that comes
//! while it is still declaring or connecting ends that at once, and a cancel
//! or close the broker does not answer is given up (see [`parting`]).

use std::hash::{DefaultHasher, Hash, Hasher};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use lapin::Channel;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions};
use lapin::types::{AMQPValue, FieldTable as AmqpTable, LongString};
use tokio::sync::watch;

use crate::command::{Command, FieldTable};
use crate::executor::{Envelope, Executor, ExecutorError};
use crate::headers::is_routing_header;
pub use crate::message::Handler;
use crate::message::{Delivery, Headers, Outcome, Settled};
use crate::recent::RecentCounts;

use super::acks::Acks;
use super::convert::from_amqp_delivery;
use super::link::{CHANNEL_TIMEOUT, ChannelError, Link, Slot, parting, reconnect_backoff};
use super::publish::RabbitMqExecutor;

/// Why a consumer could not attach to its queue (it tries again after a pause).
#[derive(Debug, thiserror::Error)]
enum AttachError {
    #[error(transparent)]
    Declare(#[from] ExecutorError),
    #[error(transparent)]
    Connect(ExecutorError),
    #[error("RabbitMQ at {url}: {source}")]
    Channel { url: String, source: ChannelError },
    #[error("RabbitMQ at {url}: {source}")]
    Subscribe { url: String, source: lapin::Error },
    #[error("RabbitMQ at {url}: no consumer on {queue} within {CHANNEL_TIMEOUT:?}")]
    SubscribeTimedOut { url: String, queue: String },
}

/// How long a message waits before it is requeued (so a broker outage or a
/// panicking handler is not a hot loop), and before the first retry of an
/// [`Outcome::Retry`].
const REQUEUE_PAUSE: Duration = Duration::from_millis(500);
/// The longest pause between two retries of a message held in hand.
const RETRY_PAUSE_MAX: Duration = Duration::from_secs(5);
/// A message the handler panicked on this many times is moved aside.
pub const MAX_PANICS: u32 = 3;
/// Messages whose panics are remembered at once; the oldest is forgotten first.
const PANICS_REMEMBERED: usize = 1_024;

pub struct Consumer<H> {
    /// The connection it consumes on, perhaps shared with other consumers.
    connection: Arc<Slot>,
    /// Declares the handler's queues and carries out its moves.
    publisher: Arc<RabbitMqExecutor>,
    handler: Arc<H>,
    consuming: AtomicBool,
    panics: Mutex<PanicCounts>,
}

impl<H: Handler> Consumer<H> {
    /// A consumer on a connection of its own to `url`.
    pub fn new(url: &str, publisher: Arc<RabbitMqExecutor>, handler: Arc<H>) -> Arc<Consumer<H>> {
        // Named for the broker's connection list, beside "hourglass publish …" and "hourglass control …".
        let connection = Arc::new(Slot::lazy(url, format!("hourglass consume {}", handler.queue())));
        Self::sharing(connection, publisher, handler)
    }

    /// A consumer on `connection`, which other consumers may share (a channel each).
    pub fn sharing(connection: Arc<Slot>, publisher: Arc<RabbitMqExecutor>, handler: Arc<H>) -> Arc<Consumer<H>> {
        Arc::new(Consumer { connection, publisher, handler, consuming: AtomicBool::new(false), panics: Default::default() })
    }

    pub fn handler(&self) -> &Arc<H> {
        &self.handler
    }

    /// Whether the consumer is attached to its queue.
    pub fn is_consuming(&self) -> bool {
        self.consuming.load(Ordering::Relaxed)
    }

    /// Declares the handler's queues now, so producers can publish before the first consume.
    pub async fn declare(&self) -> Result<(), ExecutorError> {
        match self.publisher.apply(&self.handler.declarations()).await {
            Err(ExecutorError::Refused(why)) => Err(ExecutorError::Refused(match self.handler.declaration_hint() {
                Some(hint) => format!("{why} ({hint})"),
                None => why,
            })),
            other => other,
        }
    }

    /// Consumes until `stop` turns true, reconnecting with backoff; returns only then.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut backoff = reconnect_backoff();
        while !*stop.borrow() {
            match self.consume(&mut stop).await {
                Ok(()) => break,
                Err((was_consuming, err)) => {
                    self.consuming.store(false, Ordering::Relaxed);
                    if was_consuming {
                        backoff.reset();
                    }
                    let wait = backoff.next_wait();
                    tracing::warn!(queue = %self.handler.queue(), error = %err, retry_in = ?wait, "consumer lost; reconnecting");
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = stop.wait_for(|stopping| *stopping) => {}
                    }
                }
            }
        }
        self.consuming.store(false, Ordering::Relaxed);
    }

    /// One connection's worth of consuming. `Err((consumed at all, why))` when it was lost.
    async fn consume(&self, stop: &mut watch::Receiver<bool>) -> Result<(), (bool, String)> {
        let queue = self.handler.queue().to_string();
        let tag = format!("hourglass-{queue}");
        // Attaching may wait CONNECT_TIMEOUT per node on a broker that does not
        // answer; a stop meanwhile ends it at once. What was opened is dropped:
        // lapin closes a dropped channel (and a connection no one holds), and
        // the broker requeues whatever a half-made consumer was given.
        let (link, channel, consumer) = tokio::select! {
            attached = self.attach(&queue, &tag) => attached.map_err(|why| (false, why.to_string()))?,
            _ = stop.wait_for(|stopping| *stopping) => {
                tracing::info!(%queue, "consumer stopped while attaching");
                return Ok(());
            }
        };
        let connection = link.connection();
        self.consuming.store(true, Ordering::Relaxed);
        tracing::info!(%queue, node = %link.node, prefetch = self.handler.prefetch(), "consuming");
        let publisher = self.publisher.as_ref();
        let acks = &Acks::default();
        // Ends the deliveries when the stop's cancel goes unanswered (they end at the broker's cancel-ok otherwise).
        let (give_up, gave_up) = tokio::sync::oneshot::channel::<()>();
        let held = Held { channel: &channel, stop: stop.clone() };
        let held = &held;
        let processing = consumer.take_until(gave_up).for_each_concurrent(self.handler.prefetch() as usize, |delivery| {
            // In hand from here, in delivery order: no multiple ack may cover it before it is done.
            if let Ok(delivery) = &delivery {
                acks.taken(delivery.delivery_tag);
            }
            async move {
                match delivery {
                    Ok(delivery) => self.process(delivery, publisher, acks, held).await,
                    Err(err) => tracing::warn!(error = %err, "delivery failed"),
                }
            }
        });
        tokio::pin!(processing);
        tokio::select! {
            _ = &mut processing => {
                burn_if_closed(&link, &channel);
                return Err((true, format!("consumer on {queue} ended: connection or channel lost")));
            }
            _ = stop.wait_for(|stopping| *stopping) => {}
        }
        // Stop taking new messages; the broker keeps the ones not yet delivered.
        // Unanswered (the connection lost or silent), nothing more is taken; the
        // broker requeues what it sent meanwhile when the connection goes.
        if !parting(connection, channel.basic_cancel(tag.as_str().into(), BasicCancelOptions::default())).await {
            give_up.send(()).ok();
        }
        processing.await;
        self.consuming.store(false, Ordering::Relaxed);
        burn_if_closed(&link, &channel);
        parting(connection, channel.close(200, "hourglass stopping".into())).await;
        tracing::info!(%queue, "consumer stopped");
        Ok(())
    }

    /// Declares the handler's queues, connects (or joins the shared
    /// connection), and consumes `queue` as `tag` on a channel of its own:
    /// the connection, the channel, and the deliveries.
    async fn attach(&self, queue: &str, tag: &str) -> Result<(Arc<Link>, Channel, lapin::Consumer), AttachError> {
        self.declare().await?;
        let link = self.connection.link_waiting().await.map_err(AttachError::Connect)?;
        let url = || link.node.clone();
        let channel = match link.open_channel(false).await {
            Ok(channel) => channel,
            Err(source) => {
                // On a live connection lapin refuses a channel when every number is
                // taken or the one it picked is a broker-closed one (lost for good):
                // counted, so the link is replaced instead of refusing everyone.
                if matches!(source, ChannelError::Refused(_)) && link.connected() {
                    link.burn();
                }
                return Err(AttachError::Channel { url: url(), source });
            }
        };
        let subscribe = async {
            channel.basic_qos(self.handler.prefetch(), BasicQosOptions::default()).await?;
            channel.basic_consume(queue.into(), tag.into(), BasicConsumeOptions::default(), AmqpTable::default()).await
        };
        // A broker that accepted the connection can still go silent.
        let consumer = match tokio::time::timeout(CHANNEL_TIMEOUT, subscribe).await {
            Ok(Ok(consumer)) => consumer,
            Ok(Err(source)) => {
                // A refused consume (queue gone, in exclusive use, not readable) closes the
                // channel, at every attach while the cause lasts.
                burn_if_closed(&link, &channel);
                return Err(AttachError::Subscribe { url: url(), source });
            }
            Err(_) => return Err(AttachError::SubscribeTimedOut { url: url(), queue: queue.to_string() }),
        };
        Ok((link, channel, consumer))
    }

    /// One delivery: the handler's decision (a panic caught and counted; a
    /// [`Outcome::Retry`] asked again while the message is held), carried out.
    async fn process(&self, raw: lapin::message::Delivery, publisher: &RabbitMqExecutor, acks: &Acks, held: &Held<'_>) {
        let delivery = from_amqp_delivery(self.handler.queue(), &raw);
        let mut pause = REQUEUE_PAUSE;
        let (outcome, note) = loop {
            let (outcome, note) = self.decide(&delivery).await;
            if outcome != Outcome::Retry {
                break (outcome, note);
            }
            if !held.wait(pause).await {
                // Stopping, or the channel is gone (then the broker has it back already).
                break (Outcome::Requeue, note);
            }
            tracing::debug!(queue = %delivery.queue, ?pause, "asking again about a message held in hand");
            pause = (pause * 2).min(RETRY_PAUSE_MAX);
        };
        let settled = self.carry_out(&raw, &delivery, &outcome, publisher, acks).await;
        if let (Outcome::MoveTo { .. }, Settled::Acked | Settled::AckLost) = (&outcome, &settled) {
            self.panics.lock().unwrap_or_else(|p| p.into_inner()).forget(&delivery);
        }
        self.handler.settled(note, &outcome, &settled);
    }

    /// The handler's answer for one delivery; a panic is caught, counted, and
    /// after [`MAX_PANICS`] turned into a move aside.
    async fn decide(&self, delivery: &Delivery) -> (Outcome, Option<H::Note>) {
        // Boxed: a handler's future holds a whole schedule (kilobytes); inline, every delivery's
        // future would be that large and be copied whole as it is spawned and moved.
        match AssertUnwindSafe(Box::pin(self.handler.handle(delivery))).catch_unwind().await {
            Ok((outcome, note)) => {
                self.panics.lock().unwrap_or_else(|p| p.into_inner()).forget(delivery);
                (outcome, Some(note))
            }
            Err(panic) => {
                let what = panic_message(panic.as_ref());
                let panics = self.panics.lock().unwrap_or_else(|p| p.into_inner()).record(delivery);
                tracing::error!(queue = %delivery.queue, panics, panic = %what, "the handler panicked on a message");
                if panics >= MAX_PANICS {
                    let reason = format!("hourglass failed on this message {panics} times (it panicked: {what}); set aside so the messages behind it go on");
                    (self.handler.poisoned(delivery, &reason), None)
                } else {
                    (Outcome::Requeue, None)
                }
            }
        }
    }

    async fn carry_out(&self, raw: &lapin::message::Delivery, delivery: &Delivery, outcome: &Outcome, publisher: &RabbitMqExecutor, acks: &Acks) -> Settled {
        let tag = raw.delivery_tag;
        match outcome {
            Outcome::Ack => acks.ack(tag, &raw.acker).await,
            Outcome::Requeue | Outcome::Retry => {
                acks.alone(tag, requeue(raw)).await;
                Settled::Requeued
            }
            // Boxed: setting aside is rare, and inline its publish would size every delivery's future.
            Outcome::MoveTo { queue, headers, reason } => match Box::pin(move_to(publisher, queue, delivery, headers)).await {
                Ok(()) => {
                    tracing::info!(from = %delivery.queue, to = %queue, %reason, "message set aside");
                    acks.ack(tag, &raw.acker).await
                }
                Err(err) => {
                    tracing::warn!(from = %delivery.queue, to = %queue, error = %err, "could not set a message aside; requeued it");
                    acks.alone(tag, requeue(raw)).await;
                    Settled::MoveFailed(err.to_string())
                }
            },
        }
    }
}

/// Publishes `delivery` as it came (body, properties, headers) plus `added`
/// headers to `queue` through the default exchange, persistent and
/// mandatory, and waits for the broker's confirm.
///
/// RabbitMQ refuses a `user-id` other than the publishing connection's user
/// (and closes the channel); a message a producer sent under its own user is
/// moved without it rather than never.
async fn move_to(publisher: &RabbitMqExecutor, queue: &str, delivery: &Delivery, added: &Headers) -> Result<(), ExecutorError> {
    let mut properties = delivery.properties.clone();
    // CC/BCC are often why a message is set aside; kept, the publish would be refused (or copied elsewhere).
    properties.headers.retain(|name, _| !is_routing_header(name));
    properties.headers.extend(added.iter().map(|(k, v)| (k.clone(), v.clone())));
    let id = properties.message_id.clone().unwrap_or_else(|| format!("a message from {}", delivery.queue));
    let publish = [Command::forward("", queue)];
    let mut envelope = Envelope { id, body: delivery.body.clone(), headers: FieldTable::new(), properties, stamp_message_id: false };
    match publisher.send(&publish, &envelope).await {
        Err(why) if envelope.properties.user_id.is_some() => {
            tracing::warn!(to = %queue, error = %why, "the broker refused the move; moving it without its user-id");
            envelope.properties.user_id = None;
            publisher.send(&publish, &envelope).await
        }
        other => other,
    }
}

/// What a consumer holding a message in hand must know: whether it still holds it.
struct Held<'a> {
    channel: &'a Channel,
    stop: watch::Receiver<bool>,
}

impl Held<'_> {
    /// Waits `pause`; true when the message is still ours to retry (no stop, the channel open).
    async fn wait(&self, pause: Duration) -> bool {
        let mut stop = self.stop.clone();
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.wait_for(|stopping| *stopping) => return false,
        }
        !*stop.borrow() && self.channel.status().connected()
    }
}

/// Counts `channel` against `link` when the broker closed it and not the
/// whole connection: lapin never opens a channel under its number again, and
/// the consumers sharing the link would run out of numbers unless the link,
/// worn out, is replaced.
fn burn_if_closed(link: &Link, channel: &Channel) {
    if link.connected() && !channel.status().connected() {
        link.burn();
    }
}

/// Puts a delivery back on its queue after a short pause.
async fn requeue(delivery: &lapin::message::Delivery) {
    tokio::time::sleep(REQUEUE_PAUSE).await;
    delivery.acker.nack(BasicNackOptions { requeue: true, ..Default::default() }).await.ok();
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// How often the handler panicked on each recent message, bounded.
///
/// A message is known by its message id, else by its content (exchange,
/// routing key, properties, body): a requeued message comes back under a new
/// delivery tag. A first delivery (not `redelivered`) starts its count afresh.
struct PanicCounts(RecentCounts<u64>);

impl Default for PanicCounts {
    fn default() -> Self {
        PanicCounts(RecentCounts::new(PANICS_REMEMBERED))
    }
}

impl PanicCounts {
    fn key(delivery: &Delivery) -> u64 {
        let mut hasher = DefaultHasher::new();
        match &delivery.properties.message_id {
            Some(id) => id.hash(&mut hasher),
            None => {
                delivery.exchange.hash(&mut hasher);
                delivery.routing_key.hash(&mut hasher);
                format!("{:?}", delivery.properties).hash(&mut hasher);
                delivery.body.hash(&mut hasher);
            }
        }
        hasher.finish()
    }

    /// Counts one more panic on `delivery`; returns its count.
    fn record(&mut self, delivery: &Delivery) -> u32 {
        let count = self.0.entry(Self::key(delivery));
        *count = if delivery.redelivered { *count + 1 } else { 1 };
        *count
    }

    fn forget(&mut self, delivery: &Delivery) {
        if self.0.len() > 0 {
            self.0.forget(&Self::key(delivery));
        }
    }
}

/// A header value holding `text`.
pub fn long_string(text: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery(body: &str, redelivered: bool) -> Delivery {
        Delivery { queue: "q".into(), body: body.as_bytes().to_vec(), redelivered, ..Default::default() }
    }

    #[test]
    fn panics_count_per_message_across_redeliveries_and_restart_on_a_first_delivery() {
        let mut counts = PanicCounts::default();
        assert_eq!(counts.record(&delivery("a", false)), 1);
        assert_eq!(counts.record(&delivery("a", true)), 2);
        assert_eq!(counts.record(&delivery("b", true)), 1, "another message counts apart");
        assert_eq!(counts.record(&delivery("a", true)), 3);
        assert_eq!(counts.record(&delivery("a", false)), 1, "a fresh copy starts again");
        counts.forget(&delivery("a", true));
        assert_eq!(counts.record(&delivery("a", true)), 1);
    }

    #[test]
    fn the_panic_memory_is_bounded() {
        let mut counts = PanicCounts::default();
        for i in 0..PANICS_REMEMBERED + 10 {
            counts.record(&delivery(&i.to_string(), true));
        }
        assert_eq!(counts.0.len(), PANICS_REMEMBERED);
        assert_eq!(counts.record(&delivery("0", true)), 1, "the oldest was forgotten");
    }

    #[test]
    fn a_message_id_names_the_message_whatever_its_body() {
        let with_id = |body: &str| {
            let mut d = delivery(body, true);
            d.properties.message_id = Some("m-1".into());
            d
        };
        let mut counts = PanicCounts::default();
        counts.record(&with_id("x"));
        assert_eq!(counts.record(&with_id("y")), 2);
    }
}
