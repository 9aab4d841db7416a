//! Planners: WebAssembly components run in a sandbox.
//!
//! * [`PlannerRuntime`] loads planners on the process's one wasmtime engine
//!   (with the one epoch ticker that bounds every call), through the on-disk
//!   cache of compiled components.
//! * [`LoadedPlanner`] is one strategy's configured planner: a pool of
//!   instances, so calls run in parallel. Every call goes through it (or
//!   through a [`PlannerInstance`] checked out of it) and comes back
//!   converted to host types and validated.
//! * [`builtin`] holds the six planners embedded in the binary.

/// The contract, `hourglass:planner@0.5.0`: what planners are built against.
pub mod bindings {
    wasmtime::component::bindgen!({
        world: "planner-world",
        path: "../wit",
    });

    /// `hourglass:planner@0.4.0`, still loaded: its answers are upgraded to
    /// 0.5.0's types as they leave the planner (see `upgrade`).
    pub mod v0_4 {
        wasmtime::component::bindgen!({
            world: "planner-world",
            path: "../wit/previous/planner@0.4.0.wit",
        });
    }

    /// `hourglass:planner@0.3.0`, still loaded: its answers are upgraded to
    /// 0.5.0's types as they leave the planner (see `upgrade`).
    pub mod v0_3 {
        wasmtime::component::bindgen!({
            world: "planner-world",
            path: "../wit/previous/planner@0.3.0.wit",
        });
    }

    /// `hourglass:planner@0.2.0`, still loaded: its answers are upgraded to
    /// 0.5.0's types as they leave the planner (see `upgrade`).
    pub mod v0_2 {
        wasmtime::component::bindgen!({
            world: "planner-world",
            path: "../wit/previous/planner@0.2.0.wit",
        });
    }

    /// `hourglass:planner@0.1.0`, still loaded: its answers are upgraded to
    /// 0.5.0's types as they leave the planner (see `upgrade`).
    pub mod v0_1 {
        wasmtime::component::bindgen!({
            world: "planner-world",
            path: "../wit/previous/planner@0.1.0.wit",
        });
    }
}

pub mod builtin;
mod cache;
mod contract;
mod convert;
mod epoch;
mod inert_wasi;
mod instance;
mod runtime;
mod upgrade;

pub use crate::command::{DueAction, DueMessage, HeldAction, HeldMessage};
pub(crate) use contract::ContractMismatch;
pub use epoch::epoch_ticker_asleep;
pub use instance::{
    BrokerFamily, ConfigKey, DelayRange, Granularity, LoadedPlanner, Plan, PlanRequest, PlannerInfo, PlannerInstance, PlannerLimits, RedeliveryDecision,
};
#[cfg(feature = "testing")]
pub use runtime::engines_created;
pub use runtime::{PlannerRuntime, PlannerSource};

use std::time::Duration;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum PlannerError {
    #[error("planner {planner}: cannot read {path}: {source}")]
    Read { planner: String, path: String, source: std::io::Error },
    #[error("planner {planner}: {path} is not a WebAssembly component: {reason}")]
    NotAComponent { planner: String, path: String, reason: String },
    #[error("planner {planner} does not fit the contract hourglass:planner (0.4.0, or 0.3.0, 0.2.0 or 0.1.0 before it): {source}")]
    WrongContract { planner: String, source: ContractMismatch },
    #[error("planner {planner} rejected its configuration: {message}")]
    Config { planner: String, message: String },
    #[error("planner {planner} refused: {message}")]
    Refused { planner: String, message: String },
    #[error("planner {planner} failed in {function}: {reason}")]
    Trapped { planner: String, function: &'static str, reason: String },
    /// Stopped by its epoch deadline: the planner may loop, or the host's CPU
    /// may merely have been starved, so a caller may try the message again.
    #[error(
        "planner {planner} failed in {function}: ran past its time budget of {budget:?} (raise {} in [planners] or in its strategy's table)",
        budget_key(function)
    )]
    Timeout { planner: String, function: &'static str, budget: Duration },
    #[error("planner {planner} returned an invalid command from {function}: {reason}")]
    InvalidOutput { planner: String, function: &'static str, reason: String },
    #[error("planner {planner} returned an invalid command from {function}: {source}")]
    InvalidCommand { planner: String, function: &'static str, source: crate::command::InvalidCommand },
    #[error("planner cache directory {path}: {problem}")]
    CacheDir { path: String, problem: String },
    /// The host's contract could not be added to a linker.
    #[error("planner engine: {0}")]
    Engine(#[source] wasmtime::Error),
    #[error("planner engine: {0}")]
    EngineUnavailable(#[from] runtime::EngineUnavailable),
}

/// The setting that bounds `function`'s time.
fn budget_key(function: &str) -> &'static str {
    if matches!(function, "instantiate" | "configure" | "names") { "start_timeout" } else { "call_timeout" }
}

impl PlannerError {
    /// The call ran out of time (rather than trapping or answering wrongly).
    pub fn is_timeout(&self) -> bool {
        matches!(self, PlannerError::Timeout { .. })
    }
}
