//! Command-line parsing and the commands themselves. Errors become one line on
//! stderr and a non-zero exit.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use hourglass::broker::{Broker, amqp_url};
use hourglass::config::{BrokerConfig, LogFormat};
use hourglass::service::{self, Service};
use hourglass::broker::rabbitmq::verify;
use hourglass::command::{Command, FieldValue};
use hourglass::planner::BrokerFamily;
use hourglass::broker::sqs::pump::Pump;
use hourglass::scheduler::{ScheduleRequest, Scheduler};
use hourglass::sim::{Hop, HopStep};
use hourglass::config::Config;
use hourglass::planner::{LoadedPlanner, PlanRequest, PlannerLimits, PlannerRuntime, PlannerSource};
use hourglass::sim::simulation::Simulation;
use hourglass::scheduler::strategies::Strategies;
use hourglass::render;
use hourglass::sim::conformance;
use hourglass_planner_sdk::parse_duration_ms;

#[derive(Parser)]
#[command(name = "hourglass", version, about = "Delayed message delivery for RabbitMQ and SQS, planned by WebAssembly strategies")]
struct Cli {
    /// The configuration file.
    #[arg(long, global = true, default_value = "delay.toml", env = "HOURGLASS_CONFIG")]
    config: PathBuf,
    /// The strategy to use (default: the destination's, else `default_strategy`).
    #[arg(long, global = true)]
    strategy: Option<String>,
    #[command(subcommand)]
    command: Commands,
}

#[derive(Clone, Copy, ValueEnum)]
enum TextOrJson {
    Table,
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
enum TopologyFormat {
    Table,
    Json,
    Mermaid,
    Dot,
}

fn duration_arg(text: &str) -> Result<u64, String> {
    parse_duration_ms(text)
}

fn header_arg(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("header {text:?} is not K=V")),
    }
}

fn tokio_runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().worker_threads(2).build()?)
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

#[derive(Subcommand)]
enum Commands {
    /// Show the broker commands one delayed message gets, and its route.
    Plan {
        #[arg(long = "to", value_name = "DEST")]
        destination: String,
        /// `10s`, `1500ms`, `2h 5m` or milliseconds.
        #[arg(long, value_parser = duration_arg, value_name = "DUR")]
        delay: u64,
        #[arg(long, value_enum, default_value = "table")]
        format: TextOrJson,
        /// SQS price per million requests, for the cost of SQS strategies' plans.
        #[arg(long, default_value_t = 0.50)]
        price_per_million: f64,
    },
    /// Show the strategy's static topology (and a destination's setup with --to);
    /// with --apply, declare it on the configured broker.
    Topology {
        #[arg(long = "to", value_name = "DEST")]
        destinations: Vec<String>,
        #[arg(long, value_enum, default_value = "table")]
        format: TopologyFormat,
        /// Declare the topology (and each --to destination's setup) on the broker. Idempotent.
        #[arg(long)]
        apply: bool,
    },
    /// Publish one delayed message and wait for the broker's confirm.
    Schedule {
        #[arg(long = "to", value_name = "DEST")]
        destination: String,
        #[arg(long, value_parser = duration_arg, value_name = "DUR")]
        delay: u64,
        /// The body as text (else --body-file, else standard input).
        #[arg(long, conflicts_with = "body_file")]
        body: Option<String>,
        #[arg(long, value_name = "PATH")]
        body_file: Option<PathBuf>,
        /// An application header, repeatable.
        #[arg(long = "header", value_name = "K=V", value_parser = header_arg)]
        headers: Vec<(String, String)>,
        #[arg(long)]
        content_type: Option<String>,
        #[arg(long, value_enum, default_value = "table")]
        format: TextOrJson,
    },
    /// Run messages through the strategy on the in-memory broker and show their routes.
    Simulate {
        #[arg(long = "to", value_name = "DEST")]
        destination: String,
        #[arg(long = "delay", value_parser = duration_arg, value_name = "DUR", required = true)]
        delays: Vec<u64>,
        #[arg(long, value_enum, default_value = "table")]
        format: TextOrJson,
    },
    /// Check that a planner component delivers what it promises.
    CheckPlanner {
        /// The planner component (.wasm), or a built-in planner's name.
        planner: String,
        /// A TOML file with the planner's table.
        #[arg(long, value_name = "FILE")]
        planner_config: Option<PathBuf>,
        #[arg(long = "to", value_name = "DEST", default_value = "destination")]
        destination: String,
        /// Random delays checked beside the edge cases.
        #[arg(long, default_value_t = 200)]
        samples: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Longest delay checked (pump-driven planners simulate every cycle).
        #[arg(long, value_parser = duration_arg, value_name = "DUR", default_value = "7d")]
        horizon: u64,
        #[arg(long, value_enum, default_value = "table")]
        format: TextOrJson,
    },
    /// Compare the broker with the strategy's topology (and each --to destination's setup).
    Verify {
        #[arg(long = "to", value_name = "DEST")]
        destinations: Vec<String>,
        #[arg(long, value_enum, default_value = "table")]
        format: TextOrJson,
    },
    /// Run the cycle pumps of a pump-driven strategy (sqs-cycles) until interrupted.
    Pump {
        /// Destinations to pump for (default: the configured destinations using the strategy).
        #[arg(long = "to", value_name = "DEST")]
        destinations: Vec<String>,
        /// Long-poll wait of each receive, 1 to 20 seconds.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(i32).range(1..=20))]
        wait_seconds: i32,
    },
    /// Run the HTTP API: POST /v1/messages, GET /v1/plan, /healthz, /readyz, /metrics.
    Serve {
        /// Address to listen on (default: service.listen, else 127.0.0.1:8080).
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
    },
    /// Delayed redelivery of rejected messages, as a running `serve` reports it.
    Redelivery {
        #[command(subcommand)]
        action: RedeliveryAction,
    },
    /// List the configured strategies and their planners.
    Strategies {
        #[arg(long, value_enum, default_value = "table")]
        format: TextOrJson,
    },
}

