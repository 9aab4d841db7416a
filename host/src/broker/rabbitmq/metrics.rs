//! What RabbitMQ counts of its own: the channels its connections hold open.

use crate::metrics::{BrokerMetric, Metrics};

pub(crate) const OPEN_CHANNELS: BrokerMetric = BrokerMetric { name: "open_channels", help: "AMQP channels open, by connection" };

/// Every family RabbitMQ registers.
pub const METRICS: &[BrokerMetric] = &[OPEN_CHANNELS];

/// Reads `open` (channels open per connection) into `hourglass_open_channels{connection}` at each scrape.
pub(crate) fn watch_open_channels(metrics: &Metrics, open: impl Fn() -> Vec<(&'static str, i64)> + Send + Sync + 'static) {
    let gauges = metrics.broker_gauges(&OPEN_CHANNELS);
    metrics.on_scrape(move || {
        for (connection, channels) in open() {
            gauges.get_or_create(&vec![("connection", connection.to_string())]).set(channels);
        }
    });
}
