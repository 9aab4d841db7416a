//! Command-line parsing, and one module per subcommand with its arguments and
//! its body. Errors become one line on stderr and a non-zero exit; only this
//! binary uses `anyhow`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand, ValueEnum};
use hourglass::config::{Config, LogFormat};
use hourglass::planner::LoadedPlanner;
use hourglass::scheduler::strategies::Strategies;
use hourglass_planner_sdk::parse_duration_ms;

mod cancel;
mod check_planner;
mod inspect;
mod migrate;
mod new_planner;
mod parked;
mod plan;
mod progress;
mod pump;
mod redelivery;
mod schedule;
mod serve;
mod simulate;
mod strategies;
mod topology;
mod transfer;
mod verify;

#[derive(Parser)]
#[command(name = "hourglass", version, about = "Delayed message delivery for RabbitMQ, SQS and NATS JetStream, planned by WebAssembly strategies")]
struct Cli {
    /// The configuration file.
    #[arg(long, global = true, default_value = "delay.toml", env = "HOURGLASS_CONFIG")]
    config: PathBuf,
    /// The strategy to use (default: the destination's, else `default_strategy`).
    #[arg(long, global = true)]
    strategy: Option<String>,
    #[command(subcommand)]
    command: Commands,
}

#[derive(Clone, Copy, ValueEnum)]
enum TextOrJson {
    Table,
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
enum TopologyFormat {
    Table,
    Json,
    Mermaid,
    Dot,
}

#[derive(Subcommand)]
enum Commands {
    /// Show the broker commands one delayed message gets, and its route.
    Plan(plan::Args),
    /// Show the strategy's static topology (and a destination's setup with --to);
    /// with --apply, declare it on the configured broker.
    Topology(topology::Args),
    /// Publish one delayed message and wait for the broker's confirm.
    Schedule(schedule::Args),
    /// Run messages through the strategy on the in-memory broker and show their routes.
    Simulate(simulate::Args),
    /// Check that a planner component delivers what it promises.
    CheckPlanner(check_planner::Args),
    /// Start a planner project (Rust, Python or JavaScript) that builds and passes check-planner.
    NewPlanner(new_planner::Args),
    /// Compare the broker with the strategy's topology (and each --to destination's setup).
    Verify(verify::Args),
    /// Run the cycle pumps of a pump-driven strategy (sqs-cycles) until interrupted.
    Pump(pump::Args),
    /// Run the HTTP API: POST /v1/messages, GET /v1/plan, /healthz, /readyz, /metrics.
    Serve(serve::Args),
    /// Delayed redelivery of rejected messages, as a running `serve` reports it.
    Redelivery(redelivery::Args),
    /// List the configured strategies and their planners.
    Strategies(strategies::Args),
    /// Show how many messages wait in each strategy's queues on RabbitMQ now.
    Inspect(inspect::Args),
    /// Cancel a message of a cancellable strategy: it is never delivered.
    Cancel(cancel::CancelArgs),
    /// Give a message of a cancellable strategy a new due time.
    Reschedule(cancel::RescheduleArgs),
    /// List, replay or drop the messages hourglass set aside (parked and invalid).
    Parked(parked::Args),
    /// Move the messages waiting in one strategy's queues into another strategy, keeping their due times.
    Transfer(transfer::Args),
    /// Move off RabbitMQ's delayed-message plugin: plan (and start) the switch of an x-delayed-message exchange.
    Migrate(migrate::Args),
}

/// `--to DEST` and `--delay DUR` or `--at TIME`, as `plan` and `schedule` take them.
#[derive(clap::Args)]
struct DelayedMessage {
    /// The destination queue.
    #[arg(long = "to", value_name = "DEST", required_unless_present = "exchange", conflicts_with = "exchange")]
    destination: Option<String>,
    /// Deliver through this exchange instead (RabbitMQ): its bindings route the message when due.
    #[arg(long, value_name = "EXCHANGE")]
    exchange: Option<String>,
    /// With --exchange: the routing key it is published with when due (default: empty).
    #[arg(long, value_name = "KEY", requires = "exchange")]
    routing_key: Option<String>,
    /// `10s`, `1500ms`, `2h 5m` or milliseconds.
    #[arg(long, value_parser = duration_arg, value_name = "DUR", required_unless_present = "at", conflicts_with = "at")]
    delay: Option<u64>,
    /// The due time instead of a delay, RFC 3339: `2026-11-23T18:00:00Z`, `2026-11-23T19:00:00+01:00`.
    #[arg(long, value_parser = hourglass::clock::parse_rfc3339_ms, value_name = "TIME")]
    at: Option<u64>,
}

impl DelayedMessage {
    /// The queue or exchange it is due to, for choosing its strategy and for messages.
    fn target(&self) -> &str {
        self.exchange.as_deref().or(self.destination.as_deref()).unwrap_or_default()
    }

