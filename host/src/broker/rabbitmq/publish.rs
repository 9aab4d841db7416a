//! The RabbitMQ executor: planned commands on a real broker with lapin.
//!
//! Every publish is persistent, `mandatory`, and waits for the broker's
//! publisher confirm (at most [`CONFIRM_TIMEOUT`]); a message the broker
//! returns as unroutable is an error, never a silent drop. Concurrent
//! publishes share a few confirm channels in batches ([`Batches`]), and a
//! refusal, a `basic.return` or a timeout is still reported only to the
//! publish it belongs to. Declares and passive checks run on a separate
//! connection ([`Control`]); those the broker refuses (PRECONDITION_FAILED,
//! NOT_FOUND) close only that channel, and the executor reports the object
//! and the arguments it wanted.
//!
//! What the broker would answer by closing the whole connection (a content
//! header larger than `frame_max`), by closing the publish channel (a missing
//! exchange, a `user-id` other than the connection's user) or by copying the
//! message elsewhere (`CC`, `BCC`) is refused before the wire.

use lapin::options::{ExchangeBindOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable as AmqpTable};
use lapin::uri::AMQPUri;
use lapin::{BasicProperties, ExchangeKind as AmqpExchangeKind};

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::command::{AmqpCommand, BrokerFamily, Command, ExchangeKind, FieldTable};
use crate::headers::{BCC_HEADER, is_routing_header};
use crate::message::HeaderValue;

pub use super::batch::CONFIRM_TIMEOUT;
use super::batch::{Answer, Batches, Outgoing};
use super::channels::{Control, DEFAULT_PUBLISH_CHANNELS, OpenChannels, PublishPool, blocked};
use super::convert::{to_amqp_properties, to_amqp_table};
use super::link::Slot;
use super::nodes::{self, redact};
use super::passive;
use crate::executor::{Envelope, Executor, ExecutorError};

/// The URL used when neither the config nor the environment gives one.
pub use crate::config::broker::DEFAULT_AMQP_URL as DEFAULT_URL;

/// How often [`RabbitMqExecutor::keep_connected`] looks for a lost or worn-out
/// connection. Each slot's backoff (250 ms doubling to 5 s) decides when it
/// may try again, and a look it turns away costs a lock, so this only bounds
/// how late a recovery starts: half a second, well inside a probe's period.
pub const KEEP_CONNECTED_EVERY: Duration = Duration::from_millis(500);
/// How long one declare or passive check may take.
pub const DECLARE_TIMEOUT: Duration = Duration::from_secs(30);
/// A content header frame's own bytes besides the properties: frame header
/// (7), class, weight and body size (12), frame end (1).
const CONTENT_HEADER_OVERHEAD: usize = 20;
/// Exchanges remembered as existing before the memory starts over.
const KNOWN_EXCHANGES: usize = 4_096;
/// The largest frame the control connection asks for. lapin sizes its
/// buffers at 32 frames each way per connection: 8 MiB at RabbitMQ's 128 KiB
/// default, 1 MiB at this. Declares, binds and passive checks are method
/// frames far smaller; the publishing connection keeps the broker's limit,
/// since a producer's content header may use all of it.
pub(crate) const CONTROL_FRAME_MAX: u32 = 16 * 1024;
/// The most a declaration's or binding's argument table may encode to: with
/// its names (up to 255 bytes each) it must fit in one control frame.
const MAX_ARGUMENT_BYTES: usize = CONTROL_FRAME_MAX as usize - 1_024;

pub struct RabbitMqExecutor {
    url: String,
    /// The user the connections log in as: the only `user-id` RabbitMQ accepts on a publish.
    user: String,
    publishing: Arc<PublishPool>,
    batches: Batches,
    control: Control,
    open: OpenChannels,
    /// Exchanges known to exist, and the reconnect count when that was learned.
    exchanges: Mutex<(u64, HashSet<String>)>,
}

