//! A planner written against `hourglass:planner@0.3.0` with wit-bindgen
//! alone (the SDK follows the newest contract): it registers the names it
//! publishes with and names them by index, as 0.3.0 has them, and knows no
//! NATS family (0.4.0 added it).

wit_bindgen::generate!({
    world: "planner-world",
    path: "../../../wit/previous/planner@0.3.0.wit",
});

use exports::hourglass::planner::planner::Guest;
use hourglass::planner::types::*;

struct OldPlanner;

const WAIT_MS: u64 = 2_000;
const WAIT_EXCHANGE: &str = "contract-0-3.wait";

impl Guest for OldPlanner {
    fn describe() -> PlannerInfo {
        PlannerInfo { name: "contract-0-3".into(), version: "0.3.0".into(), family: BrokerFamily::Amqp, config_keys: Vec::new() }
    }

    fn configure(_config_json: String) -> Result<DelayRange, String> {
        Ok(DelayRange { granularity: Granularity::Listed(vec![0, WAIT_MS]), max_delay_ms: WAIT_MS })
    }

    fn names() -> Vec<String> {
        vec![WAIT_EXCHANGE.into()]
    }

    fn topology() -> Result<Vec<Command>, String> {
        Ok(Vec::new())
    }

    fn destination_setup(_destination: String) -> Result<Vec<Command>, String> {
        Ok(Vec::new())
    }

    fn plan(request: PlanRequest) -> Result<DelayPlan, String> {
        let publish = Publish {
            exchange: Name::Registered(0),
            routing_key: Name::Text(request.destination),
            bcc: Vec::new(),
            headers: Vec::new(),
            expiration_ms: None,
            mandatory: true,
        };
        Ok(DelayPlan { commands: vec![Command::Publish(publish)], delivers_after_ms: WAIT_MS })
    }

    fn handle_due(_message: DueMessage) -> Result<DueAction, String> {
        Err("contract-0-3 has no pumped queues".into())
    }

    fn decide_redelivery(_request: RedeliveryRequest) -> Result<RedeliveryDecision, String> {
        Ok(RedeliveryDecision::GiveUp("contract-0-3 does not redeliver".into()))
    }
}

export!(OldPlanner);
