//! The embedded in-memory broker: the simulator on the wall clock.
//!
//! It keeps what a first-time user needs to see a delay happen: each message
//! reaching a destination is logged (destination, id, lateness) and the
//! newest [`KEPT_PER_DESTINATION`] per destination are kept, with their
//! bodies, for `GET /v1/delivered`. [`MemoryExecutor::run_clock`] moves the
//! simulator along the wall clock so deliveries happen when they fall due,
//! not when someone next looks. Its side (`side`) runs that clock in a
//! serving host and hands what falls due on pumped queues to their planner.

pub(super) mod side;

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tokio::sync::Notify;

use crate::clock::unix_now_ms;
use crate::command::{Command, DueMessage, FieldTable, FieldValue, HeldMessage};
use crate::headers::{DUE_AT_HEADER, TARGET_HEADER};
use crate::sim::{Arrival, DueSqsMessage, HeldNatsMessage, SimError, SimMessage, Simulator};

use crate::executor::{Delivered, Envelope, Executor, ExecutorError, KEPT_PER_DESTINATION};

/// The embedded in-memory broker, on the wall clock.
#[derive(Default)]
pub struct MemoryExecutor {
    state: std::sync::Mutex<MemoryState>,
    /// Told when a send may have brought the next event closer.
    sent: Notify,
}

struct MemoryState {
    simulator: Simulator,
    epoch_ms: u64,
    /// Messages that fell due on pumped queues, waiting for the pump.
    due: Vec<DueSqsMessage>,
    /// Deliveries of held streams, waiting for their planner's answer.
    held: Vec<HeldNatsMessage>,
    /// Bodies of messages in flight, by id: the simulator carries none.
    bodies: HashMap<String, Vec<u8>>,
    delivered: HashMap<String, VecDeque<Delivered>>,
}

impl Default for MemoryState {
    fn default() -> Self {
        MemoryState {
            simulator: Simulator::new(),
            epoch_ms: unix_now_ms(),
            due: Vec::new(),
            held: Vec::new(),
            bodies: HashMap::new(),
            delivered: HashMap::new(),
        }
    }
}

impl MemoryState {
    /// Logs and keeps what reached a destination; forgets the bodies of what was lost.
    fn settle(&mut self) {
        for arrival in self.simulator.take_arrivals() {
            let delivered = self.delivered_from(arrival);
            match delivered.late_ms() {
                Some(late) if late < 0 => {
                    tracing::warn!(destination = %delivered.destination, id = %delivered.id, early_ms = -late, "delivered EARLY")
                }
                Some(late_ms) => tracing::info!(destination = %delivered.destination, id = %delivered.id, late_ms, "delivered"),
                None => tracing::info!(destination = %delivered.destination, id = %delivered.id, "delivered"),
            }
            let kept = self.delivered.entry(delivered.destination.clone()).or_default();
            if kept.len() == KEPT_PER_DESTINATION {
                kept.pop_front();
            }
            kept.push_back(delivered);
        }
        for lost in self.simulator.take_lost() {
            self.bodies.remove(&lost.message.id);
            tracing::warn!(id = %lost.message.id, reason = %lost.reason, "message lost on the memory broker");
        }
    }

    fn delivered_from(&mut self, arrival: Arrival) -> Delivered {
        let due_at_ms = due_at_ms(&arrival.message.headers);
        Delivered {
            body: self.bodies.remove(&arrival.message.id).unwrap_or_default(),
            id: arrival.message.id,
            destination: arrival.queue,
            arrived_at_ms: self.epoch_ms + arrival.at_ms,
            due_at_ms,
        }
    }
}

