//! `hourglass cancel ID` and `hourglass reschedule ID`: the same cancellation
//! log as `DELETE` and `PATCH /v1/messages/{id}` of a running `serve`, written
//! and read straight on RabbitMQ. The answer comes once this process has read
//! the log up to its own event, so a long log takes a while (`--wait`). On
//! SQS the entry goes to the fates queue, and a serving host answers it on a
//! reply queue this process makes for itself.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Result, bail};
use hourglass::broker::nats::cancel::NatsCancel;
use hourglass::broker::{self, RabbitMqSettings, SqsSettings};
use hourglass::clock::Clock;
use hourglass::config::BrokerConfig;
use hourglass::scheduler::Scheduler;
use hourglass::service::cancel::{Answer, CancelLog};
use hourglass::service::cancellations::Cancellations;
use hourglass::service::sqs_cancel::SqsCancel;
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

/// Runs `ask` against the log while a reader reads it, or on SQS against the
/// fates queue while a reply queue of this process's own (deleted after) takes the answer.
fn with_log(cli: &Cli, wait_ms: u64, ask: impl AsyncFnOnce(&dyn Cancellations, &Arc<Clock>) -> Result<Answer>) -> Result<Answer> {
    let (mut config, strategies) = load(cli)?;
    config.service.cancel.answer_timeout = Some(DurationMs(wait_ms));
    tokio_runtime()?.block_on(async {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        if let Some(RabbitMqSettings { url, .. }) = config.broker.rabbitmq() {
            let scheduler = Scheduler::new(&config, strategies, broker::connect(&config.broker).await?);
            // The log's records and due times count on the broker's clock, as a serving host's do.
            hourglass::service::clock_check::read_for(&config, scheduler.clock()).await;
            let clock = scheduler.clock().clone();
            let log = CancelLog::new(&url, &config.service.cancel, Arc::new(scheduler));
            let reader = tokio::spawn(log.clone().read(stopped));
            let answer = ask(log.as_ref(), &clock).await;
            let _ = stop.send(true);
            let _ = reader.await;
            answer
        } else if let Some(SqsSettings { region, endpoint_url, send_batch_window }) = config.broker.sqs() {
            let sqs = broker::connect_sqs(&region, &endpoint_url, send_batch_window).await?;
            let clock = Clock::system();
            // The fates queue is made by `serve`; without it nothing here is cancellable.
            let cancel = SqsCancel::open(sqs.clone(), &config.service.cancel, clock.clone(), false).await?;
            let listener = tokio::spawn({
                let cancel = cancel.clone();
                async move { cancel.listen(stopped).await }
            });
            let answer = ask(cancel.as_ref(), &clock).await;
            let _ = stop.send(true);
            let _ = listener.await;
            cancel.close().await;
            answer
        } else if config.broker.nats().is_some() {
            let nats = broker::connect_nats(&config.broker).await?;
            let bucket = hourglass::broker::nats::cancellation_bucket(config.service.cancel.log());
            // The bucket is made by `serve`; without it nothing here is cancellable.
            let cancel = NatsCancel::open(&nats, &bucket, config.service.cancel.retention_ms(), false).await?;
            ask(&cancel, &Clock::system()).await
        } else {
            bail!("cancellation needs {}", BrokerConfig::kinds_that(|can| can.cancellation_log))
        }
    })
}

pub fn cancel(cli: &Cli, args: &CancelArgs) -> Result<ExitCode> {
    let answer = with_log(cli, args.wait, async |asked: &dyn Cancellations, _: &Arc<Clock>| Ok(asked.cancel(&args.id).await?))?;
    Ok(report(&args.id, answer))
}

pub fn reschedule(cli: &Cli, args: &RescheduleArgs) -> Result<ExitCode> {
    let answer = with_log(cli, args.wait, async |asked: &dyn Cancellations, clock: &Arc<Clock>| {
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
