//! What the RabbitMQ benches share: a `binary-levels` strategy and a
//! destination under names unique to the run, a scheduler ready to send to
//! it, and cleanup of everything declared; the service running in-process,
//! and lateness measured at a destination.

// Each bench uses part of this.
#![allow(dead_code)]

/// The allocator the `hourglass` binary uses (src/main.rs), for hourglass and the raw baselines alike.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::Path;
use std::time::Duration;

use hourglass::broker;
use hourglass::command::{AmqpCommand, Command};
use hourglass::config::Config;
use hourglass::config::broker::amqp_url;
use hourglass::executor::Broker;
use hourglass::scheduler::Scheduler;
use hourglass::scheduler::strategies::Strategies;
use lapin::options::{ExchangeDeleteOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;

pub struct BenchBroker {
    /// Kept open for the channel's sake.
    _connection: lapin::Connection,
    config: Config,
    channel: lapin::Channel,
    pub destination: String,
}

impl BenchBroker {
    /// Declares the destination; the scheduler (strategy `main`) has prepared it.
    pub async fn start() -> (BenchBroker, Scheduler<Broker>) {
        let url = amqp_url(None, None);
        let prefix = format!("bench-{}", run_id());
        // `BENCH_PUBLISH_CHANNELS=N` sweeps the channel count; unset, the default applies.
        let channels = std::env::var("BENCH_PUBLISH_CHANNELS").map(|n| format!("publish_channels = {n}\n")).unwrap_or_default();
        let text = format!("[broker]\nkind = \"rabbitmq\"\nurl = \"{url}\"\n{channels}[strategies.main]\nplanner = \"binary-levels\"\nprefix = \"{prefix}\"\n");
        let config = Config::parse(Path::new("bench.toml"), text).unwrap();
        let connection = lapin::Connection::connect(&url, lapin::ConnectionProperties::default()).await.expect("RabbitMQ");
        let channel = connection.create_channel().await.unwrap();
        let destination = format!("{prefix}.destination");
        channel.queue_declare(destination.as_str().into(), QueueDeclareOptions::default(), FieldTable::default()).await.unwrap();

        let strategies = Strategies::load(&config).unwrap();
        let broker = broker::connect(&config.broker).await.unwrap();
        let scheduler = Scheduler::new(&config, strategies, broker);
        scheduler.prepare_destination("main", &destination).await.unwrap();
        (BenchBroker { _connection: connection, config, channel, destination }, scheduler)
    }

    /// Deletes the strategy's topology and the destination.
    pub async fn cleanup(self) {
        delete_topology(&self.channel, &self.config).await;
        self.channel.queue_delete(self.destination.as_str().into(), QueueDeleteOptions::default()).await.ok();
    }
}

/// Deletes the queues and exchanges of every strategy's static topology,
/// their parking queues' orphans and their release queues (a serving host
/// declares both), the canary's queue, and the config's delayed exchanges
/// with their `deliver_to`.
pub async fn delete_topology(channel: &lapin::Channel, config: &Config) {
    let mut strategies = Strategies::load(config).unwrap();
    let names: Vec<String> = strategies.names().map(str::to_string).collect();
    // Only a running canary's queue: a disabled one keeps the default name, which is not the run's.
    let mut queues: Vec<String> = config.service.canary.enabled.then(|| config.service.canary.queue.clone()).into_iter().collect();
    let mut exchanges: Vec<String> = config.exchanges.iter().flat_map(|(name, e)| [name.clone(), e.deliver_to.clone()]).collect();
    for name in names {
        let topology = strategies.get_mut(&name).unwrap().topology().unwrap();
        let release = config.service.cancel.release_queue(&name);
        queues.extend(hourglass::command::parking_queues(&topology).iter().map(|q| hourglass::broker::rabbitmq::parked::orphan_queue(q)));
        queues.extend([format!("{release}.parked"), release]);
        for command in topology {
            match command {
                Command::Amqp(AmqpCommand::DeclareQueue { name, .. }) => queues.push(name),
                Command::Amqp(AmqpCommand::DeclareExchange { name, .. }) => exchanges.push(name),
                _ => {}
            }
        }
    }
    for queue in queues {
        drop(channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await);
    }
    for exchange in exchanges {
        drop(channel.exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default()).await);
    }
}

