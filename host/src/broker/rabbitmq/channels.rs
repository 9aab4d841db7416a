//! The executor's channels: a bounded pool for confirmed publishes, and one
//! control channel for declares and passive checks, each on its own connection.
//!
//! RabbitMQ answers a bad declare or a passive check of a missing queue by
//! closing the channel, and fails every publish still awaiting its confirm on
//! it. So declares never share a connection with publishes, and a batch of
//! publishes holds its channel alone from send to the last confirm
//! ([`PublishPool::lease`], used by [`super::batch`]). A channel the broker
//! closed is dropped and a fresh one opened on next use; every channel counts
//! itself in [`OpenChannels`] while it lives, so the count is bounded by the
//! pool size plus the control channel.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lapin::Channel;
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::executor::ExecutorError;

use super::link::{Link, Slot};

/// Confirm-mode channels for publishes by default, each carrying a batch of
/// up to [`super::batch::MAX_BATCH`] publishes at a time. With batches, 4 to
/// 64 channels drained the ingress within noise of each other
/// (BENCHMARKS.md, "Ingress drain"); fewer channels are fewer broker processes.
/// RabbitMQ allows 2,047 channels per connection.
pub(crate) const DEFAULT_PUBLISH_CHANNELS: usize = 16;
/// How long a publish may wait for a free channel.
pub(crate) const LEASE_TIMEOUT: Duration = Duration::from_secs(30);

/// How many channels the executor holds open now.
#[derive(Clone, Default)]
pub struct OpenChannels(Arc<AtomicUsize>);

impl OpenChannels {
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// A channel and the link it lives on; counted open until dropped (dropping
/// the last handle of a lapin channel closes it).
struct Counted {
    channel: Channel,
    link: Arc<Link>,
    open: OpenChannels,
}

impl Counted {
    async fn open(link: Arc<Link>, confirm: bool, open: &OpenChannels) -> Result<Counted, ExecutorError> {
        let channel = link.open_channel(confirm).await.map_err(|e| ExecutorError::Unavailable(e.to_string()))?;
        open.0.fetch_add(1, Ordering::Relaxed);
        Ok(Counted { channel, link, open: open.clone() })
    }

    fn usable_on(&self, link: &Arc<Link>) -> bool {
        Arc::ptr_eq(&self.link, link) && self.channel.status().connected()
    }

