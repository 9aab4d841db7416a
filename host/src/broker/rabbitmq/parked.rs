//! The messages hourglass set aside, and what an operator does with them:
//! list, replay, drop (`hourglass parked`).
//!
//! Set aside are: a strategy's parking queue (its delay ended and the
//! destination was gone, or a delay level on its way was missing), a
//! cancellable strategy's `<release queue>.parked`, and the ingress's invalid
//! queue. Listing takes each message unacked and gives it back, so nothing
//! moves; replaying publishes it again (to its destination, through its
//! strategy again if it is not due yet, to its release queue if its strategy
//! is cancellable, or an invalid message to the ingress) with a confirm, then
//! acks it; dropping acks it. A message that cannot be replayed (its
//! destination, or its release queue, is still gone) is given back and counted.

use std::collections::HashMap;
use std::time::{Duration, UNIX_EPOCH};

use serde::Serialize;

use crate::broker::rabbitmq::take::{Taken, Taker};
use crate::clock::unix_now_ms;
use crate::command::{Command, FieldTable};
use crate::config::Config;
use crate::config::broker::RabbitMqSettings;
use crate::executor::{Broker, Envelope, Executor, ExecutorError};
use crate::headers::{DUE_AT_HEADER, ID_HEADER, INVALID_REASON_HEADER, PARKED_REASON_HEADER, TARGET_HEADER};
use crate::message::{Delivery, HeaderValue};
use crate::render;
use crate::report::{CommandError, ParkedAction, Verdict};
use crate::scheduler::strategies::Strategies;
use crate::scheduler::{ScheduleError, ScheduleRequest, Scheduler};

/// A queue of set-aside messages, and where its messages go when replayed.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ParkingQueue {
    pub queue: String,
    /// `parked` (a strategy's or a release queue's) or `invalid` (the ingress's).
    pub kind: &'static str,
    /// The strategy whose messages wait here: one not due yet goes round it again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strategy: Option<String>,
    /// That strategy's release queue, when it is cancellable: a due message
    /// is replayed through it, so the cancellation log decides whether it goes on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release_queue: Option<String>,
}

impl ParkingQueue {
    fn parked(config: &Config, queue: String, strategy: &str) -> ParkingQueue {
        let release_queue = config.strategies.get(strategy).filter(|s| s.cancellable).map(|_| config.service.cancel.release_queue(strategy));
        ParkingQueue { queue, kind: "parked", strategy: Some(strategy.to_string()), release_queue }
    }
}

/// Where a serving host moves a message from a strategy's parking queue when
/// its destination (or release queue) is really gone, with the reason: what
/// is left for an operator once the host has sent on everything it could.
pub fn orphan_queue(parking_queue: &str) -> String {
    format!("{parking_queue}.orphaned")
}

/// Each strategy's own parking queue (where its topology's alternate
/// exchanges put what they cannot route), with its owner: the queues a
/// serving host takes messages from as they are parked (`unpark`).
/// A queue two strategies share (one prefix) keeps the first by name as its owner.
pub(crate) fn strategy_parking_queues(config: &Config, scheduler: &Scheduler<Broker>) -> Vec<ParkingQueue> {
    let mut queues = Vec::new();
    for (strategy, parking) in scheduler.parking_queues() {
        queues.extend(parking.into_iter().map(|queue| ParkingQueue::parked(config, queue, &strategy)));
    }
    queues.sort_by(|a, b| a.queue.cmp(&b.queue));
    queues.dedup_by(|a, b| a.queue == b.queue);
    queues
}

