//! JetStream message schedules (nats-server 2.12+): a message the server
//! itself keeps and publishes later (`nats-schedule`), and its cancel.
//!
//! Each message is one schedule on a subject of its own,
//! `hourglass.schedules.<id>.<target>` (the server keeps one schedule per
//! subject; the id comes first so a cancel finds it knowing only the id). The
//! server requires the schedule and its target to be in one stream, which
//! must allow schedules: the user's destination stream, which hourglass never
//! changes. A publish the server refuses fails naming what to add.
//!
//! Times: `Nats-Schedule: @at <RFC 3339>` is absolute, read on the server's
//! clock, so a delay becomes the latest time the server's clock can read now
//! plus the delay (never earlier on any reading). A server that does not know
//! schedules (before 2.12) would store the message as an ordinary one and
//! never send it on, so the host asks the server's version first.

use async_nats::HeaderMap;
use async_nats::jetstream::response::Response;
use async_nats::jetstream::stream::Stream;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::NatsExecutor;
use crate::executor::ExecutorError;

/// The first tokens of every schedule subject.
pub const SUBJECT_PREFIX: &str = "hourglass.schedules";
/// The schedule header, and the target's.
pub(crate) const SCHEDULE: &str = "Nats-Schedule";
pub(crate) const TARGET: &str = "Nats-Schedule-Target";
/// The first server version with one-shot schedules.
pub const FIRST_VERSION: (u64, u64) = (2, 12);

/// The subject a message's schedule is kept on. `id` must be one subject token.
pub fn subject(id: &str, target: &str) -> Result<String, ExecutorError> {
    if id.is_empty() || id.contains(|c: char| c.is_whitespace() || c.is_control() || matches!(c, '.' | '*' | '>')) {
        return Err(ExecutorError::Invalid(format!(
            "message id {id:?}: a NATS schedule is kept on a subject named by the id, which must be one subject token (no '.', '*', '>' or spaces)"
        )));
    }
    Ok(format!("{SUBJECT_PREFIX}.{id}.{target}"))
}

/// What a cancel matches: every schedule of the message `id`.
pub fn subjects_of(id: &str) -> String {
    format!("{SUBJECT_PREFIX}.{id}.>")
}

/// The stream subject that captures the schedules of messages to `target`:
/// what a user adds to the stream that captures `target`.
pub fn capture_for(target: &str) -> String {
    format!("{SUBJECT_PREFIX}.*.{target}")
}

/// `@at` and the time, to the millisecond, in UTC.
pub fn at(at_ms: u64) -> String {
    let time = OffsetDateTime::from_unix_timestamp_nanos(i128::from(at_ms) * 1_000_000).unwrap_or(OffsetDateTime::UNIX_EPOCH);
    format!("@at {}", time.format(&Rfc3339).unwrap_or_default())
}

/// The time of an `@at` schedule, Unix ms; `None` for anything else.
pub fn at_ms(schedule: &str) -> Option<u64> {
    let time = OffsetDateTime::parse(schedule.strip_prefix("@at ")?.trim(), &Rfc3339).ok()?;
    u64::try_from(time.unix_timestamp_nanos() / 1_000_000).ok()
}

