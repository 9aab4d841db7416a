//! A held stream's consumer: where a NATS message waits until it is due.
//!
//! JetStream before 2.12 cannot publish later, but a consumer can decline a
//! message for a while: a negative acknowledgement with a delay (`Nak`)
//! makes the server deliver it again after that delay. Every host serving
//! the strategy pulls from the one durable consumer of the held stream, so
//! they share the work, and the server keeps each waiting message as
//! pending on it.
//!
//! For each delivery the strategy's planner decides ([`HeldHandler`]): wait
//! (nak with the delay it names, never more than its own cap, answered in
//! bursts on a 100 ms grid for a reason [`answer_declines`] gives) or hand over
//! (publish on, and acknowledge the held copy only once the publish is
//! acknowledged). The due time is the absolute `hourglass-due-at` the message
//! was scheduled with, compared with the earliest the clock can read, so a
//! delivery that comes early (after a server restart, say) only waits again.
//! A message that can never go on (its destination has no stream, the planner
//! refuses it, hourglass's headers are missing) is parked in the held stream's
//! parked stream with the reason ([`super::parked_stream`]); one that cannot go
//! on now (the server is away, the planner ran out of time) is delivered
//! again a little later. Nothing is acknowledged before it is somewhere else.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use async_nats::jetstream::{AckKind, Message};
use futures_util::StreamExt;
use tokio::sync::{mpsc, watch};

use super::NatsExecutor;
use super::cancel::NatsCancel;
use super::convert::text;
use super::metrics::HoldCounters;
use crate::cancellation::Answer;
use crate::clock::Clock;
use crate::command::{Command, HeldAction, HeldMessage, NatsCommand};
use crate::executor::ExecutorError;
use crate::headers::{DUE_AT_HEADER, ID_HEADER, PARKED_REASON_HEADER, TARGET_HEADER};
use crate::planner::{LoadedPlanner, PlannerError};

/// The durable consumer every host of a held stream pulls from.
pub const CONSUMER: &str = "hourglass-hold";
/// How long a delivery may go unanswered before the server gives it to another
/// host: far more than a planner call and a publish take. It also bounds what
/// a server restart costs: nats-server 2.15 forgets the delays of declined
/// deliveries when killed and delivers them again this long after it is back
/// (measured: messages due during a kill -9 came up to 27 s late with 30 s).
const ACK_WAIT: Duration = Duration::from_secs(5);
/// Deliveries handled at once by one host.
const IN_FLIGHT: usize = 64;
/// How soon a message that cannot go on now comes back.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// The grid declines are answered on ([`answer_declines`]).
const DECLINE_EVERY: Duration = Duration::from_millis(100);

/// Who decides about a held message: the strategy's planner.
pub trait HeldHandler: Send + Sync {
    /// Who decides, for logs and parking reasons.
    fn label(&self) -> &str;
    fn handle_held(&self, message: &HeldMessage) -> Result<HeldAction, PlannerError>;
}

impl HeldHandler for LoadedPlanner {
    fn label(&self) -> &str {
        LoadedPlanner::label(self)
    }
    fn handle_held(&self, message: &HeldMessage) -> Result<HeldAction, PlannerError> {
        LoadedPlanner::handle_held(self, message)
    }
}

/// Why a held message can never go on: it is parked with this as its reason.
#[derive(Debug, thiserror::Error)]
enum Undeliverable {
    #[error("no {0} header: it was not scheduled by hourglass")]
    MissingHeader(&'static str),
    #[error("{DUE_AT_HEADER} {0:?} is not Unix milliseconds")]
    BadDueTime(String),
    #[error("{0}")]
    Planner(PlannerError),
    #[error("planner {planner} handed it over with {command:?}, which is no NATS publish")]
    NotAPublish { planner: String, command: Box<Command> },
    #[error(transparent)]
    Broker(ExecutorError),
}

/// Why a delivery was left to come back later.
#[derive(Debug, thiserror::Error)]
enum NotNow {
    #[error(transparent)]
    Broker(ExecutorError),
    #[error(transparent)]
    Planner(PlannerError),
}

/// One held stream, consumed for one strategy.
pub struct HeldStream {
    executor: Arc<NatsExecutor>,
    handler: Arc<dyn HeldHandler>,
    stream: String,
    clock: Arc<Clock>,
    /// For a cancellable strategy: asked at every hand-over.
    cancellations: Option<Arc<NatsCancel>>,
    consuming: AtomicBool,
    pub counters: Arc<HoldCounters>,
}

impl HeldStream {
    pub fn new(executor: Arc<NatsExecutor>, handler: Arc<dyn HeldHandler>, stream: &str, clock: Arc<Clock>) -> HeldStream {
        HeldStream { executor, handler, stream: stream.to_string(), clock, cancellations: None, consuming: AtomicBool::new(false), counters: Arc::default() }
    }

    /// Asks `cancellations` before each hand-over of a message scheduled with an id (a cancellable strategy's).
    pub fn cancellable(mut self, cancellations: Arc<NatsCancel>) -> HeldStream {
        self.cancellations = Some(cancellations);
        self
    }

    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// Pulling from the stream now.
    pub fn is_consuming(&self) -> bool {
        self.consuming.load(Ordering::Relaxed)
    }

