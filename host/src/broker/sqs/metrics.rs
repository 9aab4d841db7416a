//! What SQS counts of its own: requests by kind (the bill) and each pump's
//! cycles, kept as atomics where they happen and copied into Prometheus
//! families at each scrape.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use crate::metrics::{BrokerMetric, Metrics};

pub(crate) const SQS_REQUESTS: BrokerMetric = BrokerMetric { name: "sqs_requests", help: "SQS API requests by kind" };
pub(crate) const PUMP_CYCLES: BrokerMetric =
    BrokerMetric { name: "pump_cycles", help: "Messages a pump received and sent on (around again or to the destination)" };
pub(crate) const PUMP_PARKED: BrokerMetric =
    BrokerMetric { name: "pump_parked", help: "Messages a pump moved to its queue's dead-letter queue, with the reason, because they could not go on" };
pub(crate) const PUMP_EMPTY_POLLS: BrokerMetric =
    BrokerMetric { name: "pump_empty_polls", help: "Long polls of a pump that came back empty: what an idle pumped queue costs in SQS requests" };
pub(crate) const PUMP_BUNDLED: BrokerMetric =
    BrokerMetric { name: "pump_bundled", help: "Messages a pump sent around again in a bundle (several in one SQS message, sharing its requests)" };

/// Every family SQS registers.
pub const METRICS: &[BrokerMetric] = &[SQS_REQUESTS, PUMP_CYCLES, PUMP_PARKED, PUMP_EMPTY_POLLS, PUMP_BUNDLED];

/// Counts `counts` in `hourglass_sqs_requests_total{kind}`.
pub(crate) fn count_requests(metrics: &Metrics, counts: Arc<RequestCounts>) {
    metrics.count_from(metrics.broker_counters(&SQS_REQUESTS), move || {
        counts.by_kind().into_iter().map(|(kind, count)| (vec![("kind", kind.to_string())], count)).collect()
    });
}

/// Counts a pump of `queue` in the pump families, labelled with its queue.
pub(crate) fn count_pump(metrics: &Metrics, queue: &str, counters: Arc<PumpCounters>) {
    type Count = fn(&PumpStats) -> u64;
    let read: [(BrokerMetric, Count); 4] = [
        (PUMP_CYCLES, |stats| stats.recycled + stats.handed_over),
        (PUMP_PARKED, |stats| stats.parked),
        (PUMP_EMPTY_POLLS, |stats| stats.empty_polls),
        (PUMP_BUNDLED, |stats| stats.bundled),
    ];
    for (metric, count) in read {
        let (queue, counters) = (queue.to_string(), counters.clone());
        metrics.count_from(metrics.broker_counters(&metric), move || vec![(vec![("queue", queue.clone())], count(&counters.snapshot()))]);
    }
}

/// Every SQS request made, by kind: the bill.
#[derive(Debug, Default)]
pub struct RequestCounts {
    pub get_queue_url: AtomicU64,
    pub create_queue: AtomicU64,
    pub get_queue_attributes: AtomicU64,
    pub send_message: AtomicU64,
    pub send_message_batch: AtomicU64,
    pub receive_message: AtomicU64,
    pub delete_message_batch: AtomicU64,
    pub change_message_visibility_batch: AtomicU64,
    pub list_queues: AtomicU64,
    pub list_queue_tags: AtomicU64,
    pub tag_queue: AtomicU64,
    pub set_queue_attributes: AtomicU64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RequestSnapshot {
    pub get_queue_url: u64,
    pub create_queue: u64,
    pub get_queue_attributes: u64,
    pub send_message: u64,
    pub send_message_batch: u64,
    pub receive_message: u64,
    pub delete_message_batch: u64,
    pub change_message_visibility_batch: u64,
    pub list_queues: u64,
    pub list_queue_tags: u64,
    pub tag_queue: u64,
    pub set_queue_attributes: u64,
}

impl RequestSnapshot {
    /// Requests that move messages (what a steady state pays for).
    pub fn message_requests(&self) -> u64 {
        self.send_message + self.send_message_batch + self.receive_message + self.delete_message_batch
    }

