//! Cancel and reschedule canaries: scheduled on the cancellable strategy
//! through HTTP, then a third are left alone, a third cancelled and a third
//! rescheduled later, at once. A cancel answered 200 means the message must
//! never arrive; a reschedule answered 2xx moves its due time; one that got
//! no clear answer after a few tries may arrive or not.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hourglass::clock::unix_now_ms;
use hourglass_e2e::chaos::canary::INTERVAL;
use hourglass_e2e::chaos::ledger::Ledger;
use serde_json::{Value, json};

/// The cancellable strategy's name in the soak's config.
pub const STRATEGY: &str = "cancellable";
/// How long after scheduling the cancel or reschedule is sent.
const SECOND_THOUGHTS: Duration = Duration::from_millis(300);
/// How often a 503 (the log could not be written: asking again is safe) is asked again.
const TRIES: usize = 5;

/// How the schedule requests were answered: status (0: unanswered) → count.
static ANSWERS: Mutex<BTreeMap<u16, usize>> = Mutex::new(BTreeMap::new());

/// How the schedule requests were answered, e.g. `202×46 503×40 unanswered×17`.
pub fn answers() -> String {
    let answers = ANSWERS.lock().unwrap();
    answers.iter().map(|(status, n)| if *status == 0 { format!("unanswered×{n}") } else { format!("{status}×{n}") }).collect::<Vec<_>>().join(" ")
}

/// Sends until `stop`, alternating between the hosts at `bases`.
pub async fn send(tag: String, bases: Vec<Arc<Mutex<String>>>, destination: String, ledger: Arc<Ledger>, stop: Arc<AtomicBool>) {
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(10))).build().into();
    let mut n: u64 = 0;
    while !stop.load(Ordering::SeqCst) {
        let id = format!("{tag}-{n}");
        let base = bases[n as usize % bases.len()].lock().unwrap().clone();
        let delay = 2_000 + (n % 3) * 1_000;
        ledger.sent(&id, unix_now_ms() + delay);
        let body = json!({ "destination": destination, "delay": delay, "strategy": STRATEGY, "body": id });
        let answer = call(&agent, "POST", format!("{base}/v1/messages"), Some(body)).await;
        *ANSWERS.lock().unwrap().entry(answer.as_ref().map_or(0, |(status, _)| *status)).or_default() += 1;
        if let Some((200..=299, json)) = &answer {
            ledger.acknowledged(&id, json.get("due_at").and_then(Value::as_u64));
            if let Some(message) = json.get("id").and_then(Value::as_str) {
                tokio::time::sleep(SECOND_THOUGHTS).await;
                let url = format!("{base}/v1/messages/{message}");
                match n % 3 {
                    1 => cancel(&agent, &url, &id, &ledger).await,
                    2 => reschedule(&agent, &url, &id, delay + 2_000, &ledger).await,
                    _ => {}
                }
            }
        }
        n += 1;
        tokio::time::sleep(INTERVAL).await;
    }
}

async fn cancel(agent: &ureq::Agent, url: &str, id: &str, ledger: &Ledger) {
    for _ in 0..TRIES {
        match call(agent, "DELETE", url.to_string(), None).await {
            Some((200, _)) => return ledger.cancelled(id),
            // Already delivered: it must have arrived, as any other.
            Some((409, _)) => return,
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
    ledger.either(id);
}

/// Asks for a new due time `delay_ms` from now; a reschedule that got no clear answer leaves the first due time, which is the earlier.
async fn reschedule(agent: &ureq::Agent, url: &str, id: &str, delay_ms: u64, ledger: &Ledger) {
    for _ in 0..TRIES {
        match call(agent, "PATCH", url.to_string(), Some(json!({ "delay": delay_ms }))).await {
            Some((200..=299, json)) => {
                if let Some(due) = json.get("due_at").and_then(Value::as_u64) {
                    ledger.rescheduled(id, due);
                }
                return;
            }
            Some((409, _)) => return,
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// One request off the runtime's threads: the status and the JSON answered, or `None` when unanswered.
async fn call(agent: &ureq::Agent, method: &'static str, url: String, body: Option<Value>) -> Option<(u16, Value)> {
    let agent = agent.clone();
    tokio::task::spawn_blocking(move || {
        let mut response = match (method, body) {
            ("POST", Some(body)) => agent.post(&url).send_json(body),
            ("PATCH", Some(body)) => agent.patch(&url).send_json(body),
            _ => agent.delete(&url).call(),
        }
        .ok()?;
        let status = response.status().as_u16();
        Some((status, response.body_mut().read_json().unwrap_or(Value::Null)))
    })
    .await
    .ok()
    .flatten()
}
