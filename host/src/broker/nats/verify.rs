//! `hourglass verify` on NATS: what the strategies rely on, proven on the
//! user's server. Each check passes or fails with a reason:
//!
//! * JetStream answers for this account (the held streams live there);
//! * the server is 2.7.2 or later (a negative acknowledgement with a delay);
//! * a probe: a message declined for 300 ms on a stream of the probe's own is
//!   delivered again no sooner, and within a second (the held stream's
//!   whole mechanism, then deleted);
//! * each stream a strategy declares exists with its subjects and, for a
//!   held stream, work-queue retention (`serve` creates a missing one; one
//!   with other settings it cannot mend);
//! * each destination asked about (`--to`) is captured by a stream;
//! * where a strategy plans schedules (`nats-schedule`): the server knows
//!   them (2.12+), and each destination's stream allows them and captures
//!   the destination's schedule subjects.

use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{AckPolicy, pull};
use async_nats::jetstream::{AckKind, stream};
use futures_util::StreamExt;
use serde::Serialize;

use super::{NatsExecutor, schedule};
use crate::command::{Command, NatsCommand};
use crate::config::broker::NatsSettings;
use crate::executor::{Executor, ExecutorError};
use crate::planner::PlanRequest;
use crate::render;
use crate::report::{CommandError, Verdict};
use crate::scheduler::strategies::Strategies;

/// The oldest server whose consumers take a delay with a negative acknowledgement.
const OLDEST_SERVER: (u64, u64, u64) = (2, 7, 2);
/// How long the probe declines its message.
const PROBE_DELAY: Duration = Duration::from_millis(300);

/// One thing verified, and what was found.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub name: String,
    pub passed: bool,
    pub detail: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub server_version: String,
    pub checks: Vec<Check>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
    }
}

fn check(name: impl Into<String>, result: Result<String, String>) -> Check {
    match result {
        Ok(detail) => Check { name: name.into(), passed: true, detail },
        Err(detail) => Check { name: name.into(), passed: false, detail },
    }
}

/// `hourglass verify` on NATS: every strategy's streams, `destinations`, and
/// a probe of the held streams' mechanism unless `probe` is false.
pub async fn verify_command(settings: &NatsSettings, strategies: &mut Strategies, destinations: &[String], probe: bool) -> Result<Verdict, CommandError> {
    let mut everything: Vec<Command> = Vec::new();
    let mut schedules = false;
    for strategy in strategies.names().map(str::to_string).collect::<Vec<_>>() {
        let planner = strategies.get(&strategy)?;
        everything.extend(planner.topology()?);
        // A strategy says what it relies on by what it plans: a second's delay to a destination of the probe's.
        let probe = PlanRequest { destination: "hourglass.verify".into(), delay_ms: 1_000, message_id: "verify".into(), routing_key: None };
        schedules |= planner.plan(&probe).is_ok_and(|plan| plan.commands.iter().any(|c| matches!(c, Command::Nats(NatsCommand::Schedule { .. }))));
    }
    let nats = super::connect(settings).await?;
    let report = verify(&nats, &everything, destinations, probe, schedules).await;
    let rows: Vec<Vec<String>> =
        report.checks.iter().map(|c| vec![c.name.clone(), if c.passed { "passed".into() } else { "FAILED".into() }, c.detail.clone()]).collect();
    let table = format!("nats-server {}\n{}", report.server_version, render::table(&["CHECK", "RESULT", "DETAIL"], &rows));
    let json = serde_json::to_value(&report).map_err(|e| CommandError::failed("writing the report", e))?;
    Ok(Verdict { passed: report.passed(), table, json })
}

/// The checks of every stream `commands` ensure, once JetStream answers.
pub async fn streams(executor: &NatsExecutor, commands: &[Command]) -> Result<Vec<Check>, ExecutorError> {
    jetstream_answers(executor).await.map_err(ExecutorError::Unavailable)?;
    Ok(stream_checks(executor, commands).await)
}

async fn stream_checks(executor: &NatsExecutor, commands: &[Command]) -> Vec<Check> {
    let mut checks = Vec::new();
    for command in commands {
        if let Command::Nats(NatsCommand::EnsureStream { name, subjects, held }) = command {
            checks.push(check(format!("stream {name}"), stream_matches(executor, name, subjects, *held).await));
        }
    }
    checks
}

/// Verifies `commands` (the strategies' declarations), `destinations`, and the server's mechanisms.
pub async fn verify(executor: &NatsExecutor, commands: &[Command], destinations: &[String], probe: bool, schedules: bool) -> Report {
    let server_version = executor.client.server_info().version;
    let mut checks = vec![check("server version", version_is_enough(&server_version)), check("JetStream", jetstream_answers(executor).await)];
    if probe {
        checks.push(check("probe: a declined message comes back after its delay", probe_decline(executor).await));
    }
    checks.extend(stream_checks(executor, commands).await);
    for destination in destinations {
        let found = executor.check_destination(destination).await.map(|()| "a stream captures it".to_string()).map_err(|e| e.to_string());
        checks.push(check(format!("destination {destination}"), found));
        if schedules {
            checks.push(check(format!("schedules to {destination}"), schedules_kept_beside(executor, destination).await));
        }
    }
    if schedules {
        let known = executor.check_schedules_known().map(|()| "one-shot schedules (@at)".to_string()).map_err(|e| e.to_string());
        checks.push(check("message schedules", known));
    }
    Report { server_version, checks }
}

