//! The RabbitMQ executor: planned commands on a real broker with lapin.
//!
//! Every publish is persistent, `mandatory`, and waits for the broker's
//! publisher confirm; a message the broker returns as unroutable is an error,
//! never a silent drop. Sends share one confirm-mode channel, so concurrent
//! sends keep a window of confirms outstanding. Declares that the broker
//! refuses (PRECONDITION_FAILED, NOT_FOUND) close the channel; the executor
//! reopens it and reports the object and the arguments it wanted.

use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeBindOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::FieldTable as AmqpTable;
use lapin::{Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind as AmqpExchangeKind};

use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use crate::command::{Command, ExchangeKind, FieldTable};
use crate::message::HeaderValue;

use super::convert::{to_amqp_properties, to_amqp_table};
use crate::broker::{Envelope, Executor, ExecutorError};

/// The URL used when neither the config nor the environment gives one.
pub const DEFAULT_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

pub struct RabbitMqExecutor {
    link: Mutex<Link>,
    url: String,
}

/// The connection and its confirm-mode channel, and when to try reconnecting.
struct Link {
    connection: Connection,
    channel: Channel,
    retry_delay: Duration,
    next_attempt: Instant,
}

const FIRST_RETRY: Duration = Duration::from_millis(250);
const MAX_RETRY: Duration = Duration::from_secs(5);

/// `amqp://user:secret@host` → `amqp://user:***@host`, for error messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let credentials = &url[scheme + 3..at];
            match credentials.find(':') {
                Some(colon) => format!("{}{}:***{}", &url[..scheme + 3], &credentials[..colon], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

fn describe(table: &FieldTable) -> String {
    if table.is_empty() {
        return "no arguments".into();
    }
    table.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", ")
}

async fn open_channel(connection: &Connection) -> Result<Channel, lapin::Error> {
    let channel = connection.create_channel().await?;
    channel.confirm_select(ConfirmSelectOptions::default()).await?;
    Ok(channel)
}

impl RabbitMqExecutor {
    pub async fn connect(url: &str) -> Result<Self, ExecutorError> {
        let (connection, channel) = Self::open(url).await?;
        let link = Link { connection, channel, retry_delay: FIRST_RETRY, next_attempt: Instant::now() };
        Ok(RabbitMqExecutor { link: Mutex::new(link), url: url.to_string() })
    }

    async fn open(url: &str) -> Result<(Connection, Channel), ExecutorError> {
        let unavailable = |e: lapin::Error| ExecutorError::Unavailable(format!("RabbitMQ at {}: {e}", redact(url)));
        let connection = Connection::connect(url, ConnectionProperties::default()).await.map_err(unavailable)?;
        let channel = open_channel(&connection).await.map_err(unavailable)?;
        Ok((connection, channel))
    }

    /// Whether the broker can take messages now; reconnects (with backoff) if not.
    pub async fn is_ready(&self) -> bool {
        self.channel().await.is_ok()
    }

    pub fn url(&self) -> String {
        redact(&self.url)
    }

    /// The confirm-mode channel; after a lost connection, reconnects with
    /// exponential backoff (250 ms doubling to 5 s) and answers "unavailable"
    /// in between, so callers fail fast instead of hanging.
    async fn channel(&self) -> Result<Channel, ExecutorError> {
        let mut link = self.link.lock().await;
        if !link.connection.status().connected() {
            if Instant::now() < link.next_attempt {
                return Err(ExecutorError::Unavailable(format!("RabbitMQ at {}: connection lost; reconnecting", self.url())));
            }
            match Self::open(&self.url).await {
                Ok((connection, channel)) => {
                    tracing::info!(url = %self.url(), "reconnected to RabbitMQ");
                    link.connection = connection;
                    link.channel = channel;
                    link.retry_delay = FIRST_RETRY;
                }
                Err(err) => {
                    link.next_attempt = Instant::now() + link.retry_delay;
                    link.retry_delay = (link.retry_delay * 2).min(MAX_RETRY);
                    return Err(err);
                }
            }
        } else if !link.channel.status().connected() {
            link.channel = open_channel(&link.connection)
                .await
                .map_err(|e| ExecutorError::Unavailable(format!("RabbitMQ at {}: {e}", self.url())))?;
        }
        Ok(link.channel.clone())
    }

    /// A broker error; the channel it closed is reopened on next use.
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

    async fn apply_one(&self, command: &Command) -> Result<(), ExecutorError> {
        let channel = self.channel().await?;
        match command {
            Command::DeclareExchange { name, kind, durable, arguments } => {
                let kind = match kind {
                    ExchangeKind::Direct => AmqpExchangeKind::Direct,
                    ExchangeKind::Fanout => AmqpExchangeKind::Fanout,
                    ExchangeKind::Topic => AmqpExchangeKind::Topic,
                    ExchangeKind::Headers => AmqpExchangeKind::Headers,
                };
                let options = ExchangeDeclareOptions { durable: *durable, ..Default::default() };
                channel.exchange_declare(name.as_str().into(), kind, options, to_amqp_table(arguments)).await.map_err(|e| {
                    self.refused(format!("exchange {name:?} (wanted: {} durable={durable}, {})", command_kind(command), describe(arguments)), e)
                })
            }
            Command::DeclareQueue { name, durable, arguments } => {
                let options = QueueDeclareOptions { durable: *durable, ..Default::default() };
                channel
                    .queue_declare(name.as_str().into(), options, to_amqp_table(arguments))
                    .await
                    .map(|_| ())
                    .map_err(|e| self.refused(format!("queue {name:?} (wanted: durable={durable}, {})", describe(arguments)), e))
            }
            Command::BindQueue { queue, exchange, routing_key, arguments } => channel
                .queue_bind(queue.as_str().into(), exchange.as_str().into(), routing_key.as_str().into(), QueueBindOptions::default(), to_amqp_table(arguments))
                .await
                .map_err(|e| self.refused(format!("binding queue {queue:?} to exchange {exchange:?} with key {routing_key:?}"), e)),
            Command::BindExchange { source, destination, routing_key, arguments } => channel
                .exchange_bind(
                    destination.as_str().into(),
                    source.as_str().into(),
                    routing_key.as_str().into(),
                    ExchangeBindOptions::default(),
                    to_amqp_table(arguments),
                )
                .await
                .map_err(|e| self.refused(format!("binding exchange {destination:?} to exchange {source:?} with key {routing_key:?}"), e)),
            Command::Publish { .. } => Err(ExecutorError::Refused("a publish needs a message".into())),
            Command::SqsEnsureQueue { name, .. } | Command::SqsSend { queue: name, .. } => {
                Err(ExecutorError::Refused(format!("SQS command for {name:?} sent to RabbitMQ: the strategy is for SQS")))
            }
        }
    }

    async fn publish(&self, command: &Command, envelope: &Envelope) -> Result<(), ExecutorError> {
        let Command::Publish { exchange, routing_key, headers, expiration_ms, mandatory } = command else {
            return self.apply_one(command).await;
        };
        // The producer's own headers keep their types; hourglass's and the plan's are added on top.
        let mut message = envelope.properties.clone();
        message.headers.extend(envelope.headers.iter().chain(headers).map(|(k, v)| (k.clone(), HeaderValue::from(v))));
        // A producer's own message id stays; otherwise the message carries hourglass's.
        if envelope.stamp_message_id && message.message_id.is_none() {
            message.message_id = Some(envelope.id.clone());
        }
        let mut properties = to_amqp_properties(&message).map_err(|e| ExecutorError::Invalid(format!("message {}: {e}", envelope.id)))?;
        if let Some(ms) = expiration_ms {
            properties = properties.with_expiration(ms.to_string().into());
        }
        let channel = self.channel().await?;
        let what = || format!("publish of {} to exchange {exchange:?} with key {routing_key:?}", envelope.id);
        let options = BasicPublishOptions { mandatory: *mandatory, ..Default::default() };
        let confirm = channel
            .basic_publish(exchange.as_str().into(), routing_key.as_str().into(), options, &envelope.body, properties)
            .await
            .map_err(|e| self.refused(what(), e))?;
        match confirm.await.map_err(|e| self.refused(what(), e))? {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)) => Err(ExecutorError::Unroutable(format!(
                "{}: the broker returned it ({} {}): nothing is bound for that routing key",
                what(),
                returned.reply_code,
                returned.reply_text
            ))),
            Confirmation::Nack(None) => Err(ExecutorError::Refused(format!("{}: the broker did not accept it (nack)", what()))),
            Confirmation::NotRequested => Err(ExecutorError::Refused(format!("{}: channel is not in confirm mode", what()))),
        }
    }
}

