//! `hourglass cancel ID` and `hourglass reschedule ID`: the same
//! cancellations as `DELETE` and `PATCH /v1/messages/{id}` of a running
//! `serve`, asked of whatever keeps them on the configured broker. On RabbitMQ
//! the answer comes once this process has read the log up to its own event,
//! so a long log takes a while (`--wait`); on SQS a serving host answers on a
//! reply queue this process makes for itself; on NATS the bucket answers.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Result, bail};
use hourglass::broker::registry;
use hourglass::clock::Clock;
use hourglass::service::cancellations::{Answer, Cancellations};
use hourglass_planner_sdk::DurationMs;

use super::{Cli, duration_arg, load, tokio_runtime};

#[derive(clap::Args)]
pub struct CancelArgs {
    /// The id `POST /v1/messages` or `schedule` answered with.
    pub id: String,
    /// How long to wait for the log to be read up to this cancel.
    #[arg(long, value_parser = duration_arg, value_name = "DUR", default_value = "60s")]
    pub wait: u64,
}

#[derive(clap::Args)]
pub struct RescheduleArgs {
    pub id: String,
    /// The new delay, from now.
    #[arg(long, value_parser = duration_arg, value_name = "DUR", required_unless_present = "at", conflicts_with = "at")]
    pub delay: Option<u64>,
    /// The new due time, RFC 3339.
    #[arg(long, value_parser = hourglass::clock::parse_rfc3339_ms, value_name = "TIME")]
    pub at: Option<u64>,
    #[arg(long, value_parser = duration_arg, value_name = "DUR", default_value = "60s")]
    pub wait: u64,
}

/// What the log answered, as an exit: 0 when done (or already so), 1 when too late.
fn report(id: &str, answer: Answer) -> ExitCode {
    let (line, ok) = match answer {
        Answer::Cancelled => (format!("cancelled {id}: it will not be delivered"), true),
        Answer::AlreadyCancelled => (format!("{id} was already cancelled"), true),
        Answer::Rescheduled => (format!("rescheduled {id}"), true),
        Answer::AlreadyReleased => (format!("{id} was already delivered to its destination"), false),
        other => (format!("unexpected answer from the cancellation log: {other:?}"), false),
    };
    if ok {
        println!("{line}");
        ExitCode::SUCCESS
    } else {
        eprintln!("{line}");
        ExitCode::FAILURE
    }
}

/// Runs `ask` against whatever keeps the configured broker's cancellations,
/// opened for this command and closed after.
fn with_cancellations(cli: &Cli, wait_ms: u64, ask: impl AsyncFnOnce(&dyn Cancellations, &Arc<Clock>) -> Result<Answer>) -> Result<Answer> {
    let (mut config, strategies) = load(cli)?;
    config.service.cancel.answer_timeout = Some(DurationMs(wait_ms));
    tokio_runtime()?.block_on(async {
        let open = registry::open_cancellations(&config, strategies).await?;
        let answer = ask(open.keeper.as_ref(), &open.clock).await;
        open.close().await;
        answer
    })
}

pub fn cancel(cli: &Cli, args: &CancelArgs) -> Result<ExitCode> {
    let answer = with_cancellations(cli, args.wait, async |asked: &dyn Cancellations, _: &Arc<Clock>| Ok(asked.cancel(&args.id).await?))?;
    Ok(report(&args.id, answer))
}

pub fn reschedule(cli: &Cli, args: &RescheduleArgs) -> Result<ExitCode> {
    let answer = with_cancellations(cli, args.wait, async |asked: &dyn Cancellations, clock: &Arc<Clock>| {
        // The latest the broker's clock can read: --delay counts from no earlier than now.
        let now = clock.latest_ms();
        let due_at_ms = args.at.unwrap_or(now + args.delay.unwrap_or_default());
        if due_at_ms.saturating_sub(now) > asked.retention_ms() {
            bail!("the new due time is more than service.cancel.retention ({} ms) away; the log would forget it", asked.retention_ms());
        }
        Ok(asked.reschedule(&args.id, due_at_ms).await?)
    })?;
    Ok(report(&args.id, answer))
}
