//! SQS through aws-sdk-sqs: the only place that speaks to SQS.
//!
//! * [`send`]: the executor — checks queues and sends with their delays.
//! * [`pump`]: receives messages that fell due on a pumped queue and sends
//!   them on as their strategy decides.
//! * [`properties`]: a message's neutral properties as message attributes
//!   (`content-type` and one JSON `hourglass-properties`), and back.

pub mod properties;
pub mod pump;
pub mod send;

pub use send::SqsExecutor;
