//! `[broker]`: each kind of broker, its settings, and what it can do.
//!
//! [`BrokerConfig`] is the table as `delay.toml` writes it. [`Capabilities`]
//! says what a kind can do, which is all `delay.toml`'s parsing asks when it
//! checks a strategy, a delayed exchange or a redelivery entry. A config also
//! asks here how its broker names and declares hourglass's own queues (the
//! ingress, the canary, the release queues) and the ingress's delayed exchanges.
//! Every match on the kind in this file is exhaustive, so a new kind is
//! refused by the compiler until each one answers for it; the code that runs
//! each kind is opened by the broker registry (`broker/registry.rs`).

use std::collections::BTreeMap;

use hourglass_planner_sdk::DurationMs;
use serde::Deserialize;

use super::{CancelConfig, DelayedExchangeConfig, OwnQueueType};
use crate::command::{AmqpCommand, Command, ExchangeKind, FieldTable, FieldValue, NatsCommand, SqsCommand};
use crate::environment::environment_text;
use crate::planner::BrokerFamily;

/// The AMQP URL when none is configured: guest on the local broker.
pub const DEFAULT_AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
/// The NATS URL when none is configured: the local server.
pub const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";
/// The environment variable that overrides the NATS URL unless `url_env` names another.
pub const NATS_URL_ENV: &str = "HOURGLASS_NATS_URL";

/// The most `broker.publish_channels` may be: well under RabbitMQ's default `channel_max` (2,047).
pub const MAX_PUBLISH_CHANNELS: usize = 1_024;

/// The most `broker.send_batch_window` may be: every first send can wait this long.
pub const MAX_SEND_BATCH_WINDOW_MS: u64 = 1_000;

/// The environment variable that overrides the AMQP URL unless `url_env` names another.
pub(crate) const AMQP_URL_ENV: &str = "HOURGLASS_AMQP_URL";

/// `[broker]`: which broker, and its settings.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum BrokerConfig {
    /// The embedded in-memory broker (the simulator).
    #[default]
    Memory,
    Rabbitmq {
        /// `amqp://` or `amqps://` URL; `url_env` names a variable that overrides it.
        url: Option<String>,
        url_env: Option<String>,
        /// The management HTTP API, for `verify` (default: the AMQP host on port 15672).
        management_url: Option<String>,
        /// Confirm-mode channels for publishes, each carrying a batch of
        /// publishes at a time: 1 to [`MAX_PUBLISH_CHANNELS`] (default 16, the executor's).
        publish_channels: Option<usize>,
    },
    Sqs {
        region: Option<String>,
        endpoint_url: Option<String>,
        /// How long a first send waits for others to the same queue to share
        /// one `SendMessageBatch` (default 2ms; `0ms`: only those already
        /// waiting; at most [`MAX_SEND_BATCH_WINDOW_MS`]).
        send_batch_window: Option<DurationMs>,
    },
    Nats {
        /// `nats://` URL (several, comma-separated, for a cluster); `url_env`
        /// names a variable that overrides it (default `HOURGLASS_NATS_URL`).
        url: Option<String>,
        url_env: Option<String>,
        /// Replicas of the streams hourglass creates: 1 on one server, 3 in a cluster (default 1).
        replicas: Option<usize>,
        /// The stream the server's clock is read through (default `hourglass-clock`; memory, one message).
        clock_stream: Option<String>,
    },
}

/// The most `broker.replicas` may be: JetStream's own limit.
pub const MAX_NATS_REPLICAS: usize = 5;

