//! hourglass: delayed message delivery on brokers without a native delay.
//!
//! # Layout
//!
//! The folders are the data path: a request comes in through [`service`] (or
//! the CLI), the [`scheduler`] asks a [`planner`] for broker [`command`]s and
//! hands them to a [`broker`], which sends them and waits for the confirm.
//!
//! ```text
//! cli ─▶ service ─▶ scheduler ─▶ planner ─┐
//!                       │                 ├─▶ command (leaf)
//!                       └──────▶ broker ──┘
//! ```
//!
//! * [`command`] is the broker command vocabulary (the WIT types, checked),
//!   [`message`] the broker-neutral message properties, [`headers`] names
//!   every header, [`clock`] is Unix-ms time, [`backoff`] the jittered waits
//!   between reconnects and restarts, `stop` the waits that give way to the
//!   stop signal, `recent` bounded counts per message, [`cancellation`] the
//!   answers a cancellation log gives: leaves (or nearly: `message` uses
//!   `command`) every layer may use.
//! * [`config`] reads `delay.toml`; it uses [`planner`] for planner sources
//!   and limits.
//! * [`planner`] runs WebAssembly planners in a sandbox: one engine per
//!   process, the compiled-component cache, the built-in planners.
//! * [`scheduler`] takes one message from request to confirmed publish and
//!   holds the configured [`scheduler::strategies`].
//! * [`broker`] is the neutral [`broker::Executor`] seam with the in-memory
//!   broker; [`broker::rabbitmq`] and [`broker::sqs`] are the only modules
//!   that use lapin and the AWS SDK.
//! * [`service`] is `hourglass serve`: HTTP API, AMQP ingress, redelivery,
//!   pumps, reload and shutdown.
//! * [`sim`] is the in-memory broker with a virtual clock, the simulation of a
//!   strategy on it, and the planner conformance check built on both.
//! * [`parked`] lists, replays and drops the messages set aside
//!   (`hourglass parked`).
//! * [`transfer`] moves waiting messages from one strategy's queues to
//!   another's, keeping their due times (`hourglass transfer`).
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
