//! `hourglass migrate delayed-exchange NAME`: plan (and with --apply, start)
//! the move of a delayed-message plugin exchange to hourglass.

use std::process::ExitCode;

use anyhow::{Result, bail};
use clap::ValueEnum;
use hourglass::broker::registry;
use hourglass::config::Config;
use hourglass::report::DelayedExchangeMove;

use super::{Cli, print_json, tokio_runtime};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub what: What,
}

#[derive(clap::Subcommand)]
pub enum What {
    /// Move an exchange of the delayed-message plugin (type x-delayed-message) to hourglass.
    ///
    /// Reads the exchange NAME through the management API (its x-delayed-type,
    /// its bindings, and how many delayed messages the plugin holds for it on
    /// each node) and prints the plan: the config entry to add, the bindings to
    /// make on the exchange due messages go through, the code to change (the
    /// exchange declarations; never the publishes), and the order of the
    /// cut-over. NAME itself is never changed or deleted: that is a step of the
    /// plan, once no delayed message is left in it.
    DelayedExchange(DelayedExchange),
}

#[derive(clap::Args)]
pub struct DelayedExchange {
    /// The plugin's exchange, the one producers publish to with x-delay.
    pub name: String,
    /// The exchange due messages are routed through: the one consumers bind
    /// their queues to. Default: deliver_to of the config's
    /// `[exchanges."NAME"]` if it has one, else NAME.due, a new exchange only
    /// due messages reach. Name an existing exchange only if every queue bound
    /// to it should get NAME's due messages too (and everything published to
    /// it should reach NAME's queues); it must be durable and of NAME's
    /// x-delayed-type.
    #[arg(long, value_name = "EXCHANGE")]
    pub deliver_to: Option<String>,
    /// The management API to read NAME from (default, as for verify:
    /// $HOURGLASS_MANAGEMENT_URL, else broker.management_url, else each AMQP
    /// host on port 15672). On a cluster give every node's, comma-separated:
    /// the plugin keeps a delayed message on the node that took it, and each
    /// node counts only its own.
    #[arg(long, value_name = "URL")]
    pub management_url: Option<String>,
    /// Declare the deliver_to exchange (durable, of NAME's x-delayed-type) and
    /// bind to it what is bound to NAME, over AMQP on the config's broker.
    /// Refused (exit 1) while the plugin holds delayed messages for NAME on any
    /// node, or when that count cannot be read.
    #[arg(long)]
    pub apply: bool,
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Format {
    Text,
    Json,
}

pub fn run(cli: &Cli, args: &Args) -> Result<ExitCode> {
    let What::DelayedExchange(args) = &args.what;
    let config = Config::load(&cli.config)?;
    let request =
        DelayedExchangeMove { name: args.name.clone(), deliver_to: args.deliver_to.clone(), management_url: args.management_url.clone(), apply: args.apply };
    let migration = tokio_runtime()?.block_on(registry::migrate_delayed_exchange(&config, &request))?;
    match args.format {
        Format::Json => print_json(&migration.json)?,
        Format::Text => print!("{}", migration.text),
    }
    if let Some(why) = &migration.refused {
        bail!("refusing to apply: {why}");
    }
    for failure in &migration.failed {
        eprintln!("error: {failure}");
    }
    Ok(if migration.failed.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
