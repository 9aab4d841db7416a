//! What one message costs on SQS, from its simulated route.
//!
//! A message pays its first send, then a receive, a send and a delete each
//! time it surfaces on a pumped queue. Alone in its queue it pays each request
//! itself. In a busy one the requests are shared: first sends and hand-overs
//! go ten to a request, a receive brings ten SQS messages, and what a pump
//! sends around again travels in bundles of as many messages as fit 64 KiB
//! (the SQS executor's bundles), so from the second visit on ten bundles
//! share each receive, send and delete. SQS bills every 64 KiB of a request's
//! payload as a request of its own, so a receive of ten full bundles is
//! billed as ten. [`cohort_requests`] follows that, receive by receive, for
//! messages scheduled together; the estimate for a busy queue is a thousand
//! messages of 1 KiB. Long polls that find nothing are the pumps' idle cost,
//! per queue and not per message, and are left out.

use serde::Serialize;

use crate::command::SQS_BILLED_BYTES;
use crate::sim::{Hop, HopStep};

/// Messages SQS carries in one batch request.
pub(crate) const SQS_BATCH: u64 = 10;
/// A `SendMessageBatch` carries at most this many bytes in all.
const SQS_MAX_BATCH_BYTES: u64 = 256 * 1024;
/// The busy queue of the estimate: this many messages due together…
pub const BUSY_COHORT: u64 = 1_000;
/// …of this many bytes each (body and attributes).
pub const BUSY_MESSAGE_BYTES: u64 = 1_024;
/// What a message adds inside a bundle beyond its own bytes: its id and the JSON around it.
pub(super) const BUNDLED_OVERHEAD_BYTES: u64 = 200;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SqsCost {
    pub pump_visits: u64,
    /// Requests when every one carries this message alone.
    pub requests_alone: u64,
    /// Billed requests per message among [`BUSY_COHORT`] messages of [`BUSY_MESSAGE_BYTES`] due together.
    pub requests_in_a_busy_queue: f64,
    pub price_per_million_usd: f64,
    pub cost_usd_alone: f64,
    pub cost_usd_in_a_busy_queue: f64,
}

impl SqsCost {
    pub fn of_route(hops: &[Hop], price_per_million: f64) -> SqsCost {
        let pump_visits = hops.iter().filter(|h| matches!(h.step, HopStep::Pump { .. })).count() as u64;
        let requests_alone = 1 + 3 * pump_visits;
        let busy = cohort_requests(BUSY_COHORT, pump_visits, BUSY_MESSAGE_BYTES);
        let requests_in_a_busy_queue = busy as f64 / BUSY_COHORT as f64;
        SqsCost {
            pump_visits,
            requests_alone,
            requests_in_a_busy_queue,
            price_per_million_usd: price_per_million,
            cost_usd_alone: requests_alone as f64 * price_per_million / 1e6,
            cost_usd_in_a_busy_queue: requests_in_a_busy_queue * price_per_million / 1e6,
        }
    }
}

/// How many messages of `message_bytes` one bundle holds.
pub(crate) fn messages_per_bundle(message_bytes: u64) -> u64 {
    (SQS_BILLED_BYTES as u64 / (message_bytes + BUNDLED_OVERHEAD_BYTES)).max(1)
}

/// A request carrying `bytes` of messages, as SQS bills it.
pub(super) fn billed(bytes: u64) -> u64 {
    bytes.div_ceil(SQS_BILLED_BYTES as u64).max(1)
}

/// Billed requests that send SQS messages of these sizes, in batches of ten and 256 KiB.
pub(super) fn sends(sizes: &[u64]) -> u64 {
    let (mut requests, mut entries, mut bytes) = (0, 0, 0);
    for size in sizes {
        if entries == SQS_BATCH || bytes + size > SQS_MAX_BATCH_BYTES {
            requests += billed(bytes);
            (entries, bytes) = (0, 0);
        }
        entries += 1;
        bytes += size;
    }
    if entries > 0 { requests + billed(bytes) } else { requests }
}

/// Billed requests `messages` of `message_bytes` scheduled together to one
/// destination spend in all (first sends included) when each surfaces
/// `pump_visits` times, the last being the hand-over, and every receive is
/// full: ten SQS messages, each alone or a bundle.
pub fn cohort_requests(messages: u64, pump_visits: u64, message_bytes: u64) -> u64 {
    let per_bundle = messages_per_bundle(message_bytes);
    let bundle_bytes = |carried: u64| if carried == 1 { message_bytes } else { carried * (message_bytes + BUNDLED_OVERHEAD_BYTES) };
    let mut requests = sends(&vec![message_bytes; messages as usize]);
    // How many messages each SQS message in the queue carries, in order.
    let mut queued: Vec<u64> = vec![1; messages as usize];
    for visit in 1..=pump_visits {
        let mut next = Vec::new();
        for received in queued.chunks(SQS_BATCH as usize) {
            let carried: u64 = received.iter().sum();
            // The receive, billed by what it brought, and the delete.
            requests += billed(received.iter().map(|c| bundle_bytes(*c)).sum()) + 1;
            if visit == pump_visits {
                requests += sends(&vec![message_bytes; carried as usize]);
                continue;
            }
            let bundles: Vec<u64> = (0..carried.div_ceil(per_bundle)).map(|n| per_bundle.min(carried - n * per_bundle)).collect();
            requests += sends(&bundles.iter().map(|c| bundle_bytes(*c)).collect::<Vec<_>>());
            next.extend(bundles);
        }
        queued = next;
    }
    requests
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lone_message_pays_every_request_and_a_cohort_shares_them() {
        // One message, three visits: first send, then receive + send + delete three times.
        assert_eq!(cohort_requests(1, 3, 100), 10);
        // Thirty small ones: 3 first sends; visit 1: 3 receives of ten, each re-sent as one
        // bundle, 3 deletes; visit 2: one receive of the three bundles, one bundle of 30, one
        // delete; hand-over: one receive, three sends of ten, one delete.
        assert_eq!(cohort_requests(30, 3, 100), 3 + 9 + 3 + 5);
        // No visits: the first sends alone.
        assert_eq!(cohort_requests(25, 0, 100), 3);
    }

    #[test]
    fn large_messages_are_billed_by_the_64_kib() {
        // 40 KiB messages: a bundle holds one, so they travel alone, a send of ten is
        // billed seven times over (ten of 40 KiB do not fit 256 KiB: batches of six and four).
        assert_eq!(messages_per_bundle(40 * 1024), 1);
        assert_eq!(sends(&[40 * 1024; 10]), 4 + 3);
    }

    #[test]
    fn a_thousand_messages_on_long_delays_cost_a_few_billed_requests_per_visit() {
        let short = cohort_requests(BUSY_COHORT, 3, BUSY_MESSAGE_BYTES);
        let long = cohort_requests(BUSY_COHORT, 103, BUSY_MESSAGE_BYTES);
        let per_visit = (long - short) as f64 / 100.0;
        // 1,000 messages of 1 KiB are about 1.2 MB in 19 bundles: about 19 billed to receive
        // them, 19 to send them again, 2 deletes. Without bundles: 300.
        assert!((35.0..=45.0).contains(&per_visit), "{per_visit}");
    }
}
