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

/// The acknowledgements of one channel's deliveries (delivery tags are per channel).
#[derive(Default)]
pub struct Acks {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Deliveries being handled, or being settled on their own.
    in_hand: BTreeSet<u64>,
    /// Finished deliveries waiting for their ack.
    finished: BTreeMap<u64, Waiting>,
    /// Whether a task is sending a multiple ack now (only one at a time, so acks go out in order).
    sending: bool,
}

struct Waiting {
    acker: Acker,
    reply: oneshot::Sender<Settled>,
}

impl Acks {
    /// A delivery arrived; it is in hand until it is acked or settled alone.
    pub fn taken(&self, tag: u64) {
        self.lock().in_hand.insert(tag);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Every change is a single insert or remove; a panic elsewhere leaves the state whole.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Acks a finished delivery, with others when they are ready too.
    pub async fn ack(&self, tag: u64, acker: &Acker) -> Settled {
        let (reply, answer) = oneshot::channel();
        {
            let mut state = self.lock();
            state.in_hand.remove(&tag);
            state.finished.insert(tag, Waiting { acker: acker.clone(), reply });
        }
        self.send_ready().await;
        let mut answer = answer;
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
        let settled = send_ack(acker, false).await;
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
                send_ack(&last.acker, true).await
            };
            for waiting in ready.into_values().chain([last]) {
                waiting.reply.send(settled.clone()).ok();
            }
        }
    }
}

/// Clears `sending` however the send ends (a dropped future included).
struct Sending<'a>(&'a Acks);

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        self.0.lock().sending = false;
    }
}

async fn send_ack(acker: &Acker, multiple: bool) -> Settled {
    match acker.ack(BasicAckOptions { multiple }).await {
        Ok(true) => Settled::Acked,
        _ => Settled::AckLost,
    }
}
