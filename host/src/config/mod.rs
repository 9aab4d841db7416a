//! `delay.toml`: the broker, planner sandbox settings, named strategies and
//! destinations.
//!
//! Every error names the file, line and column. A strategy's own keys are
//! checked by its planner; when the planner names a key, the error points at it.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hourglass_planner_sdk::DurationMs;
use serde::Deserialize;
use thiserror::Error;
use toml::Spanned;
use toml::de::{DeString, DeTable, DeValue, ValueDeserializer};

pub mod broker;

pub use crate::environment::{environment, environment_text};
use crate::planner::{PlannerLimits, PlannerSource};
pub use broker::BrokerConfig;

/// A place in a config file, shown as `path:line:column`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    pub path: PathBuf,
    pub line: usize,
    pub column: usize,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.path.display(), self.line, self.column)
    }
}

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("{path}: cannot read the config: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{location}: {message}")]
    Invalid { location: Location, message: String },
}

/// A strategy asked for by name that the config does not define.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("unknown strategy {name:?}; configured: {}", configured.join(", "))]
pub struct UnknownStrategy {
    pub name: String,
    pub configured: Vec<String>,
}

/// The type of hourglass's own queues on RabbitMQ.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OwnQueueType {
    /// Replicated over a cluster's nodes, kept through a node's loss (the default).
    #[default]
    Quorum,
    /// On one node: for a deployment whose queues were declared so before
    /// quorum became the default (RabbitMQ refuses to change a queue's type).
    Classic,
}

/// `hourglass serve`'s settings.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServiceConfig {
    /// Address to listen on (default 127.0.0.1:8080).
    pub listen: Option<String>,
    /// Bearer token required on the API; `token_env` (default `HOURGLASS_TOKEN`) overrides it.
    /// Never empty: an empty token is a config error, not "no token".
    pub token: Option<String>,
    pub token_env: Option<String>,
    /// `apply` (default), `verify` or `skip`; see [`TopologyAtStart`].
    pub topology: Option<TopologyAtStart>,
    /// `human` (default) or `json` log lines on stderr.
    pub log_format: Option<LogFormat>,
    /// How long shutdown waits for in-flight work (default 20s).
    pub shutdown_timeout: Option<DurationMs>,
    /// Long-poll wait of each SQS pump receive (default 20s, at most 20s).
    pub pump_wait: Option<DurationMs>,
    /// How often the SQS queues are listed for pumped queues no pump drains yet (default 60s).
    pub pump_discovery: Option<DurationMs>,
    /// Visibility timeout a pump sets on its queue and extends while a batch
    /// is in hand (default 60s, whole seconds, at most 12 hours).
    pub pump_visibility: Option<DurationMs>,
    /// Receives after which SQS moves a message the pump never forwarded to
    /// the queue's dead-letter queue (default 10).
    pub pump_max_receives: Option<u32>,
    /// Pause after a pump receive that brought fewer than ten messages, so
    /// batches fill (default 250ms, at most 5s, 0 turns it off).
    pub pump_linger: Option<DurationMs>,
    /// The ingress queue (RabbitMQ) or subject (NATS) producers publish to.
    #[serde(default)]
    pub ingress: IngressConfig,
    /// The SQS ingress queue (SQS brokers).
    #[serde(default)]
    pub sqs_ingress: SqsIngressConfig,
    /// How often queue depths are read for /metrics, /v1/delays and the
    /// status page (default 5s on RabbitMQ, 60s on SQS, where it is billed).
    pub depth_poll: Option<DurationMs>,
    /// Lateness probes: messages sent through each strategy to measure how late they arrive.
    #[serde(default)]
    pub canary: CanaryConfig,
    /// Where the cancellations of `cancellable = true` strategies are kept, and for how long.
    #[serde(default)]
    pub cancel: CancelConfig,
    /// The exchange and queue rejected messages dead-letter to (default `hourglass.redelivery`).
    pub redelivery_input: Option<String>,
    /// The type of the queues hourglass declares for itself on RabbitMQ
    /// (ingress, invalid, redelivery input and error queues, canary).
    #[serde(default)]
    pub queue_type: OwnQueueType,
    /// Most HTTP connections open at once (default 512); more wait in the listen backlog.
    pub max_connections: Option<u32>,
    /// Time a client has to send a request's headers, counted from when the
    /// server starts waiting for them (default 10s): closes idle and slowloris connections.
    pub header_read_timeout: Option<DurationMs>,
    /// A connection on which nothing moves either way for this long is closed (default 60s).
    pub idle_timeout: Option<DurationMs>,
    /// RabbitMQ: take each message from the strategies' parking queues as it
    /// is parked and send on those whose destination exists (default true;
    /// false leaves every parked message for `hourglass parked replay`).
    pub unpark: Option<bool>,
}

/// A consumer queue whose rejected messages hourglass redelivers later.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RedeliveryConfig {
    /// The consumer's queue.
    pub queue: String,
    /// The strategy that carries the delays (default: the default strategy).
    pub strategy: Option<String>,
    /// The strategy whose planner decides each redelivery (default: `strategy`).
    pub policy: Option<String>,
    /// Deliveries in all, the first included, before giving up whatever the policy says.
    pub max_attempts: Option<u32>,
    /// Where given-up messages go (default `<queue>.error`).
    pub error_queue: Option<String>,
    /// How the queue gets its dead-letter exchange.
    #[serde(default)]
    pub dead_letter: DeadLetterSetup,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum DeadLetterSetup {
    /// Declare the queue with `x-dead-letter-exchange` (the consumer declares it the same way, or passively).
    #[default]
    Declare,
    /// A RabbitMQ policy through the management API, for a queue that exists with other arguments.
    BrokerPolicy,
}

impl RedeliveryConfig {
    /// The strategy carrying the delays, given the config's default strategy.
    pub(crate) fn strategy_or<'a>(&'a self, default_strategy: &'a str) -> &'a str {
        self.strategy.as_deref().unwrap_or(default_strategy)
    }

    /// The strategy whose planner decides, given the config's default strategy.
    pub(crate) fn policy_or<'a>(&'a self, default_strategy: &'a str) -> &'a str {
        self.policy.as_deref().unwrap_or(self.strategy_or(default_strategy))
    }

