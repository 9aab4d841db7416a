//! A strategy's release queue: the last hop before the destination for the
//! messages the host forwards itself — every message of a `cancellable = true`
//! strategy, and every message due to an exchange. For a cancellable
//! strategy the host asks the cancellation log ([`super::cancel`]) what to do
//! with each message that finished its delay:
//!
//! * released: forwarded (a confirmed, mandatory publish) to its destination
//!   queue through the default exchange, or to its exchange with its routing
//!   key, then acked;
//! * cancelled: acked and dropped;
//! * rescheduled later: sent round the strategy again with the same id, due
//!   at the new time, then acked;
//! * a destination that no longer exists, an exchange that routes it nowhere,
//!   or a message without hourglass's headers: parked in
//!   `<release queue>.parked` with the reason.
//!
//! A strategy that is not cancellable has no log to ask: each message is
//! forwarded as released. While the log or the broker cannot answer the
//! message is requeued: nothing is forwarded that the log has not let go.

use std::sync::Arc;

use crate::broker::rabbitmq::release_queue_declaration;
use crate::command::{Command, FieldTable};
use crate::executor::{Broker, Envelope, Executor, ExecutorError};
use crate::headers::{DUE_AT_HEADER, EXCHANGE_HEADER, ID_HEADER, PARKED_REASON_HEADER, ROUTING_KEY_HEADER, TARGET_HEADER};
use crate::message::{Delivery, Handler, HeaderValue, Outcome, Settled};
use crate::scheduler::{ScheduleError, ScheduleRequest, Scheduler};

use super::cancel::{Answer, CancelLog};

/// What happened to one message, for the metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    Forwarded,
    Cancelled,
    Rescheduled,
    Parked,
    Requeued,
}

impl Released {
    fn label(self) -> &'static str {
        match self {
            Released::Forwarded => "forwarded",
            Released::Cancelled => "cancelled",
            Released::Rescheduled => "rescheduled",
            Released::Parked => "parked",
            Released::Requeued => "requeued",
        }
    }
}

pub struct Release {
    strategy: String,
    queue: String,
    prefetch: u16,
    /// The cancellation log, for a cancellable strategy.
    log: Option<Arc<CancelLog>>,
    scheduler: Arc<Scheduler<Broker>>,
}

/// Where a released message goes: the queue or the exchange it is due to.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Onward {
    Queue(String),
    Exchange { exchange: String, routing_key: String },
}

impl Onward {
    /// Read from the message's headers: an exchange if it names one, else its target queue.
    fn of(delivery: &Delivery) -> Option<Onward> {
        let text = |name: &str| delivery.properties.headers.get(name).and_then(|v| v.as_text());
        match text(EXCHANGE_HEADER).filter(|e| !e.is_empty()) {
            Some(exchange) => Some(Onward::Exchange { exchange, routing_key: text(ROUTING_KEY_HEADER).unwrap_or_default() }),
            None => text(TARGET_HEADER).filter(|t| !t.is_empty()).map(Onward::Queue),
        }
    }

    /// How a refusal of the forward reads in the parked message's reason.
    fn describe(&self) -> String {
        match self {
            Onward::Queue(queue) => format!("destination {queue:?}"),
            Onward::Exchange { exchange, routing_key } => format!("exchange {exchange:?} (routing key {routing_key:?})"),
        }
    }
}

impl Release {
    /// `log`: the cancellation log, when the strategy is cancellable.
    pub fn new(strategy: &str, queue: String, prefetch: u16, log: Option<Arc<CancelLog>>, scheduler: Arc<Scheduler<Broker>>) -> Arc<Release> {
        Arc::new(Release { strategy: strategy.to_string(), queue, prefetch, log, scheduler })
    }

    /// Where messages go that cannot be released.
    pub fn parked_queue(&self) -> String {
        format!("{}.parked", self.queue)
    }

    fn park(&self, reason: &str) -> (Outcome, Released) {
        tracing::warn!(queue = %self.queue, %reason, "parking a message from the release queue");
        (Outcome::move_to(&self.parked_queue(), PARKED_REASON_HEADER, reason), Released::Parked)
    }

    /// Publishes the message as it came to its destination queue, or to its
    /// exchange with its routing key, and waits for the confirm.
    async fn forward(&self, delivery: &Delivery, id: &str, onward: &Onward) -> Result<(), ExecutorError> {
        let publish = [match onward {
            Onward::Queue(queue) => Command::forward("", queue),
            Onward::Exchange { exchange, routing_key } => Command::forward(exchange, routing_key),
        }];
        let envelope = Envelope {
            id: id.to_string(),
            body: delivery.body.clone(),
            headers: FieldTable::new(),
            properties: delivery.properties.clone(),
            stamp_message_id: false,
        };
        self.scheduler.executor().send(&publish, &envelope).await
    }

    /// Sends the message round the strategy again, under the same id, due at `due_at_ms`.
    async fn replan(&self, delivery: &Delivery, due_at_ms: u64) -> Result<(), ScheduleError> {
        let request = ScheduleRequest::again(delivery, &self.strategy, due_at_ms).map_err(|why| ScheduleError::BadRequest(why.to_string()))?;
        self.scheduler.schedule(request).await.map(|_| ())
    }

