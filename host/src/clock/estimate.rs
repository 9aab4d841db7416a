//! What a host can know of the broker's clock: an interval, not a number.
//!
//! Each reading of the broker's time (an HTTP `Date` header, a message's
//! broker stamp) says that the broker's Unix ms minus this host's monotonic
//! ms lay in `[lo, hi]`: the broker's stamp was made somewhere between the
//! request leaving and the answer arriving, and a `Date` header is truncated
//! to the second besides. Readings are anchored on the monotonic clock, not
//! the host's wall clock, so a step of the wall clock (an operator's `date
//! -s`) changes nothing here.
//!
//! Readings are intersected: each narrows what the others allow, so a few,
//! taken at different moments within the broker's second, pin the offset
//! tighter than one `Date` header can. Two clocks never run at exactly the
//! same rate, so what is known is widened by [`DRIFT_PPM`] of its age: old
//! knowledge fades instead of being trusted for ever. A reading that
//! contradicts what is known means a clock jumped (the broker's clock
//! stepped, the host was suspended, the broker's nodes disagree): what was
//! known is dropped for it.
//!
//! The lower bound due times are counted on takes a narrowing in gradually,
//! [`SLEW_PER_MILLE`] of the time passing (as NTP slews a clock instead of
//! stepping it): a lower bound is still a lower bound when it is lower than
//! it could be, and a clock that does not jump keeps "now minus a due time
//! counted a moment ago" honest (the canary's lateness). Only a
//! contradiction moves it at once.

/// How far two clocks may drift apart, per million. The monotonic clock read
/// is the raw one (see [`super::monotonic_ms`]), which NTP does not speed up
/// or slow down, so this is its oscillator against the broker's disciplined
/// clock: within 50 ppm for ordinary quartz, four times that for room.
pub const DRIFT_PPM: u64 = 200;
/// How fast a better lower bound is taken in, per thousand of the time
/// passing: 10 ms a second.
pub const SLEW_PER_MILLE: u64 = 10;

/// One reading: the broker's Unix ms minus the host's monotonic ms lay
/// within `[lo, hi]` at monotonic time `at`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    pub lo: i64,
    pub hi: i64,
    /// Monotonic ms at which it was taken (when the answer arrived).
    pub at: u64,
}

impl Reading {
    /// A broker stamp of `stamp_ms` (Unix ms) made while a request was out:
    /// sent at monotonic `sent` ms, answered at `received` ms (both as read,
    /// whole ms rounded down: `received` is counted a millisecond later so
    /// the bound stays a bound).
    pub fn stamp(stamp_ms: u64, sent: u64, received: u64) -> Reading {
        let stamp = stamp_ms as i64;
        // The stamp is whole ms too: the broker's clock read up to 1 ms past it.
        Reading { lo: stamp - (received as i64 + 1), hi: stamp + 1 - sent as i64, at: received }
    }

    /// An HTTP `Date` header naming second `date_s`, asked at monotonic
    /// `sent` and answered at `received`. The header is whole seconds, and a
    /// server may cache it: RabbitMQ's (Cowboy's) is renewed once a second,
    /// not on the second, so the broker's clock reads up to `staleness_ms`
    /// past the second named when the answer leaves. The lower end is hard
    /// (a `Date` is never ahead of the clock it was read from); the upper end
    /// only as good as that allowance.
    pub(crate) fn http_date(date_s: u64, staleness_ms: u64, sent: u64, received: u64) -> Reading {
        let date_ms = (date_s * 1_000) as i64;
        Reading { lo: date_ms - (received as i64 + 1), hi: date_ms + staleness_ms as i64 - sent as i64, at: received }
    }

    /// Its interval at monotonic `now` (at or after it was taken), widened for drift since.
    fn at(&self, now: u64) -> (i64, i64) {
        let widen = (now.saturating_sub(self.at) * DRIFT_PPM).div_ceil(1_000_000) as i64;
        (self.lo - widen, self.hi + widen)
    }
}

/// The broker's clock as known at one moment: its Unix ms minus the host's
/// monotonic ms lies within `[lo, hi]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub lo: i64,
    pub hi: i64,
}

