//! The cycle pump: receives up to ten messages that became visible on a
//! pumped SQS queue, asks the strategy's planner what to do with each (send
//! around again, or hand over to the destination), sends them on in batches
//! per target queue, then deletes them in one batch. What goes around again
//! travels in bundles ([`super::bundle`]), opened here on the next visit: the
//! planner sees each message as if it had come alone.
//!
//! A received message is deleted once each message in it went on or was
//! parked, always with the receipt handle of the queue it came from; a failed
//! delete is retried there. Hand-overs go first: when one fails for a passing
//! reason (tried twice), its received message is kept to come back, the
//! others in it do not go around again meanwhile, and the pump remembers
//! which already went so it does not send them twice. A pump killed between
//! send and delete leaves the message to come back after its visibility
//! timeout: delivered, possibly twice, never lost. Several pumps may share a
//! queue: the FIFO deduplication id of each cycle (message and cycle; a
//! bundle's from its members') absorbs a double send within five minutes when
//! the same messages are received together again.
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

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry, Message, MessageAttributeValue, MessageSystemAttributeName,
    SendMessageBatchRequestEntry,
};

use super::metrics::PumpCounters;
use crate::clock::estimate::Reading;
use crate::clock::{Clock, monotonic_ms};
use crate::command::{Command, FieldValue, SqsCommand};
use crate::command::{DueAction, DueMessage};
use crate::executor::ExecutorError;
use crate::stop::{pause_unless_stopped, unless_stopped};

use super::bundle::{self, Bundled, Candidate, Outgoing};
use super::consume::{SetAside, delete_entry, set_aside_entry};
use super::properties::is_property_attribute;
use super::pumped::{PARKED_REASON_ATTRIBUTE, PreparedQueue, PumpSettings};
use super::send::{PropertyAttributes, SqsExecutor, count};

/// Where a pump stops in the middle, for fault-injection tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interrupt {
    None,
    /// Sent onward, then died before deleting.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    AfterSendBeforeDelete,
}

/// Why a [`DueHandler`] could not decide: whatever error its planner has,
/// kept whole (the pump does not depend on the planner's types).
pub type DueError = Box<dyn std::error::Error + Send + Sync>;

/// Decides what happens to a due message: the strategy's planner, as the pump sees it.
pub trait DueHandler: Send + Sync {
    /// Who decides, for error messages.
    fn label(&self) -> &str;
    fn handle_due(&mut self, message: &DueMessage) -> Result<DueAction, DueError>;
}

/// A pump asks the strategy's planner about each due message.
impl DueHandler for crate::planner::LoadedPlanner {
    fn label(&self) -> &str {
        crate::planner::LoadedPlanner::label(self)
    }

    fn handle_due(&mut self, message: &DueMessage) -> Result<DueAction, DueError> {
        Ok(crate::planner::LoadedPlanner::handle_due(self, message)?)
    }
}

