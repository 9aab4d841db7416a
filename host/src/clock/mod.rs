//! Time as hourglass counts it: Unix milliseconds, as the brokers and headers carry them.
//!
//! A delay is relative: its TTLs run on the broker, whose clock does the
//! waiting, so a delay is as long as asked whatever this host's clock says.
//! A *due time* is absolute (`deliver_at`, `hourglass-due-at`, a reschedule,
//! the cancellation log's claims), and an absolute time turned into a delay
//! against a host clock that is ahead makes the message early by as much.
//! So a [`Clock`] counts due times on the broker's clock, as far as readings
//! of it ([`estimate`]; taken by `broker::rabbitmq::clock_check` from the management
//! API on RabbitMQ, by the pumps from SQS's receive stamps) can tell, on the
//! side of what they allow that cannot make a message early: what decides
//! counts from the earliest the broker's clock can read
//! ([`Clock::earliest_ms`]), a delay that becomes a due time from the latest
//! ([`Clock::latest_ms`]). Only reports trust the host's own clock, and only
//! where the readings cannot fault it ([`Clock::now_ms`]). Before any reading
//! (no management API, no pump yet, the memory broker) it is this host's
//! wall clock, as before: then the host's clock must be right (NTP).

pub mod estimate;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use estimate::{Added, Estimate, Reading};

pub fn unix_now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// An HTTP `Date` header (`Fri, 27 Nov 2026 10:31:11 GMT`, RFC 9110's
/// IMF-fixdate) as Unix seconds.
pub(crate) fn parse_http_date_s(text: &str) -> Option<u64> {
    let at = time::OffsetDateTime::parse(text.trim(), &time::format_description::well_known::Rfc2822).ok()?;
    u64::try_from(at.unix_timestamp()).ok()
}

/// The monotonic clock, in ms from an arbitrary start. On Linux the raw one
/// (`CLOCK_MONOTONIC_RAW`): NTP slews the ordinary monotonic clock along with
/// the wall clock (chrony by up to 8 % while it corrects an offset), which
/// would carry a reading of the broker's clock away with it; the raw clock
/// runs at its oscillator's rate, within [`estimate::DRIFT_PPM`].
pub fn monotonic_ms() -> u64 {
    #[cfg(target_os = "linux")]
    {
        let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `now` is a valid timespec for the call to write; the clock id is a constant Linux has had since 2.6.28.
        if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_RAW, &mut now) } == 0 {
            return now.tv_sec as u64 * 1_000 + now.tv_nsec as u64 / 1_000_000;
        }
    }
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed().as_millis() as u64
}

/// A host's wall clock: the system's, or one set off from it.
pub trait WallClock: Send + Sync {
    fn now_ms(&self) -> u64;
}

/// The system's wall clock.
pub(crate) struct SystemClock;

impl WallClock for SystemClock {
    fn now_ms(&self) -> u64 {
        unix_now_ms()
    }
}

/// The system's wall clock moved by an amount that can change while it runs:
/// a host whose clock is wrong, or is stepped, for tests and drills (several
/// hosts in one process, each with its own clock). The monotonic clock is
/// left alone, as a real skewed host's is.
#[derive(Debug, Default)]
pub struct ShiftedClock {
    shift_ms: AtomicI64,
}

impl ShiftedClock {
    pub fn new(shift_ms: i64) -> Arc<ShiftedClock> {
        Arc::new(ShiftedClock { shift_ms: AtomicI64::new(shift_ms) })
    }

    /// Steps the clock to `shift_ms` from the system's.
    pub fn set(&self, shift_ms: i64) {
        self.shift_ms.store(shift_ms, Ordering::SeqCst);
    }
}

impl WallClock for ShiftedClock {
    fn now_ms(&self) -> u64 {
        unix_now_ms().saturating_add_signed(self.shift_ms.load(Ordering::SeqCst))
    }
}

