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

#[derive(Debug, Error)]
pub enum CommandError {
    /// The configured broker has no such command: the kinds that have it.
    #[error("{command} needs {kinds}")]
    Unsupported { command: &'static str, kinds: String },
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
    #[error("{step}: {source}")]
    Failed {
        step: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl CommandError {
    /// `step` failed with `source`.
    pub fn failed(step: &'static str, source: impl std::error::Error + Send + Sync + 'static) -> CommandError {
        CommandError::Failed { step, source: Box::new(source) }
    }
}
