//! Probes: proof, on the broker at hand, that the mechanisms the configured
//! strategies are built from behave as hourglass needs.
//!
//! hourglass is tested on RabbitMQ 3.10 only, and 3.13 rewrote how the broker
//! carries a message (message containers: `BCC` became an annotation). So a
//! probe sends one message through each mechanism a strategy uses, on a
//! topology of its own, and watches where it arrives:
//!
//! * [`Mechanism::Bcc`]: a message published with a `BCC` key waits in a TTL
//!   queue and dead-letters to a direct exchange bound only on that key; it
//!   must arrive there, without a `BCC` header (what binary-levels' direct
//!   routing relies on at every level).
//! * [`Mechanism::AlternateExchange`]: the dead-letter exchange routes the
//!   message nowhere; its `alternate-exchange` must take it (how direct
//!   levels pass a message down, and how every last hop parks).
//! * [`Mechanism::AtLeastOnce`]: a quorum queue declared with
//!   `x-dead-letter-strategy = at-least-once` and `x-overflow =
//!   reject-publish` is accepted and dead-letters an expired message.
//!
//! When the strategies use quorum at-least-once queues, the first two probes
//! dead-letter from such a queue as well (the broker dead-letters from quorum
//! and classic queues by different code), else from a classic queue.
//!
//! Names are `hourglass.probe.<random>.<mechanism>.<role>`: the queue a probe
//! reads is exclusive to its connection, the waiting queue has `x-expires`,
//! the exchanges delete themselves once those queues are gone, and a finished
//! probe deletes all of it. A process that dies mid-probe leaves nothing for
//! longer than [`EXPIRES_MS`].

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldArray, FieldTable as AmqpTable, LongString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind};
use serde::Serialize;
use thiserror::Error;

use crate::command::{AmqpCommand, Command, FieldValue};
use crate::headers::BCC_HEADER;

use super::link::{CHANNEL_TIMEOUT, CONNECT_TIMEOUT, create_channel, parting};
use super::nodes::{self, redact};

/// Every probe's names start with this.
pub(crate) const PROBE_PREFIX: &str = "hourglass.probe";
/// How long a probe message may take from its publish to its arrival. On
/// RabbitMQ 3.10 it takes the TTL plus a few milliseconds.
pub const ARRIVAL_DEADLINE: Duration = Duration::from_secs(5);
/// How long a probe message waits before it dead-letters.
const TTL_MS: i64 = 50;
/// A probe's waiting queue goes this long after its last use, should the probe never delete it.
pub const EXPIRES_MS: i64 = 60_000;
/// How often a probe looks for its message.
const LOOK_EVERY: Duration = Duration::from_millis(20);

/// A broker mechanism a strategy is built from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mechanism {
    /// `BCC` routing keys carried through dead-lettering.
    Bcc,
    /// An exchange's `alternate-exchange` followed on the dead-letter path.
    AlternateExchange,
    /// At-least-once dead-lettering from a quorum queue.
    AtLeastOnce,
}

impl Mechanism {
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Bcc => "bcc",
            Mechanism::AlternateExchange => "alternate-exchange",
            Mechanism::AtLeastOnce => "at-least-once",
        }
    }

    /// The sentence that opens a refusal: what this broker does not do.
    fn does_not(self) -> &'static str {
        match self {
            Mechanism::Bcc => "BCC keys are not carried through dead-lettering on this broker",
            Mechanism::AlternateExchange => "alternate exchanges are not followed on the dead-letter path on this broker",
            Mechanism::AtLeastOnce => "quorum queues do not dead-letter at least once on this broker",
        }
    }

    /// What hourglass would get wrong without it, and what to do instead.
    fn consequence(self) -> &'static str {
        match self {
            Mechanism::Bcc => {
                "hourglass's binary-levels direct routing (the hourglass preset's default) would deliver wrong: each message carries its lower bits \
                 and its destination as BCC keys. Use routing = \"topic\" for those strategies (the delay is spelt in the routing key), \
                 or a broker on which this probe passes"
            }
            Mechanism::AlternateExchange => {
                "binary-levels direct routing passes a message down a level through alternate exchanges, and every strategy's last hop parks \
                 what it cannot route through one: messages would be lost (classic queues) or held and retried (quorum). Use routing = \"topic\" \
                 for binary-levels strategies, and expect no parking, or a broker on which this probe passes"
            }
            Mechanism::AtLeastOnce => {
                "level and interval queues (queue_type = \"quorum\", the default) rely on it to keep delayed messages through a broker crash. \
                 Use a broker with quorum queues and at-least-once dead-lettering (RabbitMQ 3.10 or later), or set queue_type = \"classic\" \
                 and accept that a crash can lose messages"
            }
        }
    }
}