fn command_kind(command: &Command) -> &'static str {
    match command {
        Command::DeclareExchange { kind, .. } => kind.as_str(),
        _ => "",
    }
}

/// Exchanges first, then queues, then bindings: a binding fails unless both ends exist.
fn declaration_order(command: &Command) -> u8 {
    match command {
        Command::DeclareExchange { .. } => 0,
        Command::DeclareQueue { .. } => 1,
        _ => 2,
    }
}

impl Executor for RabbitMqExecutor {
    async fn apply(&self, commands: &[Command]) -> Result<(), ExecutorError> {
        let mut ordered: Vec<&Command> = commands.iter().collect();
        ordered.sort_by_key(|c| declaration_order(c));
        for command in ordered {
            self.apply_one(command).await?;
        }
        Ok(())
    }

    async fn check_destination(&self, destination: &str) -> Result<(), ExecutorError> {
        let channel = self.channel().await?;
        let passive = QueueDeclareOptions { passive: true, ..Default::default() };
        match channel.queue_declare(destination.into(), passive, AmqpTable::default()).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_amqp_soft_error() => Err(ExecutorError::Refused(format!(
                "destination queue {destination:?} does not exist on RabbitMQ at {}; declare it before scheduling to it ({e})",
                self.url()
            ))),
            Err(e) => Err(self.refused(format!("checking destination queue {destination:?}"), e)),
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

    #[test]
    fn passwords_never_reach_error_messages() {
        assert_eq!(redact("amqp://guest:secret@127.0.0.1:5672/%2f"), "amqp://guest:***@127.0.0.1:5672/%2f");
        assert_eq!(redact("amqps://host/vhost"), "amqps://host/vhost");
    }
}
