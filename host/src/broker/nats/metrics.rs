//! What a NATS held stream counts of its own: its deliveries by outcome,
//! kept as atomics by its consumer and copied into Prometheus at each scrape.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::metrics::{BrokerMetric, Metrics};

pub(crate) const HELD_DELIVERIES: BrokerMetric = BrokerMetric {
    name: "held_deliveries",
    help: "Deliveries of a NATS held stream (queue) by what became of them: waited, handed_over, parked, cancelled, retried",
};

/// Every family NATS registers.
pub const METRICS: &[BrokerMetric] = &[HELD_DELIVERIES];

/// Counts a consumer of `stream` in `hourglass_held_deliveries_total{queue, outcome}`.
pub(crate) fn count_hold(metrics: &Metrics, stream: &str, counters: Arc<HoldCounters>) {
    let stream = stream.to_string();
    metrics.count_from(metrics.broker_counters(&HELD_DELIVERIES), move || {
        counters.by_outcome().into_iter().map(|(outcome, count)| (vec![("queue", stream.clone()), ("outcome", outcome.to_string())], count)).collect()
    });
}

/// What became of the deliveries a NATS held stream's consumer handled (`broker::nats::hold`).
#[derive(Debug, Default)]
pub struct HoldCounters {
    pub waited: AtomicU64,
    pub handed_over: AtomicU64,
    pub parked: AtomicU64,
    /// Dropped at hand-over: cancelled.
    pub cancelled: AtomicU64,
    /// Delivered again later: the server or the planner could not answer now.
    pub retried: AtomicU64,
}

impl HoldCounters {
    fn by_outcome(&self) -> [(&'static str, u64); 5] {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        [
            ("waited", get(&self.waited)),
            ("handed_over", get(&self.handed_over)),
            ("parked", get(&self.parked)),
            ("cancelled", get(&self.cancelled)),
            ("retried", get(&self.retried)),
        ]
    }
}