fn describe(table: &FieldTable) -> String {
    if table.is_empty() {
        return "no arguments".into();
    }
    table.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", ")
}

/// Refuses an argument table too large for one control frame, before the
/// wire: sent, it would close the control connection under every other declare.
fn check_arguments(what: impl FnOnce() -> String, arguments: &AmqpTable) -> Result<(), ExecutorError> {
    let generate = lapin::types::generation::gen_field_table(arguments);
    let size = generate(Vec::<u8>::new().into()).map_or(usize::MAX, |written| written.position as usize);
    if size > MAX_ARGUMENT_BYTES {
        return Err(ExecutorError::Refused(format!("{}: its arguments take {size} bytes; at most {MAX_ARGUMENT_BYTES} fit", what())));
    }
    Ok(())
}

/// At least the encoded size of a content header's properties, headers
/// included, counted without encoding them: every string at its length plus
/// its longest prefix, every other value at eight bytes.
fn size_bound(properties: &BasicProperties) -> usize {
    fn value_bound(value: &AMQPValue) -> usize {
        1 + match value {
            AMQPValue::ShortString(s) => 1 + s.as_str().len(),
            AMQPValue::LongString(s) => 4 + s.as_bytes().len(),
            AMQPValue::ByteArray(b) => 4 + b.len(),
            AMQPValue::FieldArray(items) => 4 + items.as_slice().iter().map(value_bound).sum::<usize>(),
            AMQPValue::FieldTable(entries) => table_bound(entries),
            _ => 8,
        }
    }
    fn table_bound(entries: &AmqpTable) -> usize {
        4 + entries.inner().iter().map(|(key, value)| 1 + key.as_str().len() + value_bound(value)).sum::<usize>()
    }
    let strings = [
        properties.content_type(),
        properties.content_encoding(),
        properties.correlation_id(),
        properties.reply_to(),
        properties.expiration(),
        properties.message_id(),
        properties.kind(),
        properties.user_id(),
        properties.app_id(),
        properties.cluster_id(),
    ];
    // Flags, delivery mode, priority and timestamp.
    2 + 1 + 1 + 8 + strings.iter().map(|s| s.as_ref().map_or(0, |s| 1 + s.as_str().len())).sum::<usize>() + properties.headers().as_ref().map_or(0, table_bound)
}

/// The encoded size of a content header's properties, headers included.
fn encoded_size(properties: &BasicProperties) -> usize {
    let generate = lapin::protocol::basic::gen_properties(properties);
    match generate(Vec::<u8>::new().into()) {
        Ok(written) => written.position as usize,
        // Only a write error can fail it, and a Vec never refuses bytes.
        Err(_) => usize::MAX,
    }
}

impl RabbitMqExecutor {
    /// Opens the publishing and the control connection now: a broker that is
    /// down at start is an error, not a retry loop.
    pub async fn connect(url: &str) -> Result<Self, ExecutorError> {
        Self::connect_with(url, DEFAULT_PUBLISH_CHANNELS).await
    }

    /// [`Self::connect`] with `publish_channels` confirm channels, each carrying a batch of publishes at a time.
    pub async fn connect_with(url: &str, publish_channels: usize) -> Result<Self, ExecutorError> {
        // The broker lists connections by these names; the suffix tells two processes apart.
        let instance = &uuid::Uuid::new_v4().simple().to_string()[..8];
        let publishing = Slot::connect(url, format!("hourglass publish {instance}")).await?;
        let control = Slot::connect(&nodes::with_frame_max(url, CONTROL_FRAME_MAX), format!("hourglass control {instance}")).await?;
        let open = OpenChannels::default();
        let publishing = Arc::new(PublishPool::new(publishing, open.clone(), publish_channels));
        // The connection is open, so the URL parsed.
        let user = nodes::first(url).parse::<AMQPUri>().map(|uri| uri.authority.userinfo.username).unwrap_or_default();
        Ok(RabbitMqExecutor {
            url: url.to_string(),
            user,
            batches: Batches::start(publishing.clone()),
            publishing,
            control: Control::new(control, open.clone()),
            open,
            exchanges: Mutex::new((0, HashSet::new())),
        })
    }

