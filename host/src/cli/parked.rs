//! `hourglass parked list|replay|drop`: the messages hourglass set aside
//! (parking queues and their `.orphaned`, release queues' `.parked`, the
//! ingress's invalid queue).

use std::process::ExitCode;

use anyhow::{Result, bail};
use hourglass::broker::registry;
use hourglass::report::ParkedAction;

use super::{Cli, TextOrJson, load, print_json, tokio_runtime};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub action: Action,
}

#[derive(clap::Subcommand)]
pub enum Action {
    /// Show set-aside messages and why (nothing moves).
    List {
        /// One queue (default: every parking and invalid queue of this config).
        #[arg(long)]
        queue: Option<String>,
        /// At most this many per queue.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        #[arg(long, value_enum, default_value = "table")]
        format: TextOrJson,
    },
    /// Publish them again, then remove them.
    ///
    /// Each goes to its destination (an invalid one to the ingress; a due one
    /// of a cancellable strategy through its release queue, where the
    /// cancellation log is asked). One not due yet goes round its strategy
    /// again for its due time. One whose destination (or, for a cancellable
    /// strategy, release queue) is still gone stays parked, and the missing
    /// queue is named (exit 1).
    Replay {
        /// One queue (default: every parking and invalid queue of this config).
        #[arg(long)]
        queue: Option<String>,
        /// Only the message with this message id.
        #[arg(long)]
        id: Option<String>,
    },
    /// Remove them for good (needs --id or --all).
    Drop {
        /// One queue (default: every parking and invalid queue of this config).
        #[arg(long)]
        queue: Option<String>,
        /// Only the message with this message id.
        #[arg(long, conflicts_with = "all")]
        id: Option<String>,
        /// Every message in the queues chosen.
        #[arg(long)]
        all: bool,
    },
}

pub fn run(cli: &Cli, args: &Args) -> Result<ExitCode> {
    let (config, strategies) = load(cli)?;
    let (action, format) = match &args.action {
        Action::List { queue, limit, format } => (ParkedAction::List { queue: queue.clone(), limit: *limit }, *format),
        Action::Replay { queue, id } => (ParkedAction::Replay { queue: queue.clone(), id: id.clone() }, TextOrJson::Table),
        Action::Drop { queue, id, all } => {
            if id.is_none() && !all {
                bail!("drop removes messages for good: name one with --id, or all of them with --all");
            }
            (ParkedAction::Drop { queue: queue.clone(), id: id.clone() }, TextOrJson::Table)
        }
    };
    let verdict = tokio_runtime()?.block_on(registry::parked(&config, strategies, &action))?;
    match format {
        TextOrJson::Json => print_json(&verdict.json)?,
        TextOrJson::Table => print!("{}", verdict.table),
    }
    Ok(if verdict.passed { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
