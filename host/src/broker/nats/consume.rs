//! A JetStream consumer under the same [`Handler`] as the AMQP and SQS ones:
//! the loop under the NATS ingress subject.
//!
//! Each queue a handler declares is a subject here, captured by a stream of
//! its own (`BrokerConfig::own_queue_declaration`): the handler's own queue by a work queue (a
//! message is gone once acknowledged), the others (the invalid-messages
//! subject) by a stream that keeps what it takes for people to look at. The
//! consumer pulls from one durable consumer that every host shares, turns each
//! message into a neutral [`Delivery`] (the property headers
//! [`super::convert`] writes become properties again, hourglass's own headers
//! holding a whole number (due times, delays in ms) whole numbers, every other
//! header a text header) and carries out each [`Outcome`]: `Ack` acknowledges;
//! `Requeue` and `Retry` decline it for a second; `MoveTo` publishes it as it
//! came, plus the outcome's headers, to the named subject and acknowledges it
//! only once the stream acknowledged that publish. A host killed meanwhile
//! leaves the message to be delivered again after the ack wait: forwarded
//! twice, never lost.
//!
//! A handler that panics on a message [`MAX_PANICS`] deliveries running has it
//! moved where [`Handler::poisoned`] says, so it never blocks the subject.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use async_nats::jetstream::{AckKind, Message};
use futures_util::{FutureExt, StreamExt};
use tokio::sync::watch;

use super::NatsExecutor;
use super::convert;
use crate::command::{BrokerFamily, Command, NatsCommand};
use crate::executor::ExecutorError;
use crate::headers::is_reserved;
use crate::message::{Delivery, Handler, HeaderValue, Outcome, Properties, Settled};

/// A message the handler panicked on this many deliveries is moved aside.
pub const MAX_PANICS: i64 = 3;
/// The durable consumer every host of a handler's subject pulls from.
const CONSUMER: &str = "hourglass";
/// How long a declined message waits before it is delivered again.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// How long a delivery may go unanswered before the server gives it to another host.
const ACK_WAIT: Duration = Duration::from_secs(30);

pub(crate) struct NatsConsumer<H> {
    executor: Arc<NatsExecutor>,
    handler: Arc<H>,
    consuming: AtomicBool,
}

impl<H: Handler> NatsConsumer<H> {
    pub fn new(executor: Arc<NatsExecutor>, handler: Arc<H>) -> Arc<NatsConsumer<H>> {
        Arc::new(NatsConsumer { executor, handler, consuming: AtomicBool::new(false) })
    }

    /// Pulling from the handler's subject now.
    pub fn is_consuming(&self) -> bool {
        self.consuming.load(Ordering::Relaxed)
    }

    /// Creates the streams the handler declares, where missing: the one
    /// capturing its own subject as a work queue.
    pub async fn declare(&self) -> Result<(), ExecutorError> {
        for command in self.handler.declarations() {
            let Command::Nats(NatsCommand::EnsureStream { name, subjects, .. }) = &command else {
                return Err(ExecutorError::other_family(&command, BrokerFamily::Nats));
            };
            let work_queue = subjects.iter().any(|subject| subject == self.handler.queue());
            self.executor.ensure_stream(name, subjects, work_queue).await?;
        }
        Ok(())
    }

    /// Consumes until `stop` turns true.
    pub async fn run(&self, mut stop: watch::Receiver<bool>) {
        let pulled = tokio::select! {
            pulled = self.pull() => pulled,
            _ = stop.wait_for(|stopped| *stopped) => Ok(()),
        };
        self.consuming.store(false, Ordering::Relaxed);
        if let Err(e) = pulled {
            tracing::warn!(subject = self.handler.queue(), error = %e, "consuming stopped");
        }
    }