    /// Opens the publish channels now, not on the first publishes (a service
    /// does this at start, so a burst that comes at once does not wait on them).
    pub async fn warm_publish_channels(&self) {
        self.publishing.warm().await;
    }

    /// Whether the broker can take messages now: both connections up and
    /// publishing not blocked. Only reads their state, so it answers at once
    /// (a readiness probe has about a second); [`Self::keep_connected`] reconnects.
    pub async fn is_ready(&self) -> bool {
        let publishing = self.publishing.slot().peek().is_some_and(|link| !link.blocked());
        publishing && self.control.slot().peek().is_some()
    }

    /// Reconnects a lost connection (or replaces a worn-out one) until `stop`
    /// turns true, so they come back with no traffic to ask for them. Each
    /// slot's backoff paces the attempts; this only looks every
    /// [`KEEP_CONNECTED_EVERY`].
    pub async fn keep_connected(&self, mut stop: watch::Receiver<bool>) {
        async fn renew(slot: &Slot) {
            if slot.needs_connecting() {
                // A failure is logged by the slot and retried on a later look.
                let _ = slot.link().await;
            }
        }
        let look = async {
            loop {
                tokio::join!(renew(self.publishing.slot()), renew(self.control.slot()));
                tokio::time::sleep(KEEP_CONNECTED_EVERY).await;
            }
        };
        // A connect may hang for CONNECT_TIMEOUT: stop cuts it short.
        tokio::select! {
            _ = look => {}
            _ = stop.wait_for(|stopping| *stopping) => {}
        }
    }

    /// Channels open now (at most the pool's size plus the control channel).
    pub fn open_channels(&self) -> usize {
        self.open.get()
    }

    /// The most channels [`Self::open_channels`] can report.
    pub fn max_open_channels(&self) -> usize {
        self.publishing.size() + 1
    }

    /// Whether the broker has blocked publishing (`connection.blocked`).
    pub fn is_blocked(&self) -> bool {
        self.publishing.slot().peek().is_some_and(|link| link.blocked())
    }

    /// The client-provided names of the publishing and the control connection, as the broker lists them.
    pub fn connection_names(&self) -> [String; 2] {
        [self.publishing.slot().name().to_string(), self.control.slot().name().to_string()]
    }

    /// How many times a lost connection was opened again: whatever was declared
    /// before may be gone (a restarted broker, a deleted queue), so callers
    /// that remember preparation start over when this changes.
    pub fn reconnects(&self) -> u64 {
        self.publishing.slot().reconnects() + self.control.slot().reconnects()
    }

    pub fn url(&self) -> String {
        redact(&self.url)
    }

    /// A broker error about `what`.
    fn refused(&self, what: String, err: lapin::Error) -> ExecutorError {
        // A soft error is about this request (a channel-level refusal); a hard
        // error closes the connection (CONNECTION_FORCED when the broker stops),
        // so like a network failure it means "not now", not "never".
        if err.is_amqp_soft_error() {
            ExecutorError::Refused(format!("{what}: {err}"))
        } else {
            ExecutorError::Unavailable(format!("{what}: RabbitMQ at {}: {err}", self.url()))
        }
    }

    /// Runs one declare or check on the control channel, bounded by [`DECLARE_TIMEOUT`].
    /// A passive declare of `queue` on the control channel: its message count, or
    /// the broker's refusal (a missing queue closes that channel, never a publish's).
    async fn passive_declare(&self, queue: &str, what: impl FnOnce() -> String) -> Result<Result<u32, lapin::Error>, ExecutorError> {
        let passive = QueueDeclareOptions { passive: true, ..Default::default() };
        self.control(what, async |channel| channel.queue_declare(queue.into(), passive, AmqpTable::default()).await.map(|q| q.message_count())).await
    }