    /// Forgets the channel. One the broker closed costs its link a channel number.
    fn discard(self) {
        if !self.channel.status().connected() && self.link.connected() {
            self.link.burn();
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.open.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Confirm-mode channels on the publishing connection, one batch each.
pub struct PublishPool {
    slot: Slot,
    size: usize,
    permits: Semaphore,
    idle: std::sync::Mutex<Vec<Counted>>,
    open: OpenChannels,
}

/// One batch's channel, from send to the last confirm. Give it back with
/// [`Lease::release`] only when the channel's state is known to be clean;
/// dropping it otherwise closes the channel.
pub struct Lease<'p> {
    pool: &'p PublishPool,
    channel: Option<Counted>,
    _permit: SemaphorePermit<'p>,
}

impl PublishPool {
    /// A pool of at most `size` channels (at least one).
    pub fn new(slot: Slot, open: OpenChannels, size: usize) -> PublishPool {
        let size = size.max(1);
        PublishPool { slot, size, permits: Semaphore::new(size), idle: Default::default(), open }
    }

    /// The most channels the pool opens at once.
    pub fn size(&self) -> usize {
        self.size
    }

    pub fn slot(&self) -> &Slot {
        &self.slot
    }

    /// Opens every channel of the pool ahead of the first publishes, so a
    /// burst right after start does not wait on channel opens (two round trips
    /// each: open and confirm.select). Channels that cannot open now are
    /// opened on first use, as always.
    pub async fn warm(&self) {
        let leases = futures_util::future::join_all((0..self.size).map(|_| self.lease())).await;
        for lease in leases.into_iter().flatten() {
            lease.release();
        }
    }

    /// A channel of its own for one batch: an idle one on the current
    /// connection, else a new one. Fails fast while the broker is blocked or
    /// unreachable.
    pub async fn lease(&self) -> Result<Lease<'_>, ExecutorError> {
        let permit = tokio::time::timeout(LEASE_TIMEOUT, self.permits.acquire())
            .await
            .map_err(|_| ExecutorError::Unavailable(format!("all {} publish channels stayed busy for {LEASE_TIMEOUT:?}", self.size)))?
            .expect("the semaphore is never closed");
        let link = self.slot.link().await?;
        if link.blocked() {
            return Err(blocked());
        }
        let (idle, stale) = {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            // Channels of a replaced or lost connection go all at once, so the old connection can close.
            let stale: Vec<Counted> = idle.extract_if(.., |channel| !channel.usable_on(&link)).collect();
            (idle.pop(), stale)
        };
        stale.into_iter().for_each(Counted::discard);
        let channel = match idle {
            Some(channel) => channel,
            None => Counted::open(link, true, &self.open).await?,
        };
        Ok(Lease { pool: self, channel: Some(channel), _permit: permit })
    }
}

/// The broker stopped accepting publishes on this connection.
pub fn blocked() -> ExecutorError {
    ExecutorError::Unavailable("RabbitMQ blocked publishing (connection.blocked: a memory or disk alarm); try again later".into())
}

impl Lease<'_> {
    pub fn channel(&self) -> &Channel {
        &self.channel.as_ref().expect("held until dropped").channel
    }

    pub fn link(&self) -> &Arc<Link> {
        &self.channel.as_ref().expect("held until dropped").link
    }

    /// The publish got its answer on an open channel: the next one may use it.
    pub fn release(mut self) {
        if let Some(channel) = self.channel.take() {
            if channel.channel.status().connected() {
                self.pool.idle.lock().unwrap_or_else(|p| p.into_inner()).push(channel);
            } else {
                channel.discard();
            }
        }
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(channel) = self.channel.take() {
            channel.discard();
        }
    }
}

/// One channel for declares and passive checks, on its own connection, used by one caller at a time.
pub struct Control {
    slot: Slot,
    channel: tokio::sync::Mutex<Option<Counted>>,
    open: OpenChannels,
}

/// The control channel, held for one operation.
pub struct ControlGuard<'c> {
    held: tokio::sync::MutexGuard<'c, Option<Counted>>,
    keep: bool,
}

impl Control {
    pub fn new(slot: Slot, open: OpenChannels) -> Control {
        Control { slot, channel: tokio::sync::Mutex::new(None), open }
    }

    pub fn slot(&self) -> &Slot {
        &self.slot
    }

    /// The control channel, reopened if the broker closed it.
    pub async fn channel(&self) -> Result<ControlGuard<'_>, ExecutorError> {
        let mut held = self.channel.lock().await;
        let link = self.slot.link().await?;
        if !held.as_ref().is_some_and(|c| c.usable_on(&link)) {
            if let Some(old) = held.take() {
                old.discard();
            }
            *held = Some(Counted::open(link, false, &self.open).await?);
        }
        Ok(ControlGuard { held, keep: true })
    }
}

impl ControlGuard<'_> {
    pub fn channel(&self) -> &Channel {
        &self.held.as_ref().expect("opened by Control::channel").channel
    }

    /// Closes the channel after this operation (its state is unknown: it timed out).
    pub(crate) fn abandon(&mut self) {
        self.keep = false;
    }
}

impl Drop for ControlGuard<'_> {
    fn drop(&mut self) {
        let closed = self.held.as_ref().is_some_and(|c| !c.channel.status().connected());
        if (closed || !self.keep)
            && let Some(channel) = self.held.take()
        {
            channel.discard();
        }
    }
}
