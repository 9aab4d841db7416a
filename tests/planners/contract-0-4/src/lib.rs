//! A planner written against `hourglass:planner@0.4.0` with wit-bindgen
//! alone (the SDK follows the newest contract): a NATS planner that holds
//! each message in one stream and hands it over when due, as 0.4.0 has it,
//! and knows no native schedules (0.5.0 added them).

wit_bindgen::generate!({
    world: "planner-world",
    path: "../../../wit/previous/planner@0.4.0.wit",
});

use exports::hourglass::planner::planner::Guest;
use hourglass::planner::types::*;

struct OldPlanner;

const WAIT_MS: u64 = 2_000;
const HOLD_STREAM: &str = "contract-0-4-hold";
const HOLD_SUBJECT: &str = "contract-0-4.hold";

impl Guest for OldPlanner {
    fn describe() -> PlannerInfo {
        PlannerInfo { name: "contract-0-4".into(), version: "0.4.0".into(), family: BrokerFamily::Nats, config_keys: Vec::new() }
    }

    fn configure(_config_json: String) -> Result<DelayRange, String> {
        Ok(DelayRange { granularity: Granularity::Listed(vec![0, WAIT_MS]), max_delay_ms: WAIT_MS })
    }

    fn names() -> Vec<String> {
        vec![HOLD_SUBJECT.into()]
    }

    fn topology() -> Result<Vec<Command>, String> {
        let hold = NatsEnsureStream { name: HOLD_STREAM.into(), subjects: vec![HOLD_SUBJECT.into()], held: true };
        Ok(vec![Command::NatsEnsureStream(hold)])
    }

    fn destination_setup(_destination: String) -> Result<Vec<Command>, String> {
        Ok(Vec::new())
    }

    fn plan(_request: PlanRequest) -> Result<DelayPlan, String> {
        let publish = NatsPublish { subject: Name::Registered(0), headers: Vec::new() };
        Ok(DelayPlan { commands: vec![Command::NatsPublish(publish)], delivers_after_ms: WAIT_MS })
    }

    fn handle_due(_message: DueMessage) -> Result<DueAction, String> {
        Err("contract-0-4 has no pumped queues".into())
    }

    fn handle_held(message: HeldMessage) -> Result<HeldAction, String> {
        if message.now_ms < message.due_at_ms {
            return Ok(HeldAction::Wait(message.due_at_ms - message.now_ms));
        }
        let publish = NatsPublish { subject: Name::Text(message.destination), headers: Vec::new() };
        Ok(HeldAction::HandOver(vec![Command::NatsPublish(publish)]))
    }

    fn decide_redelivery(_request: RedeliveryRequest) -> Result<RedeliveryDecision, String> {
        Ok(RedeliveryDecision::GiveUp("contract-0-4 does not redeliver".into()))
    }
}

export!(OldPlanner);
