//! An SQS queue consumer under the same [`Handler`] as the AMQP one: the
//! loop under the SQS ingress queue.
//!
//! It long-polls for up to ten messages, turns each into a neutral
//! [`Delivery`] (the attributes that carry properties become properties,
//! every other attribute a header: `Number` as a number, the rest as text),
//! hands them to the handler together and carries out each [`Outcome`]:
//! `Ack` deletes; `Requeue` makes the message visible again after a short
//! pause; `MoveTo` sends it as it came, plus the outcome's headers as
//! attributes, to the named queue and deletes it only once SQS took that
//! send. Nothing is deleted before its forward or move succeeded, so a host
//! killed meanwhile leaves the message to come back after its visibility
//! timeout: forwarded twice, never lost.
//!
//! A handler that panics leaves the message on its queue; once it has been
//! received [`MAX_PANICS`] times and the handler panicked again, it is moved
//! where [`Handler::poisoned`] says, so it never blocks the queue.

use std::collections::{BTreeMap, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry, Message, MessageAttributeValue, MessageSystemAttributeName,
    SendMessageBatchRequestEntry,
};
use futures_util::FutureExt;
use tokio::sync::watch;

use super::properties::{from_attributes, is_property_attribute};
use super::send::{SqsExecutor, count, message_size, unavailable};
use crate::command::{BrokerFamily, Command, SQS_MAX_MESSAGE_ATTRIBUTES, SqsCommand};
use crate::executor::ExecutorError;
use crate::message::{Delivery, Handler, HeaderValue, Outcome, Properties, Settled};
use crate::stop::{pause_unless_stopped, unless_stopped};

/// A message the handler panicked on this many receives is moved aside.
pub const MAX_PANICS: u32 = 3;
/// How long a requeued message stays invisible (whole seconds, as SQS counts).
const REQUEUE_PAUSE_SECONDS: i32 = 1;
const RETRY_PAUSE: Duration = Duration::from_secs(1);

pub(crate) struct SqsConsumer<H> {
    executor: Arc<SqsExecutor>,
    handler: Arc<H>,
    wait_seconds: i32,
    consuming: AtomicBool,
}

impl<H: Handler> SqsConsumer<H> {
    pub fn new(executor: Arc<SqsExecutor>, handler: Arc<H>, wait_seconds: i32) -> Arc<SqsConsumer<H>> {
        Arc::new(SqsConsumer { executor, handler, wait_seconds, consuming: AtomicBool::new(false) })
    }

    /// Whether the last receive reached the queue.
    pub fn is_consuming(&self) -> bool {
        self.consuming.load(Ordering::Relaxed)
    }

    /// Creates the queues the handler names (as standard queues) where missing.
    pub async fn declare(&self) -> Result<(), ExecutorError> {
        for command in self.handler.declarations() {
            let Command::Sqs(SqsCommand::EnsureQueue { name, .. }) = &command else {
                return Err(ExecutorError::other_family(&command, BrokerFamily::Sqs));
            };
            if self.executor.url(name).await?.is_none() {
                count(&self.executor.requests.create_queue);
                self.executor.client().create_queue().queue_name(name).send().await.map_err(|e| unavailable(format!("CreateQueue {name}"), e))?;
            }
        }
        Ok(())
    }

    /// Consumes until `stop` turns true, finishing the messages in hand.
    pub async fn run(&self, mut stop: watch::Receiver<bool>) {
        let queue = self.handler.queue().to_string();
        while !*stop.borrow() {
            let Some(received) = unless_stopped(&mut stop, self.receive(&queue)).await else { break };
            match received {
                Ok((url, messages)) => {
                    if let Err(err) = self.process(&queue, &url, messages).await {
                        tracing::warn!(%queue, error = %err, "settling consumed messages failed; they come back after their visibility timeout");
                    }
                }
                Err(err) => {
                    self.consuming.store(false, Ordering::Relaxed);
                    tracing::warn!(%queue, error = %err, "receiving failed; retrying");
                    if !pause_unless_stopped(&mut stop, RETRY_PAUSE).await {
                        break;
                    }
                }
            }
        }
        self.consuming.store(false, Ordering::Relaxed);
    }

    async fn receive(&self, queue: &str) -> Result<(String, Vec<Message>), ExecutorError> {
        let url = self.executor.url(queue).await?.ok_or_else(|| ExecutorError::Refused(format!("SQS queue {queue:?} does not exist")))?;
        // Up once the queue is there: a long poll on an empty queue must not read as down.
        self.consuming.store(true, Ordering::Relaxed);
        let messages = self.executor.receive_ten(queue, &url, self.wait_seconds).await?;
        Ok((url, messages))
    }

