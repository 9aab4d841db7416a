//! The messages hourglass set aside, and what an operator does with them:
//! list, replay, drop (`hourglass parked`).
//!
//! Set aside are: a strategy's parking queue (its delay ended and the
//! destination was gone), a cancellable strategy's `<release queue>.parked`,
//! and the ingress's invalid queue. Listing takes each message unacked and
//! gives it back, so nothing moves; replaying publishes it again (to its
//! destination, or an invalid message to the ingress) with a confirm, then
//! acks it; dropping acks it. A message that cannot be replayed (its
//! destination is still gone) is given back and counted.

use serde::Serialize;

use crate::broker::rabbitmq::take::{Taken, Taker};
use crate::broker::{Broker, Envelope, Executor, ExecutorError};
use crate::command::{Command, FieldTable};
use crate::config::Config;
use crate::headers::{DUE_AT_HEADER, INVALID_REASON_HEADER, PARKED_REASON_HEADER, TARGET_HEADER};
use crate::message::{Delivery, HeaderValue};
use crate::scheduler::Scheduler;

/// A queue of set-aside messages, and where its messages go when replayed.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ParkingQueue {
    pub queue: String,
    /// `parked` (a strategy's or a release queue's) or `invalid` (the ingress's).
    pub kind: &'static str,
}

/// Every queue hourglass sets messages aside in, for this config.
pub fn parking_queues(config: &Config, scheduler: &Scheduler<Broker>) -> Vec<ParkingQueue> {
    let mut queues: Vec<ParkingQueue> = scheduler.parking_queues().into_values().flatten().map(|queue| ParkingQueue { queue, kind: "parked" }).collect();
    for strategy in config.strategies.values().filter(|s| s.cancellable) {
        queues.push(ParkingQueue { queue: format!("{}.parked", config.service.cancel.release_queue(&strategy.name)), kind: "parked" });
    }
    if config.service.ingress.enabled {
        queues.push(ParkingQueue { queue: config.service.ingress.invalid_queue.clone(), kind: "invalid" });
    }
    queues.sort_by(|a, b| a.queue.cmp(&b.queue));
    queues.dedup();
    queues
}

/// One set-aside message, as `list` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct ParkedMessage {
    pub queue: String,
    pub message_id: Option<String>,
    pub destination: Option<String>,
    pub due_at_ms: Option<u64>,
    pub reason: Option<String>,
    pub bytes: usize,
}

impl ParkedMessage {
    fn of(delivery: &Delivery) -> ParkedMessage {
        let headers = &delivery.properties.headers;
        let text = |name: &str| headers.get(name).and_then(|v| v.as_text());
        let reason = text(PARKED_REASON_HEADER).or_else(|| text(INVALID_REASON_HEADER)).or_else(|| dead_letter_reason(delivery));
        ParkedMessage {
            queue: delivery.queue.clone(),
            message_id: delivery.properties.message_id.clone(),
            destination: text(TARGET_HEADER),
            due_at_ms: headers.get(DUE_AT_HEADER).and_then(|v| v.as_whole_number()).and_then(|n| u64::try_from(n).ok()),
            reason,
            bytes: delivery.body.len(),
        }
    }
}

/// Parked through an alternate exchange, a message carries no reason of
/// hourglass's; its last death record says where it came from.
fn dead_letter_reason(delivery: &Delivery) -> Option<String> {
    // `x-death` lists the newest death first (RabbitMQ 3.10 has no `x-last-death-*` headers yet).
    let Some(HeaderValue::Array(deaths)) = delivery.properties.headers.get("x-death") else { return None };
    let queue = deaths.iter().find_map(|death| match death {
        HeaderValue::Table(death) => death.get("queue").and_then(|v| v.as_text()),
        _ => None,
    })?;
    Some(format!("unroutable after its delay (last in {queue}): the destination queue was gone"))
}

/// What `replay` or `drop` did to one queue.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Handled {
    pub queue: String,
    pub done: u64,
    /// Given back, with why (the first reason seen).
    pub left: u64,
    pub why_left: Option<String>,
}

/// Up to `limit` messages of `queue`, taken and given back.
pub async fn list(taker: &Taker, queue: &str, limit: usize) -> Result<Vec<ParkedMessage>, ExecutorError> {
    let taken = taker.take(queue, limit).await?;
    let listed = taken.iter().map(|t| ParkedMessage::of(&t.delivery)).collect();
    for message in taken {
        taker.give_back(message).await?;
    }
    Ok(listed)
}

/// Which messages an operation touches: all, or those with this message id.
fn selected(delivery: &Delivery, id: Option<&str>) -> bool {
    id.is_none_or(|id| delivery.properties.message_id.as_deref() == Some(id))
}

/// Takes every message of `queue` once, applies `act` to the selected ones
/// (`Ok(true)`: done, ack it; `Ok(false)` or `Err`: give it back), then gives back the rest.
async fn each_message(
    taker: &Taker,
    queue: &str,
    id: Option<&str>,
    mut act: impl AsyncFnMut(&Delivery) -> Result<(), String>,
) -> Result<Handled, ExecutorError> {
    let mut handled = Handled { queue: queue.to_string(), ..Default::default() };
    let mut kept: Vec<Taken> = Vec::new();
    let result = async {
        loop {
            let taken = taker.take(queue, 64).await?;
            if taken.is_empty() {
                return Ok(());
            }
            for message in taken {
                if !selected(&message.delivery, id) {
                    kept.push(message);
                    continue;
                }
                match act(&message.delivery).await {
                    Ok(()) => {
                        taker.ack(message).await?;
                        handled.done += 1;
                    }
                    Err(why) => {
                        handled.left += 1;
                        handled.why_left.get_or_insert(why);
                        kept.push(message);
                    }
                }
            }
        }
    }
    .await;
    for message in kept {
        taker.give_back(message).await.ok();
    }
    result.map(|()| handled)
}

/// Publishes each selected message again: a parked one to its destination
/// queue (it is past due), an invalid one to the ingress queue.
pub async fn replay(scheduler: &Scheduler<Broker>, taker: &Taker, parking: &ParkingQueue, ingress: &str, id: Option<&str>) -> Result<Handled, ExecutorError> {
    each_message(taker, &parking.queue, id, async |delivery: &Delivery| {
        let target = if parking.kind == "invalid" {
            ingress.to_string()
        } else {
            delivery.properties.headers.get(TARGET_HEADER).and_then(|v| v.as_text()).ok_or("no hourglass-target header: replay it by hand")?
        };
        let mut properties = delivery.properties.clone();
        properties.headers.retain(|name, _| name != PARKED_REASON_HEADER && name != INVALID_REASON_HEADER);
        let publish = [Command::forward("", &target)];
        let envelope = Envelope {
            id: properties.message_id.clone().unwrap_or_default(),
            body: delivery.body.clone(),
            headers: FieldTable::new(),
            properties,
            stamp_message_id: false,
        };
        scheduler.executor().send(&publish, &envelope).await.map_err(|e| format!("to {target}: {e}"))
    })
    .await
}

/// Acks (deletes) each selected message.
pub async fn drop(taker: &Taker, queue: &str, id: Option<&str>) -> Result<Handled, ExecutorError> {
    each_message(taker, queue, id, async |_: &Delivery| Ok(())).await
}
