//! An SQS release queue's receiver. A `cancellable = true` strategy ends
//! every delay in its standard release queue (the last leg there with
//! `DelaySeconds`, as it would go to the destination); what a receive brings
//! is due. Each message goes into the fates queue as its claim, with its body
//! and attributes as they are, and is then deleted here: the fates queue
//! decides whether it goes on ([`super::fates`]).
//!
//! A host killed between the claim and the delete leaves the message to come
//! back and be claimed again under the same deduplication id (its SQS
//! message id), which the fates queue absorbs within SQS's five minutes; a
//! later copy is a duplicate claim, forwarded at most again, never lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aws_sdk_sqs::types::Message;
use tokio::sync::watch;

use super::consume::delete_entry;
use super::fates_queue::{FatesError, FatesQueue};
use super::send::{SqsExecutor, count};
use crate::executor::ExecutorError;
use crate::headers::ID_HEADER;
use crate::stop::{pause_unless_stopped, unless_stopped};

const RETRY_PAUSE: Duration = Duration::from_secs(1);

pub(crate) struct SqsRelease {
    executor: Arc<SqsExecutor>,
    strategy: String,
    queue: String,
    fates: Arc<FatesQueue>,
    wait_seconds: i32,
    receiving: AtomicBool,
}

impl SqsRelease {
    pub fn new(executor: Arc<SqsExecutor>, strategy: &str, queue: &str, fates: Arc<FatesQueue>, wait_seconds: i32) -> Arc<SqsRelease> {
        Arc::new(SqsRelease { executor, strategy: strategy.to_string(), queue: queue.to_string(), fates, wait_seconds, receiving: AtomicBool::new(false) })
    }

    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// Whether the last receive reached the queue.
    pub(crate) fn is_receiving(&self) -> bool {
        self.receiving.load(Ordering::Relaxed)
    }

    /// Receives until `stop` turns true, finishing the messages in hand.
    pub async fn run(&self, mut stop: watch::Receiver<bool>) {
        while !*stop.borrow() {
            let Some(once) = unless_stopped(&mut stop, self.once()).await else { break };
            if let Err(err) = once {
                self.receiving.store(false, Ordering::Relaxed);
                tracing::warn!(queue = %self.queue, error = %err, "the release queue's receive failed; retrying");
                if !pause_unless_stopped(&mut stop, RETRY_PAUSE).await {
                    break;
                }
            }
        }
        self.receiving.store(false, Ordering::Relaxed);
    }

    /// One receive; every message claimed, and deleted once its claim is sent.
    pub async fn once(&self) -> Result<usize, FatesError> {
        let url = self.executor.url(&self.queue).await?.ok_or_else(|| ExecutorError::Refused(format!("SQS queue {:?} does not exist", self.queue)))?;
        // Up once the queue is there: a long poll on an empty queue must not read as down.
        self.receiving.store(true, Ordering::Relaxed);
        let messages = self.executor.receive_ten(&self.queue, &url, self.wait_seconds).await?;
        let mut deletes = Vec::new();
        for (index, message) in messages.iter().enumerate() {
            match self.claim(message).await {
                Ok(()) => deletes.push(delete_entry(index, message)?),
                // Left in place: it comes back after its visibility timeout and is claimed then.
                Err(err) => tracing::warn!(queue = %self.queue, error = %err, "could not claim a due message; it comes back to be claimed again"),
            }
        }
        let claimed = deletes.len();
        if !deletes.is_empty() {
            count(&self.executor.requests.delete_message_batch);
            // A failed delete only brings the message back: its second claim is deduplicated or forwarded again.
            if let Err(err) = self.executor.client().delete_message_batch().queue_url(&url).set_entries(Some(deletes)).send().await {
                tracing::warn!(queue = %self.queue, error = %err, "could not delete claimed messages; they will be claimed again");
            }
        }
        Ok(claimed)
    }

    async fn claim(&self, message: &Message) -> Result<(), FatesError> {
        let attributes = message.message_attributes().cloned().unwrap_or_default();
        let sqs_id = message.message_id().unwrap_or_default();
        // Scheduled on a cancellable strategy, it has an id; anything else in the
        // queue goes on under a group of its own, which nothing cancels.
        let id = match attributes.get(ID_HEADER).and_then(|v| v.string_value()).filter(|id| !id.is_empty()) {
            Some(id) => id.to_string(),
            None => format!("no-id-{sqs_id}"),
        };
        self.fates.claim(&id, &format!("claim-{sqs_id}"), Some(&self.strategy), message.body().unwrap_or_default(), &attributes).await
    }
}
