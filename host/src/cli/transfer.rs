//! `hourglass transfer --from A --to B [--dry-run]`: moves the messages
//! waiting in strategy A's queues into strategy B, each keeping its due time
//! (on RabbitMQ), with progress on a terminal and a summary.

use std::process::ExitCode;

use anyhow::Result;
use hourglass::broker::registry;
use hourglass::report::Transfer;

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
    #[arg(long, default_value_t = Transfer::DEFAULT_BATCH)]
    pub batch: usize,
    #[arg(long, value_enum, default_value = "table")]
    pub format: TextOrJson,
}

pub fn run(cli: &Cli, args: &Args) -> Result<ExitCode> {
    let (config, strategies) = load(cli)?;
    let request = Transfer { from: args.from.clone(), to: args.to.clone(), dry_run: args.dry_run, batch: args.batch };
    let mut bar = Bar(None);
    let verdict = tokio_runtime()?.block_on(registry::transfer(&config, strategies, &request, &mut bar))?;
    if let Some(progress) = bar.0 {
        progress.finish();
    }
    match args.format {
        TextOrJson::Json => print_json(&verdict.json)?,
        TextOrJson::Table => print!("{}", verdict.table),
    }
    Ok(if verdict.passed { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// The progress bar, made once the total is known.
struct Bar(Option<Progress>);

impl hourglass::report::Progress for Bar {
    fn begin(&mut self, total: u64) {
        self.0 = Some(Progress::new(total));
    }

    fn advance(&mut self, steps: u64, item: &str) {
        if let Some(progress) = &mut self.0 {
            progress.advance(steps, item);
        }
    }
}