/// What a kind of broker can do, for the checks that refuse a config asking more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// What keeps cancellations, for people (`cancellable = true`); `None`: nothing can be cancelled.
    pub cancellation_log: Option<&'static str>,
    /// Delayed exchanges (`[exchanges."name"]`) and due times to an exchange.
    pub exchanges: bool,
    /// `[[redelivery]]`: consumers reject messages to a dead-letter exchange.
    pub redelivery: bool,
    /// The commands a strategy's planner must write here; `None`: any (the simulator runs every family).
    pub family: Option<BrokerFamily>,
    /// A cancellable strategy needs one of these built-in planners (its release step is the broker's own); empty: any.
    pub cancellable_planners: &'static [&'static str],
    /// A cancellable strategy delivers through a release queue that asks the
    /// cancellation log before forwarding; without one, the broker's own hold
    /// asks it at hand-over (NATS).
    pub release_queue: bool,
    /// `hourglass verify` and `service.topology = "verify"` compare what a
    /// strategy declares with the broker.
    pub verify_topology: bool,
    /// `hourglass inspect` reads what waits without a running service.
    pub depths_at_rest: bool,
}

/// A `[broker]` setting out of its bounds: the key and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct SettingError {
    /// The key under `[broker]`.
    pub key: &'static str,
    pub reason: String,
}

impl BrokerConfig {
    /// Every kind, as `[broker] kind` spells it, with what it can do.
    pub const KINDS: [(&'static str, Capabilities); 4] = [
        (
            "memory",
            Capabilities {
                cancellation_log: None,
                exchanges: false,
                redelivery: false,
                family: None,
                cancellable_planners: &[],
                release_queue: false,
                verify_topology: false,
                depths_at_rest: false,
            },
        ),
        (
            "rabbitmq",
            Capabilities {
                cancellation_log: Some("a stream keeps cancellations"),
                exchanges: true,
                redelivery: true,
                family: Some(BrokerFamily::Amqp),
                cancellable_planners: &[],
                release_queue: true,
                verify_topology: true,
                depths_at_rest: true,
            },
        ),
        (
            "sqs",
            Capabilities {
                cancellation_log: Some("a FIFO fates queue keeps cancellations"),
                exchanges: false,
                redelivery: false,
                family: Some(BrokerFamily::Sqs),
                // The release step is a standard queue reached with DelaySeconds: only an SQS planner plans to it.
                cancellable_planners: &[crate::planner::builtin::SQS_CYCLES],
                release_queue: true,
                verify_topology: false,
                depths_at_rest: false,
            },
        ),
        (
            "nats",
            Capabilities {
                cancellation_log: Some("a KV bucket keeps cancellations"),
                exchanges: false,
                redelivery: false,
                family: Some(BrokerFamily::Nats),
                // The held stream asks the bucket at hand-over, and a cancel removes a schedule: the planners of either.
                cancellable_planners: &[crate::planner::builtin::NATS_HOLD, crate::planner::builtin::NATS_SCHEDULE],
                release_queue: false,
                verify_topology: true,
                depths_at_rest: true,
            },
        ),
    ];

    fn index(&self) -> usize {
        match self {
            BrokerConfig::Memory => 0,
            BrokerConfig::Rabbitmq { .. } => 1,
            BrokerConfig::Sqs { .. } => 2,
            BrokerConfig::Nats { .. } => 3,
        }
    }

    /// The kind as `[broker] kind` spells it.
    pub fn kind(&self) -> &'static str {
        Self::KINDS[self.index()].0
    }

    pub fn capabilities(&self) -> Capabilities {
        Self::KINDS[self.index()].1
    }

    /// `broker.kind = "a" (why) or "b" (why)`: the kinds that have what `has`
    /// picks, with what `why` says of each, for a message refusing a config.
    pub fn kinds_that(has: impl Fn(&Capabilities) -> Option<&'static str>) -> String {
        let kinds: Vec<String> = Self::KINDS
            .iter()
            .filter_map(|(kind, capabilities)| has(capabilities).map(|why| if why.is_empty() { format!("{kind:?}") } else { format!("{kind:?} ({why})") }))
            .collect();
        format!("broker.kind = {}", kinds.join(" or "))
    }