    /// Handles the messages together, then carries out every outcome.
    async fn process(&self, queue: &str, url: &str, messages: Vec<Message>) -> Result<(), ExecutorError> {
        let decided = futures_util::future::join_all(messages.iter().map(|message| self.decide(queue, message))).await;
        let mut deletes = Vec::new();
        let mut requeues = Vec::new();
        let mut moves: BTreeMap<String, Vec<(SendMessageBatchRequestEntry, usize)>> = BTreeMap::new();
        for (index, (message, (outcome, _))) in messages.iter().zip(&decided).enumerate() {
            let handle = message.receipt_handle().unwrap_or_default();
            match outcome {
                Outcome::Ack => deletes.push(delete_entry(index, message)?),
                Outcome::Requeue | Outcome::Retry => requeues.push(requeue_entry(index, handle)?),
                Outcome::MoveTo { queue: to, headers, reason } => {
                    tracing::warn!(from = %queue, %to, %reason, "setting a message aside");
                    let extra: Vec<(String, String)> =
                        headers.iter().map(|(name, value)| (name.clone(), value.as_text().unwrap_or_else(|| format!("{value:?}")))).collect();
                    moves.entry(to.clone()).or_default().push(set_aside_entry(index, message, &extra, to.ends_with(".fifo"))?);
                }
            }
        }
        let mut move_failed: HashMap<String, String> = HashMap::new();
        for (to, entries) in moves {
            let failed = self.executor.send_batches(&to, entries).await;
            move_failed.extend(failed.into_iter().map(|(id, err)| (id, format!("SQS did not take the move to {to}: {err}"))));
        }
        for (index, message) in messages.iter().enumerate() {
            if matches!(decided[index].0, Outcome::MoveTo { .. }) && !move_failed.contains_key(&index.to_string()) {
                deletes.push(delete_entry(index, message)?);
            }
        }
        let unacked = self.delete(url, queue, deletes).await;
        self.requeue(url, queue, requeues).await;
        for (index, (outcome, note)) in decided.into_iter().enumerate() {
            let id = index.to_string();
            let settled = match (&outcome, move_failed.get(&id)) {
                (Outcome::Requeue | Outcome::Retry, _) => Settled::Requeued,
                (_, Some(reason)) => Settled::MoveFailed(reason.clone()),
                _ if unacked.contains(&id) => Settled::AckLost,
                _ => Settled::Acked,
            };
            self.handler.settled(note, &outcome, &settled);
        }
        Ok(())
    }

    /// One message's outcome, and the handler's note (none when it panicked).
    async fn decide(&self, queue: &str, message: &Message) -> (Outcome, Option<H::Note>) {
        let receives: u32 =
            message.attributes().and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount)).and_then(|v| v.parse().ok()).unwrap_or(1);
        let no_attributes = HashMap::new();
        let attributes = message.message_attributes().unwrap_or(&no_attributes);
        let (delivery, unreadable) = to_delivery(queue, message.body().unwrap_or_default(), attributes, receives);
        if let Some(reason) = unreadable {
            return (self.handler.poisoned(&delivery, &reason), None);
        }
        match AssertUnwindSafe(self.handler.handle(&delivery)).catch_unwind().await {
            Ok((outcome, note)) => (outcome, Some(note)),
            Err(_) if receives >= MAX_PANICS => {
                let reason = format!("the handler panicked on this message {receives} times");
                (self.handler.poisoned(&delivery, &reason), None)
            }
            Err(_) => (Outcome::Requeue, None),
        }
    }

    /// Deletes; returns the entry ids SQS did not delete (they come back).
    async fn delete(&self, url: &str, queue: &str, entries: Vec<DeleteMessageBatchRequestEntry>) -> Vec<String> {
        if entries.is_empty() {
            return Vec::new();
        }
        let ids: Vec<String> = entries.iter().map(|e| e.id().to_string()).collect();
        count(&self.executor.requests.delete_message_batch);
        match self.executor.client().delete_message_batch().queue_url(url).set_entries(Some(entries)).send().await {
            Ok(output) => output.failed().iter().map(|f| f.id().to_string()).collect(),
            Err(err) => {
                tracing::warn!(%queue, error = %err, "deleting handled messages failed; they will be handled again");
                ids
            }
        }
    }

    async fn requeue(&self, url: &str, queue: &str, entries: Vec<ChangeMessageVisibilityBatchRequestEntry>) {
        if entries.is_empty() {
            return;
        }
        count(&self.executor.requests.change_message_visibility_batch);
        if let Err(err) = self.executor.client().change_message_visibility_batch().queue_url(url).set_entries(Some(entries)).send().await {
            tracing::warn!(%queue, error = %err, "could not make requeued messages visible early; they come back after their visibility timeout");
        }
    }
}

