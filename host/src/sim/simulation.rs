//! Runs a strategy on the simulator: its topology, its destination setup, its
//! plans, and — for pump-driven and held strategies — its answers to due and
//! held messages.

use std::collections::{BTreeMap, HashSet};

use serde::Serialize;
use thiserror::Error;

use crate::command::{Command, FieldTable, FieldValue, NatsCommand, SqsCommand};
use crate::headers::{DELAY_HEADER, DUE_AT_HEADER};
use crate::planner::{BrokerFamily, DueAction, HeldAction, HeldMessage, LoadedPlanner, PlanRequest, PlannerError};
use crate::sim::{HeldNatsMessage, Hop, HopStep, SimError, SimMessage, Simulator, Step};

/// A simulation gives up on a message after this many broker events, so a
/// planner that cycles forever is reported instead of hanging the host.
const MAX_STEPS_PER_MESSAGE: usize = 100_000;

#[derive(Debug, Error)]
pub enum SimulationError {
    #[error(transparent)]
    Planner(#[from] PlannerError),
    #[error("planner {planner}: {what} failed on the simulator: {source}")]
    Broker { planner: String, what: String, source: SimError },
}

/// What happened to one simulated message.
#[derive(Clone, Debug, Serialize)]
pub struct SimulatedMessage {
    pub id: String,
    pub destination: String,
    pub requested_ms: u64,
    /// The delay the planner said its commands give.
    pub promised_ms: Option<u64>,
    /// When it reached the destination, counted from its publish.
    pub arrival_ms: Option<u64>,
    pub hops: Vec<Hop>,
    /// Why it did not arrive, if it did not.
    pub problem: Option<String>,
}

/// A simulator set up for one strategy and destination; messages can be run
/// through it one batch after another.
pub struct Simulation<'p> {
    planner: &'p mut LoadedPlanner,
    simulator: Simulator,
    destination: String,
    next_id: u64,
    /// Messages that reached the destination, to tell a second copy from the first.
    arrived: HashSet<String>,
    /// Copies that reached the destination after the first: (message id, at ms).
    duplicates: Vec<(String, u64)>,
}

/// What remains once the broker has nothing left to do: extra copies that
/// arrived, and copies still waiting on the way. A sound plan leaves neither.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Leftovers {
    /// (message id, ms of virtual time) of each arrival after a message's first.
    pub duplicates: Vec<(String, u64)>,
    /// (queue, message id) of each copy that will never move on.
    pub waiting: Vec<(String, String)>,
}

impl<'p> Simulation<'p> {
    pub fn new(planner: &'p mut LoadedPlanner, destination: &str) -> Result<Self, SimulationError> {
        let mut simulator = Simulator::new();
        match planner.info().family {
            BrokerFamily::Amqp => simulator.declare_destination_queue(destination),
            BrokerFamily::Sqs => simulator.declare_destination_sqs_queue(destination),
            BrokerFamily::Nats => simulator.declare_destination_subject(destination),
        }
        let mut setup = planner.topology()?;
        setup.extend(planner.destination_setup(destination)?);
        for command in &setup {
            simulator.apply(command).map_err(|source| SimulationError::Broker {
                planner: planner.label().to_string(),
                what: format!("setup command {command:?}"),
                source,
            })?;
        }
        Ok(Simulation { planner, simulator, destination: destination.to_string(), next_id: 0, arrived: HashSet::new(), duplicates: Vec::new() })
    }

    /// Publishes one message per delay at the current virtual time and runs
    /// the broker until each has arrived or is known not to.
    pub fn run(&mut self, delays_ms: &[u64]) -> Result<Vec<SimulatedMessage>, SimulationError> {
        let start = self.simulator.now_ms();
        let mut results: BTreeMap<String, SimulatedMessage> = BTreeMap::new();
        for &delay_ms in delays_ms {
            self.next_id += 1;
            let id = format!("m{}", self.next_id);
            let result = self.publish(&id, delay_ms, start);
            results.insert(id, result);
        }
        let mut pending = results.values().filter(|r| r.problem.is_none()).count();
        let step_budget = MAX_STEPS_PER_MESSAGE * delays_ms.len().max(1);
        for _ in 0..step_budget {
            // Publishing can deliver at once (a zero delay), so look before stepping.
            pending -= self.collect_outcomes(&mut results, start);
            if pending == 0 {
                break;
            }
            let Some(answered) = self.step() else { break };
            if let Err((id, problem)) = answered
                && let Some(r) = results.get_mut(&id)
                && r.problem.is_none()
            {
                r.problem = Some(problem);
                pending -= 1;
            }
        }
        let mut results: Vec<SimulatedMessage> = results.into_values().collect();
        results.sort_by_key(|r| r.id[1..].parse::<u64>().unwrap_or(0));
        for r in results.iter_mut().filter(|r| r.arrival_ms.is_none() && r.problem.is_none()) {
            r.problem = Some(match self.simulator.queue_holding(&r.id) {
                Some(queue) => format!("never reached the destination; it waits in queue {queue:?}"),
                None => "never reached the destination".into(),
            });
        }
        Ok(results)
    }

