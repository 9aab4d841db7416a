//! The fates queue on SQS: appends entries to a message's group and carries
//! out what [`super::fates::decide`] makes of each group a receive brings.
//!
//! Each group's steps run one request at a time, in the decision's order
//! (answers and sends, then the fence, then deletes newest first, then holds
//! and reveals); the groups of one receive run side by side, as no step of one
//! depends on another's. A host killed between any two steps leaves entries
//! that come back after their visibility timeout and are decided again from
//! the same head.
//!
//! A host remembers the claims it received, by SQS message id: how many of
//! SQS's receives of each were its own, and whether it forwarded and fenced it
//! (for an hour, at most 100,000). SQS's receive count alone cannot tell this
//! host's receives from another host's.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::{Message, MessageAttributeValue, MessageSystemAttributeName};
use futures_util::future::join_all;
use thiserror::Error;

use super::consume::to_delivery;
use super::fates::{Decision, Entry, FATE_ATTRIBUTE, Seen, decide, group_of};
use super::send::{SqsExecutor, count};
use crate::cancellation::Answer;
use crate::clock::Clock;
use crate::executor::ExecutorError;
use crate::headers::TARGET_HEADER;
use crate::message::Delivery;

#[derive(Debug, Error)]
pub enum FatesError {
    #[error(transparent)]
    Broker(#[from] ExecutorError),
    #[error("SQS {what} on {queue}")]
    Sqs {
        what: &'static str,
        queue: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("the fates queue {0:?} does not exist")]
    Missing(String),
}

impl FatesError {
    /// Whether it is the entry's own problem (SQS refused its send, its
    /// destination is gone), which does not say SQS or this host is unwell.
    fn is_the_message_s_own(&self) -> bool {
        matches!(self, FatesError::Broker(ExecutorError::Refused(_) | ExecutorError::Invalid(_)))
    }
}

/// Why a replan failed: the scheduler's error, whatever it is.
pub(crate) type ReplanError = Box<dyn std::error::Error + Send + Sync>;

/// Sends a claim that was not cancelled round its strategy again, due at `due_at_ms`.
pub trait Replan: Send + Sync {
    /// `claim`: the message as it was claimed, its fate left out (its
    /// attributes read as properties and headers, as a consumer gets them);
    /// `strategy`: the one it was claimed from, if the claim says.
    fn replan(&self, strategy: Option<&str>, claim: &Delivery, due_at_ms: u64) -> impl Future<Output = Result<(), ReplanError>> + Send;
}

/// Refuses every replan: for a fates queue whose strategy takes no reschedules.
pub struct NoReplan;

impl Replan for NoReplan {
    async fn replan(&self, _: Option<&str>, _: &Delivery, _: u64) -> Result<(), ReplanError> {
        Err("rescheduling is not wired to a strategy here".into())
    }
}

/// What one receive did, for counters and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Processed {
    pub received: usize,
    pub forwarded: usize,
    pub dropped: usize,
    pub replanned: usize,
    pub answered: usize,
    /// Groups that could not be settled this time (logged; they come back).
    pub unsettled: usize,
}

impl Processed {
    /// Adds what one group's steps did (all but `received`, which is the receive's).
    fn add(&mut self, group: Processed) {
        self.forwarded += group.forwarded;
        self.dropped += group.dropped;
        self.replanned += group.replanned;
        self.answered += group.answered;
        self.unsettled += group.unsettled;
    }
}

/// One reply to an asker: the token it sent and the answer.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Reply {
    pub token: String,
    pub answer: String,
}

/// The label an answer travels under in a [`Reply`].
pub(crate) fn answer_label(answer: Answer) -> &'static str {
    match answer {
        Answer::Cancelled => "cancelled",
        Answer::AlreadyCancelled => "already_cancelled",
        Answer::Rescheduled => "rescheduled",
        Answer::AlreadyReleased => "already_released",
        Answer::Release => "release",
        Answer::Drop => "drop",
        Answer::Replan { .. } => "replan",
    }
}

