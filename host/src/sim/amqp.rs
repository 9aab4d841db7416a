//! AMQP exchanges, queues, TTLs and dead-lettering.
//!
//! Dead-lettering follows the queue type: classic queues (and quorum queues
//! without `x-dead-letter-strategy = at-least-once` and `x-overflow =
//! reject-publish`) dead-letter at most once and drop what routes nowhere;
//! at-least-once queues keep such a message and retry it after the topology
//! changes. An exchange that routes a message nowhere hands it to its
//! `alternate-exchange`, which is how strategies park what lost its destination.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};

use serde::Serialize;

use super::{Arrival, Hop, HopStep, Lost, SimError, SimMessage};
use crate::command::{AmqpCommand, ExchangeKind, FieldTable, FieldValue};

/// One entry of a message's `x-death` history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Death {
    pub queue: String,
    pub reason: String,
    pub count: u32,
    pub exchange: String,
    pub routing_keys: Vec<String>,
    pub time_ms: u64,
}

struct Exchange {
    kind: ExchangeKind,
    durable: bool,
    arguments: FieldTable,
    bindings: Vec<Binding>,
}

#[derive(Clone, PartialEq, Eq)]
enum Target {
    Queue(String),
    Exchange(String),
}

impl Target {
    fn label(&self) -> String {
        match self {
            Target::Queue(q) => format!("queue:{q}"),
            Target::Exchange(e) => format!("exchange:{e}"),
        }
    }
}

#[derive(Clone, PartialEq, Eq)]
struct Binding {
    target: Target,
    routing_key: String,
    arguments: FieldTable,
}

struct Stored {
    message: SimMessage,
    enqueued_ms: u64,
    expires_at: Option<u64>,
}

struct Queue {
    durable: bool,
    arguments: FieldTable,
    ttl: Option<u64>,
    dead_letter_exchange: Option<String>,
    dead_letter_routing_key: Option<String>,
    expires: Option<u64>,
    last_used_ms: u64,
    messages: VecDeque<Stored>,
    /// A consumer's queue: what reaches it has arrived.
    destination: bool,
    /// Dead-letters at least once: keeps what it cannot route.
    at_least_once: bool,
    /// Expired messages whose dead-letter target routed them nowhere, kept for a retry.
    held: Vec<Stored>,
}