/// Why a due message can never go on: it is parked with this as its reason.
#[derive(Debug, thiserror::Error)]
enum Undeliverable {
    #[error("planner {planner}: {source}")]
    Planner { planner: String, source: DueError },
    #[error("planner {planner} answered with a command the pump cannot send")]
    NotAnSqsSend { planner: String },
    #[error(transparent)]
    Entry(#[from] ExecutorError),
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
    gone_on: GoneOn,
    pub counters: Arc<PumpCounters>,
    /// The host's clock: SQS's receive stamps are read into it, and it tells a
    /// redelivered copy (whose stamps are old) what time it is on SQS.
    clock: Arc<Clock>,
}

/// Where a message went on to.
#[derive(Clone, Copy, Debug)]
enum Went {
    AroundAgain,
    HandedOver,
}

/// What becomes of one message.
#[derive(Clone, Debug)]
enum Verdict {
    /// Sent on; counted once its received message is deleted.
    Forward(Went),
    /// Not sent: another message in the same received message failed, so that
    /// one is kept, and this one goes on when it comes back.
    Held,
    /// Failed for a passing reason: its received message is kept and comes back.
    Retry(String),
    /// Can never go on: parked in the dead-letter queue with this reason.
    Park(String),
}

impl Verdict {
    /// Why the received message it came in must be kept to come back, if it must.
    fn keeps(&self, can_park: bool) -> Option<&str> {
        match self {
            Verdict::Retry(reason) => Some(reason),
            Verdict::Park(reason) if !can_park => Some(reason),
            Verdict::Held => Some("held while another message in it is retried"),
            Verdict::Forward(_) | Verdict::Park(_) => None,
        }
    }
}

/// The broker's stamps on a received message (a bundle's are its messages').
struct Stamps {
    sent_ms: u64,
    first_receive_ms: u64,
    receive_count: u32,
}

impl Stamps {
    fn of(message: &Message) -> Stamps {
        let system = message.attributes();
        let stamp = |name: MessageSystemAttributeName| -> u64 { system.and_then(|a| a.get(&name)).and_then(|v| v.parse().ok()).unwrap_or(0) };
        Stamps {
            sent_ms: stamp(MessageSystemAttributeName::SentTimestamp),
            first_receive_ms: stamp(MessageSystemAttributeName::ApproximateFirstReceiveTimestamp),
            receive_count: stamp(MessageSystemAttributeName::ApproximateReceiveCount) as u32,
        }
    }
}

/// One message as its planner sees it: received alone, or out of a bundle.
struct Item<'m> {
    /// The received message it came in.
    source: usize,
    /// Its SQS message id, or the id it kept in its bundle.
    id: String,
    attributes: Cow<'m, HashMap<String, MessageAttributeValue>>,
    body: Cow<'m, str>,
    from_bundle: bool,
    /// Why it cannot go on as it is: its bundle could not give back one of its attributes.
    damaged: Option<String>,
}

impl<'m> Item<'m> {
    fn alone(source: usize, message: &'m Message) -> Item<'m> {
        Item {
            source,
            id: message.message_id().unwrap_or_default().to_string(),
            attributes: message.message_attributes().map_or_else(|| Cow::Owned(HashMap::new()), Cow::Borrowed),
            body: Cow::Borrowed(message.body().unwrap_or_default()),
            from_bundle: false,
            damaged: None,
        }
    }

    fn bundled(source: usize, bundled: Bundled) -> Item<'m> {
        let (attributes, damaged) = bundled.sqs_attributes();
        Item {
            source,
            id: bundled.id,
            attributes: Cow::Owned(attributes),
            body: Cow::Owned(bundled.body),
            from_bundle: true,
            damaged: damaged.map(|e| e.to_string()),
        }
    }
}

/// A send the planner asked for, carrying the message at `key`.
struct Onward {
    key: usize,
    queue: String,
    entry: SendMessageBatchRequestEntry,
    size: usize,
}

/// How the messages in a received message ended, when none is left to go:
/// it is deleted once the ones to park are parked.
struct Settlement<'i, 'm> {
    forwarded: Vec<Went>,
    /// What to park and why: one of its messages, or (`None`) the whole received message.
    parks: Vec<(Option<&'i Item<'m>>, String)>,
}

