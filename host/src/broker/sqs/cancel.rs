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

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{oneshot, watch};

use futures_util::future::BoxFuture;

use crate::broker::sqs::SqsExecutor;
use crate::broker::sqs::fates::Entry;
use crate::broker::sqs::fates_queue::{FatesError, FatesQueue, Replan, ReplanError, Reply, answer_of};
use crate::broker::sqs::replies::ReplyQueue;
use crate::broker::sqs::safe_name;
use crate::clock::Clock;
use crate::config::CancelConfig;
use crate::config::Config;
use crate::config::broker::SqsSettings;
use crate::executor::{Broker, ExecutorError};
use crate::message::Delivery;
use crate::report::CommandError;
use crate::scheduler::{ScheduleRequest, Scheduler};
use crate::service::cancellations::{Answer, CancelError, Cancellations, OpenCancellations};
use crate::stop::{pause_unless_stopped, unless_stopped};

/// How long a receive of the fates or the reply queue waits for something to come.
const LONG_POLL_SECONDS: i32 = 20;
const RETRY_PAUSE: Duration = Duration::from_secs(1);
/// Failed rounds in a row before the fates task reads as down.
const DOWN_AFTER_FAILURES: u32 = 3;

pub struct SqsCancel {
    fates: Arc<FatesQueue>,
    replies: ReplyQueue,
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
        let fates = FatesQueue::open(executor.clone(), &super::fates_queue_name(settings.log()), settings.remember_delivered_ms(), clock, declaring).await?;
        let replies = ReplyQueue::create(executor, &safe_name(settings.log())).await?;
        Ok(Arc::new(SqsCancel {
            fates: Arc::new(fates),
            replies,
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

    /// The longest delay a cancellable strategy takes (`service.cancel.retention`).
    pub fn retention_ms(&self) -> u64 {
        self.retention_ms
    }

    pub(crate) fn is_listening(&self) -> bool {
        self.listening.load(Ordering::Relaxed)
    }

    pub(crate) fn is_deciding(&self) -> bool {
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
        let entry = entry(token.clone(), self.replies.name().to_string());
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
            let Some(received) = unless_stopped(&mut stop, self.replies.receive(LONG_POLL_SECONDS)).await else { break };
            match received {
                Ok(received) => {
                    self.listening.store(true, Ordering::Relaxed);
                    self.hand_over(&received.replies);
                    self.replies.delete(received).await;
                }
                Err(err) => {
                    self.listening.store(false, Ordering::Relaxed);
                    tracing::warn!(queue = %self.replies.name(), error = %err, "receiving answers failed; retrying");
                    if !pause_unless_stopped(&mut stop, RETRY_PAUSE).await {
                        break;
                    }
                }
            }
        }
        self.listening.store(false, Ordering::Relaxed);
    }

    fn hand_over(&self, replies: &[Reply]) {
        for reply in replies {
            match (answer_of(&reply.answer), self.lock().remove(&reply.token)) {
                (Some(answer), Some(asker)) => _ = asker.send(answer),
                // Its asker gave up (503) or this host restarted: nobody waits for it.
                (Some(_), None) => {}
                (None, _) => tracing::warn!(queue = %self.replies.name(), answer = %reply.answer, "an answer hourglass does not know"),
            }
        }
    }

    /// Decides the fates queue's groups until `stop`.
    pub async fn decide(&self, replan: &impl Replan, mut stop: watch::Receiver<bool>) {
        // Up from the start (the queue was found at open), down after failures in a row.
        self.failures.store(0, Ordering::Relaxed);
        self.deciding.store(true, Ordering::Relaxed);
        while !*stop.borrow() {
            let Some(processed) = unless_stopped(&mut stop, self.fates.process_once(LONG_POLL_SECONDS, replan)).await else { break };
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
                    if !pause_unless_stopped(&mut stop, RETRY_PAUSE).await {
                        break;
                    }
                }
            }
        }
        self.deciding.store(false, Ordering::Relaxed);
    }

    /// Deletes this host's reply queue (a host killed leaves it, with nothing in it after a minute).
    pub async fn close(&self) {
        self.replies.close().await;
    }
}

/// Sends a claim a reschedule moved later round its strategy again, with its id.
pub(crate) struct SchedulerReplan(pub Arc<Scheduler<Broker>>);

impl Replan for SchedulerReplan {
    async fn replan(&self, strategy: Option<&str>, claim: &Delivery, due_at_ms: u64) -> Result<(), ReplanError> {
        let config = self.0.config();
        let strategy = match strategy {
            Some(strategy) => strategy.to_string(),
            None => {
                let target = claim.properties.headers.get(crate::headers::TARGET_HEADER).and_then(|v| v.as_text()).unwrap_or_default();
                config.strategy_for(&target).to_string()
            }
        };
        let request = ScheduleRequest::again(claim, &strategy, due_at_ms)?;
        self.0.schedule(request).await?;
        Ok(())
    }
}
/// The fates queue opened for one command, with a reply queue of this
/// process's own (deleted at close) where a serving host answers.
pub async fn open_for_command(settings: &SqsSettings, config: &Config) -> Result<OpenCancellations, CommandError> {
    let sqs = super::connect(settings).await?;
    let clock = Clock::system();
    // The fates queue is made by `serve`; without it nothing here is cancellable.
    let cancel = SqsCancel::open(sqs, &config.service.cancel, clock.clone(), false).await.map_err(|e| CommandError::failed("opening the fates queue", e))?;
    let (stop, stopped) = watch::channel(false);
    let listener = tokio::spawn({
        let cancel = cancel.clone();
        async move { cancel.listen(stopped).await }
    });
    let closing = {
        let cancel = cancel.clone();
        Box::pin(async move {
            let _ = stop.send(true);
            let _ = listener.await;
            cancel.close().await;
        })
    };
    Ok(OpenCancellations::with_closing(cancel, clock, closing))
}

impl Cancellations for SqsCancel {
    fn cancel<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Answer, CancelError>> {
        Box::pin(SqsCancel::cancel(self, id))
    }

    fn reschedule<'a>(&'a self, id: &'a str, due_at_ms: u64) -> BoxFuture<'a, Result<Answer, CancelError>> {
        Box::pin(SqsCancel::reschedule(self, id, due_at_ms))
    }

    fn retention_ms(&self) -> u64 {
        SqsCancel::retention_ms(self)
    }
}
