//! Reading a RabbitMQ stream in order, from a given offset.
//!
//! A stream keeps its messages after they are read, so every host reads the
//! same log from the start; this is what the cancellation log
//! (`cancel`) is built on. Appending needs nothing special: a
//! confirmed publish to the default exchange with the stream's name.

use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::{AMQPValue, FieldTable as AmqpTable};
use lapin::{Connection, ConnectionProperties};
use tokio::sync::{mpsc, watch};

use crate::command::{AmqpCommand, Command, FieldValue};
use crate::executor::ExecutorError;

use super::link::{CHANNEL_TIMEOUT, CONNECT_TIMEOUT, create_channel, parting};
use super::nodes::{self, redact};

/// Entries the broker sends ahead of the reader (streams need a prefetch to be read at all).
const READ_AHEAD: u16 = 1_000;

/// The declaration of a durable stream that drops whole segments older than `max_age` (`"7D"`, `"12h"`).
pub fn declare_stream(name: &str, max_age: &str) -> Command {
    let arguments = [("x-queue-type".to_string(), FieldValue::Text("stream".into())), ("x-max-age".to_string(), FieldValue::Text(max_age.into()))];
    Command::Amqp(AmqpCommand::DeclareQueue { name: name.to_string(), durable: true, arguments: arguments.into() })
}

/// Sends each entry of `stream` from offset `from` on, as `(offset, body)`,
/// in the stream's order, until `stop` turns true (`Ok`) or the connection is
/// lost (`Err`: read again from the offset after the last one received).
/// `attached` is true while the consumer is attached.
pub async fn read(
    url: &str,
    stream: &str,
    from: u64,
    entries: mpsc::Sender<(u64, Vec<u8>)>,
    mut stop: watch::Receiver<bool>,
    attached: &AtomicBool,
) -> Result<(), ExecutorError> {
    let lost = |e: lapin::Error| ExecutorError::Unavailable(format!("RabbitMQ at {}: reading stream {stream}: {e}", redact(url)));
    // Attaching may wait CONNECT_TIMEOUT per node on a broker that does not
    // answer; a stop meanwhile ends it at once (lapin closes what was dropped).
    let (connection, mut consumer) = tokio::select! {
        attached = attach(url, stream, from) => attached?,
        _ = stop.wait_for(|stopping| *stopping) => return Ok(()),
    };
    attached.store(true, Ordering::Relaxed);
    let result = loop {
        let delivery = tokio::select! {
            next = consumer.next() => next,
            _ = stop.wait_for(|stopping| *stopping) => break Ok(()),
        };
        let delivery = match delivery {
            Some(Ok(delivery)) => delivery,
            Some(Err(err)) => break Err(lost(err)),
            None => break Err(ExecutorError::Unavailable(format!("reading stream {stream}: the broker ended the consumer"))),
        };
        let offset = delivery
            .properties
            .headers()
            .as_ref()
            .map(super::convert::from_amqp_headers)
            .and_then(|headers| headers.get("x-stream-offset").and_then(|v| v.as_whole_number()).and_then(|n| u64::try_from(n).ok()));
        let Some(offset) = offset else {
            break Err(ExecutorError::Refused(format!("stream {stream}: an entry came without its x-stream-offset (is it a stream?)")));
        };
        // On a stream an ack only grants credit for more; it removes nothing.
        if let Err(err) = delivery.acker.ack(BasicAckOptions::default()).await {
            break Err(lost(err));
        }
        if entries.send((offset, delivery.data)).await.is_err() {
            break Ok(());
        }
    };
    attached.store(false, Ordering::Relaxed);
    parting(&connection, connection.close(200, "hourglass stopped reading".into())).await;
    result
}

/// A connection with a consumer of `stream` from offset `from`.
async fn attach(url: &str, stream: &str, from: u64) -> Result<(Connection, lapin::Consumer), ExecutorError> {
    let unavailable = |e: String| ExecutorError::Unavailable(format!("RabbitMQ at {}: reading stream {stream}: {e}", redact(url)));
    let (connection, _) = nodes::connect(url, ConnectionProperties::default(), CONNECT_TIMEOUT).await.map_err(|e| unavailable(e.to_string()))?;
    let subscribe = async {
        let channel = create_channel(&connection).await?;
        channel.basic_qos(READ_AHEAD, BasicQosOptions::default()).await?;
        let mut arguments = AmqpTable::default();
        arguments.insert("x-stream-offset".into(), AMQPValue::LongLongInt(from as i64));
        let tag = format!("hourglass-read-{}", uuid::Uuid::new_v4());
        channel.basic_consume(stream.into(), tag.as_str().into(), BasicConsumeOptions::default(), arguments).await
    };
    // A broker that accepted the connection can still go silent.
    let consumer = match tokio::time::timeout(CHANNEL_TIMEOUT, subscribe).await {
        Ok(subscribed) => subscribed.map_err(|e| unavailable(e.to_string()))?,
        Err(_) => return Err(unavailable(format!("no consumer within {CHANNEL_TIMEOUT:?}"))),
    };
    Ok((connection, consumer))
}
