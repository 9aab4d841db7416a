//! The service's two keepers of cancellations answer the broker-neutral
//! [`Cancellations`]: the RabbitMQ cancellation log ([`CancelLog`]) and SQS's
//! fates queue ([`SqsCancel`]), both of which run service work (a reader, a
//! decider). A NATS KV bucket answers it from `broker::nats::cancel`.

use futures_util::future::BoxFuture;

use super::cancel::{Answer, CancelError, CancelLog};
use super::sqs_cancel::SqsCancel;
pub use crate::broker::cancellations::Cancellations;

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
