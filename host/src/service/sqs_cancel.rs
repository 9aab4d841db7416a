//! Cancel and reschedule on SQS, as a host (`serve`, or the CLI) takes part:
//! it appends `DELETE` / `PATCH` to the fates queue and waits for the answer
//! on a reply queue of its own; and, when serving, it decides the fates
//! queue's groups ([`crate::broker::sqs::fates_queue`]) and sends claims that
//! a reschedule moved later round their strategy again.
//!
//! The answer may come from any host: whichever receives the group's head.
//! An asker that is not answered within `service.cancel.answer_timeout` gets
//! [`CancelError::Unanswered`] (503): its entry is in the group all the same,
//! and asking again is safe (a second cancel of a cancelled message is
//! answered `already_cancelled`, also 200).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_sqs::types::{Message, MessageAttributeValue};
use tokio::sync::{oneshot, watch};

use super::cancel::{Answer, CancelError};
use crate::broker::sqs::SqsExecutor;
use crate::broker::sqs::consume::{delete_entry, to_delivery};
use crate::broker::sqs::fates::Entry;
use crate::broker::sqs::fates_queue::{FatesError, FatesQueue, Replan, Reply, answer_of};
use crate::broker::sqs::send::count;
use crate::broker::{Broker, ExecutorError};
use crate::config::{CancelConfig, sqs_safe};
use crate::scheduler::{ScheduleRequest, Scheduler};

/// How long a receive of the fates or the reply queue waits for something to come.
const LONG_POLL_SECONDS: i32 = 20;
const RETRY_PAUSE: Duration = Duration::from_secs(1);
/// Failed rounds in a row before the fates task reads as down.
const DOWN_AFTER_FAILURES: u32 = 3;
/// A reply left unread (its asker gone) is dropped after this; SQS's shortest.
const REPLY_RETENTION_SECONDS: &str = "60";

pub struct SqsCancel {
    executor: Arc<SqsExecutor>,
    fates: Arc<FatesQueue>,
    reply_queue: String,
    reply_url: String,
    retention_ms: u64,
    answer_timeout: Duration,
    waiting: Mutex<HashMap<String, oneshot::Sender<Answer>>>,
    listening: AtomicBool,
    failures: AtomicU32,
    deciding: AtomicBool,
}

impl From<FatesError> for CancelError {
    fn from(err: FatesError) -> CancelError {
        match err {
            FatesError::Broker(err) => CancelError::Broker(err),
            other => CancelError::Broker(ExecutorError::Unavailable(other.to_string())),
        }
    }
}

