//! Pumped queues: found by a tag rather than configured, each with a
//! dead-letter queue beside it.
//!
//! Every pumped queue is tagged `hourglass-pumped-by = <strategy>` when a host
//! first sets it up for a destination, so after a restart (or on another
//! host) every queue with messages still cycling is found by listing the
//! account's queues, whether or not its destination is configured anywhere.
//!
//! Before pumping, the host gives the queue a visibility timeout that covers
//! a batch and a redrive policy to `<stem>-dlq.fifo`: a message received
//! `max_receives` times without being forwarded lands there instead of
//! cycling until its retention ends, and the pump moves there itself, with
//! the reason, what it knows it cannot forward.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::QueueAttributeName;

use super::dead_letters::dead_letter_queue;
use super::send::{SqsExecutor, count, unavailable};
use crate::executor::ExecutorError;

/// The tag naming the strategy whose planner pumps a queue.
pub(crate) const PUMPED_BY_TAG: &str = "hourglass-pumped-by";
/// The message attribute that says why a message was parked in a dead-letter queue.
pub const PARKED_REASON_ATTRIBUTE: &str = "hourglass-parked-reason";
/// Dead letters are kept as long as SQS allows: someone has to look at them.
const DEAD_LETTER_RETENTION_SECONDS: u64 = 14 * 86_400;
/// A queue found untagged is looked at again after this long: another host
/// may have tagged it since (it tags right after creating it).
const RECHECK_UNTAGGED: Duration = Duration::from_secs(600);

/// How a pump treats its queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PumpSettings {
    /// Set on the queue, and extended while a batch is still in hand.
    pub visibility: Duration,
    /// Receives before SQS moves an unforwarded message to the dead-letter queue.
    pub max_receives: u32,
    /// After a receive brought fewer than ten, the pump waits this long before
    /// the next, so the queue fills the next batch. A later visit leaves less
    /// of the delay to go, so only a message due within the linger arrives later.
    pub linger: Duration,
}

impl Default for PumpSettings {
    fn default() -> Self {
        PumpSettings { visibility: Duration::from_secs(60), max_receives: 10, linger: Duration::from_millis(250) }
    }
}

/// What the listing remembers between rounds: queues already reported, and
/// untagged ones with when they were looked at.
#[derive(Debug, Default)]
pub(crate) struct Discovery {
    reported: std::collections::HashSet<String>,
    untagged: HashMap<String, Instant>,
}

/// A pumped queue, ready: its URL and its dead-letter queue's name (none when
/// the host may not create one and none exists).
#[derive(Clone, Debug)]
pub struct PreparedQueue {
    pub url: String,
    pub dead_letters: Option<String>,
}

impl SqsExecutor {
    /// Tags `queue` as pumped by `strategy`, so listing finds it after a restart.
    pub(crate) async fn tag_pumped(&self, queue: &str, strategy: &str) -> Result<(), ExecutorError> {
        let url = self.url(queue).await?.ok_or_else(|| ExecutorError::Refused(format!("pumped SQS queue {queue:?} does not exist")))?;
        count(&self.requests.tag_queue);
        self.client().tag_queue().queue_url(url).tags(PUMPED_BY_TAG, strategy).send().await.map_err(|e| unavailable(format!("TagQueue {queue}"), e))?;
        Ok(())
    }

    /// Messages in `queue` by SQS's approximate counts: visible, in flight and
    /// delayed (a cycling message is delayed most of its time), times the
    /// messages per SQS message this host's pumps received there lately (a
    /// bundle counts once in SQS's counts): an estimate, as SQS's own counts
    /// are. `None` when the queue is missing or SQS does not answer.
    pub async fn queue_depth(&self, queue: &str) -> Option<u64> {
        let url = self.url(queue).await.ok()??;
        count(&self.requests.get_queue_attributes);
        let counts = [
            QueueAttributeName::ApproximateNumberOfMessages,
            QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
            QueueAttributeName::ApproximateNumberOfMessagesDelayed,
        ];
        let output = self.client().get_queue_attributes().queue_url(url).set_attribute_names(Some(counts.to_vec())).send().await.ok()?;
        let attributes = output.attributes()?;
        let sqs_messages: u64 = counts.iter().filter_map(|name| attributes.get(name)?.parse::<u64>().ok()).sum();
        Some((sqs_messages as f64 * self.carried_per_message(queue)).round() as u64)
    }

