//! The embedded in-memory broker: the simulator on the wall clock.

use crate::clock::unix_now_ms;
use crate::command::Command;
use crate::sim::{Arrival, DueSqsMessage, SimError, SimMessage, Simulator};

use super::{Envelope, Executor, ExecutorError};

/// The embedded in-memory broker, on the wall clock.
#[derive(Default)]
pub struct MemoryExecutor {
    state: std::sync::Mutex<MemoryState>,
}

struct MemoryState {
    simulator: Simulator,
    epoch_ms: u64,
    /// Messages that fell due on pumped queues, waiting for the pump.
    due: Vec<DueSqsMessage>,
}

impl Default for MemoryState {
    fn default() -> Self {
        MemoryState { simulator: Simulator::new(), epoch_ms: unix_now_ms(), due: Vec::new() }
    }
}

impl MemoryExecutor {
    /// The simulator, caught up with the wall clock.
    fn now(&self) -> std::sync::MutexGuard<'_, MemoryState> {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let at = unix_now_ms().saturating_sub(state.epoch_ms);
        let due = state.simulator.advance_to(at);
        state.due.extend(due);
        state
    }

    /// Messages due on pumped queues; the caller hands each to its planner.
    pub fn take_due(&self) -> Vec<DueSqsMessage> {
        std::mem::take(&mut self.now().due)
    }

    /// A destination queue whose arrivals are kept for [`Self::arrivals`].
    pub fn declare_destination(&self, name: &str) {
        let mut state = self.now();
        state.simulator.declare_destination_queue(name);
        state.simulator.declare_destination_sqs_queue(name);
    }

    /// Messages that reached destinations so far.
    pub fn arrivals(&self) -> Vec<Arrival> {
        self.now().simulator.arrivals().to_vec()
    }
}

fn to_executor_error(err: SimError) -> ExecutorError {
    match err {
        SimError::Unroutable { .. } => ExecutorError::Unroutable(err.to_string()),
        other => ExecutorError::Refused(other.to_string()),
    }
}

impl Executor for MemoryExecutor {
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
        let message = SimMessage::new(&envelope.id, envelope.headers.clone());
        commands.iter().try_for_each(|c| state.simulator.execute(c, message.clone())).map_err(to_executor_error)
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
        let publish =
            Command::Publish { exchange: String::new(), routing_key: "dest".into(), headers: FieldTable::new(), expiration_ms: None, mandatory: true };
        let headers: FieldTable = [(DELAY_HEADER.to_string(), FieldValue::Int(0))].into();
        let envelope = Envelope { id: "m1".into(), body: b"hi".to_vec(), headers, properties: Default::default(), stamp_message_id: true };
        broker.send(&[publish], &envelope).await.unwrap();
        assert_eq!(broker.arrivals()[0].message.id, "m1");
        assert!(broker.take_due().is_empty());
    }
}