    async fn control<T>(
        &self,
        what: impl FnOnce() -> String,
        operation: impl AsyncFnOnce(&lapin::Channel) -> Result<T, lapin::Error>,
    ) -> Result<Result<T, lapin::Error>, ExecutorError> {
        let mut guard = self.control.channel().await?;
        match tokio::time::timeout(DECLARE_TIMEOUT, operation(guard.channel())).await {
            Ok(result) => Ok(result),
            Err(_) => {
                guard.abandon();
                Err(ExecutorError::Unavailable(format!("{}: no answer from RabbitMQ at {} within {DECLARE_TIMEOUT:?}", what(), self.url())))
            }
        }
    }

    async fn apply_one(&self, command: &Command) -> Result<(), ExecutorError> {
        let Command::Amqp(command) = command else { return Err(ExecutorError::other_family(command, BrokerFamily::Amqp)) };
        match command {
            AmqpCommand::DeclareExchange { name, kind, durable, arguments } => {
                let amqp_kind = match kind {
                    ExchangeKind::Direct => AmqpExchangeKind::Direct,
                    ExchangeKind::Fanout => AmqpExchangeKind::Fanout,
                    ExchangeKind::Topic => AmqpExchangeKind::Topic,
                    ExchangeKind::Headers => AmqpExchangeKind::Headers,
                };
                let what = || format!("exchange {name:?} (wanted: {} durable={durable}, {})", kind.as_str(), describe(arguments));
                let options = ExchangeDeclareOptions { durable: *durable, ..Default::default() };
                let arguments = to_amqp_table(arguments);
                check_arguments(what, &arguments)?;
                self.control(what, async |channel| channel.exchange_declare(name.as_str().into(), amqp_kind, options, arguments).await)
                    .await?
                    .map_err(|e| self.refused(what(), e))?;
                self.remember_exchange(name);
                Ok(())
            }
            AmqpCommand::DeclareQueue { name, durable, arguments } => {
                let what = || format!("queue {name:?} (wanted: durable={durable}, {})", describe(arguments));
                let options = QueueDeclareOptions { durable: *durable, ..Default::default() };
                let arguments = to_amqp_table(arguments);
                check_arguments(what, &arguments)?;
                self.control(what, async |channel| channel.queue_declare(name.as_str().into(), options, arguments).await.map(|_| ()))
                    .await?
                    .map_err(|e| self.refused(what(), e))
            }
            AmqpCommand::BindQueue { queue, exchange, routing_key, arguments } => {
                let what = || format!("binding queue {queue:?} to exchange {exchange:?} with key {routing_key:?}");
                let arguments = to_amqp_table(arguments);
                check_arguments(what, &arguments)?;
                self.control(what, async |channel| {
                    channel
                        .queue_bind(queue.as_str().into(), exchange.as_str().into(), routing_key.as_str().into(), QueueBindOptions::default(), arguments)
                        .await
                })
                .await?
                .map_err(|e| self.refused(what(), e))
            }
            AmqpCommand::BindExchange { source, destination, routing_key, arguments } => {
                let what = || format!("binding exchange {destination:?} to exchange {source:?} with key {routing_key:?}");
                let arguments = to_amqp_table(arguments);
                check_arguments(what, &arguments)?;
                self.control(what, async |channel| {
                    channel
                        .exchange_bind(
                            destination.as_str().into(),
                            source.as_str().into(),
                            routing_key.as_str().into(),
                            ExchangeBindOptions::default(),
                            arguments,
                        )
                        .await
                })
                .await?
                .map_err(|e| self.refused(what(), e))
            }
            AmqpCommand::Publish { .. } => Err(ExecutorError::Refused("a publish needs a message".into())),
        }
    }

