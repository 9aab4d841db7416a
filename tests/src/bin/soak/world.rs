//! What the soak runs and hurts: a private RabbitMQ node, two hosts on one
//! config (host 0 reaches the broker through a proxy that can go dark or drop
//! its connections, host 1 directly), a third host on the local SQS server,
//! the canaries' destinations, and how each
//! kind of fault is done to them. Faults on different parts run at once;
//! two on the same part (the broker, one host, the proxy, a queue) take
//! turns.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hourglass::clock::unix_now_ms;
use hourglass_e2e::blackhole::Blackhole;
use hourglass_e2e::chaos::canary;
use hourglass_e2e::chaos::host::Host;
use hourglass_e2e::chaos::setup::Setup;
use hourglass_e2e::private_node::PrivateNode;
use hourglass_e2e::unique;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, ExchangeKind};
use serde_json::json;
use tokio::sync::Mutex as Turn;

use crate::cancels;
use crate::fates::SetAside;
use crate::nats::NatsSide;
use crate::schedule::{Kind, Planned};
use crate::sqs::SqsSide;

/// How long a fault keeps trying a broker operation (the broker may be down meanwhile).
const PATIENCE: Duration = Duration::from_secs(30);
/// Bad HTTP requests and bad ingress messages in one flood.
const FLOOD_REQUESTS: usize = 60;
const FLOOD_MESSAGES: usize = 20;

/// A fault as it happened.
pub struct Injected {
    pub planned: Planned,
    pub started_ms: u64,
    pub ended_ms: u64,
    /// What it found on the way (a reload's answer, a queue that would not empty).
    pub note: Option<String>,
}

pub struct World {
    pub node: Arc<PrivateNode>,
    /// Between host 0 and the broker.
    pub proxy: Blackhole,
    pub setup: Setup,
    /// The cancellable strategy's prefix (its parking queue is `<prefix>.parked`).
    pub cancellable_prefix: String,
    /// The SQS host's config and destination.
    pub sqs: SqsSide,
    /// The NATS host's config and destination.
    pub nats: NatsSide,
    /// A destination the soak deletes and declares again; its own canaries go there.
    pub victim: String,
    configs: Vec<PathBuf>,
    hosts: Vec<Turn<Option<Host>>>,
    /// Each host's HTTP base, swapped when it is started again.
    pub bases: Vec<Arc<Mutex<String>>>,
    broker: Turn<()>,
    proxy_turn: Turn<()>,
    victim_turn: Turn<()>,
    exchange_turn: Turn<()>,
    /// Bad ingress messages the broker confirmed: each must be set aside with a reason.
    pub garbage: Mutex<Vec<String>>,
    /// Wrong answers to bad input, and faults that could not be done.
    pub problems: Mutex<Vec<String>>,
    /// What the checker found set aside.
    pub set_aside: Mutex<SetAside>,
}

impl World {
    pub async fn start() -> anyhow::Result<World> {
        let node = Arc::new(tokio::task::spawn_blocking(PrivateNode::start).await??);
        let proxy = Blackhole::start(&node.url()).await;
        let cancellable_prefix = unique("soak-cancellable");
        let more = format!("[strategies.{}]\nplanner = \"binary-levels\"\nprefix = \"{cancellable_prefix}\"\ncancellable = true\n", cancels::STRATEGY);
        let setup = Setup::new("soak", &node.url(), &more).await?;
        let victim = unique("soak-victim");
        declare_victim(&node.url(), &victim).await?;
        // Host 0 through the proxy, host 1 straight to the node: the same config otherwise.
        let through_proxy = setup.config.with_file_name("hourglass-proxied.toml");
        std::fs::write(&through_proxy, std::fs::read_to_string(&setup.config)?.replace(&node.url(), &proxy.url))?;
        // Host 2 on the local SQS server.
        let sqs = SqsSide::prepare(&setup.config).await?;
        // Host 3 on the NATS server.
        let nats = NatsSide::prepare(&setup.config).await?;
        let configs = vec![through_proxy, setup.config.clone(), sqs.config.clone(), nats.config.clone()];
        let mut hosts = Vec::new();
        let mut bases = Vec::new();
        for config in &configs {
            let host = start_host(config.clone()).await?;
            bases.push(Arc::new(Mutex::new(host.base.clone())));
            hosts.push(Turn::new(Some(host)));
        }
        Ok(World {
            node,
            proxy,
            setup,
            cancellable_prefix,
            victim,
            sqs,
            nats,
            configs,
            hosts,
            bases,
            broker: Turn::new(()),
            proxy_turn: Turn::new(()),
            victim_turn: Turn::new(()),
            exchange_turn: Turn::new(()),
            garbage: Mutex::new(Vec::new()),
            problems: Mutex::new(Vec::new()),
            set_aside: Mutex::new(SetAside::default()),
        })
    }

