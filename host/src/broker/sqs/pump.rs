//! The cycle pump: receives up to ten messages that became visible on a
//! pumped SQS queue, asks the strategy's planner what to do with each (send
//! around again, or hand over to the destination), sends them on in batches
//! per target queue, then deletes them in one batch.
//!
//! A message is deleted only after its onward send succeeded, and always with
//! the receipt handle of the queue it came from; a failed delete is retried
//! there. A pump killed between send and delete leaves the message to come back
//! after its visibility timeout: it is delivered, possibly twice, never lost.
//! Several pumps may share a queue: the FIFO deduplication id of each cycle
//! (message and cycle) absorbs a double send within five minutes.
//!
//! The attributes that carry the producer's properties (`content-type`,
//! `hourglass-properties`) are forwarded exactly as received on every cycle
//! and at the hand-over, so the destination gets them as they were sent; the
//! planner does not see them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, Message, MessageSystemAttributeName, SendMessageBatchRequestEntry};

use crate::broker::ExecutorError;
use crate::clock::unix_now_ms;
use crate::command::{Command, FieldValue};
use crate::command::{DueAction, DueMessage};
use crate::metrics::PumpCounters;

use super::properties::is_property_attribute;
use super::send::{PropertyAttributes, SqsExecutor, count};

/// Where a pump stops in the middle, for fault-injection tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interrupt {
    None,
    /// Sent onward, then died before deleting.
    AfterSendBeforeDelete,
}

/// Decides what happens to a due message: the strategy's planner, as the pump sees it.
pub trait DueHandler: Send + Sync {
    /// Who decides, for error messages.
    fn label(&self) -> &str;
    fn handle_due(&mut self, message: &DueMessage) -> Result<DueAction, String>;
}

pub struct Pump {
    executor: Arc<SqsExecutor>,
    planner: Box<dyn DueHandler>,
    queue: String,
    url: String,
    wait_seconds: i32,
    pub counters: Arc<PumpCounters>,
}

impl Pump {
    pub async fn new(executor: Arc<SqsExecutor>, planner: Box<dyn DueHandler>, queue: &str, wait_seconds: i32) -> Result<Self, ExecutorError> {
        let url =
            executor.url(queue).await?.ok_or_else(|| ExecutorError::Refused(format!("pumped SQS queue {queue:?} does not exist; apply the topology first")))?;
        Ok(Pump { executor, planner, queue: queue.to_string(), url, wait_seconds, counters: Arc::default() })
    }

    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// One receive (long poll) and everything it brought. Returns how many messages came.
    pub async fn pump_once(&mut self, interrupt: Interrupt) -> Result<usize, ExecutorError> {
        let received = self.receive().await?;
        self.process(&received, interrupt).await
    }

    /// A long poll for up to ten messages. Dropping it mid-poll is safe: a
    /// message it had taken comes back after its visibility timeout.
    async fn receive(&self) -> Result<Vec<Message>, ExecutorError> {
        count(&self.executor.requests.receive_message);
        let received = self
            .executor
            .client()
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(10)
            .wait_time_seconds(self.wait_seconds)
            .message_attribute_names("All")
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .send()
            .await
            .map_err(|e| ExecutorError::Unavailable(format!("SQS ReceiveMessage on {}: {e}", self.queue)))?;
        Ok(received.messages.unwrap_or_default())
    }