    /// Gives `queue` its dead-letter queue, redrive policy and visibility
    /// timeout. With `declaring` off nothing is created or changed: an
    /// existing dead-letter queue is used, and the queue is pumped as it is.
    pub async fn prepare_pumped(&self, queue: &str, settings: &PumpSettings, declaring: bool) -> Result<PreparedQueue, ExecutorError> {
        let url = self.url(queue).await?.ok_or_else(|| ExecutorError::Refused(format!("pumped SQS queue {queue:?} does not exist")))?;
        let dead_letters = dead_letter_queue(queue);
        if !declaring {
            let exists = self.url(&dead_letters).await?.is_some();
            return Ok(PreparedQueue { url, dead_letters: exists.then_some(dead_letters) });
        }
        let mut attributes = HashMap::from([(QueueAttributeName::MessageRetentionPeriod, DEAD_LETTER_RETENTION_SECONDS.to_string())]);
        if queue.ends_with(".fifo") {
            attributes.insert(QueueAttributeName::FifoQueue, "true".into());
        }
        let dead_letters_url = match self.url(&dead_letters).await? {
            Some(url) => url,
            None => {
                count(&self.requests.create_queue);
                let created = self
                    .client()
                    .create_queue()
                    .queue_name(&dead_letters)
                    .set_attributes(Some(attributes))
                    .tags("hourglass-dead-letters-of", queue)
                    .send()
                    .await
                    .map_err(|e| unavailable(format!("CreateQueue {dead_letters}"), e))?;
                created.queue_url().unwrap_or_default().to_string()
            }
        };
        count(&self.requests.get_queue_attributes);
        let arn = self
            .client()
            .get_queue_attributes()
            .queue_url(&dead_letters_url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
            .map_err(|e| unavailable(format!("GetQueueAttributes {dead_letters}"), e))?
            .attributes()
            .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
            .ok_or_else(|| ExecutorError::Unavailable(format!("SQS did not say the ARN of {dead_letters}")))?;
        let policy = serde_json::json!({ "deadLetterTargetArn": arn, "maxReceiveCount": settings.max_receives }).to_string();
        count(&self.requests.set_queue_attributes);
        self.client()
            .set_queue_attributes()
            .queue_url(&url)
            .attributes(QueueAttributeName::RedrivePolicy, policy)
            .attributes(QueueAttributeName::VisibilityTimeout, settings.visibility.as_secs().max(1).to_string())
            .send()
            .await
            .map_err(|e| unavailable(format!("SetQueueAttributes {queue}"), e))?;
        Ok(PreparedQueue { url, dead_letters: Some(dead_letters) })
    }

    /// Lists the account's queues and returns the pumped ones not reported
    /// before, with the strategy each is tagged for.
    pub(crate) async fn discover_pumped(&self, discovery: &mut Discovery) -> Result<Vec<(String, String)>, ExecutorError> {
        let mut urls = Vec::new();
        let mut next_token = None;
        loop {
            count(&self.requests.list_queues);
            let page = self.client().list_queues().max_results(1_000).set_next_token(next_token).send().await.map_err(|e| unavailable("ListQueues", e))?;
            urls.extend(page.queue_urls().iter().cloned());
            next_token = page.next_token().map(str::to_string);
            if next_token.is_none() {
                break;
            }
        }
        let mut found = Vec::new();
        let now = Instant::now();
        for url in urls {
            let name = url.rsplit('/').next().unwrap_or_default().to_string();
            let recently_untagged = discovery.untagged.get(&name).is_some_and(|at| now.duration_since(*at) < RECHECK_UNTAGGED);
            if discovery.reported.contains(&name) || recently_untagged {
                continue;
            }
            count(&self.requests.list_queue_tags);
            let tags = match self.client().list_queue_tags().queue_url(&url).send().await {
                Ok(tags) => tags,
                // Deleted between the listing and now.
                Err(err)
                    if err
                        .as_service_error()
                        .and_then(|e| e.meta().code())
                        .is_some_and(|c| c.contains("NonExistentQueue") || c.contains("QueueDoesNotExist")) =>
                {
                    continue;
                }
                Err(err) => return Err(unavailable(format!("ListQueueTags {name}"), err)),
            };
            match tags.tags().and_then(|t| t.get(PUMPED_BY_TAG)) {
                Some(strategy) => {
                    discovery.untagged.remove(&name);
                    discovery.reported.insert(name.clone());
                    found.push((name, strategy.clone()));
                }
                None => {
                    discovery.untagged.insert(name, now);
                }
            }
        }
        Ok(found)
    }
}
impl PumpSettings {
    /// The pump settings `[service]` asks for.
    pub fn from_config(config: &crate::config::Config) -> PumpSettings {
        let defaults = PumpSettings::default();
        PumpSettings {
            visibility: config.service.pump_visibility.map_or(defaults.visibility, |d| Duration::from_secs(d.ms().div_ceil(1000))),
            max_receives: config.service.pump_max_receives.unwrap_or(defaults.max_receives),
            linger: config.service.pump_linger.map_or(defaults.linger, |d| Duration::from_millis(d.ms())),
        }
    }
}
