//! The release queue of a `cancellable = true` strategy: the last hop before
//! the destination, where the host asks the cancellation log
//! ([`super::cancel`]) what to do with each message that finished its delay.
//!
//! * released: forwarded to its destination queue (a confirmed, mandatory
//!   publish through the default exchange), then acked;
//! * cancelled: acked and dropped;
//! * rescheduled later: sent round the strategy again with the same id, due
//!   at the new time, then acked;
//! * a destination that no longer exists, or a message without hourglass's
//!   headers: parked in `<release queue>.parked` with the reason.
//!
//! While the log cannot answer (the broker is away) the message is requeued:
//! nothing is forwarded that the log has not let go.

use std::sync::Arc;

use crate::broker::{Broker, Envelope, Executor, ExecutorError};
use crate::command::{Command, FieldTable};
use crate::headers::{DUE_AT_HEADER, ID_HEADER, PARKED_REASON_HEADER, TARGET_HEADER, is_reserved};
use crate::message::{Delivery, Handler, HeaderValue, Outcome, Settled};
use crate::scheduler::{ScheduleError, ScheduleRequest, Scheduler, release_queue_declaration};

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
    log: Arc<CancelLog>,
    scheduler: Arc<Scheduler<Broker>>,
}

impl Release {
    pub fn new(strategy: &str, queue: String, prefetch: u16, log: Arc<CancelLog>, scheduler: Arc<Scheduler<Broker>>) -> Arc<Release> {
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

    /// Publishes the message as it came to its destination queue and waits for the confirm.
    async fn forward(&self, delivery: &Delivery, id: &str, destination: &str) -> Result<(), ExecutorError> {
        let publish = [Command::forward("", destination)];
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
    async fn replan(&self, delivery: &Delivery, id: &str, destination: &str, due_at_ms: u64) -> Result<(), ScheduleError> {
        let mut properties = delivery.properties.clone();
        // hourglass's headers are written afresh; the broker's death records are dropped by the scheduler.
        properties.headers.retain(|name, _| !is_reserved(name));
        let request = ScheduleRequest {
            destination: destination.to_string(),
            deliver_at_ms: Some(due_at_ms),
            body: delivery.body.clone(),
            properties,
            strategy: Some(self.strategy.clone()),
            as_is: true,
            id: Some(id.to_string()),
            ..Default::default()
        };
        self.scheduler.schedule(request).await.map(|_| ())
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
        vec![release_queue_declaration(&self.queue), release_queue_declaration(&self.parked_queue()), self.log.declaration()]
    }

    async fn handle(&self, delivery: &Delivery) -> (Outcome, Released) {
        let text = |name: &str| delivery.properties.headers.get(name).and_then(|v| v.as_text()).filter(|t| !t.is_empty());
        let (Some(id), Some(destination)) = (text(ID_HEADER), text(TARGET_HEADER)) else {
            return self.park(&format!("no {ID_HEADER} and {TARGET_HEADER} headers: not scheduled by hourglass through strategy {:?}", self.strategy));
        };
        let answer = match self.log.claim(&id).await {
            Ok(answer) => answer,
            Err(err) => {
                tracing::warn!(queue = %self.queue, %id, error = %err, "the cancellation log did not answer; requeueing");
                return (Outcome::Requeue, Released::Requeued);
            }
        };
        match answer {
            Answer::Drop => {
                tracing::info!(%id, %destination, "cancelled message dropped");
                (Outcome::Ack, Released::Cancelled)
            }
            Answer::Replan { due_at_ms } => match self.replan(delivery, &id, &destination, due_at_ms).await {
                Ok(()) => (Outcome::Ack, Released::Rescheduled),
                Err(ScheduleError::Broker(ExecutorError::Unavailable(why))) => {
                    tracing::warn!(%id, %why, "could not send a rescheduled message round again; requeueing");
                    (Outcome::Requeue, Released::Requeued)
                }
                Err(err) => {
                    let (outcome, released) = self.park(&format!("rescheduling to {due_at_ms} failed: {err}"));
                    (due_at_rescheduled(outcome, due_at_ms), released)
                }
            },
            Answer::Release => match self.forward(delivery, &id, &destination).await {
                Ok(()) => (Outcome::Ack, Released::Forwarded),
                Err(ExecutorError::Unavailable(why)) => {
                    tracing::warn!(%id, %why, "could not forward a released message; requeueing");
                    (Outcome::Requeue, Released::Requeued)
                }
                Err(err) => self.park(&format!("destination {destination:?}: {err}")),
            },
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
