//! Cancels and reschedules on NATS: a KV bucket keyed by message id, where
//! each key holds the message's fate. Every host's held stream asks it at
//! hand-over ([`NatsCancel::claim`]), so nothing reads a log or runs beside
//! the hold, and every change is one compare-and-set on the key:
//!
//! * a cancel writes `cancelled` unless the message was `released`;
//! * a reschedule writes `due=<Unix ms>` unless it was cancelled or released;
//! * a hand-over writes `released` unless it was cancelled (then the held
//!   copy is dropped) or moved later (then it waits on until the new time);
//! * a message handed to the server as a schedule is written `scheduled`
//!   first, so a cancel that finds no schedule knows the server sent it.
//!
//! The first writer of a key creates it, and every later one updates the
//! revision it read, so a cancel and a hand-over racing on one message agree
//! on one order: the message is delivered and the cancel answers "already
//! released", or it is not delivered and the cancel answers "cancelled".
//! Keys live as long as the bucket's `max_age`: `service.cancel.retention`.
//!
//! A message handed to the server as a schedule (`nats-schedule`) waits in no
//! held stream, so a cancel removes the schedule itself, and says so only when
//! the removal was done before the server's clock could reach its due time:
//! within [`DUE_MARGIN_MS`] of it, the message is taken as on its way. One
//! whose schedule is gone and whose key says `scheduled` was sent.

use std::time::Duration;

use async_nats::jetstream::kv::{self, CreateErrorKind, UpdateErrorKind};
use async_nats::jetstream::response::Response;
use async_nats::jetstream::stream::{self, DiscardPolicy, StorageType};

use super::{NatsExecutor, schedule};
use crate::executor::ExecutorError;
use std::sync::Arc;

use crate::clock::Clock;
use crate::config::Config;
use crate::config::broker::NatsSettings;
use crate::report::CommandError;
use crate::service::cancellations::{Answer, CancelError, Cancellations, OpenCancellations};

/// `STREAM.NAMES`' answer.
#[derive(serde::Deserialize)]
struct StreamNames {
    streams: Option<Vec<String>>,
}

const CANCELLED: &str = "cancelled";
const RELEASED: &str = "released";
const SCHEDULED: &str = "scheduled";
const DUE_PREFIX: &str = "due=";

/// What a key says of its message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Cancelled,
    Released,
    Due(u64),
    /// Handed to the server as a schedule: gone from its stream, it was sent.
    Scheduled,
}

impl Fate {
    fn read(value: &[u8]) -> Option<Fate> {
        match std::str::from_utf8(value).ok()? {
            CANCELLED => Some(Fate::Cancelled),
            RELEASED => Some(Fate::Released),
            SCHEDULED => Some(Fate::Scheduled),
            other => other.strip_prefix(DUE_PREFIX)?.parse().ok().map(Fate::Due),
        }
    }

    fn written(self) -> bytes::Bytes {
        match self {
            Fate::Cancelled => CANCELLED.into(),
            Fate::Released => RELEASED.into(),
            Fate::Scheduled => SCHEDULED.into(),
            Fate::Due(ms) => format!("{DUE_PREFIX}{ms}").into(),
        }
    }
}

/// A schedule this close to its due time (on the latest the server's clock
/// can read) is left to go: the server may already be sending it.
pub const DUE_MARGIN_MS: u64 = 500;

/// The bucket every host of this NATS account shares.
pub struct NatsCancel {
    bucket: kv::Store,
    retention_ms: u64,
    /// For the schedules (found in the streams, counted on its clock).
    nats: Arc<NatsExecutor>,
}

impl NatsCancel {
    /// Opens the bucket, creating it when `declaring` (each key kept `retention_ms`).
    pub async fn open(executor: &Arc<NatsExecutor>, name: &str, retention_ms: u64, declaring: bool) -> Result<NatsCancel, ExecutorError> {
        let jetstream = executor.jetstream();
        let bucket = match jetstream.get_key_value(name).await {
            Ok(bucket) => bucket,
            Err(_) if declaring => {
                // The bucket's stream as async-nats makes one, made here: its own
                // create_key_value asks the account's info first, which it cannot read from nats-server 2.9.
                let config = stream::Config {
                    name: format!("KV_{name}"),
                    description: Some("hourglass: the fate of each cancellable message (cancelled, released, due=<ms>)".to_string()),
                    subjects: vec![format!("$KV.{name}.>")],
                    max_messages_per_subject: 1,
                    max_age: Duration::from_millis(retention_ms),
                    storage: StorageType::File,
                    num_replicas: executor.replicas,
                    allow_rollup: true,
                    deny_delete: true,
                    allow_direct: true,
                    discard: DiscardPolicy::New,
                    ..Default::default()
                };
                jetstream.get_or_create_stream(config).await.map_err(|e| ExecutorError::Refused(format!("KV bucket {name}: {e}")))?;
                jetstream.get_key_value(name).await.map_err(|e| ExecutorError::Unavailable(format!("KV bucket {name}: {e}")))?
            }
            Err(e) => return Err(ExecutorError::Unavailable(format!("KV bucket {name}: {e}"))),
        };
        Ok(NatsCancel { bucket, retention_ms, nats: executor.clone() })
    }