/// `hourglass::service` running in this process on a loopback port, as `serve` runs it.
pub struct Served {
    pub service: std::sync::Arc<hourglass::service::Service>,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Served {
    pub async fn start(config: Config) -> Served {
        init_logging();
        let service = hourglass::service::Service::start(config).await.expect("service starts");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(hourglass::service::run(listener, service.clone(), async move {
            stopped.await.ok();
        }));
        // Measured from a running host (its consumers attached), as a producer meets it in production.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !service.readiness().await.ready {
            assert!(std::time::Instant::now() < deadline, "the service was not ready within a minute: {:?}", service.readiness().await);
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        Served { service, stop, server }
    }

    pub async fn stop(self) {
        self.stop.send(()).ok();
        self.server.await.unwrap().expect("service stops");
    }
}

/// `BENCH_LOG=<filter>` (e.g. `hourglass=debug`) prints the host's log to
/// stderr, with timestamps, to see where a run that stalls stands.
pub fn init_logging() {
    if let Ok(filter) = std::env::var("BENCH_LOG") {
        let _ = tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::new(filter)).with_writer(std::io::stderr).try_init();
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// Consumes `queue`, whose message bodies are due times ([`now_ms`] as text),
/// until `count` arrived or none came for a minute: each one's lateness in ms,
/// negative when early.
pub fn collect_lateness(channel: lapin::Channel, queue: &str, count: usize) -> tokio::task::JoinHandle<Lateness> {
    use futures_util::StreamExt;
    let queue = queue.to_string();
    tokio::spawn(async move {
        let options = lapin::options::BasicConsumeOptions::default();
        let mut consumer = channel.basic_consume(queue.as_str().into(), "bench-lateness".into(), options, FieldTable::default()).await.unwrap();
        let mut lateness = Lateness { from_send: Vec::with_capacity(count), from_forward: Vec::with_capacity(count) };
        while lateness.from_send.len() < count {
            let Ok(Some(Ok(delivery))) = tokio::time::timeout(std::time::Duration::from_secs(60), consumer.next()).await else { break };
            let now = now_ms() as i64;
            let due: i64 = String::from_utf8_lossy(&delivery.data).parse().expect("the body is the due time");
            lateness.from_send.push(now - due);
            let forwarded_due = delivery.properties.headers().as_ref().and_then(|h| h.inner().get("hourglass-due-at")).and_then(|v| v.as_long_long_int());
            lateness.from_forward.extend(forwarded_due.map(|due| now - due));
            delivery.acker.ack(lapin::options::BasicAckOptions::default()).await.ok();
        }
        lateness.from_send.sort();
        lateness.from_forward.sort();
        lateness
    })
}

/// Arrival lateness in ms, sorted: from the producer's due time (the body),
/// and from the due time hourglass stamped when it forwarded the message
/// (`hourglass-due-at`), which leaves out the wait in the ingress queue.
pub struct Lateness {
    pub from_send: Vec<i64>,
    pub from_forward: Vec<i64>,
}

/// The `q` quantile of sorted values.
pub fn percentile(sorted: &[i64], q: f64) -> i64 {
    sorted[((sorted.len() as f64 * q) as usize).min(sorted.len() - 1)]
}

/// The `binary-levels` variants a bench runs, level type and routing, each
/// list in the order given: all of them, or those `BENCH_LEVELS` (classic or
/// quorum) and `BENCH_ROUTING` (topic or direct) pick.
pub fn level_variants(queue_types: [&'static str; 2]) -> Vec<(&'static str, &'static str)> {
    let only_levels = std::env::var("BENCH_LEVELS").ok();
    let only_routing = std::env::var("BENCH_ROUTING").ok();
    let queue_types = queue_types.into_iter().filter(|t| only_levels.as_deref().is_none_or(|o| o == *t));
    queue_types
        .flat_map(|queue_type| ["topic", "direct"].map(|routing| (queue_type, routing)))
        .filter(|(_, routing)| only_routing.as_deref().is_none_or(|o| o == *routing))
        .collect()
}

/// Eight hex digits that name one run's queues and exchanges.
pub fn run_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..8].to_string()
}

/// Declares a durable queue, a quorum queue if asked.
pub async fn declare_queue(channel: &lapin::Channel, name: &str, quorum: bool) {
    use lapin::types::{AMQPValue, LongString, ShortString};
    let mut arguments = FieldTable::default();
    if quorum {
        arguments.insert(ShortString::from("x-queue-type"), AMQPValue::LongString(LongString::from("quorum")));
    }
    channel.queue_declare(name.into(), QueueDeclareOptions { durable: true, ..Default::default() }, arguments).await.expect("declare");
}

/// Publishes one persistent message to the ingress queue `queue`, for
/// `destination` after `delay_ms`, as any producer would; the confirm is the caller's to await.
pub async fn publish_to_ingress(channel: &lapin::Channel, queue: &str, destination: &str, delay_ms: u64, body: &[u8]) -> lapin::PublisherConfirm {
    publish_to_ingress_through(channel, queue, destination, None, delay_ms, body).await
}

/// [`publish_to_ingress`], through `strategy` (`hourglass-strategy`) when one is named.
pub async fn publish_to_ingress_through(
    channel: &lapin::Channel,
    queue: &str,
    destination: &str,
    strategy: Option<&str>,
    delay_ms: u64,
    body: &[u8],
) -> lapin::PublisherConfirm {
    use lapin::types::{AMQPValue, LongString, ShortString};
    let mut headers = FieldTable::default();
    if let Some(strategy) = strategy {
        headers.insert(ShortString::from("hourglass-strategy"), AMQPValue::LongString(LongString::from(strategy)));
    }
    headers.insert(ShortString::from("hourglass-destination"), AMQPValue::LongString(LongString::from(destination)));
    headers.insert(ShortString::from("hourglass-delay"), AMQPValue::LongString(LongString::from(format!("{delay_ms}ms"))));
    let properties = lapin::BasicProperties::default().with_delivery_mode(2).with_headers(headers);
    channel.basic_publish("".into(), queue.into(), lapin::options::BasicPublishOptions::default(), body, properties).await.expect("publish")
}

/// A config with `binary-levels` as strategy `main` under `prefix` (plus
/// `strategy` lines, and its release queue under `prefix` too) and the AMQP
/// ingress on `ingress` (plus `broker` lines).
/// The benches declare and preload the ingress queue before the host starts,
/// classic like the queues their raw baselines read, so the host keeps it
/// classic (`service.queue_type`).
pub fn ingress_config_text(url: &str, prefix: &str, ingress: &str, strategy: &str, broker: &str) -> String {
    format!(
        "[broker]\nkind = \"rabbitmq\"\nurl = \"{url}\"\n{broker}\n[strategies.main]\nplanner = \"binary-levels\"\nprefix = \"{prefix}\"\n{strategy}\n\
         [service]\nqueue_type = \"classic\"\n\
         [service.canary]\nenabled = false\n\
         [service.cancel]\nrelease_prefix = \"{prefix}.release\"\n\
         [service.ingress]\nqueue = \"{ingress}\"\ninvalid_queue = \"{ingress}.invalid\"\n"
    )
}

/// CPU time (user + system) this process and the broker's processes (every
/// `beam.smp` on the machine) have used so far: what a phase cost each side.
#[derive(Clone, Copy, Debug)]
pub struct CpuClock {
    pub own: Duration,
    pub broker: Duration,
    /// Context switches of this process's threads, voluntary and not (`getrusage`).
    pub own_switches: u64,
}

impl CpuClock {
    pub fn now() -> CpuClock {
        let broker = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter(|entry| std::fs::read_to_string(entry.path().join("comm")).is_ok_and(|comm| comm.trim() == "beam.smp"))
            .map(|entry| cpu_of(&entry.path().join("stat")))
            .sum();
        CpuClock { own: cpu_of(Path::new("/proc/self/stat")), broker, own_switches: context_switches() }
    }