impl SqsCancel {
    /// Opens the fates queue (creating it when `declaring`) and creates this
    /// host's reply queue, `<log>-replies-<random>`, deleted by [`SqsCancel::close`].
    pub async fn open(
        executor: Arc<SqsExecutor>,
        settings: &CancelConfig,
        clock: Arc<crate::clock::Clock>,
        declaring: bool,
    ) -> Result<Arc<SqsCancel>, FatesError> {
        let fates = FatesQueue::open(executor.clone(), &settings.sqs_fates_queue(), settings.remember_delivered_ms(), clock, declaring).await?;
        let stem = sqs_safe(settings.log());
        let reply_queue = format!("{}-replies-{}", &stem[..stem.len().min(50)], &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let attributes = BTreeMap::from([("MessageRetentionPeriod".to_string(), REPLY_RETENTION_SECONDS.to_string())]);
        let reply_url = executor.ensure_queue(&reply_queue, &attributes).await?;
        Ok(Arc::new(SqsCancel {
            executor,
            fates: Arc::new(fates),
            reply_queue,
            reply_url,
            retention_ms: settings.retention_ms(),
            answer_timeout: Duration::from_millis(settings.answer_timeout_ms()),
            waiting: Mutex::new(HashMap::new()),
            listening: AtomicBool::new(false),
            failures: AtomicU32::new(0),
            deciding: AtomicBool::new(false),
        }))
    }

    pub fn fates(&self) -> &Arc<FatesQueue> {
        &self.fates
    }

    pub fn reply_queue(&self) -> &str {
        &self.reply_queue
    }

    /// The longest delay a cancellable strategy takes (`service.cancel.retention`).
    pub fn retention_ms(&self) -> u64 {
        self.retention_ms
    }

    pub fn is_listening(&self) -> bool {
        self.listening.load(Ordering::Relaxed)
    }

    pub fn is_deciding(&self) -> bool {
        self.deciding.load(Ordering::Relaxed)
    }

    pub async fn cancel(&self, id: &str) -> Result<Answer, CancelError> {
        self.ask(id, |token, reply| Entry::Cancel { token, reply: Some(reply) }).await
    }

    pub async fn reschedule(&self, id: &str, due_at_ms: u64) -> Result<Answer, CancelError> {
        self.ask(id, |token, reply| Entry::Reschedule { token, due_at_ms, reply: Some(reply) }).await
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, oneshot::Sender<Answer>>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends the entry to the id's group and waits for its answer.
    async fn ask(&self, id: &str, entry: impl FnOnce(String, String) -> Entry) -> Result<Answer, CancelError> {
        let token = uuid::Uuid::new_v4().simple().to_string();
        let (answered, answer) = oneshot::channel();
        self.lock().insert(token.clone(), answered);
        let entry = entry(token.clone(), self.reply_queue.clone());
        if let Err(err) = self.fates.append(id, &entry, &token).await {
            self.lock().remove(&token);
            return Err(err.into());
        }
        match tokio::time::timeout(self.answer_timeout, answer).await {
            Ok(Ok(answer)) => Ok(answer),
            _ => {
                self.lock().remove(&token);
                Err(CancelError::Unanswered(self.answer_timeout))
            }
        }
    }

    /// Receives this host's answers until `stop`, handing each to its asker.
    pub async fn listen(&self, mut stop: watch::Receiver<bool>) {
        // Up from the start: the queue was made at open, and a long poll on an empty queue must not read as down.
        self.listening.store(true, Ordering::Relaxed);
        while !*stop.borrow() {
            let received = tokio::select! {
                received = self.executor.receive_ten(&self.reply_queue, &self.reply_url, LONG_POLL_SECONDS) => received,
                _ = stop.changed() => break,
            };
            match received {
                Ok(messages) => {
                    self.listening.store(true, Ordering::Relaxed);
                    self.hand_over(&messages).await;
                }
                Err(err) => {
                    self.listening.store(false, Ordering::Relaxed);
                    tracing::warn!(queue = %self.reply_queue, error = %err, "receiving answers failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(RETRY_PAUSE) => {}
                        _ = stop.changed() => break,
                    }
                }
            }
        }
        self.listening.store(false, Ordering::Relaxed);
    }

    async fn hand_over(&self, messages: &[Message]) {
        let mut deletes = Vec::new();
        for (index, message) in messages.iter().enumerate() {
            match serde_json::from_str::<Reply>(message.body().unwrap_or_default()) {
                Ok(reply) => match (answer_of(&reply.answer), self.lock().remove(&reply.token)) {
                    (Some(answer), Some(asker)) => _ = asker.send(answer),
                    // Its asker gave up (503) or this host restarted: nobody waits for it.
                    (Some(_), None) => {}
                    (None, _) => tracing::warn!(queue = %self.reply_queue, answer = %reply.answer, "an answer hourglass does not know"),
                },
                Err(err) => tracing::warn!(queue = %self.reply_queue, error = %err, "a reply that is not one; deleted"),
            }
            if let Ok(entry) = delete_entry(index, message) {
                deletes.push(entry);
            }
        }
        if deletes.is_empty() {
            return;
        }
        count(&self.executor.requests.delete_message_batch);
        // Not deleted: received again and dropped, as nobody waits for it by then.
        if let Err(err) = self.executor.client().delete_message_batch().queue_url(&self.reply_url).set_entries(Some(deletes)).send().await {
            tracing::warn!(queue = %self.reply_queue, error = %err, "could not delete answers read");
        }
    }

    /// Decides the fates queue's groups until `stop`.
    pub async fn decide(&self, replan: &impl Replan, mut stop: watch::Receiver<bool>) {
        // Up from the start (the queue was found at open), down after failures in a row.
        self.failures.store(0, Ordering::Relaxed);
        self.deciding.store(true, Ordering::Relaxed);
        while !*stop.borrow() {
            let processed = tokio::select! {
                processed = self.fates.process_once(LONG_POLL_SECONDS, replan) => processed,
                _ = stop.changed() => break,
            };
            match processed {
                Ok(_) => {
                    self.failures.store(0, Ordering::Relaxed);
                    self.deciding.store(true, Ordering::Relaxed);
                }
                Err(err) => {
                    // One group that cannot be settled (its destination gone, say) must not read as the task down.
                    if self.failures.fetch_add(1, Ordering::Relaxed) + 1 >= DOWN_AFTER_FAILURES {
                        self.deciding.store(false, Ordering::Relaxed);
                    }
                    tracing::warn!(queue = %self.fates.queue(), error = %err, "deciding the fates queue failed; what was not settled comes back");
                    tokio::select! {
                        _ = tokio::time::sleep(RETRY_PAUSE) => {}
                        _ = stop.changed() => break,
                    }
                }
            }
        }
        self.deciding.store(false, Ordering::Relaxed);
    }

    /// Deletes this host's reply queue (a host killed leaves it, with nothing in it after a minute).
    pub async fn close(&self) {
        if let Err(err) = self.executor.client().delete_queue().queue_url(&self.reply_url).send().await {
            tracing::warn!(queue = %self.reply_queue, error = %err, "could not delete this host's reply queue");
        }
    }
}

/// Sends a claim a reschedule moved later round its strategy again, with its id.
pub struct SchedulerReplan(pub Arc<Scheduler<Broker>>);

impl Replan for SchedulerReplan {
    async fn replan(&self, strategy: Option<&str>, body: &str, attributes: &HashMap<String, MessageAttributeValue>, due_at_ms: u64) -> Result<(), String> {
        let message = Message::builder().body(body).set_message_attributes(Some(attributes.clone())).build();
        let (delivery, unreadable) = to_delivery("", &message, 1);
        if let Some(why) = unreadable {
            return Err(why);
        }
        let config = self.0.config();
        let strategy = match strategy {
            Some(strategy) => strategy.to_string(),
            None => {
                let target = delivery.properties.headers.get(crate::headers::TARGET_HEADER).and_then(|v| v.as_text()).unwrap_or_default();
                config.strategy_for(&target).to_string()
            }
        };
        let request = ScheduleRequest::again(&delivery, &strategy, due_at_ms)?;
        self.0.schedule(request).await.map(|_| ()).map_err(|e| e.to_string())
    }
}
