//! `hourglass migrate delayed-exchange NAME`: plan (and with --apply, start)
//! the move of a delayed-message plugin exchange to hourglass.

use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::ValueEnum;
use hourglass::broker;
use hourglass::broker::rabbitmq::manage::{self, Management, vhost_of};
use hourglass::broker::rabbitmq::migrate::{self, Applied, Plan};
use hourglass::config::Config;
use hourglass::config::broker::RabbitMqSettings;
use hourglass::render;
use serde::Serialize;

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

#[derive(Serialize)]
struct Report<'a> {
    #[serde(flatten)]
    plan: &'a Plan,
    #[serde(skip_serializing_if = "Option::is_none")]
    applied: Option<&'a Applied>,
}

pub fn run(cli: &Cli, args: &Args) -> Result<ExitCode> {
    let What::DelayedExchange(args) = &args.what;
    let config = Config::load(&cli.config)?;
    let Some(RabbitMqSettings { url: amqp, management_url, .. }) = config.broker.rabbitmq() else {
        bail!("{}: the delayed-message plugin is RabbitMQ's; migrate needs broker.kind = \"rabbitmq\"", config.path.display());
    };
    let management = args
        .management_url
        .clone()
        .or_else(|| manage::management_url(&amqp, management_url.as_deref()))
        .context("no management API to read the exchange from: give one with --management-url")?;
    let api = Management::new(&management, vhost_of(&amqp)).map_err(anyhow::Error::msg)?;
    let configured = config.exchanges.get(&args.name);
    let deliver_to = args.deliver_to.as_deref().or(configured.map(|entry| entry.deliver_to.as_str()));
    let mut plan = migrate::plan(&api, &args.name, deliver_to)?;
    if let Some(entry) = configured {
        if entry.kind.exchange_kind() != plan.exchange.delayed_type {
            plan.notes.push(format!(
                "{} already has [exchanges.{:?}] with type = {:?}, but the plugin's exchange routes as {}: make them the same, or due messages are routed differently than before",
                config.path.display(),
                args.name,
                entry.kind.exchange_kind().as_str(),
                plan.exchange.delayed_type.as_str()
            ));
        }
        if entry.deliver_to != plan.deliver_to {
            plan.notes.push(format!(
                "{} has deliver_to = {:?} for {:?}; this plan uses {:?}",
                config.path.display(),
                entry.deliver_to,
                args.name,
                plan.deliver_to
            ));
        }
    }
    let applied = if args.apply {
        if let Some(why) = &plan.blocked {
            show(cli, &plan, None, args.format)?;
            bail!("refusing to apply: {why}");
        }
        let applied = tokio_runtime()?.block_on(async {
            let broker = broker::connect(&config.broker).await?;
            Ok::<_, anyhow::Error>(migrate::apply(&broker, &plan).await?)
        })?;
        Some(applied)
    } else {
        None
    };
    show(cli, &plan, applied.as_ref(), args.format)?;
    match &applied {
        Some(applied) if !applied.failed.is_empty() => {
            for failure in &applied.failed {
                eprintln!("error: {failure}");
            }
            Ok(ExitCode::FAILURE)
        }
        _ => Ok(ExitCode::SUCCESS),
    }
}

fn show(cli: &Cli, plan: &Plan, applied: Option<&Applied>, format: Format) -> Result<()> {
    match format {
        Format::Json => print_json(&Report { plan, applied }),
        Format::Text => {
            print!("{}", text(&cli.config.display().to_string(), plan, applied));
            Ok(())
        }
    }
}

fn indent(text: &str, by: &str) -> String {
    text.lines().map(|line| format!("{by}{line}\n")).collect()
}

fn arguments(arguments: &serde_json::Map<String, serde_json::Value>) -> String {
    arguments.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", ")
}

