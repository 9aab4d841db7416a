//! AMQP ingress: any AMQP client hands hourglass a message to delay by
//! publishing it to one queue, with the destination and delay in headers.
//!
//! Each message is planned and forwarded through the scheduler, and acked only
//! after the broker confirmed the forward. A message that cannot be scheduled
//! (missing or bad headers, unknown destination or strategy, a delay the
//! planner refuses) is published to the invalid-messages queue with the reason
//! in a header, and acked only once that publish is confirmed. While the broker
//! is unavailable a message is requeued, never acked; a lost connection leaves
//! every unacked message to the broker, which delivers it again. Prefetch bounds
//! the messages in flight.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable as AmqpTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use tokio::sync::watch;

use crate::broker::Broker;
use crate::config::IngressConfig;
use crate::executor::ExecutorError;
use crate::rabbitmq::redact;
use crate::scheduler::{ScheduleError, ScheduleRequest, Scheduler};

/// The destination queue (required).
pub const DESTINATION_HEADER: &str = "hourglass-destination";
/// The delay: a duration string ("90s", "1h 30m") or whole milliseconds (required).
pub const DELAY_HEADER: &str = "hourglass-delay";
/// A strategy other than the destination's (optional).
pub const STRATEGY_HEADER: &str = "hourglass-strategy";
/// On invalid messages: why the message could not be scheduled.
pub const INVALID_REASON_HEADER: &str = "hourglass-invalid-reason";

const FIRST_RETRY: Duration = Duration::from_millis(250);
const MAX_RETRY: Duration = Duration::from_secs(5);
/// How long a message waits before it is requeued while the broker is unavailable.
const REQUEUE_PAUSE: Duration = Duration::from_millis(500);

pub struct Ingress {
    url: String,
    config: IngressConfig,
    scheduler: Arc<Scheduler<Broker>>,
    consuming: AtomicBool,
}

/// Why a message is invalid, or that it must wait for the broker.
enum Refusal {
    Invalid(String),
    Unavailable(String),
}

impl Ingress {
    pub fn new(url: &str, config: IngressConfig, scheduler: Arc<Scheduler<Broker>>) -> Arc<Ingress> {
        Arc::new(Ingress { url: url.to_string(), config, scheduler, consuming: AtomicBool::new(false) })
    }

    pub fn queue(&self) -> &str {
        &self.config.queue
    }

    /// Whether the ingress consumer is attached to its queue.
    pub fn is_consuming(&self) -> bool {
        self.consuming.load(Ordering::Relaxed)
    }

    /// Declares the ingress and invalid-messages queues (durable), so a
    /// producer can publish before `serve` first consumes.
    pub async fn declare(&self) -> Result<(), ExecutorError> {
        let unavailable = |e: lapin::Error| ExecutorError::Unavailable(format!("RabbitMQ at {}: {e}", redact(&self.url)));
        let connection = Connection::connect(&self.url, ConnectionProperties::default()).await.map_err(unavailable)?;
        let channel = connection.create_channel().await.map_err(unavailable)?;
        self.declare_on(&channel).await?;
        connection.close(200, "declared".into()).await.ok();
        Ok(())
    }

    async fn declare_on(&self, channel: &Channel) -> Result<(), ExecutorError> {
        let durable = QueueDeclareOptions { durable: true, ..Default::default() };
        for queue in [&self.config.queue, &self.config.invalid_queue] {
            channel
                .queue_declare(queue.as_str().into(), durable, AmqpTable::default())
                .await
                .map_err(|e| ExecutorError::Refused(format!("ingress queue {queue:?} (wanted: durable, no arguments): {e}")))?;
        }
        Ok(())
    }

