//! Taking messages off a queue one `basic.get` at a time, holding each until
//! it is acked (done with) or given back: what `hourglass transfer` moves
//! messages with. A taken message sits unacked, so it neither expires into
//! the next queue nor is lost if this process dies: the broker puts it back.

use lapin::options::{BasicAckOptions, BasicGetOptions, BasicNackOptions, QueueDeclareOptions};
use lapin::types::FieldTable as AmqpTable;
use lapin::{Channel, Connection, ConnectionProperties};

use crate::broker::ExecutorError;
use crate::message::Delivery;

use super::convert::from_amqp_delivery;
use super::link::{CONNECT_TIMEOUT, create_channel, parting};
use super::nodes::{self, redact};
use super::passive::{self, PassiveFailure};

/// One connection and channel to take messages with.
pub struct Taker {
    url: String,
    connection: Connection,
    channel: Channel,
}

/// A message taken and not yet acked or given back.
pub struct Taken {
    pub delivery: Delivery,
    acker: lapin::Acker,
}

impl Taker {
    pub async fn open(url: &str) -> Result<Taker, ExecutorError> {
        let lost = |e: lapin::Error| ExecutorError::Unavailable(format!("RabbitMQ at {}: {e}", redact(url)));
        let (connection, _) = nodes::connect(url, ConnectionProperties::default(), CONNECT_TIMEOUT)
            .await
            .map_err(|e| ExecutorError::Unavailable(format!("RabbitMQ at {}: {e}", redact(url))))?;
        let channel = create_channel(&connection).await.map_err(lost)?;
        Ok(Taker { url: url.to_string(), connection, channel })
    }

    fn lost(&self, e: lapin::Error) -> ExecutorError {
        ExecutorError::Unavailable(format!("RabbitMQ at {}: {e}", redact(&self.url)))
    }

    /// Messages ready in `queue` now (a passive declare); `None` only when the
    /// broker says there is no such queue. One that exists but cannot be read
    /// now (its home node down, say) is an error, never an empty queue.
    pub async fn depth(&self, queue: &str) -> Result<Option<u32>, ExecutorError> {
        // A passive declare of a missing queue closes the channel: use one of its own.
        let channel = create_channel(&self.connection).await.map_err(|e| self.lost(e))?;
        let options = QueueDeclareOptions { passive: true, ..Default::default() };
        let declared = channel.queue_declare(queue.into(), options, AmqpTable::default()).await;
        parting(&self.connection, channel.close(200, "done".into())).await;
        match declared {
            Ok(declared) => Ok(Some(declared.message_count())),
            Err(e) if passive::classify(&e) == PassiveFailure::Missing => Ok(None),
            Err(e) => Err(passive::check_failed(&format!("queue {queue:?}"), &redact(&self.url), &e, "")),
        }
    }

    /// Up to `max` messages from `queue`, fewer when it runs empty.
    pub async fn take(&self, queue: &str, max: usize) -> Result<Vec<Taken>, ExecutorError> {
        let mut taken = Vec::new();
        while taken.len() < max {
            let Some(got) = self.channel.basic_get(queue.into(), BasicGetOptions { no_ack: false }).await.map_err(|e| self.lost(e))? else { break };
            taken.push(Taken { delivery: from_amqp_delivery(queue, &got.delivery), acker: got.delivery.acker });
        }
        Ok(taken)
    }

    /// Done with it: the broker forgets it.
    pub async fn ack(&self, taken: Taken) -> Result<(), ExecutorError> {
        taken.acker.ack(BasicAckOptions::default()).await.map(|_| ()).map_err(|e| self.lost(e))
    }

    /// Back where it was, as it was.
    pub(crate) async fn give_back(&self, taken: Taken) -> Result<(), ExecutorError> {
        taken.acker.nack(BasicNackOptions { requeue: true, ..Default::default() }).await.map(|_| ()).map_err(|e| self.lost(e))
    }

    pub async fn close(self) {
        parting(&self.connection, self.connection.close(200, "hourglass transfer done".into())).await;
    }
}