impl<'i, 'm> Settlement<'i, 'm> {
    /// `Err` with why (its verdict's reason) when one of them is still to go
    /// (or to park, with nowhere to park it).
    fn of<'v>(parts: &[(&'i Item<'m>, &'v Verdict)], can_park: bool) -> Result<Self, &'v str> {
        let mut settlement = Settlement { forwarded: Vec::new(), parks: Vec::new() };
        for (item, verdict) in parts {
            if let Some(reason) = verdict.keeps(can_park) {
                return Err(reason);
            }
            match verdict {
                Verdict::Forward(went) => settlement.forwarded.push(*went),
                Verdict::Park(reason) => settlement.parks.push((Some(item), reason.clone())),
                // Kept above.
                Verdict::Retry(_) | Verdict::Held => {}
            }
        }
        Ok(settlement)
    }

    /// Counts the messages that went on: their received message is being deleted.
    fn count(&self, counters: &PumpCounters) {
        for went in &self.forwarded {
            let counter = match went {
                Went::AroundAgain => &counters.recycled,
                Went::HandedOver => &counters.handed_over,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// What already went on out of received messages that were kept (another
/// message in them failed), by SQS message id: when one comes back to this
/// pump, those are not sent again. Bounded; another pump receiving it sends
/// them again (at least once, as after a crash).
#[derive(Default)]
struct GoneOn {
    by_message: HashMap<String, HashMap<String, Went>>,
    /// Oldest first, for the bound (ids forgotten since are skipped).
    order: VecDeque<String>,
}

/// Kept received messages a pump remembers what went on from.
const REMEMBERED_MESSAGES: usize = 10_000;

impl GoneOn {
    fn get(&self, message_id: &str, item: &str) -> Option<Went> {
        self.by_message.get(message_id)?.get(item).copied()
    }

    fn remember(&mut self, message_id: &str, gone: Vec<(String, Went)>) {
        if gone.is_empty() {
            return;
        }
        let known = self.by_message.entry(message_id.to_string()).or_insert_with(|| {
            self.order.push_back(message_id.to_string());
            HashMap::new()
        });
        known.extend(gone);
        while self.by_message.len() > REMEMBERED_MESSAGES
            && let Some(oldest) = self.order.pop_front()
        {
            self.by_message.remove(&oldest);
        }
    }

    fn forget(&mut self, message_id: &str) {
        if self.by_message.remove(message_id).is_some() {
            self.order.retain(|id| id != message_id);
        }
    }
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
            gone_on: GoneOn::default(),
            counters: Arc::default(),
            clock: Clock::system(),
        })
    }

    /// A pump for `queue` whose dead-letter queue and visibility are prepared
    /// first as `settings` ask (created and set when `declaring`); with the
    /// queue as prepared.
    pub async fn open(
        executor: Arc<SqsExecutor>,
        planner: Box<dyn DueHandler>,
        queue: &str,
        wait_seconds: i32,
        settings: &PumpSettings,
        declaring: bool,
    ) -> Result<(Self, PreparedQueue), ExecutorError> {
        let prepared = executor.prepare_pumped(queue, settings, declaring).await?;
        let pump = Pump::new(executor, planner, queue, wait_seconds).await?.prepared(&prepared, settings);
        Ok((pump, prepared))
    }

    /// Reads SQS's clock into `clock` (the service's), and asks it the time.
    pub(crate) fn clocked(mut self, clock: Arc<Clock>) -> Self {
        self.clock = clock;
        self
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

    /// One receive (long poll) and everything it brought, stopped where
    /// `interrupt` says. Returns how many messages came.
    #[cfg(feature = "testing")]
    pub async fn pump_once(&mut self, interrupt: Interrupt) -> Result<usize, ExecutorError> {
        let received = self.receive().await?;
        self.process(&received, interrupt).await
    }

    /// A long poll for up to ten messages. Dropping it mid-poll is safe: a
    /// message it had taken comes back after its visibility timeout.
    async fn receive(&self) -> Result<Vec<Message>, ExecutorError> {
        let sent = monotonic_ms();
        let messages = self.executor.receive_ten(&self.queue, &self.url, self.wait_seconds).await?;
        let received = monotonic_ms();
        if messages.is_empty() {
            self.counters.empty_polls.fetch_add(1, Ordering::Relaxed);
        }
        // A first receive is stamped by SQS's clock during this very call: a
        // reading of it, tight at its lower end (SQS answers as soon as it hands a message out).
        let newest = messages.iter().map(Stamps::of).filter(|s| s.receive_count == 1 && s.first_receive_ms > 0).map(|s| s.first_receive_ms).max();
        if let Some(stamp) = newest {
            self.clock.record(Reading::stamp(stamp, sent, received), "SQS's first-receive stamps");
        }
        Ok(messages)
    }

    /// Sends each received message on and deletes it. Never cancelled halfway by `run`.
    async fn process(&mut self, messages: &[Message], interrupt: Interrupt) -> Result<usize, ExecutorError> {
        let stamps: Vec<Stamps> = messages.iter().map(Stamps::of).collect();
        let (items, unreadable) = self.unpack(messages, &stamps);
        let mut verdicts = Vec::with_capacity(items.len());
        let mut onward = Vec::new();
        for (key, item) in items.iter().enumerate() {
            let received = &messages[item.source];
            let verdict = if let Some(went) = self.gone_on.get(received.message_id().unwrap_or_default(), &item.id) {
                Verdict::Forward(went)
            } else if let Some(reason) = &item.damaged {
                Verdict::Park(reason.clone())
            } else {
                match self.decide(key, item, &stamps[item.source]) {
                    Ok((sends, went)) => {
                        onward.extend(sends);
                        Verdict::Forward(went)
                    }
                    Err(undeliverable) => Verdict::Park(undeliverable.to_string()),
                }
            };
            verdicts.push(verdict);
        }
        // Hand-overs first. A received message one of whose messages failed is
        // kept and comes back, so its others do not go around again meanwhile:
        // that would make a second copy of each.
        let (around_again, elsewhere): (Vec<Onward>, Vec<Onward>) = onward.into_iter().partition(|o| o.queue == self.queue);
        self.send_onward(elsewhere.into_iter().map(|o| (o.queue, Outgoing { entry: o.entry, size: o.size, members: vec![o.key] })).collect(), &mut verdicts)
            .await;
        let can_park = self.dead_letters.is_some();
        let kept: HashSet<usize> = items.iter().zip(&verdicts).filter(|(_, verdict)| verdict.keeps(can_park).is_some()).map(|(item, _)| item.source).collect();
        let mut candidates = Vec::new();
        for send in around_again {
            if kept.contains(&items[send.key].source) {
                verdicts[send.key] = Verdict::Held;
            } else {
                candidates.push(Candidate { key: send.key, id: items[send.key].id.clone(), entry: send.entry, size: send.size });
            }
        }
        let packed: Vec<_> = bundle::pack(&self.queue, candidates).into_iter().map(|o| (self.queue.clone(), o)).collect();
        let in_bundles: Vec<usize> = packed.iter().filter(|(_, o)| o.members.len() > 1).flat_map(|(_, o)| o.members.clone()).collect();
        self.send_onward(packed, &mut verdicts).await;
        let bundled = in_bundles.iter().filter(|key| matches!(verdicts[**key], Verdict::Forward(_))).count();
        self.counters.bundled.fetch_add(bundled as u64, Ordering::Relaxed);
        self.settle(messages, &items, &verdicts, &unreadable, interrupt).await?;
        Ok(messages.len())
    }

    /// The messages in what was received (a bundle's one by one), and for
    /// each received message why it could not be opened, if it could not.
    fn unpack<'m>(&self, messages: &'m [Message], stamps: &[Stamps]) -> (Vec<Item<'m>>, Vec<Option<String>>) {
        let mut items = Vec::new();
        let mut unreadable = vec![None; messages.len()];
        for (index, message) in messages.iter().enumerate() {
            match bundle::open(message) {
                None => items.push(Item::alone(index, message)),
                Some(Ok(bundled)) => items.extend(bundled.into_iter().map(|b| Item::bundled(index, b))),
                Some(Err(err)) => unreadable[index] = Some(err.to_string()),
            }
        }
        self.counters.received.fetch_add(items.len() as u64, Ordering::Relaxed);
        let redelivered = items.iter().filter(|item| stamps[item.source].receive_count > 1).count();
        self.counters.redelivered.fetch_add(redelivered as u64, Ordering::Relaxed);
        self.executor.note_carried(&self.queue, messages.len(), items.len());
        (items, unreadable)
    }

    /// What the planner makes of one message: its onward sends and where it
    /// goes, or why it can never go on.
    fn decide(&mut self, key: usize, item: &Item, stamps: &Stamps) -> Result<(Vec<Onward>, Went), Undeliverable> {
        let mut base: BTreeMap<String, FieldValue> = BTreeMap::new();
        let mut attributes = Vec::new();
        // The producer's properties ride along unchanged, unseen by the planner.
        let mut properties = PropertyAttributes::new();
        for (name, value) in item.attributes.iter() {
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
            message_id: item.id.clone(),
            attributes,
            sent_timestamp_ms: stamps.sent_ms,
            first_receive_timestamp_ms: stamps.first_receive_ms,
            receive_count: stamps.receive_count,
            // SQS's clock as read (never after it; the host's own before any reading):
            // a redelivered copy's remaining wait is counted on it.
            host_now_ms: self.clock.earliest_ms(),
        };
        let (commands, went) = match self.planner.handle_due(&due) {
            Ok(DueAction::Recycle(commands)) => (commands, Went::AroundAgain),
            Ok(DueAction::HandOver(commands)) => (commands, Went::HandedOver),
            Err(source) => return Err(Undeliverable::Planner { planner: self.planner.label().to_string(), source }),
        };
        let mut sends = Vec::with_capacity(commands.len());
        for (n, command) in commands.iter().enumerate() {
            let Command::Sqs(SqsCommand::Send { queue, attributes, .. }) = command else {
                return Err(Undeliverable::NotAnSqsSend { planner: self.planner.label().to_string() });
            };
            // The planner's attributes win over the message's own.
            let mut carried = base.clone();
            carried.retain(|key, _| !attributes.contains_key(key));
            let (entry, size) = self.executor.batch_entry(&format!("{key}-{n}"), command, &item.body, &carried, &properties)?;
            sends.push(Onward { key, queue: queue.clone(), entry, size });
        }
        Ok((sends, went))
    }

    /// Sends entries, each to its target queue, in batches per queue, every
    /// queue at once (a visit of bundles handed over to many destinations
    /// would otherwise wait for each in turn); one that failed for a passing
    /// reason is tried once more at once. The messages an entry carries are
    /// parked when SQS refused it or its queue is gone, retried when it did
    /// not go for another reason.
    async fn send_onward(&self, sends: Vec<(String, Outgoing)>, verdicts: &mut [Verdict]) {
        let mut by_queue: BTreeMap<String, Vec<(SendMessageBatchRequestEntry, usize)>> = BTreeMap::new();
        let mut carried_by: HashMap<String, Vec<usize>> = HashMap::new();
        for (queue, Outgoing { entry, size, members }) in sends {
            carried_by.insert(entry.id().to_string(), members);
            by_queue.entry(queue).or_default().push((entry, size));
        }
        let sent = futures_util::future::join_all(by_queue.into_iter().map(|(queue, entries)| async move {
            let mut failures = self.executor.send_batches(&queue, entries.clone()).await;
            let passing: HashSet<String> = failures.iter().filter(|(_, err)| !matches!(err, ExecutorError::Refused(_))).map(|(id, _)| id.clone()).collect();
            if !passing.is_empty() {
                failures.retain(|(id, _)| !passing.contains(id));
                let again: Vec<_> = entries.into_iter().filter(|(entry, _)| passing.contains(entry.id())).collect();
                failures.extend(self.executor.send_batches(&queue, again).await);
            }
            (queue, failures)
        }))
        .await;
        for (queue, failures) in sent {
            for (id, err) in failures {
                let verdict = match err {
                    ExecutorError::Refused(reason) => Verdict::Park(reason),
                    err => {
                        tracing::error!(queue = %queue, error = %err, "an onward send failed twice; its messages will be retried");
                        Verdict::Retry(err.to_string())
                    }
                };
                for key in carried_by.get(&id).into_iter().flatten() {
                    if matches!(verdicts[*key], Verdict::Forward(_)) {
                        verdicts[*key] = verdict.clone();
                    }
                }
            }
        }
    }

    /// Deletes each received message whose messages all went on or were
    /// parked; keeps the others to come back, remembering what already went.
    async fn settle(
        &mut self,
        messages: &[Message],
        items: &[Item<'_>],
        verdicts: &[Verdict],
        unreadable: &[Option<String>],
        interrupt: Interrupt,
    ) -> Result<(), ExecutorError> {
        let can_park = self.dead_letters.is_some();
        let parts_of = |index: usize| -> Vec<(&Item, &Verdict)> { items.iter().zip(verdicts).filter(|(item, _)| item.source == index).collect() };
        let mut deletes = Vec::new();
        let mut to_park = Vec::new();
        for (index, message) in messages.iter().enumerate() {
            let parts = parts_of(index);
            let settlement = match &unreadable[index] {
                Some(reason) if can_park => Ok(Settlement { forwarded: Vec::new(), parks: vec![(None, reason.clone())] }),
                Some(reason) => Err(reason.as_str()),
                None => Settlement::of(&parts, can_park),
            };
            match settlement {
                Ok(settlement) if settlement.parks.is_empty() => {
                    settlement.count(&self.counters);
                    deletes.push((index, delete_entry(index, message)?));
                }
                Ok(settlement) => to_park.push((index, message, settlement)),
                Err(reason) => self.keep(message, &parts, reason),
            }
        }
        let (parked, not_parked) = self.park(to_park).await?;
        deletes.extend(parked);
        for (index, reason) in not_parked {
            self.keep(&messages[index], &parts_of(index), &reason);
        }
        if interrupt == Interrupt::AfterSendBeforeDelete {
            return Ok(());
        }
        for (index, _) in &deletes {
            self.gone_on.forget(messages[*index].message_id().unwrap_or_default());
        }
        self.delete(deletes.into_iter().map(|(_, entry)| entry).collect()).await
    }

    /// Leaves a received message to come back after its visibility timeout,
    /// remembering which of its messages already went on.
    fn keep(&mut self, message: &Message, parts: &[(&Item, &Verdict)], reason: &str) {
        let gone: Vec<(String, Went)> = parts
            .iter()
            .filter_map(|(item, verdict)| match verdict {
                Verdict::Forward(went) => Some((item.id.clone(), *went)),
                _ => None,
            })
            .collect();
        let failed = parts.iter().filter(|(_, verdict)| matches!(verdict, Verdict::Retry(_) | Verdict::Park(_))).count().max(1);
        self.counters.failed.fetch_add(failed as u64, Ordering::Relaxed);
        tracing::error!(queue = %self.queue, error = %reason, "due message not forwarded; it will be retried");
        self.gone_on.remember(message.message_id().unwrap_or_default(), gone);
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

    /// Moves what can never go on to the dead-letter queue with its reason:
    /// a message received alone as it came, one out of a bundle by itself, an
    /// unreadable bundle whole. Returns the deletes of the received messages
    /// whose every part SQS took there (counted), and the others with why.
    #[allow(clippy::type_complexity)]
    async fn park(
        &self,
        to_park: Vec<(usize, &Message, Settlement<'_, '_>)>,
    ) -> Result<(Vec<(usize, DeleteMessageBatchRequestEntry)>, Vec<(usize, String)>), ExecutorError> {
        let Some(dead_letters) = &self.dead_letters else { return Ok((Vec::new(), Vec::new())) };
        if to_park.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        let fifo = dead_letters.ends_with(".fifo");
        let mut entries = Vec::new();
        for (index, message, settlement) in &to_park {
            for (n, (item, reason)) in settlement.parks.iter().enumerate() {
                tracing::warn!(queue = %self.queue, %dead_letters, message_id = message.message_id().unwrap_or_default(), %reason, "parking a message that cannot go on");
                let reason = [(PARKED_REASON_ATTRIBUTE.to_string(), reason.clone())];
                let entry = match item {
                    Some(item) if item.from_bundle => SetAside {
                        id: format!("{index}-{n}"),
                        message_id: &item.id,
                        group: &item.id,
                        body: &item.body,
                        attributes: item.attributes.clone().into_owned(),
                    }
                    .entry(&reason, fifo)?,
                    _ => {
                        let (mut entry, size) = set_aside_entry(*index, message, &reason, fifo)?;
                        entry.id = format!("{index}-{n}");
                        (entry, size)
                    }
                };
                entries.push(entry);
            }
        }
        let failed = self.executor.send_batches(dead_letters, entries).await;
        let mut deletes = Vec::new();
        let mut not_parked = Vec::new();
        for (index, message, settlement) in to_park {
            let prefix = format!("{index}-");
            if let Some((_, err)) = failed.iter().find(|(id, _)| id.starts_with(&prefix)) {
                not_parked.push((index, format!("could not park it in {dead_letters}: {err}")));
                continue;
            }
            self.counters.parked.fetch_add(settlement.parks.len() as u64, Ordering::Relaxed);
            settlement.count(&self.counters);
            deletes.push((index, delete_entry(index, message)?));
        }
        Ok((deletes, not_parked))
    }

    /// Pumps until `shutdown` turns true, finishing the batch in hand.
    pub async fn run(mut self, mut shutdown: tokio::sync::watch::Receiver<bool>) -> Result<(), ExecutorError> {
        let mut retry_pause = Duration::ZERO;
        while !*shutdown.borrow() {
            let Some(received) = unless_stopped(&mut shutdown, self.receive()).await else { break };
            let pause = match async { self.process_keeping_invisible(&received?).await }.await {
                Ok(count) => {
                    retry_pause = Duration::ZERO;
                    // The queue is drained for now: let the next batch gather.
                    if (1..10).contains(&count) { self.linger } else { Duration::ZERO }
                }
                Err(err) => {
                    retry_pause = next_retry_pause(retry_pause);
                    tracing::warn!(queue = %self.queue, error = %err, retry_in = ?retry_pause, "pump cycle failed; retrying");
                    retry_pause
                }
            };
            // A stop meanwhile ends the loop at its check.
            if !pause.is_zero() {
                pause_unless_stopped(&mut shutdown, pause).await;
            }
        }
        Ok(())
    }
}

/// The pause before a pump tries again after `previous` (zero: the first
/// failure): 1 s, doubling while it keeps failing (its queue deleted, SQS
/// unreachable) up to 30 s, so a queue that is gone costs a request and a
/// warning every 30 s, not every second.
fn next_retry_pause(previous: Duration) -> Duration {
    (previous * 2).clamp(Duration::from_secs(1), Duration::from_secs(30))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_pump_waits_longer_each_time_up_to_30_s() {
        let mut pause = Duration::ZERO;
        let pauses: Vec<u64> = (0..8)
            .map(|_| {
                pause = next_retry_pause(pause);
                pause.as_secs()
            })
            .collect();
        assert_eq!(pauses, [1, 2, 4, 8, 16, 30, 30, 30]);
    }

    #[test]
    fn what_went_on_from_a_kept_message_is_remembered_until_it_is_deleted_and_within_a_bound() {
        let mut gone_on = GoneOn::default();
        gone_on.remember("sqs-1", vec![("a".into(), Went::HandedOver)]);
        gone_on.remember("sqs-1", vec![("b".into(), Went::AroundAgain)]);
        assert!(matches!(gone_on.get("sqs-1", "a"), Some(Went::HandedOver)));
        assert!(matches!(gone_on.get("sqs-1", "b"), Some(Went::AroundAgain)));
        assert!(gone_on.get("sqs-1", "c").is_none() && gone_on.get("sqs-2", "a").is_none());
        gone_on.forget("sqs-1");
        assert!(gone_on.get("sqs-1", "a").is_none(), "deleted: nothing left to skip");
        assert!(gone_on.order.is_empty());
        for n in 0..REMEMBERED_MESSAGES + 5 {
            gone_on.remember(&format!("m{n}"), vec![("x".into(), Went::HandedOver)]);
        }
        assert_eq!(gone_on.by_message.len(), REMEMBERED_MESSAGES);
        assert!(gone_on.get("m0", "x").is_none(), "the oldest forgotten first");
        assert!(gone_on.get(&format!("m{}", REMEMBERED_MESSAGES + 4), "x").is_some());
    }

    #[test]
    fn a_received_message_is_settled_only_when_none_of_its_messages_is_left_to_go() {
        let message = Message::builder().message_id("sqs-1").body("b").build();
        let item = Item::alone(0, &message);
        let forward = Verdict::Forward(Went::HandedOver);
        let park = Verdict::Park("refused".into());
        let settled = Settlement::of(&[(&item, &forward), (&item, &park)], true).unwrap();
        assert_eq!((settled.forwarded.len(), settled.parks.len()), (1, 1));
        assert!(Settlement::of(&[(&item, &forward), (&item, &park)], false).is_err(), "nowhere to park: kept");
        assert!(Settlement::of(&[(&item, &forward), (&item, &Verdict::Held)], true).is_err());
        assert!(Settlement::of(&[(&item, &forward), (&item, &Verdict::Retry("later".into()))], true).is_err());
    }
}
