//! Cancel and reschedule, decided by an ordered log on the broker: no database,
//! any number of hosts, any restart.
//!
//! A strategy with `cancellable = true` ends its delay in the host's release
//! queue instead of the destination ([`super::release`]). Before a host
//! forwards a message from there, it appends a *claim* to the log, a RabbitMQ
//! stream that every host reads from the start; `DELETE` appends a *cancel*,
//! `PATCH` a *reschedule*. Each host folds the log, in the broker's order, into
//! the same [`Fates`], and an event is answered by the fold at the moment the
//! event is reached. So whichever of a cancel and a claim for one message the
//! broker appended first decides, the same way on every host and whatever
//! their clocks say (a claim carries its host's time with it):
//!
//! * cancel first: the cancel is answered `cancelled`, the claim `drop`;
//! * claim first: the message is on its way, and the cancel is answered `delivered` (409).
//!
//! A reschedule works the same way: a claim that finds a later due time sends
//! the message round the strategy again, with the same id, until then.
//!
//! Memory and replay are bounded by time: the stream drops segments older than
//! `retention` (and a cancellable strategy takes no delay longer than that), and
//! a host forgets released messages after `remember_delivered`: cancelling one
//! released longer ago is recorded and matches nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch};

use crate::broker::rabbitmq::stream;
use crate::command::{Command, FieldTable};
use crate::config::CancelConfig;
use crate::executor::{Broker, Envelope, Executor, ExecutorError};
use crate::message::Properties;
use crate::scheduler::Scheduler;

/// What a host appends to the log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// Never deliver `id`.
    Cancel { id: String },
    /// Deliver `id` at `due_at_ms` (Unix ms) instead.
    Reschedule { id: String, due_at_ms: u64 },
    /// A host is about to release `id` to its destination.
    Claim { id: String },
}

/// One log entry: the event, who is waiting for its answer, and the writer's clock.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    #[serde(flatten)]
    pub event: Event,
    /// Unique per append: the writer finds its answer by it.
    pub token: String,
    /// The writer's Unix ms when it appended, on the broker's clock as the
    /// writer read it (its own clock before any reading); a claim compares
    /// due times with it.
    pub at_ms: u64,
}

use futures_util::future::BoxFuture;

use crate::config::Config;
use crate::config::broker::RabbitMqSettings;
use crate::report::CommandError;
use crate::scheduler::strategies::Strategies;
pub use crate::service::cancellations::{Answer, CancelError};
use crate::service::cancellations::{Cancellations, OpenCancellations};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Cancelled,
    Rescheduled { due_at_ms: u64 },
    Released,
}

/// The fold of the log: what is known of each message id. Pure and
/// deterministic, so every host that reads the same log holds the same fates.
#[derive(Debug)]
pub struct Fates {
    by_id: HashMap<String, (Fate, u64)>,
    /// The newest writer clock seen: ages are measured against it, not the reader's clock.
    newest_ms: u64,
    remember_released_ms: u64,
    retention_ms: u64,
    since_sweep: u32,
}

/// Events between sweeps of forgotten fates.
const SWEEP_EVERY: u32 = 4_096;

