//! The brokers, one folder each, and the [`registry`] that opens the one
//! `delay.toml` names.
//!
//! Each folder implements the host's traits for its broker and is the only
//! place its client library is used: [`crate::executor::Executor`] (declare,
//! check a destination, send with the broker's confirm) and
//! [`crate::service::side::BrokerSide`] (what it checks before work and runs
//! beside the scheduler: consumers, pumps, held streams, its clock), with the
//! cancellation keeper behind [`crate::service::cancellations::Cancellations`].
//!
//! * [`memory`]: the embedded in-memory broker, on the wall clock.
//! * [`rabbitmq`]: lapin; its ingress, redelivery, release, unpark and canary
//!   consumers, the cancellation log, parked messages and transfers.
//! * [`sqs`]: the AWS SDK; pumps, the fates queue and its release receivers.
//! * [`nats`]: async-nats; held streams asked of their planner, the KV bucket
//!   of cancellations.

pub mod memory;
pub mod nats;
pub mod rabbitmq;
pub mod registry;
pub mod sqs;

pub use registry::connect;