#[derive(Subcommand)]
enum RedeliveryAction {
    /// Per queue: messages waiting in delay queues, redelivered, and given up (since the service started).
    Status {
        /// The service's base URL (default: http:// + service.listen from the config).
        #[arg(long, value_name = "URL")]
        url: Option<String>,
        #[arg(long, value_enum, default_value = "table")]
        format: TextOrJson,
    },
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Commands::Serve { .. }) {
        init_logging(LogFormat::Human, "warn,lapin=off");
    }
    match run(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Log lines on stderr; `RUST_LOG` overrides `default_filter`, and
/// `HOURGLASS_LOG_FORMAT` (`human` or `json`) overrides `format`.
fn init_logging(format: LogFormat, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default_filter.into());
    let format = match std::env::var("HOURGLASS_LOG_FORMAT").as_deref() {
        Ok("json") => LogFormat::Json,
        Ok("human") => LogFormat::Human,
        _ => format,
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Human => builder.init(),
    }
}

fn load(cli: &Cli) -> Result<(Config, Strategies)> {
    let config = Config::load(&cli.config)?;
    let strategies = Strategies::load(&config)?;
    Ok((config, strategies))
}

fn pick<'s>(cli: &Cli, config: &Config, strategies: &'s mut Strategies, destination: Option<&str>) -> Result<(String, &'s mut LoadedPlanner)> {
    let name = match (&cli.strategy, destination) {
        (Some(name), _) => name.clone(),
        (None, Some(dest)) => config.strategy_for(dest).to_string(),
        (None, None) => config.default_strategy.clone(),
    };
    let planner = strategies.get_mut(&name).map_err(anyhow::Error::msg)?;
    Ok((name, planner))
}