/// Every queue hourglass sets messages aside in, for this config, each with its owner.
pub fn parking_queues(config: &Config, scheduler: &Scheduler<Broker>) -> Vec<ParkingQueue> {
    let mut queues = Vec::new();
    for parking in strategy_parking_queues(config, scheduler) {
        queues.push(ParkingQueue { queue: orphan_queue(&parking.queue), ..parking.clone() });
        queues.push(parking);
    }
    // Where its release consumer parks: the strategy's own messages, not claimed yet or not deliverable.
    for strategy in config.strategies.values() {
        let queue = format!("{}.parked", config.service.cancel.release_queue(&strategy.name));
        queues.push(ParkingQueue::parked(config, queue, &strategy.name));
    }
    if config.service.ingress.enabled {
        queues.push(ParkingQueue { queue: config.service.ingress.invalid_queue.clone(), kind: "invalid", strategy: None, release_queue: None });
    }
    // Stable, so a parking queue two strategies share (one prefix) keeps the first by name as its owner.
    queues.sort_by(|a, b| a.queue.cmp(&b.queue));
    queues.dedup_by(|a, b| a.queue == b.queue);
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
    /// The message as listed at `now_ms` (whether it is due yet changes its reason).
    fn of(delivery: &Delivery, now_ms: u64) -> ParkedMessage {
        let text = |name: &str| header_text(delivery, name);
        let due_at_ms = due_at(delivery);
        let reason = text(PARKED_REASON_HEADER).or_else(|| text(INVALID_REASON_HEADER)).or_else(|| dead_letter_reason(delivery, due_at_ms, now_ms));
        ParkedMessage {
            queue: delivery.queue.clone(),
            message_id: delivery.properties.message_id.clone(),
            destination: text(TARGET_HEADER),
            due_at_ms,
            reason,
            bytes: delivery.body.len(),
        }
    }
}

fn header_text(delivery: &Delivery, name: &str) -> Option<String> {
    delivery.properties.headers.get(name).and_then(|v| v.as_text())
}

/// The message's `hourglass-due-at` (Unix ms), if it has one.
pub fn due_at(delivery: &Delivery) -> Option<u64> {
    delivery.properties.headers.get(DUE_AT_HEADER).and_then(|v| v.as_whole_number()).and_then(|n| u64::try_from(n).ok())
}

/// Parked through an alternate exchange, a message carries no reason of
/// hourglass's. Its due time says whether its delay had ended (the
/// destination was gone) or not (a delay level's queue was missing, so a
/// level's hold exchange parked it); its last death record says where it
/// came from, and none means it was parked as it was published. One with
/// `hourglass-id` is a cancellable strategy's, whose delays end in its
/// release queue: that was what was gone, not the destination.
fn dead_letter_reason(delivery: &Delivery, due_at_ms: Option<u64>, now_ms: u64) -> Option<String> {
    // `x-death` lists the newest death first (RabbitMQ 3.10 has no `x-last-death-*` headers yet).
    let last_queue = match delivery.properties.headers.get("x-death") {
        Some(HeaderValue::Array(deaths)) => deaths.iter().find_map(|death| match death {
            HeaderValue::Table(death) => death.get("queue").and_then(|v| v.as_text()),
            _ => None,
        }),
        _ => None,
    };
    if due_at_ms.is_some_and(|due| due > now_ms) {
        let from = last_queue.map_or_else(|| "on entry".to_string(), |queue| format!("last in {queue}"));
        return Some(format!("parked before its due time ({from}): a delay level on its way was missing; replay sends it round again for its due time"));
    }
    let last_queue = last_queue?;
    if header_text(delivery, ID_HEADER).is_some() {
        return Some(format!(
            "unroutable after its delay (last in {last_queue}): its strategy is cancellable, and its release queue was gone (a serving host declares it)"
        ));
    }
    Some(format!("unroutable after its delay (last in {last_queue}): the destination queue was gone"))
}

/// What `replay` or `drop` did to one queue.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Handled {
    pub queue: String,
    pub done: u64,
    /// Of `done`, those replay sent round their strategy again because they were not due yet.
    pub rescheduled: u64,
    /// Of `done`, those replay handed to their cancellable strategy's release
    /// queue, whose consumer claims each in the cancellation log and drops it
    /// if it was cancelled.
    pub released: u64,
    /// Given back, with why (the first reason seen).
    pub left: u64,
    pub why_left: Option<String>,
}

/// Up to `limit` messages of `queue`, taken and given back.
pub async fn list(taker: &Taker, queue: &str, limit: usize) -> Result<Vec<ParkedMessage>, ExecutorError> {
    let taken = taker.take(queue, limit).await?;
    let now_ms = unix_now_ms();
    let listed = taken.iter().map(|t| ParkedMessage::of(&t.delivery, now_ms)).collect();
    for message in taken {
        taker.give_back(message).await?;
    }
    Ok(listed)
}

/// Which messages an operation touches: all, or those with this message id.
fn selected(delivery: &Delivery, id: Option<&str>) -> bool {
    id.is_none_or(|id| delivery.properties.message_id.as_deref() == Some(id))
}

/// What became of a message that is then acked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Done {
    Forwarded,
    Rescheduled,
    Released,
    Dropped,
}

