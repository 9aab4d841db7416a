//! Reading the broker's clock on RabbitMQ, so due times are counted on it
//! (see [`crate::clock`]): AMQP carries no time, but every answer of the
//! management API has a `Date` header. One reading is taken before the
//! service takes any work, a few more a second or so apart right after, then
//! one every [`EVERY`], under the supervisor as `clock-check`.
//!
//! A `Date` names a whole second, so the readings are spread over the
//! broker's second (each wait adds a golden-ratio fraction of a second):
//! each lands at another moment of it, and together they narrow the offset
//! far below a second. Without a management API (or with one that does not
//! answer) nothing is read: due times are counted on the host's clock, as
//! before, and a warning says so once.

use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

use crate::broker::rabbitmq::manage::{Management, ManagementError};
use crate::clock::Clock;
use crate::config::broker::RabbitMqSettings;
use crate::service::Service;

/// How often the broker's clock is read once the first readings are in.
pub const EVERY: Duration = Duration::from_secs(10);
/// Readings taken about a second apart right after the first one.
const QUICK: u64 = 8;
/// How long the start waits for the first reading (a management API that
/// does not answer must not hold the service up for its 10 s timeout).
const FIRST_WITHIN: Duration = Duration::from_secs(2);

/// Why the broker's clock could not be read.
#[derive(Debug, Error)]
pub enum ClockCheckError {
    /// The management API could not be reached, or its answer had no usable `Date`.
    #[error("{0}")]
    Api(#[from] ManagementError),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The blocking task that asked panicked or was cancelled.
    #[error("the reading was lost: {0}")]
    Lost(#[source] tokio::task::JoinError),
}

/// Takes one reading of the broker's clock into `clock`.
pub async fn read_once(api: &Arc<Management>, clock: &Arc<Clock>) -> Result<(), ClockCheckError> {
    let asked = api.clone();
    let reading = tokio::task::spawn_blocking(move || asked.clock_reading()).await.map_err(ClockCheckError::Lost)??;
    clock.record(reading, "the management API's Date header");
    Ok(())
}

/// The first reading, before the service takes work: waited for at most
/// [`FIRST_WITHIN`]. A failure is logged; due times then count on the host's
/// clock until a reading succeeds.
pub async fn first(api: &Arc<Management>, clock: &Arc<Clock>) {
    match read_within(api, clock).await {
        Ok(()) => match clock.offset() {
            Some(offset) => tracing::info!(offset_ms = offset.offset_ms, error_ms = offset.error_ms, "read the broker's clock (offset = broker minus host)"),
            None => tracing::debug!("read the broker's clock"),
        },
        Err(err) => warn_unread(&err),
    }
}

/// [`read_once`], given up after [`FIRST_WITHIN`].
async fn read_within(api: &Arc<Management>, clock: &Arc<Clock>) -> Result<(), ClockCheckError> {
    tokio::time::timeout(FIRST_WITHIN, read_once(api, clock)).await.unwrap_or(Err(ClockCheckError::Timeout(FIRST_WITHIN)))
}

fn warn_unread(err: &ClockCheckError) {
    tracing::warn!(
        error = %err,
        "cannot read the broker's clock from the management API: until it can, deliver_at and other due times are counted on this host's clock, which must then be right (NTP)"
    );
}

/// The wait before reading `k` (from 0): a second for the first [`QUICK`],
/// then [`EVERY`], each plus the golden ratio's fraction of a second, so
/// reading `k` falls `k` × 0.618 s (mod 1 s) into the broker's second: any
/// run of them visits the second evenly (the largest gap left is under a
/// quarter second after ten).
fn wait_before(k: u64) -> Duration {
    let base = if k < QUICK { Duration::from_secs(1) } else { EVERY };
    base + Duration::from_millis(618)
}

/// For a command run once (`schedule --at`, `reschedule`, `cancel`): one
/// reading into `clock` when the broker has a management API.
pub async fn read_for(settings: &RabbitMqSettings, clock: &Arc<Clock>) {
    if let Some(api) = super::manage::management_for(settings)
        && let Err(err) = read_within(&api, clock).await
    {
        warn_unread(&err);
    }
}

/// Reads the broker's clock every [`EVERY`] (after a quick few) until the service stops.
pub(super) fn supervise(service: &Arc<Service>, api: Arc<Management>) {
    let (clock, stop) = (service.scheduler.clock().clone(), service.background.stop.subscribe());
    service.background.supervisor.spawn("clock-check", None, move || {
        let (api, clock, mut stop) = (api.clone(), clock.clone(), stop.clone());
        async move {
            // Whether the last reading failed, so a lasting failure is logged once.
            let mut failing = !clock.is_measured();
            for k in 0.. {
                tokio::select! {
                    _ = tokio::time::sleep(wait_before(k)) => {}
                    _ = stop.wait_for(|stopping| *stopping) => return Ok(()),
                }
                let result = tokio::select! {
                    result = read_once(&api, &clock) => result,
                    _ = stop.wait_for(|stopping| *stopping) => return Ok(()),
                };
                match result {
                    Ok(()) if failing => {
                        failing = false;
                        tracing::info!("reading the broker's clock again: due times count on it");
                    }
                    Ok(()) => {}
                    Err(err) if !failing => {
                        failing = true;
                        warn_unread(&err);
                    }
                    Err(err) => tracing::debug!(error = %err, "reading the broker's clock failed"),
                }
            }
            Ok(())
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_fall_at_spread_moments_of_the_second() {
        let mut at = Duration::ZERO;
        let mut phases: Vec<u128> = (0..QUICK + 4)
            .map(|k| {
                at += wait_before(k);
                at.as_millis() % 1_000
            })
            .collect();
        phases.sort();
        let widest_gap = phases.windows(2).map(|w| w[1] - w[0]).chain([1_000 - phases[phases.len() - 1] + phases[0]]).max().unwrap();
        assert!(widest_gap <= 250, "the readings leave {widest_gap} ms of the second unvisited: {phases:?}");
        assert_eq!(wait_before(QUICK).as_secs(), EVERY.as_secs());
    }
}
