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
//! A message that cannot go on (its planner refuses it, its destination queue
//! is gone, it no longer fits SQS's limits) is moved to the queue's
//! dead-letter queue with the reason in `hourglass-parked-reason`, then
//! deleted; one that failed for a passing reason is left to come back. While a
//! batch is in hand its visibility is extended, so a slow batch is not
//! received again by another pump.
//!
//! The attributes that carry the producer's properties (`content-type`,
//! `hourglass-properties`) are forwarded exactly as received on every cycle
//! and at the hand-over, so the destination gets them as they were sent; the
//! planner does not see them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry, Message, MessageSystemAttributeName, SendMessageBatchRequestEntry,
};

use crate::broker::ExecutorError;
use crate::clock::unix_now_ms;
use crate::command::{Command, FieldValue};
use crate::command::{DueAction, DueMessage};
use crate::metrics::PumpCounters;

use super::consume::{delete_entry, set_aside_entry};
use super::properties::is_property_attribute;
use super::pumped::{PARKED_REASON_ATTRIBUTE, PreparedQueue, PumpSettings};
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
    /// Where messages that cannot go on are parked; without one they are retried.
    dead_letters: Option<String>,
    /// Extended this long again, every half of it, while a batch is in hand.
    visibility: Option<Duration>,
    /// Pause after a receive that brought fewer than ten (see [`PumpSettings::linger`]).
    linger: Duration,
    pub counters: Arc<PumpCounters>,
}

/// What becomes of one received message.
enum Verdict<'c> {
    /// Sent on; bump this counter once deleted.
    Forward(&'c AtomicU64),
    /// Failed for a passing reason: left to come back after its visibility timeout.
    Retry(String),
    /// Can never go on: parked in the dead-letter queue with this reason.
    Park(String),
}

impl Pump {
    pub async fn new(executor: Arc<SqsExecutor>, planner: Box<dyn DueHandler>, queue: &str, wait_seconds: i32) -> Result<Self, ExecutorError> {
        let url =
            executor.url(queue).await?.ok_or_else(|| ExecutorError::Refused(format!("pumped SQS queue {queue:?} does not exist; apply the topology first")))?;
        Ok(Pump {
            executor,
            planner,
            queue: queue.to_string(),
            url,
            wait_seconds,
            dead_letters: None,
            visibility: None,
            linger: Duration::ZERO,
            counters: Arc::default(),
        })
    }

    /// Parks what cannot go on in the prepared dead-letter queue, keeps a
    /// batch in hand invisible to other pumps for `settings.visibility` at a
    /// time, and lingers after a partial receive.
    pub fn prepared(mut self, prepared: &PreparedQueue, settings: &PumpSettings) -> Self {
        self.dead_letters = prepared.dead_letters.clone();
        self.visibility = Some(settings.visibility);
        self.linger = settings.linger;
        self
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
        let messages = self.executor.receive_ten(&self.queue, &self.url, self.wait_seconds).await?;
        if messages.is_empty() {
            self.counters.empty_polls.fetch_add(1, Ordering::Relaxed);
        }
        Ok(messages)
    }