    /// Pulls and decides until `stop`; returns with the error that broke the pull.
    pub async fn run(&self, stop: watch::Receiver<bool>) -> Result<(), ExecutorError> {
        let result = self.pull(stop).await;
        self.consuming.store(false, Ordering::Relaxed);
        result
    }

    async fn pull(&self, mut stop: watch::Receiver<bool>) -> Result<(), ExecutorError> {
        let unavailable = |e: &dyn std::fmt::Display| ExecutorError::Unavailable(format!("held stream {}: {e}", self.stream));
        let stream = self.executor.jetstream().get_stream(&self.stream).await.map_err(|e| unavailable(&e))?;
        let config = pull::Config {
            durable_name: Some(CONSUMER.to_string()),
            description: Some("hourglass: delayed messages, delivered again until due".to_string()),
            deliver_policy: DeliverPolicy::All,
            ack_policy: AckPolicy::Explicit,
            ack_wait: ACK_WAIT,
            // Every waiting message is pending on this consumer: a bound would
            // leave messages due sooner behind those that wait longer.
            max_ack_pending: -1,
            max_deliver: -1,
            ..Default::default()
        };
        let consumer = stream.get_or_create_consumer(CONSUMER, config).await.map_err(|e| unavailable(&e))?;
        let messages = consumer.messages().await.map_err(|e| unavailable(&e))?;
        self.consuming.store(true, Ordering::Relaxed);
        tracing::info!(stream = %self.stream, planner = self.handler.label(), "holding");
        let (declines, declined) = mpsc::unbounded_channel();
        let mut failure = None;
        let consume = messages
            .take_while(|next| {
                let broken = next.as_ref().err().map(|e| unavailable(e));
                let go_on = broken.is_none();
                failure = failure.take().or(broken);
                async move { go_on }
            })
            .for_each_concurrent(IN_FLIGHT, {
                let sender = declines.clone();
                move |next| {
                    let declines = sender.clone();
                    async move {
                        if let Ok(message) = next {
                            self.handle(message, &declines).await;
                        }
                    }
                }
            });
        // On a stop or a broken pull, the declines in hand are still answered (the channel closes
        // once `consume` and `declines` are gone), so none waits out ACK_WAIT; a hand-over cut
        // short comes back after it, and its repeat is dropped by the destination (Nats-Msg-Id).
        let consuming = async {
            let stopped = tokio::select! {
                _ = consume => false,
                _ = stop.wait_for(|stopped| *stopped) => true,
            };
            drop(declines);
            stopped
        };
        let (stopped, ()) = tokio::join!(consuming, answer_declines(declined));
        if stopped {
            return Ok(());
        }
        Err(failure.unwrap_or_else(|| unavailable(&"the consumer's message stream ended")))
    }

    async fn handle(&self, message: Message, declines: &mpsc::UnboundedSender<Decline>) {
        let answer = match self.decide(&message).await {
            Ok(Some(wait)) => {
                self.counters.waited.fetch_add(1, Ordering::Relaxed);
                // Answered on the next tick of the grid (`answer_declines`), the wait counted from now.
                let _ = declines.send(Decline { message, decided: Instant::now(), wait });
                return;
            }
            Ok(None) => {
                self.counters.handed_over.fetch_add(1, Ordering::Relaxed);
                AckKind::Ack
            }
            Err(Left::NotNow(why)) => {
                tracing::warn!(stream = %self.stream, error = %why, "a held message could not go on now; it comes back in {RETRY_AFTER:?}");
                self.counters.retried.fetch_add(1, Ordering::Relaxed);
                AckKind::Nak(Some(RETRY_AFTER))
            }
            Err(Left::Cancelled) => {
                self.counters.cancelled.fetch_add(1, Ordering::Relaxed);
                AckKind::Ack
            }
            Err(Left::Never(why)) => match self.park(&message, &why.to_string()).await {
                Ok(()) => {
                    self.counters.parked.fetch_add(1, Ordering::Relaxed);
                    AckKind::Ack
                }
                Err(e) => {
                    tracing::warn!(stream = %self.stream, error = %e, reason = %why, "parking a held message failed; it comes back in {RETRY_AFTER:?}");
                    self.counters.retried.fetch_add(1, Ordering::Relaxed);
                    AckKind::Nak(Some(RETRY_AFTER))
                }
            },
        };
        // A lost answer is not lost work: the server delivers the message again after ACK_WAIT.
        if let Err(e) = message.ack_with(answer).await {
            tracing::warn!(stream = %self.stream, error = %e, "answering a held delivery failed; the server delivers it again");
        }
    }

