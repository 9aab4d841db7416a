//! A queue consumer that survives the broker: the shared loop under the AMQP
//! ingress and the redelivery input.
//!
//! It connects, declares what its handler needs, sets prefetch, and hands
//! each delivery to the handler with at most `prefetch` in flight; the handler
//! acks. After a lost connection it reconnects with backoff; unacked messages
//! are the broker's to deliver again. On stop it cancels the consumer, lets
//! the handler finish the deliveries in hand, then closes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable as AmqpTable, LongString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use tokio::sync::watch;

use crate::broker::ExecutorError;
use crate::message::HeaderValue;

use super::convert::{short_string, to_amqp_value};
use crate::broker::rabbitmq::redact;

const FIRST_RETRY: Duration = Duration::from_millis(250);
const MAX_RETRY: Duration = Duration::from_secs(5);
/// How long a message waits before it is requeued while the broker is unavailable.
const REQUEUE_PAUSE: Duration = Duration::from_millis(500);

/// What a consumer does with its queue.
pub trait Handler: Send + Sync + 'static {
    /// The queue consumed.
    fn queue(&self) -> &str;
    fn prefetch(&self) -> u16;
    /// Declares the queues (and exchanges) the handler needs; called on every connect.
    fn declare(&self, channel: &Channel) -> impl Future<Output = Result<(), ExecutorError>> + Send;
    /// Handles one delivery and acks, nacks or requeues it. `publisher` is a
    /// confirm-mode channel on the same connection.
    fn handle(&self, delivery: Delivery, publisher: &Channel) -> impl Future<Output = ()> + Send;
}

pub struct Consumer<H> {
    url: String,
    handler: Arc<H>,
    consuming: AtomicBool,
}

impl<H: Handler> Consumer<H> {
    pub fn new(url: &str, handler: Arc<H>) -> Arc<Consumer<H>> {
        Arc::new(Consumer { url: url.to_string(), handler, consuming: AtomicBool::new(false) })
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
        let unavailable = |e: lapin::Error| ExecutorError::Unavailable(format!("RabbitMQ at {}: {e}", redact(&self.url)));
        let connection = Connection::connect(&self.url, ConnectionProperties::default()).await.map_err(unavailable)?;
        let channel = connection.create_channel().await.map_err(unavailable)?;
        let declared = self.handler.declare(&channel).await;
        connection.close(200, "declared".into()).await.ok();
        declared
    }

    /// Consumes until `stop` turns true, reconnecting with backoff.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut retry = FIRST_RETRY;
        while !*stop.borrow() {
            match self.consume(&mut stop).await {
                Ok(()) => break,
                Err((was_consuming, err)) => {
                    self.consuming.store(false, Ordering::Relaxed);
                    if was_consuming {
                        retry = FIRST_RETRY;
                    }
                    tracing::warn!(queue = %self.handler.queue(), error = %err, retry_in = ?retry, "consumer lost; reconnecting");
                    tokio::select! {
                        _ = tokio::time::sleep(retry) => {}
                        _ = stop.changed() => {}
                    }
                    retry = (retry * 2).min(MAX_RETRY);
                }
            }
        }
        self.consuming.store(false, Ordering::Relaxed);
    }

    /// One connection's worth of consuming. `Err((consumed at all, why))` when it was lost.
    async fn consume(&self, stop: &mut watch::Receiver<bool>) -> Result<(), (bool, String)> {
        let queue = self.handler.queue().to_string();
        let lost = |e: lapin::Error| (false, format!("RabbitMQ at {}: {e}", redact(&self.url)));
        let connection = Connection::connect(&self.url, ConnectionProperties::default()).await.map_err(lost)?;
        let channel = connection.create_channel().await.map_err(lost)?;
        channel.basic_qos(self.handler.prefetch(), BasicQosOptions::default()).await.map_err(lost)?;
        self.handler.declare(&channel).await.map_err(|e| (false, e.to_string()))?;
        let publisher = connection.create_channel().await.map_err(lost)?;
        publisher.confirm_select(ConfirmSelectOptions::default()).await.map_err(lost)?;
        let tag = format!("hourglass-{queue}");
        let consumer = channel
            .basic_consume(queue.as_str().into(), tag.as_str().into(), BasicConsumeOptions::default(), AmqpTable::default())
            .await
            .map_err(lost)?;
        self.consuming.store(true, Ordering::Relaxed);
        tracing::info!(%queue, prefetch = self.handler.prefetch(), "consuming");
        let (handler, publisher) = (&self.handler, &publisher);
        let processing = consumer.for_each_concurrent(self.handler.prefetch() as usize, |delivery| async move {
            match delivery {
                Ok(delivery) => handler.handle(delivery, publisher).await,
                Err(err) => tracing::warn!(error = %err, "delivery failed"),
            }
        });
        tokio::pin!(processing);
        tokio::select! {
            _ = &mut processing => return Err((true, format!("consumer on {queue} ended: connection or channel lost"))),
            _ = stop.changed() => {}
        }
        // Stop taking new messages; the broker keeps the ones not yet delivered.
        channel.basic_cancel(tag.as_str().into(), BasicCancelOptions::default()).await.ok();
        processing.await;
        self.consuming.store(false, Ordering::Relaxed);
        connection.close(200, "hourglass stopping".into()).await.ok();
        tracing::info!(%queue, "consumer stopped");
        Ok(())
    }
}

