//! Moving the messages waiting in one strategy's queues into another
//! strategy, each keeping its due time: the upgrade from classic to quorum
//! levels, or from one topology to another, while messages are in flight.
//!
//! Queue by queue, longest TTL first (a message that drops to a shorter level
//! meanwhile is met again there), messages are taken unacked in batches,
//! scheduled through the target strategy at their `hourglass-due-at` with a
//! confirmed publish, and only then acked: never early (the target plans the
//! time left, rounded up), never lost (a message not yet acked goes back to
//! its queue if anything fails). A message without hourglass's due time and
//! destination headers (scheduled by another client, or before hourglass
//! wrote its destination) is given back and counted, not guessed at; so is a
//! queue that exists but cannot be read now.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use thiserror::Error;

use crate::broker::rabbitmq::manage::{Management, ManagementError};
use crate::broker::rabbitmq::take::{Taken, Taker};
use crate::config::broker::RabbitMqSettings;
use crate::config::{Config, UnknownStrategy};
use crate::executor::{Broker, ExecutorError};
use crate::headers::DUE_AT_HEADER;
use crate::message::Delivery;
use crate::render;
use crate::report::{CommandError, Progress, Transfer, Verdict};
use crate::scheduler::strategies::Strategies;
use crate::scheduler::{ScheduleError, ScheduleRequest, Scheduler};

