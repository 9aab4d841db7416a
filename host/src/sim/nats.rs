//! NATS JetStream: streams that capture subjects, the host's consumer on a
//! held stream (a message declined with a delay is delivered again after
//! it), and one-shot message schedules (nats-server 2.12+).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use super::{Arrival, Hop, HopStep, SimError, SimMessage};

struct Stream {
    subjects: Vec<String>,
    /// The host consumes it and asks the planner about each delivery.
    held: bool,
    /// A consumer's stream: messages captured by it count as arrived.
    destination: bool,
}

/// What waits for its time.
enum Pending {
    /// A held stream's message, (re)delivered to the host's consumer.
    Delivery(HeldNatsMessage),
    /// A schedule, publishing its message to `target` when it fires.
    Schedule { target: String, message: SimMessage, set_ms: u64 },
}

/// A held stream's delivery to the host, as its planner is asked about it.
#[derive(Debug)]
pub struct HeldNatsMessage {
    pub stream: String,
    pub subject: String,
    pub message: SimMessage,
    /// 1 for the first delivery.
    pub deliveries: u32,
    /// When it was published or last declined, for the wait shown in its route.
    pub since_ms: u64,
}

/// A publish to a subject no stream captures, refused with its message.
pub(crate) struct Uncaptured {
    pub subject: String,
    pub message: Box<SimMessage>,
}

impl From<Uncaptured> for SimError {
    fn from(refused: Uncaptured) -> SimError {
        SimError::NotFound(format!("no stream captures subject {:?}", refused.subject))
    }
}

/// What the next event on the server did.
pub(crate) enum Fired {
    Arrived(Arrival),
    Held(HeldNatsMessage),
    /// A schedule fired at a subject no stream captures: the server drops it.
    Dropped {
        reason: String,
        message: SimMessage,
    },
    /// The server keeps it: in a held stream until delivered, or in a stream nothing here consumes.
    Kept,
}

#[derive(Default)]
pub(crate) struct NatsBroker {
    streams: BTreeMap<String, Stream>,
    pending: HashMap<u64, Pending>,
    due: BinaryHeap<Reverse<(u64, u64)>>,
    /// Messages in streams nothing consumes, as (stream, message id).
    stored: Vec<(String, String)>,
    sequence: u64,
}

/// Whether NATS subject `pattern` (`*` one token, `>` one or more at the end) matches `subject`.
pub(crate) fn subject_matches(pattern: &str, subject: &str) -> bool {
    let mut tokens = subject.split('.');
    for want in pattern.split('.') {
        match (want, tokens.next()) {
            (">", Some(_)) => return true,
            ("*", Some(_)) => {}
            (want, Some(token)) if want == token => {}
            _ => return false,
        }
    }
    tokens.next().is_none()
}

impl NatsBroker {
    /// A consumer's subject, captured by a stream of its own.
    pub fn declare_destination(&mut self, subject: &str) {
        let name = format!("destination:{subject}");
        self.streams.entry(name).or_insert(Stream { subjects: vec![subject.to_string()], held: false, destination: true });
    }

    /// `nats-ensure-stream`: as the server, refuses a second stream capturing a subject another one does.
    pub fn ensure_stream(&mut self, name: &str, subjects: &[String], held: bool) -> Result<(), SimError> {
        if let Some(existing) = self.streams.get(name) {
            if existing.subjects != subjects || existing.held != held {
                return Err(SimError::PreconditionFailed(format!("stream {name:?} exists with subjects {:?}", existing.subjects)));
            }
            return Ok(());
        }
        let overlapping = self
            .streams
            .iter()
            .find(|(_, s)| s.subjects.iter().any(|have| subjects.iter().any(|want| subject_matches(have, want) || subject_matches(want, have))));
        if let Some((other, _)) = overlapping {
            return Err(SimError::PreconditionFailed(format!("subjects {subjects:?} overlap those of stream {other:?}")));
        }
        self.streams.insert(name.to_string(), Stream { subjects: subjects.to_vec(), held, destination: false });
        Ok(())
    }

    /// Every message still waiting, as (stream, message id).
    pub fn waiting(&self) -> impl Iterator<Item = (&str, &str)> {
        let pending = self.pending.values().map(|p| match p {
            Pending::Delivery(held) => (held.stream.as_str(), held.message.id.as_str()),
            Pending::Schedule { target, message, .. } => (target.as_str(), message.id.as_str()),
        });
        pending.chain(self.stored.iter().map(|(stream, id)| (stream.as_str(), id.as_str())))
    }

    /// The stream capturing `subject`, if any.
    fn capturing(&self, subject: &str) -> Option<(&String, &Stream)> {
        self.streams.iter().find(|(_, s)| s.subjects.iter().any(|p| subject_matches(p, subject)))
    }

    /// A JetStream publish: acked by the stream that captures `subject`, refused when none does.
    /// The arrival when a consumer's stream captured it; none when a stream
    /// keeps it (held until delivered, or where nothing here consumes it).
    pub fn publish(&mut self, subject: &str, message: SimMessage, now: u64) -> Result<Option<Arrival>, Uncaptured> {
        let Some((name, stream)) = self.capturing(subject) else {
            return Err(Uncaptured { subject: subject.to_string(), message: Box::new(message) });
        };
        let (name, held, destination) = (name.clone(), stream.held, stream.destination);
        if destination {
            return Ok(Some(Arrival { queue: subject.to_string(), at_ms: now, message }));
        }
        if !held {
            self.stored.push((name, message.id.clone()));
            return Ok(None);
        }
        self.push(now, Pending::Delivery(HeldNatsMessage { stream: name, subject: subject.to_string(), message, deliveries: 1, since_ms: now }));
        Ok(None)
    }

    /// `nats-schedule`: the server publishes the message to `target` `after_ms` from now.
    pub fn schedule(&mut self, target: &str, after_ms: u64, message: SimMessage, now: u64) {
        self.push(now + after_ms, Pending::Schedule { target: target.to_string(), message, set_ms: now });
    }

    /// The host declined a delivery with a delay: the server delivers it again after it.
    pub fn redeliver(&mut self, mut held: HeldNatsMessage, after_ms: u64, now: u64) {
        held.deliveries += 1;
        held.since_ms = now;
        self.push(now + after_ms, Pending::Delivery(held));
    }

    fn push(&mut self, at: u64, pending: Pending) {
        self.sequence += 1;
        self.pending.insert(self.sequence, pending);
        self.due.push(Reverse((at, self.sequence)));
    }

    pub(crate) fn next_event_ms(&self) -> Option<u64> {
        self.due.peek().map(|Reverse((at, _))| *at)
    }

    pub(crate) fn fire(&mut self, now: u64) -> Fired {
        let Some(Reverse((_, sequence))) = self.due.pop() else { return Fired::Kept };
        match self.pending.remove(&sequence) {
            None => Fired::Kept,
            Some(Pending::Delivery(held)) => Fired::Held(held),
            Some(Pending::Schedule { target, mut message, set_ms }) => {
                let then = format!("published to {target}");
                message.hops.push(Hop { at_ms: now, step: HopStep::Scheduled { target: target.clone(), waited_ms: now - set_ms, then } });
                match self.publish(&target, message, now) {
                    Ok(Some(arrival)) => Fired::Arrived(arrival),
                    Ok(None) => Fired::Kept,
                    Err(Uncaptured { message, .. }) => {
                        Fired::Dropped { reason: format!("the schedule fired at subject {target:?}, which no stream captures"), message: *message }
                    }
                }
            }
        }
    }
}
