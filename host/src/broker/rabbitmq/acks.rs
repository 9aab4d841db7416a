//! Acknowledgements of one consume channel, coalesced: one `basic.ack` with
//! `multiple` for every finished delivery below the oldest one still in hand.
//!
//! Why: each ack is a frame the broker handles and a round through lapin's
//! I/O thread; under load many deliveries finish together, and one ack can
//! carry them all (BENCHMARKS.md, "Ingress drain").
//!
//! A multiple ack covers every outstanding delivery tag up to its own, so it
//! is only ever sent for tags below the lowest delivery still being handled
//! or settled on its own (a requeue, or an ack sent alone): it can never
//! acknowledge a message before its forward was confirmed. A delivery stuck
//! behind a slow one (a planner call, a broker check) waits at most
//! [`STRAGGLER_WAIT`], then is acked alone, so one slow message does not hold
//! the prefetch window of those behind it. While a delivery is being acked
//! alone it still counts as in hand, so no multiple ack can overtake its own
//! frame (RabbitMQ closes the channel on an ack of an unknown tag).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use lapin::Acker;
use lapin::options::BasicAckOptions;
use tokio::sync::oneshot;

use crate::message::Settled;

/// How long a finished delivery waits for the ones before it to finish, so
/// all go in one ack, before it is acked alone.
pub const STRAGGLER_WAIT: Duration = Duration::from_millis(5);

/// Sends one delivery's ack: alone, or with `multiple`, every outstanding one up to it.
pub trait SendAck: Clone + Send + Sync {
    fn send_ack(&self, multiple: bool) -> impl Future<Output = Settled> + Send;
}

impl SendAck for Acker {
    async fn send_ack(&self, multiple: bool) -> Settled {
        match self.ack(BasicAckOptions { multiple }).await {
            Ok(true) => Settled::Acked,
            _ => Settled::AckLost,
        }
    }
}

/// The acknowledgements of one channel's deliveries (delivery tags are per channel).
pub struct Acks<A = Acker> {
    state: Mutex<State<A>>,
}

impl<A> Default for Acks<A> {
    fn default() -> Self {
        Acks { state: Mutex::new(State { in_hand: BTreeSet::new(), finished: BTreeMap::new(), sending: false }) }
    }
}

struct State<A> {
    /// Deliveries being handled, or being settled on their own.
    in_hand: BTreeSet<u64>,
    /// Finished deliveries waiting for their ack.
    finished: BTreeMap<u64, Waiting<A>>,
    /// Whether a task is sending a multiple ack now (only one at a time, so acks go out in order).
    sending: bool,
}

struct Waiting<A> {
    acker: A,
    reply: oneshot::Sender<Settled>,
}

