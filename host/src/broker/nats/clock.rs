//! Reading the NATS server's clock, so due times are counted on it, as on
//! RabbitMQ (see [`crate::clock`]): a held message is handed over when the
//! earliest the server's clock can read is past its due time, whatever the
//! clock of the host deciding. NATS carries no time, but JetStream stamps
//! every message it stores: a tiny message is published to a stream of its
//! own (memory, one message kept) and read back by its sequence; its stamp
//! was made between the publish and its acknowledgement, which bounds the
//! reading to within a round trip.

use std::time::Duration;

use async_nats::jetstream::stream;

use super::NatsExecutor;
use crate::clock::estimate::Reading;
use crate::clock::monotonic_ms;
use crate::executor::ExecutorError;

/// The subject a clock stream captures.
fn subject_of(stream: &str) -> String {
    format!("hourglass.clock.{stream}")
}

/// One reading of the server's clock through `stream` (created when missing).
pub async fn read(executor: &NatsExecutor, stream_name: &str) -> Result<Reading, ExecutorError> {
    let unavailable = |e: &dyn std::fmt::Display| ExecutorError::Unavailable(format!("reading the server's clock through stream {stream_name}: {e}"));
    let config = stream::Config {
        name: stream_name.to_string(),
        subjects: vec![subject_of(stream_name)],
        storage: stream::StorageType::Memory,
        max_messages_per_subject: 1,
        max_age: Duration::from_secs(60),
        num_replicas: executor.replicas,
        ..Default::default()
    };
    let stream = executor.jetstream.get_or_create_stream(config).await.map_err(|e| unavailable(&e))?;
    let sent = monotonic_ms();
    let stored = executor.jetstream.publish(subject_of(stream_name), "".into()).await.map_err(|e| unavailable(&e))?.await.map_err(|e| unavailable(&e))?;
    let received = monotonic_ms();
    let message = stream.get_raw_message(stored.sequence).await.map_err(|e| unavailable(&e))?;
    let stamp_ms = u64::try_from(message.time.unix_timestamp_nanos() / 1_000_000).map_err(|e| unavailable(&e))?;
    Ok(Reading::stamp(stamp_ms, sent, received))
}