impl Fates {
    pub fn new(retention_ms: u64, remember_released_ms: u64) -> Fates {
        Fates { by_id: HashMap::new(), newest_ms: 0, remember_released_ms, retention_ms, since_sweep: 0 }
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Folds one record in and answers it.
    pub fn apply(&mut self, record: &Record) -> Answer {
        self.newest_ms = self.newest_ms.max(record.at_ms);
        self.since_sweep += 1;
        if self.since_sweep >= SWEEP_EVERY {
            self.sweep();
        }
        let at = record.at_ms;
        match &record.event {
            Event::Cancel { id } => match self.fate(id) {
                Some(Fate::Released) => Answer::AlreadyReleased,
                Some(Fate::Cancelled) => Answer::AlreadyCancelled,
                _ => {
                    self.by_id.insert(id.clone(), (Fate::Cancelled, at));
                    Answer::Cancelled
                }
            },
            Event::Reschedule { id, due_at_ms } => match self.fate(id) {
                Some(Fate::Released) => Answer::AlreadyReleased,
                Some(Fate::Cancelled) => Answer::AlreadyCancelled,
                _ => {
                    self.by_id.insert(id.clone(), (Fate::Rescheduled { due_at_ms: *due_at_ms }, at));
                    Answer::Rescheduled
                }
            },
            Event::Claim { id } => match self.fate(id) {
                Some(Fate::Cancelled) => Answer::Drop,
                Some(Fate::Rescheduled { due_at_ms }) if due_at_ms > at => Answer::Replan { due_at_ms },
                // A second claim of a released message is its redelivery (the first host died before its ack): forward again.
                _ => {
                    self.by_id.insert(id.clone(), (Fate::Released, at));
                    Answer::Release
                }
            },
        }
    }

    fn fate(&self, id: &str) -> Option<Fate> {
        self.by_id.get(id).map(|(fate, _)| *fate)
    }

    /// Forgets released messages after `remember_released_ms` and everything else after the retention.
    fn sweep(&mut self) {
        self.since_sweep = 0;
        let newest = self.newest_ms;
        let (released, retention) = (self.remember_released_ms, self.retention_ms);
        self.by_id.retain(|_, (fate, at)| {
            let keep_for = if *fate == Fate::Released { released } else { retention };
            newest.saturating_sub(*at) <= keep_for
        });
    }
}

/// What the reader keeps.
struct Reading {
    fates: Fates,
    /// Tokens of this host's appends, waiting for their answers.
    waiting: HashMap<String, oneshot::Sender<Answer>>,
    /// The offset to read from after a reconnect.
    next_offset: u64,
}

/// The log as one host sees it: appends through the broker's executor, reads
/// with [`stream::read`], and answers this host's events as the reader reaches them.
pub struct CancelLog {
    stream: String,
    url: String,
    retention_ms: u64,
    answer_timeout: Duration,
    scheduler: Arc<Scheduler<Broker>>,
    reading: Mutex<Reading>,
    attached: AtomicBool,
}

impl CancelLog {
    pub fn new(url: &str, settings: &CancelConfig, scheduler: Arc<Scheduler<Broker>>) -> Arc<CancelLog> {
        let retention_ms = settings.retention_ms();
        Arc::new(CancelLog {
            stream: settings.log().to_string(),
            url: url.to_string(),
            retention_ms,
            answer_timeout: Duration::from_millis(settings.answer_timeout_ms()),
            scheduler,
            reading: Mutex::new(Reading { fates: Fates::new(retention_ms, settings.remember_delivered_ms()), waiting: HashMap::new(), next_offset: 0 }),
            attached: AtomicBool::new(false),
        })
    }

    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The clock its records and due times count on.
    pub fn clock(&self) -> &Arc<crate::clock::Clock> {
        self.scheduler.clock()
    }

    /// The longest delay a cancellable strategy takes: its cancellations must outlive it.
    pub fn retention_ms(&self) -> u64 {
        self.retention_ms
    }

    /// The stream's declaration (idempotent).
    pub fn declaration(&self) -> Command {
        // Whole seconds: RabbitMQ reads x-max-age as a number with a unit (Y, M, D, h, m, s).
        stream::declare_stream(&self.stream, &format!("{}s", self.retention_ms.div_ceil(1000)))
    }

    /// Whether the reader is attached to the stream.
    pub(crate) fn is_reading(&self) -> bool {
        self.attached.load(Ordering::Relaxed)
    }

    /// Message ids this host knows a fate for.
    pub fn known(&self) -> usize {
        self.lock().fates.len()
    }

    pub async fn cancel(&self, id: &str) -> Result<Answer, CancelError> {
        self.append(Event::Cancel { id: id.to_string() }).await
    }

    pub async fn reschedule(&self, id: &str, due_at_ms: u64) -> Result<Answer, CancelError> {
        self.append(Event::Reschedule { id: id.to_string(), due_at_ms }).await
    }