    /// Records arrivals at the destination and losses; returns how many
    /// messages were settled by them.
    fn collect_outcomes(&mut self, results: &mut BTreeMap<String, SimulatedMessage>, start: u64) -> usize {
        let mut settled = 0;
        for arrival in self.simulator.take_arrivals() {
            if arrival.queue == self.destination && !self.arrived.insert(arrival.message.id.clone()) {
                self.duplicates.push((arrival.message.id.clone(), arrival.at_ms));
                continue;
            }
            if let Some(r) = results.get_mut(&arrival.message.id)
                && r.arrival_ms.is_none()
                && r.problem.is_none()
                && arrival.queue == self.destination
            {
                r.arrival_ms = Some(arrival.at_ms - start);
                r.hops = arrival.message.hops;
                settled += 1;
            }
        }
        for lost in self.simulator.take_lost() {
            if let Some(r) = results.get_mut(&lost.message.id)
                && r.arrival_ms.is_none()
                && r.problem.is_none()
            {
                r.problem = Some(format!("lost at {}ms: {}", lost.at_ms - start, lost.reason));
                r.hops = lost.message.hops;
                settled += 1;
            }
        }
        settled
    }

    /// Runs the broker until nothing is left to happen (or a step budget for
    /// `messages` runs out, for a planner that cycles copies forever) and
    /// reports what a sound plan never leaves behind.
    pub fn settle(&mut self, messages: usize) -> Leftovers {
        for _ in 0..MAX_STEPS_PER_MESSAGE * messages.max(1) {
            self.collect_outcomes(&mut BTreeMap::new(), 0);
            // Their problems were reported when the messages were run.
            if self.step().is_none() {
                break;
            }
        }
        self.collect_outcomes(&mut BTreeMap::new(), 0);
        Leftovers { duplicates: std::mem::take(&mut self.duplicates), waiting: self.simulator.waiting() }
    }

    /// One step of the broker, with the planner's answer to a message it
    /// surfaced (a due or held one); `None` once nothing is left to happen.
    fn step(&mut self) -> Option<Result<(), (String, String)>> {
        match self.simulator.step() {
            Step::Idle => None,
            Step::Progressed => Some(Ok(())),
            Step::Due(due) => Some(self.handle_due(due)),
            Step::Held(held) => Some(self.handle_held(held)),
        }
    }

    fn publish(&mut self, id: &str, delay_ms: u64, start: u64) -> SimulatedMessage {
        let mut result = SimulatedMessage {
            id: id.to_string(),
            destination: self.destination.clone(),
            requested_ms: delay_ms,
            promised_ms: None,
            arrival_ms: None,
            hops: Vec::new(),
            problem: None,
        };
        let request = PlanRequest { destination: self.destination.clone(), delay_ms, message_id: id.to_string(), routing_key: None };
        let plan = match patiently(|| self.planner.plan(&request)) {
            Ok(plan) => plan,
            Err(err) => {
                result.problem = Some(err.to_string());
                return result;
            }
        };
        result.promised_ms = Some(plan.delivers_after_ms);
        let headers: FieldTable =
            [(DELAY_HEADER.to_string(), FieldValue::Int(delay_ms as i64)), (DUE_AT_HEADER.to_string(), FieldValue::Int((start + delay_ms) as i64))].into();
        let message = SimMessage::new(id, headers);
        for command in &plan.commands {
            if let Err(err) = self.simulator.execute(command, message.clone()) {
                result.problem = Some(format!("{command:?}: {err}"));
                break;
            }
        }
        result
    }