/// "2.15.1" as (2, 15); `None` when it does not read as a version.
pub fn major_minor(version: &str) -> Option<(u64, u64)> {
    let mut parts = version.trim_start_matches('v').split(['.', '-']);
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

impl NatsExecutor {
    /// Fails unless the server this client talks to knows one-shot schedules.
    pub(crate) fn check_schedules_known(&self) -> Result<(), ExecutorError> {
        let version = self.client.server_info().version;
        match major_minor(&version) {
            Some(found) if found >= FIRST_VERSION => Ok(()),
            _ => Err(ExecutorError::Refused(format!(
                "nats-server {version} has no message schedules (they came in {}.{}); use the nats-hold strategy on it",
                FIRST_VERSION.0, FIRST_VERSION.1
            ))),
        }
    }

    /// Publishes the message as a schedule to `target`, due `after_ms` from
    /// the latest the server's clock can read now. `before` runs once the
    /// checks pass and before the publish (a cancellable message's fate is
    /// written there, so no cancel can miss the schedule).
    pub(crate) async fn schedule(
        &self,
        id: &str,
        target: &str,
        after_ms: u64,
        mut headers: HeaderMap,
        body: bytes::Bytes,
        before: impl Future<Output = Result<(), ExecutorError>>,
    ) -> Result<(), ExecutorError> {
        let subject = subject(id, target)?;
        self.check_schedules_known()?;
        if !self.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains(target) {
            keeper(self, target).await?;
            self.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(target.to_string());
        }
        before.await?;
        let at_ms = self.clock().latest_ms() + after_ms;
        headers.insert(SCHEDULE, at(at_ms).as_str());
        headers.insert(TARGET, target);
        let published = self.publish(&subject, headers, body).await;
        if let Err(ExecutorError::Refused(_) | ExecutorError::Unroutable(_)) = &published {
            // The stream changed since it was checked: check again next time, to say what it lacks now.
            self.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(target);
        }
        published
    }
}

/// The stream that keeps the schedules to `target`: the one that captures
/// `target`, which must allow schedules and capture the schedule subjects too.
/// The error names everything it lacks.
pub(crate) async fn keeper(executor: &NatsExecutor, target: &str) -> Result<String, ExecutorError> {
    let name = match executor.jetstream().stream_by_subject(target).await {
        Ok(name) => name,
        Err(e) if e.kind() == async_nats::jetstream::context::GetStreamByNameErrorKind::NotFound => {
            return Err(ExecutorError::Unroutable(format!("no stream captures subject {target:?}")));
        }
        Err(e) => return Err(ExecutorError::Unavailable(format!("looking up the stream of {target:?}: {e}"))),
    };
    let mut lacks = Vec::new();
    if !allowed_in(executor, &name).await? {
        lacks.push(format!("message schedules allowed (allow_msg_schedules: `nats stream edit {name} --allow-schedules`)"));
    }
    let capture = capture_for(target);
    let example = subject("hourglass-check", target)?;
    match executor.jetstream().stream_by_subject(example.as_str()).await {
        Ok(keeper) if keeper == name => {}
        Ok(other) => lacks.push(format!("subject {capture:?} (stream {other} captures it now; schedules must be kept beside their target)")),
        Err(_) => lacks.push(format!("subject {capture:?} among its subjects")),
    }
    if lacks.is_empty() {
        Ok(name)
    } else {
        Err(ExecutorError::Refused(format!("stream {name} captures {target:?} but cannot keep schedules to it: it needs {}", lacks.join(" and "))))
    }
}

/// Whether stream `name` allows message schedules (`allow_msg_schedules`),
/// read from its raw configuration: the client's typed one has the option only
/// with a feature that would send newer servers' options to every server.
pub(crate) async fn allowed_in(executor: &NatsExecutor, name: &str) -> Result<bool, ExecutorError> {
    let unavailable = |e: &dyn std::fmt::Display| ExecutorError::Unavailable(format!("reading stream {name}: {e}"));
    let info: Response<serde_json::Value> =
        executor.jetstream().request(format!("STREAM.INFO.{name}"), &serde_json::json!({})).await.map_err(|e| unavailable(&e))?;
    match info {
        Response::Ok(info) => Ok(info["config"]["allow_msg_schedules"].as_bool().unwrap_or(false)),
        Response::Err { error } => Err(unavailable(&error)),
    }
}

/// The schedule of message `id` kept in `stream`, with its due time: `None` when there is none.
pub(crate) async fn find(stream: &Stream<()>, id: &str) -> Result<Option<(String, u64)>, ExecutorError> {
    match stream.get_first_raw_message_by_subject(subjects_of(id), 0).await {
        Ok(message) => {
            let due_ms = message.headers.get(SCHEDULE).and_then(|value| at_ms(value.as_str())).unwrap_or(0);
            Ok(Some((message.subject.to_string(), due_ms)))
        }
        Err(e) if e.kind() == async_nats::jetstream::stream::RawMessageErrorKind::NoMessageFound => Ok(None),
        Err(e) => Err(ExecutorError::Unavailable(format!("looking up the schedule of {id}: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_is_written_to_the_millisecond_and_reads_back() {
        let written = at(1_796_208_043_713);
        assert_eq!(written, "@at 2026-12-02T10:40:43.713Z");
        assert_eq!(at_ms(&written), Some(1_796_208_043_713));
        assert_eq!(at_ms("@every 1m"), None);
    }

    #[test]
    fn a_subject_holds_the_id_first_and_only_a_single_token_id() {
        assert_eq!(subject("0f8c", "orders.created").unwrap(), "hourglass.schedules.0f8c.orders.created");
        assert_eq!(subjects_of("0f8c"), "hourglass.schedules.0f8c.>");
        for id in ["a.b", "a*", ">", "a b", ""] {
            assert!(matches!(subject(id, "orders"), Err(ExecutorError::Invalid(_))), "{id:?}");
        }
    }

    #[test]
    fn versions_before_2_12_are_told_apart() {
        assert_eq!(major_minor("2.9.10"), Some((2, 9)));
        assert_eq!(major_minor("2.15.1"), Some((2, 15)));
        assert_eq!(major_minor("2.12.0-RC.1"), Some((2, 12)));
        assert!(major_minor("2.9.10").unwrap() < FIRST_VERSION && major_minor("2.12.0").unwrap() >= FIRST_VERSION);
    }
}