    pub fn error_queue(&self) -> String {
        self.error_queue.clone().unwrap_or_else(|| format!("{}.error", self.queue))
    }
}

/// What `serve` does with the broker objects its strategies need.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum TopologyAtStart {
    /// Declare the default strategy's topology at start, and any other on first use.
    Apply,
    /// Declare nothing; at start, check the default strategy's topology and the
    /// configured destinations' setup exist as planned, and refuse to start on drift.
    Verify,
    /// Declare and check nothing: the operator manages the broker objects.
    Skip,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Human,
    Json,
}

/// A queue where any AMQP client publishes a message to delay, naming its
/// destination and delay in headers.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct IngressConfig {
    /// On by default when the broker is RabbitMQ.
    pub enabled: bool,
    pub queue: String,
    /// Where messages that cannot be scheduled go, with the reason in a header.
    pub invalid_queue: String,
    /// Unacknowledged ingress messages in flight at once.
    pub prefetch: u16,
}

impl Default for IngressConfig {
    fn default() -> Self {
        IngressConfig { enabled: true, queue: "hourglass.ingress".into(), invalid_queue: "hourglass.ingress.invalid".into(), prefetch: 64 }
    }
}

/// `[service.canary]`: a probe through every strategy, timed on arrival
/// (every broker but the in-memory one; the default name is a valid queue
/// and subject on each).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CanaryConfig {
    /// On by default.
    pub enabled: bool,
    /// The probes' destination, consumed by the host.
    pub queue: String,
    /// One probe per strategy this often.
    pub every: DurationMs,
    /// Each probe's delay.
    pub delay: DurationMs,
}

impl Default for CanaryConfig {
    fn default() -> Self {
        CanaryConfig { enabled: true, queue: "hourglass-canary".into(), every: DurationMs(60_000), delay: DurationMs(5_000) }
    }
}

/// `[service.cancel]`: the store that decides cancels and reschedules of
/// messages on `cancellable = true` strategies (each broker's `cancel` module).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CancelConfig {
    /// The store every host reads (default `hourglass.cancellations`): a
    /// RabbitMQ stream of that name; on SQS the fates queue and on NATS the
    /// KV bucket named after it ([`BrokerConfig::cancellation_store`]).
    pub log: Option<String>,
    /// Each cancellable strategy's release queue is `<release_prefix>.<strategy>` (default `hourglass.release`).
    pub release_prefix: Option<String>,
    /// How long the log keeps events (default 7 days); a cancellable strategy takes no longer delay.
    pub retention: Option<DurationMs>,
    /// How long a host remembers a released message, so cancelling it says 409 (default 10m).
    pub remember_delivered: Option<DurationMs>,
    /// How long a cancel, reschedule or release waits to read its own event back (default 10s).
    pub answer_timeout: Option<DurationMs>,
}

impl CancelConfig {
    pub fn log(&self) -> &str {
        self.log.as_deref().unwrap_or("hourglass.cancellations")
    }
    /// Where a cancellable strategy ends its delays; the host forwards from there.
    pub fn release_queue(&self, strategy: &str) -> String {
        format!("{}.{strategy}", self.release_prefix.as_deref().unwrap_or("hourglass.release"))
    }
    pub fn retention_ms(&self) -> u64 {
        self.retention.map_or(7 * 24 * 3_600_000, |d| d.ms())
    }
    pub(crate) fn remember_delivered_ms(&self) -> u64 {
        self.remember_delivered.map_or(600_000, |d| d.ms())
    }
    pub(crate) fn answer_timeout_ms(&self) -> u64 {
        self.answer_timeout.map_or(10_000, |d| d.ms())
    }
}

/// `[service.sqs_ingress]`: a standard SQS queue any SQS client sends to, with
/// the destination and delay in message attributes.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SqsIngressConfig {
    /// On by default when the broker is SQS.
    pub enabled: bool,
    pub queue: String,
    /// Where messages that cannot be scheduled go, with the reason in an attribute.
    pub invalid_queue: String,
}

impl Default for SqsIngressConfig {
    fn default() -> Self {
        SqsIngressConfig { enabled: true, queue: "hourglass-ingress".into(), invalid_queue: "hourglass-ingress-invalid".into() }
    }
}

impl SqsIngressConfig {
    /// The handler's settings: SQS hands out at most ten messages at a time.
    pub(crate) fn as_ingress(&self) -> IngressConfig {
        IngressConfig { enabled: self.enabled, queue: self.queue.clone(), invalid_queue: self.invalid_queue.clone(), prefetch: 10 }
    }
}

