//! `hourglass migrate delayed-exchange NAME` on RabbitMQ: the plan read
//! through the management API ([`super::migrate`]), checked against the
//! config's `[exchanges."NAME"]`, applied over AMQP when asked, and shown as a
//! reader follows it.

use serde::Serialize;

use super::manage::{self, Management, vhost_of};
use super::migrate::{self, Applied, Plan};
use crate::config::Config;
use crate::config::broker::RabbitMqSettings;
use crate::render;
use crate::report::{CommandError, DelayedExchangeMove, Migration};

#[derive(Serialize)]
struct Report<'a> {
    #[serde(flatten)]
    plan: &'a Plan,
    #[serde(skip_serializing_if = "Option::is_none")]
    applied: Option<&'a Applied>,
}

/// Plans (and with `request.apply`, starts) the move of the plugin's exchange `request.name`.
pub async fn migrate_command(settings: &RabbitMqSettings, config: &Config, request: &DelayedExchangeMove) -> Result<Migration, CommandError> {
    let RabbitMqSettings { url: amqp, management_url, .. } = settings;
    let Some(management) = request.management_url.clone().or_else(|| manage::management_url(amqp, management_url.as_deref())) else {
        return Err(CommandError::Argument {
            argument: "management-url",
            reason: "no management API to read the exchange from: give one with --management-url".into(),
        });
    };
    let api = Management::new(&management, vhost_of(amqp)).map_err(|e| CommandError::failed("the management API", e))?;
    let configured = config.exchanges.get(&request.name);
    let deliver_to = request.deliver_to.as_deref().or(configured.map(|entry| entry.deliver_to.as_str()));
    let (name, deliver_to) = (request.name.clone(), deliver_to.map(str::to_string));
    let mut plan = tokio::task::spawn_blocking(move || migrate::plan(&api, &name, deliver_to.as_deref()))
        .await
        .map_err(|e| CommandError::failed("reading the exchange", e))?
        .map_err(|e| CommandError::failed("reading the exchange", e))?;
    if let Some(entry) = configured {
        if entry.kind.exchange_kind() != plan.exchange.delayed_type {
            plan.notes.push(format!(
                "{} already has [exchanges.{:?}] with type = {:?}, but the plugin's exchange routes as {}: make them the same, or due messages are routed differently than before",
                config.path.display(),
                request.name,
                entry.kind.exchange_kind().as_str(),
                plan.exchange.delayed_type.as_str()
            ));
        }
        if entry.deliver_to != plan.deliver_to {
            plan.notes.push(format!(
                "{} has deliver_to = {:?} for {:?}; this plan uses {:?}",
                config.path.display(),
                entry.deliver_to,
                request.name,
                plan.deliver_to
            ));
        }
    }
    let refused = plan.blocked.clone().filter(|_| request.apply);
    let applied = match request.apply && refused.is_none() {
        true => Some(migrate::apply(super::connect(settings).await?.as_ref(), &plan).await.map_err(|e| CommandError::failed("applying the plan", e))?),
        false => None,
    };
    let json = serde_json::to_value(Report { plan: &plan, applied: applied.as_ref() }).map_err(|e| CommandError::failed("writing the report", e))?;
    let shown = text(&config.path.display().to_string(), &plan, applied.as_ref());
    Ok(Migration { text: shown, json, refused, failed: applied.map(|a| a.failed).unwrap_or_default() })
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