impl std::fmt::Display for Mechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The mechanisms `declarations` (strategies' topologies and sample plans)
/// rely on, each once, in [`Mechanism`] order:
///
/// * at-least-once: a queue declared with `x-dead-letter-strategy = at-least-once`;
/// * alternate exchange: an exchange that some queue dead-letters to and that names an `alternate-exchange`;
/// * BCC: a publish with `BCC` keys, and a queue that dead-letters on the message's own keys (no `x-dead-letter-routing-key`).
pub fn mechanisms_used(declarations: &[Command]) -> Vec<Mechanism> {
    let text = |arguments: &crate::command::FieldTable, key: &str| arguments.get(key).and_then(FieldValue::as_text).map(str::to_string);
    let mut dead_letter_targets = Vec::new();
    let (mut at_least_once, mut keeps_keys, mut alternate, mut bcc) = (false, false, false, false);
    for command in declarations {
        if let Command::Amqp(AmqpCommand::DeclareQueue { arguments, .. }) = command {
            at_least_once |= text(arguments, "x-dead-letter-strategy").as_deref() == Some("at-least-once");
            if let Some(target) = text(arguments, "x-dead-letter-exchange") {
                keeps_keys |= !arguments.contains_key("x-dead-letter-routing-key");
                dead_letter_targets.push(target);
            }
        }
    }
    for command in declarations {
        match command {
            Command::Amqp(AmqpCommand::DeclareExchange { name, arguments, .. }) => {
                alternate |= arguments.contains_key("alternate-exchange") && dead_letter_targets.contains(name)
            }
            Command::Amqp(AmqpCommand::Publish { bcc: keys, .. }) => bcc |= !keys.is_empty(),
            _ => {}
        }
    }
    let mut used = Vec::new();
    if bcc && keeps_keys {
        used.push(Mechanism::Bcc);
    }
    if alternate {
        used.push(Mechanism::AlternateExchange);
    }
    if at_least_once {
        used.push(Mechanism::AtLeastOnce);
    }
    used
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    Passed,
    /// The broker does not behave as hourglass needs.
    Failed,
    /// The probe could not run (the user may not declare its names, the
    /// connection went): nothing is known about the mechanism.
    NotRun,
}

#[derive(Clone, Debug, Serialize)]
pub struct ProbeResult {
    pub mechanism: Mechanism,
    pub outcome: Outcome,
    /// What happened, in a sentence.
    pub detail: String,
    pub elapsed_ms: u64,
}

impl ProbeResult {
    pub fn passed(&self) -> bool {
        self.outcome == Outcome::Passed
    }

    /// For a failed probe, the refusal: what the broker does not do, what
    /// was seen, and what that means for hourglass.
    pub fn refusal(&self) -> Option<String> {
        (self.outcome == Outcome::Failed).then(|| format!("{}: {}. {}", self.mechanism.does_not(), self.detail, self.mechanism.consequence()))
    }
}

#[derive(Debug, Error)]
pub enum ProbeError {
    #[error("cannot probe RabbitMQ at {url}: {source}")]
    Unavailable { url: String, source: nodes::ConnectError },
}

/// Sends one message through each of `mechanisms` on a private topology
/// (see the module's documentation) and reports each probe's outcome, in
/// the order given. The probes run side by side on one connection; each
/// takes the broker's round trips plus a 50 ms TTL when the mechanism
/// works, and at most [`ARRIVAL_DEADLINE`] after its publish when it does
/// not. Only a connection that cannot be opened is an error.
pub async fn probe(amqp_url: &str, mechanisms: &[Mechanism]) -> Result<Vec<ProbeResult>, ProbeError> {
    if mechanisms.is_empty() {
        return Ok(Vec::new());
    }
    let properties = ConnectionProperties::default().with_connection_name("hourglass probe".into());
    let (connection, _) =
        nodes::connect(amqp_url, properties, CONNECT_TIMEOUT).await.map_err(|source| ProbeError::Unavailable { url: redact(amqp_url), source })?;
    let prefix = format!("{PROBE_PREFIX}.{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let quorum_source = mechanisms.contains(&Mechanism::AtLeastOnce);
    let results = join_all(mechanisms.iter().map(|&mechanism| run(&connection, Route::new(&prefix, mechanism, quorum_source)))).await;
    // Closing the connection also deletes the exclusive queues a failed clean-up left.
    parting(&connection, connection.close(200, "probed".into())).await;
    Ok(results)
}

/// One probe's topology. The message waits in `wait` for the TTL and
/// dead-letters to `next`, which routes it to `arrived` (directly, or
/// through its alternate exchange); the probe reads `arrived`.
struct Route {
    mechanism: Mechanism,
    wait: String,
    wait_arguments: AmqpTable,
    next: String,
    next_kind: ExchangeKind,
    /// `next`'s alternate exchange (a fanout to `arrived`), if the probe has one.
    alternate: Option<String>,
    /// The key `arrived` is bound to `next` with. Auto-delete exchanges go
    /// with their last binding, so even `next` of the alternate-exchange
    /// probe has one, on a key no message carries.
    arrived_key: String,
    arrived: String,
    /// The `BCC` key the message is published with.
    bcc: Option<String>,
}

impl Route {
    fn new(prefix: &str, mechanism: Mechanism, quorum_source: bool) -> Route {
        let base = format!("{prefix}.{}", mechanism.name());
        let mut wait_arguments = AmqpTable::default();
        let mut text = |key: &str, value: &str| {
            wait_arguments.insert(key.into(), AMQPValue::LongString(value.into()));
        };
        if quorum_source || mechanism == Mechanism::AtLeastOnce {
            text("x-queue-type", "quorum");
            text("x-dead-letter-strategy", "at-least-once");
            text("x-overflow", "reject-publish");
        } else {
            text("x-queue-type", "classic");
        }
        text("x-dead-letter-exchange", &format!("{base}.next"));
        wait_arguments.insert("x-message-ttl".into(), AMQPValue::LongLongInt(TTL_MS));
        wait_arguments.insert("x-expires".into(), AMQPValue::LongLongInt(EXPIRES_MS));
        let (next_kind, alternate, arrived_key, bcc) = match mechanism {
            // A key that names no queue, so the default exchange routes the publish on its routing key alone.
            Mechanism::Bcc => (ExchangeKind::Direct, None, format!("bcc:{base}"), Some(format!("bcc:{base}"))),
            Mechanism::AlternateExchange => (ExchangeKind::Direct, Some(format!("{base}.alternate")), format!("never:{base}"), None),
            Mechanism::AtLeastOnce => (ExchangeKind::Fanout, None, String::new(), None),
        };
        Route {
            mechanism,
            wait: format!("{base}.wait"),
            wait_arguments,
            next: format!("{base}.next"),
            next_kind,
            alternate,
            arrived_key,
            arrived: format!("{base}.arrived"),
            bcc,
        }
    }

    /// What the probe expects, for its report.
    fn expectation(&self) -> String {
        match self.mechanism {
            Mechanism::Bcc => {
                format!(
                    "a message published with BCC key {:?} into {} (TTL {TTL_MS} ms) should dead-letter to direct exchange {} and its binding on that key",
                    self.arrived_key, self.wait, self.next
                )
            }
            Mechanism::AlternateExchange => format!(
                "a message expiring from {} should dead-letter to {}, which routes it nowhere, and go on through its alternate exchange {}",
                self.wait,
                self.next,
                self.alternate.as_deref().unwrap_or_default()
            ),
            Mechanism::AtLeastOnce => {
                format!("a message expiring from quorum queue {} (at-least-once, reject-publish) should dead-letter to {}", self.wait, self.next)
            }
        }
    }
}

/// Why a step of a probe stopped it.
enum Stop {
    Failed(String),
    NotRun(String),
}

async fn run(connection: &Connection, route: Route) -> ProbeResult {
    let started = Instant::now();
    let stop = match tokio::time::timeout(CHANNEL_TIMEOUT, set_up_and_publish(connection, &route)).await {
        Err(_) => Some(Stop::NotRun(format!("the broker did not answer the probe's declarations and publish within {CHANNEL_TIMEOUT:?}"))),
        Ok(Err(stop)) => Some(stop),
        Ok(Ok(channel)) => look_for_arrival(&channel, &route).await.err(),
    };
    let elapsed_ms = started.elapsed().as_millis() as u64;
    clean_up(connection, &route).await;
    let (outcome, detail) = match stop {
        None => (Outcome::Passed, format!("arrived in {} after {elapsed_ms} ms", route.arrived)),
        Some(Stop::Failed(why)) => (Outcome::Failed, format!("{}; {why}", route.expectation())),
        Some(Stop::NotRun(why)) => (Outcome::NotRun, why),
    };
    ProbeResult { mechanism: route.mechanism, outcome, detail, elapsed_ms }
}

/// A refused declaration: a permission the user lacks is "not run", anything
/// else the broker refuses is the mechanism failing.
fn refused(what: &str, err: lapin::Error) -> Stop {
    let why = format!("{what}: {err}");
    match err.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => match amqp.kind() {
            AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED) => {
                Stop::NotRun(format!("{why} (the user needs configure, write and read permissions on names starting with {PROBE_PREFIX}.)"))
            }
            AMQPErrorKind::Soft(_) => Stop::Failed(why),
            AMQPErrorKind::Hard(_) => Stop::NotRun(why),
        },
        _ => Stop::NotRun(why),
    }
}