    /// The requests made since `earlier` was taken.
    pub fn since(&self, earlier: &RequestSnapshot) -> RequestSnapshot {
        RequestSnapshot {
            get_queue_url: self.get_queue_url - earlier.get_queue_url,
            create_queue: self.create_queue - earlier.create_queue,
            get_queue_attributes: self.get_queue_attributes - earlier.get_queue_attributes,
            send_message: self.send_message - earlier.send_message,
            send_message_batch: self.send_message_batch - earlier.send_message_batch,
            receive_message: self.receive_message - earlier.receive_message,
            delete_message_batch: self.delete_message_batch - earlier.delete_message_batch,
            change_message_visibility_batch: self.change_message_visibility_batch - earlier.change_message_visibility_batch,
            list_queues: self.list_queues - earlier.list_queues,
            list_queue_tags: self.list_queue_tags - earlier.list_queue_tags,
            tag_queue: self.tag_queue - earlier.tag_queue,
            set_queue_attributes: self.set_queue_attributes - earlier.set_queue_attributes,
        }
    }
}

impl RequestCounts {
    pub fn snapshot(&self) -> RequestSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        RequestSnapshot {
            get_queue_url: get(&self.get_queue_url),
            create_queue: get(&self.create_queue),
            get_queue_attributes: get(&self.get_queue_attributes),
            send_message: get(&self.send_message),
            send_message_batch: get(&self.send_message_batch),
            receive_message: get(&self.receive_message),
            delete_message_batch: get(&self.delete_message_batch),
            change_message_visibility_batch: get(&self.change_message_visibility_batch),
            list_queues: get(&self.list_queues),
            list_queue_tags: get(&self.list_queue_tags),
            tag_queue: get(&self.tag_queue),
            set_queue_attributes: get(&self.set_queue_attributes),
        }
    }
}

impl RequestCounts {
    /// Each request kind by its SQS API name, for metrics.
    pub fn by_kind(&self) -> [(&'static str, u64); 12] {
        let s = self.snapshot();
        [
            ("GetQueueUrl", s.get_queue_url),
            ("CreateQueue", s.create_queue),
            ("GetQueueAttributes", s.get_queue_attributes),
            ("SendMessage", s.send_message),
            ("SendMessageBatch", s.send_message_batch),
            ("ReceiveMessage", s.receive_message),
            ("DeleteMessageBatch", s.delete_message_batch),
            ("ChangeMessageVisibilityBatch", s.change_message_visibility_batch),
            ("ListQueues", s.list_queues),
            ("ListQueueTags", s.list_queue_tags),
            ("TagQueue", s.tag_queue),
            ("SetQueueAttributes", s.set_queue_attributes),
        ]
    }
}

#[derive(Debug, Default)]
pub struct PumpCounters {
    pub received: AtomicU64,
    pub recycled: AtomicU64,
    pub handed_over: AtomicU64,
    /// Messages received more than once (a pump died, or a delete failed).
    pub redelivered: AtomicU64,
    pub failed: AtomicU64,
    /// Messages moved to the queue's dead-letter queue with the reason they could not go on.
    pub parked: AtomicU64,
    /// Long polls that found nothing: the pump's idle cost.
    pub empty_polls: AtomicU64,
    /// Messages sent around again in a bundle (several in one SQS message).
    pub bundled: AtomicU64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PumpStats {
    pub received: u64,
    pub recycled: u64,
    pub handed_over: u64,
    pub redelivered: u64,
    pub failed: u64,
    pub parked: u64,
    pub empty_polls: u64,
    pub bundled: u64,
}

impl PumpCounters {
    pub fn snapshot(&self) -> PumpStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        PumpStats {
            received: get(&self.received),
            recycled: get(&self.recycled),
            handed_over: get(&self.handed_over),
            redelivered: get(&self.redelivered),
            failed: get(&self.failed),
            parked: get(&self.parked),
            empty_polls: get(&self.empty_polls),
            bundled: get(&self.bundled),
        }
    }
}