    pub fn hosts(&self) -> usize {
        self.configs.len()
    }

    fn problem(&self, problem: String) {
        eprintln!("   problem: {problem}");
        self.problems.lock().unwrap().push(problem);
    }

    /// Does one fault, waiting its turn on the part it hurts; returns once that part is whole again.
    pub async fn inject(&self, planned: Planned) -> Injected {
        let started_ms = unix_now_ms();
        let note = match planned.kind {
            Kind::BrokerKill9 | Kind::BrokerStopStart => self.broker_down(planned).await,
            Kind::HostKill9 => self.host_kill9(planned).await,
            Kind::ConnectionBlackhole => {
                let _turn = self.proxy_turn.lock().await;
                self.proxy.cut();
                tokio::time::sleep(planned.hold).await;
                self.proxy.restore();
                None
            }
            Kind::ConnectionReset => {
                let _turn = self.proxy_turn.lock().await;
                self.proxy.reset();
                None
            }
            Kind::BadInputFlood => self.flood(planned.host).await,
            Kind::DestinationDeleted => self.destination_deleted(planned.hold).await,
            Kind::ExchangeDeleted => self.exchange_deleted(planned.hold).await,
            Kind::ConfigReload => Some(self.reload(planned.host).await),
        };
        Injected { planned, started_ms, ended_ms: unix_now_ms(), note }
    }

    async fn broker_down(&self, planned: Planned) -> Option<String> {
        let _turn = self.broker.lock().await;
        let node = self.node.clone();
        let kill = planned.kind == Kind::BrokerKill9;
        let down = tokio::task::spawn_blocking(move || if kill { node.kill9() } else { node.stop() }).await.expect("join");
        if let Err(err) = down {
            self.problem(format!("{}: the broker did not go down: {err}", planned.kind.name()));
        }
        tokio::time::sleep(planned.hold).await;
        let node = self.node.clone();
        if let Err(err) = tokio::task::spawn_blocking(move || node.boot()).await.expect("join") {
            self.problem(format!("{}: the broker did not come back: {err}", planned.kind.name()));
        }
        None
    }

    async fn host_kill9(&self, planned: Planned) -> Option<String> {
        let mut host = self.hosts[planned.host].lock().await;
        if let Some(mut killed) = host.take() {
            killed.kill9();
        }
        tokio::time::sleep(planned.hold).await;
        match start_host(self.configs[planned.host].clone()).await {
            Ok(started) => {
                *self.bases[planned.host].lock().unwrap() = started.base.clone();
                *host = Some(started);
                None
            }
            Err(err) => {
                self.problem(format!("host {} did not start again: {err:#}", planned.host));
                None
            }
        }
    }

