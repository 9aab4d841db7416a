//! A deliberately wrong planner, kept so `check-planner` is shown to catch one.
//! It promises the requested delay but gives its hold queue a TTL one
//! millisecond short.

use hourglass_planner_sdk::*;

struct OffByOne;

impl Planner for OffByOne {
    type Config = NoConfig;

    fn info() -> Info {
        Info::new("off-by-one", env!("CARGO_PKG_VERSION"), BrokerFamily::Amqp)
    }

    fn new(_: NoConfig) -> Result<Self, String> {
        Ok(OffByOne)
    }

    fn delay_range(&self) -> DelayRange {
        DelayRange::uniform(1, 3_600_000)
    }

    fn plan(&self, request: &PlanRequest) -> Result<Plan, String> {
        let queue = format!("off-by-one.{}ms.{}", request.delay_ms, request.destination);
        let arguments = vec![
            int("x-message-ttl", request.delay_ms.saturating_sub(1) as i64),
            text("x-dead-letter-exchange", ""),
            text("x-dead-letter-routing-key", request.destination.as_str()),
        ];
        Ok(Plan { commands: vec![declare_queue(&queue, arguments), publish("", &queue, vec![])], delivers_after_ms: request.delay_ms })
    }
}

register_planner!(OffByOne);
