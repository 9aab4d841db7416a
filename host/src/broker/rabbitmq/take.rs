//! Taking messages off a queue with `basic.get`, holding each until it is
//! acked (done with) or given back: what `hourglass transfer` moves messages
//! with and `hourglass parked` lists them with. A taken message sits unacked,
//! so it neither expires into the next queue nor is lost if this process
//! dies: the broker puts it back.
//!
//! A `basic.get` is a round trip for one message, so a transfer opens its
//! taker with [`Taker::open_spread`] and gets on several channels at once
//! ([`Taker::take_spread`]: order does not matter there); a listing opens one
//! channel and [`Taker::take`] keeps the queue's order.

use futures_util::future::join_all;
use lapin::options::{BasicAckOptions, BasicGetOptions, BasicNackOptions, QueueDeclareOptions};
use lapin::types::FieldTable as AmqpTable;
use lapin::{Channel, Connection, ConnectionProperties};

use crate::executor::ExecutorError;
use crate::message::Delivery;

use super::convert::from_amqp_delivery;
use super::link::{CONNECT_TIMEOUT, create_channel, parting};
use super::nodes::{self, redact};
use super::passive::{self, PassiveFailure};

/// Channels a [`Taker::open_spread`] taker gets on at once. One `basic.get` per round
/// trip was most of a transfer's time: 10,000 messages moved in 8.3 s on one
/// channel with one ack after another, 3.5–4.4 s on four with the acks
/// together (a debug build; eight channels took no less).
const SPREAD: usize = 4;

/// One connection, and channels to take messages with.
pub struct Taker {
    url: String,
    connection: Connection,
    /// The first keeps a queue's order for [`Taker::take`].
    channels: Vec<Channel>,
}

/// A message taken and not yet acked or given back.
pub struct Taken {
    pub delivery: Delivery,
    acker: lapin::Acker,
}

impl Taker {
    /// A taker with one channel: [`Self::take`] and [`Self::take_spread`] alike keep to it.
    pub async fn open(url: &str) -> Result<Taker, ExecutorError> {
        Self::open_with(url, 1).await
    }

    /// A taker whose [`Self::take_spread`] gets on [`SPREAD`] channels at once.
    pub async fn open_spread(url: &str) -> Result<Taker, ExecutorError> {
        Self::open_with(url, SPREAD).await
    }

    async fn open_with(url: &str, channel_count: usize) -> Result<Taker, ExecutorError> {
        let lost = |e: lapin::Error| ExecutorError::Unavailable(format!("RabbitMQ at {}: {e}", redact(url)));
        let (connection, _) = nodes::connect(url, ConnectionProperties::default(), CONNECT_TIMEOUT)
            .await
            .map_err(|e| ExecutorError::Unavailable(format!("RabbitMQ at {}: {e}", redact(url))))?;
        let mut channels = Vec::with_capacity(channel_count);
        for _ in 0..channel_count {
            channels.push(create_channel(&connection).await.map_err(lost)?);
        }
        Ok(Taker { url: url.to_string(), connection, channels })
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

    /// Up to `max` messages from `queue` in its order, fewer when it runs empty.
    pub async fn take(&self, queue: &str, max: usize) -> Result<Vec<Taken>, ExecutorError> {
        self.take_on(&self.channels[0], queue, max).await
    }

    /// Up to `max` messages from `queue`, fewer when it runs empty, taken on
    /// every channel at once: faster, in no particular order. When one channel
    /// fails, what the others took is given back before the error returns.
    pub async fn take_spread(&self, queue: &str, max: usize) -> Result<Vec<Taken>, ExecutorError> {
        let count = self.channels.len();
        let shares = self.channels.iter().enumerate().map(|(i, channel)| self.take_on(channel, queue, max / count + usize::from(i < max % count)));
        let mut taken = Vec::with_capacity(max);
        let mut failed = None;
        for share in join_all(shares).await {
            match share {
                Ok(share) => taken.extend(share),
                Err(err) => _ = failed.get_or_insert(err),
            }
        }
        let Some(err) = failed else { return Ok(taken) };
        self.give_back_all(taken).await;
        Err(err)
    }

    /// On `channel`, one `basic.get` after another; on a failure part way, what it took is given back.
    async fn take_on(&self, channel: &Channel, queue: &str, max: usize) -> Result<Vec<Taken>, ExecutorError> {
        let mut taken = Vec::new();
        while taken.len() < max {
            match channel.basic_get(queue.into(), BasicGetOptions { no_ack: false }).await {
                Ok(Some(got)) => taken.push(Taken { delivery: from_amqp_delivery(queue, &got.delivery), acker: got.delivery.acker }),
                Ok(None) => break,
                Err(e) => {
                    self.give_back_all(taken).await;
                    return Err(self.lost(e));
                }
            }
        }
        Ok(taken)
    }

    /// Done with it: the broker forgets it. An ack that cannot go out (its
    /// channel closed meanwhile, so the broker has the message back) is an error.
    pub async fn ack(&self, taken: Taken) -> Result<(), ExecutorError> {
        match taken.acker.ack(BasicAckOptions::default()).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(ExecutorError::Unavailable(format!(
                "RabbitMQ at {}: the channel closed before the ack; the broker has the message back",
                redact(&self.url)
            ))),
            Err(e) => Err(self.lost(e)),
        }
    }

    /// Done with all of them: their acks go out together rather than one after another's.
    pub async fn ack_all(&self, taken: Vec<Taken>) -> Result<(), ExecutorError> {
        join_all(taken.into_iter().map(|taken| self.ack(taken))).await.into_iter().collect()
    }

    /// Back where it was, as it was (a closed channel has given it back already).
    pub(crate) async fn give_back(&self, taken: Taken) -> Result<(), ExecutorError> {
        taken.acker.nack(BasicNackOptions { requeue: true, ..Default::default() }).await.map(|_| ()).map_err(|e| self.lost(e))
    }

    /// Every one back, as far as the channels allow: on the way out, where a
    /// failed give-back leaves the message to the broker when the taker closes.
    pub(crate) async fn give_back_all(&self, taken: Vec<Taken>) {
        for message in taken {
            self.give_back(message).await.ok();
        }
    }

    pub async fn close(self) {
        parting(&self.connection, self.connection.close(200, "hourglass transfer done".into())).await;
    }
}