/// The `[service]` values serde cannot check: (the value's dotted path under
/// `[service]`, complaint).
fn check_service(service: &ServiceConfig) -> Result<(), (&'static str, String)> {
    let ingress = &service.ingress;
    if ingress.prefetch == 0 {
        return Err(("ingress.prefetch", "service.ingress.prefetch: must be at least 1".into()));
    }
    if ingress.queue.is_empty() || ingress.invalid_queue.is_empty() {
        let empty = if ingress.queue.is_empty() { "ingress.queue" } else { "ingress.invalid_queue" };
        return Err((empty, "service.ingress: queue and invalid_queue must be non-empty".into()));
    }
    if ingress.queue == ingress.invalid_queue {
        return Err(("ingress.invalid_queue", format!("service.ingress.invalid_queue: {:?} is also the ingress queue", ingress.queue)));
    }
    if let Some(wait) = service.pump_wait
        && wait.ms() > 20_000
    {
        return Err(("pump_wait", format!("service.pump_wait: {} ms is above SQS's 20 s long-poll limit", wait.ms())));
    }
    let sqs_ingress = &service.sqs_ingress;
    for (path, name) in [("sqs_ingress.queue", &sqs_ingress.queue), ("sqs_ingress.invalid_queue", &sqs_ingress.invalid_queue)] {
        if name.is_empty() || name.len() > 80 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
            return Err((path, format!("service.{path}: {name:?} must be 1 to 80 letters, digits, '-' or '_' (a standard SQS queue)")));
        }
    }
    if sqs_ingress.queue == sqs_ingress.invalid_queue {
        return Err(("sqs_ingress.invalid_queue", format!("service.sqs_ingress.invalid_queue: {:?} is also the ingress queue", sqs_ingress.queue)));
    }
    if let Some(visibility) = service.pump_visibility
        && !(1_000..=43_200_000).contains(&visibility.ms())
    {
        return Err(("pump_visibility", format!("service.pump_visibility: {} ms must be between 1 s and SQS's 12 hours", visibility.ms())));
    }
    if service.pump_discovery.is_some_and(|d| d.ms() == 0) {
        return Err(("pump_discovery", "service.pump_discovery: must be above zero".into()));
    }
    if service.depth_poll.is_some_and(|d| d.ms() < 100) {
        return Err(("depth_poll", "service.depth_poll: must be at least 100ms".into()));
    }
    if service.canary.every.ms() < 100 {
        return Err(("canary.every", "service.canary.every: must be at least 100ms".into()));
    }
    if service.canary.queue.is_empty() || service.canary.queue.len() > 255 {
        return Err(("canary.queue", "service.canary.queue: must be 1 to 255 bytes".into()));
    }
    if service.pump_linger.is_some_and(|d| d.ms() > 5_000) {
        return Err(("pump_linger", "service.pump_linger: must be at most 5s (a longer pause only delays messages)".into()));
    }
    if service.pump_max_receives.is_some_and(|n| !(1..=1_000).contains(&n)) {
        return Err(("pump_max_receives", "service.pump_max_receives: must be between 1 and SQS's 1000".into()));
    }
    if service.token.as_deref() == Some("") {
        return Err(("token", "service.token: empty; an empty token would lock every client out. Remove the key for no token, or set one".into()));
    }
    if service.max_connections == Some(0) {
        return Err(("max_connections", "service.max_connections: must be at least 1".into()));
    }
    for (path, value) in [("header_read_timeout", service.header_read_timeout), ("idle_timeout", service.idle_timeout)] {
        if value.is_some_and(|d| d.ms() == 0) {
            return Err((path, format!("service.{path}: must be above zero")));
        }
    }
    Ok(())
}

/// Where the value at `path` (dotted bare keys) is written in the parsed
/// document; else the nearest table on the way to it that is written; else
/// the document, which starts the file.
fn span_of(document: &Spanned<DeTable<'_>>, path: &str) -> Range<usize> {
    let mut span = document.span();
    let mut table = Some(document.get_ref());
    for key in path.split('.') {
        let Some(value) = table.and_then(|t| t.get(key)) else { break };
        span = value.span();
        table = value.get_ref().as_table();
    }
    span
}

/// Where a complaint of toml's deserializer is about.
fn complaint_span(document: &Spanned<DeTable<'_>>, err: &toml::de::Error) -> Range<usize> {
    let span = err.span().unwrap_or_else(|| document.span());
    match document.get_ref().get("broker") {
        Some(broker) if broker.span() == span => broker_key_at_fault(broker, err.message()).unwrap_or(span),
        _ => span,
    }
}

/// serde reads an internally tagged table, `[broker]` (tagged by `kind`),
/// through a buffer that keeps no positions, so toml can name only the table
/// for a complaint about one of its keys. Read again with `kind` and one key
/// at a time, the key whose reading fails with the same complaint is the one.
fn broker_key_at_fault(broker: &Spanned<DeValue<'_>>, message: &str) -> Option<Range<usize>> {
    let table = broker.get_ref().as_table()?;
    let (kind_key, kind) = table.get_key_value("kind")?;
    let read_with = |entry: Option<(&Spanned<DeString<'_>>, &Spanned<DeValue<'_>>)>| {
        let mut alone = DeTable::new();
        alone.insert(kind_key.clone(), kind.clone());
        if let Some((key, value)) = entry {
            alone.insert(key.clone(), value.clone());
        }
        BrokerConfig::deserialize(ValueDeserializer::from(Spanned::new(broker.span(), DeValue::Table(alone))))
    };
    // A `kind` that fails on its own is the complaint itself, which toml placed already.
    read_with(None).ok()?;
    table.iter().filter(|(key, _)| *key != kind_key).find(|&entry| read_with(Some(entry)).is_err_and(|e| e.message() == message)).map(|(key, _)| key.span())
}

impl ServiceConfig {
    pub fn redelivery_input(&self) -> &str {
        self.redelivery_input.as_deref().unwrap_or("hourglass.redelivery")
    }

    pub fn token(&self) -> Option<String> {
        let variable = self.token_env.as_deref().unwrap_or("HOURGLASS_TOKEN");
        environment_text(variable).or_else(|| self.token.clone())
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlannerSettings {
    call_timeout: Option<DurationMs>,
    start_timeout: Option<DurationMs>,
    memory_limit_mib: Option<u32>,
    cache: Option<bool>,
    cache_dir: Option<PathBuf>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DestinationConfig {
    /// The strategy for this destination; the default strategy otherwise.
    pub strategy: Option<String>,
}

/// How a delayed exchange's messages are routed when due: the type of its
/// `deliver_to` exchange (the plugin's `x-delayed-type`).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DelayedType {
    #[default]
    Direct,
    Topic,
    Fanout,
    Headers,
}

impl DelayedType {
    pub fn exchange_kind(self) -> crate::command::ExchangeKind {
        use crate::command::ExchangeKind;
        match self {
            DelayedType::Direct => ExchangeKind::Direct,
            DelayedType::Topic => ExchangeKind::Topic,
            DelayedType::Fanout => ExchangeKind::Fanout,
            DelayedType::Headers => ExchangeKind::Headers,
        }
    }
}

/// `[exchanges."<name>"]`: an exchange producers publish to with `x-delay`,
/// as they did to the delayed-message plugin's `x-delayed-message` exchange
/// (RabbitMQ). hourglass declares it as a plain fanout exchange bound to its
/// ingress queue, and delivers each message when due through `deliver_to`
/// with its original routing key.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DelayedExchangeConfig {
    /// How due messages are routed: `deliver_to`'s type (declared with it when missing).
    #[serde(rename = "type", default)]
    pub kind: DelayedType,
    /// The exchange that routes due messages to the queues bound to it.
    pub deliver_to: String,
    /// The strategy that holds the messages (default: `default_strategy`).
    pub strategy: Option<String>,
}

type SpannedTable = BTreeMap<Spanned<String>, Spanned<toml::Value>>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    default_strategy: Option<Spanned<String>>,
    #[serde(default)]
    broker: BrokerConfig,
    #[serde(default)]
    planners: RawPlannerSettings,
    #[serde(default)]
    service: ServiceConfig,
    #[serde(default)]
    strategies: BTreeMap<Spanned<String>, SpannedTable>,
    #[serde(default)]
    destinations: BTreeMap<Spanned<String>, Spanned<DestinationConfig>>,
    #[serde(default)]
    redelivery: Vec<Spanned<RedeliveryConfig>>,
    #[serde(default)]
    exchanges: BTreeMap<Spanned<String>, Spanned<DelayedExchangeConfig>>,
}