    async fn publish(&self, command: &Command, envelope: &Envelope) -> Result<(), ExecutorError> {
        let Command::Amqp(AmqpCommand::Publish { exchange, routing_key, bcc, headers, expiration_ms, mandatory }) = command else {
            // Boxed: a declare among the commands to send is rare; inline it would size every publish.
            return Box::pin(self.apply_one(command)).await;
        };
        let invalid = |reason: String| ExecutorError::Invalid(format!("message {}: {reason}", envelope.id));
        // The producer's own headers keep their types; hourglass's and the plan's are added on top.
        let mut message = envelope.properties.clone();
        message.headers.extend(envelope.headers.iter().chain(headers).map(|(k, v)| (k.clone(), HeaderValue::from(v))));
        if let Some(name) = message.headers.keys().find(|name| is_routing_header(name)) {
            return Err(invalid(format!("header {name:?} would copy the message to other queues; it is never sent")));
        }
        // The plan's own extra keys, checked where the plan was converted.
        if !bcc.is_empty() {
            message.headers.insert(BCC_HEADER.to_string(), HeaderValue::Array(bcc.iter().map(|key| HeaderValue::Text(key.clone().into_bytes())).collect()));
        }
        // A producer's own message id stays; otherwise the message carries hourglass's.
        if envelope.stamp_message_id && message.message_id.is_none() {
            message.message_id = Some(envelope.id.clone());
        }
        let mut properties = to_amqp_properties(&message).map_err(|too_long| invalid(too_long.to_string()))?;
        if let Some(ms) = expiration_ms {
            properties = properties.with_expiration(ms.to_string().into());
        }
        let link = self.publishing.slot().link().await?;
        if link.blocked() {
            return Err(blocked());
        }
        // Too large a content header closes the whole connection: refuse it here.
        let frame_max = link.frame_max();
        drop(link);
        // Encoding the properties only to count them cost a copy of every
        // header per publish: the bound settles it unless it is near the limit.
        if size_bound(&properties).saturating_add(CONTENT_HEADER_OVERHEAD) > frame_max {
            let size = encoded_size(&properties).saturating_add(CONTENT_HEADER_OVERHEAD);
            if size > frame_max {
                return Err(invalid(format!("its headers and properties take {size} bytes; the broker's frame_max is {frame_max}")));
            }
        }
        // What the broker would refuse by closing the channel is refused here,
        // so it never fails the other publishes sharing that channel.
        if let Some(user) = properties.user_id()
            && user.as_str() != self.user
        {
            return Err(invalid(format!("user_id {user:?} is not the user hourglass publishes as ({:?}); RabbitMQ refuses it", self.user)));
        }
        self.check_exchange(exchange).await?;
        let what = || format!("publish of {} to exchange {exchange:?} with key {routing_key:?}", envelope.id);
        let outgoing =
            Outgoing { exchange: exchange.clone(), routing_key: routing_key.clone(), mandatory: *mandatory, body: envelope.body.clone(), properties };
        match self.batches.publish(outgoing).await {
            Answer::Confirmed => Ok(()),
            Answer::Returned { code, text } => {
                Err(ExecutorError::Unroutable(format!("{}: the broker returned it ({code} {text}): nothing is bound for that routing key", what())))
            }
            // A nack is "not now": a quorum queue it routes to has no leader (a node was lost) or is full
            // (reject-publish). Treated as a refusal, a release or unpark consumer would park a message
            // whose destination is fine; as unavailable, it is retried (HTTP 503, ingress requeue).
            Answer::Nacked => Err(ExecutorError::Unavailable(format!(
                "{}: the broker did not accept it now (nack: a queue it routes to has no leader or is full); try again later",
                what()
            ))),
            Answer::NotConfirmMode => Err(ExecutorError::Refused(format!("{}: channel is not in confirm mode", what()))),
            Answer::Failed(err) => {
                if err.is_amqp_soft_error() {
                    // Perhaps the exchange went away since it was checked: check again next time.
                    self.forget_exchanges();
                }
                Err(self.refused(what(), err))
            }
            Answer::NoConfirm { blocked } => {
                let why = if blocked { " (the broker blocked publishing)" } else { "" };
                Err(ExecutorError::Unavailable(format!("{}: no confirm within {CONFIRM_TIMEOUT:?}{why}", what())))
            }
            Answer::NoChannel(err) => Err(err),
        }
    }

