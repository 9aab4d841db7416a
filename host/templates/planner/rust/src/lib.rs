//! {{name}}: an hourglass delay planner.
//!
//! Delays round up to the next of the configured `steps`. Each step is a
//! fanout exchange and a queue whose messages expire after the step; the
//! message is published with the destination as its routing key and, on
//! expiry, dead-letters through the default exchange, which routes on that key
//! straight to the destination queue.

use hourglass_planner_sdk::*;
use serde::Deserialize;

/// The strategy's table in `delay.toml` (without `planner`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Names of the step exchanges and queues: `<prefix>.<ms>ms`.
    pub prefix: Option<String>,
    pub steps: Option<Vec<DurationMs>>,
}

pub struct Steps {
    prefix: String,
    /// Ascending, each above zero.
    steps: Vec<u64>,
    /// Each step's exchange, registered once (beside `steps`): a plan names
    /// it by this key, which reaches the host as an index, not a string.
    step_keys: Vec<Key>,
}

impl Steps {
    fn step_name(&self, ms: u64) -> String {
        format!("{}.{ms}ms", self.prefix)
    }
}

impl Planner for Steps {
    type Config = Config;

    fn info() -> Info {
        Info::new("{{name}}", env!("CARGO_PKG_VERSION"), BrokerFamily::Amqp)
            .key("prefix", "names of the step exchanges and queues: <prefix>.<ms>ms", Some("{{name}}"))
            .key("steps", "the delays it delivers; others round up to the next", Some("[\"1s\", \"10s\", \"1m\"]"))
    }

    fn new(config: Config) -> Result<Self, String> {
        let mut steps: Vec<u64> = match config.steps {
            Some(steps) => steps.into_iter().map(DurationMs::ms).collect(),
            None => vec![1_000, 10_000, 60_000],
        };
        steps.sort_unstable();
        steps.dedup();
        if steps.first().is_none_or(|&first| first == 0) {
            return Err("steps: give at least one delay, each above zero".into());
        }
        let mut planner = Steps { prefix: config.prefix.unwrap_or_else(|| "{{name}}".into()), steps, step_keys: Vec::new() };
        planner.step_keys = planner.steps.iter().map(|&ms| Key::register(&planner.step_name(ms))).collect();
        Ok(planner)
    }

    fn delay_range(&self) -> DelayRange {
        DelayRange::listed([0].into_iter().chain(self.steps.iter().copied()).collect())
    }

    fn topology(&self) -> Result<Vec<Command>, String> {
        let mut commands = Vec::new();
        for &ms in &self.steps {
            let name = self.step_name(ms);
            commands.push(declare_exchange(&name, ExchangeKind::Fanout, vec![]));
            commands.push(declare_queue(&name, vec![int("x-message-ttl", ms as i64), text("x-dead-letter-exchange", "")]));
            commands.push(bind_queue(&name, &name, ""));
        }
        Ok(commands)
    }

    fn plan(&self, request: &PlanRequest) -> Result<Plan, String> {
        if request.delay_ms == 0 {
            return Ok(Plan { commands: vec![publish("", &request.destination, vec![])], delivers_after_ms: 0 });
        }
        let longest = *self.steps.last().expect("new() keeps one step");
        let n = self
            .steps
            .iter()
            .position(|&ms| ms >= request.delay_ms)
            .ok_or_else(|| format!("delay {}ms is above the longest step {longest}ms", request.delay_ms))?;
        // The destination is this request's own: it goes as text.
        Ok(Plan { commands: vec![publish(self.step_keys[n], &request.destination, vec![])], delivers_after_ms: self.steps[n] })
    }
}

register_planner!(Steps);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delay_rounds_up_to_the_next_step_and_beyond_the_last_is_refused() {
        let planner = Steps::new(Config { prefix: None, steps: Some(vec![DurationMs(1_000), DurationMs(10_000)]) }).unwrap();
        let plan = |delay_ms| planner.plan(&PlanRequest { destination: "orders".into(), delay_ms, message_id: "m".into(), routing_key: None });
        let planned = plan(2_500).unwrap();
        assert_eq!(planned.delivers_after_ms, 10_000);
        assert_eq!(planned.commands, vec![publish(Key::register("{{name}}.10000ms"), "orders", vec![])]);
        assert!(plan(10_001).is_err());
    }
}