    /// `Some(wait)`: deliver again after it; `None`: handed over.
    async fn decide(&self, message: &Message) -> Result<Option<Duration>, Left> {
        let empty = HeaderMap::new();
        let headers = message.headers.as_ref().unwrap_or(&empty);
        let destination = text(headers, TARGET_HEADER).ok_or(Undeliverable::MissingHeader(TARGET_HEADER))?;
        let due = text(headers, DUE_AT_HEADER).ok_or(Undeliverable::MissingHeader(DUE_AT_HEADER))?;
        let due_at_ms = due.parse().map_err(|_| Undeliverable::BadDueTime(due.to_string()))?;
        let deliveries = message.info().map(|info| info.delivered).unwrap_or(1);
        let held = HeldMessage {
            stream: self.stream.clone(),
            subject: message.subject.to_string(),
            destination: destination.to_string(),
            due_at_ms,
            now_ms: self.clock.earliest_ms(),
            deliveries: u32::try_from(deliveries).unwrap_or(u32::MAX),
        };
        let mut asked = self.ask(&held)?;
        if let (Some(cancellations), Some(id), Asked::HandOver(_)) = (&self.cancellations, text(headers, ID_HEADER), &asked) {
            match cancellations.claim(id, held.now_ms).await.map_err(|e| Left::NotNow(NotNow::Broker(e)))? {
                Answer::Drop => return Err(Left::Cancelled),
                // Moved later: the planner decides again, against the new due time.
                Answer::Replan { due_at_ms } => asked = self.ask(&HeldMessage { due_at_ms, ..held })?,
                _ => {}
            }
        }
        let commands = match asked {
            Asked::Wait(wait) => return Ok(Some(wait)),
            Asked::HandOver(commands) => commands,
        };
        for command in commands {
            let Command::Nats(NatsCommand::Publish { subject, headers: extra }) = &command else {
                return Err(Undeliverable::NotAPublish { planner: self.handler.label().to_string(), command: Box::new(command) }.into());
            };
            let mut headers = headers.clone();
            for (name, value) in extra {
                headers.insert(name.as_str(), value.as_str());
            }
            self.executor.publish(subject, headers, message.payload.clone()).await.map_err(|e| match e {
                ExecutorError::Unavailable(_) => Left::NotNow(NotNow::Broker(e)),
                ExecutorError::Refused(_) | ExecutorError::Invalid(_) | ExecutorError::Unroutable(_) | ExecutorError::OtherFamily { .. } => {
                    Undeliverable::Broker(e).into()
                }
            })?;
        }
        Ok(None)
    }

    fn ask(&self, held: &HeldMessage) -> Result<Asked, Left> {
        match self.handler.handle_held(held) {
            Ok(HeldAction::Wait { ms }) => Ok(Asked::Wait(Duration::from_millis(ms.max(1)))),
            Ok(HeldAction::HandOver { commands }) => Ok(Asked::HandOver(commands)),
            Err(e) if e.is_timeout() => Err(Left::NotNow(NotNow::Planner(e))),
            Err(e) => Err(Undeliverable::Planner(e).into()),
        }
    }

    async fn park(&self, message: &Message, reason: &str) -> Result<(), ExecutorError> {
        let (_, subject) = super::parked_stream(&self.stream);
        let mut headers = message.headers.clone().unwrap_or_default();
        headers.insert(PARKED_REASON_HEADER, reason.replace(['\r', '\n'], " ").as_str());
        tracing::warn!(stream = %self.stream, %reason, "parked a held message");
        self.executor.publish(&subject, headers, message.payload.clone()).await
    }
}

/// A delivery the planner said to wait on, not answered yet.
struct Decline {
    message: Message,
    decided: Instant,
    wait: Duration,
}

/// Answers declines in bursts, on the wall clock's [`DECLINE_EVERY`] grid.
///
/// nats-server (2.9 to 2.15) re-arms a consumer's redelivery timer to 10 ms
/// on every negative acknowledgement with a delay, so declines arriving more
/// often than that, one by one, keep it from ever firing: measured, a steady
/// 1,000 schedules a second held every due message back until the schedules
/// stopped (1.9 s late). Answered together on a shared grid, the declines of
/// every host leave the timer quiet stretches to fire in, and a message is
/// delivered again at most one grid step after its wait, usually at it.
async fn answer_declines(mut declined: mpsc::UnboundedReceiver<Decline>) {
    while let Some(first) = declined.recv().await {
        let now = crate::clock::unix_now_ms();
        let step = DECLINE_EVERY.as_millis() as u64;
        tokio::time::sleep(Duration::from_millis(step - now % step)).await;
        let mut batch = vec![first];
        while let Ok(next) = declined.try_recv() {
            batch.push(next);
        }
        for decline in batch {
            let wait = decline.wait.saturating_sub(decline.decided.elapsed()).max(Duration::from_millis(1));
            // A lost answer is not lost work: the server delivers the message again after ACK_WAIT.
            if let Err(e) = decline.message.ack_with(AckKind::Nak(Some(wait))).await {
                tracing::warn!(error = %e, "declining a held delivery failed; the server delivers it again");
            }
        }
    }
}

/// What the planner said of a delivery.
enum Asked {
    Wait(Duration),
    HandOver(Vec<Command>),
}

/// What keeps a delivery from being handed over.
enum Left {
    NotNow(NotNow),
    Never(Undeliverable),
    /// Cancelled: its held copy is dropped.
    Cancelled,
}

impl From<Undeliverable> for Left {
    fn from(why: Undeliverable) -> Left {
        Left::Never(why)
    }
}
