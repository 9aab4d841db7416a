//! Every header name hourglass reads or writes, in one place.
//!
//! All of hourglass's own headers start with `hourglass-`; a producer may not
//! set them (see [`is_reserved`]).

/// The prefix of every header hourglass sets.
pub(crate) const PREFIX: &str = "hourglass-";

// On every delayed message.
/// The requested delay in ms, so a consumer can see it.
pub const DELAY_HEADER: &str = "hourglass-delay-ms";
/// The absolute due time (Unix ms), so a consumer can measure lateness.
pub const DUE_AT_HEADER: &str = "hourglass-due-at";

/// The destination a delayed message is on its way to: what a release queue
/// forwards by, and `transfer` and `parked replay` move by. (Not
/// [`DESTINATION_HEADER`], the ingress's input, which a planner may also use
/// for its own routing.)
pub const TARGET_HEADER: &str = "hourglass-target";

/// On a message due to an exchange: the exchange its release queue publishes
/// it to when due (its `hourglass-target` is then that release queue). Also
/// read at the AMQP ingress, instead of [`DESTINATION_HEADER`].
pub const EXCHANGE_HEADER: &str = "hourglass-exchange";
/// With [`EXCHANGE_HEADER`]: the routing key it is published with (empty if absent).
pub(crate) const ROUTING_KEY_HEADER: &str = "hourglass-routing-key";

/// On messages of cancellable strategies: the id the message was scheduled
/// under (what `DELETE /v1/messages/{id}` names).
pub(crate) const ID_HEADER: &str = "hourglass-id";

/// On parked messages: why they could not go on.
pub const PARKED_REASON_HEADER: &str = "hourglass-parked-reason";

// Read at the AMQP ingress.
/// The destination queue (required).
pub const DESTINATION_HEADER: &str = "hourglass-destination";
/// The delay: a duration string ("90s", "1h 30m") or whole milliseconds
/// (this or [`DELIVER_AT_HEADER`] is required).
pub const REQUESTED_DELAY_HEADER: &str = "hourglass-delay";
/// The due time instead of a delay: RFC 3339 text or whole Unix milliseconds.
pub const DELIVER_AT_HEADER: &str = "hourglass-deliver-at";
/// A strategy other than the destination's (optional).
pub const STRATEGY_HEADER: &str = "hourglass-strategy";
/// On invalid messages: why the message could not be scheduled.
pub const INVALID_REASON_HEADER: &str = "hourglass-invalid-reason";

// Redelivery.
/// On every redelivered message: which delivery this is (2 for the first redelivery).
pub const ATTEMPT_HEADER: &str = "hourglass-attempt";
/// On error-queue messages: deliveries made in all.
pub const ATTEMPTS_HEADER: &str = "hourglass-attempts";
/// On error-queue messages: why the last delivery failed (the broker's dead-letter reason).
pub const FAILURE_REASON_HEADER: &str = "hourglass-failure-reason";
/// On error-queue messages: why hourglass stopped redelivering.
pub const GAVE_UP_HEADER: &str = "hourglass-gave-up";
/// On error-queue and unknown messages: the queue the message failed on.
pub(crate) const FAILED_QUEUE_HEADER: &str = "hourglass-failed-queue";

/// Where a plan's extra routing keys travel (`AmqpCommand::Publish::bcc`); set only by the host.
pub(crate) const BCC_HEADER: &str = "BCC";

/// Headers that make the broker copy a message to the queues they name
/// (sender-selected distribution), and close the channel when malformed.
pub(crate) fn is_routing_header(name: &str) -> bool {
    name.eq_ignore_ascii_case("CC") || name.eq_ignore_ascii_case("BCC")
}

/// Whether a producer's header is hourglass's to set.
pub fn is_reserved(name: &str) -> bool {
    name.starts_with(PREFIX)
}