/// Declares the route (the queue that is read first, so nothing routed to it is missed) and publishes the message, confirmed.
async fn set_up_and_publish(connection: &Connection, route: &Route) -> Result<Channel, Stop> {
    let channel = create_channel(connection).await.map_err(|e| Stop::NotRun(format!("opening a channel: {e}")))?;
    let exclusive = QueueDeclareOptions { exclusive: true, ..Default::default() };
    channel
        .queue_declare(route.arrived.as_str().into(), exclusive, AmqpTable::default())
        .await
        .map_err(|e| refused(&format!("declaring {}", route.arrived), e))?;
    let auto_delete = ExchangeDeclareOptions { durable: true, auto_delete: true, ..Default::default() };
    let mut next_arguments = AmqpTable::default();
    if let Some(alternate) = &route.alternate {
        channel
            .exchange_declare(alternate.as_str().into(), ExchangeKind::Fanout, auto_delete, AmqpTable::default())
            .await
            .map_err(|e| refused(&format!("declaring {alternate}"), e))?;
        bind(&channel, &route.arrived, alternate, "").await?;
        next_arguments.insert("alternate-exchange".into(), AMQPValue::LongString(alternate.as_str().into()));
    }
    channel
        .exchange_declare(route.next.as_str().into(), route.next_kind.clone(), auto_delete, next_arguments)
        .await
        .map_err(|e| refused(&format!("declaring {}", route.next), e))?;
    bind(&channel, &route.arrived, &route.next, &route.arrived_key).await?;
    let durable = QueueDeclareOptions { durable: true, ..Default::default() };
    channel
        .queue_declare(route.wait.as_str().into(), durable, route.wait_arguments.clone())
        .await
        .map_err(|e| refused(&format!("declaring {} with {:?}", route.wait, route.wait_arguments), e))?;

    channel.confirm_select(ConfirmSelectOptions::default()).await.map_err(|e| Stop::NotRun(format!("confirm mode: {e}")))?;
    let mut headers = AmqpTable::default();
    if let Some(key) = &route.bcc {
        headers.insert(BCC_HEADER.into(), AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::LongString(LongString::from(key.as_str()))])));
    }
    let properties = BasicProperties::default().with_delivery_mode(2).with_message_id(route.wait.as_str().into()).with_headers(headers);
    let options = BasicPublishOptions { mandatory: true, ..Default::default() };
    let confirm = channel
        .basic_publish("".into(), route.wait.as_str().into(), options, b"hourglass probe", properties)
        .await
        .map_err(|e| refused(&format!("publishing to {}", route.wait), e))?;
    match confirm.await {
        Ok(Confirmation::Ack(None)) => Ok(channel),
        Ok(Confirmation::Ack(Some(_))) => Err(Stop::Failed(format!("the broker returned the probe message as unroutable to {}", route.wait))),
        Ok(Confirmation::Nack(_)) => Err(Stop::Failed(format!("the broker refused the probe message (nack) into {}", route.wait))),
        Ok(Confirmation::NotRequested) => Err(Stop::NotRun("the channel was not in confirm mode".into())),
        Err(err) => Err(refused(&format!("publishing to {}", route.wait), err)),
    }
}

