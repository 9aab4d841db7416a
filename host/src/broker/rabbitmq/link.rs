//! One AMQP connection and the slot that keeps one open.
//!
//! A [`Link`] is a lapin connection plus what it has cost: lapin 4 never
//! reuses the number of a channel the *broker* closed (it stays poisoned), so
//! after about `channel_max` such closes every new channel fails. A link
//! counts those closes and calls itself worn out well before that; its
//! [`Slot`] then opens a fresh connection, and the old one closes by itself
//! once the last publish still using it has its answer. While a successor
//! cannot open (a broker at its connection limit refuses it), the worn link
//! stays in use and the attempts back off as reconnects do.
//!
//! A [`Slot`] reconnects single-flight: one caller connects (bounded by
//! [`CONNECT_TIMEOUT`]) while every other caller gets the worn link if there
//! is one, or is told "unavailable" at once instead of queueing behind it;
//! failed attempts back off from 250 ms to 5 s. Readiness only
//! [`Slot::peek`]s; in `serve` a background task
//! (`RabbitMqExecutor::keep_connected`) reconnects, so no probe waits on a connect.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lapin::options::ConfirmSelectOptions;
use lapin::{Channel, Connection, ConnectionProperties, ConnectionStatus, ErrorKind};

use crate::backoff::Backoff;
use crate::executor::ExecutorError;

use super::nodes::{self, redact};

/// How long opening a connection (TCP, TLS, AMQP handshake) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long opening a channel may take.
pub const CHANNEL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a step on the way out of a connection (a consumer's cancel, a
/// close) waits for the broker's answer before it is given up. A broker that
/// is there answers in milliseconds.
pub const PARTING_TIMEOUT: Duration = Duration::from_secs(1);
/// How often a wait for a channel or a parting step looks whether its connection ended meanwhile.
const LOST_LOOK_EVERY: Duration = Duration::from_millis(50);
/// A link is replaced after this many broker-closed channels (each one a
/// channel number lapin will not use again; RabbitMQ allows 2,047 per connection).
pub(crate) const WEAR_LIMIT: usize = 1_000;

/// The first step of the backoff between reconnects (links and consumers alike).
const FIRST_RETRY: Duration = Duration::from_millis(250);
/// The longest step of that backoff.
const MAX_RETRY: Duration = Duration::from_secs(5);

/// The waits between attempts to reconnect to RabbitMQ.
pub(crate) fn reconnect_backoff() -> Backoff {
    Backoff::new(FIRST_RETRY, MAX_RETRY)
}

/// One connection to the broker.
pub struct Link {
    connection: Connection,
    /// Channels the broker closed on this connection.
    burnt: AtomicUsize,
    wear_limit: usize,
    /// Which connection of its slot this is (1 = the first).
    pub number: u64,
    /// The node it reached (redacted URL): one of several when the URL lists a cluster.
    pub node: String,
}

impl Link {
    async fn open(url: &str, name: &str) -> Result<Link, ExecutorError> {
        let unavailable = |reason: nodes::ConnectError| ExecutorError::Unavailable(format!("RabbitMQ at {}: {reason}", redact(url)));
        let properties = ConnectionProperties::default().with_connection_name(name.into());
        let (connection, node) = nodes::connect(url, properties, CONNECT_TIMEOUT).await.map_err(unavailable)?;
        // A broker that negotiates fewer channels wears a link out sooner.
        let channel_max = match connection.configuration().channel_max() {
            0 => usize::from(u16::MAX),
            max => usize::from(max),
        };
        let wear_limit = WEAR_LIMIT.min(channel_max / 2).max(1);
        Ok(Link { connection, burnt: AtomicUsize::new(0), wear_limit, number: 0, node })
    }

    /// The lapin connection, for steps on the way out of it (see [`parting`]).
    pub fn connection(&self) -> &Connection {
        &self.connection
    }

    pub fn connected(&self) -> bool {
        self.connection.status().connected()
    }

    /// The broker stopped reading from this connection (a memory or disk
    /// alarm, `connection.blocked`): a publish would hang until it lifts.
    pub fn blocked(&self) -> bool {
        self.connection.status().blocked()
    }

    /// Connected, and not so worn that new channels might fail.
    fn usable(&self) -> bool {
        self.connected() && self.burnt.load(Ordering::Relaxed) < self.wear_limit
    }

    /// Records a channel the broker closed (its number is lost for good).
    pub(crate) fn burn(&self) {
        self.burnt.fetch_add(1, Ordering::Relaxed);
    }

    /// The largest frame the broker accepts (content headers must fit in one).
    pub fn frame_max(&self) -> usize {
        match self.connection.configuration().frame_max() {
            0 => usize::MAX,
            max => max as usize,
        }
    }

    /// A new channel, in confirm mode if `confirm`. Failing to open one is "not now".
    pub async fn open_channel(&self, confirm: bool) -> Result<Channel, ChannelError> {
        let open = async {
            let channel = create_channel(&self.connection).await?;
            if confirm {
                channel.confirm_select(ConfirmSelectOptions::default()).await?;
            }
            Ok::<_, lapin::Error>(channel)
        };
        match tokio::time::timeout(CHANNEL_TIMEOUT, open).await {
            Ok(result) => result.map_err(ChannelError::Refused),
            Err(_) => Err(ChannelError::TimedOut),
        }
    }
}

/// Why [`Link::open_channel`] gave no channel.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    #[error("opening a channel: {0}")]
    Refused(#[source] lapin::Error),
    #[error("no channel opened within {CHANNEL_TIMEOUT:?}")]
    TimedOut,
}

/// [`Connection::create_channel`], but failing once the connection ends.
///
/// lapin opens a channel through its connection's command task, which stops
/// when the connection ends; a request queued behind that stop is never run
/// nor refused. So a channel asked for just as the connection drops (lapin
/// still calls it connected) neither opens nor fails: a declare waited out
/// [`CHANNEL_TIMEOUT`] for it. lapin marks the connection lost a moment
/// later; this gives up then.
pub async fn create_channel(connection: &Connection) -> lapin::Result<Channel> {
    tokio::select! {
        biased;
        opened = connection.create_channel() => opened,
        () = until(connection, |status| !status.connected()) => {
            let ended = std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "the connection ended before the channel opened");
            Err(ErrorKind::IOError(Arc::new(ended)).into())
        }
    }
}

