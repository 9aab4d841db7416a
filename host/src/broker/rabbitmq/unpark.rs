//! A strategy's parking queue, taken from as messages arrive: "parked" means
//! gone, so what the broker parked while its destination still existed goes
//! on without an operator.
//!
//! The broker parks a message when a dead-letter or a hold exchange routes it
//! nowhere. Mostly its destination was deleted; but a broker that restarts
//! dead-letters expiring messages before it has recovered every binding and
//! queue, and parks messages whose destination exists the whole time. Each
//! message is replayed as `hourglass parked replay` would
//! ([`parked::replay_parked`]):
//!
//! * due, destination there: forwarded to it (a confirmed, mandatory publish);
//!   a cancellable strategy's through its release queue, so a cancel still wins;
//! * not due yet (a level on its way was missing): the strategy's topology is
//!   declared again, then the message goes round it for its due time;
//! * the broker cannot answer now: requeued after a pause;
//! * its destination (or release queue) is really gone, it carries no
//!   `hourglass-target`, or it came back [`MAX_SENDS`] times: moved to
//!   `<parking queue>.orphaned` with the reason, where `parked list` shows it
//!   and `parked replay` sends it on once the destination is back.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::broker::rabbitmq::parked::{self, Destinations, Done, Left, ParkingQueue};
use crate::broker::rabbitmq::release_queue_declaration;
use crate::command::Command;
use crate::executor::Broker;
use crate::headers::{ID_HEADER, PARKED_REASON_HEADER};
use crate::message::{Delivery, Handler, Outcome, Settled};
use crate::recent::RecentCounts;
use crate::scheduler::Scheduler;

/// Times one host sends a message on before it takes the message's return
/// for a fault that sending cannot mend (a level that stays missing).
pub const MAX_SENDS: u32 = 3;
/// Messages whose sends are remembered at once; the oldest is forgotten first.
const SENDS_REMEMBERED: usize = 4_096;
/// A not-due message's strategy topology is declared again at most this often.
const REDECLARE_EVERY: Duration = Duration::from_secs(5);

/// What happened to one message, for the metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unparked {
    Forwarded,
    Released,
    Rescheduled,
    Orphaned,
    Requeued,
}

impl Unparked {
    pub fn label(self) -> &'static str {
        match self {
            Unparked::Forwarded => "forwarded",
            Unparked::Released => "released",
            Unparked::Rescheduled => "rescheduled",
            Unparked::Orphaned => "orphaned",
            Unparked::Requeued => "requeued",
        }
    }
}

pub(crate) struct Unpark {
    parking: ParkingQueue,
    orphans: String,
    prefetch: u16,
    scheduler: Arc<Scheduler<Broker>>,
    sends: Mutex<Sends>,
    redeclared: Mutex<Option<Instant>>,
}

impl Unpark {
    pub fn new(parking: ParkingQueue, prefetch: u16, scheduler: Arc<Scheduler<Broker>>) -> Arc<Unpark> {
        let orphans = parked::orphan_queue(&parking.queue);
        Arc::new(Unpark { parking, orphans, prefetch, scheduler, sends: Default::default(), redeclared: Default::default() })
    }

    fn strategy(&self) -> &str {
        self.parking.strategy.as_deref().unwrap_or_default()
    }

    fn orphan(&self, reason: &str) -> (Outcome, Unparked) {
        tracing::warn!(queue = %self.parking.queue, %reason, "a parked message cannot go on; moved to {}", self.orphans);
        (Outcome::move_to(&self.orphans, PARKED_REASON_HEADER, reason), Unparked::Orphaned)
    }

    /// A message parked before its due time met a missing level: declare the
    /// strategy's topology again (at most every [`REDECLARE_EVERY`]) so its
    /// next round finds every level.
    async fn redeclare_topology(&self) {
        {
            let mut last = self.redeclared.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|at| at.elapsed() < REDECLARE_EVERY) {
                return;
            }
            *last = Some(Instant::now());
        }
        if let Err(err) = self.scheduler.apply_topology(self.strategy()).await {
            tracing::warn!(strategy = %self.strategy(), error = %err, "declaring the strategy's topology again failed");
        }
    }
}

impl Handler for Unpark {
    type Note = Unparked;

    fn queue(&self) -> &str {
        &self.parking.queue
    }

    fn prefetch(&self) -> u16 {
        self.prefetch
    }

    /// The orphan queue, and the strategy's topology (its parking queue among
    /// it): a strategy not used yet since the start or the reload that added
    /// it has declared nothing, and its parking queue must be consumed all the same.
    fn declarations(&self) -> Vec<Command> {
        let mut declarations = self.scheduler.topology_of(self.strategy()).unwrap_or_default();
        declarations.push(release_queue_declaration(&self.orphans));
        declarations
    }