/// A host clock provably further than this from the broker's is warned about.
pub const WARN_OFFSET_MS: u64 = 1_000;
/// Readings that contradict each other are warned about at most this often.
const CONTRADICTION_WARNING_EVERY_MS: u64 = 600_000;

/// What the readings say of this host's wall clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Offset {
    /// The broker's clock minus this host's wall clock, ms: the middle of what the readings allow.
    pub offset_ms: i64,
    /// How far the true offset may be from it, ms.
    pub error_ms: u64,
    /// How long ago the newest reading was taken, ms.
    pub age_ms: u64,
}

impl Offset {
    /// Whether the host's clock is off by more than [`WARN_OFFSET_MS`], beyond the readings' error.
    pub(crate) fn is_skewed(&self) -> bool {
        self.offset_ms.unsigned_abs().saturating_sub(self.error_ms) > WARN_OFFSET_MS
    }
}

/// What has been logged, so a lasting state is not logged at every reading.
#[derive(Default)]
struct Logged {
    /// The offset last warned about, while the host's clock is skewed.
    skewed: Option<i64>,
    /// Monotonic ms of the last warning that readings contradicted each other.
    contradiction: Option<u64>,
}

/// The time due times are counted in: the broker's clock as far as readings
/// tell, else this host's wall clock. One per host, shared by everything in
/// it that compares or makes due times.
pub struct Clock {
    /// Tells this clock from another host's (the canary knows its own probes by it).
    id: String,
    wall: Arc<dyn WallClock>,
    estimate: Mutex<Estimate>,
    logged: Mutex<Logged>,
}

impl Clock {
    /// The system's clock, until readings of the broker's arrive.
    pub fn system() -> Arc<Clock> {
        Clock::new(Arc::new(SystemClock))
    }

    pub fn new(wall: Arc<dyn WallClock>) -> Arc<Clock> {
        Arc::new(Clock { id: uuid::Uuid::new_v4().simple().to_string(), wall, estimate: Mutex::default(), logged: Mutex::default() })
    }

    /// Unique to this clock.
    pub fn id(&self) -> &str {
        &self.id
    }

    fn estimate(&self) -> std::sync::MutexGuard<'_, Estimate> {
        self.estimate.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Unix ms now, never later than the broker's clock reads as far as the
    /// readings tell (this host's wall clock before any reading): what
    /// decides. A `deliver_at` becomes a delay against it, so the message is
    /// late by at most the readings' error, never early; a due time is
    /// compared with it to decide that a message may go (unpark, replay, the
    /// cancellation log's claims). It runs on without jumps (see
    /// [`estimate`]) except when the readings show that a clock jumped.
    pub fn earliest_ms(&self) -> u64 {
        self.read().map_or_else(|| self.wall.now_ms(), |(earliest, _)| earliest)
    }

    /// The earliest and the latest the broker's clock can read now (Unix
    /// ms), under one lock; `None` before any reading.
    fn read(&self) -> Option<(u64, u64)> {
        let now = monotonic_ms();
        let estimate = self.estimate();
        let earliest = (now as i64 + estimate.lower(now)?).max(0) as u64;
        Some((earliest, estimate.bounds(now)?.latest(now)))
    }

    /// Unix ms now as a delay's due time is reported (the time plus the
    /// delay, in the answer and in `hourglass-due-at`): this host's wall
    /// clock unless the readings show it ahead of the broker's or behind the
    /// earliest it can read; then [`Self::earliest_ms`]. A host that NTP
    /// keeps right reports as it always did (a consumer measuring lateness
    /// against `hourglass-due-at` measures it to the millisecond); one whose
    /// clock is off by more than the readings' error reports on the early
    /// side of the broker's clock, so the message (whose TTLs run on the
    /// broker) still arrives at or after the due time it is given. A host off
    /// by less than that error cannot be told from a right one, and reports
    /// as far off as it is.
    pub fn now_ms(&self) -> u64 {
        let host = self.wall.now_ms();
        match self.read() {
            None => host,
            Some((earliest, latest)) if host > latest => earliest,
            Some((earliest, _)) => host.max(earliest),
        }
    }

