//! The seeded schedule: which fault starts when, for how long. The same seed
//! and duration give the same schedule, printed before the run so a failing
//! run can be read and replayed.
//!
//! Faults come in rounds: each round is every kind once, in an order drawn
//! from the seed, so a long run injects every kind about as often as the
//! others. Gaps between starts are drawn too, shorter than most faults last,
//! so faults overlap (a host killed while the broker restarts).

use std::fmt;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};

/// What a fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `kill -9` of the broker's VM, then a boot on the same data.
    BrokerKill9,
    /// A clean stop of the broker, then a boot.
    BrokerStopStart,
    /// `kill -9` of one host, then a new one on the same config.
    HostKill9,
    /// The proxy in front of one host's broker connections swallows everything for a while.
    ConnectionBlackhole,
    /// The proxy drops every connection at once.
    ConnectionReset,
    /// Bad HTTP requests and bad ingress messages, in a burst, beside the canaries.
    BadInputFlood,
    /// A canary destination queue deleted (when empty), declared again later.
    DestinationDeleted,
    /// The delayed exchange's `deliver_to` deleted, declared and bound again later.
    ExchangeDeleted,
    /// `POST /v1/reload` on one host.
    ConfigReload,
}

impl Kind {
    pub const ALL: [Kind; 9] = [
        Kind::BrokerKill9,
        Kind::BrokerStopStart,
        Kind::HostKill9,
        Kind::ConnectionBlackhole,
        Kind::ConnectionReset,
        Kind::BadInputFlood,
        Kind::DestinationDeleted,
        Kind::ExchangeDeleted,
        Kind::ConfigReload,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::BrokerKill9 => "broker-kill9",
            Kind::BrokerStopStart => "broker-stop-start",
            Kind::HostKill9 => "host-kill9",
            Kind::ConnectionBlackhole => "connection-blackhole",
            Kind::ConnectionReset => "connection-reset",
            Kind::BadInputFlood => "bad-input-flood",
            Kind::DestinationDeleted => "destination-deleted",
            Kind::ExchangeDeleted => "exchange-deleted",
            Kind::ConfigReload => "config-reload",
        }
    }
}

/// One fault of the schedule.
#[derive(Clone, Copy, Debug)]
pub struct Planned {
    /// From the start of the traffic.
    pub at: Duration,
    pub kind: Kind,
    /// How long the fault holds (the broker stays down, the proxy dark, the queue gone); 0 for instant ones.
    pub hold: Duration,
    /// Which of the hosts, for the faults aimed at one.
    pub host: usize,
}

impl fmt::Display for Planned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t={:>6.1}s {:<21} hold={:.1}s host={}", self.at.as_secs_f64(), self.kind.name(), self.hold.as_secs_f64(), self.host)
    }
}

/// Faults start after this much clean traffic, and none starts in the last
/// stretch of the run, so every canary has a quiet phase to compare with.
pub const QUIET_EDGE: Duration = Duration::from_secs(8);
/// Shortest and longest gap between two starts.
const GAP_MS: std::ops::Range<u64> = 3_000..15_000;

/// The schedule for `seconds` of traffic with `hosts` hosts.
pub fn draw(seed: u64, seconds: u64, hosts: usize) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(seed);
    let end = Duration::from_secs(seconds).saturating_sub(QUIET_EDGE);
    let mut at = QUIET_EDGE;
    let mut round = Vec::new();
    let mut plan = Vec::new();
    while at < end {
        if round.is_empty() {
            round = Kind::ALL.to_vec();
            round.shuffle(&mut rng);
        }
        let kind = round.pop().expect("a round is never empty here");
        let hold = match kind {
            Kind::BrokerKill9 | Kind::BrokerStopStart => Duration::from_millis(rng.random_range(500..4_000)),
            Kind::ConnectionBlackhole => Duration::from_millis(rng.random_range(1_000..8_000)),
            Kind::DestinationDeleted | Kind::ExchangeDeleted => Duration::from_millis(rng.random_range(1_000..6_000)),
            Kind::HostKill9 => Duration::from_millis(rng.random_range(200..2_000)),
            Kind::ConnectionReset | Kind::BadInputFlood | Kind::ConfigReload => Duration::ZERO,
        };
        plan.push(Planned { at, kind, hold, host: rng.random_range(0..hosts) });
        at += Duration::from_millis(rng.random_range(GAP_MS));
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_draws_the_same_schedule_and_every_kind_comes_round() {
        let first: Vec<String> = draw(7, 3_600, 2).iter().map(ToString::to_string).collect();
        let again: Vec<String> = draw(7, 3_600, 2).iter().map(ToString::to_string).collect();
        assert_eq!(first, again);
        let other: Vec<String> = draw(8, 3_600, 2).iter().map(ToString::to_string).collect();
        assert_ne!(first, other);
        for kind in Kind::ALL {
            let count = draw(7, 3_600, 2).iter().filter(|p| p.kind == kind).count();
            assert!(count >= 10, "{} drawn {count} times in an hour", kind.name());
        }
    }
}