    /// The schedule of message `id` a stream keeps: the stream, its subject
    /// and its due time; `None` when no stream keeps one (the message waits in
    /// a held stream, or its schedule already went).
    async fn find_schedule(&self, id: &str) -> Result<Option<(stream::Stream<()>, String, u64)>, ExecutorError> {
        // An id that is no single token has no schedule, and must not reach a filter as a wildcard.
        if schedule::subject(id, "x").is_err() {
            return Ok(None);
        }
        let filter = schedule::subjects_of(id);
        let unavailable = |e: &dyn std::fmt::Display| ExecutorError::Unavailable(format!("looking up the schedule of {id}: {e}"));
        let jetstream = self.nats.jetstream();
        let names: Response<StreamNames> = jetstream.request("STREAM.NAMES", &serde_json::json!({ "subject": filter })).await.map_err(|e| unavailable(&e))?;
        let names = match names {
            Response::Ok(names) => names.streams.unwrap_or_default(),
            Response::Err { error } => return Err(unavailable(&error)),
        };
        for name in names {
            let stream = jetstream.get_stream_no_info(&name).await.map_err(|e| unavailable(&e))?;
            if let Some((subject, due_ms)) = schedule::find(&stream, id).await? {
                return Ok(Some((stream, subject, due_ms)));
            }
        }
        Ok(None)
    }

    /// Changes the schedule of message `id`, if a stream keeps one, by `change`
    /// (a purge, a new schedule on its subject), done only while it is not yet
    /// due, and answering `done` when it was done before it could be: `None`
    /// when no stream keeps one.
    async fn change_schedule<F: Future<Output = Result<(), ExecutorError>>>(
        &self,
        id: &str,
        done: Answer,
        change: impl FnOnce(stream::Stream<()>, String) -> F,
    ) -> Result<Option<Answer>, ExecutorError> {
        let Some((stream, subject, due_ms)) = self.find_schedule(id).await? else { return Ok(None) };
        let clock = self.nats.clock();
        if clock.latest_ms() + DUE_MARGIN_MS >= due_ms {
            return Ok(Some(Answer::AlreadyReleased));
        }
        change(stream, subject).await?;
        // Done before the server's clock could reach the due time: the old schedule never fired.
        if clock.latest_ms() < due_ms {
            return Ok(Some(done));
        }
        Err(ExecutorError::Unavailable(format!("the change to {id}'s schedule took until its due time: the server may have sent it first")))
    }

    /// What becomes of a message at hand-over: `Release` (send it on now),
    /// `Drop` (it was cancelled) or `Replan` (it was moved later, to `due_at_ms`).
    pub async fn claim(&self, id: &str, now_ms: u64) -> Result<Answer, ExecutorError> {
        let answer = self
            .settle(id, Fate::Released, |fate| match fate {
                Fate::Cancelled => Err(Answer::Drop),
                // A delivery again of one already released (its acknowledgement was lost): send it again; the stream drops the repeat.
                Fate::Released => Err(Answer::Release),
                Fate::Due(due_at_ms) if due_at_ms > now_ms => Err(Answer::Replan { due_at_ms }),
                Fate::Due(_) | Fate::Scheduled => Ok(()),
            })
            .await?;
        Ok(answer.unwrap_or(Answer::Release))
    }

    /// Notes that message `id` is about to be handed to the server as a
    /// schedule (before it is, so no cancel can miss it).
    pub(crate) async fn record_scheduled(&self, id: &str) -> Result<(), ExecutorError> {
        self.settle(id, Fate::Scheduled, |_| Ok(())).await.map(drop)
    }