    /// Consumes until `stop` turns true, reconnecting with backoff after a
    /// lost connection. On stop, cancels the consumer and finishes the
    /// messages in hand (their forwards confirmed and acked) before returning.
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
                    tracing::warn!(queue = %self.config.queue, error = %err, retry_in = ?retry, "ingress consumer lost; reconnecting");
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
        let lost = |e: lapin::Error| (false, format!("RabbitMQ at {}: {e}", redact(&self.url)));
        let connection = Connection::connect(&self.url, ConnectionProperties::default()).await.map_err(lost)?;
        let channel = connection.create_channel().await.map_err(lost)?;
        channel.basic_qos(self.config.prefetch, BasicQosOptions::default()).await.map_err(lost)?;
        self.declare_on(&channel).await.map_err(|e| (false, e.to_string()))?;
        let publisher = connection.create_channel().await.map_err(lost)?;
        publisher.confirm_select(ConfirmSelectOptions::default()).await.map_err(lost)?;
        let consumer = channel
            .basic_consume(self.config.queue.as_str().into(), "hourglass-ingress".into(), BasicConsumeOptions::default(), AmqpTable::default())
            .await
            .map_err(lost)?;
        self.consuming.store(true, Ordering::Relaxed);
        tracing::info!(queue = %self.config.queue, prefetch = self.config.prefetch, "ingress consuming");
        let publisher = &publisher;
        let processing = consumer.for_each_concurrent(self.config.prefetch as usize, |delivery| async move {
            match delivery {
                Ok(delivery) => self.handle(delivery, publisher).await,
                Err(err) => tracing::warn!(error = %err, "ingress delivery failed"),
            }
        });
        tokio::pin!(processing);
        tokio::select! {
            _ = &mut processing => {
                return Err((true, format!("consumer on {} ended: connection or channel lost", self.config.queue)));
            }
            _ = stop.changed() => {}
        }
        // Stop taking new messages; the broker keeps the ones not yet delivered.
        channel.basic_cancel("hourglass-ingress".into(), BasicCancelOptions::default()).await.ok();
        processing.await;
        self.consuming.store(false, Ordering::Relaxed);
        connection.close(200, "hourglass stopping".into()).await.ok();
        tracing::info!(queue = %self.config.queue, "ingress stopped");
        Ok(())
    }

    async fn handle(&self, delivery: Delivery, publisher: &Channel) {
        let metrics = self.scheduler.metrics();
        metrics.ingress_started();
        let result = match parse(&delivery) {
            Err(reason) => Err(Refusal::Invalid(reason)),
            Ok(request) => {
                let destination = request.destination.clone();
                let strategy = request.strategy.clone().unwrap_or_else(|| self.scheduler.strategy_for(&destination));
                match self.scheduler.schedule(request).await {
                    Ok(scheduled) => {
                        metrics.scheduled(&scheduled.strategy, &destination);
                        Ok(())
                    }
                    Err(err) => {
                        metrics.failed(&strategy, &destination);
                        Err(match err {
                            ScheduleError::Broker(ExecutorError::Unavailable(why)) => Refusal::Unavailable(why),
                            other => Refusal::Invalid(other.to_string()),
                        })
                    }
                }
            }
        };
        let outcome = match result {
            Ok(()) => match delivery.acker.ack(BasicAckOptions::default()).await {
                Ok(true) => "forwarded",
                // The broker delivers it again: forwarded twice, never lost.
                _ => "forwarded_unacked",
            },
            Err(Refusal::Invalid(reason)) => match self.publish_invalid(&delivery, publisher, &reason).await {
                Ok(()) => {
                    tracing::info!(queue = %self.config.invalid_queue, %reason, "invalid ingress message set aside");
                    match delivery.acker.ack(BasicAckOptions::default()).await {
                        Ok(true) => "invalid",
                        _ => "invalid_unacked",
                    }
                }
                Err(err) => {
                    tracing::warn!(error = %err, "could not set aside an invalid ingress message; requeueing it");
                    self.requeue(&delivery).await
                }
            },
            Err(Refusal::Unavailable(why)) => {
                tracing::warn!(%why, "broker unavailable; requeueing the ingress message");
                self.requeue(&delivery).await
            }
        };
        metrics.ingress(outcome);
        metrics.ingress_finished();
    }

    async fn requeue(&self, delivery: &Delivery) -> &'static str {
        tokio::time::sleep(REQUEUE_PAUSE).await;
        delivery.acker.nack(BasicNackOptions { requeue: true, ..Default::default() }).await.ok();
        "requeued"
    }

    /// The message as it came, plus the reason, on the invalid-messages queue; confirmed.
    async fn publish_invalid(&self, delivery: &Delivery, publisher: &Channel, reason: &str) -> Result<(), String> {
        let mut headers = delivery.properties.headers().clone().unwrap_or_default();
        headers.insert(INVALID_REASON_HEADER.into(), AMQPValue::LongString(LongString::from(reason)));
        let properties = delivery.properties.clone().with_headers(headers).with_delivery_mode(2);
        let options = BasicPublishOptions { mandatory: true, ..Default::default() };
        let confirm = publisher
            .basic_publish("".into(), self.config.invalid_queue.as_str().into(), options, &delivery.data, properties)
            .await
            .map_err(|e| e.to_string())?;
        match confirm.await.map_err(|e| e.to_string())? {
            Confirmation::Ack(None) => Ok(()),
            other => Err(format!("invalid-messages queue {:?} did not take it: {other:?}", self.config.invalid_queue)),
        }
    }
}

fn text(value: &AMQPValue) -> Option<String> {
    match value {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_string()),
        _ => None,
    }
}

