//! `hourglass schedule`: publish one delayed message and wait for the broker's confirm.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use hourglass::broker::registry;
use hourglass::command::FieldValue;
use hourglass::executor::Executor;
use hourglass::render;
use hourglass::scheduler::{ScheduleRequest, Scheduler};

use super::{Cli, DelayedMessage, TextOrJson, header_arg, load, print_json, tokio_runtime};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub message: DelayedMessage,
    /// The body as text (else --body-file, else standard input).
    #[arg(long, conflicts_with = "body_file")]
    pub body: Option<String>,
    #[arg(long, value_name = "PATH")]
    pub body_file: Option<PathBuf>,
    /// An application header, repeatable.
    #[arg(long = "header", value_name = "K=V", value_parser = header_arg)]
    pub headers: Vec<(String, String)>,
    #[arg(long)]
    pub content_type: Option<String>,
    #[arg(long, value_enum, default_value = "table")]
    pub format: TextOrJson,
}

pub fn run(cli: &Cli, args: &Args) -> Result<ExitCode> {
    let Args { message, body, body_file, headers, content_type, format } = args;
    let DelayedMessage { destination, exchange, routing_key, .. } = message;
    let (config, strategies) = load(cli)?;
    let body = read_body(body, body_file)?;
    let properties = hourglass::message::Properties { content_type: content_type.clone(), ..Default::default() };
    let request = ScheduleRequest {
        destination: destination.clone().unwrap_or_default(),
        exchange: exchange.clone(),
        routing_key: routing_key.clone(),
        delay_ms: message.delay.unwrap_or_default(),
        deliver_at_ms: message.at,
        body,
        headers: headers.iter().map(|(k, v)| (k.clone(), FieldValue::Text(v.clone()))).collect(),
        properties,
        strategy: cli.strategy.clone(),
        ..Default::default()
    };
    let (scheduled, place, now) = tokio_runtime()?.block_on(async {
        let broker = registry::connect(&config.broker).await?;
        let place = broker.describe();
        let scheduler = Scheduler::new(&config, strategies, broker);
        if request.deliver_at_ms.is_some() {
            // --at is counted on the broker's clock, as a serving host counts it.
            registry::read_clock_once(&config, scheduler.clock()).await;
        }
        let scheduled = scheduler.schedule(request).await?;
        Ok::<_, anyhow::Error>((scheduled, place, scheduler.clock().now_ms()))
    })?;
    let due = humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + std::time::Duration::from_millis(scheduled.due_at_ms));
    match format {
        TextOrJson::Json => print_json(&serde_json::json!({
            "id": scheduled.id,
            "strategy": scheduled.strategy,
            "destination": destination,
            "exchange": exchange,
            "routing_key": routing_key,
            "due_at_ms": scheduled.due_at_ms,
            "due_at": due.to_string(),
            "delivers_after_ms": scheduled.delivers_after_ms,
        }))?,
        TextOrJson::Table => {
            let due_in = message.delay.unwrap_or_else(|| scheduled.due_at_ms.saturating_sub(now));
            let to = message.describe();
            println!("scheduled {} to {to} via strategy {} on {place}: due {due} (in {})", scheduled.id, scheduled.strategy, render::duration(due_in))
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn read_body(body: &Option<String>, body_file: &Option<PathBuf>) -> Result<Vec<u8>> {
    use std::io::{IsTerminal, Read};
    if let Some(text) = body {
        return Ok(text.clone().into_bytes());
    }
    if let Some(path) = body_file {
        return std::fs::read(path).with_context(|| format!("{}: cannot read the body file", path.display()));
    }
    if std::io::stdin().is_terminal() {
        bail!("give the body with --body, --body-file, or on standard input");
    }
    let mut bytes = Vec::new();
    std::io::stdin().read_to_end(&mut bytes).context("reading the body from standard input")?;
    Ok(bytes)
}