    pub async fn claim(&self, id: &str) -> Result<Answer, CancelError> {
        self.append(Event::Claim { id: id.to_string() }).await
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Reading> {
        self.reading.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends `event` (a confirmed publish) and waits until the reader reaches it.
    async fn append(&self, event: Event) -> Result<Answer, CancelError> {
        let token = uuid::Uuid::new_v4().to_string();
        // The broker's clock as read (never after it): every host's claims compare due times on the one clock.
        let record = Record { event, token: token.clone(), at_ms: self.scheduler.clock().earliest_ms() };
        let (answered, answer) = oneshot::channel();
        self.lock().waiting.insert(token.clone(), answered);
        let forget = || self.lock().waiting.remove(&token);
        let publish = [Command::forward("", &self.stream)];
        let body = serde_json::to_vec(&record).expect("a record is plain data");
        let envelope = Envelope { id: token.clone(), body, headers: FieldTable::new(), properties: Properties::default(), stamp_message_id: true };
        if let Err(err) = self.scheduler.executor().send(&publish, &envelope).await {
            forget();
            return Err(err.into());
        }
        match tokio::time::timeout(self.answer_timeout, answer).await {
            Ok(Ok(answer)) => Ok(answer),
            _ => {
                forget();
                Err(CancelError::Unanswered(self.answer_timeout))
            }
        }
    }

    /// Folds one entry in; answers it if this host is waiting for it.
    fn apply(&self, offset: u64, body: &[u8]) {
        let mut reading = self.lock();
        if offset < reading.next_offset {
            return; // read again after a reconnect
        }
        reading.next_offset = offset + 1;
        let record: Record = match serde_json::from_slice(body) {
            Ok(record) => record,
            Err(err) => {
                tracing::warn!(stream = %self.stream, offset, error = %err, "skipping an entry of the cancellation log that is not a record");
                return;
            }
        };
        let answer = reading.fates.apply(&record);
        if let Some(waiting) = reading.waiting.remove(&record.token) {
            let _ = waiting.send(answer);
        }
    }

    /// Reads the log until `stop`; `Err` when the connection was lost (the
    /// supervisor runs it again, and it goes on from where it was).
    pub async fn read(self: Arc<Self>, stop: watch::Receiver<bool>) -> Result<(), ExecutorError> {
        let (entries, mut received) = mpsc::channel(1_024);
        let from = self.lock().next_offset;
        let reader = stream::read(&self.url, &self.stream, from, entries, stop, &self.attached);
        let applying = async {
            while let Some((offset, body)) = received.recv().await {
                self.apply(offset, &body);
            }
        };
        let (result, ()) = tokio::join!(reader, applying);
        self.attached.store(false, Ordering::Relaxed);
        result
    }
}

/// The log opened for one command, read while it asks, on the broker's clock as a serving host's.
pub async fn open_for_command(settings: &RabbitMqSettings, config: &Config, strategies: Strategies) -> Result<OpenCancellations, CommandError> {
    let scheduler = Scheduler::new(config, strategies, super::connect(settings).await?.into());
    // The log's records and due times count on the broker's clock, as a serving host's do.
    super::clock_check::read_for(settings, scheduler.clock()).await;
    let clock = scheduler.clock().clone();
    let log = CancelLog::new(&settings.url, &config.service.cancel, Arc::new(scheduler));
    let (stop, stopped) = watch::channel(false);
    let reader = tokio::spawn(log.clone().read(stopped));
    Ok(OpenCancellations::with_closing(
        log,
        clock,
        Box::pin(async move {
            let _ = stop.send(true);
            let _ = reader.await;
        }),
    ))
}

impl Cancellations for CancelLog {
    fn cancel<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Answer, CancelError>> {
        Box::pin(CancelLog::cancel(self, id))
    }

    fn reschedule<'a>(&'a self, id: &'a str, due_at_ms: u64) -> BoxFuture<'a, Result<Answer, CancelError>> {
        Box::pin(CancelLog::reschedule(self, id, due_at_ms))
    }

    fn retention_ms(&self) -> u64 {
        CancelLog::retention_ms(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(event: Event, at_ms: u64) -> Record {
        Record { event, token: "t".into(), at_ms }
    }
    fn cancel(id: &str, at: u64) -> Record {
        record(Event::Cancel { id: id.into() }, at)
    }
    fn claim(id: &str, at: u64) -> Record {
        record(Event::Claim { id: id.into() }, at)
    }
    fn reschedule(id: &str, due_at_ms: u64, at: u64) -> Record {
        record(Event::Reschedule { id: id.into(), due_at_ms }, at)
    }

    #[test]
    fn whichever_of_cancel_and_claim_comes_first_in_the_log_decides() {
        let mut fates = Fates::new(u64::MAX, u64::MAX);
        assert_eq!(fates.apply(&cancel("a", 1)), Answer::Cancelled);
        assert_eq!(fates.apply(&claim("a", 2)), Answer::Drop);
        assert_eq!(fates.apply(&claim("a", 3)), Answer::Drop, "a redelivered copy is dropped too");
        assert_eq!(fates.apply(&cancel("a", 4)), Answer::AlreadyCancelled);

        assert_eq!(fates.apply(&claim("b", 1)), Answer::Release);
        assert_eq!(fates.apply(&cancel("b", 2)), Answer::AlreadyReleased);
        assert_eq!(fates.apply(&claim("b", 3)), Answer::Release, "a redelivered copy of a released message goes on");
        assert_eq!(fates.apply(&claim("c", 1)), Answer::Release, "an id nobody cancelled is released");
    }

    #[test]
    fn a_reschedule_holds_the_message_until_its_due_time_by_the_claimers_clock() {
        let mut fates = Fates::new(u64::MAX, u64::MAX);
        assert_eq!(fates.apply(&reschedule("a", 10_000, 1)), Answer::Rescheduled);
        assert_eq!(fates.apply(&claim("a", 5_000)), Answer::Replan { due_at_ms: 10_000 });
        assert_eq!(fates.apply(&claim("a", 9_999)), Answer::Replan { due_at_ms: 10_000 });
        assert_eq!(fates.apply(&claim("a", 10_000)), Answer::Release);
        assert_eq!(fates.apply(&reschedule("a", 20_000, 10_001)), Answer::AlreadyReleased);

        assert_eq!(fates.apply(&reschedule("b", 10_000, 1)), Answer::Rescheduled);
        assert_eq!(fates.apply(&reschedule("b", 20_000, 2)), Answer::Rescheduled, "the newest reschedule wins");
        assert_eq!(fates.apply(&claim("b", 15_000)), Answer::Replan { due_at_ms: 20_000 });
        assert_eq!(fates.apply(&cancel("b", 16_000)), Answer::Cancelled, "a rescheduled message can still be cancelled");
        assert_eq!(fates.apply(&claim("b", 20_000)), Answer::Drop);
        assert_eq!(fates.apply(&reschedule("b", 30_000, 20_001)), Answer::AlreadyCancelled);

        assert_eq!(fates.apply(&reschedule("c", 1_000, 1)), Answer::Rescheduled);
        assert_eq!(fates.apply(&claim("c", 5_000)), Answer::Release, "moved earlier than its plan: released when it arrives");
    }

    #[test]
    fn two_hosts_folding_the_same_log_hold_the_same_fates() {
        let log = [cancel("a", 1), claim("b", 2), reschedule("c", 50, 3), claim("c", 4), claim("a", 5), cancel("b", 6), claim("c", 60)];
        let answers = |log: &[Record]| {
            let mut fates = Fates::new(u64::MAX, u64::MAX);
            log.iter().map(|r| fates.apply(r)).collect::<Vec<_>>()
        };
        assert_eq!(answers(&log), answers(&log));
        assert_eq!(
            answers(&log),
            [Answer::Cancelled, Answer::Release, Answer::Rescheduled, Answer::Replan { due_at_ms: 50 }, Answer::Drop, Answer::AlreadyReleased, Answer::Release]
        );
    }

    #[test]
    fn released_ids_are_forgotten_sooner_than_cancellations() {
        let mut fates = Fates::new(1_000_000, 1_000);
        fates.apply(&claim("released", 0));
        fates.apply(&cancel("cancelled", 0));
        for i in 0..SWEEP_EVERY {
            fates.apply(&claim(&format!("later-{i}"), 2_000));
        }
        assert_eq!(fates.apply(&cancel("released", 2_001)), Answer::Cancelled, "forgotten after remember_delivered");
        assert_eq!(fates.apply(&claim("cancelled", 2_002)), Answer::Drop, "kept for the retention");
        assert!(fates.len() <= SWEEP_EVERY as usize + 2, "{}", fates.len());
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let written = Record { event: Event::Reschedule { id: "m-1".into(), due_at_ms: 42 }, token: "tok".into(), at_ms: 7 };
        let text = serde_json::to_string(&written).unwrap();
        assert_eq!(text, r#"{"event":"reschedule","id":"m-1","due_at_ms":42,"token":"tok","at_ms":7}"#);
        assert_eq!(serde_json::from_str::<Record>(&text).unwrap(), written);
    }
}