    /// Sends each received message on and deletes it. Never cancelled halfway by `run`.
    async fn process(&mut self, messages: &[Message], interrupt: Interrupt) -> Result<usize, ExecutorError> {
        let mut verdicts: Vec<Verdict> = Vec::with_capacity(messages.len());
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
                    verdicts.push(Verdict::Park(format!("planner {}: {err}", self.planner.label())));
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
                        verdicts.push(Verdict::Park(err.to_string()));
                        break;
                    }
                }
            }
            if verdicts.len() == index + 1 {
                continue;
            }
            if entries.is_empty() && !commands.is_empty() {
                verdicts.push(Verdict::Park(format!("planner {} answered with a command the pump cannot send", self.planner.label())));
                continue;
            }
            for (queue, entry) in entries {
                outgoing.entry(queue).or_default().push(entry);
            }
            verdicts.push(Verdict::Forward(counter));
        }
        // Entry ids start with the message's index: "3-0" is message 3's first send.
        let mut failed_ids: Vec<(String, Verdict)> = Vec::new();
        for (queue, entries) in outgoing {
            let ids: Vec<String> = entries.iter().map(|(entry, _)| entry.id().to_string()).collect();
            match self.executor.send_batches(&queue, entries).await {
                Ok(failed) => failed_ids.extend(failed.into_iter().map(|id| (id, Verdict::Retry("SQS did not accept the onward send".into())))),
                // The target queue is gone: waiting will not bring it back.
                Err(ExecutorError::Refused(reason)) => failed_ids.extend(ids.into_iter().map(|id| (id, Verdict::Park(reason.clone())))),
                Err(err) => {
                    tracing::error!(queue = %queue, error = %err, "onward sends failed; the messages will be retried");
                    failed_ids.extend(ids.into_iter().map(|id| (id, Verdict::Retry(err.to_string()))));
                }
            }
        }
        let mut deletes = Vec::new();
        let mut parked = Vec::new();
        for (index, (message, verdict)) in messages.iter().zip(verdicts).enumerate() {
            let prefix = format!("{index}-");
            let verdict = match (verdict, failed_ids.iter().position(|(id, _)| id.starts_with(&prefix))) {
                (Verdict::Forward(_), Some(at)) => failed_ids.swap_remove(at).1,
                (verdict, _) => verdict,
            };
            match verdict {
                Verdict::Forward(counter) => {
                    counter.fetch_add(1, Ordering::Relaxed);
                    deletes.push(delete_entry(index, message)?);
                }
                Verdict::Park(reason) if self.dead_letters.is_some() => parked.push((index, message, reason)),
                Verdict::Park(reason) | Verdict::Retry(reason) => {
                    // Not deleted: it comes back after its visibility timeout.
                    self.counters.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(queue = %self.queue, error = %reason, "due message not forwarded; it will be retried");
                }
            }
        }
        deletes.extend(self.park(parked).await?);
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

    /// [`Self::process`], with the batch's visibility extended every half
    /// timeout until it is done, so no other pump receives it meanwhile. The
    /// extension runs as a task of its own: a slow planner call holding this
    /// task's thread does not hold it up.
    async fn process_keeping_invisible(&mut self, messages: &[Message]) -> Result<usize, ExecutorError> {
        let Some(visibility) = self.visibility.filter(|_| !messages.is_empty()) else {
            return self.process(messages, Interrupt::None).await;
        };
        let (executor, url, queue) = (self.executor.clone(), self.url.clone(), self.queue.clone());
        let handles: Vec<String> = messages.iter().filter_map(|m| m.receipt_handle().map(str::to_string)).collect();
        let extender = tokio::spawn(async move {
            let every = visibility / 2;
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            loop {
                ticks.tick().await;
                extend_visibility(&executor, &url, &queue, &handles, visibility).await;
            }
        });
        // Let the extender start (and arm its timer) before a planner call can hold this thread.
        tokio::task::yield_now().await;
        let result = self.process(messages, Interrupt::None).await;
        extender.abort();
        result
    }

    /// Moves messages that can never go on to the dead-letter queue, each
    /// with its reason; returns the deletes of those SQS accepted there.
    async fn park(&self, parked: Vec<(usize, &Message, String)>) -> Result<Vec<DeleteMessageBatchRequestEntry>, ExecutorError> {
        let Some(dead_letters) = &self.dead_letters else { return Ok(Vec::new()) };
        if parked.is_empty() {
            return Ok(Vec::new());
        }
        let mut entries = Vec::new();
        for (index, message, reason) in &parked {
            tracing::warn!(queue = %self.queue, %dead_letters, message_id = message.message_id().unwrap_or_default(), %reason, "parking a message that cannot go on");
            let reason = [(PARKED_REASON_ATTRIBUTE.to_string(), reason.clone())];
            entries.push(set_aside_entry(*index, message, &reason, dead_letters.ends_with(".fifo"))?);
        }
        let failed = self.executor.send_batches(dead_letters, entries).await?;
        let mut deletes = Vec::new();
        for (index, message, _) in parked {
            if failed.contains(&index.to_string()) {
                self.counters.failed.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            self.counters.parked.fetch_add(1, Ordering::Relaxed);
            deletes.push(delete_entry(index, message)?);
        }
        Ok(deletes)
    }

    /// Pumps until `shutdown` turns true, finishing the batch in hand.
    pub async fn run(mut self, mut shutdown: tokio::sync::watch::Receiver<bool>) -> Result<(), ExecutorError> {
        while !*shutdown.borrow() {
            let received = tokio::select! {
                received = self.receive() => received,
                _ = shutdown.changed() => break,
            };
            let pause = match async { self.process_keeping_invisible(&received?).await }.await {
                // The queue is drained for now: let the next batch gather.
                Ok(count) if (1..10).contains(&count) => self.linger,
                Ok(_) => Duration::ZERO,
                Err(err) => {
                    tracing::warn!(queue = %self.queue, error = %err, "pump cycle failed; retrying");
                    Duration::from_secs(1)
                }
            };
            if !pause.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = shutdown.changed() => {}
                }
            }
        }
        Ok(())
    }
}

/// Keeps a batch in hand invisible for another `visibility`; a failure only
/// means another pump may see a message twice (deduplicated per cycle).
async fn extend_visibility(executor: &SqsExecutor, url: &str, queue: &str, receipt_handles: &[String], visibility: Duration) {
    let entries: Vec<_> = receipt_handles
        .iter()
        .enumerate()
        .filter_map(|(index, handle)| {
            ChangeMessageVisibilityBatchRequestEntry::builder()
                .id(index.to_string())
                .receipt_handle(handle)
                .visibility_timeout(visibility.as_secs().max(1) as i32)
                .build()
                .ok()
        })
        .collect();
    count(&executor.requests.change_message_visibility_batch);
    match executor.client().change_message_visibility_batch().queue_url(url).set_entries(Some(entries)).send().await {
        Ok(output) if output.failed().is_empty() => {}
        Ok(output) => {
            let failed: Vec<String> = output.failed().iter().map(|f| format!("{}: {}", f.code(), f.message().unwrap_or_default())).collect();
            tracing::warn!(%queue, ?failed, "could not extend the visibility of some messages still in hand");
        }
        Err(err) => tracing::warn!(%queue, error = %err, "could not extend the visibility of a batch still in hand"),
    }
}
