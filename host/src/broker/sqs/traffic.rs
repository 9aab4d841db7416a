//! What a stream of messages costs on SQS: the host's batcher and pumps
//! walked event by event over a traffic shape, counting requests by action
//! as SQS bills them.
//!
//! [`super::cost::cohort_requests`] follows messages scheduled together.
//! Producers mostly trickle, and then how many messages share a request
//! depends on the traffic and the host's settings: first sends that meet
//! within the send window leave as one batch; a pump receives what became
//! visible since its last receive (pausing for its linger after a partial
//! one), sends what goes around again as bundles and hands the due ones over
//! in one batch per destination, then deletes what it received. With a delay
//! queue per destination each queue sees its share of the rate; with one
//! shared by the strategy (`delay_queue`) every visit sees all of them.
//!
//! Time is the requests' round trip, which the caller gives: tens of ms on
//! SQS, more on a loaded local server. Visibility-timeout extensions (a batch
//! in hand for over half its timeout) and retries are left out.

use std::collections::{BTreeMap, VecDeque};

use serde::Serialize;

use super::cost::{BUNDLED_OVERHEAD_BYTES, SQS_BATCH, billed, messages_per_bundle, sends};

/// How long a pump's receive waits for a message (SQS's longest long poll).
const LONG_POLL_MS: f64 = 20_000.0;

/// Messages arriving one by one, evenly spaced, each to the next destination in turn.
#[derive(Clone, Debug)]
pub struct Traffic {
    pub messages: u64,
    /// Messages a second; `f64::INFINITY` schedules them all at once.
    pub rate_per_second: f64,
    pub destinations: u64,
    /// Body and attributes of one message.
    pub message_bytes: u64,
}

/// What the host and the strategy do with them.
#[derive(Clone, Debug)]
pub struct Handling {
    /// One delay queue for all destinations (`delay_queue`), or one each.
    pub shared_delay_queue: bool,
    /// `broker.send_batch_window`.
    pub send_window_ms: f64,
    /// `service.pump_linger`.
    pub linger_ms: f64,
    /// One request there and back.
    pub round_trip_ms: f64,
    /// How often a waiting long poll looks for a message that became visible,
    /// unless a send to the queue wakes it sooner: 0 (at once) on SQS; moto
    /// looks each second.
    pub notice_ms: f64,
    /// How long a message waits in the delay queue per visit (the cycle).
    pub cycle_ms: f64,
    /// Pump visits each message gets, the last a hand-over (from its simulated route).
    pub pump_visits: u64,
}

/// Billed requests by action.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Requests {
    pub send_message_batch: u64,
    /// Receives that brought messages.
    pub receive_message: u64,
    /// Long polls that ended with nothing: a pump's idle cost, per queue and
    /// not per message, but billed all the same.
    pub empty_receive_message: u64,
    pub delete_message_batch: u64,
}

impl Requests {
    pub fn total(&self) -> u64 {
        self.send_message_batch + self.receive_message + self.empty_receive_message + self.delete_message_batch
    }

    /// Requests per message per pump visit, first sends included: the figure BENCHMARKS reports.
    pub fn per_message_per_cycle(&self, messages: u64, pump_visits: u64) -> f64 {
        self.total() as f64 / (messages * pump_visits.max(1)).max(1) as f64
    }

    fn add(&mut self, other: &Requests) {
        self.send_message_batch += other.send_message_batch;
        self.receive_message += other.receive_message;
        self.empty_receive_message += other.empty_receive_message;
        self.delete_message_batch += other.delete_message_batch;
    }
}

/// The requests `traffic` costs when handled so, summed over its delay queues.
pub fn requests(traffic: &Traffic, handling: &Handling) -> Requests {
    let arrivals: Vec<(f64, u64)> = (0..traffic.messages)
        .map(|n| {
            let at = if traffic.rate_per_second.is_finite() { n as f64 * 1_000.0 / traffic.rate_per_second } else { 0.0 };
            (at, n % traffic.destinations.max(1))
        })
        .collect();
    let queues: Vec<Vec<(f64, u64)>> = if handling.shared_delay_queue {
        vec![arrivals]
    } else {
        (0..traffic.destinations.max(1)).map(|d| arrivals.iter().copied().filter(|(_, to)| *to == d).collect()).collect()
    };
    let mut total = Requests::default();
    for arrivals in queues.iter().filter(|a| !a.is_empty()) {
        total.add(&one_queue(arrivals, traffic.message_bytes, handling));
    }
    total
}