/// One named strategy: a planner and its own table.
#[derive(Clone, Debug)]
pub struct StrategyConfig {
    pub name: String,
    pub planner: PlannerSource,
    /// The table minus `planner` and `cancellable`, as handed to the planner.
    pub table: serde_json::Value,
    /// Messages end in the host's release queue, so they can be cancelled and rescheduled.
    pub cancellable: bool,
    /// This strategy's own sandbox limits, over `[planners]`'s.
    pub limits: StrategyLimits,
    name_span: Range<usize>,
    planner_span: Range<usize>,
    key_spans: BTreeMap<String, Range<usize>>,
}

/// A strategy's `memory_limit_mib`, `call_timeout` and `start_timeout`, when
/// it sets them (a planner on a large runtime, Python's say, needs more).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StrategyLimits {
    pub memory_limit_mib: Option<u32>,
    pub call_timeout: Option<u64>,
    pub start_timeout: Option<u64>,
}

impl StrategyConfig {
    /// The sandbox limits its planner runs under: its own, else `defaults` (`[planners]`).
    pub(crate) fn planner_limits(&self, defaults: PlannerLimits) -> PlannerLimits {
        let ms = |own: Option<u64>, default: Duration| own.map_or(default, Duration::from_millis);
        PlannerLimits {
            call_timeout: ms(self.limits.call_timeout, defaults.call_timeout),
            start_timeout: ms(self.limits.start_timeout, defaults.start_timeout),
            memory_bytes: self.limits.memory_limit_mib.map_or(defaults.memory_bytes, |mib| (mib as usize) << 20),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Config {
    pub path: PathBuf,
    text: String,
    pub default_strategy: String,
    pub broker: BrokerConfig,
    pub service: ServiceConfig,
    pub planner_limits: PlannerLimits,
    /// `None`: compile planners on every start.
    pub cache_dir: Option<PathBuf>,
    /// Where `planners.cache_dir` is written (else `[planners]`, else the file's start).
    cache_dir_span: Range<usize>,
    pub strategies: BTreeMap<String, StrategyConfig>,
    pub destinations: BTreeMap<String, DestinationConfig>,
    /// Consumer queues with delayed redelivery.
    pub redelivery: Vec<RedeliveryConfig>,
    /// Delayed exchanges (`x-delay`), by name.
    pub exchanges: BTreeMap<String, DelayedExchangeConfig>,
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.display().to_string(), source })?;
        Config::parse(path, text)
    }

