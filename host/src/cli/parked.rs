//! `hourglass parked list|replay|drop`: the messages hourglass set aside
//! (parking queues and their `.orphaned`, release queues' `.parked`, the
//! ingress's invalid queue).

use std::process::ExitCode;

use anyhow::{Result, bail};
use hourglass::broker;
use hourglass::broker::rabbitmq::parked::{self, Handled, ParkingQueue};
use hourglass::broker::rabbitmq::take::Taker;
use hourglass::config::broker::RabbitMqSettings;
use hourglass::scheduler::Scheduler;

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
    let Some(RabbitMqSettings { url, .. }) = config.broker.rabbitmq() else {
        bail!("parked reads RabbitMQ queues; broker.kind is not \"rabbitmq\"");
    };
    tokio_runtime()?.block_on(async {
        let scheduler = Scheduler::new(&config, strategies, broker::connect(&config.broker).await?);
        let mut queues = parked::parking_queues(&config, &scheduler);
        let wanted = match &args.action {
            Action::List { queue, .. } | Action::Replay { queue, .. } | Action::Drop { queue, .. } => queue.clone(),
        };
        if let Some(wanted) = &wanted {
            queues.retain(|q| &q.queue == wanted);
            if queues.is_empty() {
                let known = parked::parking_queues(&config, &scheduler).into_iter().map(|q| q.queue).collect::<Vec<_>>().join(", ");
                bail!("{wanted:?} is not a parking or invalid queue of this config (they are: {known})");
            }
        }
        let taker = Taker::open(&url).await?;
        // A queue no host declared yet (an orphan queue before the first serve, say) holds nothing.
        let mut declared = Vec::with_capacity(queues.len());
        for queue in queues {
            match taker.depth(&queue.queue).await? {
                Some(_) => declared.push(queue),
                None if wanted.is_some() => bail!("{:?} does not exist on the broker (a serving host declares it)", queue.queue),
                None => {}
            }
        }
        let queues = declared;
        let code = match &args.action {
            Action::List { limit, format, .. } => list(&taker, &queues, *limit, *format).await?,
            Action::Replay { id, .. } => {
                let mut results = Vec::new();
                for queue in &queues {
                    results.push(parked::replay(&scheduler, &taker, queue, &config.service.ingress.queue, id.as_deref()).await?);
                }
                report("replayed", &results, true)
            }
            Action::Drop { id, all, .. } => {
                if id.is_none() && !all {
                    bail!("drop removes messages for good: name one with --id, or all of them with --all");
                }
                let mut results = Vec::new();
                for queue in &queues {
                    results.push(parked::drop(&taker, &queue.queue, id.as_deref()).await?);
                }
                report("dropped", &results, false)
            }
        };
        taker.close().await;
        Ok(code)
    })
}

async fn list(taker: &Taker, queues: &[ParkingQueue], limit: usize, format: TextOrJson) -> Result<ExitCode> {
    let mut all = Vec::new();
    for queue in queues {
        all.extend(parked::list(taker, &queue.queue, limit).await?);
    }
    match format {
        TextOrJson::Json => print_json(&all)?,
        TextOrJson::Table => {
            let rows: Vec<Vec<String>> = all
                .iter()
                .map(|m| {
                    vec![
                        m.queue.clone(),
                        m.message_id.clone().unwrap_or_default(),
                        m.destination.clone().unwrap_or_default(),
                        m.reason.clone().unwrap_or_default(),
                    ]
                })
                .collect();
            print!("{}", hourglass::render::table(&["QUEUE", "MESSAGE ID", "DESTINATION", "REASON"], &rows));
            println!("{} set-aside messages shown (at most {limit} per queue)", all.len());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// One line per queue touched; exit 1 when any selected message stayed.
/// With `split`, how many went round their strategy again (not due yet), how
/// many to a release queue (a cancellable strategy's) and how many straight on.
fn report(verb: &str, results: &[Handled], split: bool) -> ExitCode {
    let how = |h: &Handled| {
        if !split {
            return String::new();
        }
        // Only a cancellable strategy's messages go there: said when it happened, not on every replay.
        let released = if h.released > 0 { format!("{} to their release queue, where the cancellation log decides, ", h.released) } else { String::new() };
        format!(" ({} rescheduled for their due time, {released}{} forwarded)", h.rescheduled, h.done - h.rescheduled - h.released)
    };
    for handled in results.iter().filter(|h| h.done > 0 || h.left > 0) {
        let done = format!("{}: {verb} {}{}", handled.queue, handled.done, how(handled));
        match &handled.why_left {
            Some(why) => println!("{done}, {} left ({why})", handled.left),
            None => println!("{done}"),
        }
    }
    let total = results.iter().fold(Handled::default(), |total, h| Handled {
        done: total.done + h.done,
        rescheduled: total.rescheduled + h.rescheduled,
        released: total.released + h.released,
        left: total.left + h.left,
        ..total
    });
    println!("{verb} {} messages{}; {} left in place", total.done, how(&total), total.left);
    if total.left == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
