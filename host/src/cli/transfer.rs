//! `hourglass transfer --from A --to B [--dry-run]`: moves the messages
//! waiting in strategy A's queues into strategy B, each keeping its due time
//! (see `hourglass::broker::rabbitmq::transfer`), with progress on a terminal and a summary.

use std::process::ExitCode;

use anyhow::{Result, bail};
use hourglass::broker;
use hourglass::broker::rabbitmq::take::Taker;
use hourglass::broker::rabbitmq::transfer::{DEFAULT_BATCH, Summary, transfer};
use hourglass::config::broker::RabbitMqSettings;
use hourglass::scheduler::Scheduler;

use super::progress::Progress;
use super::{Cli, TextOrJson, load, print_json, tokio_runtime};

#[derive(clap::Args)]
pub struct Args {
    /// The strategy whose queues are emptied.
    #[arg(long)]
    pub from: String,
    /// The strategy the messages are scheduled through.
    #[arg(long)]
    pub to: String,
    /// Count what would move; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Messages taken, scheduled and acked at a time.
    #[arg(long, default_value_t = DEFAULT_BATCH)]
    pub batch: usize,
    #[arg(long, value_enum, default_value = "table")]
    pub format: TextOrJson,
}

pub fn run(cli: &Cli, args: &Args) -> Result<ExitCode> {
    let (config, strategies) = load(cli)?;
    let Some(RabbitMqSettings { url, .. }) = config.broker.rabbitmq() else {
        bail!("transfer moves messages between RabbitMQ queues; broker.kind is not \"rabbitmq\"");
    };
    let summary = tokio_runtime()?.block_on(async {
        let scheduler = Scheduler::new(&config, strategies, broker::connect(&config.broker).await?);
        let taker = Taker::open_spread(&url).await?;
        let (from, to) = (args.from.as_str(), args.to.as_str());
        let management = hourglass::broker::rabbitmq::manage::management_for(&config);
        let management = management.as_deref();
        let found = transfer(&scheduler, &taker, management, from, to, true, args.batch, |_, _| {}).await?;
        let mut progress = Progress::new(found.queues.iter().map(|q| q.found).sum());
        let summary = if args.dry_run {
            found
        } else {
            transfer(&scheduler, &taker, management, from, to, false, args.batch, |queue, moved| progress.advance(moved, queue)).await?
        };
        let took = progress.finish();
        taker.close().await;
        Ok::<_, anyhow::Error>((summary, took))
    })?;
    let (summary, took) = summary;
    match args.format {
        TextOrJson::Json => print_json(&summary)?,
        TextOrJson::Table => print_summary(&summary, took),
    }
    Ok(if summary.left == 0 && summary.unreadable == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn print_summary(summary: &Summary, took: std::time::Duration) {
    let rows: Vec<Vec<String>> = summary
        .queues
        .iter()
        .filter(|q| q.found > 0 || q.moved > 0 || !q.left.is_empty() || q.unreadable.is_some())
        .map(|q| {
            let unreadable = q.unreadable.iter().map(|why| format!("all: could not be read ({why})"));
            let left = q.left.iter().map(|(why, n)| format!("{n} ({why})")).chain(unreadable).collect::<Vec<_>>().join("; ");
            vec![q.queue.clone(), q.found.to_string(), q.moved.to_string(), left]
        })
        .collect();
    print!("{}", hourglass::render::table(&["QUEUE", "FOUND", "MOVED", "LEFT"], &rows));
    let due = |ms: Option<u64>| {
        ms.map_or("-".to_string(), |ms| humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms)).to_string())
    };
    if summary.unreadable > 0 {
        println!("{} of {}'s queues could not be read: what they hold was not counted or moved", summary.unreadable, summary.from);
    }
    if summary.dry_run {
        let found: u64 = summary.queues.iter().map(|q| q.found).sum();
        println!("dry run: {found} messages wait in {}'s queues; nothing was moved", summary.from);
    } else {
        println!(
            "moved {} messages from {} to {} in {:.1?} (due {} to {}); {} left in place",
            summary.moved,
            summary.from,
            summary.to,
            took,
            due(summary.earliest_due_ms),
            due(summary.latest_due_ms),
            summary.left
        );
    }
}