/// Whether the stream that captures `destination` allows schedules and captures its schedule subjects.
async fn schedules_kept_beside(executor: &NatsExecutor, destination: &str) -> Result<String, String> {
    let name = schedule::keeper(executor, destination).await.map_err(|e| e.to_string())?;
    Ok(format!("stream {name} allows schedules and captures {}", schedule::capture_for(destination)))
}

fn version_is_enough(version: &str) -> Result<String, String> {
    let mut parts = version.trim_start_matches('v').split(['.', '-']).map(|p| p.parse::<u64>().unwrap_or(0));
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if found >= OLDEST_SERVER {
        Ok(format!("{version}: declines with a delay"))
    } else {
        Err(format!("{version} is older than 2.7.2, which added a delay to a negative acknowledgement; the held streams need it"))
    }
}

async fn jetstream_answers(executor: &NatsExecutor) -> Result<String, String> {
    let answer = executor.client.request("$JS.API.INFO", "".into()).await.map_err(|e| format!("no answer from JetStream: {e}"))?;
    let info: serde_json::Value = serde_json::from_slice(&answer.payload).map_err(|e| format!("JetStream answered what is not JSON: {e}"))?;
    match info.get("error") {
        Some(error) => Err(format!("JetStream refused: {error}; enable it on the server (nats-server -js) for this account")),
        None => Ok(format!("enabled ({} streams)", info["streams"].as_u64().unwrap_or(0))),
    }
}

async fn stream_matches(executor: &NatsExecutor, name: &str, subjects: &[String], held: bool) -> Result<String, String> {
    let mut stream = match executor.jetstream.get_stream(name).await {
        Ok(stream) => stream,
        Err(e) => return Err(format!("missing ({e}); `serve` creates it")),
    };
    let info = stream.info().await.map_err(|e| e.to_string())?;
    let missing: Vec<&String> = subjects.iter().filter(|s| !info.config.subjects.contains(s)).collect();
    if !missing.is_empty() {
        return Err(format!("captures {:?}, not {missing:?}", info.config.subjects));
    }
    if held && info.config.retention != stream::RetentionPolicy::WorkQueue {
        return Err(format!("retention is {:?}: a held stream must be a work queue, so a handed-over message is gone", info.config.retention));
    }
    Ok(format!("{} messages, {} replicas", info.state.messages, info.config.num_replicas))
}

/// A message on a stream of the probe's own, declined for [`PROBE_DELAY`]; the stream is deleted after.
async fn probe_decline(executor: &NatsExecutor) -> Result<String, String> {
    let name = format!("hourglass-probe-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let subject = format!("hourglass.probe.{name}");
    let measured = async {
        let config = stream::Config { name: name.clone(), subjects: vec![subject.clone()], max_age: Duration::from_secs(60), ..Default::default() };
        let stream = executor.jetstream.create_stream(config).await.map_err(|e| format!("creating the probe's stream: {e}"))?;
        let consumer = stream
            .create_consumer(pull::Config { ack_policy: AckPolicy::Explicit, ack_wait: Duration::from_secs(10), ..Default::default() })
            .await
            .map_err(|e| format!("creating the probe's consumer: {e}"))?;
        executor.publish(&subject, async_nats::HeaderMap::new(), "probe".into()).await.map_err(|e: ExecutorError| e.to_string())?;
        let mut messages = consumer.messages().await.map_err(|e| e.to_string())?;
        let first =
            tokio::time::timeout(Duration::from_secs(5), messages.next()).await.ok().flatten().and_then(Result::ok).ok_or("the probe was not delivered")?;
        first.ack_with(AckKind::Nak(Some(PROBE_DELAY))).await.map_err(|e| e.to_string())?;
        let declined = Instant::now();
        let again = tokio::time::timeout(Duration::from_secs(5), messages.next())
            .await
            .ok()
            .flatten()
            .and_then(Result::ok)
            .ok_or("the declined probe never came back")?;
        let after = declined.elapsed();
        again.ack().await.map_err(|e| e.to_string())?;
        if after < PROBE_DELAY {
            return Err(format!("it came back after {after:?}, before its {PROBE_DELAY:?} delay"));
        }
        if after > PROBE_DELAY + Duration::from_secs(1) {
            return Err(format!("it came back after {after:?}, more than a second after its {PROBE_DELAY:?} delay"));
        }
        Ok(format!("declined for {PROBE_DELAY:?}, back after {after:?}"))
    }
    .await;
    let _ = executor.jetstream.delete_stream(&name).await;
    measured
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_before_2_7_2_is_refused_naming_why() {
        assert!(version_is_enough("2.9.10").is_ok());
        assert!(version_is_enough("2.7.2").is_ok());
        assert!(version_is_enough("v2.15.1-beta").is_ok());
        assert!(version_is_enough("2.7.1").unwrap_err().contains("2.7.2"));
        assert!(version_is_enough("2.6.6").is_err());
    }
}