/// Puts a delivery back on its queue after a short pause (so a broker outage is not a hot loop).
pub async fn requeue(delivery: &Delivery) {
    tokio::time::sleep(REQUEUE_PAUSE).await;
    delivery.acker.nack(BasicNackOptions { requeue: true, ..Default::default() }).await.ok();
}

/// Publishes through the default exchange to `queue` and waits for the confirm.
async fn publish_confirmed(publisher: &Channel, queue: &str, body: &[u8], properties: BasicProperties) -> Result<(), String> {
    let options = BasicPublishOptions { mandatory: true, ..Default::default() };
    let confirm = publisher.basic_publish("".into(), queue.into(), options, body, properties).await.map_err(|e| e.to_string())?;
    match confirm.await.map_err(|e| e.to_string())? {
        Confirmation::Ack(None) => Ok(()),
        other => Err(format!("queue {queue:?} did not take it: {other:?}")),
    }
}

/// Moves a delivery aside: publishes it to `queue` as it came (body, properties,
/// headers) plus `added` headers, persistent, and acks it once the broker
/// confirmed. `Ok(acked)`; if the publish fails the delivery is requeued and
/// the error returned, so the message is never lost.
pub async fn move_to(publisher: &Channel, queue: &str, delivery: &Delivery, added: Vec<(&str, HeaderValue)>) -> Result<bool, String> {
    let mut headers = delivery.properties.headers().clone().unwrap_or_default();
    for (key, value) in added {
        headers.insert(short_string("header name", key)?, to_amqp_value(&value)?);
    }
    let properties = delivery.properties.clone().with_headers(headers).with_delivery_mode(2);
    match publish_confirmed(publisher, queue, &delivery.data, properties).await {
        Ok(()) => Ok(ack(delivery).await),
        Err(err) => {
            requeue(delivery).await;
            Err(err)
        }
    }
}

/// A header value holding `text`.
pub fn long_string(text: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(text))
}

/// Acks; `false` when the ack could not be sent (the broker will deliver the message again).
pub async fn ack(delivery: &Delivery) -> bool {
    matches!(delivery.acker.ack(lapin::options::BasicAckOptions::default()).await, Ok(true))
}

/// A header's text, if it is a string.
pub fn text(value: &AMQPValue) -> Option<String> {
    match value {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_string()),
        _ => None,
    }
}

/// A header's value, if it is a whole number of any AMQP width.
pub fn whole_number(value: &AMQPValue) -> Option<i128> {
    Some(match value {
        AMQPValue::ShortShortInt(v) => *v as i128,
        AMQPValue::ShortShortUInt(v) => *v as i128,
        AMQPValue::ShortInt(v) => *v as i128,
        AMQPValue::ShortUInt(v) => *v as i128,
        AMQPValue::LongInt(v) => *v as i128,
        AMQPValue::LongUInt(v) => *v as i128,
        AMQPValue::LongLongInt(v) => *v as i128,
        _ => return None,
    })
}