/// Runs `step`, a step on the way out of `connection` (a consumer's cancel,
/// a channel's or the connection's own close), best effort: true if the
/// broker answered it, false if it failed, the connection ended first, or
/// no answer came within [`PARTING_TIMEOUT`].
///
/// Such a step is a courtesy: the broker drops a connection's channels and
/// consumers, and requeues what they held, once its TCP connection goes. But
/// lapin's may never end: a close sent as the connection drops can be lost
/// like a channel open (queued behind its connection task's stop, see
/// [`create_channel`]), and one sent into a connection that went silent waits
/// for a close-ok that never comes (lapin stops checking heartbeats once
/// closing); a cancel there waits out lapin's missed-heartbeat check (two
/// minutes at RabbitMQ's default heartbeat).
pub async fn parting<T>(connection: &Connection, step: impl Future<Output = lapin::Result<T>>) -> bool {
    let step = async {
        tokio::select! {
            biased;
            done = step => done.is_ok(),
            // A closing connection is neither connected nor gone yet. One that
            // dropped as the close was asked for can stay "closing" for good,
            // which only the timeout ends.
            () = until(connection, |status| status.closed() || status.errored()) => false,
        }
    };
    tokio::time::timeout(PARTING_TIMEOUT, step).await.unwrap_or(false)
}

/// Returns once `holds` is true of `connection`'s status, looking every [`LOST_LOOK_EVERY`].
async fn until(connection: &Connection, holds: impl Fn(&ConnectionStatus) -> bool) {
    let mut looks = tokio::time::interval(LOST_LOOK_EVERY);
    while !holds(connection.status()) {
        looks.tick().await;
    }
}

/// Keeps one [`Link`] open, replacing it when lost or worn out.
pub struct Slot {
    url: String,
    /// The connection name the broker shows (management UI, `rabbitmqctl`).
    name: String,
    current: std::sync::Mutex<Option<Arc<Link>>>,
    /// Held only by the one caller that is connecting.
    connecting: tokio::sync::Mutex<Connecting>,
    /// How many connections this slot opened after losing one.
    reconnects: AtomicU64,
}

/// What [`Slot::link_or`] does when another caller is connecting.
#[derive(Clone, Copy)]
enum Busy {
    Refuse,
    Wait,
}

/// The connecting caller's state: when it may try again, and how many links it opened.
struct Connecting {
    backoff: Backoff,
    next_attempt: Instant,
    opened: u64,
}

impl Slot {
    /// Connects now: a broker that is down at start is an error, not a retry loop.
    pub async fn connect(url: &str, name: String) -> Result<Slot, ExecutorError> {
        let mut link = Link::open(url, &name).await?;
        link.number = 1;
        Ok(Slot {
            url: url.to_string(),
            name,
            current: std::sync::Mutex::new(Some(Arc::new(link))),
            connecting: tokio::sync::Mutex::new(Connecting { backoff: reconnect_backoff(), next_attempt: Instant::now(), opened: 1 }),
            reconnects: AtomicU64::new(0),
        })
    }