    pub fn parse(path: &Path, text: String) -> Result<Config, ConfigError> {
        let locate = |span: Range<usize>| location_in(path, &text, span.start);
        let invalid = |span: Range<usize>, message: String| ConfigError::Invalid { location: locate(span), message };
        let complaint = |span: Range<usize>, err: toml::de::Error| invalid(span, err.message().trim_end().to_string());
        // The parsed document keeps every key's and value's position, for
        // values checked below whose types keep none.
        let document = DeTable::parse(&text).map_err(|err| complaint(err.span().unwrap_or(0..0), err))?;
        let raw = RawConfig::deserialize(toml::de::Deserializer::from(document.clone())).map_err(|err| complaint(complaint_span(&document, &err), err))?;
        let base_dir = path.parent().unwrap_or(Path::new("."));

        let mut strategies = BTreeMap::new();
        for (name, table) in raw.strategies {
            let name_span = name.span();
            let name = name.into_inner();
            let mut planner = None;
            let mut cancellable = false;
            let mut cancellable_span = None;
            let mut limits = StrategyLimits::default();
            let mut key_spans = BTreeMap::new();
            let mut json = serde_json::Map::new();
            for (key, value) in table {
                let (key_span, key) = (key.span(), key.into_inner());
                if key == "planner" {
                    let span = value.span();
                    match value.into_inner() {
                        toml::Value::String(spec) if !spec.is_empty() => planner = Some((spec, span)),
                        other => {
                            return Err(invalid(
                                span,
                                format!("strategies.{name}.planner: expected a built-in planner name or a path to a .wasm file, found {other}"),
                            ));
                        }
                    }
                    continue;
                }
                if matches!(key.as_str(), "memory_limit_mib" | "call_timeout" | "start_timeout") {
                    // The sandbox's limits for this strategy's planner (they override [planners]).
                    let span = value.span();
                    let value = value.into_inner();
                    let bad = |why: String| invalid(span.clone(), format!("strategies.{name}.{key}: {why}"));
                    if key == "memory_limit_mib" {
                        let mib = value
                            .as_integer()
                            .filter(|m| (2..=4096).contains(m))
                            .ok_or_else(|| bad(format!("{value} must be a whole number from 2 to 4096")))?;
                        limits.memory_limit_mib = Some(mib as u32);
                    } else {
                        let ms = DurationMs::deserialize(value).map_err(|e| bad(e.to_string()))?.ms();
                        if ms == 0 {
                            return Err(bad("must be above zero".into()));
                        }
                        *(if key == "call_timeout" { &mut limits.call_timeout } else { &mut limits.start_timeout }) = Some(ms);
                    }
                    continue;
                }
                if key == "cancellable" {
                    match value.into_inner() {
                        toml::Value::Boolean(on) if on && raw.broker.capabilities().cancellation_log.is_none() => {
                            let kinds = BrokerConfig::kinds_that(|can| can.cancellation_log);
                            return Err(invalid(key_span, format!("strategies.{name}.cancellable: needs {kinds}")));
                        }
                        toml::Value::Boolean(on) => {
                            cancellable = on;
                            cancellable_span = Some(key_span);
                        }
                        other => return Err(invalid(key_span, format!("strategies.{name}.cancellable: expected true or false, found {other}"))),
                    }
                    continue;
                }
                let value = serde_json::to_value(value.get_ref()).map_err(|e| invalid(value.span(), format!("strategies.{name}.{key}: {e}")))?;
                json.insert(key.clone(), value);
                key_spans.insert(key, key_span);
            }
            let Some((spec, planner_span)) = planner else {
                return Err(invalid(
                    name_span,
                    format!("strategies.{name}: missing `planner` (one of {} or a path to a .wasm file)", crate::planner::builtin::NAMES.join(", ")),
                ));
            };
            let planner = PlannerSource::parse(&spec, base_dir);
            // Where a broker releases through a queue only its own planner plans to, a cancellable strategy needs that planner.
            // (A planner from a file says its family when loaded, and `serve` refuses the wrong one then.)
            let needed = raw.broker.capabilities().cancellable_planners;
            if let (true, PlannerSource::Builtin(builtin), Some(span)) = (cancellable, &planner, &cancellable_span)
                && !needed.is_empty()
                && !needed.contains(builtin)
            {
                let kind = raw.broker.kind();
                return Err(invalid(
                    span.clone(),
                    format!("strategies.{name}.cancellable: on broker.kind = {kind:?} it needs the {} planner, not {builtin}", needed.join(" or ")),
                ));
            }
            strategies.insert(
                name.clone(),
                StrategyConfig { name, planner, table: serde_json::Value::Object(json), cancellable, limits, name_span, planner_span, key_spans },
            );
        }
        if strategies.is_empty() {
            return Err(invalid(span_of(&document, "strategies"), "no strategies: add a [strategies.NAME] table with a `planner`".into()));
        }

        let default_strategy = match raw.default_strategy {
            Some(name) => {
                if !strategies.contains_key(name.get_ref()) {
                    return Err(invalid(name.span(), unknown_strategy(name.get_ref(), &strategies).to_string()));
                }
                name.into_inner()
            }
            None if strategies.len() == 1 => strategies.keys().next().cloned().expect("one strategy"),
            None => {
                return Err(invalid(span_of(&document, "strategies"), "default_strategy is required when there is more than one strategy".into()));
            }
        };

        let mut destinations = BTreeMap::new();
        for (name, destination) in raw.destinations {
            let span = destination.span();
            let destination = destination.into_inner();
            if let Some(strategy) = &destination.strategy
                && !strategies.contains_key(strategy)
            {
                return Err(invalid(span, format!("destinations.{}: {}", name.get_ref(), unknown_strategy(strategy, &strategies))));
            }
            destinations.insert(name.into_inner(), destination);
        }

        let mut exchanges = BTreeMap::new();
        for (name, exchange) in raw.exchanges {
            let (span, name, exchange) = (exchange.span(), name.into_inner(), exchange.into_inner());
            let refuse = |why: String| Err(invalid(span.clone(), format!("exchanges.{name:?}: {why}")));
            if !raw.broker.capabilities().exchanges {
                return refuse(format!("delayed exchanges need {}", BrokerConfig::kinds_that(|can| can.exchanges.then_some(""))));
            }
            if !raw.service.ingress.enabled {
                return refuse("delayed exchanges feed the AMQP ingress queue; service.ingress.enabled must be true".into());
            }
            if name.is_empty() || name.starts_with("amq.") {
                return refuse("the name must be non-empty and must not start with \"amq.\" (reserved by RabbitMQ)".into());
            }
            if exchange.deliver_to.is_empty() || exchange.deliver_to == name {
                return refuse("deliver_to must name another exchange, the one consumers bind their queues to".into());
            }
            if let Some(strategy) = &exchange.strategy
                && !strategies.contains_key(strategy)
            {
                return refuse(unknown_strategy(strategy, &strategies).to_string());
            }
            exchanges.insert(name, exchange);
        }

        check_service(&raw.service).map_err(|(path, message)| invalid(span_of(&document, &format!("service.{path}")), message))?;
        if let Err(setting) = raw.broker.check() {
            return Err(invalid(span_of(&document, &format!("broker.{}", setting.key)), setting.to_string()));
        }
        if raw.service.topology == Some(TopologyAtStart::Verify) && !raw.broker.capabilities().verify_topology {
            let needs = format!("service.topology = \"verify\" needs {}", BrokerConfig::topology_verifiers());
            return Err(invalid(span_of(&document, "service.topology"), needs));
        }

        let mut redelivery: Vec<RedeliveryConfig> = Vec::new();
        for entry in raw.redelivery {
            let span = entry.span();
            let entry = entry.into_inner();
            let named = |what: &str, name: &Option<String>| match name {
                Some(strategy) if !strategies.contains_key(strategy) => {
                    Err(invalid(span.clone(), format!("redelivery {:?}: {what}: {}", entry.queue, unknown_strategy(strategy, &strategies))))
                }
                _ => Ok(()),
            };
            if !raw.broker.capabilities().redelivery {
                let kinds = BrokerConfig::kinds_that(|can| can.redelivery.then_some("consumers reject messages to its dead-letter exchange"));
                return Err(invalid(span, format!("redelivery {:?}: needs {kinds}", entry.queue)));
            }
            named("strategy", &entry.strategy)?;
            named("policy", &entry.policy)?;
            if entry.queue.is_empty() {
                return Err(invalid(span, "redelivery: queue must be a non-empty queue name".into()));
            }
            if entry.max_attempts == Some(0) {
                return Err(invalid(span, format!("redelivery {:?}: max_attempts counts the first delivery too; give 1 or more", entry.queue)));
            }
            if redelivery.iter().any(|r| r.queue == entry.queue) {
                return Err(invalid(span, format!("redelivery {:?}: the queue is listed twice", entry.queue)));
            }
            if entry.error_queue() == entry.queue || entry.queue == raw.service.redelivery_input() {
                return Err(invalid(span, format!("redelivery {:?}: the error queue and the redelivery input must differ from the queue", entry.queue)));
            }
            redelivery.push(entry);
        }

        let settings = raw.planners;
        let defaults = PlannerLimits::default();
        let memory_mib = settings.memory_limit_mib.unwrap_or((defaults.memory_bytes >> 20) as u32);
        if !(2..=4096).contains(&memory_mib) {
            return Err(invalid(
                span_of(&document, "planners.memory_limit_mib"),
                format!("planners.memory_limit_mib: {memory_mib} must be between 2 and 4096"),
            ));
        }
        let call_timeout = settings.call_timeout.map_or(defaults.call_timeout, |d| Duration::from_millis(d.ms()));
        if call_timeout.is_zero() {
            return Err(invalid(span_of(&document, "planners.call_timeout"), "planners.call_timeout: must be above zero".into()));
        }
        let start_timeout = settings.start_timeout.map_or(defaults.start_timeout, |d| Duration::from_millis(d.ms()));
        if start_timeout.is_zero() {
            return Err(invalid(span_of(&document, "planners.start_timeout"), "planners.start_timeout: must be above zero".into()));
        }
        let cache_dir_span = span_of(&document, "planners.cache_dir");
        let cache_dir = match settings.cache {
            Some(false) => None,
            _ => settings.cache_dir.map(|dir| base_dir.join(dir)).or_else(default_cache_dir),
        };

        Ok(Config {
            path: path.to_path_buf(),
            text,
            default_strategy,
            broker: raw.broker,
            service: raw.service,
            planner_limits: PlannerLimits { call_timeout, start_timeout, memory_bytes: (memory_mib as usize) << 20 },
            cache_dir,
            cache_dir_span,
            strategies,
            destinations,
            redelivery,
            exchanges,
        })
    }

