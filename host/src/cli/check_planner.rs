//! `hourglass check-planner`: check that a planner component delivers what it promises.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use hourglass::planner::{PlannerLimits, PlannerRuntime, PlannerSource};
use hourglass::render;
use hourglass::sim::conformance;

use super::{TextOrJson, duration_arg, print_json};

#[derive(clap::Args)]
pub struct Args {
    /// The planner component (.wasm), or a built-in planner's name.
    pub planner: String,
    /// A TOML file with the planner's table.
    #[arg(long, value_name = "FILE")]
    pub planner_config: Option<PathBuf>,
    #[arg(long = "to", value_name = "DEST", default_value = "destination")]
    pub destination: String,
    /// Random delays checked beside the edge cases.
    #[arg(long, default_value_t = 200)]
    pub samples: usize,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Longest delay checked (pump-driven planners simulate every cycle).
    #[arg(long, value_parser = duration_arg, value_name = "DUR", default_value = "7d")]
    pub horizon: u64,
    /// The sandbox's memory for the planner (default 16; a Python planner needs more).
    #[arg(long, value_name = "MIB")]
    pub memory_limit_mib: Option<u32>,
    /// Budget to instantiate and configure it (default 1s).
    #[arg(long, value_parser = duration_arg, value_name = "DUR")]
    pub start_timeout: Option<u64>,
    /// Budget of one call (default 100ms).
    #[arg(long, value_parser = duration_arg, value_name = "DUR")]
    pub call_timeout: Option<u64>,
    #[arg(long, value_enum, default_value = "table")]
    pub format: TextOrJson,
}

pub fn run(args: &Args) -> Result<ExitCode> {
    let Args { planner, planner_config, destination, samples, seed, horizon, format, .. } = args;
    let table = planner_table(planner_config.as_deref())?;
    let defaults = PlannerLimits::default();
    let limits = PlannerLimits {
        memory_bytes: args.memory_limit_mib.map_or(defaults.memory_bytes, |mib| (mib as usize) << 20),
        start_timeout: args.start_timeout.map_or(defaults.start_timeout, std::time::Duration::from_millis),
        call_timeout: args.call_timeout.map_or(defaults.call_timeout, std::time::Duration::from_millis),
    };
    // The default cache: a large component (a Python planner) compiles once, not on every check.
    let runtime = PlannerRuntime::new(limits, hourglass::config::default_cache_dir())?;
    let mut loaded = runtime.load(&PlannerSource::parse(planner, Path::new(".")), table.to_string())?;
    let delays = conformance::delays_to_check(loaded.delay_range(), *seed, *samples, *horizon);
    let report = conformance::check(&mut loaded, destination, &delays)?;
    match format {
        TextOrJson::Json => print_json(&report)?,
        TextOrJson::Table => {
            let properties: Vec<&str> = report.properties.iter().map(|p| p.name()).collect();
            if report.passed() {
                println!("planner {}: all {} delays delivered as promised ({})", report.planner, report.checked, properties.join(", "));
            } else {
                println!("planner {}: {} broken promises over {} delays ({})", report.planner, report.failures.len(), report.checked, properties.join(", "));
                let rows: Vec<Vec<String>> =
                    report.failures.iter().map(|f| vec![f.property.name().into(), format!("{}ms", f.delay_ms), f.expected.clone(), f.got.clone()]).collect();
                print!("{}", render::table(&["PROPERTY", "DELAY", "EXPECTED", "GOT"], &rows));
            }
        }
    }
    Ok(if report.passed() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// The planner's table for `check-planner`, from a TOML file, as JSON.
fn planner_table(path: Option<&Path>) -> Result<serde_json::Value> {
    let Some(path) = path else { return Ok(serde_json::json!({})) };
    let text = std::fs::read_to_string(path).with_context(|| format!("{}: cannot read", path.display()))?;
    let table: toml::Table = toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {}", path.display(), e.message()))?;
    if table.contains_key("planner") {
        bail!("{}: give only the planner's own keys (no `planner`)", path.display());
    }
    Ok(serde_json::to_value(table)?)
}