impl MemoryExecutor {
    /// The simulator, caught up with the wall clock.
    fn now(&self) -> std::sync::MutexGuard<'_, MemoryState> {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let at = unix_now_ms().saturating_sub(state.epoch_ms);
        let surfaced = state.simulator.advance_to(at);
        state.due.extend(surfaced.due);
        state.held.extend(surfaced.held);
        state.settle();
        state
    }

    /// Messages due on pumped queues, each with the question its planner
    /// answers (times on the wall clock, as SQS gives them); the caller hands
    /// each to its planner and [`Self::carry_out`] does what it answered.
    pub(crate) fn take_due(&self) -> Vec<(DueMessage, DueSqsMessage)> {
        let mut state = self.now();
        let (epoch_ms, now_ms) = (state.epoch_ms, state.simulator.now_ms());
        std::mem::take(&mut state.due).into_iter().map(|due| (due.question(epoch_ms, now_ms), due)).collect()
    }

    /// Sends a message that surfaced (due on a pumped queue, or held) on
    /// with the commands its planner answered.
    pub(crate) fn carry_out(&self, commands: &[Command], message: &SimMessage) -> Result<(), ExecutorError> {
        self.execute(self.now(), commands, message)
    }

    /// Deliveries of held streams, each with the question its planner
    /// answers (times on the wall clock, the destination from the message's
    /// own header, as a NATS host asks it); the caller answers each with
    /// [`Self::redeliver`] or [`Self::carry_out`]. A delivery that
    /// cannot be asked about (its headers lost) comes with why.
    pub(crate) fn take_held(&self) -> Vec<(Result<HeldMessage, String>, HeldNatsMessage)> {
        let mut state = self.now();
        let now_ms = state.epoch_ms + state.simulator.now_ms();
        let question = |held: &HeldNatsMessage| {
            let headers = &held.message.headers;
            let destination = headers.get(TARGET_HEADER).and_then(FieldValue::as_text).ok_or_else(|| format!("held without its {TARGET_HEADER} header"))?;
            let due_at_ms = due_at_ms(headers).ok_or_else(|| format!("held without its {DUE_AT_HEADER} header"))?;
            Ok(HeldMessage {
                stream: held.stream.clone(),
                subject: held.subject.clone(),
                destination: destination.to_string(),
                due_at_ms,
                now_ms,
                deliveries: held.deliveries,
            })
        };
        std::mem::take(&mut state.held).into_iter().map(|held| (question(&held), held)).collect()
    }

    /// Declines a held delivery for `wait_ms`: the stream delivers it again then.
    pub(crate) fn redeliver(&self, held: HeldNatsMessage, wait_ms: u64) {
        self.now().simulator.redeliver(held, wait_ms);
        self.sent.notify_one();
    }

    /// Forgets a message that cannot go on (its body with it).
    pub(crate) fn drop_message(&self, message: &SimMessage) {
        self.now().bodies.remove(&message.id);
    }

    /// Runs `commands` on `message`, whose body is kept in `state`: a message
    /// they fail for keeps no body. Wakes the clock, as what was sent may fall
    /// due sooner than what it waits for.
    fn execute(&self, mut state: std::sync::MutexGuard<'_, MemoryState>, commands: &[Command], message: &SimMessage) -> Result<(), ExecutorError> {
        let sent = commands.iter().try_for_each(|c| state.simulator.execute(c, message.clone())).map_err(to_executor_error);
        if sent.is_err() {
            state.bodies.remove(&message.id);
        }
        // A delay of none arrives within the send.
        state.settle();
        drop(state);
        self.sent.notify_one();
        sent
    }

    /// A destination queue whose arrivals are kept for [`Self::delivered`].
    pub fn declare_destination(&self, name: &str) {
        let mut state = self.now();
        state.simulator.declare_destination_queue(name);
        state.simulator.declare_destination_sqs_queue(name);
        state.simulator.declare_destination_subject(name);
    }

    /// Moves the simulator along the wall clock until `stop` turns true, so
    /// each delivery is logged when it falls due.
    pub async fn run_clock(&self, mut stop: tokio::sync::watch::Receiver<bool>) {
        // An idle broker still looks now and then; a send wakes it at once.
        const IDLE: Duration = Duration::from_secs(1);
        while !*stop.borrow() {
            let wait = {
                let state = self.now();
                let now = unix_now_ms().saturating_sub(state.epoch_ms);
                state.simulator.next_event_ms().map_or(IDLE, |next| Duration::from_millis(next.saturating_sub(now)).min(IDLE))
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.sent.notified() => {}
                _ = stop.changed() => {}
            }
        }
    }
}