/// The plan as a reader follows it: what was found, then the steps in order.
fn text(config: &str, plan: &Plan, applied: Option<&Applied>) -> String {
    let exchange = &plan.exchange;
    let (name, deliver_to, kind) = (&exchange.name, &plan.deliver_to, plan.exchange.delayed_type.as_str());
    let mut out = String::new();
    let mut line = |text: String| {
        out.push_str(&text);
        out.push('\n');
    };
    line(format!("Plugin exchange {name:?} in vhost {:?}", exchange.vhost));
    line(format!("  x-delayed-type    {kind}"));
    line(format!("  delayed messages  {}", exchange.messages_delayed.summary()));
    line(format!("  bindings          {} from it, {} into it", exchange.bindings.len(), exchange.incoming.len()));
    line(String::new());

    line(format!("1. Add to {config}. hourglass then declares {name:?} as a fanout exchange feeding"));
    line(format!("   its intake, and routes each message when due through {deliver_to:?}"));
    line("   with the routing key it was published with:".into());
    line(String::new());
    line(indent(&plan.toml, "    ").trim_end().to_string());
    line(String::new());

    line(format!("2. Declare {deliver_to:?} ({kind}, durable) and bind to it what is bound to {name:?} now."));
    if plan.deliver_to_exists.is_some() {
        line(format!("   {deliver_to:?} exists already."));
    }
    line(format!("   --apply does both; {name:?} and its bindings stay as they are:"));
    line(String::new());
    let rows: Vec<Vec<String>> = exchange
        .bindings
        .iter()
        .filter(|b| !plan.by_hand.iter().any(|h| &h.binding == *b))
        .map(|b| vec![b.destination.clone(), b.destination_type.as_str().to_string(), b.routing_key.clone(), arguments(&b.arguments)])
        .collect();
    if rows.is_empty() {
        line("    (nothing)".into());
    } else {
        line(indent(&render::table(&["DESTINATION", "TYPE", "ROUTING KEY", "ARGUMENTS"], &rows), "    ").trim_end().to_string());
    }
    if !plan.by_hand.is_empty() {
        line(String::new());
        line("   Bind these yourself (--apply does not):".into());
        for hand in &plan.by_hand {
            let b = &hand.binding;
            line(format!("    - {} {:?}, key {:?}: {}", b.destination_type.as_str(), b.destination, b.routing_key, hand.why));
        }
    }
    line(String::new());

    line("3. Change the exchange declarations, never the publishes:".into());
    line(format!("   - Producers: stop declaring {name:?} (type x-delayed-message); hourglass declares it."));
    line(format!("     Every publish stays as it is: exchange {name:?}, its routing key, its x-delay header."));
    line(format!("   - Consumers: bind each queue to {deliver_to:?} (declare it as a durable {kind} exchange)"));
    line(format!("     where they bound it to {name:?}. A queue bound to {name:?} once hourglass has"));
    line("     declared it gets every message at once, undelayed.".into());
    line(String::new());

    line("4. Cut over in this order, and no message is lost:".into());
    let mut steps: Vec<String> = vec![
        format!("Stop the producers that publish to {name:?}."),
        "Wait until this command shows 0 delayed messages on every node: as long as the\n   longest delay already published.".into(),
        "Run this command again with --apply.".into(),
        "Deploy the consumers' change.".into(),
        format!("Delete the plugin's exchange (hourglass never does):\n     {}", plan.delete_command),
        format!(
            "Start (or restart) hourglass serve with the entry of step 1: it declares {name:?} as a\n   fanout exchange feeding its intake (the broker refuses that while the plugin's exchange exists)."
        ),
    ];
    if !exchange.incoming.is_empty() {
        let commands: Vec<String> = exchange.incoming.iter().map(|i| format!("     {}", i.command)).collect();
        steps.push(format!("Bind again what was bound into {name:?} (deleting it removed these):\n{}", commands.join("\n")));
    }
    steps.push("Start the producers with their change.".into());
    for (letter, step) in ('a'..).zip(&steps) {
        line(indent(&format!("{letter}. {step}"), "   ").trim_end().to_string());
    }

    if !plan.notes.is_empty() {
        line(String::new());
        line("Notes:".into());
        for note in &plan.notes {
            line(format!("  - {note}"));
        }
    }
    line(String::new());
    match (applied, &plan.blocked) {
        (Some(applied), _) => {
            line("Applied:".into());
            for done in &applied.done {
                line(format!("  done    {done}"));
            }
            for failed in &applied.failed {
                line(format!("  FAILED  {failed}"));
            }
        }
        (None, Some(why)) => line(format!("--apply refuses now: {why}")),
        (None, None) => line(format!("--apply would declare {deliver_to:?} and make {} binding(s) on it now.", plan.commands.len() - 1)),
    }
    out
}