impl Bounds {
    /// The earliest the broker's clock can read at monotonic `now` (Unix ms).
    pub fn earliest(&self, now: u64) -> u64 {
        (now as i64 + self.lo).max(0) as u64
    }

    /// The latest the broker's clock can read at monotonic `now` (Unix ms).
    pub fn latest(&self, now: u64) -> u64 {
        (now as i64 + self.hi).max(0) as u64
    }

    /// The middle of what it can read at monotonic `now` (Unix ms), and half the width.
    pub fn middle(&self, now: u64) -> (i64, u64) {
        let width = (self.hi - self.lo) as u64;
        (now as i64 + self.lo + (width / 2) as i64, width.div_ceil(2))
    }
}

/// What adding a reading did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Added {
    /// It agrees with what was known (and may have narrowed it), or is the first.
    Agrees,
    /// It contradicts what was known: a clock jumped; only it is known now.
    Contradicts,
}

#[derive(Debug, Default)]
pub struct Estimate {
    /// What every reading so far allows (widened to its `at`).
    known: Option<Reading>,
    /// The lower bound in use, `(lo, at)`: it rises toward `known`'s at
    /// [`SLEW_PER_MILLE`], and never above it.
    used: Option<(i64, u64)>,
}

impl Estimate {
    pub fn add(&mut self, reading: Reading) -> Added {
        let Some(known) = self.known else {
            self.known = Some(reading);
            self.used = Some((reading.lo, reading.at));
            return Added::Agrees;
        };
        // Readings from different tasks may come in slightly out of order.
        let at = known.at.max(reading.at);
        let ((known_lo, known_hi), (lo, hi)) = (known.at(at), reading.at(at));
        let (lo, hi) = (known_lo.max(lo), known_hi.min(hi));
        if lo > hi {
            self.known = Some(reading);
            self.used = Some((reading.lo, reading.at));
            return Added::Contradicts;
        }
        // Taken in from where the bound in use is now: no jump.
        self.used = Some((self.lower(at).expect("known"), at));
        self.known = Some(Reading { lo, hi, at });
        Added::Agrees
    }

    /// What the readings allow at monotonic `now`; `None` before the first.
    pub fn bounds(&self, now: u64) -> Option<Bounds> {
        let (lo, hi) = self.known?.at(now);
        Some(Bounds { lo, hi })
    }

    /// The lower bound due times count on at monotonic `now`: at most
    /// [`Self::bounds`]' own, reaching it at [`SLEW_PER_MILLE`].
    pub fn lower(&self, now: u64) -> Option<i64> {
        let (known_lo, _) = self.known?.at(now);
        let (used, since) = self.used?;
        let slewed = used + (now.saturating_sub(since) * SLEW_PER_MILLE / 1_000) as i64;
        Some(known_lo.min(slewed))
    }