    /// Writes `to` unless `allowed` says what the key holds forbids it (and what to answer then).
    /// `Ok(None)`: written.
    async fn settle(&self, id: &str, to: Fate, allowed: impl Fn(Fate) -> Result<(), Answer>) -> Result<Option<Answer>, ExecutorError> {
        let unavailable = |e: &dyn std::fmt::Display| ExecutorError::Unavailable(format!("cancellation of {id}: {e}"));
        loop {
            match self.bucket.create(id, to.written()).await {
                Ok(_) => return Ok(None),
                Err(e) if e.kind() == CreateErrorKind::AlreadyExists => {}
                Err(e) if e.kind() == CreateErrorKind::InvalidKey => return Err(ExecutorError::Invalid(format!("message id {id:?} cannot be a KV key: {e}"))),
                Err(e) => return Err(unavailable(&e)),
            }
            let Some(entry) = self.bucket.entry(id).await.map_err(|e| unavailable(&e))? else { continue };
            let fate = Fate::read(&entry.value).ok_or_else(|| ExecutorError::Refused(format!("cancellation of {id}: the bucket holds {:?}", entry.value)))?;
            if let Err(answer) = allowed(fate) {
                return Ok(Some(answer));
            }
            match self.bucket.update(id, to.written(), entry.revision).await {
                Ok(_) => return Ok(None),
                // Someone else wrote in between: read again.
                Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => continue,
                Err(e) => return Err(unavailable(&e)),
            }
        }
    }
}

impl Cancellations for NatsCancel {
    fn cancel<'a>(&'a self, id: &'a str) -> futures_util::future::BoxFuture<'a, Result<Answer, CancelError>> {
        Box::pin(async move {
            let purge = |stream: stream::Stream<()>, subject: String| async move {
                stream.purge().filter(subject).await.map(drop).map_err(|e| ExecutorError::Unavailable(format!("removing the schedule of {id}: {e}")))
            };
            if let Some(answer) = self.change_schedule(id, Answer::Cancelled, purge).await? {
                if answer == Answer::Cancelled {
                    // So a cancel again answers that it was cancelled before.
                    self.settle(id, Fate::Cancelled, |_| Ok(())).await?;
                }
                return Ok(answer);
            }
            let refused = self
                .settle(id, Fate::Cancelled, |fate| match fate {
                    Fate::Cancelled => Err(Answer::AlreadyCancelled),
                    Fate::Released | Fate::Scheduled => Err(Answer::AlreadyReleased),
                    Fate::Due(_) => Ok(()),
                })
                .await?;
            Ok(refused.unwrap_or(Answer::Cancelled))
        })
    }

    fn reschedule<'a>(&'a self, id: &'a str, due_at_ms: u64) -> futures_util::future::BoxFuture<'a, Result<Answer, CancelError>> {
        Box::pin(async move {
            // The server keeps one schedule per subject, the latest: the same message again, due at the new time, replaces it.
            let replace = |stream: stream::Stream<()>, subject: String| async move {
                let unavailable = |e: &dyn std::fmt::Display| ExecutorError::Unavailable(format!("rescheduling {id}: {e}"));
                let kept = stream.get_last_raw_message_by_subject(&subject).await.map_err(|e| unavailable(&e))?;
                // A de-duplication id of its own: under the first one's, the stream would drop it as a repeat.
                let mut headers = async_nats::HeaderMap::new();
                for (name, values) in kept.headers.iter().filter(|(name, _)| AsRef::<str>::as_ref(name) != super::convert::MSG_ID) {
                    for value in values {
                        headers.append(name.clone(), value.clone());
                    }
                }
                headers.insert(super::convert::MSG_ID, format!("{id}.due-{due_at_ms}").as_str());
                headers.insert(schedule::SCHEDULE, schedule::at(due_at_ms).as_str());
                self.nats.publish(&subject, headers, kept.payload).await
            };
            if let Some(answer) = self.change_schedule(id, Answer::Rescheduled, replace).await? {
                return Ok(answer);
            }
            let refused = self
                .settle(id, Fate::Due(due_at_ms), |fate| match fate {
                    Fate::Cancelled => Err(Answer::AlreadyCancelled),
                    Fate::Released | Fate::Scheduled => Err(Answer::AlreadyReleased),
                    Fate::Due(_) => Ok(()),
                })
                .await?;
            Ok(refused.unwrap_or(Answer::Rescheduled))
        })
    }

    fn retention_ms(&self) -> u64 {
        self.retention_ms
    }
}

/// The bucket opened for one command.
pub async fn open_for_command(settings: &NatsSettings, config: &Config) -> Result<OpenCancellations, CommandError> {
    let nats = super::connect(settings).await?;
    let bucket = config.broker.cancellation_store(&config.service.cancel);
    // The bucket is made by `serve`; without it nothing here is cancellable.
    let cancel = NatsCancel::open(&nats, &bucket, config.service.cancel.retention_ms(), false).await?;
    Ok(OpenCancellations::new(Arc::new(cancel), Clock::system()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fates_read_back_as_written_and_nothing_else_reads() {
        for fate in [Fate::Cancelled, Fate::Released, Fate::Scheduled, Fate::Due(1_700_000_000_000)] {
            assert_eq!(Fate::read(&fate.written()), Some(fate));
        }
        for other in [&b"due=soon"[..], b"", b"CANCELLED", &[0xff, 0xfe]] {
            assert_eq!(Fate::read(other), None, "{other:?}");
        }
    }
}
