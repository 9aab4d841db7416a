//! `hourglass serve`: run the HTTP API: POST /v1/messages, GET /v1/plan, /healthz, /readyz, /metrics.

use std::process::ExitCode;

use anyhow::{Context, Result};
use hourglass::config::Config;
use hourglass::executor::Executor;
use hourglass::service::{self, Service};

use super::{Cli, init_logging, tokio_runtime};

#[derive(clap::Args)]
pub struct Args {
    /// Address to listen on (default: service.listen, else 127.0.0.1:8080).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
}

pub fn run(cli: &Cli, args: &Args) -> Result<ExitCode> {
    let Args { listen } = args;
    let config = Config::load(&cli.config)?;
    init_logging(config.service.log_format.unwrap_or_default(), "info");
    let listen = listen.clone().or_else(|| config.service.listen.clone()).unwrap_or_else(|| "127.0.0.1:8080".into());
    tokio_runtime()?.block_on(async {
        let listener = tokio::net::TcpListener::bind(&listen).await.with_context(|| format!("listen on {listen}"))?;
        let service = Service::start(config).await?;
        let place = service.scheduler().executor().describe();
        eprintln!("hourglass serving on http://{} with {place}", listener.local_addr()?);
        tokio::spawn(reload_on_sighup(service.clone()));
        service::run(listener, service, shutdown_signal()).await?;
        eprintln!("hourglass stopped");
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// SIGHUP re-reads the config; a bad one is logged and the running one stays.
async fn reload_on_sighup(service: std::sync::Arc<Service>) {
    #[cfg(unix)]
    {
        let Ok(mut hangup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else { return };
        while hangup.recv().await.is_some() {
            match service.reload().await {
                Ok(reloaded) => eprintln!("reloaded: strategies {:?}, default {}", reloaded.strategies, reloaded.default_strategy),
                Err(err) => eprintln!("reload refused, the running config stays: {err}"),
            }
        }
    }
    #[cfg(not(unix))]
    let _ = service;
}

pub(super) async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    interrupt.await.ok();
}