    /// Unix ms now, never earlier than the broker's clock reads as far as the
    /// readings tell (this host's wall clock before any reading): what a
    /// delay is counted from when it becomes a due time that is then held to
    /// (a `PATCH` with a `delay`), so the message cannot go before the delay
    /// has passed by the broker's clock.
    pub fn latest_ms(&self) -> u64 {
        self.read().map_or_else(|| self.wall.now_ms(), |(_, latest)| latest)
    }

    /// This host's wall clock.
    pub fn host_now_ms(&self) -> u64 {
        self.wall.now_ms()
    }

    /// Whether the broker's clock has been read.
    pub(crate) fn is_measured(&self) -> bool {
        self.estimate().newest().is_some()
    }

    /// What the readings say of this host's wall clock now; `None` before any.
    pub fn offset(&self) -> Option<Offset> {
        let now = monotonic_ms();
        let estimate = self.estimate();
        let bounds = estimate.bounds(now)?;
        let (broker_ms, error_ms) = bounds.middle(now);
        let age_ms = now.saturating_sub(estimate.newest()?);
        drop(estimate);
        Some(Offset { offset_ms: broker_ms - self.wall.now_ms() as i64, error_ms, age_ms })
    }

    /// Takes in a reading of the broker's clock from `source` (for the log),
    /// and warns when this host's wall clock is provably off.
    pub fn record(&self, reading: Reading, source: &str) {
        let added = self.estimate().add(reading);
        let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        if added == Added::Contradicts && logged.contradiction.is_none_or(|at| reading.at.saturating_sub(at) >= CONTRADICTION_WARNING_EVERY_MS) {
            logged.contradiction = Some(reading.at);
            tracing::warn!(%source, "a reading of the broker's clock contradicts the earlier ones: the broker's clock stepped, or this host was suspended (or the broker's nodes disagree); measuring afresh from this reading");
        }
        let Some(offset) = self.offset() else { return };
        if offset.is_skewed() {
            // Once per skew, again when it changes by as much as the threshold.
            if logged.skewed.is_none_or(|warned| warned.abs_diff(offset.offset_ms) >= WARN_OFFSET_MS) {
                logged.skewed = Some(offset.offset_ms);
                tracing::warn!(
                    %source,
                    offset_ms = offset.offset_ms,
                    error_ms = offset.error_ms,
                    "this host's clock is off the broker's by more than {WARN_OFFSET_MS} ms (offset = broker minus host): due times are counted on the broker's clock as read, so nothing is early, but fix the host's clock (NTP)"
                );
            }
        } else if logged.skewed.take().is_some() {
            tracing::info!(%source, offset_ms = offset.offset_ms, error_ms = offset.error_ms, "this host's clock agrees with the broker's again");
        }
    }
}

/// Why a due time given as text (`deliver_at`, `--at`) cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TimeError {
    #[error("{text:?} is not an RFC 3339 time such as 2026-11-23T18:00:00Z ({source})")]
    NotRfc3339 { text: String, source: time::error::Parse },
    #[error("{text:?} is before 1970")]
    Before1970 { text: String },
}