impl Queue {
    fn expiry_deadline(&self) -> Option<u64> {
        self.expires.map(|e| self.last_used_ms + e)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum EventKind {
    HeadExpires,
    QueueExpires,
    /// At-least-once dead-lettering tries its held messages again.
    RetryHeld,
}

/// How long RabbitMQ waits before retrying an at-least-once dead-letter that
/// found no route (measured ~173 s; the broker's default is 180 s).
pub(crate) const HELD_RETRY_MS: u64 = 180_000;

/// The outcome of a publish: who got it, and what reached nobody.
pub struct Routed {
    pub arrivals: Vec<Arrival>,
    pub unroutable: Option<SimMessage>,
}

#[derive(Default)]
pub(crate) struct Fired {
    pub arrivals: Vec<Arrival>,
    pub lost: Vec<Lost>,
}

#[derive(Default)]
pub(crate) struct AmqpBroker {
    exchanges: BTreeMap<String, Exchange>,
    queues: BTreeMap<String, Queue>,
    // Candidate events; stale ones are skipped when they surface.
    events: BinaryHeap<Reverse<(u64, EventKind, String)>>,
}

fn int_argument(arguments: &FieldTable, key: &str) -> Option<u64> {
    arguments.get(key).and_then(FieldValue::as_int).map(|v| v.max(0) as u64)
}

fn text_argument(arguments: &FieldTable, key: &str) -> Option<String> {
    arguments.get(key).and_then(FieldValue::as_text).map(str::to_string)
}

/// AMQP topic matching: `*` is one word, `#` is zero or more.
pub(crate) fn topic_matches(pattern: &str, key: &str) -> bool {
    fn matches(pattern: &[&str], key: &[&str]) -> bool {
        match pattern.split_first() {
            None => key.is_empty(),
            Some((&"#", rest)) => (0..=key.len()).any(|skip| matches(rest, &key[skip..])),
            Some((&word, rest)) => match key.split_first() {
                Some((&first, key_rest)) => (word == "*" || word == first) && matches(rest, key_rest),
                None => false,
            },
        }
    }
    let pattern: Vec<&str> = pattern.split('.').collect();
    let key: Vec<&str> = if key.is_empty() { Vec::new() } else { key.split('.').collect() };
    matches(&pattern, &key)
}

fn headers_match(arguments: &FieldTable, headers: &FieldTable) -> bool {
    let any = arguments.get("x-match").and_then(FieldValue::as_text) == Some("any");
    let mut wanted = arguments.iter().filter(|(k, _)| !k.starts_with("x-"));
    if any { wanted.any(|(k, v)| headers.get(k) == Some(v)) } else { wanted.all(|(k, v)| headers.get(k) == Some(v)) }
}

fn differing(wanted: &FieldTable, existing: &FieldTable) -> String {
    let keys: BTreeSet<&String> = wanted.keys().chain(existing.keys()).collect();
    keys.into_iter()
        .filter(|k| wanted.get(*k) != existing.get(*k))
        .map(|k| {
            let show = |v: Option<&FieldValue>| v.map_or("(none)".to_string(), ToString::to_string);
            format!("{k}: wanted {}, broker has {}", show(wanted.get(k)), show(existing.get(k)))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

impl AmqpBroker {
    pub fn declare_destination(&mut self, name: &str, now: u64) {
        self.queues.entry(name.to_string()).or_insert(Queue {
            durable: true,
            arguments: FieldTable::new(),
            ttl: None,
            dead_letter_exchange: None,
            dead_letter_routing_key: None,
            expires: None,
            last_used_ms: now,
            messages: VecDeque::new(),
            destination: true,
            at_least_once: false,
            held: Vec::new(),
        });
    }

    /// Deletes a queue as `queue.delete` does: its bindings go, its messages are lost.
    pub fn delete_queue(&mut self, name: &str, now: u64) -> Result<Vec<Lost>, SimError> {
        let queue = self.queues.remove(name).ok_or_else(|| SimError::NotFound(format!("no queue {name:?} to delete")))?;
        for exchange in self.exchanges.values_mut() {
            exchange.bindings.retain(|b| b.target != Target::Queue(name.to_string()));
        }
        let reason = format!("queue {name:?} was deleted while holding it");
        let messages = queue.messages.into_iter().chain(queue.held);
        Ok(messages.map(|stored| Lost { at_ms: now, reason: reason.clone(), message: stored.message }).collect())
    }

    /// The queue a message waits in (or is held by), if it waits anywhere.
    pub(crate) fn queue_holding(&self, message_id: &str) -> Option<&str> {
        self.queues.iter().find(|(_, q)| q.messages.iter().chain(&q.held).any(|m| m.message.id == message_id)).map(|(name, _)| name.as_str())
    }

    /// Every message waiting in a queue, as (queue, message id).
    pub fn waiting(&self) -> impl Iterator<Item = (&str, &str)> {
        self.queues.iter().flat_map(|(name, q)| q.messages.iter().chain(&q.held).map(move |m| (name.as_str(), m.message.id.as_str())))
    }

    /// After a topology change, at-least-once queues retry what they hold one retry interval later.
    fn schedule_held_retries(&mut self, now: u64) {
        for (name, queue) in &self.queues {
            if !queue.held.is_empty() {
                self.events.push(Reverse((now + HELD_RETRY_MS, EventKind::RetryHeld, name.clone())));
            }
        }
    }

    pub fn apply(&mut self, command: &AmqpCommand, now: u64) -> Result<(), SimError> {
        match command {
            AmqpCommand::DeclareExchange { name, kind, durable, arguments } => {
                if let Some(existing) = self.exchanges.get(name) {
                    if existing.kind != *kind || existing.durable != *durable || existing.arguments != *arguments {
                        return Err(SimError::PreconditionFailed(format!(
                            "exchange {name:?} exists as {} (durable {}), declared as {} (durable {durable})",
                            existing.kind.as_str(),
                            existing.durable,
                            kind.as_str()
                        )));
                    }
                    return Ok(());
                }
                let exchange = Exchange { kind: *kind, durable: *durable, arguments: arguments.clone(), bindings: Vec::new() };
                self.exchanges.insert(name.clone(), exchange);
            }
            AmqpCommand::DeclareQueue { name, durable, arguments } => {
                if let Some(existing) = self.queues.get_mut(name) {
                    if existing.destination && existing.arguments.is_empty() && arguments.is_empty() {
                        return Ok(());
                    }
                    if existing.arguments != *arguments || existing.durable != *durable {
                        return Err(SimError::PreconditionFailed(format!(
                            "queue {name:?} exists with other arguments: {}",
                            differing(arguments, &existing.arguments)
                        )));
                    }
                    // Redeclaring counts as use and renews x-expires.
                    existing.last_used_ms = now;
                    if let Some(deadline) = existing.expiry_deadline() {
                        self.events.push(Reverse((deadline, EventKind::QueueExpires, name.clone())));
                    }
                    return Ok(());
                }
                let queue = Queue {
                    durable: *durable,
                    arguments: arguments.clone(),
                    ttl: int_argument(arguments, "x-message-ttl"),
                    dead_letter_exchange: text_argument(arguments, "x-dead-letter-exchange"),
                    dead_letter_routing_key: text_argument(arguments, "x-dead-letter-routing-key"),
                    expires: int_argument(arguments, "x-expires"),
                    last_used_ms: now,
                    messages: VecDeque::new(),
                    destination: false,
                    at_least_once: text_argument(arguments, "x-queue-type").as_deref() == Some("quorum")
                        && text_argument(arguments, "x-dead-letter-strategy").as_deref() == Some("at-least-once")
                        && text_argument(arguments, "x-overflow").as_deref() == Some("reject-publish"),
                    held: Vec::new(),
                };
                if let Some(deadline) = queue.expiry_deadline() {
                    self.events.push(Reverse((deadline, EventKind::QueueExpires, name.clone())));
                }
                self.queues.insert(name.clone(), queue);
            }
            AmqpCommand::BindQueue { queue, exchange, routing_key, arguments } => {
                if !self.queues.contains_key(queue) {
                    return Err(SimError::NotFound(format!("no queue {queue:?} to bind to exchange {exchange:?}")));
                }
                let target = Target::Queue(queue.clone());
                self.bind(exchange, Binding { target, routing_key: routing_key.clone(), arguments: arguments.clone() })?;
            }
            AmqpCommand::BindExchange { source, destination, routing_key, arguments } => {
                if !self.exchanges.contains_key(destination) {
                    return Err(SimError::NotFound(format!("no exchange {destination:?} to bind from {source:?}")));
                }
                let target = Target::Exchange(destination.clone());
                self.bind(source, Binding { target, routing_key: routing_key.clone(), arguments: arguments.clone() })?;
            }
            AmqpCommand::Publish { .. } => return Err(SimError::Invalid("a publish needs a message; use execute".into())),
        }
        self.schedule_held_retries(now);
        Ok(())
    }

    fn bind(&mut self, exchange: &str, binding: Binding) -> Result<(), SimError> {
        let source = self.exchanges.get_mut(exchange).ok_or_else(|| SimError::NotFound(format!("no exchange {exchange:?} to bind")))?;
        if !source.bindings.contains(&binding) {
            source.bindings.push(binding);
        }
        Ok(())
    }

    /// Queues reached from `exchange` for this message, recording each exchange passed.
    fn route(&self, exchange: &str, message: &SimMessage, now: u64, hops: &mut Vec<Hop>, seen: &mut BTreeSet<String>) -> BTreeSet<String> {
        let mut queues = BTreeSet::new();
        if !seen.insert(exchange.to_string()) {
            return queues;
        }
        if exchange.is_empty() {
            let mut routed_to = Vec::new();
            // Each key, BCC ones too, names a queue.
            for key in std::iter::once(&message.routing_key).chain(&message.bcc) {
                if self.queues.contains_key(key) && queues.insert(key.clone()) {
                    routed_to.push(Target::Queue(key.clone()).label());
                }
            }
            let step = HopStep::Exchange { name: "(default)".into(), routing_key: message.routing_key.clone(), bcc: message.bcc.clone(), routed_to };
            hops.push(Hop { at_ms: now, step });
            return queues;
        }
        let Some(source) = self.exchanges.get(exchange) else { return queues };
        // Like RabbitMQ: the BCC keys route as the routing key does.
        let keys = std::iter::once(&message.routing_key).chain(&message.bcc);
        let matched: Vec<&Binding> = source
            .bindings
            .iter()
            .filter(|b| match source.kind {
                ExchangeKind::Direct => keys.clone().any(|key| b.routing_key == *key),
                ExchangeKind::Fanout => true,
                ExchangeKind::Topic => keys.clone().any(|key| topic_matches(&b.routing_key, key)),
                ExchangeKind::Headers => headers_match(&b.arguments, &message.headers),
            })
            .collect();
        let mut routed_to: Vec<String> = matched.iter().map(|b| b.target.label()).collect();
        routed_to.dedup();
        // Like RabbitMQ: an exchange whose own bindings match nothing hands the message to its alternate.
        let alternate = text_argument(&source.arguments, "alternate-exchange").filter(|_| matched.is_empty());
        if let Some(alternate) = &alternate {
            routed_to.push(format!("{} (alternate)", Target::Exchange(alternate.clone()).label()));
        }
        let step = HopStep::Exchange { name: exchange.to_string(), routing_key: message.routing_key.clone(), bcc: message.bcc.clone(), routed_to };
        hops.push(Hop { at_ms: now, step });
        if let Some(alternate) = alternate {
            queues.extend(self.route(&alternate, message, now, hops, seen));
        }
        for binding in matched {
            match &binding.target {
                Target::Queue(q) => {
                    queues.insert(q.clone());
                }
                Target::Exchange(e) => queues.extend(self.route(e, message, now, hops, seen)),
            }
        }
        queues
    }

    fn enqueue(&mut self, queue_name: &str, mut message: SimMessage, now: u64) -> Option<Arrival> {
        let queue = self.queues.get_mut(queue_name)?;
        if queue.destination {
            // What a consumer receives: the broker strips the BCC keys.
            message.bcc.clear();
            return Some(Arrival { queue: queue_name.to_string(), at_ms: now, message });
        }
        let ttl = [queue.ttl, message.expiration_ms].into_iter().flatten().min();
        let expires_at = ttl.map(|t| now + t);
        if queue.messages.is_empty()
            && let Some(at) = expires_at
        {
            self.events.push(Reverse((at, EventKind::HeadExpires, queue_name.to_string())));
        }
        queue.messages.push_back(Stored { message, enqueued_ms: now, expires_at });
        None
    }

    pub fn publish(&mut self, exchange: &str, mut message: SimMessage, now: u64) -> Result<Routed, SimError> {
        if !exchange.is_empty() && !self.exchanges.contains_key(exchange) {
            return Err(SimError::NotFound(format!("no exchange {exchange:?}")));
        }
        let mut hops = Vec::new();
        let targets = self.route(exchange, &message, now, &mut hops, &mut BTreeSet::new());
        message.hops.extend(hops);
        if targets.is_empty() {
            return Ok(Routed { arrivals: Vec::new(), unroutable: Some(message) });
        }
        let arrivals = targets.iter().filter_map(|q| self.enqueue(q, message.clone(), now)).collect();
        Ok(Routed { arrivals, unroutable: None })
    }

    /// Drops stale heap entries and returns the next real event.
    fn next_event(&self) -> Option<(u64, EventKind, String)> {
        self.events.iter().map(|Reverse(e)| e).filter(|e| self.is_current(e)).min().cloned()
    }

    fn is_current(&self, (at, kind, name): &(u64, EventKind, String)) -> bool {
        let Some(queue) = self.queues.get(name) else { return false };
        match kind {
            EventKind::HeadExpires => queue.messages.front().and_then(|m| m.expires_at) == Some(*at),
            EventKind::QueueExpires => queue.expiry_deadline() == Some(*at),
            EventKind::RetryHeld => !queue.held.is_empty(),
        }
    }

    fn prune(&mut self) {
        while let Some(Reverse(top)) = self.events.peek() {
            if self.is_current(top) {
                break;
            }
            self.events.pop();
        }
    }

    pub(crate) fn next_event_ms(&self) -> Option<u64> {
        // The heap top is current after every mutation (see `prune`), so peeking is enough.
        match self.events.peek() {
            Some(Reverse(top)) if self.is_current(top) => Some(top.0),
            Some(_) => self.next_event().map(|e| e.0),
            None => None,
        }
    }

    /// Handles the earliest event.
    pub(crate) fn fire(&mut self, now: u64) -> Fired {
        self.prune();
        let mut fired = Fired::default();
        let Some(Reverse((at, kind, name))) = self.events.pop() else { return fired };
        debug_assert!(at <= now);
        match kind {
            EventKind::QueueExpires => {
                let queue = self.queues.remove(&name).expect("current event has its queue");
                for exchange in self.exchanges.values_mut() {
                    exchange.bindings.retain(|b| b.target != Target::Queue(name.clone()));
                }
                for stored in queue.messages.into_iter().chain(queue.held) {
                    let reason = format!("queue {name:?} was deleted by x-expires while holding it");
                    fired.lost.push(Lost { at_ms: now, reason, message: stored.message });
                }
            }
            EventKind::HeadExpires => {
                let queue = self.queues.get_mut(&name).expect("current event has its queue");
                let stored = queue.messages.pop_front().expect("current event has its head");
                if let Some(next) = queue.messages.front().and_then(|m| m.expires_at) {
                    self.events.push(Reverse((next, EventKind::HeadExpires, name.clone())));
                }
                let dead_letter_exchange = queue.dead_letter_exchange.clone();
                let dead_letter_key = queue.dead_letter_routing_key.clone();
                self.dead_letter(&name, stored, dead_letter_exchange, dead_letter_key, now, &mut fired);
            }
            EventKind::RetryHeld => {
                let queue = self.queues.get_mut(&name).expect("current event has its queue");
                let held = std::mem::take(&mut queue.held);
                let dead_letter_exchange = queue.dead_letter_exchange.clone();
                for stored in held {
                    // The broker retries the held message as it was when it first expired.
                    let retry = Stored { message: stored.message, enqueued_ms: now, expires_at: None };
                    self.redead_letter(&name, retry, dead_letter_exchange.clone(), now, &mut fired);
                }
            }
        }
        self.prune();
        fired
    }

    fn dead_letter(&mut self, queue: &str, stored: Stored, exchange: Option<String>, routing_key: Option<String>, now: u64, fired: &mut Fired) {
        let mut message = stored.message;
        let waited_ms = now - stored.enqueued_ms;
        let Some(exchange) = exchange else {
            let then = "expired, no dead-letter exchange".to_string();
            message.hops.push(Hop { at_ms: now, step: HopStep::Queue { name: queue.into(), waited_ms, then } });
            let reason = format!("expired in queue {queue:?}, which has no dead-letter exchange");
            fired.lost.push(Lost { at_ms: now, reason, message });
            return;
        };
        let then = format!("dead-lettered to {}", if exchange.is_empty() { "(default)".into() } else { format!("exchange:{exchange}") });
        message.hops.push(Hop { at_ms: now, step: HopStep::Queue { name: queue.into(), waited_ms, then } });
        match message.deaths.iter().position(|d| d.queue == queue && d.reason == "expired") {
            Some(i) => {
                let mut death = message.deaths.remove(i);
                death.count += 1;
                death.time_ms = now;
                message.deaths.insert(0, death);
            }
            None => message.deaths.insert(
                0,
                Death {
                    queue: queue.into(),
                    reason: "expired".into(),
                    count: 1,
                    exchange: exchange.clone(),
                    routing_keys: vec![message.routing_key.clone()],
                    time_ms: now,
                },
            ),
        }
        if let Some(key) = routing_key {
            // A dead-letter routing key replaces every key the message had, BCC included.
            message.routing_key = key;
            message.bcc.clear();
        }
        // The broker drops the expiration so the message does not expire again downstream.
        message.expiration_ms = None;
        self.route_dead_letter(queue, message, exchange, now, fired);
    }

    /// Retries a held message: its death is already recorded.
    fn redead_letter(&mut self, queue: &str, stored: Stored, exchange: Option<String>, now: u64, fired: &mut Fired) {
        let Some(exchange) = exchange else { return };
        self.route_dead_letter(queue, stored.message, exchange, now, fired);
    }

    /// Routes a dead-lettered message; what reaches no queue is held by an
    /// at-least-once queue and lost from any other.
    fn route_dead_letter(&mut self, queue: &str, mut message: SimMessage, exchange: String, now: u64, fired: &mut Fired) {
        let at_least_once = self.queues.get(queue).is_some_and(|q| q.at_least_once);
        let hold = |broker: &mut Self, message: SimMessage| {
            let held = broker.queues.get_mut(queue).expect("the dead-lettering queue exists");
            held.held.push(Stored { message, enqueued_ms: now, expires_at: None });
        };
        if !exchange.is_empty() && !self.exchanges.contains_key(&exchange) {
            if at_least_once {
                return hold(self, message);
            }
            let reason = format!("dead-letter exchange {exchange:?} of queue {queue:?} does not exist");
            fired.lost.push(Lost { at_ms: now, reason, message });
            return;
        }
        let mut hops = Vec::new();
        let targets = self.route(&exchange, &message, now, &mut hops, &mut BTreeSet::new());
        message.hops.extend(hops);
        let mut delivered = false;
        let mut cycled = false;
        for target in targets {
            // Like RabbitMQ: a message expiring back into a queue it already expired from is dropped.
            if message.deaths.iter().skip(1).any(|d| d.queue == target) || target == queue {
                let reason = format!("dead-letter cycle: would re-enter queue {target:?}");
                fired.lost.push(Lost { at_ms: now, reason, message: message.clone() });
                cycled = true;
                continue;
            }
            delivered = true;
            fired.arrivals.extend(self.enqueue(&target, message.clone(), now));
        }
        if !delivered && !cycled && at_least_once {
            return hold(self, message);
        }
        if !delivered && !cycled {
            let reason = format!("dead-lettered from queue {queue:?} to exchange {exchange:?}, which routes it nowhere");
            fired.lost.push(Lost { at_ms: now, reason, message });
        }
    }
}