    /// How its destination reads in a sentence: `orders`, or `exchange orders (routing key "k")`.
    fn describe(&self) -> String {
        match (&self.exchange, &self.destination) {
            (Some(exchange), _) => format!("exchange {exchange} (routing key {:?})", self.routing_key.as_deref().unwrap_or_default()),
            (None, destination) => destination.clone().unwrap_or_default(),
        }
    }

    /// The delay asked for, or what is left until `--at` now (none once it has passed).
    fn delay_ms_from_now(&self) -> u64 {
        match (self.delay, self.at) {
            (Some(delay), _) => delay,
            (None, Some(at)) => at.saturating_sub(hourglass::clock::unix_now_ms()),
            (None, None) => unreachable!("clap requires --delay or --at"),
        }
    }
}

fn duration_arg(text: &str) -> Result<u64, String> {
    parse_duration_ms(text)
}

fn header_arg(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("header {text:?} is not K=V")),
    }
}

fn tokio_runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().worker_threads(2).build()?)
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Commands::Serve(_)) {
        init_logging(LogFormat::Human, "warn");
    }
    match run(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Log lines on stderr at `level`, the brokers' clients quieter; `RUST_LOG`
/// overrides that, and `HOURGLASS_LOG_FORMAT` (`human` or `json`) `format`.
fn init_logging(format: LogFormat, level: &str) {
    let default_filter = format!("{level},{}", hourglass::broker::registry::CLIENT_LOG_DIRECTIVES);
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default_filter.into());
    let format = match std::env::var("HOURGLASS_LOG_FORMAT").as_deref() {
        Ok("json") => LogFormat::Json,
        Ok("human") => LogFormat::Human,
        _ => format,
    };
    // Colours only on a terminal: escape codes in a journal or a log file are noise.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Human => builder.init(),
    }
}

fn load(cli: &Cli) -> Result<(Config, Strategies)> {
    let config = Config::load(&cli.config)?;
    let strategies = Strategies::load(&config)?;
    Ok((config, strategies))
}

fn pick<'s>(cli: &Cli, config: &Config, strategies: &'s mut Strategies, destination: Option<&str>) -> Result<(String, &'s mut LoadedPlanner)> {
    let name = match (&cli.strategy, destination) {
        (Some(name), _) => name.clone(),
        (None, Some(dest)) => config.strategy_for(dest).to_string(),
        (None, None) => config.default_strategy.clone(),
    };
    let planner = strategies.get_mut(&name).map_err(anyhow::Error::msg)?;
    Ok((name, planner))
}

fn print_json(value: &impl serde::Serialize) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

fn run(cli: Cli) -> Result<ExitCode> {
    match &cli.command {
        Commands::Plan(args) => plan::run(&cli, args),
        Commands::Topology(args) => topology::run(&cli, args),
        Commands::Schedule(args) => schedule::run(&cli, args),
        Commands::Simulate(args) => simulate::run(&cli, args),
        Commands::CheckPlanner(args) => check_planner::run(args),
        Commands::NewPlanner(args) => new_planner::run(args),
        Commands::Verify(args) => verify::run(&cli, args),
        Commands::Pump(args) => pump::run(&cli, args),
        Commands::Serve(args) => serve::run(&cli, args),
        Commands::Redelivery(args) => redelivery::run(&cli, args),
        Commands::Strategies(args) => strategies::run(&cli, args),
        Commands::Inspect(args) => inspect::run(&cli, args),
        Commands::Cancel(args) => cancel::cancel(&cli, args),
        Commands::Reschedule(args) => cancel::reschedule(&cli, args),
        Commands::Transfer(args) => transfer::run(&cli, args),
        Commands::Parked(args) => parked::run(&cli, args),
        Commands::Migrate(args) => migrate::run(&cli, args),
    }
}
