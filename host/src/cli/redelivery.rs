//! `hourglass redelivery`: delayed redelivery of rejected messages, as a running `serve` reports it.

use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use hourglass::config::Config;
use hourglass::render;

use super::{Cli, TextOrJson, print_json};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub action: Action,
}

#[derive(Subcommand)]
pub enum Action {
    /// Per queue: messages waiting in delay queues, redelivered, and given up (since the service started).
    Status {
        /// The service's base URL (default: http:// + service.listen from the config).
        #[arg(long, value_name = "URL")]
        url: Option<String>,
        #[arg(long, value_enum, default_value = "table")]
        format: TextOrJson,
    },
}

pub fn run(cli: &Cli, args: &Args) -> Result<ExitCode> {
    let Args { action: Action::Status { url, format } } = args;
    let config = Config::load(&cli.config)?;
    let base = url.clone().unwrap_or_else(|| format!("http://{}", config.service.listen.as_deref().unwrap_or("127.0.0.1:8080")));
    let status = redelivery_status(&base, config.service.token().as_deref())?;
    match format {
        TextOrJson::Json => print_json(&status)?,
        TextOrJson::Table => print!("{}", redelivery_table(&status)),
    }
    Ok(ExitCode::SUCCESS)
}

/// `GET /v1/redelivery` from a running service.
fn redelivery_status(base: &str, token: Option<&str>) -> Result<Vec<hourglass::service::side::QueueStatus>> {
    #[derive(serde::Deserialize)]
    struct Answer {
        queues: Vec<hourglass::service::side::QueueStatus>,
    }
    let url = format!("{}/v1/redelivery", base.trim_end_matches('/'));
    let agent: ureq::Agent = ureq::Agent::config_builder().timeout_global(Some(std::time::Duration::from_secs(10))).http_status_as_error(false).build().into();
    let mut request = agent.get(&url);
    if let Some(token) = token {
        request = request.header("Authorization", &format!("Bearer {token}"));
    }
    let mut response = request.call().with_context(|| format!("{url}: is `hourglass serve` running there?"))?;
    let status = response.status();
    let body = response.body_mut().read_to_string().with_context(|| format!("{url}: reading the answer"))?;
    if !status.is_success() {
        bail!("{url}: HTTP {status}: {body}");
    }
    let answer: Answer = serde_json::from_str(&body).with_context(|| format!("{url}: unexpected answer {body:?}"))?;
    Ok(answer.queues)
}

/// `hourglass redelivery status`: one row per consumer queue.
pub fn redelivery_table(queues: &[hourglass::service::side::QueueStatus]) -> String {
    if queues.is_empty() {
        return "no queues configured for redelivery ([[redelivery]] in the service's config)\n".into();
    }
    let rows: Vec<Vec<String>> = queues
        .iter()
        .map(|q| {
            vec![
                q.queue.clone(),
                q.waiting.to_string(),
                q.redelivered.to_string(),
                q.given_up.to_string(),
                q.strategy.clone(),
                q.policy.clone(),
                q.max_attempts.map_or("-".into(), |m| m.to_string()),
                q.error_queue.clone(),
            ]
        })
        .collect();
    render::table(&["QUEUE", "WAITING", "REDELIVERED", "GIVEN UP", "STRATEGY", "POLICY", "MAX ATTEMPTS", "ERROR QUEUE"], &rows)
}