    /// Forwards a message the log let go (or that no log holds back).
    async fn release(&self, delivery: &Delivery, id: &str, onward: &Onward) -> (Outcome, Released) {
        match self.forward(delivery, id, onward).await {
            Ok(()) => (Outcome::Ack, Released::Forwarded),
            Err(ExecutorError::Unavailable(why)) => {
                tracing::warn!(%id, %why, "could not forward a released message; holding it to try again");
                (Outcome::Retry, Released::Requeued)
            }
            Err(ExecutorError::Unroutable(_)) if matches!(onward, Onward::Exchange { .. }) => {
                self.park(&format!("{} routed it nowhere: no queue is bound for that routing key", onward.describe()))
            }
            Err(err) => self.park(&format!("{}: {err}", onward.describe())),
        }
    }
}

/// A message parked because its reschedule failed still carries the due time
/// it was first scheduled for; it leaves with the one it was rescheduled to,
/// so `parked list` shows it and `parked replay` does not forward it before then.
fn due_at_rescheduled(outcome: Outcome, due_at_ms: u64) -> Outcome {
    match outcome {
        Outcome::MoveTo { queue, mut headers, reason } => {
            headers.insert(DUE_AT_HEADER.to_string(), HeaderValue::I64(i64::try_from(due_at_ms).unwrap_or(i64::MAX)));
            Outcome::MoveTo { queue, headers, reason }
        }
        other => other,
    }
}

impl Handler for Release {
    type Note = Released;

    fn queue(&self) -> &str {
        &self.queue
    }

    fn prefetch(&self) -> u16 {
        self.prefetch
    }

    fn declarations(&self) -> Vec<Command> {
        let mut declarations = vec![release_queue_declaration(&self.queue), release_queue_declaration(&self.parked_queue())];
        declarations.extend(self.log.as_ref().map(|log| log.declaration()));
        declarations
    }

    async fn handle(&self, delivery: &Delivery) -> (Outcome, Released) {
        let text = |name: &str| delivery.properties.headers.get(name).and_then(|v| v.as_text()).filter(|t| !t.is_empty());
        let Some(onward) = Onward::of(delivery) else {
            return self.park(&format!("no {TARGET_HEADER} or {EXCHANGE_HEADER} header: not scheduled by hourglass through strategy {:?}", self.strategy));
        };
        let Some(log) = &self.log else {
            // Nothing can have cancelled it: it goes on.
            let id = delivery.properties.message_id.clone().unwrap_or_default();
            return self.release(delivery, &id, &onward).await;
        };
        let Some(id) = text(ID_HEADER) else {
            return self.park(&format!("no {ID_HEADER} header: not scheduled by hourglass through strategy {:?}", self.strategy));
        };
        let answer = match log.claim(&id).await {
            Ok(answer) => answer,
            Err(err) => {
                tracing::warn!(queue = %self.queue, %id, error = %err, "the cancellation log did not answer; holding the message to ask again");
                return (Outcome::Retry, Released::Requeued);
            }
        };
        match answer {
            Answer::Drop => {
                tracing::info!(%id, onward = %onward.describe(), "cancelled message dropped");
                (Outcome::Ack, Released::Cancelled)
            }
            Answer::Replan { due_at_ms } => match self.replan(delivery, due_at_ms).await {
                Ok(()) => (Outcome::Ack, Released::Rescheduled),
                Err(ScheduleError::Broker(ExecutorError::Unavailable(why))) => {
                    tracing::warn!(%id, %why, "could not send a rescheduled message round again; holding it to try again");
                    (Outcome::Retry, Released::Requeued)
                }
                Err(err) => {
                    let (outcome, released) = self.park(&format!("rescheduling to {due_at_ms} failed: {err}"));
                    (due_at_rescheduled(outcome, due_at_ms), released)
                }
            },
            Answer::Release => self.release(delivery, &id, &onward).await,
            other => self.park(&format!("the cancellation log answered a claim with {other:?}")),
        }
    }

    fn poisoned(&self, _delivery: &Delivery, reason: &str) -> Outcome {
        Outcome::move_to(&self.parked_queue(), PARKED_REASON_HEADER, reason)
    }

    fn settled(&self, note: Option<Released>, _outcome: &Outcome, settled: &Settled) {
        let outcome = match (note, settled) {
            (_, Settled::Requeued | Settled::MoveFailed(_)) | (None, _) => Released::Requeued,
            (Some(note), _) => note,
        };
        self.scheduler.metrics().released(&self.strategy, outcome.label());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_parked_after_a_failed_reschedule_carries_its_new_due_time() {
        let parked = Outcome::move_to("hourglass.release.main.parked", PARKED_REASON_HEADER, "rescheduling failed");
        let Outcome::MoveTo { headers, .. } = due_at_rescheduled(parked, 1_795_456_800_500) else { panic!("still a move") };
        assert_eq!(headers.get(DUE_AT_HEADER).and_then(|v| v.as_whole_number()), Some(1_795_456_800_500));
        assert!(headers.contains_key(PARKED_REASON_HEADER));
    }
}