#[derive(Debug, Error)]
pub enum TransferError {
    #[error(transparent)]
    UnknownStrategy(#[from] UnknownStrategy),
    #[error("--from and --to name the same strategy")]
    SameStrategy,
    #[error("strategy {0:?} declares its queues per message; listing them needs the management API (broker.management_url)")]
    NeedsManagement(String),
    #[error("listing the queues strategy {from:?} declared per message: {source}")]
    ListQueues { from: String, source: ManagementError },
    #[error("strategy {0:?} has no queues where messages wait")]
    NoQueues(String),
    #[error(transparent)]
    Broker(#[from] ExecutorError),
}

/// What a transfer did (or, dry, would do), per source queue.
#[derive(Clone, Debug, Default, Serialize)]
pub struct QueueSummary {
    pub queue: String,
    /// Messages waiting when the queue was first read.
    pub found: u64,
    pub moved: u64,
    /// Given back, by reason.
    pub left: BTreeMap<String, u64>,
    /// Why the queue could not be read (it exists but is out of reach: its
    /// home node down, exclusive to another connection): whatever it holds stays.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    pub from: String,
    pub to: String,
    pub dry_run: bool,
    pub queues: Vec<QueueSummary>,
    pub moved: u64,
    pub left: u64,
    /// Queues that could not be read: never taken for empty, so the old
    /// topology is not deleted with messages still in it.
    pub unreadable: u64,
    /// The earliest and latest due time (Unix ms) among the moved messages.
    pub earliest_due_ms: Option<u64>,
    pub latest_due_ms: Option<u64>,
}

/// The source strategy's waiting queues, longest TTL first: its static
/// topology's, and those it declared per message (hold queues), which the
/// management API lists.
fn source_queues(scheduler: &Scheduler<Broker>, management: Option<&Management>, from: &str, to: &str) -> Result<Vec<String>, TransferError> {
    let names = scheduler.strategy_names();
    for name in [from, to] {
        if !names.iter().any(|n| n == name) {
            return Err(UnknownStrategy { name: name.to_string(), configured: names }.into());
        }
    }
    if from == to {
        return Err(TransferError::SameStrategy);
    }
    let mut queues = scheduler.waiting_queues().remove(from).unwrap_or_default();
    if let Some(exchanges) = scheduler.per_message_queue_targets().remove(from) {
        let Some(api) = management else {
            return Err(TransferError::NeedsManagement(from.to_string()));
        };
        let found = tokio::task::block_in_place(|| api.queues_dead_lettering_to(&exchanges))
            .map_err(|source| TransferError::ListQueues { from: from.to_string(), source })?;
        queues.extend(found.into_iter().map(|(queue, _, ttl)| (queue, ttl)));
    }
    if queues.is_empty() {
        return Err(TransferError::NoQueues(from.to_string()));
    }
    queues.sort_by_key(|(_, ttl)| std::cmp::Reverse(ttl.unwrap_or(0)));
    Ok(queues.into_iter().map(|(queue, _)| queue).collect())
}

/// The request that moves `delivery` to `to`, or why it stays.
fn request_for(delivery: &Delivery, to: &str) -> Result<(ScheduleRequest, u64), &'static str> {
    let headers = &delivery.properties.headers;
    let due = headers.get(DUE_AT_HEADER).and_then(|v| v.as_whole_number()).and_then(|n| u64::try_from(n).ok()).ok_or("no hourglass-due-at header")?;
    Ok((ScheduleRequest::again(delivery, to, due)?, due))
}

/// Moves every message waiting in `from`'s queues to `to`; with `dry_run`, only counts them.
/// `progress` hears of each batch: (queue, messages moved in it).
#[allow(clippy::too_many_arguments)]
pub async fn transfer(
    scheduler: &Scheduler<Broker>,
    taker: &Taker,
    management: Option<&Management>,
    from: &str,
    to: &str,
    dry_run: bool,
    batch: usize,
    mut progress: impl FnMut(&str, u64),
) -> Result<Summary, TransferError> {
    let queues = source_queues(scheduler, management, from, to)?;
    let mut summary = Summary { from: from.into(), to: to.into(), dry_run, ..Default::default() };
    for queue in queues {
        // A queue the broker says does not exist holds nothing; one it cannot read now may hold anything.
        let found = match taker.depth(&queue).await {
            Ok(depth) => depth.unwrap_or(0) as u64,
            Err(err) => {
                summary.unreadable += 1;
                summary.queues.push(QueueSummary { queue, unreadable: Some(err.to_string()), ..Default::default() });
                continue;
            }
        };
        let mut counts = QueueSummary { queue: queue.clone(), found, ..Default::default() };
        if !dry_run && found > 0 {
            move_queue(scheduler, taker, &queue, to, batch.max(1), &mut counts, &mut summary, &mut progress).await?;
        }
        summary.left += counts.left.values().sum::<u64>();
        summary.queues.push(counts);
    }
    Ok(summary)
}

#[allow(clippy::too_many_arguments)]
async fn move_queue(
    scheduler: &Scheduler<Broker>,
    taker: &Taker,
    queue: &str,
    to: &str,
    batch: usize,
    counts: &mut QueueSummary,
    summary: &mut Summary,
    progress: &mut impl FnMut(&str, u64),
) -> Result<(), TransferError> {
    // Messages that stay are held unacked until the queue is done, so basic.get moves past them.
    let mut staying: Vec<Taken> = Vec::new();
    let result = async {
        loop {
            let taken = taker.take_spread(queue, batch).await?;
            if taken.is_empty() {
                return Ok(());
            }
            let mut moving = Vec::new();
            let mut requests = Vec::new();
            for message in taken {
                match request_for(&message.delivery, to) {
                    Ok((request, due)) => {
                        requests.push(request);
                        moving.push((message, due));
                    }
                    Err(reason) => {
                        *counts.left.entry(reason.to_string()).or_default() += 1;
                        staying.push(message);
                    }
                }
            }
            let results = scheduler.schedule_many(requests, batch).await;
            let mut confirmed = Vec::with_capacity(moving.len());
            let mut unavailable = None;
            for ((message, due), result) in moving.into_iter().zip(results) {
                match result {
                    Ok(_) => {
                        confirmed.push(message);
                        summary.earliest_due_ms = Some(summary.earliest_due_ms.map_or(due, |d| d.min(due)));
                        summary.latest_due_ms = Some(summary.latest_due_ms.map_or(due, |d| d.max(due)));
                    }
                    // The broker went away: what it confirmed is acked, the rest goes back, and the transfer stops.
                    Err(ScheduleError::Broker(err @ ExecutorError::Unavailable(_))) => {
                        staying.push(message);
                        unavailable.get_or_insert(err);
                    }
                    Err(err) => {
                        *counts.left.entry(format!("refused by {to}: {err}")).or_default() += 1;
                        staying.push(message);
                    }
                }
            }
            let moved = confirmed.len() as u64;
            taker.ack_all(confirmed).await?;
            counts.moved += moved;
            summary.moved += moved;
            progress(queue, moved);
            if let Some(err) = unavailable {
                return Err(TransferError::Broker(err));
            }
        }
    }
    .await;
    taker.give_back_all(staying).await;
    result
}

/// `hourglass transfer` on RabbitMQ: counts what waits in the source
/// strategy's queues, then (unless a dry run) moves it, telling `progress`.
pub async fn transfer_command(
    settings: &RabbitMqSettings,
    config: &Config,
    strategies: Strategies,
    request: &Transfer,
    progress: &mut dyn Progress,
) -> Result<Verdict, CommandError> {
    let scheduler = Scheduler::new(config, strategies, super::connect(settings).await?.into());
    let taker = Taker::open_spread(&settings.url).await?;
    let management = super::manage::management_for(settings);
    let mut started = std::time::Instant::now();
    let summary = async {
        let Transfer { from, to, dry_run, batch } = request;
        let found = transfer(&scheduler, &taker, management.as_deref(), from, to, true, *batch, |_, _| {}).await?;
        progress.begin(found.queues.iter().map(|q| q.found).sum());
        started = std::time::Instant::now();
        match dry_run {
            true => Ok(found),
            false => transfer(&scheduler, &taker, management.as_deref(), from, to, false, *batch, |queue, moved| progress.advance(moved, queue)).await,
        }
    }
    .await;
    taker.close().await;
    let summary = summary.map_err(|e| CommandError::failed("transfer", e))?;
    let json = serde_json::to_value(&summary).map_err(|e| CommandError::failed("writing the report", e))?;
    Ok(Verdict { passed: summary.left == 0 && summary.unreadable == 0, table: summary_table(&summary, started.elapsed()), json })
}

fn summary_table(summary: &Summary, took: std::time::Duration) -> String {
    let rows: Vec<Vec<String>> = summary
        .queues
        .iter()
        .filter(|q| q.found > 0 || q.moved > 0 || !q.left.is_empty() || q.unreadable.is_some())
        .map(|q| {
            let unreadable = q.unreadable.iter().map(|why| format!("all: could not be read ({why})"));
            let left = q.left.iter().map(|(why, n)| format!("{n} ({why})")).chain(unreadable).collect::<Vec<_>>().join("; ");
            vec![q.queue.clone(), q.found.to_string(), q.moved.to_string(), left]
        })
        .collect();
    let mut table = render::table(&["QUEUE", "FOUND", "MOVED", "LEFT"], &rows);
    let due = |ms: Option<u64>| {
        ms.map_or("-".to_string(), |ms| humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms)).to_string())
    };
    if summary.unreadable > 0 {
        let _ = writeln!(table, "{} of {}'s queues could not be read: what they hold was not counted or moved", summary.unreadable, summary.from);
    }
    if summary.dry_run {
        let found: u64 = summary.queues.iter().map(|q| q.found).sum();
        let _ = writeln!(table, "dry run: {found} messages wait in {}'s queues; nothing was moved", summary.from);
    } else {
        let _ = writeln!(
            table,
            "moved {} messages from {} to {} in {:.1?} (due {} to {}); {} left in place",
            summary.moved,
            summary.from,
            summary.to,
            took,
            due(summary.earliest_due_ms),
            due(summary.latest_due_ms),
            summary.left
        );
    }
    table
}