    /// The kinds whose topology `hourglass verify` and `service.topology = "verify"` can check.
    pub fn topology_verifiers() -> String {
        Self::kinds_that(|kind| kind.verify_topology.then_some(""))
    }

    /// Settings out of their bounds, naming the key.
    pub fn check(&self) -> Result<(), SettingError> {
        match self {
            BrokerConfig::Memory => Ok(()),
            BrokerConfig::Rabbitmq { publish_channels, .. } => match publish_channels {
                Some(channels) if !(1..=MAX_PUBLISH_CHANNELS).contains(channels) => {
                    Err(SettingError { key: "publish_channels", reason: format!("{channels} is not between 1 and {MAX_PUBLISH_CHANNELS}") })
                }
                _ => Ok(()),
            },
            BrokerConfig::Sqs { send_batch_window, .. } => match send_batch_window {
                Some(window) if window.ms() > MAX_SEND_BATCH_WINDOW_MS => Err(SettingError {
                    key: "send_batch_window",
                    reason: format!("{} ms is above {MAX_SEND_BATCH_WINDOW_MS} ms; every first send may wait this long", window.ms()),
                }),
                _ => Ok(()),
            },
            BrokerConfig::Nats { replicas, .. } => match replicas {
                Some(replicas) if !(1..=MAX_NATS_REPLICAS).contains(replicas) => {
                    Err(SettingError { key: "replicas", reason: format!("{replicas} is not between 1 and {MAX_NATS_REPLICAS}") })
                }
                _ => Ok(()),
            },
        }
    }

    /// Where this kind keeps the cancellations of `cancellable = true`
    /// strategies, named after `service.cancel.log`: RabbitMQ's stream,
    /// SQS's fates queue, NATS's KV bucket.
    pub fn cancellation_store(&self, cancel: &CancelConfig) -> String {
        let log = cancel.log();
        match self {
            BrokerConfig::Memory | BrokerConfig::Rabbitmq { .. } => log.to_string(),
            BrokerConfig::Sqs { .. } => sqs_fates_queue(log),
            BrokerConfig::Nats { .. } => nats_cancellation_bucket(log),
        }
    }

    /// A release queue named `name` (`<release_prefix>.<strategy>`) as this broker takes names.
    pub fn release_queue_name(&self, name: String) -> String {
        match self {
            BrokerConfig::Memory | BrokerConfig::Rabbitmq { .. } => name,
            BrokerConfig::Sqs { .. } => sqs_safe_name(&name),
            BrokerConfig::Nats { .. } => nats_safe_subject(&name),
        }
    }

    /// The declaration of the release queue `name` (or of its `.parked` queue)
    /// on this broker; the simulator takes RabbitMQ's.
    pub fn release_queue_declaration(&self, name: &str) -> Command {
        match self {
            BrokerConfig::Memory | BrokerConfig::Rabbitmq { .. } => rabbitmq_release_queue(name),
            BrokerConfig::Sqs { .. } => sqs_release_queue(name),
            BrokerConfig::Nats { .. } => nats_release_stream(name),
        }
    }

    /// The ingress's queue and its invalid queue (see [`Self::own_queue_declaration`]),
    /// and on RabbitMQ each delayed exchange, bound to the ingress queue, with its `deliver_to`.
    pub fn ingress_declarations(
        &self,
        queue: &str,
        invalid_queue: &str,
        queue_type: OwnQueueType,
        exchanges: &BTreeMap<String, DelayedExchangeConfig>,
    ) -> Vec<Command> {
        let mut declarations: Vec<Command> = [queue, invalid_queue].into_iter().map(|name| self.own_queue_declaration(name, queue_type)).collect();
        match self {
            BrokerConfig::Memory | BrokerConfig::Rabbitmq { .. } => {
                declarations.extend(exchanges.iter().flat_map(|(name, exchange)| rabbitmq_delayed_exchange(name, exchange, queue)));
            }
            // [exchanges] is refused on these when the config is read.
            BrokerConfig::Sqs { .. } | BrokerConfig::Nats { .. } => {}
        }
        declarations
    }

