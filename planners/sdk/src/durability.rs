//! How a strategy's TTL queues dead-letter, and where a message goes when its
//! destination is gone: the choices that decide whether a message can be lost.
//!
//! Quorum queues dead-letter *at least once*: the broker keeps an expired
//! message until the next hop confirmed it, so a broker crash cannot lose it.
//! They need `x-overflow = reject-publish` for that (with the default drop-head
//! the broker silently falls back to at most once). Classic queues dead-letter
//! *at most once*: a crash between expiry and the next hop loses the message.
//!
//! Parking: the exchange a strategy's last hop routes through names a parking
//! exchange as its alternate exchange, so a message whose destination queue
//! vanished while it waited lands in the parking queue instead of vanishing.

use serde::Deserialize;

use crate::{Command, ExchangeKind, Field, bind_queue, declare_exchange, declare_queue, text};

/// The queue type of a strategy's TTL (waiting) queues.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum QueueType {
    /// Replicated, and dead-letters at least once.
    #[default]
    Quorum,
    /// Dead-letters at most once: a broker crash can lose confirmed messages.
    Classic,
}

impl QueueType {
    pub fn as_str(self) -> &'static str {
        match self {
            QueueType::Quorum => "quorum",
            QueueType::Classic => "classic",
        }
    }

    /// The arguments that make a dead-lettering queue of this type as safe as it can be.
    pub fn dead_letter_arguments(self) -> Vec<Field> {
        match self {
            QueueType::Quorum => vec![text("x-queue-type", "quorum"), text("x-overflow", "reject-publish"), text("x-dead-letter-strategy", "at-least-once")],
            QueueType::Classic => vec![text("x-queue-type", "classic")],
        }
    }
}

/// A parking exchange and the queue it fills.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parking {
    pub exchange: String,
    pub queue: String,
}

impl Parking {
    /// `<prefix>.parking` (fanout exchange) and `<prefix>.parked` (queue).
    pub fn under(prefix: &str) -> Parking {
        Parking { exchange: format!("{prefix}.parking"), queue: format!("{prefix}.parked") }
    }

    /// The argument that sends what an exchange cannot route to the parking exchange.
    pub fn alternate_exchange(&self) -> Field {
        text("alternate-exchange", self.exchange.as_str())
    }

    /// Declares the parking exchange and queue and binds them. Declare these
    /// before the exchange that names the parking exchange as its alternate.
    pub fn topology(&self, queue_type: QueueType) -> Vec<Command> {
        vec![
            declare_exchange(&self.exchange, ExchangeKind::Fanout, vec![]),
            declare_queue(&self.queue, vec![text("x-queue-type", queue_type.as_str())]),
            bind_queue(&self.queue, &self.exchange, ""),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quorum_is_the_default_and_dead_letters_at_least_once_with_reject_publish() {
        let arguments = QueueType::default().dead_letter_arguments();
        assert!(arguments.contains(&text("x-dead-letter-strategy", "at-least-once")));
        assert!(arguments.contains(&text("x-overflow", "reject-publish")));
        assert_eq!(QueueType::Classic.dead_letter_arguments(), vec![text("x-queue-type", "classic")]);
    }

    #[test]
    fn parking_declares_its_exchange_before_binding_its_queue() {
        let parking = Parking::under("p");
        let commands = parking.topology(QueueType::Quorum);
        assert_eq!(commands[0], declare_exchange("p.parking", ExchangeKind::Fanout, vec![]));
        assert_eq!(commands[2], bind_queue("p.parked", "p.parking", ""));
        assert_eq!(parking.alternate_exchange(), text("alternate-exchange", "p.parking"));
    }
}