    pub fn strategy(&self, name: &str) -> Result<&StrategyConfig, UnknownStrategy> {
        self.strategies.get(name).ok_or_else(|| unknown_strategy(name, &self.strategies))
    }

    /// The strategy a destination uses unless one is named explicitly.
    pub fn strategy_for(&self, destination: &str) -> &str {
        self.destinations.get(destination).and_then(|d| d.strategy.as_deref()).unwrap_or(&self.default_strategy)
    }

    /// Where a strategy's messages wait before the host forwards them (cancellable,
    /// or due to an exchange), named as this config's broker takes names.
    pub fn release_queue(&self, strategy: &str) -> String {
        self.broker.release_queue_name(self.service.cancel.release_queue(strategy))
    }

    fn location(&self, offset: usize) -> Location {
        location_in(&self.path, &self.text, offset)
    }

    /// Where to point for a planner cache directory that is refused: its
    /// setting, when the file has one (it may come from the environment).
    pub(crate) fn cache_dir_location(&self) -> Location {
        self.location(self.cache_dir_span.start)
    }

    /// Where a strategy's `planner` value is.
    pub(crate) fn planner_location(&self, strategy: &StrategyConfig) -> Location {
        self.location(strategy.planner_span.start)
    }

    /// Where to point for a planner's complaint about its table: the key it
    /// names (`levels: …` or "unknown field `levls`"), else the table itself.
    pub(crate) fn table_error_location(&self, strategy: &StrategyConfig, message: &str) -> Location {
        let named = strategy.key_spans.iter().find(|(key, _)| {
            message.starts_with(&format!("{key}:"))
                || message.starts_with(&format!("{key}."))
                || message.starts_with(&format!("{key}["))
                || message.contains(&format!("`{key}`"))
        });
        match named {
            Some((_, span)) => self.location(span.start),
            None => self.location(strategy.name_span.start),
        }
    }
}

fn unknown_strategy(name: &str, strategies: &BTreeMap<String, StrategyConfig>) -> UnknownStrategy {
    UnknownStrategy { name: name.to_string(), configured: strategies.keys().cloned().collect() }
}

fn location_in(path: &Path, text: &str, offset: usize) -> Location {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    Location { path: path.to_path_buf(), line, column }
}

