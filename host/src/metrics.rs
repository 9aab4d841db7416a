//! Prometheus metrics, shared by the scheduler, the service and the ingress;
//! a broker registers families of its own ([`BrokerMetric`], declared in its
//! folder) when its side starts. Encoded as OpenMetrics text for `GET /metrics`.
//!
//! Every label set is bounded: a strategy or destination label is a name from
//! the config (set by [`Metrics::bound_labels`]), anything else counts as
//! `other`, so a client cannot grow the series without limit.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Strategy {
    strategy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Level {
    strategy: String,
    level: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaskLabel {
    task: String,
}

/// The label value for anything not named in the config.
pub(crate) const OTHER_LABEL: &str = "other";

/// A metric family a broker keeps of its own (SQS requests, a NATS hold's
/// deliveries, …): declared in the broker's folder, registered when its side
/// starts, sampled with labels as name–value pairs.
#[derive(Clone, Copy, Debug)]
pub struct BrokerMetric {
    /// Without the `hourglass_` prefix (and a counter's `_total`).
    pub name: &'static str,
    pub help: &'static str,
}

/// A broker's label set: each label's name and value.
pub(crate) type BrokerLabels = Vec<(&'static str, String)>;
pub(crate) type BrokerCounters = Family<BrokerLabels, Counter>;
pub(crate) type BrokerGauges = Family<BrokerLabels, Gauge>;

/// The names a strategy or destination label may take.
#[derive(Default)]
struct LabelBounds {
    strategies: std::collections::HashSet<String>,
    destinations: std::collections::HashSet<String>,
    /// Every name either label was ever allowed: a reload can drop a name
    /// whose series stay, and still count in the totals.
    ever_strategies: std::collections::BTreeSet<String>,
    ever_destinations: std::collections::BTreeSet<String>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StrategyOutcome {
    strategy: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueOutcome {
    queue: String,
    outcome: String,
}

/// What is read when the metrics are read: counts brokers keep as atomics
/// (copied into their families), and the host's clock.
#[derive(Default)]
struct Mirrored {
    scrapers: Vec<Box<dyn Fn() + Send + Sync>>,
    /// The host's clock, whose offset from the broker's is read at each scrape.
    clock: Option<Arc<crate::clock::Clock>>,
}

/// The families brokers registered, by name: a second side of the same broker shares them.
#[derive(Default)]
struct BrokerFamilies {
    counters: std::collections::BTreeMap<&'static str, BrokerCounters>,
    gauges: std::collections::BTreeMap<&'static str, BrokerGauges>,
}

/// A registry that remembers the names it was given, so tests (and the
/// dashboard check) can list every family, sampled or not.
struct Named {
    registry: Registry,
    families: Vec<String>,
}

impl Named {
    fn register(&mut self, name: &str, help: &str, metric: impl prometheus_client::registry::Metric) {
        self.families.push(format!("hourglass_{name}"));
        self.registry.register(name, help, metric);
    }
}

pub struct Metrics {
    registry: Mutex<Registry>,
    /// Every registered family's full name.
    families: Mutex<Vec<String>>,
    mirrored: Mutex<Mirrored>,
    broker_families: Mutex<BrokerFamilies>,
    scheduled: Family<Route, Counter>,
    failed: Family<Route, Counter>,
    rejected: Family<Field, Counter>,
    schedule_seconds: Histogram,
    planner_call_seconds: Family<Strategy, Histogram>,
    confirm_seconds: Histogram,
    ingress: Family<Outcome, Counter>,
    ingress_in_flight: Gauge,
    reloads: Family<Outcome, Counter>,
    redeliveries: Family<QueueOutcome, Counter>,
    task_restarts: Family<TaskLabel, Counter>,
    clock_offset: Gauge<f64, AtomicU64>,
    clock_offset_error: Gauge<f64, AtomicU64>,
    parked: Family<Strategy, Gauge>,
    pending: Family<Level, Gauge>,
    lateness: Family<Strategy, Histogram>,
    /// The newest canary lateness samples per strategy, in ms, for the status page's percentiles.
    recent_lateness: Mutex<std::collections::BTreeMap<String, std::collections::VecDeque<u64>>>,
    early: Family<Strategy, Counter>,
    released: Family<StrategyOutcome, Counter>,
    cancellations: Family<Outcome, Counter>,
    bounds: std::sync::RwLock<LabelBounds>,
}

/// Canary samples kept per strategy for [`Metrics::recent_lateness`].
const RECENT_LATENESS: usize = 200;

fn lateness_histogram() -> Histogram {
    // 1 ms to ~65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// A gauge that reads NaN until it is set: no reading is not an offset of zero.
fn not_measured() -> Gauge<f64, AtomicU64> {
    let gauge = Gauge::<f64, AtomicU64>::default();
    gauge.set(f64::NAN);
    gauge
}

fn latency_histogram() -> Histogram {
    // 50 µs to ~0.8 s.
    Histogram::new(exponential_buckets(0.00005, 2.0, 15))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Named { registry: Registry::with_prefix("hourglass"), families: Vec::new() };
        let mut metrics = Metrics {
            registry: Mutex::new(Registry::default()),
            families: Mutex::default(),
            mirrored: Mutex::default(),
            broker_families: Mutex::default(),
            scheduled: Family::default(),
            failed: Family::default(),
            rejected: Family::default(),
            schedule_seconds: latency_histogram(),
            planner_call_seconds: Family::new_with_constructor(latency_histogram),
            confirm_seconds: latency_histogram(),
            ingress: Family::default(),
            ingress_in_flight: Gauge::default(),
            reloads: Family::default(),
            redeliveries: Family::default(),
            task_restarts: Family::default(),
            clock_offset: not_measured(),
            clock_offset_error: not_measured(),
            parked: Family::default(),
            pending: Family::default(),
            lateness: Family::new_with_constructor(lateness_histogram),
            recent_lateness: Mutex::default(),
            early: Family::default(),
            released: Family::default(),
            cancellations: Family::default(),
            bounds: Default::default(),
        };
        registry.register("messages_scheduled", "Messages the broker confirmed", metrics.scheduled.clone());
        registry.register("messages_failed", "Messages that could not be scheduled", metrics.failed.clone());
        registry.register("requests_rejected", "HTTP requests refused before planning, by offending field", metrics.rejected.clone());
        registry.register("schedule_seconds", "Plan plus confirmed publish, per message", metrics.schedule_seconds.clone());
        registry.register("planner_call_seconds", "One plan call into a planner's sandbox", metrics.planner_call_seconds.clone());
        registry.register("broker_confirm_seconds", "From first publish to the broker's last confirm, per message", metrics.confirm_seconds.clone());
        registry.register(
            "ingress_messages",
            "Ingress messages (the ingress queue or subject) by outcome: forwarded, invalid, requeued",
            metrics.ingress.clone(),
        );
        registry.register("ingress_in_flight", "Ingress messages received and not yet acknowledged", metrics.ingress_in_flight.clone());
        registry.register("reloads", "Config reloads by outcome", metrics.reloads.clone());
        registry.register("redeliveries", "Rejected messages by consumer queue and outcome: redelivered, given_up, requeued", metrics.redeliveries.clone());
        registry.register(
            "task_restarts",
            "Background tasks (ingress, redelivery, pump:<queue>) restarted after a panic, an error or an early end",
            metrics.task_restarts.clone(),
        );
        registry.register(
            "clock_offset_seconds",
            "The broker's clock minus this host's, as last read (RabbitMQ: the management API's Date header; SQS: the pumps' receive stamps; NATS: JetStream's stamp on a stored message); NaN until read",
            metrics.clock_offset.clone(),
        );
        registry.register(
            "clock_offset_error_seconds",
            "How far the true offset may be from hourglass_clock_offset_seconds (the readings' resolution, round trips and age); NaN until read",
            metrics.clock_offset_error.clone(),
        );
        registry.register(
            "parked_messages",
            "Messages waiting in a strategy's parking queue: their destination was gone when their delay ended",
            metrics.parked.clone(),
        );
        registry.register(
            "pending_messages",
            "Messages waiting in each queue (level) of a strategy's topology, read from the broker every 5 s",
            metrics.pending.clone(),
        );
        registry.register("delivery_lateness_seconds", "Canary probes: arrival minus due time, per strategy (service.canary)", metrics.lateness.clone());
        registry.register("delivery_early", "Canary probes that arrived before their due time, per strategy", metrics.early.clone());
        registry.register(
            "released_messages",
            "Messages of cancellable strategies leaving the release queue: forwarded, cancelled, rescheduled, parked, requeued",
            metrics.released.clone(),
        );
        registry.register(
            "cancellations",
            "Cancel and reschedule requests by answer: cancelled, rescheduled, already_cancelled, already_released, unanswered, failed",
            metrics.cancellations.clone(),
        );
        *metrics.registry.lock().expect("fresh mutex") = registry.registry;
        metrics.families = Mutex::new(registry.families);
        metrics
    }
}

impl Metrics {
    /// The full name of every metric family, whether sampled yet or not.
    pub fn families(&self) -> Vec<String> {
        self.families.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// `metric`'s counters, registered on the first ask.
    pub(crate) fn broker_counters(&self, metric: &BrokerMetric) -> BrokerCounters {
        let mut families = self.broker_families.lock().unwrap_or_else(|p| p.into_inner());
        families.counters.entry(metric.name).or_insert_with(|| self.register(metric, BrokerCounters::default())).clone()
    }

    /// `metric`'s gauges, registered on the first ask.
    pub(crate) fn broker_gauges(&self, metric: &BrokerMetric) -> BrokerGauges {
        let mut families = self.broker_families.lock().unwrap_or_else(|p| p.into_inner());
        families.gauges.entry(metric.name).or_insert_with(|| self.register(metric, BrokerGauges::default())).clone()
    }

    fn register<M: prometheus_client::registry::Metric + Clone>(&self, metric: &BrokerMetric, family: M) -> M {
        self.registry.lock().unwrap_or_else(|p| p.into_inner()).register(metric.name, metric.help, family.clone());
        self.families.lock().unwrap_or_else(|p| p.into_inner()).push(format!("hourglass_{}", metric.name));
        family
    }

    /// Runs `read` at each scrape, before the families are encoded: how a
    /// broker reads a gauge of its own.
    pub(crate) fn on_scrape(&self, read: impl Fn() + Send + Sync + 'static) {
        self.mirrored.lock().unwrap_or_else(|p| p.into_inner()).scrapers.push(Box::new(read));
    }

    /// Adds to `family`, at each scrape, what the counts `read` returns (kept
    /// as atomics by a broker) grew by since the last one: several sources
    /// (a restarted pump, another consumer of a held stream) add up in one series.
    pub(crate) fn count_from(&self, family: BrokerCounters, read: impl Fn() -> Vec<(BrokerLabels, u64)> + Send + Sync + 'static) {
        let seen = Mutex::new(std::collections::HashMap::<BrokerLabels, u64>::new());
        self.on_scrape(move || {
            let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
            for (labels, count) in read() {
                let last = seen.entry(labels.clone()).or_default();
                family.get_or_create(&labels).inc_by(count.saturating_sub(*last));
                *last = count.max(*last);
            }
        });
    }

    /// The strategy and destination names labels may carry from now on (the
    /// config's); any other name is counted as `other`.
    pub fn bound_labels<'a>(&self, strategies: impl IntoIterator<Item = &'a String>, destinations: impl IntoIterator<Item = &'a String>) {
        let mut guard = self.bounds.write().unwrap_or_else(|p| p.into_inner());
        let bounds = &mut *guard;
        bounds.strategies = strategies.into_iter().cloned().collect();
        bounds.destinations = destinations.into_iter().cloned().collect();
        bounds.ever_strategies.extend(bounds.strategies.iter().cloned());
        bounds.ever_destinations.extend(bounds.destinations.iter().cloned());
    }

    /// Every (strategy, destination) label a series may carry: each name
    /// ever allowed, and `other`.
    fn labels_ever(&self) -> (Vec<String>, Vec<String>) {
        let bounds = self.bounds.read().unwrap_or_else(|p| p.into_inner());
        let with_other = |names: &std::collections::BTreeSet<String>| names.iter().cloned().chain([OTHER_LABEL.to_string()]).collect();
        (with_other(&bounds.ever_strategies), with_other(&bounds.ever_destinations))
    }

    fn routes(&self) -> Vec<Route> {
        let (strategies, destinations) = self.labels_ever();
        strategies
            .iter()
            .flat_map(|strategy| destinations.iter().map(|destination| Route { strategy: strategy.clone(), destination: destination.clone() }))
            .collect()
    }

    /// Messages the broker confirmed, over every strategy and destination.
    pub(crate) fn scheduled_total(&self) -> u64 {
        sum(&self.scheduled, self.routes())
    }

    /// Messages that could not be scheduled, over every strategy and destination.
    pub(crate) fn failed_total(&self) -> u64 {
        sum(&self.failed, self.routes())
    }

    /// Canary probes that arrived before their due time, over every strategy.
    pub(crate) fn early_total(&self) -> u64 {
        sum(&self.early, self.labels_ever().0.into_iter().map(|strategy| Strategy { strategy }))
    }

    /// Ingress messages with `outcome` (forwarded, invalid, requeued).
    pub(crate) fn ingress_count(&self, outcome: &str) -> u64 {
        sum(&self.ingress, [Outcome { outcome: outcome.into() }])
    }

    fn route(&self, strategy: &str, destination: &str) -> Route {
        let bounds = self.bounds.read().unwrap_or_else(|p| p.into_inner());
        let named = |known: &std::collections::HashSet<String>, name: &str| {
            if known.contains(name) { name.to_string() } else { OTHER_LABEL.to_string() }
        };
        Route { strategy: named(&bounds.strategies, strategy), destination: named(&bounds.destinations, destination) }
    }

    pub fn scheduled(&self, strategy: &str, destination: &str) {
        self.scheduled.get_or_create(&self.route(strategy, destination)).inc();
    }

    pub fn failed(&self, strategy: &str, destination: &str) {
        self.failed.get_or_create(&self.route(strategy, destination)).inc();
    }

    /// Messages in one of `strategy`'s queues, as last read from the broker.
    /// The queue names come from the strategy's static topology: a bounded set.
    pub(crate) fn set_pending(&self, strategy: &str, level: &str, messages: u64) {
        let strategy = self.route(strategy, "").strategy;
        self.pending.get_or_create(&Level { strategy, level: level.into() }).set(messages as i64);
    }

    /// A canary probe arrived `late` after its due time.
    pub(crate) fn observe_lateness(&self, strategy: &str, late: Duration) {
        let strategy = self.route(strategy, "").strategy;
        self.lateness.get_or_create(&Strategy { strategy: strategy.clone() }).observe(late.as_secs_f64());
        let mut recent = self.recent_lateness.lock().unwrap_or_else(|p| p.into_inner());
        let samples = recent.entry(strategy).or_default();
        if samples.len() == RECENT_LATENESS {
            samples.pop_front();
        }
        samples.push_back(late.as_millis() as u64);
    }

    /// p50 and p99 of the newest canary probes through `strategy` (ms), and how many.
    pub fn recent_lateness(&self, strategy: &str) -> Option<(u64, u64, usize)> {
        let recent = self.recent_lateness.lock().unwrap_or_else(|p| p.into_inner());
        let mut samples: Vec<u64> = recent.get(strategy)?.iter().copied().collect();
        samples.sort_unstable();
        let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
        (!samples.is_empty()).then(|| (at(0.5), at(0.99), samples.len()))
    }

    /// A canary probe arrived before its due time.
    pub(crate) fn delivered_early(&self, strategy: &str) {
        let strategy = self.route(strategy, "").strategy;
        self.early.get_or_create(&Strategy { strategy }).inc();
    }

    /// A message of a cancellable strategy left its release queue (`outcome` from a fixed set).
    pub fn released(&self, strategy: &str, outcome: &str) {
        let strategy = self.route(strategy, "").strategy;
        self.released.get_or_create(&StrategyOutcome { strategy, outcome: outcome.into() }).inc();
    }

    /// `strategy` as a label: its name if configured, else one shared name.
    pub(crate) fn strategy_label(&self, strategy: &str) -> String {
        self.route(strategy, "").strategy
    }

    /// A cancel or reschedule was answered (`outcome` from a fixed set).
    pub fn cancellation(&self, outcome: &str) {
        self.cancellations.get_or_create(&Outcome { outcome: outcome.into() }).inc();
    }

    /// A supervised background task was restarted.
    pub(crate) fn task_restarted(&self, task: &str) {
        self.task_restarts.get_or_create(&TaskLabel { task: task.into() }).inc();
    }

    /// Messages in `strategy`'s parking queues, as last read from the broker.
    pub(crate) fn set_parked(&self, strategy: &str, messages: u64) {
        self.parked.get_or_create(&Strategy { strategy: strategy.into() }).set(messages as i64);
    }

    pub fn rejected(&self, field: &str) {
        self.rejected.get_or_create(&Field { field: field.into() }).inc();
    }

    pub(crate) fn observe_schedule(&self, took: Duration) {
        self.schedule_seconds.observe(took.as_secs_f64());
    }

    pub(crate) fn observe_planner_call(&self, strategy: &str, took: Duration) {
        let strategy = self.route(strategy, "").strategy;
        self.planner_call_seconds.get_or_create(&Strategy { strategy }).observe(took.as_secs_f64());
    }

    pub(crate) fn observe_confirm(&self, took: Duration) {
        self.confirm_seconds.observe(took.as_secs_f64());
    }

    pub fn ingress(&self, outcome: &str) {
        self.ingress.get_or_create(&Outcome { outcome: outcome.into() }).inc();
    }

    pub(crate) fn ingress_started(&self) {
        self.ingress_in_flight.inc();
    }

    pub(crate) fn ingress_finished(&self) {
        self.ingress_in_flight.dec();
    }

    pub fn redelivery(&self, queue: &str, outcome: &str) {
        self.redeliveries.get_or_create(&QueueOutcome { queue: queue.into(), outcome: outcome.into() }).inc();
    }

    pub fn reload(&self, outcome: &str) {
        self.reloads.get_or_create(&Outcome { outcome: outcome.into() }).inc();
    }

    /// Reports `clock`'s offset from the broker's clock at each scrape.
    pub(crate) fn watch_clock(&self, clock: Arc<crate::clock::Clock>) {
        self.mirrored.lock().unwrap_or_else(|p| p.into_inner()).clock = Some(clock);
    }

    fn mirror(&self) {
        let mirrored = self.mirrored.lock().unwrap_or_else(|p| p.into_inner());
        for read in &mirrored.scrapers {
            read();
        }
        // Read now against the host's clock now: a step of it shows at the next scrape.
        if let Some(offset) = mirrored.clock.as_ref().and_then(|clock| clock.offset()) {
            self.clock_offset.set(offset.offset_ms as f64 / 1_000.0);
            self.clock_offset_error.set(offset.error_ms as f64 / 1_000.0);
        }
    }

    pub fn encode(&self) -> String {
        self.mirror();
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        prometheus_client::encoding::text::encode(&mut out, &registry).expect("writing to a String cannot fail");
        out
    }
}

/// The counts of `family`'s series with these labels (a label set never counted adds nothing).
fn sum<S: Clone + std::hash::Hash + Eq>(family: &Family<S, Counter>, labels: impl IntoIterator<Item = S>) -> u64 {
    labels.into_iter().filter_map(|label| family.get(&label).map(|counter| counter.get())).sum()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    const WIDGETS: BrokerMetric = BrokerMetric { name: "widgets", help: "Widgets by colour" };

    #[test]
    fn a_broker_family_sums_its_sources_and_a_restarted_one_counts_on() {
        let metrics = Metrics::default();
        let (first, second) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        for source in [&first, &second] {
            let source = source.clone();
            metrics.count_from(metrics.broker_counters(&WIDGETS), move || vec![(vec![("colour", "blue".to_string())], source.load(Ordering::Relaxed))]);
        }
        first.store(3, Ordering::Relaxed);
        second.store(4, Ordering::Relaxed);
        assert!(metrics.encode().contains("hourglass_widgets_total{colour=\"blue\"} 7"), "{}", metrics.encode());
        // A third source starting from zero (a restarted pump) adds what it counts.
        let third = Arc::new(AtomicU64::new(0));
        let counting = third.clone();
        metrics.count_from(metrics.broker_counters(&WIDGETS), move || vec![(vec![("colour", "blue".to_string())], counting.load(Ordering::Relaxed))]);
        first.store(5, Ordering::Relaxed);
        third.store(1, Ordering::Relaxed);
        let encoded = metrics.encode();
        assert!(encoded.contains("hourglass_widgets_total{colour=\"blue\"} 10"), "{encoded}");
        assert_eq!(encoded.matches("# HELP hourglass_widgets Widgets by colour").count(), 1, "registered once: {encoded}");
        assert!(metrics.families().contains(&"hourglass_widgets".to_string()));
    }
}
