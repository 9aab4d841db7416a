//! A host's reply queue on SQS: where the fates queue's deciders send the
//! answers to the cancels and reschedules this host asked for
//! ([`super::fates_queue::Reply`]). One per host, made when it starts and
//! deleted when it stops; a host killed leaves it, emptied by its short
//! retention.

use std::collections::BTreeMap;
use std::sync::Arc;

use aws_sdk_sqs::types::DeleteMessageBatchRequestEntry;

use super::consume::delete_entry;
use super::fates_queue::Reply;
use super::send::{SqsExecutor, count};
use crate::executor::ExecutorError;

/// A reply left unread (its asker gone) is dropped after this; SQS's shortest.
const REPLY_RETENTION_SECONDS: &str = "60";
/// SQS queue names are at most 80 characters: the stem keeps room for `-replies-` and the suffix.
const LONGEST_STEM: usize = 50;

pub(crate) struct ReplyQueue {
    executor: Arc<SqsExecutor>,
    queue: String,
    url: String,
}

/// The replies one receive brought, and what deletes them once handed over.
pub(crate) struct ReceivedReplies {
    pub replies: Vec<Reply>,
    deletes: Vec<DeleteMessageBatchRequestEntry>,
}

impl ReplyQueue {
    /// Creates a reply queue of its own for this host, `<stem>-replies-<random>`;
    /// `stem` must be SQS-safe.
    pub async fn create(executor: Arc<SqsExecutor>, stem: &str) -> Result<ReplyQueue, ExecutorError> {
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        let queue = format!("{}-replies-{}", &stem[..stem.len().min(LONGEST_STEM)], &suffix[..12]);
        let attributes = BTreeMap::from([("MessageRetentionPeriod".to_string(), REPLY_RETENTION_SECONDS.to_string())]);
        let url = executor.ensure_queue(&queue, &attributes).await?;
        Ok(ReplyQueue { executor, queue, url })
    }

    pub fn name(&self) -> &str {
        &self.queue
    }

    /// One receive (long poll of `wait_seconds`). A message that is not a
    /// reply is logged and deleted with the others.
    pub async fn receive(&self, wait_seconds: i32) -> Result<ReceivedReplies, ExecutorError> {
        let messages = self.executor.receive_ten(&self.queue, &self.url, wait_seconds).await?;
        let mut received = ReceivedReplies { replies: Vec::with_capacity(messages.len()), deletes: Vec::with_capacity(messages.len()) };
        for (index, message) in messages.iter().enumerate() {
            match serde_json::from_str::<Reply>(message.body().unwrap_or_default()) {
                Ok(reply) => received.replies.push(reply),
                Err(err) => tracing::warn!(queue = %self.queue, error = %err, "a reply that is not one; deleted"),
            }
            if let Ok(entry) = delete_entry(index, message) {
                received.deletes.push(entry);
            }
        }
        Ok(received)
    }

    /// Deletes what a receive brought; one not deleted is received again and
    /// dropped, as nobody waits for it by then.
    pub async fn delete(&self, received: ReceivedReplies) {
        if received.deletes.is_empty() {
            return;
        }
        count(&self.executor.requests.delete_message_batch);
        if let Err(err) = self.executor.client().delete_message_batch().queue_url(&self.url).set_entries(Some(received.deletes)).send().await {
            tracing::warn!(queue = %self.queue, error = %err, "could not delete answers read");
        }
    }

    /// Deletes the queue.
    pub async fn close(&self) {
        if let Err(err) = self.executor.client().delete_queue().queue_url(&self.url).send().await {
            tracing::warn!(queue = %self.queue, error = %err, "could not delete this host's reply queue");
        }
    }
}