/// Takes every message of `queue` once, applies `act` to the selected ones
/// (`Ok`: done, ack it; `Err`: give it back), then gives back the rest.
async fn each_message(
    taker: &Taker,
    queue: &str,
    id: Option<&str>,
    mut act: impl AsyncFnMut(&Delivery) -> Result<Done, Left>,
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
                    Ok(done) => {
                        taker.ack(message).await?;
                        handled.done += 1;
                        match done {
                            Done::Rescheduled => handled.rescheduled += 1,
                            Done::Released => handled.released += 1,
                            Done::Forwarded | Done::Dropped => {}
                        }
                    }
                    Err(why) => {
                        handled.left += 1;
                        handled.why_left.get_or_insert(why.to_string());
                        kept.push(message);
                    }
                }
            }
        }
    }
    .await;
    taker.give_back_all(kept).await;
    result.map(|()| handled)
}

/// Why a parked message stays where it is.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Left {
    /// What it needs is gone or refuses it (its destination, its release
    /// queue, its strategy), or it lacks what replay needs: an operator's
    /// matter, named.
    #[error("{0}")]
    Stays(String),
    /// The broker could not answer now: try again later.
    #[error("{0}")]
    NotNow(String),
}

impl Left {
    fn of_send(e: ExecutorError, why: impl FnOnce(&ExecutorError) -> String) -> Left {
        match e {
            ExecutorError::Unavailable(_) => Left::NotNow(why(&e)),
            _ => Left::Stays(why(&e)),
        }
    }
}

/// Publishes each selected message again: an invalid one to the ingress
/// queue; a parked one, if it is due, to its destination queue, or to the
/// release queue when the strategy that owns `parking` is cancellable (its
/// own parking queue and its release queue's `.parked` alike); and otherwise
/// (a delay level on its way was missing, or a reschedule failed) through
/// that strategy again, due when it was. That scheduling declares the
/// strategy's topology on the scheduler's first use of it, the missing level
/// included.
pub async fn replay(scheduler: &Scheduler<Broker>, taker: &Taker, parking: &ParkingQueue, ingress: &str, id: Option<&str>) -> Result<Handled, ExecutorError> {
    let mut destinations = Destinations::new(scheduler);
    each_message(taker, &parking.queue, id, async |delivery: &Delivery| {
        if parking.kind == "invalid" {
            return forward(scheduler, delivery, ingress).await.map(|()| Done::Forwarded);
        }
        replay_parked(scheduler, &mut destinations, parking, delivery).await
    })
    .await
}

/// Replays one message of a strategy's parking queue (see [`replay`]):
/// what `parked replay` does to each, and what a serving host does to each
/// as it is parked. Never early: one not due yet goes round its strategy.
pub async fn replay_parked(
    scheduler: &Scheduler<Broker>,
    destinations: &mut Destinations<'_>,
    parking: &ParkingQueue,
    delivery: &Delivery,
) -> Result<Done, Left> {
    let target = header_text(delivery, TARGET_HEADER).ok_or_else(|| Left::Stays(format!("no {TARGET_HEADER} header: replay it by hand")))?;
    match (due_at(delivery).filter(|due| *due > scheduler.clock().earliest_ms()), &parking.release_queue) {
        // Forwarded now, it would arrive early.
        (Some(due), _) => reschedule(scheduler, delivery, parking.strategy.as_deref(), due).await,
        // Forwarded straight on, it could be a message cancelled meanwhile.
        (None, Some(release_queue)) => release(scheduler, destinations, delivery, release_queue, &target).await,
        (None, None) => {
            destinations.check(&target).await?;
            forward(scheduler, delivery, &target).await.map(|()| Done::Forwarded)
        }
    }
}

/// Whether destination queues can take messages, asked before a due message
/// is sent on (so one still gone stays parked naming it): the scheduler's own check
/// (a queue whose node cannot answer now is not taken for a missing one),
/// each queue asked once per replay.
pub struct Destinations<'s> {
    scheduler: &'s Scheduler<Broker>,
    known: HashMap<String, Result<(), Left>>,
}

