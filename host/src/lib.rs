//! hourglass: delayed message delivery on brokers without a native delay.
//!
//! # Layout
//!
//! The folders are the data path: a request comes in through [`service`] (or
//! the CLI), the [`scheduler`] asks a [`planner`] for broker [`command`]s and
//! hands them to its [`executor::Broker`], which sends them and waits for the
//! broker's confirm. Which broker that is, only [`broker`] knows.
//!
//! ```text
//! cli ─▶ broker (registry + one folder per broker) ─▶ service ─▶ scheduler ─▶ planner
//!                                                                   │            │
//!                                                                   ▼            ▼
//!                                                               executor ─▶ command (leaf)
//! ```
//!
//! * [`command`] is the broker command vocabulary (the WIT types, checked),
//!   [`message`] the broker-neutral message properties, [`headers`] names
//!   every header, [`clock`] is Unix-ms time, [`backoff`] the jittered waits
//!   between reconnects and restarts, `stop` the waits that give way to the
//!   stop signal, `recent` bounded counts per message, [`cancellation`] the
//!   answers a cancellation keeper gives: leaves (or nearly: `message` uses
//!   `command`) every layer may use.
//! * [`config`] reads `delay.toml`, `[broker]` included ([`config::broker`]:
//!   each kind, its settings and what it can do); it uses [`planner`] for
//!   planner sources and limits.
//! * [`planner`] runs WebAssembly planners in a sandbox: one engine per
//!   process, the compiled-component cache, the built-in planners.
//! * [`executor`] is the seam every broker implements to run commands, and
//!   [`executor::Broker`] the one handle over whichever it is.
//! * [`scheduler`] takes one message from request to confirmed publish and
//!   holds the configured [`scheduler::strategies`].
//! * [`service`] is `hourglass serve`: HTTP API, ingress, reload, readiness,
//!   shutdown, and [`service::side::BrokerSide`], what a broker runs beside
//!   the scheduler.
//! * [`broker`] holds the brokers, one folder each ([`broker::memory`],
//!   [`broker::rabbitmq`], [`broker::sqs`], [`broker::nats`], the only
//!   modules that use their client libraries), and [`broker::registry`], the
//!   one place that opens the kind a config names.
//! * [`report`] is what a broker answers the CLI's one-shot commands with.
//! * [`sim`] is the in-memory broker with a virtual clock, the simulation of a
//!   strategy on it, and the planner conformance check built on both.
//! * [`metrics`] are shared by all of the above; [`render`] prints plans,
//!   topologies and traces as tables, JSON, Mermaid or DOT.
//! * [`scaffold`] writes a new planner project in Rust, Python or JavaScript
//!   (`hourglass new-planner`).
//!
//! The `hourglass` binary (`main.rs`, `cli/`) is a thin command line over these.

pub mod backoff;
pub mod broker;
pub mod cancellation;
pub mod clock;
pub mod command;
pub mod config;
mod environment;
pub mod executor;
pub mod headers;
pub mod message;
pub mod metrics;
pub mod planner;
mod recent;
pub mod render;
pub mod report;
pub mod scaffold;
pub mod scheduler;
pub mod service;
pub mod sim;
mod stop;
