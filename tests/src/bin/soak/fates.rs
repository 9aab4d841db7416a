//! What the checker reads: every queue where hourglass sets a message aside
//! with a reason (each strategy's parking queue and its `.orphaned`, each
//! release queue's `.parked`, the ingress's invalid queue). A canary found
//! there is not lost; a bad ingress message must be found on the invalid queue.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use hourglass::broker::rabbitmq::parked::orphan_queue;
use hourglass_e2e::chaos::canary;
use hourglass_e2e::chaos::ledger::Ledger;
use lapin::options::BasicGetOptions;

use crate::cancels;
use crate::world::World;

/// How long after a fault ends its effects are still counted (clients reconnect, consumers come back).
pub const SETTLE: Duration = Duration::from_secs(5);

/// Which queues to read.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Where {
    /// Only those no running host consumes (not the strategies' parking queues, which hosts unpark).
    NoHostLooks,
    /// All of them: the hosts are stopped.
    Everywhere,
}

/// What was found set aside so far: how many per queue, and each message's reason by body.
#[derive(Default)]
pub struct SetAside {
    found: BTreeMap<String, usize>,
    reasons: HashMap<String, String>,
}

/// Takes every message set aside in the queues `which` names and records
/// the canaries found there in the ledger. The queues are emptied: this is the end of the run.
pub async fn read_set_aside(world: &World, ledger: &Ledger, which: Where) {
    let setup = &world.setup;
    let mut queues = vec![setup.invalid.clone()];
    for (prefix, strategy) in [(&setup.prefix, "main"), (&world.cancellable_prefix, cancels::STRATEGY)] {
        let parking = format!("{prefix}.parked");
        queues.push(orphan_queue(&parking));
        if which == Where::Everywhere {
            queues.push(parking);
        }
        let release_parked = format!("{}.release.{strategy}.parked", setup.prefix);
        queues.push(orphan_queue(&release_parked));
        queues.push(release_parked);
    }
    // Bounded: a broker that went away meanwhile can leave a lapin call unanswered for good.
    match tokio::time::timeout(Duration::from_secs(60), take(world, ledger, &queues)).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => world.problems.lock().unwrap().push(format!("could not read the queues where messages are set aside: {err:#}")),
        Err(_) => world.problems.lock().unwrap().push("reading the queues where messages are set aside took over 60 s".into()),
    }
}

async fn take(world: &World, ledger: &Ledger, queues: &[String]) -> anyhow::Result<()> {
    let connection = canary::connect(&world.setup.amqp_url).await?;
    for queue in queues {
        // A queue that does not exist closes the channel: one channel per queue.
        let channel = connection.create_channel().await?;
        while let Ok(Some(message)) = channel.basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true }).await {
            let delivery = &message.delivery;
            let reason = ["hourglass-parked-reason", "hourglass-invalid-reason"]
                .iter()
                .find_map(|header| hourglass_e2e::header_text(delivery, header))
                .unwrap_or_default();
            let body = String::from_utf8_lossy(&delivery.data).into_owned();
            if !reason.is_empty() {
                ledger.parked(&body, &reason);
            }
            let mut set_aside = world.set_aside.lock().unwrap();
            *set_aside.found.entry(queue.clone()).or_default() += 1;
            set_aside.reasons.insert(body, reason);
        }
    }
    connection.close(200, "done".into()).await.ok();
    Ok(())
}

/// Checks that every bad ingress message was set aside with a reason, and says what was found where.
pub fn summary(world: &World) -> String {
    let set_aside = world.set_aside.lock().unwrap();
    let garbage = world.garbage.lock().unwrap();
    for marker in garbage.iter() {
        let problem = match set_aside.reasons.get(marker) {
            Some(reason) if !reason.is_empty() => continue,
            Some(_) => format!("bad message {marker} set aside without a reason"),
            None => format!("bad message {marker} is not on the invalid queue"),
        };
        world.problems.lock().unwrap().push(problem);
    }
    let found: Vec<String> = set_aside.found.iter().map(|(queue, n)| format!("{queue}: {n}")).collect();
    format!("{} ({} of them the floods' bad messages)", if found.is_empty() { "nothing".to_string() } else { found.join(", ") }, garbage.len())
}
