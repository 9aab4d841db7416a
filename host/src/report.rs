//! What a broker answers the CLI's one-shot commands with (`verify`, …):
//! a [`Verdict`] it rendered itself, or a [`CommandError`]. The registry
//! (`broker/registry.rs`) asks the configured broker; the CLI prints
//! what comes back and never learns which broker answered.

use thiserror::Error;

use crate::config::UnknownStrategy;
use crate::executor::ExecutorError;
use crate::planner::PlannerError;
use crate::scheduler::ScheduleError;
use crate::scheduler::strategies::StrategyError;

/// A check's outcome: a table for people, JSON for programs, and whether it passed.
#[derive(Debug)]
pub struct Verdict {
    pub passed: bool,
    pub table: String,
    pub json: serde_json::Value,
}

/// Where long work says how far it got (the CLI draws a bar on a terminal,
/// plain lines otherwise).
pub trait Progress {
    /// `total` steps are ahead.
    fn begin(&mut self, total: u64);
    /// `steps` more are done, on `item`.
    fn advance(&mut self, steps: u64, item: &str);
}

/// What `hourglass parked` does with the messages set aside in `queue` (default: every such queue).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParkedAction {
    /// Shows up to `limit` per queue; nothing moves.
    List { queue: Option<String>, limit: usize },
    /// Publishes them (or the one with message id `id`) again, then removes them.
    Replay { queue: Option<String>, id: Option<String> },
    /// Removes them (or the one with message id `id`) for good.
    Drop { queue: Option<String>, id: Option<String> },
}

impl ParkedAction {
    pub fn queue(&self) -> Option<&str> {
        match self {
            ParkedAction::List { queue, .. } | ParkedAction::Replay { queue, .. } | ParkedAction::Drop { queue, .. } => queue.as_deref(),
        }
    }
}

/// `hourglass transfer`: the messages waiting in strategy `from`'s queues
/// scheduled through `to`, `batch` at a time, keeping their due times; with
/// `dry_run`, only counted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transfer {
    pub from: String,
    pub to: String,
    pub dry_run: bool,
    pub batch: usize,
}

impl Transfer {
    /// Messages taken, scheduled and acked at a time unless `--batch` says.
    pub const DEFAULT_BATCH: usize = 256;
}

/// `hourglass migrate delayed-exchange`: the delayed-message plugin's
/// exchange `name` to move to hourglass, routing due messages through
/// `deliver_to`, read through `management_url`; with `apply`, started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DelayedExchangeMove {
    pub name: String,
    pub deliver_to: Option<String>,
    pub management_url: Option<String>,
    pub apply: bool,
}

/// A migration's plan as shown (`text`, `json`), why `--apply` was refused,
/// and the steps of it that failed.
#[derive(Debug)]
pub struct Migration {
    pub text: String,
    pub json: serde_json::Value,
    pub refused: Option<String>,
    pub failed: Vec<String>,
}

#[derive(Debug, Error)]
pub enum CommandError {
    /// The configured broker has no such command: the kinds that have it.
    #[error("{command} needs {kinds}")]
    Unsupported { command: &'static str, kinds: String },
    /// An argument the command cannot take, and why.
    #[error("{reason}")]
    Argument { argument: &'static str, reason: String },
    #[error(transparent)]
    Broker(#[from] ExecutorError),
    #[error(transparent)]
    Strategy(#[from] StrategyError),
    #[error(transparent)]
    UnknownStrategy(#[from] UnknownStrategy),
    #[error(transparent)]
    Planner(#[from] PlannerError),
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    /// A step of the broker's own failed; its error is the source.
    #[error("{step}")]
    Failed {
        step: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// What `hourglass plan` asks about a strategy's cost, where its broker
/// bills by request.
#[derive(Clone, Debug)]
pub struct CostQuestion {
    /// USD per million requests.
    pub price_per_million: f64,
    /// A steady stream of such messages, besides the one.
    pub stream: Option<StreamQuestion>,
}

/// Messages arriving one by one at a steady rate, each to the next destination in turn.
#[derive(Clone, Debug)]
pub struct StreamQuestion {
    pub rate_per_second: f64,
    pub lasting_ms: u64,
    pub destinations: u64,
    /// One request there and back.
    pub round_trip_ms: u64,
    /// Bytes of one message, body and attributes; the broker's estimate when not given.
    pub message_bytes: Option<u64>,
}

/// A strategy's cost as `plan` shows it: fields of its JSON, lines of its table.
#[derive(Debug, Default)]
pub struct PlanCost {
    pub json: serde_json::Map<String, serde_json::Value>,
    pub lines: Vec<String>,
}

impl CommandError {
    /// `step` failed with `source`.
    pub fn failed(step: &'static str, source: impl std::error::Error + Send + Sync + 'static) -> CommandError {
        CommandError::Failed { step, source: Box::new(source) }
    }
}
