//! NATS JetStream: the executor, and the only module that speaks async-nats.
//!
//! * [`NatsExecutor`] (this file): one client connection, reconnected by the
//!   client; streams ensured (`nats-ensure-stream`), a destination checked
//!   (a stream must capture its subject), messages published with JetStream's
//!   acknowledgement (`nats-publish`), handed to the server as schedules
//!   (`nats-schedule`, [`schedule`]).
//! * [`convert`]: a message's headers and properties as NATS headers.
//! * [`consume`]: a JetStream consumer under the neutral `Handler` (the NATS ingress).
//! * [`cancel`]: cancels and reschedules, a KV bucket the held streams ask at hand-over.
//! * [`schedule`]: JetStream message schedules (nats-server 2.12+), and their cancel.
//! * [`verify`]: what the strategies rely on, proven on the user's server.
//! * [`clock`]: the server's clock, read from the stamp JetStream gives a stored message.
//! * [`hold`]: the durable consumer of a held stream, which asks the
//!   strategy's planner about every delivery: wait (a negative acknowledgement
//!   with a delay) or hand over (publish on, then acknowledge), and parks what
//!   can never go on; [`metrics`] counts its deliveries by outcome.
//! * `side`: what a serving host runs on NATS: a consumer per held stream,
//!   the ingress and canary subjects, the bucket, the server's clock read
//!   every 10 s; `hourglass verify` is [`verify::verify_command`].
//!
//! A destination is a subject some stream captures: publishing to one no
//! stream captures is refused, as a missing queue is on RabbitMQ.

pub mod cancel;
pub mod clock;
pub(crate) mod consume;
pub mod convert;
pub mod hold;
pub mod metrics;
pub mod schedule;
pub(super) mod side;
pub mod verify;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, context::PublishErrorKind, stream};

use crate::clock::Clock;
use crate::command::{BrokerFamily, Command, NatsCommand};
use crate::config::broker::NatsSettings;
use crate::executor::{Envelope, Executor, ExecutorError};

/// `[broker] url` when none is given.
pub use crate::config::broker::DEFAULT_NATS_URL as DEFAULT_URL;
/// How long a JetStream request (a publish's acknowledgement, a stream look-up) may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Where a held stream's messages that can never go on are kept, with the reason (the contract's rule).
pub(crate) use crate::command::held_parked_stream as parked_stream;

/// Commands of a NATS plan, run on one client connection.
pub struct NatsExecutor {
    client: async_nats::Client,
    jetstream: jetstream::Context,
    url: String,
    /// Replicas of every stream hourglass creates (1 on a single server, 3 in a cluster).
    replicas: usize,
    reconnects: Arc<AtomicU64>,
    /// What a schedule's delay is counted on (the scheduler's clock, see [`Executor::count_on`]).
    clock: std::sync::RwLock<Arc<Clock>>,
    /// Targets whose stream was found to keep schedules (see [`schedule::keeper`]).
    kept: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Where a cancellable message's fate is written before it becomes a schedule (the service's bucket).
    fates: std::sync::OnceLock<Arc<cancel::NatsCancel>>,
}

impl NatsExecutor {
    pub async fn connect(url: &str, replicas: usize) -> Result<NatsExecutor, ExecutorError> {
        let reconnects = Arc::new(AtomicU64::new(0));
        let counted = reconnects.clone();
        let seen_first = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let options =
            async_nats::ConnectOptions::new().name("hourglass").connection_timeout(REQUEST_TIMEOUT).request_timeout(Some(REQUEST_TIMEOUT)).event_callback(
                move |event| {
                    let (counted, seen_first) = (counted.clone(), seen_first.clone());
                    async move {
                        match event {
                            // The first is the connection itself; each later one a reconnect.
                            async_nats::Event::Connected if seen_first.swap(true, Ordering::Relaxed) => {
                                counted.fetch_add(1, Ordering::Relaxed);
                            }
                            async_nats::Event::Disconnected => tracing::warn!("NATS connection lost; the client reconnects"),
                            _ => {}
                        }
                    }
                },
            );
        // A cluster's servers, comma-separated: the client takes any and reconnects to another
        // (async-nats parses a single string as one URL, and refuses the list as an invalid port).
        let servers: Vec<&str> = url.split(',').map(str::trim).collect();
        let client = options.connect(servers).await.map_err(|e| ExecutorError::Unavailable(format!("NATS at {url}: {e}")))?;
        let mut jetstream = jetstream::new(client.clone());
        jetstream.set_timeout(REQUEST_TIMEOUT);
        Ok(NatsExecutor {
            client,
            jetstream,
            url: url.to_string(),
            replicas: replicas.max(1),
            reconnects,
            clock: std::sync::RwLock::new(Clock::system()),
            kept: Default::default(),
            fates: Default::default(),
        })
    }

