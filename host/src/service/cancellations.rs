//! What decides cancels and reschedules, whichever broker keeps them: the
//! RabbitMQ cancellation log ([`CancelLog`]) or SQS's fates queue
//! ([`SqsCancel`]). The HTTP API and `hourglass cancel`/`reschedule` ask
//! through [`Cancellations`] and never learn which one answers.

use futures_util::future::BoxFuture;

use super::cancel::{Answer, CancelError, CancelLog};
use super::sqs_cancel::SqsCancel;

/// Asks whoever keeps this host's cancellations.
pub trait Cancellations: Send + Sync {
    /// The message is never delivered (`Cancelled`, `AlreadyCancelled`), or it already was (`AlreadyReleased`).
    fn cancel<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Answer, CancelError>>;

    /// The message is delivered at `due_at_ms` instead (`Rescheduled`), or it cannot be.
    fn reschedule<'a>(&'a self, id: &'a str, due_at_ms: u64) -> BoxFuture<'a, Result<Answer, CancelError>>;

    /// How long a cancellation is kept: a due time further away would outlive it.
    fn retention_ms(&self) -> u64;
}

impl Cancellations for CancelLog {
    fn cancel<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Answer, CancelError>> {
        Box::pin(CancelLog::cancel(self, id))
    }

    fn reschedule<'a>(&'a self, id: &'a str, due_at_ms: u64) -> BoxFuture<'a, Result<Answer, CancelError>> {
        Box::pin(CancelLog::reschedule(self, id, due_at_ms))
    }

    fn retention_ms(&self) -> u64 {
        CancelLog::retention_ms(self)
    }
}

impl Cancellations for SqsCancel {
    fn cancel<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Answer, CancelError>> {
        Box::pin(SqsCancel::cancel(self, id))
    }

    fn reschedule<'a>(&'a self, id: &'a str, due_at_ms: u64) -> BoxFuture<'a, Result<Answer, CancelError>> {
        Box::pin(SqsCancel::reschedule(self, id, due_at_ms))
    }

    fn retention_ms(&self) -> u64 {
        SqsCancel::retention_ms(self)
    }
}
