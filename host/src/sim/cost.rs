//! What one message costs on SQS, from its simulated route.
//!
//! A message pays its first send, then a receive, a send and a delete each
//! time it surfaces on a pumped queue. Alone in its queue it pays each request
//! itself; in a busy one ten messages share every request (first sends are
//! coalesced, the pump receives, re-sends and deletes ten at a time), which is
//! what the pump spends under load. Long polls that find nothing are the
//! pumps' idle cost, per queue and not per message, and are left out.

use serde::Serialize;

use super::{Hop, HopStep};

/// Messages SQS carries in one batch request.
pub const SQS_BATCH: u64 = 10;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SqsCost {
    pub pump_visits: u64,
    /// Requests when every one carries this message alone.
    pub requests_alone: u64,
    /// Requests when every one carries ten messages (a busy queue).
    pub requests_in_batches: f64,
    pub price_per_million_usd: f64,
    pub cost_usd_alone: f64,
    pub cost_usd_in_batches: f64,
}

impl SqsCost {
    pub fn of_route(hops: &[Hop], price_per_million: f64) -> SqsCost {
        let pump_visits = hops.iter().filter(|h| matches!(h.step, HopStep::Pump { .. })).count() as u64;
        let requests_alone = 1 + 3 * pump_visits;
        let requests_in_batches = requests_alone as f64 / SQS_BATCH as f64;
        SqsCost {
            pump_visits,
            requests_alone,
            requests_in_batches,
            price_per_million_usd: price_per_million,
            cost_usd_alone: requests_alone as f64 * price_per_million / 1e6,
            cost_usd_in_batches: requests_in_batches * price_per_million / 1e6,
        }
    }
}
