//! What keeps cancels and reschedules, whichever broker it is (RabbitMQ's
//! cancellation log stream, SQS's fates queue, a NATS KV bucket, each in its
//! broker's folder). The HTTP API and `hourglass cancel`/`reschedule` ask
//! through [`Cancellations`] and never learn which one answers.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use thiserror::Error;

pub use crate::cancellation::Answer;
use crate::clock::Clock;
use crate::executor::ExecutorError;

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

/// Cancellations opened for one command (`hourglass cancel`, `reschedule`):
/// what answers, the clock due times count on, and what runs beside it until
/// [`OpenCancellations::close`].
pub struct OpenCancellations {
    pub keeper: Arc<dyn Cancellations>,
    pub clock: Arc<Clock>,
    closing: Option<BoxFuture<'static, ()>>,
}

impl OpenCancellations {
    /// `keeper` answers by itself.
    pub fn new(keeper: Arc<dyn Cancellations>, clock: Arc<Clock>) -> OpenCancellations {
        OpenCancellations { keeper, clock, closing: None }
    }

    /// `keeper` answers while something runs beside it, which `closing` stops and waits for.
    pub fn with_closing(keeper: Arc<dyn Cancellations>, clock: Arc<Clock>, closing: BoxFuture<'static, ()>) -> OpenCancellations {
        OpenCancellations { keeper, clock, closing: Some(closing) }
    }

    /// Stops what ran beside the keeper.
    pub async fn close(self) {
        if let Some(closing) = self.closing {
            closing.await;
        }
    }
}