/// An RFC 3339 timestamp (`2026-11-23T18:00:00Z`, `2026-11-23T19:00:00.250+01:00`)
/// as Unix ms, rounded up so a due time never moves earlier.
pub fn parse_rfc3339_ms(text: &str) -> Result<u64, TimeError> {
    let at = time::OffsetDateTime::parse(text.trim(), &time::format_description::well_known::Rfc3339)
        .map_err(|source| TimeError::NotRfc3339 { text: text.to_string(), source })?;
    let nanos = at.unix_timestamp_nanos();
    if nanos < 0 {
        return Err(TimeError::Before1970 { text: text.to_string() });
    }
    Ok((nanos as u128).div_ceil(1_000_000) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_times_with_offsets_and_fractions_are_read_as_unix_ms() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:01Z"), Ok(1_000));
        assert_eq!(parse_rfc3339_ms("1970-01-01T01:00:01.250+01:00"), Ok(1_250));
        // Never earlier: a fraction of a millisecond rounds up.
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00.0001Z"), Ok(1));
        assert!(parse_rfc3339_ms("tomorrow").unwrap_err().to_string().contains("RFC 3339"));
        assert!(parse_rfc3339_ms("2026-11-23 18:00").is_err());
        assert!(parse_rfc3339_ms("1969-12-31T23:59:59Z").unwrap_err().to_string().contains("before 1970"));
    }

    #[test]
    fn an_http_date_is_read_as_unix_seconds() {
        assert_eq!(parse_http_date_s("Thu, 01 Jan 1970 00:00:07 GMT"), Some(7));
        assert_eq!(parse_http_date_s("Fri, 27 Nov 2026 10:31:11 GMT"), Some(1_795_775_471));
        assert_eq!(parse_http_date_s("yesterday"), None);
    }

    #[test]
    fn before_any_reading_the_host_clock_is_the_clock_and_after_one_the_broker_s_earliest() {
        let wall = ShiftedClock::new(5_000);
        let clock = Clock::new(wall.clone());
        assert!(!clock.is_measured() && clock.offset().is_none());
        let host = clock.now_ms();
        assert!(host >= unix_now_ms() + 4_990, "unmeasured, the host's own (skewed) clock is used: {host}");
        // The broker's clock is the system's: a stamp of it taken now.
        let sent = monotonic_ms();
        let stamp = unix_now_ms();
        clock.record(Reading::stamp(stamp, sent, monotonic_ms()), "test");
        let earliest = clock.earliest_ms();
        assert!(earliest <= unix_now_ms(), "never after the broker's clock");
        assert!(unix_now_ms() - earliest < 50, "{} ms before it", unix_now_ms() - earliest);
        assert!(clock.latest_ms() >= unix_now_ms() && clock.latest_ms() - unix_now_ms() < 50);
        // Provably ahead: a delay's due time is reported on the broker's earliest, not the host's clock.
        assert!(clock.now_ms() <= unix_now_ms() && unix_now_ms() - clock.now_ms() < 50);
        let offset = clock.offset().unwrap();
        assert!((offset.offset_ms + 5_000).abs() < 50 && offset.error_ms < 50, "{offset:?}");
        assert!(offset.is_skewed());
        // A step of the host's wall clock moves the offset, not the time due times are counted in.
        wall.set(-10_000);
        assert!((clock.offset().unwrap().offset_ms - 10_000).abs() < 50);
        assert!(unix_now_ms() - clock.earliest_ms() < 50);
        assert!(unix_now_ms() - clock.now_ms() < 50, "10 s behind is corrected too");
    }

    #[test]
    fn a_host_clock_the_readings_cannot_fault_reports_as_it_is_but_decides_nothing() {
        let wall = ShiftedClock::new(0);
        let clock = Clock::new(wall.clone());
        // A Date header of the broker (the system's clock) asked and answered now: a two-second-wide reading.
        let sent = monotonic_ms();
        clock.record(Reading::http_date(unix_now_ms() / 1_000, 2_000, sent, monotonic_ms()), "test");
        assert!(!clock.offset().unwrap().is_skewed());
        let (host, now) = (unix_now_ms(), clock.now_ms());
        assert!(now >= host && now - host < 50, "reported on the host's own clock: {now} vs {host}");
        assert!(clock.earliest_ms() <= unix_now_ms(), "decided on the earliest the broker's clock can read");
        // 5 s behind is outside what the reading allows: reported on the broker's earliest.
        wall.set(-5_000);
        assert!(clock.offset().unwrap().is_skewed());
        assert!(clock.now_ms() + 2_100 >= unix_now_ms() && clock.now_ms() <= unix_now_ms());
    }
}