    /// One of hourglass's own queues (the ingress and its invalid queue, the
    /// canary's), as this broker makes it: a durable queue of `queue_type` on
    /// RabbitMQ, a standard queue on SQS, a stream capturing the subject
    /// (named after it, '.' as '-') on NATS.
    pub fn own_queue_declaration(&self, name: &str, queue_type: OwnQueueType) -> Command {
        match self {
            BrokerConfig::Memory | BrokerConfig::Rabbitmq { .. } => rabbitmq_own_queue(name, queue_type),
            BrokerConfig::Sqs { .. } => Command::Sqs(SqsCommand::EnsureQueue { name: name.to_string(), attributes: Default::default(), pumped: false }),
            BrokerConfig::Nats { .. } => {
                Command::Nats(NatsCommand::EnsureStream { name: name.replace('.', "-"), subjects: vec![name.to_string()], held: false })
            }
        }
    }
}

/// `[broker]` with the environment's overrides taken and defaults filled in:
/// what the registry opens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BrokerSettings {
    Memory,
    RabbitMq(RabbitMqSettings),
    Sqs(SqsSettings),
    Nats(NatsSettings),
}

/// A RabbitMQ broker's settings as the work that runs only there takes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RabbitMqSettings {
    /// The AMQP URL, the environment's override taken ([`amqp_url`]).
    pub url: String,
    /// `broker.management_url`, as configured.
    pub management_url: Option<String>,
    pub publish_channels: Option<usize>,
}

/// An SQS broker's settings as the work that runs only there takes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqsSettings {
    pub region: Option<String>,
    pub endpoint_url: Option<String>,
    pub send_batch_window: Option<DurationMs>,
}

impl BrokerConfig {
    /// The settings of whichever kind this is.
    pub fn settings(&self) -> BrokerSettings {
        match self {
            BrokerConfig::Memory => BrokerSettings::Memory,
            BrokerConfig::Rabbitmq { url, url_env, management_url, publish_channels } => BrokerSettings::RabbitMq(RabbitMqSettings {
                url: amqp_url(url.as_deref(), url_env.as_deref()),
                management_url: management_url.clone(),
                publish_channels: *publish_channels,
            }),
            BrokerConfig::Sqs { region, endpoint_url, send_batch_window } => {
                BrokerSettings::Sqs(SqsSettings { region: region.clone(), endpoint_url: endpoint_url.clone(), send_batch_window: *send_batch_window })
            }
            BrokerConfig::Nats { url, url_env, replicas, clock_stream } => BrokerSettings::Nats(NatsSettings {
                url: nats_url(url.as_deref(), url_env.as_deref()),
                replicas: replicas.unwrap_or(1),
                clock_stream: clock_stream.clone().unwrap_or_else(|| "hourglass-clock".to_string()),
            }),
        }
    }
}

/// A NATS server's settings as the work that runs only there takes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NatsSettings {
    /// The URL, the environment's override taken.
    pub url: String,
    pub replicas: usize,
    /// `broker.clock_stream`.
    pub clock_stream: String,
}

/// The NATS URL: the environment variable (`url_env`, default
/// `HOURGLASS_NATS_URL`), else `url`, else the local server.
pub fn nats_url(url: Option<&str>, url_env: Option<&str>) -> String {
    let variable = url_env.unwrap_or(NATS_URL_ENV);
    environment_text(variable).or_else(|| url.map(str::to_string)).unwrap_or_else(|| DEFAULT_NATS_URL.to_string())
}

/// The AMQP URL: the environment variable (`url_env`, default
/// `HOURGLASS_AMQP_URL`), else `url`, else guest on localhost.
pub fn amqp_url(url: Option<&str>, url_env: Option<&str>) -> String {
    let variable = url_env.unwrap_or(AMQP_URL_ENV);
    environment_text(variable).or_else(|| url.map(str::to_string)).unwrap_or_else(|| DEFAULT_AMQP_URL.to_string())
}