    /// Sends each received message on and deletes it. Never cancelled halfway by `run`.
    async fn process(&mut self, messages: &[Message], interrupt: Interrupt) -> Result<usize, ExecutorError> {
        // Per message: the counter its action bumps, or why it cannot go on.
        let mut verdicts: Vec<Result<&AtomicU64, String>> = Vec::with_capacity(messages.len());
        // Onward sends, grouped by target queue so they go out in batches.
        let mut outgoing: BTreeMap<String, Vec<(SendMessageBatchRequestEntry, usize)>> = BTreeMap::new();
        for (index, message) in messages.iter().enumerate() {
            self.counters.received.fetch_add(1, Ordering::Relaxed);
            let system = message.attributes();
            let stamp = |name: MessageSystemAttributeName| -> u64 { system.and_then(|a| a.get(&name)).and_then(|v| v.parse().ok()).unwrap_or(0) };
            let receive_count = stamp(MessageSystemAttributeName::ApproximateReceiveCount) as u32;
            if receive_count > 1 {
                self.counters.redelivered.fetch_add(1, Ordering::Relaxed);
            }
            let mut base: BTreeMap<String, FieldValue> = BTreeMap::new();
            let mut attributes = Vec::new();
            // The producer's properties ride along unchanged, unseen by the planner.
            let mut properties = PropertyAttributes::new();
            for (name, value) in message.message_attributes().into_iter().flatten() {
                if is_property_attribute(name) {
                    properties.insert(name.clone(), value.clone());
                    continue;
                }
                let text = value.string_value().unwrap_or_default().to_string();
                let field = match (value.data_type(), text.parse::<i64>()) {
                    ("Number", Ok(n)) => FieldValue::Int(n),
                    _ => FieldValue::Text(text.clone()),
                };
                base.insert(name.clone(), field);
                attributes.push((name.clone(), text));
            }
            let due = DueMessage {
                queue: self.queue.clone(),
                message_id: message.message_id().unwrap_or_default().to_string(),
                attributes,
                sent_timestamp_ms: stamp(MessageSystemAttributeName::SentTimestamp),
                first_receive_timestamp_ms: stamp(MessageSystemAttributeName::ApproximateFirstReceiveTimestamp),
                receive_count,
                host_now_ms: unix_now_ms(),
            };
            let (commands, counter) = match self.planner.handle_due(&due) {
                Ok(DueAction::Recycle(commands)) => (commands, &self.counters.recycled),
                Ok(DueAction::HandOver(commands)) => (commands, &self.counters.handed_over),
                Err(err) => {
                    verdicts.push(Err(err.to_string()));
                    continue;
                }
            };
            let body = message.body().unwrap_or_default();
            let mut entries = Vec::new();
            for (n, command) in commands.iter().enumerate() {
                // The planner's attributes win over the message's own.
                let mut carried = base.clone();
                if let Command::SqsSend { attributes, .. } = command {
                    carried.retain(|key, _| !attributes.contains_key(key));
                }
                let Command::SqsSend { queue, .. } = command else {
                    entries.clear();
                    break;
                };
                match self.executor.batch_entry(&format!("{index}-{n}"), command, body, &carried, &properties) {
                    Ok(entry) => entries.push((queue.clone(), entry)),
                    Err(err) => {
                        entries.clear();
                        verdicts.push(Err(err.to_string()));
                        break;
                    }
                }
            }
            if verdicts.len() == index + 1 {
                continue;
            }
            if entries.is_empty() && !commands.is_empty() {
                verdicts.push(Err(format!("planner {} answered with a command the pump cannot send", self.planner.label())));
                continue;
            }
            for (queue, entry) in entries {
                outgoing.entry(queue).or_default().push(entry);
            }
            verdicts.push(Ok(counter));
        }
        let mut failed_ids = Vec::new();
        for (queue, entries) in outgoing {
            let ids: Vec<String> = entries.iter().map(|(entry, _)| entry.id().to_string()).collect();
            match self.executor.send_batches(&queue, entries).await {
                Ok(failed) => failed_ids.extend(failed),
                Err(err) => {
                    tracing::error!(queue = %queue, error = %err, "onward sends failed; the messages will be retried");
                    failed_ids.extend(ids);
                }
            }
        }
        let mut deletes = Vec::new();
        for (index, (message, verdict)) in messages.iter().zip(verdicts).enumerate() {
            let prefix = format!("{index}-");
            let verdict = verdict.and_then(|counter| {
                if failed_ids.iter().any(|id| id.starts_with(&prefix)) { Err("SQS did not accept the onward send".into()) } else { Ok(counter) }
            });
            match verdict {
                Ok(counter) => {
                    counter.fetch_add(1, Ordering::Relaxed);
                    deletes.push(
                        DeleteMessageBatchRequestEntry::builder()
                            .id(index.to_string())
                            .receipt_handle(message.receipt_handle().unwrap_or_default())
                            .build()
                            .map_err(|e| ExecutorError::Refused(e.to_string()))?,
                    );
                }
                Err(err) => {
                    // Not deleted: it comes back after its visibility timeout.
                    self.counters.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(queue = %self.queue, error = %err, "due message not forwarded; it will be retried");
                }
            }
        }
        if interrupt == Interrupt::AfterSendBeforeDelete {
            return Ok(messages.len());
        }
        self.delete(deletes).await?;
        Ok(messages.len())
    }

    /// Deletes against the queue the messages came from; failed entries are retried once there.
    async fn delete(&self, entries: Vec<DeleteMessageBatchRequestEntry>) -> Result<(), ExecutorError> {
        let mut pending = entries;
        for attempt in 0..2 {
            if pending.is_empty() {
                return Ok(());
            }
            count(&self.executor.requests.delete_message_batch);
            let output = self
                .executor
                .client()
                .delete_message_batch()
                .queue_url(&self.url)
                .set_entries(Some(pending.clone()))
                .send()
                .await
                .map_err(|e| ExecutorError::Unavailable(format!("SQS DeleteMessageBatch on {}: {e}", self.queue)))?;
            let failed: Vec<&str> = output.failed().iter().map(|f| f.id()).collect();
            pending.retain(|e| failed.contains(&e.id()));
            if attempt == 1 && !pending.is_empty() {
                tracing::warn!(queue = %self.queue, count = pending.len(), "deletes failed twice; those messages will come back and be deduplicated");
            }
        }
        Ok(())
    }

    /// Pumps until `shutdown` turns true, finishing the batch in hand.
    pub async fn run(mut self, mut shutdown: tokio::sync::watch::Receiver<bool>) -> Result<(), ExecutorError> {
        while !*shutdown.borrow() {
            let received = tokio::select! {
                received = self.receive() => received,
                _ = shutdown.changed() => break,
            };
            if let Err(err) = async { self.process(&received?, Interrupt::None).await }.await {
                tracing::warn!(queue = %self.queue, error = %err, "pump cycle failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                    _ = shutdown.changed() => {}
                }
            }
        }
        Ok(())
    }
}
