//! `hourglass verify`: compare the broker with the strategy's topology (and each --to destination's setup).

use std::process::ExitCode;

use anyhow::{Result, bail};
use hourglass::broker::amqp_url;
use hourglass::broker::rabbitmq::verify;
use hourglass::config::BrokerConfig;
use hourglass::render;

use super::{Cli, TextOrJson, load, pick, print_json, tokio_runtime};

#[derive(clap::Args)]
pub struct Args {
    #[arg(long = "to", value_name = "DEST")]
    pub destinations: Vec<String>,
    #[arg(long, value_enum, default_value = "table")]
    pub format: TextOrJson,
}

pub fn run(cli: &Cli, args: &Args) -> Result<ExitCode> {
    let Args { destinations, format } = args;
    let (config, mut strategies) = load(cli)?;
    let BrokerConfig::Rabbitmq { url, url_env, management_url, .. } = &config.broker else {
        bail!("{}: verify needs broker.kind = \"rabbitmq\"", config.path.display());
    };
    let (name, planner) = pick(cli, &config, &mut strategies, None)?;
    let mut commands = planner.topology()?;
    for destination in destinations {
        commands.extend(planner.destination_setup(destination)?);
    }
    let amqp = amqp_url(url.as_deref(), url_env.as_deref());
    let report = tokio_runtime()?.block_on(verify::verify(&amqp, management_url.as_deref(), &commands))?;
    match format {
        TextOrJson::Json => print_json(&report)?,
        TextOrJson::Table => {
            println!("strategy {name}: checked {} objects and bindings via {}", report.checked, report.method);
            if report.drifts.is_empty() {
                println!("no drift");
            } else {
                let rows: Vec<Vec<String>> =
                    verify::grouped(&report).into_iter().flat_map(|(object, problems)| problems.into_iter().map(move |p| vec![object.clone(), p])).collect();
                print!("{}", render::table(&["OBJECT", "DRIFT"], &rows));
            }
        }
    }
    Ok(if report.drifts.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
