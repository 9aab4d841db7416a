//! RabbitMQ through lapin: the only place that speaks AMQP.
//!
//! * [`publish`]: the executor — declares topology and sends confirmed publishes.
//! * [`batch`]: confirmed publishes in batches per channel, each answered on its own.
//! * [`channels`]: its channels — a pool for publishes, one for declares.
//! * [`link`]: one connection that reconnects, and wears out by broker-closed channels.
//! * [`nodes`]: several cluster nodes behind one URL setting; every connection fails over between them.
//! * [`passive`]: what a passive declare's refusal means (missing, or not answerable now).
//! * [`convert`]: neutral properties and headers to and from AMQP.
//! * [`consume`]: a queue consumer that survives the broker, under the ingress and redelivery.
//! * [`acks`]: a consume channel's acks, many finished deliveries in one.
//! * [`manage`]: the management HTTP API (bindings for `verify`, broker policies).
//! * [`metrics`]: the families RabbitMQ adds to `/metrics` (open channels).
//! * [`migrate`]: reads a delayed-message plugin exchange and plans (and applies) its move to hourglass.
//! * [`verify`]: compares a broker with a strategy's topology.
//! * [`probe`]: sends one message through each broker mechanism the strategies rely on.
//! * [`capacity`]: weighs the quorum queues the strategies declare against the nodes' file handle limits.
//! * [`stream`]: reads a RabbitMQ stream in order (the cancellation log).
//! * [`take`]: takes messages off a queue unacked, one `basic.get` at a time (transfer).
//!
//! What a serving host runs on RabbitMQ (`side`): the broker's clock read
//! through the management API ([`clock_check`]), the mechanisms probed, and
//! one connection's consumers: the ingress, [`redelivery`], each strategy's
//! [`release`] queue and parking queues ([`unpark`]), the canary; the
//! cancellation log ([`cancel`]) when a strategy is cancellable. The CLI's
//! commands on RabbitMQ: [`check`] (`verify`), [`parked`], [`transfer`],
//! [`migration`] (`migrate delayed-exchange`).

pub mod acks;
pub mod batch;
pub mod cancel;
pub mod capacity;
pub mod channels;
pub mod check;
pub mod clock_check;
pub mod consume;
pub mod convert;
pub mod link;
pub mod manage;
pub mod metrics;
pub mod migrate;
pub mod migration;
pub mod nodes;
pub mod parked;
pub mod passive;
pub mod probe;
pub mod publish;
pub mod redelivery;
pub mod release;
pub(super) mod side;
pub mod stream;
pub mod take;
pub mod transfer;
pub mod unpark;
pub mod verify;

pub use crate::config::broker::rabbitmq_release_queue as release_queue_declaration;
pub(crate) use channels::DEFAULT_PUBLISH_CHANNELS;
pub use nodes::redact;
pub use publish::{DEFAULT_URL, RabbitMqExecutor};

use std::sync::Arc;

use crate::config::broker::RabbitMqSettings;
use crate::executor::ExecutorError;

/// Opens the RabbitMQ `settings` name, with its publish channels.
pub async fn connect(settings: &RabbitMqSettings) -> Result<Arc<RabbitMqExecutor>, ExecutorError> {
    Ok(Arc::new(RabbitMqExecutor::connect_with(&settings.url, settings.publish_channels.unwrap_or(DEFAULT_PUBLISH_CHANNELS)).await?))
}