impl<'s> Destinations<'s> {
    pub fn new(scheduler: &'s Scheduler<Broker>) -> Destinations<'s> {
        Destinations { scheduler, known: HashMap::new() }
    }

    async fn check(&mut self, queue: &str) -> Result<(), Left> {
        if let Some(known) = self.known.get(queue) {
            return known.clone();
        }
        let checked = self.scheduler.executor().check_destination(queue).await.map_err(|e| match e {
            ExecutorError::Refused(why) => Left::Stays(format!("its destination cannot take it: {why}")),
            other => Left::of_send(other, ToString::to_string),
        });
        self.known.insert(queue.to_string(), checked.clone());
        checked
    }
}

/// Hands a due message of a cancellable strategy to its release queue. The
/// release consumer there makes the one decision that lets a message go: it
/// claims the id in the cancellation log, forwards it only if it was not
/// cancelled, and waits while the log cannot answer. Its destination is
/// checked first: were it gone, the message would only come back parked
/// while replay counted it released. One deleted between the check and the
/// hand-over is parked again in `<release queue>.parked` with its reason:
/// still there to see, never lost.
async fn release(
    scheduler: &Scheduler<Broker>,
    destinations: &mut Destinations<'_>,
    delivery: &Delivery,
    release_queue: &str,
    target: &str,
) -> Result<Done, Left> {
    if header_text(delivery, ID_HEADER).is_none() {
        return Err(Left::Stays(format!("no {ID_HEADER} header, so the cancellation log cannot be asked about it: replay it by hand")));
    }
    destinations.check(target).await.map_err(|left| match left {
        Left::Stays(why) => Left::Stays(format!("{why} (so it was not sent through its release queue)")),
        not_now => not_now,
    })?;
    forward(scheduler, delivery, release_queue).await.map(|()| Done::Released).map_err(|left| match left {
        Left::Stays(why) => {
            Left::Stays(format!("{why} (its strategy is cancellable, so it is replayed through its release queue, which a serving host declares)"))
        }
        not_now => not_now,
    })
}

/// Publishes the message as it is (without the reasons it was set aside for) to `queue`, confirmed.
async fn forward(scheduler: &Scheduler<Broker>, delivery: &Delivery, queue: &str) -> Result<(), Left> {
    let mut properties = delivery.properties.clone();
    properties.headers.retain(|name, _| name != PARKED_REASON_HEADER && name != INVALID_REASON_HEADER);
    let publish = [Command::forward("", queue)];
    let envelope = Envelope {
        id: properties.message_id.clone().unwrap_or_default(),
        body: delivery.body.clone(),
        headers: FieldTable::new(),
        properties,
        stamp_message_id: false,
    };
    scheduler.executor().send(&publish, &envelope).await.map_err(|e| Left::of_send(e, |e| format!("to {queue}: {e}")))
}

/// Schedules a message parked before its due time through `strategy` again, due at `due_at_ms`.
async fn reschedule(scheduler: &Scheduler<Broker>, delivery: &Delivery, strategy: Option<&str>, due_at_ms: u64) -> Result<Done, Left> {
    let not_due = format!("not due until {}", humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(due_at_ms)));
    let Some(strategy) = strategy else {
        return Err(Left::Stays(format!("{not_due} and no strategy of this config parks in {}: replay it after its due time", delivery.queue)));
    };
    let request = ScheduleRequest::again(delivery, strategy, due_at_ms).map_err(|why| Left::Stays(format!("{not_due}; {why}: replay it by hand")))?;
    scheduler.schedule(request).await.map(|_| Done::Rescheduled).map_err(|e| {
        let why = format!("{not_due}; rescheduling it through strategy {strategy:?} failed: {e}");
        match e {
            ScheduleError::Broker(ExecutorError::Unavailable(_)) => Left::NotNow(why),
            _ => Left::Stays(why),
        }
    })
}

/// Acks (deletes) each selected message.
pub async fn drop(taker: &Taker, queue: &str, id: Option<&str>) -> Result<Handled, ExecutorError> {
    each_message(taker, queue, id, async |_: &Delivery| Ok(Done::Dropped)).await
}

/// `hourglass parked` on RabbitMQ: `action` on this config's parking,
/// orphan, release-parked and invalid queues (or the one it names).
pub async fn parked_command(settings: &RabbitMqSettings, config: &Config, strategies: Strategies, action: &ParkedAction) -> Result<Verdict, CommandError> {
    let scheduler = Scheduler::new(config, strategies, super::connect(settings).await?.into());
    let mut queues = parking_queues(config, &scheduler);
    if let Some(wanted) = action.queue() {
        queues.retain(|q| q.queue == wanted);
        if queues.is_empty() {
            let known = parking_queues(config, &scheduler).into_iter().map(|q| q.queue).collect::<Vec<_>>().join(", ");
            let reason = format!("{wanted:?} is not a parking or invalid queue of this config (they are: {known})");
            return Err(CommandError::Argument { argument: "queue", reason });
        }
    }
    let taker = Taker::open(&settings.url).await?;
    let verdict = parked_on(&scheduler, &taker, config, queues, action).await;
    taker.close().await;
    verdict
}