    /// Bad requests at one host and bad messages at the ingress: each request
    /// must get a 4xx (no answer is fine while that host is down), each
    /// confirmed message must end on the invalid queue with a reason.
    async fn flood(&self, host: usize) -> Option<String> {
        let base = self.bases[host].lock().unwrap().clone();
        let bad: [serde_json::Value; 6] = [
            json!({ "delay": 1000, "body": "no destination" }),
            json!({ "destination": self.setup.destination, "delay": -5 }),
            json!({ "destination": self.setup.destination, "delay": "soon" }),
            json!({ "destination": self.setup.destination, "delay": 1000, "strategy": "no-such-strategy" }),
            json!({ "destination": self.setup.destination, "exchange": self.setup.orders, "delay": 1000 }),
            json!({ "destination": "", "delay": 1000 }),
        ];
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(10))).build().into();
        let mut requests = Vec::new();
        for n in 0..FLOOD_REQUESTS {
            let (agent, url, body) = (agent.clone(), format!("{base}/v1/messages"), bad[n % bad.len()].clone());
            requests.push(tokio::task::spawn_blocking(move || agent.post(&url).send_json(&body).ok().map(|r| (r.status().as_u16(), body))));
        }
        let (mut answered, mut unanswered) = (0, 0);
        for request in requests {
            match request.await.expect("join") {
                Some((status, _)) if (400..500).contains(&status) => answered += 1,
                Some((status, body)) => self.problem(format!("bad request {body} answered {status}, not 4xx")),
                None => unanswered += 1,
            }
        }
        let confirmed = self.bad_messages().await;
        Some(format!("{answered} requests answered 4xx, {unanswered} unanswered, {confirmed} bad messages confirmed"))
    }

    /// Ingress messages with no destination, published with confirms; returns how many were confirmed.
    async fn bad_messages(&self) -> usize {
        let Ok(connection) = canary::connect(&self.setup.amqp_url).await else { return 0 };
        let mut confirmed = 0;
        if let Ok(channel) = connection.create_channel().await
            && channel.confirm_select(ConfirmSelectOptions::default()).await.is_ok()
        {
            for _ in 0..FLOOD_MESSAGES {
                let marker = unique("soak-garbage");
                let mut headers = FieldTable::default();
                headers.insert(ShortString::from("hourglass-delay"), AMQPValue::LongString(LongString::from("1s")));
                let properties = BasicProperties::default().with_delivery_mode(2).with_headers(headers);
                let options = BasicPublishOptions { mandatory: true, ..Default::default() };
                let Ok(confirm) = channel.basic_publish("".into(), self.setup.ingress.as_str().into(), options, marker.as_bytes(), properties).await else {
                    break;
                };
                if let Ok(Ok(confirmation)) = tokio::time::timeout(Duration::from_secs(10), confirm).await
                    && confirmation.is_ack()
                    && confirmation.take_message().is_none()
                {
                    self.garbage.lock().unwrap().push(marker);
                    confirmed += 1;
                }
            }
        }
        connection.close(200, "done".into()).await.ok();
        confirmed
    }

    /// The victim queue deleted once it is empty (so no canary goes with it),
    /// then declared again after `hold`. Canaries due meanwhile are set aside.
    async fn destination_deleted(&self, hold: Duration) -> Option<String> {
        let _turn = self.victim_turn.lock().await;
        let deadline = Instant::now() + PATIENCE;
        let mut deleted = false;
        while !deleted && Instant::now() < deadline {
            deleted = async {
                let connection = canary::connect(&self.setup.amqp_url).await?;
                let channel = connection.create_channel().await?;
                let options = QueueDeleteOptions { if_empty: true, ..Default::default() };
                let result = channel.queue_delete(self.victim.as_str().into(), options).await;
                connection.close(200, "done".into()).await.ok();
                anyhow::Ok(result.is_ok())
            }
            .await
            .unwrap_or(false);
            if !deleted {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        tokio::time::sleep(hold).await;
        let back = retry(|| declare_victim(&self.setup.amqp_url, &self.victim)).await;
        if !back {
            self.problem(format!("the victim queue {} could not be declared again within {PATIENCE:?}", self.victim));
        }
        (!deleted).then(|| "the victim queue never emptied: not deleted".to_string())
    }

    /// `deliver_to` deleted, then declared and bound again after `hold`, as an operator would.
    async fn exchange_deleted(&self, hold: Duration) -> Option<String> {
        let _turn = self.exchange_turn.lock().await;
        let orders = self.setup.orders.clone();
        let deleted = retry(|| async {
            let connection = canary::connect(&self.setup.amqp_url).await?;
            let channel = connection.create_channel().await?;
            channel.exchange_delete(orders.as_str().into(), Default::default()).await?;
            connection.close(200, "done".into()).await.ok();
            anyhow::Ok(())
        })
        .await;
        tokio::time::sleep(hold).await;
        let back = retry(|| async {
            let connection = canary::connect(&self.setup.amqp_url).await?;
            let channel = connection.create_channel().await?;
            let durable = ExchangeDeclareOptions { durable: true, ..Default::default() };
            channel.exchange_declare(orders.as_str().into(), ExchangeKind::Topic, durable, FieldTable::default()).await?;
            let bind = QueueBindOptions::default();
            channel.queue_bind(self.setup.destination.as_str().into(), orders.as_str().into(), "canary".into(), bind, FieldTable::default()).await?;
            connection.close(200, "done".into()).await.ok();
            anyhow::Ok(())
        })
        .await;
        if !back {
            self.problem(format!("{orders} could not be declared and bound again within {PATIENCE:?}"));
        }
        (!deleted).then(|| "not deleted (the broker was away)".to_string())
    }

    async fn reload(&self, host: usize) -> String {
        let url = format!("{}/v1/reload", self.bases[host].lock().unwrap());
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(30))).build().into();
        let answer = tokio::task::spawn_blocking(move || {
            let mut response = agent.post(&url).send_empty().ok()?;
            Some((response.status().as_u16(), response.body_mut().read_to_string().unwrap_or_default()))
        })
        .await
        .expect("join");
        match answer {
            Some((200, _)) => "reload answered 200".into(),
            // The broker away: the config stays, ask again later.
            Some((503, _)) => "reload answered 503".into(),
            Some((status, body)) => {
                self.problem(format!("reload answered {status}: {body}"));
                format!("reload answered {status}")
            }
            None => "reload unanswered".into(),
        }
    }

    /// Stops every host (the node goes when the world is dropped).
    pub async fn stop_hosts(&self) {
        for host in &self.hosts {
            host.lock().await.take();
        }
    }

    /// The host's `/metrics` lines starting with `prefix`, from every host that answers.
    pub async fn metric_lines(&self, prefix: &str) -> Vec<String> {
        let mut lines = Vec::new();
        for host in &self.hosts {
            if let Some(host) = host.lock().await.as_ref() {
                lines.extend(host.metric_lines(prefix).await);
            }
        }
        lines
    }
}

/// The victim: a classic queue, since only those can be deleted "if empty"
/// (a quorum queue refuses the flag), so the soak never deletes a canary.
async fn declare_victim(amqp_url: &str, queue: &str) -> anyhow::Result<()> {
    let connection = canary::connect(amqp_url).await?;
    let channel = connection.create_channel().await?;
    let durable = QueueDeclareOptions { durable: true, ..Default::default() };
    channel.queue_declare(queue.into(), durable, FieldTable::default()).await?;
    connection.close(200, "done".into()).await.ok();
    Ok(())
}

/// `hourglass serve` on `config`, tried again while the broker (or the proxy) is away.
async fn start_host(config: PathBuf) -> anyhow::Result<Host> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let config = config.clone();
        match tokio::task::spawn_blocking(move || Host::start(&config)).await? {
            Ok(host) => return Ok(host),
            Err(err) if Instant::now() > deadline => return Err(err),
            Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

/// Runs `attempt` until it succeeds or [`PATIENCE`] runs out; true when it succeeded.
async fn retry<F, Fut>(mut attempt: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        if attempt().await.is_ok() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