    /// Monotonic ms of the newest reading.
    pub fn newest(&self) -> Option<u64> {
        self.known.map(|r| r.at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The broker's clock is `offset` ms ahead of the monotonic one; a
    /// `Date` read at monotonic `at` (answered in `rtt` ms).
    fn date_reading(offset: i64, at: u64, rtt: u64) -> Reading {
        let broker_ms = (at as i64 + offset) as u64;
        Reading::http_date(broker_ms / 1_000, 2_000, at - rtt, at)
    }

    #[test]
    fn one_date_header_bounds_the_offset_within_its_second_and_staleness() {
        let mut estimate = Estimate::default();
        assert_eq!(estimate.bounds(0), None);
        assert_eq!(estimate.lower(0), None);
        // The broker reads 1_000_700 at monotonic 10_000: its Date says 1_000 s.
        assert_eq!(estimate.add(date_reading(990_700, 10_000, 4)), Added::Agrees);
        let bounds = estimate.bounds(10_000).unwrap();
        assert!(bounds.lo <= 990_700 && 990_700 <= bounds.hi, "{bounds:?}");
        assert_eq!(bounds.lo, 1_000_000 - 10_001);
        assert_eq!(bounds.earliest(10_000), 999_999, "never after the broker's clock");
        assert_eq!(bounds.hi - bounds.lo, 2_000 + 4 + 1);
        assert_eq!(estimate.lower(10_000), Some(bounds.lo), "the first reading is taken at once");
    }

    #[test]
    fn readings_at_different_moments_within_the_second_narrow_the_interval() {
        let mut estimate = Estimate::default();
        let offset = 1_700_000_000_123;
        // Readings a second and 0.618 s apart, as the clock check takes them.
        for k in 0..12u64 {
            let at = 1_000 + k * 1_618;
            assert_eq!(estimate.add(date_reading(offset, at, 3)), Added::Agrees);
            let bounds = estimate.bounds(at).unwrap();
            assert!(bounds.lo <= offset && offset <= bounds.hi, "reading {k}: {bounds:?} lost the true offset");
            assert!(estimate.lower(at).unwrap() <= bounds.lo);
        }
        let last = 1_000 + 11 * 1_618;
        let bounds = estimate.bounds(last).unwrap();
        assert!(offset - bounds.lo < 150, "a dozen readings leave {} ms below the truth", offset - bounds.lo);
        // The bound in use gets there at 10 ms a second, never above it.
        let lower = |now| estimate.lower(now).unwrap();
        assert!(lower(last) < bounds.lo);
        assert_eq!(lower(last + 1_000) - lower(last), 10);
        assert_eq!(lower(last + 1_000_000), estimate.bounds(last + 1_000_000).unwrap().lo);
    }

    #[test]
    fn what_is_known_widens_with_age() {
        let mut estimate = Estimate::default();
        estimate.add(Reading { lo: 100, hi: 200, at: 0 });
        // 10 s later, 200 ppm: 2 ms wider on each side.
        assert_eq!(estimate.bounds(10_000), Some(Bounds { lo: 98, hi: 202 }));
        estimate.add(Reading { lo: 150, hi: 300, at: 10_000 });
        assert_eq!(estimate.bounds(10_000), Some(Bounds { lo: 150, hi: 202 }));
        // A day without readings: 17 s either way, fading rather than trusted for ever.
        assert_eq!(estimate.bounds(10_000 + 86_400_000), Some(Bounds { lo: 150 - 17_280, hi: 202 + 17_280 }));
        assert_eq!(estimate.newest(), Some(10_000));
    }

    #[test]
    fn a_reading_that_contradicts_what_is_known_replaces_it_at_once() {
        let mut estimate = Estimate::default();
        estimate.add(Reading { lo: 100, hi: 200, at: 0 });
        // The broker's clock stepped back 10 s.
        assert_eq!(estimate.add(Reading { lo: -9_900, hi: -9_800, at: 1_000 }), Added::Contradicts);
        assert_eq!(estimate.bounds(1_000), Some(Bounds { lo: -9_900, hi: -9_800 }));
        assert_eq!(estimate.lower(1_000), Some(-9_900));
        // And forward again (a suspended host wakes): taken at once too.
        assert_eq!(estimate.add(Reading { lo: 50_000, hi: 50_100, at: 2_000 }), Added::Contradicts);
        assert_eq!(estimate.lower(2_000), Some(50_000));
    }

    #[test]
    fn the_clock_counted_on_never_runs_backwards_as_readings_come_in() {
        let mut estimate = Estimate::default();
        let offset = 5_000_000;
        let mut previous = 0;
        for k in 0..200u64 {
            let at = 1_000 + k * 1_618;
            estimate.add(date_reading(offset, at, 2));
            for now in [at, at + 800] {
                let counted = now as i64 + estimate.lower(now).unwrap();
                assert!(counted >= previous, "ran back from {previous} to {counted} at reading {k}");
                assert!(counted <= now as i64 + offset, "after the broker's clock at reading {k}");
                previous = counted;
            }
        }
    }

    #[test]
    fn a_stamp_bounds_the_offset_by_the_round_trip() {
        // Stamped 5_000 (broker ms) while out from 100 to 120 (monotonic).
        let reading = Reading::stamp(5_000, 100, 120);
        assert_eq!((reading.lo, reading.hi, reading.at), (5_000 - 121, 4_901, 120));
        assert_eq!(Bounds { lo: reading.lo, hi: reading.hi }.middle(120), (5_010, 11));
    }
}