async fn parked_on(
    scheduler: &Scheduler<Broker>,
    taker: &Taker,
    config: &Config,
    queues: Vec<ParkingQueue>,
    action: &ParkedAction,
) -> Result<Verdict, CommandError> {
    // A queue no host declared yet (an orphan queue before the first serve, say) holds nothing.
    let mut declared = Vec::with_capacity(queues.len());
    for queue in queues {
        match taker.depth(&queue.queue).await? {
            Some(_) => declared.push(queue),
            None if action.queue().is_some() => {
                return Err(CommandError::Argument {
                    argument: "queue",
                    reason: format!("{:?} does not exist on the broker (a serving host declares it)", queue.queue),
                });
            }
            None => {}
        }
    }
    match action {
        ParkedAction::List { limit, .. } => {
            let mut all = Vec::new();
            for queue in &declared {
                all.extend(list(taker, &queue.queue, *limit).await?);
            }
            let rows: Vec<Vec<String>> = all
                .iter()
                .map(|m| {
                    let text = |value: &Option<String>| value.clone().unwrap_or_default();
                    vec![m.queue.clone(), text(&m.message_id), text(&m.destination), text(&m.reason)]
                })
                .collect();
            let table = format!(
                "{}{} set-aside messages shown (at most {limit} per queue)\n",
                render::table(&["QUEUE", "MESSAGE ID", "DESTINATION", "REASON"], &rows),
                all.len()
            );
            let json = serde_json::to_value(&all).map_err(|e| CommandError::failed("writing the report", e))?;
            Ok(Verdict { passed: true, table, json })
        }
        ParkedAction::Replay { id, .. } => {
            let mut results = Vec::new();
            for queue in &declared {
                results.push(replay(scheduler, taker, queue, &config.service.ingress.queue, id.as_deref()).await?);
            }
            handled("replayed", results, true)
        }
        ParkedAction::Drop { id, .. } => {
            let mut results = Vec::new();
            for queue in &declared {
                results.push(drop(taker, &queue.queue, id.as_deref()).await?);
            }
            handled("dropped", results, false)
        }
    }
}

