//! The in-memory broker: AMQP exchanges and queues, SQS queues and NATS
//! JetStream streams on a virtual clock.
//!
//! It models what delay strategies rely on: direct, fanout, topic and headers
//! routing, exchange-to-exchange bindings, per-queue and per-message TTL with
//! head-of-queue expiry, dead-lettering with `x-death` (and the broker's cycle
//! drop) at most once or at least once by queue type, alternate exchanges,
//! `x-expires`, queue deletion; SQS queues with per-message and queue-level delays,
//! FIFO deduplication and `SentTimestamp`; JetStream streams capturing subjects,
//! a held stream's redeliveries after a declined delivery's delay, and one-shot
//! message schedules. Time only moves when [`Simulator::step`]
//! jumps to the next event, so years of delay simulate in microseconds.
//!
//! Nothing disappears unrecorded: every message that leaves other than by
//! arriving at a destination is kept in [`Simulator::lost`] with the reason.

mod amqp;
pub mod conformance;
mod nats;
pub mod simulation;
mod sqs;

use std::collections::BTreeMap;

use serde::Serialize;
use thiserror::Error;

pub(crate) use amqp::Death;
pub(crate) use nats::HeldNatsMessage;
pub(crate) use sqs::DueSqsMessage;

use crate::command::{AmqpCommand, Command, FieldTable, FieldValue, NatsCommand, SqsCommand};

#[derive(Debug, Error, PartialEq, Eq)]
pub enum SimError {
    #[error("NOT_FOUND: {0}")]
    NotFound(String),
    #[error("PRECONDITION_FAILED: {0}")]
    PreconditionFailed(String),
    #[error("unroutable: publish to exchange {exchange:?} with routing key {routing_key:?} reached no queue")]
    Unroutable { exchange: String, routing_key: String },
    #[error("invalid: {0}")]
    Invalid(String),
}

/// One step of a message's route.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Hop {
    pub at_ms: u64,
    #[serde(flatten)]
    pub step: HopStep,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "via", rename_all = "kebab-case")]
pub enum HopStep {
    /// Routed by an exchange to queues and exchanges (`queue:NAME`, `exchange:NAME`).
    Exchange {
        name: String,
        routing_key: String,
        /// The `BCC` keys it was routed on as well.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        bcc: Vec<String>,
        routed_to: Vec<String>,
    },
    /// Waited in a queue, then left (`dead-lettered to exchange:NAME`, `arrived`).
    Queue { name: String, waited_ms: u64, then: String },
    /// Waited in an SQS queue until visible.
    SqsQueue { name: String, waited_ms: u64, then: String },
    /// A pump asked the planner about a due message and sent it on.
    Pump { queue: String, action: String, sends: Vec<String> },
    /// A held stream delivered the message to the host after `waited_ms`;
    /// its planner answered `action` (wait again, or hand over with `sends`).
    Held { stream: String, waited_ms: u64, action: String, sends: Vec<String> },
    /// A JetStream schedule fired after `waited_ms`.
    Scheduled { target: String, waited_ms: u64, then: String },
}

/// A message in flight, with the route it has taken so far.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SimMessage {
    pub id: String,
    pub routing_key: String,
    /// The broker's copy of the `BCC` keys: routed on, dropped on the way to a consumer.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub bcc: Vec<String>,
    pub headers: FieldTable,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub sqs_attributes: BTreeMap<String, String>,
    pub expiration_ms: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub deaths: Vec<Death>,
    pub hops: Vec<Hop>,
}