/// A message's destination and the pump visits still to come.
type Carried = (u64, u64);

/// One SQS message in the delay queue: a message alone, or a bundle.
struct Queued {
    visible_at: f64,
    carried: Vec<Carried>,
}

impl Queued {
    fn bytes(&self, message_bytes: u64) -> u64 {
        bundle_bytes(self.carried.len() as u64, message_bytes)
    }
}

fn bundle_bytes(messages: u64, message_bytes: u64) -> u64 {
    if messages == 1 { message_bytes } else { messages * (message_bytes + BUNDLED_OVERHEAD_BYTES) }
}

/// The batcher's first sends, then the one pump of the queue until it is empty.
fn one_queue(arrivals: &[(f64, u64)], message_bytes: u64, handling: &Handling) -> Requests {
    let mut requests = Requests::default();
    let mut queued: Vec<Queued> = Vec::new();
    // When first sends reached the queue: each wakes a waiting long poll.
    let mut first_sends: Vec<f64> = Vec::new();
    // First sends: a batch opens with its first message and leaves when full or when the window closes.
    let mut pending = arrivals.iter().copied().peekable();
    while let Some((opened, first)) = pending.next() {
        let mut batch = vec![first];
        let mut closes = opened + handling.send_window_ms;
        while batch.len() < SQS_BATCH as usize {
            match pending.peek() {
                Some((at, to)) if *at <= closes => {
                    batch.push(*to);
                    closes = if batch.len() == SQS_BATCH as usize { *at } else { closes };
                    pending.next();
                }
                _ => break,
            }
        }
        requests.send_message_batch += sends(&vec![message_bytes; batch.len()]);
        first_sends.push(closes + handling.round_trip_ms);
        let visible_at = closes + handling.round_trip_ms + handling.cycle_ms;
        queued.extend(batch.into_iter().map(|to| Queued { visible_at, carried: vec![(to, handling.pump_visits)] }));
    }
    if handling.pump_visits == 0 {
        return requests;
    }
    let per_bundle = messages_per_bundle(message_bytes);
    let mut queue: VecDeque<Queued> = {
        queued.sort_by(|a, b| a.visible_at.total_cmp(&b.visible_at));
        queued.into()
    };
    let mut now = arrivals.first().map_or(0.0, |(at, _)| *at);
    while let Some(next) = queue.front().map(|q| q.visible_at) {
        // A receive that finds nothing waits up to a long poll for the next message.
        if next > now {
            let polls_that_end_empty = ((next - now) / LONG_POLL_MS).floor();
            requests.empty_receive_message += polls_that_end_empty as u64;
            let started = now + polls_that_end_empty * LONG_POLL_MS;
            now = noticed(next, started, handling.notice_ms, &first_sends);
        }
        let mut received = Vec::new();
        while received.len() < SQS_BATCH as usize && queue.front().is_some_and(|q| q.visible_at <= now) {
            received.extend(queue.pop_front());
        }
        requests.receive_message += billed(received.iter().map(|q| q.bytes(message_bytes)).sum());
        now += handling.round_trip_ms;
        let (due, again): (Vec<Carried>, Vec<Carried>) = received.iter().flat_map(|q| q.carried.iter().copied()).partition(|(_, visits)| *visits == 1);
        // Hand-overs: one batch (or more) per destination, all at once.
        let mut by_destination: BTreeMap<u64, u64> = BTreeMap::new();
        for (to, _) in &due {
            *by_destination.entry(*to).or_default() += 1;
        }
        for count in by_destination.values() {
            requests.send_message_batch += sends(&vec![message_bytes; *count as usize]);
        }
        if !due.is_empty() {
            now += handling.round_trip_ms;
        }
        // Around again: in bundles of as many as fit.
        if !again.is_empty() {
            let bundles: Vec<Vec<Carried>> =
                again.chunks(per_bundle as usize).map(|chunk| chunk.iter().map(|(to, visits)| (*to, visits - 1)).collect()).collect();
            requests.send_message_batch += sends(&bundles.iter().map(|b| bundle_bytes(b.len() as u64, message_bytes)).collect::<Vec<_>>());
            now += handling.round_trip_ms;
            let visible_at = now + handling.cycle_ms;
            let at = queue.partition_point(|q| q.visible_at <= visible_at);
            for (n, carried) in bundles.into_iter().enumerate() {
                queue.insert(at + n, Queued { visible_at, carried });
            }
        }
        requests.delete_message_batch += 1;
        now += handling.round_trip_ms;
        if received.len() < SQS_BATCH as usize {
            now += handling.linger_ms;
        }
    }
    requests
}

