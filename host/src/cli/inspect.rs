//! `hourglass inspect`: what waits in each strategy's queues on the
//! configured broker now, read as a serving host reads them.

use std::process::ExitCode;

use anyhow::Result;
use hourglass::broker::registry;
use hourglass::render;
use hourglass::scheduler::Scheduler;
use hourglass::service::pending;

use super::{Cli, TextOrJson, load, print_json, tokio_runtime};

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, value_enum, default_value = "table")]
    pub format: TextOrJson,
}

pub fn run(cli: &Cli, args: &Args) -> Result<ExitCode> {
    let (config, strategies) = load(cli)?;
    let mut depths = tokio_runtime()?.block_on(async {
        let reading = registry::depth_reading(&config)?;
        let broker = registry::connect(&config.broker).await?;
        anyhow::Ok(pending::read(&Scheduler::new(&config, strategies, broker), false, &Default::default(), &reading).await)
    })?;
    if let Some(wanted) = &cli.strategy {
        depths.retain(|s| &s.strategy == wanted);
    }
    match args.format {
        TextOrJson::Json => print_json(&depths)?,
        TextOrJson::Table => {
            let mut rows = Vec::new();
            for strategy in &depths {
                for queue in strategy.queues.iter().filter(|q| q.messages != Some(0)) {
                    rows.push(vec![
                        strategy.strategy.clone(),
                        queue.queue.clone(),
                        queue.messages.map_or("absent".into(), |m| m.to_string()),
                        queue.ttl_ms.map_or(String::new(), render::duration),
                    ]);
                }
                rows.push(vec![strategy.strategy.clone(), "(all waiting)".into(), strategy.waiting.to_string(), String::new()]);
                rows.push(vec![strategy.strategy.clone(), "(parked)".into(), strategy.parked.to_string(), String::new()]);
            }
            print!("{}", render::table(&["STRATEGY", "QUEUE", "MESSAGES", "TTL"], &rows));
        }
    }
    Ok(ExitCode::SUCCESS)
}