/// The answer a [`Reply`] carries.
pub(crate) fn answer_of(label: &str) -> Option<Answer> {
    Some(match label {
        "cancelled" => Answer::Cancelled,
        "already_cancelled" => Answer::AlreadyCancelled,
        "rescheduled" => Answer::Rescheduled,
        "already_released" => Answer::AlreadyReleased,
        _ => return None,
    })
}

/// The most claims a host remembers; past it the oldest are forgotten first.
const CLAIMS_REMEMBERED: usize = 100_000;
/// How long a host remembers a claim it received (a claim is deleted within
/// minutes once seen with its fence).
const CLAIM_KEPT: Duration = Duration::from_secs(3_600);

/// What this host did with one claim, by its SQS message id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct ClaimHere {
    /// How many of SQS's receives of it were this host's.
    receives: u32,
    /// Whether this host forwarded and fenced it.
    forwarded: bool,
}

/// The claims this host received, bounded in count and age. A claim forgotten
/// costs at most what the rule does for a claim never seen here: a hold, or
/// (when its fence stays out of reach) a second forward.
#[derive(Debug, Default)]
struct ClaimMemory {
    claims: HashMap<String, ClaimHere>,
    /// Ids by when they were first received here, oldest first.
    order: VecDeque<(Instant, String)>,
}

impl ClaimMemory {
    /// Counts a receive of claim `id` at `now`; returns what this host knew of it before.
    fn received(&mut self, id: &str, now: Instant) -> ClaimHere {
        self.forget_before(now);
        if !self.claims.contains_key(id) {
            self.order.push_back((now, id.to_string()));
        }
        let here = self.claims.entry(id.to_string()).or_default();
        let before = *here;
        here.receives += 1;
        before
    }

    fn forwarded(&mut self, id: &str, now: Instant) {
        self.forget_before(now);
        if !self.claims.contains_key(id) {
            self.order.push_back((now, id.to_string()));
        }
        self.claims.entry(id.to_string()).or_default().forwarded = true;
    }

    fn forget_before(&mut self, now: Instant) {
        while let Some((at, id)) = self.order.front() {
            if now.duration_since(*at) < CLAIM_KEPT && self.claims.len() < CLAIMS_REMEMBERED {
                break;
            }
            self.claims.remove(id);
            self.order.pop_front();
        }
    }
}

pub struct FatesQueue {
    claims: std::sync::Mutex<ClaimMemory>,
    executor: Arc<SqsExecutor>,
    queue: String,
    url: String,
    remember_ms: u64,
    clock: Arc<Clock>,
}