/// A message, by its body and attributes, as a neutral delivery; and why its
/// property attributes could not be read (the delivery then comes without them).
pub(super) fn to_delivery(queue: &str, body: &str, attributes: &HashMap<String, MessageAttributeValue>, receives: u32) -> (Delivery, Option<String>) {
    let mut delivery = Delivery {
        queue: queue.to_string(),
        body: body.as_bytes().to_vec(),
        properties: Properties::default(),
        exchange: String::new(),
        routing_key: String::new(),
        redelivered: receives > 1,
    };
    let properties = from_attributes(attributes);
    for (name, value) in attributes {
        if is_property_attribute(name) {
            continue;
        }
        let text = value.string_value().unwrap_or_default();
        let header = match (value.data_type().split('.').next(), text.parse::<i64>()) {
            (Some("Number"), Ok(number)) => HeaderValue::I64(number),
            (Some("Binary"), _) => HeaderValue::Bytes(value.binary_value().map(|b| b.as_ref().to_vec()).unwrap_or_default()),
            _ => HeaderValue::text(text),
        };
        delivery.properties.headers.insert(name.clone(), header);
    }
    match properties {
        Ok(mut properties) => {
            properties.headers.extend(std::mem::take(&mut delivery.properties.headers));
            delivery.properties = properties;
            (delivery, None)
        }
        Err(reason) => (delivery, Some(format!("attribute hourglass-properties: {reason}"))),
    }
}

/// A delete of the `index`th received message, by its receipt handle.
pub(crate) fn delete_entry(index: usize, message: &Message) -> Result<DeleteMessageBatchRequestEntry, ExecutorError> {
    DeleteMessageBatchRequestEntry::builder()
        .id(index.to_string())
        .receipt_handle(message.receipt_handle().unwrap_or_default())
        .build()
        .map_err(|e| ExecutorError::Refused(e.to_string()))
}

fn requeue_entry(index: usize, handle: &str) -> Result<ChangeMessageVisibilityBatchRequestEntry, ExecutorError> {
    ChangeMessageVisibilityBatchRequestEntry::builder()
        .id(index.to_string())
        .receipt_handle(handle)
        .visibility_timeout(REQUEUE_PAUSE_SECONDS)
        .build()
        .map_err(|e| ExecutorError::Refused(e.to_string()))
}

/// The message as it came, plus `extra` text attributes where SQS's ten leave
/// room (a reason is worth more than nothing, but never an attribute the
/// message came with). FIFO targets get the message's group and a
/// deduplication id of its own.
pub(super) fn set_aside_entry(
    index: usize,
    message: &Message,
    extra: &[(String, String)],
    fifo: bool,
) -> Result<(SendMessageBatchRequestEntry, usize), ExecutorError> {
    let message_id = message.message_id().unwrap_or_default();
    let group = message.attributes().and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId)).map_or(message_id, String::as_str);
    let attributes = message.message_attributes().cloned().unwrap_or_default();
    let set_aside = SetAside { id: index.to_string(), message_id, group, body: message.body().unwrap_or_default(), attributes };
    set_aside.entry(extra, fifo)
}

/// A message to move aside, by its parts: one received, or one out of a bundle.
pub(super) struct SetAside<'m> {
    /// The batch entry's id.
    pub id: String,
    pub message_id: &'m str,
    pub group: &'m str,
    pub body: &'m str,
    pub attributes: HashMap<String, MessageAttributeValue>,
}

impl SetAside<'_> {
    /// See [`set_aside_entry`].
    pub fn entry(self, extra: &[(String, String)], fifo: bool) -> Result<(SendMessageBatchRequestEntry, usize), ExecutorError> {
        let mut attributes = self.attributes;
        for (name, text) in extra {
            if attributes.len() >= SQS_MAX_MESSAGE_ATTRIBUTES {
                tracing::warn!(attribute = %name, "the message set aside already has ten attributes; this one is left off");
                continue;
            }
            // Reasons quote planner and broker errors: keep them short.
            let text: String = text.chars().take(1_000).collect();
            let value = MessageAttributeValue::builder().data_type("String").string_value(text).build().map_err(|e| ExecutorError::Refused(e.to_string()))?;
            attributes.insert(name.clone(), value);
        }
        let size = message_size(self.body, &attributes);
        let mut entry = SendMessageBatchRequestEntry::builder().id(self.id).message_body(self.body).set_message_attributes(Some(attributes));
        if fifo {
            entry = entry.message_group_id(self.group).message_deduplication_id(format!("{}-set-aside", self.message_id));
        }
        let entry = entry.build().map_err(|e| ExecutorError::Refused(format!("batch entry: {e}")))?;
        Ok((entry, size))
    }
}