impl<A: SendAck> Acks<A> {
    /// A delivery arrived; it is in hand until it is acked or settled alone.
    pub fn taken(&self, tag: u64) {
        self.lock().in_hand.insert(tag);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<A>> {
        // Every change is a single insert or remove; a panic elsewhere leaves the state whole.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Acks a finished delivery, with others when they are ready too.
    pub async fn ack(&self, tag: u64, acker: &A) -> Settled {
        let (reply, mut answer) = oneshot::channel();
        {
            let mut state = self.lock();
            state.in_hand.remove(&tag);
            state.finished.insert(tag, Waiting { acker: acker.clone(), reply });
        }
        self.send_ready().await;
        if let Ok(settled) = tokio::time::timeout(STRAGGLER_WAIT, &mut answer).await {
            return settled.unwrap_or(Settled::AckLost);
        }
        // Still waiting behind a slower delivery: ack alone, unless a multiple ack took it meanwhile.
        let alone = {
            let mut state = self.lock();
            match state.finished.remove(&tag) {
                Some(_) => {
                    state.in_hand.insert(tag);
                    true
                }
                None => false,
            }
        };
        if !alone {
            return answer.await.unwrap_or(Settled::AckLost);
        }
        let settled = acker.send_ack(false).await;
        self.settled_alone(tag).await;
        settled
    }

    /// Settles a delivery on its own (a requeue): `settle` runs while the tag
    /// still counts as in hand, so no multiple ack covers it first.
    pub async fn alone<R>(&self, tag: u64, settle: impl Future<Output = R>) -> R {
        let result = settle.await;
        self.settled_alone(tag).await;
        result
    }

    async fn settled_alone(&self, tag: u64) {
        self.lock().in_hand.remove(&tag);
        self.send_ready().await;
    }

    /// Sends one multiple ack for every finished delivery below the lowest
    /// in hand, again while more became ready; returns at once if another
    /// task is sending (it will take what is ready after its own ack).
    async fn send_ready(&self) {
        loop {
            let mut ready = {
                let mut state = self.lock();
                if state.sending {
                    return;
                }
                let ready = match state.in_hand.first().copied() {
                    Some(lowest) => {
                        let above = state.finished.split_off(&lowest);
                        std::mem::replace(&mut state.finished, above)
                    }
                    None => std::mem::take(&mut state.finished),
                };
                if ready.is_empty() {
                    return;
                }
                state.sending = true;
                ready
            };
            let (_, last) = ready.pop_last().expect("not empty");
            let settled = {
                let _sending = Sending(self);
                last.acker.send_ack(true).await
            };
            for waiting in ready.into_values().chain([last]) {
                waiting.reply.send(settled.clone()).ok();
            }
        }
    }
}

/// Clears `sending` however the send ends (a dropped future included).
struct Sending<'a, A: SendAck>(&'a Acks<A>);

impl<A: SendAck> Drop for Sending<'_, A> {
    fn drop(&mut self) {
        self.0.lock().sending = false;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use futures_util::future::join_all;
    use proptest::prelude::*;
    use tokio::time::{Duration, Instant};

    use super::*;

    /// The broker's side of one channel, checking each frame as RabbitMQ would.
    #[derive(Default)]
    struct Channel {
        /// Delivered, not yet acked or requeued.
        outstanding: BTreeSet<u64>,
        /// Deliveries their handler finished with an ack.
        handled: BTreeSet<u64>,
        acked: Vec<u64>,
        frames: Vec<(u64, bool)>,
        /// What the broker would have closed the channel for, or a message acked unhandled.
        faults: Vec<String>,
    }

    impl Channel {
        fn delivered(tags: impl IntoIterator<Item = u64>) -> Arc<Mutex<Channel>> {
            Arc::new(Mutex::new(Channel { outstanding: tags.into_iter().collect(), ..Default::default() }))
        }

        fn ack(&mut self, tag: u64, multiple: bool) {
            self.frames.push((tag, multiple));
            let covered: Vec<u64> = if multiple { self.outstanding.range(..=tag).copied().collect() } else { vec![tag] };
            for tag in covered {
                if !self.outstanding.remove(&tag) {
                    self.faults.push(format!("PRECONDITION_FAILED - unknown delivery tag {tag}"));
                } else if !self.handled.contains(&tag) {
                    self.faults.push(format!("delivery {tag} acked while its handler still had it"));
                }
                self.acked.push(tag);
            }
        }

        fn requeue(&mut self, tag: u64) {
            if !self.outstanding.remove(&tag) {
                self.faults.push(format!("PRECONDITION_FAILED - unknown delivery tag {tag} (requeue)"));
            }
        }
    }

    #[derive(Clone)]
    struct FakeAcker {
        tag: u64,
        channel: Arc<Mutex<Channel>>,
    }

    impl SendAck for FakeAcker {
        async fn send_ack(&self, multiple: bool) -> Settled {
            // On another thread, other tasks may run between the decision to
            // send and the frame taking its place in the channel: for a while
            // that differs from ack to ack.
            for _ in 0..self.tag % 3 {
                tokio::task::yield_now().await;
            }
            self.channel.lock().unwrap().ack(self.tag, multiple);
            // Its round through the I/O thread.
            tokio::task::yield_now().await;
            Settled::Acked
        }
    }

    /// A handler finishing `tag` with an ack, as the consumer carries it out.
    async fn finish(acks: &Acks<FakeAcker>, channel: &Arc<Mutex<Channel>>, tag: u64) -> Settled {
        channel.lock().unwrap().handled.insert(tag);
        acks.ack(tag, &FakeAcker { tag, channel: channel.clone() }).await
    }

    #[tokio::test(start_paused = true)]
    async fn a_delivery_behind_a_slower_one_goes_alone_after_the_wait_and_never_covers_it() {
        let channel = Channel::delivered(1..=3);
        let acks = Acks::default();
        (1..=3).for_each(|tag| acks.taken(tag));
        let started = Instant::now();
        assert_eq!(finish(&acks, &channel, 2).await, Settled::Acked);
        assert_eq!(started.elapsed(), STRAGGLER_WAIT, "waited for 1, then went alone");
        assert_eq!(finish(&acks, &channel, 1).await, Settled::Acked);
        assert_eq!(finish(&acks, &channel, 3).await, Settled::Acked);
        let channel = channel.lock().unwrap();
        assert_eq!(channel.frames, [(2, false), (1, true), (3, true)]);
        assert!(channel.faults.is_empty(), "{:?}", channel.faults);
    }

    #[tokio::test(start_paused = true)]
    async fn deliveries_finishing_together_go_in_one_or_two_acks() {
        let channel = Channel::delivered(1..=64);
        let acks = Acks::default();
        (1..=64).for_each(|tag| acks.taken(tag));
        let settled = join_all((1..=64).map(|tag| finish(&acks, &channel, tag))).await;
        assert!(settled.iter().all(|s| *s == Settled::Acked));
        let channel = channel.lock().unwrap();
        // The first goes at once; the rest gather behind it.
        assert_eq!(channel.frames, [(1, true), (64, true)]);
        assert!(channel.faults.is_empty() && channel.outstanding.is_empty(), "{:?}", channel.faults);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_ack_under_way_is_never_overtaken_by_a_multiple_ack_covering_it() {
        // 2 gives up waiting for 1 at the moment 1 finishes, with 3 finished
        // behind it: the multiple ack for 1 and 3 must not cover 2, whose own
        // ack is on its way (the broker would close the channel on it).
        let channel = Channel::delivered(1..=3);
        let acks = Arc::new(Acks::default());
        (1..=3).for_each(|tag| acks.taken(tag));
        let run = |tag: u64, after: Duration| {
            let (acks, channel) = (acks.clone(), channel.clone());
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                finish(&acks, &channel, tag).await
            })
        };
        let two = run(2, Duration::ZERO);
        tokio::task::yield_now().await;
        let three = run(3, Duration::from_millis(1));
        let one = run(1, STRAGGLER_WAIT);
        for task in [one, two, three] {
            assert_eq!(task.await.unwrap(), Settled::Acked);
        }
        let channel = channel.lock().unwrap();
        assert!(channel.faults.is_empty(), "{:?} (frames {:?})", channel.faults, channel.frames);
        assert!(channel.outstanding.is_empty());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Any mix of handling times (some beyond the straggler wait) and
        /// requeues: no frame names an unknown tag, nothing is acked before
        /// its handler finished, and every handled delivery is acked once.
        #[test]
        fn no_interleaving_acks_a_delivery_early_twice_or_never(deliveries in prop::collection::vec((any::<bool>(), 0u64..12), 1..48)) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
            let channel = Channel::delivered(1..=deliveries.len() as u64);
            runtime.block_on(async {
                let acks = Arc::new(Acks::default());
                let mut tasks = Vec::new();
                for (i, &(requeue, handling_ms)) in deliveries.iter().enumerate() {
                    let tag = i as u64 + 1;
                    acks.taken(tag);
                    let (acks, channel) = (acks.clone(), channel.clone());
                    tasks.push(tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(handling_ms)).await;
                        if requeue {
                            let requeued = async {
                                channel.lock().unwrap().requeue(tag);
                                tokio::task::yield_now().await;
                            };
                            acks.alone(tag, requeued).await;
                        } else {
                            assert_eq!(finish(&acks, &channel, tag).await, Settled::Acked);
                        }
                    }));
                }
                for task in tasks {
                    task.await.unwrap();
                }
            });
            let channel = channel.lock().unwrap();
            prop_assert!(channel.faults.is_empty(), "{:?} (frames {:?})", channel.faults, channel.frames);
            let mut acked = channel.acked.clone();
            acked.sort();
            let handled: Vec<u64> = channel.handled.iter().copied().collect();
            prop_assert_eq!(acked, handled);
            prop_assert!(channel.outstanding.is_empty());
        }
    }
}
