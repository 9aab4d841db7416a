//! Planners: WebAssembly components run in a sandbox.
//!
//! * [`PlannerRuntime`] owns the one wasmtime engine, the epoch ticker that
//!   bounds every call, and the on-disk cache of compiled components.
//! * [`LoadedPlanner`] is one configured instance per strategy; every call goes
//!   through it and comes back converted to host types and validated.
//! * [`builtin`] holds the four planners embedded in the binary.

pub mod bindings {
    wasmtime::component::bindgen!({
        world: "planner-world",
        path: "../wit",
    });
}

pub mod builtin;
mod cache;
mod convert;
mod instance;
mod runtime;

pub use crate::command::{DueAction, DueMessage};
pub use instance::{BrokerFamily, ConfigKey, DelayRange, Granularity, LoadedPlanner, Plan, PlanRequest, PlannerInfo, RedeliveryDecision};
pub use runtime::{PlannerLimits, PlannerRuntime, PlannerSource};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum PlannerError {
    #[error("planner {planner}: cannot read {path}: {source}")]
    Read { planner: String, path: String, source: std::io::Error },
    #[error("planner {planner}: {path} is not a WebAssembly component: {reason}")]
    NotAComponent { planner: String, path: String, reason: String },
    #[error("planner {planner} does not implement hourglass:planner@0.1.0: {reason}")]
    WrongContract { planner: String, reason: String },
    #[error("planner {planner} rejected its configuration: {message}")]
    Config { planner: String, message: String },
    #[error("planner {planner} refused: {message}")]
    Refused { planner: String, message: String },
    #[error("planner {planner} failed in {function}: {reason}")]
    Trapped { planner: String, function: &'static str, reason: String },
    #[error("planner {planner} returned an invalid command from {function}: {reason}")]
    InvalidOutput { planner: String, function: &'static str, reason: String },
    #[error("planner engine: {0}")]
    Engine(String),
}
