//! hourglass: delayed message delivery on brokers without a native delay.
//!
//! # Layout
//!
//! * [`planner`] loads delay planners (WebAssembly components) into a sandbox
//!   and calls them: request in, broker commands out.
//! * [`command`] is the broker command vocabulary the host executes, checked
//!   as it leaves a planner.
//! * [`config`] reads `delay.toml`; [`strategy`] turns its strategies into
//!   loaded planners.
//! * [`simulator`] is the in-memory broker with a virtual clock (AMQP
//!   exchanges, queues, TTLs, dead-lettering; SQS queues with delays).
//! * [`simulation`] runs a strategy's commands on the simulator, pumping
//!   pump-driven queues, and reports each message's route.
//! * [`conformance`] checks a planner keeps its promises (`check-planner`).
//! * [`executor`] is the seam between planned commands and a broker;
//!   [`rabbitmq`] and [`sqs`] implement it; [`broker`] connects the one
//!   `delay.toml` names; [`pump`] drives pump-driven strategies on SQS.
//! * [`scheduler`] takes one message from request to confirmed publish,
//!   preparing strategies and destinations on first use.
//! * [`service`] is `hourglass serve`: the HTTP API, reload, shutdown, and
//!   the background work: [`ingress`] (an AMQP queue any client publishes
//!   delayed messages to), [`redelivery`] (rejected messages back to their
//!   queue after a policy's delay) and the pumps. Both AMQP consumers run on
//!   [`consumer`]. [`metrics`] are shared by all of them.
//! * [`verify`] compares a broker with a strategy's topology through the
//!   [`management`] API (which also sets redelivery's broker policies).
//! * [`render`] prints plans, topologies and traces as tables, JSON, Mermaid or DOT.
//!
//! The `hourglass` binary (`main.rs`, `cli.rs`) is a thin command line over these.

pub mod broker;
pub mod command;
pub mod config;
pub mod conformance;
pub mod consumer;
pub mod executor;
pub mod ingress;
pub mod management;
pub mod metrics;
pub mod planner;
pub mod pump;
pub mod rabbitmq;
pub mod redelivery;
pub mod render;
pub mod scheduler;
pub mod service;
pub mod simulation;
pub mod simulator;
pub mod sqs;
pub mod strategy;
pub mod verify;