async fn bind(channel: &Channel, queue: &str, exchange: &str, key: &str) -> Result<(), Stop> {
    channel
        .queue_bind(queue.into(), exchange.into(), key.into(), QueueBindOptions::default(), AmqpTable::default())
        .await
        .map_err(|e| refused(&format!("binding {queue} to {exchange} on {key:?}"), e))
}

/// Looks for the message in `arrived` until [`ARRIVAL_DEADLINE`]: it must come, and without a `BCC` header.
async fn look_for_arrival(channel: &Channel, route: &Route) -> Result<(), Stop> {
    let deadline = Instant::now() + ARRIVAL_DEADLINE;
    let mut looks = tokio::time::interval(LOOK_EVERY);
    loop {
        looks.tick().await;
        let got = channel
            .basic_get(route.arrived.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .map_err(|e| refused(&format!("reading {}", route.arrived), e))?;
        if let Some(got) = got {
            let headers = got.delivery.properties.headers().clone().unwrap_or_default();
            if let Some(bcc) = headers.inner().iter().find(|(name, _)| name.as_str().eq_ignore_ascii_case(BCC_HEADER)) {
                return Err(Stop::Failed(format!("it arrived, but its consumer saw the header {}: {:?}", bcc.0.as_str(), bcc.1)));
            }
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Stop::Failed(format!("nothing arrived in {} within {ARRIVAL_DEADLINE:?}", route.arrived)));
        }
    }
}