/// The fates queue's attributes: FIFO, one group per message id, kept as
/// long as SQS keeps anything (a cancel must outlive every claim behind it).
pub(crate) fn fates_queue_attributes() -> BTreeMap<String, String> {
    [("FifoQueue", "true"), ("DeduplicationScope", "messageGroup"), ("FifoThroughputLimit", "perMessageGroupId"), ("MessageRetentionPeriod", "1209600")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl FatesQueue {
    /// Creates the queue if missing (`declaring`), else requires it.
    pub async fn open(executor: Arc<SqsExecutor>, queue: &str, remember_ms: u64, clock: Arc<Clock>, declaring: bool) -> Result<FatesQueue, FatesError> {
        let url = if declaring {
            executor.ensure_queue(queue, &fates_queue_attributes()).await?
        } else {
            executor.url(queue).await?.ok_or_else(|| FatesError::Missing(queue.to_string()))?
        };
        Ok(FatesQueue { claims: Default::default(), executor, queue: queue.to_string(), url, remember_ms, clock })
    }

    pub fn queue(&self) -> &str {
        &self.queue
    }

    fn claims(&self) -> std::sync::MutexGuard<'_, ClaimMemory> {
        self.claims.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn sqs<E: std::error::Error + Send + Sync + 'static>(&self, what: &'static str) -> impl FnOnce(E) -> FatesError + '_ {
        move |err| FatesError::Sqs { what, queue: self.queue.clone(), source: Box::new(err) }
    }

    /// Appends `entry` to message `id`'s group; `dedup`: the same for a retried
    /// send of the same entry (absorbed within SQS's five minutes).
    pub async fn append(&self, id: &str, entry: &Entry, dedup: &str) -> Result<(), FatesError> {
        let attributes = HashMap::from([(FATE_ATTRIBUTE.to_string(), text_attribute(entry.encode()))]);
        self.send(&group_of(id), dedup, "-", attributes).await
    }

    /// Appends the message itself as the claim of `id`: its body and attributes
    /// as they are; `strategy`: the one a reschedule sends it round again.
    pub async fn claim(
        &self,
        id: &str,
        dedup: &str,
        strategy: Option<&str>,
        body: &str,
        attributes: &HashMap<String, MessageAttributeValue>,
    ) -> Result<(), FatesError> {
        let mut attributes = attributes.clone();
        let claim = Entry::Claim { strategy: strategy.map(str::to_string) };
        attributes.insert(FATE_ATTRIBUTE.to_string(), text_attribute(claim.encode()));
        self.send(&group_of(id), dedup, body, attributes).await
    }

    async fn send(&self, group: &str, dedup: &str, body: &str, attributes: HashMap<String, MessageAttributeValue>) -> Result<(), FatesError> {
        count(&self.executor.requests.send_message);
        self.executor
            .client()
            .send_message()
            .queue_url(&self.url)
            .message_group_id(group)
            .message_deduplication_id(dedup_id(dedup))
            .message_body(body)
            .set_message_attributes(Some(attributes))
            .send()
            .await
            .map_err(self.sqs("SendMessage"))?;
        Ok(())
    }

    /// One receive (long poll of `wait_seconds`) and every group in it decided and carried out.
    pub async fn process_once(&self, wait_seconds: i32, replan: &impl Replan) -> Result<Processed, FatesError> {
        let messages = self.executor.receive_ten(&self.queue, &self.url, wait_seconds).await?;
        let mut processed = Processed { received: messages.len(), ..Processed::default() };
        // Oldest first within each group, as SQS returned them.
        let mut groups: Vec<(String, Vec<&Message>)> = Vec::new();
        for message in &messages {
            let group = system(message, MessageSystemAttributeName::MessageGroupId).unwrap_or_default().to_string();
            match groups.iter_mut().find(|(g, _)| *g == group) {
                Some((_, members)) => members.push(message),
                None => groups.push((group, vec![message])),
            }
        }
        let decided: Vec<_> = groups.iter().filter_map(|(group, members)| Some((group, members, self.decide(group, members)?))).collect();
        // Each group's steps run in their order, one request at a time; the
        // groups run side by side, as no step of one depends on another's. (One
        // group after another, a receive of ten groups took some thirty requests
        // before the next receive, and claims that came meanwhile waited for them all.)
        let outcomes = join_all(decided.iter().map(|(group, members, (seen, decision))| async move {
            let mut done = Processed::default();
            let outcome = match self.deliver(members, seen, decision, replan, &mut done).await {
                Ok(()) => self.tidy(group, members, decision, &mut done).await,
                Err(err) => Err(err),
            };
            (group, done, outcome)
        }))
        .await;
        // A group that fails is logged and comes back; it fails the receive only
        // when no group settled and SQS itself may be the cause (not one
        // message's own problem, such as its destination being gone).
        let mut passing_failure = None;
        let mut settled = 0;
        for (group, done, outcome) in outcomes {
            processed.add(done);
            match outcome {
                Ok(()) => settled += 1,
                Err(err) => {
                    tracing::warn!(queue = %self.queue, %group, error = %err, "a fates group was not settled; it comes back to be decided again");
                    processed.unsettled += 1;
                    if !err.is_the_message_s_own() {
                        passing_failure.get_or_insert(err);
                    }
                }
            }
        }
        match passing_failure {
            Some(err) if settled == 0 => Err(err),
            _ => Ok(processed),
        }
    }

    /// What the head of one group's received entries says, or `None` for a
    /// group holding an entry hourglass did not write (left to SQS's retention).
    fn decide(&self, group: &str, members: &[&Message]) -> Option<(Vec<Seen>, Decision)> {
        let mut seen = Vec::with_capacity(members.len());
        for message in members {
            let text = message.message_attributes().and_then(|a| a.get(FATE_ATTRIBUTE)).and_then(|v| v.string_value()).unwrap_or_default();
            let entry = match Entry::decode(text) {
                Ok(entry) => entry,
                Err(err) => {
                    tracing::error!(queue = %self.queue, %group, error = %err, "an entry of the fates queue is not one hourglass wrote; left in place");
                    return None;
                }
            };
            let number = |name| system(message, name).and_then(|v| v.parse().ok()).unwrap_or(0);
            let here = match entry {
                Entry::Claim { .. } => self.claims().received(message.message_id().unwrap_or_default(), Instant::now()),
                _ => ClaimHere::default(),
            };
            seen.push(Seen {
                entry,
                receive_count: number(MessageSystemAttributeName::ApproximateReceiveCount) as u32,
                sent_ms: number(MessageSystemAttributeName::SentTimestamp),
                received_here: here.receives,
                forwarded_here: here.forwarded,
            });
        }
        let decision = decide(&seen, self.clock.earliest_ms(), self.remember_ms);
        Some((seen, decision))
    }

    /// A decision's first steps: answers, forwards, replans.
    async fn deliver(
        &self,
        members: &[&Message],
        seen: &[Seen],
        decision: &Decision,
        replan: &impl Replan,
        processed: &mut Processed,
    ) -> Result<(), FatesError> {
        for (index, answer) in &decision.answers {
            if let Some((token, Some(reply))) = seen[*index].entry.asker() {
                // An asker that is gone (its host stopped) costs one lost reply, nothing more.
                if let Err(err) = self.reply(reply, token, *answer).await {
                    tracing::warn!(queue = %self.queue, %reply, error = %err, "could not send an answer to its asker");
                }
            }
            processed.answered += 1;
        }
        for index in &decision.forward {
            self.forward(members[*index]).await?;
            processed.forwarded += 1;
        }
        for (index, due_at_ms) in &decision.replan {
            let strategy = match &seen[*index].entry {
                Entry::Claim { strategy } => strategy.as_deref(),
                _ => None,
            };
            let replan_failed = |source: ReplanError| FatesError::Sqs { what: "replan", queue: self.queue.clone(), source };
            let message = members[*index];
            // Read as received once: it goes round its strategy again, not redelivered.
            let (claim, unreadable) = to_delivery("", message.body().unwrap_or_default(), &own_attributes(message), 1);
            if let Some(why) = unreadable {
                return Err(replan_failed(why.into()));
            }
            replan.replan(strategy, &claim, *due_at_ms).await.map_err(replan_failed)?;
            processed.replanned += 1;
        }
        Ok(())
    }

    /// The rest of a decision, once its first steps are done: the fence, the
    /// deletes (newest first), the head's hold and the reveals.
    async fn tidy(&self, group: &str, members: &[&Message], decision: &Decision, processed: &mut Processed) -> Result<(), FatesError> {
        if decision.fence {
            let head = decision.reveal.first().map_or("", |index| members[*index].message_id().unwrap_or_default());
            self.append(group, &Entry::Released, &format!("released-{head}")).await?;
            self.claims().forwarded(head, Instant::now());
        }
        for index in &decision.delete {
            count(&self.executor.requests.delete_message_batch);
            let handle = members[*index].receipt_handle().unwrap_or_default();
            self.executor.client().delete_message().queue_url(&self.url).receipt_handle(handle).send().await.map_err(self.sqs("DeleteMessage"))?;
        }
        processed.dropped += decision.dropped.len();
        if let Some((index, hold)) = decision.hold {
            self.set_visibility(members[index], jittered(hold)).await?;
        }
        for index in &decision.reveal {
            self.set_visibility(members[*index], Duration::ZERO).await?;
        }
        Ok(())
    }

    async fn set_visibility(&self, message: &Message, visibility: Duration) -> Result<(), FatesError> {
        count(&self.executor.requests.change_message_visibility_batch);
        self.executor
            .client()
            .change_message_visibility()
            .queue_url(&self.url)
            .receipt_handle(message.receipt_handle().unwrap_or_default())
            .visibility_timeout(visibility.as_secs().min(43_200) as i32)
            .send()
            .await
            .map_err(self.sqs("ChangeMessageVisibility"))?;
        Ok(())
    }

    /// The claim's body and attributes (its fate left out) to the queue its `hourglass-target` names.
    async fn forward(&self, message: &Message) -> Result<(), FatesError> {
        let attributes = own_attributes(message);
        let target = attributes.get(TARGET_HEADER).and_then(|v| v.string_value()).filter(|t| !t.is_empty());
        let Some(target) = target else {
            return Err(FatesError::Broker(ExecutorError::Refused(format!("a claim in {} has no {TARGET_HEADER} attribute", self.queue))));
        };
        let url = self.executor.url(target).await?.ok_or_else(|| ExecutorError::Refused(format!("destination {target:?} does not exist")))?;
        count(&self.executor.requests.send_message);
        self.executor
            .client()
            .send_message()
            .queue_url(url)
            .message_body(message.body().unwrap_or_default())
            .set_message_attributes(Some(attributes))
            .send()
            .await
            .map_err(self.sqs("SendMessage (forward)"))?;
        Ok(())
    }

    async fn reply(&self, queue: &str, token: &str, answer: Answer) -> Result<(), FatesError> {
        let url = self.executor.url(queue).await?.ok_or_else(|| FatesError::Missing(queue.to_string()))?;
        let body = serde_json::to_string(&Reply { token: token.to_string(), answer: answer_label(answer).to_string() }).expect("plain data");
        count(&self.executor.requests.send_message);
        self.executor.client().send_message().queue_url(url).message_body(body).send().await.map_err(self.sqs("SendMessage (reply)"))?;
        Ok(())
    }
}

