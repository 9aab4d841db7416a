//! A deliberately wrong planner, kept so `check-planner` is shown to catch
//! each broken promise. `fault` picks which:
//!
//! * `early` (the default): promises the requested delay but gives its hold
//!   queue a TTL one millisecond short;
//! * `twice`: publishes two copies into its hold queue;
//! * `copy-left`: also leaves a copy in a queue nothing reads;
//! * `changing`: each plan's queue name counts the calls, so the same request
//!   gets a different plan every time.

use std::sync::atomic::{AtomicU64, Ordering};

use hourglass_planner_sdk::*;
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    fault: Option<String>,
}

#[derive(Clone, Copy, PartialEq)]
enum Fault {
    Early,
    Twice,
    CopyLeft,
    Changing,
}

struct OffByOne {
    fault: Fault,
    calls: AtomicU64,
}

const FORGOTTEN: &str = "off-by-one.forgotten";
const MAX_DELAY_MS: u64 = 3_600_000;

impl Planner for OffByOne {
    type Config = Config;

    fn info() -> Info {
        Info::new("off-by-one", env!("CARGO_PKG_VERSION"), BrokerFamily::Amqp).key("fault", "early, twice, copy-left or changing", Some("early"))
    }

    fn new(config: Config) -> Result<Self, String> {
        let fault = match config.fault.as_deref().unwrap_or("early") {
            "early" => Fault::Early,
            "twice" => Fault::Twice,
            "copy-left" => Fault::CopyLeft,
            "changing" => Fault::Changing,
            other => return Err(format!("fault: {other:?} is not one of early, twice, copy-left, changing")),
        };
        Ok(OffByOne { fault, calls: AtomicU64::new(0) })
    }

    fn delay_range(&self) -> DelayRange {
        DelayRange::uniform(1, MAX_DELAY_MS)
    }

    fn topology(&self) -> Result<Vec<Command>, String> {
        Ok(vec![declare_queue(FORGOTTEN, vec![])])
    }

    fn plan(&self, request: &PlanRequest) -> Result<Plan, String> {
        // Only the chosen fault is wrong: beyond the range it refuses, as promised.
        if request.delay_ms > MAX_DELAY_MS {
            return Err(format!("delay_ms: {} is beyond {MAX_DELAY_MS}", request.delay_ms));
        }
        let short = u64::from(self.fault == Fault::Early);
        let mut queue = format!("off-by-one.{}ms.{}", request.delay_ms, request.destination);
        if self.fault == Fault::Changing {
            queue.push_str(&format!(".{}", self.calls.fetch_add(1, Ordering::Relaxed)));
        }
        let arguments = vec![
            int("x-message-ttl", request.delay_ms.saturating_sub(short) as i64),
            text("x-dead-letter-exchange", ""),
            text("x-dead-letter-routing-key", request.destination.as_str()),
        ];
        let mut commands = vec![declare_queue(&queue, arguments), publish("", &queue, vec![])];
        match self.fault {
            Fault::Twice => commands.push(publish("", &queue, vec![])),
            Fault::CopyLeft => commands.push(publish("", FORGOTTEN, vec![])),
            Fault::Early | Fault::Changing => {}
        }
        Ok(Plan { commands, delivers_after_ms: request.delay_ms })
    }
}

register_planner!(OffByOne);
