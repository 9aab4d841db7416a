//! Redelivery policies through the built-in planners' WebAssembly components:
//! what `decide-redelivery` answers for each policy a strategy's table names.

use std::path::Path;

use hourglass::config::Config;
use hourglass::planner::RedeliveryDecision;
use hourglass::scheduler::strategies::Strategies;

const CONFIG: &str = r#"
default_strategy = "fixed"

[strategies.fixed]
planner = "fixed-intervals"
intervals = ["5m", "15m", "30m"]

[strategies.holds]
planner = "hold-queues"
redelivery = { policy = "immediate-then-intervals", immediate = 2, intervals = ["1s", "5s"] }

[strategies.levels]
planner = "binary-levels"
unit = "1ms"
redelivery = { policy = "exponential", initial = "100ms", factor = 3, cap = "1s", jitter = 0.5, max_redeliveries = 4 }

[strategies.bare]
planner = "binary-levels"
"#;

fn strategies(text: &str) -> Strategies {
    let config = Config::parse(Path::new("policies.toml"), text.to_string()).unwrap();
    Strategies::load(&config).unwrap()
}

fn delays(strategies: &mut Strategies, strategy: &str, seed: u64, attempts: u32) -> Vec<Option<u64>> {
    let planner = strategies.get_mut(strategy).unwrap();
    (1..=attempts)
        .map(|attempt| match planner.decide_redelivery("work", attempt, seed, Some("rejected")).unwrap() {
            RedeliveryDecision::RetryAfterMs(ms) => Some(ms),
            RedeliveryDecision::GiveUp(_) => None,
        })
        .collect()
}

#[test]
fn fixed_intervals_redeliver_at_each_interval_then_give_up() {
    let mut strategies = strategies(CONFIG);
    assert_eq!(delays(&mut strategies, "fixed", 7, 4), vec![Some(300_000), Some(900_000), Some(1_800_000), None]);
}

#[test]
fn hold_queues_take_immediate_then_intervals() {
    let mut strategies = strategies(CONFIG);
    assert_eq!(delays(&mut strategies, "holds", 7, 5), vec![Some(0), Some(0), Some(1_000), Some(5_000), None]);
}

#[test]
fn binary_levels_take_exponential_with_seeded_jitter_inside_its_bounds() {
    let mut strategies = strategies(CONFIG);
    let bases = [100.0, 300.0, 900.0, 1_000.0];
    let first = delays(&mut strategies, "levels", 42, 5);
    assert_eq!(first[4], None, "gives up after max_redeliveries");
    for (delay, base) in first[..4].iter().zip(bases) {
        let delay = delay.unwrap() as f64;
        assert!(delay >= base * 0.5 && delay <= base, "{delay} ms outside [{}, {base}]", base * 0.5);
    }
    assert_eq!(delays(&mut strategies, "levels", 42, 5), first, "the same seed gives the same delays");
    assert_ne!(delays(&mut strategies, "levels", 43, 5), first, "another seed gives others");
}

#[test]
fn a_strategy_without_a_policy_refuses_with_the_key_to_add() {
    let mut strategies = strategies(CONFIG);
    let err = strategies.get_mut("bare").unwrap().decide_redelivery("work", 1, 0, None).unwrap_err().to_string();
    assert!(err.contains("binary-levels") && err.contains("redelivery = {"), "{err}");
}

#[test]
fn a_policy_the_strategy_cannot_carry_is_a_config_error() {
    let text = "[strategies.short]\nplanner = \"binary-levels\"\nlevels = 4\nunit = \"1s\"\nredelivery = { policy = \"intervals\", intervals = [\"1h\"] }\n";
    let config = Config::parse(Path::new("policies.toml"), text.to_string()).unwrap();
    let err = Strategies::load(&config).err().expect("refused").to_string();
    assert!(err.contains("redelivery") && err.contains("beyond"), "{err}");
}