    /// Publishing to a missing exchange closes the channel: each exchange is
    /// checked once (on the control channel) before the first publish to it,
    /// and again after a reconnect.
    async fn check_exchange(&self, exchange: &str) -> Result<(), ExecutorError> {
        if exchange.is_empty() || self.knows_exchange(exchange) {
            return Ok(());
        }
        let what = || format!("checking exchange {exchange:?}");
        let options = ExchangeDeclareOptions { passive: true, ..Default::default() };
        // Boxed: once per exchange and connection; inline, the check would size every publish's future.
        let checked = Box::pin(
            self.control(what, async |channel| channel.exchange_declare(exchange.into(), AmqpExchangeKind::Direct, options, AmqpTable::default()).await),
        )
        .await?;
        match checked {
            Ok(()) => {
                self.remember_exchange(exchange);
                Ok(())
            }
            Err(e) => Err(passive::check_failed(&format!("exchange {exchange:?}"), &self.url(), &e, "")),
        }
    }

    fn knows_exchange(&self, exchange: &str) -> bool {
        let known = self.exchanges.lock().unwrap_or_else(|p| p.into_inner());
        known.0 == self.reconnects() && known.1.contains(exchange)
    }

    fn remember_exchange(&self, exchange: &str) {
        let reconnects = self.reconnects();
        let mut known = self.exchanges.lock().unwrap_or_else(|p| p.into_inner());
        if known.0 != reconnects {
            *known = (reconnects, HashSet::new());
        }
        // Bounded: names come from strategies and callers; past the bound, start over.
        if known.1.len() >= KNOWN_EXCHANGES {
            known.1.clear();
        }
        known.1.insert(exchange.to_string());
    }

    fn forget_exchanges(&self) {
        self.exchanges.lock().unwrap_or_else(|p| p.into_inner()).1.clear();
    }
}

/// Exchanges first, then queues, then bindings: a binding fails unless both ends exist.
fn declaration_order(command: &Command) -> u8 {
    match command {
        Command::Amqp(AmqpCommand::DeclareExchange { .. }) => 0,
        Command::Amqp(AmqpCommand::DeclareQueue { .. }) => 1,
        _ => 2,
    }
}

impl Executor for RabbitMqExecutor {
    fn describe(&self) -> String {
        format!("RabbitMQ at {}", self.url())
    }

    async fn is_ready(&self) -> bool {
        RabbitMqExecutor::is_ready(self).await
    }

    fn reconnects(&self) -> u64 {
        RabbitMqExecutor::reconnects(self)
    }

    async fn apply(&self, commands: &[Command]) -> Result<(), ExecutorError> {
        let mut ordered: Vec<&Command> = commands.iter().collect();
        ordered.sort_by_key(|c| declaration_order(c));
        for command in ordered {
            self.apply_one(command).await?;
        }
        Ok(())
    }

    async fn check_destination(&self, destination: &str) -> Result<(), ExecutorError> {
        let what = || format!("checking destination queue {destination:?}");
        match self.passive_declare(destination, what).await? {
            Ok(_) => Ok(()),
            Err(e) => Err(passive::check_failed(&format!("destination queue {destination:?}"), &self.url(), &e, "; declare it first")),
        }
    }

    async fn check_exchange(&self, exchange: &str) -> Result<(), ExecutorError> {
        let what = || format!("checking exchange {exchange:?}");
        let passive = ExchangeDeclareOptions { passive: true, ..Default::default() };
        // The kind is not compared by a passive declare; any will do.
        let declared = self
            .control(what, async |channel| channel.exchange_declare(exchange.into(), AmqpExchangeKind::Direct, passive, AmqpTable::default()).await)
            .await?;
        declared.map_err(|e| passive::check_failed(&format!("exchange {exchange:?}"), &self.url(), &e, "; declare it first"))
    }