/// One line per queue touched; passed when no selected message stayed.
/// With `split`, how many went round their strategy again (not due yet), how
/// many to a release queue (a cancellable strategy's) and how many straight on.
fn handled(verb: &str, results: Vec<Handled>, split: bool) -> Result<Verdict, CommandError> {
    let how = |h: &Handled| {
        if !split {
            return String::new();
        }
        // Only a cancellable strategy's messages go there: said when it happened, not on every replay.
        let released = if h.released > 0 { format!("{} to their release queue, where the cancellation log decides, ", h.released) } else { String::new() };
        format!(" ({} rescheduled for their due time, {released}{} forwarded)", h.rescheduled, h.done - h.rescheduled - h.released)
    };
    let mut table = String::new();
    for handled in results.iter().filter(|h| h.done > 0 || h.left > 0) {
        let done = format!("{}: {verb} {}{}", handled.queue, handled.done, how(handled));
        match &handled.why_left {
            Some(why) => table.push_str(&format!("{done}, {} left ({why})\n", handled.left)),
            None => table.push_str(&format!("{done}\n")),
        }
    }
    let total = results.iter().fold(Handled::default(), |total, h| Handled {
        done: total.done + h.done,
        rescheduled: total.rescheduled + h.rescheduled,
        released: total.released + h.released,
        left: total.left + h.left,
        ..total
    });
    table.push_str(&format!("{verb} {} messages{}; {} left in place\n", total.done, how(&total), total.left));
    let json = serde_json::to_value(&results).map_err(|e| CommandError::failed("writing the report", e))?;
    Ok(Verdict { passed: total.left == 0, table, json })
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::message::Headers;
    use crate::scheduler::validate;

    const NOW: u64 = 1_000_000;

    fn parked(headers: &[(&str, HeaderValue)]) -> Delivery {
        let mut delivery = Delivery { queue: "hourglass.parked".into(), body: b"body".to_vec(), ..Default::default() };
        delivery.properties.headers = headers.iter().map(|(name, value)| (name.to_string(), value.clone())).collect();
        delivery
    }

    fn died_in(queue: &str) -> (&'static str, HeaderValue) {
        let death: Headers = [("queue".to_string(), HeaderValue::text(queue)), ("reason".to_string(), HeaderValue::text("expired"))].into();
        ("x-death", HeaderValue::Array(vec![HeaderValue::Table(death)]))
    }

    fn due(at: u64) -> (&'static str, HeaderValue) {
        (DUE_AT_HEADER, HeaderValue::I64(at as i64))
    }

    fn reason(headers: &[(&str, HeaderValue)]) -> Option<String> {
        ParkedMessage::of(&parked(headers), NOW).reason
    }

    #[test]
    fn a_message_parked_before_its_due_time_says_a_level_was_missing_and_where_it_came_from() {
        let on_the_way = reason(&[due(NOW + 2_000), died_in("hourglass.direct-level-02")]).unwrap();
        assert!(on_the_way.starts_with("parked before its due time (last in hourglass.direct-level-02)"), "{on_the_way}");
        assert!(on_the_way.contains("a delay level on its way was missing"), "{on_the_way}");
        assert!(!on_the_way.contains("destination queue was gone"), "{on_the_way}");
        let on_entry = reason(&[due(NOW + 2_000)]).unwrap();
        assert!(on_entry.starts_with("parked before its due time (on entry)"), "{on_entry}");
    }

    #[test]
    fn a_message_past_or_without_its_due_time_was_parked_because_its_destination_was_gone() {
        for headers in [vec![due(NOW), died_in("hourglass.direct-level-00")], vec![died_in("hourglass.direct-level-00")]] {
            let reason = reason(&headers).unwrap();
            assert_eq!(reason, "unroutable after its delay (last in hourglass.direct-level-00): the destination queue was gone");
        }
        assert_eq!(reason(&[due(NOW - 1)]), None, "no death record and no reason of hourglass's: nothing to say");
        let own = reason(&[due(NOW + 2_000), (PARKED_REASON_HEADER, HeaderValue::text("destination \"d\": gone"))]);
        assert_eq!(own.as_deref(), Some("destination \"d\": gone"), "hourglass's own reason comes first");
    }

    #[test]
    fn a_cancellable_strategys_message_parked_after_its_delay_says_its_release_queue_was_gone() {
        let after = reason(&[due(NOW - 1), died_in("hourglass.direct-level-00"), (ID_HEADER, HeaderValue::text("id-1"))]).unwrap();
        assert!(after.starts_with("unroutable after its delay (last in hourglass.direct-level-00)"), "{after}");
        assert!(after.contains("release queue was gone"), "{after}");
        assert!(!after.contains("destination queue was gone"), "the destination was never tried: {after}");
        let not_due = reason(&[due(NOW + 2_000), died_in("hourglass.direct-level-02"), (ID_HEADER, HeaderValue::text("id-1"))]).unwrap();
        assert!(not_due.contains("a delay level on its way was missing"), "before its due time it is still a level: {not_due}");
    }

    #[test]
    fn a_rescheduled_message_keeps_body_properties_and_id_without_what_validation_refuses() {
        let mut delivery = parked(&[
            due(NOW + 2_000),
            died_in("hourglass.direct-level-02"),
            ("x-first-death-reason", HeaderValue::text("expired")),
            (TARGET_HEADER, HeaderValue::text("orders")),
            (ID_HEADER, HeaderValue::text("id-1")),
            ("CC", HeaderValue::Array(vec![HeaderValue::text("elsewhere")])),
            ("tenant", HeaderValue::text("acme")),
        ]);
        delivery.properties.message_id = Some("id-1".into());
        let mut request = ScheduleRequest::again(&delivery, "main", NOW + 2_000).unwrap();
        assert_eq!(request.properties.headers.keys().collect::<Vec<_>>(), vec!["tenant"]);
        assert_eq!(request.properties.message_id.as_deref(), Some("id-1"));
        assert_eq!((request.destination.as_str(), request.deliver_at_ms, request.strategy.as_deref()), ("orders", Some(NOW + 2_000), Some("main")));
        assert_eq!((request.body.as_slice(), request.id.as_deref()), (&b"body"[..], Some("id-1")));
        assert_eq!(validate::check(&mut request, &HashSet::new()), Ok(()));
    }
}
