//! SQS queues: per-message and queue-level delays, FIFO deduplication.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use super::{Arrival, Hop, HopStep, SimError, SimMessage};
use crate::command::DueMessage;

/// SQS forgets a deduplication id after five minutes.
const DEDUP_WINDOW_MS: u64 = 5 * 60_000;

struct Stored {
    message: SimMessage,
    sent_ms: u64,
}

struct SqsQueue {
    attributes: BTreeMap<String, String>,
    fifo: bool,
    delay_seconds: u32,
    pumped: bool,
    destination: bool,
    messages: HashMap<u64, Stored>,
    dedup: HashMap<String, u64>,
}

/// Send options beside the message itself.
pub struct Send {
    pub delay_seconds: u32,
    pub group_id: Option<String>,
    pub dedup_id: Option<String>,
}

/// A message received from a pumped queue, with the broker's stamps.
#[derive(Debug)]
pub struct DueSqsMessage {
    pub queue: String,
    pub message: SimMessage,
    pub sent_timestamp_ms: u64,
    pub first_receive_timestamp_ms: u64,
    pub receive_count: u32,
}

impl DueSqsMessage {
    /// What its planner is asked about it, its times counted from `epoch_ms`
    /// (the simulator's clock starts at 0) and `now_ms` the simulator's now.
    pub(crate) fn question(&self, epoch_ms: u64, now_ms: u64) -> DueMessage {
        DueMessage {
            queue: self.queue.clone(),
            message_id: self.message.id.clone(),
            attributes: self.message.sqs_attributes.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            sent_timestamp_ms: epoch_ms + self.sent_timestamp_ms,
            first_receive_timestamp_ms: epoch_ms + self.first_receive_timestamp_ms,
            receive_count: self.receive_count,
            host_now_ms: epoch_ms + now_ms,
        }
    }
}

pub(crate) enum Fired {
    Arrived(Arrival),
    Due(DueSqsMessage),
    Nothing,
}

#[derive(Default)]
pub(crate) struct SqsBroker {
    queues: BTreeMap<String, SqsQueue>,
    visible: BinaryHeap<Reverse<(u64, u64, String)>>,
    sequence: u64,
}

impl SqsBroker {
    /// Every message in a queue that is not a destination, as (queue, message id).
    pub fn waiting(&self) -> impl Iterator<Item = (&str, &str)> {
        self.queues.iter().filter(|(_, q)| !q.destination).flat_map(|(name, q)| q.messages.values().map(move |m| (name.as_str(), m.message.id.as_str())))
    }

    pub fn declare_destination(&mut self, name: &str) {
        self.queues.entry(name.to_string()).or_insert(SqsQueue {
            attributes: BTreeMap::new(),
            fifo: name.ends_with(".fifo"),
            delay_seconds: 0,
            pumped: false,
            destination: true,
            messages: HashMap::new(),
            dedup: HashMap::new(),
        });
    }

    pub fn ensure_queue(&mut self, name: &str, attributes: &BTreeMap<String, String>, pumped: bool) -> Result<(), SimError> {
        if let Some(existing) = self.queues.get(name) {
            let wrong: Vec<String> = attributes
                .iter()
                .filter(|(k, v)| existing.attributes.get(*k) != Some(*v))
                .map(|(k, v)| format!("{k}: wanted {v}, queue has {}", existing.attributes.get(k).map_or("(unset)", String::as_str)))
                .collect();
            if !wrong.is_empty() {
                return Err(SimError::PreconditionFailed(format!("SQS queue {name:?}: {}", wrong.join("; "))));
            }
            return Ok(());
        }
        let delay_seconds = match attributes.get("DelaySeconds") {
            Some(v) => v.parse().map_err(|_| SimError::Invalid(format!("SQS queue {name:?}: DelaySeconds {v:?}")))?,
            None => 0,
        };
        self.queues.insert(
            name.to_string(),
            SqsQueue {
                attributes: attributes.clone(),
                fifo: name.ends_with(".fifo"),
                delay_seconds,
                pumped,
                destination: false,
                messages: HashMap::new(),
                dedup: HashMap::new(),
            },
        );
        Ok(())
    }

    pub fn send(&mut self, name: &str, message: SimMessage, send: Send, now: u64) -> Result<(), SimError> {
        let queue = self.queues.get_mut(name).ok_or_else(|| SimError::NotFound(format!("SQS queue {name:?} does not exist")))?;
        let delay_seconds = if queue.fifo {
            if send.group_id.is_none() {
                return Err(SimError::Invalid(format!("send to FIFO queue {name:?} without a message group id")));
            }
            if send.delay_seconds != 0 {
                return Err(SimError::Invalid(format!("FIFO queue {name:?} takes no per-message DelaySeconds")));
            }
            let dedup = send.dedup_id.ok_or_else(|| SimError::Invalid(format!("send to FIFO queue {name:?} without a deduplication id")))?;
            queue.dedup.retain(|_, sent| now < *sent + DEDUP_WINDOW_MS);
            if queue.dedup.contains_key(&dedup) {
                // SQS accepts the send and keeps only the first copy.
                return Ok(());
            }
            queue.dedup.insert(dedup, now);
            queue.delay_seconds
        } else {
            send.delay_seconds
        };
        self.sequence += 1;
        queue.messages.insert(self.sequence, Stored { message, sent_ms: now });
        self.visible.push(Reverse((now + u64::from(delay_seconds) * 1_000, self.sequence, name.to_string())));
        Ok(())
    }

    pub(crate) fn next_event_ms(&self) -> Option<u64> {
        self.visible.peek().map(|Reverse((at, _, _))| *at)
    }

    pub(crate) fn fire(&mut self, now: u64) -> Fired {
        let Some(Reverse((_, sequence, name))) = self.visible.pop() else { return Fired::Nothing };
        let Some(queue) = self.queues.get_mut(&name) else { return Fired::Nothing };
        let (destination, pumped) = (queue.destination, queue.pumped);
        if !destination && !pumped {
            // Visible, but nobody here consumes this queue: it stays, as on SQS.
            return Fired::Nothing;
        }
        let Some(Stored { mut message, sent_ms }) = queue.messages.remove(&sequence) else { return Fired::Nothing };
        let then = if destination { "arrived" } else { "received by the pump" }.to_string();
        message.hops.push(Hop { at_ms: now, step: HopStep::SqsQueue { name: name.clone(), waited_ms: now - sent_ms, then } });
        if destination {
            return Fired::Arrived(Arrival { queue: name, at_ms: now, message });
        }
        Fired::Due(DueSqsMessage { queue: name, message, sent_timestamp_ms: sent_ms, first_receive_timestamp_ms: now, receive_count: 1 })
    }
}