    /// Writes the fate of each cancellable message handed over as a schedule to `bucket`.
    pub(crate) fn keep_fates_in(&self, bucket: Arc<cancel::NatsCancel>) {
        let _ = self.fates.set(bucket);
    }

    /// The clock due times count on: the server's, once it was read.
    pub(crate) fn clock(&self) -> Arc<Clock> {
        self.clock.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub(crate) fn jetstream(&self) -> &jetstream::Context {
        &self.jetstream
    }

    /// Creates the stream if missing; an existing one must capture every subject asked.
    /// A `work_queue` keeps a message until it is acknowledged, and no longer
    /// (a held stream, an ingress); another keeps what it takes within its limits.
    pub(crate) async fn ensure_stream(&self, name: &str, subjects: &[String], work_queue: bool) -> Result<(), ExecutorError> {
        let config = stream::Config {
            name: name.to_string(),
            subjects: subjects.to_vec(),
            retention: if work_queue { stream::RetentionPolicy::WorkQueue } else { stream::RetentionPolicy::Limits },
            storage: stream::StorageType::File,
            num_replicas: self.replicas,
            ..Default::default()
        };
        let mut stream = self.jetstream.get_or_create_stream(config).await.map_err(|e| self.refused(&format!("stream {name}"), e))?;
        let info = stream.info().await.map_err(|e| self.refused(&format!("stream {name}"), e))?;
        let missing: Vec<&String> = subjects.iter().filter(|s| !info.config.subjects.contains(s)).collect();
        if !missing.is_empty() {
            return Err(ExecutorError::Refused(format!(
                "stream {name} exists without subjects {missing:?} (it captures {:?}); add them, or give the strategy a stream of its own",
                info.config.subjects
            )));
        }
        Ok(())
    }

    /// Publishes `body` with `headers` to `subject` and waits for the stream's acknowledgement.
    pub(crate) async fn publish(&self, subject: &str, headers: async_nats::HeaderMap, body: bytes::Bytes) -> Result<(), ExecutorError> {
        let publish = jetstream::message::PublishMessage::build().headers(headers).payload(body);
        let sent = self.jetstream.send_publish(subject.to_string(), publish).await.map_err(|e| publish_error(subject, e))?;
        match sent.await {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == PublishErrorKind::StreamNotFound => Err(self.unanswered(subject).await),
            Err(e) => Err(publish_error(subject, e)),
        }
    }

    /// A publish no stream answered ("no responders"): no stream captures the
    /// subject, or, in a cluster, the one that does has no leader while one is
    /// elected (its leader killed: 3.7 s on 2.9). The meta leader's list of
    /// streams tells which: only the first is unroutable; the second is the
    /// broker away for now (taken as unroutable, every hand-over of those
    /// seconds was parked).
    async fn unanswered(&self, subject: &str) -> ExecutorError {
        match self.jetstream.stream_by_subject(subject).await {
            Err(e) if e.kind() == jetstream::context::GetStreamByNameErrorKind::NotFound => {
                ExecutorError::Unroutable(format!("no stream captures subject {subject:?}"))
            }
            Ok(stream) => ExecutorError::Unavailable(format!("publish to {subject:?}: stream {stream} captures it but did not answer (no leader yet?)")),
            Err(e) => ExecutorError::Unavailable(format!("publish to {subject:?}: no stream answered, and looking one up failed: {e}")),
        }
    }

    fn refused(&self, what: &str, error: impl std::fmt::Display) -> ExecutorError {
        let text = error.to_string();
        // Anything the server answered is a refusal; a lost or timed-out request is the broker being away.
        if text.contains("timed out") || text.contains("timeout") || text.contains("disconnected") || text.contains("broken pipe") {
            ExecutorError::Unavailable(format!("{what}: {text}"))
        } else {
            ExecutorError::Refused(format!("{what}: {text}"))
        }
    }
}

fn publish_error(subject: &str, error: jetstream::context::PublishError) -> ExecutorError {
    match error.kind() {
        PublishErrorKind::StreamNotFound => ExecutorError::Unroutable(format!("no stream captures subject {subject:?}")),
        PublishErrorKind::MaxPayloadExceeded => ExecutorError::Invalid(format!("publish to {subject:?}: {error}")),
        PublishErrorKind::TimedOut | PublishErrorKind::BrokenPipe | PublishErrorKind::MaxAckPending => {
            ExecutorError::Unavailable(format!("publish to {subject:?}: {error}"))
        }
        PublishErrorKind::WrongLastMessageId | PublishErrorKind::WrongLastSequence | PublishErrorKind::Other => {
            ExecutorError::Refused(format!("publish to {subject:?}: {error}"))
        }
    }
}

impl Executor for NatsExecutor {
    fn describe(&self) -> String {
        format!("NATS JetStream at {}", self.url())
    }

