//! A planner written against `hourglass:planner@0.2.0` with wit-bindgen
//! alone (the SDK follows the newest contract): it waits in one TTL queue
//! per destination and publishes with every name a string, `bcc` too, as
//! 0.2.0 had them (0.3.0 names them by index or text).

wit_bindgen::generate!({
    world: "planner-world",
    path: "../../../wit/previous/planner@0.2.0.wit",
});

use exports::hourglass::planner::planner::Guest;
use hourglass::planner::types::*;

struct OldPlanner;

const WAIT_MS: u64 = 2_000;

impl Guest for OldPlanner {
    fn describe() -> PlannerInfo {
        PlannerInfo { name: "contract-0-2".into(), version: "0.2.0".into(), family: BrokerFamily::Amqp, config_keys: Vec::new() }
    }

    fn configure(config_json: String) -> Result<DelayRange, String> {
        // As the SDK does: without WASI a panic's message reaches the host through diagnostics.
        std::panic::set_hook(Box::new(|info| hourglass::planner::diagnostics::report_panic(&info.to_string())));
        if config_json.contains("\"panic\"") {
            panic!("asked to panic while configured");
        }
        Ok(DelayRange { granularity: Granularity::Listed(vec![0, WAIT_MS]), max_delay_ms: WAIT_MS })
    }

    fn topology() -> Result<Vec<Command>, String> {
        Ok(Vec::new())
    }

    fn destination_setup(destination: String) -> Result<Vec<Command>, String> {
        let arguments = vec![
            Field { key: "x-message-ttl".into(), value: Value::Int(WAIT_MS as i64) },
            Field { key: "x-dead-letter-exchange".into(), value: Value::Text(String::new()) },
            Field { key: "x-dead-letter-routing-key".into(), value: Value::Text(destination.clone()) },
        ];
        Ok(vec![Command::DeclareQueue(DeclareQueue { name: format!("{destination}.wait"), durable: true, arguments })])
    }

    fn plan(request: PlanRequest) -> Result<DelayPlan, String> {
        let (queue, delivers_after_ms) = if request.delay_ms == 0 { (request.destination, 0) } else { (format!("{}.wait", request.destination), WAIT_MS) };
        // A second key, so the test sees `bcc` cross the upgrade.
        let bcc = vec![format!("copy:{}", request.message_id)];
        let publish = Publish { exchange: String::new(), routing_key: queue, bcc, headers: Vec::new(), expiration_ms: None, mandatory: true };
        Ok(DelayPlan { commands: vec![Command::Publish(publish)], delivers_after_ms })
    }

    fn handle_due(_message: DueMessage) -> Result<DueAction, String> {
        Err("contract-0-2 has no pumped queues".into())
    }

    fn decide_redelivery(_request: RedeliveryRequest) -> Result<RedeliveryDecision, String> {
        Ok(RedeliveryDecision::GiveUp("contract-0-2 does not redeliver".into()))
    }
}

export!(OldPlanner);