/// When a long poll started at `started` returns a message that became
/// visible at `visible`: at its next look, or at the first send after it became
/// visible, whichever is sooner.
fn noticed(visible: f64, started: f64, every: f64, sends: &[f64]) -> f64 {
    if every <= 0.0 {
        return visible;
    }
    let look = started + ((visible - started) / every).ceil() * every;
    let woken = sends.get(sends.partition_point(|at| *at < visible)).copied().unwrap_or(f64::INFINITY);
    look.min(woken)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handling(shared: bool, window_ms: f64, visits: u64) -> Handling {
        Handling {
            shared_delay_queue: shared,
            send_window_ms: window_ms,
            linger_ms: 250.0,
            round_trip_ms: 20.0,
            notice_ms: 0.0,
            cycle_ms: 30_000.0,
            pump_visits: visits,
        }
    }

    fn trickle(messages: u64, rate: f64, destinations: u64) -> Traffic {
        Traffic { messages, rate_per_second: rate, destinations, message_bytes: 100 }
    }

    #[test]
    fn a_lone_message_pays_every_request_itself() {
        let spent = requests(&trickle(1, 20.0, 1), &handling(true, 2.0, 3));
        // One first send, then a receive, a send and a delete on each of three visits; each
        // 30 s wait for the next visit has a long poll that ends empty.
        assert_eq!(spent, Requests { send_message_batch: 4, receive_message: 3, empty_receive_message: 3, delete_message_batch: 3 });
    }

    #[test]
    fn messages_scheduled_at_once_agree_with_the_cohort_estimate() {
        for (messages, visits) in [(30, 3), (1_000, 4), (25, 1)] {
            // With no time passing per request, a visit's messages are all visible together.
            let spent = requests(&trickle(messages, f64::INFINITY, 1), &Handling { round_trip_ms: 0.0, ..handling(true, 2.0, visits) });
            let moving = spent.total() - spent.empty_receive_message;
            assert_eq!(moving, super::super::cost::cohort_requests(messages, visits, 100), "{messages} messages, {visits} visits");
        }
    }

    #[test]
    fn a_wider_send_window_a_shared_queue_and_a_longer_linger_each_make_a_trickle_cheaper() {
        // Issue 34's trickle: 20 msg/s for 60 s to 10 destinations, three visits.
        let traffic = trickle(1_200, 20.0, 10);
        let per = |shared, window, linger_ms| requests(&traffic, &Handling { linger_ms, ..handling(shared, window, 3) }).per_message_per_cycle(1_200, 3);
        let (alone, windowed, shared, lingering) = (per(false, 2.0, 250.0), per(false, 500.0, 250.0), per(true, 500.0, 250.0), per(true, 500.0, 2_000.0));
        // 2 msg/s per destination, 500 ms apart: nearly every request carries one message.
        assert!(alone > 2.5, "{alone}");
        assert!(windowed < alone && shared < windowed && lingering < shared, "{alone} {windowed} {shared} {lingering}");
        // A receive every 250 ms or so sees one first-send batch, and its hand-overs
        // go to most of the ten destinations one message each; pausing 2 s gathers
        // eight times as many for each hand-over.
        assert!(shared > 0.5, "{shared}");
        assert!(lingering < 0.3, "{lingering}");
    }

    #[test]
    fn a_quiet_pump_pays_its_long_polls() {
        // Two messages an hour apart, one visit each (the hand-over): a long poll ends empty
        // before the first is visible (30 s in), then 179 in the hour between them.
        let traffic = Traffic { messages: 2, rate_per_second: 1.0 / 3_600.0, destinations: 1, message_bytes: 100 };
        let spent = requests(&traffic, &handling(true, 2.0, 1));
        assert_eq!(spent.send_message_batch, 2 + 2);
        assert_eq!(spent.delete_message_batch, 2);
        assert_eq!((spent.receive_message, spent.empty_receive_message), (2, 1 + 179), "{spent:?}");
    }
}