    /// A slot that connects on its first [`Self::link`], for connections
    /// only some deployments need (the consumers').
    pub fn lazy(url: &str, name: String) -> Slot {
        Slot {
            url: url.to_string(),
            name,
            current: std::sync::Mutex::new(None),
            connecting: tokio::sync::Mutex::new(Connecting { backoff: reconnect_backoff(), next_attempt: Instant::now(), opened: 0 }),
            reconnects: AtomicU64::new(0),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Connections opened after one was lost (not counting worn-out replacements).
    pub fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Acquire)
    }

    /// The current link if it is connected (lapin's live connection state),
    /// without trying to reconnect.
    pub fn peek(&self) -> Option<Arc<Link>> {
        self.current.lock().unwrap_or_else(|p| p.into_inner()).clone().filter(|link| link.connected())
    }

    /// Whether the current connection is lost or worn out (then [`Self::link`]
    /// opens another, unless an attempt failed within the backoff).
    pub(crate) fn needs_connecting(&self) -> bool {
        !self.current.lock().unwrap_or_else(|p| p.into_inner()).as_ref().is_some_and(|link| link.usable())
    }

    /// A connected link: the current one, a new one if it was lost or worn
    /// out, or the worn one while its successor cannot open.
    pub async fn link(&self) -> Result<Arc<Link>, ExecutorError> {
        self.link_or(Busy::Refuse).await
    }

    /// [`Self::link`], but a caller that finds another connecting, with no
    /// connected link to go on with, waits for its outcome instead of hearing
    /// "not now": for consumers attaching together, which would otherwise all
    /// but one back off at start.
    pub async fn link_waiting(&self) -> Result<Arc<Link>, ExecutorError> {
        self.link_or(Busy::Wait).await
    }

    async fn link_or(&self, busy: Busy) -> Result<Arc<Link>, ExecutorError> {
        let current = self.current.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(link) = &current
            && link.usable()
        {
            return Ok(link.clone());
        }
        // Single flight: whoever holds the lock connects; everyone else hears "not now" (or waits).
        let mut connecting = match (self.connecting.try_lock(), busy, current) {
            (Ok(connecting), _, _) => connecting,
            // A link that is only worn out still works while its successor opens.
            (Err(_), _, Some(link)) if link.connected() => return Ok(link),
            (Err(_), Busy::Wait, _) => self.connecting.lock().await,
            (Err(_), Busy::Refuse, _) => return Err(self.unavailable("reconnecting")),
        };
        // Someone may have replaced it between our look and the lock.
        let current = self.current.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(link) = &current
            && link.usable()
        {
            return Ok(link.clone());
        }
        // Only worn out, it still works: it carries on while a successor cannot
        // open (a broker at its connection limit), and the attempts back off.
        let worn = current.filter(|link| link.connected());
        let lost = worn.is_none();
        if Instant::now() < connecting.next_attempt {
            return worn.ok_or_else(|| self.unavailable("connection lost; reconnecting"));
        }
        // A lazy slot's first connection is no reconnect.
        let first = connecting.opened == 0;
        // Boxed: connecting is rare, and its future is large; inline it would size every publish's.
        match Box::pin(Link::open(&self.url, &self.name)).await {
            Ok(mut link) => {
                connecting.opened += 1;
                link.number = connecting.opened;
                connecting.backoff.reset();
                let link = Arc::new(link);
                *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(link.clone());
                if first {
                    tracing::debug!(node = %link.node, connection = %self.name, "connected to RabbitMQ");
                } else if lost {
                    self.reconnects.fetch_add(1, Ordering::AcqRel);
                    tracing::info!(node = %link.node, connection = %self.name, "reconnected to RabbitMQ");
                } else {
                    tracing::info!(connection = %self.name, "replaced a connection worn out by broker-closed channels");
                }
                Ok(link)
            }
            Err(err) => {
                let wait = connecting.backoff.next_wait();
                connecting.next_attempt = Instant::now() + wait;
                match worn {
                    Some(link) => {
                        tracing::warn!(connection = %self.name, error = %err, retry_in = ?wait, "could not replace a connection worn out by broker-closed channels; still using it");
                        Ok(link)
                    }
                    None => {
                        tracing::warn!(connection = %self.name, error = %err, retry_in = ?wait, "connecting to RabbitMQ failed");
                        Err(err)
                    }
                }
            }
        }
    }

    fn unavailable(&self, what: &str) -> ExecutorError {
        ExecutorError::Unavailable(format!("RabbitMQ at {}: {what}", redact(&self.url)))
    }
}