    async fn apply(&self, commands: &[Command]) -> Result<(), ExecutorError> {
        for command in commands {
            let Command::Nats(command) = command else { return Err(ExecutorError::other_family(command, BrokerFamily::Nats)) };
            match command {
                NatsCommand::EnsureStream { name, subjects, held } => {
                    self.ensure_stream(name, subjects, *held).await?;
                    if *held {
                        let (parked, subject) = parked_stream(name);
                        self.ensure_stream(&parked, &[subject], false).await?;
                    }
                }
                NatsCommand::Publish { .. } | NatsCommand::Schedule { .. } => return Err(ExecutorError::Refused("a publish needs a message".into())),
            }
        }
        Ok(())
    }

    async fn check_destination(&self, destination: &str) -> Result<(), ExecutorError> {
        crate::command::check_nats_subject("destination", destination, false).map_err(|e| ExecutorError::Refused(e.to_string()))?;
        match self.jetstream.stream_by_subject(destination).await {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == jetstream::context::GetStreamByNameErrorKind::NotFound => {
                Err(ExecutorError::Refused(format!("NOT_FOUND - no stream captures subject {destination:?}")))
            }
            Err(e) => Err(ExecutorError::Unavailable(format!("looking up the stream of {destination:?}: {e}"))),
        }
    }

    async fn send(&self, commands: &[Command], envelope: &Envelope) -> Result<(), ExecutorError> {
        let headers = convert::headers(envelope)?;
        let body = bytes::Bytes::from(envelope.body.clone());
        for command in commands {
            match command {
                Command::Nats(NatsCommand::Publish { subject, headers: extra }) => {
                    let mut headers = headers.clone();
                    for (name, value) in extra {
                        headers.insert(name.as_str(), value.as_str());
                    }
                    self.publish(subject, headers, body.clone()).await?;
                }
                Command::Nats(NatsCommand::Schedule { target, after_ms, headers: extra }) => {
                    let mut headers = headers.clone();
                    for (name, value) in extra {
                        headers.insert(name.as_str(), value.as_str());
                    }
                    // A cancellable message (it carries its id) has its fate kept.
                    let fates = self.fates.get().filter(|_| envelope.headers.contains_key(crate::headers::ID_HEADER));
                    let record_fate = async {
                        match fates {
                            Some(fates) => fates.record_scheduled(&envelope.id).await,
                            None => Ok(()),
                        }
                    };
                    self.schedule(&envelope.id, target, *after_ms, headers, body.clone(), record_fate).await?;
                }
                other => self.apply(std::slice::from_ref(other)).await?,
            }
        }
        Ok(())
    }

    async fn is_ready(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }

    fn count_on(&self, clock: Arc<Clock>) {
        *self.clock.write().unwrap_or_else(std::sync::PoisonError::into_inner) = clock;
    }

    async fn queue_depth(&self, queue: &str) -> Option<u64> {
        let mut stream = self.jetstream.get_stream(queue).await.ok()?;
        Some(stream.info().await.ok()?.state.messages)
    }
}

/// Opens the NATS server (or cluster) `settings` name.
pub async fn connect(settings: &NatsSettings) -> Result<Arc<NatsExecutor>, ExecutorError> {
    Ok(Arc::new(NatsExecutor::connect(&settings.url, settings.replicas).await?))
}