    async fn pull(&self) -> Result<(), ExecutorError> {
        let subject = self.handler.queue();
        let unavailable = |e: &dyn std::fmt::Display| ExecutorError::Unavailable(format!("subject {subject}: {e}"));
        // The stream the handler declares for its subject, by name: never another stream
        // that happens to capture it (one of the user's, when hourglass does not declare).
        let declared = self.handler.declarations().into_iter().find_map(|command| match command {
            Command::Nats(NatsCommand::EnsureStream { name, subjects, .. }) if subjects.iter().any(|s| s == subject) => Some(name),
            _ => None,
        });
        let name = declared.ok_or_else(|| unavailable(&"the handler declares no stream capturing it"))?;
        let stream = self.executor.jetstream().get_stream(name).await.map_err(|e| unavailable(&e))?;
        let config = pull::Config {
            durable_name: Some(CONSUMER.to_string()),
            filter_subject: subject.to_string(),
            deliver_policy: DeliverPolicy::All,
            ack_policy: AckPolicy::Explicit,
            ack_wait: ACK_WAIT,
            max_ack_pending: i64::from(self.handler.prefetch().max(1)),
            max_deliver: -1,
            ..Default::default()
        };
        let consumer = stream.get_or_create_consumer(CONSUMER, config).await.map_err(|e| unavailable(&e))?;
        let messages = consumer.messages().await.map_err(|e| unavailable(&e))?;
        self.consuming.store(true, Ordering::Relaxed);
        // Up to prefetch deliveries in hand at once, as the AMQP consumer's prefetch allows.
        let mut failure = None;
        messages
            .take_while(|next| {
                let broken = next.as_ref().err().map(|e| unavailable(e));
                let go_on = broken.is_none();
                failure = failure.take().or(broken);
                async move { go_on }
            })
            .for_each_concurrent(usize::from(self.handler.prefetch().max(1)), |next| async move {
                if let Ok(message) = next {
                    self.handle(message).await;
                }
            })
            .await;
        Err(failure.unwrap_or_else(|| unavailable(&"the consumer's message stream ended")))
    }

    async fn handle(&self, message: Message) {
        let delivered = message.info().map(|info| info.delivered).unwrap_or(1);
        let delivery = delivery(self.handler.queue(), &message, delivered > 1);
        let (outcome, note) = match AssertUnwindSafe(self.handler.handle(&delivery)).catch_unwind().await {
            Ok((outcome, note)) => (outcome, Some(note)),
            Err(_) if delivered >= MAX_PANICS => {
                let reason = format!("the handler panicked on this message {delivered} times");
                (self.handler.poisoned(&delivery, &reason), None)
            }
            Err(_) => (Outcome::Requeue, None),
        };
        let settled = self.settle(&message, &outcome).await;
        self.handler.settled(note, &outcome, &settled);
    }

    async fn settle(&self, message: &Message, outcome: &Outcome) -> Settled {
        let answer = match outcome {
            Outcome::Ack => AckKind::Ack,
            Outcome::Requeue | Outcome::Retry => AckKind::Nak(Some(RETRY_AFTER)),
            Outcome::MoveTo { queue, headers, reason } => {
                let mut moved = message.headers.clone().unwrap_or_default();
                let added: Result<(), ExecutorError> = headers.iter().try_for_each(|(name, value)| convert::put_typed(&mut moved, name, value));
                let published = match added {
                    Ok(()) => self.executor.publish(queue, moved, message.payload.clone()).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = published {
                    tracing::warn!(subject = %queue, %reason, error = %e, "moving a message failed; it is delivered again");
                    let _ = message.ack_with(AckKind::Nak(Some(RETRY_AFTER))).await;
                    return Settled::MoveFailed(e.to_string());
                }
                AckKind::Ack
            }
        };
        let requeued = matches!(answer, AckKind::Nak(_));
        match message.ack_with(answer).await {
            Ok(()) if requeued => Settled::Requeued,
            Ok(()) => Settled::Acked,
            Err(_) if requeued => Settled::Requeued,
            Err(_) => Settled::AckLost,
        }
    }
}

/// A NATS message as a handler sees it.
fn delivery(subject: &str, message: &Message, redelivered: bool) -> Delivery {
    let empty = HeaderMap::new();
    let headers = message.headers.as_ref().unwrap_or(&empty);
    let mut properties = Properties::default();
    for (name, values) in headers.iter() {
        let (name, value) = (name.to_string(), values.first().map(|v| v.as_str().to_string()).unwrap_or_default());
        if convert::set_property(&mut properties, &name, &value) {
            continue;
        }
        // hourglass's own headers carry whole numbers (due times, delays in ms) as text on NATS: typed again here.
        let typed = match value.parse::<i64>() {
            Ok(number) if is_reserved(&name) => HeaderValue::I64(number),
            _ => HeaderValue::text(&value),
        };
        properties.headers.insert(name, typed);
    }
    Delivery {
        queue: subject.to_string(),
        body: message.payload.to_vec(),
        properties,
        exchange: String::new(),
        routing_key: message.subject.to_string(),
        redelivered,
    }
}
