//! An example of a planner a user writes: exponential backoff buckets.
//!
//! Delays round up to `base · 2^k` (1 s, 2 s, 4 s, … up to `cap`). Each bucket
//! is a fanout exchange and a TTL queue; the message is published with the
//! destination as its routing key, and on expiry dead-letters through the
//! default exchange, which routes on that key straight to the destination
//! queue — no per-destination setup at all.
//!
//! It also decides redeliveries: attempt `n` waits `base · 2^(n-1)` (capped),
//! shortened by up to `jitter` of itself. The jitter comes from the request's
//! seed, so the same request always gets the same answer.

use hourglass_planner_sdk::*;
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub base: Option<DurationMs>,
    pub cap: Option<DurationMs>,
    pub max_attempts: Option<u32>,
    /// Fraction of a redelivery delay that jitter may remove, 0.0 to 1.0.
    pub jitter: Option<f64>,
}

pub struct Backoff {
    buckets: Vec<u64>,
    /// Each bucket's exchange, registered once (beside `buckets`): a plan
    /// then names it by index instead of sending the string on every call.
    bucket_keys: Vec<Key>,
    max_attempts: u32,
    jitter: f64,
}

fn bucket_name(delay_ms: u64) -> String {
    format!("backoff.{delay_ms}ms")
}

/// SplitMix64: a tiny, well-mixed generator; good enough to spread retries.
fn splitmix64(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Planner for Backoff {
    type Config = Config;

    fn info() -> Info {
        Info::new("backoff", env!("CARGO_PKG_VERSION"), BrokerFamily::Amqp)
            .key("base", "the shortest bucket", Some("1s"))
            .key("cap", "the longest bucket", Some("5m"))
            .key("max_attempts", "redeliveries before giving up", Some("8"))
            .key("jitter", "fraction of a redelivery delay jitter may remove", Some("0.2"))
    }

    fn new(config: Config) -> Result<Self, String> {
        let base = config.base.map_or(1_000, DurationMs::ms);
        let cap = config.cap.map_or(300_000, DurationMs::ms);
        let jitter = config.jitter.unwrap_or(0.2);
        if base == 0 || cap < base {
            return Err(format!("base ({base}ms) must be above zero and at most cap ({cap}ms)"));
        }
        if !(0.0..=1.0).contains(&jitter) {
            return Err(format!("jitter: {jitter} must be between 0.0 and 1.0"));
        }
        let mut buckets = vec![base];
        while let Some(next) = buckets.last().and_then(|b| b.checked_mul(2)).filter(|&n| n <= cap) {
            buckets.push(next);
        }
        let bucket_keys = buckets.iter().map(|&b| Key::register(&bucket_name(b))).collect();
        Ok(Backoff { buckets, bucket_keys, max_attempts: config.max_attempts.unwrap_or(8), jitter })
    }

    fn delay_range(&self) -> DelayRange {
        let mut delays = vec![0];
        delays.extend(&self.buckets);
        DelayRange::listed(delays)
    }

    fn topology(&self) -> Result<Vec<Command>, String> {
        let mut commands = Vec::new();
        for &bucket in &self.buckets {
            let name = bucket_name(bucket);
            commands.push(declare_exchange(&name, ExchangeKind::Fanout, vec![]));
            commands.push(declare_queue(&name, vec![int("x-message-ttl", bucket as i64), text("x-dead-letter-exchange", "")]));
            commands.push(bind_queue(&name, &name, ""));
        }
        Ok(commands)
    }

    fn plan(&self, request: &PlanRequest) -> Result<Plan, String> {
        if request.delay_ms == 0 {
            return Ok(Plan { commands: vec![publish("", &request.destination, vec![])], delivers_after_ms: 0 });
        }
        let n = self
            .buckets
            .iter()
            .position(|&b| b >= request.delay_ms)
            .ok_or_else(|| format!("delay {}ms is above the longest bucket {}ms", request.delay_ms, self.buckets.last().unwrap()))?;
        // The destination is the request's own: it goes as text.
        let publish = publish(self.bucket_keys[n], &request.destination, vec![]);
        Ok(Plan { commands: vec![publish], delivers_after_ms: self.buckets[n] })
    }

    fn decide_redelivery(&self, request: &RedeliveryRequest) -> Result<RedeliveryDecision, String> {
        if request.attempt == 0 || request.attempt > self.max_attempts {
            return Ok(RedeliveryDecision::GiveUp(format!("{} attempts made", request.attempt.saturating_sub(1))));
        }
        let index = (request.attempt as usize - 1).min(self.buckets.len() - 1);
        let full = self.buckets[index];
        let unit = (splitmix64(request.seed ^ u64::from(request.attempt)) >> 11) as f64 / (1u64 << 53) as f64;
        let shortened = (full as f64 * self.jitter * unit) as u64;
        Ok(RedeliveryDecision::RetryAfterMs(full - shortened))
    }
}

register_planner!(Backoff);

#[cfg(test)]
mod tests {
    use super::*;

    fn backoff() -> Backoff {
        Backoff::new(Config { base: None, cap: Some(DurationMs(10_000)), max_attempts: Some(3), jitter: Some(0.5) }).unwrap()
    }

    #[test]
    fn delays_round_up_to_a_power_of_two_bucket() {
        let plan = backoff().plan(&PlanRequest { destination: "q".into(), delay_ms: 2_500, message_id: "m".into(), routing_key: None }).unwrap();
        assert_eq!(plan.delivers_after_ms, 4_000);
        assert_eq!(plan.commands, vec![publish(Key::register("backoff.4000ms"), "q", vec![])]);
    }

    #[test]
    fn jitter_is_bounded_and_reproducible() {
        let b = backoff();
        let ask = |attempt, seed| b.decide_redelivery(&RedeliveryRequest { queue: "q".into(), attempt, seed, reason: None });
        for seed in 0..100 {
            let Ok(RedeliveryDecision::RetryAfterMs(d)) = ask(2, seed) else { panic!() };
            assert!((1_000..=2_000).contains(&d), "{d}");
            assert_eq!(ask(2, seed), ask(2, seed));
        }
        assert!(matches!(ask(4, 1), Ok(RedeliveryDecision::GiveUp(_))));
    }
}
