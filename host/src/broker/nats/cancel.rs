//! Cancels and reschedules on NATS: a KV bucket keyed by message id, where
//! each key holds the message's fate. Every host's held stream asks it at
//! hand-over ([`NatsCancel::claim`]), so nothing reads a log or runs beside
//! the hold, and every change is one compare-and-set on the key:
//!
//! * a cancel writes `cancelled` unless the message was `released`;
//! * a reschedule writes `due=<Unix ms>` unless it was cancelled or released;
//! * a hand-over writes `released` unless it was cancelled (then the held
//!   copy is dropped) or moved later (then it waits on until the new time).
//!
//! The first writer of a key creates it, and every later one updates the
//! revision it read, so a cancel and a hand-over racing on one message agree
//! on one order: the message is delivered and the cancel answers "already
//! released", or it is not delivered and the cancel answers "cancelled".
//! Keys live as long as the bucket's `max_age`: `service.cancel.retention`.

use std::time::Duration;

use async_nats::jetstream::kv::{self, CreateErrorKind, UpdateErrorKind};
use async_nats::jetstream::stream::{self, DiscardPolicy, StorageType};

use super::NatsExecutor;
use crate::executor::ExecutorError;
use std::sync::Arc;

use crate::clock::Clock;
use crate::config::Config;
use crate::config::broker::NatsSettings;
use crate::report::CommandError;
use crate::service::cancellations::{Answer, CancelError, Cancellations, OpenCancellations};

const CANCELLED: &str = "cancelled";
const RELEASED: &str = "released";
const DUE_PREFIX: &str = "due=";

/// What a key says of its message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Cancelled,
    Released,
    Due(u64),
}

impl Fate {
    fn read(value: &[u8]) -> Option<Fate> {
        match std::str::from_utf8(value).ok()? {
            CANCELLED => Some(Fate::Cancelled),
            RELEASED => Some(Fate::Released),
            other => other.strip_prefix(DUE_PREFIX)?.parse().ok().map(Fate::Due),
        }
    }

    fn written(self) -> bytes::Bytes {
        match self {
            Fate::Cancelled => CANCELLED.into(),
            Fate::Released => RELEASED.into(),
            Fate::Due(ms) => format!("{DUE_PREFIX}{ms}").into(),
        }
    }
}

/// The bucket every host of this NATS account shares.
pub struct NatsCancel {
    bucket: kv::Store,
    retention_ms: u64,
}

impl NatsCancel {
    /// Opens the bucket, creating it when `declaring` (each key kept `retention_ms`).
    pub async fn open(executor: &NatsExecutor, name: &str, retention_ms: u64, declaring: bool) -> Result<NatsCancel, ExecutorError> {
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
        Ok(NatsCancel { bucket, retention_ms })
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
                Fate::Due(_) => Ok(()),
            })
            .await?;
        Ok(answer.unwrap_or(Answer::Release))
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
            let refused = self
                .settle(id, Fate::Cancelled, |fate| match fate {
                    Fate::Cancelled => Err(Answer::AlreadyCancelled),
                    Fate::Released => Err(Answer::AlreadyReleased),
                    Fate::Due(_) => Ok(()),
                })
                .await?;
            Ok(refused.unwrap_or(Answer::Cancelled))
        })
    }

    fn reschedule<'a>(&'a self, id: &'a str, due_at_ms: u64) -> futures_util::future::BoxFuture<'a, Result<Answer, CancelError>> {
        Box::pin(async move {
            let refused = self
                .settle(id, Fate::Due(due_at_ms), |fate| match fate {
                    Fate::Cancelled => Err(Answer::AlreadyCancelled),
                    Fate::Released => Err(Answer::AlreadyReleased),
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
    let bucket = super::cancellation_bucket(config.service.cancel.log());
    // The bucket is made by `serve`; without it nothing here is cancellable.
    let cancel = NatsCancel::open(&nats, &bucket, config.service.cancel.retention_ms(), false).await?;
    Ok(OpenCancellations::new(Arc::new(cancel), Clock::system()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fates_read_back_as_written_and_nothing_else_reads() {
        for fate in [Fate::Cancelled, Fate::Released, Fate::Due(1_700_000_000_000)] {
            assert_eq!(Fate::read(&fate.written()), Some(fate));
        }
        for other in [&b"due=soon"[..], b"", b"CANCELLED", &[0xff, 0xfe]] {
            assert_eq!(Fate::read(other), None, "{other:?}");
        }
    }
}