/// A message's due time, Unix ms: an integer header as the scheduler sets
/// it, or text, as NATS headers carry it.
fn due_at_ms(headers: &FieldTable) -> Option<u64> {
    match headers.get(DUE_AT_HEADER)? {
        FieldValue::Int(due) => u64::try_from(*due).ok(),
        other => other.as_text()?.parse().ok(),
    }
}

fn to_executor_error(err: SimError) -> ExecutorError {
    match err {
        SimError::Unroutable { .. } => ExecutorError::Unroutable(err.to_string()),
        other => ExecutorError::Refused(other.to_string()),
    }
}

impl Executor for MemoryExecutor {
    fn describe(&self) -> String {
        "the in-memory broker".into()
    }

    /// The newest messages that reached `destination`, oldest first.
    fn delivered(&self, destination: &str) -> Option<Vec<Delivered>> {
        Some(self.now().delivered.get(destination).map_or_else(Vec::new, |kept| kept.iter().cloned().collect()))
    }

    fn outlives_the_process(&self) -> bool {
        false
    }

    async fn apply(&self, commands: &[Command]) -> Result<(), ExecutorError> {
        let mut state = self.now();
        commands.iter().try_for_each(|c| state.simulator.apply(c)).map_err(to_executor_error)
    }

    async fn check_destination(&self, destination: &str) -> Result<(), ExecutorError> {
        // The in-memory broker has no consumers of its own: any destination is one.
        self.declare_destination(destination);
        Ok(())
    }

    async fn send(&self, commands: &[Command], envelope: &Envelope) -> Result<(), ExecutorError> {
        let mut state = self.now();
        state.bodies.insert(envelope.id.clone(), envelope.body.clone());
        self.execute(state, commands, &SimMessage::new(&envelope.id, envelope.headers.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{FieldTable, FieldValue};
    use crate::headers::DELAY_HEADER;

    #[tokio::test]
    async fn the_memory_broker_delivers_on_the_wall_clock() {
        let broker = MemoryExecutor::default();
        broker.declare_destination("dest");
        let publish = Command::forward("", "dest");
        let headers: FieldTable = [(DELAY_HEADER.to_string(), FieldValue::Int(0))].into();
        let envelope = Envelope { id: "m1".into(), body: b"hi".to_vec(), headers, properties: Default::default(), stamp_message_id: true };
        broker.send(&[publish], &envelope).await.unwrap();
        let delivered = broker.delivered("dest").unwrap();
        assert_eq!((delivered[0].id.as_str(), delivered[0].body.as_slice()), ("m1", b"hi".as_slice()));
        assert!(broker.take_due().is_empty());
    }

    #[tokio::test]
    async fn only_the_newest_deliveries_are_kept_and_bodies_are_not_held_after() {
        let broker = MemoryExecutor::default();
        broker.declare_destination("dest");
        let publish = Command::forward("", "dest");
        for n in 0..KEPT_PER_DESTINATION + 5 {
            let envelope =
                Envelope { id: format!("m{n}"), body: vec![b'x'; 10], headers: FieldTable::new(), properties: Default::default(), stamp_message_id: true };
            broker.send(std::slice::from_ref(&publish), &envelope).await.unwrap();
        }
        let delivered = broker.delivered("dest").unwrap();
        assert_eq!(delivered.len(), KEPT_PER_DESTINATION);
        assert_eq!(delivered[0].id, "m5", "the oldest five were dropped");
        assert!(broker.state.lock().unwrap().bodies.is_empty(), "no body outlives its delivery");
    }
}