fn whole_number(value: &AMQPValue) -> Option<i128> {
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

/// The schedule request an ingress message asks for, or why it is invalid.
/// The control headers are removed; every other header and property is kept
/// as it came, with its AMQP type.
fn parse(delivery: &Delivery) -> Result<ScheduleRequest, String> {
    parse_parts(&delivery.properties, &delivery.data)
}

fn parse_parts(properties: &BasicProperties, body: &[u8]) -> Result<ScheduleRequest, String> {
    let mut headers: BTreeMap<ShortString, AMQPValue> = properties.headers().as_ref().map(|h| h.inner().clone()).unwrap_or_default();
    let destination = match headers.remove(DESTINATION_HEADER) {
        None => return Err(format!("missing header {DESTINATION_HEADER}")),
        Some(value) => text(&value).filter(|d| !d.is_empty()).ok_or_else(|| format!("header {DESTINATION_HEADER}: must be a non-empty string"))?,
    };
    let delay_ms = match headers.remove(DELAY_HEADER) {
        None => return Err(format!("missing header {DELAY_HEADER} (\"10s\" or milliseconds)")),
        Some(value) => match (text(&value), whole_number(&value)) {
            (Some(text), _) => hourglass_planner_sdk::parse_duration_ms(&text).map_err(|e| format!("header {DELAY_HEADER}: {e}"))?,
            (None, Some(ms)) if ms >= 0 && ms <= u64::MAX as i128 => ms as u64,
            (None, Some(ms)) => return Err(format!("header {DELAY_HEADER}: {ms} is negative")),
            (None, None) => return Err(format!("header {DELAY_HEADER}: {value:?} is neither a duration string nor whole milliseconds")),
        },
    };
    let strategy = match headers.remove(STRATEGY_HEADER) {
        None => None,
        Some(value) => Some(text(&value).ok_or_else(|| format!("header {STRATEGY_HEADER}: must be a string"))?),
    };
    if let Some(reserved) = headers.keys().find(|k| k.as_str().starts_with("hourglass-")) {
        return Err(format!(
            "header {:?} is reserved: only {DESTINATION_HEADER}, {DELAY_HEADER} and {STRATEGY_HEADER} may be set by a producer",
            reserved.as_str()
        ));
    }
    Ok(ScheduleRequest {
        destination,
        delay_ms,
        body: body.to_vec(),
        headers: Default::default(),
        properties: properties.clone().with_headers(AmqpTable::from(headers)),
        strategy,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn properties(headers: &[(&str, AMQPValue)]) -> BasicProperties {
        let table: BTreeMap<ShortString, AMQPValue> = headers.iter().map(|(k, v)| (ShortString::from(*k), v.clone())).collect();
        BasicProperties::default().with_headers(AmqpTable::from(table)).with_content_type("application/json".into())
    }

    fn long(text: &str) -> AMQPValue {
        AMQPValue::LongString(LongString::from(text))
    }

    #[test]
    fn control_headers_become_the_request_and_the_rest_is_kept_with_its_type() {
        let props = properties(&[
            (DESTINATION_HEADER, long("orders")),
            (DELAY_HEADER, long("1m 30s")),
            ("tenant", long("acme")),
            ("score", AMQPValue::Double(0.5)),
        ]);
        let request = parse_parts(&props, b"body").unwrap();
        assert_eq!((request.destination.as_str(), request.delay_ms, request.strategy), ("orders", 90_000, None));
        let kept = request.properties.headers().clone().unwrap();
        assert_eq!(kept.inner().len(), 2);
        assert_eq!(kept.inner().get("score"), Some(&AMQPValue::Double(0.5)));
        assert_eq!(request.properties.content_type().as_ref().map(|c| c.as_str()), Some("application/json"));
        assert_eq!(request.body, b"body");
    }

    #[test]
    fn whole_milliseconds_and_a_strategy_are_accepted() {
        let props =
            properties(&[(DESTINATION_HEADER, long("d")), (DELAY_HEADER, AMQPValue::LongInt(2500)), (STRATEGY_HEADER, long("precise"))]);
        let request = parse_parts(&props, b"").unwrap();
        assert_eq!((request.delay_ms, request.strategy.as_deref()), (2500, Some("precise")));
    }

    #[test]
    fn each_bad_message_is_refused_with_a_reason_naming_the_header() {
        let cases: Vec<(Vec<(&str, AMQPValue)>, &str)> = vec![
            (vec![(DELAY_HEADER, long("1s"))], "missing header hourglass-destination"),
            (vec![(DESTINATION_HEADER, long("d"))], "missing header hourglass-delay"),
            (vec![(DESTINATION_HEADER, long("")), (DELAY_HEADER, long("1s"))], "hourglass-destination: must be a non-empty"),
            (vec![(DESTINATION_HEADER, long("d")), (DELAY_HEADER, long("soon"))], "hourglass-delay:"),
            (vec![(DESTINATION_HEADER, long("d")), (DELAY_HEADER, AMQPValue::LongInt(-5))], "is negative"),
            (vec![(DESTINATION_HEADER, long("d")), (DELAY_HEADER, AMQPValue::Boolean(true))], "neither a duration"),
            (vec![(DESTINATION_HEADER, long("d")), (DELAY_HEADER, long("1s")), ("hourglass-due-at", long("x"))], "is reserved"),
        ];
        for (headers, want) in cases {
            let err = parse_parts(&properties(&headers), b"").unwrap_err();
            assert!(err.contains(want), "{err:?} should mention {want:?}");
        }
    }
}