/// A name with the characters SQS refuses in queue names replaced by `-`
/// (SQS names take letters, digits, `-` and `_`).
pub fn sqs_safe_name(name: &str) -> String {
    word_characters(name)
}

/// `name` in letters, digits, `-` and `_`, anything else as `-`.
fn word_characters(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '-' }).collect()
}

/// SQS's store of cancellations: the FIFO fates queue every host shares,
/// named after `log` (`hourglass.cancellations` → `hourglass-cancellations.fifo`).
pub fn sqs_fates_queue(log: &str) -> String {
    format!("{}.fifo", sqs_safe_name(log.strip_suffix(".fifo").unwrap_or(log)))
}

/// NATS's store of cancellations: the KV bucket named after `log` (bucket
/// names take letters, digits, `-` and `_`).
pub fn nats_cancellation_bucket(log: &str) -> String {
    word_characters(log)
}

/// A name made a valid NATS subject (letters, digits, `-`, `_`, `.`).
pub fn nats_safe_subject(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '_' }).collect()
}

/// One of hourglass's own RabbitMQ queues (ingress, invalid, canary, redelivery), durable, of `queue_type`.
pub fn rabbitmq_own_queue(name: &str, queue_type: OwnQueueType) -> Command {
    let arguments: FieldTable = match queue_type {
        OwnQueueType::Quorum => [("x-queue-type".to_string(), FieldValue::Text("quorum".into()))].into(),
        OwnQueueType::Classic => FieldTable::default(),
    };
    Command::Amqp(AmqpCommand::DeclareQueue { name: name.to_string(), durable: true, arguments })
}

/// What a delayed exchange declares: itself, a fanout exchange bound to the
/// ingress queue (every routing key reaches it), and `deliver_to` with the
/// exchange's `type`. A delayed exchange that exists as the plugin's
/// `x-delayed-message` is refused by the broker, by name, until it is deleted.
pub fn rabbitmq_delayed_exchange(name: &str, exchange: &DelayedExchangeConfig, ingress_queue: &str) -> Vec<Command> {
    let declare = |name: &str, kind: ExchangeKind| {
        Command::Amqp(AmqpCommand::DeclareExchange { name: name.to_string(), kind, durable: true, arguments: Default::default() })
    };
    vec![
        declare(name, ExchangeKind::Fanout),
        Command::Amqp(AmqpCommand::BindQueue {
            queue: ingress_queue.to_string(),
            exchange: name.to_string(),
            routing_key: String::new(),
            arguments: Default::default(),
        }),
        declare(&exchange.deliver_to, exchange.kind.exchange_kind()),
    ]
}

/// A RabbitMQ release queue (where a `cancellable = true` strategy, or a
/// message due to an exchange, ends its delay), or its `.parked` queue:
/// quorum, so it keeps what it holds through a broker crash.
pub fn rabbitmq_release_queue(name: &str) -> Command {
    let arguments = [("x-queue-type".to_string(), FieldValue::Text("quorum".into()))];
    Command::Amqp(AmqpCommand::DeclareQueue { name: name.to_string(), durable: true, arguments: arguments.into() })
}

/// An SQS release queue: a standard queue, kept as long as SQS keeps anything,
/// so a message waiting there for a host outlives any outage.
pub fn sqs_release_queue(name: &str) -> Command {
    let attributes = [("MessageRetentionPeriod".to_string(), "1209600".to_string())].into();
    Command::Sqs(SqsCommand::EnsureQueue { name: name.to_string(), attributes, pumped: false })
}

/// The stream that captures a NATS release subject.
pub fn nats_release_stream(subject: &str) -> Command {
    Command::Nats(NatsCommand::EnsureStream { name: subject.replace('.', "_"), subjects: vec![subject.to_string()], held: false })
}
