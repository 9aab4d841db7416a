//! Waits between attempts to reconnect or restart: doubling from a first
//! wait up to a cap, each drawn at random from the upper half of its step.
//!
//! Why random: a broker restart drops every connection of every host at the
//! same moment. With fixed waits they would all knock again in the same
//! instant, at every step; spread over half of each wait, they arrive apart.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// One retry loop's waits; [`Backoff::reset`] after a success.
pub struct Backoff {
    policy: ExponentialBuilder,
    waits: ExponentialBackoff,
}

impl Backoff {
    /// Steps `first`, `2 × first`, … up to `max`; each wait is at least half
    /// its step and less than the step.
    pub fn new(first: Duration, max: Duration) -> Backoff {
        // backon's jitter adds up to the step again: halving the steps puts each wait in [step/2, step).
        let policy = ExponentialBuilder::new().with_min_delay(first / 2).with_max_delay(max / 2).without_max_times().with_jitter();
        Backoff { waits: policy.build(), policy }
    }

    /// How long to wait before the next attempt.
    pub(crate) fn next_wait(&mut self) -> Duration {
        self.waits.next().expect("no limit on attempts")
    }

    /// Back to the first step.
    pub fn reset(&mut self) {
        self.waits = self.policy.build();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    const FIRST: Duration = Duration::from_millis(250);
    const MAX: Duration = Duration::from_secs(5);

    #[test]
    fn each_wait_lies_in_the_upper_half_of_a_doubling_step_capped_at_the_max() {
        let mut backoff = Backoff::new(FIRST, MAX);
        let steps = [250, 500, 1_000, 2_000, 4_000, 5_000, 5_000, 5_000].map(Duration::from_millis);
        for (attempt, step) in steps.into_iter().enumerate() {
            let wait = backoff.next_wait();
            assert!(wait >= step / 2 && wait < step, "attempt {attempt}: {wait:?} outside [{:?}, {step:?})", step / 2);
        }
        backoff.reset();
        let wait = backoff.next_wait();
        assert!(wait >= FIRST / 2 && wait < FIRST, "after a reset the first step again: {wait:?}");
    }

    /// What the jitter is for: hosts that lost the broker together do not come back together.
    #[test]
    fn hosts_starting_at_the_same_moment_wait_different_times() {
        let firsts: HashSet<Duration> = (0..100).map(|_| Backoff::new(FIRST, MAX).next_wait()).collect();
        assert!(firsts.len() > 90, "only {} distinct first waits of 100", firsts.len());
    }
}
