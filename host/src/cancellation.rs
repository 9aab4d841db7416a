//! What a cancellation log answers about one message: the vocabulary the
//! RabbitMQ log and the SQS fates queue share, so neither the brokers nor the
//! service depend on the other for it. A leaf.

/// How a cancellation log answered an event (RabbitMQ's stream in
/// `broker::rabbitmq::cancel`, SQS's fates queue in `broker::sqs::fates`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// To a cancel: it will not be delivered.
    Cancelled,
    /// To a cancel or a reschedule: it was cancelled before.
    AlreadyCancelled,
    /// To a reschedule: it will be delivered at the new time.
    Rescheduled,
    /// To a cancel or a reschedule: it is already on its way to its destination.
    AlreadyReleased,
    /// To a claim: forward it now.
    Release,
    /// To a claim: it was cancelled; drop it.
    Drop,
    /// To a claim: it was moved later; send it round the strategy until `due_at_ms`.
    Replan { due_at_ms: u64 },
}