    async fn queue_depth(&self, queue: &str) -> Option<u64> {
        match self.passive_declare(queue, || format!("reading the depth of queue {queue:?}")).await {
            Ok(Ok(messages)) => Some(u64::from(messages)),
            _ => None,
        }
    }

    async fn send(&self, commands: &[Command], envelope: &Envelope) -> Result<(), ExecutorError> {
        for command in commands {
            self.publish(command, envelope).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::{ByteArray, DecimalValue, FieldArray, LongString, ShortString};
    use proptest::prelude::*;

    fn leaf() -> impl Strategy<Value = AMQPValue> {
        prop_oneof![
            any::<bool>().prop_map(AMQPValue::Boolean),
            any::<i8>().prop_map(AMQPValue::ShortShortInt),
            any::<u16>().prop_map(AMQPValue::ShortUInt),
            any::<i32>().prop_map(AMQPValue::LongInt),
            any::<i64>().prop_map(AMQPValue::LongLongInt),
            any::<f64>().prop_map(AMQPValue::Double),
            (any::<u8>(), any::<u32>()).prop_map(|(scale, value)| AMQPValue::DecimalValue(DecimalValue { scale, value })),
            any::<u64>().prop_map(AMQPValue::Timestamp),
            "[a-z.]{0,40}".prop_map(|s| AMQPValue::ShortString(ShortString::from(s))),
            prop::collection::vec(any::<u8>(), 0..300).prop_map(|b| AMQPValue::LongString(LongString::from(b))),
            prop::collection::vec(any::<u8>(), 0..300).prop_map(|b| AMQPValue::ByteArray(ByteArray::from(b))),
            Just(AMQPValue::Void),
        ]
    }

    fn value() -> impl Strategy<Value = AMQPValue> {
        leaf().prop_recursive(3, 64, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(|items| AMQPValue::FieldArray(FieldArray::from(items))),
                prop::collection::btree_map("[a-z-]{1,20}", inner, 0..8).prop_map(|entries| AMQPValue::FieldTable(table(entries))),
            ]
        })
    }

    fn table(entries: std::collections::BTreeMap<String, AMQPValue>) -> AmqpTable {
        let mut table = AmqpTable::default();
        for (key, value) in entries {
            table.insert(ShortString::from(key), value);
        }
        table
    }

    fn text() -> impl Strategy<Value = Option<ShortString>> {
        prop::option::of("[ -~]{0,255}".prop_map(ShortString::from))
    }

    proptest! {
        /// The bound that spares a publish its encoding never says less than the encoding.
        #[test]
        fn the_size_bound_is_never_below_the_encoded_size(
            headers in prop::option::of(prop::collection::btree_map("[a-z-]{1,40}", value(), 0..12)),
            strings in prop::collection::vec(text(), 10),
            timestamp in prop::option::of(any::<u64>()),
            mode in prop::option::of(any::<u8>()),
        ) {
            let mut properties = BasicProperties::default();
            let setters: [fn(BasicProperties, ShortString) -> BasicProperties; 10] = [
                BasicProperties::with_content_type,
                BasicProperties::with_content_encoding,
                BasicProperties::with_correlation_id,
                BasicProperties::with_reply_to,
                BasicProperties::with_expiration,
                BasicProperties::with_message_id,
                BasicProperties::with_type,
                BasicProperties::with_user_id,
                BasicProperties::with_app_id,
                BasicProperties::with_cluster_id,
            ];
            for (set, string) in setters.iter().zip(strings) {
                if let Some(string) = string {
                    properties = set(properties, string);
                }
            }
            if let Some(headers) = headers {
                properties = properties.with_headers(table(headers));
            }
            if let Some(timestamp) = timestamp {
                properties = properties.with_timestamp(timestamp);
            }
            if let Some(mode) = mode {
                properties = properties.with_delivery_mode(mode).with_priority(mode);
            }
            prop_assert!(size_bound(&properties) >= encoded_size(&properties));
        }
    }
}