/// A hold cut to between half and all of it, so heads held at the same moment
/// come back at different ones (a receive reaches a group's later entries only
/// when fewer than ten older ones are in the way).
fn jittered(hold: Duration) -> Duration {
    let fraction = (uuid::Uuid::new_v4().as_u128() % 1_000) as u32;
    (hold / 2 + hold / 2 * fraction / 1_000).max(Duration::from_secs(1))
}

fn text_attribute(value: String) -> MessageAttributeValue {
    MessageAttributeValue::builder().data_type("String").string_value(value).build().expect("data type and value are set")
}

fn system(message: &Message, name: MessageSystemAttributeName) -> Option<&str> {
    message.attributes().and_then(|a| a.get(&name)).map(String::as_str)
}

/// A claim's attributes without its fate: the message's own.
fn own_attributes(message: &Message) -> HashMap<String, MessageAttributeValue> {
    let mut attributes = message.message_attributes().cloned().unwrap_or_default();
    attributes.remove(FATE_ATTRIBUTE);
    attributes
}

/// SQS takes deduplication ids of at most 128 printable ASCII characters;
/// hourglass makes its own from SQS message ids and tokens, which fit.
fn dedup_id(wanted: &str) -> String {
    wanted.chars().filter(char::is_ascii_graphic).take(128).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_counts_its_own_receives_of_a_claim_and_forgets_the_oldest_first() {
        let mut memory = ClaimMemory::default();
        let start = Instant::now();
        assert_eq!(memory.received("a", start), ClaimHere::default(), "never seen here");
        memory.forwarded("a", start);
        assert_eq!(memory.received("a", start), ClaimHere { receives: 1, forwarded: true });
        assert_eq!(memory.received("a", start).receives, 2);
        let later = start + CLAIM_KEPT;
        assert_eq!(memory.received("a", later), ClaimHere::default(), "forgotten after CLAIM_KEPT");
        for n in 0..CLAIMS_REMEMBERED {
            memory.received(&n.to_string(), later);
        }
        assert_eq!((memory.claims.len(), memory.order.len()), (CLAIMS_REMEMBERED, CLAIMS_REMEMBERED));
        assert!(!memory.claims.contains_key("a"), "the oldest goes first");
        let newest = (CLAIMS_REMEMBERED - 1).to_string();
        assert_eq!(memory.received(&newest, later).receives, 1, "the newest is remembered");
    }
}
