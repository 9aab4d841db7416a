//! Prometheus metrics, shared by the scheduler, the service, the ingress and
//! the pumps. Encoded as OpenMetrics text for `GET /metrics`.
//!
//! Every label set is bounded: a strategy or destination label is a name from
//! the config (set by [`Metrics::bound_labels`]), anything else counts as
//! `other`, so a client cannot grow the series without limit.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use serde::Serialize;

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
struct Kind {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Queue {
    queue: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaskLabel {
    task: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConnectionLabel {
    connection: String,
}

/// The label value for anything not named in the config.
pub(crate) const OTHER_LABEL: &str = "other";

/// Open channels per connection, read when the metrics are read.
pub(crate) type ChannelCounts = Box<dyn Fn() -> Vec<(&'static str, i64)> + Send + Sync>;

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

/// Counters kept as atomics elsewhere (SQS requests, pump cycles), copied
/// into Prometheus counters when the metrics are read.
#[derive(Default)]
struct Mirrored {
    sqs: Vec<Arc<RequestCounts>>,
    pumps: Vec<(String, Arc<PumpCounters>)>,
    holds: Vec<(String, Arc<HoldCounters>)>,
    channels: Vec<ChannelCounts>,
    /// The host's clock, whose offset from the broker's is read at each scrape.
    clock: Option<Arc<crate::clock::Clock>>,
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
    families: Vec<String>,
    mirrored: Mutex<Mirrored>,
    scheduled: Family<Route, Counter>,
    failed: Family<Route, Counter>,
    rejected: Family<Field, Counter>,
    schedule_seconds: Histogram,
    planner_call_seconds: Family<Strategy, Histogram>,
    confirm_seconds: Histogram,
    sqs_requests: Family<Kind, Counter>,
    pump_cycles: Family<Queue, Counter>,
    pump_parked: Family<Queue, Counter>,
    pump_empty_polls: Family<Queue, Counter>,
    pump_bundled: Family<Queue, Counter>,
    held_deliveries: Family<QueueOutcome, Counter>,
    ingress: Family<Outcome, Counter>,
    ingress_in_flight: Gauge,
    reloads: Family<Outcome, Counter>,
    redeliveries: Family<QueueOutcome, Counter>,
    task_restarts: Family<TaskLabel, Counter>,
    open_channels: Family<ConnectionLabel, Gauge>,
    clock_offset: Gauge<f64, AtomicU64>,
    clock_offset_error: Gauge<f64, AtomicU64>,
    parked: Family<Strategy, Gauge>,
    pending: Family<Level, Gauge>,
    lateness: Family<Strategy, Histogram>,
    /// The newest canary lateness samples per strategy, in ms, for the status page's percentiles.
    recent_lateness: Mutex<std::collections::BTreeMap<String, std::collections::VecDeque<u64>>>,
    early: Family<Strategy, Counter>,
    released: Family<StrategyOutcome, Counter>,
    unparked: Family<StrategyOutcome, Counter>,
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
            families: Vec::new(),
            mirrored: Mutex::default(),
            scheduled: Family::default(),
            failed: Family::default(),
            rejected: Family::default(),
            schedule_seconds: latency_histogram(),
            planner_call_seconds: Family::new_with_constructor(latency_histogram),
            confirm_seconds: latency_histogram(),
            sqs_requests: Family::default(),
            pump_cycles: Family::default(),
            pump_parked: Family::default(),
            pump_empty_polls: Family::default(),
            pump_bundled: Family::default(),
            held_deliveries: Family::default(),
            ingress: Family::default(),
            ingress_in_flight: Gauge::default(),
            reloads: Family::default(),
            redeliveries: Family::default(),
            task_restarts: Family::default(),
            open_channels: Family::default(),
            clock_offset: not_measured(),
            clock_offset_error: not_measured(),
            parked: Family::default(),
            pending: Family::default(),
            lateness: Family::new_with_constructor(lateness_histogram),
            recent_lateness: Mutex::default(),
            early: Family::default(),
            released: Family::default(),
            unparked: Family::default(),
            cancellations: Family::default(),
            bounds: Default::default(),
        };
        registry.register("messages_scheduled", "Messages the broker confirmed", metrics.scheduled.clone());
        registry.register("messages_failed", "Messages that could not be scheduled", metrics.failed.clone());
        registry.register("requests_rejected", "HTTP requests refused before planning, by offending field", metrics.rejected.clone());
        registry.register("schedule_seconds", "Plan plus confirmed publish, per message", metrics.schedule_seconds.clone());
        registry.register("planner_call_seconds", "One plan call into a planner's sandbox", metrics.planner_call_seconds.clone());
        registry.register("broker_confirm_seconds", "From first publish to the broker's last confirm, per message", metrics.confirm_seconds.clone());
        registry.register("sqs_requests", "SQS API requests by kind", metrics.sqs_requests.clone());
        registry.register(
            "held_deliveries",
            "Deliveries of a NATS held stream (queue) by what became of them: waited, handed_over, parked, cancelled, retried",
            metrics.held_deliveries.clone(),
        );
        registry.register("pump_cycles", "Messages a pump received and sent on (around again or to the destination)", metrics.pump_cycles.clone());
        registry.register(
            "pump_parked",
            "Messages a pump moved to its queue's dead-letter queue, with the reason, because they could not go on",
            metrics.pump_parked.clone(),
        );
        registry.register(
            "pump_empty_polls",
            "Long polls of a pump that came back empty: what an idle pumped queue costs in SQS requests",
            metrics.pump_empty_polls.clone(),
        );
        registry.register(
            "pump_bundled",
            "Messages a pump sent around again in a bundle (several in one SQS message, sharing its requests)",
            metrics.pump_bundled.clone(),
        );
        registry.register("ingress_messages", "Ingress messages (AMQP or SQS ingress queue) by outcome: forwarded, invalid, requeued", metrics.ingress.clone());
        registry.register("ingress_in_flight", "AMQP ingress messages received and not yet acknowledged", metrics.ingress_in_flight.clone());
        registry.register("reloads", "Config reloads by outcome", metrics.reloads.clone());
        registry.register("redeliveries", "Rejected messages by consumer queue and outcome: redelivered, given_up, requeued", metrics.redeliveries.clone());
        registry.register(
            "task_restarts",
            "Background tasks (ingress, redelivery, pump:<queue>) restarted after a panic, an error or an early end",
            metrics.task_restarts.clone(),
        );
        registry.register("open_channels", "AMQP channels open, by connection", metrics.open_channels.clone());
        registry.register(
            "clock_offset_seconds",
            "The broker's clock minus this host's, as last read (RabbitMQ: the management API's Date header; SQS: the pumps' receive stamps); NaN until read",
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
            "unparked_messages",
            "Messages a serving host took from a strategy's parking queue: forwarded, released (to a cancellable strategy's release queue), rescheduled, orphaned (their destination was gone), requeued",
            metrics.unparked.clone(),
        );
        registry.register(
            "cancellations",
            "Cancel and reschedule requests by answer: cancelled, rescheduled, already_cancelled, already_released, unanswered, failed",
            metrics.cancellations.clone(),
        );
        *metrics.registry.lock().expect("fresh mutex") = registry.registry;
        metrics.families = registry.families;
        metrics
    }
}

impl Metrics {
    /// The full name of every metric family, whether sampled yet or not.
    pub fn families(&self) -> &[String] {
        &self.families
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

    /// A message left a strategy's parking queue through the service (`outcome` from a fixed set).
    pub fn unparked(&self, strategy: &str, outcome: &str) {
        let strategy = self.route(strategy, "").strategy;
        self.unparked.get_or_create(&StrategyOutcome { strategy, outcome: outcome.into() }).inc();
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

    /// Reports open AMQP channels per connection, read at each scrape.
    pub(crate) fn watch_open_channels(&self, counts: ChannelCounts) {
        self.mirrored.lock().unwrap_or_else(|p| p.into_inner()).channels.push(counts);
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

    /// Reports an SQS executor's request counts.
    pub(crate) fn watch_sqs(&self, counts: Arc<RequestCounts>) {
        self.mirrored.lock().unwrap_or_else(|p| p.into_inner()).sqs.push(counts);
    }

    /// Reports a pump's cycles.
    pub(crate) fn watch_pump(&self, queue: &str, counters: Arc<PumpCounters>) {
        self.mirrored.lock().unwrap_or_else(|p| p.into_inner()).pumps.push((queue.to_string(), counters));
    }

    pub(crate) fn watch_hold(&self, stream: &str, counters: Arc<HoldCounters>) {
        self.mirrored.lock().unwrap_or_else(|p| p.into_inner()).holds.push((stream.to_string(), counters));
    }

    fn mirror(&self) {
        fn raise(counter: &Counter, to: u64) {
            counter.inc_by(to.saturating_sub(counter.get()));
        }
        let mirrored = self.mirrored.lock().unwrap_or_else(|p| p.into_inner());
        let mut by_kind = std::collections::BTreeMap::<&str, u64>::new();
        for counts in &mirrored.sqs {
            for (kind, value) in counts.by_kind() {
                *by_kind.entry(kind).or_default() += value;
            }
        }
        for (kind, value) in by_kind {
            raise(&self.sqs_requests.get_or_create(&Kind { kind: kind.into() }), value);
        }
        // Per queue: (cycles, parked, empty polls, bundled), summed over its pumps.
        let mut by_queue = std::collections::BTreeMap::<&str, (u64, u64, u64, u64)>::new();
        for (queue, counters) in &mirrored.pumps {
            let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
            let sums = by_queue.entry(queue).or_default();
            sums.0 += get(&counters.recycled) + get(&counters.handed_over);
            sums.1 += get(&counters.parked);
            sums.2 += get(&counters.empty_polls);
            sums.3 += get(&counters.bundled);
        }
        for (queue, (cycles, parked, empty_polls, bundled)) in by_queue {
            raise(&self.pump_bundled.get_or_create(&Queue { queue: queue.into() }), bundled);
            raise(&self.pump_empty_polls.get_or_create(&Queue { queue: queue.into() }), empty_polls);
            raise(&self.pump_cycles.get_or_create(&Queue { queue: queue.into() }), cycles);
            raise(&self.pump_parked.get_or_create(&Queue { queue: queue.into() }), parked);
        }
        // Per held stream and outcome, summed over its consumers (a restarted one counts on from zero).
        let mut by_outcome = std::collections::BTreeMap::<(&str, &str), u64>::new();
        for (stream, counters) in &mirrored.holds {
            for (outcome, value) in counters.by_outcome() {
                *by_outcome.entry((stream, outcome)).or_default() += value;
            }
        }
        for ((stream, outcome), value) in by_outcome {
            raise(&self.held_deliveries.get_or_create(&QueueOutcome { queue: stream.into(), outcome: outcome.into() }), value);
        }
        for counts in &mirrored.channels {
            for (connection, open) in counts() {
                self.open_channels.get_or_create(&ConnectionLabel { connection: connection.into() }).set(open);
            }
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