    /// This process's context switches per message since `earlier`: each is a
    /// thread going to sleep or being preempted, so it counts the hand-offs
    /// between threads a message costs.
    pub fn switches_per_message_since(&self, earlier: &CpuClock, messages: usize) -> f64 {
        self.own_switches.saturating_sub(earlier.own_switches) as f64 / messages.max(1) as f64
    }

    /// Microseconds of CPU per message, (own, broker), since `earlier`.
    pub fn per_message_since(&self, earlier: &CpuClock, messages: usize) -> (f64, f64) {
        let per = |now: Duration, then: Duration| now.saturating_sub(then).as_secs_f64() * 1e6 / messages.max(1) as f64;
        (per(self.own, earlier.own), per(self.broker, earlier.broker))
    }
}

/// Voluntary and involuntary context switches of every thread of this process, ended ones included.
fn context_switches() -> u64 {
    // SAFETY: getrusage writes only the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0;
    }
    (usage.ru_nvcsw + usage.ru_nivcsw) as u64
}

/// utime + stime of a `/proc/<pid>/stat`, zero if it is gone.
fn cpu_of(stat: &Path) -> Duration {
    let Ok(text) = std::fs::read_to_string(stat) else { return Duration::ZERO };
    // The command name, in parentheses, may hold spaces: count fields after it.
    let Some(after_name) = text.rsplit_once(')').map(|(_, rest)| rest) else { return Duration::ZERO };
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Fields 14 and 15 of stat(5); the first after the name is field 3.
    let ticks: u64 = fields.get(11..13).into_iter().flatten().filter_map(|f| f.parse::<u64>().ok()).sum();
    // SAFETY: sysconf only reads a constant of the system.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_nanos(ticks * 1_000_000_000 / per_second)
}
