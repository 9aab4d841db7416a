//! Redelivery policies a planner can offer through `decide_redelivery`:
//! fixed intervals, exponential backoff with a cap and seeded jitter, and
//! immediate retries followed by intervals. A planner embeds one in its table
//! (`redelivery = { policy = "exponential", … }`) and calls [`RedeliveryPolicy::decide`].
//!
//! Jitter comes from the request's seed, never from a clock or a random
//! source, so the same request always gets the same answer.

use serde::Deserialize;

use crate::{DurationMs, RedeliveryDecision, RedeliveryRequest};

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(tag = "policy", rename_all = "kebab-case", deny_unknown_fields)]
pub enum RedeliveryPolicy {
    /// Redelivery n waits `intervals[n-1]`; after the last one, give up.
    Intervals { intervals: Vec<DurationMs> },
    /// Redelivery n waits `min(initial × factor^(n-1), cap)`, shortened by up to
    /// `jitter` (a fraction, 0 to 1) of itself; give up after `max_redeliveries`.
    Exponential {
        initial: DurationMs,
        #[serde(default = "default_factor")]
        factor: f64,
        cap: DurationMs,
        #[serde(default)]
        jitter: f64,
        max_redeliveries: u32,
    },
    /// `immediate` redeliveries at once, then the intervals.
    ImmediateThenIntervals { immediate: u32, intervals: Vec<DurationMs> },
}

fn default_factor() -> f64 {
    2.0
}

/// splitmix64: a well-mixed 64-bit value from a seed, for jitter.
fn mix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl RedeliveryPolicy {
    /// Checks the numbers make sense; call it from `Planner::new`.
    pub fn check(&self) -> Result<(), String> {
        match self {
            RedeliveryPolicy::Intervals { intervals } | RedeliveryPolicy::ImmediateThenIntervals { intervals, .. } => {
                if intervals.is_empty() && matches!(self, RedeliveryPolicy::Intervals { .. }) {
                    return Err("redelivery.intervals: give at least one interval".into());
                }
                Ok(())
            }
            RedeliveryPolicy::Exponential { initial, factor, cap, jitter, .. } => {
                if initial.ms() == 0 {
                    return Err("redelivery.initial: must be above zero".into());
                }
                if !(factor.is_finite() && *factor >= 1.0) {
                    return Err(format!("redelivery.factor: {factor} must be at least 1"));
                }
                if cap.ms() < initial.ms() {
                    return Err(format!("redelivery.cap: {} ms is below initial {} ms", cap.ms(), initial.ms()));
                }
                if !(0.0..=1.0).contains(jitter) {
                    return Err(format!("redelivery.jitter: {jitter} must be between 0 and 1"));
                }
                Ok(())
            }
        }
    }

    /// The longest delay the policy can ask for (so a planner can check it can deliver it).
    pub fn longest_ms(&self) -> u64 {
        match self {
            RedeliveryPolicy::Intervals { intervals } | RedeliveryPolicy::ImmediateThenIntervals { intervals, .. } => {
                intervals.iter().map(|d| d.ms()).max().unwrap_or(0)
            }
            RedeliveryPolicy::Exponential { cap, .. } => cap.ms(),
        }
    }

    pub fn decide(&self, request: &RedeliveryRequest) -> Result<RedeliveryDecision, String> {
        let n = request.attempt.checked_sub(1).ok_or("redelivery attempts are numbered from 1")?;
        let from_list = |intervals: &[DurationMs], index: u32, made: u32| match intervals.get(index as usize) {
            Some(delay) => RedeliveryDecision::RetryAfterMs(delay.ms()),
            None => RedeliveryDecision::GiveUp(format!("{made} redeliveries made")),
        };
        Ok(match self {
            RedeliveryPolicy::Intervals { intervals } => from_list(intervals, n, intervals.len() as u32),
            RedeliveryPolicy::ImmediateThenIntervals { immediate, intervals } => {
                if n < *immediate {
                    RedeliveryDecision::RetryAfterMs(0)
                } else {
                    from_list(intervals, n - immediate, immediate + intervals.len() as u32)
                }
            }
            RedeliveryPolicy::Exponential { initial, factor, cap, jitter, max_redeliveries } => {
                if n >= *max_redeliveries {
                    return Ok(RedeliveryDecision::GiveUp(format!("{max_redeliveries} redeliveries made")));
                }
                let base = (initial.ms() as f64 * factor.powi(n.min(1_000) as i32)).min(cap.ms() as f64);
                // A fraction in [0, 1) from the seed and the attempt.
                let unit = (mix(request.seed ^ mix(request.attempt as u64)) >> 11) as f64 / (1u64 << 53) as f64;
                RedeliveryDecision::RetryAfterMs((base * (1.0 - jitter * unit)).round() as u64)
            }
        })
    }
}

