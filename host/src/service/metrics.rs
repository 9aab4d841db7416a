//! Prometheus metrics of the service.

use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Route {
    strategy: String,
    destination: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Field {
    field: String,
}

pub struct Metrics {
    registry: Mutex<Registry>,
    scheduled: Family<Route, Counter>,
    failed: Family<Route, Counter>,
    rejected: Family<Field, Counter>,
    schedule_seconds: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("hourglass");
        let scheduled = Family::<Route, Counter>::default();
        let failed = Family::<Route, Counter>::default();
        let rejected = Family::<Field, Counter>::default();
        let schedule_seconds = Histogram::new(exponential_buckets(0.0005, 2.0, 14));
        registry.register("messages_scheduled", "Messages the broker confirmed", scheduled.clone());
        registry.register("messages_failed", "Messages that could not be scheduled", failed.clone());
        registry.register("requests_rejected", "Requests refused before planning, by offending field", rejected.clone());
        registry.register("schedule_seconds", "Plan plus confirmed publish, per message", schedule_seconds.clone());
        Metrics { registry: Mutex::new(registry), scheduled, failed, rejected, schedule_seconds }
    }
}

impl Metrics {
    pub fn scheduled(&self, strategy: &str, destination: &str) {
        self.scheduled.get_or_create(&Route { strategy: strategy.into(), destination: destination.into() }).inc();
    }

    pub fn failed(&self, strategy: &str, destination: &str) {
        self.failed.get_or_create(&Route { strategy: strategy.into(), destination: destination.into() }).inc();
    }

    pub fn rejected(&self, field: &str) {
        self.rejected.get_or_create(&Field { field: field.into() }).inc();
    }

    pub fn observe_schedule(&self, took: Duration) {
        self.schedule_seconds.observe(took.as_secs_f64());
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        prometheus_client::encoding::text::encode(&mut out, &registry).expect("writing to a String cannot fail");
        out
    }
}
