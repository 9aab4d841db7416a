//! `hourglass strategies`: list the configured strategies and their planners.

use std::process::ExitCode;

use anyhow::Result;
use hourglass::render;

use super::{Cli, TextOrJson, load, print_json};

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, value_enum, default_value = "table")]
    pub format: TextOrJson,
}

pub fn run(cli: &Cli, args: &Args) -> Result<ExitCode> {
    let Args { format } = args;
    let (config, mut strategies) = load(cli)?;
    let names: Vec<String> = strategies.names().map(str::to_string).collect();
    let mut listed = Vec::new();
    for name in names {
        let planner = strategies.get_mut(&name).map_err(anyhow::Error::msg)?;
        listed.push(serde_json::json!({
            "strategy": name,
            "default": name == config.default_strategy,
            "planner": planner.label(),
            "info": planner.info(),
            "delay_range": planner.delay_range(),
        }));
    }
    match format {
        TextOrJson::Json => print_json(&listed)?,
        TextOrJson::Table => {
            let rows: Vec<Vec<String>> = listed
                .iter()
                .map(|s| {
                    vec![
                        format!("{}{}", s["strategy"].as_str().unwrap_or(""), if s["default"] == true { " (default)" } else { "" }),
                        s["planner"].as_str().unwrap_or("").to_string(),
                        s["info"]["family"].as_str().unwrap_or("").to_string(),
                        render::duration(s["delay_range"]["max_delay_ms"].as_u64().unwrap_or(0)),
                    ]
                })
                .collect();
            print!("{}", render::table(&["STRATEGY", "PLANNER", "BROKER", "MAX DELAY"], &rows));
        }
    }
    Ok(ExitCode::SUCCESS)
}
