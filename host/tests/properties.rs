//! For every built-in planner, 10,000 random delays over its range: the
//! simulated arrival equals the requested delay rounded up to the planner's
//! resolution (fixed intervals: its rounding policy). The expected value is
//! computed here from the planner's documented rule, not taken from the planner.

mod common;

use std::cell::RefCell;

use hourglass::planner::LoadedPlanner;
use hourglass::sim::HopStep;
use hourglass::sim::simulation::{SimulatedMessage, Simulation};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::json;

const CASES: u32 = 10_000;

fn runner() -> TestRunner {
    TestRunner::new(Config { cases: CASES, failure_persistence: None, ..Config::default() })
}

fn check(
    planner: &mut LoadedPlanner,
    delays: impl Strategy<Value = u64>,
    expected: impl Fn(u64) -> Option<u64>,
    extra: impl Fn(u64, &SimulatedMessage) -> Result<(), TestCaseError>,
) {
    let simulation = RefCell::new(Simulation::new(planner, "destination").unwrap());
    runner()
        .run(&delays, |delay| {
            let outcome = simulation.borrow_mut().run(&[delay]).unwrap().remove(0);
            prop_assert_eq!(outcome.arrival_ms, expected(delay), "delay {}ms: {:?}", delay, outcome.problem);
            extra(delay, &outcome)
        })
        .unwrap();
}

fn none(_: u64, _: &SimulatedMessage) -> Result<(), TestCaseError> {
    Ok(())
}

/// Binary levels of 1 s (28 of them, the default) configured by `config`:
/// every delay arrives rounded up to the second; `route` checks the path
/// taken for the delay's whole seconds.
fn binary_levels_in_seconds(config: serde_json::Value, route: impl Fn(u64, &SimulatedMessage) -> Result<(), TestCaseError>) {
    let runtime = common::patient_runtime();
    let mut planner = common::builtin(&runtime, "binary-levels", config);
    let max = ((1u64 << 28) - 1) * 1_000;
    check(&mut planner, 0..=max, |d| Some(d.div_ceil(1_000) * 1_000), |delay, outcome| route(delay.div_ceil(1_000), outcome));
}

#[test]
fn binary_levels_with_topic_routing_in_seconds_round_up_and_enter_at_the_highest_set_bit() {
    binary_levels_in_seconds(json!({ "routing": "topic" }), |units, outcome| {
        let entry = match &outcome.hops[0].step {
            HopStep::Exchange { name, .. } => name.clone(),
            other => return Err(TestCaseError::fail(format!("first hop {other:?}"))),
        };
        let wanted = if units == 0 { "hourglass.delay-delivery".to_string() } else { format!("hourglass.delay-level-{:02}", 63 - units.leading_zeros()) };
        prop_assert_eq!(entry, wanted);
        Ok(())
    });
}

/// Direct levels (the default): each message waits exactly in the levels of
/// its set bits (an alternate exchange passes it by the others) and arrives on time.
#[test]
fn binary_levels_by_default_wait_in_the_levels_of_their_set_bits() {
    binary_levels_in_seconds(json!({}), |units, outcome| {
        let waited: Vec<String> = outcome
            .hops
            .iter()
            .filter_map(|hop| match &hop.step {
                HopStep::Queue { name, .. } => Some(name.clone()),
                _ => None,
            })
            .collect();
        let wanted: Vec<String> = (0..28).rev().filter(|bit| units >> bit & 1 == 1).map(|bit| format!("hourglass.direct-level-{bit:02}")).collect();
        prop_assert_eq!(waited, wanted);
        Ok(())
    });
}

#[test]
fn binary_levels_in_milliseconds_are_exact() {
    let runtime = common::patient_runtime();
    let mut planner = common::builtin(&runtime, "binary-levels", json!({ "unit": "1ms", "queue_type": "quorum" }));
    check(&mut planner, 0..=(1u64 << 28) - 1, Some, none);
}

#[test]
fn hold_queues_round_up_to_their_default_granularity_of_a_second() {
    let runtime = common::patient_runtime();
    let mut planner = common::builtin(&runtime, "hold-queues", json!({}));
    let max: u64 = 10 * 365 * 24 * 3_600_000 - 60_000;
    check(&mut planner, 0..=max, |d| Some(d.div_ceil(1_000) * 1_000), none);
}

#[test]
fn hold_queues_with_a_granularity_of_250ms_round_up_to_it() {
    let runtime = common::patient_runtime();
    let mut planner = common::builtin(&runtime, "hold-queues", json!({ "granularity": "250ms" }));
    check(&mut planner, 0..=3_600_000u64, |d| Some(d.div_ceil(250) * 250), none);
}

#[test]
fn hold_queues_with_a_granularity_of_1ms_are_exact_to_the_millisecond() {
    let runtime = common::patient_runtime();
    let mut planner = common::builtin(&runtime, "hold-queues", json!({ "granularity": "1ms" }));
    let max: u64 = 10 * 365 * 24 * 3_600_000 - 60_000;
    check(&mut planner, 0..=max, Some, none);
}

#[test]
fn fixed_intervals_round_up_to_the_next_interval() {
    let runtime = common::patient_runtime();
    let intervals = [5_000u64, 15_000, 30_000, 3_600_000];
    let mut planner = common::builtin(&runtime, "fixed-intervals", json!({ "intervals": ["5s", "15s", "30s", "1h"], "rounding": "up" }));
    let next = move |d: u64| if d == 0 { Some(0) } else { intervals.iter().copied().find(|&i| i >= d) };
    check(&mut planner, 0..=3_600_000u64, next, none);
}

#[test]
fn fixed_intervals_with_reject_deliver_only_the_intervals() {
    let runtime = common::patient_runtime();
    let mut planner = common::builtin(&runtime, "fixed-intervals", json!({ "intervals": ["1s", "2s", "3s"], "rounding": "reject" }));
    let exact = |d: u64| [0, 1_000, 2_000, 3_000].contains(&d).then_some(d);
    // Half the cases land exactly on an interval.
    let delays = prop_oneof![prop::sample::select(vec![0u64, 1_000, 2_000, 3_000]), 0..=3_500u64];
    check(&mut planner, delays, exact, |delay, outcome| {
        if exact(delay).is_none() {
            let problem = outcome.problem.as_deref().unwrap_or("");
            prop_assert!(problem.contains("not one of the intervals"), "{}", problem);
        }
        Ok(())
    });
}

#[test]
fn sqs_cycles_hand_over_exactly_after_any_number_of_cycles() {
    let runtime = common::patient_runtime();
    // Six hours is 24 cycles of 900 s: every message crosses many cycle boundaries.
    let mut planner = common::builtin(&runtime, "sqs-cycles", json!({ "cycle": "900s", "max_delay": "6h" }));
    check(&mut planner, 0..=6 * 3_600_000u64, |d| Some(d.div_ceil(1_000) * 1_000), none);
}
