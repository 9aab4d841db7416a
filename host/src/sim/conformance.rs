//! `check-planner`: does a planner keep its promises?
//!
//! A planner declares which delays it delivers ([`DelayRange`]). For a spread
//! of delays — edges of its granularity, powers of two, its maximum, one past
//! it, and seeded random ones — the check plans each message, runs it on the
//! simulator and compares: the plan must promise the delay rounded up to the
//! planner's granularity, and the message must arrive exactly then. Delays
//! beyond the maximum must be refused. The same request must get the same
//! plan, and each message must reach its destination once, leaving no copy
//! waiting anywhere on the way.

use std::collections::HashMap;

use serde::Serialize;

use crate::planner::{DelayRange, Granularity, LoadedPlanner, PlanRequest};
use crate::sim::simulation::{Simulation, SimulationError};

/// The promises every planner must keep, in the order they are checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Property {
    /// The same request gets the same plan.
    Deterministic,
    /// The plan promises the delay rounded up to the declared granularity.
    Promise,
    /// The message arrives exactly when promised: never early, never late.
    OnTime,
    /// A delay beyond the declared maximum is refused, not delivered.
    RefusedBeyondMax,
    /// One copy reaches the destination, and none is left waiting on the way.
    OneDelivery,
}

impl Property {
    pub const ALL: [Property; 5] = [Property::Deterministic, Property::Promise, Property::OnTime, Property::RefusedBeyondMax, Property::OneDelivery];

    pub fn name(self) -> &'static str {
        match self {
            Property::Deterministic => "deterministic",
            Property::Promise => "promise",
            Property::OnTime => "on-time",
            Property::RefusedBeyondMax => "refused-beyond-max",
            Property::OneDelivery => "one-delivery",
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Failure {
    pub property: Property,
    pub delay_ms: u64,
    pub expected: String,
    pub got: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub planner: String,
    /// How many delays were checked.
    pub checked: usize,
    pub properties: Vec<Property>,
    pub failures: Vec<Failure>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// SplitMix64, for reproducible random delays.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The delays worth checking for a range: edges, powers of two, the maximum,
/// one past it, and `random` seeded samples — all up to `horizon_ms`, since a
/// pump-driven planner takes one simulated step per cycle and a ten-year
/// maximum would take hundreds of thousands of them.
pub fn delays_to_check(range: &DelayRange, seed: u64, random: usize, horizon_ms: u64) -> Vec<u64> {
    let max = range.max_delay_ms.min(horizon_ms);
    let mut delays = vec![0, 1, max, max.saturating_sub(1)];
    match &range.granularity {
        Granularity::Uniform(step) => {
            let step = (*step).max(1);
            let mut multiple = step;
            while multiple <= max {
                delays.extend([multiple - 1, multiple, multiple + 1]);
                multiple = match multiple.checked_mul(2) {
                    Some(m) => m,
                    None => break,
                };
            }
            delays.extend([3 * step, 5 * step, 7 * step, 10 * step].into_iter().filter(|&d| d <= max));
        }
        Granularity::Listed(listed) => {
            for &d in listed.iter().filter(|&&d| d <= max) {
                delays.extend([d.saturating_sub(1), d, d + 1]);
            }
        }
    }
    let mut state = seed;
    for _ in 0..random {
        delays.push(splitmix64(&mut state) % max.saturating_add(1).max(1));
    }
    delays.retain(|&d| d <= max);
    if range.max_delay_ms <= horizon_ms {
        delays.push(range.max_delay_ms.saturating_add(1));
    }
    delays.sort_unstable();
    delays.dedup();
    delays
}

/// Checks every [`Property`] for each delay, collecting every broken promise.
pub fn check(planner: &mut LoadedPlanner, destination: &str, delays: &[u64]) -> Result<Report, SimulationError> {
    let range = planner.delay_range().clone();
    let label = planner.label().to_string();
    let mut failures = Vec::new();
    for &delay_ms in delays {
        let request = PlanRequest { destination: destination.to_string(), delay_ms, message_id: "conformance".into(), routing_key: None };
        let answer = |planner: &LoadedPlanner| match planner.plan(&request) {
            Ok(plan) => format!("{plan:?}"),
            Err(err) => format!("error: {err}"),
        };
        let (first, second) = (answer(planner), answer(planner));
        if first != second {
            failures.push(Failure { property: Property::Deterministic, delay_ms, expected: first, got: second });
        }
    }
    let mut simulation = Simulation::new(planner, destination)?;
    let mut delay_of = HashMap::new();
    for &delay_ms in delays {
        let outcome = simulation.run(&[delay_ms])?.remove(0);
        delay_of.insert(outcome.id.clone(), delay_ms);
        let mut fail = |property, expected: String, got: String| failures.push(Failure { property, delay_ms, expected, got });
        match range.promise(delay_ms) {
            None => {
                if let Some(arrival) = outcome.arrival_ms {
                    fail(Property::RefusedBeyondMax, "refusal: beyond the declared maximum".into(), format!("delivered after {arrival}ms"));
                }
            }
            Some(expected) => {
                if outcome.promised_ms != Some(expected) {
                    let got = match (outcome.promised_ms, &outcome.problem) {
                        (Some(p), _) => format!("plan promised {p}ms"),
                        (None, Some(problem)) => problem.clone(),
                        (None, None) => "no plan".into(),
                    };
                    fail(Property::Promise, format!("plan promising {expected}ms"), got);
                } else if outcome.arrival_ms != Some(expected) {
                    let got = match (outcome.arrival_ms, &outcome.problem) {
                        (Some(a), _) => format!("arrived after {a}ms"),
                        (None, Some(problem)) => problem.clone(),
                        (None, None) => "never arrived".into(),
                    };
                    fail(Property::OnTime, format!("arrival after {expected}ms"), got);
                }
            }
        }
    }
    let leftovers = simulation.settle(delays.len());
    for (id, _) in &leftovers.duplicates {
        let delay_ms = delay_of.get(id).copied().unwrap_or_default();
        failures.push(Failure {
            property: Property::OneDelivery,
            delay_ms,
            expected: "one copy at the destination".into(),
            got: "a second copy arrived".into(),
        });
    }
    for (queue, id) in &leftovers.waiting {
        let delay_ms = delay_of.get(id).copied().unwrap_or_default();
        let got = format!("a copy waits in queue {queue:?} for good");
        failures.push(Failure { property: Property::OneDelivery, delay_ms, expected: "no copy left on the way".into(), got });
    }
    Ok(Report { planner: label, checked: delays.len(), properties: Property::ALL.to_vec(), failures })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_cover_edges_and_one_past_the_maximum() {
        let range = DelayRange { granularity: Granularity::Uniform(1_000), max_delay_ms: 16_000 };
        let delays = delays_to_check(&range, 7, 10, u64::MAX);
        for d in [0, 1, 999, 1_000, 1_001, 8_000, 16_000, 16_001] {
            assert!(delays.contains(&d), "{d} missing from {delays:?}");
        }
        assert_eq!(delays, delays_to_check(&range, 7, 10, u64::MAX), "seeded");
        let near = delays_to_check(&range, 7, 10, 4_000);
        assert!(near.iter().all(|&d| d <= 4_000), "{near:?}");
    }
}