    /// Asks the planner about a due message and carries out its answer.
    /// The error names the message it concerns.
    fn handle_due(&mut self, due: crate::sim::DueSqsMessage) -> Result<(), (String, String)> {
        let id = due.message.id.clone();
        let request = due.question(0, self.simulator.now_ms());
        let action = patiently(|| self.planner.handle_due(&request)).map_err(|e| (id.clone(), e.to_string()))?;
        let (name, commands) = match action {
            DueAction::Recycle(commands) => ("recycle", commands),
            DueAction::HandOver(commands) => ("hand over", commands),
        };
        let mut message = due.message;
        let sends = commands.iter().filter_map(|c| match c {
            Command::Sqs(SqsCommand::Send { queue, delay_seconds, .. }) => Some(format!("{queue} with DelaySeconds {delay_seconds}")),
            _ => None,
        });
        let step = HopStep::Pump { queue: due.queue.clone(), action: name.into(), sends: sends.collect() };
        message.hops.push(Hop { at_ms: self.simulator.now_ms(), step });
        self.carry(&id, message, &commands)
    }

    /// Asks the planner about a held stream's delivery, as the host does, and
    /// carries out its answer: a wait (the server delivers it again after
    /// it) or a hand-over. The error names the message it concerns.
    fn handle_held(&mut self, mut held: HeldNatsMessage) -> Result<(), (String, String)> {
        let id = held.message.id.clone();
        let now_ms = self.simulator.now_ms();
        let due_at_ms = match held.message.headers.get(DUE_AT_HEADER) {
            Some(FieldValue::Int(due)) => u64::try_from(*due).unwrap_or(0),
            _ => return Err((id, format!("held without its {DUE_AT_HEADER} header"))),
        };
        let question = HeldMessage {
            stream: held.stream.clone(),
            subject: held.subject.clone(),
            destination: self.destination.clone(),
            due_at_ms,
            now_ms,
            deliveries: held.deliveries,
        };
        let action = patiently(|| self.planner.handle_held(&question)).map_err(|e| (id.clone(), e.to_string()))?;
        let waited_ms = now_ms - held.since_ms;
        match action {
            HeldAction::Wait { ms } => {
                // As the host: a nak's delay is at least 1 ms.
                let wait = ms.max(1);
                let step = HopStep::Held {
                    stream: held.stream.clone(),
                    waited_ms,
                    action: format!("wait {}", humantime::format_duration(std::time::Duration::from_millis(wait))),
                    sends: Vec::new(),
                };
                held.message.hops.push(Hop { at_ms: now_ms, step });
                self.simulator.redeliver(held, wait);
                Ok(())
            }
            HeldAction::HandOver { commands } => {
                let sends = commands.iter().filter_map(|c| match c {
                    Command::Nats(NatsCommand::Publish { subject, .. }) => Some(subject.clone()),
                    _ => None,
                });
                let step = HopStep::Held { stream: held.stream.clone(), waited_ms, action: "hand over".into(), sends: sends.collect() };
                let mut message = held.message;
                message.hops.push(Hop { at_ms: now_ms, step });
                self.carry(&id, message, &commands)
            }
        }
    }

    /// Runs `commands`, each carrying a copy of `message` (the last the message itself).
    fn carry(&mut self, id: &str, message: SimMessage, commands: &[Command]) -> Result<(), (String, String)> {
        let last = commands.len().saturating_sub(1);
        let mut message = Some(message);
        for (i, command) in commands.iter().enumerate() {
            let copy = if i == last { message.take().expect("moved once") } else { message.clone().expect("still here") };
            self.simulator.execute(command, copy).map_err(|e| (id.to_string(), format!("{command:?}: {e}")))?;
        }
        Ok(())
    }
}

/// A planner call that ran out of its time budget is asked again, up to
/// twice: a simulation makes thousands of calls back to back (a year of
/// 15-minute cycles is 35,039), and on a busy machine one of them may be
/// starved of the CPU. A planner that loops fails all three.
fn patiently<T>(mut call: impl FnMut() -> Result<T, PlannerError>) -> Result<T, PlannerError> {
    let mut tries = 0;
    loop {
        match call() {
            Err(err) if err.is_timeout() && tries < 2 => tries += 1,
            answer => return answer,
        }
    }
}
