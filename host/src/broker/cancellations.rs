//! What keeps cancels and reschedules, whichever broker it is: RabbitMQ's
//! cancellation log (`service::cancel`), SQS's fates queue
//! (`service::sqs_cancel`), a NATS KV bucket ([`super::nats::cancel`]). The
//! HTTP API and `hourglass cancel`/`reschedule` ask through [`Cancellations`]
//! and never learn which one answers.

use std::time::Duration;

use futures_util::future::BoxFuture;
use thiserror::Error;

use super::ExecutorError;
pub use crate::cancellation::Answer;

/// Asks whoever keeps this host's cancellations.
pub trait Cancellations: Send + Sync {
    /// The message is never delivered (`Cancelled`, `AlreadyCancelled`), or it already was (`AlreadyReleased`).
    fn cancel<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Answer, CancelError>>;

    /// The message is delivered at `due_at_ms` instead (`Rescheduled`), or it cannot be.
    fn reschedule<'a>(&'a self, id: &'a str, due_at_ms: u64) -> BoxFuture<'a, Result<Answer, CancelError>>;

    /// How long a cancellation is kept: a due time further away would outlive it.
    fn retention_ms(&self) -> u64;
}

#[derive(Debug, Error)]
pub enum CancelError {
    #[error(transparent)]
    Broker(#[from] ExecutorError),
    /// Appended, but this host has not read the log that far in time: the
    /// event takes effect all the same, and asking again is safe.
    #[error("the cancellation log on the broker has not been read back within {0:?}; the request was recorded and asking again is safe")]
    Unanswered(Duration),
}
