//! `check-planner`: does a planner keep its promises?
//!
//! A planner declares which delays it delivers ([`DelayRange`]). For a spread
//! of delays — edges of its granularity, powers of two, its maximum, one past
//! it, and seeded random ones — the check plans each message, runs it on the
//! simulator and compares: the plan must promise the delay rounded up to the
//! planner's granularity, and the message must arrive exactly then. Delays
//! beyond the maximum must be refused.

use serde::Serialize;

use crate::planner::{DelayRange, Granularity, LoadedPlanner};
use crate::sim::simulation::{Simulation, SimulationError};

#[derive(Clone, Debug, Serialize)]
pub struct Failure {
    pub delay_ms: u64,
    pub expected: String,
    pub got: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub planner: String,
    pub checked: usize,
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

/// Plans and simulates each delay, collecting every broken promise.
pub fn check(planner: &mut LoadedPlanner, destination: &str, delays: &[u64]) -> Result<Report, SimulationError> {
    let range = planner.delay_range().clone();
    let label = planner.label().to_string();
    let mut simulation = Simulation::new(planner, destination)?;
    let mut failures = Vec::new();
    for &delay_ms in delays {
        let outcome = simulation.run(&[delay_ms])?.remove(0);
        let mut fail = |expected: String, got: String| failures.push(Failure { delay_ms, expected, got });
        match range.promise(delay_ms) {
            None => {
                if let Some(arrival) = outcome.arrival_ms {
                    fail("refusal: beyond the declared maximum".into(), format!("delivered after {arrival}ms"));
                }
            }
            Some(expected) => {
                if outcome.promised_ms != Some(expected) {
                    let got = match (outcome.promised_ms, &outcome.problem) {
                        (Some(p), _) => format!("plan promised {p}ms"),
                        (None, Some(problem)) => problem.clone(),
                        (None, None) => "no plan".into(),
                    };
                    fail(format!("plan promising {expected}ms"), got);
                } else if outcome.arrival_ms != Some(expected) {
                    let got = match (outcome.arrival_ms, &outcome.problem) {
                        (Some(a), _) => format!("arrived after {a}ms"),
                        (None, Some(problem)) => problem.clone(),
                        (None, None) => "never arrived".into(),
                    };
                    fail(format!("arrival after {expected}ms"), got);
                }
            }
        }
    }
    Ok(Report { planner: label, checked: delays.len(), failures })
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