/// A planner's optional `redelivery` key, checked, and no longer than the
/// planner's longest delay.
pub fn checked_policy(policy: Option<RedeliveryPolicy>, max_delay_ms: u64) -> Result<Option<RedeliveryPolicy>, String> {
    let Some(policy) = policy else { return Ok(None) };
    policy.check()?;
    if policy.longest_ms() > max_delay_ms {
        return Err(format!("redelivery: a {} ms delay is beyond this strategy's longest, {max_delay_ms} ms", policy.longest_ms()));
    }
    Ok(Some(policy))
}

/// `decide_redelivery` for a planner whose policy is its optional `redelivery` key.
pub fn decide_with(policy: Option<&RedeliveryPolicy>, request: &RedeliveryRequest) -> Result<RedeliveryDecision, String> {
    match policy {
        Some(policy) => policy.decide(request),
        None => Err("no redelivery policy: add `redelivery = { policy = \"intervals\", intervals = [\"5s\", \"30s\"] }` (or exponential, immediate-then-intervals) to the strategy".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(attempt: u32, seed: u64) -> RedeliveryRequest {
        RedeliveryRequest { queue: "orders".into(), attempt, seed, reason: None }
    }

    fn delay(policy: &RedeliveryPolicy, attempt: u32, seed: u64) -> Option<u64> {
        match policy.decide(&request(attempt, seed)).unwrap() {
            RedeliveryDecision::RetryAfterMs(ms) => Some(ms),
            RedeliveryDecision::GiveUp(_) => None,
        }
    }

    fn ms(values: &[u64]) -> Vec<DurationMs> {
        values.iter().map(|&v| DurationMs(v)).collect()
    }

    #[test]
    fn intervals_then_give_up() {
        let policy = RedeliveryPolicy::Intervals { intervals: ms(&[1_000, 2_000, 3_000]) };
        let delays: Vec<_> = (1..=4).map(|a| delay(&policy, a, 7)).collect();
        assert_eq!(delays, vec![Some(1_000), Some(2_000), Some(3_000), None]);
    }

    #[test]
    fn immediate_then_intervals() {
        let policy = RedeliveryPolicy::ImmediateThenIntervals { immediate: 2, intervals: ms(&[5_000, 10_000]) };
        let delays: Vec<_> = (1..=5).map(|a| delay(&policy, a, 7)).collect();
        assert_eq!(delays, vec![Some(0), Some(0), Some(5_000), Some(10_000), None]);
    }

    #[test]
    fn exponential_stays_within_its_bounds_and_repeats_for_the_same_seed() {
        let policy = RedeliveryPolicy::Exponential { initial: DurationMs(1_000), factor: 2.0, cap: DurationMs(10_000), jitter: 0.5, max_redeliveries: 6 };
        policy.check().unwrap();
        for seed in 0..200u64 {
            for attempt in 1..=6u32 {
                let base = (1_000u64 << (attempt - 1)).min(10_000);
                let got = delay(&policy, attempt, seed).unwrap();
                assert!(got >= base / 2 && got <= base, "attempt {attempt} seed {seed}: {got} outside [{}, {base}]", base / 2);
                assert_eq!(delay(&policy, attempt, seed), Some(got), "same seed, same delay");
            }
            assert_eq!(delay(&policy, 7, seed), None);
        }
        let spread: std::collections::BTreeSet<_> = (0..50).map(|seed| delay(&policy, 3, seed)).collect();
        assert!(spread.len() > 10, "jitter spreads delays across seeds: {spread:?}");
    }

    #[test]
    fn nonsense_is_refused() {
        let bad = RedeliveryPolicy::Exponential { initial: DurationMs(5_000), factor: 2.0, cap: DurationMs(1_000), jitter: 0.0, max_redeliveries: 3 };
        assert!(bad.check().unwrap_err().contains("cap"));
        assert!(RedeliveryPolicy::Intervals { intervals: vec![] }.check().is_err());
        let parsed: RedeliveryPolicy =
            serde_json::from_str(r#"{"policy":"exponential","initial":"1s","cap":"30s","jitter":0.2,"max_redeliveries":5}"#).unwrap();
        assert_eq!(delay(&parsed, 1, 1).map(|d| (800..=1_000).contains(&d)), Some(true));
    }
}