    async fn handle(&self, delivery: &Delivery) -> (Outcome, Unparked) {
        if let Some(reason) = delivery.properties.headers.get(PARKED_REASON_HEADER).and_then(|v| v.as_text()) {
            // Set aside by hourglass itself, for a reason of its own: an operator's.
            return self.orphan(&reason);
        }
        let sent = self.sends.lock().unwrap_or_else(|p| p.into_inner()).count(delivery);
        if sent > MAX_SENDS {
            return self.orphan(&format!("parked again after it was sent on {MAX_SENDS} times; replay it by hand once the strategy's topology is whole"));
        }
        let not_due = parked::due_at(delivery).is_some_and(|due| due > self.scheduler.clock().earliest_ms());
        if not_due {
            self.redeclare_topology().await;
        }
        let mut destinations = Destinations::new(&self.scheduler);
        match parked::replay_parked(&self.scheduler, &mut destinations, &self.parking, delivery).await {
            Ok(Done::Released) => (Outcome::Ack, Unparked::Released),
            Ok(Done::Rescheduled) => (Outcome::Ack, Unparked::Rescheduled),
            Ok(Done::Forwarded | Done::Dropped) => (Outcome::Ack, Unparked::Forwarded),
            Err(Left::NotNow(why)) => {
                tracing::warn!(queue = %self.parking.queue, %why, "could not send a parked message on now; holding it to try again");
                // Asked again in hand, not parked again: this send does not count.
                self.sends.lock().unwrap_or_else(|p| p.into_inner()).uncount(delivery);
                (Outcome::Retry, Unparked::Requeued)
            }
            Err(Left::Stays(why)) => self.orphan(&why),
        }
    }

    fn poisoned(&self, _delivery: &Delivery, reason: &str) -> Outcome {
        Outcome::move_to(&self.orphans, PARKED_REASON_HEADER, reason)
    }

    fn settled(&self, note: Option<Unparked>, _outcome: &Outcome, settled: &Settled) {
        let outcome = match (note, settled) {
            (_, Settled::Requeued | Settled::MoveFailed(_)) | (None, _) => Unparked::Requeued,
            (Some(note), _) => note,
        };
        super::metrics::count_unparked(self.scheduler.metrics(), self.strategy(), outcome.label());
    }
}

/// How many times this host has taken each message from the parking queue,
/// bounded: a message is known by its id (`hourglass-id`, else its message
/// id); one with neither is not counted (only a level that stays missing
/// brings a message back, and such a message is sent on no more than any other).
struct Sends(RecentCounts<String>);

impl Default for Sends {
    fn default() -> Self {
        Sends(RecentCounts::new(SENDS_REMEMBERED))
    }
}

impl Sends {
    /// A message is known by hourglass's id, else by its message id.
    fn id_of(delivery: &Delivery) -> Option<String> {
        delivery.properties.headers.get(ID_HEADER).and_then(|v| v.as_text()).or_else(|| delivery.properties.message_id.clone())
    }

    fn count(&mut self, delivery: &Delivery) -> u32 {
        let Some(id) = Sends::id_of(delivery) else { return 1 };
        let count = self.0.entry(id);
        *count += 1;
        *count
    }

    /// Takes back the last [`Sends::count`] of this message.
    fn uncount(&mut self, delivery: &Delivery) {
        if let Some(count) = Sends::id_of(delivery).and_then(|id| self.0.get_mut(&id)) {
            *count = count.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_id(id: &str) -> Delivery {
        let mut delivery = Delivery::default();
        delivery.properties.message_id = Some(id.to_string());
        delivery
    }

    #[test]
    fn sends_are_counted_per_message_and_the_oldest_is_forgotten_first() {
        let mut sends = Sends::default();
        assert_eq!(sends.count(&with_id("a")), 1);
        assert_eq!(sends.count(&with_id("a")), 2);
        assert_eq!(sends.count(&with_id("b")), 1, "another message counts apart");
        assert_eq!(sends.count(&Delivery::default()), 1, "one without an id is never counted up");
        assert_eq!(sends.count(&Delivery::default()), 1);
        sends.uncount(&with_id("a"));
        assert_eq!(sends.count(&with_id("a")), 2, "a retry in hand takes its count back");
        for n in 0..SENDS_REMEMBERED {
            sends.count(&with_id(&format!("filler-{n}")));
        }
        assert!(sends.0.len() <= SENDS_REMEMBERED);
        assert_eq!(sends.count(&with_id("a")), 1, "forgotten once SENDS_REMEMBERED others came after it");
    }
}
