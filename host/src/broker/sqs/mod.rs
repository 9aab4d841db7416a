//! SQS through aws-sdk-sqs: the only place that speaks to SQS.
//!
//! * [`send`]: the executor — checks queues and sends with their delays.
//! * [`batcher`]: coalesces concurrent first sends to one queue into
//!   `SendMessageBatch` requests.
//! * [`pump`]: receives messages that fell due on a pumped queue and sends
//!   them on as their strategy decides.
//! * [`bundle`]: what a pump sends around again travels several to one SQS
//!   message, so a visit's requests are shared by more messages.
//! * [`fates`]: cancel and reschedule, decided by the head of each
//!   message's group in a FIFO fates queue; [`fates_queue`] carries it out,
//!   [`release`] claims what a cancellable strategy's release queue brings,
//!   and [`replies`] is a host's queue for the answers to what it asked.
//! * [`pumped`]: finds pumped queues by their tag and gives each its
//!   dead-letter queue and visibility timeout.
//! * [`dead_letters`]: a pumped queue's dead-letter queue, by name.
//! * [`consume`]: the consumer under the SQS ingress queue, carrying out a
//!   [`Handler`](crate::message::Handler)'s outcomes as deletes and moves.
//! * [`properties`]: a message's neutral properties as message attributes
//!   (`content-type` and one JSON `hourglass-properties`), and back.

pub mod batcher;
pub mod bundle;
pub mod consume;
pub mod dead_letters;
pub mod fates;
pub mod fates_queue;
pub mod properties;
pub mod pump;
pub mod pumped;
pub mod release;
pub mod replies;
pub mod send;

pub use send::SqsExecutor;

use crate::command::Command;

/// An SQS release queue: a standard queue, kept as long as SQS keeps anything,
/// so a message waiting there for a host outlives any outage.
pub fn release_queue_declaration(name: &str) -> Command {
    let attributes = [("MessageRetentionPeriod".to_string(), "1209600".to_string())].into();
    Command::SqsEnsureQueue { name: name.to_string(), attributes, pumped: false }
}

/// A name with the characters SQS refuses in queue names replaced by `-`
/// (SQS names take letters, digits, `-` and `_`).
pub fn safe_name(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '-' }).collect()
}
