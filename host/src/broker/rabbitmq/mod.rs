//! RabbitMQ through lapin: the only place that speaks AMQP.
//!
//! * [`publish`]: the executor — declares topology and sends confirmed publishes.
//! * [`consume`]: a queue consumer that survives the broker, under the ingress and redelivery.
//! * [`manage`]: the management HTTP API (bindings for `verify`, broker policies).
//! * [`verify`]: compares a broker with a strategy's topology.

pub mod consume;
pub mod manage;
pub mod publish;
pub mod verify;

pub use publish::{DEFAULT_URL, RabbitMqExecutor, redact, to_amqp_table};