/// Deletes what the probe declared, best effort, on a channel of its own (a
/// refusal closes the channel it came on). What is left goes by itself: the
/// read queue with the connection, the waiting queue by `x-expires`, the exchanges with their bindings.
async fn clean_up(connection: &Connection, route: &Route) {
    let Ok(mut channel) = create_channel(connection).await else { return };
    let exchanges = std::iter::once(&route.next).chain(route.alternate.as_ref());
    for exchange in exchanges {
        if channel.exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default()).await.is_err() {
            let Ok(fresh) = create_channel(connection).await else { return };
            channel = fresh;
        }
    }
    for queue in [&route.wait, &route.arrived] {
        if channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await.is_err() {
            let Ok(fresh) = create_channel(connection).await else { return };
            channel = fresh;
        }
    }
    parting(connection, channel.close(200, "probe cleaned up".into())).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{ExchangeKind as Kind, FieldTable};

    fn queue(name: &str, arguments: &[(&str, &str)]) -> Command {
        let arguments = arguments.iter().map(|(k, v)| (k.to_string(), FieldValue::Text(v.to_string()))).collect();
        Command::Amqp(AmqpCommand::DeclareQueue { name: name.into(), durable: true, arguments })
    }

    fn exchange(name: &str, alternate: Option<&str>) -> Command {
        let arguments: FieldTable = alternate.map(|a| ("alternate-exchange".to_string(), FieldValue::Text(a.into()))).into_iter().collect();
        Command::Amqp(AmqpCommand::DeclareExchange { name: name.into(), kind: Kind::Direct, durable: true, arguments })
    }

    fn publish(bcc: &[&str]) -> Command {
        Command::Amqp(AmqpCommand::Publish {
            exchange: "level-01".into(),
            routing_key: "bit:1".into(),
            bcc: bcc.iter().map(|k| k.to_string()).collect(),
            headers: FieldTable::new(),
            expiration_ms: None,
            mandatory: true,
        })
    }

    #[test]
    fn direct_levels_on_quorum_queues_use_all_three() {
        let declarations = [
            exchange("level-00", Some("delivery")),
            queue("level-01", &[("x-queue-type", "quorum"), ("x-dead-letter-strategy", "at-least-once"), ("x-dead-letter-exchange", "level-00")]),
            publish(&["to:orders"]),
        ];
        assert_eq!(mechanisms_used(&declarations), vec![Mechanism::Bcc, Mechanism::AlternateExchange, Mechanism::AtLeastOnce]);
    }

    #[test]
    fn only_what_is_on_the_dead_letter_path_counts() {
        // Classic topic levels: no BCC in the plan, no at-least-once; the
        // delivery exchange's alternate is on the path only if a queue dead-letters to it.
        let topic =
            [exchange("delivery", Some("parking")), queue("level-00", &[("x-queue-type", "classic"), ("x-dead-letter-exchange", "delivery")]), publish(&[])];
        assert_eq!(mechanisms_used(&topic), vec![Mechanism::AlternateExchange]);
        let nothing_dead_letters_there = [exchange("delivery", Some("parking")), queue("level-00", &[("x-dead-letter-exchange", "elsewhere")])];
        assert!(mechanisms_used(&nothing_dead_letters_there).is_empty());
        // Hold queues dead-letter on a fixed key: BCC keys would not be used.
        let fixed_key = [queue("hold", &[("x-dead-letter-exchange", "delivery"), ("x-dead-letter-routing-key", "orders")]), publish(&["x"])];
        assert!(mechanisms_used(&fixed_key).is_empty());
    }

    #[test]
    fn a_refusal_names_the_mechanism_what_was_seen_and_what_to_do() {
        let result = ProbeResult { mechanism: Mechanism::Bcc, outcome: Outcome::Failed, detail: "nothing arrived".into(), elapsed_ms: 5_000 };
        let refusal = result.refusal().unwrap();
        assert!(refusal.starts_with("BCC keys are not carried through dead-lettering on this broker: nothing arrived."), "{refusal}");
        assert!(refusal.contains("routing = \"topic\""), "{refusal}");
        let not_run = ProbeResult { outcome: Outcome::NotRun, ..result };
        assert!(not_run.refusal().is_none() && !not_run.passed());
    }

    #[test]
    fn routes_wait_in_the_queue_type_the_strategies_use_and_expire() {
        let text = |route: &Route, key: &str| match route.wait_arguments.inner().get(key) {
            Some(AMQPValue::LongString(s)) => Some(s.to_string()),
            _ => None,
        };
        let classic = Route::new("hourglass.probe.x", Mechanism::Bcc, false);
        assert_eq!(text(&classic, "x-queue-type").as_deref(), Some("classic"));
        assert_eq!(classic.bcc.as_deref(), Some(classic.arrived_key.as_str()));
        let quorum = Route::new("hourglass.probe.x", Mechanism::AlternateExchange, true);
        assert_eq!(text(&quorum, "x-queue-type").as_deref(), Some("quorum"));
        assert_eq!(text(&quorum, "x-overflow").as_deref(), Some("reject-publish"));
        assert!(quorum.wait.starts_with("hourglass.probe.x.alternate-exchange."));
        for route in [classic, quorum] {
            assert!(matches!(route.wait_arguments.inner().get("x-expires"), Some(AMQPValue::LongLongInt(EXPIRES_MS))));
        }
    }
}
