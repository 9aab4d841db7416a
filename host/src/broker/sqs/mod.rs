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
//! * [`metrics`]: requests by kind and each pump's cycles, as `/metrics` families.
//! * [`consume`]: the consumer under the SQS ingress queue, carrying out a
//!   [`Handler`](crate::message::Handler)'s outcomes as deletes and moves.
//! * [`properties`]: a message's neutral properties as message attributes
//!   (`content-type` and one JSON `hourglass-properties`), and back.
//! * [`cancel`]: cancel and reschedule as a host asks them of the fates
//!   queue and decides them.
//! * [`cost`]: the requests one message's route costs, alone and among a
//!   thousand; [`traffic`]: what a stream of them costs, walked through the
//!   batcher and pumps; [`estimate`]: both as `hourglass plan` shows them.
//!
//! What a serving host runs on SQS (`side`): a pump per pumped queue (those
//! the strategies report and those found tagged), the SQS ingress and canary,
//! and the fates queue with a release receiver per cancellable strategy.
//! [`pumping`] is `hourglass pump`: the pumps without a service.

pub mod batcher;
pub mod bundle;
pub mod cancel;
pub mod consume;
pub mod cost;
pub mod dead_letters;
pub mod estimate;
pub mod fates;
pub mod fates_queue;
pub mod metrics;
pub mod properties;
pub mod pump;
pub mod pumped;
pub mod pumping;
pub mod release;
pub mod replies;
pub mod send;
pub(super) mod side;
pub mod traffic;

pub use send::SqsExecutor;

use std::sync::Arc;

use crate::config::broker::SqsSettings;
use crate::executor::ExecutorError;

pub use crate::config::broker::{sqs_fates_queue as fates_queue_name, sqs_release_queue as release_queue_declaration, sqs_safe_name as safe_name};

/// Opens the SQS `settings` name.
pub async fn connect(settings: &SqsSettings) -> Result<Arc<SqsExecutor>, ExecutorError> {
    Ok(Arc::new(SqsExecutor::connect(settings.region.as_deref(), settings.endpoint_url.as_deref(), batcher::window(settings.send_batch_window)).await?))
}