/// `GET /v1/redelivery` from a running service.
fn redelivery_status(base: &str, token: Option<&str>) -> Result<Vec<hourglass::service::redelivery::QueueStatus>> {
    #[derive(serde::Deserialize)]
    struct Answer {
        queues: Vec<hourglass::service::redelivery::QueueStatus>,
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

fn print_json(value: &impl serde::Serialize) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

fn run(cli: Cli) -> Result<ExitCode> {
    match &cli.command {
        Commands::Plan { destination, delay, format, price_per_million } => {
            let (config, mut strategies) = load(&cli)?;
            let (name, planner) = pick(&cli, &config, &mut strategies, Some(destination))?;
            let request = PlanRequest {
                destination: destination.clone(),
                delay_ms: *delay,
                message_id: "plan-preview".into(),
                routing_key: None,
            };
            let plan = planner.plan(&request)?;
            let info = planner.info().clone();
            let simulated = Simulation::new(planner, destination)?.run(&[*delay])?.remove(0);
            let cost = (info.family == BrokerFamily::Sqs).then(|| sqs_cost(&simulated.hops, *price_per_million));
            match format {
                TextOrJson::Json => print_json(&serde_json::json!({
                    "strategy": name,
                    "planner": info.name,
                    "destination": destination,
                    "delay_ms": delay,
                    "delivers_after_ms": plan.delivers_after_ms,
                    "commands": plan.commands,
                    "sqs": cost,
                }))?,
                TextOrJson::Table => {
                    println!(
                        "strategy {name} (planner {} {}): to {destination} after {} (asked {})\n",
                        info.name,
                        info.version,
                        render::duration(plan.delivers_after_ms),
                        render::duration(*delay)
                    );
                    print!("{}", render::commands(&plan.commands));
                    println!("\nroute on the in-memory broker:");
                    print!("{}", render::route(&simulated.hops));
                    match (simulated.arrival_ms, simulated.problem) {
                        (Some(at), _) => println!("delivered to {destination} after {}", render::duration(at)),
                        (None, problem) => println!("NOT delivered: {}", problem.unwrap_or_default()),
                    }
                    if let Some(cost) = cost {
                        println!(
                            "SQS requests: {} (1 send + {} pump visits x 3: receive, send, delete); ${:.7} at ${} per million",
                            cost.requests, cost.pump_visits, cost.cost_usd, cost.price_per_million_usd
                        );
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Commands::Topology { destinations, format: _, apply: true } => {
            let (config, strategies) = load(&cli)?;
            let strategy = cli.strategy.clone().unwrap_or_else(|| config.default_strategy.clone());
            tokio_runtime()?.block_on(async {
                let broker = Broker::connect(&config.broker).await?;
                let place = broker.describe();
                let scheduler = Scheduler::new(&config, strategies, broker);
                scheduler.apply_topology(&strategy).await?;
                for destination in destinations {
                    scheduler.prepare_destination(&strategy, destination).await?;
                }
                println!("applied the topology of strategy {strategy} on {place}");
                Ok::<_, anyhow::Error>(())
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Commands::Schedule { destination, delay, body, body_file, headers, content_type, format } => {
            let (config, strategies) = load(&cli)?;
            let body = read_body(body, body_file)?;
            let properties = hourglass::message::Properties { content_type: content_type.clone(), ..Default::default() };
            let request = ScheduleRequest {
                destination: destination.clone(),
                delay_ms: *delay,
                body,
                headers: headers.iter().map(|(k, v)| (k.clone(), FieldValue::Text(v.clone()))).collect(),
                properties,
                strategy: cli.strategy.clone(),
                ..Default::default()
            };
            let (scheduled, place) = tokio_runtime()?.block_on(async {
                let broker = Broker::connect(&config.broker).await?;
                let place = broker.describe();
                let scheduler = Scheduler::new(&config, strategies, broker);
                Ok::<_, anyhow::Error>((scheduler.schedule(request).await?, place))
            })?;
            let due = humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + std::time::Duration::from_millis(scheduled.due_at_ms));
            match format {
                TextOrJson::Json => print_json(&serde_json::json!({
                    "id": scheduled.id,
                    "strategy": scheduled.strategy,
                    "destination": destination,
                    "due_at_ms": scheduled.due_at_ms,
                    "due_at": due.to_string(),
                    "delivers_after_ms": scheduled.delivers_after_ms,
                }))?,
                TextOrJson::Table => println!(
                    "scheduled {} to {destination} via strategy {} on {place}: due {due} (in {})",
                    scheduled.id,
                    scheduled.strategy,
                    render::duration(*delay)
                ),
            }
            Ok(ExitCode::SUCCESS)
        }
        Commands::Topology { destinations, format, apply: false } => {
            let (config, mut strategies) = load(&cli)?;
            let (_, planner) = pick(&cli, &config, &mut strategies, None)?;
            let mut commands: Vec<Command> = planner.topology()?;
            for destination in destinations {
                commands.extend(planner.destination_setup(destination)?);
            }
            match format {
                TopologyFormat::Table => print!("{}", render::commands(&commands)),
                TopologyFormat::Json => print_json(&commands)?,
                TopologyFormat::Mermaid => print!("{}", render::mermaid(&commands)),
                TopologyFormat::Dot => print!("{}", render::dot(&commands)),
            }
            Ok(ExitCode::SUCCESS)
        }
        Commands::Simulate { destination, delays, format } => {
            let (config, mut strategies) = load(&cli)?;
            let (_, planner) = pick(&cli, &config, &mut strategies, Some(destination))?;
            let results = Simulation::new(planner, destination)?.run(delays)?;
            match format {
                TextOrJson::Json => print_json(&results)?,
                TextOrJson::Table => print!("{}", render::simulated(&results)),
            }
            Ok(if results.iter().all(|r| r.arrival_ms.is_some()) { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Commands::CheckPlanner { planner, planner_config, destination, samples, seed, horizon, format } => {
            let table = planner_table(planner_config.as_deref())?;
            let runtime = PlannerRuntime::new(PlannerLimits::default(), None)?;
            let mut loaded = runtime.load(&PlannerSource::parse(planner, Path::new(".")), table.to_string())?;
            let delays = conformance::delays_to_check(loaded.delay_range(), *seed, *samples, *horizon);
            let report = conformance::check(&mut loaded, destination, &delays)?;
            match format {
                TextOrJson::Json => print_json(&report)?,
                TextOrJson::Table => {
                    if report.passed() {
                        println!("planner {}: all {} delays delivered as promised", report.planner, report.checked);
                    } else {
                        println!("planner {}: {} of {} delays broke their promise", report.planner, report.failures.len(), report.checked);
                        let rows: Vec<Vec<String>> =
                            report.failures.iter().map(|f| vec![format!("{}ms", f.delay_ms), f.expected.clone(), f.got.clone()]).collect();
                        print!("{}", render::table(&["DELAY", "EXPECTED", "GOT"], &rows));
                    }
                }
            }
            Ok(if report.passed() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Commands::Verify { destinations, format } => {
            let (config, mut strategies) = load(&cli)?;
            let BrokerConfig::Rabbitmq { url, url_env, management_url } = &config.broker else {
                bail!("{}: verify needs broker.kind = \"rabbitmq\"", config.path.display());
            };
            let (name, planner) = pick(&cli, &config, &mut strategies, None)?;
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
                        let rows: Vec<Vec<String>> = verify::grouped(&report)
                            .into_iter()
                            .flat_map(|(object, problems)| problems.into_iter().map(move |p| vec![object.clone(), p]))
                            .collect();
                        print!("{}", render::table(&["OBJECT", "DRIFT"], &rows));
                    }
                }
            }
            Ok(if report.drifts.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Commands::Pump { destinations, wait_seconds } => {
            let (config, strategies) = load(&cli)?;
            let strategy = cli.strategy.clone().unwrap_or_else(|| config.default_strategy.clone());
            let destinations: Vec<String> = if destinations.is_empty() {
                config.destinations.keys().filter(|d| config.strategy_for(d) == strategy).cloned().collect()
            } else {
                destinations.clone()
            };
            if destinations.is_empty() {
                bail!("no destinations to pump for: give --to DEST or list them under [destinations] with strategy = {strategy:?}");
            }
            tokio_runtime()?.block_on(run_pumps(&config, strategies, &strategy, &destinations, *wait_seconds))?;
            Ok(ExitCode::SUCCESS)
        }
        Commands::Redelivery { action: RedeliveryAction::Status { url, format } } => {
            let config = Config::load(&cli.config)?;
            let base = url.clone().unwrap_or_else(|| format!("http://{}", config.service.listen.as_deref().unwrap_or("127.0.0.1:8080")));
            let status = redelivery_status(&base, config.service.token().as_deref())?;
            match format {
                TextOrJson::Json => print_json(&status)?,
                TextOrJson::Table => print!("{}", redelivery_table(&status)),
            }
            Ok(ExitCode::SUCCESS)
        }
        Commands::Serve { listen } => {
            let config = Config::load(&cli.config)?;
            init_logging(config.service.log_format.unwrap_or_default(), "info,lapin=off");
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
        Commands::Strategies { format } => {
            let (config, mut strategies) = load(&cli)?;
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
    }
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

#[derive(serde::Serialize)]
struct SqsCost {
    pump_visits: u64,
    requests: u64,
    price_per_million_usd: f64,
    cost_usd: f64,
}

/// The SQS bill of one message: its first send, then a receive, a send and a
/// delete each time it surfaces on a pumped queue.
fn sqs_cost(hops: &[Hop], price_per_million: f64) -> SqsCost {
    let pump_visits = hops.iter().filter(|h| matches!(h.step, HopStep::Pump { .. })).count() as u64;
    let requests = 1 + 3 * pump_visits;
    SqsCost { pump_visits, requests, price_per_million_usd: price_per_million, cost_usd: requests as f64 * price_per_million / 1e6 }
}

async fn run_pumps(config: &Config, strategies: Strategies, strategy: &str, destinations: &[String], wait_seconds: i32) -> Result<()> {
    let broker = Broker::connect(&config.broker).await?;
    let Broker::Sqs(executor) = &broker else {
        bail!("{}: pump needs broker.kind = \"sqs\"", config.path.display());
    };
    let executor = executor.clone();
    let scheduler = Scheduler::new(config, strategies, broker);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    let mut counters = Vec::new();
    for destination in destinations {
        scheduler.prepare_destination(strategy, destination).await?;
        let planner = Strategies::load_one(config, strategy)?;
        let pumped: Vec<String> = planner
            .destination_setup(destination)?
            .into_iter()
            .filter_map(|c| match c {
                Command::SqsEnsureQueue { name, pumped: true, .. } => Some(name),
                _ => None,
            })
            .collect();
        for queue in pumped {
            let pump = Pump::new(executor.clone(), Box::new(Strategies::load_one(config, strategy)?), &queue, wait_seconds).await?;
            eprintln!("pumping {queue}");
            counters.push(pump.counters.clone());
            tasks.push(tokio::spawn(pump.run(stopped.clone())));
        }
    }
    if tasks.is_empty() {
        bail!("strategy {strategy} has no pumped queues: it is not pump-driven");
    }
    shutdown_signal().await;
    eprintln!("stopping: finishing the batches in hand");
    stop.send(true).ok();
    for task in tasks {
        task.await??;
    }
    let handed_over: u64 = counters.iter().map(|c| c.snapshot().handed_over).sum();
    let visits: u64 = counters.iter().map(|c| { let s = c.snapshot(); s.recycled + s.handed_over }).sum();
    let requests = executor.requests.snapshot();
    println!("{}", serde_json::to_string_pretty(&serde_json::json!({
        "pumps": counters.iter().map(|c| c.snapshot()).collect::<Vec<_>>(),
        "requests": requests,
        "requests_per_delivered_message": requests.message_requests() as f64 / handed_over.max(1) as f64,
        "requests_per_cycle": requests.message_requests() as f64 / visits.max(1) as f64,
    }))?);
    Ok(())
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

async fn shutdown_signal() {
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

/// `hourglass redelivery status`: one row per consumer queue.
pub fn redelivery_table(queues: &[hourglass::service::redelivery::QueueStatus]) -> String {
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