impl SimMessage {
    pub fn new(id: &str, headers: FieldTable) -> Self {
        SimMessage {
            id: id.to_string(),
            routing_key: String::new(),
            bcc: Vec::new(),
            headers,
            sqs_attributes: BTreeMap::new(),
            expiration_ms: None,
            deaths: Vec::new(),
            hops: Vec::new(),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Arrival {
    pub queue: String,
    pub at_ms: u64,
    pub message: SimMessage,
}

#[derive(Clone, Debug, Serialize)]
pub struct Lost {
    pub at_ms: u64,
    pub reason: String,
    pub message: SimMessage,
}

/// What [`Simulator::step`] did.
// Returned once per step and matched at once: boxing the message would only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Step {
    /// Nothing is scheduled any more.
    Idle,
    /// Time moved and the broker acted on its own (expiry, dead-lettering, delivery).
    Progressed,
    /// A message became visible on a pumped SQS queue; the caller must handle it.
    Due(DueSqsMessage),
    /// A held NATS stream delivered a message to the host; the caller must
    /// answer it ([`Simulator::redeliver`] or a hand-over).
    Held(HeldNatsMessage),
}

/// Messages that surfaced for the host to answer while the clock moved.
#[derive(Debug, Default)]
pub(crate) struct Surfaced {
    /// Due on pumped queues: each goes to its strategy's planner (`handle-due`).
    pub due: Vec<DueSqsMessage>,
    /// Delivered by held streams: each goes to its strategy's planner (`handle-held`).
    pub held: Vec<HeldNatsMessage>,
}

#[derive(Default)]
pub struct Simulator {
    now_ms: u64,
    amqp: amqp::AmqpBroker,
    sqs: sqs::SqsBroker,
    nats: nats::NatsBroker,
    arrivals: Vec<Arrival>,
    lost: Vec<Lost>,
}

impl Simulator {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    pub fn arrivals(&self) -> &[Arrival] {
        &self.arrivals
    }

    pub(crate) fn take_arrivals(&mut self) -> Vec<Arrival> {
        std::mem::take(&mut self.arrivals)
    }

    pub fn lost(&self) -> &[Lost] {
        &self.lost
    }

    pub(crate) fn take_lost(&mut self) -> Vec<Lost> {
        std::mem::take(&mut self.lost)
    }

    /// A consumer's queue: messages that reach it count as arrived.
    pub(crate) fn declare_destination_queue(&mut self, name: &str) {
        self.amqp.declare_destination(name, self.now_ms);
    }

    /// Deletes an AMQP queue with its bindings, as a consumer's `queue.delete`
    /// would; messages waiting in it are recorded as lost.
    pub fn delete_queue(&mut self, name: &str) -> Result<(), SimError> {
        let lost = self.amqp.delete_queue(name, self.now_ms)?;
        self.lost.extend(lost);
        Ok(())
    }

    /// The AMQP queue a message waits in, if it waits in one (a parking queue, a
    /// level, or held by an at-least-once queue whose dead-letter found no route).
    pub(crate) fn queue_holding(&self, message_id: &str) -> Option<&str> {
        self.amqp.queue_holding(message_id)
    }

    /// Every message still waiting somewhere on the way, as (queue, message id).
    pub fn waiting(&self) -> Vec<(String, String)> {
        self.amqp.waiting().chain(self.sqs.waiting()).chain(self.nats.waiting()).map(|(q, id)| (q.to_string(), id.to_string())).collect()
    }

    /// A consumer's SQS queue: messages count as arrived when they become visible.
    pub(crate) fn declare_destination_sqs_queue(&mut self, name: &str) {
        self.sqs.declare_destination(name);
    }

    /// A consumer's subject: messages published to it count as arrived.
    pub(crate) fn declare_destination_subject(&mut self, subject: &str) {
        self.nats.declare_destination(subject);
    }

    /// Applies a topology or setup command (anything but a send).
    pub fn apply(&mut self, command: &Command) -> Result<(), SimError> {
        match command {
            Command::Amqp(AmqpCommand::Publish { .. })
            | Command::Sqs(SqsCommand::Send { .. })
            | Command::Nats(NatsCommand::Publish { .. } | NatsCommand::Schedule { .. }) => {
                Err(SimError::Invalid("a publish or send needs a message; use execute".into()))
            }
            Command::Amqp(command) => self.amqp.apply(command, self.now_ms),
            Command::Sqs(SqsCommand::EnsureQueue { name, attributes, pumped }) => self.sqs.ensure_queue(name, attributes, *pumped),
            Command::Nats(NatsCommand::EnsureStream { name, subjects, held }) => self.nats.ensure_stream(name, subjects, *held),
        }
    }

    /// Runs one command for `message`: a publish or send carries it; any other
    /// command is applied as is. Taking the message by value spares a copy of
    /// its route on every hop of a long-cycling message.
    pub(crate) fn execute(&mut self, command: &Command, mut message: SimMessage) -> Result<(), SimError> {
        match command {
            Command::Amqp(AmqpCommand::Publish { exchange, routing_key, bcc, headers, expiration_ms, mandatory }) => {
                message.routing_key = routing_key.clone();
                message.bcc = bcc.clone();
                message.headers.extend(headers.iter().map(|(k, v)| (k.clone(), v.clone())));
                message.expiration_ms = *expiration_ms;
                let outcome = self.amqp.publish(exchange, message, self.now_ms)?;
                self.settle(outcome, *mandatory, exchange, routing_key)
            }
            Command::Sqs(SqsCommand::Send { queue, delay_seconds, attributes, group_id, dedup_id }) => {
                message.sqs_attributes.extend(attributes.iter().map(|(k, v)| (k.clone(), v.clone())));
                let send = sqs::Send { delay_seconds: *delay_seconds, group_id: group_id.clone(), dedup_id: dedup_id.clone() };
                self.sqs.send(queue, message, send, self.now_ms)
            }
            Command::Nats(NatsCommand::Publish { subject, headers }) => {
                message.headers.extend(headers.iter().map(|(k, v)| (k.clone(), FieldValue::Text(v.clone()))));
                if let Some(arrival) = self.nats.publish(subject, message, self.now_ms)? {
                    self.arrivals.push(arrival);
                }
                Ok(())
            }
            Command::Nats(NatsCommand::Schedule { target, after_ms, headers }) => {
                message.headers.extend(headers.iter().map(|(k, v)| (k.clone(), FieldValue::Text(v.clone()))));
                self.nats.schedule(target, *after_ms, message, self.now_ms);
                Ok(())
            }
            other => self.apply(other),
        }
    }

    fn settle(&mut self, outcome: amqp::Routed, mandatory: bool, exchange: &str, routing_key: &str) -> Result<(), SimError> {
        let amqp::Routed { arrivals, unroutable } = outcome;
        self.arrivals.extend(arrivals);
        if let Some(message) = unroutable {
            self.lost.push(Lost { at_ms: self.now_ms, reason: format!("unroutable from exchange {exchange:?}"), message });
            if mandatory {
                return Err(SimError::Unroutable { exchange: exchange.into(), routing_key: routing_key.into() });
            }
        }
        Ok(())
    }

    /// The host declined a held delivery for `after_ms`: the server delivers it again then.
    pub(crate) fn redeliver(&mut self, held: HeldNatsMessage, after_ms: u64) {
        self.nats.redeliver(held, after_ms, self.now_ms);
    }

    /// When the next scheduled event happens, if any.
    pub(crate) fn next_event_ms(&self) -> Option<u64> {
        [self.amqp.next_event_ms(), self.sqs.next_event_ms(), self.nats.next_event_ms()].into_iter().flatten().min()
    }

    /// Moves the clock to `at_ms`, handling every broker event up to then.
    /// What surfaced for the host to answer (due on pumped queues, delivered
    /// by held streams) is returned for the caller.
    pub(crate) fn advance_to(&mut self, at_ms: u64) -> Surfaced {
        let mut surfaced = Surfaced::default();
        while self.next_event_ms().is_some_and(|t| t <= at_ms) {
            match self.step() {
                Step::Due(due) => surfaced.due.push(due),
                Step::Held(held) => surfaced.held.push(held),
                Step::Idle | Step::Progressed => {}
            }
        }
        self.now_ms = self.now_ms.max(at_ms);
        surfaced
    }

    /// Jumps to the next event and handles it.
    pub fn step(&mut self) -> Step {
        let Some(at) = self.next_event_ms() else { return Step::Idle };
        self.now_ms = self.now_ms.max(at);
        if self.amqp.next_event_ms() == Some(at) {
            let effects = self.amqp.fire(self.now_ms);
            self.arrivals.extend(effects.arrivals);
            self.lost.extend(effects.lost);
            return Step::Progressed;
        }
        if self.nats.next_event_ms() == Some(at) {
            match self.nats.fire(self.now_ms) {
                nats::Fired::Held(held) => return Step::Held(held),
                nats::Fired::Arrived(arrival) => self.arrivals.push(arrival),
                nats::Fired::Dropped { reason, message } => self.lost.push(Lost { at_ms: self.now_ms, reason, message }),
                nats::Fired::Kept => {}
            }
            return Step::Progressed;
        }
        match self.sqs.fire(self.now_ms) {
            sqs::Fired::Arrived(arrival) => {
                self.arrivals.push(arrival);
                Step::Progressed
            }
            sqs::Fired::Due(due) => Step::Due(due),
            sqs::Fired::Nothing => Step::Progressed,
        }
    }
}

#[cfg(test)]
mod tests;