/// `$HOURGLASS_CACHE_DIR`, else the user's cache directory.
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(dir) = environment("HOURGLASS_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    let base = environment("XDG_CACHE_HOME").map(PathBuf::from).or_else(|| environment("HOME").map(|home| PathBuf::from(home).join(".cache")))?;
    Some(base.join("hourglass"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("delay.toml"), text.to_string())
    }

    #[test]
    fn a_strategy_sets_its_own_sandbox_limits_and_they_never_reach_its_planner() {
        let config =
            parse("[planners]\ncall_timeout = \"50ms\"\n[strategies.py]\nplanner = \"hold-queues\"\nmemory_limit_mib = 64\nstart_timeout = \"10s\"\n").unwrap();
        let strategy = &config.strategies["py"];
        let limits = strategy.planner_limits(config.planner_limits);
        assert_eq!((limits.memory_bytes, limits.start_timeout, limits.call_timeout), (64 << 20, Duration::from_secs(10), Duration::from_millis(50)));
        assert_eq!(strategy.table, serde_json::json!({}), "the host's keys are not the planner's");
        for (line, complaint) in
            [("memory_limit_mib = 1", "from 2 to 4096"), ("call_timeout = \"0ms\"", "above zero"), ("start_timeout = \"soon\"", "start_timeout")]
        {
            let err = parse(&format!("[strategies.py]\nplanner = \"hold-queues\"\n{line}\n")).unwrap_err().to_string();
            assert!(err.contains("strategies.py.") && err.contains(complaint), "{line}: {err}");
        }
    }

    #[test]
    fn a_minimal_config_has_one_default_strategy() {
        let config = parse("[strategies.seconds]\nplanner = \"binary-levels\"\nlevels = 20\n").unwrap();
        assert_eq!(config.default_strategy, "seconds");
        let strategy = config.strategy("seconds").unwrap();
        assert_eq!(strategy.planner, PlannerSource::Builtin("binary-levels"));
        assert_eq!(strategy.table, serde_json::json!({ "levels": 20 }));
        assert_eq!(config.broker, BrokerConfig::Memory);
    }

    #[test]
    fn service_settings_default_sensibly_and_bad_ones_name_their_line() {
        let config = parse("[strategies.a]\nplanner = \"hold-queues\"\n").unwrap();
        assert_eq!(config.service.ingress, IngressConfig::default());
        assert!(config.service.ingress.enabled && config.service.ingress.prefetch == 64);
        let config =
            parse("[broker]\nkind = \"rabbitmq\"\n[service]\nlog_format = \"json\"\ntopology = \"verify\"\n[service.ingress]\nqueue = \"in\"\n[strategies.a]\nplanner = \"hold-queues\"\n")
                .unwrap();
        assert_eq!(config.service.log_format, Some(LogFormat::Json));
        assert_eq!(config.service.topology, Some(TopologyAtStart::Verify));
        assert_eq!((config.service.ingress.queue.as_str(), config.service.ingress.invalid_queue.as_str()), ("in", "hourglass.ingress.invalid"));

        let bad = [
            ("[service]\n[service.ingress]\nprefetch = 0\n", "delay.toml:3:", "prefetch: must be at least 1"),
            ("[service]\npump_wait = \"30s\"\n", "delay.toml:2:", "above SQS's 20 s"),
            ("[service.ingress]\nqueue = \"q\"\ninvalid_queue = \"q\"\n", "delay.toml:3:", "is also the ingress queue"),
            ("[service]\ntopology = \"maybe\"\n", "delay.toml:2:", "unknown variant"),
            ("[service]\ntopology = \"verify\"\n", "delay.toml:2:", "service.topology = \"verify\" needs broker.kind = \"rabbitmq\" or \"nats\""),
            ("[service]\ntoken = \"\"\n", "delay.toml:2:", "service.token: empty"),
            ("[service]\nmax_connections = 0\n", "delay.toml:2:", "at least 1"),
            ("[service]\nheader_read_timeout = \"0s\"\n", "delay.toml:2:", "header_read_timeout: must be above zero"),
            ("[service]\nidle_timeout = \"0ms\"\n", "delay.toml:2:", "idle_timeout: must be above zero"),
            ("[service]\npump_linger = \"6s\"\n", "delay.toml:2:", "pump_linger: must be at most 5s"),
            ("[service]\ndepth_poll = \"10ms\"\n", "delay.toml:2:", "depth_poll: must be at least 100ms"),
            ("[service.canary]\nevery = \"10ms\"\n", "delay.toml:2:", "canary.every: must be at least 100ms"),
        ];
        for (service, location, message) in bad {
            let err = parse(&format!("{service}[strategies.a]\nplanner = \"hold-queues\"\n")).unwrap_err().to_string();
            assert!(err.starts_with(location) && err.contains(message), "{err}");
        }
    }

    #[test]
    fn publish_channels_is_read_and_bounded() {
        let broker =
            |channels: &str| parse(&format!("[broker]\nkind = \"rabbitmq\"\npublish_channels = {channels}\n[strategies.a]\nplanner = \"hold-queues\"\n"));
        assert!(matches!(broker("8").unwrap().broker, BrokerConfig::Rabbitmq { publish_channels: Some(8), .. }));
        for bad in ["0", "5000"] {
            let err = broker(bad).unwrap_err().to_string();
            assert!(err.starts_with("delay.toml:3:") && err.contains("publish_channels"), "{err}");
        }
    }

    #[test]
    fn send_batch_window_is_read_and_bounded() {
        let broker = |window: &str| parse(&format!("[broker]\nkind = \"sqs\"\nsend_batch_window = {window}\n[strategies.a]\nplanner = \"sqs-cycles\"\n"));
        let window = |text: &str| match broker(text).unwrap().broker {
            BrokerConfig::Sqs { send_batch_window, .. } => send_batch_window.map(|d| d.ms()),
            other => panic!("{other:?}"),
        };
        assert_eq!(window("\"0ms\""), Some(0));
        assert_eq!(window("\"5ms\""), Some(5));
        assert_eq!(window("\"1s\""), Some(1_000));
        let err = broker("\"2s\"").unwrap_err().to_string();
        assert!(err.starts_with("delay.toml:3:") && err.contains("send_batch_window: 2000 ms is above 1000 ms"), "{err}");
        // Inside the tagged `[broker]` table serde keeps no position; the complaint still points at its key.
        let err = broker("\"soon\"").unwrap_err().to_string();
        assert!(err.starts_with("delay.toml:3:1:") && err.contains("duration \"soon\""), "{err}");
    }

    #[test]
    fn positions_come_from_the_parser_not_from_text_that_looks_like_the_key() {
        let cases = [
            // A comment and another table's `invalid_queue` say `queue =` before the value at fault.
            (
                "# queue = \"set below\"\n[service.ingress]\ninvalid_queue = \"in.invalid\"\n[service.sqs_ingress]\nqueue = \"no spaces\"\n",
                "delay.toml:5:9:",
                "service.sqs_ingress.queue",
            ),
            ("[service.ingress]\nqueue = \"in\"\n[service.canary]\nqueue = \"\"\n", "delay.toml:4:9:", "service.canary.queue"),
            ("[service.ingress]\nqueue = \"\"\n", "delay.toml:2:9:", "queue and invalid_queue must be non-empty"),
            ("[planners]\ncache = false\nmemory_limit_mib = 1\n", "delay.toml:3:20:", "planners.memory_limit_mib"),
            ("[planners]\nstart_timeout = \"0s\"\n", "delay.toml:2:17:", "planners.start_timeout"),
            // Unknown keys at their own line, in the tagged `[broker]` table too (it was once 1:1).
            ("[broker]\nkind = \"rabbitmq\"\npublish_channel = 8\n", "delay.toml:3:1:", "unknown field `publish_channel`"),
            ("# rabbit\n[broker]\nurl = \"amqp://localhost\"\nkind = \"rabbitmq\"\npublish_channels = \"many\"\n", "delay.toml:5:1:", "invalid type"),
            ("[service]\nlisten = \"127.0.0.1:9000\"\n[service.ingress]\npump_wait = \"5s\"\n", "delay.toml:4:1:", "unknown field `pump_wait`"),
        ];
        for (text, location, message) in cases {
            let err = parse(&format!("{text}[strategies.a]\nplanner = \"hold-queues\"\n")).unwrap_err().to_string();
            assert!(err.starts_with(location) && err.contains(message), "{text:?}: {err:?} should start {location} and mention {message:?}");
        }
        // Complaints about the table as a whole stay at the table.
        let err = parse("[broker]\nurl = \"amqp://localhost\"\n[strategies.a]\nplanner = \"hold-queues\"\n").unwrap_err().to_string();
        assert!(err.starts_with("delay.toml:1:1:") && err.contains("missing field `kind`"), "{err}");
        let err = parse("[strategies.a]\nplanner = \"hold-queues\"\n[strategies.b]\nplanner = \"hold-queues\"\n").unwrap_err().to_string();
        assert!(err.starts_with("delay.toml:1:") && err.contains("default_strategy is required"), "{err}");
    }

    #[test]
    fn redelivery_entries_default_sensibly_and_mistakes_name_their_line() {
        let rabbit = "[broker]\nkind = \"rabbitmq\"\n[strategies.a]\nplanner = \"fixed-intervals\"\nintervals = [\"1s\"]\n";
        let config = parse(&format!("{rabbit}[[redelivery]]\nqueue = \"orders\"\nmax_attempts = 3\n")).unwrap();
        let entry = &config.redelivery[0];
        assert_eq!((entry.queue.as_str(), entry.error_queue(), entry.dead_letter), ("orders", "orders.error".to_string(), DeadLetterSetup::Declare));
        assert_eq!(config.service.redelivery_input(), "hourglass.redelivery");
        let cases = [
            (format!("{rabbit}\n[[redelivery]]\nqueue = \"q\"\npolicy = \"nope\"\n"), 7, "unknown strategy \"nope\""),
            (format!("{rabbit}\n[[redelivery]]\nqueue = \"q\"\nmax_attempts = 0\n"), 7, "max_attempts"),
            (format!("{rabbit}\n[[redelivery]]\nqueue = \"q\"\n[[redelivery]]\nqueue = \"q\"\n"), 9, "listed twice"),
            (format!("{rabbit}\n[[redelivery]]\nqueue = \"q\"\nerror_queue = \"q\"\n"), 7, "must differ"),
            (format!("{rabbit}\n[[redelivery]]\nqueue = \"q\"\ndead_letter = \"maybe\"\n"), 9, "unknown variant `maybe`"),
            ("[strategies.a]\nplanner = \"hold-queues\"\n[[redelivery]]\nqueue = \"q\"\n".to_string(), 3, "needs broker.kind = \"rabbitmq\""),
        ];
        for (text, line, want) in cases {
            let err = parse(&text).unwrap_err().to_string();
            assert!(err.starts_with(&format!("delay.toml:{line}:")) && err.contains(want), "{err:?} should be at line {line} and mention {want:?}");
        }
    }

    #[test]
    fn unknown_top_level_keys_name_file_line_and_column() {
        let err = parse("[strategies.a]\nplanner = \"hold-queues\"\n\n[brokr]\nkind = \"memory\"\n").unwrap_err().to_string();
        assert!(err.starts_with("delay.toml:4:"), "{err}");
        assert!(err.contains("unknown field `brokr`"), "{err}");
    }

    #[test]
    fn wrong_types_name_the_place() {
        let err = parse("[planners]\nmemory_limit_mib = \"lots\"\n[strategies.a]\nplanner = \"hold-queues\"\n").unwrap_err().to_string();
        assert!(err.starts_with("delay.toml:2:"), "{err}");
    }

    #[test]
    fn strategy_problems_point_into_the_strategy() {
        let err = parse("[strategies.a]\nlevels = 3\n").unwrap_err().to_string();
        assert!(err.starts_with("delay.toml:1:") && err.contains("missing `planner`"), "{err}");
        let err = parse("default_strategy = \"b\"\n[strategies.a]\nplanner = \"hold-queues\"\n").unwrap_err().to_string();
        assert!(err.starts_with("delay.toml:1:") && err.contains("unknown strategy \"b\""), "{err}");
    }

    #[test]
    fn each_kind_names_its_cancellation_store_after_the_log() {
        let store = |kind: &str| {
            let strategy = match kind {
                "sqs" => "sqs-cycles",
                "nats" => "nats-hold",
                _ => "hold-queues",
            };
            let text = format!("[broker]\nkind = \"{kind}\"\n[service.cancel]\nlog = \"orders.cancelled\"\n[strategies.a]\nplanner = \"{strategy}\"\n");
            let config = parse(&text).unwrap();
            config.broker.cancellation_store(&config.service.cancel)
        };
        assert_eq!(store("rabbitmq"), "orders.cancelled", "a stream of that name");
        assert_eq!(store("sqs"), "orders-cancelled.fifo", "SQS FIFO names take no dots");
        assert_eq!(store("nats"), "orders-cancelled", "KV bucket names take no dots");
    }

    #[test]
    fn cancellable_is_taken_on_rabbitmq_and_on_sqs_with_an_sqs_planner_and_refused_otherwise_naming_the_key() {
        let sqs = "[broker]\nkind = \"sqs\"\n";
        let config = parse(&format!("{sqs}[strategies.a]\nplanner = \"sqs-cycles\"\ncancellable = true\n")).unwrap();
        assert!(config.strategy("a").unwrap().cancellable);
        assert_eq!(config.release_queue("a"), "hourglass-release-a", "SQS names take no dots");
        assert_eq!(config.broker.cancellation_store(&config.service.cancel), "hourglass-cancellations.fifo");
        let err = parse(&format!("{sqs}[strategies.a]\nplanner = \"binary-levels\"\ncancellable = true\n")).unwrap_err().to_string();
        assert!(err.starts_with("delay.toml:5:") && err.contains("strategies.a.cancellable") && err.contains("sqs-cycles"), "{err}");
        let err = parse("[strategies.a]\nplanner = \"hold-queues\"\ncancellable = true\n").unwrap_err().to_string();
        assert!(err.contains("strategies.a.cancellable: needs broker.kind"), "the memory broker keeps no cancellations: {err}");
    }

    #[test]
    fn planner_complaints_point_at_the_key_they_name() {
        let config = parse("[strategies.a]\nplanner = \"binary-levels\"\nlevls = 3\n").unwrap();
        let strategy = config.strategy("a").unwrap();
        let location = config.table_error_location(strategy, "unknown field `levls`, expected one of `levels`");
        assert_eq!((location.line, location.column), (3, 1));
    }

    #[test]
    fn relative_planner_paths_resolve_beside_the_config() {
        let config = Config::parse(Path::new("conf/delay.toml"), "[strategies.a]\nplanner = \"p.wasm\"\n".into()).unwrap();
        assert_eq!(config.strategy("a").unwrap().planner, PlannerSource::File(PathBuf::from("conf/p.wasm")));
    }
}
