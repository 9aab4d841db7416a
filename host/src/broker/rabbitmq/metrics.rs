//! What RabbitMQ counts of its own: the channels its connections hold open,
//! and what its parking queues' consumers did.

use crate::metrics::{BrokerMetric, Metrics};

pub(crate) const OPEN_CHANNELS: BrokerMetric = BrokerMetric { name: "open_channels", help: "AMQP channels open, by connection" };

pub(crate) const UNPARKED: BrokerMetric = BrokerMetric {
    name: "unparked_messages",
    help: "Messages a serving host took from a strategy's parking queue: forwarded, released (to a cancellable strategy's release queue), rescheduled, orphaned (their destination was gone), requeued",
};

/// Every family RabbitMQ registers.
pub const METRICS: &[BrokerMetric] = &[OPEN_CHANNELS, UNPARKED];

/// A message left `strategy`'s parking queue through the service (`outcome` from a fixed set).
pub(crate) fn count_unparked(metrics: &Metrics, strategy: &str, outcome: &str) {
    let labels = vec![("strategy", metrics.strategy_label(strategy)), ("outcome", outcome.to_string())];
    metrics.broker_counters(&UNPARKED).get_or_create(&labels).inc();
}

/// Reads `open` (channels open per connection) into `hourglass_open_channels{connection}` at each scrape.
pub(crate) fn watch_open_channels(metrics: &Metrics, open: impl Fn() -> Vec<(&'static str, i64)> + Send + Sync + 'static) {
    let gauges = metrics.broker_gauges(&OPEN_CHANNELS);
    metrics.on_scrape(move || {
        for (connection, channels) in open() {
            gauges.get_or_create(&vec![("connection", connection.to_string())]).set(channels);
        }
    });
}
